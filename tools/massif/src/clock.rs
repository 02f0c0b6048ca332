//! `--time-unit=ms` without a system call per allocation.
//!
//! `Host::elapsed_ms` may cost a system call (the runtime reads `CLOCK_MONOTONIC` with a raw
//! `syscall`); at one call per `malloc` that more than doubled the cost of profiling an
//! allocation-heavy program. Snapshot times are whole milliseconds, so Massif re-reads the
//! host clock only when the CPU's time-stamp counter says at least [`REREAD_CYCLES`] cycles
//! (about 0.1 ms at 2 GHz) have passed since the last reading, and otherwise reuses it. A
//! time can thus be stale by that much: invisible at millisecond resolution, except that a
//! snapshot near a millisecond boundary may carry the previous millisecond.
//!
//! The counter is only a trigger, never converted to time, so its frequency does not
//! matter; a counter that is not synchronised between CPUs (or goes backwards) just causes
//! an extra reading. Other architectures read the host clock every time.

use oxgrind_tool::Host;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counter ticks after which the host clock is read again.
pub(crate) const REREAD_CYCLES: u64 = 200_000;

pub(crate) struct MsClock {
    /// Counter value at the last host reading (0: never read).
    last_tick: AtomicU64,
    last_ms: AtomicU64,
}

#[inline]
fn ticks() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC exists on every x86-64 CPU, reads no memory and has no side effect
        // (a kernel could make it fault with CR4.TSD, which Linux does not do for processes
        // that have not asked for it with prctl(PR_SET_TSC)).
        Some(unsafe { core::arch::x86_64::_rdtsc() })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

impl MsClock {
    pub(crate) fn new() -> Self {
        MsClock {
            last_tick: AtomicU64::new(0),
            last_ms: AtomicU64::new(0),
        }
    }

    /// Milliseconds since program start, at most [`REREAD_CYCLES`] ticks old.
    #[inline]
    pub(crate) fn now_ms(&self, host: &dyn Host) -> u64 {
        self.now_ms_at(host, ticks())
    }

    /// [`MsClock::now_ms`] with the counter value given (`None`: no counter).
    #[inline]
    fn now_ms_at(&self, host: &dyn Host, ticks: Option<u64>) -> u64 {
        let Some(t) = ticks else {
            return host.elapsed_ms();
        };
        let last = self.last_tick.load(Ordering::Relaxed);
        if last != 0 && t.wrapping_sub(last) < REREAD_CYCLES {
            return self.last_ms.load(Ordering::Relaxed);
        }
        let ms = host.elapsed_ms();
        // Racing threads may interleave these two stores; the worst outcome is one extra
        // host reading or a value one reading old, both within the staleness bound.
        self.last_ms.store(ms, Ordering::Relaxed);
        self.last_tick.store(t, Ordering::Relaxed);
        ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::fake::FakeHost;

    #[test]
    fn a_reading_is_reused_for_a_short_while_then_refreshed() {
        let h = FakeHost::new();
        let c = MsClock::new();
        let set = |ms| *h.now_ms.lock().unwrap() = ms;
        set(7);
        assert_eq!(
            c.now_ms_at(&h, Some(1_000)),
            7,
            "first reading asks the host"
        );
        set(9);
        assert_eq!(
            c.now_ms_at(&h, Some(1_000 + REREAD_CYCLES - 1)),
            7,
            "too soon: reused"
        );
        assert_eq!(
            c.now_ms_at(&h, Some(1_000 + REREAD_CYCLES)),
            9,
            "long enough: refreshed"
        );
        set(11);
        assert_eq!(
            c.now_ms_at(&h, Some(500)),
            11,
            "counter went backwards: refreshed"
        );
        set(13);
        assert_eq!(c.now_ms_at(&h, None), 13, "no counter: always the host");
    }
}
