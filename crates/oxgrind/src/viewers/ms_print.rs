//! `oxgrind ms_print [options] massif-out-file`: Valgrind's `ms_print`, byte for byte.
//!
//! Everything about the output lives in `oxgrind_formats::massif::ms_print` (renderer and
//! command-line grammar, tested there against the real Perl script); this is only the
//! process side: read the file, write stdout, turn problems into one-line errors.
//!
//! Deliberate differences from the Perl script, which reports everything by dying with its
//! usage text on stderr (exit status 255): `-h`/`--help` prints the usage on stdout and
//! `--version` prints `ms_print-3.19.0` on stdout, both with success; a bad option or a file
//! that cannot be read or rendered is one `oxgrind: ms_print: ...` line from the launcher and
//! exit status 1. Output ms_print would have printed before dying (the header, when the
//! problem is only found while drawing the graph) is still printed first, as it does.

use anyhow::{anyhow, Context, Result};
use oxgrind_formats::massif::ms_print::{self, Invocation};
use std::io::Write;

/// Runs ms_print with `args` (the arguments after `ms_print`), printing to stdout.
pub fn main(args: &[String]) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    run(args, &mut out)
}

/// [`main`] with the output going to `out`.
fn run(args: &[String], out: &mut dyn Write) -> Result<()> {
    let invocation = ms_print::parse_args(args).map_err(|e| {
        anyhow!(
            "ms_print: {e} (usage: oxgrind ms_print [--threshold=<m.n>] [--x=<4..1000>] \
             [--y=<4..1000>] massif-out-file)"
        )
    })?;
    match invocation {
        Invocation::Help { usage } => emit(out, usage.as_bytes()),
        Invocation::Version => emit(out, format!("ms_print-{}\n", ms_print::VERSION).as_bytes()),
        Invocation::Render {
            options,
            file,
            arguments,
        } => {
            let data = std::fs::read(&file)
                .with_context(|| format!("ms_print: cannot read massif file {file}"))?;
            match ms_print::render_bytes(&data, &options, &arguments) {
                Ok(text) => emit(out, &text),
                Err(err) => {
                    emit(out, &err.partial_output)?;
                    Err(anyhow!("ms_print: {file}: {err}"))
                }
            }
        }
    }
}

/// Writes and flushes; an I/O error (a closed pipe included) is returned as `std::io::Error`
/// so the launcher can recognise `BrokenPipe`.
fn emit(out: &mut dyn Write, bytes: &[u8]) -> Result<()> {
    out.write_all(bytes)?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::run;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn example(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/reference/examples/massif")
            .join(name)
    }

    #[test]
    fn renders_an_example_exactly_as_stored() {
        let dir = example("");
        let expected = std::fs::read(dir.join("ms_print.small.txt")).expect("stored output");
        // The stored output was produced from inside that directory.
        let cwd = std::env::current_dir().unwrap();
        let file = dir.join("massif.out.small");
        let mut out = Vec::new();
        run(&args(&[file.to_str().unwrap()]), &mut out).unwrap();
        let got = String::from_utf8(out).unwrap();
        let expected = String::from_utf8(expected).unwrap().replace(
            "ms_print arguments: massif.out.small",
            &format!("ms_print arguments: {}", file.display()),
        );
        assert_eq!(got, expected, "(cwd {})", cwd.display());
    }

    #[test]
    fn bad_option_is_a_one_line_error() {
        let err = run(&args(&["--x=2", "f"]), &mut Vec::new()).unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.starts_with("ms_print: value out of range in `--x=2`"),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "{msg}");
        let err = run(&args(&["--frob", "f"]), &mut Vec::new()).unwrap_err();
        assert!(format!("{err:#}").contains("--frob"));
        let err = run(&args(&[]), &mut Vec::new()).unwrap_err();
        assert!(format!("{err:#}").contains("no massif-out-file"));
    }

    #[test]
    fn unreadable_file_names_the_file() {
        let err = run(&args(&["/nonexistent/massif.out.1"]), &mut Vec::new()).unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("cannot read massif file /nonexistent/massif.out.1"),
            "{msg}"
        );
    }

    #[test]
    fn corrupt_file_reports_the_line() {
        let path =
            std::env::temp_dir().join(format!("oxgrind-ms_print-corrupt-{}", std::process::id()));
        std::fs::write(&path, "desc: x\ncmd: y\ntime_unit: i\nsnapshot=0\ntime=zz\nmem_heap_B=0\nmem_heap_extra_B=0\nmem_stacks_B=0\nheap_tree=empty\n").unwrap();
        let err = run(&args(&[path.to_str().unwrap()]), &mut Vec::new()).unwrap_err();
        let _ = std::fs::remove_file(&path);
        let msg = format!("{err:#}");
        assert!(
            msg.contains("line 5: expected a number after `time=`"),
            "{msg}"
        );
    }

    #[test]
    fn help_and_version_print_on_stdout() {
        let mut out = Vec::new();
        run(&args(&["--threshold=5", "-h"]), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("usage: ms_print [options] massif-out-file\n"));
        assert!(text.contains("in percent [1]"));
        let mut out = Vec::new();
        run(&args(&["--version", "--x=2"]), &mut out).unwrap();
        assert_eq!(out, b"ms_print-3.19.0\n");
    }
}
