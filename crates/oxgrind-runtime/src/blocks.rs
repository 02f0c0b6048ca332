//! The live-block table: every block the program holds, by address.
//!
//! Every `free` must find its block (size, allocation stack, which family allocated it), and
//! every `free` of an unknown address is an error to report rather than memory to hand to
//! glibc. The table is split into shards by address so threads rarely meet on one lock;
//! each shard is an address table of its own (`oxgrind_tool::addr_table`).
//! Freed blocks may also wait in a bounded queue ([`FreedQueue`]) before glibc gets them
//! back, so their addresses are not reused at once (Memcheck's `--freelist-vol`); threads
//! feed it in batches, and glibc's `free` never runs under its lock.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use oxgrind_sys::lock::SpinLock;
use oxgrind_tool::addr_table::AddrTable;
use oxgrind_tool::fifo::ChunkedFifo;
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
    /// The tool's number for the block (`Tool::block_word`), handed back when it is freed.
    /// 32 bits, so that an entry stays 32 bytes, two to a cache line.
    pub tool_word: u32,
}

// An entry of a shard table (address and `BlockInfo`) is 32 bytes.
const _: () = assert!(core::mem::size_of::<BlockInfo>() == 24);

/// An empty entry's value in the shard tables (never read as a block).
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

const SHARDS: usize = 64;

/// One shard on cache lines of its own: a shard's lock word and table header are written
/// by every insert and remove, and with shards packed side by side two threads working in
/// different shards still fought over a shared line (128 bytes: the spatial prefetcher
/// pulls lines in pairs).
#[repr(align(128))]
struct Shard {
    table: SpinLock<AddrTable<BlockInfo>>,
    /// The table's `AddrTable::layout`, stored under the lock when it changes and read
    /// without it by [`BlockTable::prefetch`].
    layout: AtomicU64,
}

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
            table: SpinLock::new(AddrTable::new()),
            layout: AtomicU64::new(0),
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
        let layout = self.shards[shard_of(addr)].layout.load(Ordering::Relaxed);
        AddrTable::<BlockInfo>::prefetch_home(layout, addr);
    }

    #[inline]
    pub fn insert(&self, addr: u64, info: BlockInfo) {
        let shard = &self.shards[shard_of(addr)];
        let replaced = {
            let mut t = shard.table.lock();
            let replaced = t.insert(addr, info);
            let layout = t.layout();
            if shard.layout.load(Ordering::Relaxed) != layout {
                shard.layout.store(layout, Ordering::Relaxed);
            }
            replaced
        };
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

    #[inline]
    pub fn get(&self, addr: u64) -> Option<BlockInfo> {
        self.shards[shard_of(addr)].table.lock().get(addr)
    }

    /// Every block of the program (not oxgrind's internal ones).
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        // Sized first: a list grown by doubling would need up to three times its size at
        // once, at exit, when memory may be short.
        let count: usize = self.shards.iter().map(|s| s.table.lock().len()).sum();
        let mut out = Vec::with_capacity(count);
        for shard in &self.shards {
            let s = shard.table.lock();
            out.extend(
                s.iter()
                    .filter(|(_, b)| !b.internal)
                    .map(|(addr, b)| LiveBlock {
                        addr,
                        size: b.size,
                        func: b.func,
                        stack: b.stack,
                    }),
            );
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

/// Freed blocks held back from glibc, oldest first, up to a byte budget (`--freelist-vol`).
///
/// One queue for the process, as Valgrind's, so a block's turn to go back to glibc depends on
/// what every thread freed after it. A thread does not take the queue's lock for every free:
/// it collects its frees in a small batch (one of [`BATCHES`], chosen by its thread pointer,
/// each behind its own lock, which threads rarely share) and moves the batch into the queue
/// in one go, taking out the blocks that must leave. It gives those to glibc after dropping the
/// lock, and one or two per free rather than all at once: a burst of frees would overflow
/// glibc's per-thread cache (7 chunks per size) into its slower bins, which touch the heads
/// of neighbouring chunks (costly under Memcheck, whose shadow marks them).
///
/// So a block goes back to glibc at most about [`BATCH`] frees (and a sixteenth of the
/// budget) later than with a lock per free, never earlier; Memcheck's own mirror of the
/// queue relies on that (it clears a freed block's shadow at half the budget).
pub struct FreedQueue {
    shared: SpinLock<SharedQueue>,
    budget: AtomicU64,
    batches: [SpinLock<Batch>; BATCHES],
}

struct SharedQueue {
    /// (address, size), oldest first: in chunks, which cost what they hold (a `VecDeque`
    /// takes up to twice that, and three times while it grows).
    queue: ChunkedFifo<(u64, u64)>,
    bytes: u64,
}

/// Most blocks a thread's batch holds before it joins the shared queue.
pub const BATCH: usize = 32;
/// Most blocks a batch holds that have left the queue but not yet gone to glibc.
const LEAVING: usize = 4 * BATCH;
/// Batches: threads are spread over them by their thread pointer.
const BATCHES: usize = 64;

/// Pending frees not yet in the shared queue, and blocks taken out of the queue that glibc
/// has not been given yet (a ring). One per group of threads (by thread pointer, see
/// [`FreedQueue`]), so a thread always uses the same one and its frees keep their order.
struct Batch {
    blocks: [(u64, u64); BATCH],
    len: usize,
    bytes: u64,
    /// (address, size).
    leaving: [(u64, u64); LEAVING],
    leaving_head: usize,
    leaving_len: usize,
}

impl Batch {
    /// Moves the queue's oldest blocks into this batch's ring while the queue is over
    /// `budget` and the ring has room: they leave in order, never before their turn.
    fn take_over_budget(&mut self, shared: &mut SharedQueue, budget: u64) {
        while shared.bytes > budget && self.leaving_len < LEAVING {
            let Some((a, s)) = shared.queue.pop_front() else {
                break;
            };
            shared.bytes -= s;
            let slot = (self.leaving_head + self.leaving_len) % LEAVING;
            self.leaving[slot] = (a, s);
            self.leaving_len += 1;
        }
    }
}

impl FreedQueue {
    pub const fn new() -> Self {
        const EMPTY: SpinLock<Batch> = SpinLock::new(Batch {
            blocks: [(0, 0); BATCH],
            len: 0,
            bytes: 0,
            leaving: [(0, 0); LEAVING],
            leaving_head: 0,
            leaving_len: 0,
        });
        FreedQueue {
            shared: SpinLock::new(SharedQueue {
                queue: ChunkedFifo::new((0, 0)),
                bytes: 0,
            }),
            budget: AtomicU64::new(0),
            batches: [EMPTY; BATCHES],
        }
    }

    pub fn set_budget(&self, budget: u64) {
        self.budget.store(budget, Ordering::Relaxed);
    }

    /// Queues the freed block `(addr, size)`; `release` gets the blocks that must now
    /// really go back to glibc, as (address, size), called with no lock held.
    pub fn push(&self, addr: u64, size: u64, release: &mut impl FnMut(u64, u64)) {
        let budget = self.budget.load(Ordering::Relaxed);
        if budget == 0 {
            release(addr, size);
            return;
        }
        // Thread control blocks are page-aligned and a few pages apart.
        let tp = crate::guard::thread_pointer();
        let which = ((tp >> 12) ^ (tp >> 20)) as usize % BATCHES;
        let mut now = [(0u64, 0u64); 2];
        let mut n_now = 0;
        // The ring was full and the queue is still over budget: see below.
        let mut behind = false;
        {
            let mut t = self.batches[which].lock();
            let i = t.len;
            t.blocks[i] = (addr, size);
            t.len += 1;
            t.bytes += size;
            if t.len == BATCH || t.bytes > budget / 16 {
                let mut shared = self.shared.lock();
                for k in 0..t.len {
                    let (a, s) = t.blocks[k];
                    shared.queue.push_back((a, s));
                    shared.bytes += s;
                }
                t.len = 0;
                t.bytes = 0;
                // Blocks that do not fit in the ring stay queued (over budget) until this
                // or another batch's next turn: a little later, never earlier.
                t.take_over_budget(&mut shared, budget);
                behind = shared.bytes > budget;
            }
            // Two per free: the ring empties faster than batches fill it.
            while n_now < now.len() && t.leaving_len > 0 {
                now[n_now] = t.leaving[t.leaving_head];
                t.leaving_head = (t.leaving_head + 1) % LEAVING;
                t.leaving_len -= 1;
                n_now += 1;
            }
            // This free's leavers and the next free's: glibc's `free` of each reads its
            // chunk header and writes the first words of the block (its per-thread cache's
            // links), lines last touched a whole budget of frees ago, so missed in every
            // cache (a tenth of Memcheck's time on bench alloc in glibc's `free`); loaded
            // meanwhile (the hook gives this free's leavers to glibc after the tool's work).
            for &(a, _) in &now[..n_now] {
                prefetch_chunk(a);
            }
            for k in 0..now.len().min(t.leaving_len) {
                prefetch_chunk(t.leaving[(t.leaving_head + k) % LEAVING].0);
            }
        }
        for &(a, s) in &now[..n_now] {
            release(a, s);
        }
        // Two per free keeps up by count, not by bytes: after many small frees, frees of
        // large blocks pushed the queue far over its budget while its small blocks left two
        // at a time (bench sqlite3, 4 KiB pages freed behind 70,000 small blocks: 80 MB
        // held for a 2 MB budget, and glibc's heap grew by as much, since none of it could
        // be reused). Then what is over budget leaves now, oldest first, a ring at a time.
        while behind {
            let mut out = [(0u64, 0u64); LEAVING];
            let mut n = 0;
            {
                let mut t = self.batches[which].lock();
                let mut shared = self.shared.lock();
                if shared.bytes <= budget {
                    break;
                }
                while t.leaving_len > 0 {
                    out[n] = t.leaving[t.leaving_head];
                    n += 1;
                    t.leaving_head = (t.leaving_head + 1) % LEAVING;
                    t.leaving_len -= 1;
                }
                t.take_over_budget(&mut shared, budget);
                behind = shared.bytes > budget;
            }
            for &(a, s) in &out[..n] {
                release(a, s);
            }
        }
    }
}

/// Starts loading, for writing, the lines of glibc's chunk header before `block` and of
/// the block's first words.
#[inline(always)]
fn prefetch_chunk(block: u64) {
    for a in [block.wrapping_sub(16), block.wrapping_add(8)] {
        // SAFETY: a prefetch never faults and changes nothing the program can see.
        unsafe {
            core::arch::asm!("prefetchw [{}]", in(reg) a, options(nostack, readonly, preserves_flags));
        }
    }
}

impl Default for FreedQueue {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_blocks_leave_oldest_first_once_over_budget_never_early() {
        let q = FreedQueue::new();
        q.set_budget(1600); // batches of at most 100 bytes or BATCH blocks
        let mut released = Vec::new();
        for i in 0..200u64 {
            q.push(0x1000 + i * 16, 10, &mut |a, _| released.push(a));
            // Never more released than the budget allows: what stays is at least the
            // budget's worth of the most recent frees (or all of them).
            let kept = (i + 1) - released.len() as u64;
            assert!(
                kept * 10 >= 1600.min((i + 1) * 10),
                "released too early at {i}"
            );
            // And no more than a batch (and the blocks waiting in the ring) late.
            assert!(
                kept * 10 <= 1600 + 100 + 10 + 20 * 10,
                "held too long at {i}"
            );
        }
        let expected: Vec<u64> = (0..released.len() as u64)
            .map(|i| 0x1000 + i * 16)
            .collect();
        assert_eq!(released, expected, "oldest first");
    }

    #[test]
    fn shard_table_finds_every_live_block_through_churn() {
        let mut t = AddrTable::<BlockInfo>::new();
        let mut live = std::collections::BTreeMap::new();
        let info = |n: u64| BlockInfo {
            size: n,
            stack: StackId(n as u32),
            func: AllocFn::Malloc,
            internal: false,
            tool_word: n as u32,
        };
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few distinct addresses (clustered, 16-aligned): long probe runs, many collisions.
            let addr = 0x5555_0000_0000 + (x % 3000) * 16;
            if x & (1 << 40) != 0 {
                assert_eq!(
                    t.insert(addr, info(step)).map(|b| b.size),
                    live.insert(addr, step)
                );
            } else {
                assert_eq!(t.remove(addr).map(|b| b.size), live.remove(&addr));
            }
            assert_eq!(t.len(), live.len());
            if step % 9973 == 0 {
                for (&a, &n) in &live {
                    assert_eq!(t.get(a).map(|b| b.size), Some(n));
                }
                assert_eq!(t.iter().count(), live.len());
            }
        }
    }

    #[test]
    fn large_frees_after_many_small_ones_keep_the_queue_near_its_budget() {
        let q = FreedQueue::new();
        let budget = 1_000_000;
        q.set_budget(budget);
        let (mut held, mut pushed) = (0u64, 0u64);
        let mut released = Vec::new();
        // 40,000 blocks of 32 bytes (the queue full of 31,250 small blocks), then 3,000
        // of 4 KiB: two leaving per free would have let the queue grow to 12 MB.
        for i in 0..43_000u64 {
            let size = if i < 40_000 { 32 } else { 4096 };
            held += size;
            pushed += size;
            q.push(0x1000 + i * 0x2000, size, &mut |a, s| {
                held -= s;
                released.push(a);
            });
            // Never more released than the budget allows (less the block that crossed it).
            assert!(
                held + 4096 >= budget.min(pushed),
                "released too early at {i}"
            );
            // The queue, a batch's worth (a sixteenth), and a ring of due blocks.
            assert!(
                held <= budget + budget / 16 + 4096 + LEAVING as u64 * 4096,
                "held {held} at {i}"
            );
        }
        let expected: Vec<u64> = (0..released.len() as u64)
            .map(|i| 0x1000 + i * 0x2000)
            .collect();
        assert_eq!(released, expected, "oldest first");
    }

    #[test]
    fn without_a_budget_every_block_goes_back_at_once() {
        let q = FreedQueue::new();
        let mut released = Vec::new();
        q.push(0x2000, 8, &mut |a, _| released.push(a));
        assert_eq!(released, [0x2000]);
    }
}
