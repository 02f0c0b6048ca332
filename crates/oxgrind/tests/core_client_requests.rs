//! The client requests Valgrind's core answers whatever the tool: `RUNNING_ON_VALGRIND`,
//! `VALGRIND_PRINTF(_BACKTRACE)` and the `STACK_*` requests, compared with Valgrind 3.19
//! under Memcheck, Massif (which runs under the engine without probes) and Nulgrind.

mod common;
use common::*;
use std::process::Command;

/// The `**PID**` messages and the stack lines of a run, normalised.
fn messages(stderr: &str) -> Vec<String> {
    normalize_report(stderr)
        .lines()
        .filter(|l| l.starts_with("**") || l.contains("    at ") || l.contains("    by "))
        .map(|l| {
            // **12345** text
            match l
                .strip_prefix("**")
                .and_then(|r| r.find("** ").map(|i| &r[i + 3..]))
            {
                Some(text) => format!("**PID** {text}"),
                None => l.to_string(),
            }
        })
        .collect()
}

#[test]
fn core_requests_are_answered_as_valgrind_answers_them_for_every_tool() {
    let prog = build("core_requests.c", &["-g", "-O0"]);
    let native = run(&mut Command::new(&prog));
    assert!(stdout(&native).contains("running on valgrind: 0"));
    assert!(stdout(&native).contains("printed 0, stacks 0 0"));
    if !have_valgrind() {
        return;
    }
    for tool in [
        &["--tool=memcheck"][..],
        &["--tool=massif", "--massif-out-file=/dev/null"],
        &["--tool=none"],
    ] {
        let ours = run(Command::new(oxgrind()).args(tool).arg(&prog));
        let theirs = run(Command::new("valgrind").args(tool).arg(&prog));
        assert_eq!(stdout(&ours), stdout(&theirs), "{tool:?}: program output");
        assert!(stdout(&ours).contains("running on valgrind: 1"), "{tool:?}");
        let (o, t) = (messages(&stderr(&ours)), messages(&stderr(&theirs)));
        assert!(t.iter().any(|l| l.starts_with("**PID** hello 42")), "{t:?}");
        assert_eq!(o, t, "{tool:?}: messages");
    }
}
