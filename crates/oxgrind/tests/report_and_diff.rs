//! `oxgrind report` and `oxgrind diff` as a user runs them: files written where asked, JSON on
//! stdout, one-line errors, and `--fail-if-grown`'s exit status and message.

mod common;
use std::path::{Path, PathBuf};
use std::process::Command;

fn oxgrind() -> Command {
    Command::new(common::oxgrind())
}

fn example(kind: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/reference/examples")
        .join(kind)
        .join(name)
}

/// massif.out.default with `extra` more bytes at the peak under `main (ms_prog.c:24)`.
fn grown_massif(dir: &Path, extra: u64) -> PathBuf {
    use oxgrind_formats::massif::{self, SnapshotKind};
    let mut f =
        massif::parse(&std::fs::read(example("massif", "massif.out.default")).unwrap()).unwrap();
    let peak = f
        .snapshots
        .iter_mut()
        .find(|s| s.kind == SnapshotKind::Peak)
        .unwrap();
    peak.mem_heap_b += extra;
    let tree = peak.tree.as_mut().unwrap();
    tree.bytes += extra;
    let site = tree
        .children
        .iter_mut()
        .find(|c| c.label.ends_with(": main (ms_prog.c:24)"))
        .unwrap();
    site.bytes += extra;
    let out = dir.join("massif.out.new");
    std::fs::write(&out, massif::write(&f)).unwrap();
    out
}

#[test]
fn report_writes_one_self_contained_page() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.html");
    let run = oxgrind()
        .arg("report")
        .arg(example("massif", "massif.out.default"))
        .arg(example("memcheck", "mc_errors.plain.xml"))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let page = std::fs::read_to_string(&out).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(page.contains("\"kind\":\"massif\"") && page.contains("\"kind\":\"memcheck\""));
    // Nothing is fetched: no external script, style or image.
    for needle in ["src=\"http", "href=\"http", "<link", "src=\"//"] {
        assert!(!page.contains(needle), "{needle}");
    }
    assert!(page.contains("default-src 'none'"));
}

#[test]
fn report_json_goes_to_stdout() {
    let run = oxgrind()
        .args(["report", "--format=json"])
        .arg(example("dhat", "dhat.out.heap"))
        .output()
        .unwrap();
    assert!(run.status.success());
    let text = String::from_utf8(run.stdout).unwrap();
    assert!(
        text.starts_with("{\"oxgrind_report\":1,\"files\":[{\"kind\":\"dhat\""),
        "{text}"
    );
    assert!(text.contains("\"totals\":{\"tb\":10052,"), "{text}");
}

#[test]
fn report_refuses_what_it_cannot_read_in_one_line() {
    let run = oxgrind()
        .arg("report")
        .arg(example("memcheck", "mc_errors.default-summary.txt"))
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(1));
    let err = String::from_utf8(run.stderr).unwrap();
    assert!(
        err.starts_with("oxgrind: report: ") && err.contains("--xml=yes"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let run = oxgrind()
        .args(["report", "--format=pdf", "x"])
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(1));
}

#[test]
fn diff_text_lists_the_grown_site_first() {
    let dir = tempfile::tempdir().unwrap();
    let new = grown_massif(dir.path(), 200_000);
    let run = oxgrind()
        .arg("diff")
        .arg(example("massif", "massif.out.default"))
        .arg(&new)
        .output()
        .unwrap();
    assert!(run.status.success());
    let text = String::from_utf8(run.stdout).unwrap();
    assert!(
        text.contains("change: +200,000 B (+195.3 KiB) (+21.96%)"),
        "{text}"
    );
    let first_site = text
        .lines()
        .skip_while(|l| !l.contains("  site"))
        .nth(1)
        .unwrap();
    assert!(first_site.ends_with("main (ms_prog.c:24)"), "{text}");
}

#[test]
fn fail_if_grown_exits_3_with_one_line_over_budget_and_0_under() {
    let dir = tempfile::tempdir().unwrap();
    let new = grown_massif(dir.path(), 200_000);
    let old = example("massif", "massif.out.default");
    let over = oxgrind()
        .arg("diff")
        .arg("--fail-if-grown=10")
        .arg(&old)
        .arg(&new)
        .output()
        .unwrap();
    assert_eq!(over.status.code(), Some(3));
    let err = String::from_utf8(over.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("oxgrind: budget broken: peak bytes grew +21.96%"),
        "{err}"
    );
    assert!(
        err.contains("top site: main (ms_prog.c:24) (+200,000 B"),
        "{err}"
    );
    let under = oxgrind()
        .arg("diff")
        .arg("--fail-if-grown=25%")
        .arg(&old)
        .arg(&new)
        .output()
        .unwrap();
    assert_eq!(
        under.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&under.stderr)
    );
    assert!(under.stderr.is_empty());
}

#[test]
fn diff_html_writes_a_page() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("d.html");
    let run = oxgrind()
        .arg("diff")
        .arg("--html")
        .arg("-o")
        .arg(&out)
        .arg(example("dhat", "dhat.out.heap"))
        .arg(example("dhat", "dhat.out.heap2"))
        .output()
        .unwrap();
    assert!(run.status.success());
    let page = std::fs::read_to_string(&out).unwrap();
    assert!(page.contains("\"diff\":{\"of\":\"dhat\""));
}

/// Our own tools' files, not only Valgrind's: run Memcheck (XML), Massif and DHAT on a program
/// with known figures (tests/corpus/budgets.c) and read all three into one report.
#[test]
fn report_reads_what_our_tools_write() {
    let prog = common::build("budgets.c", &["-g", "-O0"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let xml = d.join("mc.xml");
    let massif = d.join("massif.out");
    let dhat = d.join("dhat.out");
    for args in [
        vec![
            "--tool=memcheck".to_string(),
            "--leak-check=full".into(),
            "--xml=yes".into(),
            format!("--xml-file={}", xml.display()),
        ],
        vec![
            "--tool=massif".into(),
            format!("--massif-out-file={}", massif.display()),
        ],
        vec![
            "--tool=dhat".into(),
            format!("--dhat-out-file={}", dhat.display()),
        ],
    ] {
        let o = common::run(oxgrind().args(&args).arg(&prog));
        assert!(o.status.success(), "{args:?}: {}", common::stderr(&o));
    }
    let o = oxgrind()
        .args(["report", "--format=json"])
        .args([&xml, &massif, &dhat])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let json = String::from_utf8(o.stdout).unwrap();
    // Memcheck: 5,000 bytes definitely lost, allocated in leak_it.
    assert!(json.contains("{\"kind\":\"Leak_DefinitelyLost\",\"name\":\"definitely lost\",\"bytes\":5000,\"blocks\":1,"), "{json}");
    assert!(json.contains("\"fn\":\"leak_it\""), "{json}");
    // Massif: the peak is 105,000 useful bytes.
    assert!(json.contains("\"heap_b\":105000"), "{json}");
    // DHAT: 101 blocks, 105,000 bytes in all.
    assert!(
        json.contains("\"totals\":{\"tb\":105000,\"tbk\":101,"),
        "{json}"
    );
    let o = oxgrind()
        .args(["report", "--format=sarif"])
        .arg(&xml)
        .output()
        .unwrap();
    assert!(o.status.success());
    let sarif = String::from_utf8(o.stdout).unwrap();
    assert!(
        sarif.contains("\"ruleId\":\"Leak_DefinitelyLost\""),
        "{sarif}"
    );
}
