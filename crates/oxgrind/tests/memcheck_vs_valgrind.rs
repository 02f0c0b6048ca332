//! Memcheck, differentially: the same program under Valgrind's memcheck and ours, with the
//! same options, must print the same report once pids, addresses and the name of the
//! preloaded library are normalised. Differences we keep on purpose are asserted exactly
//! (and listed in docs/differences-from-valgrind.md), never filtered away wholesale.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn both(prog: &Path, opts: &[&str]) -> Option<(String, String)> {
    both_args(prog, opts, &[])
}

fn both_args(prog: &Path, opts: &[&str], args: &[&str]) -> Option<(String, String)> {
    reports_beside_valgrind(prog, opts, args)
}

#[test]
fn heap_errors_and_every_leak_kind_match_valgrind() {
    let prog = build("mc_heap.c", &["-g", "-O0", "-w"]);
    for opts in [
        &["--leak-check=full", "--show-leak-kinds=all"][..],
        &["--leak-check=full"],
        &["--leak-check=summary"],
        &["--leak-check=full", "--show-reachable=yes", "-s"],
        &[
            "--leak-check=full",
            "--errors-for-leak-kinds=all",
            "--error-exitcode=9",
        ],
        &["-q", "--leak-check=full"],
        &["--leak-check=full", "--num-callers=2"],
        &[
            "--leak-check=full",
            "--exit-on-first-error=yes",
            "--error-exitcode=7",
        ],
    ] {
        let Some((ours, theirs)) = both(&prog, opts) else {
            return;
        };
        eprintln!("options {opts:?}");
        assert_same_report(&ours, &theirs);
    }
}

#[test]
fn reallocs_past_a_small_freed_block_queue_match_valgrind() {
    let prog = build("mc_realloc_growth.c", &["-g", "-O0"]);
    for vol in [
        "--freelist-vol=0",
        "--freelist-vol=1",
        "--freelist-vol=1000",
    ] {
        let Some((ours, theirs)) = both(&prog, &["--leak-check=full", vol]) else {
            return;
        };
        eprintln!("{vol}");
        assert_same_report(&ours, &theirs);
    }
}

#[test]
fn mismatched_frees_and_cxx_leaks_match_valgrind() {
    let prog = build("mc_cxx.cpp", &["-g", "-O0"]);
    let Some((ours, theirs)) = both(&prog, &["--leak-check=full", "--show-leak-kinds=all"]) else {
        return;
    };
    assert_same_report(&ours, &theirs);
}

/// The first errors of the run are invalid accesses in C++ functions: their reports, written
/// from the access probes' slow path, demangle names with libstdc++'s `__cxa_demangle`
/// (malloc, free, and `dlsym` on first use). Those are oxgrind's allocations, not the
/// program's: HEAP SUMMARY, the leak check and the errors must be Valgrind's.
#[test]
fn invalid_accesses_in_cxx_code_match_valgrind() {
    let prog = build("mc_cxx_access.cpp", &["-g", "-O0"]);
    let Some((ours, theirs)) = both(&prog, &["--leak-check=full", "--show-leak-kinds=all"]) else {
        return;
    };
    assert!(
        ours.contains("shapes::Grid::read_past_end() const"),
        "frames demangled:\n{ours}"
    );
    assert_same_report(&ours, &theirs);
}

/// At -O1, `rbp` is an ordinary register: at an allocation it held the address of a block
/// the program leaks later. The runtime's cache of stack walks (thread-local storage, in
/// the program's memory) kept that frame pointer, and the leak check found it there: the
/// block was "still reachable" where Valgrind reports it definitely lost.
#[test]
fn optimised_cxx_leaks_match_valgrind() {
    let prog = build("mc_cxx_access.cpp", &["-g", "-O1"]);
    let Some((ours, theirs)) = both(&prog, &["--leak-check=full"]) else {
        return;
    };
    assert!(
        ours.contains("definitely lost: 32 bytes in 1 blocks"),
        "{ours}"
    );
    assert_same_report(&ours, &theirs);
}

#[test]
fn leaks_from_threads_and_exit_from_a_thread_match_valgrind() {
    let prog = build("mc_threads.c", &["-g", "-O0"]);
    let Some((ours, theirs)) = both(&prog, &["--leak-check=full", "--show-leak-kinds=all"]) else {
        return;
    };
    // glibc's per-thread DTV has one more 16-byte slot under oxgrind, because our runtime
    // library has a TLS segment (Valgrind's preload has none): the two live threads' DTV
    // blocks are 16 bytes bigger each. Everything else is identical.
    // Exactly 16 bytes per DTV, on exactly the lines that count them: 2 live threads' DTVs
    // are in use at exit (possibly lost); 4 were allocated in all (glibc reuses the stacks,
    // and their DTVs, of the first threads for the last two).
    assert!(
        ours.contains("bytes in 2 blocks are possibly lost"),
        "{ours}"
    );
    assert_same_report(&less_dtv_bytes(&ours, 2 * 16, 4 * 16), &theirs);
}

#[test]
fn a_pointer_left_in_a_freed_block_of_a_threads_arena_is_no_root() {
    // The thread's arena holds no live block at exit, only the freed one whose first word
    // still points to the main thread's block: Valgrind (no glibc arenas) says definitely
    // lost; scanning the arena as memory of the program's would say still reachable.
    let prog = build("mc_stale_arena_pointer.c", &["-g", "-O0"]);
    let Some((ours, theirs)) = both(&prog, &["--leak-check=full", "--show-leak-kinds=all"]) else {
        return;
    };
    assert!(
        ours.contains("48 bytes in 1 blocks are definitely lost"),
        "{ours}"
    );
    // The joined thread's DTV, freed, was 16 bytes bigger (see the test above).
    assert_same_report(&less_dtv_bytes(&ours, 0, 16), &theirs);
}

#[test]
fn leak_checks_after_a_thread_exited_scan_no_dead_frames_as_valgrind() {
    // The thread's blocks are pointed to only from its dead frames (definitely lost) and
    // its TLS (still reachable at the request, while glibc keeps its stack).
    let prog = build("mc_leak_after_thread.c", &["-g", "-O0"]);
    for args in [&["request"][..], &[]] {
        let Some((ours, theirs)) = both_args(&prog, &["--leak-check=full"], args) else {
            return;
        };
        eprintln!("{args:?}");
        let request = !args.is_empty();
        if request {
            assert!(
                ours.contains("definitely lost: 58,607 bytes in 586 blocks"),
                "{ours}"
            );
            assert!(
                ours.contains("still reachable: 40 bytes in 1 blocks"),
                "{ours}"
            );
        }
        assert!(
            ours.contains("definitely lost: 58,647 bytes in 587 blocks"),
            "{ours}"
        );
        // The exited thread's DTV, 16 bytes bigger here (see `less_dtv_bytes`), is
        // possibly lost at the request only.
        let ours = if request {
            ours.replace(
                "304 bytes in 1 blocks are possibly lost",
                "288 bytes in 1 blocks are possibly lost",
            )
            .replace(
                "possibly lost: 304 bytes in 1 blocks",
                "possibly lost: 288 bytes in 1 blocks",
            )
        } else {
            ours
        };
        let ours = ours.replace("63,047 bytes allocated", "63,031 bytes allocated");
        assert_same_report(&ours, &theirs);
    }
}

/// Takes the DTV difference out of a report: `live` bytes from the lines counting the live
/// threads' DTV blocks (their loss record, the possibly-lost total, bytes in use), and
/// `allocated` bytes from "bytes allocated".
fn less_dtv_bytes(report: &str, live: u64, allocated: u64) -> String {
    report
        .lines()
        .map(|l| {
            let counts = l.contains("are possibly lost in loss record")
                || l.contains("possibly lost: ")
                || l.contains("in use at exit: ")
                || l.contains("bytes allocated");
            if !counts {
                return l.to_string();
            }
            // The number before " bytes" (for "bytes allocated", the last number).
            let key = if l.contains("bytes allocated") {
                " bytes allocated"
            } else {
                " bytes in "
            };
            let Some(end) = l.find(key) else {
                return l.to_string();
            };
            let start = l[..end]
                .rfind(|c: char| !(c.is_ascii_digit() || c == ','))
                .map_or(0, |i| i + 1);
            let v: u64 = l[start..end].replace(',', "").parse().unwrap();
            let n = if l.contains("bytes allocated") {
                allocated
            } else {
                live
            };
            let fixed = oxgrind_formats_commify(v - n);
            format!("{}{}{}", &l[..start], fixed, &l[end..])
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn oxgrind_formats_commify(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[test]
fn invalid_frees_of_stack_and_global_addresses_are_described_as_valgrind_does() {
    // "is on thread 1's stack / in frame #1, created by free_stack (...)" and
    // "is 0 bytes inside data symbol \"global_array\"".
    let prog = build("mc_static_free.c", &["-g", "-O0", "-w"]);
    let Some((ours, theirs)) = both(&prog, &[]) else {
        return;
    };
    assert!(
        ours.contains("in frame #1, created by free_stack"),
        "{ours}"
    );
    assert!(
        ours.contains("bytes inside data symbol \"global_array\""),
        "{ours}"
    );
    assert_same_report(&ours, &theirs);
}

/// Element paths of an XML document, in document order, as a real consumer (Python's
/// xml.dom.minidom) reads them.
fn xml_structure(path: &Path) -> String {
    let script = r#"
import sys, xml.dom.minidom
doc = xml.dom.minidom.parse(sys.argv[1])
out = []
def walk(n, path):
    for c in n.childNodes:
        if c.nodeType == c.ELEMENT_NODE:
            p = path + "/" + c.tagName
            if c.tagName not in ("pid", "ppid", "ip", "obj", "unique", "tid", "line", "dir", "file", "fn", "exe", "arg", "duration"):
                out.append(p)
            walk(c, p)
walk(doc, "")
print("\n".join(out))
"#;
    let o = run(Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(script)
        .arg(path));
    assert!(
        o.status.success(),
        "{} is not well-formed XML: {}",
        path.display(),
        stderr(&o)
    );
    stdout(&o)
}

#[test]
fn xml_output_is_well_formed_and_has_valgrinds_structure() {
    if !have_valgrind() {
        return;
    }
    let prog = build("mc_heap.c", &["-g", "-O0", "-w"]);
    let dir = tempfile::tempdir().unwrap();
    let (ours, theirs) = (dir.path().join("ours.xml"), dir.path().join("theirs.xml"));
    for (tool, file) in [
        (oxgrind(), &ours),
        (Path::new("valgrind").to_path_buf(), &theirs),
    ] {
        let o = run(Command::new(tool)
            .args(["--xml=yes", "--leak-check=full"])
            .arg(format!("--xml-file={}", file.display()))
            .arg(&prog));
        assert!(o.status.success(), "{}", stderr(&o));
    }
    // Both sides differ only in the frames of our preloaded library: compare the element
    // structure with frame-level leaves dropped (see xml_structure).
    assert_eq!(xml_structure(&ours), xml_structure(&theirs));
}

#[test]
fn generated_suppressions_silence_the_same_errors_in_oxgrind_and_in_valgrind() {
    if !have_valgrind() {
        return;
    }
    let prog = build("mc_heap.c", &["-g", "-O0", "-w"]);
    let o = run(Command::new(oxgrind())
        .args(["--leak-check=full", "--gen-suppressions=all"])
        .arg(&prog));
    let blocks: Vec<String> = {
        let text = stderr(&o);
        let mut out = Vec::new();
        let mut cur: Option<String> = None;
        for l in text.lines() {
            if l == "{" {
                cur = Some(String::from("{\n"));
            } else if let Some(c) = cur.as_mut() {
                c.push_str(l);
                c.push('\n');
                if l == "}" {
                    out.push(cur.take().unwrap());
                }
            }
        }
        out
    };
    assert!(
        blocks.len() >= 5,
        "expected suppressions for every error and leak: {}",
        stderr(&o)
    );
    let dir = tempfile::tempdir().unwrap();
    let supp = dir.path().join("gen.supp");
    // Our frame 0 lives in our library; Valgrind's in its preload: let `obj:` lines of either
    // match both by naming frame 0 by function only (which --gen-suppressions already does).
    std::fs::write(&supp, blocks.concat()).unwrap();
    for tool in [oxgrind(), Path::new("valgrind").to_path_buf()] {
        let r = run(Command::new(&tool)
            .args(["--leak-check=full", "-s"])
            .arg(format!("--suppressions={}", supp.display()))
            .arg(&prog));
        let err = stderr(&r);
        let summary = err
            .lines()
            .find(|l| l.contains("ERROR SUMMARY"))
            .unwrap_or_default()
            .to_string();
        assert!(
            summary.contains("ERROR SUMMARY: 0 errors from 0 contexts"),
            "{} still reports: {summary}\n{err}",
            tool.display()
        );
    }
}

/// The LEAK SUMMARY and ERROR SUMMARY lines of a report, without the `==PID==` prefix.
fn summary_lines(report: &str) -> Vec<String> {
    report
        .lines()
        .filter(|l| {
            l.contains("ERROR SUMMARY")
                || l.contains(" lost: ")
                || l.contains("still reachable: ")
                || l.contains("in use at exit")
        })
        .map(|l| l.split_once("== ").map_or(l, |x| x.1).trim().to_string())
        .collect()
}

/// Which leak categories are non-empty ("definitely lost", ...).
fn leak_categories(report: &str) -> Vec<String> {
    summary_lines(report)
        .into_iter()
        .filter(|l| {
            (l.contains(" lost: ") || l.contains("still reachable: "))
                && !l.contains(": 0 bytes in 0 blocks")
        })
        .map(|l| l.split(':').next().unwrap().to_string())
        .collect()
}

/// Real programs and clean corpus programs: the errors and leak categories Valgrind reports,
/// no more. Where the numbers are identical too (all but two), that is asserted.
#[test]
fn real_programs_report_no_errors_and_valgrinds_leak_categories() {
    if !have_valgrind() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sql = dir.path().join("w.sql");
    let mut text = String::from("create table t(a, b);\n");
    for i in 0..500 {
        text.push_str(&format!("insert into t values({i}, 'v{i}');\n"));
    }
    text.push_str("select count(*), max(a) from t;\n");
    std::fs::write(&sql, text).unwrap();
    let threads = build("threads.c", &["-g", "-O2"]);
    let cxx = build("containers.cpp", &["-g", "-O2"]);
    let rust = build("rust_prog.rs", &["-O"]);
    let cases: Vec<(Vec<String>, bool)> = vec![
        (
            vec![
                "/usr/bin/python3".into(),
                "-c".into(),
                "import json; print(json.dumps({'a': list(range(50))}))".into(),
            ],
            true,
        ),
        (vec!["/usr/bin/git".into(), "--version".into()], true),
        (vec!["/bin/ls".into(), "/usr".into()], true),
        (
            vec![
                "/usr/bin/sqlite3".into(),
                ":memory:".into(),
                format!(".read {}", sql.display()),
            ],
            true,
        ),
        (vec![threads.display().to_string()], true),
        (vec![cxx.display().to_string()], true),
        // perl copies its environment, and Valgrind's memcheck adds LD_PRELOAD and
        // LD_LIBRARY_PATH to it; Rust's runtime keeps a few environment-dependent bytes.
        (
            vec![
                "/usr/bin/perl".into(),
                "-e".into(),
                "my %h = map { $_ => 1 } 1..100; print scalar(keys %h)".into(),
            ],
            false,
        ),
        (vec![rust.display().to_string()], false),
    ];
    for (argv, exact) in cases {
        if !Path::new(&argv[0]).exists() {
            assert!(
                std::env::var_os("CI").is_none(),
                "{} is required in CI",
                argv[0]
            );
            continue;
        }
        let ours = run(Command::new(oxgrind()).arg("--leak-check=full").args(&argv));
        let theirs = run(Command::new("valgrind")
            .arg("--leak-check=full")
            .args(&argv));
        assert_eq!(
            stdout(&ours),
            stdout(&theirs),
            "{argv:?}: program output differs"
        );
        let (o, t) = (stderr(&ours), stderr(&theirs));
        let error_summary = |s: &str| {
            summary_lines(s)
                .into_iter()
                .find(|l| l.contains("ERROR SUMMARY"))
        };
        // Every error is one Valgrind reports too (for perl: its possibly-lost records).
        assert_eq!(error_summary(&o), error_summary(&t), "{argv:?}:\n{o}");
        if exact {
            assert_eq!(
                error_summary(&o).as_deref(),
                Some("ERROR SUMMARY: 0 errors from 0 contexts (suppressed: 0 from 0)"),
                "{argv:?}"
            );
        }
        assert_eq!(
            leak_categories(&o),
            leak_categories(&t),
            "{argv:?}: leak categories differ\n{o}\n{t}"
        );
        if exact {
            assert_eq!(
                summary_lines(&o),
                summary_lines(&t),
                "{argv:?}: summaries differ"
            );
        }
    }
}

#[test]
fn time_stamps_and_silent_forked_children() {
    let prog = build("endings.c", &["-g", "-O2"]);
    let o = run(Command::new(oxgrind())
        .args(["--time-stamp=yes"])
        .arg(&prog)
        .arg("exit"));
    let err = stderr(&o);
    let stamped = err.lines().filter(|l| l.starts_with("==")).all(|l| {
        // ==DD:HH:MM:SS.mmm PID==
        let b = l.as_bytes();
        b.len() > 20
            && b[4] == b':'
            && b[7] == b':'
            && b[10] == b':'
            && b[13] == b'.'
            && b[17] == b' '
    });
    assert!(stamped && err.contains("ERROR SUMMARY"), "{err}");
    // A forked child reports for itself, unless told to keep quiet.
    let count = |opts: &[&str]| {
        let o = run(Command::new(oxgrind()).args(opts).arg(&prog).arg("fork"));
        stderr(&o).matches("ERROR SUMMARY").count()
    };
    assert_eq!(count(&[]), 2);
    assert_eq!(count(&["--child-silent-after-fork=yes"]), 1);
}

#[test]
fn xml_goes_to_a_descriptor_with_xml_fd() {
    let prog = build("mc_heap.c", &["-g", "-O0", "-w"]);
    let dir = tempfile::tempdir().unwrap();
    let (by_fd, by_file) = (dir.path().join("fd.xml"), dir.path().join("file.xml"));
    let script = format!(
        "{} --xml=yes --xml-fd=3 --leak-check=full {} 3>{}",
        oxgrind().display(),
        prog.display(),
        by_fd.display()
    );
    let o = run(Command::new("/bin/sh").arg("-c").arg(&script));
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(Command::new(oxgrind())
        .args(["--xml=yes", "--leak-check=full"])
        .arg(format!("--xml-file={}", by_file.display()))
        .arg(&prog));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::metadata(&by_fd).unwrap().len() > 1000);
    assert_eq!(xml_structure(&by_fd), xml_structure(&by_file));
}

/// With --log-file the report goes to the file (with %p and %q{VAR} expanded) and the
/// preamble names the parent process, as Valgrind's does.
#[test]
fn log_file_templates_and_the_parent_pid_line() {
    let prog = build("mc_heap.c", &["-g", "-O0", "-w"]);
    let dir = tempfile::tempdir().unwrap();
    let o = run(Command::new(oxgrind())
        .env("OXG_TEST_JOB", "job7")
        .args(["--leak-check=full", "--log-file=mc.%q{OXG_TEST_JOB}.%p.log"])
        .arg(&prog)
        .current_dir(dir.path()));
    assert!(o.status.success());
    assert!(
        !stderr(&o).contains("ERROR SUMMARY"),
        "the report went to stderr"
    );
    let logs: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert!(
        logs[0].starts_with("mc.job7.") && logs[0].ends_with(".log"),
        "{logs:?}"
    );
    let text = std::fs::read_to_string(dir.path().join(&logs[0])).unwrap();
    let pid = logs[0]
        .trim_start_matches("mc.job7.")
        .trim_end_matches(".log")
        .to_string();
    assert!(text.contains(&format!("=={pid}== Parent PID: ")), "{text}");
    assert!(
        text.contains("ERROR SUMMARY: 10 errors from 10 contexts"),
        "{text}"
    );
}

/// With `-q --log-file=...%p`, every process leaves its file, empty when it has nothing to
/// report, as Valgrind's do: the shell, its forked subshell, and the programs they exec.
/// (Files were made at the first line logged: quiet processes left none.) With
/// `--child-silent-after-fork=yes` the forked subshell makes none.
#[test]
fn quiet_log_files_exist_for_every_process_as_valgrinds() {
    if !have_valgrind() {
        return;
    }
    let script = "/bin/true; (/bin/true; exit 0); exit 0";
    for silent in [false, true] {
        let count = |tool: &std::path::Path| {
            let dir = tempfile::tempdir().unwrap();
            let mut c = Command::new(tool);
            c.args(["-q", "--trace-children=yes", "--log-file=log.%p"]);
            if silent {
                c.arg("--child-silent-after-fork=yes");
            }
            let o = run(c.args(["/bin/sh", "-c", script]).current_dir(dir.path()));
            assert!(o.status.success(), "{}", stderr(&o));
            let sizes: Vec<u64> = std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .map(|e| e.metadata().unwrap().len())
                .collect();
            assert!(
                sizes.iter().all(|&n| n == 0),
                "quiet logs not empty: {sizes:?}"
            );
            sizes.len()
        };
        let ours = count(&oxgrind());
        let theirs = count(std::path::Path::new("valgrind"));
        assert_eq!(ours, theirs, "log files (silent children: {silent})");
        assert!(ours >= 2, "{ours}");
    }
}

/// The block from "Process terminating with default action of signal" to the heap summary.
fn fatal_block(report: &str) -> String {
    let start = report
        .find("Process terminating")
        .expect("no fatal-signal block");
    let end = report[start..]
        .find("HEAP SUMMARY")
        .map_or(report.len(), |e| start + e);
    report[start..end].to_string()
}

#[test]
fn death_by_signal_is_reported_as_valgrind_reports_it() {
    let prog = build("endings.c", &["-g", "-O2"]);
    // abort(): the whole report equals Valgrind's.
    let Some((ours, theirs)) = both_args(&prog, &["--leak-check=full"], &["abort"]) else {
        return;
    };
    assert!(
        ours.contains("Process terminating with default action of signal 6 (SIGABRT)"),
        "{ours}"
    );
    assert_same_report(&ours, &theirs);
    // A segfault: Valgrind also reports the invalid read itself (that needs the engine's
    // instrumentation); the fatal-signal block must be the same.
    let Some((ours, theirs)) = both_args(&prog, &[], &["segv"]) else {
        return;
    };
    assert!(
        ours.contains("Access not within mapped region at address 0xADDR"),
        "{ours}"
    );
    assert_eq!(fatal_block(&ours), fatal_block(&theirs));
}

/// A stack that runs out: the kernel cannot deliver the SIGSEGV on it, so the report is
/// written from the alternate stack the engine gives every thread (before, the process
/// died without one). The main thread's overflow is named as Valgrind names it ("Stack
/// overflow in thread #1: can't grow stack to ..."); a thread's is a fault on its guard page.
#[test]
fn a_stack_overflow_is_reported_as_valgrind_reports_it() {
    let prog = build("endings.c", &["-g", "-O2"]);
    let Some((ours, theirs)) = both_args(&prog, &["--leak-check=full"], &["stack-overflow"]) else {
        return;
    };
    assert!(
        ours.matches("Stack overflow in thread #1: can't grow stack to 0xADDR")
            .count()
            == 2,
        "{ours}"
    );
    assert_same_report(&ours, &theirs);
    let Some((ours, theirs)) = both_args(&prog, &["--leak-check=full"], &["thread-stack-overflow"])
    else {
        return;
    };
    assert!(
        ours.contains("Bad permissions for mapped region at address 0xADDR"),
        "{ours}"
    );
    // The leak report differs by the thread's DTV slot (`without_dtv_slot`), in three
    // lines: compare the fatal-signal block and the error count.
    assert_eq!(fatal_block(&ours), fatal_block(&theirs));
    let summary = |r: &str| r.lines().last().map(str::to_string);
    assert_eq!(summary(&ours), summary(&theirs));
}

/// A main-thread stack overflow the program catches (its SIGSEGV handler, on its own
/// alternate stack, jumps back): Valgrind's core still says the stack could not grow, at
/// the fault, with -q too, and the program goes on. (-q: without it Valgrind also warns of
/// the jump back as "client switching stacks?", which is not Memcheck's report.)
#[test]
fn a_caught_stack_overflow_is_named_as_valgrind_names_it() {
    let prog = build("endings.c", &["-g", "-O2"]);
    let Some((ours, theirs)) = both_args(&prog, &["-q"], &["caught-stack-overflow"]) else {
        return;
    };
    assert_eq!(
        ours.matches("Stack overflow in thread #1: can't grow stack to 0xADDR")
            .count(),
        1,
        "{ours}"
    );
    assert_same_report(&ours, &theirs);
}

#[test]
fn death_by_signal_in_xml_has_valgrinds_structure() {
    if !have_valgrind() {
        return;
    }
    let prog = build("endings.c", &["-g", "-O2"]);
    let dir = tempfile::tempdir().unwrap();
    let (ours, theirs) = (dir.path().join("ours.xml"), dir.path().join("theirs.xml"));
    for (tool, file) in [
        (oxgrind(), &ours),
        (Path::new("valgrind").to_path_buf(), &theirs),
    ] {
        run(Command::new(tool)
            .arg("--xml=yes")
            .arg(format!("--xml-file={}", file.display()))
            .arg(&prog)
            .arg("abort"));
    }
    let text = std::fs::read_to_string(&ours).unwrap();
    assert!(text.contains("<signame>SIGABRT</signame>"), "{text}");
    assert_eq!(xml_structure(&ours), xml_structure(&theirs));
}

#[test]
fn xml_reports_equal_valgrinds_line_for_line() {
    if !have_valgrind() {
        return;
    }
    let cases = [
        (build("mc_heap.c", &["-g", "-O0", "-w"]), vec![]),
        (build("mc_overlap.c", &["-g", "-O0", "-w"]), vec![]),
        (build("endings.c", &["-g", "-O2"]), vec!["abort"]),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (prog, args) in &cases {
        for quiet in [&[][..], &["-q"]] {
            let (ours, theirs) = (dir.path().join("o.xml"), dir.path().join("v.xml"));
            for (tool, file) in [(oxgrind(), &ours), (PathBuf::from("valgrind"), &theirs)] {
                run(Command::new(tool)
                    .args(quiet)
                    .args(["--xml=yes", "--leak-check=full"])
                    .arg(format!("--xml-file={}", file.display()))
                    .arg(prog)
                    .args(args));
            }
            let (o, t) = (xml_normalized(&ours), xml_normalized(&theirs));
            if o != t {
                let first = o.lines().zip(t.lines()).position(|(a, b)| a != b);
                panic!("{} {quiet:?}: XML differs at line {first:?}:\n--- ours\n{o}\n--- valgrind\n{t}", prog.display());
            }
        }
    }
}

#[test]
fn every_operator_new_and_delete_form_matches_valgrind() {
    let prog = build("cxx_new_forms.cpp", &["-g", "-O0", "-std=c++17"]);
    let Some((ours, theirs)) = both(&prog, &["--leak-check=full", "--show-leak-kinds=all"]) else {
        return;
    };
    // Every pair matches; the one block left is reachable from a global.
    assert!(
        ours.contains("ERROR SUMMARY: 0 errors from 0 contexts"),
        "{ours}"
    );
    assert!(
        ours.contains("still reachable: 256 bytes in 1 blocks"),
        "{ours}"
    );
    assert_same_report(&ours, &theirs);
}
