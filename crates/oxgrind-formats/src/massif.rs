//! `massif.out.<pid>`: the data model (formats.md §1).
//!
//! The model is what the file says, nothing more: the writer prints it byte for byte as
//! Massif 3.19 does, the reader accepts what ms_print accepts. Building the tree from live
//! allocations (thresholds, grouping) is Massif's job (`tools/massif`), not this module's.
//!
//! * [`write`] / [`write_into`]: the model as Massif 3.19 writes it.
//! * [`parse`]: a file (as ms_print accepts it) into the model, or a [`ParseError`] with the
//!   line number and what was expected.
//! * [`ms_print`]: the `ms_print` report, byte for byte as `/usr/bin/ms_print` prints it.

pub mod ms_print;
mod parse;
mod perl;
mod write;

pub use parse::{parse, ParseError, ParseErrorKind};
pub use write::{write, write_into};

use alloc::string::String;
use alloc::vec::Vec;

/// A whole massif.out file.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MassifFile {
    /// `desc:` text after the colon and space, e.g. `--depth=3` or `(none)`. Several `desc:`
    /// lines in a file read as one, joined by `\n`; the writer writes one `desc:` line per
    /// line (Massif writes exactly one).
    pub desc: String,
    /// `cmd:` text: the program and its arguments joined by spaces (leading blanks after the
    /// colon are not part of it, trailing ones are).
    pub cmd: String,
    /// `time_unit:` value: `i`, `ms` or `B`.
    pub time_unit: String,
    pub snapshots: Vec<Snapshot>,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub time: i64,
    pub mem_heap_b: u64,
    pub mem_heap_extra_b: u64,
    pub mem_stacks_b: u64,
    pub kind: SnapshotKind,
    /// The heap tree: present for `Detailed` and `Peak`.
    pub tree: Option<TreeNode>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum SnapshotKind {
    #[default]
    Empty,
    Detailed,
    Peak,
}

/// One line `nK: BYTES LABEL` of a heap tree with its K children.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TreeNode {
    pub bytes: u64,
    /// Everything after the byte count and one space: the root label, a frame text
    /// (`0x109180: big_alloc (ms_prog.c:6)`) or an aggregate (`in 2 places, ...`).
    pub label: String,
    pub children: Vec<TreeNode>,
}

/// Root label of a heap tree.
pub const HEAP_ROOT_LABEL: &str = "(heap allocation functions) malloc/new/new[], --alloc-fns, etc.";
/// Root label with `--pages-as-heap=yes`.
pub const PAGES_ROOT_LABEL: &str = "(page allocation syscalls) mmap/mremap/brk, --alloc-fns, etc.";
