//! `oxgrind report` and `oxgrind diff`: Valgrind's and oxgrind's output files turned into
//! something people would rather look at, and into what CI systems read.
//!
//! * [`input`]: which format a file is (by content) and its model, through `oxgrind-formats`'
//!   readers (massif.out, dhat.out, cachegrind.out, Memcheck XML).
//! * [`report_json`] / [`report_html`]: one self-contained HTML page per set of inputs (the
//!   data as JSON inside, the committed front-end bundle from `web/` beside it), or the same
//!   JSON for scripts (`--format=json`, described in docs/report.md).
//! * [`diff`]: two files of one kind compared site by site; text, JSON for the page, and the
//!   `--fail-if-grown` budget.
//! * [`sarif`]: Memcheck's errors as SARIF 2.1.0 for code-scanning services and IDEs.
//!
//! Nothing here runs inside the profiled program: this crate is the launcher's, uses `std`
//! freely, and never touches the network. The browser side lives in `web/src` (plain ES
//! modules, no dependencies), bundled by `web/build.sh` into `web/dist/`, which is committed.

pub mod diff;
pub mod input;
pub mod json;
pub mod page;
pub mod sarif;
pub mod sites;
pub mod size;

mod cachegrind_view;
mod dhat_view;
mod massif_view;
mod memcheck_view;

pub use input::{load, Data, Input};

use json::JsonOut;

/// Version of the JSON written by `--format=json` and embedded in pages.
pub const JSON_VERSION: u64 = 1;

/// What a report may use beyond its input files.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Where to look for source files named in Memcheck stacks (after the frame's own
    /// directory), as cg_annotate's `-I`.
    pub source_dirs: Vec<std::path::PathBuf>,
}

/// Writes one input's object (`{"kind": ..., "path": ..., ...}`).
fn write_input(j: &mut JsonOut, input: &Input, options: &Options) {
    j.obj()
        .field_str("kind", input.data.kind())
        .field_str("path", &input.path.display().to_string());
    match &input.data {
        Data::Massif(m) => massif_view::write(j, m),
        Data::Dhat(d) => dhat_view::write(j, d),
        Data::Cachegrind(c) => cachegrind_view::write(j, c),
        Data::Memcheck(x) => {
            let mut dirs = options.source_dirs.clone();
            dirs.extend(input.path.parent().map(|p| p.to_path_buf()));
            memcheck_view::write(j, x, &dirs)
        }
    }
    j.end_obj();
}

/// The report's data: `{"oxgrind_report": 1, "files": [...]}`.
pub fn report_json(inputs: &[Input], options: &Options) -> String {
    let mut j = JsonOut::new();
    j.obj()
        .field_u64("oxgrind_report", JSON_VERSION)
        .key("files")
        .arr();
    for i in inputs {
        write_input(&mut j, i, options);
    }
    j.end_arr().end_obj();
    let mut s = j.finish();
    s.push('\n');
    s
}

/// The self-contained HTML page for `inputs`.
pub fn report_html(inputs: &[Input], options: &Options) -> String {
    let title = inputs
        .iter()
        .map(|i| i.path.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    page::html(&title, &report_json(inputs, options))
}

pub use massif_view::{peak_index as massif_peak_index, sites_of as massif_sites_of};
pub use memcheck_view::{direct_indirect, leak_summary, leaked_bytes, LeakTotal};
