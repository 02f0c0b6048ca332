//! Memcheck's Invalid read / Invalid write for heap blocks, differentially: the corpus
//! programs `access_*.c` under Valgrind's memcheck and ours must print the same report
//! (normalised as in `memcheck_vs_valgrind.rs`), and correct programs none at all.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn both(prog: &Path, opts: &[&str]) -> Option<(String, String)> {
    reports_beside_valgrind(prog, opts, &[])
}

fn heap_program() -> PathBuf {
    build("access_heap.c", &["-g", "-O0", "-w"])
}

#[test]
fn overruns_underruns_and_uses_after_free_match_valgrind() {
    let prog = heap_program();
    for opts in [
        &[][..],
        &["-s"],
        &["--num-callers=1"],
        &["--error-exitcode=3"],
        &["--partial-loads-ok=no", "-s"],
        &["-q"],
    ] {
        let Some((ours, theirs)) = both(&prog, opts) else {
            return;
        };
        eprintln!("options {opts:?}");
        assert_same_report(&ours, &theirs);
    }
}

#[test]
fn invalid_accesses_are_counted_in_the_error_summary() {
    let prog = heap_program();
    let o = run(Command::new(oxgrind()).arg(&prog));
    let report = stderr(&o);
    // 17 places; a loop of 8 bad reads is one of them, the 2-byte store counts twice,
    // the increment of freed memory counts its read and its write, and the 16-byte
    // store is two 8-byte pieces.
    assert!(
        report.contains("ERROR SUMMARY: 27 errors from 17 contexts"),
        "{report}"
    );
    for what in [
        "Invalid read of size 1",
        "Invalid write of size 2",
        "Invalid read of size 16",
        "Invalid write of size 8",
        "is 4 bytes before a block of size 40 alloc'd",
        "is 8 bytes inside a block of size 40 free'd",
        "is 3 bytes inside a block of size 16 free'd",
    ] {
        assert!(report.contains(what), "no {what:?} in\n{report}");
    }
    // The partly addressable aligned 8-byte load is not an error by default.
    assert!(!report.contains("vectors (access_heap.c:82)"), "{report}");
    let strict = stderr(&run(Command::new(oxgrind())
        .arg("--partial-loads-ok=no")
        .arg(&prog)));
    assert!(strict.contains("vectors (access_heap.c:82)"), "{strict}");
}

#[test]
fn one_bad_access_per_thread_matches_valgrind() {
    let prog = build("access_threads.c", &["-g", "-O0"]);
    let Some((ours, theirs)) = both(&prog, &[]) else {
        return;
    };
    assert!(ours.contains("Thread 4:"), "{ours}");
    // glibc's per-thread DTV has one more 16-byte slot under oxgrind (our runtime library
    // has a TLS segment, Valgrind's preload none): 3 threads, 48 bytes more allocated (as
    // in memcheck_vs_valgrind.rs).
    let allocated = |r: &str| -> u64 {
        let l = r.lines().find(|l| l.contains("total heap usage:")).unwrap();
        let n = l.rsplit(", ").next().unwrap().split(' ').next().unwrap();
        n.replace(',', "").parse().unwrap()
    };
    let (o, t) = (allocated(&ours), allocated(&theirs));
    assert_eq!(o, t + 48, "{ours}");
    let fmt = |n: u64| {
        let s = n.to_string();
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    };
    let ours = ours.replace(
        &format!("{} bytes allocated", fmt(o)),
        &format!("{} bytes allocated", fmt(t)),
    );
    assert_same_report(&ours, &theirs);
}

#[test]
fn generated_suppressions_name_addr_kinds_and_silence_the_errors() {
    let prog = heap_program();
    let Some((ours, theirs)) = both(&prog, &["--gen-suppressions=all"]) else {
        return;
    };
    assert!(ours.contains("   Memcheck:Addr4\n"), "{ours}");
    assert!(ours.contains("   Memcheck:Addr16\n"), "{ours}");
    assert_same_report(&ours, &theirs);

    // Every generated entry, fed back, suppresses every error in both tools.
    let dir = tempfile::tempdir().unwrap();
    let supp = dir.path().join("access.supp");
    let mut text = String::new();
    let mut inside = false;
    for l in stderr(&run(Command::new(oxgrind())
        .arg("--gen-suppressions=all")
        .arg(&prog)))
    .lines()
    {
        if l == "{" {
            inside = true;
        }
        if inside {
            text.push_str(l);
            text.push('\n');
        }
        if l == "}" {
            inside = false;
        }
    }
    std::fs::write(&supp, text).unwrap();
    let opt = format!("--suppressions={}", supp.display());
    let Some((ours, theirs)) = both(&prog, &[&opt, "-s"]) else {
        return;
    };
    assert!(
        ours.contains("ERROR SUMMARY: 0 errors from 0 contexts (suppressed: 27 from 17)"),
        "{ours}"
    );
    // The used-suppression lines name the file; both tools read the same one. Their
    // `--PID--` prefix is not normalised by normalize_report.
    let debug_prefix = |r: &str| {
        r.lines()
            .map(
                |l| match l.strip_prefix("--").and_then(|t| t.split_once("-- ")) {
                    Some((pid, rest)) if pid.chars().all(|c| c.is_ascii_digit()) => {
                        format!("--PID-- {rest}")
                    }
                    _ => l.to_string(),
                },
            )
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_same_report(&debug_prefix(&ours), &debug_prefix(&theirs));
}

#[test]
fn xml_has_invalid_read_and_write_kinds_as_valgrind_writes_them() {
    if !have_valgrind() {
        return;
    }
    let prog = heap_program();
    let dir = tempfile::tempdir().unwrap();
    let (ours, theirs) = (dir.path().join("o.xml"), dir.path().join("v.xml"));
    for (tool, file) in [(oxgrind(), &ours), (PathBuf::from("valgrind"), &theirs)] {
        run(Command::new(tool)
            .arg("--xml=yes")
            .arg(format!("--xml-file={}", file.display()))
            .arg(&prog));
    }
    let (o, t) = (xml_normalized(&ours), xml_normalized(&theirs));
    assert!(o.contains("<kind>InvalidWrite</kind>"), "{o}");
    if o != t {
        let first = o.lines().zip(t.lines()).position(|(a, b)| a != b);
        panic!("XML differs at line {first:?}:\n--- ours\n{o}\n--- valgrind\n{t}");
    }
}

/// Correct programs that use glibc's vectorised string functions on heap memory all the
/// time: no error, as under Valgrind (which replaces those functions).
#[test]
fn correct_real_programs_have_no_invalid_accesses() {
    for argv in [
        &["/usr/bin/python3", "-c", "pass"][..],
        &["/bin/ls", "-l", "/usr"],
    ] {
        if !Path::new(argv[0]).exists() {
            assert!(
                std::env::var_os("CI").is_none(),
                "{} is required in CI",
                argv[0]
            );
            continue;
        }
        let o = run(Command::new(oxgrind()).args(argv));
        let report = stderr(&o);
        assert!(o.status.success(), "{argv:?}: {report}");
        assert!(
            report.contains("ERROR SUMMARY: 0 errors from 0 contexts (suppressed: 0 from 0)"),
            "{argv:?}:\n{report}"
        );
    }
}

#[test]
fn accesses_up_to_a_blocks_last_byte_are_clean_and_one_past_is_not_as_valgrind() {
    // The inline check reads every granule an access of its size could touch at once
    // (the redzone after a block's last word among them); only the exact compares behind
    // it may report. Every width at every offset inside blocks of 1 to 40 bytes, then one
    // byte past or before at offsets no alignment rule excuses.
    let prog = build("access_widths.c", &["-g", "-O2", "-w"]);
    let Some((ours, theirs)) = both(&prog, &[]) else {
        return;
    };
    assert!(ours.contains("Invalid read of size 16"), "{ours}");
    assert_same_report(&ours, &theirs);
}

/// A freed block waits in Memcheck's queue, held back from glibc, and is read only in error:
/// the whole pages inside a big one go back to the kernel at its free (python3's big lists
/// in the 20 MB queue were a fifth of its peak resident memory), and a read of one after
/// the free is still an invalid read of a freed block.
#[test]
fn big_freed_blocks_keep_no_pages_while_queued() {
    let prog = build("mc_freed_pages.c", &["-g", "-O0"]);
    let o = run(Command::new(oxgrind()).arg(&prog));
    let (out, report) = (stdout(&o), stderr(&o));
    // "NAME freed: resident dropped by N KiB"
    let dropped = |what: &str| -> i64 {
        let line = out
            .lines()
            .find(|l| l.starts_with(what))
            .unwrap_or_else(|| panic!("no {what:?} in\n{out}"));
        line.rsplit(' ').nth(1).unwrap().parse().unwrap()
    };
    // The block's 256 pages leave the resident set at its free (held whole, about 120 KiB
    // left: the V bits the free marks defined, given back by the shadow's own sweep).
    assert!(dropped("1 MiB block") >= 900, "{out}");
    assert!(
        report.contains("Invalid read of size 1")
            && report.contains("is 102,400 bytes inside a block of size 262,144 free'd"),
        "{report}"
    );
}
