//! The massif.out writer: the bytes Massif 3.19 writes (formats.md §1.1), nothing else.
//!
//! Runs inside the profiled program at exit, so it only needs `alloc` and a
//! `core::fmt::Write` sink; it walks trees with an explicit stack so a deep tree cannot
//! overflow the (possibly small) thread stack it runs on.

use super::{MassifFile, SnapshotKind, TreeNode, HEAP_ROOT_LABEL};
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::{self, Write};

/// The line Massif puts around every `snapshot=N` line.
const SEPARATOR: &str = "#-----------\n";

/// `file` as Massif writes it.
///
/// * `desc` is written as one `desc: ` line per `\n`-separated line (Massif itself always
///   has exactly one).
/// * Snapshots are numbered 0, 1, 2... in order, as Massif renumbers them after culling.
/// * A `Detailed`/`Peak` snapshot without a tree gets a childless root of `mem_heap_b`
///   bytes (the file would be unreadable otherwise); the tree of an `Empty` snapshot is not
///   written.
pub fn write(file: &MassifFile) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = write_into(file, &mut out);
    out
}

/// [`write`] into any `core::fmt::Write` sink (the runtime's file-descriptor writer).
pub fn write_into<W: Write + ?Sized>(file: &MassifFile, out: &mut W) -> fmt::Result {
    for line in file.desc.split('\n') {
        writeln!(out, "desc: {line}")?;
    }
    // An argument may contain a newline (`python3 -c 'a\nb'`). Massif writes it as is and
    // produces a file its own ms_print rejects; we fold line breaks into spaces.
    if file.cmd.contains(['\n', '\r']) {
        writeln!(out, "cmd: {}", file.cmd.replace(['\n', '\r'], " "))?;
    } else {
        writeln!(out, "cmd: {}", file.cmd)?;
    }
    writeln!(out, "time_unit: {}", file.time_unit)?;
    for (k, s) in file.snapshots.iter().enumerate() {
        out.write_str(SEPARATOR)?;
        writeln!(out, "snapshot={k}")?;
        out.write_str(SEPARATOR)?;
        writeln!(out, "time={}", s.time)?;
        writeln!(out, "mem_heap_B={}", s.mem_heap_b)?;
        writeln!(out, "mem_heap_extra_B={}", s.mem_heap_extra_b)?;
        writeln!(out, "mem_stacks_B={}", s.mem_stacks_b)?;
        let kind = match s.kind {
            SnapshotKind::Empty => "empty",
            SnapshotKind::Detailed => "detailed",
            SnapshotKind::Peak => "peak",
        };
        writeln!(out, "heap_tree={kind}")?;
        if s.kind != SnapshotKind::Empty {
            match &s.tree {
                Some(tree) => write_tree(tree, out)?,
                None => writeln!(out, "n0: {} {HEAP_ROOT_LABEL}", s.mem_heap_b)?,
            }
        }
    }
    Ok(())
}

/// Preorder, one line per node: `<depth spaces>n<children>: <bytes> <label>`.
fn write_tree<W: Write + ?Sized>(root: &TreeNode, out: &mut W) -> fmt::Result {
    let mut stack: Vec<(&TreeNode, usize)> = alloc::vec![(root, 0)];
    while let Some((node, depth)) = stack.pop() {
        // Not `{:depth$}`: format widths are limited to u16 and trees can be deeper.
        for _ in 0..depth {
            out.write_char(' ')?;
        }
        write!(out, "n{}: {}", node.children.len(), node.bytes)?;
        // Massif never writes an empty label; without one, no trailing space either.
        if !node.label.is_empty() {
            out.write_char(' ')?;
            out.write_str(&node.label)?;
        }
        out.write_char('\n')?;
        stack.extend(node.children.iter().rev().map(|c| (c, depth + 1)));
    }
    Ok(())
}

#[cfg(test)]
mod cmd_line_tests {
    use super::*;
    use crate::massif::MassifFile;

    #[test]
    fn newlines_in_the_command_line_do_not_break_the_file() {
        let f = MassifFile {
            desc: "(none)".into(),
            cmd: "python3 -c a\nb".into(),
            time_unit: "B".into(),
            snapshots: vec![],
        };
        let text = write(&f);
        assert!(
            text.contains("cmd: python3 -c a b\ntime_unit: B\n"),
            "{text}"
        );
    }
}
