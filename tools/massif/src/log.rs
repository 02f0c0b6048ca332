//! Per-thread logs of heap events, so that no allocation takes the process-wide state lock.
//!
//! Massif's state is one serial history: Valgrind's allocator replayed (module `arena`), the
//! heap totals, the clock of `--time-unit=B` (bytes allocated and freed so far) and the
//! snapshots taken along it. Valgrind builds it from one thread at a time, since it runs one
//! thread at a time. Here threads run in parallel, so each event is first appended to a log
//! of the thread's own (one of [`SLOTS`], chosen by thread id, each behind its own lock,
//! which threads rarely share), and the logs are applied to the state in batches, under the
//! state lock, by whichever thread fills its log (or by `fini`, or by an event that must see
//! the state up to date). A thread takes the state lock about once per [`FLUSH`] events, and
//! only waits for it when its log is full ([`CAPACITY`]).
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

use oxgrind_tool::{Addr, Alloc, Free};

use crate::sync::SpinLock;
use crate::Clock;

/// Logs: threads are spread over them by thread id.
pub(crate) const SLOTS: usize = 64;
/// Events a log holds before its thread applies the logs, if the state lock is free.
pub(crate) const FLUSH: usize = 64;
/// Events a log holds at most: its thread then waits for the state lock.
pub(crate) const CAPACITY: usize = 256;

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

pub(crate) struct Logs {
    slots: [SpinLock<Vec<Event>>; SLOTS],
}

impl Logs {
    pub(crate) const fn new() -> Self {
        Logs {
            slots: [const { SpinLock::new(Vec::new()) }; SLOTS],
        }
    }

    /// Appends `ev` to the log of thread `tid`; returns how many events that log holds.
    #[inline]
    pub(crate) fn push(&self, tid: i32, ev: Event) -> usize {
        let mut log = self.slots[tid as u32 as usize % SLOTS].lock();
        if log.capacity() == 0 {
            log.reserve_exact(CAPACITY);
        }
        log.push(ev);
        log.len()
    }

    /// Moves every log's events to the back of `pending` (one queue per log), oldest first.
    pub(crate) fn take_all(&self, pending: &mut [std::collections::VecDeque<Event>]) -> bool {
        let mut any = false;
        for (slot, queue) in self.slots.iter().zip(pending.iter_mut()) {
            let mut log = slot.lock();
            if !log.is_empty() {
                any = true;
                queue.extend(log.drain(..));
            }
        }
        any
    }

    /// # Safety
    /// Only in a single-threaded child right after `fork`.
    pub(crate) unsafe fn force_unlock(&self) {
        for s in &self.slots {
            // SAFETY: forwarded to the caller.
            unsafe { s.force_unlock() };
        }
    }
}
