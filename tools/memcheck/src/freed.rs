//! The freed-block queue: what Memcheck remembers of recently freed blocks, so that a later
//! double free, free of an interior pointer or realloc of a freed pointer can say
//! `Address 0x... is 0 bytes inside a block of size 10 free'd` with both stacks.
//!
//! Valgrind keeps freed blocks unavailable for reuse until `--freelist-vol` bytes have
//! been freed after them; blocks of at least `--freelist-big-blocks` bytes leave first. The
//! runtime keeps the memory itself (`Needs::freelist_vol`); this queue mirrors its policy
//! with the stacks, and is only searched when an error is being described. Threads feed it
//! through batches of their own ([`FreedBatches`]), so a free takes no process-wide lock.

use std::collections::VecDeque;

use oxgrind_tool::sync::SpinLock;
use oxgrind_tool::{Addr, StackId};

/// One freed block.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct FreedBlock {
    pub addr: Addr,
    pub size: u64,
    pub alloc_stack: StackId,
    pub free_stack: StackId,
}

/// Bounded FIFO of freed blocks, by volume.
#[derive(Debug)]
pub struct FreedQueue {
    limit: u64,
    big: u64,
    volume: u64,
    /// Small blocks, oldest first.
    small: VecDeque<FreedBlock>,
    /// Blocks of `big` bytes or more, oldest first; released before the small ones.
    large: VecDeque<FreedBlock>,
}

/// Memcheck's redzone: an address this close to a block is described relative to it.
pub const REDZONE: u64 = 16;

impl FreedQueue {
    pub fn new(limit: u64, big: u64) -> FreedQueue {
        FreedQueue {
            limit,
            big,
            volume: 0,
            small: VecDeque::new(),
            large: VecDeque::new(),
        }
    }

    pub fn push(&mut self, b: FreedBlock) {
        if b.size >= self.big {
            self.large.push_back(b);
        } else {
            self.small.push_back(b);
        }
        self.volume += b.size;
        while self.volume > self.limit {
            let Some(old) = self.large.pop_front().or_else(|| self.small.pop_front()) else {
                break;
            };
            self.volume -= old.size;
        }
    }

    /// A remembered block whose extent (plus redzones) contains `addr`, as Memcheck's
    /// `get_freed_block_bracketting` finds it: big blocks first, oldest first.
    pub fn bracketing(&self, addr: Addr) -> Option<&FreedBlock> {
        self.large.iter().chain(self.small.iter()).find(|b| {
            addr >= b.addr.saturating_sub(REDZONE)
                && addr < b.addr.saturating_add(b.size).saturating_add(REDZONE)
        })
    }

    pub fn len(&self) -> usize {
        self.small.len() + self.large.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fb(addr: u64, size: u64) -> FreedBlock {
        FreedBlock {
            addr,
            size,
            alloc_stack: StackId(1),
            free_stack: StackId(2),
        }
    }

    #[test]
    fn freed_block_is_found_from_inside_and_its_redzones() {
        let mut q = FreedQueue::new(1000, 100);
        q.push(fb(0x1000, 10));
        assert_eq!(q.bracketing(0x1000).map(|b| b.addr), Some(0x1000));
        assert_eq!(q.bracketing(0x1009).map(|b| b.addr), Some(0x1000));
        assert_eq!(q.bracketing(0x1000 - 16).map(|b| b.addr), Some(0x1000));
        assert_eq!(q.bracketing(0x1000 + 10 + 15).map(|b| b.addr), Some(0x1000));
        assert!(q.bracketing(0x1000 + 10 + 16).is_none());
    }

    #[test]
    fn oldest_blocks_leave_when_volume_exceeds_the_limit_big_ones_first() {
        let mut q = FreedQueue::new(100, 50);
        q.push(fb(0x1000, 40));
        q.push(fb(0x2000, 60)); // big
        assert_eq!(q.len(), 2);
        q.push(fb(0x3000, 10)); // 110 > 100: the big block goes first
        assert!(q.bracketing(0x2000).is_none());
        assert!(q.bracketing(0x1000).is_some());
        q.push(fb(0x4000, 55)); // big again: 105 -> it leaves itself
        assert!(q.bracketing(0x4000).is_none());
        q.push(fb(0x5000, 45)); // 95 ok
        q.push(fb(0x6000, 10)); // 105 -> the oldest small one leaves
        assert!(q.bracketing(0x1000).is_none());
        assert_eq!(q.len(), 3);
    }
}

/// The runtime's own freed-block queue, mirrored to know when a freed block's memory goes
/// back to glibc, so its shadow can be cleared first (see [`crate::shadow`]).
///
/// The runtime releases blocks oldest first once more than `--freelist-vol` bytes wait
/// (plain FIFO, unlike [`FreedQueue`]'s big-blocks-first order). This mirror keeps only
/// half that volume, so it lets a block go (and clears its shadow) no later than the
/// runtime does, even when the runtime queues a `realloc`'s old block before the tool hears
/// of it: a stale "freed" mark on memory glibc hands out or unmaps again would be reported
/// as an error in correct code, while clearing early only misses a use after free of a
/// block freed long ago.
#[derive(Debug, Default)]
pub struct ShadowQueue {
    /// (address, size, end of its chunk: see `shadow::chunk_end`).
    queue: VecDeque<(Addr, u64, Addr)>,
    bytes: u64,
    budget: u64,
}

impl ShadowQueue {
    pub fn new(freelist_vol: u64) -> ShadowQueue {
        ShadowQueue {
            queue: VecDeque::new(),
            bytes: 0,
            budget: freelist_vol / 2,
        }
    }

    /// Whether a freed block of `size` bytes stays in the queue at all (larger ones are
    /// cleared at once and not worth marking).
    pub fn keeps(&self, size: u64) -> bool {
        size <= self.budget
    }

    /// Queues a freed block; `release` gets every block that leaves, oldest first (the new
    /// one itself when it is too large to keep).
    pub fn push(
        &mut self,
        addr: Addr,
        size: u64,
        end: Addr,
        release: &mut impl FnMut(Addr, u64, Addr),
    ) {
        self.queue.push_back((addr, size, end));
        self.bytes += size;
        while self.bytes > self.budget {
            let Some((a, s, e)) = self.queue.pop_front() else {
                break;
            };
            self.bytes -= s;
            release(a, s, e);
        }
    }
}

#[cfg(test)]
mod shadow_queue_tests {
    use super::*;

    #[test]
    fn shadow_queue_releases_oldest_first_at_half_the_volume() {
        let mut q = ShadowQueue::new(200);
        let mut out = Vec::new();
        q.push(0x1000, 60, 0, &mut |a, _, _| out.push(a));
        q.push(0x2000, 30, 0, &mut |a, _, _| out.push(a));
        assert!(out.is_empty());
        q.push(0x3000, 20, 0, &mut |a, _, _| out.push(a)); // 110 > 100
        assert_eq!(out, [0x1000]);
        assert!(!q.keeps(101));
        q.push(0x4000, 150, 0, &mut |a, _, _| out.push(a));
        assert_eq!(out, [0x1000, 0x2000, 0x3000, 0x4000]);
    }
}

/// A freed block on its way into the queues: the block, and the end of its chunk for the
/// [`ShadowQueue`] (0 when the shadow is not kept).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Freed {
    pub block: FreedBlock,
    pub chunk_end: Addr,
}

/// Most frees a thread keeps before handing them to the shared queues ([`FreedBatches`]).
///
/// Half the runtime's batch (`oxgrind-runtime`'s `blocks::BATCH`, 32, and a sixteenth of
/// `--freelist-vol`), so that a block reaches the [`ShadowQueue`] before the runtime's queue
/// even when the two counts drift by a few events (frees the tool does not see, the order of
/// a `realloc`'s two halves): its shadow is then cleared before glibc may reuse its memory.
pub const BATCH: usize = 16;

/// Each thread's recent frees, before they join the queues that Memcheck keeps under its
/// state lock ([`FreedQueue`], [`ShadowQueue`]): that lock is taken once per [`BATCH`]
/// frees instead of once per free, and threads freeing at once do not meet on it.
///
/// Blocks in a batch are still "recently freed": whoever describes an address first moves
/// every batch into the queues ([`FreedBatches::drain`]), each thread's frees in its order.
/// For one thread, the queues then hold exactly what they would with a lock per free.
pub struct FreedBatches {
    volume: u64,
    /// Threads are spread over the batches by their thread pointer, so a thread always
    /// uses the same one (its frees keep their order) and threads rarely share one.
    batches: Box<[SpinLock<Batch>]>,
}

/// A batch [`FreedBatches::push`] took out, on its way into the queues.
pub struct FullBatch {
    items: [Freed; BATCH],
    len: usize,
}

impl FullBatch {
    /// Its frees, oldest first.
    pub fn blocks(&self) -> &[Freed] {
        &self.items[..self.len]
    }
}

/// One thread's pending frees, oldest first.
struct Batch {
    items: [Freed; BATCH],
    len: usize,
    bytes: u64,
}

const EMPTY: Freed = Freed {
    block: FreedBlock {
        addr: 0,
        size: 0,
        alloc_stack: StackId(0),
        free_stack: StackId(0),
    },
    chunk_end: 0,
};

impl FreedBatches {
    /// `volume`: `--freelist-vol`, which bounds the bytes a batch holds.
    pub fn new(volume: u64) -> FreedBatches {
        FreedBatches {
            volume,
            batches: (0..crate::totals::SLOTS)
                .map(|_| {
                    SpinLock::new(Batch {
                        items: [EMPTY; BATCH],
                        len: 0,
                        bytes: 0,
                    })
                })
                .collect(),
        }
    }

    /// Whether a freed block of `size` bytes is marked in the shadow at all: the
    /// [`ShadowQueue`]'s own test ([`ShadowQueue::keeps`]), answered without its lock.
    pub fn keeps_shadow(&self, size: u64) -> bool {
        size <= self.volume / 2
    }

    fn mine(&self) -> &SpinLock<Batch> {
        &self.batches[crate::totals::thread_slot()]
    }

    /// Adds a free to the calling thread's batch; when the batch is full, returns all of
    /// it, oldest first, for the caller to move into the queues (with no batch lock held).
    pub fn push(&self, f: Freed) -> Option<FullBatch> {
        let mine = self.mine();
        let mut b = mine.lock();
        let i = b.len;
        b.items[i] = f;
        b.len += 1;
        b.bytes += f.block.size;
        if b.len < BATCH && b.bytes <= self.volume / 32 {
            return None;
        }
        let n = b.len;
        let mut out = FullBatch {
            items: [EMPTY; BATCH],
            len: n,
        };
        out.items[..n].copy_from_slice(&b.items[..n]);
        b.len = 0;
        b.bytes = 0;
        Some(out)
    }

    /// Hands every thread's pending frees to `f`, each thread's oldest first, and empties
    /// the batches: before an address is described.
    pub fn drain(&self, mut f: impl FnMut(&[Freed])) {
        for t in self.batches.iter() {
            let mut b = t.lock();
            let n = b.len;
            f(&b.items[..n]);
            b.len = 0;
            b.bytes = 0;
        }
    }
}

#[cfg(test)]
mod batch_tests {
    use super::*;

    fn freed(addr: u64) -> Freed {
        Freed {
            block: FreedBlock {
                addr,
                size: 8,
                alloc_stack: StackId(1),
                free_stack: StackId(2),
            },
            chunk_end: 0,
        }
    }

    #[test]
    fn a_threads_frees_reach_the_queue_in_order_by_batch_or_drain() {
        let batches = FreedBatches::new(20_000_000);
        let mut seen = Vec::new();
        for i in 0..(BATCH as u64 + 3) {
            if let Some(b) = batches.push(freed(0x1000 + i * 16)) {
                seen.extend(b.blocks().iter().map(|f| f.block.addr))
            }
        }
        assert_eq!(seen.len(), BATCH, "one full batch flushed");
        batches.drain(|b| seen.extend(b.iter().map(|f| f.block.addr)));
        let expected: Vec<u64> = (0..(BATCH as u64 + 3)).map(|i| 0x1000 + i * 16).collect();
        assert_eq!(seen, expected);
        let mut again = Vec::new();
        batches.drain(|b| again.extend_from_slice(b));
        assert!(again.is_empty(), "drained batches are empty");
    }

    #[test]
    fn two_instances_on_one_thread_keep_separate_batches() {
        let a = FreedBatches::new(20_000_000);
        let b = FreedBatches::new(20_000_000);
        assert!(a.push(freed(0x10)).is_none(), "not full");
        assert!(b.push(freed(0x20)).is_none(), "not full");
        let mut from_a = Vec::new();
        a.drain(|x| from_a.extend(x.iter().map(|f| f.block.addr)));
        assert_eq!(from_a, [0x10]);
    }
}
