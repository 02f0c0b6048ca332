//! The freed-block queue: what Memcheck remembers of recently freed blocks, so that a later
//! double free, free of an interior pointer or realloc of a freed pointer can say
//! `Address 0x... is 0 bytes inside a block of size 10 free'd` with both stacks.
//!
//! Valgrind keeps freed blocks unavailable for reuse until `--freelist-vol` bytes have
//! been freed after them; blocks of at least `--freelist-big-blocks` bytes leave first.
//! This queue is the only one: the runtime keeps the program's freed blocks from glibc
//! while Memcheck asks it to (`Needs::freelist_vol`), and a block leaving the queue goes
//! back through `Host::release_freed` (a few frees later, never earlier). Threads feed it
//! through batches of their own ([`FreedBatches`]), so a free takes no process-wide lock,
//! and give the blocks that left back from there, two per free.

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

// A batch of frees is copied at every 16th free: an entry that carried more was slower.
const _: () = assert!(core::mem::size_of::<FreedBlock>() == 24);

/// [`FreedQueue`]'s flags of an entry: it left out of order (a big one).
const DROPPED: u8 = 1;
/// [`FreedQueue`]'s flags of an entry: a client request's or a memory pool's block, which
/// no one keeps from glibc for us (nothing to give back when it leaves).
const UNKEPT: u8 = 2;

/// Memcheck's redzone: an address this close to a block is described relative to it.
pub const REDZONE: u64 = 16;

/// Where an [`Entry`]'s flags start in its size word.
const FLAGS_SHIFT: u32 = 56;
/// The largest size an entry holds: larger ones (a client request's nonsense) are held as
/// this, which is still larger than any `--freelist-vol`, so they leave at once all the same.
const MAX_SIZE: u64 = (1 << FLAGS_SHIFT) - 1;

/// A queued block as the queue holds it: a [`FreedBlock`] with the queue's flags
/// ([`DROPPED`], [`UNKEPT`]) in the top byte of its size, so that the queue is one stream
/// of 24-byte entries (it was a stream of blocks and one of flag bytes, each indexed
/// through a `VecDeque` of chunks: 270 instructions per malloc/free pair of bench alloc).
#[derive(Copy, Clone)]
struct Entry {
    addr: Addr,
    size_flags: u64,
    alloc_stack: StackId,
    free_stack: StackId,
}

const _: () = assert!(core::mem::size_of::<Entry>() == 24);

impl Entry {
    #[inline(always)]
    fn new(b: &FreedBlock, flags: u8) -> Entry {
        Entry {
            addr: b.addr,
            size_flags: b.size.min(MAX_SIZE) | u64::from(flags) << FLAGS_SHIFT,
            alloc_stack: b.alloc_stack,
            free_stack: b.free_stack,
        }
    }

    #[inline(always)]
    fn size(&self) -> u64 {
        self.size_flags & MAX_SIZE
    }

    #[inline(always)]
    fn flags(&self) -> u8 {
        (self.size_flags >> FLAGS_SHIFT) as u8
    }

    #[inline(always)]
    fn block(&self) -> FreedBlock {
        FreedBlock {
            addr: self.addr,
            size: self.size(),
            alloc_stack: self.alloc_stack,
            free_stack: self.free_stack,
        }
    }
}

/// log2 of the entries in a chunk of [`Chunks`].
const CHUNK_SHIFT: u32 = 12;
/// Entries in a chunk of [`Chunks`] (96 KiB).
pub const CHUNK: usize = 1 << CHUNK_SHIFT;

/// The queue's entries by sequence number, in chunks of [`CHUNK`] entries: sequence
/// number `s` is entry `s % CHUNK` of the chunk in table slot `(s / CHUNK) % table.len()`.
/// An entry is found with two loads and no division or bounds test, never moves, and the
/// memory follows what the queue holds (a chunk at a time, one emptied chunk kept for the
/// next): a ring of entries would double to grow, copying itself while the old one is
/// still held, at the moment of peak memory.
struct Chunks {
    /// Its length is a power of two; a slot no chunk is in holds an empty slice.
    table: Vec<Box<[Entry]>>,
    spare: Option<Box<[Entry]>>,
}

impl Chunks {
    fn new() -> Chunks {
        Chunks {
            table: vec![Box::default()],
            spare: None,
        }
    }

    #[inline(always)]
    fn slot(&self, seq: u64) -> usize {
        (seq >> CHUNK_SHIFT) as usize & (self.table.len() - 1)
    }

    /// Where entry `seq` is: its chunk's slot and its index in the chunk, whose length
    /// (CHUNK, the chunk being held: [`Chunks::open`], not yet [`Chunks::close`]d) bounds it.
    #[inline(always)]
    fn place(&self, seq: u64) -> (usize, usize) {
        let slot = self.slot(seq);
        debug_assert_eq!(
            self.table[slot].len(),
            CHUNK,
            "entry {seq}'s chunk is not held"
        );
        (slot, seq as usize & (CHUNK - 1))
    }

    /// Entry `seq`, whose chunk is held.
    #[inline(always)]
    fn get(&self, seq: u64) -> &Entry {
        let (slot, i) = self.place(seq);
        // SAFETY: `slot` is masked to the table's length (a power of two, at least 1), and
        // the caller's chunk is held, so it has CHUNK entries, more than the masked index.
        unsafe { self.table.get_unchecked(slot).get_unchecked(i) }
    }

    /// [`Chunks::get`], to write.
    #[inline(always)]
    fn get_mut(&mut self, seq: u64) -> &mut Entry {
        let (slot, i) = self.place(seq);
        // SAFETY: as in `get`.
        unsafe { self.table.get_unchecked_mut(slot).get_unchecked_mut(i) }
    }

    /// Holds the chunk that starts at `seq` while the queue holds entries from `first`
    /// on (their chunks are held), doubling the table when they would share a slot.
    #[cold]
    #[inline(never)]
    fn open(&mut self, seq: u64, first: u64) {
        debug_assert!(seq.is_multiple_of(CHUNK as u64) && first <= seq);
        let (lo, hi) = (first >> CHUNK_SHIFT, seq >> CHUNK_SHIFT);
        let needed = (hi - lo + 1) as usize;
        if needed > self.table.len() {
            let mut table: Vec<Box<[Entry]>> =
                (0..needed.next_power_of_two().max(2 * self.table.len()))
                    .map(|_| Box::default())
                    .collect();
            let mask = table.len() - 1;
            for c in lo..hi {
                let old = self.slot(c << CHUNK_SHIFT);
                table[c as usize & mask] = core::mem::take(&mut self.table[old]);
            }
            self.table = table;
        }
        let slot = self.slot(seq);
        debug_assert!(self.table[slot].is_empty(), "chunk slot {slot} still held");
        self.table[slot] = self.spare.take().unwrap_or_else(|| {
            let fill = Entry::new(
                &FreedBlock {
                    addr: 0,
                    size: 0,
                    alloc_stack: StackId(0),
                    free_stack: StackId(0),
                },
                0,
            );
            vec![fill; CHUNK].into_boxed_slice()
        });
    }

    /// Lets go of the chunk that ends just before `seq` (the queue's first entry moved
    /// past it): kept as the spare, the spare before it freed.
    #[cold]
    #[inline(never)]
    fn close(&mut self, seq: u64) {
        let slot = self.slot(seq - 1);
        self.spare = Some(core::mem::take(&mut self.table[slot]));
    }

    /// Chunks held, the spare included: what the queue costs, in [`CHUNK`]s.
    #[cfg(test)]
    fn chunks_held(&self) -> usize {
        self.table.iter().filter(|c| !c.is_empty()).count() + usize::from(self.spare.is_some())
    }
}

/// Valgrind's freed-block queue, bounded by volume (`--freelist-vol`): when it holds too
/// much, blocks of at least `--freelist-big-blocks` bytes leave first, then the oldest.
/// Only searched when an error is being described ([`FreedQueue::bracketing`]).
///
/// One stream of every block in the order of their frees ([`Chunks`], numbered from 0); a
/// big block that leaves before its turn is marked dropped in place, and the small ones
/// leave from the front. A block that left is no longer described at once, but stays until
/// taken out to be given back ([`FreedQueue::take_leaver`]): the entries before `vfirst`
/// and the big ones in `due_big`. The common case, a small block pushed and the oldest
/// small one leaving, is a few instructions inline; big blocks take calls.
pub struct FreedQueue {
    limit: u64,
    big: u64,
    entries: Chunks,
    /// The sequence number of the first entry held.
    first: u64,
    /// The sequence number of the first entry still in the queue (as Valgrind's): those
    /// before it left and wait to be given back.
    vfirst: u64,
    /// The sequence number the next free gets.
    end: u64,
    /// Big blocks of the heap (not [`UNKEPT`]) that left out of order, to give back.
    due_big: VecDeque<FreedBlock>,
    bytes: u64,
    len: usize,
    /// Big blocks still in the queue, by sequence number, oldest first.
    big_seqs: VecDeque<u64>,
    /// Entries marked dropped not yet let go from the front: while none is, the front is
    /// never a dropped one, and [`FreedQueue::skip_dropped`] has nothing to look at.
    dropped_held: usize,
}

impl FreedQueue {
    /// `limit`: `--freelist-vol`; `big`: `--freelist-big-blocks`.
    pub fn new(limit: u64, big: u64) -> FreedQueue {
        FreedQueue {
            limit,
            big,
            entries: Chunks::new(),
            first: 0,
            vfirst: 0,
            end: 0,
            due_big: VecDeque::new(),
            bytes: 0,
            len: 0,
            big_seqs: VecDeque::new(),
            dropped_held: 0,
        }
    }

    /// A free of the program's heap: with a limit, the runtime keeps the block from glibc
    /// until it leaves ([`FreedQueue::take_leaver`]); without one, the runtime gave it back
    /// already.
    #[inline]
    pub fn push(&mut self, b: &FreedBlock) {
        self.push_flagged(b, if self.limit > 0 { 0 } else { UNKEPT });
    }

    /// A client request's or a memory pool's freed block: remembered, never given back.
    pub fn push_unkept(&mut self, b: &FreedBlock) {
        self.push_flagged(b, UNKEPT);
    }

    #[inline(always)]
    fn push_flagged(&mut self, b: &FreedBlock, flags: u8) {
        let seq = self.end;
        if seq as usize & (CHUNK - 1) == 0 {
            self.entries.open(seq, self.first);
        }
        let e = Entry::new(b, flags);
        *self.entries.get_mut(seq) = e;
        self.end = seq + 1;
        let size = e.size();
        if size >= self.big {
            self.big_seqs.push_back(seq);
        }
        self.bytes += size;
        self.len += 1;
        while self.bytes > self.limit {
            if !self.big_seqs.is_empty() {
                self.drop_big();
            } else {
                // Every big block before it dropped: the first one not dropped is the
                // oldest small one.
                self.skip_dropped();
                self.bytes -= self.entries.get(self.vfirst).size();
                self.vfirst += 1;
            }
            self.len -= 1;
        }
        self.skip_dropped();
    }

    /// The oldest big block in the queue leaves it, out of order.
    #[inline(never)]
    fn drop_big(&mut self) {
        let Some(s) = self.big_seqs.pop_front() else {
            return;
        };
        let e = self.entries.get_mut(s);
        e.size_flags |= u64::from(DROPPED) << FLAGS_SHIFT;
        let gone = *e;
        self.dropped_held += 1;
        self.bytes -= gone.size();
        if gone.flags() & UNKEPT == 0 {
            self.due_big.push_back(gone.block());
        }
    }

    /// Moves the queue's front past the entries of big blocks that already left (letting
    /// them go when nothing before them waits to be given back). The test of the common
    /// case (no big block let go) is inline where it is called; the walk is out of line.
    #[inline(always)]
    fn skip_dropped(&mut self) {
        if self.dropped_held != 0 {
            self.skip_dropped_walk();
        }
    }

    #[inline(never)]
    fn skip_dropped_walk(&mut self) {
        while self.vfirst < self.end && self.entries.get(self.vfirst).flags() & DROPPED != 0 {
            let at_front = self.vfirst == self.first;
            self.vfirst += 1;
            if at_front {
                self.let_go_first();
                self.dropped_held -= 1;
                if self.dropped_held == 0 {
                    break;
                }
            }
        }
    }

    /// The first entry held is let go.
    #[inline(always)]
    fn let_go_first(&mut self) {
        self.first += 1;
        if self.first as usize & (CHUNK - 1) == 0 {
            self.entries.close(self.first);
        }
    }

    /// The next block of the heap that left the queue and is not given back yet, oldest
    /// (or big) first; its entry is let go.
    #[inline]
    pub fn take_leaver(&mut self) -> Option<FreedBlock> {
        if !self.due_big.is_empty() {
            return self.due_big.pop_front();
        }
        while self.first < self.vfirst {
            let e = *self.entries.get(self.first);
            self.let_go_first();
            let flags = e.flags();
            if flags == 0 {
                return Some(e.block());
            }
            if flags & DROPPED != 0 {
                self.dropped_held -= 1;
            }
        }
        None
    }

    /// Whether [`FreedQueue::take_leaver`] has a block to give.
    pub fn has_leavers(&self) -> bool {
        !self.due_big.is_empty() || self.first < self.vfirst
    }

    /// A remembered block whose extent (plus redzones) contains `addr`, as Memcheck's
    /// `get_freed_block_bracketting` finds it: big blocks first, oldest first.
    pub fn bracketing(&self, addr: Addr) -> Option<FreedBlock> {
        let near = |b: &FreedBlock| {
            addr >= b.addr.saturating_sub(REDZONE)
                && addr < b.addr.saturating_add(b.size).saturating_add(REDZONE)
        };
        let big = self.big_seqs.iter().map(|&s| self.entries.get(s).block());
        let small = (self.vfirst..self.end)
            .map(|s| self.entries.get(s))
            .filter(|e| e.flags() & DROPPED == 0 && e.size() < self.big)
            .map(Entry::block);
        big.chain(small).find(near)
    }

    /// The blocks in the queue, in the order of their frees.
    #[cfg(test)]
    fn blocks(&self) -> Vec<FreedBlock> {
        (self.vfirst..self.end)
            .map(|s| self.entries.get(s))
            .filter(|e| e.flags() & DROPPED == 0)
            .map(Entry::block)
            .collect()
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
        q.push(&fb(0x1000, 10));
        assert_eq!(q.bracketing(0x1000).map(|b| b.addr), Some(0x1000));
        assert_eq!(q.bracketing(0x1009).map(|b| b.addr), Some(0x1000));
        assert_eq!(q.bracketing(0x1000 - 16).map(|b| b.addr), Some(0x1000));
        assert_eq!(q.bracketing(0x1000 + 10 + 15).map(|b| b.addr), Some(0x1000));
        assert!(q.bracketing(0x1000 + 10 + 16).is_none());
    }

    #[test]
    fn oldest_blocks_leave_when_volume_exceeds_the_limit_big_ones_first() {
        let mut q = FreedQueue::new(100, 50);
        q.push(&fb(0x1000, 40));
        q.push(&fb(0x2000, 60)); // big
        assert_eq!(q.len(), 2);
        q.push(&fb(0x3000, 10)); // 110 > 100: the big block goes first
        assert!(q.bracketing(0x2000).is_none());
        assert!(q.bracketing(0x1000).is_some());
        q.push(&fb(0x4000, 55)); // big again: 105 -> it leaves itself
        assert!(q.bracketing(0x4000).is_none());
        q.push(&fb(0x5000, 45)); // 95 ok
        q.push(&fb(0x6000, 10)); // 105 -> the oldest small one leaves
        assert!(q.bracketing(0x1000).is_none());
        assert_eq!(q.len(), 3);
    }

    /// Client requests' and pools' blocks leave as heap blocks do, big ones first, but no
    /// one kept them from glibc: only the heap's are given back.
    #[test]
    fn only_heap_blocks_are_given_back_when_they_leave() {
        let mut q = FreedQueue::new(100, 50);
        q.push(&fb(0x1000, 40));
        q.push_unkept(&fb(0x2000, 40));
        q.push_unkept(&fb(0x3000, 60)); // big: leaves at once (140 > 100), not given back
        assert!(q.bracketing(0x3000).is_none());
        assert_eq!(q.take_leaver(), None);
        q.push(&fb(0x4000, 60)); // big, 140: leaves itself, given back
        q.push(&fb(0x5000, 30)); // 110: the oldest small one leaves (the heap's)
        q.push(&fb(0x6000, 30)); // 100: fits
        q.push(&fb(0x7000, 10)); // 110: the unkept small one leaves
        let given: Vec<u64> = core::iter::from_fn(|| q.take_leaver())
            .map(|b| b.addr)
            .collect();
        assert_eq!(given, [0x4000, 0x1000]);
        assert!(q.bracketing(0x2000).is_none());
        assert_eq!(q.len(), 3);
        // Without a limit the runtime keeps nothing: a heap block is not given back either.
        let mut q = FreedQueue::new(0, 50);
        q.push(&fb(0x1000, 40));
        assert_eq!(q.take_leaver(), None);
        assert!(q.is_empty());
    }

    #[test]
    fn big_blocks_are_searched_first_then_the_oldest() {
        let mut q = FreedQueue::new(1000, 50);
        q.push(&fb(0x1000, 16));
        q.push(&fb(0x1000, 8));
        q.push(&fb(0x1000, 64)); // big: found first
        assert_eq!(q.bracketing(0x1004).map(|b| b.size), Some(64));
        let mut q = FreedQueue::new(1000, 50);
        q.push(&fb(0x1000, 16));
        q.push(&fb(0x1000, 8));
        assert_eq!(q.bracketing(0x1004).map(|b| b.size), Some(16), "oldest");
    }

    /// The queue against the two plain queues (small and big blocks) Valgrind keeps, on
    /// `n` frees of sizes `size(i, random)`: the same blocks, found in the same order; what
    /// left is given back once, and only what left.
    fn matches_two_plain_queues(
        limit: u64,
        big: u64,
        n: u64,
        size: impl Fn(u64, u64) -> u64,
    ) -> FreedQueue {
        let mut q = FreedQueue::new(limit, big);
        let (mut small, mut large) = (VecDeque::new(), VecDeque::<FreedBlock>::new());
        let mut vol = 0u64;
        let mut taken = 0u64;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for i in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let size = size(i, x);
            let addr = 0x10_0000 + (x >> 20) % 5_000 * 16;
            let b = FreedBlock {
                addr,
                size,
                alloc_stack: StackId(i as u32),
                free_stack: StackId(i as u32 + 1),
            };
            q.push(&b);
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
            while let Some(l) = q.take_leaver() {
                taken += 1;
                assert!(
                    !small
                        .iter()
                        .chain(large.iter())
                        .any(|p| p.alloc_stack == l.alloc_stack),
                    "{l:?} given back while still queued, at {i}"
                );
            }
            if i % 997 == 0 {
                for probe in (0x10_0000 - 32..0x10_0000 + 5_000 * 16 + 400).step_by(40) {
                    let plain = large.iter().chain(small.iter()).find(|b| {
                        probe >= b.addr.saturating_sub(REDZONE) && probe < b.addr + b.size + REDZONE
                    });
                    assert_eq!(q.bracketing(probe), plain.copied(), "{probe:#x} at {i}");
                }
            }
            assert!(
                q.entries.chunks_held() <= (q.end - q.first) as usize / CHUNK + 3,
                "no emptied chunk kept but the spare, at {i}"
            );
        }
        assert_eq!(
            taken + q.len() as u64,
            n,
            "every block queued or given back"
        );
        q
    }

    #[test]
    fn one_stream_matches_two_plain_queues() {
        let _ = matches_two_plain_queues(40_000, 3_000, 60_000, |_, x| match x % 100 {
            0 => 2_000 + x % 30_000,
            1..=30 => 1 + x % 16,
            _ => 16 + (x >> 8) % 200,
        });
    }

    /// The queue grows across many chunks while its front is in the middle of the chunk
    /// table (empty blocks add no volume: Valgrind keeps them all), then shrinks back.
    #[test]
    fn the_chunk_table_grows_and_shrinks_with_its_front_anywhere() {
        let q = matches_two_plain_queues(40_000, 3_000, 70_000, |i, x| match i {
            0..=20_000 => 16 + (x >> 8) % 200,
            20_001..=45_000 => {
                if x % 500 == 0 {
                    3_000 + x % 5_000
                } else {
                    0
                }
            }
            _ => 1_000 + (x >> 8) % 200,
        });
        assert!(
            q.entries.table.len() >= 8,
            "grown to {}",
            q.entries.table.len()
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

/// What [`FreedBatches::push`] did with a free.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Pushed {
    /// Batched.
    Room,
    /// Batched, and the batch is full: the caller moves it into the queue
    /// ([`FreedBatches::absorb`]).
    Full,
    /// Not batched: another thread on the same batch filled it and has not moved it into the
    /// queue yet. The caller moves it ([`FreedBatches::absorb`]) and pushes again.
    NoRoom,
}

/// Most blocks that left the queue a batch holds before they go back to glibc.
pub const LEAVING: usize = 4 * BATCH;

/// Blocks given back per free (the ring empties faster than batches fill it).
pub const GIVEN_PER_FREE: usize = 2;

/// The blocks a free gives back to glibc at its end (address, size), oldest first.
#[derive(Default)]
#[must_use = "blocks not given back stay out of glibc's hands for good"]
pub struct Giving {
    items: [(u64, u64); GIVEN_PER_FREE],
    n: usize,
    /// More blocks left the queue than the thread's ring holds: all go back now.
    pub behind: bool,
}

impl Giving {
    pub fn blocks(&self) -> &[(u64, u64)] {
        &self.items[..self.n]
    }
}

/// Starts loading, for writing, glibc's chunk header before `block` and the block's first
/// words, which its `free` reads and writes.
#[inline(always)]
fn prefetch_chunk(block: u64) {
    oxgrind_tool::hint::prefetch_write_at(block.wrapping_sub(16));
    oxgrind_tool::hint::prefetch_write_at(block.wrapping_add(8));
}

/// One thread's pending frees, oldest first, and the blocks that left the queue on their
/// way back to glibc (a ring, oldest first): given back one or two per free rather than a
/// batch at once, which would overflow glibc's per-thread cache (7 chunks per size) into
/// its slower bins, which touch the heads of neighbouring chunks (costly here, whose
/// shadow marks them).
struct Batch {
    items: [FreedBlock; BATCH],
    len: usize,
    bytes: u64,
    /// (address, size).
    leaving: [(u64, u64); LEAVING],
    leaving_head: usize,
    leaving_len: usize,
}

const EMPTY: FreedBlock = FreedBlock {
    addr: 0,
    size: 0,
    alloc_stack: StackId(0),
    free_stack: StackId(0),
};

impl Batch {
    /// Moves blocks that left `queue` into the ring while it has room; whether some are
    /// left over.
    fn take_leavers(&mut self, queue: &mut FreedQueue) -> bool {
        while self.leaving_len < LEAVING {
            let Some(b) = queue.take_leaver() else {
                return false;
            };
            let slot = (self.leaving_head + self.leaving_len) % LEAVING;
            self.leaving[slot] = (b.addr, b.size);
            self.leaving_len += 1;
        }
        queue.has_leavers()
    }

    /// Tops `giving` up to [`GIVEN_PER_FREE`] blocks from the ring, oldest first; the
    /// caller starts loading their chunks if the previous free's look-ahead did not
    /// ([`FreedBatches::push`]).
    #[inline]
    fn give_into(&mut self, giving: &mut Giving) {
        while giving.n < GIVEN_PER_FREE {
            let Some(l) = self.pop_leaver() else { break };
            giving.items[giving.n] = l;
            giving.n += 1;
        }
    }

    /// Starts loading the chunks of the blocks the next free gives back.
    #[inline]
    fn look_ahead(&self) {
        for k in 0..GIVEN_PER_FREE.min(self.leaving_len) {
            prefetch_chunk(self.leaving[(self.leaving_head + k) % LEAVING].0);
        }
    }

    fn pop_leaver(&mut self) -> Option<(u64, u64)> {
        if self.leaving_len == 0 {
            return None;
        }
        let b = self.leaving[self.leaving_head];
        self.leaving_head = (self.leaving_head + 1) % LEAVING;
        self.leaving_len -= 1;
        Some(b)
    }
}

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
                        leaving: [(0, 0); LEAVING],
                        leaving_head: 0,
                        leaving_len: 0,
                    }))
                })
                .collect(),
        }
    }

    fn mine(&self) -> &SpinLock<Batch> {
        &self.batches[crate::totals::thread_slot()].0
    }

    /// Adds a free to the calling thread's batch, and takes the oldest blocks of its ring
    /// into `giving` (up to [`GIVEN_PER_FREE`]), which the free gives back at its end; says
    /// whether the batch is full, for the caller to move into the queue
    /// ([`FreedBatches::absorb`], with no batch lock held: the queue's lock comes first).
    ///
    /// Starts loading the chunks of the blocks the next free gives back: glibc's `free` of
    /// each reads its chunk header and writes the block's first words, lines last touched a
    /// whole `--freelist-vol` of frees ago (a tenth of Memcheck's time on bench alloc was
    /// glibc's `free` missing them). This free's were loaded so by the free before (or by
    /// [`FreedBatches::absorb`], which refilled the ring).
    #[inline]
    pub fn push(&self, f: &FreedBlock, giving: &mut Giving) -> Pushed {
        let mut b = self.mine().lock();
        let i = b.len;
        if i == BATCH {
            return Pushed::NoRoom;
        }
        b.give_into(giving);
        b.look_ahead();
        b.items[i] = *f;
        b.len = i + 1;
        b.bytes += f.size;
        if i + 1 < BATCH && b.bytes <= self.volume / 32 {
            Pushed::Room
        } else {
            Pushed::Full
        }
    }

    /// Moves the calling thread's batch into `queue` (the caller holds its lock), the
    /// blocks that left it into the thread's ring, and tops `giving` up from there (a block
    /// larger than the queue leaves in the very free that queued it); whether more left
    /// than the ring holds. The batch is read where it is, under its lock taken after the
    /// queue's (as [`FreedBatches::drain`] takes them): a batch copied out under its lock
    /// alone was a 400-byte copy per batch.
    pub fn absorb(&self, queue: &mut FreedQueue, giving: &mut Giving) -> bool {
        let mut guard = self.mine().lock();
        let b = &mut *guard;
        for f in &b.items[..b.len] {
            queue.push(f);
        }
        b.len = 0;
        b.bytes = 0;
        let behind = b.take_leavers(queue);
        let had = giving.n;
        b.give_into(giving);
        if had < giving.n {
            // Taken from the ring just refilled, which was empty at the push's look-ahead:
            // these, and the next free's.
            for &(a, _) in &giving.items[had..giving.n] {
                prefetch_chunk(a);
            }
            b.look_ahead();
        }
        behind
    }

    /// Takes every block of the calling thread's ring out, oldest first, for `give`
    /// (address, size; called with no lock held).
    pub fn give_all(&self, give: &mut impl FnMut(u64, u64)) {
        let mut out = [(0u64, 0u64); LEAVING];
        let mut n = 0;
        {
            let mut b = self.mine().lock();
            while let Some(l) = b.pop_leaver() {
                out[n] = l;
                n += 1;
            }
        }
        for &(a, s) in &out[..n] {
            give(a, s);
        }
    }

    /// Refills the calling thread's ring from `queue` (the caller holds its lock): when
    /// more blocks left than a ring holds; whether some are still left over.
    pub fn refill(&self, queue: &mut FreedQueue) -> bool {
        self.mine().lock().take_leavers(queue)
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

    /// Memcheck's free path on one thread (`events.rs`): push, absorb a full batch, catch
    /// up when behind, give back two per free. Checks that the blocks go back oldest first,
    /// each once.
    fn run_frees(limit: u64, sizes: &[u64], mut check: impl FnMut(usize, u64, u64)) {
        let mut q = FreedQueue::new(limit, 1_000_000);
        let batches = FreedBatches::new(limit);
        let mut given = Vec::new();
        let (mut pushed, mut back) = (0u64, 0u64);
        for (i, &size) in sizes.iter().enumerate() {
            let addr = 0x10_0000 + i as u64 * 0x2000;
            let mut giving = Giving::default();
            let outcome = batches.push(
                &FreedBlock {
                    size,
                    ..freed(addr)
                },
                &mut giving,
            );
            assert_ne!(
                outcome,
                Pushed::NoRoom,
                "one thread never finds its batch full"
            );
            pushed += size;
            let mut give = |a: u64, s: u64| {
                given.push(a);
                back += s;
            };
            if outcome == Pushed::Full {
                giving.behind = batches.absorb(&mut q, &mut giving);
            }
            for &(a, s) in giving.blocks() {
                give(a, s);
            }
            let mut behind = giving.behind;
            while behind {
                batches.give_all(&mut give);
                behind = batches.refill(&mut q);
            }
            // A block given back is never one the queue still describes.
            for &a in given.iter().rev().take(2) {
                assert!(
                    q.bracketing(a).is_none(),
                    "{a:#x} given back while queued, at {i}"
                );
            }
            check(i, pushed, pushed - back);
        }
        let expected: Vec<u64> = (0..given.len() as u64)
            .map(|i| 0x10_0000 + i * 0x2000)
            .collect();
        assert_eq!(given, expected, "oldest first, each once");
    }

    #[test]
    fn blocks_that_left_the_queue_go_back_oldest_first_two_per_free_never_early() {
        let limit = 1600;
        let sizes = vec![10u64; 2000];
        run_frees(limit, &sizes, |i, pushed, held| {
            // Never more given back than the queue let go: it holds the budget's worth of
            // the latest frees (or all of them).
            assert!(held >= limit.min(pushed), "given back too early at {i}");
            // And no more than a batch and a ring of leavers late.
            assert!(
                held <= limit + (BATCH + LEAVING) as u64 * 10,
                "held {held} at {i}"
            );
        });
    }

    #[test]
    fn large_frees_after_many_small_ones_keep_the_held_memory_near_the_volume() {
        let limit = 1_000_000;
        // 40,000 blocks of 32 bytes (the queue full of 31,250 small blocks), then 3,000
        // of 4 KiB: two going back per free would have let the held memory grow to 12 MB.
        let sizes: Vec<u64> = (0..43_000)
            .map(|i| if i < 40_000 { 32 } else { 4096 })
            .collect();
        run_frees(limit, &sizes, |i, pushed, held| {
            assert!(
                held + 4096 >= limit.min(pushed),
                "given back too early at {i}"
            );
            assert!(
                held <= limit + limit / 32 + 4096 + LEAVING as u64 * 4096,
                "held {held} at {i}"
            );
        });
    }

    #[test]
    fn a_threads_frees_reach_the_queue_in_order_by_batch_or_drain() {
        let batches = FreedBatches::new(20_000_000);
        let mut q = FreedQueue::new(20_000_000, 1_000_000);
        for i in 0..(BATCH as u64 + 3) {
            let mut giving = Giving::default();
            if batches.push(&freed(0x1000 + i * 16), &mut giving) == Pushed::Full {
                assert!(!batches.absorb(&mut q, &mut giving));
            }
        }
        assert_eq!(q.len(), BATCH, "one full batch moved");
        batches.drain(|b| b.iter().for_each(|f| q.push(f)));
        let expected: Vec<u64> = (0..(BATCH as u64 + 3)).map(|i| 0x1000 + i * 16).collect();
        assert_eq!(
            q.blocks().iter().map(|f| f.addr).collect::<Vec<_>>(),
            expected
        );
        let mut again = Vec::new();
        batches.drain(|b| again.extend_from_slice(b));
        assert!(again.is_empty(), "drained batches are empty");
    }

    /// Two threads on one batch: one filled it and has not moved it yet when the other
    /// frees; that free is refused, not lost, and goes in after the batch moved.
    #[test]
    fn a_free_into_a_full_batch_waits_for_it_to_move() {
        let batches = FreedBatches::new(20_000_000);
        let mut q = FreedQueue::new(20_000_000, 1_000_000);
        let mut giving = Giving::default();
        for i in 0..BATCH as u64 {
            let full = batches.push(&freed(0x1000 + i * 16), &mut giving) == Pushed::Full;
            assert_eq!(full, i + 1 == BATCH as u64);
        }
        let late = freed(0x9000);
        assert_eq!(batches.push(&late, &mut giving), Pushed::NoRoom);
        let _ = batches.absorb(&mut q, &mut giving);
        assert_eq!(batches.push(&late, &mut giving), Pushed::Room);
        batches.drain(|b| b.iter().for_each(|f| q.push(f)));
        let addrs: Vec<u64> = q.blocks().iter().map(|f| f.addr).collect();
        assert_eq!(addrs.len(), BATCH + 1);
        assert_eq!(addrs.last(), Some(&0x9000));
    }

    #[test]
    fn two_instances_on_one_thread_keep_separate_batches() {
        let a = FreedBatches::new(20_000_000);
        let b = FreedBatches::new(20_000_000);
        assert_eq!(a.push(&freed(0x10), &mut Giving::default()), Pushed::Room);
        assert_eq!(b.push(&freed(0x20), &mut Giving::default()), Pushed::Room);
        let mut from_a = Vec::new();
        a.drain(|x| from_a.extend(x.iter().map(|f| f.addr)));
        assert_eq!(from_a, [0x10]);
    }
}
