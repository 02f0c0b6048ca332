//! The pages counted with `--pages-as-heap=yes`, as disjoint address ranges.
//!
//! Valgrind records every 4 KiB page as a heap block of its own. Some programs reserve
//! terabytes of address space (language runtimes, sanitizers, JITs): one table entry per page
//! would not fit in memory. Here a mapping is one range, split only when part of it is
//! unmapped, so the cost follows the number of mappings. The byte counts are the same: a
//! page is counted once while mapped, whoever maps it again.

use std::collections::BTreeMap;

/// `[start, end)` → the execution context its pages are attributed to.
#[derive(Default)]
pub(crate) struct Pages {
    ranges: BTreeMap<u64, (u64, u32)>,
}

impl Pages {
    /// Whether the page at `addr` is counted.
    pub(crate) fn contains(&self, addr: u64) -> bool {
        self.ranges
            .range(..=addr)
            .next_back()
            .is_some_and(|(_, &(end, _))| addr < end)
    }

    /// Counts the parts of `[start, end)` not counted yet, for `ec`; calls `add(ec, bytes)`
    /// for what was added.
    pub(crate) fn record(&mut self, start: u64, end: u64, ec: u32, add: &mut dyn FnMut(u32, u64)) {
        let mut gaps = Vec::new();
        let mut at = start;
        if let Some((_, &(e, _))) = self.ranges.range(..=start).next_back() {
            at = at.max(e);
        }
        for (&s, &(e, _)) in self.ranges.range(start..end) {
            if s > at {
                gaps.push((at, s));
            }
            at = at.max(e);
        }
        if at < end {
            gaps.push((at, end));
        }
        for (s, e) in gaps {
            self.ranges.insert(s, (e, ec));
            add(ec, e - s);
        }
    }

    /// Stops counting `[start, end)`; calls `sub(ec, bytes)` for what was counted there.
    pub(crate) fn unrecord(&mut self, start: u64, end: u64, sub: &mut dyn FnMut(u32, u64)) {
        let mut hit: Vec<(u64, u64, u32)> = Vec::new();
        if let Some((&s, &(e, ec))) = self.ranges.range(..start).next_back() {
            if e > start {
                hit.push((s, e, ec));
            }
        }
        hit.extend(
            self.ranges
                .range(start..end)
                .map(|(&s, &(e, ec))| (s, e, ec)),
        );
        for (s, e, ec) in hit {
            self.ranges.remove(&s);
            if s < start {
                self.ranges.insert(s, (start, ec));
            }
            if e > end {
                self.ranges.insert(end, (e, ec));
            }
            sub(ec, e.min(end) - s.max(start));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The per-page model Valgrind uses (minus double counting): the reference.
    #[derive(Default)]
    struct Naive(HashMap<u64, u32>);

    #[test]
    fn ranges_count_the_same_bytes_as_a_page_table() {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut rnd = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let mut p = Pages::default();
        let mut naive = Naive::default();
        let mut bytes: HashMap<u32, i64> = HashMap::new();
        for _ in 0..3000 {
            let start = rnd(64) * 4096;
            let end = start + (1 + rnd(16)) * 4096;
            let ec = rnd(3) as u32;
            if rnd(2) == 0 {
                p.record(start, end, ec, &mut |ec, b| {
                    *bytes.entry(ec).or_default() += b as i64
                });
                for pg in (start..end).step_by(4096) {
                    naive.0.entry(pg).or_insert(ec);
                }
            } else {
                p.unrecord(start, end, &mut |ec, b| {
                    *bytes.entry(ec).or_default() -= b as i64
                });
                for pg in (start..end).step_by(4096) {
                    naive.0.remove(&pg);
                }
            }
            let mut expect: HashMap<u32, i64> = HashMap::new();
            for &ec in naive.0.values() {
                *expect.entry(ec).or_default() += 4096;
            }
            for ec in 0..3 {
                assert_eq!(
                    bytes.get(&ec).copied().unwrap_or(0),
                    expect.get(&ec).copied().unwrap_or(0)
                );
            }
            for pg in 0..80u64 {
                assert_eq!(p.contains(pg * 4096), naive.0.contains_key(&(pg * 4096)));
            }
        }
    }

    #[test]
    fn a_huge_reservation_is_one_range() {
        let mut p = Pages::default();
        let mut total = 0;
        p.record(0, 1 << 40, 0, &mut |_, b| total += b);
        assert_eq!(total, 1 << 40);
        p.unrecord(4096, 8192, &mut |_, b| total -= b);
        assert_eq!(total, (1 << 40) - 4096);
        assert_eq!(p.ranges.len(), 2);
    }
}
