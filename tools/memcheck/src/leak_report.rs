//! The leak report, at exit and whenever the program asks (`VALGRIND_DO_LEAK_CHECK` and
//! its forms): the live blocks and the roots the host hands over go through the leak
//! search ([`crate::leak`]), and its verdicts become loss records, the LEAK SUMMARY and the
//! "reachable via heuristic" lines, in Valgrind's order and words.
//!
//! As in Memcheck, each search remembers its loss records and totals ([`LastLeakSearch`]):
//! the next search's records start from them, which gives the delta searches
//! (`DO_ADDED_LEAK_CHECK` prints the records that grew, `DO_CHANGED_LEAK_CHECK` those that
//! grew or shrank, with `(+N)`/`(-N)` after each number) and what `VALGRIND_COUNT_LEAKS`
//! returns.

use std::sync::atomic::Ordering;

use oxgrind_formats::memcheck_text::{self as text, Amount, ErrorBlock, LeakMode, LeakSummary};
use oxgrind_formats::memcheck_xml::WhatQuirk;
use oxgrind_formats::suppressions::{GeneratedSupp, LeakKind};
use oxgrind_tool::{Addr, Host, LiveBlock, RootRange, StackId};

use crate::errors::{Output, Shown};
use crate::options::LeakCheck;
use crate::{leak, shadow, Memcheck, State};

/// Which loss records a leak search prints and counts as errors (Memcheck's
/// `LeakCheckDeltaMode`), against the previous search's.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Delta {
    /// Every record with blocks; no changes printed (the search at exit,
    /// `VALGRIND_DO_LEAK_CHECK`).
    Any,
    /// Records whose bytes or blocks grew (`VALGRIND_DO_ADDED_LEAK_CHECK`).
    Increased,
    /// Records whose bytes or blocks changed (`VALGRIND_DO_CHANGED_LEAK_CHECK`).
    Changed,
}

/// How one leak search reports.
#[derive(Copy, Clone, Debug)]
pub(crate) struct LeakParams {
    /// Loss records printed (`--leak-check=full`, the client requests but the quick one);
    /// otherwise the LEAK SUMMARY alone.
    pub full: bool,
    pub delta: Delta,
    /// Valgrind's number of the thread that asked (1 at exit).
    pub tid: i32,
}

/// What a heap search found.
pub(crate) enum Search {
    /// No live block: nothing to search.
    NoBlocks,
    /// The host never handed over the roots.
    NotRun,
    /// The blocks (by address) and their verdicts; `scanned`: bytes read (`-v`).
    Done {
        blocks: Vec<leak::Block>,
        verdicts: Vec<leak::Verdict>,
        scanned: u64,
    },
}

/// What the last leak search leaves for the next one.
#[derive(Default)]
pub(crate) struct LastLeakSearch {
    /// Its loss records, in its order, with its numbers.
    records: Vec<leak::LossRecord>,
    /// Its LEAK SUMMARY numbers (`heuristics`: those with blocks). Zero before any search.
    pub summary: LeakSummary,
}

impl Memcheck {
    /// The leak search at exit and its report; text goes to `out`, returns nothing to
    /// print when `--leak-check=no`.
    pub(crate) fn leak_check(
        &self,
        host: &dyn Host,
        st: &mut State,
        out: &mut Output,
        live: &[LiveBlock],
    ) {
        let pid = host.pid();
        if self.opts.leak_check == LeakCheck::No {
            if self.opts.core.verbosity == 1 && !self.opts.core.xml {
                text::line(
                    &mut out.text,
                    pid,
                    "For a detailed leak analysis, rerun with: --leak-check=full",
                );
                text::line(&mut out.text, pid, "");
            }
            return;
        }
        let params = LeakParams {
            full: self.opts.leak_check == LeakCheck::Full,
            delta: Delta::Any,
            tid: 1,
        };
        let found = self.search_heap(host, &mut || live.to_vec(), None);
        self.report_leaks(host, st, out, found, params);
    }

    /// Searches the heap: the blocks `live` returns against the roots, the calling thread's
    /// stack from `sp` (its stack pointer) when the program asked for the search. Needs no
    /// lock of ours, and must hold none: the host waits for the other threads' events in
    /// flight, which may be waiting for our state lock.
    ///
    /// `live` is asked once the host has stopped the world (inside `with_roots`): a list
    /// taken before would hold blocks another thread freed meanwhile, and a freed block
    /// waits in the freed-block queue with no pointer left to it, a false "definitely lost"
    /// (`leak_check_requests_while_threads_allocate` saw 51 to 66 for 50, about one run in
    /// ten). It must take no lock a stopped thread may hold: allocator events are all
    /// finished then, client requests may not be.
    pub(crate) fn search_heap(
        &self,
        host: &dyn Host,
        live: &mut dyn FnMut() -> Vec<LiveBlock>,
        sp: Option<Addr>,
    ) -> Search {
        // Before the world stops: client requests change these under their locks.
        let mut custom = self.client_blocks.lock().clone();
        custom.extend(self.pools.lock().chunks().copied());
        let mut found = Search::NotRun;
        let mut scan = |roots: &[RootRange]| {
            let live = live();
            if live.is_empty() {
                found = Search::NoBlocks;
                return;
            }
            let mut blocks: Vec<leak::Block> = live
                .iter()
                .map(|b| leak::Block {
                    addr: b.addr,
                    size: b.size,
                    stack: b.stack,
                })
                .collect();
            blocks.sort_by_key(|b| b.addr);
            drop_superblocks(&mut blocks, &custom);
            let mem = HostMemory {
                host,
                scanned: std::cell::Cell::new(0),
            };
            let mut search = leak::LeakSearch::new(&blocks, &mem, self.opts.heuristics);
            // Our shadow is a writable mapping the runtime does not know as ours: 16 TiB
            // of zeroes that hold no pointer and would take for ever to scan.
            let shadow = shadow::base_if_ready();
            let shadow = (shadow, shadow + shadow::SHADOW_SPAN * (shadow != 0) as u64);
            let real = self.probing.load(Ordering::Relaxed);
            // Exited threads' stacks below where they last were (see `gone_threads`).
            let dead = self.gone.dead_ranges(host);
            search.run(&mut |sink| {
                for r in roots {
                    let parts = crate::gone_threads::live_parts(r, &dead);
                    let parts = parts.into_iter().flat_map(|(s, e)| outside(s, e, shadow));
                    for (start, end) in parts {
                        if real {
                            mem.read_root_words(start, end, &mut |_, w| sink(w));
                        } else {
                            let len = end - start;
                            leak::Memory::read_words(&mem, start, len, &mut |_, w| sink(w));
                        }
                    }
                }
            });
            let scanned = mem.scanned.get();
            let verdicts = search.into_verdicts();
            found = Search::Done {
                blocks,
                verdicts,
                scanned,
            };
        };
        match sp {
            Some(sp) => host.with_roots_from(sp, &mut scan),
            None => host.with_roots(&mut scan),
        }
        found
    }

    /// The report of one leak search (`found`, from [`Memcheck::search_heap`]) to `out`,
    /// remembered in `st` for the next.
    pub(crate) fn report_leaks(
        &self,
        host: &dyn Host,
        st: &mut State,
        out: &mut Output,
        found: Search,
        params: LeakParams,
    ) {
        let pid = host.pid();
        let verbose_text = self.opts.core.verbosity > 0 && !self.opts.core.xml;
        let (blocks, verdicts, scanned) = match found {
            Search::NoBlocks => {
                // Memcheck forgets its loss records (nothing is left to compare with) but
                // keeps the totals of the last search that found blocks.
                st.last_leak.records.clear();
                st.leaked = Some(oxgrind_tool::Leaked::default());
                if verbose_text {
                    text::line(
                        &mut out.text,
                        pid,
                        "All heap blocks were freed -- no leaks are possible",
                    );
                    text::line(&mut out.text, pid, "");
                }
                return;
            }
            // The host never called us back: nothing was searched, say nothing wrong.
            Search::NotRun => return,
            Search::Done {
                blocks,
                verdicts,
                scanned,
            } => (blocks, verdicts, scanned),
        };
        if self.opts.core.verbosity > 1 && !self.opts.core.xml {
            let n = oxgrind_formats::number::commify(blocks.len() as u64);
            text::line(
                &mut out.text,
                pid,
                &format!("Searching for pointers to {n} not-freed blocks"),
            );
            let n = oxgrind_formats::number::commify(scanned);
            text::line(&mut out.text, pid, &format!("Checked {n} bytes"));
            text::line(&mut out.text, pid, "");
        }
        let frames = self.opts.resolution.frames();
        let mut prefixes: std::collections::HashMap<StackId, Vec<u64>> = Default::default();
        let mut same_place = |a: StackId, b: StackId| match frames {
            None => a == b,
            Some(n) => {
                let mut prefix = |id: StackId| {
                    prefixes
                        .entry(id)
                        .or_insert_with(|| host.stack(id).into_iter().take(n).collect())
                        .clone()
                };
                a == b || prefix(a) == prefix(b)
            }
        };
        let previous = std::mem::take(&mut st.last_leak.records);
        let records = leak::loss_records_after(previous, &blocks, &verdicts, &mut same_place);
        let total = records.len();
        let full = params.full;
        let mut sum = LeakSummary::default();
        for (i, r) in records.iter().enumerate() {
            let grew =
                r.bytes > r.old_bytes || r.indirect > r.old_indirect || r.blocks > r.old_blocks;
            let changed =
                r.bytes != r.old_bytes || r.indirect != r.old_indirect || r.blocks != r.old_blocks;
            let considered = match params.delta {
                Delta::Any => r.blocks > 0,
                Delta::Increased => grew,
                Delta::Changed => changed,
            };
            let print = full && considered && self.opts.show_leak_kinds.contains(r.kind);
            let count = full && considered && self.opts.errors_for_leak_kinds.contains(r.kind);
            let res = self.resolve(host, r.stack);
            let before =
                (params.delta != Delta::Any).then_some((r.old_bytes, r.old_indirect, r.old_blocks));
            let shown = Shown {
                tid: params.tid,
                xml_kind: match r.kind {
                    LeakKind::Definite => "Leak_DefinitelyLost",
                    LeakKind::Indirect => "Leak_IndirectlyLost",
                    LeakKind::Possible => "Leak_PossiblyLost",
                    LeakKind::Reachable => "Leak_StillReachable",
                },
                block: ErrorBlock {
                    what: text::loss_record_what_since(
                        r.bytes,
                        r.indirect,
                        r.blocks,
                        before,
                        r.kind,
                        i + 1,
                        total,
                    ),
                    stack: res.shown,
                    aux: Vec::new(),
                },
                what_newline_quirk: WhatQuirk::None,
                supp_frames: res.supp,
                generated: GeneratedSupp {
                    kind: "Memcheck:Leak".into(),
                    extra: Some(format!("match-leak-kinds: {}", r.kind.keyword())),
                    frames: res.gen,
                },
            };
            let suppressed = st.errors.leak(
                out,
                r.kind,
                &shown,
                (r.bytes + r.indirect, r.blocks),
                print,
                count,
            );
            let slot = if suppressed {
                &mut sum.suppressed
            } else {
                match r.kind {
                    LeakKind::Definite => &mut sum.definite,
                    LeakKind::Indirect => &mut sum.indirect,
                    LeakKind::Possible => &mut sum.possible,
                    LeakKind::Reachable => &mut sum.reachable,
                }
            };
            slot.bytes += r.bytes;
            slot.blocks += r.blocks;
        }
        st.leaked = Some(oxgrind_tool::Leaked {
            bytes: sum.definite.bytes + sum.indirect.bytes,
            largest: records
                .iter()
                .filter(|r| r.kind == LeakKind::Definite)
                .max_by_key(|r| r.bytes + r.indirect)
                .map(|r| (r.stack, r.bytes + r.indirect)),
        });
        // "of which reachable via heuristic", per heuristic, over all blocks (as Memcheck),
        // also when the previous search had some and this one none.
        let old_sum = std::mem::take(&mut st.last_leak.summary);
        let mut shown_heuristics = Vec::new();
        for h in [
            leak::Heuristic::StdString,
            leak::Heuristic::Length64,
            leak::Heuristic::NewArray,
            leak::Heuristic::MultipleInheritance,
        ] {
            let mut a = Amount::default();
            for (b, v) in blocks.iter().zip(&verdicts) {
                if v.heuristic == Some(h) {
                    a.bytes += b.size;
                    a.blocks += 1;
                }
            }
            if a.blocks > 0 {
                sum.heuristics.push((h.name(), a));
            }
            let had = old_sum
                .heuristics
                .iter()
                .any(|(n, o)| *n == h.name() && o.blocks > 0);
            if a.blocks > 0 || had {
                shown_heuristics.push((h.name(), a));
            }
        }
        if verbose_text {
            let mode = if full {
                LeakMode::Full {
                    reachable_shown: self.opts.show_leak_kinds.contains(LeakKind::Reachable),
                }
            } else {
                LeakMode::Summary
            };
            let printed = LeakSummary {
                heuristics: shown_heuristics,
                ..sum.clone()
            };
            let before = (params.delta != Delta::Any).then_some(&old_sum);
            text::leak_summary_since(&mut out.text, pid, &printed, before, mode);
        }
        st.last_leak = LastLeakSearch {
            records,
            summary: sum,
        };
    }
}

/// Memcheck's rule for custom allocators (its bug 100628): a block announced with
/// `VALGRIND_MALLOCLIKE_BLOCK` that lies inside a `malloc`ed block (the allocator's pool)
/// takes its place in the leak search, which would otherwise see two overlapping blocks.
/// `blocks` is sorted by address; neighbours are compared, as Valgrind compares them.
fn drop_superblocks(blocks: &mut Vec<leak::Block>, custom: &[LiveBlock]) {
    if custom.is_empty() {
        return;
    }
    let is_custom = |b: &leak::Block| custom.iter().any(|c| c.addr == b.addr && c.size == b.size);
    let mut i = 0;
    while i + 1 < blocks.len() {
        let (a, b) = (&blocks[i], &blocks[i + 1]);
        let (end_a, end_b) = (a.addr + a.size, b.addr + b.size);
        if end_a <= b.addr {
            i += 1;
        } else if a.addr >= b.addr && end_a <= end_b && is_custom(a) && !is_custom(b) {
            blocks.remove(i + 1);
        } else if b.addr >= a.addr && end_b <= end_a && is_custom(b) && !is_custom(a) {
            blocks.remove(i);
        } else {
            i += 1;
        }
    }
}

/// The parts of `[start, end)` outside `hole` (at most two).
fn outside(start: Addr, end: Addr, hole: (Addr, Addr)) -> impl Iterator<Item = (Addr, Addr)> {
    let before = (start, end.min(hole.0));
    let after = (start.max(hole.1), end);
    [before, after].into_iter().filter(|(s, e)| s < e)
}

/// The leak search's view of the program's memory.
struct HostMemory<'a> {
    host: &'a dyn Host,
    /// Bytes of blocks scanned (`-v`'s "Checked N bytes").
    scanned: std::cell::Cell<u64>,
}

impl HostMemory<'_> {
    /// Every aligned word of the root range `[start, end)`. The host's reads never fault:
    /// root ranges are computed before the scan, and under the translation engine our own
    /// large allocations can be unmapped while the scan runs.
    pub(crate) fn read_root_words(&self, start: Addr, end: Addr, f: &mut dyn FnMut(Addr, u64)) {
        let mut n = 0u64;
        self.host
            .read_words(start, end.saturating_sub(start), &mut |a, w| {
                n += 1;
                f(a, w)
            });
        self.scanned.set(self.scanned.get() + n * 8);
    }
}

impl leak::Memory for HostMemory<'_> {
    fn read_words(&self, start: Addr, len: u64, f: &mut dyn FnMut(Addr, u64)) {
        let mut n = 0u64;
        self.host.read_words(start, len, &mut |a, w| {
            n += 1;
            f(a, w)
        });
        // Single-word reads are the heuristics peeking, not scanning.
        if len > 8 {
            self.scanned.set(self.scanned.get() + n * 8);
        }
    }
    fn is_vtable(&self, _addr: Addr) -> bool {
        // Needs data symbols (`_ZTV...`), which `Host::describe` (code addresses) does not
        // give, and it runs with the program's threads stopped, where calling into the
        // symbolizer could wait for a lock a stopped thread holds. So the
        // multiple-inheritance heuristic never fires here; such blocks stay "possibly lost".
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(crate) fn root_ranges_skip_the_shadow() {
        let parts = |s, e, h| outside(s, e, h).collect::<Vec<_>>();
        assert_eq!(parts(0, 100, (40, 60)), [(0, 40), (60, 100)]);
        assert_eq!(parts(50, 100, (40, 60)), [(60, 100)]);
        assert_eq!(parts(45, 55, (40, 60)), []);
        assert_eq!(parts(0, 10, (0, 0)), [(0, 10)]);
    }
}
