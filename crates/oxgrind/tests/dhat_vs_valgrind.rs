//! DHAT, differentially: the same program under Valgrind's DHAT and ours, program point by
//! program point (PPs matched by their frames, addresses aside).
//!
//! What must be equal, and what may differ (docs/differences-from-valgrind.md, DHAT):
//! * block and byte counts (`tb`, `tbk`, `mb`, `mbk`, `gb`, `gbk`, `eb`, `ebk`) and the
//!   summary lines: equal on deterministic programs;
//! * bytes read and written (`rb`, `wb`) and the access histograms (`acc`): equal when the
//!   program touches its blocks itself (`dhat_heap.c`); within a tolerance through libc's
//!   string functions (`dhat_strings.c`), which Valgrind replaces with byte and word loops
//!   and we leave as glibc's vector code;
//! * instruction counts (`tl`, `te`, `tg`): within a tolerance; see [`TIME_SLACK`].

mod common;
use common::*;
use oxgrind_formats::dhat::{self, DhatFile, Pp};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

/// Instructions Valgrind counts that we cannot see: everything before the engine takes
/// over in our runtime's constructor (the dynamic loader's work: 104,000 to 112,000 for
/// `dhat_heap.c` on this machine), less the allocator work we count and Valgrind does not.
/// `te` and `tg` may differ by this much.
const TIME_SLACK: u64 = 200_000;

/// One run of a corpus program under each tool: the files and the logs.
struct Both {
    ours: DhatFile,
    theirs: DhatFile,
    ours_text: String,
    theirs_text: String,
    ours_log: String,
    theirs_log: String,
}

fn dhat_both(prog: &Path, opts: &[&str]) -> Option<Both> {
    if !have_valgrind() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let go = |cmd: &mut Command, file: &str| -> (Output, String) {
        let out = run(cmd
            .arg("--tool=dhat")
            .args(opts)
            .arg(format!("--dhat-out-file={file}"))
            .arg(prog)
            .current_dir(dir.path()));
        let text = std::fs::read_to_string(dir.path().join(file))
            .unwrap_or_else(|e| panic!("{file} not written ({e}): {}", stderr(&out)));
        (out, text)
    };
    let (o, ours_text) = go(&mut Command::new(oxgrind()), "ours.json");
    assert!(o.status.success(), "oxgrind failed: {}", stderr(&o));
    let (v, theirs_text) = go(&mut Command::new("valgrind"), "theirs.json");
    assert!(v.status.success(), "valgrind failed: {}", stderr(&v));
    Some(Both {
        ours: dhat::parse(ours_text.as_bytes()).unwrap_or_else(|e| panic!("ours: {e}")),
        theirs: dhat::parse(theirs_text.as_bytes()).unwrap_or_else(|e| panic!("theirs: {e}")),
        ours_text,
        theirs_text,
        ours_log: stderr(&o),
        theirs_log: stderr(&v),
    })
}

/// A frame as both tools should print it: without its address, and the allocator's own
/// frame (Valgrind's `vgpreload_dhat…so`, our runtime) reduced to the function name.
fn norm_frame(text: &str) -> String {
    let body = match text.find(": ") {
        Some(i) if text.starts_with("0x") => &text[i + 2..],
        _ => text,
    };
    let preload = ["vgpreload_", "liboxgrind_runtime", "(hooks.rs:"];
    if preload.iter().any(|p| body.contains(p)) {
        let name = body.rsplit_once(" (").map_or(body, |(n, _)| n);
        return format!("{name} (PRELOAD)");
    }
    // Valgrind has no clone3, so glibc falls back to clone under it.
    body.replace("clone3 (clone3.S:81)", "clone (clone.S:100)")
}

/// PPs by their normalised frames.
fn by_frames(f: &DhatFile) -> BTreeMap<Vec<String>, &Pp> {
    let mut m = BTreeMap::new();
    for pp in &f.pps {
        let key: Vec<String> = pp
            .fs
            .iter()
            .map(|&i| norm_frame(&f.ftbl[i as usize]))
            .collect();
        assert!(m.insert(key.clone(), pp).is_none(), "two PPs at {key:?}");
    }
    m
}

/// The PPs of both files, paired; panics if the sets of program points differ.
fn paired(b: &Both) -> Vec<(Vec<String>, &Pp, &Pp)> {
    let (o, t) = (by_frames(&b.ours), by_frames(&b.theirs));
    assert_eq!(
        o.keys().collect::<Vec<_>>(),
        t.keys().collect::<Vec<_>>(),
        "different program points\n--- ours ---\n{}\n--- valgrind ---\n{}",
        b.ours_text,
        b.theirs_text
    );
    o.into_iter().map(|(k, p)| (k.clone(), p, t[&k])).collect()
}

fn sizes(p: &Pp) -> [u64; 8] {
    [p.tb, p.tbk, p.mb, p.mbk, p.gb, p.gbk, p.eb, p.ebk]
}

/// The summary lines (`Total:` to `Writes:`), prefix removed.
fn summary(log: &str) -> Vec<String> {
    normalize_report(log)
        .lines()
        .filter_map(|l| l.strip_prefix("==PID== "))
        .filter(|l| {
            ["Total:", "At t-gmax:", "At t-end:", "Reads:", "Writes:"]
                .iter()
                .any(|k| l.starts_with(k))
        })
        .map(str::to_string)
        .collect()
}

fn heap_run() -> Option<&'static Both> {
    static RUN: std::sync::OnceLock<Option<Both>> = std::sync::OnceLock::new();
    RUN.get_or_init(|| dhat_both(&build("dhat_heap.c", &["-O0", "-g"]), &[]))
        .as_ref()
}

#[test]
fn block_and_byte_counts_equal_valgrinds_per_program_point() {
    let Some(b) = heap_run() else { return };
    let pairs = paired(b);
    assert_eq!(pairs.len(), 9, "dhat_heap.c has nine allocation sites");
    for (at, o, t) in &pairs {
        assert_eq!(sizes(o), sizes(t), "tb..ebk at {at:?}");
    }
    // The 3.19 quirk is reproduced: allocated after the peak, so no maximum.
    let late = pairs
        .iter()
        .find(|(at, _, _)| at.iter().any(|f| f.contains("dhat_heap.c:58")))
        .expect("the late 7-byte block");
    assert_eq!((late.1.mb, late.1.eb), (0, 7));
}

/// Bytes of glibc's own bookkeeping a `realloc` that shrinks a block in place writes and
/// reads inside the block (the split-off remainder's chunk header and free-list links),
/// which the runtime reports as the program's: see docs/differences-from-valgrind.md.
const REALLOC_BOOKKEEPING: u64 = 32;

/// Whether `at` is the PP of `dhat_heap.c` whose block is shrunk by `realloc`.
fn shrunk_by_realloc(at: &[String]) -> bool {
    at.iter().any(|f| f.contains("dhat_heap.c:35"))
}

#[test]
fn bytes_read_written_and_histograms_equal_valgrinds_when_the_program_touches_them() {
    let Some(b) = heap_run() else { return };
    for (at, o, t) in paired(b) {
        if shrunk_by_realloc(&at) {
            for (what, ours, theirs) in [("rb", o.rb, t.rb), ("wb", o.wb, t.wb)] {
                assert!(
                    ours >= theirs && ours <= theirs + REALLOC_BOOKKEEPING,
                    "{what} at {at:?}: ours {ours} valgrind {theirs}"
                );
            }
        } else {
            assert_eq!((o.rb, o.wb), (t.rb, t.wb), "rb/wb at {at:?}");
        }
        assert_eq!(o.acc, t.acc, "acc at {at:?}");
    }
}

/// A summary line's number (`Reads:     2,729 bytes` → 2729).
fn number_in(line: &str) -> u64 {
    let digits: String = line
        .split_whitespace()
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))
        .unwrap_or("")
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

#[test]
fn summary_lines_equal_valgrinds() {
    let Some(b) = heap_run() else { return };
    let (o, t) = (summary(&b.ours_log), summary(&b.theirs_log));
    assert_eq!(o.len(), 5, "{}", b.ours_log);
    assert_eq!(o[..3], t[..3]);
    for i in 3..5 {
        assert_eq!(o[i].split(' ').next(), t[i].split(' ').next());
        let (ours, theirs) = (number_in(&o[i]), number_in(&t[i]));
        assert!(
            ours >= theirs && ours <= theirs + REALLOC_BOOKKEEPING,
            "{} vs {}",
            o[i],
            t[i]
        );
    }
    // And the rest of the log around them: banner, blank lines, viewer hint.
    let shape = |log: &str| -> Vec<String> {
        normalize_report(log)
            .lines()
            .map(|l| {
                if l.starts_with("==PID==   /") {
                    "==PID==   FILE".to_string()
                } else if summary(l).is_empty() {
                    l.to_string()
                } else {
                    "SUMMARY".to_string()
                }
            })
            .collect()
    };
    assert_eq!(shape(&b.ours_log), shape(&b.theirs_log));
}

/// Issue 13: accesses to large blocks (no histogram) are counted inline in each thread's hot
/// ranges, not recorded. Loops over two and three blocks (ranges replaced), a block grown
/// by realloc in use, one freed and made again, read-modify-writes, an access past a
/// block's end, both sides of the histogram limit, a small reallocated block (no histogram,
/// never hot) replaced by a new one: every count equals Valgrind's.
#[test]
fn accesses_counted_in_hot_ranges_equal_valgrinds() {
    let Some(b) = dhat_both(&build("dhat_hot.c", &["-O0", "-g"]), &[]) else {
        return;
    };
    let pairs = paired(&b);
    assert_eq!(pairs.len(), 10, "{}", b.ours_text);
    for (at, o, t) in pairs {
        assert_eq!(sizes(o), sizes(t), "tb..ebk at {at:?}");
        assert_eq!((o.rb, o.wb, &o.acc), (t.rb, t.wb, &t.acc), "at {at:?}");
    }
    let (o, t) = (summary(&b.ours_log), summary(&b.theirs_log));
    assert_eq!(o, t);
}

#[test]
fn end_and_peak_times_are_within_the_start_up_slack() {
    let Some(b) = heap_run() else { return };
    let (o, t) = (&b.ours, &b.theirs);
    assert!(o.te.abs_diff(t.te) <= TIME_SLACK, "te {} vs {}", o.te, t.te);
    assert!(o.tg.abs_diff(t.tg) <= TIME_SLACK, "tg {} vs {}", o.tg, t.tg);
    assert!(o.tg <= o.te && o.tg > 0);
}

#[test]
#[ignore = "glibc's allocator is no longer counted (Needs::allocator_unseen) and the report at exit runs natively, but on dhat_heap.c differences remain beyond the slack: blocks live at exit count about 1,900 instructions fewer than Valgrind's (4 such blocks at line 42: 17,998 against 25,680; Valgrind's exit path, its vgpreload libraries' and its freeres wrappers' instructions, is longer; not traced further), our hook counts about 5 instructions per call where Valgrind's wrapper counts 25 to 50 (line 53: 25 against 163), and a function's first call about 450 more"]
fn lifetimes_are_within_a_tenth_of_valgrinds() {
    let Some(b) = heap_run() else { return };
    // Lifetimes are differences of counts, so the unseen start-up cancels out: what is
    // left is the allocator wrappers (Valgrind's run in the program, a few dozen
    // instructions per call) and our engine's counting granularity.
    for (at, o, t) in paired(b) {
        let slack = t.tl / 10 + 100 * t.tbk;
        assert!(
            o.tl.abs_diff(t.tl) <= slack,
            "tl at {at:?}: ours {} valgrind {} (slack {slack})",
            o.tl,
            t.tl
        );
    }
}

#[test]
fn the_file_is_json_with_valgrinds_keys() {
    let Some(b) = heap_run() else { return };
    // Python's json module, as a third party reading the file.
    let keys = |text: &str| -> String {
        let mut child = Command::new("/usr/bin/python3")
            .args([
                "-c",
                "import json,sys; d=json.load(sys.stdin); \
                 print(sorted(d)); print(sorted({k for p in d['pps'] for k in p}))",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "python3 json refused the file");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(keys(&b.ours_text), keys(&b.theirs_text));
    // Line structure too: the same lines once numbers and frame texts are masked.
    let mask = |text: &str| -> Vec<String> {
        text.lines()
            .map(|l| {
                let l = match l.find("\"0x") {
                    Some(i) => format!("{}\"FRAME\"", &l[..i]),
                    None => l.to_string(),
                };
                let mut out = String::new();
                for c in l.chars() {
                    if !c.is_ascii_digit() {
                        out.push(c);
                    } else if !out.ends_with('#') {
                        out.push('#');
                    }
                }
                out
            })
            .collect()
    };
    assert_eq!(mask(&b.ours_text), mask(&b.theirs_text));
}

#[test]
fn valgrinds_viewer_renders_our_file_as_it_renders_valgrinds() {
    let Some(b) = heap_run() else { return };
    let harness = repo_root().join("../shared/reference/examples/tools/dh_view_harness.js");
    let viewer = Path::new("/usr/libexec/valgrind/dh_view.js");
    let node_ok = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !node_ok || !harness.exists() || !viewer.exists() {
        eprintln!("note: node, the dh_view harness or dh_view.js missing; viewer check skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let render = |text: &str, name: &str| -> String {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        let out = run(Command::new("node").arg(&harness).arg(viewer).arg(&p));
        assert!(
            out.status.success(),
            "dh_view refused {name}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        stdout(&out)
    };
    let ours = render(&b.ours_text, "ours.json");
    let theirs = render(&b.theirs_text, "theirs.json");
    // Every PP's byte lines (Total/Max/At t-gmax/At t-end) render the same; lines with
    // instruction counts, per-Minstr rates, the PID and frame texts may differ.
    let bytes_lines = |r: &str| -> Vec<String> {
        let mut v: Vec<String> = r
            .lines()
            .map(str::trim_start)
            .map(|l| l.trim_start_matches(['│', '├', '└', '─', ' ']))
            .filter(|l| l.starts_with("Max:") || l.starts_with("At t-"))
            .filter(|l| !l.contains("instrs"))
            .map(str::to_string)
            .collect();
        v.sort();
        v
    };
    assert!(!bytes_lines(&ours).is_empty(), "{ours}");
    assert_eq!(bytes_lines(&ours), bytes_lines(&theirs));
}

#[test]
fn string_functions_agree_within_the_vector_slack() {
    let Some(b) = dhat_both(&build("dhat_strings.c", &["-O0", "-g"]), &[]) else {
        return;
    };
    for (at, o, t) in paired(&b) {
        assert_eq!(sizes(o), sizes(t), "tb..ebk at {at:?}");
        // glibc's vector code may store a vector twice where the tail overlaps and read
        // whole aligned vectors past a string's end (within the page, so possibly within
        // the block): at most a few vectors per call more than Valgrind's byte loops, and
        // never less. Each block here goes through at most three such calls.
        for (what, ours, theirs) in [("rb", o.rb, t.rb), ("wb", o.wb, t.wb)] {
            assert!(
                ours >= theirs && ours <= theirs + 3 * 4 * 64,
                "{what} at {at:?}: ours {ours} valgrind {theirs}"
            );
        }
    }
}

#[test]
fn threads_give_valgrinds_totals_and_the_exact_accesses() {
    let Some(b) = dhat_both(&build("dhat_threads.c", &["-O0", "-g"]), &[]) else {
        return;
    };
    let pairs = paired(&b);
    assert_eq!(pairs.len(), 2, "{}", b.ours_text);
    for (at, o, t) in pairs {
        if at.iter().any(|f| f.contains("allocate_dtv")) {
            // glibc's thread-local storage vector, sized by the number of loaded modules
            // with TLS: our runtime is one more than Valgrind's preload.
            assert_eq!(o.tbk, t.tbk, "at {at:?}");
            continue;
        }
        // The interleaving decides the global peak (gb, mb), not these.
        assert_eq!(
            (o.tb, o.tbk, o.eb, o.ebk),
            (t.tb, t.tbk, t.eb, t.ebk),
            "at {at:?}"
        );
        // Each thread writes every byte of its blocks and reads every other one: 200
        // rounds of 16, 32 and 48 bytes. Valgrind counts less when a thread's blocks lie
        // within 16 KiB above its stack pointer (its stack-access filter), which depends
        // on the memory layout; we count them all.
        assert_eq!((o.rb, o.wb), (200 * (8 + 16 + 24), 200 * (16 + 32 + 48)));
        assert!(o.rb >= t.rb && o.wb >= t.wb);
    }
    let (o, t) = (summary(&b.ours_log), summary(&b.theirs_log));
    assert_eq!(o[2], t[2]);
    // Total blocks (the bytes include the TLS vectors' sizes).
    assert_eq!(
        o[0].rsplit_once(" in ").unwrap().1,
        t[0].rsplit_once(" in ").unwrap().1
    );
}

/// Issue 13: the runtime's own per-thread lookups must not be charged to the program. A
/// thread-local lookup through the dynamic loader (`__tls_get_addr`) runs translated and
/// reads the thread's TLS vector, a heap block; once per allocator call it made DHAT's bytes
/// read on a multi-threaded allocation loop many times Valgrind's.
#[test]
fn the_runtimes_thread_local_lookups_are_not_the_programs_accesses() {
    let Some(b) = dhat_both(&build("dhat_thread_churn.c", &["-O0", "-g"]), &[]) else {
        return;
    };
    // The program reads none of its blocks: what both tools count is glibc's (about 1 KB,
    // the TLS vectors read at thread start); the lookups made it hundreds of KB.
    let (o, t) = (summary(&b.ours_log), summary(&b.theirs_log));
    let (ours, theirs) = (number_in(&o[3]), number_in(&t[3]));
    assert!(
        ours.abs_diff(theirs) <= theirs / 8 + 256,
        "{} vs {}",
        o[3],
        t[3]
    );
    for (at, o, t) in paired(&b) {
        if at.iter().any(|f| f.contains("allocate_dtv")) {
            assert!(
                o.rb.abs_diff(t.rb) <= 256 && o.wb.abs_diff(t.wb) <= 256,
                "TLS vectors: ours rb {} wb {}, valgrind rb {} wb {}",
                o.rb,
                o.wb,
                t.rb,
                t.wb
            );
        } else if at.iter().any(|f| f.contains("worker")) {
            // The program's own stores, counted exactly: 5000 blocks of 8, 16, 24 and 32
            // bytes. (Valgrind counts less when blocks lie near a thread's stack pointer.)
            assert_eq!((o.rb, o.wb), (0, 5000 * (8 + 16 + 24 + 32)), "at {at:?}");
            assert!(o.wb >= t.wb, "at {at:?}");
        }
    }
}

#[test]
fn ad_hoc_events_equal_valgrinds() {
    let Some(b) = dhat_both(&build("dhat_adhoc.c", &["-O0", "-g"]), &["--mode=ad-hoc"]) else {
        return;
    };
    assert_eq!(b.ours.mode, dhat::Mode::AdHoc);
    let pairs = paired(&b);
    assert_eq!(pairs.len(), 4, "{}", b.ours_text);
    for (at, o, t) in pairs {
        assert_eq!((o.tb, o.tbk), (t.tb, t.tbk), "at {at:?}");
    }
    assert_eq!(summary(&b.ours_log), summary(&b.theirs_log));
    assert!(summary(&b.ours_log)[0].contains("units in"));
}

#[test]
fn quiet_prints_nothing_and_still_writes_the_file() {
    let prog = build("dhat_heap.c", &["-O0", "-g"]);
    let dir = tempfile::tempdir().unwrap();
    let out = run(Command::new(oxgrind())
        .args(["--tool=dhat", "-q", "--dhat-out-file=d.%p.json"])
        .arg(&prog)
        .current_dir(dir.path()));
    assert!(out.status.success());
    assert_eq!(stderr(&out), "");
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert_eq!(files.len(), 1);
    let name = files[0].file_name().into_string().unwrap();
    assert!(name.starts_with("d.") && name.ends_with(".json"), "{name}");
    let f = dhat::parse(&std::fs::read(files[0].path()).unwrap()).unwrap();
    assert_eq!(f.pps.iter().map(|p| p.tbk).sum::<u64>(), 19);
}

#[test]
fn copy_mode_is_refused_before_the_program_runs() {
    let out = run(Command::new(oxgrind()).args(["--tool=dhat", "--mode=copy", "/bin/true"]));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--mode=copy"), "{}", stderr(&out));
}
