//! Shared by the massif/ms_print tests: where the reference files are, and how to run the
//! real `/usr/bin/ms_print` for comparison.
#![allow(dead_code)]

use oxgrind_formats::massif::ms_print::{self, Options};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const MS_PRINT: &str = "/usr/bin/ms_print";

/// `shared/reference/examples/massif` beside the repository.
pub fn massif_examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference/examples/massif")
}

/// Every `massif.out.*` example, sorted. Panics (fails the test) if the directory is missing:
/// the examples are part of the test set, not optional.
pub fn example_files() -> Vec<PathBuf> {
    let dir = massif_examples();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("massif.out."))
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no massif.out.* in {}", dir.display());
    files
}

/// True if the real ms_print can be run; prints a note otherwise so a skip is visible.
pub fn have_ms_print(test: &str) -> bool {
    let ok = Path::new(MS_PRINT).exists();
    if !ok {
        eprintln!("NOTE: {test}: {MS_PRINT} is absent, live comparison SKIPPED");
    }
    ok
}

/// What a run of ms_print produced: stdout and whether it exited successfully.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    pub stdout: Vec<u8>,
    pub ok: bool,
}

/// Runs the real ms_print on `file` (relative to `dir`) with `opts` before it.
///
/// ms_print writes its snapshot table to `$TMPDIR/ms_print.tmp.<pid>` and removes it only
/// when it finishes: on a corrupt file it dies and leaves it. Each run gets a directory of
/// its own, removed afterwards, so the corrupt-input tests leave nothing in /tmp.
pub fn run_real(dir: &Path, opts: &[&str], file: &str) -> Outcome {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = std::env::temp_dir().join(format!("oxgrind-ms_print-{}-{run}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    let out = Command::new(MS_PRINT)
        .args(opts)
        .arg(file)
        .current_dir(dir)
        .env("TMPDIR", &tmp)
        .output()
        .unwrap_or_else(|e| panic!("running {MS_PRINT}: {e}"));
    let _ = std::fs::remove_dir_all(&tmp);
    Outcome {
        stdout: out.stdout,
        ok: out.status.success(),
    }
}

/// Runs our ms_print the way the launcher does: arguments parsed by `parse_args`.
pub fn run_ours(dir: &Path, opts: &[&str], file: &str) -> Outcome {
    let mut args: Vec<String> = opts.iter().map(|s| s.to_string()).collect();
    args.push(file.to_string());
    let inv = ms_print::parse_args(&args).expect("valid arguments");
    let ms_print::Invocation::Render {
        options,
        file,
        arguments,
    } = inv
    else {
        panic!("expected a render invocation")
    };
    let data = std::fs::read(dir.join(&file)).expect("reading input");
    match ms_print::render_bytes(&data, &options, &arguments) {
        Ok(stdout) => Outcome { stdout, ok: true },
        Err(e) => Outcome {
            stdout: e.partial_output,
            ok: false,
        },
    }
}

/// Asserts our output equals the real one, showing the first differing line.
pub fn assert_same(what: &str, ours: &Outcome, real: &Outcome) {
    if ours == real {
        return;
    }
    let o = String::from_utf8_lossy(&ours.stdout);
    let r = String::from_utf8_lossy(&real.stdout);
    let (ol, rl): (Vec<&str>, Vec<&str>) = (o.lines().collect(), r.lines().collect());
    let i = ol
        .iter()
        .zip(&rl)
        .position(|(a, b)| a != b)
        .unwrap_or(ol.len().min(rl.len()));
    panic!(
        "{what}: output differs from ms_print (ours ok={}, real ok={}) at line {}:\n  ours: {:?}\n  real: {:?}\n(ours {} lines, real {} lines)",
        ours.ok,
        real.ok,
        i + 1,
        ol.get(i),
        rl.get(i),
        ol.len(),
        rl.len()
    );
}

pub fn default_options() -> Options {
    Options::default()
}
