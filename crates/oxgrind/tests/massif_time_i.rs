//! Massif's default time unit, `--time-unit=i`, against Valgrind's: the same snapshots (how
//! many, which are detailed or the peak, the heap at each), and times that differ only by
//! what neither can change.
//!
//! Valgrind counts every guest instruction from the dynamic loader's first; the engine takes
//! over in our library's constructor, so the loader and libc's start-up (≈132,000
//! instructions for a C program linked with libc alone, measured) are missing from every
//! time. After that the counts agree: the program's own instructions exactly, and for each
//! allocator call the few dozen instructions of Valgrind's client-side wrapper (our hooks
//! are left out of the count and charged that much instead, `crates/oxgrind-runtime/src/
//! hooks.rs`). What still differs: the first call of each allocation function through the
//! PLT (lazy binding looks the symbol up in our library instead of Valgrind's preload,
//! ≈600 instructions more), and the exit path.
//!

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The C programs of this test live beside it.
fn build_here(name: &str) -> PathBuf {
    build(
        &format!("../../crates/oxgrind/tests/corpus/{name}"),
        &["-g", "-O2"],
    )
}

/// Start-up instructions Valgrind counts and we cannot see, for a C program linked with
/// libc alone: 131,915 measured on every such program of the corpus (glibc 2.36). Bounds,
/// not the value, so that a different libc still passes.
const STARTUP: std::ops::RangeInclusive<i64> = 50_000..=400_000;

/// A snapshot taken at exit (glibc's `__libc_freeres`, which both run to free libc's own
/// blocks, such as stdout's buffer) comes after our exit handling, which runs translated and
/// counted: ≈5,000 instructions more than Valgrind's (measured on known_peak.c).
const EXIT_DRIFT: i64 = 20_000;

#[derive(Debug, Clone, PartialEq)]
struct Snap {
    time: i64,
    heap: u64,
    extra: u64,
    /// `empty`, `detailed` or `peak`.
    tree: String,
}

fn snapshots(text: &str) -> Vec<Snap> {
    let mut out = Vec::new();
    let (mut time, mut heap, mut extra) = (0, 0, 0);
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("time=") {
            time = v.parse().unwrap();
        } else if let Some(v) = line.strip_prefix("mem_heap_B=") {
            heap = v.parse().unwrap();
        } else if let Some(v) = line.strip_prefix("mem_heap_extra_B=") {
            extra = v.parse().unwrap();
        } else if let Some(v) = line.strip_prefix("heap_tree=") {
            out.push(Snap {
                time,
                heap,
                extra,
                tree: v.to_string(),
            });
        }
    }
    out
}

/// Runs the program under both with default options plus `opts`; `None` without Valgrind.
fn both(prog: &Path, opts: &[&str]) -> Option<(String, String)> {
    if !have_valgrind() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (ours, theirs) = (dir.path().join("ours.out"), dir.path().join("theirs.out"));
    let o = run(Command::new(oxgrind())
        .args(["-q", "--tool=massif"])
        .args(opts)
        .arg(format!("--massif-out-file={}", ours.display()))
        .arg(prog));
    assert!(o.status.success(), "oxgrind failed: {}", stderr(&o));
    let v = run(Command::new("valgrind")
        .args(["-q", "--tool=massif"])
        .args(opts)
        .arg(format!("--massif-out-file={}", theirs.display()))
        .arg(prog));
    assert!(v.status.success(), "valgrind failed: {}", stderr(&v));
    Some((
        std::fs::read_to_string(ours).unwrap(),
        std::fs::read_to_string(theirs).unwrap(),
    ))
}

/// Same snapshots as Valgrind's; every time but the start-up snapshot's is Valgrind's minus
/// the unseen start-up, give or take `drift` (lazy binding), and [`EXIT_DRIFT`] for the last.
fn assert_same_structure_and_times(what: &str, ours: &str, theirs: &str, drift: i64) {
    assert!(
        ours.contains("\ntime_unit: i\n"),
        "{what}: not in instructions"
    );
    let (o, t) = (snapshots(ours), snapshots(theirs));
    let shape = |s: &[Snap]| -> Vec<(u64, u64, String)> {
        s.iter()
            .map(|s| (s.heap, s.extra, s.tree.clone()))
            .collect()
    };
    assert_eq!(shape(&o), shape(&t), "{what}: snapshots differ");
    assert_eq!((o[0].time, t[0].time), (0, 0), "{what}: start-up snapshot");
    let offset = t[1].time - o[1].time;
    assert!(
        STARTUP.contains(&offset),
        "{what}: start-up offset {offset} (ours {}, Valgrind {})",
        o[1].time,
        t[1].time
    );
    for (i, (a, b)) in o.iter().zip(&t).enumerate().skip(2) {
        let d = b.time - a.time - offset;
        let allowed = if i + 1 == o.len() { EXIT_DRIFT } else { drift };
        assert!(
            d.abs() <= allowed,
            "{what}: snapshot {i}: ours {} + {offset} vs Valgrind {} ({d:+})",
            a.time,
            b.time
        );
    }
}

#[test]
fn default_time_unit_is_instructions_with_valgrinds_snapshots() {
    // Fewer events than --max-snapshots: one snapshot per event, none culled, so the
    // comparison covers every event's time (see the culled test for why not more). Drift allowed: ≈600 per allocation function
    // first called after start-up (four at most here), plus the exit path.
    for (name, prog, drift) in [
        ("time_i_loop.c", build_here("time_i_loop.c"), 3_000),
        ("time_i_calls.c", build_here("time_i_calls.c"), 3_000),
        ("known_peak.c", build("known_peak.c", &["-g", "-O2"]), 3_000),
    ] {
        let Some((ours, theirs)) = both(&prog, &[]) else {
            return;
        };
        assert_same_structure_and_times(name, &ours, &theirs, drift);
    }
}

#[test]
fn loop_of_known_length_between_two_mallocs_takes_valgrinds_time() {
    let prog = build_here("time_i_loop.c");
    let Some((ours, theirs)) = both(&prog, &[]) else {
        return;
    };
    let (o, t) = (snapshots(&ours), snapshots(&theirs));
    // Snapshots 1 and 2: after malloc(16) and after malloc(32), with spin(1,000,000) (two
    // instructions per iteration) between them.
    let (d_ours, d_theirs) = (o[2].time - o[1].time, t[2].time - t[1].time);
    assert!(
        (2_000_000..2_000_200).contains(&d_theirs),
        "Valgrind's delta {d_theirs}: the program is not the one this test expects"
    );
    // Exactly the same instructions run between the two reads of the count; the hooks are
    // charged Valgrind's wrapper cost to within a few instructions.
    assert!(
        (d_ours - d_theirs).abs() <= 8,
        "delta: ours {d_ours}, Valgrind {d_theirs}"
    );
}

#[test]
fn each_allocator_call_counts_what_valgrinds_wrapper_counts() {
    for (name, opts) in [
        ("time_i_calls.c", &[][..]),
        // Eleven loops, sixty-six events: more snapshots than the default, none culled.
        ("time_i_aligned_calls.c", &["--max-snapshots=1000"][..]),
        ("time_i_cxx_calls.cpp", &[][..]),
    ] {
        let prog = build_here(name);
        let Some((ours, theirs)) = both(&prog, opts) else {
            return;
        };
        let (o, t) = (snapshots(&ours), snapshots(&theirs));
        assert_eq!(o.len(), t.len());
        let mut compared = 0;
        for i in 3..o.len() {
            let (a, b) = (o[i].time - o[i - 1].time, t[i].time - t[i - 1].time);
            // Steady-state calls only, inside a loop (the same delta as the one before under
            // Valgrind): not a first call through the PLT (lazy binding), nor the move from
            // one loop to the next.
            if b != t[i - 1].time - t[i - 2].time {
                continue;
            }
            compared += 1;
            assert!(
                (a - b).abs() <= 2,
                "{name}: snapshot {i}: one loop iteration + call counts {a} here, {b} under Valgrind"
            );
        }
        assert!(
            compared >= 20,
            "{name}: only {compared} steady-state calls compared"
        );
    }
}

#[test]
fn culled_program_has_valgrinds_peak_and_both_ms_prints_read_it() {
    // Hundreds of events: the table is culled several times. Which snapshots survive a cull
    // depends on the gaps between them, the first of which is shorter here by the unseen
    // start-up, so only what does not depend on time is compared: the peak.
    let prog = build_here("time_i_many.c");
    let Some((ours, theirs)) = both(&prog, &[]) else {
        return;
    };
    assert_eq!(massif_peak(&ours), massif_peak(&theirs), "peak differs");
    assert_eq!(massif_peak(&ours), Some(798_720));
    let o = snapshots(&ours);
    assert!(o.iter().filter(|s| s.tree == "detailed").count() >= 5);
    assert!(
        o.windows(2).all(|w| w[0].time <= w[1].time),
        "times go back"
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("massif.out");
    std::fs::write(&file, &ours).unwrap();
    let valgrinds = run(Command::new("ms_print").arg(&file));
    assert!(
        valgrinds.status.success(),
        "ms_print rejected the file: {}",
        stderr(&valgrinds)
    );
    let mine = run(Command::new(oxgrind()).arg("ms_print").arg(&file));
    assert!(mine.status.success(), "{}", stderr(&mine));
    assert_eq!(stdout(&mine), stdout(&valgrinds), "renderers differ");
    assert!(
        stdout(&mine).contains("time(i)") && stdout(&mine).contains(">Mi\n"),
        "not drawn in instructions"
    );
}
