//! The freed-block queue: what Memcheck remembers of recently freed blocks, so that a later
//! double free, free of an interior pointer or realloc of a freed pointer can say
//! `Address 0x... is 0 bytes inside a block of size 10 free'd` with both stacks.
//!
//! Valgrind keeps freed blocks unavailable for reuse until `--freelist-vol` bytes have
//! been freed after them; blocks of at least `--freelist-big-blocks` bytes leave first. The
//! runtime keeps the memory itself (`Needs::freelist_vol`); this queue mirrors its policy
//! with the stacks, is only searched when an error is being described, and also says when
//! a freed block's shadow goes back to ordinary memory. Threads feed it through batches of
//! their own ([`FreedBatches`]), so a free takes no process-wide lock.

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

/// Every freed block Memcheck remembers, in one FIFO of compact entries, read two ways:
///
/// * as the *description queue*, Valgrind's freed-block queue bounded by volume
///   (`--freelist-vol`): when it holds too much, blocks of at least `--freelist-big-blocks`
///   bytes leave first, then the oldest; only searched when an error is being described
///   ([`FreedQueue::bracketing`]);
/// * as the *shadow window*, which decides when a freed block's shadow goes back to
///   ordinary memory (`release` of [`FreedQueue::push`]). The runtime keeps the memory
///   itself (`Needs::freelist_vol`, plain FIFO), and the window keeps only half that
///   volume, so it lets a block go (and clears its shadow) no later than the runtime does,
///   even when the runtime queues a `realloc`'s old block before the tool hears of it: a
///   stale "freed" mark on memory glibc hands out or unmaps again would be reported as an
///   error in correct code, while clearing early only misses a use after free of a block
///   freed long ago. Only blocks whose shadow was marked count (`chunk_end` given).
///
/// One entry serves both (they were two queues of 24-byte entries, each a `VecDeque` that
/// doubles: up to four times the bytes of one), and entries live in [`ChunkedFifo`]s: the
/// queue takes what it holds and a chunk, and never copies itself to grow.
pub struct FreedQueue {
    limit: u64,
    big: u64,
    shadow_budget: u64,
    blocks: ChunkedFifo<FreedBlock>,
    /// Each block's [`Tag`].
    tags: ChunkedFifo<Tag>,
    /// The sequence number of the first entry (frees are numbered from 0).
    first: u64,
    /// Entries from here on are described, except those [`DROPPED`].
    desc_front: u64,
    desc_bytes: u64,
    described: usize,
    /// Big blocks still described, by sequence number, oldest first.
    big_seqs: VecDeque<u64>,
    /// The oldest entry whose shadow may still be marked (or the end).
    shadow_front: u64,
    shadow_bytes: u64,
}

/// An entry's tag: what the queue knows of a block beyond the block itself.
type Tag = u16;
/// The block left the description queue out of order (a big one).
const DROPPED: Tag = 1 << 15;
/// The block's shadow is marked and waits in the shadow window.
const SHADOW_KEPT: Tag = 1 << 14;
/// The rest: how far the block's chunk ends beyond `addr + size` (see `shadow::chunk_end`:
/// at most its redzone and two pages, well below this).
const END_DELTA: Tag = SHADOW_KEPT - 1;

impl FreedQueue {
    /// `limit`: `--freelist-vol`; `big`: `--freelist-big-blocks`.
    pub fn new(limit: u64, big: u64) -> FreedQueue {
        FreedQueue {
            limit,
            big,
            shadow_budget: limit / 2,
            blocks: ChunkedFifo::new(FreedBlock {
                addr: 0,
                size: 0,
                alloc_stack: StackId(0),
                free_stack: StackId(0),
            }),
            tags: ChunkedFifo::new(0),
            first: 0,
            desc_front: 0,
            desc_bytes: 0,
            described: 0,
            big_seqs: VecDeque::new(),
            shadow_front: 0,
            shadow_bytes: 0,
        }
    }

    /// Whether a freed block of `size` bytes stays in the shadow window at all (larger
    /// ones leave it at once: not worth marking).
    pub fn keeps_shadow(&self, size: u64) -> bool {
        size <= self.shadow_budget
    }

    fn next(&self) -> u64 {
        self.first + self.blocks.len() as u64
    }

    fn at(&self, seq: u64) -> (&FreedBlock, Tag) {
        let i = (seq - self.first) as usize;
        (self.blocks.get(i), *self.tags.get(i))
    }

    /// Queues a block whose shadow is not Memcheck's to clear (a client request's, a memory
    /// pool's chunk).
    pub fn push_unmarked(&mut self, b: FreedBlock) {
        self.push(b, 0, &mut |_, _, _| {
            unreachable!("an unmarked block never makes a marked one leave")
        });
    }

    /// Queues a freed block; `chunk_end`, when not 0, says its shadow was marked, up to
    /// there (`shadow::chunk_end`). `release` gets every marked block that leaves the
    /// shadow window, oldest first (the new one itself when it is too large to keep), as
    /// (address, size, chunk end).
    pub fn push(
        &mut self,
        b: FreedBlock,
        chunk_end: Addr,
        release: &mut impl FnMut(Addr, u64, Addr),
    ) {
        let mut tag = 0;
        if chunk_end != 0 {
            match chunk_end.checked_sub(b.addr.saturating_add(b.size)) {
                Some(d) if d <= END_DELTA as u64 => tag = SHADOW_KEPT | d as Tag,
                // Never from `shadow::chunk_end`; cleared now rather than kept wrong.
                _ => release(b.addr, b.size, chunk_end),
            }
        }
        let seq = self.next();
        self.blocks.push_back(b);
        self.tags.push_back(tag);
        if b.size >= self.big {
            self.big_seqs.push_back(seq);
        }
        self.desc_bytes += b.size;
        self.described += 1;
        if tag & SHADOW_KEPT != 0 {
            self.shadow_bytes += b.size;
        }
        while self.desc_bytes > self.limit {
            if let Some(s) = self.big_seqs.pop_front() {
                let i = (s - self.first) as usize;
                *self.tags.get_mut(i) |= DROPPED;
                self.desc_bytes -= self.blocks.get(i).size;
            } else {
                // Every big block before it dropped: the front is the oldest small one.
                self.skip_dropped();
                self.desc_bytes -= self.at(self.desc_front).0.size;
                self.desc_front += 1;
            }
            self.described -= 1;
        }
        self.skip_dropped();
        while self.shadow_bytes > self.shadow_budget {
            let (&old, t) = self.at(self.shadow_front);
            self.shadow_front += 1;
            if t & SHADOW_KEPT != 0 {
                self.shadow_bytes -= old.size;
                let end = old.addr + old.size + (t & END_DELTA) as u64;
                release(old.addr, old.size, end);
            }
        }
        while self.shadow_front < self.next() && self.at(self.shadow_front).1 & SHADOW_KEPT == 0 {
            self.shadow_front += 1;
        }
        while self.first < self.desc_front.min(self.shadow_front) {
            self.blocks.pop_front();
            self.tags.pop_front();
            self.first += 1;
        }
    }

    fn skip_dropped(&mut self) {
        while self.desc_front < self.next() && self.at(self.desc_front).1 & DROPPED != 0 {
            self.desc_front += 1;
        }
    }

    /// A remembered block whose extent (plus redzones) contains `addr`, as Memcheck's
    /// `get_freed_block_bracketting` finds it: big blocks first, oldest first.
    pub fn bracketing(&self, addr: Addr) -> Option<FreedBlock> {
        let near = |b: &FreedBlock| {
            addr >= b.addr.saturating_sub(REDZONE)
                && addr < b.addr.saturating_add(b.size).saturating_add(REDZONE)
        };
        let big = self.big_seqs.iter().map(|&s| *self.at(s).0);
        let small = (self.desc_front..self.next())
            .map(|s| self.at(s))
            .filter(|(b, t)| t & DROPPED == 0 && b.size < self.big)
            .map(|(b, _)| *b);
        big.chain(small).find(near)
    }

    /// How many blocks the description queue holds.
    pub fn len(&self) -> usize {
        self.described
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
        q.push_unmarked(fb(0x1000, 10));
        assert_eq!(q.bracketing(0x1000).map(|b| b.addr), Some(0x1000));
        assert_eq!(q.bracketing(0x1009).map(|b| b.addr), Some(0x1000));
        assert_eq!(q.bracketing(0x1000 - 16).map(|b| b.addr), Some(0x1000));
        assert_eq!(q.bracketing(0x1000 + 10 + 15).map(|b| b.addr), Some(0x1000));
        assert!(q.bracketing(0x1000 + 10 + 16).is_none());
    }

    #[test]
    fn oldest_blocks_leave_when_volume_exceeds_the_limit_big_ones_first() {
        let mut q = FreedQueue::new(100, 50);
        q.push_unmarked(fb(0x1000, 40));
        q.push_unmarked(fb(0x2000, 60)); // big
        assert_eq!(q.len(), 2);
        q.push_unmarked(fb(0x3000, 10)); // 110 > 100: the big block goes first
        assert!(q.bracketing(0x2000).is_none());
        assert!(q.bracketing(0x1000).is_some());
        q.push_unmarked(fb(0x4000, 55)); // big again: 105 -> it leaves itself
        assert!(q.bracketing(0x4000).is_none());
        q.push_unmarked(fb(0x5000, 45)); // 95 ok
        q.push_unmarked(fb(0x6000, 10)); // 105 -> the oldest small one leaves
        assert!(q.bracketing(0x1000).is_none());
        assert_eq!(q.len(), 3);
    }

    #[test]
    fn big_blocks_are_searched_first_then_the_oldest() {
        let mut q = FreedQueue::new(1000, 50);
        q.push_unmarked(fb(0x1000, 16));
        q.push_unmarked(fb(0x1000, 8));
        q.push_unmarked(fb(0x1000, 64)); // big: found first
        assert_eq!(q.bracketing(0x1004).map(|b| b.size), Some(64));
        let mut q = FreedQueue::new(1000, 50);
        q.push_unmarked(fb(0x1000, 16));
        q.push_unmarked(fb(0x1000, 8));
        assert_eq!(q.bracketing(0x1004).map(|b| b.size), Some(16), "oldest");
    }

    #[test]
    fn shadow_window_releases_oldest_first_at_half_the_volume() {
        let mut q = FreedQueue::new(200, 1000);
        let out = std::cell::RefCell::new(Vec::new());
        let mut rel = |a: u64, _: u64, e: u64| out.borrow_mut().push((a, e));
        q.push(fb(0x1000, 60), 0x1000 + 80, &mut rel);
        q.push(fb(0x2000, 30), 0x2000 + 48, &mut rel);
        q.push_unmarked(fb(0x9000, 90)); // counts for the description, not the shadow
        q.push(fb(0x3000, 20), 0x3000 + 32, &mut rel); // 110 > 100
        assert_eq!(*out.borrow(), [(0x1000, 0x1000 + 80)]);
        assert!(!q.keeps_shadow(101));
        q.push(fb(0x4000, 150), 0x4000 + 160, &mut rel);
        let out = out.into_inner();
        assert_eq!(
            out,
            [
                (0x1000, 0x1000 + 80),
                (0x2000, 0x2000 + 48),
                (0x3000, 0x3000 + 32),
                (0x4000, 0x4000 + 160)
            ]
        );
    }

    /// The queue against the two plain queues it replaced, on a long random run across
    /// many chunks: the same blocks described, found in the same order, and the same
    /// shadow releases.
    #[test]
    fn one_ring_matches_two_plain_queues() {
        let (limit, big) = (40_000u64, 3_000u64);
        let mut q = FreedQueue::new(limit, big);
        let (mut small, mut large) = (VecDeque::new(), VecDeque::<FreedBlock>::new());
        let mut vol = 0u64;
        let mut shadow = VecDeque::new();
        let mut shadow_bytes = 0u64;
        let (mut got, mut want) = (Vec::new(), Vec::new());
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
            let marked = x & (1 << 40) != 0;
            let end = if marked {
                addr + size + (x >> 30) % 4000
            } else {
                0
            };
            q.push(b, end, &mut |a, s, e| got.push((a, s, e)));
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
            if marked {
                shadow.push_back((addr, size, end));
                shadow_bytes += size;
                while shadow_bytes > limit / 2 {
                    let Some(o) = shadow.pop_front() else { break };
                    shadow_bytes -= o.1;
                    want.push(o);
                }
            }
            assert_eq!(got, want, "shadow releases at {i}");
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

/// A freed block on its way into the queue: the block, and the end of its chunk for the
/// shadow window (0 when its shadow is not marked).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Freed {
    pub block: FreedBlock,
    pub chunk_end: Addr,
}

/// Most frees a thread keeps before handing them to the shared queues ([`FreedBatches`]).
///
/// Half the runtime's batch (`oxgrind-runtime`'s `blocks::BATCH`, 32, and a sixteenth of
/// `--freelist-vol`), so that a block reaches the shadow window before the runtime's queue
/// even when the two counts drift by a few events (frees the tool does not see, the order of
/// a `realloc`'s two halves): its shadow is then cleared before glibc may reuse its memory.
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
                    OwnLines(SpinLock::new(Batch {
                        items: [EMPTY; BATCH],
                        len: 0,
                        bytes: 0,
                    }))
                })
                .collect(),
        }
    }

    /// Whether a freed block of `size` bytes is marked in the shadow at all: the
    /// queue's own test ([`FreedQueue::keeps_shadow`]), answered without its lock.
    pub fn keeps_shadow(&self, size: u64) -> bool {
        size <= self.volume / 2
    }

    fn mine(&self) -> &SpinLock<Batch> {
        &self.batches[crate::totals::thread_slot()].0
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
