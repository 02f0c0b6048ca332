//! Per-thread recent-lines tables (`Needs::recent_lines`, the contract's `RecentLines`):
//! which line each slot last saw among the thread's recorded accesses, so that the
//! `trace_new_lines` probes skip the records of accesses a cache simulator would see as
//! hits that change nothing (Cachegrind's D1: most accesses of most programs).
//!
//! The table lives in the thread's context mapping at [`RECENT_LINES_OFF`], where
//! translated code reads and writes it as `gs:[RECENT_LINES_OFF + slot * 8]` (see
//! `translate::probes`); the Rust side keeps it in step for the records it appends itself
//! (the clean-call fallback of the trace probes) and empties it whenever records it
//! described are dropped instead of delivered (a hold's, a forked child's), since a slot
//! must only name lines the tool has seen.

use core::sync::atomic::{AtomicU32, Ordering};

use oxgrind_tool::instrument::{RecentLines, MAX_RECENT_LINE_SLOTS};

use crate::context::{ThreadCtx, RECENT_LINES_OFF};

/// What a slot holds when it names no line (no access has its first byte at the last
/// address, so no line number is all ones).
pub(crate) const NO_LINE: u64 = u64::MAX;

/// The table's geometry: `line_shift | slots << 8`, 0 when there is no table.
static GEOMETRY: AtomicU32 = AtomicU32::new(0);

/// Declares the geometry (before the first context is made). Slots are rounded down to a
/// power of two within `MAX_RECENT_LINE_SLOTS`; a table of no slot, or lines wider than
/// the address space, is no table.
pub(crate) fn configure(r: RecentLines) {
    let slots = r.slots.min(MAX_RECENT_LINE_SLOTS);
    if slots == 0 || r.line_shift >= 64 {
        return;
    }
    let slots = 1u32 << (15 - slots.leading_zeros().min(15));
    GEOMETRY.store(u32::from(r.line_shift) | slots << 8, Ordering::Release);
}

/// `(line_shift, slots)` when the tool declared a table.
#[inline]
pub(crate) fn geometry() -> Option<(u32, u32)> {
    let g = GEOMETRY.load(Ordering::Relaxed);
    (g != 0).then_some((g & 0xff, g >> 8))
}

/// The table of `ctx` (its context mapping extends past the struct to `CTX_SIZE`).
fn table(ctx: &mut ThreadCtx) -> &mut [u64; MAX_RECENT_LINE_SLOTS as usize] {
    // SAFETY: contexts are mappings of `CTX_SIZE` bytes starting at the struct, and the
    // table's `MAX_RECENT_LINE_SLOTS` words end at `CTX_SIZE`; only the owning thread (or,
    // for a context not yet or no longer running, its creator or reuser) touches them, and
    // the borrow of `ctx` keeps this the only reference.
    unsafe {
        &mut *((ctx as *mut ThreadCtx as *mut u8).add(RECENT_LINES_OFF)
            as *mut [u64; MAX_RECENT_LINE_SLOTS as usize])
    }
}

/// Empties `ctx`'s table: no slot names a line.
pub(crate) fn clear(ctx: &mut ThreadCtx) {
    if let Some((_, slots)) = geometry() {
        table(ctx)[..slots as usize].fill(NO_LINE);
    }
}

/// A record of an access of `size` bytes at `addr` was appended from Rust: its lines'
/// slots name them, as the inline appends do.
#[inline]
pub(crate) fn note(ctx: &mut ThreadCtx, addr: u64, size: u64) {
    let Some((shift, slots)) = geometry() else {
        return;
    };
    let clamped = size.clamp(1, 1 << shift);
    let first = addr >> shift;
    let last = addr.wrapping_add(clamped - 1) >> shift;
    let t = table(ctx);
    for line in [first, last] {
        t[(line & u64::from(slots - 1)) as usize] = line;
    }
}
