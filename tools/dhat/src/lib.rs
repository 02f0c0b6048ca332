//! DHAT: where a program allocates heap memory, how long the blocks live and how their
//! bytes are used, written as Valgrind 3.19's `dhat.out.<pid>` for `dh_view.html`
//! (formats.md §3).
//!
//! [`Dhat`] implements [`oxgrind_tool::Tool`]. Time is guest instructions, counted by DHAT
//! itself with a counter bump per translated block, as Valgrind's DHAT does (a per-thread
//! counter of the engine's, summed when read: no lock, no shared cache line).
//! Three event streams feed one state ([`heap::Heap`]: blocks sharded by address, each
//! shard behind its own lock, the heap size counted per thread; no process-wide lock per
//! event):
//!
//! * allocation events (`on_alloc`, `on_free`, `on_realloc`) on the program's threads, each
//!   stamped with the instruction count; each live block is marked in a shadow map. The
//!   stack → PP lookup reads a table of atomics ([`PpTable`]); the interning table is
//!   locked only for a stack seen for the first time;
//! * memory accesses: [`Tool::instrument`] asks, before every instruction that may touch
//!   the heap (`Insn::may_touch_heap`), for a *filtered trace* probe: the engine checks the
//!   shadow map inline and appends a record to the thread's trace buffer only for accesses
//!   to a live block's granules. [`Tool::on_trace`] charges each batch of records to the
//!   live block containing each first byte (a shard lock per run of records in one shard);
//!   a thread's buffer is flushed before it frees or reallocates a block, so its accesses
//!   count first. Accesses to the `HOT_RANGES` (3) blocks too large for a histogram a thread used most in
//!   its last batch (`Needs::hot_ranges`) make no record: the engine counts their bytes
//!   inline, and [`Tool::on_trace_hot`] charges them with the batch and picks the next ones;
//!   within a batch, a large block's records add up and are charged once;
//! * at exit, [`Tool::fini`] folds the live blocks in, resolves frames and writes the file
//!   and the summary.
//!
//! A program point (PP) is the allocation stack as Valgrind records it: `--num-callers`
//! frames including the allocator's own (our `malloc`, where Valgrind on this distribution
//! shows its `vgpreload` one), cut after `main` or the first function below it. Stacks are
//! classified once, outside the lock, when first seen.
//!
//! `--mode=ad-hoc` counts `DHAT_AD_HOC_EVENT(n)` client requests, which the engine
//! recognises by Valgrind's magic preamble and hands to [`Tool::client_request`]. `--mode=copy` is refused for now.
//!
//! What differs from Valgrind is listed in `docs/differences-from-valgrind.md` (DHAT).

pub mod heap;
pub mod options;
pub mod probe;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};

use options::Options;
use oxgrind_formats::dhat::{DhatFile, FrameTable, Mode, Pp};
use oxgrind_formats::number::commify;
use oxgrind_tool::instrument::{
    Access, AccessKind, CounterId, GuestRegs, HotRange, Insn, Plan, ShadowSpec, TraceKind,
    TraceRecord, HOT_RANGES,
};
use oxgrind_tool::sync::SpinLock;
use oxgrind_tool::{Addr, Alloc, Exit, Frame, Free, Host, Needs, OptionError, StackId, Tool};

/// Where Valgrind installs the viewer the summary points to (oxgrind's files load in it).
pub const DH_VIEW: &str = "file:///usr/libexec/valgrind/dh_view.html";

/// Guest instructions executed, counted by DHAT itself as Valgrind's DHAT does
/// (`g_curr_instrs`): every translated block of the program adds its length when it starts.
/// The runtime's own code is never offered for instrumentation, so its work (the
/// allocator hooks, DHAT itself) is not counted, nor is glibc's allocator when a hook calls
/// it (`Needs::allocator_unseen`: the event runs natively), as Valgrind's replacement
/// allocator is not.
const INSTRS: CounterId = CounterId(0);

/// The instruction count at a heap event, as the calling thread sees it
/// ([`Host::counter_seen`]: the other threads' counts may lag a little, as the order of
/// events across threads is uncertain anyway; with one thread it is exact).
#[inline]
fn now(host: &dyn Host) -> u64 {
    host.counter_seen(INSTRS)
}

/// The instruction count at exit: every thread's, exactly.
fn total_instrs(host: &dyn Host) -> u64 {
    host.counter(INSTRS)
}

/// Marks a stack whose allocations are ignored (`--ignore-fn`).
const IGNORED: u32 = u32::MAX;

/// Program points: one per allocation stack as the runtime interned it. Stacks are
/// resolved (cut after `main`, described) only at exit, so the measured run does no
/// symbol work; stacks that resolve to the same frames are merged then.
#[derive(Default)]
struct Points {
    /// Runtime stack → PP number (or [`IGNORED`]).
    by_stack: HashMap<StackId, u32>,
    stacks: Vec<StackId>,
    /// Ad-hoc mode: events and units per PP.
    adhoc: Vec<(u64, u64)>,
}

impl Points {
    fn intern(&mut self, stack: StackId) -> u32 {
        let n = self.stacks.len() as u32;
        self.stacks.push(stack);
        self.by_stack.insert(stack, n);
        n
    }
}

/// Stack number → PP + 1 (0: not decided yet, `u32::MAX`: ignored), readable without a lock: chunks of
/// [`PP_CHUNK`] atomics, each made once (under the [`Points`] lock) when a stack of its range
/// is first seen. An answer never changes once given. The runtime numbers stacks densely
/// from 0; stacks past the table's reach are answered by [`Points`] alone.
///
/// Chunks are published through plain atomic pointers: `std::sync::OnceLock` was tried
/// and, measured on a 4-thread malloc/free loop, doubled the reads charged to each thread's
/// TLS vector (`allocate_dtv`'s block, read by the dynamic loader's `__tls_get_addr` on our
/// runtime's behalf; see docs/differences-from-valgrind.md, DHAT); the cause inside std was
/// not pinned down.
struct PpTable {
    /// Each chunk, once made, is a leaked `Box<[AtomicU32; PP_CHUNK]>`, never freed.
    chunks: Box<[AtomicPtr<[AtomicU32; PP_CHUNK]>]>,
}

const PP_CHUNK: usize = 4096;
const PP_CHUNKS: usize = 1024;

impl PpTable {
    fn new() -> Self {
        PpTable {
            chunks: (0..PP_CHUNKS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
        }
    }

    fn get(&self, stack: StackId) -> Option<u32> {
        let (c, i) = (stack.0 as usize / PP_CHUNK, stack.0 as usize % PP_CHUNK);
        let chunk = self.chunks.get(c)?.load(Ordering::Acquire);
        if chunk.is_null() {
            return None;
        }
        // SAFETY: a non-null chunk pointer was published (Release) after the chunk was made
        // and is never freed.
        match unsafe { &*chunk }[i].load(Ordering::Acquire) {
            0 => None,
            u32::MAX => Some(IGNORED),
            v => Some(v - 1),
        }
    }

    /// Records the answer for `stack` (called with the [`Points`] lock held).
    fn set(&self, stack: StackId, pp: u32) {
        let (c, i) = (stack.0 as usize / PP_CHUNK, stack.0 as usize % PP_CHUNK);
        let Some(slot) = self.chunks.get(c) else {
            return;
        };
        let mut chunk = slot.load(Ordering::Acquire);
        if chunk.is_null() {
            // Made under the Points lock: no other thread makes it at the same time.
            let fresh: Box<[AtomicU32; PP_CHUNK]> =
                Box::new(std::array::from_fn(|_| AtomicU32::new(0)));
            chunk = Box::into_raw(fresh);
            slot.store(chunk, Ordering::Release);
        }
        let v = if pp == IGNORED { u32::MAX } else { pp + 1 };
        // SAFETY: as in `get`; this thread made or saw the chunk published.
        let chunk = unsafe { &*chunk };
        chunk[i].store(v, Ordering::Release);
    }
}

/// The DHAT tool. Create with [`Dhat::new`], feed options, then hand to the runtime.
pub struct Dhat {
    opts: Options,
    heap: heap::Heap,
    points: SpinLock<Points>,
    pp_table: PpTable,
    /// Descriptions of code addresses, filled as stacks are first seen; read at exit.
    descs: SpinLock<HashMap<Addr, Vec<Frame>>>,
    finished: AtomicBool,
}

impl Default for Dhat {
    fn default() -> Self {
        Self::new()
    }
}

use oxgrind_formats::below_main::is_below_main;

impl Dhat {
    pub fn new() -> Self {
        Dhat {
            opts: Options::default(),
            heap: heap::Heap::new(),
            points: SpinLock::new(Points::default()),
            pp_table: PpTable::new(),
            descs: SpinLock::new(HashMap::new()),
            finished: AtomicBool::new(false),
        }
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// The frames describing `ip` (cached; described without holding the cache lock).
    fn describe(&self, host: &dyn Host, ip: Addr) -> Vec<Frame> {
        if let Some(f) = self.descs.lock().get(&ip) {
            return f.clone();
        }
        let mut f = host.describe(ip);
        if f.is_empty() {
            f.push(Frame {
                ip,
                ..Frame::default()
            });
        }
        self.descs.lock().entry(ip).or_insert_with(|| f.clone());
        f
    }

    /// The PP frames of a raw stack, or `None` when an `--ignore-fn` matches one of them.
    /// `skip_first`: frame 0 is the allocator (not looked at by `--ignore-fn`).
    fn classify(&self, host: &dyn Host, raw: &[Addr], skip_first: bool) -> Option<Vec<Addr>> {
        let mut out = Vec::with_capacity(raw.len());
        for (i, &ip) in raw.iter().take(self.opts.num_callers).enumerate() {
            out.push(ip);
            let frames = self.describe(host, ip);
            let names = frames.iter().filter_map(|f| f.function.as_deref());
            let mut cut = false;
            for name in names {
                if !(skip_first && i == 0)
                    && self
                        .opts
                        .ignore_fns
                        .iter()
                        .any(|p| options::glob_match(p, name))
                {
                    return None;
                }
                if !self.opts.show_below_main && (name == "main" || is_below_main(name)) {
                    cut = true;
                }
            }
            if cut {
                break;
            }
        }
        Some(out)
    }

    /// The PP of an allocation stack (`None`: ignored): from the lock-free table, else
    /// the interning table (a hash lookup, or a new number on first sight).
    fn pp_of(&self, host: &dyn Host, stack: StackId, skip_first: bool) -> Option<u32> {
        let pp = match self.pp_table.get(stack) {
            Some(pp) => pp,
            None => self.pp_of_shared(host, stack, skip_first),
        };
        (pp != IGNORED).then_some(pp)
    }

    /// [`Dhat::pp_of`] from the shared table. With `--ignore-fn`, a new stack is first
    /// described (outside the lock) to decide whether it is ignored ([`IGNORED`]).
    fn pp_of_shared(&self, host: &dyn Host, stack: StackId, skip_first: bool) -> u32 {
        {
            let mut points = self.points.lock();
            if let Some(&pp) = points.by_stack.get(&stack) {
                return pp;
            }
            if self.opts.ignore_fns.is_empty() {
                let pp = points.intern(stack);
                self.pp_table.set(stack, pp);
                return pp;
            }
        }
        let raw = host.stack(stack);
        let ignored = self.classify(host, &raw, skip_first).is_none();
        let mut points = self.points.lock();
        if let Some(&pp) = points.by_stack.get(&stack) {
            return pp;
        }
        let pp = if ignored {
            points.by_stack.insert(stack, IGNORED);
            IGNORED
        } else {
            points.intern(stack)
        };
        self.pp_table.set(stack, pp);
        pp
    }

    /// A block is going away: no thread counts accesses in it inline any more (only blocks
    /// too large for a histogram are ever hot ranges). The calling thread's counts were taken
    /// by the flush before.
    fn forget_hot(&self, host: &dyn Host, addr: Addr, size: u64) {
        if heap::may_be_hot(size.max(1)) {
            host.forget_hot_range(addr, addr + size);
        }
    }

    fn heap_mode(&self) -> bool {
        self.opts.mode == Mode::Heap
    }

    /// An ad-hoc event of `units` at the guest state `regs` (`DHAT_AD_HOC_EVENT`).
    fn adhoc_event(&self, host: &dyn Host, regs: &GuestRegs, units: u64) {
        let stack = host.stack_at(regs, self.opts.num_callers);
        if let Some(pp) = self.pp_of(host, stack, false) {
            let mut points = self.points.lock();
            let a = &mut points.adhoc;
            if a.len() <= pp as usize {
                a.resize(pp as usize + 1, (0, 0));
            }
            a[pp as usize].0 += 1;
            a[pp as usize].1 += units;
        }
    }

    /// Frame texts of one PP's stack into the table, as `write_PPInfo_frame` does
    /// (inlined frames are entries of their own).
    fn frame_numbers(&self, host: &dyn Host, ips: &[Addr], table: &mut FrameTable) -> Vec<u32> {
        let mut fs = Vec::with_capacity(ips.len());
        for &ip in ips {
            for f in self.describe(host, ip) {
                let below = f.function.as_deref().is_some_and(is_below_main);
                let text = if below && !self.opts.show_below_main {
                    let mut g = f.clone();
                    g.function = Some(String::from("(below main)"));
                    g.to_string()
                } else {
                    f.to_string()
                };
                // Valgrind's own allocator frames, when it has their source.
                if text.contains("vg_replace_malloc.c") {
                    continue;
                }
                fs.push(table.intern(&text));
            }
        }
        fs
    }

    /// The file and the summary totals at exit. `None` when the state stayed locked (a
    /// fatal signal interrupted a thread inside a DHAT handler).
    fn build(&self, host: &dyn Host) -> Option<(DhatFile, heap::Totals)> {
        let te = total_instrs(host);
        let summary = if self.heap_mode() {
            self.heap.finish(te)?
        } else {
            heap::Summary::default()
        };
        let st = self.points.lock_bounded(1 << 24)?;
        let stacks = st.stacks.clone();
        let mut table = FrameTable::new();
        let mut pps = Vec::new();
        // PPs in creation order (Valgrind's order is that of its ExeContext pointers).
        let mut seen_fs: BTreeMap<Vec<u32>, usize> = BTreeMap::new();
        for (i, &stack) in stacks.iter().enumerate() {
            let mut pp = Pp::default();
            match self.opts.mode {
                Mode::Heap => {
                    let Some(p) = summary.pps.get(i) else {
                        continue;
                    };
                    if p.total_blocks == 0 {
                        continue;
                    }
                    pp.tb = p.total_bytes;
                    pp.tbk = p.total_blocks;
                    pp.tl = p.total_lifetimes;
                    pp.mb = p.max_bytes;
                    pp.mbk = p.max_blocks;
                    pp.gb = p.at_tgmax_bytes;
                    pp.gbk = p.at_tgmax_blocks;
                    pp.eb = p.curr_bytes;
                    pp.ebk = p.curr_blocks;
                    pp.rb = p.reads;
                    pp.wb = p.writes;
                    pp.acc = p.access_histogram();
                }
                Mode::AdHoc | Mode::Copy => {
                    let Some(&(events, units)) = st.adhoc.get(i) else {
                        continue;
                    };
                    if events == 0 {
                        continue;
                    }
                    pp.tb = units;
                    pp.tbk = events;
                }
            }
            let raw = host.stack(stack);
            let ips = self.classify(host, &raw, true).unwrap_or(raw);
            pp.fs = self.frame_numbers(host, &ips, &mut table);
            // dh_view refuses two PPs with the same frames: stacks that differ only past
            // the cut are one PP, as they are one ExeContext in Valgrind. Their maxima
            // add up (exact when, as usual, they never overlap in time).
            if let Some(&j) = seen_fs.get(&pp.fs) {
                let q: &mut Pp = &mut pps[j];
                q.tb += pp.tb;
                q.tbk += pp.tbk;
                q.tl += pp.tl;
                q.mb += pp.mb;
                q.mbk += pp.mbk;
                q.gb += pp.gb;
                q.gbk += pp.gbk;
                q.eb += pp.eb;
                q.ebk += pp.ebk;
                q.rb += pp.rb;
                q.wb += pp.wb;
                q.acc = None;
                continue;
            }
            seen_fs.insert(pp.fs.clone(), pps.len());
            pps.push(pp);
        }
        let mut totals = summary.totals;
        if !self.heap_mode() {
            totals = heap::Totals::default();
            for &(events, units) in &st.adhoc {
                totals.total_blocks += events;
                totals.total_bytes += units;
            }
        }
        drop(st);
        Some((
            DhatFile {
                mode: self.opts.mode,
                cmd: host.command_line().join(" "),
                pid: host.pid() as i64,
                te,
                tg: if self.heap_mode() { totals.tgmax } else { 0 },
                pps,
                ftbl: table.into_strings(),
            },
            totals,
        ))
    }

    fn summary(&self, host: &dyn Host, t: &heap::Totals, path: &str) -> String {
        let pid = host.pid();
        let mut out = String::new();
        let mut line = |s: &str| out.push_str(&format!("=={pid}== {s}\n"));
        let (units, events) = if self.opts.mode == Mode::AdHoc {
            ("units", "events")
        } else {
            ("bytes", "blocks")
        };
        line(&format!(
            "Total:     {} {units} in {} {events}",
            commify(t.total_bytes),
            commify(t.total_blocks)
        ));
        if self.heap_mode() {
            line(&format!(
                "At t-gmax: {} bytes in {} blocks",
                commify(t.max_bytes),
                commify(t.max_blocks)
            ));
            line(&format!(
                "At t-end:  {} bytes in {} blocks",
                commify(t.curr_bytes),
                commify(t.curr_blocks)
            ));
            line(&format!("Reads:     {} bytes", commify(t.reads)));
            line(&format!("Writes:    {} bytes", commify(t.writes)));
        }
        line("");
        line("To view the resulting profile, open");
        line(&format!("  {DH_VIEW}"));
        line("in a web browser, click on \"Load...\", and then select the file");
        line(&format!("  {path}"));
        line("The text at the bottom explains the abbreviations used in the output.");
        out
    }
}

impl Tool for Dhat {
    fn name(&self) -> &'static str {
        "dhat"
    }

    fn help(&self) -> &'static str {
        "  user options for DHAT:
    --dhat-out-file=<file>          output file name [dhat.out.%p]
    --mode=heap|copy|ad-hoc         profiling mode (copy: not yet)
    --ignore-fn=<name>              ignore heap allocations within <name> [empty]
    --ignore-fns-file=<filename>    ignore heap allocations contained in <filename> [empty]
"
    }

    fn parse_option(&mut self, arg: &str) -> Result<bool, OptionError> {
        self.opts.parse(arg)
    }

    fn core_options(&mut self, core: &oxgrind_tool::CoreView) {
        self.opts.apply_core(core);
    }

    fn post_options(&mut self) -> Result<(), OptionError> {
        self.opts.check()?;
        Ok(())
    }

    fn needs(&self) -> Needs {
        let heap = self.heap_mode();
        Needs {
            stack_depth: if heap { self.opts.num_callers } else { 0 },
            ignores_heap: !heap,
            // DHAT counts for itself (see INSTRS): the core's count is not needed.
            instrument: true,
            counters: 1,
            // Live blocks marked in a shadow map; their accesses buffered per thread.
            shadow: heap.then_some(ShadowSpec::BYTE_PER_GRANULE),
            trace: heap,
            // Accesses to the last large blocks a thread touched counted inline.
            hot_ranges: heap,
            client_requests: self.opts.mode == Mode::AdHoc,
            // glibc's allocator runs outside the program, as Valgrind's replacement does:
            // not in the instruction clock (lifetimes as Valgrind's), and natively.
            allocator_unseen: true,
            ..Needs::default()
        }
    }

    fn on_start(&self, host: &dyn Host) {
        if self.opts.quiet {
            return;
        }
        let mut out = String::new();
        out.push_str(&host.banner(
            "DHAT, a dynamic heap analysis tool",
            "Copyright (C) 2010-2018, and GNU GPL'd, by Mozilla Foundation",
        ));
        host.log(&out);
    }

    fn on_alloc(&self, host: &dyn Host, ev: &Alloc) -> u32 {
        if !self.heap_mode() {
            return 0;
        }
        let Some(pp) = self.pp_of(host, ev.stack, true) else {
            return 0;
        };
        // Marked in the shadow map (see `heap::mark_block`): the engine records exactly the
        // accesses that may touch a live block.
        let thread = ev.tid as u32;
        self.heap.alloc(
            host.shadow().as_ref(),
            thread,
            ev.addr,
            ev.size,
            pp,
            now(host),
        );
        0
    }

    fn on_free(&self, host: &dyn Host, ev: &Free) {
        if !self.heap_mode() {
            return;
        }
        // This thread's accesses to the block, still in its trace buffer, count first.
        host.flush_trace();
        self.forget_hot(host, ev.addr, ev.size);
        let now = now(host);
        self.heap
            .free(host.shadow().as_ref(), ev.tid as u32, ev.addr, now);
    }

    fn on_realloc(&self, host: &dyn Host, old: &Free, new: &Alloc) -> u32 {
        if !self.heap_mode() {
            return 0;
        }
        host.flush_trace();
        self.forget_hot(host, old.addr, old.size);
        let now = now(host);
        let shadow = host.shadow();
        self.heap.realloc(
            shadow.as_ref(),
            new.tid as u32,
            old.addr,
            new.addr,
            new.size,
            now,
        );
        0
    }

    fn on_fork_child(&self) {
        // The child keeps the parent's profile (as under Valgrind) and writes its own file
        // (`%p` is expanded at exit).
        // SAFETY: the child runs only the forking thread, which was inside fork(), not in a
        // DHAT handler, so it holds no guard of these locks.
        unsafe {
            self.points.force_unlock();
            self.heap.force_unlock();
            self.descs.force_unlock();
        }
    }

    fn instrument(&self, _pc: Addr, block: &[Insn], plan: &mut Plan) {
        if !block.is_empty() {
            plan.count(0, INSTRS, block.len() as u32);
        }
        if self.heap_mode() {
            // A record, appended inline, only for accesses to granules of live blocks; the
            // rest cost the inline shadow check.
            for (i, ins) in block.iter().enumerate() {
                if ins.may_touch_heap() {
                    plan.trace_accesses_filtered(i, 0);
                }
            }
        }
    }

    fn on_trace(&self, host: &dyn Host, records: &[TraceRecord]) {
        let accesses = accesses_of(records);
        self.heap.access_all(host.shadow().as_ref(), accesses);
    }

    /// The hot ranges' counts go to their blocks, the records to theirs (in any order:
    /// a block is freed only after its thread's counts and records were taken), and the
    /// thread counts next in the large blocks it used most (see [`Dhat::forget_hot`]).
    fn on_trace_hot(
        &self,
        host: &dyn Host,
        records: &[TraceRecord],
        hot: &mut [HotRange; HOT_RANGES],
    ) {
        for h in hot.iter() {
            if h.read_bytes != 0 || h.write_bytes != 0 {
                self.heap
                    .charge_range(h.lo, h.hi, h.read_bytes, h.write_bytes);
            }
        }
        let accesses = accesses_of(records);
        let batch = self.heap.access_all(host.shadow().as_ref(), accesses);
        // The busiest large blocks next: those of this batch's records and the ranges
        // counting now, by the bytes their accesses named (on a tie, this batch's first,
        // the block hit last first). A program working in more large blocks than there
        // are ranges then has records only for its less used ones.
        let mut cands = [(0u64, 0u64, 0u64); heap::HOT_BLOCKS + HOT_RANGES];
        let mut n = 0;
        let counting = hot
            .iter()
            .map(|h| (h.lo, h.hi, h.read_bytes + h.write_bytes));
        for (lo, hi, bytes) in batch.into_iter().chain(counting) {
            if hi <= lo {
                continue;
            }
            match cands[..n].iter().position(|c| c.0 == lo && c.1 == hi) {
                Some(k) => cands[k].2 += bytes,
                None => {
                    cands[n] = (lo, hi, bytes);
                    n += 1;
                }
            }
        }
        // Stable: equal counts keep their order.
        cands[..n].sort_by(|a, b| b.2.cmp(&a.2));
        for (k, h) in hot.iter_mut().enumerate() {
            let (lo, hi, _) = if k < n { cands[k] } else { (0, 0, 0) };
            h.lo = lo;
            h.hi = hi;
        }
    }

    fn client_request(&self, host: &dyn Host, args: &[u64; 6], regs: &GuestRegs) -> Option<u64> {
        if self.opts.mode != Mode::AdHoc {
            return None;
        }
        let units = probe::adhoc_units(args)?;
        self.adhoc_event(host, regs, units);
        Some(0)
    }

    /// Natively ([`Host::run_native`]): reached from the program's exit, the building and
    /// writing of the file would run translated, most of a short program's time under DHAT.
    fn fini(&self, host: &dyn Host, exit: Exit) {
        host.run_native(&mut || self.finish(host, exit));
    }
}

impl Dhat {
    /// [`Tool::fini`]'s work: the file, then the summary.
    fn finish(&self, host: &dyn Host, exit: Exit) {
        let talk = !self.opts.quiet && !matches!(exit, Exit::Exec);
        if talk {
            host.log(&format!("=={}== \n", host.pid()));
        }
        if self.finished.swap(true, Ordering::SeqCst) {
            return;
        }
        let Some((file, totals)) = self.build(host) else {
            host.log("dhat: the heap state was busy when the program ended; no output written\n");
            return;
        };
        let text = oxgrind_formats::dhat::write(&file);
        let path = match host.expand_output_path(&self.opts.out_file) {
            Ok(p) => p,
            Err(e) => {
                host.log(&format!("dhat: --dhat-out-file: {}\n", e.0));
                return;
            }
        };
        if host.write_file(&path, text.as_bytes()).is_err() {
            host.log(&format!(
                "=={}== error: can't open DHAT output file '{path}'\n",
                host.pid()
            ));
            return;
        }
        if talk {
            host.log(&self.summary(host, &totals, &path));
        }
    }
}

/// The memory accesses of a batch of trace records (block records carry none).
fn accesses_of(records: &[TraceRecord]) -> impl Iterator<Item = Access> + '_ {
    records.iter().filter_map(|r| {
        let kind = match r.kind() {
            TraceKind::Block => return None,
            TraceKind::Read => AccessKind::Read,
            TraceKind::Write => AccessKind::Write,
            TraceKind::Modify => AccessKind::Modify,
        };
        Some(Access {
            addr: r.addr,
            size: r.size as u32,
            kind,
            conditional: false,
        })
    })
}
