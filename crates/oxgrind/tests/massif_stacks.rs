//! Massif's `--stacks=yes` (issue 11): each thread's stack measured as Valgrind measures it,
//! every stack-pointer change an event.

mod common;
use common::*;
use std::process::Command;

/// `(mem_heap_B, mem_stacks_B)` of the peak snapshot.
fn peak_heap_and_stacks(text: &str) -> (u64, u64) {
    let lines: Vec<&str> = text.lines().collect();
    let i = lines
        .iter()
        .position(|l| *l == "heap_tree=peak")
        .expect("a peak snapshot");
    let field = |name: &str| -> u64 {
        lines[..i]
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix(name))
            .unwrap()
            .parse()
            .unwrap()
    };
    (field("mem_heap_B="), field("mem_stacks_B="))
}

fn massif(tool: &str, prog: &std::path::Path, opts: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = if tool == "valgrind" {
        let mut c = Command::new("valgrind");
        c.arg("-q");
        c
    } else {
        let mut c = Command::new(oxgrind());
        c.arg("-q");
        c
    };
    let o = run(cmd
        .args([
            "--tool=massif",
            "--stacks=yes",
            "--massif-out-file=massif.out",
        ])
        .args(opts)
        .arg(prog)
        .current_dir(dir.path()));
    assert!(o.status.success(), "{tool} {opts:?}: {}", stderr(&o));
    assert_eq!(stdout(&o), "stack depth done 0\n");
    std::fs::read_to_string(dir.path().join("massif.out")).unwrap()
}

/// A recursion 2,000 calls deep with 1,000-byte frames, under a 100,000-byte block: the peak
/// snapshot has Valgrind's heap and Valgrind's stack bytes exactly (2,049,296 with gcc 12
/// -O1), in every time unit. Times differ: Valgrind also counts the dynamic loader's start-up
/// (docs/differences-from-valgrind.md).
#[test]
fn peak_stack_of_a_known_recursion_equals_valgrinds() {
    let prog = build("stack_depth.c", &["-g", "-O1"]);
    for opts in [&["--time-unit=B"][..], &[], &["--time-unit=ms"]] {
        let ours = massif("oxgrind", &prog, opts);
        let (heap, stacks) = peak_heap_and_stacks(&ours);
        assert_eq!(heap, 100_000, "{opts:?}");
        // 2,000 frames of at least the 1,000-byte buffer.
        assert!(
            stacks > 2_000_000 && stacks < 2_200_000,
            "{opts:?}: {stacks}"
        );
        assert!(
            ours.contains("mem_stacks_B=0\n"),
            "the startup snapshot has no stack"
        );
        if have_valgrind() && opts != ["--time-unit=ms"] {
            let theirs = massif("valgrind", &prog, opts);
            assert_eq!(
                peak_heap_and_stacks(&ours),
                peak_heap_and_stacks(&theirs),
                "{opts:?}"
            );
            // The tree's significance threshold counts the stacks too (1% of 2.1 MB).
            assert_eq!(
                massif_peak_tree(&ours),
                massif_peak_tree(&theirs),
                "{opts:?}"
            );
        }
    }
}

/// Threads each count their own stack; the program runs as natively and every snapshot's
/// stack bytes stay within what its threads can use.
#[test]
fn stacks_of_a_threaded_program_are_counted() {
    let prog = build("threads.c", &["-g", "-O1"]);
    let native = run(&mut Command::new(&prog));
    let dir = tempfile::tempdir().unwrap();
    let o = run(Command::new(oxgrind())
        .args([
            "-q",
            "--tool=massif",
            "--stacks=yes",
            "--massif-out-file=massif.out",
        ])
        .arg(&prog)
        .current_dir(dir.path()));
    assert_eq!(o.status.code(), native.status.code(), "{}", stderr(&o));
    assert_eq!(stdout(&o), stdout(&native));
    let text = std::fs::read_to_string(dir.path().join("massif.out")).unwrap();
    let stacks: Vec<u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("mem_stacks_B="))
        .map(|v| v.parse().unwrap())
        .collect();
    let max = *stacks.iter().max().unwrap();
    assert!(max > 1000 && max < 1 << 20, "{max}");
    if have_valgrind() {
        let p = run(Command::new("ms_print").arg(dir.path().join("massif.out")));
        assert!(
            p.status.success(),
            "ms_print rejects the file: {}",
            stderr(&p)
        );
    }
}

/// Valgrind refuses the combination, with its words.
#[test]
fn stacks_with_pages_as_heap_is_refused_as_valgrind_does() {
    let o = run(Command::new(oxgrind()).args([
        "--tool=massif",
        "--stacks=yes",
        "--pages-as-heap=yes",
        "/bin/true",
    ]));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("Cannot be used together with --stacks=yes"),
        "{}",
        stderr(&o)
    );
}

/// `--heap=no --stacks=yes` profiles the stacks alone: as under Valgrind no snapshot has a
/// tree (the peak included), and the deepest point is the same.
#[test]
fn stacks_alone_with_heap_no_as_valgrind() {
    let prog = build("stack_depth.c", &["-g", "-O1"]);
    let ours = massif("oxgrind", &prog, &["--heap=no", "--time-unit=B"]);
    let max = |t: &str| {
        t.lines()
            .filter_map(|l| l.strip_prefix("mem_stacks_B="))
            .map(|v| v.parse::<u64>().unwrap())
            .max()
            .unwrap()
    };
    assert!(ours
        .lines()
        .filter(|l| l.starts_with("heap_tree="))
        .all(|l| l == "heap_tree=empty"));
    assert!(ours
        .lines()
        .filter_map(|l| l.strip_prefix("mem_heap_B="))
        .all(|v| v == "0"));
    if have_valgrind() {
        let theirs = massif("valgrind", &prog, &["--heap=no", "--time-unit=B"]);
        assert_eq!(max(&ours), max(&theirs));
    }
}

/// A handler on an alternate stack: the switch to that stack is ignored (more than
/// `--max-stackframe` away) but the handler's own frame is counted and given back, so the
/// recursion afterwards still reaches its full depth. (Valgrind 3.19 itself aborts on this
/// program with an assertion in `update_stack_stats`.)
#[test]
fn alternate_signal_stacks_do_not_lose_stack_bytes() {
    let prog = build("stack_signals.c", &["-g", "-O1"]);
    let dir = tempfile::tempdir().unwrap();
    let o = run(Command::new(oxgrind())
        .args([
            "-q",
            "--tool=massif",
            "--stacks=yes",
            "--time-unit=B",
            "--massif-out-file=massif.out",
        ])
        .arg(&prog)
        .current_dir(dir.path()));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "sig done 1\n");
    let text = std::fs::read_to_string(dir.path().join("massif.out")).unwrap();
    let max = text
        .lines()
        .filter_map(|l| l.strip_prefix("mem_stacks_B="))
        .map(|v| v.parse::<u64>().unwrap())
        .max()
        .unwrap();
    // 101 frames of deep() alone: 53,328 bytes (each lost handler frame used to take 3 KB
    // off: 42,688 with five of them).
    assert!(max >= 53_328 && max < 70_000, "{max}");
}
