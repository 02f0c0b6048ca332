//! DHAT's bookkeeping for `--mode=heap`, with Valgrind 3.19's rules (`dh_main.c`): live
//! blocks, per-program-point counters, the global maximum, and the per-byte access
//! histograms. No host: it is tested on its own (`tests` below replays Valgrind's reference
//! program `dh_prog.c`).
//!
//! The program's threads update it at once, without a process-wide lock per event:
//!
//! * live blocks live in [`SHARDS`] shards chosen by address (blocks that fit in one
//!   64 MiB region go to that region's shard, larger or straddling ones to a shard of their
//!   own), each behind its own spin lock, with the per-program-point counters of the blocks
//!   it saw (added up at the end). Threads allocating from different regions (glibc gives
//!   each thread its own arena) and charging accesses to them rarely meet;
//! * the current heap size in bytes is counted per thread ([`size`]): each thread changes a
//!   count of its own, within a window of credit granted far enough below the global
//!   maximum that no event inside it can be a peak. Only an event that leaves its window
//!   takes the peak lock; if it may be a peak (the heap may reach `>=` the maximum on
//!   allocation, or be at it, `==`, before a free: Valgrind's tests) every thread's credit
//!   is revoked, so that the size (and the number of blocks) is known exactly, and the
//!   maximum is recorded under the peak lock, as Valgrind does at the same moments with the
//!   whole program stopped: the PP allocating has its counts added up from the shards that
//!   ever held its blocks, and the at-t-gmax snapshot visits only the shards whose PPs
//!   changed since the last one (one atomic bit mask, written once per shard between
//!   snapshots). (One atomic for the size, written by every thread at every event, was most
//!   of the time of `alloc` and `free` with four threads; locking all 33 shards at every
//!   peak, most of a growing heap's.)
//!
//! With one thread the sequence of updates is Valgrind's, so every number is; with several,
//! totals are still exact and the peak is the one of the order in which the events were
//! counted.
//!
//! Where Valgrind keeps the live blocks in an interval tree with a three-entry cache, each
//! shard keeps them in a slab indexed by a hash map from start address, and the block an
//! access lies in is found from the shadow map DHAT marks live blocks in (the filter of its
//! trace probes), without a search: each granule's shadow byte says how far back its block
//! starts ([`mark_block`], [`block_start`]). A batch of accesses remembers the blocks it hit
//! last (most accesses in a row touch one block). Program points are numbered by the
//! caller.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

pub mod size;

use oxgrind_tool::instrument::{Access, AccessKind, ShadowMap};
use oxgrind_tool::sync::{SpinGuard, SpinLock};

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

/// The counters of one program point (`PPInfo`). A shard keeps one per PP for its own
/// blocks (its `max_*` stay 0); [`Heap::finish`] adds them up.
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
    /// `curr_*` changed since the last peak snapshot (the PP is in its shard's
    /// `unsnapped` list).
    unsnapped: bool,
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
            unsnapped: false,
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

    /// Adds another shard's counters of the same PP.
    fn merge(&mut self, o: &PpStats) {
        self.total_blocks += o.total_blocks;
        self.total_bytes += o.total_bytes;
        self.curr_blocks += o.curr_blocks;
        self.curr_bytes += o.curr_bytes;
        self.at_tgmax_blocks += o.at_tgmax_blocks;
        self.at_tgmax_bytes += o.at_tgmax_bytes;
        self.total_lifetimes += o.total_lifetimes;
        self.reads += o.reads;
        self.writes += o.writes;
        match (self.xsize, o.xsize) {
            (_, XSize::Unknown) => {}
            (XSize::Unknown, x) => {
                self.xsize = x;
                self.histo = o.histo.clone();
            }
            (XSize::Exactly(a), XSize::Exactly(b)) if a == b => {
                if let (Some(h), Some(oh)) = (&mut self.histo, &o.histo) {
                    for (acc, &n) in h.iter_mut().zip(oh.iter()) {
                        // As when a block retires: no more adding once near overflow.
                        if *acc <= 0xFFFE_0000 {
                            *acc = acc.saturating_add(n);
                        }
                    }
                }
            }
            _ => {
                self.xsize = XSize::Mixed;
                self.histo = None;
            }
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

/// Number of block shards (plus one for blocks that do not fit in one region).
pub const SHARDS: usize = 32;
/// Blocks inside one `1 << REGION_SHIFT` region are kept in that region's shard: 64 MiB,
/// the size and alignment of glibc's per-thread heaps, so that the blocks of one thread's
/// arena share a shard and threads meet on one only when one frees or touches what another
/// allocated. (With 1 MiB regions hashed over the shards, a thread's heap spread over
/// several shards and two threads' heaps met on some: their lock and table lines went from
/// core to core.)
const REGION_SHIFT: u32 = 26;

/// The shard of an address's region: neighbouring regions (the arenas glibc maps one after
/// the other) in different shards, higher bits mixed in so that the main heap and the
/// mappings land apart.
#[inline]
fn region_shard(addr: u64) -> usize {
    let region = addr >> REGION_SHIFT;
    (region ^ (region >> 5) ^ (region >> 10)) as usize % SHARDS
}

/// The shard a block `[addr, addr + size)` is kept in.
#[inline]
fn block_shard(addr: u64, size: u64) -> usize {
    let last = addr.saturating_add(size.max(1) - 1);
    if addr >> REGION_SHIFT == last >> REGION_SHIFT {
        region_shard(addr)
    } else {
        SHARDS
    }
}

/// Lines of 256 bytes for which a batch of accesses remembers the block it hit last
/// (Valgrind's DHAT keeps the last three blocks): a loop reading one array and writing
/// another alternates between two; a database walks many pages.
const HINTS: usize = 256;

/// Hashes a block's start address (a multiple of 16) with one multiplication: the keys
/// are the program's addresses, not chosen against us, and SipHash cost more than the
/// lookup it served.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type ByAddr = HashMap<u64, u32, BuildHasherDefault<AddrHasher>>;

/// Live blocks of some regions and the counters of the PPs they came from.
#[derive(Debug, Default)]
struct Shard {
    blocks: Vec<Block>,
    free_slots: Vec<u32>,
    /// Start address -> slot in `blocks`.
    by_addr: ByAddr,
    pps: Vec<PpStats>,
    /// The PPs whose current counts changed since the last peak snapshot: only theirs can
    /// differ from their at-t-gmax counts ([`Shard::snapshot`]).
    unsnapped: Vec<u32>,
    /// This shard's bit in [`Heap::dirty`] and [`Peak::pp_shards`].
    bit: u64,
    total_blocks: u64,
    total_bytes: u64,
    /// Accesses of the blocks retired here.
    reads: u64,
    writes: u64,
}

const EMPTY_BLOCK: Block = Block {
    addr: 0,
    size: 0,
    pp: 0,
    allocd_at: 0,
    reads: 0,
    writes: 0,
    histo: None,
};

impl Shard {
    fn pp(&mut self, pp: u32) -> &mut PpStats {
        let i = pp as usize;
        if i >= self.pps.len() {
            self.pps.resize_with(i + 1, PpStats::new);
        }
        &mut self.pps[i]
    }

    /// [`Shard::pp`], for a change of its current counts (see `unsnapped`; the first
    /// since the last snapshot marks the shard in `dirty`, [`Heap::dirty`]).
    fn pp_changing(&mut self, pp: u32, dirty: &AtomicU64) -> &mut PpStats {
        let p = self.pp(pp);
        if !p.unsnapped {
            p.unsnapped = true;
            if self.unsnapped.is_empty() {
                dirty.fetch_or(self.bit, Ordering::AcqRel);
            }
            self.unsnapped.push(pp);
        }
        &mut self.pps[pp as usize]
    }

    fn insert(&mut self, b: Block) {
        let addr = b.addr;
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
    }

    /// Takes the live block starting at `addr` out of the shard.
    fn remove(&mut self, addr: u64) -> Option<Block> {
        let slot = self.by_addr.remove(&addr)?;
        self.free_slots.push(slot);
        Some(core::mem::replace(
            &mut self.blocks[slot as usize],
            EMPTY_BLOCK,
        ))
    }

    /// `check_for_peak`'s snapshot, for this shard's share of every PP: only the PPs whose
    /// current counts changed since the last one are copied (every other PP's at-t-gmax
    /// counts equal its current ones already). A heap growing by allocations with frees in
    /// between is at its peak at every free: copying every PP of every shard each time was
    /// 4% of sqlite3's time.
    fn snapshot(&mut self) {
        for pp in self.unsnapped.drain(..) {
            let p = &mut self.pps[pp as usize];
            p.at_tgmax_blocks = p.curr_blocks;
            p.at_tgmax_bytes = p.curr_bytes;
            p.unsnapped = false;
        }
    }

    /// A freed block, taken out of the shard already, leaves its PP's live counts and
    /// retires ([`Shard::retire`]).
    fn retire_live(&mut self, b: Block, now: u64, dirty: &AtomicU64) {
        let p = self.pp_changing(b.pp, dirty);
        p.curr_blocks -= 1;
        p.curr_bytes -= b.size;
        self.retire(b, now);
    }

    /// Folds a retiring block's lifetime, accesses and histogram into its PP
    /// (`retire_Block`, after the live counts were taken care of).
    fn retire(&mut self, b: Block, now: u64) {
        self.reads += b.reads;
        self.writes += b.writes;
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

    /// Charges one access to the live block starting at `start` (the slot it had when last
    /// hit, if known: checked, as another thread may have freed it since), if its first
    /// byte lies in it: then the block's slot and end, and whether it may be a hot range
    /// ([`may_be_hot`]).
    #[inline]
    fn access_at(&mut self, start: u64, hint: Option<u32>, a: &Access) -> Option<(u32, u64, bool)> {
        let hinted = hint.filter(|&s| {
            self.blocks
                .get(s as usize)
                .is_some_and(|b| b.addr == start && b.size != 0)
        });
        let slot = match hinted {
            Some(s) => s,
            None => *self.by_addr.get(&start)?,
        };
        let b = &mut self.blocks[slot as usize];
        let end = b.addr + b.size;
        if a.addr < b.addr || a.addr >= end {
            return None;
        }
        let counted = charge(b, a);
        Some((slot, end, !counted && may_be_hot(b.size)))
    }

    /// [`Shard::access_at`] for a block of this shard that the batch hit before in the
    /// access's line (`start` at `slot`, and `start <= a.addr`): no hash lookup. `false`
    /// when the slot holds no block starting there any more, or one that ends before the
    /// access (freed or resized by another thread since); the caller then looks it up.
    #[inline(always)]
    fn access_hinted(&mut self, slot: u32, start: u64, a: &Access) -> bool {
        match self.blocks.get_mut(slot as usize) {
            Some(b) if b.addr == start && a.addr < b.addr + b.size => {
                charge(b, a);
                true
            }
            _ => false,
        }
    }
}

/// Counts access `a`, whose first byte lies in `b`, in `b`'s totals and histogram.
/// Returns whether `b` has a histogram.
#[inline(always)]
fn charge(b: &mut Block, a: &Access) -> bool {
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
    let Some(h) = &mut b.histo else {
        return false;
    };
    let from = (a.addr - b.addr) as usize;
    let to = (from + a.size as usize).min(h.len());
    for c in &mut h[from..to] {
        *c = c.saturating_add(times);
    }
    true
}

/// Granules whose shadow byte names the distance to their block's start exactly: the
/// first 128 of each block.
const EXACT_GRANULES: u64 = 128;

/// Marks the granules of the live block `[addr, addr + size)` (a zero-byte block is one
/// byte, as DHAT counts it) in DHAT's shadow map: granule `d` of the block (counted from
/// its first) gets `d + 1` while `d < 128`, else `129 + (log2(d) - 7)`, which says that the
/// start is at least `2^log2(d)` granules back. [`block_start`] reads it back in at most
/// one step per doubling. Blocks are 16-byte aligned: two live blocks never share a
/// granule. Any nonzero byte is "live" to the engine's filter.
pub fn mark_block(shadow: &ShadowMap, addr: u64, size: u64) {
    let lo = addr & !7;
    let granules = (addr.saturating_add(size.max(1)).next_multiple_of(8) - lo) / 8;
    for d in 0..granules.min(EXACT_GRANULES) {
        shadow.set_granule(lo + 8 * d, d as u8 + 1);
    }
    let mut k = EXACT_GRANULES.trailing_zeros();
    while 1u64 << k < granules {
        let (from, to) = (1u64 << k, (1u64 << (k + 1)).min(granules));
        let v = (EXACT_GRANULES as u32 + 1 + k - EXACT_GRANULES.trailing_zeros()) as u8;
        shadow.set_granules(lo + 8 * from, lo + 8 * to, v);
        k += 1;
    }
}

/// Clears what [`mark_block`] marked.
pub fn unmark_block(shadow: &ShadowMap, addr: u64, size: u64) {
    let end = addr.saturating_add(size.max(1)).next_multiple_of(8);
    shadow.set_granules(addr & !7, end, 0);
}

/// The start of the live block whose granule `addr` lies in, as [`mark_block`] wrote it
/// (`None`: no block there). Read without a lock: a block being marked or cleared by
/// another thread meanwhile may give a wrong start, which the caller's lookup of the block
/// at that start then refutes.
#[inline]
pub fn block_start(shadow: &ShadowMap, addr: u64) -> Option<u64> {
    let mut g = addr & !7;
    for _ in 0..48 {
        match shadow.get(g) {
            0 => return None,
            v if v as u64 <= EXACT_GRANULES => return g.checked_sub(8 * (v as u64 - 1)),
            v => {
                let k = v as u32 - EXACT_GRANULES as u32 - 1 + EXACT_GRANULES.trailing_zeros();
                g = g.checked_sub(8u64.checked_shl(k)?)?;
            }
        }
    }
    None
}

/// Whether accesses to a block of `size` bytes may be counted in a hot range: one too large
/// for a histogram (not merely without one: a block shrunk by `realloc` has none, but the
/// tool forgets hot ranges only for the large blocks it frees).
pub fn may_be_hot(size: u64) -> bool {
    size > HISTOGRAM_SIZE_LIMIT
}

/// Blocks too large for a histogram that a batch of accesses hit, `(start, end, bytes)`
/// with the bytes those accesses named (twice for a read-modify-write, as a hot range
/// counts them), the block first hit last first (`end == 0`: none): what a thread's hot
/// ranges should count next are the busiest of them.
pub type HotBlocks = [(u64, u64, u64); HOT_BLOCKS];
/// How many large blocks of a batch are tallied ([`HotBlocks`]): a program may work in
/// more large blocks at once than the engine has hot ranges for.
pub const HOT_BLOCKS: usize = 8;

/// The global maximum (`g_max_*`, `g_tgmax_instrs`) and each PP's own maximum, recorded
/// when the heap reached it.
#[derive(Debug, Default)]
struct Peak {
    max_blocks: u64,
    max_bytes: u64,
    tgmax: u64,
    /// Per PP: (max_blocks, max_bytes).
    pp_max: Vec<(u64, u64)>,
    /// Per PP: the shards that ever held one of its blocks (bit `i`: shard `i`), the ones
    /// a new maximum adds its current counts up from.
    pp_shards: Vec<u64>,
    /// The settled part of the heap's size and the credit the threads hold ([`size`]).
    ledger: size::Ledger,
}

/// The end result: every PP's counters and the totals.
#[derive(Debug, Default)]
pub struct Summary {
    pub pps: Vec<PpStats>,
    pub totals: Totals,
}

/// A value on cache lines of its own (128 bytes: the spatial prefetcher pulls lines in
/// pairs), so that threads writing one of these do not slow the readers of another.
#[repr(align(128))]
#[derive(Default)]
struct Padded<T>(T);

impl<T> core::ops::Deref for Padded<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Everything DHAT knows in heap mode. See the module docs for how threads share it.
///
/// Laid out by how it is shared: each shard's lock and header, each slot of the heap's
/// size, the line read at every access batch (the span), and the peak's lock each on lines
/// of their own.
pub struct Heap {
    /// [`SHARDS`] region shards, then the shard of blocks larger than a region.
    shards: Vec<Padded<SpinLock<Shard>>>,
    peak: Padded<SpinLock<Peak>>,
    /// The heap's current size in bytes and blocks, per thread (see [`size`]).
    size: size::Slots,
    /// Shards with PPs changed since the last peak snapshot (bit `i`: shard `i`), the only
    /// ones a snapshot visits.
    dirty: Padded<AtomicU64>,
    /// `[lo, hi)` holds every block ever recorded (it only grows): most accesses (the
    /// stack, globals) fall outside, and are set aside without a lock or a lookup.
    span: Padded<(AtomicU64, AtomicU64)>,
}

impl Default for Heap {
    fn default() -> Self {
        Self::new()
    }
}

impl Heap {
    pub fn new() -> Self {
        Heap {
            shards: (0..=SHARDS)
                .map(|i| {
                    Padded(SpinLock::new(Shard {
                        bit: 1 << i,
                        ..Shard::default()
                    }))
                })
                .collect(),
            peak: Padded(SpinLock::new(Peak::default())),
            size: size::Slots::new(),
            dirty: Padded(AtomicU64::new(0)),
            span: Padded((AtomicU64::new(u64::MAX), AtomicU64::new(0))),
        }
    }

    /// Widens the span of recorded blocks to `[addr, addr + size)`, before the block is
    /// recorded (an access to it can only be drained after that). Reads first: it seldom
    /// widens.
    #[inline]
    fn cover(&self, addr: u64, size: u64) {
        let (lo, hi) = &*self.span;
        if addr < lo.load(Ordering::Relaxed) {
            lo.fetch_min(addr, Ordering::AcqRel);
        }
        let end = addr.saturating_add(size);
        if end > hi.load(Ordering::Relaxed) {
            hi.fetch_max(end, Ordering::AcqRel);
        }
    }

    /// Number of live blocks.
    pub fn live(&self) -> usize {
        self.shards.iter().map(|s| s.lock().by_addr.len()).sum()
    }

    /// `check_for_peak`'s snapshot: every PP's current counts become its at-t-gmax counts,
    /// in the shards where they changed since the last one. With the peak lock held.
    fn snapshot(&self) {
        let mut dirty = self.dirty.swap(0, Ordering::AcqRel);
        while dirty != 0 {
            let i = dirty.trailing_zeros() as usize;
            dirty &= dirty - 1;
            self.shards[i].lock().snapshot();
        }
    }

    /// Notes that shard `i` holds blocks of `pp` (its first, as it counted it), before the
    /// allocation is counted: a new maximum then finds them.
    #[cold]
    fn note_pp_shard(&self, pp: u32, i: usize) {
        let mut peak = self.peak.lock();
        let m = &mut peak.pp_shards;
        if m.len() <= pp as usize {
            m.resize(pp as usize + 1, 0);
        }
        m[pp as usize] |= 1 << i;
    }

    /// The slow path of a change of the heap's size by `d` bytes by `thread`, whose slot
    /// has no credit for it (see [`size`]), with Valgrind's peak tests on the exact size
    /// when the change may be a peak. `apply` makes the change to the shards, under the
    /// peak lock: before the size changes when it shrinks (a free's PP still holds the
    /// block at `check_for_peak`'s snapshot), nothing when it grows (the caller has added
    /// the block already, so that a new maximum counts it in its PP).
    ///
    /// Shrinking (`d < 0`): `check_for_peak`, at the global maximum every PP's current
    /// bytes become its at-t-gmax bytes (several equal peaks: the last one wins). Growing
    /// (`d >= 0`): the `>=` test of `intro_Block`/`resize_Block`, a new (or equal) global
    /// maximum. DHAT 3.19 updates the max of only the PP being allocated from (`pp`), so a
    /// PP whose blocks all come after the global peak keeps `mb == 0`; reproduced as is.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn count_slow<T>(
        &self,
        thread: u32,
        d: i64,
        blocks: i64,
        pp: u32,
        now: u64,
        apply: impl FnOnce() -> T,
    ) -> T {
        let mut peak = self.peak.lock();
        let peak = &mut *peak;
        self.size.settle(&mut peak.ledger, thread);
        let max = peak.max_bytes as i64;
        let bound = peak.ledger.bound();
        let may_peak = if d < 0 {
            bound >= max
        } else {
            bound + d >= max
        };
        if may_peak {
            self.size.revoke_all(&mut peak.ledger);
            if d < 0 && peak.ledger.base() == max {
                self.snapshot();
            }
        }
        let out = apply();
        peak.ledger.add(d, blocks);
        let curr = peak.ledger.base();
        if may_peak && d >= 0 && curr >= max {
            peak.max_bytes = curr as u64;
            peak.max_blocks = peak.ledger.blocks() as u64;
            peak.tgmax = now;
            let (mut blocks, mut bytes) = (0, 0);
            let mut held = peak.pp_shards.get(pp as usize).copied().unwrap_or(0);
            while held != 0 {
                let s = self.shards[held.trailing_zeros() as usize].lock();
                held &= held - 1;
                if let Some(p) = s.pps.get(pp as usize) {
                    blocks += p.curr_blocks;
                    bytes += p.curr_bytes;
                }
            }
            let i = pp as usize;
            if i >= peak.pp_max.len() {
                peak.pp_max.resize(i + 1, (0, 0));
            }
            peak.pp_max[i] = (blocks, bytes);
        }
        self.size
            .grant(&mut peak.ledger, thread, peak.max_bytes as i64);
        out
    }

    /// A block of `size` bytes at `addr` was allocated from `pp` by `thread` (any number
    /// naming the thread: its id) at instruction `now` (`new_block` + `intro_Block`), and is
    /// marked in `shadow` ([`mark_block`]). A block already recorded at `addr` (a missed
    /// free) is retired first.
    pub fn alloc(
        &self,
        shadow: Option<&ShadowMap>,
        thread: u32,
        addr: u64,
        size: u64,
        pp: u32,
        now: u64,
    ) {
        let size = size.max(1);
        self.cover(addr, size);
        let i = block_shard(addr, size);
        let shard = &self.shards[i];
        let mut s = shard.lock();
        if s.by_addr.contains_key(&addr) {
            drop(s);
            self.free(shadow, thread, addr, now);
            s = shard.lock();
        }
        let histo =
            (size <= HISTOGRAM_SIZE_LIMIT).then(|| vec![0u16; size as usize].into_boxed_slice());
        s.insert(Block {
            addr,
            size,
            pp,
            allocd_at: now,
            reads: 0,
            writes: 0,
            histo,
        });
        s.total_blocks += 1;
        s.total_bytes += size;
        let p = s.pp_changing(pp, &self.dirty);
        let first = p.total_blocks == 0;
        p.total_blocks += 1;
        p.total_bytes += size;
        p.curr_blocks += 1;
        p.curr_bytes += size;
        drop(s);
        if first {
            self.note_pp_shard(pp, i);
        }
        if let Some(map) = shadow {
            mark_block(map, addr, size);
        }
        if !self.size.local(thread, size as i64, 1) {
            self.count_slow(thread, size as i64, 1, pp, now, || ());
        }
    }

    /// The block starting at `addr` was freed by `thread` (`die_block`) and leaves
    /// `shadow`; anything else is a bogus free and changes nothing. Returns whether a block
    /// was retired.
    pub fn free(&self, shadow: Option<&ShadowMap>, thread: u32, addr: u64, now: u64) -> bool {
        for i in [region_shard(addr), SHARDS] {
            let mut s = self.shards[i].lock();
            let Some(b) = s.remove(addr) else {
                continue;
            };
            let size = b.size;
            if let Some(map) = shadow {
                unmark_block(map, addr, size);
            }
            if self.size.local(thread, -(size as i64), -1) {
                s.retire_live(b, now, &self.dirty);
                return true;
            }
            // Maybe at the peak: its PP keeps the block for the snapshot, taken first.
            drop(s);
            self.count_slow(thread, -(size as i64), -1, b.pp, now, || {
                self.shards[i].lock().retire_live(b, now, &self.dirty)
            });
            return true;
        }
        false
    }

    /// `realloc` by `thread` of the block at `old` to `new_size` bytes, now at `new_addr`
    /// (`renew_block`): one more allocation for the totals, the same PP, the copy counted
    /// as a read and a write of the bytes kept, the histogram dropped. `false` when `old`
    /// is not a live block (the caller then ignores the new one, as DHAT does). The
    /// shadow marks move with the block.
    pub fn realloc(
        &self,
        shadow: Option<&ShadowMap>,
        thread: u32,
        old: u64,
        new_addr: u64,
        new_size: u64,
        now: u64,
    ) -> bool {
        let new_size = new_size.max(1);
        let Some((i, mut s, mut b)) = [region_shard(old), SHARDS].into_iter().find_map(|i| {
            let mut s = self.shards[i].lock();
            s.remove(old).map(|b| (i, s, b))
        }) else {
            return false;
        };
        let (pp, old_size) = (b.pp, b.size);
        if let Some(map) = shadow {
            unmark_block(map, old, old_size);
        }
        let d = new_size as i64 - old_size as i64;
        // Shrinking can only end a peak: Valgrind checks for one before the sizes change.
        // Growing is counted once the block is in its new place.
        let leave = |s: &mut Shard| {
            let p = s.pp_changing(pp, &self.dirty);
            p.curr_blocks -= 1;
            p.curr_bytes -= old_size;
        };
        if d >= 0 || self.size.local(thread, d, 0) {
            leave(&mut s);
            drop(s);
        } else {
            drop(s);
            self.count_slow(thread, d, 0, pp, now, || leave(&mut self.shards[i].lock()));
        }
        b.histo = None;
        // Shrinking "copies" the new size (DHAT acts as if it copied), growing the old.
        let copied = new_size.min(old_size);
        b.reads += copied;
        b.writes += copied;
        b.addr = new_addr;
        b.size = new_size;
        self.cover(new_addr, new_size);
        let j = block_shard(new_addr, new_size);
        let target = &self.shards[j];
        let mut t = target.lock();
        if t.by_addr.contains_key(&new_addr) {
            // The runtime reported a block there already: it cannot be live any more.
            drop(t);
            self.free(shadow, thread, new_addr, now);
            t = target.lock();
        }
        t.insert(b);
        t.total_blocks += 1;
        t.total_bytes += new_size;
        let p = t.pp_changing(pp, &self.dirty);
        let first = p.total_blocks == 0;
        p.total_blocks += 1;
        p.total_bytes += new_size;
        p.curr_blocks += 1;
        p.curr_bytes += new_size;
        drop(t);
        if first {
            self.note_pp_shard(pp, j);
        }
        if let Some(map) = shadow {
            mark_block(map, new_addr, new_size);
        }
        if d >= 0 && !self.size.local(thread, d, 0) {
            self.count_slow(thread, d, 0, pp, now, || ());
        }
        true
    }

    /// The program's accesses, in order: each counted against the live block containing
    /// its first byte (`dh_handle_read` / `dh_handle_write`). A read-modify-write is a read
    /// and a write, as in Valgrind's IR (a load then a store). A shard's lock is kept while
    /// consecutive accesses fall in it.
    ///
    /// Addresses outside every block ever recorded are skipped at once. The block is the
    /// one this batch hit last in the access's 256-byte line, or a large block the batch
    /// hit before (whose accesses are then added up and charged once, at the end, as
    /// [`Heap::charge_range`] charges a hot range's), or the one whose start `shadow`
    /// names ([`block_start`]), looked up by its start in its region's shard, then in the
    /// large blocks' shard; one lock is held at a time. Without a shadow map nothing is
    /// recorded.
    ///
    /// Returns the blocks too large for a histogram it hit and how much ([`HotBlocks`]).
    pub fn access_all(
        &self,
        shadow: Option<&ShadowMap>,
        accesses: impl Iterator<Item = Access>,
    ) -> HotBlocks {
        let mut hot: HotBlocks = [(0, 0, 0); HOT_BLOCKS];
        let Some(shadow) = shadow else {
            return hot;
        };
        let (lo, hi) = &*self.span;
        let (lo, hi) = (lo.load(Ordering::Acquire), hi.load(Ordering::Acquire));
        let mut held: Option<(usize, SpinGuard<'_, Shard>)> = None;
        // The block hit last in each 256-byte line of [`HINTS`] (direct-mapped, `valid`
        // saying which are filled): `[start, end)`, its shard and slot, and whether it is
        // too large for a histogram. Only a hint, checked under the shard's lock; a program
        // working in many blocks at once (a database's pages) finds most of them here,
        // without a shadow walk or a hash lookup.
        // Not initialised: a flush before a free hands over a few records, and zeroing the
        // table each time cost more than they did.
        let mut hints = [core::mem::MaybeUninit::<(u64, u64, usize, u32, bool)>::uninit(); HINTS];
        let mut valid = [0u64; HINTS / 64];
        let line = |addr: u64| (addr >> 8) as usize % HINTS;
        // The large blocks hit (see [`HotBlocks`]), with the bytes read and written by the
        // accesses not charged yet: after its first access in the batch, a large block's
        // accesses (no histogram: only its totals) add up here and are charged once, as
        // the engine's hot ranges are ([`Heap::charge_range`]).
        let mut large = [(0u64, 0u64, 0u64, 0u64, 0u64); HOT_BLOCKS];
        let pending = |large: &mut [(u64, u64, u64, u64, u64); HOT_BLOCKS],
                       held: &mut Option<(usize, SpinGuard<'_, Shard>)>,
                       (start, end): (u64, u64),
                       bytes: u64,
                       (r, w): (u64, u64)| {
            match large.iter().position(|e| e.0 == start && e.1 == end) {
                Some(k) => {
                    large[k].2 += bytes;
                    large[k].3 += r;
                    large[k].4 += w;
                }
                None => {
                    let out = large[HOT_BLOCKS - 1];
                    if out.3 != 0 || out.4 != 0 {
                        *held = None;
                        self.charge_range(out.0, out.1, out.3, out.4);
                    }
                    large.copy_within(0..HOT_BLOCKS - 1, 1);
                    large[0] = (start, end, bytes, r, w);
                }
            }
        };
        for a in accesses {
            if a.addr < lo || a.addr >= hi {
                continue;
            }
            let l = line(a.addr);
            // SAFETY: an entry is read only once written (its bit in `valid`).
            let h =
                (valid[l / 64] & (1 << (l % 64)) != 0).then(|| unsafe { hints[l].assume_init() });
            let bytes = a.size as u64 * (1 + (a.kind == AccessKind::Modify) as u64);
            let h = h.filter(|h| h.0 <= a.addr && a.addr < h.1);
            // Most records of a batch hit a block with a histogram (the large ones are
            // mostly counted in hot ranges) that the line's hint names, in the shard held.
            if let (Some(h), Some((j, g))) = (h, &mut held) {
                if !h.4 && *j == h.2 && g.access_hinted(h.3, h.0, &a) {
                    continue;
                }
            }
            // A large block this batch hit before: named by the line's hint, else found
            // among them (a few large arrays are most of the accesses of some programs,
            // and their shadow, as large, mostly misses the cache).
            // (Empty entries, `(0, 0)`, contain no address; found by the search, the entry
            // is added to in place.)
            let hit_large = match h {
                Some(h) => h.4.then_some(((h.0, h.1), None)),
                // (None yet while the first entry is empty: they fill from the front.)
                None if large[0].1 == 0 => None,
                None => large
                    .iter()
                    .position(|e| e.0 <= a.addr && a.addr < e.1)
                    .map(|k| ((large[k].0, large[k].1), Some(k))),
            };
            if let Some((range, k)) = hit_large {
                let size = a.size as u64;
                let (r, w) = match a.kind {
                    AccessKind::Read => (size, 0),
                    AccessKind::Write => (0, size),
                    AccessKind::Modify => (size, size),
                };
                match k {
                    Some(k) => {
                        large[k].2 += bytes;
                        large[k].3 += r;
                        large[k].4 += w;
                    }
                    None => pending(&mut large, &mut held, range, bytes, (r, w)),
                }
                continue;
            }
            let (start, first, slot) = match h {
                Some(h) => (h.0, h.2, Some(h.3)),
                None => match block_start(shadow, a.addr) {
                    Some(start) => (start, region_shard(start), None),
                    None => continue,
                },
            };
            let candidates = [first, region_shard(start), SHARDS];
            for (n, &i) in candidates.iter().enumerate() {
                if candidates[..n].contains(&i) {
                    continue;
                }
                let g = match &mut held {
                    Some((j, g)) if *j == i => g,
                    _ => {
                        held = None;
                        &mut held.insert((i, self.shards[i].lock())).1
                    }
                };
                let hint = (i == first).then_some(slot).flatten();
                if let Some((slot, end, hot_candidate)) = g.access_at(start, hint, &a) {
                    hints[l].write((start, end, i, slot, hot_candidate));
                    valid[l / 64] |= 1 << (l % 64);
                    if hot_candidate {
                        pending(&mut large, &mut held, (start, end), bytes, (0, 0));
                    }
                    break;
                }
            }
        }
        drop(held);
        for (k, e) in large.iter().enumerate() {
            if e.3 != 0 || e.4 != 0 {
                self.charge_range(e.0, e.1, e.3, e.4);
            }
            hot[k] = (e.0, e.1, e.2);
        }
        hot
    }

    /// Bytes read and written by accesses whose first byte lies in `[lo, hi)`, counted by
    /// the engine in a thread's hot range: charged to the block that is exactly that range,
    /// if it is still live and too large for a histogram (else another thread freed it while the
    /// range was being counted in, and the counts are dropped, as the records of an access
    /// to a freed block are).
    pub fn charge_range(&self, lo: u64, hi: u64, reads: u64, writes: u64) -> bool {
        if hi <= lo {
            return false;
        }
        let mut s = self.shards[block_shard(lo, hi - lo)].lock();
        let Some(&slot) = s.by_addr.get(&lo) else {
            return false;
        };
        let b = &mut s.blocks[slot as usize];
        if b.size != hi - lo || b.histo.is_some() || !may_be_hot(b.size) {
            return false;
        }
        b.reads += reads;
        b.writes += writes;
        true
    }

    /// One access (see [`Heap::access_all`]).
    pub fn access(&self, shadow: Option<&ShadowMap>, a: &Access) {
        self.access_all(shadow, std::iter::once(*a));
    }

    /// At exit (`dh_fini`): a last peak check, then every live block's lifetime (up to
    /// `now`), accesses and histogram folded into its PP; the blocks stay counted as live
    /// (`eb`, `ebk`). Every shard's counters added up. `None` when a lock stayed held
    /// (a fatal signal interrupted a thread inside DHAT).
    pub fn finish(&self, now: u64) -> Option<Summary> {
        let mut peak = self.peak.lock_bounded(1 << 24)?;
        // The size, exactly: every thread's count settled.
        self.size.revoke_all_bounded(&mut peak.ledger, 1 << 24)?;
        let mut shards = Vec::with_capacity(self.shards.len());
        for s in &self.shards {
            shards.push(s.lock_bounded(1 << 24)?);
        }
        let curr = peak.ledger.base();
        if curr == peak.max_bytes as i64 {
            for s in &mut shards {
                s.snapshot();
            }
        }
        let mut out = Summary::default();
        for s in &mut shards {
            let slots: Vec<u32> = s.by_addr.values().copied().collect();
            out.totals.curr_blocks += slots.len() as u64;
            s.by_addr.clear();
            for slot in slots {
                let b = core::mem::replace(&mut s.blocks[slot as usize], EMPTY_BLOCK);
                s.retire(b, now);
            }
            s.blocks.clear();
            s.free_slots.clear();
            if out.pps.len() < s.pps.len() {
                out.pps.resize_with(s.pps.len(), PpStats::new);
            }
            for (o, p) in out.pps.iter_mut().zip(&s.pps) {
                o.merge(p);
            }
            let t = &mut out.totals;
            t.total_blocks += s.total_blocks;
            t.total_bytes += s.total_bytes;
            t.reads += s.reads;
            t.writes += s.writes;
        }
        for (o, &(blocks, bytes)) in out.pps.iter_mut().zip(&peak.pp_max) {
            o.max_blocks = blocks;
            o.max_bytes = bytes;
        }
        let t = &mut out.totals;
        t.curr_bytes = curr as u64;
        t.max_blocks = peak.max_blocks;
        t.max_bytes = peak.max_bytes;
        t.tgmax = peak.tgmax;
        Some(out)
    }

    /// After `fork`, in the child: the locks of threads that do not exist there.
    ///
    /// # Safety
    /// Only in a forked child, before any other thread of it can use the heap.
    pub unsafe fn force_unlock(&self) {
        // SAFETY: the caller guarantees no guard is live in this process.
        unsafe {
            self.peak.force_unlock();
            for s in &self.shards {
                s.force_unlock();
            }
            self.size.force_unlock();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shadow map of its own for each test (they run in parallel), for addresses below
    /// 2^31: 256 MiB of zeroed memory, never touched beyond the pages used, stands in for
    /// the core's reservation.
    fn shadow() -> ShadowMap {
        let v: Vec<u8> = vec![0; 1 << 28];
        let mem = Box::leak(v.into_boxed_slice()).as_mut_ptr() as u64;
        fn zero(start: u64, len: u64) {
            // SAFETY: ShadowMap passes whole pages of the map, all inside the leaked
            // 256 MiB for the tests' addresses.
            unsafe { core::ptr::write_bytes(start as *mut u8, 0, len as usize) };
        }
        // SAFETY: the tests only use addresses below 2^31, whose shadow lies in the leaked,
        // never freed 256 MiB at `mem`; `zero` only zeroes pages of it.
        unsafe { ShadowMap::new(mem, zero) }
    }

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
        let s = Heap::new();
        let m = &shadow();
        // PP 0: a 16-byte block, written once, each half read 4 and 1 times more.
        s.alloc(Some(m), 0, 0x1000, 16, 0, 144_000);
        for i in 0..16 {
            s.access(Some(m), &acc(0x1000 + i, 1, Write));
        }
        for _ in 0..4 {
            s.access(Some(m), &acc(0x1000, 8, Read));
        }
        s.access(Some(m), &acc(0x1008, 8, Read));
        s.free(Some(m), 0, 0x1000, 146_535);
        // PP 1: 2000 bytes written; PP 2: 100 bytes, 16 written, realloc'd to 200.
        s.alloc(Some(m), 0, 0x2000, 2000, 1, 144_646);
        s.access(Some(m), &acc(0x2000, 2000, Write));
        s.alloc(Some(m), 0, 0x3000, 100, 2, 145_000);
        s.access(Some(m), &acc(0x3000, 16, Write));
        assert!(s.realloc(Some(m), 0, 0x3000, 0x4000, 200, 147_679));
        s.free(Some(m), 0, 0x2000, 147_679);
        s.free(Some(m), 0, 0x4000, 147_700);
        // PP 3: 7 bytes, one byte written, never freed.
        s.alloc(Some(m), 0, 0x5000, 7, 3, 147_800);
        s.access(Some(m), &acc(0x5000, 1, Write));
        let r = s.finish(152_386).expect("no lock held");

        let t = r.totals;
        assert_eq!((t.total_bytes, t.total_blocks), (2323, 5));
        assert_eq!((t.max_bytes, t.max_blocks), (2200, 2));
        assert_eq!((t.curr_bytes, t.curr_blocks), (7, 1));
        assert_eq!(t.tgmax, 147_679);
        let p = &r.pps;
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
    fn every_byte_of_a_marked_block_leads_back_to_its_start() {
        let m = &shadow();
        let mut addr = 0x100_0000u64;
        for size in [
            1u64,
            8,
            9,
            16,
            1023,
            1024,
            1025,
            2048,
            4095,
            70_000,
            3 << 20,
        ] {
            mark_block(m, addr, size);
            for off in (0..size).step_by(7).chain([size - 1]) {
                assert_eq!(
                    block_start(m, addr + off),
                    Some(addr),
                    "size {size} off {off}"
                );
            }
            // The granule after the block is not part of it; the tail of its last
            // granule is (the caller checks the block's end).
            let end = (addr + size).next_multiple_of(8);
            assert_eq!(block_start(m, end), None, "size {size}");
            unmark_block(m, addr, size);
            assert_eq!(block_start(m, addr + size - 1), None, "size {size}");
            addr = (end + 4096).next_multiple_of(16);
        }
    }

    #[test]
    fn the_last_of_equal_peaks_is_the_one_recorded() {
        let s = Heap::new();
        let m = &shadow();
        s.alloc(Some(m), 0, 0x10, 8, 0, 10);
        s.free(Some(m), 0, 0x10, 20);
        s.alloc(Some(m), 0, 0x10, 8, 1, 30);
        let r = s.finish(40).expect("no lock held");
        assert_eq!(r.totals.tgmax, 30);
        assert_eq!((r.pps[0].at_tgmax_bytes, r.pps[1].at_tgmax_bytes), (0, 8));
        assert_eq!((r.pps[0].max_bytes, r.pps[1].max_bytes), (8, 8));
    }

    #[test]
    fn zero_byte_blocks_count_as_one_byte() {
        let s = Heap::new();
        let m = &shadow();
        s.alloc(Some(m), 0, 0x10, 0, 0, 1);
        s.access(Some(m), &acc(0x10, 4, AccessKind::Read));
        let r = s.finish(2).expect("no lock held");
        assert_eq!(r.totals.total_bytes, 1);
        assert_eq!(r.pps[0].reads, 4);
        assert_eq!(r.pps[0].access_histogram(), Some(vec![1]));
    }

    #[test]
    fn accesses_outside_blocks_and_bogus_frees_change_nothing() {
        let s = Heap::new();
        let m = &shadow();
        s.alloc(Some(m), 0, 0x100, 16, 0, 1);
        s.access(Some(m), &acc(0xF8, 8, AccessKind::Read)); // starts before the block
        s.access(Some(m), &acc(0x110, 1, AccessKind::Write)); // one past the end
        assert!(!s.free(Some(m), 0, 0x108, 2), "interior pointer");
        assert!(!s.realloc(Some(m), 0, 0x500, 0x600, 4, 2));
        s.access(Some(m), &acc(0x10F, 8, AccessKind::Modify)); // last byte, clipped for the histogram
        let r = s.finish(3).expect("no lock held");
        assert_eq!((r.pps[0].reads, r.pps[0].writes), (8, 8));
        let mut h = vec![0u16; 16];
        h[15] = 2;
        assert_eq!(r.pps[0].access_histogram(), Some(h));
        assert_eq!(s.live(), 0);
    }

    #[test]
    fn mixed_sizes_drop_the_histogram_and_large_blocks_never_have_one() {
        let s = Heap::new();
        let m = &shadow();
        s.alloc(Some(m), 0, 0x100, 8, 0, 1);
        s.free(Some(m), 0, 0x100, 2);
        s.alloc(Some(m), 0, 0x100, 9, 0, 3);
        s.free(Some(m), 0, 0x100, 4);
        s.alloc(Some(m), 0, 0x1000, HISTOGRAM_SIZE_LIMIT + 1, 1, 5);
        s.free(Some(m), 0, 0x1000, 6);
        s.alloc(Some(m), 0, 0x1000, HISTOGRAM_SIZE_LIMIT, 2, 7);
        let r = s.finish(8).expect("no lock held");
        assert_eq!(r.pps[0].access_histogram(), None);
        assert_eq!(r.pps[1].access_histogram(), None);
        assert_eq!(r.pps[2].access_histogram().map(|h| h.len()), Some(1024));
    }

    #[test]
    fn counts_latch_at_65535_per_block_and_stay_capped_when_written() {
        let s = Heap::new();
        let m = &shadow();
        s.alloc(Some(m), 0, 0x100, 1, 0, 1);
        for _ in 0..70_000 {
            s.access(Some(m), &acc(0x100, 1, AccessKind::Read));
        }
        s.free(Some(m), 0, 0x100, 2);
        s.alloc(Some(m), 0, 0x100, 1, 0, 3);
        s.access(Some(m), &acc(0x100, 1, AccessKind::Read));
        s.free(Some(m), 0, 0x100, 4);
        let r = s.finish(5).expect("no lock held");
        assert_eq!(r.pps[0].reads, 70_001);
        assert_eq!(r.pps[0].access_histogram(), Some(vec![0xFFFF]));
    }

    #[test]
    fn blocks_in_other_shards_and_across_regions_are_found_and_moved() {
        let s = Heap::new();
        let m = &shadow();
        let big = 3 << REGION_SHIFT;
        // Straddles two regions: kept in the shard of large blocks.
        let edge = (7 << REGION_SHIFT) - 8;
        s.alloc(Some(m), 0, 0x1000_0000, 16, 0, 1);
        s.alloc(Some(m), 0, edge, 16, 1, 2);
        s.alloc(Some(m), 0, 0x2000_0000, big, 2, 3);
        s.access(Some(m), &acc(edge + 12, 4, AccessKind::Write));
        s.access(Some(m), &acc(0x2000_0000 + big - 1, 1, AccessKind::Read));
        // Moves from a region's shard to the large one and back.
        assert!(s.realloc(Some(m), 0, 0x1000_0000, 0x3000_0000, big, 4));
        assert!(s.realloc(Some(m), 0, 0x3000_0000, 0x1000_0008, 8, 5));
        s.access(Some(m), &acc(0x1000_0008, 8, AccessKind::Read));
        assert!(s.free(Some(m), 0, edge, 6));
        assert_eq!(s.live(), 2);
        let r = s.finish(7).expect("no lock held");
        assert_eq!((r.pps[1].writes, r.pps[2].reads), (4, 1));
        assert_eq!((r.pps[0].total_blocks, r.pps[0].reads), (3, 16 + 8 + 8));
        assert_eq!(r.totals.total_bytes, 16 + 16 + big + big + 8);
        assert_eq!((r.totals.curr_blocks, r.totals.curr_bytes), (2, big + 8));
        assert_eq!(r.totals.max_bytes, 16 + big + big);
    }

    #[test]
    fn threads_updating_at_once_keep_exact_totals() {
        let s = Heap::new();
        let m = &shadow();
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let s = &s;
                scope.spawn(move || {
                    let base = (t + 1) << 26;
                    for i in 0..2000u64 {
                        let a = base + (i % 64) * 64;
                        s.alloc(Some(m), t as u32, a, 32, t as u32, i);
                        s.access(Some(m), &acc(a, 8, AccessKind::Write));
                        s.free(Some(m), t as u32, a, i + 1);
                    }
                });
            }
        });
        let r = s.finish(10_000).expect("no lock held");
        assert_eq!(
            (r.totals.total_blocks, r.totals.total_bytes),
            (8000, 8000 * 32)
        );
        assert_eq!((r.totals.writes, r.totals.curr_bytes), (8000 * 8, 0));
        assert!((32..=4 * 32).contains(&r.totals.max_bytes));
        for p in &r.pps {
            assert_eq!((p.total_blocks, p.writes), (2000, 2000 * 8));
        }
    }

    /// Valgrind's rules on one global size, event by event (`intro_Block`, `die_block`,
    /// `resize_Block`, `check_for_peak`): what the per-thread counts must come to.
    #[derive(Default)]
    struct Reference {
        live: HashMap<u64, (u64, u32)>,
        curr: u64,
        max: u64,
        max_blocks: u64,
        tgmax: u64,
        pp_curr: Vec<(u64, u64)>,
        pp_max: Vec<(u64, u64)>,
        pp_at: Vec<(u64, u64)>,
    }

    impl Reference {
        fn check_for_peak(&mut self) {
            if self.curr == self.max {
                self.pp_at = self.pp_curr.clone();
            }
        }
        fn grew(&mut self, pp: u32, now: u64) {
            if self.curr >= self.max {
                self.max = self.curr;
                self.max_blocks = self.live.len() as u64;
                self.tgmax = now;
                self.pp_max[pp as usize] = self.pp_curr[pp as usize];
            }
        }
        fn alloc(&mut self, addr: u64, size: u64, pp: u32, now: u64) {
            self.live.insert(addr, (size, pp));
            self.pp_curr[pp as usize].0 += 1;
            self.pp_curr[pp as usize].1 += size;
            self.curr += size;
            self.grew(pp, now);
        }
        fn free(&mut self, addr: u64) {
            self.check_for_peak();
            let (size, pp) = self.live.remove(&addr).unwrap();
            self.pp_curr[pp as usize].0 -= 1;
            self.pp_curr[pp as usize].1 -= size;
            self.curr -= size;
        }
        fn realloc(&mut self, old: u64, new: u64, size: u64, now: u64) {
            let (old_size, pp) = self.live.remove(&old).unwrap();
            if size < old_size {
                self.check_for_peak();
            }
            self.live.insert(new, (size, pp));
            self.pp_curr[pp as usize].1 = self.pp_curr[pp as usize].1 - old_size + size;
            self.curr = self.curr - old_size + size;
            self.grew(pp, now);
        }
    }

    /// Eight threads' events, one after another (so the order is known), the heap
    /// hovering near its maximum and each thread freeing and resizing the others' blocks:
    /// every credit, settlement and revocation path, checked against [`Reference`].
    #[test]
    fn per_thread_counts_find_valgrinds_peaks_exactly() {
        const PPS: u32 = 5;
        let s = Heap::new();
        let m = &shadow();
        let mut r = Reference {
            pp_curr: vec![(0, 0); PPS as usize],
            pp_max: vec![(0, 0); PPS as usize],
            ..Reference::default()
        };
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut addrs: Vec<u64> = Vec::new();
        // Places 1 MiB apart below 2 GiB (the tests' shadow), reused once freed.
        let mut unused: Vec<u64> = (1..2000u64).map(|k| k << 20).collect();
        for now in 1..40_000u64 {
            let x = next();
            let thread = (x % 8) as u32;
            // Bursts of growth from time to time, then back to about 100 live blocks.
            let target = if (now / 3000) % 3 == 2 { 400 } else { 100 };
            let size = match (x >> 8) % 16 {
                0 => 200_000 + (x >> 20) % 100_000,
                1..=4 => 1 + (x >> 20) % 16,
                _ => 1 + (x >> 20) % 3000,
            };
            let pp = ((x >> 40) % PPS as u64) as u32;
            match (x >> 50) % 8 {
                0 | 1 if !addrs.is_empty() => {
                    let k = (x >> 12) as usize % addrs.len();
                    let (old, new) = (addrs[k], unused.pop().unwrap());
                    unused.push(old);
                    // Same size at times: may be a peak too (`>=`).
                    let size = if x % 5 == 0 { r.live[&old].0 } else { size };
                    assert!(s.realloc(Some(m), thread, old, new, size, now));
                    r.realloc(old, new, size, now);
                    addrs[k] = new;
                }
                _ if addrs.len() > target || (addrs.len() == target && x % 2 == 0) => {
                    let k = (x >> 12) as usize % addrs.len();
                    let a = addrs.swap_remove(k);
                    assert!(s.free(Some(m), thread, a, now));
                    r.free(a);
                    unused.push(a);
                }
                _ => {
                    let a = unused.pop().unwrap();
                    s.alloc(Some(m), thread, a, size, pp, now);
                    r.alloc(a, size, pp, now);
                    addrs.push(a);
                }
            }
        }
        r.check_for_peak();
        let got = s.finish(50_000).expect("no lock held");
        let t = got.totals;
        assert_eq!(
            (t.max_bytes, t.max_blocks, t.tgmax),
            (r.max, r.max_blocks, r.tgmax)
        );
        assert_eq!((t.curr_bytes, t.curr_blocks), (r.curr, r.live.len() as u64));
        for pp in 0..PPS as usize {
            let p = &got.pps[pp];
            assert_eq!((p.max_blocks, p.max_bytes), r.pp_max[pp], "PP {pp}");
            assert_eq!(
                (p.at_tgmax_blocks, p.at_tgmax_bytes),
                r.pp_at[pp],
                "PP {pp}"
            );
            assert_eq!((p.curr_blocks, p.curr_bytes), r.pp_curr[pp], "PP {pp}");
        }
    }

    /// Four threads allocate at once, meet, then free at once: whatever the interleaving,
    /// the maximum is everything allocated, each PP at t-gmax holding all of its blocks.
    #[test]
    fn threads_growing_at_once_reach_the_exact_peak() {
        const N: u64 = 3000;
        let s = Heap::new();
        let m = &shadow();
        let met = std::sync::Barrier::new(4);
        let size = |t: u64, i: u64| 1 + (t * 7919 + i * 104_729) % 1500;
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let (s, met) = (&s, &met);
                scope.spawn(move || {
                    let base = (t + 1) << 27;
                    for i in 0..N {
                        s.alloc(Some(m), t as u32, base + i * 2048, size(t, i), t as u32, 1);
                    }
                    met.wait();
                    // All but the last block of each thread's own region go, half of them
                    // freed by the next thread.
                    let other = (((t + 1) % 4) + 1) << 27;
                    for i in 0..N - 1 {
                        let a = if i % 2 == 0 { base } else { other } + i * 2048;
                        s.free(Some(m), t as u32, a, 2);
                    }
                });
            }
        });
        let r = s.finish(3).expect("no lock held");
        let sum = |t: u64| (0..N).map(|i| size(t, i)).sum::<u64>();
        let all: u64 = (0..4).map(sum).sum();
        assert_eq!((r.totals.max_bytes, r.totals.max_blocks), (all, 4 * N));
        assert_eq!(r.totals.tgmax, 1);
        let last: u64 = (0..4).map(|t| size(t, N - 1)).sum();
        assert_eq!((r.totals.curr_bytes, r.totals.curr_blocks), (last, 4));
        for t in 0..4u64 {
            let p = &r.pps[t as usize];
            assert_eq!((p.at_tgmax_blocks, p.at_tgmax_bytes), (N, sum(t)), "PP {t}");
            assert_eq!((p.max_blocks, p.max_bytes), (N, sum(t)), "PP {t}");
        }
    }
}
