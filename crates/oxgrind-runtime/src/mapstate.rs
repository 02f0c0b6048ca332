//! Which of the program's mappings Valgrind's Memcheck holds unaddressable
//! (`Needs::mapping_access`, `Host::noaccess_mapping`).
//!
//! A fault in a mapping that allows no access at all (`---`) is an invalid access to
//! Memcheck only if its A bits say so, and those follow how the mapping got its
//! permissions, not what they are now: `mmap` with any permission makes the range defined,
//! `mmap` with `PROT_NONE` unaddressable; `mprotect` to `PROT_NONE` changes nothing;
//! `mprotect` to anything else makes what was unaddressable defined; `munmap` makes it
//! unaddressable (nothing is mapped, which the fault says itself: `SEGV_MAPERR`); `mremap`
//! carries the old range's bits to the new one and treats a grown tail as `mmap` with the
//! mapping's permissions. So a page the program made `PROT_NONE` with `mprotect` to catch
//! its accesses (a guard it re-enables in its handler) is addressable, while a thread
//! stack's guard page (glibc maps the whole stack `PROT_NONE`, then `mprotect`s all but the
//! guard read-write) is not.
//!
//! Kept here: for every range the engine saw a memory system call for, whether Valgrind
//! holds it unaddressable, as sorted disjoint intervals, updated from the engine's memory
//! system calls (`oxgrind_engine::Config::on_memory_syscall`, which sees every `mmap`,
//! `munmap`, `mremap` and `mprotect` the program's code makes). Those calls are not per
//! access, and the question is asked only at a fault, so one lock guards the intervals.
//! What the engine does not see is unknown ([`state`] gives `None`; the tool decides):
//! mappings made before it took over (the dynamic linker's, whose `---` holes in
//! libraries it makes with `mprotect`, addressable to Valgrind, which saw that), and calls
//! made natively (glibc's allocator inside a heap event: an arena's `PROT_NONE` reserve,
//! which has no counterpart under Valgrind, whose allocator is its own). `brk` never moves
//! over a mapping, and `shmat` maps with some permission where nothing is mapped, unless
//! with `SHM_REMAP` (not followed: the range keeps the state of what it replaced).

use std::sync::atomic::{AtomicBool, Ordering};

use oxgrind_sys::lock::SpinLock;

const SYS_MMAP: u64 = 9;
const SYS_MPROTECT: u64 = 10;
const SYS_MUNMAP: u64 = 11;
const SYS_MREMAP: u64 = 25;
const SYS_PKEY_MPROTECT: u64 = 329;
/// `PROT_READ | PROT_WRITE | PROT_EXEC`: any of them is "some permission" to Valgrind
/// (`PROT_GROWSDOWN` and the like are not permissions).
const PROT_ANY: u64 = 7;
const PAGE: u64 = 4096;

/// Whether the tool asked for the intervals ([`enable`]).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The ranges seen, `(lo, hi, unaddressable)` for `[lo, hi)`: sorted, disjoint, and two
/// that touch hold different states.
static SEEN: SpinLock<Vec<(u64, u64, bool)>> = SpinLock::new(Vec::new());

/// Starts following the program's mappings (before the engine takes over).
pub fn enable() {
    ENABLED.store(true, Ordering::Release);
}

/// Whether [`enable`] was called.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Acquire)
}

/// Whether Valgrind holds `addr` unaddressable by how its mapping got its permissions (see
/// the module's doc): `Some(true)` where `mmap` made it `PROT_NONE` and nothing has given it
/// a permission since, `Some(false)` where the program mapped it with some permission or
/// gave it one; `None` where the engine saw no call for it (or without [`enable`]).
pub fn state(addr: u64) -> Option<bool> {
    if !enabled() {
        return None;
    }
    let ranges = SEEN.lock();
    let i = ranges.partition_point(|&(_, hi, _)| hi <= addr);
    ranges
        .get(i)
        .filter(|&&(lo, _, _)| lo <= addr)
        .map(|&(_, _, noaccess)| noaccess)
}

/// In the child of a fork, which has only the forking thread: a lock another thread of the
/// parent held is released (its update is lost at worst: a missed or an extra report for
/// that range, never a hang).
pub fn after_fork_child() {
    // SAFETY: the child is single-threaded here; no thread of it holds the lock.
    unsafe { SEEN.force_unlock() };
}

/// The engine performed one of the program's memory system calls (`call.result` is the
/// kernel's): the intervals follow Valgrind's rules for it.
pub fn on_engine_syscall(call: &oxgrind_engine::MemorySyscall) {
    if !enabled() || (-4095..0).contains(&call.result) {
        return;
    }
    let a = call.args;
    let len = |n: u64| n.saturating_add(PAGE - 1) & !(PAGE - 1);
    match call.nr {
        SYS_MMAP => {
            let lo = call.result as u64;
            set(lo, lo.saturating_add(len(a[1])), Some(a[2] & PROT_ANY == 0));
        }
        SYS_MPROTECT | SYS_PKEY_MPROTECT if a[2] & PROT_ANY != 0 => {
            set(a[0], a[0].saturating_add(len(a[1])), Some(false));
        }
        SYS_MPROTECT | SYS_PKEY_MPROTECT => {
            // PROT_NONE changes nothing seen; what was not seen had some permission (the
            // program protects memory it uses: a page of a block glibc's allocator mapped
            // natively), so it is addressable.
            let (lo, hi) = (a[0], a[0].saturating_add(len(a[1])));
            let unseen = gaps(&SEEN.lock(), lo, hi);
            for (lo, hi) in unseen {
                set(lo, hi, Some(false));
            }
        }
        SYS_MUNMAP => set(a[0], a[0].saturating_add(len(a[1])), None),
        SYS_MREMAP => remapped(a[0], len(a[1]), len(a[2]), call.result as u64),
        _ => {}
    }
}

/// `mremap(old, old_len, new_len, ...)` returned `new`: the first `min(old_len, new_len)`
/// bytes at `new` are as the old range's were, the old range is gone, and a grown tail is
/// unaddressable if the mapping allows no access (Valgrind's `copy_mem_remap`, then
/// `new_mem_mmap` with the segment's permissions).
fn remapped(old: u64, old_len: u64, new_len: u64, new: u64) {
    let kept = old_len.min(new_len);
    let mut carried: Vec<(u64, u64, bool)> = Vec::new();
    {
        let ranges = SEEN.lock();
        let end = old.saturating_add(kept);
        for &(lo, hi, noaccess) in ranges.iter() {
            let (lo, hi) = (lo.max(old), hi.min(end));
            if lo < hi {
                carried.push((lo - old, hi - old, noaccess));
            }
        }
    }
    // (old_len 0 duplicates a shared mapping: the old one stays, and this forgets nothing.)
    set(old, old.saturating_add(old_len), None);
    set(new, new.saturating_add(new_len), None);
    for (lo, hi, noaccess) in carried {
        set(new + lo, new + hi, Some(noaccess));
    }
    if new_len > old_len {
        let tail = new + old_len;
        set(tail, new + new_len, Some(mapping_has_no_access(tail)));
    }
}

/// Whether the mapping at `addr` allows no access, from `/proc/self/maps` (only for a
/// grown `mremap`, which is rare).
fn mapping_has_no_access(addr: u64) -> bool {
    let Some(maps) = oxgrind_sys::procself::read_string(oxgrind_sys::procself::SelfFile::Maps)
    else {
        return false;
    };
    maps.lines().any(|line| {
        let mut fields = line.split_whitespace();
        let range = fields.next().and_then(|r| r.split_once('-'));
        let perms = fields.next().unwrap_or("");
        range.is_some_and(|(lo, hi)| {
            let lo = u64::from_str_radix(lo, 16).unwrap_or(u64::MAX);
            let hi = u64::from_str_radix(hi, 16).unwrap_or(0);
            lo <= addr && addr < hi && perms.starts_with("---")
        })
    })
}

/// The parts of `[lo, hi)` no range in `ranges` covers.
fn gaps(ranges: &[(u64, u64, bool)], lo: u64, hi: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = lo;
    let first = ranges.partition_point(|&(_, h, _)| h <= lo);
    for &(l, h, _) in ranges[first..].iter().take_while(|&&(l, _, _)| l < hi) {
        if l > at {
            out.push((at, l));
        }
        at = at.max(h);
    }
    if at < hi {
        out.push((at, hi));
    }
    out
}

/// Sets `[lo, hi)` to `state` (`None`: forgotten, nothing mapped).
fn set(lo: u64, hi: u64, state: Option<bool>) {
    if lo >= hi {
        return;
    }
    let mut ranges = SEEN.lock();
    apply(&mut ranges, lo, hi, state);
}

/// [`set`] on `ranges` (sorted, disjoint, touching ones of different states; kept so).
fn apply(ranges: &mut Vec<(u64, u64, bool)>, lo: u64, hi: u64, state: Option<bool>) {
    // The ranges that overlap or touch [lo, hi): first..last.
    let first = ranges.partition_point(|&(_, h, _)| h < lo);
    let last = first + ranges[first..].partition_point(|&(l, _, _)| l <= hi);
    let mut new: [Option<(u64, u64, bool)>; 3] = [None, None, None];
    let (mut l, mut h) = (lo, hi);
    if first < last {
        // What sticks out below or above (or only touches) stays, as its own range or, in
        // the same state, as part of the new one.
        let (fl, _, fs) = ranges[first];
        if fl < lo {
            match Some(fs) == state {
                true => l = fl,
                false => new[0] = Some((fl, lo, fs)),
            }
        }
        let (_, lh, ls) = ranges[last - 1];
        if lh > hi {
            match Some(ls) == state {
                true => h = lh,
                false => new[2] = Some((hi, lh, ls)),
            }
        }
    }
    if let Some(s) = state {
        new[1] = Some((l, h, s));
    }
    ranges.splice(first..last, new.into_iter().flatten());
}

#[cfg(test)]
mod tests {
    use super::{apply, gaps};

    #[test]
    fn gaps_are_what_no_range_covers() {
        let r = [(0x2000, 0x3000, true), (0x4000, 0x5000, false)];
        assert_eq!(
            gaps(&r, 0x1000, 0x6000),
            [(0x1000, 0x2000), (0x3000, 0x4000), (0x5000, 0x6000)]
        );
        assert_eq!(gaps(&r, 0x2000, 0x3000), []);
        assert_eq!(gaps(&r, 0x2800, 0x4800), [(0x3000, 0x4000)]);
        assert_eq!(gaps(&[], 0x1000, 0x2000), [(0x1000, 0x2000)]);
    }

    #[test]
    fn intervals_merge_split_and_stay_sorted() {
        let (yes, no) = (Some(true), Some(false));
        let mut r = Vec::new();
        apply(&mut r, 0x3000, 0x5000, yes);
        apply(&mut r, 0x8000, 0x9000, yes);
        assert_eq!(r, [(0x3000, 0x5000, true), (0x8000, 0x9000, true)]);
        // Touching ranges of one state merge; of another they stay apart.
        apply(&mut r, 0x5000, 0x6000, yes);
        apply(&mut r, 0x6000, 0x7000, no);
        assert_eq!(
            r,
            [
                (0x3000, 0x6000, true),
                (0x6000, 0x7000, false),
                (0x8000, 0x9000, true)
            ]
        );
        // A hole in the middle splits one.
        apply(&mut r, 0x4000, 0x5000, None);
        assert_eq!(
            r,
            [
                (0x3000, 0x4000, true),
                (0x5000, 0x6000, true),
                (0x6000, 0x7000, false),
                (0x8000, 0x9000, true)
            ]
        );
        // Across several: the ends that stick out stay; one of the same state joins.
        apply(&mut r, 0x3800, 0x8800, no);
        assert_eq!(
            r,
            [
                (0x3000, 0x3800, true),
                (0x3800, 0x8800, false),
                (0x8800, 0x9000, true)
            ]
        );
        // Inside one of the same state: nothing changes; of another: it splits in three.
        apply(&mut r, 0x4000, 0x5000, no);
        assert_eq!(
            r,
            [
                (0x3000, 0x3800, true),
                (0x3800, 0x8800, false),
                (0x8800, 0x9000, true)
            ]
        );
        apply(&mut r, 0x4000, 0x5000, yes);
        assert_eq!(
            r,
            [
                (0x3000, 0x3800, true),
                (0x3800, 0x4000, false),
                (0x4000, 0x5000, true),
                (0x5000, 0x8800, false),
                (0x8800, 0x9000, true)
            ]
        );
        // Forgetting what only touches changes nothing.
        apply(&mut r, 0x9000, 0xa000, None);
        apply(&mut r, 0x1000, 0x3000, None);
        assert_eq!(r.len(), 5);
        // Covering everything makes one range; forgetting it, none.
        apply(&mut r, 0x1000, 0xa000, yes);
        assert_eq!(r, [(0x1000, 0xa000, true)]);
        apply(&mut r, 0x1000, 0xa000, None);
        assert!(r.is_empty());
    }
}
