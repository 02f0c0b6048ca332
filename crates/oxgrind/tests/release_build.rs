//! The release build, which scripts/setup.sh installs and users run, against Valgrind: the
//! rest of the suite runs the debug build, and the two lay out their frames differently
//! (a release-only regression once left a stale copy of a leaked block's address on the
//! program's stack, where only the optimised hook's frames put it). scripts/test.sh builds
//! the release launcher and runtime and sets OXGRIND_TEST_RELEASE, so these run in CI.

mod common;
use common::*;

#[test]
fn release_build_reports_leaks_and_errors_as_valgrind() {
    let Some(oxgrind) = release_oxgrind() else {
        return;
    };
    if !have_valgrind() {
        return;
    }
    for (name, flags) in [
        ("mc_leak_last_pointer_dropped.c", &["-g", "-O0"][..]),
        ("mc_leak_last_pointer_dropped.c", &["-g", "-O2"]),
        ("mc_heap.c", &["-g", "-O0", "-w"]),
    ] {
        let prog = build(name, flags);
        let opts = ["--leak-check=full", "--show-leak-kinds=all"];
        let (ours, theirs) = run_beside_valgrind(&oxgrind, &prog, &opts, &[]);
        let (ours, theirs) = (normalize_report(&ours), normalize_report(&theirs));
        eprintln!("{name} {flags:?}");
        assert_same_report(&ours, &theirs);
    }
}
