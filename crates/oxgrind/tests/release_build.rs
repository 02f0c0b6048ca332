//! The release build, which scripts/setup.sh installs and users run, against Valgrind: the
//! rest of the suite runs the debug build, and the two lay out their frames differently
//! (a release-only regression once left a stale copy of a leaked block's address on the
//! program's stack, where only the optimised hook's frames put it). scripts/test.sh builds
//! the release launcher and runtime and sets OXGRIND_TEST_RELEASE, so these run in CI.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// The normalised Memcheck reports of `prog` under the release build and under Valgrind,
/// after checking that the program's output and exit status are the same.
fn both(oxgrind: &Path, prog: &Path, opts: &[&str]) -> (String, String) {
    let ours = run(Command::new(oxgrind).args(opts).arg(prog));
    let theirs = run(Command::new("valgrind").args(opts).arg(prog));
    assert_eq!(stdout(&ours), stdout(&theirs), "program output differs");
    assert_eq!(
        ours.status.code(),
        theirs.status.code(),
        "exit status differs"
    );
    (
        normalize_report(&stderr(&ours)),
        normalize_report(&stderr(&theirs)),
    )
}

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
        let (ours, theirs) = both(
            &oxgrind,
            &prog,
            &["--leak-check=full", "--show-leak-kinds=all"],
        );
        eprintln!("{name} {flags:?}");
        assert_same_report(&ours, &theirs);
    }
}
