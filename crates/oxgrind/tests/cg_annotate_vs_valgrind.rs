//! `oxgrind cg_annotate` prints what Valgrind 3.19's `/usr/bin/cg_annotate` prints, on
//! Valgrind's own files and on files exercising source annotation (context markers, bogus
//! lines, unidentified lines, include directories, the "more recent" warning).
//!
//! The Perl script walks hashes, so rows with equal sort keys and the annotated files come
//! out in a random order there; both outputs are compared after sorting within each group
//! of tied rows and sorting the per-file annotation chunks. Everything else is byte for byte.

use std::path::{Path, PathBuf};
use std::process::Command;

const CG_ANNOTATE: &str = "/usr/bin/cg_annotate";
#[path = "cg_normalise.rs"]
mod cg_normalise;
use cg_normalise::normalise;

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

fn compare(args: &[&str], cwd: &Path) {
    let ox = env!("CARGO_BIN_EXE_oxgrind");
    let (p_out, p_err, p_ok) = run(CG_ANNOTATE, &[], args, cwd);
    let (o_out, o_err, o_ok) = run(ox, &["cg_annotate"], args, cwd);
    assert!(p_ok, "cg_annotate {args:?} failed: {p_err}");
    assert!(o_ok, "oxgrind cg_annotate {args:?} failed: {o_err}");
    let whole = args.iter().any(|a| a.starts_with("--sort="));
    assert_eq!(
        normalise(&o_out, whole),
        normalise(&p_out, whole),
        "cg_annotate {args:?} in {} differs",
        cwd.display()
    );
    assert_eq!(o_err, p_err, "stderr of cg_annotate {args:?}");
}

const OPTION_SETS: &[&[&str]] = &[
    &[],
    &["--auto=no"],
    &["--show=Ir,Dr,Dw", "--sort=Dr", "--threshold=1", "--auto=no"],
    &["--threshold=0.5"],
    &["--threshold=0"],
    &["--threshold=20%"],
    &["--sort=Dw:1,Ir", "--show-percs=no"],
    &["--show-percs=no", "--context=2"],
];

#[test]
fn same_output_as_valgrinds_on_valgrinds_files() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "cachegrind.out.static",
        "cachegrind.out.static-nobranch",
        "cachegrind.out.nosim",
        "cachegrind.out.default.HEAD60",
    ] {
        std::fs::copy(examples().join(name), dir.path().join(name)).unwrap();
        for opts in OPTION_SETS {
            let nosim = name.ends_with("nosim");
            if nosim && opts.iter().any(|o| o.contains("Dr") || o.contains("Dw")) {
                continue;
            }
            let mut args: Vec<&str> = opts.to_vec();
            args.push(name);
            compare(&args, dir.path());
        }
    }
}

/// A source file and a data file for it with lines in context groups, a line past the end,
/// a line-0 entry, a second file found through `-I`, and a function in a file that does not
/// exist.
fn annotation_fixture(dir: &Path) {
    let mut src = String::new();
    for i in 1..=60 {
        src.push_str(&format!("int line{i} = {i};\n"));
    }
    std::fs::create_dir_all(dir.join("inc")).unwrap();
    std::fs::write(dir.join("prog.c"), &src).unwrap();
    std::fs::write(
        dir.join("inc/helper.h"),
        "static int h(void)\n{\n  return 1;\n}\n",
    )
    .unwrap();
    let data = "desc: I1 cache:         32768 B, 64 B, 8-way associative
desc: D1 cache:         32768 B, 64 B, 8-way associative
desc: LL cache:         8388608 B, 64 B, 16-way associative
cmd: ./prog a b
events: Ir Dr Dw
fl=prog.c
fn=main
0 5 1 1
3 1000 200 100
12 50 . 3
14 20 5
40 7 1 1
75 9 0 0
fn=other
59 300 30 0
fl=helper.h
fn=h
2 400 10 0
3 100 0 .
9 1 1 1
fl=missing.c
fn=lost
5 250 20 20

# a comment
summary: 2142 268 126
";
    std::fs::write(dir.join("cachegrind.out.fixture"), data).unwrap();
    // The data file is newer than the sources (no warning) ...
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    for f in ["prog.c", "inc/helper.h"] {
        let file = std::fs::File::options()
            .write(true)
            .open(dir.join(f))
            .unwrap();
        file.set_modified(old).unwrap();
    }
}

#[test]
fn same_source_annotation_as_valgrinds() {
    let dir = tempfile::tempdir().unwrap();
    annotation_fixture(dir.path());
    let d = dir.path();
    for opts in OPTION_SETS.iter().copied().chain([
        &["-Iinc"][..],
        &["--include=inc/", "--context=1"][..],
        &["--context=0", "-Iinc"][..],
        &["--auto=no", "-Iinc", "helper.h"][..],
        &["--sort=Dr,Ir", "--show=Dr,Ir", "-Iinc"][..],
    ]) {
        let mut args: Vec<&str> = opts.to_vec();
        // Source files named after the data file are user-annotated.
        let user: Vec<&str> = args.iter().copied().filter(|a| *a == "helper.h").collect();
        args.retain(|a| *a != "helper.h");
        args.push("cachegrind.out.fixture");
        args.extend(user);
        compare(&args, d);
    }
    // ... and then older, which prints the warning.
    let new = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    let f = std::fs::File::options()
        .write(true)
        .open(d.join("prog.c"))
        .unwrap();
    f.set_modified(new).unwrap();
    compare(&["cachegrind.out.fixture"], d);
}

#[test]
fn malformed_lines_are_warned_about_in_the_scripts_words() {
    let dir = tempfile::tempdir().unwrap();
    let data = "desc: x\ncmd: p\nevents: Ir\nfl=a.c\nfn=f\n1 10\nbogus here\n2 5\nsummary: 15\n";
    std::fs::write(dir.path().join("cg.out"), data).unwrap();
    compare(&["cg.out"], dir.path());
}

#[test]
fn version_and_help_go_to_stdout() {
    let ox = env!("CARGO_BIN_EXE_oxgrind");
    let (out, _, ok) = run(ox, &["cg_annotate"], &["--version"], Path::new("/"));
    assert!(ok);
    assert_eq!(out, "cg_annotate-3.19.0\n");
    let (out, _, ok) = run(ox, &["cg_annotate"], &["--help"], Path::new("/"));
    assert!(
        ok && out.starts_with("usage: cg_annotate [options]"),
        "{out}"
    );
    let (_, err, ok) = run(ox, &["cg_annotate"], &["--frob", "x"], Path::new("/"));
    assert!(
        !ok && err.starts_with("oxgrind: cg_annotate: unknown option `--frob`"),
        "{err}"
    );
    let (_, err, ok) = run(
        ox,
        &["cg_annotate"],
        &["/nonexistent/cg.out"],
        Path::new("/"),
    );
    assert!(
        !ok && err.contains("Cannot open /nonexistent/cg.out"),
        "{err}"
    );
}

/// `oxgrind cg_merge` writes what `/usr/bin/cg_merge` writes, progress messages included.
#[test]
fn cg_merge_writes_valgrinds_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "cachegrind.out.static",
        "cachegrind.out.static-nobranch",
        "cachegrind.out.nosim",
    ] {
        std::fs::copy(examples().join(name), dir.path().join(name)).unwrap();
    }
    // A second profile of the same program, with different counts and a new function.
    let other = std::fs::read_to_string(dir.path().join("cachegrind.out.static"))
        .unwrap()
        .replace("fn=main\n4 74", "fn=main\n4 75")
        .replace("summary: 500089", "summary: 500090")
        .replace(
            "fl=???\n",
            "fl=???\nfn=aaa_new\n7 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
        );
    std::fs::write(dir.path().join("other.out"), other).unwrap();
    let ox = env!("CARGO_BIN_EXE_oxgrind");
    for files in [
        &["cachegrind.out.static", "other.out"][..],
        &[
            "cachegrind.out.nosim",
            "cachegrind.out.nosim",
            "cachegrind.out.nosim",
        ][..],
        &["cachegrind.out.static-nobranch"][..],
    ] {
        let mut with_o = vec!["-o", "merged.vg"];
        with_o.extend_from_slice(files);
        // `cg_merge` found on the PATH names itself so in its messages.
        let (_, p_err, p_ok) = run("cg_merge", &[], &with_o, dir.path());
        with_o[1] = "merged.ox";
        let (_, o_err, o_ok) = run(ox, &["cg_merge"], &with_o, dir.path());
        assert!(p_ok && o_ok, "{p_err}\n{o_err}");
        assert_eq!(o_err.replace("merged.ox", "merged.vg"), p_err);
        let p = std::fs::read(dir.path().join("merged.vg")).unwrap();
        let o = std::fs::read(dir.path().join("merged.ox")).unwrap();
        assert!(p == o, "cg_merge {files:?} differs");
        // Without -o the merged file goes to stdout.
        let (p_out, _, _) = run("cg_merge", &[], files, dir.path());
        let (o_out, _, _) = run(ox, &["cg_merge"], files, dir.path());
        assert_eq!(o_out, p_out);
    }
    // Mismatched events are refused, as by cg_merge.
    let (_, err, ok) = run(
        ox,
        &["cg_merge"],
        &["cachegrind.out.static", "cachegrind.out.nosim"],
        dir.path(),
    );
    assert!(
        !ok && err.contains("\"events:\" line of most recent file does not match"),
        "{err}"
    );
}
