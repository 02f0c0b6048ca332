//! The live-block table: every block the program holds, by address.
//!
//! Every `free` must find its block (size, allocation stack, which family allocated it), and
//! every `free` of an unknown address is an error to report rather than memory to hand to
//! glibc. The table is split into shards by address so threads rarely meet on one lock;
//! each shard is an address table of its own (`oxgrind_tool::addr_table`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use oxgrind_sys::lock::{SpinGuard, SpinLock};
use oxgrind_tool::addr_table::AddrTable;
use oxgrind_tool::{AllocFn, LiveBlock, StackId};

/// A multiplicative hash: addresses are already well spread except in their low bits.
#[derive(Default)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

pub type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;

#[derive(Copy, Clone, Debug)]
pub struct BlockInfo {
    pub size: u64,
    pub stack: StackId,
    pub func: AllocFn,
    /// Allocated by oxgrind itself through libc: not the program's, never reported.
    pub internal: bool,
    /// The tool's number for the block (`Tool::on_alloc`'s result), handed back when it is
    /// freed.
    /// 32 bits, so that a packed entry is 16 bytes (`Packed`).
    pub tool_word: u32,
}

/// An empty entry's value in the overflow tables (never read as a block).
impl Default for BlockInfo {
    fn default() -> Self {
        BlockInfo {
            size: 0,
            stack: StackId(0),
            func: AllocFn::Malloc,
            internal: false,
            tool_word: 0,
        }
    }
}

/// Every `AllocFn`, at the index of its discriminant (a packed entry holds the index; 16
/// entries, the last two never used, so that a 4-bit index needs no bounds check).
const FUNCS: [AllocFn; 16] = [
    AllocFn::Malloc,
    AllocFn::Calloc,
    AllocFn::Realloc,
    AllocFn::ReallocArray,
    AllocFn::Memalign,
    AllocFn::PosixMemalign,
    AllocFn::AlignedAlloc,
    AllocFn::Valloc,
    AllocFn::Pvalloc,
    AllocFn::New,
    AllocFn::NewArray,
    AllocFn::Free,
    AllocFn::Delete,
    AllocFn::DeleteArray,
    AllocFn::Malloc,
    AllocFn::Malloc,
];

const _: () = {
    let mut i = 0;
    while i < 14 {
        assert!(FUNCS[i] as usize == i);
        i += 1;
    }
};

/// A live block in a shard's table, 16 bytes (four to a cache line; the table's lines are
/// what a free misses on, see [`ShardTable`]):
/// `key`: the address divided by 16 in bits 21..64, `internal` in bit 20, the allocating
/// function's index in `FUNCS` in bits 16..20, the size in bits 0..16 (`SIZE_BIG`: the
/// size is in the shard's overflow table); 0 for an empty entry.
/// `ids`: the allocation stack in bits 0..32, the tool's word in bits 32..64.
#[derive(Copy, Clone)]
struct Packed {
    key: u64,
    ids: u64,
}

impl Packed {
    /// An empty slot.
    const VACANT: Packed = Packed {
        key: EMPTY_KEY,
        ids: 0,
    };
}

const EMPTY_KEY: u64 = 0;
const SIZE_BIG: u64 = 0xffff;
const FUNC_SHIFT: u32 = 16;
const INTERNAL_BIT: u64 = 1 << 20;
/// The bits of `key` below the address.
const KEY_INFO: u64 = (1 << 21) - 1;

/// Whether a block at `addr` can have a packed entry: 16-byte aligned (glibc's blocks all
/// are), not 0, below 2^47 (user space). Others (none expected) live in the overflow table.
#[inline(always)]
fn packs(addr: u64) -> bool {
    // One compare for the range [16, 2^47): 0 wraps to the top.
    addr & 15 == 0 && addr.wrapping_sub(16) < (1 << 47) - 16
}

/// The address part of a packed key (`addr` packs).
#[inline(always)]
fn key_of(addr: u64) -> u64 {
    addr << 17
}

#[inline(always)]
fn pack(addr: u64, b: &BlockInfo) -> Packed {
    Packed {
        key: key_of(addr)
            | if b.internal { INTERNAL_BIT } else { 0 }
            | ((b.func as u64) << FUNC_SHIFT)
            | b.size.min(SIZE_BIG),
        ids: b.stack.0 as u64 | ((b.tool_word as u64) << 32),
    }
}

/// The block of a packed entry; `big_size` gives the size of one whose size is `SIZE_BIG`.
#[inline(always)]
fn unpack(e: Packed, big_size: impl FnOnce() -> u64) -> BlockInfo {
    let small = e.key & SIZE_BIG;
    BlockInfo {
        size: if small == SIZE_BIG { big_size() } else { small },
        stack: StackId(e.ids as u32),
        func: FUNCS[((e.key >> FUNC_SHIFT) & 15) as usize],
        internal: e.key & INTERNAL_BIT != 0,
        tool_word: (e.ids >> 32) as u32,
    }
}

/// The home slot of `addr` in a table of `1 << (64 - shift)` entries: a multiplicative hash
/// of its 4 KiB page plus its 32-byte unit in the page (glibc's blocks lie at least 32
/// bytes apart), so that the blocks of one page, which an allocator hands out close in
/// time, have their entries side by side on a few lines (as `oxgrind_tool::addr_table`).
#[inline(always)]
fn home_in(shift: u32, addr: u64) -> usize {
    let page = ((addr >> 12).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize;
    (page + ((addr >> 5) & 0x7f) as usize) & (usize::MAX >> shift)
}

/// One shard's live blocks. Open addressing with linear probing and removal by shifting
/// back (Knuth's algorithm R, as `oxgrind_tool::addr_table`, whose general table this was
/// until session 15), over 16-byte packed entries, at most half full while it has at most
/// `SPARSE_MAX` entries and three quarters full beyond. Why packed: the first probe of a free's removal missed the cache (bench `alloc`,
/// 4,096 live blocks: 512 KiB of 32-byte entries, a quarter full; 70% of
/// `BlockTable::remove`'s samples, 11% of the whole run's under Massif): the table shares
/// the cache with the program's heap and the tool's shadows, and its size decides how much
/// of it stays there (16-byte entries, and three quarters full at most instead of half:
/// `alloc`'s table 128 KiB instead of 512, 4-7% less CPU time under Memcheck in paired
/// runs; with 16-byte entries kept half full, about 5% more than at three quarters). A
/// small table stays in the cache anyway, and there the longer probes of a fuller one cost
/// (bench `threads`, 1,024 live blocks per shard: 4-8% slower under Massif at three
/// quarters). Blocks of 64 KiB or more keep their size in `overflow` (the packed
/// entry says so); a block whose address does not pack is there alone.
struct ShardTable {
    /// A power of two entries (none until the first insert).
    entries: Vec<Packed>,
    len: usize,
    /// `64 - log2(entries.len())`.
    shift: u32,
    /// The number of packed entries at which the table grows (see `SPARSE_MAX`).
    grow_at: usize,
    overflow: AddrTable<BlockInfo>,
}

/// The size (in entries, 64 KiB) up to which a table is kept at most half full.
const SPARSE_MAX: usize = 4096;

impl ShardTable {
    const fn new() -> Self {
        ShardTable {
            entries: Vec::new(),
            len: 0,
            shift: 64,
            grow_at: 0,
            overflow: AddrTable::new(),
        }
    }

    /// How many blocks the table holds, or a few more (big blocks are counted twice).
    fn len_at_most(&self) -> usize {
        self.len + self.overflow.len()
    }

    /// As `AddrTable::layout`: the entries and their count in one word, for
    /// [`ShardTable::prefetch_home`] without the lock (0 while there are none).
    #[inline]
    fn layout(&self) -> u64 {
        if self.entries.is_empty() {
            return 0;
        }
        // User-space addresses have 47 bits; `shift` is at most 63.
        ((self.entries.as_ptr() as u64) << 7) | self.shift as u64
    }

    #[inline(always)]
    fn prefetch_home(layout: u64, addr: u64) {
        if layout == 0 {
            return;
        }
        let shift = (layout & 0x7f) as u32;
        let at = (layout >> 7).wrapping_add((home_in(shift, addr) * size_of::<Packed>()) as u64);
        oxgrind_tool::hint::prefetch_read_at(at);
    }

    /// Entry `i`, a slot index (a home, or masked by `entries.len() - 1`) of a table that
    /// has entries: in bounds. Unchecked: the probe loops run on every event.
    #[inline(always)]
    fn at(&self, i: usize) -> Packed {
        debug_assert!(i < self.entries.len());
        // SAFETY: `i` is a slot index (above), so `i < entries.len()`.
        unsafe { *self.entries.get_unchecked(i) }
    }

    #[inline(always)]
    fn set(&mut self, i: usize, e: Packed) {
        debug_assert!(i < self.entries.len());
        // SAFETY: as in `at`.
        unsafe { *self.entries.get_unchecked_mut(i) = e }
    }

    /// The slot of the packed entry of `addr` (which packs), if it has one.
    #[inline(always)]
    fn find(&self, addr: u64) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.entries.len() - 1;
        let want = key_of(addr);
        let mut i = home_in(self.shift, addr);
        loop {
            let key = self.at(i).key;
            if key & !KEY_INFO == want {
                return Some(i);
            }
            if key == EMPTY_KEY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// The block of the entry at slot `i`, which belongs to `addr`.
    #[inline(always)]
    fn block_at(&self, i: usize, addr: u64) -> BlockInfo {
        unpack(self.at(i), || self.overflow.get(addr).map_or(0, |b| b.size))
    }

    #[inline]
    fn get(&self, addr: u64) -> Option<BlockInfo> {
        if !packs(addr) {
            return self.overflow.get(addr);
        }
        self.find(addr).map(|i| self.block_at(i, addr))
    }

    /// Adds or replaces the block at `addr`; returns the one replaced. Inlined into its
    /// callers, as `remove`: each has one on the per-event path.
    #[inline(always)]
    fn insert(&mut self, addr: u64, info: BlockInfo) -> Option<BlockInfo> {
        if !packs(addr) {
            return self.overflow.insert(addr, info);
        }
        let e = pack(addr, &info);
        let big = info.size >= SIZE_BIG;
        if self.len >= self.grow_at {
            self.grow();
        }
        let mask = self.entries.len() - 1;
        let mut i = home_in(self.shift, addr);
        loop {
            let key = self.at(i).key;
            if key == EMPTY_KEY {
                self.set(i, e);
                self.len += 1;
                if big {
                    self.overflow.insert(addr, info);
                }
                return None;
            }
            if key & !KEY_INFO == e.key & !KEY_INFO {
                let old = unpack(self.at(i), || {
                    self.overflow.remove(addr).map_or(0, |b| b.size)
                });
                self.set(i, e);
                if big {
                    self.overflow.insert(addr, info);
                }
                return Some(old);
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes and returns the block at `addr`.
    #[inline(always)]
    fn remove(&mut self, addr: u64) -> Option<BlockInfo> {
        if !packs(addr) {
            return self.overflow.remove(addr);
        }
        let mut hole = self.find(addr)?;
        let block = unpack(self.at(hole), || {
            self.overflow.remove(addr).map_or(0, |b| b.size)
        });
        let mask = self.entries.len() - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let e = self.at(j);
            if e.key == EMPTY_KEY {
                break;
            }
            // The entry at j moves back into the hole unless its home lies cyclically in
            // (hole, j]: it would then no longer be reachable from its home.
            let h = home_in(self.shift, (e.key >> 21) << 4);
            let stays = if hole <= j {
                hole < h && h <= j
            } else {
                hole < h || h <= j
            };
            if !stays {
                self.set(hole, e);
                hole = j;
            }
        }
        self.set(hole, Packed::VACANT);
        self.len -= 1;
        Some(block)
    }

    #[cold]
    fn grow(&mut self) {
        let n = (self.entries.len() * 2).max(64);
        let old = core::mem::replace(&mut self.entries, vec![Packed::VACANT; n]);
        self.shift = 64 - n.trailing_zeros();
        self.grow_at = if n > SPARSE_MAX { n / 4 * 3 } else { n / 2 };
        let mask = n - 1;
        for e in old.into_iter().filter(|e| e.key != EMPTY_KEY) {
            let mut i = home_in(self.shift, (e.key >> 21) << 4);
            while self.entries[i].key != EMPTY_KEY {
                i = (i + 1) & mask;
            }
            self.entries[i] = e;
        }
    }

    /// Every block, in no particular order.
    fn for_each(&self, mut f: impl FnMut(u64, BlockInfo)) {
        for e in self.entries.iter().filter(|e| e.key != EMPTY_KEY) {
            let addr = (e.key >> 21) << 4;
            f(
                addr,
                unpack(*e, || self.overflow.get(addr).map_or(0, |b| b.size)),
            );
        }
        for (addr, b) in self.overflow.iter() {
            if !packs(addr) {
                f(addr, *b);
            }
        }
    }
}

const SHARDS: usize = 64;

/// A shard's lock stayed held through a call without an event's tries.
#[derive(Debug)]
pub struct ShardBusy;

/// How long a call without an event tries a shard's lock (`SpinLock::lock_bounded`: a
/// yield every 64 rounds) before it takes its interrupted frame for the holder: far longer
/// than any other thread holds it unless it is preempted.
const UNEVENTED_SPINS: u64 = 1 << 14;

/// Internal blocks made by calls without an event while their shard's lock stayed held
/// ([`BlockTable::insert_without_event`]): a few addresses, each slot claimed and released
/// with one atomic operation, so that a signal handler may use them at any instant. Full
/// (as many such blocks alive at once: not seen), a block is not recorded and its memory
/// is not given back at its `free`.
struct Orphans {
    slots: [AtomicU64; 32],
    /// Slots in use: a `free` that finds none looks no further (every call without an
    /// event asks).
    used: AtomicU64,
}

static ORPHANS: Orphans = Orphans {
    slots: [const { AtomicU64::new(0) }; 32],
    used: AtomicU64::new(0),
};

impl Orphans {
    fn park(&self, addr: u64) {
        // Counted before it is there, so that a `take` never sees it with the count at 0.
        self.used.fetch_add(1, Ordering::AcqRel);
        for slot in &self.slots {
            if slot
                .compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
        self.used.fetch_sub(1, Ordering::AcqRel);
    }

    fn take(&self, addr: u64) -> bool {
        if self.used.load(Ordering::Acquire) == 0 {
            return false;
        }
        for slot in &self.slots {
            if slot
                .compare_exchange(addr, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.used.fetch_sub(1, Ordering::AcqRel);
                return true;
            }
        }
        false
    }
}

/// One shard on cache lines of its own: a shard's lock word and table header are written
/// by every insert and remove, and with shards packed side by side two threads working in
/// different shards still fought over a shared line (128 bytes: the spatial prefetcher
/// pulls lines in pairs).
#[repr(align(128))]
struct Shard {
    table: SpinLock<ShardTable>,
    layout: Layout,
}

/// The table's `ShardTable::layout`, stored under the lock when it changes (when the table
/// grows) and read without it by [`BlockTable::prefetch`] at every allocation: on lines of
/// its own, apart from the lock's word, which every insert and removal writes. Beside it,
/// the prefetch's read missed whenever another thread had just used the shard (under
/// Memcheck on `threads`, where the freed-block queue gives each thread's blocks back to
/// glibc from any thread, so every thread allocates in every shard: 85% of
/// `record_alloc`'s samples were that load), and it is the read that was to hide a miss.
#[repr(align(128))]
struct Layout(AtomicU64);

pub struct BlockTable {
    shards: [Shard; SHARDS],
}

/// The shard of a block: by 64 MiB region, the size and alignment of glibc's per-thread
/// heaps, so the blocks of one thread's arena share a shard and threads meet on a shard only
/// when one frees what another allocated. (Spreading neighbouring blocks over every shard,
/// as before, made every thread write every shard: on two cores the lines of the locks and
/// maps went back and forth between the caches on each malloc and free.) Regions mix their
/// higher bits so that the main heap, mappings and thread heaps land apart.
#[inline]
fn shard_of(addr: u64) -> usize {
    let region = addr >> 26;
    (region ^ (region >> 6) ^ (region >> 12)) as usize % SHARDS
}

impl BlockTable {
    pub const fn new() -> Self {
        const EMPTY: Shard = Shard {
            table: SpinLock::new(ShardTable::new()),
            layout: Layout(AtomicU64::new(0)),
        };
        BlockTable {
            shards: [EMPTY; SHARDS],
        }
    }

    /// Starts loading the entry `addr`'s insert or removal will read first, without the
    /// shard's lock, so that the miss (the table outgrows the cache: 4 MiB on bench
    /// `containers`) overlaps the work before the lock. A hint.
    #[inline(always)]
    pub fn prefetch(&self, addr: u64) {
        let layout = self.shards[shard_of(addr)].layout.0.load(Ordering::Relaxed);
        ShardTable::prefetch_home(layout, addr);
    }

    #[inline]
    pub fn insert(&self, addr: u64, info: BlockInfo) {
        let shard = &self.shards[shard_of(addr)];
        Self::insert_locked(shard, shard.table.lock(), addr, info);
    }

    #[inline(always)]
    fn insert_locked(shard: &Shard, mut t: SpinGuard<'_, ShardTable>, addr: u64, info: BlockInfo) {
        let replaced = t.insert(addr, info);
        let layout = t.layout();
        if shard.layout.0.load(Ordering::Relaxed) != layout {
            shard.layout.0.store(layout, Ordering::Relaxed);
        }
        drop(t);
        // The --max-* budgets see every program block come and go (outside the lock).
        if let Some(old) = replaced {
            crate::budget::on_remove(&old);
        }
        crate::budget::on_insert(&info);
    }

    #[inline]
    pub fn remove(&self, addr: u64) -> Option<BlockInfo> {
        let removed = self.shards[shard_of(addr)].table.lock().remove(addr);
        if let Some(b) = &removed {
            crate::budget::on_remove(b);
        }
        removed
    }

    /// [`insert`](Self::insert) for a call that has no event: one a signal handler makes
    /// while its thread is inside the runtime, whose interrupted frame may hold the very
    /// shard's lock (a thread's blocks share a shard, `shard_of`), so waiting for it would
    /// wait forever. The lock is tried for a while; if it stays held, an internal block is
    /// parked in [`ORPHANS`] instead, where its `free` finds it
    /// ([`remove_without_event`](Self::remove_without_event)).
    pub fn insert_without_event(&self, addr: u64, info: BlockInfo) {
        let shard = &self.shards[shard_of(addr)];
        match shard.table.lock_bounded(UNEVENTED_SPINS) {
            Some(t) => Self::insert_locked(shard, t, addr, info),
            None if info.internal => ORPHANS.park(addr),
            // Only internal blocks are made without an event.
            None => {}
        }
    }

    /// [`remove`](Self::remove) for a call that has no event (as
    /// [`insert_without_event`](Self::insert_without_event)): a parked block is found
    /// first (as internal, size unknown: 0). [`ShardBusy`] when the shard's lock stays held:
    /// the block is left as it is (still live in the table, its memory not given back: the
    /// rare price of a `free` in a signal handler that interrupted the runtime on that
    /// shard).
    pub fn remove_without_event(&self, addr: u64) -> Result<Option<BlockInfo>, ShardBusy> {
        if ORPHANS.take(addr) {
            return Ok(Some(BlockInfo {
                size: 0,
                stack: crate::hooks::NO_STACK,
                func: AllocFn::Malloc,
                internal: true,
                tool_word: 0,
            }));
        }
        let t = self.shards[shard_of(addr)]
            .table
            .lock_bounded(UNEVENTED_SPINS);
        let removed = t.ok_or(ShardBusy)?.remove(addr);
        if let Some(b) = &removed {
            crate::budget::on_remove(b);
        }
        Ok(removed)
    }

    #[inline]
    pub fn get(&self, addr: u64) -> Option<BlockInfo> {
        self.shards[shard_of(addr)].table.lock().get(addr)
    }

    /// Gives the block at `addr` another allocating function and allocation stack (see
    /// `replace::prepare`: blocks made before the engine started through a program's own
    /// `operator new`). Nothing if there is no such block.
    pub fn reattribute(&self, addr: u64, func: AllocFn, stack: StackId) {
        let mut t = self.shards[shard_of(addr)].table.lock();
        if let Some(mut b) = t.get(addr) {
            b.func = func;
            b.stack = stack;
            t.insert(addr, b);
        }
    }

    /// Every block of the program (not oxgrind's internal ones).
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        // Sized first: a list grown by doubling would need up to three times its size at
        // once, at exit, when memory may be short.
        let count: usize = self
            .shards
            .iter()
            .map(|s| s.table.lock().len_at_most())
            .sum();
        let mut out = Vec::with_capacity(count);
        for shard in &self.shards {
            shard.table.lock().for_each(|addr, b| {
                if !b.internal {
                    out.push(LiveBlock {
                        addr,
                        size: b.size,
                        func: b.func,
                        stack: b.stack,
                    });
                }
            });
        }
        out
    }

    /// Forces every shard open: for a forked child, whose other threads are gone.
    ///
    /// # Safety
    /// Only in a single-threaded child right after `fork`.
    pub unsafe fn force_unlock_all(&self) {
        for s in &self.shards {
            // SAFETY: forwarded to the caller.
            unsafe { s.table.force_unlock() };
        }
    }
}

impl Default for BlockTable {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(a: &BlockInfo, b: &BlockInfo) -> bool {
        a.size == b.size
            && a.stack == b.stack
            && a.func == b.func
            && a.internal == b.internal
            && a.tool_word == b.tool_word
    }

    /// Every field of every block comes back as it went in, through inserts, replacements
    /// and removals: small and big sizes (the overflow table), every allocating function,
    /// addresses that do not pack, clustered addresses (long probe runs, many collisions).
    #[test]
    fn shard_table_finds_every_live_block_through_churn() {
        let mut t = ShardTable::new();
        let mut live = std::collections::BTreeMap::new();
        let info = |n: u64, x: u64| BlockInfo {
            size: match x % 7 {
                0 => SIZE_BIG + (x >> 20) % 3 - 1,
                1 => x >> 24,
                _ => n % 300,
            },
            stack: StackId((x >> 8) as u32),
            func: FUNCS[(x >> 3) as usize % FUNCS.len()],
            internal: x & (1 << 50) != 0,
            tool_word: (x >> 30) as u32,
        };
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let addr = match (x >> 60) % 16 {
                // Not 16-byte aligned, 0, above user space: not packed.
                0 => 0x5555_0000_0008 + (x % 64) * 16,
                1 => 0,
                2 => (1 << 47) + (x % 64) * 16,
                // Few distinct addresses, 16-aligned.
                _ => 0x5555_0000_0000 + (x % 3000) * 16,
            };
            if x & (1 << 40) != 0 {
                let b = info(step, x);
                let old = t.insert(addr, b);
                match (old, live.insert(addr, b)) {
                    (None, None) => {}
                    (Some(a), Some(b)) => assert!(same(&a, &b)),
                    _ => panic!("insert at {addr:#x}"),
                }
            } else {
                match (t.remove(addr), live.remove(&addr)) {
                    (None, None) => {}
                    (Some(a), Some(b)) => assert!(same(&a, &b)),
                    _ => panic!("remove at {addr:#x}"),
                }
            }
            assert!(t.len_at_most() >= live.len());
            if step % 9973 == 0 {
                for (&a, b) in &live {
                    assert!(same(&t.get(a).unwrap(), b));
                }
                let mut seen = std::collections::BTreeMap::new();
                t.for_each(|a, b| assert!(seen.insert(a, b).is_none()));
                assert_eq!(seen.len(), live.len());
                for (a, b) in &seen {
                    assert!(same(b, &live[a]));
                }
            }
        }
    }

    /// The entry a prefetch loads is the one a lookup of the address reads first.
    #[test]
    fn layout_gives_the_home_entry_of_an_address() {
        let mut t = ShardTable::new();
        assert_eq!(t.layout(), 0);
        for k in 0..1000u64 {
            t.insert(0x9000_0000 + k * 0x1230, BlockInfo::default());
        }
        let layout = t.layout();
        let addr = 0x7f00_dead_bee0;
        let shift = (layout & 0x7f) as u32;
        assert_eq!(shift, t.shift);
        assert_eq!(layout >> 7, t.entries.as_ptr() as u64);
        assert_eq!(home_in(shift, addr), {
            t.insert(addr, BlockInfo::default());
            t.find(addr).unwrap()
        });
    }
}
