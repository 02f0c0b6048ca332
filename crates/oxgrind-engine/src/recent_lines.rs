//! Per-thread recent-lines tables (`Needs::recent_lines`, the contract's `RecentLines`):
//! which line each slot last saw among the thread's recorded accesses, so that the
//! `trace_new_lines` probes skip the records of accesses a cache simulator would see as
//! hits that change nothing (Cachegrind's D1: most accesses of most programs).
//!
//! The same for code: `trace_block_new_lines` probes leave a block record out when the
//! code-lines table names every line of the block (an instruction cache's hits). With
//! `Needs::recent_code_lines_ways` a code slot names up to [`MAX_CODE_WAYS`] lines in
//! most-recently-used order (way `w` of slot `s` at word `w * slots + s` of the code
//! array): a hit moves its line to way 0, and a line not named is put there, the last way
//! leaving, with a code-miss record that names the leaving line
//! (`TraceRecord::code_miss`). An I1 simulator that keeps a set's first `ways` lines as a
//! set (in any order) and the others in order then replays every fetch exactly from those
//! records alone (`Simulator::i1_replace` in tools/cachegrind).
//!
//! With `Needs::recent_lines_two_ways` the data table names two lines per slot (the second
//! at [`RECENT_SECOND_LINES_OFF`]) and keeps a swap bit per slot ([`RECENT_SWAPS_OFF`]):
//! an access to the second line is skipped too, the two change places and the bit flips;
//! the slot's next record carries the bit and clears it (`TraceRecord::swaps`).
//!
//! The tables live in the thread's context mapping at [`RECENT_LINES_OFF`] and
//! [`RECENT_CODE_LINES_OFF`], where translated code reads and writes them as
//! `gs:[RECENT_LINES_OFF + slot * 8]` (see `translate::probes`; a data slot holds its
//! line's [`data_key`], a code slot the line number, which the block checks compare with
//! immediates); the Rust side keeps it in step for the records it appends itself (the
//! clean-call fallback of the trace probes) and empties it whenever records it described
//! are dropped instead of delivered (a hold's, a forked child's), since a slot must only
//! name lines the tool has seen.

use core::sync::atomic::{AtomicU32, Ordering};

use oxgrind_tool::instrument::{RecentLines, MAX_RECENT_LINE_SLOTS};

use crate::context::{
    ThreadCtx, RECENT_CODE_LINES_OFF, RECENT_LINES_OFF, RECENT_SECOND_LINES_OFF, RECENT_SWAPS_OFF,
};

/// What a code-lines slot holds when it names no line (no access has its first byte at
/// the last address, so no line number is all ones).
pub(crate) const NO_LINE: u64 = u64::MAX;

/// What a data-table slot holds for `line` of `1 << shift` bytes: the negated address of
/// the line's first byte. Translated code adds it to an access's address: the sum is the
/// access's offset in the line, and one unsigned compare with `line bytes - access bytes`
/// tells both that the slot names the access's line and that the access does not run into
/// the next (see `translate::probes`), where a line number took a shift, a compare and a
/// second test for the straddle.
#[inline]
pub(crate) fn data_key(line: u64, shift: u32) -> u64 {
    (line << shift).wrapping_neg()
}

/// What table `which`'s slots hold when they name no line: for the data table the key
/// ([`data_key`]) of the address space's last line, where no access of a program lies
/// (its sum with any user address is at least one line, above every compare's bound);
/// for the code table [`NO_LINE`].
fn empty_slot(which: Table, shift: u32) -> u64 {
    match which {
        Table::Data => data_key(u64::MAX >> shift, shift),
        Table::Code => NO_LINE,
    }
}

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

/// Each table's geometry: `line_shift | slots << 8 | ways << 24` (ways 0: one, without the
/// second-way machinery), 0 when there is no table.
static GEOMETRY: [AtomicU32; 2] = [AtomicU32::new(0), AtomicU32::new(0)];

/// The geometry's data-table ways for a table of two lines per slot.
const TWO_WAYS: u32 = 2 << 24;

/// Most lines a code slot names (`Needs::recent_code_lines_ways`): each one more costs a
/// compare on every miss of the first and a move on every hit past it.
pub(crate) const MAX_CODE_WAYS: u32 = oxgrind_tool::instrument::MAX_RECENT_CODE_WAYS as u32;

/// Declares a table's geometry (before the first context is made). Slots are rounded down
/// to a power of two within `MAX_RECENT_LINE_SLOTS`; a table of no slot, or lines wider
/// than the address space, is no table.
/// `two_ways`: two lines per slot (only with two slots or more).
pub(crate) fn configure(which: Table, r: RecentLines, two_ways: bool) {
    let slots = r.slots.min(MAX_RECENT_LINE_SLOTS);
    // (The data table's inline checks compare an offset in a line with a 32-bit
    // immediate, sign-extended: lines of 2 GiB or more make no table there.)
    let widest = if which == Table::Data { 31 } else { 64 };
    if slots == 0 || r.line_shift >= widest {
        return;
    }
    let slots = 1u32 << (15 - slots.leading_zeros().min(15));
    let two = if two_ways && slots >= 2 { TWO_WAYS } else { 0 };
    GEOMETRY[which as usize].store(
        u32::from(r.line_shift) | slots << 8 | two,
        Ordering::Release,
    );
}

/// Declares the code-lines table: as [`configure`], with `ways` lines per slot when
/// there are 2 to [`MAX_CODE_WAYS`] of them and the code array's `MAX_RECENT_LINE_SLOTS`
/// words hold them all; otherwise one line per slot (the contract the tool relies on:
/// `Needs::recent_code_lines_ways`).
pub(crate) fn configure_code(r: RecentLines, ways: u8) {
    configure(Table::Code, r, false);
    let g = GEOMETRY[Table::Code as usize].load(Ordering::Relaxed);
    let ways = u32::from(ways);
    if g != 0
        && (2..=MAX_CODE_WAYS).contains(&ways)
        && ways * (g >> 8) <= u32::from(MAX_RECENT_LINE_SLOTS)
    {
        GEOMETRY[Table::Code as usize].store(g | ways << 24, Ordering::Release);
    }
}

/// `(line_shift, slots)` when the tool declared the table.
#[inline]
pub(crate) fn geometry(which: Table) -> Option<(u32, u32)> {
    let g = GEOMETRY[which as usize].load(Ordering::Relaxed);
    (g != 0).then_some((g & 0xff, (g & 0xff_ffff) >> 8))
}

/// Whether the data table names two lines per slot with swap bits (the code table's ways
/// are [`code_ways`]).
#[inline]
pub(crate) fn two_ways() -> bool {
    GEOMETRY[Table::Data as usize].load(Ordering::Relaxed) >> 24 == 2
}

/// Lines per slot of the code table in most-recently-used order (0: one line, no ways).
#[inline]
pub(crate) fn code_ways() -> u32 {
    GEOMETRY[Table::Code as usize].load(Ordering::Relaxed) >> 24
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

/// The data table's second lines and swap bits (with [`two_ways`]; the code table's
/// further ways share its one array).
fn second_ways(
    ctx: &mut ThreadCtx,
) -> (
    &mut [u64; MAX_RECENT_LINE_SLOTS as usize],
    &mut [u8; MAX_RECENT_LINE_SLOTS as usize],
) {
    // SAFETY: as `table`: both arrays lie below `CTX_SIZE` in the context mapping, apart
    // from each other and from the first lines; the borrow of `ctx` keeps them unaliased.
    unsafe {
        let base = ctx as *mut ThreadCtx as *mut u8;
        (
            &mut *(base.add(RECENT_SECOND_LINES_OFF) as *mut [u64; MAX_RECENT_LINE_SLOTS as usize]),
            &mut *(base.add(RECENT_SWAPS_OFF) as *mut [u8; MAX_RECENT_LINE_SLOTS as usize]),
        )
    }
}

/// Empties `ctx`'s tables: no slot names a line. (A swap bit not yet carried by a record is
/// lost: the simulator may keep two lines of that set in the other order.)
pub(crate) fn clear(ctx: &mut ThreadCtx) {
    for which in [Table::Data, Table::Code] {
        if let Some((shift, slots)) = geometry(which) {
            let empty = empty_slot(which, shift);
            let words = if which == Table::Code {
                slots * code_ways().max(1)
            } else {
                slots
            };
            table(ctx, which)[..words as usize].fill(empty);
            if which == Table::Data && two_ways() {
                let (second, swaps) = second_ways(ctx);
                second[..slots as usize].fill(empty);
                swaps[..slots as usize].fill(0);
            }
        }
    }
}

/// A record of an access of `size` bytes at `addr` is being appended from Rust: its
/// lines' slots in the data table name them (hold their [`data_key`]s), as the inline
/// appends do. Returns the record's swap bits (`TraceRecord::swaps`).
#[inline]
pub(crate) fn note(ctx: &mut ThreadCtx, addr: u64, size: u64) -> u8 {
    let Some((shift, slots)) = geometry(Table::Data) else {
        return 0;
    };
    let clamped = size.clamp(1, 1 << shift);
    let first = addr >> shift;
    let last = addr.wrapping_add(clamped - 1) >> shift;
    if !two_ways() {
        let t = table(ctx, Table::Data);
        for line in [first, last] {
            t[(line & u64::from(slots - 1)) as usize] = data_key(line, shift);
        }
        return 0;
    }
    let mut bits = 0;
    for (bit, line) in [first, last].into_iter().enumerate() {
        let slot = (line & u64::from(slots - 1)) as usize;
        let key = data_key(line, shift);
        let was_first = table(ctx, Table::Data)[slot];
        let (second, swaps) = second_ways(ctx);
        bits |= swaps[slot] << bit;
        swaps[slot] = 0;
        if was_first != key {
            // Second line: the two change places; a new one: the first moves down.
            second[slot] = was_first;
            table(ctx, Table::Data)[slot] = key;
        }
    }
    bits
}

/// One step of the inline code's update, for tests: an access to `line` in `slot`, skipped
/// or recorded as the translated code decides. Returns `None` when skipped, else the
/// record's swap bit.
#[cfg(test)]
fn model_access(first: &mut u64, second: &mut u64, swap: &mut u8, line: u64) -> Option<u8> {
    if *first == line {
        return None;
    }
    if *second == line {
        *second = *first;
        *first = line;
        *swap ^= 1;
        return None;
    }
    *second = *first;
    *first = line;
    Some(core::mem::take(swap))
}

#[cfg(test)]
mod tests {
    /// The inline first-line test (`translate::probes`): the access's address plus its
    /// slot's key is at most `line bytes - access bytes` exactly when the key is the
    /// access's line's and the access does not run into the next line; an empty slot
    /// admits no access of a program.
    #[test]
    fn a_slots_key_admits_exactly_the_accesses_within_its_line() {
        for shift in [4u32, 6, 7, 12, 30] {
            let line_bytes = 1u64 << shift;
            let empty = super::empty_slot(super::Table::Data, shift);
            for size in [1u64, 2, 3, 4, 8, 16, 32, 64, 128] {
                let clamped = size.clamp(1, line_bytes);
                let room = line_bytes - clamped;
                for line in [0u64, 1, 2, 977, (1 << (47 - shift)) - 1] {
                    let key = super::data_key(line, shift);
                    let start = line << shift;
                    let near = [0u64, 1, 2, 3, 5, 8, 17, 63, 64, 65, 127, 128, 200];
                    let addrs = near.iter().flat_map(|&d| {
                        [
                            start.wrapping_sub(d),
                            start + d,
                            (start + line_bytes).wrapping_sub(d),
                        ]
                    });
                    for addr in addrs.chain([start + room, start + room + 1]) {
                        let admitted = addr.wrapping_add(key) <= room;
                        let last = addr.wrapping_add(clamped - 1);
                        let within = addr >> shift == line && last >> shift == line;
                        assert_eq!(admitted, within, "shift {shift} size {size} addr {addr:#x}");
                    }
                }
                for addr in [0u64, 1, 0x7fff_ffff_f000, (1u64 << 63) - line_bytes - 1] {
                    assert!(
                        addr.wrapping_add(empty) > room,
                        "empty slot, addr {addr:#x}"
                    );
                }
            }
        }
    }

    /// The two-way table's contract against an LRU set: replaying only the records (with
    /// their swap bits) gives the same hits, misses and order as every access.
    #[test]
    fn records_and_swap_bits_replay_an_lru_set_exactly() {
        fn touch(set: &mut Vec<u64>, line: u64, assoc: usize) -> bool {
            let hit = set.iter().position(|&t| t == line);
            match hit {
                Some(i) => {
                    set.remove(i);
                }
                None => set.truncate(assoc - 1),
            }
            set.insert(0, line);
            hit.is_none()
        }
        for assoc in [2usize, 3, 8] {
            let (mut full, mut replay) = (vec![0u64; assoc], vec![0u64; assoc]);
            let (mut first, mut second, mut swap) = (super::NO_LINE, super::NO_LINE, 0u8);
            let (mut misses_full, mut misses_replay) = (0, 0);
            let mut x: u64 = 0x2545F4914F6CDD1D;
            for _ in 0..100_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Mostly the two recent lines, sometimes others.
                let line = 1 + x % (assoc as u64 + 3);
                misses_full += u32::from(touch(&mut full, line, assoc));
                if let Some(bit) = super::model_access(&mut first, &mut second, &mut swap, line) {
                    if bit != 0 {
                        replay.swap(0, 1);
                    }
                    misses_replay += u32::from(touch(&mut replay, line, assoc));
                }
            }
            if swap != 0 {
                replay.swap(0, 1);
            }
            assert_eq!(misses_full, misses_replay, "assoc {assoc}");
            assert_eq!(full, replay, "assoc {assoc}");
        }
    }
}
