//! `--track-fds`, differentially: each case of `tests/corpus/track_fds.c` leaves descriptors
//! open at exit, made a different way (open, pipe, dup, socket; dup2 onto an open one, dup3,
//! fcntl(F_DUPFD*); libc's own opens, socketpair, creat of a since-unlinked file;
//! close_range; across exec, where O_CLOEXEC ones vanish and the others are inherited;
//! accept4 on loopback and a forked child, which inherits them). The
//! whole report, "FILE DESCRIPTORS: N open (M std) at exit." and each descriptor's block
//! with its opening stack, must be Valgrind 3.19's, for `yes` and `all`, under Memcheck and
//! under a tool that does not translate by itself (none). And a descriptor call that blocks
//! until a signal interrupts it (`tests/corpus/fd_signals.c`) restarts or fails with EINTR
//! as natively.

mod common;
use common::*;
use std::process::{Command, Stdio};

const CASES: &[&str] = &[
    "basic",
    "dups",
    "libc",
    "close_range",
    "exec",
    "fork_accept",
];

/// Loopback ports differ from run to run.
fn without_ports(report: &str) -> String {
    let mut out = String::new();
    let mut rest = report;
    while let Some(i) = rest.find("127.0.0.1:") {
        out.push_str(&rest[..i + 10]);
        let tail = &rest[i + 10..];
        let n = tail.chars().take_while(|c| c.is_ascii_digit()).count();
        out.push_str("PORT");
        rest = &tail[n..];
    }
    out.push_str(rest);
    out
}

fn report(tool: &str, mode: &str, prog: &std::path::Path, case: &str, ours: bool) -> String {
    let mut cmd = if ours {
        Command::new(oxgrind())
    } else {
        Command::new("valgrind")
    };
    cmd.arg(format!("--tool={tool}"))
        .arg(format!("--track-fds={mode}"))
        .arg("--trace-children=yes")
        .arg(prog)
        .arg(case)
        .stdin(Stdio::null());
    let out = run(&mut cmd);
    assert!(out.status.success(), "{case}: {out:?}");
    without_ports(&normalize_report(&stderr(&out)))
}

#[test]
fn open_descriptors_at_exit_match_valgrind() {
    if !have_valgrind() {
        return;
    }
    let prog = build("track_fds.c", &["-g", "-O0", "-w"]);
    let mut failures = Vec::new();
    for (tool, mode) in [("memcheck", "yes"), ("memcheck", "all"), ("none", "yes")] {
        for case in CASES {
            let theirs = report(tool, mode, &prog, case, false);
            let ours = report(tool, mode, &prog, case, true);
            assert!(
                theirs.contains("FILE DESCRIPTORS: "),
                "{case}: Valgrind says\n{theirs}"
            );
            if ours != theirs {
                failures.push(format!(
                    "--- {tool} {mode} {case}: ours\n{ours}\n--- valgrind\n{theirs}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn no_report_without_the_option() {
    let prog = build("track_fds.c", &["-g", "-O0", "-w"]);
    let out = run(Command::new(oxgrind()).arg(&prog).arg("basic"));
    assert!(!stderr(&out).contains("FILE DESCRIPTORS"), "{out:?}");
}

#[test]
fn under_xml_the_stacks_go_into_the_xml_as_valgrind_writes_them() {
    // Valgrind 3.19: the list on the log without its stacks, each stack a <stack> in the
    // XML after the FINISHED status (before the leak errors, with --leak-check=full).
    if !have_valgrind() {
        return;
    }
    let prog = build("track_fds.c", &["-g", "-O0", "-w"]);
    let dir = tempfile::tempdir().unwrap();
    for case in ["basic", "dups", "libc"] {
        let mut got = Vec::new();
        for ours in [true, false] {
            // --xml-fd on a descriptor the program inherits, as both show it alike
            // (Valgrind's own --xml-file descriptor is the program's to see; ours not).
            let xml = dir.path().join(if ours { "o.xml" } else { "v.xml" });
            let tool = if ours { oxgrind() } else { "valgrind".into() };
            let mut cmd = Command::new("/bin/sh");
            cmd.arg("-c")
                .arg("xml=$1; shift; exec \"$@\" 3>\"$xml\"")
                .arg("sh")
                .arg(&xml)
                .arg(&tool)
                .args([
                    "--track-fds=yes",
                    "--xml=yes",
                    "--xml-fd=3",
                    "--leak-check=full",
                ])
                .arg(&prog)
                .arg(case)
                .stdin(Stdio::null());
            let out = run(&mut cmd);
            assert!(out.status.success(), "{case}: {out:?}");
            let log = without_ports(&normalize_report(&stderr(&out)))
                .replace(&xml.display().to_string(), "XML");
            got.push((log, without_ports(&xml_normalized(&xml))));
        }
        let ((ours_log, ours_xml), (theirs_log, theirs_xml)) = (&got[0], &got[1]);
        assert!(theirs_xml.contains("  <stack>"), "{case}: {theirs_xml}");
        assert!(!theirs_log.contains(" at 0x"), "{case}: {theirs_log}");
        assert_eq!(ours_log, theirs_log, "{case}: the log");
        assert_eq!(ours_xml, theirs_xml, "{case}: the XML");
    }
}

/// A descriptor call that blocks until a signal comes (`tests/corpus/fd_signals.c`: the
/// open of a FIFO without a writer, an accept without a client, a read of an empty pipe,
/// each under a repeating SIGALRM) is interrupted as natively: with `SA_RESTART` the
/// handler runs (and makes the call able to complete) and the call restarts; without, it
/// fails with EINTR. The program prints and ends as it does natively, and the report is
/// Valgrind's. Under `--track-fds` the engine once performed these calls itself, from the
/// dispatcher, where the signal could not reach the handler: with `SA_RESTART` the program
/// hung for ever; hence the deadline.
#[test]
fn a_blocking_descriptor_call_is_interrupted_by_a_signal_as_natively() {
    let prog = build("fd_signals.c", &["-g", "-O0", "-w"]);
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let deadline = std::time::Duration::from_secs(120);
    let valgrind = have_valgrind();
    let mut failures = Vec::new();
    for mode in ["restart", "eintr"] {
        let native = run_with_deadline(
            Command::new(&prog)
                .arg(mode)
                .arg(&fifo)
                .stdin(Stdio::null()),
            deadline,
        );
        assert_eq!(
            native.status.code(),
            Some(if mode == "restart" { 0 } else { 5 })
        );
        for tool in ["none", "memcheck"] {
            let run_under = |launcher: std::path::PathBuf| {
                run_with_deadline(
                    Command::new(launcher)
                        .arg(format!("--tool={tool}"))
                        .arg("--track-fds=yes")
                        .arg(&prog)
                        .arg(mode)
                        .arg(&fifo)
                        .stdin(Stdio::null()),
                    deadline,
                )
            };
            let ours = run_under(oxgrind());
            if stdout(&ours) != stdout(&native) || ours.status.code() != native.status.code() {
                failures.push(format!(
                    "--- {tool} {mode}: ours {:?}\n{}{}--- native {:?}\n{}",
                    ours.status,
                    stdout(&ours),
                    stderr(&ours),
                    native.status,
                    stdout(&native)
                ));
                continue;
            }
            if !valgrind {
                continue;
            }
            let theirs = run_under("valgrind".into());
            let (ours, theirs) = (
                without_ports(&normalize_report(&stderr(&ours))),
                without_ports(&normalize_report(&stderr(&theirs))),
            );
            assert!(
                theirs.contains("FILE DESCRIPTORS: "),
                "{mode}: Valgrind says\n{theirs}"
            );
            if ours != theirs {
                failures.push(format!(
                    "--- {tool} {mode}: ours\n{ours}\n--- valgrind\n{theirs}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
