//! `--format=sarif` against the published SARIF 2.1.0 JSON schema (vendored in tests/data,
//! validated with Python's `jsonschema`, which scripts/test.sh installs), and the results
//! carrying what code-scanning services show: rule, message, location, the rest of the stack.

mod common;
use common::example;
use oxgrind_report::sarif::{from_inputs, SarifOptions};
use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> Option<PathBuf> {
    match std::env::var_os("OXGRIND_TEST_PYTHON") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            assert!(
                std::env::var_os("CI").is_none(),
                "OXGRIND_TEST_PYTHON must be set in CI (scripts/test.sh)"
            );
            eprintln!("note: OXGRIND_TEST_PYTHON not set (run scripts/test.sh); SARIF schema checks skipped");
            None
        }
    }
}

/// Validates `sarif` and prints a summary of it: one line per result.
const CHECK: &str = r#"
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
doc = json.loads(sys.stdin.read())
errors = list(jsonschema.Draft202012Validator(schema).iter_errors(doc))
for e in errors[:5]:
    print("INVALID", list(e.path), e.message[:200])
# The validator must be able to fail: a wrong version is refused.
bad = dict(doc, version="2.0.0")
assert list(jsonschema.Draft202012Validator(schema).iter_errors(bad)), "schema accepts anything"
for run in doc["runs"]:
    for r in run["results"]:
        loc = r["locations"][0]
        phys = loc.get("physicalLocation")
        where = f'{phys["artifactLocation"]["uri"]}:{phys["region"]["startLine"]}' if phys else "-"
        fn = loc["logicalLocations"][0]["name"]
        print(r["ruleId"], r["level"], where, fn, len(r["relatedLocations"]), r["occurrenceCount"], r["message"]["text"], sep="|")
"#;

fn check(files: &[&Path]) -> Vec<String> {
    let inputs: Vec<_> = files
        .iter()
        .map(|f| oxgrind_report::load(f).unwrap())
        .collect();
    let sarif = from_inputs(
        &inputs,
        &SarifOptions {
            source_root: PathBuf::from("/src"),
        },
    )
    .unwrap();
    let Some(py) = python() else {
        return Vec::new();
    };
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sarif-schema-2.1.0.json");
    let mut child = Command::new(py)
        .arg("-c")
        .arg(CHECK)
        .arg(schema)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(sarif.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(
        !lines.iter().any(|l| l.starts_with("INVALID")),
        "{lines:#?}"
    );
    lines
}

#[test]
fn memcheck_errors_are_valid_sarif_with_source_locations() {
    let lines = check(&[&example("memcheck", "mc_errors.plain.xml")]);
    if lines.is_empty() {
        return;
    }
    assert_eq!(lines.len(), 12, "{lines:#?}");
    // The invalid write: at main (mc_errors.c:24), the allocation stack related (2 frames).
    assert_eq!(
        lines[0],
        "InvalidWrite|error|fmt/mc_errors.c:24|main|2|1|Invalid write of size 4"
    );
    // Invalid free: the location skips free() (no source) for main's line; free is related.
    assert_eq!(
        lines[3],
        "InvalidFree|error|fmt/mc_errors.c:31|main|5|1|Invalid free() / delete / delete[] / realloc()"
    );
    assert!(lines
        .iter()
        .any(|l| l.starts_with("Leak_PossiblyLost|warning|fmt/mc_errors.c:16|leak_possible|")));
    assert_eq!(
        lines[11],
        "Leak_DefinitelyLost|error|fmt/mc_errors.c:8|leak_definite|2|1|100 bytes in 1 blocks are definitely lost in loss record 6 of 6"
    );
}

#[test]
fn suppressions_and_fatal_signals_stay_valid() {
    check(&[
        &example("memcheck", "mc_errors.gen-suppressions-all.xml"),
        &example(
            "memcheck",
            "mc_crash.fatal_signal.track-fds.logfilequalifier.xml",
        ),
    ]);
}

#[test]
fn sarif_is_only_for_memcheck() {
    let input = oxgrind_report::load(&example("massif", "massif.out.small")).unwrap();
    let err = from_inputs(&[input], &SarifOptions::default()).unwrap_err();
    assert!(
        err.ends_with("SARIF is for Memcheck's errors; this is a massif file"),
        "{err}"
    );
}
