//! A signal a program keeps blocked except while it waits (`pselect`, `ppoll`,
//! `epoll_pwait`, `sigsuspend` with a mask of their own: `tests/corpus/signal_masked_waits.c`)
//! reaches its handler exactly as natively: once, as the wait ends with EINTR, with the
//! wait's mask in force, and the usual mask back afterwards; a later wait with nothing to
//! come idles. The engine used to defer such a signal (it arrives right after the `syscall`
//! instruction, in engine code) and raise it again once the usual mask, which blocks it, was
//! back: the handler never ran, and every later wait failed at once, a busy loop for ever
//! (gpg-agent, daemonised by gpg, at 50% CPU). Real-time signals queued while blocked and
//! unblocked by one `sigprocmask` all arrive as that call returns: deferred, they were
//! merged (one of five lost). Checked natively against each tool's run,
//! with `--track-fds=yes` too (every system call then comes back to the dispatcher).
//! Valgrind runs the handler with the usual mask instead of the wait's (it prints
//! `usr2_open_in_handler=0`), so native is the reference here.

mod common;
use common::*;
use std::process::{Command, Stdio};

#[test]
fn a_signal_unblocked_only_while_waiting_reaches_its_handler_as_natively() {
    let prog = build("signal_masked_waits.c", &["-g", "-O0", "-w"]);
    let deadline = std::time::Duration::from_secs(120);
    let native = run_with_deadline(Command::new(&prog).stdin(Stdio::null()), deadline);
    assert_eq!(
        native.status.code(),
        Some(0),
        "natively: {}",
        stdout(&native)
    );
    let mut failures = Vec::new();
    for opts in [
        &["--tool=none"][..],
        &["--tool=memcheck"],
        &["--tool=none", "--track-fds=yes"],
    ] {
        let ours = run_with_deadline(
            Command::new(oxgrind())
                .args(opts)
                .arg(&prog)
                .stdin(Stdio::null()),
            deadline,
        );
        let report = stderr(&ours);
        let clean = !opts.contains(&"--tool=memcheck")
            || report.contains("ERROR SUMMARY: 0 errors from 0 contexts");
        if stdout(&ours) != stdout(&native) || ours.status.code() != native.status.code() || !clean
        {
            failures.push(format!(
                "--- {opts:?}: ours {:?}\n{}{report}--- native\n{}",
                ours.status,
                stdout(&ours),
                stdout(&native)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
