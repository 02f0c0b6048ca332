//! `oxgrind diff [--format=text|html|json] [-o FILE] [--fail-if-grown=PCT] OLD NEW`: the
//! process side of `oxgrind_report::diff`.
//!
//! Exit status: 0, or `oxgrind_options::BUDGET_EXIT_CODE` (3, as a run's broken `--max-*`
//! budget) when `--fail-if-grown` is given and the total
//! grew by more than PCT percent (one line on stderr says by how much and which site grew
//! most), or 1 when oxgrind cannot do what was asked.

use super::report::write_output;
use anyhow::{anyhow, bail, Result};
use oxgrind_options::BUDGET_EXIT_CODE;
use std::process::ExitCode;

const USAGE: &str = "usage: oxgrind diff [--format=text|html|json] [--html] [-o FILE] [--fail-if-grown=PCT] OLD NEW\n\
  OLD, NEW: two massif.out, two dhat.out or two Memcheck XML files\n\
  compares the peak (massif), total bytes (dhat) or leaked bytes (memcheck), site by site\n\
  --fail-if-grown=PCT  exit with status 3 if the total grew by more than PCT percent\n";

pub fn main(args: &[String]) -> Result<ExitCode> {
    let mut format = "text";
    let mut output: Option<String> = None;
    let mut budget: Option<f64> = None;
    let mut files = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if !a.starts_with('-') || a == "-" {
            files.push(a.clone());
        } else if a == "-h" || a == "--help" {
            print!("{USAGE}");
            return Ok(ExitCode::SUCCESS);
        } else if a == "--html" {
            format = "html";
        } else if let Some(f) = a.strip_prefix("--format=") {
            format = match f {
                "text" => "text",
                "html" => "html",
                "json" => "json",
                _ => bail!("diff: unknown format `{f}` (text, html or json)"),
            };
        } else if a == "-o" || a == "--output" {
            output = Some(
                it.next()
                    .ok_or_else(|| anyhow!("diff: {a} needs a file name"))?
                    .clone(),
            );
        } else if let Some(o) = a.strip_prefix("--output=") {
            output = Some(o.to_string());
        } else if let Some(p) = a.strip_prefix("--fail-if-grown=") {
            let p = p.trim_end_matches('%');
            budget = Some(
                p.parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .ok_or_else(|| {
                        anyhow!("diff: --fail-if-grown needs a percentage, not `{p}`")
                    })?,
            );
        } else {
            bail!("diff: unknown option `{a}` (oxgrind diff --help)");
        }
    }
    let [old, new] = files.as_slice() else {
        bail!("diff: needs two files, OLD and NEW (oxgrind diff --help)");
    };
    let load = |f: &String| {
        oxgrind_report::load(std::path::Path::new(f)).map_err(|e| anyhow!("diff: {e}"))
    };
    let (old, new) = (load(old)?, load(new)?);
    let d = oxgrind_report::diff::diff(&old, &new).map_err(|e| anyhow!("diff: {e}"))?;
    let (text, default_out) = match format {
        "html" => (d.html(), Some("oxgrind-diff.html")),
        "json" => (d.json(), None),
        _ => (d.text(), None),
    };
    write_output(output.as_deref().or(default_out), text.as_bytes(), "diff")?;
    if let Some(pct) = budget {
        if let Some(line) = d.fail_if_grown(pct) {
            eprintln!("oxgrind: {line}");
            return Ok(ExitCode::from(BUDGET_EXIT_CODE as u8));
        }
    }
    Ok(ExitCode::SUCCESS)
}
