//! The live-block table: every block the program holds, by address.
//!
//! Every `free` must find its block (size, allocation stack, which family allocated it), and
//! every `free` of an unknown address is an error to report rather than memory to hand to
//! glibc. The table is split into shards by address so threads rarely meet on one lock;
//! each shard is an address table of its own (`oxgrind_tool::addr_table`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use oxgrind_sys::lock::SpinLock;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
