//! Replays the heap events of Valgrind's reference runs (`tests/data/mc_errors.c`) through
//! Memcheck with a fake host, and compares the report with what Valgrind 3.19 printed
//! (`tests/data/*.txt`, `*.xml`), byte for byte where we can produce the same errors.
//!
//! What the fake host stands for: the runtime's stacks (raw addresses), the symbolizer
//! (`describe`), the live-block table, the program's memory and its root set. Addresses,
//! stacks and sizes are those of the reference run, so the output must be identical except
//! where a documented limitation applies (each is removed from the expected text below
//! with a comment saying why).

mod common;

use common::{frame, FakeHost, Program, FREE, MALLOC};
use oxgrind_memcheck::Memcheck;
use oxgrind_tool::{AllocFn, Exit, Misuse, RootKind, RootRange, Tool};

/// The events of `mc_errors.c` that concern the allocator, at the reference run's
/// addresses (from `mc_errors.full.all-kinds.txt` where printed, otherwise invented but in
/// allocation order, as Valgrind's allocator hands them out).
fn run_mc_errors(args: &[&str]) -> FakeHost {
    let mut host = FakeHost {
        pid: 19191,
        cmd: vec!["./mc_errors".into()],
        log_to_file: args.iter().any(|a| a.starts_with("--log-file=")),
        ..Default::default()
    };
    for (ip, f, l) in [
        (MALLOC, "malloc", 0),
        (FREE, "free", 0),
        (0x109238, "main", 23),
        (0x109260, "main", 28),
        (0x109276, "main", 31),
        (0x10936E, "main", 52),
        (0x10937E, "main", 54),
        (0x10918A, "leak_definite", 8),
        (0x109383, "main", 55),
        (0x1091AB, "leak_indirect", 10),
        (0x1091B9, "leak_indirect", 11),
        (0x1091D5, "leak_indirect", 12),
        (0x109388, "main", 56),
        (0x1091F1, "leak_possible", 16),
        (0x10938D, "main", 57),
        (0x109215, "keep_reachable", 19),
        (0x109392, "main", 58),
    ] {
        host.frames.insert(ip, frame(ip, f, l));
    }
    // Globals of mc_errors: `interior` (leak_possible) and `global_keep`.
    host.roots = vec![RootRange {
        start: 0x10c000,
        end: 0x10c020,
        kind: RootKind::Global,
    }];
    let mut tool = Memcheck::new();
    let core = oxgrind_tool::CoreView::from_options(args).unwrap();
    for a in args {
        if !oxgrind_tool::CoreView::default().parse_option(a).unwrap() {
            assert!(tool.parse_option(a).unwrap(), "{a}");
        }
    }
    tool.core_options(&core);
    let supp =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/test.supp"))
            .unwrap();
    tool.provide_suppressions_file("test.supp", supp);
    tool.post_options().unwrap();
    tool.start(&host);
    let p = Program {
        host: &host,
        tool: &tool,
    };
    p.malloc(0x4a40040, 40, &[MALLOC, 0x109238]);
    p.free(0x4a40040, &[FREE, 0x109260]);
    p.free(0x4a40040, &[FREE, 0x109276]); // double free
    p.malloc(0x4a400b0, 16, &[MALLOC, 0x109290]); // arr
    p.malloc(0x4a40100, 8, &[MALLOC, 0x10929E]); // idxp
    p.free(0x4a40100, &[FREE, 0x1092D5]);
    p.free(0x4a400b0, &[FREE, 0x1092E1]);
    p.malloc(0x4a40150, 16, &[MALLOC, 0x1092ED]); // buf
    p.free(0x4a40150, &[FREE, 0x109313]);
    p.misuse(
        Misuse::FishyValue {
            func: AllocFn::Malloc,
            arg: "size",
            value: (-5i64) as u64,
        },
        &[MALLOC, 0x10936E],
    );
    p.free(0x1fff0005c0, &[FREE, 0x10937E]); // free(s): a stack array
    p.malloc(0x4a401a0, 100, &[MALLOC, 0x10918A, 0x109383]);
    p.malloc(0x4a40250, 16, &[MALLOC, 0x1091AB, 0x109388]);
    p.malloc(0x4a402a0, 40, &[MALLOC, 0x1091B9, 0x109388]);
    p.malloc(0x4a40310, 24, &[MALLOC, 0x1091D5, 0x109388]);
    p.store(0x4a40250, 0x4a402a0);
    p.store(0x4a40258, 0x4a40310);
    p.malloc(0x4a40370, 64, &[MALLOC, 0x1091F1, 0x10938D]);
    p.store(0x10c008, 0x4a40370 + 10);
    p.malloc(0x4a403f0, 33, &[MALLOC, 0x109215, 0x109392]);
    p.store(0x10c010, 0x4a403f0);
    tool.fini(&host, Exit::Normal(0));
    let status = tool.exit_status();
    host.files
        .borrow_mut()
        .insert("<exit status>".into(), format!("{status:?}").into_bytes());
    host
}

fn reference(name: &str) -> String {
    std::fs::read_to_string(format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// Removes whole error blocks (headline to the closing blank line) whose headline is one
/// of `headlines`: errors that need the instrumenting engine (Memcheck part 2).
fn drop_blocks(text: &str, headlines: &[&str]) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for line in text.split_inclusive('\n') {
        let body = line
            .split_once("== ")
            .map(|x| x.1)
            .unwrap_or(line)
            .trim_end_matches('\n');
        if skipping {
            if body.is_empty() {
                skipping = false;
            }
            continue;
        }
        if headlines.iter().any(|h| body.starts_with(h)) {
            skipping = true;
            continue;
        }
        out.push_str(line);
    }
    out
}

const ENGINE_ERRORS: &[&str] = &[
    "Invalid write of size",
    "Invalid read of size",
    "Conditional jump or move",
    "Use of uninitialised value",
    "Syscall param",
];

/// Our host cannot say which thread's stack an address is on (see the report); Memcheck
/// then describes it as unknown.
fn without_stack_description(text: &str) -> String {
    text.replace(
        "Address 0x1fff0005c0 is on thread 1's stack\n==19191==  in frame #1, created by main (mc_errors.c:21)",
        "Address 0x1fff0005c0 is not stack'd, malloc'd or (recently) free'd",
    )
}

#[test]
fn full_leak_check_with_all_kinds_matches_valgrind_text() {
    let host = run_mc_errors(&["--leak-check=full", "--show-leak-kinds=all"]);
    let mut expected = drop_blocks(&reference("mc_errors.full.all-kinds.txt"), ENGINE_ERRORS);
    expected = without_stack_description(&expected);
    // Only value errors produce this hint.
    expected = expected.replace(
        "==19191== Use --track-origins=yes to see where uninitialised values come from\n",
        "",
    );
    // 12 errors minus the 6 of ENGINE_ERRORS (2 reads, 1 write, cond, value, param).
    expected = expected.replace(
        "ERROR SUMMARY: 12 errors from 12 contexts",
        "ERROR SUMMARY: 6 errors from 6 contexts",
    );
    let expected = expected.trim_end().to_string() + "\n";
    assert_eq!(*host.log.borrow(), expected);
}

#[test]
fn default_summary_mode_matches_valgrind_text() {
    let host = run_mc_errors(&[]);
    let mut expected = drop_blocks(&reference("mc_errors.default-summary.txt"), ENGINE_ERRORS);
    expected = without_stack_description(&expected.replace("19200", "19191"));
    expected = expected.replace(
        "==19191== Use --track-origins=yes to see where uninitialised values come from\n",
        "",
    );
    // Summary mode counts no leak errors: 9 minus the 6 engine errors.
    expected = expected.replace(
        "ERROR SUMMARY: 9 errors from 9 contexts",
        "ERROR SUMMARY: 3 errors from 3 contexts",
    );
    let expected = expected.trim_end().to_string() + "\n";
    assert_eq!(*host.log.borrow(), expected);
}

#[test]
fn suppressions_and_s_listing_match_valgrind_text_and_exit_code() {
    let host = run_mc_errors(&[
        "--leak-check=full",
        "--suppressions=test.supp",
        "-s",
        "--error-exitcode=42",
    ]);
    // From mc_errors.with-supp.s.error-exitcode42.txt, without the engine's errors and
    // suppressions (addr4-in-main, param-write) and with our stack-address description.
    let expected = "\
==19191== Memcheck, a memory error detector
==19191== Copyright (C) 2002-2022, and GNU GPL'd, by Julian Seward et al.
==19191== Using Valgrind-3.19.0 and LibVEX; rerun with -h for copyright info
==19191== Command: ./mc_errors
==19191== 
==19191== Invalid free() / delete / delete[] / realloc()
==19191==    at 0x484417B: free (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==19191==    by 0x109276: main (mc_errors.c:31)
==19191==  Address 0x4a40040 is 0 bytes inside a block of size 40 free'd
==19191==    at 0x484417B: free (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==19191==    by 0x109260: main (mc_errors.c:28)
==19191==  Block was alloc'd at
==19191==    at 0x48417B4: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==19191==    by 0x109238: main (mc_errors.c:23)
==19191== 
==19191== Invalid free() / delete / delete[] / realloc()
==19191==    at 0x484417B: free (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==19191==    by 0x10937E: main (mc_errors.c:54)
==19191==  Address 0x1fff0005c0 is not stack'd, malloc'd or (recently) free'd
==19191== 
==19191== 
==19191== HEAP SUMMARY:
==19191==     in use at exit: 277 bytes in 6 blocks
==19191==   total heap usage: 10 allocs, 6 frees, 357 bytes allocated
==19191== 
==19191== 64 bytes in 1 blocks are possibly lost in loss record 4 of 6
==19191==    at 0x48417B4: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==19191==    by 0x1091F1: leak_possible (mc_errors.c:16)
==19191==    by 0x10938D: main (mc_errors.c:57)
==19191== 
==19191== 100 bytes in 1 blocks are definitely lost in loss record 6 of 6
==19191==    at 0x48417B4: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==19191==    by 0x10918A: leak_definite (mc_errors.c:8)
==19191==    by 0x109383: main (mc_errors.c:55)
==19191== 
==19191== LEAK SUMMARY:
==19191==    definitely lost: 100 bytes in 1 blocks
==19191==    indirectly lost: 0 bytes in 0 blocks
==19191==      possibly lost: 64 bytes in 1 blocks
==19191==    still reachable: 33 bytes in 1 blocks
==19191==         suppressed: 80 bytes in 3 blocks
==19191== Reachable blocks (those to which a pointer was found) are not shown.
==19191== To see them, rerun with: --leak-check=full --show-leak-kinds=all
==19191== 
==19191== ERROR SUMMARY: 4 errors from 4 contexts (suppressed: 2 from 2)
==19191== 
==19191== 1 errors in context 1 of 4:
==19191== Invalid free() / delete / delete[] / realloc()
==19191==    at 0x484417B: free (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==19191==    by 0x10937E: main (mc_errors.c:54)
==19191==  Address 0x1fff0005c0 is not stack'd, malloc'd or (recently) free'd
==19191== 
==19191== 
==19191== 1 errors in context 2 of 4:
==19191== Invalid free() / delete / delete[] / realloc()
==19191==    at 0x484417B: free (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==19191==    by 0x109276: main (mc_errors.c:31)
==19191==  Address 0x4a40040 is 0 bytes inside a block of size 40 free'd
==19191==    at 0x484417B: free (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==19191==    by 0x109260: main (mc_errors.c:28)
==19191==  Block was alloc'd at
==19191==    at 0x48417B4: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==19191==    by 0x109238: main (mc_errors.c:23)
==19191== 
--19191-- 
--19191-- used_suppression:      3 leak-indirect-wild test.supp:8 suppressed: 144 bytes in 3 blocks
--19191-- used_suppression:      1 fishy test.supp:23
==19191== 
==19191== ERROR SUMMARY: 4 errors from 4 contexts (suppressed: 2 from 2)
";
    assert_eq!(*host.log.borrow(), expected);
    assert_eq!(host.files.borrow()["<exit status>"], b"Some(42)");
}

#[test]
fn no_error_exit_status_without_error_exitcode() {
    let host = run_mc_errors(&[]);
    assert_eq!(host.files.borrow()["<exit status>"], b"None");
}

#[test]
fn gen_suppressions_all_prints_valgrinds_entries_after_each_error() {
    let host = run_mc_errors(&[
        "--leak-check=full",
        "--show-leak-kinds=all",
        "--gen-suppressions=all",
        "--log-file=x",
    ]);
    let log = host.log.borrow();
    let reference = drop_blocks(
        &reference("mc_errors.gen-suppressions-all.log"),
        ENGINE_ERRORS,
    );
    // Every suppression entry we print is one Valgrind printed (same kind, extra, frames).
    let entries = |t: &str| -> Vec<String> {
        t.split("{\n")
            .skip(1)
            .map(|e| e.split("}\n").next().unwrap().to_string())
            .collect()
    };
    let ours = entries(&log);
    let theirs = entries(&reference);
    assert_eq!(ours.len(), 3 + 6, "{log}");
    for e in &ours {
        assert!(theirs.contains(e), "not in the reference: {e}");
    }
    assert!(log.contains("==19191== Parent PID: "));
}

#[test]
fn xml_output_matches_valgrind_for_the_errors_we_produce() {
    let host = run_mc_errors(&[
        "--leak-check=full",
        "--suppressions=test.supp",
        "--xml=yes",
        "--xml-file=mc_errors.supp.xml",
    ]);
    assert_eq!(
        *host.log.borrow(),
        "",
        "nothing on the text channel in XML mode"
    );
    let ours = String::from_utf8(host.files.borrow()["<xml>"].clone()).unwrap();
    let theirs = reference("mc_errors.with-supp.xml");
    // Same skeleton: header up to the first <status>, and the trailer after <errorcounts>.
    let head = |t: &str| t[t.find("<preamble>").unwrap()..t.find("<pid>").unwrap()].to_string();
    assert_eq!(head(&ours), head(&theirs));
    assert!(ours.starts_with(
        "<?xml version=\"1.0\"?>\n\n<valgrindoutput>\n\n<protocolversion>4</protocolversion>\n"
    ));
    assert!(ours.ends_with(
        "<suppcounts>\n  <pair>\n    <count>3</count>\n    <name>leak-indirect-wild</name>\n  </pair>\n  <pair>\n    <count>1</count>\n    <name>fishy</name>\n  </pair>\n</suppcounts>\n\n</valgrindoutput>\n\n"
    ));
    // The double-free error is Valgrind's, but for its unique number (we produce fewer
    // errors before it: Valgrind's 0x3 is our 0x0).
    let theirs_err = &theirs[theirs.find("<error>\n  <unique>0x3</unique>").unwrap()..];
    let theirs_err = &theirs_err[..theirs_err.find("</error>").unwrap()];
    assert!(ours.contains(&theirs_err.replace("<unique>0x3</unique>", "<unique>0x0</unique>")));
    // Leak errors: loss records 4 and 6 of 6, with their bytes and stacks.
    for unique in ["0xc", "0xe"] {
        let t = &theirs[theirs
            .find(&format!("<error>\n  <unique>{unique}</unique>"))
            .unwrap()..];
        let body = &t[t.find("<tid>").unwrap()..t.find("</error>").unwrap()];
        assert!(ours.contains(body), "missing leak error {unique}");
    }
    let wellformed = std::process::Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import sys,xml.dom.minidom; xml.dom.minidom.parseString(sys.stdin.read())",
        ])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(ours.as_bytes())?;
            c.wait()
        });
    if let Ok(status) = wellformed {
        assert!(status.success(), "XML is not well-formed:\n{ours}");
    }
}

#[test]
fn quiet_mode_prints_only_errors() {
    let host = run_mc_errors(&["-q", "--leak-check=full"]);
    let log = host.log.borrow();
    assert!(!log.contains("Memcheck, a memory error detector"));
    assert!(!log.contains("HEAP SUMMARY"));
    assert!(!log.contains("LEAK SUMMARY"));
    assert!(!log.contains("ERROR SUMMARY"));
    assert!(log.contains("are definitely lost in loss record 6 of 6"));
    assert_eq!(log.matches("Invalid free()").count(), 2);
}

#[test]
fn malformed_suppression_file_is_an_error_naming_file_and_line() {
    let mut tool = Memcheck::new();
    tool.core_options(&oxgrind_tool::CoreView::from_options(&["--suppressions=bad.supp"]).unwrap());
    tool.provide_suppressions_file("bad.supp", "{\n  x\n  Memcheck:Leak\n  fun:malloc\n".into());
    let e = tool.post_options().unwrap_err();
    assert_eq!(
        e.0,
        "FATAL: in suppressions file \"bad.supp\" near line 4:\n   unexpected end-of-file (when reading stack trace)\nexiting now."
    );
    let mut tool = Memcheck::new();
    tool.core_options(
        &oxgrind_tool::CoreView::from_options(&["--suppressions=/nonexistent/x.supp"]).unwrap(),
    );
    assert!(tool
        .post_options()
        .unwrap_err()
        .0
        .contains("can't open suppressions file \"/nonexistent/x.supp\""));
}
