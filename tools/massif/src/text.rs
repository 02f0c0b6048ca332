//! Interim massif.out writer, used until `oxgrind_formats::massif::write` lands (it is being
//! written in parallel). Prints the layout of formats.md §1.1; replace every use with the
//! formats crate's writer once it exists.

use oxgrind_formats::massif::{MassifFile, SnapshotKind, TreeNode};
use std::fmt::Write;

pub(crate) fn write(file: &MassifFile) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "desc: {}\ncmd: {}\ntime_unit: {}",
        file.desc, file.cmd, file.time_unit
    );
    for (i, snap) in file.snapshots.iter().enumerate() {
        let kind = match snap.kind {
            SnapshotKind::Empty => "empty",
            SnapshotKind::Detailed => "detailed",
            SnapshotKind::Peak => "peak",
        };
        let _ = write!(
            s,
            "#-----------\nsnapshot={i}\n#-----------\ntime={}\nmem_heap_B={}\n\
             mem_heap_extra_B={}\nmem_stacks_B={}\nheap_tree={kind}\n",
            snap.time, snap.mem_heap_b, snap.mem_heap_extra_b, snap.mem_stacks_b
        );
        if let Some(t) = &snap.tree {
            tree(t, 0, &mut s);
        }
    }
    s
}

fn tree(n: &TreeNode, indent: usize, out: &mut String) {
    let _ = writeln!(
        out,
        "{:indent$}n{}: {} {}",
        "",
        n.children.len(),
        n.bytes,
        n.label
    );
    for c in &n.children {
        tree(c, indent + 1, out);
    }
}
