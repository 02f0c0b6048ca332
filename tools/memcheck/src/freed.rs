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

use oxgrind_tool::fifo::ChunkedFifo;
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

/// Memcheck's redzone: an address this close to a block is described relative to it.
pub const REDZONE: u64 = 16;

/// Valgrind's freed-block queue, bounded by volume (`--freelist-vol`): when it holds too
/// much, blocks of at least `--freelist-big-blocks` bytes leave first, then the oldest.
/// Only searched when an error is being described ([`FreedQueue::bracketing`]).
///
/// One FIFO of every block in the order of their frees, in [`ChunkedFifo`]s (its memory
/// follows what it holds; a `VecDeque` takes up to twice that and copies itself to grow);
/// a big block that leaves before its turn is marked dropped in place, and the small
/// ones leave from the front. A freed block's shadow is not this queue's business: it
/// lasts while the runtime holds the memory (`Tool::on_release`).
pub struct FreedQueue {
    limit: u64,
    big: u64,
    blocks: ChunkedFifo<FreedBlock>,
    /// Whether each block left the queue out of order (a big one).
    dropped: ChunkedFifo<bool>,
    /// The sequence number of the first entry (frees are numbered from 0).
    first: u64,
    bytes: u64,
    len: usize,
    /// Big blocks still in the queue, by sequence number, oldest first.
    big_seqs: VecDeque<u64>,
    /// Entries marked dropped not yet let go from the front: while none is, the front is
    /// never a dropped one, and [`FreedQueue::drop_front_dropped`] has nothing to look at
    /// (its look at the front of two queues was 40 of the instructions Memcheck adds per
    /// malloc/free pair of bench alloc, whose blocks are all small).
    dropped_held: usize,
}

impl FreedQueue {
    /// `limit`: `--freelist-vol`; `big`: `--freelist-big-blocks`.
    pub fn new(limit: u64, big: u64) -> FreedQueue {
        FreedQueue {
            limit,
            big,
            blocks: ChunkedFifo::new(FreedBlock {
                addr: 0,
                size: 0,
                alloc_stack: StackId(0),
                free_stack: StackId(0),
            }),
            dropped: ChunkedFifo::new(false),
            first: 0,
            bytes: 0,
            len: 0,
            big_seqs: VecDeque::new(),
            dropped_held: 0,
        }
    }

    pub fn push(&mut self, b: FreedBlock) {
        let seq = self.first + self.blocks.len() as u64;
        self.blocks.push_back(b);
        self.dropped.push_back(false);
        if b.size >= self.big {
            self.big_seqs.push_back(seq);
        }
        self.bytes += b.size;
        self.len += 1;
        while self.bytes > self.limit {
            if let Some(s) = self.big_seqs.pop_front() {
                let i = (s - self.first) as usize;
                *self.dropped.get_mut(i) = true;
                self.dropped_held += 1;
                self.bytes -= self.blocks.get(i).size;
            } else {
                // Every big block before it dropped: the first one not dropped is the
                // oldest small one.
                self.drop_front_dropped();
                let old = self.blocks.pop_front();
                self.dropped.pop_front();
                self.first += 1;
                self.bytes -= old.map_or(0, |b| b.size);
            }
            self.len -= 1;
        }
        self.drop_front_dropped();
    }

    /// Lets the entries of blocks that already left go from the front.
    #[inline]
    fn drop_front_dropped(&mut self) {
        while self.dropped_held > 0 && !self.dropped.is_empty() && *self.dropped.get(0) {
            self.blocks.pop_front();
            self.dropped.pop_front();
            self.first += 1;
            self.dropped_held -= 1;
        }
    }

    /// A remembered block whose extent (plus redzones) contains `addr`, as Memcheck's
    /// `get_freed_block_bracketting` finds it: big blocks first, oldest first.
    pub fn bracketing(&self, addr: Addr) -> Option<FreedBlock> {
        let near = |b: &FreedBlock| {
            addr >= b.addr.saturating_sub(REDZONE)
                && addr < b.addr.saturating_add(b.size).saturating_add(REDZONE)
        };
        let big = self
            .big_seqs
            .iter()
            .map(|&s| *self.blocks.get((s - self.first) as usize));
        let small = self
            .blocks
            .iter()
            .zip(self.dropped.iter())
            .filter(|(b, &d)| !d && b.size < self.big)
            .map(|(b, _)| *b);
        big.chain(small).find(near)
    }

    /// How many blocks the queue holds.
    pub fn len(&self) -> usize {
        self.len
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

    #[test]
    fn big_blocks_are_searched_first_then_the_oldest() {
        let mut q = FreedQueue::new(1000, 50);
        q.push(fb(0x1000, 16));
        q.push(fb(0x1000, 8));
        q.push(fb(0x1000, 64)); // big: found first
        assert_eq!(q.bracketing(0x1004).map(|b| b.size), Some(64));
        let mut q = FreedQueue::new(1000, 50);
        q.push(fb(0x1000, 16));
        q.push(fb(0x1000, 8));
        assert_eq!(q.bracketing(0x1004).map(|b| b.size), Some(16), "oldest");
    }

    /// The queue against the two plain queues (small and big blocks) it replaced, on a
    /// long random run across many chunks: the same blocks, found in the same order.
    #[test]
    fn one_fifo_matches_two_plain_queues() {
        let (limit, big) = (40_000u64, 3_000u64);
        let mut q = FreedQueue::new(limit, big);
        let (mut small, mut large) = (VecDeque::new(), VecDeque::<FreedBlock>::new());
        let mut vol = 0u64;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for i in 0..60_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let size = match x % 100 {
                0 => 2_000 + x % 30_000,
                1..=30 => 1 + x % 16,
                _ => 16 + (x >> 8) % 200,
            };
            let addr = 0x10_0000 + (x >> 20) % 5_000 * 16;
            let b = FreedBlock {
                addr,
                size,
                alloc_stack: StackId(i as u32),
                free_stack: StackId(i as u32 + 1),
            };
            q.push(b);
            // The two queues as they were.
            if size >= big {
                large.push_back(b);
            } else {
                small.push_back(b);
            }
            vol += size;
            while vol > limit {
                let Some(old) = large.pop_front().or_else(|| small.pop_front()) else {
                    break;
                };
                vol -= old.size;
            }
            assert_eq!(q.len(), small.len() + large.len(), "at {i}");
            if i % 997 == 0 {
                for probe in (0x10_0000 - 32..0x10_0000 + 5_000 * 16 + 400).step_by(40) {
                    let plain = large.iter().chain(small.iter()).find(|b| {
                        probe >= b.addr.saturating_sub(REDZONE) && probe < b.addr + b.size + REDZONE
                    });
                    assert_eq!(q.bracketing(probe), plain.copied(), "{probe:#x} at {i}");
                }
            }
        }
        assert!(
            q.blocks.chunks_held() <= q.blocks.len() / oxgrind_tool::fifo::CHUNK + 3,
            "no emptied chunk kept but the spare"
        );
    }
}

/// Most frees a thread keeps before handing them to the shared queues ([`FreedBatches`]).
///
/// (And at most a thirty-second of `--freelist-vol`.)
pub const BATCH: usize = 16;

/// Each thread's recent frees, before they join the queues that Memcheck keeps under its
/// state lock ([`FreedQueue`]): that lock is taken once per [`BATCH`]
/// frees instead of once per free, and threads freeing at once do not meet on it.
///
/// Blocks in a batch are still "recently freed": whoever describes an address first moves
/// every batch into the queues ([`FreedBatches::drain`]), each thread's frees in its order.
/// For one thread, the queues then hold exactly what they would with a lock per free.
pub struct FreedBatches {
    volume: u64,
    /// Threads are spread over the batches by their thread pointer, so a thread always
    /// uses the same one (its frees keep their order) and threads rarely share one.
    batches: Box<[OwnLines]>,
}

/// A batch on cache lines of its own: its lock, length and byte count are written at every
/// free, and packed side by side two threads' batches shared a line (128 bytes: the
/// spatial prefetcher pulls lines in pairs).
#[repr(align(128))]
struct OwnLines(SpinLock<Batch>);

/// A batch [`FreedBatches::push`] took out, on its way into the queues.
pub struct FullBatch {
    items: [FreedBlock; BATCH],
    len: usize,
}

impl FullBatch {
    /// Its frees, oldest first.
    pub fn blocks(&self) -> &[FreedBlock] {
        &self.items[..self.len]
    }
}

/// One thread's pending frees, oldest first.
struct Batch {
    items: [FreedBlock; BATCH],
    len: usize,
    bytes: u64,
}

const EMPTY: FreedBlock = FreedBlock {
    addr: 0,
    size: 0,
    alloc_stack: StackId(0),
    free_stack: StackId(0),
};

impl FreedBatches {
    /// `volume`: `--freelist-vol`, which bounds the bytes a batch holds.
    pub fn new(volume: u64) -> FreedBatches {
        FreedBatches {
            volume,
            batches: (0..crate::totals::SLOTS)
                .map(|_| {
                    OwnLines(SpinLock::new(Batch {
                        items: [EMPTY; BATCH],
                        len: 0,
                        bytes: 0,
                    }))
                })
                .collect(),
        }
    }

    fn mine(&self) -> &SpinLock<Batch> {
        &self.batches[crate::totals::thread_slot()].0
    }

    /// Adds a free to the calling thread's batch; when the batch is full, returns all of
    /// it, oldest first, for the caller to move into the queues (with no batch lock held).
    pub fn push(&self, f: FreedBlock) -> Option<FullBatch> {
        let mine = self.mine();
        let mut b = mine.lock();
        let i = b.len;
        b.items[i] = f;
        b.len += 1;
        b.bytes += f.size;
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
    pub fn drain(&self, mut f: impl FnMut(&[FreedBlock])) {
        for t in self.batches.iter() {
            let mut b = t.0.lock();
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

    fn freed(addr: u64) -> FreedBlock {
        FreedBlock {
            addr,
            size: 8,
            alloc_stack: StackId(1),
            free_stack: StackId(2),
        }
    }

    #[test]
    fn a_threads_frees_reach_the_queue_in_order_by_batch_or_drain() {
        let batches = FreedBatches::new(20_000_000);
        let mut seen = Vec::new();
        for i in 0..(BATCH as u64 + 3) {
            if let Some(b) = batches.push(freed(0x1000 + i * 16)) {
                seen.extend(b.blocks().iter().map(|f| f.addr))
            }
        }
        assert_eq!(seen.len(), BATCH, "one full batch flushed");
        batches.drain(|b| seen.extend(b.iter().map(|f| f.addr)));
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
        a.drain(|x| from_a.extend(x.iter().map(|f| f.addr)));
        assert_eq!(from_a, [0x10]);
    }
}
