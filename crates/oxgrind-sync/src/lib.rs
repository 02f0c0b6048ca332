//! A spin lock that needs nothing: no futex word shared with libc, no TLS, no allocation.
//!
//! oxgrind's critical sections inside the program are short (a hash-table update, a
//! snapshot), so spinning with a `sched_yield` back-off costs less than a futex round trip and
//! keeps working in states where libc's locks do not (a hook running inside `fork`'s child,
//! a fatal-signal handler). It is not reentrant: code that may be re-entered on the same
//! thread (a signal handler writing the final report) uses [`SpinLock::lock_bounded`] so a
//! lock held by the interrupted frame cannot hang the process.

#![no_std]

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, Ordering};

pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialised by `locked` (acquire on lock, release on unlock),
// so sharing the lock between threads is sound whenever T itself may move between threads.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: as above; the lock owns its T.
unsafe impl<T: Send> Send for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        if self
            .locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
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
        self.locked.load(Ordering::Relaxed)
    }

    #[inline]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        if let Some(g) = self.try_lock() {
            return g;
        }
        self.lock_slow(u64::MAX)
            .expect("unbounded lock always succeeds")
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
            while self.locked.load(Ordering::Relaxed) {
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
        self.locked.store(false, Ordering::Release);
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
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
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
