//! The small pieces of plumbing Massif's event handlers need inside the program: a lock, a
//! way to sleep until it is released, and a hash function.
//!
//! Events arrive on the program's own threads, from inside its `malloc`. A futex-based
//! `std::sync::Mutex` goes through libc's `syscall()` wrapper, which may set `errno`, and
//! `std`'s default hasher seeds itself from `getrandom`; neither belongs in an allocator hook.
//! So the state sits behind a spin lock with a `sched_yield` back-off (critical sections are a
//! hash lookup and a few additions; a snapshot is rarer) and the tables use a fixed
//! multiplicative hash (keys are stack ids and code addresses, not attacker-chosen strings
//! on a network).
//!
//! The lock is the project's one spin lock, `oxgrind_sys::lock::SpinLock`, which the tool
//! contract re-exports for tools.

use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};

use oxgrind_tool::sync::{futex_wait, futex_wake};
pub(crate) use oxgrind_tool::sync::{SpinGuard, SpinLock};

/// Tells threads waiting for a [`SpinLock`] that its holder let it go, so that they sleep in
/// the kernel instead of spinning for a holder that may not even be running (four program
/// threads on two cores: a thread whose log is full spun for about 4% of Massif's CPU time).
/// Only a holder that calls [`Released::notify`] after unlocking wakes them; the others'
/// release is seen within [`Released::NAP_NS`].
pub(crate) struct Released {
    /// The futex word: bumped by each notification that finds sleepers.
    epoch: AtomicU32,
    /// Threads between [`Released::lock`]'s registration and its return.
    sleepers: AtomicU32,
}

impl Released {
    /// The longest sleep before looking at the lock again.
    const NAP_NS: i64 = 1_000_000;

    pub(crate) const fn new() -> Self {
        Released {
            epoch: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
        }
    }

    /// Takes `lock`, sleeping while it is held.
    pub(crate) fn lock<'a, T>(&self, lock: &'a SpinLock<T>) -> SpinGuard<'a, T> {
        loop {
            // Registered before the epoch is read and the lock tried (all sequentially
            // consistent): a holder unlocking after our try sees us and bumps the epoch, so
            // the futex wait returns at once rather than sleep through the release.
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let seen = self.epoch.load(Ordering::SeqCst);
            let got = lock.try_lock();
            if got.is_none() {
                futex_wait(&self.epoch, seen, Self::NAP_NS);
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
            if let Some(g) = got {
                return g;
            }
        }
    }

    /// Wakes the sleepers, if any; called after unlocking.
    #[inline]
    pub(crate) fn notify(&self) {
        if self.sleepers.load(Ordering::SeqCst) != 0 {
            self.epoch.fetch_add(1, Ordering::SeqCst);
            futex_wake(&self.epoch, u32::MAX);
        }
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
    fn a_sleeper_gets_the_lock_once_the_holder_notifies() {
        let lock = std::sync::Arc::new(SpinLock::new(0u64));
        let released = std::sync::Arc::new(Released::new());
        let held = lock.lock();
        let sleeper = {
            let (lock, released) = (lock.clone(), released.clone());
            std::thread::spawn(move || {
                for _ in 0..1000 {
                    *released.lock(&lock) += 1;
                }
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(5));
        drop(held);
        released.notify();
        for _ in 0..1000 {
            *lock.lock() += 1;
            released.notify();
        }
        sleeper.join().unwrap();
        assert_eq!(*lock.lock(), 2000);
    }

    #[test]
    fn bounded_lock_gives_up_when_held() {
        let lock = SpinLock::new(());
        let _held = lock.lock();
        assert!(lock.lock_bounded(1000).is_none());
    }
}
