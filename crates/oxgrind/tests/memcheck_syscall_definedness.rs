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

/// `tests/corpus/mc_syscall_outputs.c`: several dozen calls that write the program's memory
/// (statfs, getitimer, sigaltstack, getresuid, waitid, sched_getattr, the xattr calls,
/// timerfd and POSIX timers, rt_sigtimedwait, mincore, recvmsg into a msghdr with undefined
/// padding, recvmmsg, fcntl F_GETLK, prctl, arch_prctl, msgrcv, semctl/shmctl IPC_STAT,
/// process_vm_readv, name_to_handle_at, an `_IOR` ioctl Valgrind knows only by its
/// encoding, a debugger's ptrace reads of its stopped tracee...) into undefined buffers,
/// then a branch on every byte the kernel wrote: no error under Valgrind, none under ours
/// (issue 12: `find` reported 3000 errors on its fstatfs buffer; gdb running a program, 17
/// on its ptrace(GETREGS/PEEKUSER/GETSIGINFO) buffers).
#[test]
fn what_the_kernel_writes_is_defined_as_in_valgrind() {
    let prog = build("mc_syscall_outputs.c", &["-g", "-O0", "-w"]);
    let ours = run(Command::new(oxgrind())
        .args(["--undef-value-errors=yes", "--leak-check=no"])
        .arg(&prog));
    let err = stderr(&ours);
    // The program forks three children (the third traced): each says its summary.
    let summaries = err.matches("ERROR SUMMARY: ").count();
    assert_eq!(summaries, 4, "{err}");
    assert_eq!(
        err.matches("ERROR SUMMARY: 0 errors from 0 contexts")
            .count(),
        summaries,
        "{err}"
    );
    if have_valgrind() {
        let theirs = run(Command::new("valgrind").arg("--leak-check=no").arg(&prog));
        let theirs = stderr(&theirs);
        assert_eq!(
            theirs
                .matches("ERROR SUMMARY: 0 errors from 0 contexts")
                .count(),
            4,
            "{theirs}"
        );
    }
}

/// One call per case whose output buffer was freed: "Syscall param NAME points to
/// unaddressable byte(s)" with Valgrind's parameter names (a struct's fields one by one
/// for getitimer), described as Valgrind does.
#[test]
fn unaddressable_output_buffers_are_reported_as_in_valgrind() {
    if !have_valgrind() {
        return;
    }
    let prog = build("mc_syscall_outputs.c", &["-g", "-O0", "-w"]);
    let mut failures = Vec::new();
    for (case, names) in [
        ("fstatfs", &["fstatfs(buf)"][..]),
        (
            "getresuid",
            &["getresuid(ruid)", "getresuid(euid)", "getresuid(suid)"][..],
        ),
        ("prctl", &["prctl(get-name)"][..]),
        ("ioctl", &["ioctl(generic)"][..]),
        ("ptrace", &["ptrace(getregs)"][..]),
        (
            "getitimer",
            &[
                "getitimer(&value->it_interval)",
                "getitimer(&value->it_value)",
            ][..],
        ),
    ] {
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
        for name in names {
            let headline = format!("Syscall param {name} points to unaddressable byte(s)");
            assert!(
                theirs.contains(&headline),
                "{case}: Valgrind says\n{theirs}"
            );
        }
        if ours != theirs {
            failures.push(format!("--- {case}: ours\n{ours}\n--- valgrind\n{theirs}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
