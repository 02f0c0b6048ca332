//! Tools people already use on Valgrind's files read ours the same way: ValgrindCI (PyPI
//! `valgrindci`, a CI gate over `--xml=yes` output) and msparser (PyPI, a massif.out reader).
//! `scripts/test.sh` installs both into a venv and names its python in OXGRIND_TEST_PYTHON.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn consumer_python() -> Option<PathBuf> {
    match std::env::var_os("OXGRIND_TEST_PYTHON") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            assert!(
                std::env::var_os("CI").is_none(),
                "OXGRIND_TEST_PYTHON must be set in CI (scripts/test.sh)"
            );
            eprintln!("note: OXGRIND_TEST_PYTHON not set (run scripts/test.sh); third-party consumer checks skipped");
            None
        }
    }
}

#[test]
fn valgrind_ci_reads_our_xml_as_it_reads_valgrinds() {
    let (Some(py), true) = (consumer_python(), have_valgrind()) else {
        return;
    };
    let ci = py.parent().unwrap().join("valgrind-ci");
    let prog = build("mc_heap.c", &["-g", "-O0", "-w"]);
    let dir = tempfile::tempdir().unwrap();
    let mut outputs = Vec::new();
    for (tool, name) in [
        (oxgrind(), "ours.xml"),
        (PathBuf::from("valgrind"), "theirs.xml"),
    ] {
        let xml = dir.path().join(name);
        let o = run(Command::new(&tool)
            .args(["--xml=yes", "--leak-check=full"])
            .arg(format!("--xml-file={}", xml.display()))
            .arg(&prog));
        assert!(o.status.success(), "{}", stderr(&o));
        let count = run(Command::new(&ci).arg(&xml).arg("--number-of-errors"));
        let summary = run(Command::new(&ci).arg(&xml).arg("--summary"));
        assert!(
            count.status.success() && summary.status.success(),
            "valgrind-ci failed on {name}: {}",
            stderr(&summary)
        );
        outputs.push((stdout(&count), stdout(&summary)));
    }
    assert_eq!(outputs[0].0, "10 errors.\n");
    assert_eq!(
        outputs[0], outputs[1],
        "valgrind-ci sees our XML differently"
    );
}

fn msparser_summary(py: &Path, file: &Path) -> String {
    let script = r#"
import sys, msparser
d = msparser.parse_file(sys.argv[1])
s = d['snapshots']
peak = s[d['peak_snapshot_index']] if d['peak_snapshot_index'] is not None else None
print(d['time_unit'], len(s), peak and peak['mem_heap'], sum(1 for x in s if x['heap_tree']))
"#;
    let o = run(Command::new(py).arg("-c").arg(script).arg(file));
    assert!(
        o.status.success(),
        "msparser cannot read {}: {}",
        file.display(),
        stderr(&o)
    );
    stdout(&o)
}

#[test]
fn msparser_reads_our_massif_files_as_it_reads_valgrinds() {
    let (Some(py), true) = (consumer_python(), have_valgrind()) else {
        return;
    };
    let prog = build(
        "../../../shared/reference/examples/src/ms_prog.c",
        &["-g", "-O2"],
    );
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ours = run(Command::new(oxgrind())
        .args(["--tool=massif", "--time-unit=B", "--massif-out-file=m.out"])
        .arg(&prog)
        .current_dir(a.path()));
    let theirs = run(Command::new("valgrind")
        .args([
            "-q",
            "--tool=massif",
            "--time-unit=B",
            "--massif-out-file=m.out",
        ])
        .arg(&prog)
        .current_dir(b.path()));
    assert!(ours.status.success() && theirs.status.success());
    let (o, t) = (
        msparser_summary(&py, &a.path().join("m.out")),
        msparser_summary(&py, &b.path().join("m.out")),
    );
    assert!(o.starts_with("B "), "{o}");
    assert_eq!(o, t);
    // Page mode, which Valgrind files are also read in.
    let pages = build("pages.c", &["-g", "-O1"]);
    let p = run(Command::new(oxgrind())
        .args([
            "--tool=massif",
            "--pages-as-heap=yes",
            "--massif-out-file=p.out",
        ])
        .arg(&pages)
        .current_dir(a.path()));
    assert!(p.status.success(), "{}", stderr(&p));
    let s = msparser_summary(&py, &a.path().join("p.out"));
    assert!(s.starts_with("i "), "{s}"); // the default unit, as in Valgrind
}
