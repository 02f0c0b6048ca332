//! The live-block table: every block the program holds, by address.
//!
//! Every `free` must find its block (size, allocation stack, which family allocated it), and
//! every `free` of an unknown address is an error to report rather than memory to hand to
//! glibc. The table is split into shards by address so threads rarely meet on one lock.
//! Freed blocks may also wait in a bounded queue ([`FreedQueue`]) before glibc gets them
//! back, so their addresses are not reused at once (Memcheck's `--freelist-vol`).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use oxgrind_sys::lock::SpinLock;
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
}

const SHARDS: usize = 64;

pub struct BlockTable {
    shards: [SpinLock<Option<AddrMap<BlockInfo>>>; SHARDS],
}

#[inline]
fn shard_of(addr: u64) -> usize {
    // Blocks are 16-byte aligned; mix the next bits so neighbours land apart.
    ((addr >> 4) ^ (addr >> 12) ^ (addr >> 20)) as usize % SHARDS
}

impl BlockTable {
    pub const fn new() -> Self {
        const EMPTY: SpinLock<Option<AddrMap<BlockInfo>>> = SpinLock::new(None);
        BlockTable {
            shards: [EMPTY; SHARDS],
        }
    }

    #[inline]
    pub fn insert(&self, addr: u64, info: BlockInfo) {
        let mut s = self.shards[shard_of(addr)].lock();
        s.get_or_insert_with(AddrMap::default).insert(addr, info);
    }

    #[inline]
    pub fn remove(&self, addr: u64) -> Option<BlockInfo> {
        let mut s = self.shards[shard_of(addr)].lock();
        s.as_mut()?.remove(&addr)
    }

    #[inline]
    pub fn get(&self, addr: u64) -> Option<BlockInfo> {
        let s = self.shards[shard_of(addr)].lock();
        s.as_ref()?.get(&addr).copied()
    }

    /// Every block of the program (not oxgrind's internal ones).
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let s = shard.lock();
            if let Some(m) = s.as_ref() {
                out.extend(
                    m.iter()
                        .filter(|(_, b)| !b.internal)
                        .map(|(&addr, b)| LiveBlock {
                            addr,
                            size: b.size,
                            func: b.func,
                            stack: b.stack,
                        }),
                );
            }
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
            unsafe { s.force_unlock() };
        }
    }
}

impl Default for BlockTable {
    fn default() -> Self {
        Self::new()
    }
}

/// Freed blocks held back from glibc, oldest first, up to a byte budget.
pub struct FreedQueue {
    queue: VecDeque<(u64, u64)>,
    bytes: u64,
    budget: u64,
}

impl FreedQueue {
    pub const fn new() -> Self {
        FreedQueue {
            queue: VecDeque::new(),
            bytes: 0,
            budget: 0,
        }
    }

    pub fn set_budget(&mut self, budget: u64) {
        self.budget = budget;
    }

    /// Queues `(addr, size)` and returns the blocks that must now really be released.
    pub fn push(&mut self, addr: u64, size: u64, release: &mut impl FnMut(u64)) {
        if self.budget == 0 {
            release(addr);
            return;
        }
        self.queue.push_back((addr, size));
        self.bytes += size;
        while self.bytes > self.budget {
            let Some((a, s)) = self.queue.pop_front() else {
                break;
            };
            self.bytes -= s;
            release(a);
        }
    }

    /// Whether `addr` lies inside a queued (freed, not yet released) block.
    pub fn contains(&self, addr: u64) -> bool {
        self.queue
            .iter()
            .any(|&(a, s)| addr >= a && addr < a + s.max(1))
    }
}

impl Default for FreedQueue {
    fn default() -> Self {
        Self::new()
    }
}
