//! Overlapping source and destination in the copying string functions: Memcheck reports
//! what Valgrind 3.19's preload replacements report (which functions, which addresses, which
//! length), the program sees the same bytes, and the tools that do not check overlaps see
//! glibc's functions, unchanged.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// Both reports (stderr) as they are ([`run_beside_valgrind`]).
fn both_raw(prog: &Path, opts: &[&str]) -> Option<(String, String)> {
    have_valgrind().then(|| run_beside_valgrind(&oxgrind(), prog, opts, &[]))
}

/// [`both_raw`], normalised.
fn both(prog: &Path, opts: &[&str]) -> Option<(String, String)> {
    both_raw(prog, opts).map(|(o, t)| (normalize_report(&o), normalize_report(&t)))
}

/// The overlap errors' first lines with each address cut to its offset in the page: both
/// runs load the same executable, so its buffers have the same page offsets, and this tells
/// whether the reported addresses are the same ones (strncpy reports dst and src *after*
/// its copy loop, for instance), which [`normalize`] cannot.
fn overlap_arguments(report: &str) -> Vec<String> {
    overlap_lines(report)
        .iter()
        .map(|l| {
            let l = &l[l.find("Source").unwrap()..];
            let mut out = String::new();
            let mut rest = l;
            while let Some(i) = rest.find("0x") {
                out.push_str(&rest[..i]);
                let tail = &rest[i + 2..];
                let n = tail.chars().take_while(|c| c.is_ascii_hexdigit()).count();
                let v = u64::from_str_radix(&tail[..n], 16).unwrap();
                out.push_str(&format!("page+{:#x}", v & 0xfff));
                rest = &tail[n..];
            }
            out.push_str(rest);
            out
        })
        .collect()
}

/// The `Source and destination overlap in ...` lines of a report.
fn overlap_lines(report: &str) -> Vec<&str> {
    report
        .lines()
        .filter(|l| l.contains("Source and destination overlap in "))
        .collect()
}

#[test]
fn overlapping_string_copies_are_reported_as_valgrind_reports_them() {
    let prog = build("mc_overlap.c", &["-g", "-O0", "-fno-builtin"]);
    for opts in [
        &[][..],
        &["--num-callers=2"],
        &["-q"],
        &["-s"],
        &["--gen-suppressions=all"],
    ] {
        let Some((ours, theirs)) = both(&prog, opts) else {
            return;
        };
        eprintln!("options {opts:?}");
        assert_same_report(&ours, &theirs);
    }
    let Some((ours, theirs)) = both_raw(&prog, &[]) else {
        return;
    };
    assert_eq!(overlap_arguments(&ours), overlap_arguments(&theirs));
    // The report is the one the corpus is designed to produce: every overlapping call once,
    // no non-overlapping one, memcpy not at all, memccpy as the mempcpy it tail-calls.
    let Some((ours, _)) = both(&prog, &[]) else {
        return;
    };
    let functions: Vec<&str> = overlap_lines(&ours)
        .iter()
        .map(|l| {
            let s = l.split("overlap in ").nth(1).unwrap();
            &s[..s.find('(').unwrap()]
        })
        .collect();
    assert_eq!(
        functions,
        [
            "strcpy",
            "strncpy",
            "strncpy",
            "strcat",
            "strncat",
            "stpcpy",
            "stpncpy",
            "mempcpy",
            "memcpy_chk",
            "strncpy",
            "stpncpy",
            "wcscpy",
            "mempcpy"
        ],
        "{ours}"
    );
    // Lengths: printed for the counted functions, omitted for strcpy/strcat/stpcpy.
    assert!(
        ours.contains("overlap in strcpy(0xADDR, 0xADDR)\n"),
        "{ours}"
    );
    assert!(
        ours.contains("overlap in strncat(0xADDR, 0xADDR, 2)\n"),
        "{ours}"
    );
    assert!(
        ours.contains("overlap in memcpy_chk(0xADDR, 0xADDR, 7)\n"),
        "{ours}"
    );
    // Frame 0 is our replacement, as Valgrind's is its preload's.
    assert!(
        ours.contains("   at 0xADDR: __memcpy_chk (in PRELOAD)\n"),
        "{ours}"
    );
}

#[test]
fn fortified_builds_are_checked_where_valgrind_checks_them() {
    // -D_FORTIFY_SOURCE=2 turns strcpy into __strcpy_chk (not checked by Valgrind 3.19)
    // but leaves strncpy/stpncpy as calls under an inlined wrapper frame.
    let prog = build(
        "mc_overlap.c",
        &["-g", "-O2", "-D_FORTIFY_SOURCE=2", "-Wno-restrict"],
    );
    let Some((ours, theirs)) = both(&prog, &[]) else {
        return;
    };
    assert_same_report(&ours, &theirs);
    assert!(
        ours.contains("by 0xADDR: strncpy (string_fortified.h:"),
        "{ours}"
    );
}

#[test]
fn tools_that_do_not_check_overlaps_leave_the_copies_to_glibc() {
    let prog = build("mc_overlap.c", &["-g", "-O0", "-fno-builtin"]);
    let native = run(&mut Command::new(&prog));
    let dir = tempfile::tempdir().unwrap();
    for tool in [
        &["--tool=massif", "--massif-out-file=massif.out"][..],
        &["--tool=none"],
    ] {
        let o = run(Command::new(oxgrind())
            .args(tool)
            .arg(&prog)
            .current_dir(dir.path()));
        let err = stderr(&o);
        assert_eq!(
            stdout(&o),
            stdout(&native),
            "{tool:?}: program output differs"
        );
        assert_eq!(o.status.code(), Some(0), "{tool:?}: {err}");
        assert!(
            !err.contains("Source and destination overlap"),
            "{tool:?} reported an overlap:\n{err}"
        );
    }
}

#[test]
fn copies_made_before_any_library_is_initialised_are_correct() {
    // The corpus copies from .preinit_array, before our constructor: the replacements are
    // still unresolved then and must copy with their own loops.
    let prog = build("strings_early.c", &["-g", "-O0", "-fno-builtin"]);
    let native = run(&mut Command::new(&prog));
    assert!(
        stdout(&native).contains("2 [the early bird]"),
        "{}",
        stdout(&native)
    );
    let dir = tempfile::tempdir().unwrap();
    for tool in [
        &["--tool=memcheck"][..],
        &["--tool=massif", "--massif-out-file=massif.out"],
        &["--tool=none"],
    ] {
        let o = run(Command::new(oxgrind())
            .args(tool)
            .arg(&prog)
            .current_dir(dir.path()));
        let err = stderr(&o);
        assert_eq!(stdout(&o), stdout(&native), "{tool:?}: {err}");
        assert_eq!(o.status.code(), Some(0), "{tool:?}: {err}");
        assert!(
            !err.contains("Source and destination overlap"),
            "{tool:?}: {err}"
        );
    }
}
