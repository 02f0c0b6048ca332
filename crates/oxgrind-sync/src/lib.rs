//! A spin lock that needs nothing: no futex word shared with libc, no TLS, no allocation.
//!
//! oxgrind's critical sections inside the program are short (a hash-table update, a
//! snapshot), so spinning costs less than a futex round trip and keeps working in states
//! where libc's locks do not (a hook running inside `fork`'s child, a fatal-signal handler).
//! A thread that has spun for much longer than any critical section lasts sleeps on the lock
//! word (a private futex, a raw system call) instead: the holder was preempted, and with more
//! threads than cores the spinner may be what keeps it from running again. Spinning on
//! with a `sched_yield` back-off, as before, took about 5% of Memcheck's CPU time on bench
//! threads (four threads on two cores, a loaded machine: perf samples in the pause loops and
//! in `sched_yield`; 0.6% after) though only about one acquisition in 2,500 of the block
//! table's found its lock held: each waited out the holder's lost time slice.
//!
//! It is not reentrant: code that may be re-entered on the same thread (a signal handler
//! writing the final report) uses [`SpinLock::lock_bounded`], which never sleeps, so a lock
//! held by the interrupted frame cannot hang the process.

#![no_std]

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicU32, Ordering};

pub struct SpinLock<T> {
    /// [`FREE`], [`HELD`] or [`HELD_WITH_SLEEPERS`]: a futex word.
    state: AtomicU32,
    value: UnsafeCell<T>,
}

const FREE: u32 = 0;
const HELD: u32 = 1;
/// Held, and a thread may be asleep on the word: the unlock wakes one.
const HELD_WITH_SLEEPERS: u32 = 2;

/// Rounds of `pause` before a waiter sleeps: a few microseconds, many times a critical
/// section's length, so a waiter sleeps only when the holder is not running.
const SPINS_BEFORE_SLEEP: u32 = 128;
/// The longest sleep before a waiter looks again. The unlock reads the word and then clears
/// it (a plain store: a locked instruction there would wait for every store the critical
/// section made, on every unlock), so a waiter that marks the word between the two sleeps
/// unwoken: this bounds that rare miss.
const SLEEP_NS: i64 = 200_000;

// SAFETY: access to `value` is serialised by `state` (acquire on lock, release on unlock),
// so sharing the lock between threads is sound whenever T itself may move between threads.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: as above; the lock owns its T.
unsafe impl<T: Send> Send for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> Self {
        SpinLock {
            state: AtomicU32::new(FREE),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        if self
            .state
            .compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            Some(SpinGuard { lock: self })
        } else {
            None
        }
    }

    /// Whether the lock is held now (a relaxed read, which may be stale): lets a caller
    /// that only offers to do work under the lock skip its `try_lock`, whose atomic
    /// exchange takes the lock's cache line from the holder on every try.
    #[inline]
    pub fn is_locked(&self) -> bool {
        self.state.load(Ordering::Relaxed) != FREE
    }

    #[inline]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        if let Some(g) = self.try_lock() {
            return g;
        }
        self.lock_contended()
    }

    /// Spins a little, then sleeps on the word until the lock is free.
    #[cold]
    fn lock_contended(&self) -> SpinGuard<'_, T> {
        for _ in 0..SPINS_BEFORE_SLEEP {
            core::hint::spin_loop();
            if self.state.load(Ordering::Relaxed) == FREE {
                if let Some(g) = self.try_lock() {
                    return g;
                }
            }
        }
        // Taken with the mark set: this thread cannot tell whether others sleep, so its
        // unlock wakes one in case (Drepper, "Futexes Are Tricky", mutex 3).
        while self.state.swap(HELD_WITH_SLEEPERS, Ordering::Acquire) != FREE {
            futex_wait(&self.state, HELD_WITH_SLEEPERS, SLEEP_NS);
        }
        SpinGuard { lock: self }
    }

    /// Tries for about `spins` rounds, then gives up: for paths (fatal signals, exit) where
    /// the holder may be the very frame that was interrupted.
    pub fn lock_bounded(&self, spins: u64) -> Option<SpinGuard<'_, T>> {
        self.try_lock().or_else(|| self.lock_slow(spins))
    }

    #[cold]
    fn lock_slow(&self, spins: u64) -> Option<SpinGuard<'_, T>> {
        let mut n: u64 = 0;
        loop {
            while self.state.load(Ordering::Relaxed) != FREE {
                n += 1;
                if n >= spins {
                    return None;
                }
                if n % 64 == 0 {
                    sched_yield();
                } else {
                    core::hint::spin_loop();
                }
            }
            if let Some(g) = self.try_lock() {
                return Some(g);
            }
        }
    }

    /// Forces the lock open. Only for a child after `fork`, where the holder no longer
    /// exists.
    ///
    /// # Safety
    /// No live guard of this lock may be used afterwards.
    pub unsafe fn force_unlock(&self) {
        self.state.store(FREE, Ordering::Release);
    }

    /// The value, bypassing the lock.
    ///
    /// # Safety
    /// The caller must guarantee that no other thread can touch the value (single-threaded
    /// start-up, or every other thread stopped).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn get_unchecked(&self) -> &mut T {
        // SAFETY: forwarded to the caller.
        unsafe { &mut *self.value.get() }
    }
}

pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: holding the guard means holding the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: holding the guard means holding the lock exclusively.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        let state = &self.lock.state;
        if state.load(Ordering::Relaxed) == HELD_WITH_SLEEPERS {
            state.store(FREE, Ordering::Release);
            futex_wake(state, 1);
        } else {
            state.store(FREE, Ordering::Release);
        }
    }
}

/// `sched_yield(2)`, made directly: the lock must work where libc cannot be called.
fn sched_yield() {
    const SYS_SCHED_YIELD: usize = 24;
    // SAFETY: sched_yield takes no arguments and touches no memory; the kernel clobbers
    // rcx and r11 (declared) and returns in rax.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") SYS_SCHED_YIELD => _,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack)
        );
    }
}

const SYS_FUTEX: usize = 202;
const FUTEX_WAIT_PRIVATE: usize = 128;
const FUTEX_WAKE_PRIVATE: usize = 128 | 1;

/// `futex(FUTEX_WAIT_PRIVATE)`: sleeps while `word` holds `expected`, for at most `ns`
/// nanoseconds (or until woken, or a signal), made directly (no libc: no `errno`, nothing of
/// the program's). Every outcome sends the caller back to look at the word, so errors are
/// ignored. The one place the workspace waits on a word (the lock below, Massif's snapshot
/// gate).
#[cold]
pub fn futex_wait(word: &AtomicU32, expected: u32, ns: i64) {
    let timeout: [i64; 2] = [ns / 1_000_000_000, ns % 1_000_000_000];
    // SAFETY: futex(FUTEX_WAIT_PRIVATE) reads the aligned word and the timespec, both live
    // for the call, and writes nothing of ours; the kernel clobbers rcx and r11 (declared)
    // and returns in rax.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") SYS_FUTEX => _,
            in("rdi") word.as_ptr(),
            in("rsi") FUTEX_WAIT_PRIVATE,
            in("rdx") expected as usize,
            in("r10") timeout.as_ptr(),
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack)
        );
    }
}

/// `futex(FUTEX_WAKE_PRIVATE)`: wakes up to `count` threads asleep on `word`
/// ([`futex_wait`]), if any.
#[cold]
pub fn futex_wake(word: &AtomicU32, count: u32) {
    // SAFETY: futex(FUTEX_WAKE_PRIVATE) only looks the word's address up in the kernel's
    // wait queues; the kernel clobbers rcx and r11 (declared) and returns in rax.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") SYS_FUTEX => _,
            in("rdi") word.as_ptr(),
            in("rsi") FUTEX_WAKE_PRIVATE,
            in("rdx") count.min(i32::MAX as u32) as usize,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack)
        );
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::sync::Arc;
    use std::vec::Vec;

    /// More threads than cores, each holding the lock across a sleep now and then (a
    /// preempted holder), so waiters reach the futex sleep: every increment is kept, and every
    /// waiter gets the lock.
    #[test]
    fn contended_lock_excludes_and_wakes_sleepers() {
        const THREADS: usize = 8;
        const ROUNDS: u64 = 20_000;
        let lock = Arc::new(SpinLock::new((0u64, false)));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for i in 0..ROUNDS {
                        let mut g = lock.lock();
                        assert!(!g.1, "two holders at once");
                        g.1 = true;
                        g.0 += 1;
                        if (i + t as u64) % 2_000 == 0 {
                            std::thread::sleep(std::time::Duration::from_micros(300));
                        }
                        g.1 = false;
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(lock.lock().0, THREADS as u64 * ROUNDS);
        assert!(!lock.is_locked());
        assert_eq!(lock.state.load(Ordering::Relaxed), FREE);
    }

    #[test]
    fn bounded_lock_gives_up_on_a_lock_held_for_good() {
        let lock = SpinLock::new(());
        let held = lock.lock();
        assert!(lock.lock_bounded(1_000).is_none());
        drop(held);
        assert!(lock.lock_bounded(1_000).is_some());
    }
}
