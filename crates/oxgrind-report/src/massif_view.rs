//! The data of the Massif view: heap over time stacked by the top allocation sites (as
//! massif-visualizer draws it), the peak snapshot's tree for the flame graph, and the table of
//! sites at the peak.
//!
//! A site is a child of the heap tree's root (the function that called the allocator), keyed
//! without its address ([`crate::sites`]). Snapshots without a tree ("empty" ones in Massif's
//! words: only totals) contribute to the total line, not to the stacked bands: Massif does not
//! say which sites held their bytes, and the view does not guess.

use crate::json::JsonOut;
use crate::sites::{is_below_threshold, without_address};
use oxgrind_formats::massif::{MassifFile, Snapshot, SnapshotKind, TreeNode, PAGES_ROOT_LABEL};
use std::collections::HashMap;

/// How many sites get a band of their own in the chart; the rest are one "other sites" band.
pub const CHART_SITES: usize = 10;
/// Rows of the sites-at-peak table kept in the page (sorted by bytes, largest first).
const TABLE_SITES: usize = 1000;
/// Deeper tree levels are left out of the page (Massif's own `--depth` maximum is 200).
const MAX_TREE_DEPTH: usize = 256;
/// In the trees of snapshots other than the peak, nodes below this fraction of the snapshot's
/// heap are folded into one aggregate per parent (as Massif's own threshold does at 1%, its
/// default), so a file of hundreds of wide trees stays a page of a few megabytes (at 0.1%,
/// the 101 MB test file made a 26 MB page; at 0.5%, 3 MB).
const OTHER_TREES_THRESHOLD: f64 = 0.005;

/// Index of the peak snapshot: the one Massif marked, or (no mark, e.g. a cut-short file) the
/// largest total among snapshots with a tree, or among all.
pub fn peak_index(file: &MassifFile) -> Option<usize> {
    if let Some(i) = file
        .snapshots
        .iter()
        .position(|s| s.kind == SnapshotKind::Peak)
    {
        return Some(i);
    }
    let total = |s: &Snapshot| s.mem_heap_b + s.mem_heap_extra_b + s.mem_stacks_b;
    let best = |with_tree: bool| {
        file.snapshots
            .iter()
            .enumerate()
            .filter(|(_, s)| !with_tree || s.tree.is_some())
            .max_by_key(|(i, s)| (total(s), std::cmp::Reverse(*i)))
            .map(|(i, _)| i)
    };
    best(true).or_else(|| best(false))
}

/// Total memory of a snapshot as ms_print's graph counts it.
pub fn total(s: &Snapshot) -> u64 {
    s.mem_heap_b + s.mem_heap_extra_b + s.mem_stacks_b
}

/// A tree's root children merged by site name, largest first.
pub fn sites_of(tree: &TreeNode) -> Vec<(String, u64)> {
    let mut by: HashMap<&str, u64> = HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    for c in &tree.children {
        let name = without_address(&c.label);
        let e = by.entry(name).or_insert_with(|| {
            order.push(name);
            0
        });
        *e += c.bytes;
    }
    let mut v: Vec<(String, u64)> = order.into_iter().map(|n| (n.to_string(), by[n])).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

pub fn write(j: &mut JsonOut, file: &MassifFile) {
    let peak = peak_index(file);
    let pages = file
        .snapshots
        .iter()
        .filter_map(|s| s.tree.as_ref())
        .any(|t| t.label == PAGES_ROOT_LABEL);
    j.field_str("cmd", &file.cmd)
        .field_str("desc", &file.desc)
        .field_str("time_unit", &file.time_unit)
        .key("pages_as_heap")
        .bool(pages)
        .key("stacks")
        .bool(file.snapshots.iter().any(|s| s.mem_stacks_b > 0));

    j.key("peak");
    match peak.map(|i| (i, &file.snapshots[i])) {
        Some((i, s)) => {
            j.obj()
                .field_u64("snapshot", i as u64)
                .key("time")
                .i64(s.time)
                .field_u64("heap_b", s.mem_heap_b)
                .field_u64("extra_b", s.mem_heap_extra_b)
                .field_u64("stacks_b", s.mem_stacks_b)
                .field_u64("total_b", total(s))
                .end_obj();
        }
        None => {
            j.null();
        }
    }

    // Every snapshot: [time, heap, extra, stacks, kind] with kind 0 empty, 1 detailed, 2 peak.
    j.key("snapshots").arr();
    for s in &file.snapshots {
        let kind = match s.kind {
            SnapshotKind::Empty => 0,
            SnapshotKind::Detailed => 1,
            SnapshotKind::Peak => 2,
        };
        j.arr()
            .i64(s.time)
            .u64(s.mem_heap_b)
            .u64(s.mem_heap_extra_b)
            .u64(s.mem_stacks_b)
            .u64(kind)
            .end_arr();
    }
    j.end_arr();

    // The chart's sites: largest at any snapshot with a tree. The below-threshold aggregate is
    // not a site of its own: it goes to "other sites".
    let per_snapshot: Vec<(usize, Vec<(String, u64)>)> = file
        .snapshots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.tree.as_ref().map(|t| (i, sites_of(t))))
        .collect();
    let mut max_by_site: HashMap<&str, u64> = HashMap::new();
    for (_, sites) in &per_snapshot {
        for (name, b) in sites {
            if !is_below_threshold(name) {
                let e = max_by_site.entry(name).or_default();
                *e = (*e).max(*b);
            }
        }
    }
    let mut ranked: Vec<(&str, u64)> = max_by_site.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    ranked.truncate(CHART_SITES);
    j.key("chart_sites").arr();
    for (name, _) in &ranked {
        j.str(name);
    }
    j.end_arr();
    // [snapshot index, [bytes of each chart site..., other sites]] for snapshots with a tree.
    j.key("chart").arr();
    for (i, sites) in &per_snapshot {
        let mut row = vec![0u64; ranked.len() + 1];
        for (name, b) in sites {
            let slot = ranked
                .iter()
                .position(|(n, _)| n == name)
                .unwrap_or(ranked.len());
            row[slot] += b;
        }
        j.arr().u64(*i as u64).arr();
        for b in row {
            j.u64(b);
        }
        j.end_arr().end_arr();
    }
    j.end_arr();

    let peak_tree = peak.and_then(|i| file.snapshots[i].tree.as_ref());
    j.key("peak_sites").arr();
    if let Some(tree) = peak_tree {
        for (name, b) in sites_of(tree).into_iter().take(TABLE_SITES) {
            j.arr().str(&name).u64(b).end_arr();
        }
    }
    j.end_arr();

    // The peak tree as nested [label, bytes, [children]], whole.
    j.key("peak_tree");
    match peak_tree {
        Some(t) => write_tree(j, t, 0, 0),
        None => {
            j.null();
        }
    }
    // The other snapshots' trees: [snapshot index, tree], small nodes folded.
    j.key("trees").arr();
    for (i, s) in file.snapshots.iter().enumerate() {
        if Some(i) == peak {
            continue;
        }
        if let Some(t) = &s.tree {
            let min = (t.bytes as f64 * OTHER_TREES_THRESHOLD) as u64;
            j.arr().u64(i as u64);
            write_tree(j, t, 0, min);
            j.end_arr();
        }
    }
    j.end_arr();
}

/// Writes `node`; children below `min` bytes are folded into one `in N places, below ...`
/// node (none when `min` is 0).
fn write_tree(j: &mut JsonOut, node: &TreeNode, depth: usize, min: u64) {
    j.arr().str(&node.label).u64(node.bytes).arr();
    if depth < MAX_TREE_DEPTH {
        let (mut folded, mut folded_bytes) = (0u64, 0u64);
        for c in &node.children {
            if c.bytes < min {
                folded += 1;
                folded_bytes += c.bytes;
            } else {
                write_tree(j, c, depth + 1, min);
            }
        }
        if folded > 0 {
            j.arr()
                .str(&format!(
                    "in {folded} place{}, below {}% of this snapshot (folded by oxgrind report)",
                    if folded == 1 { "" } else { "s" },
                    OTHER_TREES_THRESHOLD * 100.0
                ))
                .u64(folded_bytes)
                .arr()
                .end_arr()
                .end_arr();
        }
    }
    j.end_arr().end_arr();
}
