//! `oxgrind report [--format=html|json|sarif] [-o FILE] FILE...`: the process side of
//! `oxgrind_report` (read the files, write the page or the JSON, one-line errors).
//!
//! The HTML page goes to `oxgrind-report.html` unless `-o` says otherwise (a page on a
//! terminal helps nobody); JSON and SARIF go to stdout unless `-o` is given. `-o -` is stdout.

use anyhow::{anyhow, bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

const USAGE: &str = "usage: oxgrind report [--format=html|json|sarif] [-o FILE] FILE...\n\
  FILE: massif.out, dhat.out or Memcheck XML (--xml=yes) files, Valgrind's or oxgrind's\n\
  --format=html   one self-contained page (default), written to oxgrind-report.html\n\
  --format=json   the report's data for scripts (docs/report.md), on stdout\n\
  --format=sarif  Memcheck's errors as SARIF 2.1.0, on stdout\n\
  -o FILE, --output=FILE   where to write (- for stdout)\n\
  -I DIR, --source-dir=DIR  look for source files of Memcheck stacks here too\n\
  --source-root=DIR  SARIF paths are relative to DIR (default: the current directory)\n";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Format {
    Html,
    Json,
    Sarif,
}

pub fn main(args: &[String]) -> Result<()> {
    let mut format = Format::Html;
    let mut output: Option<String> = None;
    let mut files: Vec<PathBuf> = Vec::new();
    let mut options = oxgrind_report::Options::default();
    let mut sarif = oxgrind_report::sarif::SarifOptions::default();
    let mut it = args.iter();
    let mut options_done = false;
    while let Some(a) = it.next() {
        if options_done || !a.starts_with('-') || a == "-" {
            files.push(PathBuf::from(a));
            continue;
        }
        if a == "--" {
            options_done = true;
        } else if a == "-h" || a == "--help" {
            print!("{USAGE}");
            return Ok(());
        } else if let Some(f) = a.strip_prefix("--format=") {
            format = match f {
                "html" => Format::Html,
                "json" => Format::Json,
                "sarif" => Format::Sarif,
                _ => bail!("report: unknown format `{f}` (html, json or sarif)"),
            };
        } else if a == "-o" || a == "--output" {
            output = Some(
                it.next()
                    .ok_or_else(|| anyhow!("report: {a} needs a file name"))?
                    .clone(),
            );
        } else if let Some(o) = a.strip_prefix("--output=") {
            output = Some(o.to_string());
        } else if let Some(d) = a.strip_prefix("--source-root=") {
            // Not canonicalised: the root is where the program was built, which need not
            // exist where the report is made.
            sarif.source_root = std::env::current_dir()
                .context("report: current directory")?
                .join(d);
        } else if a == "-I" {
            let d = it
                .next()
                .ok_or_else(|| anyhow!("report: -I needs a directory"))?;
            options.source_dirs.push(PathBuf::from(d));
        } else if let Some(d) = a
            .strip_prefix("--source-dir=")
            .or_else(|| a.strip_prefix("-I"))
        {
            options.source_dirs.push(PathBuf::from(d));
        } else {
            bail!("report: unknown option `{a}` (oxgrind report --help)");
        }
    }
    if files.is_empty() {
        bail!("report: no input file (usage: oxgrind report [--format=html|json|sarif] [-o FILE] FILE...)");
    }
    let inputs = files
        .iter()
        .map(|f| oxgrind_report::load(f).map_err(|e| anyhow!("report: {e}")))
        .collect::<Result<Vec<_>>>()?;
    let (text, default_out) = match format {
        Format::Html => (
            oxgrind_report::report_html(&inputs, &options),
            Some("oxgrind-report.html"),
        ),
        Format::Json => (oxgrind_report::report_json(&inputs, &options), None),
        Format::Sarif => (
            oxgrind_report::sarif::from_inputs(&inputs, &sarif)
                .map_err(|e| anyhow!("report: {e}"))?,
            None,
        ),
    };
    write_output(output.as_deref().or(default_out), text.as_bytes(), "report")
}

/// Writes to `path` (stdout for `None` or `-`), saying on stderr where a page went.
pub fn write_output(path: Option<&str>, bytes: &[u8], what: &str) -> Result<()> {
    match path {
        None | Some("-") => {
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            out.write_all(bytes)?;
            out.flush()?;
        }
        Some(p) => {
            std::fs::write(Path::new(p), bytes)
                .with_context(|| format!("{what}: cannot write {p}"))?;
            eprintln!("oxgrind: {what} written to {p}");
        }
    }
    Ok(())
}
