//! Our ms_print against the real `/usr/bin/ms_print` (Valgrind 3.19's Perl script), run live
//! on the reference files with several option sets, on hand-written files exercising its
//! quirks, and on synthetic files (many snapshots, deep trees, zero-byte nodes, huge numbers,
//! every time unit, with and without a peak). Skipped, with a note, without the script.

mod common;

use common::{assert_same, run_ours, run_real};
use oxgrind_formats::massif::{self, ms_print, MassifFile, Snapshot, SnapshotKind, TreeNode};
use std::path::{Path, PathBuf};

const OPTION_SETS: &[&[&str]] = &[
    &[],
    &["--threshold=0"],
    &["--threshold=5"],
    &["--threshold=50"],
    &["--x=40", "--y=10"],
    &["--x=4", "--y=4"],
    &["--threshold=5.5%", "--x=200", "--y=50"],
    &["--threshold=0.0", "--x=5"],
    &["--threshold=100", "--y=1000"],
];

/// A scratch directory for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("oxgrind-ms_print-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn put(&self, name: &str, data: &[u8]) -> &Path {
        std::fs::write(self.0.join(name), data).unwrap();
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn compare(dir: &Path, name: &str, opts: &[&str]) -> common::Outcome {
    let real = run_real(dir, opts, name);
    let ours = run_ours(dir, opts, name);
    assert_same(&format!("{name} {opts:?}"), &ours, &real);
    real
}

#[test]
fn matches_live_ms_print_on_every_example_with_several_option_sets() {
    if !common::have_ms_print("matches_live_ms_print_on_every_example_with_several_option_sets") {
        return;
    }
    let dir = common::massif_examples();
    for file in common::example_files() {
        let name = file.file_name().unwrap().to_str().unwrap();
        for opts in OPTION_SETS {
            let real = compare(&dir, name, opts);
            assert!(real.ok, "{name} {opts:?}: ms_print failed");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Hand-written files for ms_print's quirks.

const ROOT: &str = "(heap allocation functions) malloc/new/new[], --alloc-fns, etc.";

fn snap(
    num: &str,
    time: &str,
    heap: &str,
    extra: &str,
    stacks: &str,
    kind: &str,
    tree: &str,
) -> String {
    format!(
        "#-----------\nsnapshot={num}\n#-----------\ntime={time}\nmem_heap_B={heap}\nmem_heap_extra_B={extra}\nmem_stacks_B={stacks}\nheap_tree={kind}\n{tree}"
    )
}

fn head(unit: &str) -> String {
    format!("desc: --x\ncmd: ./p\ntime_unit: {unit}\n")
}

/// (name, contents, whether ms_print succeeds on it)
fn quirk_files() -> Vec<(&'static str, String, bool)> {
    let leaf = |b: &str| format!("n0: {b} {ROOT}\n");
    let mut v = Vec::new();
    v.push((
        "comments-blank-lines-several-desc",
        format!(
            "# leading comment\n\ndesc: --a=1 # c\ndesc:--b\ndesc:   \ncmd:   ./prog  x #y\ntime_unit: i\n{}\n\n{}   # trailing\n",
            snap("0", "0   # c", "0", "0", "0", "empty", ""),
            snap("1", " 1234567", "1000", "24", "0", "peak", &format!("   n2:   1000 {ROOT}\n\tn1: 900 0x1: a#b (x.c:1)\n  n0:900 0x2: main\n n0: 100   0x3: %s %d (y.c:2)\n"))
        ),
        true,
    ));
    v.push((
        "no-desc-line",
        format!(
            "cmd: ./p\ntime_unit: i\n{}",
            snap("0", "5", "1", "2", "3", "empty", "")
        ),
        true,
    ));
    v.push((
        "snapshot-numbers-not-positions",
        format!(
            "{}{}{}{}{}",
            head("i"),
            snap("7", "10", "100", "0", "0", "empty", ""),
            snap("1", "20", "300", "0", "0", "detailed", &leaf("300")),
            snap("3", "30", "500", "0", "0", "peak", &leaf("500")),
            snap("x", "40", "200", "0", "0", "empty", "")
        ),
        true,
    ));
    v.push((
        "heap-tree-substring-and-peak-with-space",
        format!(
            "{}{}{}{}",
            head("B"),
            snap("0", "10", "100", "0", "0", "xdetailedy", &leaf("100")),
            snap("1", "20", "300", "0", "0", "peak ", &leaf("300")),
            snap("2", "30", "0", "0", "0", "empty", "")
        ),
        true,
    ));
    v.push((
        "huge-numbers-overflow-to-doubles",
        format!(
            "{}{}{}{}",
            head("B"),
            snap("0", "9223372036854775807", "18446744073709551615", "10", "0", "detailed",
                &format!("n2: 18446744073709551615 {ROOT}\n n0: 18446744073709551600 big\n n0: 15 small\n")),
            snap("1", "99999999999999999999", "99999999999999999999", "1", "1", "empty", ""),
            snap("2", "99999999999999999999", "1152921504606846976", "0", "0", "peak",
                &format!("n3: 1152921504606846976 {ROOT}\n n0: 1152921504606846000 a\n n0: 900 b\n n0: 76 c\n"))
        ),
        true,
    ));
    // peak = 20 * (2^55 + 1): Perl divides it by 20 exactly in integers (the quotient is not a
    // double), so the second snapshot, one byte short of 19 rows, does not reach row 19; in
    // doubles it would.
    v.push((
        "exact-integer-division-above-2^53",
        format!(
            "{}{}{}",
            head("i"),
            snap("0", "10", "720575940379279380", "0", "0", "empty", ""),
            snap("1", "20", "684547143360315410", "0", "0", "empty", "")
        ),
        true,
    ));
    v.push(("zero-snapshots", head("i"), false));
    v.push((
        "negative-end-time",
        format!(
            "{}{}",
            head("i"),
            snap("0", "-5", "1", "0", "0", "empty", "")
        ),
        false,
    ));
    v.push((
        "bad-time-unit",
        format!(
            "{}{}",
            head("s"),
            snap("0", "5", "1", "0", "0", "empty", "")
        ),
        false,
    ));
    v.push((
        "node-larger-than-total",
        format!(
            "{}{}",
            head("i"),
            snap("0", "5", "10", "0", "0", "detailed", &leaf("11"))
        ),
        false,
    ));
    v.push(("missing-cmd", "desc: x\ntime_unit: i\n".to_string(), false));
    v.push((
        "truncated-tree",
        format!(
            "{}{}",
            head("i"),
            snap(
                "0",
                "5",
                "10",
                "0",
                "0",
                "detailed",
                &format!("n2: 10 {ROOT}\n n0: 5 a\n")
            )
        ),
        false,
    ));
    v.push((
        "negative-times-in-the-middle",
        format!(
            "{}{}{}{}{}{}",
            head("i"),
            // end 1000, 72 columns: -1 -> column 1, -130 -> -8 (column 65), -20 -> 0 (the
            // y axis), -100 -> -6 (column 67).
            snap("0", "-1", "50", "0", "0", "detailed", &leaf("50")),
            snap("1", "-130", "80", "0", "0", "empty", ""),
            snap("2", "-20", "90", "0", "0", "peak", &leaf("90")),
            snap("3", "-100", "70", "0", "0", "empty", ""),
            snap("4", "1000", "60", "0", "0", "empty", "")
        ),
        true,
    ));
    v.push((
        "negative-time-beyond-the-array",
        format!(
            "{}{}{}",
            head("i"),
            snap("0", "-1000", "50", "0", "0", "empty", ""),
            snap("1", "10", "60", "0", "0", "empty", "")
        ),
        false,
    ));
    v.push((
        "times-beyond-the-end",
        format!(
            "{}{}{}{}{}{}",
            head("ms"),
            snap("0", "0", "10", "0", "0", "empty", ""),
            snap("1", "500", "40", "0", "0", "detailed", &leaf("40")),
            snap("2", "90", "30", "0", "0", "empty", ""),
            snap("3", "-1", "20", "0", "0", "empty", ""),
            snap("4", "100", "20", "0", "0", "empty", "")
        ),
        true,
    ));
    v.push((
        "all-zero",
        format!(
            "{}{}{}",
            head("i"),
            snap("0", "0", "0", "0", "0", "empty", ""),
            snap("1", "0", "0", "0", "0", "detailed", &leaf("0"))
        ),
        true,
    ));
    for (name, end) in [
        ("ms-hours", "7200000"),
        ("ms-3599s", "3599999"),
        ("ms-999", "999"),
        ("ms-1000", "1000"),
    ] {
        v.push((
            name,
            format!(
                "{}{}",
                head("ms"),
                snap("0", end, "1023", "1", "0", "empty", "")
            ),
            true,
        ));
    }
    for (name, total) in [
        ("bytes-999", "999"),
        ("bytes-1000", "1000"),
        ("bytes-1024", "1024"),
        ("bytes-10239", "10239"),
        ("bytes-102400", "102400"),
    ] {
        v.push((
            name,
            format!(
                "{}{}",
                head("B"),
                snap("0", total, total, "0", "0", "empty", "")
            ),
            true,
        ));
    }
    v.push((
        "decimal-values",
        format!(
            "{}{}",
            head("i"),
            snap("0", "1.5", "10.25", "0", "1e2", "empty", "")
        ),
        true,
    ));
    v.push((
        "crlf-lines",
        format!(
            "{}{}",
            head("i"),
            snap("0", "5", "1", "0", "0", "empty", "")
        )
        .replace('\n', "\r\n"),
        false,
    ));
    v.push((
        "single-snapshot",
        format!(
            "{}{}",
            head("i"),
            snap("0", "0", "5", "0", "0", "peak", &leaf("5"))
        ),
        true,
    ));
    v.push((
        "last-line-without-newline",
        format!(
            "{}{}",
            head("i"),
            snap(
                "0",
                "3",
                "5",
                "0",
                "0",
                "detailed",
                &format!("n1: 5 {ROOT}\n n0: 5 x")
            )
        ),
        true,
    ));
    v
}

#[test]
fn matches_live_ms_print_on_quirky_files() {
    if !common::have_ms_print("matches_live_ms_print_on_quirky_files") {
        return;
    }
    let scratch = Scratch::new("quirks");
    for (name, text, succeeds) in quirk_files() {
        let dir = scratch.put(name, text.as_bytes());
        for opts in [&[][..], &["--threshold=0"], &["--x=10", "--y=5"]] {
            let real = compare(dir, name, opts);
            assert_eq!(
                real.ok, succeeds,
                "{name}: ms_print success differs from the test's expectation"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Synthetic files.

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

const LABELS: &[&str] = &[
    "0x10919A: mid_alloc (ms_prog.c:7)",
    "0x1093AB: main (ms_prog.c:24)",
    "0x4A2B3C1: std::vector<int, std::allocator<int> >::_M_realloc_insert(int&&) (vector.tcc:449)",
    "0x0: ???",
    "in 3 places, all below massif's threshold (1.00%)",
    "in 1 place, below massif's threshold (1.00%)",
    "0x1: 100% sure %s %d (p.c:1)",
];

/// A random tree whose node sizes never exceed their parent's and whose root is `bytes`.
fn tree(rng: &mut Rng, bytes: u64, depth: u32, max_depth: u32, root: bool) -> TreeNode {
    let label = if root {
        massif::HEAP_ROOT_LABEL.to_string()
    } else {
        LABELS[rng.below(LABELS.len() as u64) as usize].to_string()
    };
    let mut children = Vec::new();
    if depth < max_depth && !(depth > 0 && rng.chance(25)) {
        let n = rng.below(6);
        let mut left = bytes;
        for _ in 0..n {
            let b = match rng.below(5) {
                0 => 0,
                1 => left,
                _ => rng.below(left.saturating_add(1)),
            };
            left -= b;
            children.push(tree(rng, b, depth + 1, max_depth, false));
        }
        children.sort_by_key(|c: &TreeNode| core::cmp::Reverse(c.bytes));
    }
    TreeNode {
        bytes,
        label,
        children,
    }
}

fn synthetic(seed: u64) -> MassifFile {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let unit = ["i", "ms", "B"][rng.below(3) as usize];
    let many = rng.chance(30);
    let n = if rng.chance(10) {
        1
    } else {
        1 + rng.below(if many { 150 } else { 25 }) as usize
    };
    // Byte scales: nothing, small, MB, GB, beyond 2^53 (Perl's exact integer division) and
    // up to u64::MAX (heap + extra + stacks overflows into a double: `1.84467440737096e+19`).
    let scale: u64 = match rng.below(7) {
        0 => 0,
        1 => 1000,
        2 => 2_000_000,
        3 => 5_000_000_000,
        4 => 1 << 60,
        5 => u64::MAX / 2,
        _ => u64::MAX,
    };
    let time_step: u64 = match rng.below(5) {
        0 => 0,
        1 => 10,
        2 => 100_000,
        3 => 1 << 50,
        _ => 40_000_000,
    };
    let peak_at = if rng.chance(60) {
        Some(rng.below(n as u64) as usize)
    } else {
        None
    };
    let max_depth = 1 + rng.below(8) as u32;
    let mut time: i64 = 0;
    let mut snapshots = Vec::new();
    for i in 0..n {
        if i > 0 {
            time = time
                .saturating_add(rng.below(time_step.saturating_mul(2).saturating_add(1)) as i64);
        }
        let heap = rng.below(scale.saturating_add(1));
        let extra = if rng.chance(20) {
            0
        } else {
            rng.below(scale / 8 + 1)
        };
        let stacks = if rng.chance(70) {
            0
        } else {
            rng.below(scale / 4 + 1)
        };
        let kind = if Some(i) == peak_at {
            SnapshotKind::Peak
        } else if rng.chance(30) {
            SnapshotKind::Detailed
        } else {
            SnapshotKind::Empty
        };
        let tree = (kind != SnapshotKind::Empty).then(|| tree(&mut rng, heap, 0, max_depth, true));
        snapshots.push(Snapshot {
            time,
            mem_heap_b: heap,
            mem_heap_extra_b: extra,
            mem_stacks_b: stacks,
            kind,
            tree,
        });
    }
    MassifFile {
        desc: "--synthetic".to_string(),
        cmd: format!("./synthetic {seed}"),
        time_unit: unit.to_string(),
        snapshots,
    }
}

fn check_synthetic(seeds: std::ops::Range<u64>, test: &str) {
    if !common::have_ms_print(test) {
        return;
    }
    let scratch = Scratch::new(test);
    let sets: &[&[&str]] = &[
        &[],
        &["--threshold=0"],
        &["--threshold=5", "--x=40", "--y=10"],
        &["--threshold=50", "--x=4", "--y=4"],
    ];
    for seed in seeds {
        let model = synthetic(seed);
        let name = format!("massif.out.synthetic{seed}");
        let dir = scratch.put(&name, massif::write(&model).as_bytes());
        for (k, opts) in sets.iter().enumerate() {
            if k > 1 && seed % 2 == 0 {
                continue; // keep the run short: half the seeds get the extra option sets
            }
            let real = compare(dir, &name, opts);
            assert!(real.ok, "{name} {opts:?}: ms_print failed");
            // The model path gives the same text as the bytes path.
            let inv = ms_print::parse_args(
                &opts
                    .iter()
                    .map(|s| s.to_string())
                    .chain([name.clone()])
                    .collect::<Vec<_>>(),
            )
            .unwrap();
            let ms_print::Invocation::Render {
                options, arguments, ..
            } = inv
            else {
                unreachable!()
            };
            let ours = ms_print::render(&model, &options, &arguments).unwrap();
            assert!(
                ours.as_bytes() == real.stdout.as_slice(),
                "{name} {opts:?}: render(model) differs"
            );
        }
    }
}

#[test]
fn matches_live_ms_print_on_synthetic_files_a() {
    check_synthetic(0..30, "synthetic_a");
}

#[test]
fn matches_live_ms_print_on_synthetic_files_b() {
    check_synthetic(30..60, "synthetic_b");
}

fn depth(t: &TreeNode) -> usize {
    1 + t.children.iter().map(depth).max().unwrap_or(0)
}

fn has_zero_node(t: &TreeNode) -> bool {
    t.bytes == 0 || t.children.iter().any(has_zero_node)
}

/// The synthetic seeds used above really contain the cases they are meant to check.
#[test]
fn synthetic_corpus_covers_the_quirks() {
    let files: Vec<MassifFile> = (0..60).map(synthetic).collect();
    let any = |f: &dyn Fn(&MassifFile) -> bool| files.iter().any(f);
    for unit in ["i", "ms", "B"] {
        assert!(
            any(&|m| m.time_unit == unit),
            "no file with time unit {unit}"
        );
    }
    let peak = |m: &MassifFile| m.snapshots.iter().any(|s| s.kind == SnapshotKind::Peak);
    assert!(any(&peak), "no file with a peak");
    assert!(any(&|m| !peak(m)), "no file without a peak");
    assert!(
        any(&|m| m.snapshots.len() >= 100),
        "no file with many snapshots"
    );
    assert!(any(&|m| m.snapshots.len() == 1), "no single-snapshot file");
    assert!(
        any(&|m| m.snapshots.iter().any(|s| s
            .mem_heap_b
            .checked_add(s.mem_heap_extra_b)
            .and_then(|v| v.checked_add(s.mem_stacks_b))
            .is_none())),
        "no total overflowing 64 bits"
    );
    assert!(
        any(&|m| m.snapshots.iter().any(|s| s.mem_heap_b > 1 << 53)),
        "no huge heap"
    );
    assert!(
        any(&|m| m
            .snapshots
            .iter()
            .filter_map(|s| s.tree.as_ref())
            .any(|t| depth(t) >= 6)),
        "no deep tree"
    );
    assert!(
        any(&|m| m
            .snapshots
            .iter()
            .filter_map(|s| s.tree.as_ref())
            .any(has_zero_node)),
        "no zero-byte node"
    );
    assert!(
        any(&|m| m.time_unit == "ms" && m.snapshots.last().unwrap().time >= 3_600_000),
        "no ms file over an hour"
    );
}

/// Option spellings ms_print accepts in its own way (`--threshold=1.2.3` is 1.2 with a Perl
/// warning, `--x=0040` is 40, a trailing `%` is allowed) give the same output.
#[test]
fn option_spellings_match_live_ms_print() {
    if !common::have_ms_print("option_spellings_match_live_ms_print") {
        return;
    }
    let dir = common::massif_examples();
    for opts in [
        &["--threshold=.5"][..],
        &["--threshold=1.2.3"],
        &["--threshold=7%"],
        &["--threshold=00.0"],
        &["--x=0040", "--y=0007"],
        &["--x=1000", "--y=4"],
        &["--y=30", "--y=5"],
    ] {
        let real = compare(&dir, "massif.out.default", opts);
        assert!(real.ok, "{opts:?}");
    }
    // Extra file names are printed on the arguments line but ignored.
    let real = run_real(&dir, &["massif.out.small"], "massif.out.tuB");
    let ours = run_ours(&dir, &["massif.out.small"], "massif.out.tuB");
    assert_same("two files", &ours, &real);
}

/// Rejected command lines are rejected by both, and our usage text is ms_print's (always
/// showing the default threshold `[1]`, even after `--threshold=5`).
#[test]
fn bad_command_lines_fail_like_live_ms_print() {
    if !common::have_ms_print("bad_command_lines_fail_like_live_ms_print") {
        return;
    }
    let dir = common::massif_examples();
    for args in [
        &["--x=3", "massif.out.small"][..],
        &["--y=1001", "massif.out.small"],
        &["--threshold=101", "massif.out.small"],
        &["--threshold=5", "--frob", "massif.out.small"],
        &["--threshold=5", "-h"],
        &["--help"],
        &["-", "massif.out.small"],
        &["--x=abc", "massif.out.small"],
        &["--threshold=-1", "massif.out.small"],
        &[],
    ] {
        let real = std::process::Command::new(common::MS_PRINT)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(!real.status.success(), "{args:?}: ms_print accepted it");
        let ours = ms_print::parse_args(args);
        let usage = match ours {
            Err(e) => e.usage,
            Ok(ms_print::Invocation::Help { usage }) => usage,
            Ok(other) => panic!("{args:?}: we accepted it: {other:?}"),
        };
        assert_eq!(usage, ms_print::usage());
        assert_eq!(String::from_utf8_lossy(&real.stderr), usage, "{args:?}");
    }
    let real = std::process::Command::new(common::MS_PRINT)
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        real.stderr,
        format!("ms_print-{}\n", ms_print::VERSION).as_bytes()
    );
    assert_eq!(
        ms_print::parse_args(&["--version", "--x=2"]),
        Ok(ms_print::Invocation::Version)
    );
}
