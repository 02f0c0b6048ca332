//! The two small pieces of plumbing Massif's event handlers need inside the program: a lock
//! and a hash function.
//!
//! Events arrive on the program's own threads, from inside its `malloc`. A futex-based
//! `std::sync::Mutex` goes through libc's `syscall()` wrapper, which may set `errno`, and
//! `std`'s default hasher seeds itself from `getrandom`; neither belongs in an allocator hook.
//! So the state sits behind a spin lock with a `sched_yield` back-off (critical sections are a
//! hash lookup and a few additions; a snapshot is rarer) and the tables use a fixed
//! multiplicative hash (keys are stack ids and code addresses, not attacker-chosen strings
//! on a network).
//!
//! This mirrors `oxgrind_sys::lock::SpinLock`; tools depend only on `oxgrind-tool` and
//! `oxgrind-formats`, so Massif keeps its own copy of the dozen lines it needs.

use std::cell::UnsafeCell;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: `value` is only reached through a guard, and a guard exists only while `locked` is
// held (acquire on lock, release on unlock), so at most one thread touches `value` at a time.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: the lock owns its value; moving the lock moves the value.
unsafe impl<T: Send> Send for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub(crate) fn new(value: T) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| SpinGuard { lock: self })
    }

    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        match self.try_lock() {
            Some(g) => g,
            None => self
                .lock_slow(u64::MAX)
                .expect("an unbounded wait always ends with the lock"),
        }
    }

    /// Gives up after about `spins` rounds: for `fini` at a fatal signal, where the holder may
    /// be the very frame the signal interrupted.
    pub(crate) fn lock_bounded(&self, spins: u64) -> Option<SpinGuard<'_, T>> {
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
                if n & 63 == 0 {
                    // sched_yield cannot fail, so errno is left alone.
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            if let Some(g) = self.try_lock() {
                return Some(g);
            }
        }
    }

    /// Opens the lock whatever its state: only for a forked child, where the thread that may
    /// have held it does not exist.
    ///
    /// # Safety
    /// No guard of this lock may be alive in the calling process.
    pub(crate) unsafe fn force_unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

pub(crate) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while this thread holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard exists only while this thread holds the lock, exclusively.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// FxHash (rustc's hasher): one multiply-rotate per word, no random seed.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;
pub(crate) type FxHashMap<K, V> = std::collections::HashMap<K, V, FxBuild>;
pub(crate) type FxHashSet<K> = std::collections::HashSet<K, FxBuild>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_serialises_increments_from_many_threads() {
        let lock = std::sync::Arc::new(SpinLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *l.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), 40_000);
    }

    #[test]
    fn bounded_lock_gives_up_when_held() {
        let lock = SpinLock::new(());
        let _held = lock.lock();
        assert!(lock.lock_bounded(1000).is_none());
    }
}
