//! The heap's current size in bytes, counted per thread, with the global maximum still
//! found exactly.
//!
//! Why: a single atomic that every allocation and free of every thread adds to moves its
//! cache line from core to core at every event; on bench `threads` (four threads churning
//! the heap) it was about 60% of `Heap::free`'s samples and 75% of `Heap::alloc`'s. Yet
//! DHAT must know the size exactly at the moments that matter: when the heap reaches
//! (`>=`) its maximum after growing, and when it is at its maximum before shrinking
//! (Valgrind's `intro_Block` / `resize_Block` tests and `check_for_peak`).
//!
//! The design is a credit scheme. The size is split into
//!
//! * a `base`, in the [`Ledger`] (kept under the heap's peak lock), and
//! * one `delta` per [`Slot`] (threads pick theirs by thread id; a slot is a cache-line
//!   padded spin lock that only its threads take, save for the rare revocation below).
//!
//! The size is `base + Σ delta`. A slot may change its delta on its own (the fast path,
//! [`Slots::local`]) only within a window `[lo, hi]` granted under the peak lock; the sum
//! of every credited slot's `hi` is the ledger's `granted`. Credit is granted only while
//! `base + granted < max`, so that as long as every credited slot's delta stays at most its
//! `hi`, the size is at most `base + granted`, below the maximum: no event within the
//! windows can reach the maximum, nor free at it. An event that would leave its slot's
//! window goes to the slow path (the caller's, under the peak lock): its slot is settled
//! (delta folded into `base`, credit returned), and if `base + granted` (+ the growth)
//! still cannot reach the maximum the event is counted in `base` and is no peak; otherwise
//! every credited slot is revoked (locked in turn, settled, left with an empty window so
//! that each of its events comes to the slow path), after which `base` is the size exactly
//! and every event is serialised by the peak lock until credit is granted again: the peak
//! tests are Valgrind's, on the exact size. After each slow event the slot gets credit
//! again, half the room left below the maximum (at most [`CREDIT`]): far from the peak the
//! threads run on their own, near it they meet at the lock, as every thread did at every
//! event before.
//!
//! With one thread the slow path is taken at exactly the events that may be peaks, and the
//! size there is exact: the sequence of maxima is Valgrind's. With several, every event is
//! counted once, in its slot or in `base`, so totals are exact, and the maximum is the one
//! of the order in which the events were counted.

use oxgrind_tool::sync::SpinLock;

/// Slots threads are spread over (by thread id): a bit each in [`Ledger::credited`].
pub const SLOTS: usize = 64;

/// The most credit a slot is granted at once, and how far below its settled value its
/// delta may fall before it settles again (frees of blocks other threads allocated make a
/// thread's delta fall without bound; the further, the less tight `base + granted` is as a
/// bound of the size). A thread settles at most once per this many bytes of net change
/// while far from the peak.
pub const CREDIT: i64 = 64 << 10;

/// A slot's bytes (and blocks) not yet in the [`Ledger`], and the window its bytes may
/// move in alone.
#[derive(Debug)]
struct Window {
    delta: i64,
    blocks: i64,
    lo: i64,
    hi: i64,
}

/// No credit: every event of the slot goes to the slow path (`lo > hi`: even a change of 0
/// bytes, a same-size `realloc`, which may be a peak).
const EMPTY: Window = Window {
    delta: 0,
    blocks: 0,
    lo: 1,
    hi: 0,
};

/// A slot on cache lines of its own (128 bytes: the spatial prefetcher pulls lines in
/// pairs): the threads of one slot never slow another's.
#[repr(align(128))]
struct Slot(SpinLock<Window>);

/// The shared part of the size, kept under the heap's peak lock.
#[derive(Debug, Default)]
pub struct Ledger {
    /// The size, less the deltas of the credited slots.
    base: i64,
    /// The number of live blocks, likewise (exact when the size is: a new maximum's).
    blocks: i64,
    /// The sum of the credited slots' `hi`: the size is at most `base + granted`.
    granted: i64,
    /// Slots holding credit (bit `i`: slot `i`); none: `base` is the size, exactly.
    credited: u64,
}

impl Ledger {
    /// An upper bound of the heap's size (the size itself when no slot holds credit).
    pub fn bound(&self) -> i64 {
        self.base + self.granted
    }

    /// Whether no slot holds credit: then [`Ledger::base`] is the size.
    pub fn exact(&self) -> bool {
        self.credited == 0
    }

    /// The settled part of the size (the size itself when [`Ledger::exact`]).
    pub fn base(&self) -> i64 {
        self.base
    }

    /// The settled part of the number of live blocks (all of it when [`Ledger::exact`]).
    pub fn blocks(&self) -> i64 {
        self.blocks
    }

    /// Counts a change of the size by `d` bytes and `blocks` blocks made on the slow path.
    pub fn add(&mut self, d: i64, blocks: i64) {
        self.base += d;
        self.blocks += blocks;
    }
}

/// Every slot: the unsettled part of the size.
pub struct Slots {
    slots: Box<[Slot]>,
}

impl Default for Slots {
    fn default() -> Self {
        Self::new()
    }
}

impl Slots {
    pub fn new() -> Self {
        Slots {
            slots: (0..SLOTS).map(|_| Slot(SpinLock::new(EMPTY))).collect(),
        }
    }

    #[inline]
    fn slot(&self, thread: u32) -> &SpinLock<Window> {
        &self.slots[thread as usize % SLOTS].0
    }

    /// The fast path: counts a change of `d` bytes and `blocks` blocks by `thread` in its
    /// slot if the slot's window allows it (then the event is no peak, see the module
    /// docs), else changes nothing and returns `false` (the caller takes the slow path).
    #[inline]
    pub fn local(&self, thread: u32, d: i64, blocks: i64) -> bool {
        let mut w = self.slot(thread).lock();
        let n = w.delta + d;
        if n < w.lo || n > w.hi {
            return false;
        }
        w.delta = n;
        w.blocks += blocks;
        true
    }

    /// Folds `thread`'s slot into the ledger and takes its credit back (its window left
    /// empty). Under the peak lock (`ledger`).
    pub fn settle(&self, ledger: &mut Ledger, thread: u32) {
        let i = thread as usize % SLOTS;
        if ledger.credited & (1 << i) == 0 {
            // Never granted (or revoked since): its delta is 0 and its window empty.
            return;
        }
        let mut w = self.slots[i].0.lock();
        Self::fold(ledger, i, &mut w);
    }

    fn fold(ledger: &mut Ledger, i: usize, w: &mut Window) {
        ledger.base += w.delta;
        ledger.blocks += w.blocks;
        ledger.granted -= w.hi;
        ledger.credited &= !(1 << i);
        *w = EMPTY;
    }

    /// Settles every credited slot: afterwards [`Ledger::base`] is the size, and stays so
    /// while the caller holds the peak lock (every slot's events come to the slow path).
    pub fn revoke_all(&self, ledger: &mut Ledger) {
        while ledger.credited != 0 {
            let i = ledger.credited.trailing_zeros() as usize;
            let mut w = self.slots[i].0.lock();
            Self::fold(ledger, i, &mut w);
        }
        debug_assert_eq!(ledger.granted, 0);
    }

    /// [`Slots::revoke_all`] for the end of the run, where a slot's lock may be held by the
    /// frame a fatal signal interrupted: `None` if one stays held.
    pub fn revoke_all_bounded(&self, ledger: &mut Ledger, spins: u64) -> Option<()> {
        while ledger.credited != 0 {
            let i = ledger.credited.trailing_zeros() as usize;
            let mut w = self.slots[i].0.lock_bounded(spins)?;
            Self::fold(ledger, i, &mut w);
        }
        Some(())
    }

    /// Gives `thread`'s slot, just settled, credit again: half the room between the
    /// bound and the maximum `max`, at most [`CREDIT`]. Even no room to grow (the bound
    /// one byte below the maximum) leaves a window for frees, which cannot be at the
    /// maximum then; only at the maximum (or when others' credit reaches it) is the slot
    /// left without a window.
    pub fn grant(&self, ledger: &mut Ledger, thread: u32, max: i64) {
        let i = thread as usize % SLOTS;
        debug_assert_eq!(ledger.credited & (1 << i), 0);
        let room = max - 1 - ledger.bound();
        if room < 0 {
            return;
        }
        let credit = (room / 2).min(CREDIT);
        let mut w = self.slots[i].0.lock();
        *w = Window {
            delta: 0,
            blocks: 0,
            lo: -CREDIT,
            hi: credit,
        };
        ledger.granted += credit;
        ledger.credited |= 1 << i;
    }

    /// After `fork`, in the child: the locks of threads that do not exist there.
    ///
    /// # Safety
    /// Only in a forked child, before any other thread of it can use the slots.
    pub unsafe fn force_unlock(&self) {
        for s in self.slots.iter() {
            // SAFETY: forwarded to the caller: no guard is live in this process.
            unsafe { s.0.force_unlock() };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_keeps_the_bound_below_the_maximum_and_settling_keeps_the_sum() {
        let s = Slots::new();
        let mut l = Ledger::default();
        let max = 1_000_000;
        assert!(!s.local(3, 10, 1), "no credit before the first grant");
        l.add(10, 1);
        s.grant(&mut l, 3, max);
        s.grant(&mut l, 4, max);
        assert!(l.bound() < max);
        assert!(!l.exact());
        assert!(s.local(3, 1000, 1));
        assert!(s.local(4, -500, -1));
        assert!(!s.local(3, CREDIT, 1), "beyond the window");
        // Threads 3 and 67 share a slot.
        assert!(s.local(67, 5, 1));
        s.settle(&mut l, 3);
        assert_eq!((l.base(), l.blocks()), (10 + 1000 + 5, 3));
        assert!(!s.local(3, 1, 1), "settled: an empty window");
        s.revoke_all(&mut l);
        assert!(l.exact());
        assert_eq!((l.base(), l.blocks()), (10 + 1000 + 5 - 500, 2));
        assert!(
            !s.local(4, 0, 0),
            "revoked: even a change of 0 goes to the slow path"
        );
    }

    #[test]
    fn no_credit_at_the_maximum_and_only_frees_just_below_it() {
        let s = Slots::new();
        let mut l = Ledger::default();
        l.add(1000, 1);
        s.grant(&mut l, 0, 1000);
        assert!(l.exact(), "at the maximum: no window");
        assert!(!s.local(0, -1, 0));
        s.grant(&mut l, 0, 1001);
        assert!(!l.exact());
        assert!(!s.local(0, 1, 0), "one byte more would reach the maximum");
        assert!(s.local(0, 0, 0) && s.local(0, -10, -1));
        assert_eq!(l.bound(), 1000);
    }
}
