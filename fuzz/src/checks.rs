//! What every reader of user input must do with any bytes: return a value or an error,
//! never panic, and an error is one line that says where (the file and the line).
//!
//! One function per reader, shared by the cargo-fuzz targets (`fuzz_targets/`, nightly,
//! libFuzzer) and by the stable test `crates/oxgrind/tests/fuzz_readers.rs`, which runs them
//! on the committed corpus (`corpus/<target>/`) and on mutations of it in every CI run.

use oxgrind_formats::{dhat, massif, suppressions};

/// Asserts the rendered error is one line naming `file` and line `line`.
fn one_line_naming(msg: &str, file: &str, line: usize) {
    assert!(!msg.contains('\n'), "error spans lines: {msg:?}");
    assert!(msg.contains(file), "error does not name the file: {msg:?}");
    assert!(
        msg.contains(&format!("line {line}")),
        "error does not name the line: {msg:?}"
    );
}

fn lines_in(data: &[u8]) -> usize {
    data.split(|&b| b == b'\n').count()
}

/// `ms_print`'s reader, then the renderer on what it accepted (as `oxgrind ms_print` does).
pub fn massif_out(data: &[u8]) {
    match massif::parse(data) {
        Ok(f) => {
            let _ = massif::ms_print::render(&f, &Default::default(), &["massif.out.fuzz"]);
        }
        Err(e) => {
            assert!(
                e.line >= 1 && e.line <= lines_in(data) + 1,
                "line {} out of range",
                e.line
            );
            // The launcher's words: "ms_print: FILE: line N: ...".
            one_line_naming(&format!("massif.out.fuzz: {e}"), "massif.out.fuzz", e.line);
        }
    }
}

/// The DHAT JSON reader.
pub fn dhat_json(data: &[u8]) {
    if let Err(e) = dhat::parse(data) {
        assert!(
            e.line >= 1 && e.line <= lines_in(data) + 1,
            "line {} out of range",
            e.line
        );
        assert!(!e.to_string().contains('\n'), "{e}");
    }
}

/// The suppression-file reader (Memcheck's `--suppressions=`).
pub fn suppressions(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Err(e) = suppressions::parse("fuzz.supp", &text, "Memcheck", 12) {
        // Valgrind's message has a line break the launcher joins (": "), as it prints it.
        let shown = e.to_string().replace('\n', ": ");
        one_line_naming(&shown, "fuzz.supp", e.line as usize);
        assert!(
            e.line as usize <= lines_in(data) + 1,
            "line {} out of range",
            e.line
        );
    }
}

/// The command-line parser: one argument per input line, plus each as a file-name template.
pub fn options(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let args: Vec<String> = text.lines().map(str::to_string).collect();
    let _ = oxgrind_options::split_command_line(&args);
    if let Err(e) = oxgrind_options::parse(&args) {
        let shown = e.0.trim().replace('\n', ": ");
        assert!(!shown.is_empty(), "empty error for {args:?}");
    }
    for a in &args {
        let _ = oxgrind_options::template::expand(a, 1, 1, &|_| Some("v".into()), "/");
    }
}
