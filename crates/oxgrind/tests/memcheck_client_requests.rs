//! Memcheck's client requests (`valgrind/memcheck.h`, no-ops natively), as Valgrind answers
//! them: memory made unaddressable is checked, a check request reports and returns the first
//! bad byte, and a custom allocator's blocks (`VALGRIND_MALLOCLIKE_BLOCK` /
//! `FREELIKE_BLOCK`) are counted, described, checked and leak-checked as heap blocks. The
//! whole report equals Valgrind's (issue 10: MAKE_MEM_NOACCESS then an access gave Valgrind
//! two errors and us none).

mod common;
use common::*;
use std::process::Command;

#[test]
fn client_requests_are_answered_and_reported_as_valgrind_does() {
    if !have_valgrind() {
        return;
    }
    let prog = build("mc_client_requests.c", &["-g", "-O0"]);
    for opts in [&["--leak-check=full"][..], &["-q"]] {
        let ours = run(Command::new(oxgrind()).args(opts).arg(&prog));
        let theirs = run(Command::new("valgrind").args(opts).arg(&prog));
        // The program prints what the requests returned (the first bad address was the
        // expected one, the clean check returned 0, and the error count).
        assert_eq!(stdout(&ours), stdout(&theirs), "{}", stderr(&ours));
        eprintln!("options {opts:?}");
        assert_same_report(
            &normalize_report(&stderr(&ours)),
            &normalize_report(&stderr(&theirs)),
        );
    }
}
