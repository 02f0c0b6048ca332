//! A program's own `operator new` / `delete` are replaced as Valgrind replaces them
//! (issue 10, item 7): its definitions never run, and the report is Valgrind 3.19's.

mod common;
use common::*;
use std::process::Command;

#[test]
fn a_programs_own_operator_new_is_replaced_as_valgrind_does() {
    let prog = build("mc_own_new.cpp", &["-g", "-O0"]);
    let native = run(&mut Command::new(&prog));
    assert_eq!(stdout(&native), "calls 3\n");
    let opts = ["--leak-check=full"];
    let ours = run(Command::new(oxgrind()).args(opts).arg(&prog));
    assert_eq!(stdout(&ours), "calls 0\n");
    if !have_valgrind() {
        return;
    }
    let theirs = run(Command::new("valgrind").args(opts).arg(&prog));
    assert_eq!(stdout(&theirs), "calls 0\n");
    assert_same_report(
        &normalize_report(&stderr(&ours)),
        &normalize_report(&stderr(&theirs)),
    );
}
