//! System-call buffers with definedness on: Memcheck checks the memory the kernel reads
//! for addressability and definedness at once, and the first bad byte of each parameter
//! decides its one error ("points to uninitialised byte(s)" or "... unaddressable ..."),
//! with the address described as Valgrind does (a heap block, a frame of the thread's
//! stack). Differential against Valgrind 3.19 on `tests/corpus/mc_syscall_undef.c`.

mod common;
use common::*;
use std::process::Command;

const CASES: &[(&str, &str)] = &[
    ("undefined_then_unaddressable", "uninitialised"),
    ("unaddressable_then_undefined", "unaddressable"),
    ("undefined_heap", "uninitialised"),
    ("stack", "uninitialised"),
];

#[test]
fn the_first_bad_byte_decides_the_one_error_as_in_valgrind() {
    if !have_valgrind() {
        return;
    }
    let prog = build("mc_syscall_undef.c", &["-g", "-O0", "-w"]);
    let mut failures = Vec::new();
    for (case, kind) in CASES {
        let ours = run(Command::new(oxgrind())
            .args(["--undef-value-errors=yes", "--leak-check=no"])
            .arg(&prog)
            .arg(case));
        let theirs = run(Command::new("valgrind")
            .arg("--leak-check=no")
            .arg(&prog)
            .arg(case));
        let (ours, theirs) = (
            normalize_report(&stderr(&ours)),
            normalize_report(&stderr(&theirs)),
        );
        let headline = format!("Syscall param write(buf) points to {kind} byte(s)");
        assert!(
            theirs.contains(&headline),
            "{case}: Valgrind says\n{theirs}"
        );
        assert_eq!(
            theirs.matches("Syscall param").count(),
            1,
            "{case}\n{theirs}"
        );
        if ours != theirs {
            failures.push(format!("--- {case}: ours\n{ours}\n--- valgrind\n{theirs}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn defined_buffers_give_no_error() {
    let prog = build("mc_syscall_undef.c", &["-g", "-O0", "-w"]);
    let out = run(Command::new(oxgrind())
        .arg("--undef-value-errors=yes")
        .arg(&prog)
        .arg("defined"));
    let err = stderr(&out);
    assert!(
        err.contains("ERROR SUMMARY: 0 errors from 0 contexts"),
        "{err}"
    );
}
