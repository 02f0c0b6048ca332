//! Per-thread recent-lines tables (`Needs::recent_lines`, the contract's `RecentLines`):
//! which line each slot last saw among the thread's recorded accesses, so that the
//! `trace_new_lines` probes skip the records of accesses a cache simulator would see as
//! hits that change nothing (Cachegrind's D1: most accesses of most programs).
//!
//! The same for code: `trace_block_new_lines` probes leave a block record out when the
//! code-lines table names every line of the block (an instruction cache's hits).
//!
//! The tables live in the thread's context mapping at [`RECENT_LINES_OFF`] and
//! [`RECENT_CODE_LINES_OFF`], where
//! translated code reads and writes them as `gs:[RECENT_LINES_OFF + slot * 8]` (see
//! `translate::probes`); the Rust side keeps it in step for the records it appends itself
//! (the clean-call fallback of the trace probes) and empties it whenever records it
//! described are dropped instead of delivered (a hold's, a forked child's), since a slot
//! must only name lines the tool has seen.

use core::sync::atomic::{AtomicU32, Ordering};

use oxgrind_tool::instrument::{RecentLines, MAX_RECENT_LINE_SLOTS};

use crate::context::{ThreadCtx, RECENT_CODE_LINES_OFF, RECENT_LINES_OFF};

/// What a slot holds when it names no line (no access has its first byte at the last
/// address, so no line number is all ones).
pub(crate) const NO_LINE: u64 = u64::MAX;

/// Which of a thread's two tables: the data accesses' (`Needs::recent_lines`, read by
/// `trace_new_lines` probes) or the code's (`Needs::recent_code_lines`, read by
/// `trace_block_new_lines` probes).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Table {
    Data = 0,
    Code = 1,
}

impl Table {
    /// Where the table starts in the context mapping.
    pub(crate) fn offset(self) -> usize {
        match self {
            Table::Data => RECENT_LINES_OFF,
            Table::Code => RECENT_CODE_LINES_OFF,
        }
    }
}

/// Each table's geometry: `line_shift | slots << 8`, 0 when there is no table.
static GEOMETRY: [AtomicU32; 2] = [AtomicU32::new(0), AtomicU32::new(0)];

/// Declares a table's geometry (before the first context is made). Slots are rounded down
/// to a power of two within `MAX_RECENT_LINE_SLOTS`; a table of no slot, or lines wider
/// than the address space, is no table.
pub(crate) fn configure(which: Table, r: RecentLines) {
    let slots = r.slots.min(MAX_RECENT_LINE_SLOTS);
    if slots == 0 || r.line_shift >= 64 {
        return;
    }
    let slots = 1u32 << (15 - slots.leading_zeros().min(15));
    GEOMETRY[which as usize].store(u32::from(r.line_shift) | slots << 8, Ordering::Release);
}

/// `(line_shift, slots)` when the tool declared the table.
#[inline]
pub(crate) fn geometry(which: Table) -> Option<(u32, u32)> {
    let g = GEOMETRY[which as usize].load(Ordering::Relaxed);
    (g != 0).then_some((g & 0xff, g >> 8))
}

/// Table `which` of `ctx` (its context mapping extends past the struct).
fn table(ctx: &mut ThreadCtx, which: Table) -> &mut [u64; MAX_RECENT_LINE_SLOTS as usize] {
    // SAFETY: contexts are mappings of at least `CTX_SIZE` bytes starting at the struct,
    // and both tables' `MAX_RECENT_LINE_SLOTS` words lie below `CTX_SIZE`; only the owning
    // thread (or, for a context not yet or no longer running, its creator or reuser)
    // touches them, and the borrow of `ctx` keeps this the only reference.
    unsafe {
        &mut *((ctx as *mut ThreadCtx as *mut u8).add(which.offset())
            as *mut [u64; MAX_RECENT_LINE_SLOTS as usize])
    }
}

/// Empties `ctx`'s tables: no slot names a line.
pub(crate) fn clear(ctx: &mut ThreadCtx) {
    for which in [Table::Data, Table::Code] {
        if let Some((_, slots)) = geometry(which) {
            table(ctx, which)[..slots as usize].fill(NO_LINE);
        }
    }
}

/// A record of an access of `size` bytes at `addr` was appended from Rust: its lines'
/// slots in the data table name them, as the inline appends do.
#[inline]
pub(crate) fn note(ctx: &mut ThreadCtx, addr: u64, size: u64) {
    let Some((shift, slots)) = geometry(Table::Data) else {
        return;
    };
    let clamped = size.clamp(1, 1 << shift);
    let first = addr >> shift;
    let last = addr.wrapping_add(clamped - 1) >> shift;
    let t = table(ctx, Table::Data);
    for line in [first, last] {
        t[(line & u64::from(slots - 1)) as usize] = line;
    }
}
