//! When Massif records a snapshot, which ones are detailed, which one is the peak, and which
//! ones are thrown away when the table is full (formats.md §1.6, Valgrind's
//! `maybe_take_snapshot` and `cull_snapshots`).
//!
//! This module knows nothing of stacks or hosts: it is handed the current totals (and, for a
//! detailed snapshot, the per-context byte counts) and the current time, so every decision
//! can be checked by hand in a unit test. A detailed snapshot stores a copy of the
//! per-context byte counts, as Valgrind's `XT_snapshot` copies its data array; the tree text
//! is built from it only when the file is written.

/// Whether a snapshot is the current peak. (Detailed or not is `Snap::detail.is_some()`.)
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Normal,
    Peak,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Snap {
    pub kind: Kind,
    pub time: i64,
    pub heap: u64,
    pub extra: u64,
    pub stacks: u64,
    /// Bytes per execution context (indexed by context id) for detailed snapshots.
    pub detail: Option<Vec<u64>>,
    /// Taken as a peak (it may be a [`Kind::Normal`] now, demoted by a later peak): with
    /// serialised times, its gap to the snapshot before it is where batches met
    /// ([`Scheduler::times_serialised`]).
    pub taken_as_peak: bool,
}

/// What is live right now.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Totals<'a> {
    pub heap: u64,
    pub extra: u64,
    pub stacks: u64,
    pub per_context: &'a [u64],
}

#[derive(Clone, Debug)]
pub(crate) struct Scheduler {
    max: usize,
    detailed_freq: u32,
    peak_inaccuracy: f64,
    /// The snapshots in use, oldest first (Valgrind's `snapshots[0..next_snapshot_i]`).
    pub snaps: Vec<Snap>,
    min_interval: i64,
    /// Lower bound of `min_interval` after a cull (see [`Scheduler::with_interval_floor`]).
    interval_floor: i64,
    earliest_next: i64,
    since_detailed: u32,
    peak_total: u64,
    /// What a total must exceed to be a new peak: `peak_total` plus `--peak-inaccuracy`
    /// percent of it, computed when the peak changes rather than at every deallocation.
    peak_bar: u64,
    /// Some snapshot times were raised to an earlier event's (see
    /// [`Scheduler::times_serialised`]).
    serialised: bool,
    /// Statistics (`--stats=yes` in Valgrind).
    pub cullings: u32,
}

impl Scheduler {
    pub(crate) fn new(max_snapshots: usize, detailed_freq: u32, peak_inaccuracy: f64) -> Self {
        Scheduler {
            max: max_snapshots.max(2),
            detailed_freq: detailed_freq.max(1),
            peak_inaccuracy,
            snaps: Vec::with_capacity(max_snapshots),
            min_interval: 0,
            interval_floor: 0,
            earliest_next: 0,
            since_detailed: 0,
            peak_total: 0,
            peak_bar: 0,
            serialised: false,
            cullings: 0,
        }
    }

    /// Never space snapshots closer than `floor` once the table has been culled.
    ///
    /// Valgrind's scheduling assumes time moves on with every event (its default unit counts
    /// instructions). With `--time-unit=ms` thousands of events share one millisecond: the
    /// smallest gap after a cull is then 0, every event takes a snapshot and every 50th culls
    /// the table, which made Massif 20 times slower on allocation-heavy threads. Snapshots
    /// within one millisecond add nothing to an ms graph, so ms mode uses a floor of 1.
    pub(crate) fn with_interval_floor(mut self, floor: i64) -> Self {
        self.interval_floor = floor;
        self
    }

    /// Some event came with a time earlier than one already used, and was given that one
    /// instead (threads' events are applied in batches, each thread's after another's
    /// later reading). From then on the gap between a peak and the snapshot just before it
    /// says where the batches met, not how far apart the program's events were: a thread's
    /// free raised to the time of another thread's allocation gives a peak at the very time
    /// of the normal snapshot before it. Valgrind's rule takes the smallest gap between
    /// neighbours that are not both uncullable as the next interval, and since a peak is
    /// never culled and the snapshot before it is the one cull spares last (its span reaches
    /// back to its earlier neighbour), that gap of 0 or a few instructions would stay the
    /// interval for as long as the peak stands: every later event a snapshot, a cull every
    /// 50 of them (seen on bench `threads`: 8,579 culls in one run instead of 27, 3% of the
    /// time). So once times are serialised, gaps next to the peak are left out of the
    /// minimum. So are those next to a snapshot taken as a peak and demoted since by a
    /// later one: its gap to the snapshot before it is as small, and once counted it set
    /// the interval back to the floor at the next cull (bench `threads` at 5.5 M
    /// iterations: one run in four took 245,810 snapshots and 4,915 culls instead of about
    /// 1,470 and 28). A single thread's readings never go backwards: its output keeps
    /// Valgrind's rule.
    pub(crate) fn times_serialised(&mut self) {
        self.serialised = true;
    }

    /// Cheap test for the common case: a normal attempt at `t` would be skipped.
    #[inline]
    pub(crate) fn too_early(&self, t: i64) -> bool {
        t < self.earliest_next
    }

    /// A normal attempt (after every allocation, deallocation and realloc).
    pub(crate) fn normal(&mut self, t: i64, now: Totals<'_>) -> bool {
        if self.too_early(t) {
            return false;
        }
        let detailed = self.since_detailed == self.detailed_freq - 1;
        self.take(Kind::Normal, t, detailed, now);
        true
    }

    /// A peak attempt, just before memory goes down; `now` is before the decrease.
    pub(crate) fn peak(&mut self, t: i64, now: Totals<'_>) -> bool {
        if !self.is_new_peak(now.heap + now.extra + now.stacks) {
            return false;
        }
        self.take(Kind::Peak, t, true, now);
        true
    }

    /// Whether `total` beats the recorded peak by more than `--peak-inaccuracy` percent
    /// (checked before reading the clock, which most deallocations then need not do).
    #[inline]
    pub(crate) fn is_new_peak(&self, total: u64) -> bool {
        total > self.peak_bar
    }

    fn take(&mut self, kind: Kind, t: i64, detailed: bool, now: Totals<'_>) {
        if kind == Kind::Peak {
            // At most one peak: the old one stays as a detailed snapshot.
            for s in &mut self.snaps {
                if s.kind == Kind::Peak {
                    s.kind = Kind::Normal;
                }
            }
            self.peak_total = now.heap + now.extra + now.stacks;
            let excess = (self.peak_total as f64 * self.peak_inaccuracy / 100.0) as u64;
            self.peak_bar = self.peak_total.saturating_add(excess);
        }
        self.snaps.push(Snap {
            kind,
            time: t,
            heap: now.heap,
            extra: now.extra,
            stacks: now.stacks,
            detail: detailed.then(|| now.per_context.to_vec()),
            taken_as_peak: kind == Kind::Peak,
        });
        self.since_detailed = if detailed { 0 } else { self.since_detailed + 1 };
        if self.snaps.len() == self.max {
            self.min_interval = self.cull().max(self.interval_floor);
        }
        self.earliest_next = t.saturating_add(self.min_interval);
    }

    /// Removes `max / 2` snapshots, one at a time, each time the one whose neighbours are
    /// closest together in time (never the first, the last or the peak), and returns the new
    /// minimum interval between snapshots.
    fn cull(&mut self) -> i64 {
        self.cullings += 1;
        let n = self.snaps.len();
        let times: Vec<i64> = self.snaps.iter().map(|s| s.time).collect();
        let peak: Vec<bool> = self.snaps.iter().map(|s| s.kind == Kind::Peak).collect();
        // Live snapshots as a doubly linked list over indices (n: none), so each round walks
        // only the survivors.
        let mut next: Vec<usize> = (1..=n).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut live = vec![true; n];
        for _ in 0..self.max / 2 {
            let mut min_span = i64::MAX;
            let mut min_j = None;
            // Candidates: every live snapshot but the first (index 0, never removed) and last.
            let mut j = next[0];
            while j < n && next[j] < n {
                if !peak[j] {
                    let span = times[next[j]] - times[prev[j]];
                    if span < min_span {
                        min_span = span;
                        min_j = Some(j);
                        if span <= 0 {
                            // Times never decrease, so nothing beats 0; the first one wins.
                            break;
                        }
                    }
                }
                j = next[j];
            }
            let Some(j) = min_j else {
                // Only uncullable snapshots left (cannot happen with max >= 10).
                break;
            };
            live[j] = false;
            let (p, nx) = (prev[j], next[j]);
            next[p] = nx;
            if nx < n {
                prev[nx] = p;
            }
        }
        let mut i = 0;
        self.snaps.retain(|_| {
            i += 1;
            live[i - 1]
        });

        // The smallest gap between neighbours, ignoring gaps between two uncullable
        // snapshots: their gap never grows, and would pin the interval forever.
        let last = self.snaps.len() - 1;
        let uncullable = |i: usize, s: &Snap| i == 0 || i == last || s.kind == Kind::Peak;
        let mut min_span = i64::MAX;
        for i in 1..self.snaps.len() {
            if uncullable(i, &self.snaps[i]) && uncullable(i - 1, &self.snaps[i - 1]) {
                continue;
            }
            if self.serialised && (self.snaps[i].taken_as_peak || self.snaps[i - 1].taken_as_peak) {
                // See `times_serialised`.
                continue;
            }
            min_span = min_span.min(self.snaps[i].time - self.snaps[i - 1].time);
        }
        if min_span == i64::MAX {
            0
        } else {
            min_span
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tot(heap: u64) -> Totals<'static> {
        Totals {
            heap,
            extra: 0,
            stacks: 0,
            per_context: &[],
        }
    }

    #[test]
    fn every_nth_snapshot_is_detailed() {
        let mut s = Scheduler::new(100, 3, 1.0);
        for t in 0..7 {
            assert!(s.normal(t, tot(t as u64)));
        }
        let detailed: Vec<bool> = s.snaps.iter().map(|x| x.detail.is_some()).collect();
        assert_eq!(detailed, [false, false, true, false, false, true, false]);
    }

    #[test]
    fn detailed_freq_one_makes_every_snapshot_detailed() {
        let mut s = Scheduler::new(100, 1, 1.0);
        s.normal(0, tot(0));
        s.normal(5, tot(1));
        assert!(s.snaps.iter().all(|x| x.detail.is_some()));
    }

    #[test]
    fn peak_needs_growth_beyond_inaccuracy_and_demotes_the_old_peak() {
        let mut s = Scheduler::new(100, 10, 1.0);
        assert!(s.peak(1, tot(1000)), "first peak: anything above 0");
        assert!(!s.peak(2, tot(1010)), "1010 <= 1000 + 1% of 1000");
        assert!(s.peak(3, tot(1011)));
        let kinds: Vec<Kind> = s.snaps.iter().map(|x| x.kind).collect();
        assert_eq!(kinds, [Kind::Normal, Kind::Peak]);
        assert!(s.snaps[0].detail.is_some(), "a demoted peak keeps its tree");
        let mut z = Scheduler::new(100, 10, 0.0);
        assert!(z.peak(1, tot(1000)));
        assert!(!z.peak(2, tot(1000)), "equal is not a new peak");
        assert!(z.peak(3, tot(1001)));
    }

    #[test]
    fn peak_snapshot_resets_the_detailed_countdown() {
        let mut s = Scheduler::new(100, 3, 1.0);
        s.normal(0, tot(0));
        s.normal(1, tot(10));
        s.peak(2, tot(10));
        s.normal(3, tot(5));
        s.normal(4, tot(5));
        s.normal(5, tot(5));
        let d: Vec<bool> = s.snaps.iter().map(|x| x.detail.is_some()).collect();
        assert_eq!(d, [false, false, true, false, false, true]);
    }

    /// Hand-computed: max 10, snapshots at times 0,1,2,4,8,9,10,20,21,30 (peak at 9).
    /// Spans (next - prev) for j = 1..8: j1: 2-0=2, j2: 4-1=3, j3: 8-2=6, j4: 9-4=5,
    /// j5 (peak, skip), j6: 20-9=11, j7: 21-10=11, j8: 30-20=10.
    /// Round 1 removes j1 (2). Now 0,2,4,8,9,10,20,21,30: j2: 4-0=4, j3: 6, j4: 5, j6: 11,
    /// j7: 11, j8: 10 -> removes j2. Now 0,4,8,9,10,20,21,30: j3: 8-0=8, j4: 9-4=5, j6: 11,
    /// j7: 11, j8: 10 -> removes j4 (t=8). Now 0,4,9,10,20,21,30: j3: 9-0=9, j6: 20-9=11,
    /// j7: 11, j8: 10 -> removes j3 (t=4). Now 0,9,10,20,21,30: j6: 20-9=11, j7: 21-10=11,
    /// j8: 30-20=10 -> removes j8 (t=21). Kept: 0,9(peak),10,20,30.
    /// New interval: gaps 0-9 (both uncullable: skip), 9-10: 1, 10-20: 10, 20-30: 10 -> 1.
    #[test]
    fn culling_removes_half_by_smallest_span_keeping_first_last_and_peak() {
        let mut s = Scheduler::new(10, 1000, 1.0);
        for (i, t) in [0, 1, 2, 4, 8, 9, 10, 20, 21].into_iter().enumerate() {
            if i == 5 {
                assert!(s.peak(t, tot(100)));
            } else {
                assert!(s.normal(t, tot(1)));
            }
        }
        assert_eq!(s.snaps.len(), 9);
        assert!(s.normal(30, tot(1)));
        let times: Vec<i64> = s.snaps.iter().map(|x| x.time).collect();
        assert_eq!(times, [0, 9, 10, 20, 30]);
        assert_eq!(s.snaps[1].kind, Kind::Peak);
        assert_eq!(s.cullings, 1);
        // New minimum interval 1 from 30: an attempt at 30 is skipped, 31 is taken.
        assert!(!s.normal(30, tot(1)));
        assert!(s.normal(31, tot(1)));
    }

    #[test]
    fn ties_in_span_remove_the_earliest_candidate() {
        let mut s = Scheduler::new(10, 1000, 1.0);
        for t in 0..10 {
            s.normal(t * 10, tot(1));
        }
        // All spans are 20: rounds remove j=1, then j=2 (span 30 vs 20 elsewhere)...
        // Equally spaced snapshots: after removing 10, 0..20 span of j=2 is 30, so j=3 (20)
        // goes: 0,20,40,...? Let the algorithm speak, but check the invariants.
        let times: Vec<i64> = s.snaps.iter().map(|x| x.time).collect();
        assert_eq!(times.len(), 5);
        assert_eq!(times[0], 0);
        assert_eq!(*times.last().unwrap(), 90);
        // First round removes t=10 (first minimal span), second removes t=30 (span 20 at
        // j=t30: 40-20), third t=50, fourth t=70, fifth: remaining 0,20,40,60,80,90 spans
        // 40,40,40,30 -> removes t=80.
        assert_eq!(times, [0, 20, 40, 60, 90]);
    }

    /// Valgrind's `cull_snapshots` transcribed literally: the reference for `cull`.
    fn naive_cull(times: &[i64], peak: &[bool], max: usize) -> Vec<usize> {
        let n = times.len();
        let mut live = vec![true; n];
        let find = |live: &[bool], from: usize| (from..n).find(|&j| live[j]).unwrap_or(n);
        for _ in 0..max / 2 {
            let (mut jp, mut j) = (0, find(&live, 1));
            let mut jn = find(&live, j + 1);
            let (mut min_span, mut min_j) = (i64::MAX, None);
            while jn < n {
                let span = times[jn] - times[jp];
                if !peak[j] && span < min_span {
                    min_span = span;
                    min_j = Some(j);
                }
                jp = j;
                j = jn;
                jn = find(&live, jn + 1);
            }
            live[min_j.unwrap()] = false;
        }
        (0..n).filter(|&i| live[i]).collect()
    }

    #[test]
    fn cull_agrees_with_valgrinds_algorithm_on_many_sequences() {
        // A small deterministic generator (xorshift), so the cases are the same every run.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rnd = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for case in 0..300 {
            let max = [10, 11, 20, 100][case % 4];
            let mut s = Scheduler::new(max, 1000, 1.0);
            let mut t = 0i64;
            let mut times = Vec::new();
            let mut peaks = Vec::new();
            let mut peak_at = None;
            for i in 0..max - 1 {
                // Many equal times (dense events within one millisecond), some jumps.
                t += [0, 0, 0, 1, 2, 5, 40][rnd(7) as usize];
                if i > 0 && rnd(15) == 0 {
                    assert!(s.peak(t, tot(1000 + i as u64 * 1000)));
                    if let Some(p) = peak_at {
                        peaks[p] = false;
                    }
                    peak_at = Some(i);
                    peaks.push(true);
                } else {
                    assert!(s.normal(t, tot(1)));
                    peaks.push(false);
                }
                times.push(t);
            }
            t += rnd(3) as i64;
            times.push(t);
            peaks.push(false);
            let expected: Vec<i64> = naive_cull(&times, &peaks, max)
                .into_iter()
                .map(|i| times[i])
                .collect();
            assert!(s.normal(t, tot(1)), "case {case}");
            let got: Vec<i64> = s.snaps.iter().map(|x| x.time).collect();
            assert_eq!(
                got, expected,
                "case {case}: times {times:?} peaks {peaks:?}"
            );
        }
    }

    #[test]
    fn attempts_before_the_interval_elapses_are_skipped() {
        let mut s = Scheduler::new(10, 1000, 1.0);
        for t in 0..10 {
            s.normal(t * 10, tot(1));
        }
        // Kept 0,20,40,60,90: min gap ignoring (first,last) pairs is 20.
        assert!(!s.normal(109, tot(1)));
        assert!(s.normal(110, tot(1)));
    }
}

#[cfg(test)]
mod serialised_tests {
    use super::*;

    /// Snapshots 1,000,000 apart, then a normal snapshot and a peak at one time (a thread's
    /// free raised to another's allocation time), then 100,000 events 100 apart: how many
    /// culls they take. With `demoted`, ten more snapshots and a later, higher peak come
    /// between that peak and the events, so it stands no longer.
    fn culls_with(serialised: bool, demoted: bool) -> u32 {
        let mut s = Scheduler::new(100, 10, 1.0).with_interval_floor(1);
        if serialised {
            s.times_serialised();
        }
        let tot = |heap| Totals {
            heap,
            extra: 0,
            stacks: 0,
            per_context: &[],
        };
        let mut t = 0;
        for _ in 0..10 {
            s.normal(t, tot(1));
            t += 1_000_000;
        }
        s.normal(t, tot(1));
        assert!(s.peak(t, tot(1000)));
        if demoted {
            for _ in 0..10 {
                t += 1_000_000;
                s.normal(t, tot(1));
            }
            assert!(s.peak(t + 500_000, tot(2000)));
            assert_eq!(
                s.snaps.iter().filter(|x| x.kind == Kind::Peak).count(),
                1,
                "the first peak is demoted"
            );
        }
        for _ in 0..100_000 {
            t += 100;
            s.normal(t, tot(1));
        }
        s.cullings
    }

    fn culls(serialised: bool) -> u32 {
        culls_with(serialised, false)
    }

    fn culls_after_demotion(serialised: bool) -> u32 {
        culls_with(serialised, true)
    }

    #[test]
    fn a_demoted_peak_at_the_time_of_the_snapshot_before_it_does_not_pin_the_interval() {
        assert!(
            culls_after_demotion(false) > 1000,
            "{}",
            culls_after_demotion(false)
        );
        assert!(
            culls_after_demotion(true) < 20,
            "{}",
            culls_after_demotion(true)
        );
    }

    #[test]
    fn a_peak_at_the_time_of_the_snapshot_before_it_does_not_pin_the_interval() {
        // Valgrind's rule: the 0 gap is the interval (floored at 1) while the peak stands,
        // so every event is a snapshot and every 50th a cull.
        assert!(culls(false) > 1000, "{}", culls(false));
        // Serialised times: the interval doubles as usual, a cull per doubling.
        assert!(culls(true) < 20, "{}", culls(true));
    }
}

#[cfg(test)]
mod interval_floor_tests {
    use super::*;

    /// In ms mode, a burst of events within one millisecond must not become a snapshot each.
    #[test]
    fn events_sharing_a_millisecond_stop_taking_snapshots_after_a_cull() {
        let per_context = [0u64; 1];
        let now = |heap| Totals {
            heap,
            extra: 0,
            stacks: 0,
            per_context: &per_context,
        };
        let mut floored = Scheduler::new(10, 1000, 1.0).with_interval_floor(1);
        let mut plain = Scheduler::new(10, 1000, 1.0);
        let (mut taken_floored, mut taken_plain) = (0, 0);
        for i in 0..1000u64 {
            let t = (i / 500) as i64; // two milliseconds, 500 events each
            if !floored.too_early(t) {
                floored.normal(t, now(i));
                taken_floored += 1;
            }
            if !plain.too_early(t) {
                plain.normal(t, now(i));
                taken_plain += 1;
            }
        }
        assert!(
            taken_floored < 20,
            "{taken_floored} snapshots with a 1 ms floor"
        );
        assert!(
            taken_plain > 900,
            "the plain algorithm snapshots every event: {taken_plain}"
        );
    }
}
