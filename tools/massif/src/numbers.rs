//! The numbers Massif gives live blocks ([`oxgrind_tool::Tool::on_alloc`]'s result), each the slot
//! of the replayed arena (module `arena`) that holds the block while it is live, with what
//! Massif knows of it (Valgrind's `HP_Chunk`: its execution context, whether it is ignored).
//! So a free costs no lookup by address: the runtime's live-block table has already found
//! the block, and its number names the block's place in the arena (a table keyed by address
//! beside the runtime's was a cache miss of its own per event; a table of records between
//! the number and the arena, one more).
//!
//! A number is handed out by the allocating thread, in `on_alloc`, without a lock; the
//! arena's slot is written when the allocation is applied and read and emptied when the
//! free is (module `log`: under the state lock, maybe by another thread, batches later). So
//! numbers come from spaces, one per log (its owner takes numbers from it) and one shared by
//! the threads that have no log (taken under the state lock). Numbers are dense, so that
//! the arena can index a plain table with them: a space takes fresh numbers a segment at a
//! time from one counter, which the arena also takes its own slots from (the free blocks',
//! which have no number), and a table says which space each segment belongs to. Whoever
//! applies a free gives the number back to its space through a ring with one writer (the
//! state lock's holder) and one reader (the space's owner), or, when the ring is full, to a
//! list under the state lock that refills the ring later; an owner whose ring is empty
//! takes a number never used. So a space holds about as many numbers as its thread's blocks
//! that are live or freed and not yet applied, plus a ring.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// Numbers per segment (what a space or the arena takes from the counter at a time).
pub(crate) const SEG_BITS: u32 = 12;
const SEG: u32 = 1 << SEG_BITS;
/// Segments that can be numbers (2^28 numbers: blocks of the program live at once, or freed
/// and not yet applied, plus the rings); past that a block gets no number and is treated
/// as one never seen.
const NUMBER_SEGS: u32 = 1 << 16;
/// Segments in all, the arena's included: every slot id stays below the arena's "none"
/// (`u32::MAX`).
const ALL_SEGS: u32 = (u32::MAX >> SEG_BITS) - 1;
/// Numbers a space's ring holds.
const RING: usize = 8192;

/// Spaces: one per log and the shared one.
pub(crate) const SPACES: usize = crate::log::SLOTS + 1;
/// The space of threads without a log (taken under the state lock).
pub(crate) const SHARED: usize = crate::log::SLOTS;
const _: () = assert!(SPACES < u8::MAX as usize);

/// A segment's owner in [`Numbers`]' table when it is not a space's (the arena's, or not
/// handed out yet).
const NO_SPACE: u8 = u8::MAX;

/// A space's ring, allocated by its owner at its first number.
struct SpaceMem {
    ring: [AtomicU32; RING],
    /// The owner's end of the ring.
    taker: TakerEnd,
    /// The state lock holder's end of the ring.
    giver: GiverEnd,
}

/// A ring's end that its space's owner reads and writes at every number it takes, in a
/// cache line of its own: when the two ends shared a line, each take and each release
/// moved it between the owner's core and the core applying the logs (a thread of
/// `threads` frees blocks other threads allocated, and whichever thread finds the state
/// lock free applies everybody's events).
#[repr(align(64))]
struct TakerEnd {
    /// Numbers the owner has taken out of the ring (written by the owner).
    head: AtomicU64,
    /// `GiverEnd::tail` as the owner last read it (the owner's alone): numbers below it are
    /// in the ring, so the owner reads the giver's line again only once it has taken them.
    tail_seen: UnsafeCell<u64>,
    /// The next number never handed out, and the end of its segment (the owner's alone;
    /// equal: a new segment is due).
    fresh: UnsafeCell<u32>,
    fresh_end: UnsafeCell<u32>,
}

/// A ring's end that the state lock's holder writes at every number it gives back, in a
/// cache line of its own (see [`TakerEnd`]).
#[repr(align(64))]
struct GiverEnd {
    /// Numbers put into the ring (written by the state lock's holder).
    tail: AtomicU64,
    /// `TakerEnd::head` as the state lock's holder last read it (under the state lock):
    /// at most the true head, so the room it gives is at most the true room; read again
    /// only when that room is used up.
    head_seen: UnsafeCell<u64>,
    /// Numbers given back while the ring was full (under the state lock).
    overflow: UnsafeCell<Vec<u32>>,
}

pub(crate) struct Numbers {
    spaces: [AtomicPtr<SpaceMem>; SPACES],
    /// The next segment not handed out (segment 0 is the arena's first: no number is 0).
    next_seg: AtomicU32,
    /// The space each number segment belongs to ([`NO_SPACE`]: none); written by the
    /// space's owner before it hands out a number of the segment.
    seg_space: Box<[AtomicU8]>,
}

// SAFETY: a space's fresh numbers, ring head and tail seen are touched only by its owner
// (the thread owning the log of that index, or the state lock's holder for `SHARED`: see
// `take`); ring tails, heads seen and overflow lists only under the state lock; the rest is
// atomics, and memory is handed between threads with release/acquire pairs.
unsafe impl Sync for Numbers {}
// SAFETY: as above; the raw pointers are to memory the numbers own.
unsafe impl Send for Numbers {}

impl Numbers {
    pub(crate) fn new() -> Self {
        Numbers {
            spaces: [const { AtomicPtr::new(std::ptr::null_mut()) }; SPACES],
            next_seg: AtomicU32::new(1),
            seg_space: (0..NUMBER_SEGS).map(|_| AtomicU8::new(NO_SPACE)).collect(),
        }
    }

    /// The first of [`SEG`] slot ids never handed out, for the arena's free blocks (any
    /// thread may take segments: one atomic addition per 4096 ids).
    pub(crate) fn arena_segment(&self) -> u32 {
        let seg = self.next_seg.fetch_add(1, Ordering::Relaxed);
        // 2^32 slots of the arena would be 160 GiB of tables: memory runs out first.
        assert!(
            seg < ALL_SEGS,
            "massif: the replayed arena ran out of slot ids"
        );
        seg << SEG_BITS
    }

    /// A number for a new block from space `space`, or 0 when numbers are exhausted (the
    /// block is then treated as one never seen).
    ///
    /// # Safety
    /// The caller owns the space: it is the thread owning log `space`, not inside another
    /// call of this, or holds the state lock (`SHARED`).
    pub(crate) unsafe fn take(&self, space: usize) -> u32 {
        let slot = &self.spaces[space];
        let mut mem = slot.load(Ordering::Acquire);
        if mem.is_null() {
            mem = Self::new_space_mem();
            slot.store(mem, Ordering::Release);
        }
        // SAFETY: published above or before, never freed.
        let m = unsafe { &*mem };
        let head = m.taker.head.load(Ordering::Relaxed);
        // SAFETY: the owner's alone, and the caller owns the space (above).
        let tail_seen = unsafe { &mut *m.taker.tail_seen.get() };
        if head == *tail_seen {
            // Acquire: the numbers below the tail were written before it (release).
            *tail_seen = m.giver.tail.load(Ordering::Acquire);
        }
        if head != *tail_seen {
            let n = m.ring[head as usize % RING].load(Ordering::Relaxed);
            m.taker.head.store(head + 1, Ordering::Release);
            return n;
        }
        // SAFETY (both): the owner's alone, as above.
        let (fresh, end) = unsafe { (&mut *m.taker.fresh.get(), &mut *m.taker.fresh_end.get()) };
        if *fresh == *end {
            // Read first, so that once numbers are exhausted the counter stops growing
            // (past the last number segment, at most one segment per space goes unused).
            if self.next_seg.load(Ordering::Relaxed) >= NUMBER_SEGS {
                return 0;
            }
            let seg = self.next_seg.fetch_add(1, Ordering::Relaxed);
            if seg >= NUMBER_SEGS {
                return 0;
            }
            // Relaxed: the number reaches a reader only in an event published (release)
            // after this.
            self.seg_space[seg as usize].store(space as u8, Ordering::Relaxed);
            *fresh = seg << SEG_BITS;
            *end = *fresh + SEG;
        }
        let n = *fresh;
        *fresh += 1;
        n
    }

    #[cold]
    fn new_space_mem() -> *mut SpaceMem {
        let layout = std::alloc::Layout::new::<SpaceMem>();
        // SAFETY: the layout has a non-zero size; all-zero bytes are a valid `SpaceMem`
        // (zero atomics and counters: no fresh numbers yet) except `overflow`, written
        // below before any use.
        unsafe {
            let p = std::alloc::alloc_zeroed(layout) as *mut SpaceMem;
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            std::ptr::addr_of_mut!((*p).giver.overflow).write(UnsafeCell::new(Vec::new()));
            p
        }
    }

    /// Gives number `n` back to its space for another block (0: nothing to give back).
    ///
    /// # Safety
    /// Under the state lock; `n` is 0 or came from [`Numbers::take`], seen through an event
    /// published after it, and its block is freed (its free or realloc being applied).
    pub(crate) unsafe fn release(&self, n: u32) {
        if n == 0 {
            return;
        }
        let space = self.seg_space[(n >> SEG_BITS) as usize].load(Ordering::Relaxed);
        debug_assert!((space as usize) < SPACES, "number {n} was never handed out");
        // SAFETY: the space's memory was published (release) before `n` was handed out,
        // and the event carrying `n` after that; never freed.
        let m = unsafe { &*self.spaces[space as usize].load(Ordering::Acquire) };
        // SAFETY (both): under the state lock.
        let overflow = unsafe { &mut *m.giver.overflow.get() };
        let head_seen = unsafe { &mut *m.giver.head_seen.get() };
        let tail = m.giver.tail.load(Ordering::Relaxed);
        let mut room = RING as u64 - (tail - *head_seen);
        if room == 0 {
            // Acquire: the owner read the slots below its head before it released them.
            *head_seen = m.taker.head.load(Ordering::Acquire);
            room = RING as u64 - (tail - *head_seen);
        }
        if room == 0 {
            overflow.push(n);
            return;
        }
        // Numbers that waited for room first, then this one, as far as the room goes.
        let mut t = tail;
        while t - tail < room - 1 {
            let Some(w) = overflow.pop() else { break };
            m.ring[t as usize % RING].store(w, Ordering::Relaxed);
            t += 1;
        }
        m.ring[t as usize % RING].store(n, Ordering::Relaxed);
        m.giver.tail.store(t + 1, Ordering::Release);
    }
}

impl Drop for Numbers {
    fn drop(&mut self) {
        for s in &mut self.spaces {
            let mem = *s.get_mut();
            if mem.is_null() {
                continue;
            }
            // SAFETY: allocated by `new_space_mem` with this layout, and nothing refers to
            // it once the numbers are dropped.
            unsafe {
                std::ptr::drop_in_place((*mem).giver.overflow.get());
                std::alloc::dealloc(mem as *mut u8, std::alloc::Layout::new::<SpaceMem>());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_dense_reused_once_released_and_never_the_arenas() {
        let r = Numbers::new();
        let arena = r.arena_segment();
        // SAFETY: one thread: it owns every space and stands for the state lock's holder.
        unsafe {
            let a = r.take(3);
            let b = r.take(3);
            let c = r.take(5);
            assert_ne!(a, 0);
            assert_eq!(b, a + 1, "one space's fresh numbers are consecutive");
            for n in [a, b, c] {
                assert!(
                    n >> SEG_BITS != arena >> SEG_BITS,
                    "{n} in the arena's segment"
                );
            }
            assert_ne!(
                a >> SEG_BITS,
                c >> SEG_BITS,
                "each space has segments of its own"
            );
            r.release(a);
            r.release(c);
            assert_eq!(r.take(3), a, "released numbers come back to their space");
            assert_eq!(r.take(5), c);
            r.release(0);
        }
    }

    #[test]
    fn a_full_ring_keeps_numbers_for_later() {
        let r = Numbers::new();
        // SAFETY: as above.
        unsafe {
            let n: Vec<u32> = (0..RING + 100).map(|_| r.take(0)).collect();
            let highest = *n.iter().max().unwrap();
            for &k in &n {
                r.release(k);
            }
            // RING in the ring, 100 waiting; taking some makes room for those.
            let mut again: Vec<u32> = (0..RING + 100).map(|_| r.take(0)).collect();
            // Every released number came back before any fresh one.
            let fresh = again.iter().filter(|&&k| k > highest).count();
            assert!(fresh <= 100, "{fresh} fresh numbers");
            again.sort();
            again.dedup();
            assert_eq!(again.len(), RING + 100, "no number handed out twice");
        }
    }
}
