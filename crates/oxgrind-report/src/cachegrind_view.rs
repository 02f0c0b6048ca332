//! The data of the Cachegrind view: the event totals, the cost per function (summed over its
//! lines) and the costliest source lines, each sortable by any event in the page.

use crate::json::JsonOut;
use oxgrind_formats::cachegrind::CachegrindFile;
use std::collections::HashMap;

/// Source lines kept in the page (the costliest by the first event).
const TOP_LINES: usize = 2000;

/// Costs per (file, function), summed over lines, in first-seen order.
pub fn by_function(f: &CachegrindFile) -> Vec<(String, String, Vec<u64>)> {
    let mut index: HashMap<(&str, &str), usize> = HashMap::new();
    let mut out: Vec<(String, String, Vec<u64>)> = Vec::new();
    for r in &f.records {
        let i = *index.entry((&r.file, &r.func)).or_insert_with(|| {
            out.push((r.file.clone(), r.func.clone(), vec![0; f.events.len()]));
            out.len() - 1
        });
        for (acc, v) in out[i].2.iter_mut().zip(&r.counts) {
            *acc = acc.saturating_add(*v);
        }
    }
    out
}

pub fn write(j: &mut JsonOut, f: &CachegrindFile) {
    j.field_str("cmd", &f.cmd);
    j.key("desc").arr();
    for d in &f.desc {
        j.str(d);
    }
    j.end_arr();
    j.key("events").arr();
    for e in &f.events {
        j.str(e);
    }
    j.end_arr();
    j.key("summary").arr();
    for v in &f.summary {
        j.u64(*v);
    }
    j.end_arr();
    // [file, function, counts...]
    j.key("functions").arr();
    for (file, func, counts) in by_function(f) {
        j.arr().str(&file).str(&func);
        for c in counts {
            j.u64(c);
        }
        j.end_arr();
    }
    j.end_arr();
    // [file, function, line, counts...], the costliest by the first event.
    let mut lines: Vec<&oxgrind_formats::cachegrind::Record> = f.records.iter().collect();
    lines.sort_by(|a, b| b.counts.first().cmp(&a.counts.first()));
    j.key("lines").arr();
    for r in lines.into_iter().take(TOP_LINES) {
        j.arr().str(&r.file).str(&r.func).u64(r.line as u64);
        for c in &r.counts {
            j.u64(*c);
        }
        j.end_arr();
    }
    j.end_arr();
}
