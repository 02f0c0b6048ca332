//! Descriptor slots oxgrind takes from the program for a moment, and the program's open
//! that found its table full because of one.
//!
//! `open` (like every call that makes a descriptor) takes the lowest free number, and there
//! is no way to ask the kernel for one above the program's `RLIMIT_NOFILE`: a file oxgrind
//! opens while the program runs (the symboliser mapping an object for an error report on
//! one thread) holds one of the program's slots between its `open` and its `close` (or the
//! `fcntl` that moves it up among oxgrind's own, `raw::dup_high`). A program at its limit
//! whose other thread opens a file in that moment gets `EMFILE` where it would not natively
//! (Valgrind has no such moment: it runs one thread at a time).
//!
//! So every such open runs inside a [`Lent`] guard, and the engine, which sees each system
//! call of the program and its result, performs again a call that failed with `EMFILE` while
//! a slot was lent or after one was lent during the call, once the slot is back
//! ([`retry_emfile`]). A call that fails with `EMFILE` has done nothing, so doing it
//! again is what the program would have seen had oxgrind not been there. The cost is one
//! atomic load per system call, and the wait only on that rare failure.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::raw;

/// Slots lent now.
static LENT: AtomicUsize = AtomicUsize::new(0);
/// Slots lent since the process started: a call that overlapped a loan sees it change.
static LOANS: AtomicU64 = AtomicU64::new(0);

/// A descriptor slot of the program's in oxgrind's hands until this is dropped: open the
/// file after taking it and close (or move up) the descriptor before dropping it.
pub struct Lent(());

impl Lent {
    pub fn take() -> Lent {
        // Both before the `open`: a program's call that overlaps it reads either count
        // changed (SeqCst orders them with the caller's later system call on this thread).
        LOANS.fetch_add(1, Ordering::SeqCst);
        LENT.fetch_add(1, Ordering::SeqCst);
        Lent(())
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        LENT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What to hand [`retry_emfile`]: read before a program's system call.
#[inline]
pub fn loans() -> u64 {
    LOANS.load(Ordering::SeqCst)
}

/// Whether a program's system call that returned `result`, with `loans()` read as `before`
/// just before it, must be performed again: it failed with `EMFILE` while a slot was in
/// oxgrind's hands (lent now, or lent and maybe returned meanwhile). Then this waits until
/// no slot is lent (an `open`, a `mmap` and a `close` away, on another thread) first.
pub fn retry_emfile(result: i64, before: u64) -> bool {
    let ours = result == EMFILE_RESULT
        && (LENT.load(Ordering::SeqCst) != 0 || LOANS.load(Ordering::SeqCst) != before);
    if ours {
        while LENT.load(Ordering::SeqCst) != 0 {
            raw::sched_yield();
        }
    }
    ours
}

/// `-EMFILE`, as a system call returns it.
pub const EMFILE_RESULT: i64 = -24;
