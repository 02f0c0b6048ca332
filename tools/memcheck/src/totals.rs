//! HEAP SUMMARY's totals ("N allocs, N frees, N bytes allocated"), counted per thread.
//!
//! Every allocation and free bumps them, on every thread: one shared counter would be a
//! cache line all threads write, bounced between cores at each event (the brief: no
//! process-wide lock or shared write on a per-allocation path). Each thread counts in a
//! slot of its own line instead ([`thread_slot`]); the totals are the slots' sums, read at
//! the report.

use std::sync::atomic::{AtomicU64, Ordering};

/// How many slots threads are spread over.
pub const SLOTS: usize = 64;

/// The calling thread's slot among `SLOTS`: the same slot for the thread's whole life, and
/// different threads rarely share one (thread control blocks are page-aligned and a few
/// pages apart).
#[inline(always)]
pub fn thread_slot() -> usize {
    let tp = thread_pointer();
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
    allocs: AtomicU64,
    frees: AtomicU64,
    bytes: AtomicU64,
}

/// The heap totals of HEAP SUMMARY.
pub struct HeapTotals {
    slots: Box<[Slot]>,
}

impl Default for HeapTotals {
    fn default() -> Self {
        HeapTotals {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
        }
    }
}

impl HeapTotals {
    /// An allocation of `size` bytes.
    pub fn alloc(&self, size: u64) {
        let s = &self.slots[thread_slot()];
        s.allocs.fetch_add(1, Ordering::Relaxed);
        s.bytes.fetch_add(size, Ordering::Relaxed);
    }

    /// A free (Memcheck counts invalid ones too).
    pub fn free(&self) {
        self.slots[thread_slot()]
            .frees
            .fetch_add(1, Ordering::Relaxed);
    }

    /// `(allocs, frees, bytes allocated)` so far.
    pub fn sum(&self) -> (u64, u64, u64) {
        self.slots.iter().fold((0, 0, 0), |(a, f, b), s| {
            (
                a + s.allocs.load(Ordering::Relaxed),
                f + s.frees.load(Ordering::Relaxed),
                b + s.bytes.load(Ordering::Relaxed),
            )
        })
    }
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
}
