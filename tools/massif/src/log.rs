//! Per-thread logs of heap events, so that no allocation takes the process-wide state lock.
//!
//! Massif's state is one serial history: Valgrind's allocator replayed (module `arena`), the
//! heap totals, the clock of `--time-unit=B` (bytes allocated and freed so far) and the
//! snapshots taken along it. Valgrind builds it from one thread at a time, since it runs one
//! thread at a time. Here threads run in parallel, so each event is first appended to a log
//! of the thread's own (one of [`SLOTS`], chosen by thread id, each behind its own lock,
//! which threads rarely share), and the logs are applied to the state in batches, under the
//! state lock, by whichever thread fills its log (or by `fini`, or by an event that must see
//! the state up to date). A thread offers to apply the logs at every event once its log
//! holds [`FLUSH`] events, taking the state lock only if it is free, and waits for it only
//! when its log holds [`LIMIT`] events.
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

use std::sync::atomic::{AtomicU64, Ordering};

use oxgrind_tool::{Addr, Alloc, Free};

use crate::sync::SpinLock;
use crate::Clock;

/// Logs: threads are spread over them by thread id.
pub(crate) const SLOTS: usize = 64;
/// Events a log holds before its thread applies the logs, if the state lock is free.
pub(crate) const FLUSH: usize = 128;
/// Room a log is given at first, and a pending batch at least.
pub(crate) const RESERVE: usize = 512;
/// Events a log holds at most: its thread then waits for the state lock. An event is at most
/// 136 bytes, so about 1.1 MiB per thread at worst.
pub(crate) const LIMIT: usize = 8192;

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

/// One log, alone in its cache lines: threads have consecutive ids, so unpadded their logs'
/// locks shared lines, and every append bounced a line between two cores.
#[repr(align(128))]
struct Slot(SpinLock<Vec<Event>>);

pub(crate) struct Logs {
    slots: [Slot; SLOTS],
    /// Bit `i` set: log `i` may hold events (set by the append that makes it non-empty), so
    /// applying the logs visits only those.
    busy: AtomicU64,
}

/// Events taken from one log and not applied yet: `events[next..]`.
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

impl Logs {
    pub(crate) const fn new() -> Self {
        Logs {
            slots: [const { Slot(SpinLock::new(Vec::new())) }; SLOTS],
            busy: AtomicU64::new(0),
        }
    }

    /// Appends `ev` to the log of thread `tid`; returns how many events that log holds.
    #[inline]
    pub(crate) fn push(&self, tid: i32, ev: Event) -> usize {
        let i = tid as u32 as usize % SLOTS;
        let mut log = self.slots[i].0.lock();
        if log.capacity() == 0 {
            log.reserve_exact(RESERVE);
        }
        log.push(ev);
        let n = log.len();
        if n == 1 {
            self.busy.fetch_or(1 << i, Ordering::Relaxed);
        }
        n
    }

    /// Moves every log's events behind the ones already pending for it (one [`Pending`] per
    /// log), oldest first: by swapping vectors when nothing of that log is pending, so an
    /// event is not copied again. Whether any event was taken. `spins`: `u64::MAX` waits
    /// for each log's lock; a smaller number gives up on a log whose lock stays taken that
    /// many tries (at the end, when a fatal signal may have stopped a thread in the middle
    /// of an append).
    pub(crate) fn take_all_within(&self, pending: &mut [Pending], spins: u64) -> bool {
        let mut any = false;
        let mut busy = self.busy.swap(0, Ordering::Relaxed);
        while busy != 0 {
            let i = busy.trailing_zeros() as usize;
            busy &= busy - 1;
            let p = &mut pending[i];
            let log = if spins == u64::MAX {
                Some(self.slots[i].0.lock())
            } else {
                self.slots[i].0.lock_bounded(spins)
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

    /// # Safety
    /// Only in a single-threaded child right after `fork`.
    pub(crate) unsafe fn force_unlock(&self) {
        for s in &self.slots {
            // SAFETY: forwarded to the caller.
            unsafe { s.0.force_unlock() };
        }
    }
}
