//! The data of the DHAT view: the program points (PPs) with their counters and the frame table,
//! as compact arrays; the page builds dh_view's tree and the flame graph from them.
//!
//! The tree is built in the browser rather than here because every re-sort and every choice of
//! flame-graph metric re-weights it: shipping the PPs once (about 60 bytes each) keeps a page
//! for 100,000 PPs a few megabytes and lets the page aggregate in one pass per choice.

use crate::json::JsonOut;
use oxgrind_formats::dhat::DhatFile;

/// The order of the counters in each `pps` row (documented in docs/report.md).
pub const PP_FIELDS: [&str; 11] = [
    "tb", "tbk", "tl", "mb", "mbk", "gb", "gbk", "eb", "ebk", "rb", "wb",
];

/// Sums over all PPs: [`PP_FIELDS`] order.
pub fn totals(file: &DhatFile) -> [u64; 11] {
    let mut t = [0u64; 11];
    for pp in &file.pps {
        let row = [
            pp.tb, pp.tbk, pp.tl, pp.mb, pp.mbk, pp.gb, pp.gbk, pp.eb, pp.ebk, pp.rb, pp.wb,
        ];
        for (acc, v) in t.iter_mut().zip(row) {
            *acc = acc.saturating_add(v);
        }
    }
    t
}

pub fn write(j: &mut JsonOut, file: &DhatFile) {
    j.field_str("cmd", &file.cmd)
        .field_str("mode", file.mode.as_str())
        .field_str("verb", file.mode.verb())
        .key("pid")
        .i64(file.pid)
        .field_u64("te", file.te)
        .field_u64("tg", file.tg);
    j.key("pp_fields").arr();
    for f in PP_FIELDS {
        j.str(f);
    }
    j.end_arr();
    j.key("totals").obj();
    for (name, v) in PP_FIELDS.iter().zip(totals(file)) {
        j.field_u64(name, v);
    }
    j.end_obj();
    j.key("ftbl").arr();
    for f in &file.ftbl {
        j.str(f);
    }
    j.end_arr();
    // One row per PP: the counters in PP_FIELDS order, then the frame indices (innermost first).
    j.key("pps").arr();
    for pp in &file.pps {
        j.arr();
        for v in [
            pp.tb, pp.tbk, pp.tl, pp.mb, pp.mbk, pp.gb, pp.gbk, pp.eb, pp.ebk, pp.rb, pp.wb,
        ] {
            j.u64(v);
        }
        j.arr();
        for &f in &pp.fs {
            j.u64(f as u64);
        }
        j.end_arr().end_arr();
    }
    j.end_arr();
}
