//! Shared by the report tests: reference examples, and opening a page in Chromium.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A file from shared/reference/examples (real Valgrind 3.19 outputs).
pub fn example(kind: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/reference/examples")
        .join(kind)
        .join(name)
}

/// What a page did in the browser: each step's value, and any console error or exception.
pub struct PageRun {
    pub results: Vec<String>,
    pub console_errors: Vec<String>,
}

/// Opens `html` in headless Chromium (tests/chromium.py, DevTools protocol) and runs `steps`
/// (see chromium.py). Values come back as JSON text (`"\"a\""`, `12`), compared as such.
pub fn run_in_chromium(html: &str, steps: &str) -> PageRun {
    // One browser at a time: each is several processes, and the tests run in parallel on
    // small CI machines where five Chromiums at once come close to the driver's timeouts.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("report.html");
    std::fs::write(&page, html).unwrap();
    let steps_file = dir.path().join("steps.json");
    std::fs::write(&steps_file, steps).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/chromium.py");
    let out = Command::new("/usr/bin/python3")
        .arg(&script)
        .arg(&page)
        .arg(&steps_file)
        .output()
        .expect("run /usr/bin/python3");
    assert!(
        out.status.success(),
        "chromium.py failed (is Debian's chromium installed? scripts/test.sh installs it):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    parse_run(&text)
}

/// chromium.py prints `{"results": [...], "console_errors": [...]}`; this splits the two
/// arrays into their JSON elements without a JSON library (values are compared as text).
fn parse_run(text: &str) -> PageRun {
    let results_at = text.find("\"results\": [").expect("results") + "\"results\": [".len();
    let errors_at = text
        .find("], \"console_errors\": [")
        .expect("console_errors");
    let results = split_top(&text[results_at..errors_at]);
    let rest = &text[errors_at + "], \"console_errors\": [".len()..];
    let end = rest.rfind("]}").expect("end");
    PageRun {
        results,
        console_errors: split_top(&rest[..end]),
    }
}

/// Top-level elements of a JSON array's inside.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut depth, mut in_str, mut esc, mut start) = (0i32, false, false, 0usize);
    for (i, c) in s.char_indices() {
        if in_str {
            match (esc, c) {
                (true, _) => esc = false,
                (false, '\\') => esc = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '[' | '{' => depth += 1,
            ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim().to_string());
                start = i + 1;
            }
            _ => {}
        }
    }
    if !s[start..].trim().is_empty() {
        out.push(s[start..].trim().to_string());
    }
    out
}

/// A JSON string literal for `s` (for comparing with results).
pub fn js(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}
