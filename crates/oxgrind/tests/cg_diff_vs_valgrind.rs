//! `oxgrind cg_diff` prints what Valgrind 3.19's `/usr/bin/cg_diff` prints: on Valgrind's
//! example file against a changed copy of it, and on two files with every shape the script
//! reads (comments, blank and malformed lines, `.` counts, short cost lines, counts after a
//! `fl=` that go to the previous function, functions in only one file, a hole left by a
//! `.` that prints as nothing).
//!
//! The script walks a hash, so its functions come out in a random order: both outputs are
//! compared with the (fl=, fn=, costs) triples sorted; everything else byte for byte.

use std::path::{Path, PathBuf};
use std::process::Command;

const CG_DIFF: &str = "/usr/bin/cg_diff";

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference/examples/cachegrind")
}

fn run(program: &str, pre: &[&str], args: &[&str], cwd: &Path) -> (String, String, bool) {
    let out = Command::new(program)
        .args(pre)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

/// The header lines, then the sorted triples, then the summary.
fn normalise(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut head = vec![];
    let mut triples = vec![];
    let mut rest = vec![];
    let mut i = 0;
    while i < lines.len() {
        if lines[i].starts_with("fl=") && i + 2 < lines.len() {
            triples.push(lines[i..i + 3].join("\n"));
            i += 3;
        } else if triples.is_empty() && !lines[i].starts_with("summary:") {
            head.push(lines[i].to_string());
            i += 1;
        } else {
            rest.push(lines[i].to_string());
            i += 1;
        }
    }
    triples.sort();
    [head, triples, rest].concat().join("\n")
}

/// Both diffs of `a` and `b` (in `dir`): the same output, and the same warnings.
fn compare(a: &str, b: &str, dir: &Path) {
    let ox = env!("CARGO_BIN_EXE_oxgrind");
    let (p_out, p_err, p_ok) = run(CG_DIFF, &[], &[a, b], dir);
    let (o_out, o_err, o_ok) = run(ox, &["cg_diff"], &[a, b], dir);
    assert!(p_ok, "cg_diff {a} {b} failed: {p_err}");
    assert!(o_ok, "oxgrind cg_diff {a} {b} failed: {o_err}");
    assert_eq!(normalise(&o_out), normalise(&p_out), "cg_diff {a} {b}");
    // Perl's own "Use of uninitialized value" noise aside, the script's warnings.
    let warnings = |e: &str| -> Vec<String> {
        e.lines()
            .filter(|l| l.starts_with("WARNING"))
            .map(String::from)
            .collect()
    };
    assert_eq!(warnings(&o_err), warnings(&p_err), "warnings of {a} {b}");
}

const A: &str = "desc: I1 cache: 32768 B, 64 B, 8-way associative
desc: D1 cache: 32768 B, 64 B, 8-way associative
cmd: ./prog one
events: Ir Dr Dw
# a comment

fl=a.c
fn=main
1 10 2 1
2 5 . 3
3 7
fl=b.c
4 100 1 1
fn=helper
5 3 3 3
junk here
fn=only_in_a
6 1 1 1
summary: 126 7 8
";

const B: &str = "desc: I1 cache: 32768 B, 64 B, 8-way associative
cmd: ./prog two
events: Ir Dr Dw
fl=a.c
fn=main
1 12 2 1
2 5 . 
fl=b.c
fn=helper
5 3 3 3
fn=only_in_b
7 9 . 4
8 1
fl=c.c
fn=main
9 4 4 4
summary: 34 9 12
";

#[test]
fn same_output_as_valgrinds_on_every_shape_of_input() {
    if !Path::new(CG_DIFF).exists() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.out"), A).unwrap();
    std::fs::write(dir.path().join("b.out"), B).unwrap();
    compare("a.out", "b.out", dir.path());
    compare("b.out", "a.out", dir.path());
    compare("a.out", "a.out", dir.path());
}

#[test]
fn same_output_as_valgrinds_on_valgrinds_file_and_a_changed_copy() {
    if !Path::new(CG_DIFF).exists() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let orig = std::fs::read_to_string(examples().join("cachegrind.out.static")).unwrap();
    // Every other cost line doubled in its first count, one function dropped.
    let mut changed = String::new();
    let mut k = 0;
    let mut skip = false;
    for l in orig.lines() {
        if let Some(f) = l.strip_prefix("fn=") {
            skip = f == "main";
        }
        if skip && !l.starts_with("fn=") && !l.starts_with("fl=") {
            continue;
        }
        let mut f: Vec<String> = l.split(' ').map(String::from).collect();
        if l.starts_with(|c: char| c.is_ascii_digit()) && f.len() > 1 {
            k += 1;
            if k % 2 == 0 {
                f[1] = (f[1].parse::<u64>().unwrap_or(0) * 2).to_string();
            }
        }
        changed.push_str(&f.join(" "));
        changed.push('\n');
    }
    std::fs::write(dir.path().join("orig.out"), &orig).unwrap();
    std::fs::write(dir.path().join("changed.out"), &changed).unwrap();
    compare("orig.out", "changed.out", dir.path());
    compare("changed.out", "orig.out", dir.path());
}

#[test]
fn mismatched_events_and_a_missing_summary_fail_as_the_script_does() {
    if !Path::new(CG_DIFF).exists() {
        return;
    }
    let ox = env!("CARGO_BIN_EXE_oxgrind");
    let dir = tempfile::tempdir().unwrap();
    let e = examples();
    let (a, b) = (
        e.join("cachegrind.out.static"),
        e.join("cachegrind.out.static-nobranch"),
    );
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let (_, p_err, p_ok) = run(CG_DIFF, &[], &[a, b], dir.path());
    let (_, o_err, o_ok) = run(ox, &["cg_diff"], &[a, b], dir.path());
    assert!(!p_ok && !o_ok);
    assert!(p_err.contains("events don't match, aborting"), "{p_err}");
    assert_eq!(o_err, "oxgrind: cg_diff: events don't match, aborting\n");
    let cut: String = A
        .lines()
        .filter(|l| !l.starts_with("summary:"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(dir.path().join("cut.out"), cut).unwrap();
    let (_, p_err, p_ok) = run(CG_DIFF, &[], &["cut.out", "cut.out"], dir.path());
    let (_, o_err, o_ok) = run(ox, &["cg_diff"], &["cut.out", "cut.out"], dir.path());
    assert!(!p_ok && !o_ok);
    assert!(
        p_err.ends_with("missing final summary line, aborting\n"),
        "{p_err}"
    );
    assert!(
        o_err.ends_with("missing final summary line, aborting\n"),
        "{o_err}"
    );
    let (v_out, _, v_ok) = run(ox, &["cg_diff"], &["--version"], dir.path());
    let (_, p_err, _) = run(CG_DIFF, &[], &["--version"], dir.path());
    assert!(v_ok);
    assert_eq!(v_out, p_err);
}
