//! Massif's record of each live block (Valgrind's `HP_Chunk`): where the replayed allocator
//! (module `arena`) put it, its execution context, and whether it is ignored. Found by the
//! number the runtime keeps with the block ([`oxgrind_tool::Tool::block_word`]), so a free
//! costs no lookup by address: the runtime's live-block table has already found the block,
//! and a second table keyed by address beside it was a cache miss of its own per event.
//!
//! A number is handed out by the allocating thread, in `block_word`, without a lock; the
//! record is written when the allocation is applied and read and released when the free is
//! (module `log`: under the state lock, maybe by another thread, batches later). So numbers
//! come from spaces, one per log (its owner takes numbers from it) and one shared by the
//! threads that have no log (taken under the state lock). A number's top bits name its space.
//! Whoever applies a free gives the number back to its space through a ring with one writer
//! (the state lock's holder) and one reader (the space's owner), or, when the ring is full,
//! to a list under the state lock that refills the ring later; an owner whose ring is empty
//! takes a number never used. So a space holds about as many records as its thread's blocks
//! that are live or freed and not yet applied, plus a ring.
//!
//! Records are written and read only under the state lock; the memory they live in is
//! allocated by the space's owner and published with release stores, which every reader
//! acquires before it meets a number of that memory in an event.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crate::arena::BlockId;
use crate::EcId;

/// What Massif knows of a live block it has applied the allocation of.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    /// The block in the replayed arena (its usable size gives the block's slop).
    pub sim: BlockId,
    /// The EC of the stack that allocated it.
    pub ec: EcId,
    /// Allocated under an ignored stack, or reallocated from such a block (Valgrind keeps it
    /// ignored wherever it moves).
    pub ignored: bool,
}

/// Bits of a number that index its space.
const INDEX_BITS: u32 = 25;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
/// Records per segment of a space (allocated as its numbers are first handed out).
const SEG_BITS: u32 = 12;
const SEG: usize = 1 << SEG_BITS;
const SEGS: usize = 1 << (INDEX_BITS - SEG_BITS);
/// Numbers a space's ring holds.
const RING: usize = 8192;

/// Spaces: one per log and the shared one.
pub(crate) const SPACES: usize = crate::log::SLOTS + 1;
/// The space of threads without a log (taken under the state lock).
pub(crate) const SHARED: usize = crate::log::SLOTS;
const _: () = assert!(SPACES <= 1 << (32 - INDEX_BITS));

/// A record as stored: 0 for "no allocation applied" (a fresh or released number).
type Packed = u64;

fn pack(r: Record) -> Packed {
    debug_assert!(r.sim < u32::MAX >> 1);
    let lo = (r.sim as u64 + 1) | (r.ignored as u64) << 31;
    lo | (r.ec as u64) << 32
}

fn unpack(p: Packed) -> Option<Record> {
    let lo = p as u32;
    (lo != 0).then(|| Record {
        sim: (lo & (u32::MAX >> 1)) - 1,
        ec: (p >> 32) as u32,
        ignored: lo >> 31 != 0,
    })
}

struct Segment([UnsafeCell<Packed>; SEG]);

/// A space's shared memory, allocated by its owner at its first number.
struct SpaceMem {
    segments: [AtomicPtr<Segment>; SEGS],
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

struct Space {
    mem: AtomicPtr<SpaceMem>,
    /// The next number never handed out (its owner's alone); 0 is never a number.
    fresh: UnsafeCell<u32>,
}

pub(crate) struct Records {
    spaces: [Space; SPACES],
}

// SAFETY: a space's `fresh`, ring head and tail seen and segment allocation are touched
// only by its owner (the thread owning the log of that index, or the state lock's holder
// for `SHARED`: see `take`); records, ring tails, heads seen and overflow lists only under
// the state lock; the rest is
// atomics, and memory is handed between threads with release/acquire pairs.
unsafe impl Sync for Records {}
// SAFETY: as above; the raw pointers are to memory the records own.
unsafe impl Send for Records {}

impl Records {
    pub(crate) const fn new() -> Self {
        Records {
            spaces: [const {
                Space {
                    mem: AtomicPtr::new(std::ptr::null_mut()),
                    fresh: UnsafeCell::new(1),
                }
            }; SPACES],
        }
    }

    /// A number for a new block from space `space`, or 0 when the space is exhausted (2^25
    /// blocks of one thread live at once: the block is then treated as one never seen).
    ///
    /// # Safety
    /// The caller owns the space: it is the thread owning log `space`, not inside another
    /// call of this, or holds the state lock (`SHARED`).
    pub(crate) unsafe fn take(&self, space: usize) -> u32 {
        let s = &self.spaces[space];
        let mut mem = s.mem.load(Ordering::Acquire);
        if mem.is_null() {
            mem = Self::new_space_mem();
            s.mem.store(mem, Ordering::Release);
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
        // SAFETY: the caller owns the space (above).
        let fresh = unsafe { &mut *s.fresh.get() };
        let index = *fresh;
        if index > INDEX_MASK {
            return 0;
        }
        let seg = &m.segments[(index >> SEG_BITS) as usize];
        if seg.load(Ordering::Relaxed).is_null() {
            // Zeroed: every record "no allocation applied".
            let layout = std::alloc::Layout::new::<Segment>();
            // SAFETY: the layout has a non-zero size.
            let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut Segment;
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            seg.store(p, Ordering::Release);
        }
        *fresh += 1;
        (space as u32) << INDEX_BITS | index
    }

    #[cold]
    fn new_space_mem() -> *mut SpaceMem {
        let layout = std::alloc::Layout::new::<SpaceMem>();
        // SAFETY: the layout has a non-zero size; all-zero bytes are a valid `SpaceMem`
        // (null pointers, zero atomics) except `overflow`, written below before any use.
        unsafe {
            let p = std::alloc::alloc_zeroed(layout) as *mut SpaceMem;
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            std::ptr::addr_of_mut!((*p).giver.overflow).write(UnsafeCell::new(Vec::new()));
            p
        }
    }

    /// The cell of record `n` (a number `take` handed out, not 0).
    ///
    /// # Safety
    /// `n` came from [`Records::take`], seen through an event published after it.
    #[inline]
    unsafe fn cell(&self, n: u32) -> &UnsafeCell<Packed> {
        let space = &self.spaces[(n >> INDEX_BITS) as usize];
        let index = n & INDEX_MASK;
        // SAFETY: `take` published the space's memory and the number's segment (release)
        // before handing `n` out; the event carrying `n` was published after, and read
        // with an acquire load, so both are visible, and never freed.
        unsafe {
            let m = &*space.mem.load(Ordering::Acquire);
            let seg = &*m.segments[(index >> SEG_BITS) as usize].load(Ordering::Acquire);
            &seg.0[(index as usize) & (SEG - 1)]
        }
    }

    /// The record of number `n`, if its allocation has been applied (0: never).
    ///
    /// # Safety
    /// Under the state lock; `n` is 0 or as for [`Records::cell`].
    #[inline]
    pub(crate) unsafe fn get(&self, n: u32) -> Option<Record> {
        if n == 0 {
            return None;
        }
        // SAFETY: forwarded; records are read and written only under the state lock.
        unpack(unsafe { *self.cell(n).get() })
    }

    /// Starts loading record `n`'s cell (0: nothing), to be read or written a few events
    /// later: records are reused first in, first out, so the cell of a block freed or
    /// allocated now was last touched thousands of events ago.
    ///
    /// # Safety
    /// As for [`Records::get`].
    #[inline]
    pub(crate) unsafe fn prefetch(&self, n: u32) {
        if n != 0 {
            // SAFETY: forwarded.
            oxgrind_tool::hint::prefetch_read(unsafe { self.cell(n) });
        }
    }

    /// Whether number `n` names a block whose allocation is applied.
    ///
    /// # Safety
    /// As for [`Records::get`].
    #[inline]
    pub(crate) unsafe fn is_live(&self, n: u32) -> bool {
        // SAFETY: forwarded.
        unsafe { self.get(n) }.is_some()
    }

    /// Writes the record of number `n` (0: nothing to write, the block has no number).
    ///
    /// # Safety
    /// As for [`Records::get`].
    #[inline]
    pub(crate) unsafe fn set(&self, n: u32, r: Record) {
        if n != 0 {
            // SAFETY: forwarded; under the state lock.
            unsafe { *self.cell(n).get() = pack(r) };
        }
    }

    /// The record of number `n`, which then goes back to its space for another block.
    ///
    /// # Safety
    /// As for [`Records::get`]; `n`'s block is freed (its free or realloc being applied).
    pub(crate) unsafe fn release(&self, n: u32) -> Option<Record> {
        if n == 0 {
            return None;
        }
        // SAFETY: forwarded; under the state lock.
        let cell = unsafe { &mut *self.cell(n).get() };
        let r = unpack(std::mem::take(cell));
        let space = &self.spaces[(n >> INDEX_BITS) as usize];
        // SAFETY: published before `n` was handed out (as in `cell`).
        let m = unsafe { &*space.mem.load(Ordering::Acquire) };
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
            return r;
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
        r
    }
}

impl Drop for Records {
    fn drop(&mut self) {
        for s in &mut self.spaces {
            let mem = *s.mem.get_mut();
            if mem.is_null() {
                continue;
            }
            // SAFETY: allocated by `new_space_mem` / `take` with these layouts, and nothing
            // refers to them once the records are dropped.
            unsafe {
                for seg in &(*mem).segments {
                    let p = seg.load(Ordering::Relaxed);
                    if !p.is_null() {
                        std::alloc::dealloc(p as *mut u8, std::alloc::Layout::new::<Segment>());
                    }
                }
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
    fn numbers_are_reused_once_released_and_records_round_trip() {
        let r = Records::new();
        // SAFETY: one thread: it owns every space and stands for the state lock's holder.
        unsafe {
            let a = r.take(3);
            let b = r.take(3);
            assert_ne!(a, 0);
            assert_ne!(a, b);
            assert_eq!(a >> INDEX_BITS, 3);
            assert_eq!(r.get(a), None, "fresh: no allocation applied");
            let rec = Record {
                sim: 7,
                ec: crate::IGNORED,
                ignored: true,
            };
            r.set(a, rec);
            assert!(r.is_live(a));
            assert_eq!(r.get(a), Some(rec));
            assert_eq!(r.release(a), Some(rec));
            assert!(!r.is_live(a));
            assert_eq!(r.take(3), a, "released numbers come back");
            assert_eq!(r.get(0), None);
        }
    }

    #[test]
    fn a_full_ring_keeps_numbers_for_later() {
        let r = Records::new();
        // SAFETY: as above.
        unsafe {
            let n: Vec<u32> = (0..RING + 100).map(|_| r.take(0)).collect();
            for &k in &n {
                r.set(
                    k,
                    Record {
                        sim: k & INDEX_MASK,
                        ec: 1,
                        ignored: false,
                    },
                );
            }
            for &k in &n {
                assert_eq!(r.release(k).map(|x| x.sim), Some(k & INDEX_MASK));
            }
            // RING in the ring, 100 waiting; taking some makes room for those.
            let mut again: Vec<u32> = (0..RING + 100).map(|_| r.take(0)).collect();
            // Every released number came back before any fresh one.
            let fresh = again
                .iter()
                .filter(|&&k| k & INDEX_MASK > (RING + 100) as u32)
                .count();
            assert!(fresh <= 100, "{fresh} fresh numbers");
            again.sort();
            again.dedup();
            assert_eq!(again.len(), RING + 100, "no number handed out twice");
        }
    }
}
