//! The `--max-peak`, `--max-allocs` and `--max-leaked` budgets (parsed in
//! `oxgrind_options::budget`): measured here, checked once at exit, after the tool's report.
//!
//! Peak and allocation count are the runtime's own figures, the same for every heap tool:
//! the live-block table ([`crate::blocks`]) calls [`on_insert`] and [`on_remove`] for each
//! program block, so allocations, frees and reallocs are all seen once. Leaked bytes come
//! from the tool's leak check ([`oxgrind_tool::Tool::leaked`]), the only place they exist.
//!
//! Nothing is measured unless a budget was given ([`ON`] is false and the hooks return at
//! once). With one, each allocation costs an atomic add on the live total (and, for
//! `--max-allocs`, a count under one of 64 stack-sharded locks, as the block table itself
//! takes); the site behind the peak is found by grouping the live blocks by stack, which is
//! done again only when the peak, already over budget, has grown by an eighth since the last
//! time: a handful of walks per run, and the site named is the one at the peak within 12.5%.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use oxgrind_options::{Budgets, BUDGET_EXIT_CODE};
use oxgrind_sys::lock::SpinLock;
use oxgrind_tool::{Host, StackId, Tool};

use crate::blocks::{AddrMap, BlockInfo};
use crate::state::BLOCKS;

/// Whether any budget is being measured.
static ON: AtomicBool = AtomicBool::new(false);
/// The budgets, `NONE` when not given (atomics, not a lock: they are read at exit, maybe in
/// a fatal-signal handler that interrupted anything).
const NONE: u64 = u64::MAX;
static MAX_PEAK: AtomicU64 = AtomicU64::new(NONE);
static MAX_LEAKED: AtomicU64 = AtomicU64::new(NONE);
static MAX_ALLOCS: AtomicU64 = AtomicU64::new(NONE);
/// Spins before giving up on a lock at exit (the top site is then left out of the line).
const EXIT_SPINS: u64 = 1 << 20;
static COUNT_SITES: AtomicBool = AtomicBool::new(false);

static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
/// The live total when the live blocks were last grouped by stack, and the largest group then.
static PEAK_SITE: SpinLock<(u64, Option<(StackId, u64)>)> = SpinLock::new((0, None));

const SHARDS: usize = 64;
type Counts = SpinLock<Option<AddrMap<u64>>>;
static ALLOCS_BY_STACK: [Counts; SHARDS] = [const { SpinLock::new(None) }; SHARDS];

/// Set when a budget broke, for the exit status.
static BROKEN: AtomicBool = AtomicBool::new(false);

/// Called once when the runtime is set up.
pub fn configure(b: &Budgets) {
    MAX_PEAK.store(b.max_peak.unwrap_or(NONE), Ordering::Relaxed);
    MAX_LEAKED.store(b.max_leaked.unwrap_or(NONE), Ordering::Relaxed);
    MAX_ALLOCS.store(b.max_allocs.unwrap_or(NONE), Ordering::Relaxed);
    COUNT_SITES.store(b.max_allocs.is_some(), Ordering::Relaxed);
    ON.store(
        b.max_peak.is_some() || b.max_allocs.is_some(),
        Ordering::Release,
    );
}

/// A program block entered the live-block table (outside the table's lock).
#[inline]
pub fn on_insert(info: &BlockInfo) {
    if !ON.load(Ordering::Relaxed) || info.internal {
        return;
    }
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    if COUNT_SITES.load(Ordering::Relaxed) {
        let shard = &ALLOCS_BY_STACK[info.stack.0 as usize % SHARDS];
        *shard
            .lock()
            .get_or_insert_with(AddrMap::default)
            .entry(info.stack.0 as u64)
            .or_default() += 1;
    }
    let live = LIVE.fetch_add(info.size, Ordering::Relaxed) + info.size;
    let before = PEAK.fetch_max(live, Ordering::Relaxed);
    if live > before && live > MAX_PEAK.load(Ordering::Relaxed) {
        note_peak_site(live);
    }
}

/// A program block left the table.
#[inline]
pub fn on_remove(info: &BlockInfo) {
    if !ON.load(Ordering::Relaxed) || info.internal {
        return;
    }
    LIVE.fetch_sub(info.size, Ordering::Relaxed);
}

/// A new peak over the budget: group the live blocks by stack if the peak grew by an eighth
/// since the last grouping. One thread does it; others carry on.
#[cold]
fn note_peak_site(live: u64) {
    let Some(mut site) = PEAK_SITE.try_lock() else {
        return;
    };
    if site.0 != 0 && live < site.0 + site.0 / 8 {
        return;
    }
    let mut by: AddrMap<u64> = AddrMap::default();
    for b in BLOCKS.live_blocks() {
        *by.entry(b.stack.0 as u64).or_default() += b.size;
    }
    let top = by
        .into_iter()
        .max_by_key(|&(s, v)| (v, std::cmp::Reverse(s)));
    *site = (live, top.map(|(s, v)| (StackId(s as u32), v)));
}

/// `big_alloc (prog.c:6)`: the first frame of an allocation stack that is the program's (not
/// our allocator hook), without its address.
fn site_name(host: &dyn Host, stack: StackId) -> String {
    let (lo, hi) = crate::stacks::self_text();
    let frames = host.stack(stack);
    for ip in frames.into_iter().filter(|&ip| !(lo <= ip && ip < hi)) {
        if let Some(f) = host.describe(ip).into_iter().next() {
            let text = f.to_string();
            return match text.split_once(": ") {
                Some((_, rest)) => rest.to_string(),
                None => text,
            };
        }
    }
    "(unknown site)".into()
}

/// `15,012,345 B (14.3 MiB)`.
fn bytes(n: u64) -> String {
    let exact = oxgrind_formats::number::commify(n);
    if n < 1024 {
        return format!("{exact} B");
    }
    let units = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let (mut v, mut u) = (n as f64 / 1024.0, 0);
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{exact} B ({v:.1} {})", units[u])
}

/// After the tool's `fini`: checks every budget, writes one line per broken one to the log.
pub fn check(host: &dyn Host, tool: &dyn Tool) {
    let given = |a: &AtomicU64| Some(a.load(Ordering::Relaxed)).filter(|&v| v != NONE);
    let b = Budgets {
        max_peak: given(&MAX_PEAK),
        max_leaked: given(&MAX_LEAKED),
        max_allocs: given(&MAX_ALLOCS),
    };
    let mut lines = Vec::new();
    if let Some(max) = b.max_peak {
        let peak = PEAK.load(Ordering::Relaxed);
        if peak > max {
            let site = match PEAK_SITE.lock_bounded(EXIT_SPINS).map(|g| *g) {
                Some((at, Some((s, v)))) => format!(
                    "; top site near the peak: {}, {} of {} live",
                    site_name(host, s),
                    bytes(v),
                    bytes(at)
                ),
                _ => String::new(),
            };
            lines.push(format!(
                "--max-peak={max}: the heap peaked at {}, {} over{site}",
                bytes(peak),
                bytes(peak - max)
            ));
        }
    }
    if let Some(max) = b.max_allocs {
        let n = ALLOCS.load(Ordering::Relaxed);
        if n > max {
            // The stack with the most allocations (the lowest id among equals).
            let top = ALLOCS_BY_STACK
                .iter()
                .flat_map(|shard| {
                    let counts: Vec<(u64, u64)> = shard
                        .lock_bounded(EXIT_SPINS)
                        .and_then(|g| {
                            g.as_ref()
                                .map(|m| m.iter().map(|(&s, &c)| (s, c)).collect())
                        })
                        .unwrap_or_default();
                    counts
                })
                .max_by_key(|&(s, c)| (c, std::cmp::Reverse(s)));
            let site = match top {
                Some((s, c)) => format!(
                    "; top site: {} ({} allocations)",
                    site_name(host, StackId(s as u32)),
                    oxgrind_formats::number::commify(c)
                ),
                None => String::new(),
            };
            lines.push(format!(
                "--max-allocs={max}: the program made {} allocations, {} over{site}",
                oxgrind_formats::number::commify(n),
                oxgrind_formats::number::commify(n - max)
            ));
        }
    }
    if let Some(max) = b.max_leaked {
        match tool.leaked() {
            Some(l) if l.bytes > max => {
                let site = match l.largest {
                    Some((s, v)) => format!("; largest loss record: {} ({})", site_name(host, s), bytes(v)),
                    None => String::new(),
                };
                lines.push(format!(
                    "--max-leaked={max}: {} definitely and indirectly lost, {} over{site}",
                    bytes(l.bytes),
                    bytes(l.bytes - max)
                ));
            }
            Some(_) => {}
            None => lines.push(format!(
                "--max-leaked={max}: no leak check ran (--leak-check=no?), so the budget cannot be met"
            )),
        }
    }
    for l in &lines {
        host.log(&format!("oxgrind: budget broken: {l}\n"));
    }
    if !lines.is_empty() {
        BROKEN.store(true, Ordering::Release);
    }
}

/// The exit status to force after [`check`]: [`BUDGET_EXIT_CODE`] if a budget broke.
pub fn exit_status() -> Option<i32> {
    BROKEN.load(Ordering::Acquire).then_some(BUDGET_EXIT_CODE)
}
