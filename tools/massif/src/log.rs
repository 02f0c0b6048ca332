//! Per-thread logs of heap events, so that no allocation takes the process-wide state lock.
//!
//! Massif's state is one serial history: Valgrind's allocator replayed (module `arena`), the
//! heap totals, the clock of `--time-unit=B` (bytes allocated and freed so far) and the
//! snapshots taken along it. Valgrind builds it from one thread at a time, since it runs one
//! thread at a time. Here threads run in parallel, so each event is first appended to a log
//! of the thread's own, and the logs are applied to the state in batches, under the state
//! lock, by whichever thread fills its log (or by `fini`, or by an event that must see the
//! state up to date). A thread offers to apply the logs at every event once its log holds
//! [`FLUSH`] events, taking the state lock only if it is free, and waits for it only when its
//! log holds [`LIMIT`] events.
//!
//! Threads are spread over [`SLOTS`] slots by thread id. The first thread to log in a slot
//! owns its ring: a single-producer, single-consumer queue that the owner appends to without
//! any atomic read-modify-write (one release store of its head), and that the thread
//! applying the logs (always under the state lock, so one at a time) empties. A lock per
//! append cost a locked instruction on every event, which waited for the program's stores
//! to drain. A thread whose slot another thread owns (more than [`SLOTS`] threads, or a
//! dead owner's slot) appends to the slot's shared log, behind a spin lock, as every thread
//! did before. A thread always uses the same one of the two, so its events keep their
//! order.
//!
//! The limit is far above the flush mark on purpose. Applying is serial, and the thread doing
//! it can be preempted while it holds the state lock (four program threads on two cores, or
//! a busy machine): with a limit close to the flush mark every other thread soon filled its
//! log and waited, spinning and yielding, for a thread that was not even running. With room
//! for a few milliseconds of events, the others keep running the program meanwhile, and the
//! next of them to log an event after the holder is done applies everything logged. A log
//! grows past [`RESERVE`] only while another thread holds the state lock.
//!
//! The order of application is a serialisation of the threads' histories, as Valgrind's
//! scheduler makes one:
//!
//! * each thread's events keep their order (one log holds them in the order they were
//!   appended);
//! * events of different threads on one address keep theirs: an allocation is applied only
//!   once no live block holds its address (the free that gave the address back, on another
//!   thread, comes first), a free or realloc only once its block is live. The runtime tells
//!   the tool of a free before glibc gets the block back, so the event that must come first
//!   is always already in some log: when no log's next event can be applied, the logs are
//!   read again;
//! * events of different threads on different addresses interleave by batch, as threads
//!   under Valgrind interleave by time slice.
//!
//! So the snapshots are consistent: each is the state after a prefix of that serialisation,
//! every block in it allocated and not yet freed in it, its totals the sums of its blocks.
//! Times never go backwards (`Massif::now` keeps them monotonic: an event's reading of the
//! `ms` or `i` clock is taken when it happens, before it waits in a log). A single-threaded
//! program's events are applied in their own order, so its output is the one a lock per event
//! gave, Valgrind's.

use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use oxgrind_tool::{Addr, Alloc, Free};

use crate::sync::SpinLock;
use crate::Clock;

/// Slots: threads are spread over them by thread id.
pub(crate) const SLOTS: usize = 64;
/// Events a log holds before its thread applies the logs, if the state lock is free.
pub(crate) const FLUSH: usize = 128;
/// Room a shared log is given at first, and a pending batch at least.
pub(crate) const RESERVE: usize = 512;
/// Events a log holds at most: its thread then waits for the state lock (a ring's size; an
/// event is at most 136 bytes, so 544 KiB per thread that allocates).
pub(crate) const LIMIT: usize = 4096;

/// A heap event as a thread recorded it, with its clock reading.
#[derive(Copy, Clone, Debug)]
pub(crate) enum Event {
    Alloc(Alloc, Clock),
    Free(Free, Clock),
    Realloc(Free, Alloc, Clock),
}

impl Event {
    /// The block it needs live (`Some`), and the address it needs not live.
    pub(crate) fn needs(&self) -> (Option<Addr>, Option<Addr>) {
        match self {
            Event::Alloc(a, _) => (None, Some(a.addr)),
            Event::Free(f, _) => (Some(f.addr), None),
            Event::Realloc(f, a, _) => (Some(f.addr), (a.addr != f.addr).then_some(a.addr)),
        }
    }
}

/// A slot's ring and shared log, alone in their cache lines: threads have consecutive ids, so
/// packed side by side two threads' slots shared lines, and every append bounced a line
/// between two cores.
#[repr(align(128))]
struct Slot {
    /// The thread that appends to `ring` (0: none yet).
    owner: AtomicI32,
    /// Events appended to the ring so far (written by the owner only).
    head: AtomicUsize,
    /// Events taken from the ring so far (written under the state lock only).
    tail: AtomicUsize,
    /// [`LIMIT`] events, allocated by the owner before its first append (null until then).
    ring: AtomicPtr<Event>,
    /// The log of the other threads of this slot.
    shared: SpinLock<Vec<Event>>,
}

pub(crate) struct Logs {
    slots: [Slot; SLOTS],
    /// Bit `i` set: slot `i`'s ring has an owner, so applying the logs looks at its ring
    /// (an owner's append cannot tell whether a reader saw the ring empty just before
    /// without a fence; a reader looks at every owned ring instead).
    owned: AtomicU64,
    /// Bit `i` set: slot `i`'s shared log may hold events (set by the append that makes it
    /// non-empty), so applying the logs visits only those.
    busy: AtomicU64,
}

/// Events taken from one shared log and not applied yet: `events[next..]`.
#[derive(Default)]
pub(crate) struct Pending {
    pub(crate) events: Vec<Event>,
    pub(crate) next: usize,
}

impl Pending {
    #[inline]
    pub(crate) fn front(&self) -> Option<Event> {
        self.events.get(self.next).copied()
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.next >= self.events.len()
    }
}

/// What [`Logs::push`] did.
pub(crate) enum Pushed {
    /// Appended; the log now holds this many events.
    Holds(usize),
    /// The thread's ring is full: apply the logs, then push again.
    Full,
}

impl Logs {
    pub(crate) const fn new() -> Self {
        Logs {
            slots: [const {
                Slot {
                    owner: AtomicI32::new(0),
                    head: AtomicUsize::new(0),
                    tail: AtomicUsize::new(0),
                    ring: AtomicPtr::new(std::ptr::null_mut()),
                    shared: SpinLock::new(Vec::new()),
                }
            }; SLOTS],
            owned: AtomicU64::new(0),
            busy: AtomicU64::new(0),
        }
    }

    /// Appends `ev` to the log of thread `tid`.
    #[inline]
    pub(crate) fn push(&self, tid: i32, ev: Event) -> Pushed {
        let i = tid as u32 as usize % SLOTS;
        let slot = &self.slots[i];
        let owner = slot.owner.load(Ordering::Relaxed);
        let mine = owner == tid || (owner == 0 && tid != 0 && self.claim(i, tid));
        if !mine {
            return self.push_shared(i, ev);
        }
        let head = slot.head.load(Ordering::Relaxed);
        let n = head.wrapping_sub(slot.tail.load(Ordering::Acquire));
        if n >= LIMIT {
            return Pushed::Full;
        }
        let ring = slot.ring.load(Ordering::Relaxed);
        // SAFETY: this thread owns the ring (only the owner appends, and a thread runs one
        // append at a time: the runtime keeps allocator events out of its own code, so a
        // signal handler cannot nest one), `ring` points to LIMIT events allocated by
        // `claim`, and the entry `head % LIMIT` is outside `[tail, head)`, which is all the
        // consumer reads; the release store below publishes it.
        unsafe { ring.add(head % LIMIT).write(ev) };
        slot.head.store(head.wrapping_add(1), Ordering::Release);
        Pushed::Holds(n + 1)
    }

    /// Makes `tid` the owner of `slot`'s ring, if no thread is; whether it did.
    #[cold]
    fn claim(&self, i: usize, tid: i32) -> bool {
        let slot = &self.slots[i];
        if slot.ring.load(Ordering::Acquire).is_null() {
            let ring: Box<[std::mem::MaybeUninit<Event>]> = Box::new_uninit_slice(LIMIT);
            let ring = Box::into_raw(ring) as *mut Event;
            if slot
                .ring
                .compare_exchange(
                    std::ptr::null_mut(),
                    ring,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err()
            {
                // SAFETY: allocated just above as LIMIT entries and never published.
                drop(unsafe {
                    Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                        ring as *mut std::mem::MaybeUninit<Event>,
                        LIMIT,
                    ))
                });
            }
        }
        let claimed = slot
            .owner
            .compare_exchange(0, tid, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if claimed {
            // Before the owner's first append, which comes after this in its own order; a
            // reader that sees the append (acquiring `head`) sees the bit.
            self.owned.fetch_or(1 << i, Ordering::Release);
        }
        claimed
    }

    #[cold]
    fn push_shared(&self, i: usize, ev: Event) -> Pushed {
        let mut log = self.slots[i].shared.lock();
        if log.capacity() == 0 {
            log.reserve_exact(RESERVE);
        }
        log.push(ev);
        let n = log.len();
        if n == 1 {
            self.busy.fetch_or(1 << i, Ordering::Relaxed);
        }
        Pushed::Holds(n)
    }

    /// Moves every shared log's events behind the ones already pending for it (one
    /// [`Pending`] per slot), oldest first, by swapping vectors when nothing of it is
    /// pending, so an event is not copied again. Whether any event was taken. Rings are read
    /// in place instead ([`Logs::ring_range`]). Called under the state lock only. `spins`:
    /// `u64::MAX` waits for each shared log's lock; a smaller number gives up on a log
    /// whose lock stays taken that many tries (at the end, when a fatal signal may have
    /// stopped a thread in the middle of an append; an append to a ring stopped halfway is
    /// simply not there yet).
    pub(crate) fn take_all_within(&self, pending: &mut [Pending], spins: u64) -> bool {
        let mut any = false;
        let mut busy = self.busy.swap(0, Ordering::Relaxed);
        while busy != 0 {
            let i = busy.trailing_zeros() as usize;
            busy &= busy - 1;
            let slot = &self.slots[i];
            let p = &mut pending[i];
            let log = if spins == u64::MAX {
                Some(slot.shared.lock())
            } else {
                slot.shared.lock_bounded(spins)
            };
            let Some(mut log) = log else {
                // Left for a later look.
                self.busy.fetch_or(1 << i, Ordering::Relaxed);
                continue;
            };
            if log.is_empty() {
                continue;
            }
            any = true;
            if p.is_empty() {
                p.events.clear();
                p.next = 0;
                if p.events.capacity() < RESERVE {
                    p.events.reserve_exact(RESERVE);
                }
                core::mem::swap(&mut p.events, &mut *log);
            } else {
                p.events.extend(log.drain(..));
            }
        }
        any
    }

    /// The slots whose ring has an owner (bit `i`: slot `i`).
    #[inline]
    pub(crate) fn owned_rings(&self) -> u64 {
        self.owned.load(Ordering::Acquire)
    }

    /// Ring `i`'s events not taken yet: `[tail, head)`, as absolute positions. Under the
    /// state lock only (the one reader).
    #[inline]
    pub(crate) fn ring_range(&self, i: usize) -> (usize, usize) {
        let slot = &self.slots[i];
        (
            slot.tail.load(Ordering::Relaxed),
            slot.head.load(Ordering::Acquire),
        )
    }

    /// The event at position `pos` of ring `i`, read in place. `pos` must lie in a range
    /// [`Logs::ring_range`] returned, not yet released by [`Logs::ring_release`].
    #[inline]
    pub(crate) fn ring_event(&self, i: usize, pos: usize) -> &Event {
        let ring = self.slots[i].ring.load(Ordering::Relaxed);
        debug_assert!(!ring.is_null());
        // SAFETY: the position is between the ring's tail and a head read with acquire, so
        // its entry was written (in the LIMIT entries `claim` allocated, published before
        // the owner's first append) before that head was stored; the owner writes it again
        // only after `ring_release` moves the tail past it, which the caller does only
        // once done with the reference.
        unsafe { &*ring.add(pos % LIMIT) }
    }

    /// Gives back ring `i`'s room up to position `pos` (its events have been applied).
    #[inline]
    pub(crate) fn ring_release(&self, i: usize, pos: usize) {
        self.slots[i].tail.store(pos, Ordering::Release);
    }

    /// # Safety
    /// Only in a single-threaded child right after `fork`.
    pub(crate) unsafe fn force_unlock(&self) {
        for s in &self.slots {
            // SAFETY: forwarded to the caller.
            unsafe { s.shared.force_unlock() };
        }
    }
}

impl Drop for Logs {
    fn drop(&mut self) {
        for s in &self.slots {
            let ring = s.ring.load(Ordering::Acquire);
            if !ring.is_null() {
                // SAFETY: allocated by `claim` as LIMIT entries; `&mut self`: no one else
                // uses it. Events are Copy: nothing to drop in them.
                drop(unsafe {
                    Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                        ring as *mut std::mem::MaybeUninit<Event>,
                        LIMIT,
                    ))
                });
            }
        }
    }
}
