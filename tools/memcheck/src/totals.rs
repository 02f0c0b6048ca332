//! HEAP SUMMARY's totals ("N allocs, N frees, N bytes allocated"), counted per thread.
//!
//! Every allocation and free bumps them, on every thread: one shared counter would be a
//! cache line all threads write, bounced between cores at each event (the brief: no
//! process-wide lock or shared write on a per-allocation path). Each thread counts in a
//! slot of its own line instead ([`thread_slot`]); the totals are the slots' sums, read at
//! the report.
//!
//! A slot belongs to the first thread that counts in it (its thread pointer, which no
//! other live thread has), and only that thread writes it: with plain loads and stores,
//! not locked adds. A locked instruction waits until every store before it is done, and
//! the allocation path has just written cold shadow lines; an add costs a few cycles.
//! A thread whose slot another thread owns counts in the shared slot with locked adds
//! (rare: the slots outnumber the threads that run at once). A slot outlives its thread:
//! a later thread with the same thread pointer (glibc reuses a joined thread's stack and
//! control block) counts on in it, after the old thread's exit, which glibc orders
//! before the reuse.

use std::sync::atomic::{AtomicU64, Ordering};

/// How many slots threads are spread over.
pub const SLOTS: usize = 64;

/// The calling thread's slot among `SLOTS`: the same slot for the thread's whole life, and
/// different threads rarely share one (thread control blocks are page-aligned and a few
/// pages apart).
#[inline(always)]
pub fn thread_slot() -> usize {
    slot_of(thread_pointer())
}

/// The slot of the thread whose pointer is `tp`.
#[inline(always)]
fn slot_of(tp: u64) -> usize {
    ((tp >> 12) ^ (tp >> 20)) as usize % SLOTS
}

/// The calling thread's pointer (`fs:0` in the x86-64 TLS ABI: the thread control block
/// points to itself), which tells threads apart without a thread-local access: from the
/// runtime's shared library that is a call into the dynamic loader, costly under the engine.
#[inline(always)]
fn thread_pointer() -> u64 {
    let v: u64;
    // SAFETY: every thread of a process with glibc TLS has a thread control block at fs:0
    // whose first word points to itself; the load has no other effect.
    unsafe {
        core::arch::asm!("mov {}, fs:[0]", out(reg) v, options(nostack, readonly, preserves_flags));
    }
    v
}

/// One slot's counts, alone on its cache line.
#[derive(Default)]
#[repr(align(64))]
struct Slot {
    /// The thread pointer of the thread that writes the counts (0: none yet).
    owner: AtomicU64,
    allocs: AtomicU64,
    frees: AtomicU64,
    bytes: AtomicU64,
}

/// Adds `n` to a counter only its owner writes: a plain load and store.
#[inline(always)]
fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// The heap totals of HEAP SUMMARY.
pub struct HeapTotals {
    slots: Box<[Slot]>,
    /// The counts of threads whose slot another thread owns, by locked adds.
    shared: Slot,
}

impl Default for HeapTotals {
    fn default() -> Self {
        HeapTotals {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            shared: Slot::default(),
        }
    }
}

impl HeapTotals {
    /// The calling thread's own slot, or None when another thread owns it.
    #[inline(always)]
    fn own_slot(&self) -> Option<&Slot> {
        let tp = thread_pointer();
        let s = &self.slots[slot_of(tp)];
        let owner = s.owner.load(Ordering::Relaxed);
        if owner == tp || (owner == 0 && claim(s, tp)) {
            Some(s)
        } else {
            None
        }
    }

    /// An allocation of `size` bytes.
    #[inline]
    pub fn alloc(&self, size: u64) {
        match self.own_slot() {
            Some(s) => {
                bump(&s.allocs, 1);
                bump(&s.bytes, size);
            }
            None => {
                self.shared.allocs.fetch_add(1, Ordering::Relaxed);
                self.shared.bytes.fetch_add(size, Ordering::Relaxed);
            }
        }
    }

    /// A free (Memcheck counts invalid ones too).
    #[inline]
    pub fn free(&self) {
        match self.own_slot() {
            Some(s) => bump(&s.frees, 1),
            None => {
                self.shared.frees.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// `(allocs, frees, bytes allocated)` so far: exact when no other thread counts
    /// meanwhile (at the report, the other threads are stopped or gone).
    pub fn sum(&self) -> (u64, u64, u64) {
        self.slots
            .iter()
            .chain(core::iter::once(&self.shared))
            .fold((0, 0, 0), |(a, f, b), s| {
                (
                    a + s.allocs.load(Ordering::Relaxed),
                    f + s.frees.load(Ordering::Relaxed),
                    b + s.bytes.load(Ordering::Relaxed),
                )
            })
    }
}

/// Makes the thread with pointer `tp` the owner of the unowned slot `s`, unless another
/// thread got there first.
#[cold]
fn claim(s: &Slot, tp: u64) -> bool {
    s.owner
        .compare_exchange(0, tp, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_of_several_threads_add_up() {
        let t = HeapTotals::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for i in 0..1000 {
                        t.alloc(i);
                        t.free();
                    }
                });
            }
        });
        assert_eq!(t.sum(), (4000, 4000, 4 * 999 * 1000 / 2));
    }

    #[test]
    fn a_thread_whose_slot_another_owns_counts_in_the_shared_slot() {
        let t = HeapTotals::default();
        t.slots[thread_slot()].owner.store(1, Ordering::Relaxed);
        t.alloc(5);
        t.free();
        assert_eq!(t.shared.allocs.load(Ordering::Relaxed), 1);
        assert_eq!(t.shared.frees.load(Ordering::Relaxed), 1);
        assert_eq!(t.sum(), (1, 1, 5));
    }
}
