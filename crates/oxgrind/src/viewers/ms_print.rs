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
/// `--peak-only` (Valgrind 3.28's option "for use in Continuous Integration") prints the
/// header and the peak snapshot's table row and tree alone: see [`peak_only`].
pub fn main(args: &[String]) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    run(args, &mut out)
}

/// [`main`] with the output going to `out`.
fn run(args: &[String], out: &mut dyn Write) -> Result<()> {
    let only_peak = args.iter().any(|a| a == "--peak-only");
    let args: Vec<String> = args
        .iter()
        .filter(|a| *a != "--peak-only")
        .cloned()
        .collect();
    let invocation = ms_print::parse_args(&args).map_err(|e| {
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
                Ok(text) if only_peak => match peak_only(&text) {
                    Some(peak) => emit(out, &peak),
                    None => Err(anyhow!("ms_print: {file}: no peak snapshot")),
                },
                Ok(text) => emit(out, &text),
                Err(err) => {
                    emit(out, &err.partial_output)?;
                    Err(anyhow!("ms_print: {file}: {err}"))
                }
            }
        }
    }
}

/// The peak alone, cut from ms_print's own rendering so every byte of it is ms_print's: the
/// header (command, arguments), then the snapshot table's heading and the peak's row with its
/// tree. The peak is the snapshot `Detailed snapshots:` marks `(peak)`.
fn peak_only(text: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(text).ok()?;
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let rule = *lines.first()?;
    // The header: from the first rule to the second, inclusive.
    let header_end = 1 + lines[1..].iter().position(|l| *l == rule)?;
    // ` Detailed snapshots: [7, 12, 56 (peak), 66]`
    let detailed = lines
        .iter()
        .position(|l| l.starts_with(" Detailed snapshots: ["))?;
    let n: usize = lines[detailed]
        .strip_prefix(" Detailed snapshots: [")?
        .trim_end()
        .trim_end_matches(']')
        .split(", ")
        .find_map(|item| item.strip_suffix(" (peak)"))?
        .parse()
        .ok()?;
    // The row, below a table heading (`  n        time(i) ...` between two rules); ms_print
    // starts a new heading after every tree, so the tree ends at the next rule.
    let row_start = format!("{n:>3} ");
    let row = (detailed + 1..lines.len()).find(|&i| lines[i].starts_with(&row_start))?;
    let heading = (0..row).rev().find(|&i| lines[i].starts_with("  n "))?;
    let tree_end = (row + 1..lines.len())
        .find(|&i| lines[i] == rule)
        .unwrap_or(lines.len());
    let mut out = lines[..=header_end].concat();
    out.push('\n');
    out.push_str(&lines[heading - 1..=heading + 1].concat());
    out.push_str(lines[row..tree_end].concat().trim_end());
    out.push('\n');
    Some(out.into_bytes())
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
    fn peak_only_prints_the_header_and_the_peak_snapshot_alone() {
        let dir = example("");
        let full =
            String::from_utf8(std::fs::read(dir.join("ms_print.default.txt")).unwrap()).unwrap();
        let file = dir.join("massif.out.default");
        let mut out = Vec::new();
        run(&args(&["--peak-only", file.to_str().unwrap()]), &mut out).unwrap();
        let got = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = got.lines().collect();
        assert_eq!(lines[1], "Command:            ./ms_prog");
        assert!(lines[3].starts_with("ms_print arguments: "), "{got}");
        assert!(!got.contains("Number of snapshots"), "{got}");
        // The peak's row and tree, exactly as the full ms_print output has them.
        let row = " 56        282,414          910,800          900,800        10,000            0";
        assert!(lines.contains(&row), "{got}");
        let from = full.find(row).unwrap();
        let tree_end = from + full[from..].find("\n\n---").unwrap();
        assert!(
            got.trim_end().ends_with(full[from..tree_end].trim_end()),
            "{got}"
        );
        assert_eq!(got.matches("  n        time(i)").count(), 1, "{got}");
        assert!(got.ends_with("(01.00%)\n"), "{got:?}");
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
