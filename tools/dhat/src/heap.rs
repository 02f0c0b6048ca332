//! DHAT's bookkeeping for `--mode=heap`, with Valgrind 3.19's rules (`dh_main.c`): live
//! blocks, per-program-point counters, the global maximum, and the per-byte access
//! histograms. Pure data: no host, no locks, so it is tested on its own
//! (`tests` below replays Valgrind's reference program `dh_prog.c`).
//!
//! Where Valgrind keeps the live blocks in an interval tree with a three-entry cache, this
//! keeps them in a slab indexed by a `BTreeMap` from start address, with a one-entry cache
//! of the last block hit (most accesses in a row touch one block). Program points are
//! numbered by the caller ([`State::intro`] takes the number).

use std::collections::BTreeMap;

use oxgrind_tool::instrument::{Access, AccessKind};

/// Blocks up to this size keep a per-byte access histogram (`HISTOGRAM_SIZE_LIMIT`).
pub const HISTOGRAM_SIZE_LIMIT: u64 = 1024;

/// One live heap block.
#[derive(Debug)]
struct Block {
    addr: u64,
    /// Requested size; never 0 (Valgrind allocates 1 byte for `malloc(0)`).
    size: u64,
    pp: u32,
    /// Instruction count at allocation.
    allocd_at: u64,
    reads: u64,
    writes: u64,
    /// Per-byte access counts, latched at 0xFFFF; dropped when the block is resized.
    histo: Option<Box<[u16]>>,
}

/// Whether all retired blocks of a PP had one size (only then is its histogram written).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum XSize {
    Unknown,
    Exactly(u64),
    Mixed,
}

/// The counters of one program point (`PPInfo`).
#[derive(Debug)]
pub struct PpStats {
    pub total_blocks: u64,
    pub total_bytes: u64,
    pub curr_blocks: u64,
    pub curr_bytes: u64,
    pub max_blocks: u64,
    pub max_bytes: u64,
    pub at_tgmax_blocks: u64,
    pub at_tgmax_bytes: u64,
    pub total_lifetimes: u64,
    pub reads: u64,
    pub writes: u64,
    xsize: XSize,
    histo: Option<Box<[u32]>>,
}

impl PpStats {
    fn new() -> Self {
        PpStats {
            total_blocks: 0,
            total_bytes: 0,
            curr_blocks: 0,
            curr_bytes: 0,
            max_blocks: 0,
            max_bytes: 0,
            at_tgmax_blocks: 0,
            at_tgmax_bytes: 0,
            total_lifetimes: 0,
            reads: 0,
            writes: 0,
            xsize: XSize::Unknown,
            histo: None,
        }
    }

    /// The histogram to write: present only when every retired block had one size. Counts
    /// above 65535 are written as 65535 ("at least", shown as ∞ by dh_view).
    pub fn access_histogram(&self) -> Option<Vec<u16>> {
        match (self.xsize, &self.histo) {
            (XSize::Exactly(_), Some(h)) => Some(h.iter().map(|&c| c.min(0xFFFF) as u16).collect()),
            _ => None,
        }
    }
}

/// Whole-run totals (the summary DHAT prints at exit).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub total_blocks: u64,
    pub total_bytes: u64,
    pub curr_blocks: u64,
    pub curr_bytes: u64,
    pub max_blocks: u64,
    pub max_bytes: u64,
    /// Instruction count at the global maximum (t-gmax).
    pub tgmax: u64,
    pub reads: u64,
    pub writes: u64,
}

/// Everything DHAT knows in heap mode.
#[derive(Debug, Default)]
pub struct State {
    blocks: Vec<Block>,
    free_slots: Vec<u32>,
    by_addr: BTreeMap<u64, u32>,
    /// The block hit last: (start, end, slot); `end == 0` when empty.
    cache: (u64, u64, u32),
    pub pps: Vec<PpStats>,
    pub totals: Totals,
}

impl State {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of live blocks.
    pub fn live(&self) -> usize {
        self.by_addr.len()
    }

    fn pp(&mut self, pp: u32) -> &mut PpStats {
        let i = pp as usize;
        if i >= self.pps.len() {
            self.pps.resize_with(i + 1, PpStats::new);
        }
        &mut self.pps[i]
    }

    /// `check_for_peak`: at the global maximum, every PP's current bytes become its
    /// at-t-gmax bytes (several equal peaks: the last one wins).
    pub fn check_for_peak(&mut self) {
        if self.totals.curr_bytes == self.totals.max_bytes {
            for p in &mut self.pps {
                p.at_tgmax_blocks = p.curr_blocks;
                p.at_tgmax_bytes = p.curr_bytes;
            }
        }
    }

    /// The `>=` test of `intro_Block`/`resize_Block`: a new (or equal) global maximum.
    /// DHAT 3.19 updates the max of only the PP being allocated from, so a PP whose blocks
    /// all come after the global peak keeps `mb == 0`; reproduced as is.
    fn maybe_new_max(&mut self, pp: u32, now: u64) {
        let t = &mut self.totals;
        if t.curr_bytes >= t.max_bytes {
            t.max_blocks = t.curr_blocks;
            t.max_bytes = t.curr_bytes;
            t.tgmax = now;
            let p = self.pp(pp);
            p.max_blocks = p.curr_blocks;
            p.max_bytes = p.curr_bytes;
        }
    }

    /// A block of `size` bytes at `addr` was allocated from `pp` at instruction `now`
    /// (`new_block` + `intro_Block`). A block already recorded at `addr` (a missed free)
    /// is retired first.
    pub fn alloc(&mut self, addr: u64, size: u64, pp: u32, now: u64) {
        let size = size.max(1);
        if self.by_addr.contains_key(&addr) {
            self.free(addr, now);
        }
        let histo =
            (size <= HISTOGRAM_SIZE_LIMIT).then(|| vec![0u16; size as usize].into_boxed_slice());
        let b = Block {
            addr,
            size,
            pp,
            allocd_at: now,
            reads: 0,
            writes: 0,
            histo,
        };
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.blocks[s as usize] = b;
                s
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        };
        self.by_addr.insert(addr, slot);
        self.totals.total_blocks += 1;
        self.totals.total_bytes += size;
        self.totals.curr_blocks += 1;
        self.totals.curr_bytes += size;
        let p = self.pp(pp);
        p.total_blocks += 1;
        p.total_bytes += size;
        p.curr_blocks += 1;
        p.curr_bytes += size;
        self.maybe_new_max(pp, now);
    }

    /// The block starting at `addr` was freed (`die_block`); anything else is a bogus free
    /// and changes nothing. Returns whether a block was retired.
    pub fn free(&mut self, addr: u64, now: u64) -> bool {
        let Some(slot) = self.by_addr.remove(&addr) else {
            return false;
        };
        self.cache = (0, 0, 0);
        self.free_slots.push(slot);
        let b = core::mem::replace(
            &mut self.blocks[slot as usize],
            Block {
                addr: 0,
                size: 0,
                pp: 0,
                allocd_at: 0,
                reads: 0,
                writes: 0,
                histo: None,
            },
        );
        self.check_for_peak();
        self.totals.curr_blocks -= 1;
        self.totals.curr_bytes -= b.size;
        let p = self.pp(b.pp);
        p.curr_blocks -= 1;
        p.curr_bytes -= b.size;
        self.retire(b, now);
        true
    }

    /// Folds a retiring block's lifetime, accesses and histogram into its PP
    /// (`retire_Block`, after the live counts were taken care of).
    fn retire(&mut self, b: Block, now: u64) {
        self.totals.reads += b.reads;
        self.totals.writes += b.writes;
        let p = self.pp(b.pp);
        p.total_lifetimes += now.saturating_sub(b.allocd_at);
        p.reads += b.reads;
        p.writes += b.writes;
        match p.xsize {
            XSize::Unknown => {
                p.xsize = XSize::Exactly(b.size);
                if b.histo.is_some() {
                    p.histo = Some(vec![0u32; b.size as usize].into_boxed_slice());
                }
            }
            XSize::Exactly(s) if s != b.size => {
                p.xsize = XSize::Mixed;
                p.histo = None;
            }
            _ => {}
        }
        if let (XSize::Exactly(_), Some(ph), Some(bh)) = (p.xsize, &mut p.histo, &b.histo) {
            for (acc, &n) in ph.iter_mut().zip(bh.iter()) {
                // As DHAT: stop adding once near overflow rather than wrap.
                if *acc <= 0xFFFE_0000 {
                    *acc += n as u32;
                }
            }
        }
    }

    /// `realloc` of the block at `old` to `new_size` bytes, now at `new_addr`
    /// (`renew_block`): one more allocation for the totals, the same PP, the copy counted
    /// as a read and a write of the bytes kept, the histogram dropped. `false` when `old`
    /// is not a live block (the caller then ignores the new one, as DHAT does).
    pub fn realloc(&mut self, old: u64, new_addr: u64, new_size: u64, now: u64) -> bool {
        let Some(slot) = self.by_addr.remove(&old) else {
            return false;
        };
        self.cache = (0, 0, 0);
        let new_size = new_size.max(1);
        let (pp, old_size) = {
            let b = &mut self.blocks[slot as usize];
            b.histo = None;
            // Shrinking "copies" the new size (DHAT acts as if it copied), growing the old.
            let copied = new_size.min(b.size);
            b.reads += copied;
            b.writes += copied;
            (b.pp, b.size)
        };
        if new_size < old_size {
            self.check_for_peak();
        }
        self.totals.total_blocks += 1;
        self.totals.total_bytes += new_size;
        self.totals.curr_bytes = self.totals.curr_bytes + new_size - old_size;
        let p = self.pp(pp);
        p.total_blocks += 1;
        p.total_bytes += new_size;
        p.curr_bytes = p.curr_bytes + new_size - old_size;
        self.maybe_new_max(pp, now);
        let b = &mut self.blocks[slot as usize];
        b.addr = new_addr;
        b.size = new_size;
        if let Some(other) = self.by_addr.insert(new_addr, slot) {
            // The runtime reported a block there already: it cannot be live any more.
            self.by_addr.insert(new_addr, other);
            self.free(new_addr, now);
            self.by_addr.insert(new_addr, slot);
        }
        true
    }

    /// The live block containing `addr`, as a slab index.
    #[inline]
    fn find(&mut self, addr: u64) -> Option<u32> {
        let (lo, hi, slot) = self.cache;
        if lo <= addr && addr < hi {
            return Some(slot);
        }
        let (_, &slot) = self.by_addr.range(..=addr).next_back()?;
        let b = &self.blocks[slot as usize];
        if addr < b.addr + b.size {
            self.cache = (b.addr, b.addr + b.size, slot);
            Some(slot)
        } else {
            None
        }
    }

    /// One access the program makes: counted against the block containing its first byte
    /// (`dh_handle_read` / `dh_handle_write`). A read-modify-write is a read and a write,
    /// as in Valgrind's IR (a load then a store).
    #[inline]
    pub fn access(&mut self, a: &Access) {
        let Some(slot) = self.find(a.addr) else {
            return;
        };
        let b = &mut self.blocks[slot as usize];
        let size = a.size as u64;
        let times = match a.kind {
            AccessKind::Read => {
                b.reads += size;
                1
            }
            AccessKind::Write => {
                b.writes += size;
                1
            }
            AccessKind::Modify => {
                b.reads += size;
                b.writes += size;
                2
            }
        };
        if let Some(h) = &mut b.histo {
            let from = (a.addr - b.addr) as usize;
            let to = (from + a.size as usize).min(h.len());
            for c in &mut h[from..to] {
                *c = c.saturating_add(times);
            }
        }
    }

    /// At exit (`dh_fini`): a last peak check, then every live block's lifetime (up to
    /// `now`), accesses and histogram folded into its PP; the blocks stay counted as live
    /// (`eb`, `ebk`).
    pub fn finish(&mut self, now: u64) {
        self.check_for_peak();
        let slots: Vec<u32> = self.by_addr.values().copied().collect();
        self.by_addr.clear();
        self.cache = (0, 0, 0);
        for s in slots {
            let b = core::mem::replace(
                &mut self.blocks[s as usize],
                Block {
                    addr: 0,
                    size: 0,
                    pp: 0,
                    allocd_at: 0,
                    reads: 0,
                    writes: 0,
                    histo: None,
                },
            );
            self.retire(b, now);
        }
        self.blocks.clear();
        self.free_slots.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acc(addr: u64, size: u32, kind: AccessKind) -> Access {
        Access {
            addr,
            size,
            kind,
            conditional: false,
        }
    }

    /// `dh_prog.c` from the reference examples, event by event, with the instruction
    /// counts taken from `dhat.out.heap2` (t-gmax 147679, t-end 152386).
    #[test]
    fn reference_program_gives_valgrinds_counters() {
        use AccessKind::*;
        let mut s = State::new();
        // PP 0: a 16-byte block, written once, each half read 4 and 1 times more.
        s.alloc(0x1000, 16, 0, 144_000);
        for i in 0..16 {
            s.access(&acc(0x1000 + i, 1, Write));
        }
        for _ in 0..4 {
            s.access(&acc(0x1000, 8, Read));
        }
        s.access(&acc(0x1008, 8, Read));
        s.free(0x1000, 146_535);
        // PP 1: 2000 bytes written; PP 2: 100 bytes, 16 written, realloc'd to 200.
        s.alloc(0x2000, 2000, 1, 144_646);
        s.access(&acc(0x2000, 2000, Write));
        s.alloc(0x3000, 100, 2, 145_000);
        s.access(&acc(0x3000, 16, Write));
        assert!(s.realloc(0x3000, 0x4000, 200, 147_679));
        s.free(0x2000, 147_679);
        s.free(0x4000, 147_700);
        // PP 3: 7 bytes, one byte written, never freed.
        s.alloc(0x5000, 7, 3, 147_800);
        s.access(&acc(0x5000, 1, Write));
        s.finish(152_386);

        let t = s.totals;
        assert_eq!((t.total_bytes, t.total_blocks), (2323, 5));
        assert_eq!((t.max_bytes, t.max_blocks), (2200, 2));
        assert_eq!((t.curr_bytes, t.curr_blocks), (7, 1));
        assert_eq!(t.tgmax, 147_679);
        let p = &s.pps;
        assert_eq!(
            (p[0].max_bytes, p[0].at_tgmax_bytes, p[0].reads, p[0].writes),
            (16, 0, 40, 16)
        );
        let mut h = vec![5u16; 8];
        h.extend([2u16; 8]);
        assert_eq!(p[0].access_histogram(), Some(h));
        assert_eq!(
            (p[2].total_bytes, p[2].total_blocks, p[2].max_bytes),
            (300, 2, 200)
        );
        assert_eq!((p[2].reads, p[2].writes), (100, 116));
        assert_eq!(
            p[2].access_histogram(),
            None,
            "a realloc'd block loses its histogram"
        );
        assert_eq!((p[1].access_histogram(), p[1].at_tgmax_bytes), (None, 2000));
        // The 3.19 quirk: allocated after the peak, so no max, though live at the end.
        assert_eq!(
            (p[3].max_bytes, p[3].curr_bytes, p[3].curr_blocks),
            (0, 7, 1)
        );
        assert_eq!(p[3].total_lifetimes, 152_386 - 147_800);
        assert_eq!(p[3].access_histogram(), Some(vec![1, 0, 0, 0, 0, 0, 0]));
        assert_eq!(p[0].total_lifetimes, 2535);
    }

    #[test]
    fn the_last_of_equal_peaks_is_the_one_recorded() {
        let mut s = State::new();
        s.alloc(0x10, 8, 0, 10);
        s.free(0x10, 20);
        s.alloc(0x10, 8, 1, 30);
        s.finish(40);
        assert_eq!(s.totals.tgmax, 30);
        assert_eq!((s.pps[0].at_tgmax_bytes, s.pps[1].at_tgmax_bytes), (0, 8));
        assert_eq!((s.pps[0].max_bytes, s.pps[1].max_bytes), (8, 8));
    }

    #[test]
    fn zero_byte_blocks_count_as_one_byte() {
        let mut s = State::new();
        s.alloc(0x10, 0, 0, 1);
        s.access(&acc(0x10, 4, AccessKind::Read));
        s.finish(2);
        assert_eq!(s.totals.total_bytes, 1);
        assert_eq!(s.pps[0].reads, 4);
        assert_eq!(s.pps[0].access_histogram(), Some(vec![1]));
    }

    #[test]
    fn accesses_outside_blocks_and_bogus_frees_change_nothing() {
        let mut s = State::new();
        s.alloc(0x100, 16, 0, 1);
        s.access(&acc(0xF8, 8, AccessKind::Read)); // starts before the block
        s.access(&acc(0x110, 1, AccessKind::Write)); // one past the end
        assert!(!s.free(0x108, 2), "interior pointer");
        assert!(!s.realloc(0x500, 0x600, 4, 2));
        s.access(&acc(0x10F, 8, AccessKind::Modify)); // last byte, clipped for the histogram
        s.finish(3);
        assert_eq!((s.pps[0].reads, s.pps[0].writes), (8, 8));
        let mut h = vec![0u16; 16];
        h[15] = 2;
        assert_eq!(s.pps[0].access_histogram(), Some(h));
        assert_eq!(s.live(), 0);
    }

    #[test]
    fn mixed_sizes_drop_the_histogram_and_large_blocks_never_have_one() {
        let mut s = State::new();
        s.alloc(0x100, 8, 0, 1);
        s.free(0x100, 2);
        s.alloc(0x100, 9, 0, 3);
        s.free(0x100, 4);
        s.alloc(0x1000, HISTOGRAM_SIZE_LIMIT + 1, 1, 5);
        s.free(0x1000, 6);
        s.alloc(0x1000, HISTOGRAM_SIZE_LIMIT, 2, 7);
        s.finish(8);
        assert_eq!(s.pps[0].access_histogram(), None);
        assert_eq!(s.pps[1].access_histogram(), None);
        assert_eq!(s.pps[2].access_histogram().map(|h| h.len()), Some(1024));
    }

    #[test]
    fn counts_latch_at_65535_per_block_and_stay_capped_when_written() {
        let mut s = State::new();
        s.alloc(0x100, 1, 0, 1);
        for _ in 0..70_000 {
            s.access(&acc(0x100, 1, AccessKind::Read));
        }
        s.free(0x100, 2);
        s.alloc(0x100, 1, 0, 3);
        s.access(&acc(0x100, 1, AccessKind::Read));
        s.free(0x100, 4);
        assert_eq!(s.pps[0].reads, 70_001);
        assert_eq!(s.pps[0].access_histogram(), Some(vec![0xFFFF]));
    }
}
