//! From a raw interned stack to Massif's execution context (Valgrind's `filter_IPs`).
//!
//! A raw stack starts with the allocator entry point the program called, then the return
//! addresses of its callers. Massif shows none of the allocator: frame 0 (our replacement
//! `malloc`) is dropped, then every frame whose function is an allocation function
//! (built-in list plus `--alloc-fn`; an address counts as one only if all its inlined levels
//! are), then frames below `main`; `--depth` frames are kept. An allocation whose first named
//! function is an `--ignore-fn` is ignored entirely. The result is the execution context (EC):
//! the list of code addresses the heap tree is built from.
//!
//! This needs function names, and `Host::describe` is slow, so it runs once per new
//! [`StackId`](oxgrind_tool::StackId) (the caller caches the answer) and once per code
//! address (a cache inside `Classifier`). The frame texts printed in the tree are computed
//! here too, so writing the file needs no symbol lookups beyond the ones already done.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use crate::sync::{FxHashMap, SpinLock};
use oxgrind_tool::{Addr, Frame, Host, StackId};

/// Allocation functions Massif always filters (Valgrind 3.19, 64-bit names).
pub const BUILTIN_ALLOC_FNS: &[&str] = &[
    "malloc",
    "__builtin_new",
    "operator new(unsigned long)",
    "__builtin_vec_new",
    "operator new[](unsigned long)",
    "calloc",
    "aligned_alloc",
    "realloc",
    "memalign",
    "posix_memalign",
    "valloc",
    "operator new(unsigned long, std::nothrow_t const&)",
    "operator new[](unsigned long, std::nothrow_t const&)",
    "operator new(unsigned long, std::align_val_t)",
    "operator new[](unsigned long, std::align_val_t)",
    "operator new(unsigned long, std::align_val_t, std::nothrow_t const&)",
    "operator new[](unsigned long, std::align_val_t, std::nothrow_t const&)",
];

/// Valgrind's `Vg_FnNameKind`: where a stack is cut unless `--show-below-main=yes` (the
/// one rule, shared with the symboliser and DHAT).
use oxgrind_formats::below_main::{fn_name_kind as fn_kind, FnNameKind as FnKind};

/// What classification needs to know about one code address, computed once.
#[derive(Clone, Debug)]
struct IpFacts {
    /// Every inlined level (and the function itself) is an allocation function.
    alloc_fn: bool,
    /// The level where the alloc-fn scan stopped has a name (Valgrind's `top_has_fnname`).
    stop_has_name: bool,
    /// That name is an `--ignore-fn`.
    stop_ignored: bool,
    /// Some level has a name.
    any_name: bool,
    /// The first level with a name is an `--ignore-fn`.
    first_name_ignored: bool,
    /// Kind of the containing (outermost) function's symbol name.
    kind: FnKind,
}

#[derive(Clone, Debug)]
struct IpInfo {
    facts: IpFacts,
    /// Frame texts, innermost inlined level first.
    labels: Vec<String>,
}

/// The filter settings (built-in + `--alloc-fn`, `--ignore-fn`, `--depth`) and the per-address
/// cache of names. Shared by every thread; its own lock, held only for lookups and inserts.
pub(crate) struct Classifier {
    alloc_fns: Vec<String>,
    ignore_fns: Vec<String>,
    depth: usize,
    /// `--show-below-main=yes`: keep the frames under `main`, with their real names.
    show_below_main: bool,
    cache: SpinLock<FxHashMap<Addr, IpInfo>>,
    /// Heap stacks [`Classifier::warm`] has seen.
    warmed: StackSet,
}

/// A set of stack ids without a lock: the runtime numbers stacks densely from 0, so one bit
/// per id in chunks allocated on first use. Ids past [`StackSet::MAX`] are never members
/// (their stacks are then described under the state lock, as before).
struct StackSet {
    chunks: [AtomicPtr<AtomicU64>; StackSet::CHUNKS],
}

impl StackSet {
    /// Ids per chunk (a chunk is 8 KiB).
    const CHUNK_BITS: u32 = 16;
    const WORDS: usize = (1 << Self::CHUNK_BITS) / 64;
    /// The runtime's own limit on distinct stacks is 2^26.
    const CHUNKS: usize = 1 << (26 - Self::CHUNK_BITS);
    const MAX: u32 = (Self::CHUNKS as u32) << Self::CHUNK_BITS;

    fn new() -> Self {
        StackSet {
            chunks: [const { AtomicPtr::new(std::ptr::null_mut()) }; Self::CHUNKS],
        }
    }

    /// Whether `id` is a member (always `true` past [`Self::MAX`]: never inserted there).
    #[inline]
    fn contains(&self, id: StackId) -> bool {
        if id.0 >= Self::MAX {
            return true;
        }
        let chunk = self.chunks[(id.0 >> Self::CHUNK_BITS) as usize].load(Ordering::Acquire);
        if chunk.is_null() {
            return false;
        }
        let bit = id.0 as usize & ((1 << Self::CHUNK_BITS) - 1);
        // SAFETY: as in `insert`: a published chunk holds WORDS words and lives as long as
        // the set; `bit / 64 < WORDS`.
        let word = unsafe { &*chunk.add(bit / 64) };
        word.load(Ordering::Relaxed) & (1u64 << (bit % 64)) != 0
    }

    /// Adds `id`; whether it was not a member before (always `false` past [`Self::MAX`]).
    fn insert(&self, id: StackId) -> bool {
        if id.0 >= Self::MAX {
            return false;
        }
        let slot = &self.chunks[(id.0 >> Self::CHUNK_BITS) as usize];
        let mut chunk = slot.load(Ordering::Acquire);
        if chunk.is_null() {
            let fresh: Box<[AtomicU64]> = (0..Self::WORDS).map(|_| AtomicU64::new(0)).collect();
            let fresh = Box::into_raw(fresh) as *mut AtomicU64;
            chunk = match slot.compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => fresh,
                Err(theirs) => {
                    // SAFETY: `fresh` came from Box::into_raw just above as a boxed slice of
                    // WORDS words and was never published.
                    drop(unsafe {
                        Box::from_raw(std::ptr::slice_from_raw_parts_mut(fresh, Self::WORDS))
                    });
                    theirs
                }
            };
        }
        let bit = id.0 as usize & ((1 << Self::CHUNK_BITS) - 1);
        // SAFETY: a published chunk holds WORDS words and is never freed while the set
        // lives (Drop frees it); `bit / 64 < WORDS`.
        let word = unsafe { &*chunk.add(bit / 64) };
        let mask = 1u64 << (bit % 64);
        word.load(Ordering::Relaxed) & mask == 0
            && word.fetch_or(mask, Ordering::Relaxed) & mask == 0
    }
}

impl Drop for StackSet {
    fn drop(&mut self) {
        for slot in &self.chunks {
            let chunk = slot.load(Ordering::Acquire);
            if !chunk.is_null() {
                // SAFETY: published chunks came from Box::into_raw of a boxed slice of
                // WORDS words; `&mut self` means no one else uses them.
                drop(unsafe {
                    Box::from_raw(std::ptr::slice_from_raw_parts_mut(chunk, Self::WORDS))
                });
            }
        }
    }
}

/// Result of classifying a stack: the EC's frames, or `None` when the allocation is ignored
/// (`--ignore-fn`, or nothing left after filtering).
pub(crate) type Classified = Option<Vec<Addr>>;

impl Classifier {
    pub(crate) fn new(
        user_alloc_fns: &[String],
        ignore_fns: &[String],
        depth: usize,
        show_below_main: bool,
    ) -> Self {
        let mut alloc_fns: Vec<String> = BUILTIN_ALLOC_FNS.iter().map(|s| s.to_string()).collect();
        alloc_fns.extend(user_alloc_fns.iter().cloned());
        Classifier {
            alloc_fns,
            ignore_fns: ignore_fns.to_vec(),
            depth,
            show_below_main,
            cache: SpinLock::new(FxHashMap::default()),
            warmed: StackSet::new(),
        }
    }

    /// Looks up the names of a new heap stack's addresses, on the calling thread, before its
    /// event is logged: so that the thread that later applies the logs, under Massif's state
    /// lock, finds them in the cache. Describing an address can take long (the first one in
    /// an object loads its symbols and debug information, hundreds of milliseconds under
    /// load); under the state lock that stalled every other thread once its log was full,
    /// and the program ran on one core. Here only threads that meet a new address wait, as
    /// Valgrind's do. The stack's classification itself is still made, from the cache, when
    /// its event is applied, so the results do not change.
    #[inline]
    pub(crate) fn warm(&self, host: &dyn Host, stack: StackId) {
        // Every allocation comes here and almost all from stacks seen before: one bit read
        // inline, the rest out of line.
        if !self.warmed.contains(stack) {
            self.warm_new(host, stack);
        }
    }

    #[inline(never)]
    #[cold]
    fn warm_new(&self, host: &dyn Host, stack: StackId) {
        if self.warmed.insert(stack) {
            let raw = host.stack(stack);
            // Frame 0 is our replacement allocator (see `Massif::ec_of_locked`).
            let _ = self.classify(host, raw.get(1..).unwrap_or(&[]));
        }
    }

    /// # Safety
    /// As [`SpinLock::force_unlock`]: only in a forked child, with no guard alive.
    pub(crate) unsafe fn force_unlock(&self) {
        // SAFETY: forwarded to the caller.
        unsafe { self.cache.force_unlock() }
    }

    fn is_alloc_fn(&self, name: &str) -> bool {
        self.alloc_fns.iter().any(|f| f == name)
    }

    fn is_ignore_fn(&self, name: &str) -> bool {
        self.ignore_fns.iter().any(|f| f == name)
    }

    fn describe(&self, host: &dyn Host, ip: Addr) -> IpInfo {
        let mut frames = host.describe(ip);
        if frames.is_empty() {
            frames.push(Frame {
                ip,
                ..Default::default()
            });
        }
        // Alloc-fn scan over the inlined levels, innermost first: stops at the first level
        // that is not an alloc fn (Valgrind's do/while over the InlIPCursor).
        let mut alloc_fn = false;
        let mut stop_name: Option<&str> = None;
        for f in &frames {
            let name = f.function.as_deref();
            stop_name = name;
            alloc_fn = name.is_some_and(|n| self.is_alloc_fn(n));
            if !alloc_fn {
                break;
            }
        }
        let first_name = frames.iter().find_map(|f| f.function.as_deref());
        let outer = frames.last().expect("at least one frame, pushed above");
        let raw = outer.mangled.as_deref().or(outer.function.as_deref());
        let facts = IpFacts {
            alloc_fn,
            stop_has_name: stop_name.is_some(),
            stop_ignored: stop_name.is_some_and(|n| self.is_ignore_fn(n)),
            any_name: first_name.is_some(),
            first_name_ignored: first_name.is_some_and(|n| self.is_ignore_fn(n)),
            kind: raw.map_or(FnKind::Normal, fn_kind),
        };
        let labels = frames
            .iter()
            .map(|f| {
                // Valgrind names a below-main function "(below main)" when it shows it.
                let below = f
                    .function
                    .as_deref()
                    .is_some_and(|n| fn_kind(n) == FnKind::BelowMain);
                if below && !self.show_below_main {
                    let mut g = f.clone();
                    g.function = Some(String::from("(below main)"));
                    g.to_string()
                } else {
                    f.to_string()
                }
            })
            .collect();
        IpInfo { facts, labels }
    }

    fn facts(&self, host: &dyn Host, ip: Addr) -> IpFacts {
        if let Some(i) = self.cache.lock().get(&ip) {
            return i.facts.clone();
        }
        // Describe without holding the lock: other threads keep classifying meanwhile.
        let info = self.describe(host, ip);
        let facts = info.facts.clone();
        self.cache.lock().entry(ip).or_insert(info);
        facts
    }

    /// The frame texts of `ip` (innermost inlined level first), as cached by [`classify`].
    ///
    /// Runs while the report is written, possibly in a fatal-signal handler that interrupted
    /// a thread holding the cache lock: then it gives up on the cache and describes afresh.
    pub(crate) fn labels(&self, host: &dyn Host, ip: Addr) -> Vec<String> {
        const SPINS: u64 = 1 << 20;
        if let Some(cache) = self.cache.lock_bounded(SPINS) {
            if let Some(i) = cache.get(&ip) {
                return i.labels.clone();
            }
        }
        let info = self.describe(host, ip);
        let labels = info.labels.clone();
        if let Some(mut cache) = self.cache.lock_bounded(SPINS) {
            cache.entry(ip).or_insert(info);
        }
        labels
    }

    /// Valgrind's `filter_IPs` over `ips` (the raw stack with frame 0 already dropped for
    /// heap blocks).
    pub(crate) fn classify(&self, host: &dyn Host, ips: &[Addr]) -> Classified {
        let ips = &ips[..ips.len().min(self.depth + crate::options::OVERESTIMATE)];
        let n = ips.len();
        let facts: Vec<IpFacts> = ips.iter().map(|&ip| self.facts(host, ip)).collect();

        // Drop alloc fns from the innermost end.
        let mut top = 0;
        let mut top_has_name = false;
        let mut top_ignored = false;
        while top < n {
            let f = &facts[top];
            top_has_name = f.stop_has_name;
            top_ignored = f.stop_ignored;
            if !f.alloc_fn {
                break;
            }
            top += 1;
        }
        let mut n_sel = n - top;

        // --ignore-fn: the first named function decides.
        if n_sel > 0 && !self.ignore_fns.is_empty() {
            let ignored = if top_has_name {
                top_ignored
            } else {
                facts[top..]
                    .iter()
                    .find(|f| f.any_name)
                    .is_some_and(|f| f.first_name_ignored)
            };
            if ignored {
                return None;
            }
        }

        // Cut below main: the outermost `main`, else the innermost below-main function.
        if n_sel > 0 && !self.show_below_main {
            let mut mbm = n - 1;
            let mut mbm_kind = FnKind::Normal;
            for i in (0..n).rev() {
                if mbm_kind == FnKind::Main {
                    break;
                }
                if facts[i].kind != FnKind::Normal {
                    mbm = i;
                    mbm_kind = facts[i].kind;
                }
            }
            if mbm < top {
                // The first main (or below-main) is itself an alloc fn.
                n_sel = 1;
            } else {
                n_sel -= n - mbm - 1;
            }
        }

        n_sel = n_sel.min(self.depth);
        if n_sel == 0 {
            return None;
        }
        Some(ips[top..top + n_sel].to_vec())
    }
}

#[cfg(test)]
pub(crate) mod fake {
    //! A scripted host for unit tests: stacks, names and time are whatever the test says.
    use oxgrind_tool::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    #[derive(Default)]
    pub struct FakeHost {
        pub stacks: Mutex<HashMap<u32, Vec<Addr>>>,
        pub frames: Mutex<HashMap<Addr, Vec<Frame>>>,
        pub now_ms: Mutex<u64>,
        pub instructions: Mutex<u64>,
        pub written: Mutex<Vec<(String, Vec<u8>)>>,
        pub logged: Mutex<Vec<String>>,
        pub describe_calls: Mutex<u32>,
        pub cmd: Vec<String>,
    }

    impl FakeHost {
        pub fn new() -> Self {
            FakeHost {
                cmd: vec!["./prog".into(), "a".into()],
                ..Default::default()
            }
        }
        /// Names an address: `func (file:line)`.
        pub fn name(&self, ip: Addr, func: &str, file: &str, line: u32) {
            self.frames.lock().unwrap().insert(
                ip,
                vec![Frame {
                    ip,
                    function: Some(func.into()),
                    file: Some(file.into()),
                    line,
                    ..Default::default()
                }],
            );
        }
        /// Names an address with inlined levels, innermost first: (func, file, line).
        pub fn name_inlined(&self, ip: Addr, levels: &[(&str, &str, u32)]) {
            let fr = levels
                .iter()
                .map(|&(f, file, line)| Frame {
                    ip,
                    function: Some(f.into()),
                    file: Some(file.into()),
                    line,
                    ..Default::default()
                })
                .collect();
            self.frames.lock().unwrap().insert(ip, fr);
        }
        pub fn stack(&self, id: u32, frames: &[Addr]) -> StackId {
            self.stacks.lock().unwrap().insert(id, frames.to_vec());
            StackId(id)
        }
    }

    impl Host for FakeHost {
        fn stack(&self, id: StackId) -> Vec<Addr> {
            self.stacks
                .lock()
                .unwrap()
                .get(&id.0)
                .cloned()
                .unwrap_or_default()
        }
        fn describe(&self, ip: Addr) -> Vec<Frame> {
            *self.describe_calls.lock().unwrap() += 1;
            self.frames
                .lock()
                .unwrap()
                .get(&ip)
                .cloned()
                .unwrap_or_default()
        }
        fn elapsed_ms(&self) -> u64 {
            *self.now_ms.lock().unwrap()
        }
        fn instructions(&self) -> u64 {
            *self.instructions.lock().unwrap()
        }
        fn pid(&self) -> i32 {
            4242
        }
        fn command_line(&self) -> &[String] {
            &self.cmd
        }
        fn expand_output_path(&self, template: &str) -> Result<String, OptionError> {
            Ok(format!("/out/{}", template.replace("%p", "4242")))
        }
        fn write_file(&self, path: &str, bytes: &[u8]) -> Result<(), i32> {
            self.written
                .lock()
                .unwrap()
                .push((path.to_string(), bytes.to_vec()));
            Ok(())
        }
        fn log(&self, text: &str) {
            self.logged.lock().unwrap().push(text.to_string());
        }
        fn live_blocks(&self) -> Vec<LiveBlock> {
            Vec::new()
        }
        fn with_roots(&self, _f: &mut dyn FnMut(&[RootRange])) {}
        fn read_words(&self, _start: Addr, _len: u64, _f: &mut dyn FnMut(Addr, u64)) {}
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeHost;
    use super::*;

    fn host() -> FakeHost {
        let h = FakeHost::new();
        h.name(0x10, "malloc", "vg_replace_malloc.c", 1);
        h.name(0x20, "my_alloc", "a.c", 3);
        h.name(0x30, "f", "a.c", 10);
        h.name(0x40, "main", "a.c", 20);
        h.name(0x50, "__libc_start_call_main", "libc_start_call_main.h", 58);
        h.name(0x60, "__libc_start_main_impl", "libc-start.c", 392);
        h.name(0x70, "_start", "start.S", 1);
        h
    }

    #[test]
    fn builtin_alloc_fns_and_frames_below_main_are_dropped() {
        let h = host();
        let c = Classifier::new(&[], &[], 30, false);
        assert_eq!(
            c.classify(&h, &[0x10, 0x30, 0x40, 0x50, 0x60, 0x70]),
            Some(vec![0x30, 0x40])
        );
    }

    #[test]
    fn user_alloc_fn_is_filtered_only_from_the_innermost_end() {
        let h = host();
        let c = Classifier::new(&["my_alloc".into()], &[], 30, false);
        assert_eq!(c.classify(&h, &[0x20, 0x30, 0x40]), Some(vec![0x30, 0x40]));
        assert_eq!(
            c.classify(&h, &[0x30, 0x20, 0x40]),
            Some(vec![0x30, 0x20, 0x40])
        );
        let plain = Classifier::new(&[], &[], 30, false);
        assert_eq!(
            plain.classify(&h, &[0x20, 0x30, 0x40]),
            Some(vec![0x20, 0x30, 0x40])
        );
    }

    #[test]
    fn inlined_alloc_fn_is_filtered_only_when_every_level_is_one() {
        let h = host();
        h.name_inlined(0x80, &[("my_alloc", "a.h", 5), ("wrapper", "a.c", 8)]);
        h.name_inlined(0x90, &[("my_alloc", "a.h", 5), ("malloc", "m.c", 8)]);
        let c = Classifier::new(&["my_alloc".into()], &[], 30, false);
        assert_eq!(c.classify(&h, &[0x80, 0x40]), Some(vec![0x80, 0x40]));
        assert_eq!(c.classify(&h, &[0x90, 0x30, 0x40]), Some(vec![0x30, 0x40]));
    }

    #[test]
    fn ignore_fn_ignores_by_first_named_function_after_filtering() {
        let h = host();
        let c = Classifier::new(&[], &["f".into()], 30, false);
        assert_eq!(c.classify(&h, &[0x10, 0x30, 0x40]), None);
        assert_eq!(
            c.classify(&h, &[0x40]),
            Some(vec![0x40]),
            "f is not the first function"
        );
        // An unnamed first frame: the first named one decides.
        assert_eq!(c.classify(&h, &[0x999, 0x30, 0x40]), None);
    }

    #[test]
    fn depth_limits_frames_after_filtering() {
        let h = host();
        for (ip, n) in [(0x100, "a"), (0x101, "b"), (0x102, "c")] {
            h.name(ip, n, "x.c", 1);
        }
        let c = Classifier::new(&[], &[], 2, false);
        assert_eq!(
            c.classify(&h, &[0x10, 0x100, 0x101, 0x102, 0x40]),
            Some(vec![0x100, 0x101])
        );
    }

    #[test]
    fn stack_of_only_alloc_fns_is_ignored() {
        let h = host();
        let c = Classifier::new(&[], &[], 30, false);
        assert_eq!(c.classify(&h, &[0x10]), None);
        assert_eq!(c.classify(&h, &[]), None);
    }

    #[test]
    fn without_main_the_innermost_below_main_frame_is_kept_and_renamed() {
        let h = host();
        let c = Classifier::new(&[], &[], 30, false);
        assert_eq!(
            c.classify(&h, &[0x30, 0x50, 0x60, 0x70]),
            Some(vec![0x30, 0x50])
        );
        assert_eq!(
            c.labels(&h, 0x50),
            ["0x50: (below main) (libc_start_call_main.h:58)"]
        );
    }

    #[test]
    fn show_below_main_keeps_every_frame_under_its_own_name() {
        let h = host();
        let c = Classifier::new(&[], &[], 30, true);
        assert_eq!(
            c.classify(&h, &[0x10, 0x30, 0x40, 0x50, 0x60]),
            Some(vec![0x30, 0x40, 0x50, 0x60])
        );
        assert_eq!(
            c.labels(&h, 0x50),
            ["0x50: __libc_start_call_main (libc_start_call_main.h:58)"]
        );
    }

    #[test]
    fn each_address_is_described_once() {
        let h = host();
        let c = Classifier::new(&[], &[], 30, false);
        c.classify(&h, &[0x30, 0x40]);
        c.classify(&h, &[0x30, 0x40]);
        c.labels(&h, 0x30);
        assert_eq!(*h.describe_calls.lock().unwrap(), 2);
    }
}
