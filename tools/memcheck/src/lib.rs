//! Memcheck, part 1: misuse of the allocator and leaks, reported in Valgrind's words and
//! numbers.
//!
//! The runtime replaces `malloc` & co and calls [`Memcheck`] through `oxgrind_tool::Tool`:
//! [`on_free`](Tool::on_free) checks allocator families (mismatched free/delete/delete[])
//! and remembers the block in the freed-block queue ([`freed`]);
//! [`on_misuse`](Tool::on_misuse) turns what the runtime detected (invalid or double free, fishy sizes,
//! bad alignment, overlapping copies) into errors; [`fini`](Tool::fini) runs the leak
//! search ([`leak`]) and writes HEAP SUMMARY, loss records, LEAK SUMMARY and ERROR SUMMARY.
//! Merging, suppressions and counting live in [`errors`]; the bytes of the text and XML come
//! from `oxgrind_formats::{memcheck_text, memcheck_xml}`.
//!
//! The preamble (`==PID== Memcheck, a memory error detector` ...) is printed by
//! [`Memcheck::start`], which the runtime may call before the program's `main`; otherwise the
//! first event prints it. After `fini`, [`Tool::exit_status_override`] gives the
//! `--error-exitcode` decision. At `Exit::Exec` nothing is printed, as in Valgrind.
//!
//! Locking: one mutex guards the error manager and the freed-block queue; `on_alloc` takes
//! no lock (counters are atomics), `on_free` takes it briefly. Errors are rendered (stacks
//! symbolized) under the lock, and only for a new context. `fini` never waits for ever on
//! it, since it may run in a fatal-signal handler.
//!
//! Invalid reads and writes of heap memory: the allocator events keep an addressability
//! shadow ([`shadow`]); [`instrument`](Tool::instrument) asks the engine for a probe on
//! every instruction that may address the heap, and [`on_accesses`](Tool::on_accesses)
//! checks each access against the shadow (one load per granule when all is well), then
//! reports as Memcheck does ([`Memcheck::check_access`]).
//!
//! Not here: definedness of values (undefined-value errors), addressability outside the
//! heap (stack below `rsp`, unmapped memory).

extern crate alloc;

pub mod errors;
pub mod freed;
pub mod leak;
pub mod options;
pub mod shadow;

pub use shadow::shadow_base;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use oxgrind_formats::frame::Frame;
use oxgrind_formats::memcheck_text::{
    self as text, Amount, Aux, ErrorBlock, LeakMode, LeakSummary,
};
use oxgrind_formats::memcheck_xml::{self as xml, WhatQuirk};
use oxgrind_formats::suppressions::{
    self as supp, GenFrame, GeneratedSupp, LeakKind, SuppFrame, SuppParseError,
};
use oxgrind_tool::{
    Addr, Alloc, AllocFn, DataAddr, Exit, Free, Host, LiveBlock, Misuse, MisuseEvent, Needs,
    OptionError, RootRange, StackId, Tool,
};

use errors::{ErrorKey, ErrorManager, KeyKind, Output, Reporting, Shown};
use freed::{FreedBlock, FreedQueue, ShadowQueue, REDZONE};
use options::{KeepStacks, LeakCheck, Options};
use oxgrind_tool::instrument::{Access, AccessKind, GuestRegs, Instruction, Plan};
use oxgrind_tool::sync::SpinLock;

/// Our default suppressions (see the file for what they cover).
pub const DEFAULT_SUPPRESSIONS: &str = include_str!("default.supp");
/// The name `-s` shows for entries of [`DEFAULT_SUPPRESSIONS`].
pub const DEFAULT_SUPPRESSIONS_NAME: &str = "oxgrind-default.supp";

/// The tool. Create with [`Memcheck::new`], feed options, then `post_options`.
pub struct Memcheck {
    opts: Options,
    /// Suppression files as (name, contents), when the runtime supplies them instead of
    /// letting `post_options` read them.
    supp_texts: Vec<(String, String)>,
    /// The preamble was printed (by [`Memcheck::start`] or at the first event).
    started: AtomicBool,
    allocs: AtomicU64,
    frees: AtomicU64,
    bytes_allocated: AtomicU64,
    state: Mutex<State>,
    /// The engine asked for probes: the shadow is kept from then on. Before, no one reads
    /// it, and events may come from a host that is no real process (tests).
    probing: AtomicBool,
    /// Blocks allocated by our own work in a probe's slow path (see `IN_PROBE`), which the
    /// runtime took for the program's: never counted, reported or leak-checked.
    foreign: SpinLock<Vec<Addr>>,
    /// What the code at each pc that made a bad access is ([`PcClass`]), found once.
    pc_classes: SpinLock<Option<std::collections::HashMap<u64, PcClass>>>,
}

/// Where an access with unaddressable bytes was made from, which decides whether it is
/// reported (see [`Memcheck::check_access`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum PcClass {
    /// The program's code, or a library's: reported as Valgrind reports it.
    Program,
    /// A glibc string or memory function (`strlen`, `__memchr_avx2`, ...), or glibc code we
    /// have no name for: these read aligned chunks past the end of their data, which
    /// Valgrind avoids by replacing them. A read is reported only if no byte of it, nor any
    /// of the 128 bytes before it, is addressable; a write as usual; nothing for chunk
    /// headers.
    LibcString,
    /// glibc's allocator (`free` reading a chunk header, `malloc` writing into a chunk the
    /// runtime gave back): its business, never the program's error.
    LibcAllocator,
}

struct State {
    errors: ErrorManager,
    freed: FreedQueue,
    /// When freed blocks' shadow goes back to addressable.
    shadow_q: ShadowQueue,
    xml: String,
    xml_started: bool,
    finished: bool,
    /// OS thread ids → Valgrind-style thread numbers (main thread 1, then in order of
    /// first appearance).
    threads: Vec<i32>,
}

impl Default for Memcheck {
    fn default() -> Self {
        Self::new()
    }
}

fn alloc_fn_name(f: AllocFn) -> &'static str {
    match f {
        AllocFn::Malloc => "malloc",
        AllocFn::Calloc => "calloc",
        AllocFn::Realloc => "realloc",
        AllocFn::ReallocArray => "reallocarray",
        AllocFn::Memalign => "memalign",
        AllocFn::PosixMemalign => "posix_memalign",
        AllocFn::AlignedAlloc => "aligned_alloc",
        AllocFn::Valloc => "valloc",
        AllocFn::Pvalloc => "pvalloc",
        // Memcheck names the C++ allocators by their GCC builtins in FishyValue errors.
        AllocFn::New => "__builtin_new",
        AllocFn::NewArray => "__builtin_vec_new",
        AllocFn::Free => "free",
        AllocFn::Delete => "__builtin_delete",
        AllocFn::DeleteArray => "__builtin_vec_delete",
    }
}

/// `Vg_FnNameBelowMain`: functions that call `main`, shown as `(below main)`.
fn is_below_main(name: &str) -> bool {
    name == "__libc_start_main"
        || name == "__libc_start_call_main"
        || name.starts_with("__libc_start_main.")
        || name == "generic_start_main"
        || name.starts_with("generic_start_main.")
        || name == "_start"
}

/// A stack resolved for printing, matching and `--gen-suppressions`.
struct Resolved {
    shown: Vec<Frame>,
    supp: Vec<SuppFrame>,
    gen: Vec<GenFrame>,
}

impl Memcheck {
    pub fn new() -> Memcheck {
        let opts = Options::default();
        let rep = reporting(&opts, 0);
        Memcheck {
            state: Mutex::new(State {
                errors: ErrorManager::new(rep),
                freed: FreedQueue::new(opts.freelist_vol, opts.freelist_big_blocks),
                shadow_q: ShadowQueue::new(opts.freelist_vol),
                xml: String::new(),
                xml_started: false,
                finished: false,
                threads: Vec::new(),
            }),
            opts,
            supp_texts: Vec::new(),
            started: AtomicBool::new(false),
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            bytes_allocated: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            foreign: SpinLock::new(Vec::new()),
            pc_classes: SpinLock::new(None),
        }
    }

    /// The parsed options (after `post_options`, with cross-option rules applied).
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Supplies the contents of a `--suppressions=` file, for a runtime that reads files
    /// itself; `post_options` then does not open that file. Call before `post_options`.
    pub fn provide_suppressions_file(&mut self, name: &str, contents: String) {
        self.supp_texts.push((name.to_string(), contents));
    }

    /// Parses one suppression file into the error manager.
    pub fn load_suppressions(&mut self, name: &str, contents: &str) -> Result<(), SuppParseError> {
        // Users' files are cut to --num-callers, as Valgrind cuts them. Ours are not: a cut
        // default pattern (`fun:malloc` alone) would hide the program's own blocks, while an
        // uncut one longer than the stack simply does not match.
        let depth = if name == DEFAULT_SUPPRESSIONS_NAME {
            usize::MAX
        } else {
            self.opts.num_callers
        };
        let entries = supp::parse(name, contents, "Memcheck", depth)?;
        self.state_mut().errors.add_suppressions(entries);
        Ok(())
    }

    fn state_mut(&mut self) -> &mut State {
        // A poisoned lock only means a panic elsewhere; the data is still what we have.
        self.state.get_mut().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state lock, given up after a long while: another thread may hold it for a
    /// moment (it is released by every event), the interrupted thread never.
    fn lock_for_fini(&self) -> Option<std::sync::MutexGuard<'_, State>> {
        for _ in 0..200_000 {
            match self.state.try_lock() {
                Ok(g) => return Some(g),
                Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
            }
        }
        None
    }

    /// The start-up banner as text (`==PID== Memcheck, a memory error detector` ...), empty
    /// with `-q` or `--xml=yes`.
    pub fn preamble_text(&self, host: &dyn Host) -> String {
        let mut out = String::new();
        if self.opts.verbosity > 0 && !self.opts.xml {
            let ppid = self
                .opts
                .log_to_file
                .then(std::os::unix::process::parent_id);
            text::preamble(
                &mut out,
                host.pid(),
                host.command_line(),
                ppid.map(|p| p as i32),
            );
        }
        out
    }

    /// Call once, after `post_options` and before the program's `main`: writes the
    /// preamble to the log (text mode) or starts the XML document. If the runtime does not
    /// call it, the first event does (an atomic load per event).
    pub fn start(&self, host: &dyn Host) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let t = self.preamble_text(host);
        if !t.is_empty() {
            host.log(&t);
        }
        if self.opts.xml {
            let mut st = self.lock();
            self.start_xml(&mut st, host);
            self.flush_xml(&mut st, host);
        }
    }

    #[inline]
    fn ensure_started(&self, host: &dyn Host) {
        if !self.started.load(Ordering::Relaxed) {
            self.start(host);
        }
    }

    /// The exit status to force when the program ends normally: `--error-exitcode=N` if
    /// errors were counted. Call after `fini`.
    pub fn exit_status(&self) -> Option<i32> {
        let st = self.lock();
        (self.opts.error_exitcode != 0 && st.errors.any_errors())
            .then_some(self.opts.error_exitcode)
    }

    fn start_xml(&self, st: &mut State, host: &dyn Host) {
        if st.xml_started {
            return;
        }
        st.xml_started = true;
        let quals = self
            .opts
            .xml_file
            .as_deref()
            .map(file_qualifiers)
            .unwrap_or_default();
        // `<vargv><exe>` is the launcher; inside the program only its environment can say
        // where it is (`OXGRIND_LAUNCHER`, set by the launcher), else its name.
        let launcher = std::env::var("OXGRIND_LAUNCHER").unwrap_or_else(|_| "oxgrind".to_string());
        let ppid = std::os::unix::process::parent_id() as i32;
        xml::header(
            &mut st.xml,
            &xml::Header {
                pid: host.pid(),
                ppid,
                command: host.command_line(),
                launcher: &launcher,
                tool_args: &self.opts.args,
                file_qualifiers: &quals,
                user_comment: self.opts.xml_user_comment.as_deref(),
            },
        );
        xml::status(&mut st.xml, "RUNNING", host.elapsed_ms());
    }

    /// Hands the XML produced so far to the runtime, which appends it to `--xml-file` or
    /// `--xml-fd` (streamed as Valgrind does: a crash still leaves every error seen so far).
    fn flush_xml(&self, st: &mut State, host: &dyn Host) {
        if !st.xml.is_empty() {
            host.xml(&st.xml);
            st.xml.clear();
        }
    }

    /// Sends what the error manager produced to the log and, in XML mode, to the XML output.
    fn emit(&self, st: &mut State, out: Output, host: &dyn Host) {
        if !out.text.is_empty() {
            host.log(&out.text);
        }
        if !out.xml.is_empty() {
            self.start_xml(st, host);
            st.xml.push_str(&out.xml);
            self.flush_xml(st, host);
        }
    }

    fn resolve(&self, host: &dyn Host, id: StackId) -> Resolved {
        self.resolve_stack(host, id, true)
    }

    /// `frame0_is_ours`: frame 0 is our replacement of an allocation or string function
    /// (printed as `malloc (in OBJ)`, as Valgrind prints its preload's); false for the stack
    /// of a fault, whose frame 0 is the program's own instruction.
    fn resolve_stack(&self, host: &dyn Host, id: StackId, frame0_is_ours: bool) -> Resolved {
        let mut r = Resolved {
            shown: Vec::new(),
            supp: Vec::new(),
            gen: Vec::new(),
        };
        let mut cut = false;
        for (depth, ip) in host
            .stack(id)
            .into_iter()
            .take(self.opts.num_callers)
            .enumerate()
        {
            let mut group = host.describe(ip);
            if group.is_empty() {
                group.push(Frame {
                    ip,
                    ..Default::default()
                });
            }
            if depth == 0 && frame0_is_ours {
                // Frame 0 is always our replacement of the function the program called
                // (`malloc`, `free`, `strcpy`, ...). Valgrind's replacements live in a
                // preload library without line tables, so they print as `malloc (in OBJ)`;
                // ours print the same way whatever debug info the runtime carries.
                group.retain(|f| f.function.is_some() || f.object.is_some());
                if let Some(outer) = group.pop() {
                    group = vec![Frame {
                        file: None,
                        dir: None,
                        line: 0,
                        ..outer
                    }];
                } else {
                    group.push(Frame {
                        ip,
                        ..Default::default()
                    });
                }
            }
            let mut reaches_main = false;
            for f in group {
                let sf = SuppFrame {
                    fun: f.mangled.clone().or_else(|| f.function.clone()),
                    obj: f.object.clone(),
                    file: f.file.clone(),
                    line: f.line,
                };
                r.supp.push(sf.clone());
                if cut {
                    continue;
                }
                let mut shown = f;
                if !self.opts.show_below_main {
                    if let Some(name) = shown.function.as_deref() {
                        if name == "main" {
                            reaches_main = true;
                        } else if is_below_main(name) {
                            reaches_main = true;
                            shown.function = Some("(below main)".into());
                        }
                    }
                }
                r.gen.push(GenFrame::from_frame(&sf));
                r.shown.push(shown);
            }
            if reaches_main {
                cut = true;
            }
        }
        r
    }

    /// Memcheck's `describe_addr` for heap addresses: a recently freed block first, then a
    /// live one (each with its redzones), else "not stack'd, malloc'd or (recently) free'd".
    /// `thread`: the erring thread's number, for "on thread N's stack".
    fn describe_addr(
        &self,
        host: &dyn Host,
        freed: &FreedQueue,
        addr: Addr,
        thread: i32,
    ) -> Vec<Aux> {
        let near = |start: Addr, size: u64| {
            addr >= start.saturating_sub(REDZONE) && addr < start + size + REDZONE
        };
        let live: Option<LiveBlock> = self
            .program_blocks(host)
            .into_iter()
            .find(|b| near(b.addr, b.size));
        let f = freed.bracketing(addr).copied().filter(|f| {
            // A freed entry whose memory was handed out again is stale.
            !host_reused(&live, f)
        });
        let keep = self.opts.keep_stacks;
        if let Some(f) = f {
            let mut aux = vec![Aux::Text(text::address_in_block(
                addr,
                addr.wrapping_sub(f.addr) as i64,
                f.size,
                true,
            ))];
            let free_st = matches!(
                keep,
                KeepStacks::Free | KeepStacks::AllocAndFree | KeepStacks::AllocThenFree
            );
            let alloc_st = matches!(keep, KeepStacks::Alloc | KeepStacks::AllocAndFree);
            if free_st {
                aux.push(Aux::Stack(self.resolve(host, f.free_stack).shown));
                if alloc_st {
                    aux.push(Aux::Text(text::BLOCK_WAS_ALLOCD_AT.into()));
                    aux.push(Aux::Stack(self.resolve(host, f.alloc_stack).shown));
                }
            } else if alloc_st {
                aux.push(Aux::Stack(self.resolve(host, f.alloc_stack).shown));
            }
            return aux;
        }
        if let Some(b) = live {
            let mut aux = vec![Aux::Text(text::address_in_block(
                addr,
                addr.wrapping_sub(b.addr) as i64,
                b.size,
                false,
            ))];
            if !matches!(
                keep,
                KeepStacks::None | KeepStacks::Free | KeepStacks::AllocThenFree
            ) {
                aux.push(Aux::Stack(self.resolve(host, b.stack).shown));
            }
            return aux;
        }
        match host.describe_data(addr) {
            Some(DataAddr::Stack { frame }) => {
                let mut aux = vec![Aux::Text(text::address_on_stack(addr, thread))];
                if let Some((k, f)) = frame {
                    aux.push(Aux::Text(text::in_frame(k, &f)));
                }
                aux
            }
            Some(DataAddr::Symbol { name, offset }) => {
                vec![Aux::Text(text::address_in_data_symbol(addr, offset, &name))]
            }
            None => vec![Aux::Text(text::address_unknown(addr))],
        }
    }

    /// The slow path of a probe: some granule of the access is marked. Decides, as
    /// Memcheck's `mc_LOADVn_slow` / `mc_STOREVn_slow` do, whether this is an error, and
    /// reports it (a read-modify-write is checked as a read, then as a write).
    fn check_access(&self, host: &dyn Host, base: u64, a: &Access, regs: &GuestRegs) {
        let v = shadow::verdict(base, a.addr, a.size);
        if v.bad == 0 {
            return;
        }
        match self.pc_class(host, regs.rip) {
            PcClass::Program => {}
            PcClass::LibcAllocator => return,
            PcClass::LibcString => {
                // glibc's vector loops read up to a few vectors past the end of their data
                // (never across a page, so never a fault): a read with an addressable byte
                // in it or shortly before it is such an over-read, not the program's
                // error. Valgrind's replacements make no such reads.
                let read_only = a.kind == AccessKind::Read;
                if v.bad_outside_header == 0
                    || (read_only
                        && (v.bad < a.size
                            || shadow::any_addressable(
                                base,
                                a.addr.saturating_sub(STRING_OVERREAD),
                                a.addr,
                            )))
                {
                    return;
                }
            }
        }
        let (read, write) = match a.kind {
            AccessKind::Read => (true, false),
            AccessKind::Write => (false, true),
            AccessKind::Modify => (true, true),
        };
        let mut at: Option<(StackId, i32, i32)> = None;
        let mut report = |addr: Addr, size: u32, write: bool| {
            let (stack, tid, thread) = *at.get_or_insert_with(|| {
                let tid = oxgrind_sys::raw::gettid();
                let mut st = self.lock();
                let thread = thread_number(&mut st.threads, tid, host.pid());
                drop(st);
                (host.stack_at(regs, self.opts.num_callers), tid, thread)
            });
            self.report_at(
                host,
                KeyKind::Addr { size },
                stack,
                false,
                tid,
                if write { "InvalidWrite" } else { "InvalidRead" },
                &|| text::invalid_access(write, size),
                WhatQuirk::None,
                &|freed| self.describe_addr(host, freed, addr, thread),
            );
        };
        if read {
            // --partial-loads-ok=yes: a naturally aligned load of a word or a vector with
            // at least one addressable byte is fine (Memcheck gives the other bytes
            // undefined values instead, which we do not track).
            let size = a.size as u64;
            let partial_ok = self.opts.partial_loads_ok
                && matches!(size, 8 | 16 | 32)
                && a.addr % size == 0
                && v.bad < a.size;
            if !partial_ok {
                report(a.addr, a.size, false);
            }
        }
        if write {
            if a.size > 8 {
                // Memcheck stores vectors in 8-byte pieces: each piece with an
                // unaddressable byte is an invalid write of size 8 at that piece.
                for off in (0..a.size).step_by(8) {
                    let (piece, n) = (a.addr + off as u64, 8.min(a.size - off));
                    if shadow::verdict(base, piece, n).bad > 0 {
                        report(piece, n, true);
                    }
                }
            } else {
                report(a.addr, a.size, true);
                if a.size == 2 {
                    // Memcheck 3.19 counts a bad 2-byte store twice (shown once).
                    report(a.addr, a.size, true);
                }
            }
        }
    }

    /// Whether `addr` is a block of ours allocated in a probe (it is forgotten).
    fn forget_foreign(&self, addr: Addr) -> bool {
        let mut f = self.foreign.lock();
        match f.iter().position(|&a| a == addr) {
            Some(i) => {
                f.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// The program's live blocks: the runtime's list without [`Memcheck::foreign`] ones.
    fn program_blocks(&self, host: &dyn Host) -> Vec<LiveBlock> {
        let mut live = host.live_blocks();
        let f = self.foreign.lock();
        if !f.is_empty() {
            live.retain(|b| !f.contains(&b.addr));
        }
        live
    }

    /// What the code at `pc` is, by its symbol (cached: asked only on the slow path).
    fn pc_class(&self, host: &dyn Host, pc: u64) -> PcClass {
        if let Some(c) = self
            .pc_classes
            .lock()
            .as_ref()
            .and_then(|m| m.get(&pc).copied())
        {
            return c;
        }
        // No lock held across the symbolizer.
        let frames = host.describe(pc);
        let outer = frames.last();
        let object = outer.and_then(|f| f.object.as_deref()).unwrap_or("");
        let function = outer.and_then(|f| f.function.as_deref());
        let c = classify(object, function);
        self.pc_classes
            .lock()
            .get_or_insert_with(Default::default)
            .insert(pc, c);
        c
    }

    /// Records one runtime-detected error on the calling thread.
    // The closures keep rendering lazy (only a new context is rendered); bundling them in a
    // struct would add a type for one caller.
    #[allow(clippy::too_many_arguments)]
    fn report(
        &self,
        host: &dyn Host,
        kind: KeyKind,
        stack: StackId,
        tid: i32,
        xml_kind: &'static str,
        what: &dyn Fn() -> String,
        quirk: WhatQuirk,
        aux: &dyn Fn(&FreedQueue) -> Vec<Aux>,
    ) {
        self.report_at(host, kind, stack, true, tid, xml_kind, what, quirk, aux)
    }

    /// [`Memcheck::report`] for a stack whose frame 0 is `frame0_is_ours` (our replacement
    /// function) or the program's own instruction (an invalid access).
    #[allow(clippy::too_many_arguments)]
    fn report_at(
        &self,
        host: &dyn Host,
        kind: KeyKind,
        stack: StackId,
        frame0_is_ours: bool,
        tid: i32,
        xml_kind: &'static str,
        what: &dyn Fn() -> String,
        quirk: WhatQuirk,
        aux: &dyn Fn(&FreedQueue) -> Vec<Aux>,
    ) {
        let ips: Vec<u64> = host
            .stack(stack)
            .into_iter()
            .take(self.opts.num_callers)
            .collect();
        let mut st = self.lock();
        st.errors.rep.pid = host.pid();
        let tid = thread_number(&mut st.threads, tid, host.pid());
        let mut out = Output::default();
        let State { errors, freed, .. } = &mut *st;
        let found_before = errors.errs_found;
        let class_kind = kind.clone();
        errors.record(&mut out, ErrorKey { kind, ips }, &mut || {
            let r = self.resolve_stack(host, stack, frame0_is_ours);
            let class_name = class_kind.class().supp_kind_name();
            let extra = match &class_kind {
                KeyKind::FishyValue { function, argument } => {
                    Some(format!("{function}({argument})"))
                }
                _ => None,
            };
            Shown {
                tid,
                xml_kind,
                block: ErrorBlock {
                    what: what(),
                    stack: r.shown,
                    aux: aux(freed),
                },
                what_newline_quirk: quirk,
                supp_frames: r.supp,
                generated: GeneratedSupp {
                    kind: format!("Memcheck:{class_name}"),
                    extra,
                    frames: r.gen,
                },
            }
        });
        let first_real_error = st.errors.errs_found > found_before;
        self.emit(&mut st, out, host);
        if self.opts.exit_on_first_error && first_real_error {
            let pid = host.pid();
            host.log(&format!(
                "=={pid}== \n=={pid}== Exit program on first error (--exit-on-first-error=yes)\n"
            ));
            host.exit_now(self.opts.error_exitcode);
        }
    }

    /// The leak search and its report; text goes to `out`, returns nothing to print when
    /// `--leak-check=no`.
    fn leak_check(&self, host: &dyn Host, st: &mut State, out: &mut Output, live: &[LiveBlock]) {
        let pid = host.pid();
        let verbose_text = self.opts.verbosity > 0 && !self.opts.xml;
        if self.opts.leak_check == LeakCheck::No {
            if self.opts.verbosity == 1 && !self.opts.xml {
                text::line(
                    &mut out.text,
                    pid,
                    "For a detailed leak analysis, rerun with: --leak-check=full",
                );
                text::line(&mut out.text, pid, "");
            }
            return;
        }
        if live.is_empty() {
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
        let mut blocks: Vec<leak::Block> = live
            .iter()
            .map(|b| leak::Block {
                addr: b.addr,
                size: b.size,
                stack: b.stack,
            })
            .collect();
        blocks.sort_by_key(|b| b.addr);
        let mem = HostMemory {
            host,
            scanned: std::cell::Cell::new(0),
        };
        let chatty = self.opts.verbosity > 1 && !self.opts.xml;
        if chatty {
            let n = oxgrind_formats::number::commify(blocks.len() as u64);
            text::line(
                &mut out.text,
                pid,
                &format!("Searching for pointers to {n} not-freed blocks"),
            );
        }
        let mut search = leak::LeakSearch::new(&blocks, &mem, self.opts.heuristics);
        let mut searched = false;
        host.with_roots(&mut |roots: &[RootRange]| {
            // Our shadow is a writable mapping the runtime does not know as ours: 16 TiB
            // of zeroes that hold no pointer and would take for ever to scan.
            let shadow = shadow::base_if_ready();
            let shadow = (shadow, shadow + shadow::SHADOW_SPAN * (shadow != 0) as u64);
            let real = self.probing.load(Ordering::Relaxed);
            search.run(&mut |sink| {
                for r in roots {
                    for (start, end) in outside(r.start, r.end, shadow) {
                        if real {
                            mem.read_root_words(start, end, &mut |_, w| sink(w));
                        } else {
                            let len = end - start;
                            leak::Memory::read_words(&mem, start, len, &mut |_, w| sink(w));
                        }
                    }
                }
            });
            searched = true;
        });
        let verdicts = search.into_verdicts();
        if !searched {
            // The host never called us back: nothing was searched, say nothing wrong.
            return;
        }
        if chatty {
            let n = oxgrind_formats::number::commify(mem.scanned.get());
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
        let records = leak::loss_records(&blocks, &verdicts, &mut same_place);
        let total = records.len();
        let full = self.opts.leak_check == LeakCheck::Full;
        let mut sum = LeakSummary::default();
        for (i, r) in records.iter().enumerate() {
            let print = full && self.opts.show_leak_kinds.contains(r.kind);
            let count = full && self.opts.errors_for_leak_kinds.contains(r.kind);
            let res = self.resolve(host, r.stack);
            let shown = Shown {
                tid: 1,
                xml_kind: match r.kind {
                    LeakKind::Definite => "Leak_DefinitelyLost",
                    LeakKind::Indirect => "Leak_IndirectlyLost",
                    LeakKind::Possible => "Leak_PossiblyLost",
                    LeakKind::Reachable => "Leak_StillReachable",
                },
                block: ErrorBlock {
                    what: text::loss_record_what(
                        r.bytes,
                        r.indirect,
                        r.blocks,
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
        // "of which reachable via heuristic", per heuristic, over all blocks (as Memcheck).
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
        }
        if verbose_text {
            let mode = if full {
                LeakMode::Full {
                    reachable_shown: self.opts.show_leak_kinds.contains(LeakKind::Reachable),
                }
            } else {
                LeakMode::Summary
            };
            text::leak_summary(&mut out.text, pid, &sum, mode);
        }
    }
}

/// Valgrind numbers threads 1, 2, ... (the main thread is 1); the runtime reports kernel
/// thread ids. The main thread's id is the pid; others are numbered as they first appear
/// in an error (Valgrind numbers them at creation, which the tool does not see).
/// The resource limits the fatal-signal block mentions, from /proc/self/limits.
struct ProcessLimits {
    /// Soft limit on core files (0: no core is written).
    core: u64,
    /// The main thread's stack size as Valgrind states it: the soft stack limit, kept
    /// between 1 MiB and 16 MiB.
    main_stack: u64,
}

impl ProcessLimits {
    fn read() -> ProcessLimits {
        let text = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let soft = |name: &str| {
            text.lines().find(|l| l.starts_with(name)).and_then(|l| {
                let v = l[name.len()..].split_whitespace().next()?;
                Some(if v == "unlimited" {
                    u64::MAX
                } else {
                    v.parse().ok()?
                })
            })
        };
        ProcessLimits {
            core: soft("Max core file size").unwrap_or(0),
            main_stack: soft("Max stack size")
                .unwrap_or(8 << 20)
                .clamp(1 << 20, 16 << 20),
        }
    }
}

thread_local! {
    /// This thread is in the slow path of a probe. The runtime does not mark the thread as
    /// inside oxgrind there (it does in allocator hooks), so what we call that allocates
    /// (the symbolizer's `__cxa_demangle`, `dlsym`) reaches the allocator hooks as if the
    /// program had called it, and would re-enter the tool while it holds its state lock.
    /// Those events are not the program's: ignored.
    static IN_PROBE: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

fn in_probe() -> bool {
    IN_PROBE.with(|f| f.get())
}

struct ProbeScope;

impl ProbeScope {
    fn enter() -> ProbeScope {
        IN_PROBE.with(|f| f.set(true));
        ProbeScope
    }
}

impl Drop for ProbeScope {
    fn drop(&mut self) {
        IN_PROBE.with(|f| f.set(false));
    }
}

/// How far past the end of its data a glibc string function may read (four 32-byte
/// vectors: the unrolled AVX2 loops).
const STRING_OVERREAD: u64 = 128;

use oxgrind_tool::instrument::may_touch_heap;

/// [`PcClass`] of code in `object` (a path) at `function` (demangled name, if known).
fn classify(object: &str, function: Option<&str>) -> PcClass {
    let file = object.rsplit('/').next().unwrap_or(object);
    if !(file.starts_with("libc.so") || file.starts_with("libc-")) {
        return PcClass::Program;
    }
    let Some(name) = function else {
        return PcClass::LibcString;
    };
    // `cfree@GLIBC_2.2.5`: a versioned alias.
    let name = name.split('@').next().unwrap_or(name);
    const ALLOCATOR: &[&str] = &[
        "malloc",
        "free",
        "cfree",
        "calloc",
        "realloc",
        "reallocarray",
        "memalign",
        "aligned_alloc",
        "posix_memalign",
        "valloc",
        "pvalloc",
        "malloc_usable_size",
        "malloc_trim",
        "malloc_consolidate",
        "mallinfo",
        "mallinfo2",
        "malloc_stats",
        "malloc_info",
        "mallopt",
        "sysmalloc",
        "systrim",
        "unlink_chunk",
        "munmap_chunk",
        "mremap_chunk",
        "tcache_init",
        "tcache_thread_shutdown",
        "arena_get2",
        "_mid_memalign",
    ];
    let bare = name.trim_start_matches('_');
    let bare = bare.strip_prefix("libc_").unwrap_or(bare);
    let bare = bare.strip_prefix("int_").unwrap_or(bare);
    if ALLOCATOR.contains(&bare) || name.starts_with("_int_") || name.contains("tcache") {
        return PcClass::LibcAllocator;
    }
    // IFUNC variants (`__strlen_avx2`, `__memmove_avx_unaligned_erms`) and the plain names.
    const STRING: &[&str] = &[
        "str",
        "mem",
        "stp",
        "wcs",
        "wmem",
        "rawmemchr",
        "bcmp",
        "bcopy",
        "bzero",
        "index",
        "rindex",
    ];
    if STRING.iter().any(|p| bare.starts_with(p)) {
        return PcClass::LibcString;
    }
    PcClass::Program
}

/// The parts of `[start, end)` outside `hole` (at most two).
fn outside(start: Addr, end: Addr, hole: (Addr, Addr)) -> impl Iterator<Item = (Addr, Addr)> {
    let before = (start, end.min(hole.0));
    let after = (start.max(hole.1), end);
    [before, after].into_iter().filter(|(s, e)| s < e)
}

fn thread_number(seen: &mut Vec<i32>, os_tid: i32, pid: i32) -> i32 {
    if os_tid == pid || os_tid == 1 {
        return 1;
    }
    match seen.iter().position(|&t| t == os_tid) {
        Some(i) => i as i32 + 2,
        None => {
            seen.push(os_tid);
            seen.len() as i32 + 1
        }
    }
}

fn host_reused(live: &Option<LiveBlock>, f: &FreedBlock) -> bool {
    match live {
        Some(b) => b.addr < f.addr + f.size.max(1) && f.addr < b.addr + b.size.max(1),
        None => false,
    }
}

/// `%q{VAR}` parts of a file-name template with their values (XML `<logfilequalifier>`).
fn file_qualifiers(template: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(i) = rest.find("%q{") {
        let after = &rest[i + 3..];
        let Some(end) = after.find('}') else { break };
        let var = &after[..end];
        out.push((var.to_string(), std::env::var(var).unwrap_or_default()));
        rest = &after[end + 1..];
    }
    out
}

fn reporting(opts: &Options, pid: i32) -> Reporting {
    Reporting {
        pid,
        verbosity: opts.verbosity,
        xml: opts.xml,
        error_limit: opts.error_limit,
        gen_suppressions: opts.gen_suppressions,
        show_error_list: opts.show_error_list,
        error_markers: opts.error_markers.clone(),
    }
}

/// The leak search's view of the program's memory.
struct HostMemory<'a> {
    host: &'a dyn Host,
    /// Bytes of blocks scanned (`-v`'s "Checked N bytes").
    scanned: std::cell::Cell<u64>,
}

impl HostMemory<'_> {
    /// Every aligned word of the root range `[start, end)`, read with `process_vm_readv` on
    /// ourselves one page at a time: a page that is gone (or unreadable) is skipped instead
    /// of faulting. Root ranges are computed before the scan, and under the translation
    /// engine our own large allocations (not excluded from the roots) can be unmapped while
    /// the scan runs.
    fn read_root_words(&self, start: Addr, end: Addr, f: &mut dyn FnMut(Addr, u64)) {
        const SYS_PROCESS_VM_READV: usize = 310;
        const PAGE: u64 = 4096;
        let pid = oxgrind_sys::raw::getpid() as usize;
        let mut buf = [0u64; (PAGE / 8) as usize];
        let mut n = 0u64;
        let mut a = (start + 7) & !7;
        while a + 8 <= end {
            let stop = end.min((a & !(PAGE - 1)) + PAGE);
            let want = ((stop - a) & !7) as usize;
            let local = [buf.as_mut_ptr() as usize, want];
            let remote = [a as usize, want];
            // SAFETY: the kernel writes at most `want` bytes to `buf` (which holds a page)
            // and reads the remote range itself, failing with EFAULT rather than faulting.
            let got = unsafe {
                oxgrind_sys::syscall::syscall6(
                    SYS_PROCESS_VM_READV,
                    pid,
                    local.as_ptr() as usize,
                    1,
                    remote.as_ptr() as usize,
                    1,
                    0,
                )
            };
            let words = if got > 0 { got as usize / 8 } else { 0 };
            for (i, &w) in buf[..words].iter().enumerate() {
                f(a + 8 * i as u64, w);
            }
            n += words as u64;
            a = stop.next_multiple_of(8);
        }
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

impl Tool for Memcheck {
    fn help(&self) -> &'static str {
        "  user options for Memcheck:
    --leak-check=no|summary|full     search for memory leaks at exit?  [summary]
    --leak-resolution=low|med|high   differentiation of leak stack traces [high]
    --show-leak-kinds=kind1,kind2,.. which leak kinds to show?
                                            [definite,possible]
    --errors-for-leak-kinds=kind1,kind2,..  which leak kinds are errors?
                                            [definite,possible]
        where kind is one of:
          definite indirect possible reachable all none
    --leak-check-heuristics=heur1,heur2,... which heuristics to use for
        improving leak search false positive [all]
        where heur is one of:
          stdstring length64 newarray multipleinheritance all none
    --show-reachable=yes             same as --show-leak-kinds=all
    --show-reachable=no --show-possibly-lost=yes
                                     same as --show-leak-kinds=definite,possible
    --show-reachable=no --show-possibly-lost=no
                                     same as --show-leak-kinds=definite
    --freelist-vol=<number>          volume of freed blocks queue     [20000000]
    --freelist-big-blocks=<number>   releases first blocks with size>= [1000000]
    --keep-stacktraces=alloc|free|alloc-and-free|alloc-then-free|none
        stack trace(s) to keep for malloc'd/free'd areas       [alloc-and-free]
    --show-mismatched-frees=no|yes   show frees that don't match the allocator? [yes]
    --partial-loads-ok=no|yes        too hard to explain here; see manual [yes]

  (Invalid reads and writes are checked for heap blocks; undefined values are not
  tracked yet.)
"
    }

    fn on_start(&self, host: &dyn Host) {
        self.start(host);
    }

    fn name(&self) -> &'static str {
        "memcheck"
    }

    fn parse_option(&mut self, arg: &str) -> Result<bool, OptionError> {
        self.opts.parse(arg)
    }

    fn post_options(&mut self) -> Result<(), OptionError> {
        self.opts.finish()?;
        let rep = reporting(&self.opts, 0);
        let (vol, big) = (self.opts.freelist_vol, self.opts.freelist_big_blocks);
        {
            let st = self.state_mut();
            st.errors = ErrorManager::new(rep);
            st.freed = FreedQueue::new(vol, big);
            st.shadow_q = ShadowQueue::new(vol);
        }
        let fatal = |e: SuppParseError| OptionError(e.fatal_lines().join("\n"));
        if self.opts.default_suppressions {
            self.load_suppressions(DEFAULT_SUPPRESSIONS_NAME, DEFAULT_SUPPRESSIONS)
                .map_err(fatal)?;
        }
        for name in self.opts.suppressions.clone() {
            let provided = self
                .supp_texts
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, t)| t.clone());
            let contents = match provided {
                Some(t) => t,
                None => match std::fs::read(&name) {
                    Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                    Err(_) => {
                        return Err(OptionError(format!(
                            "FATAL: can't open suppressions file \"{name}\""
                        )))
                    }
                },
            };
            self.load_suppressions(&name, &contents).map_err(fatal)?;
        }
        Ok(())
    }

    fn needs(&self) -> Needs {
        Needs {
            stack_depth: self.opts.num_callers,
            free_stacks: true,
            freelist_vol: self.opts.freelist_vol,
            page_events: false,
            // Valgrind's default --redzone-size for Memcheck.
            redzone: shadow::REDZONE,
            check_overlaps: true,
            // Probes on the program's memory accesses: Invalid read / Invalid write.
            instrument: true,
            ..Needs::default()
        }
    }

    fn on_alloc(&self, host: &dyn Host, ev: &Alloc) {
        if in_probe() {
            self.foreign.lock().push(ev.addr);
            return;
        }
        self.ensure_started(host);
        self.allocs.fetch_add(1, Ordering::Relaxed);
        self.bytes_allocated.fetch_add(ev.size, Ordering::Relaxed);
        if self.probing.load(Ordering::Relaxed) {
            // SAFETY: the engine runs, so this is a real process and the block was just
            // returned by glibc's allocator (through the runtime).
            let (end, next_header) = unsafe { shadow::chunk_end(ev.addr, ev.size) };
            let base = shadow_base();
            shadow::mark_alloc(base, ev.addr, ev.size, end);
            if next_header {
                shadow::mark_next_header(base, end);
            }
        }
    }

    fn on_free(&self, host: &dyn Host, ev: &Free) {
        if self.forget_foreign(ev.addr) || in_probe() {
            return;
        }
        self.ensure_started(host);
        self.frees.fetch_add(1, Ordering::Relaxed);
        if self.opts.show_mismatched_frees && ev.alloc_func.family() != ev.func.family() {
            let (addr, size, alloc_stack) = (ev.addr, ev.size, ev.alloc_stack);
            let keep_alloc = !matches!(
                self.opts.keep_stacks,
                KeepStacks::None | KeepStacks::Free | KeepStacks::AllocThenFree
            );
            self.report(
                host,
                KeyKind::MismatchedFree,
                ev.stack,
                ev.tid,
                "MismatchedFree",
                &|| text::MISMATCHED_FREE.to_string(),
                WhatQuirk::None,
                &|_| {
                    let mut aux = vec![Aux::Text(text::address_in_block(addr, 0, size, false))];
                    if keep_alloc {
                        aux.push(Aux::Stack(self.resolve(host, alloc_stack).shown));
                    }
                    aux
                },
            );
        }
        let mut st = self.lock();
        st.freed.push(FreedBlock {
            addr: ev.addr,
            size: ev.size,
            alloc_stack: ev.alloc_stack,
            free_stack: ev.stack,
        });
        if !self.probing.load(Ordering::Relaxed) {
            return;
        }
        let base = shadow_base();
        if st.shadow_q.keeps(ev.size) {
            shadow::mark_freed(base, ev.addr, ev.size);
        }
        // SAFETY: the engine runs, so this is a real process, and the runtime tells us of a
        // free before giving the block back to glibc.
        let (end, _) = unsafe { shadow::chunk_end(ev.addr, ev.size) };
        st.shadow_q
            .push(ev.addr, ev.size, end, &mut |a, size, end| {
                shadow::clear_block(base, a, size, end)
            });
    }

    fn instrument(&self, _pc: Addr, block: &[Instruction], plan: &mut Plan) {
        // Runs at translation with the thread stopped, maybe while this thread holds our
        // state lock (translating libc code our own reporting calls): no locks here.
        if shadow_base() == 0 {
            return;
        }
        if !self.probing.swap(true, Ordering::Relaxed) {
            // The engine checks the same shadow inline and calls only when a granule an
            // access touches is not all addressable (0 = addressable, as here).
            oxgrind_tool::instrument::set_shadow_base(shadow_base());
        }
        for (i, ins) in block.iter().enumerate() {
            if may_touch_heap(ins) {
                plan.accesses_filtered(i, 0);
            }
        }
    }

    fn on_accesses(&self, host: &dyn Host, accesses: &[Access], regs: &GuestRegs, _data: u64) {
        let base = shadow::base_if_ready();
        if base == 0 {
            return;
        }
        for a in accesses {
            if !shadow::all_addressable(base, a.addr, a.size) {
                let _probe = ProbeScope::enter();
                self.check_access(host, base, a, regs);
            }
        }
    }

    fn on_misuse(&self, host: &dyn Host, ev: &MisuseEvent) {
        if in_probe() {
            return;
        }
        self.ensure_started(host);
        match ev.kind {
            Misuse::InvalidFree { addr, func, size } => {
                let thread = {
                    let mut st = self.lock();
                    thread_number(&mut st.threads, ev.tid, host.pid())
                };
                // Memcheck counts the call before validating the pointer: an invalid free
                // is one of the "frees" of HEAP SUMMARY, an invalid realloc also an alloc
                // of the size it asked for.
                self.frees.fetch_add(1, Ordering::Relaxed);
                if matches!(func, AllocFn::Realloc | AllocFn::ReallocArray) {
                    self.allocs.fetch_add(1, Ordering::Relaxed);
                    self.bytes_allocated.fetch_add(size, Ordering::Relaxed);
                }
                self.report(
                    host,
                    KeyKind::InvalidFree,
                    ev.stack,
                    ev.tid,
                    "InvalidFree",
                    &|| text::INVALID_FREE.to_string(),
                    WhatQuirk::None,
                    &|freed| self.describe_addr(host, freed, addr, thread),
                )
            }
            Misuse::FishyValue { func, arg, value } => {
                let function = alloc_fn_name(func);
                self.report(
                    host,
                    KeyKind::FishyValue {
                        function,
                        argument: arg,
                    },
                    ev.stack,
                    ev.tid,
                    "FishyValue",
                    &|| text::fishy_value(function, arg, value),
                    WhatQuirk::NewlineThenTag,
                    &|_| Vec::new(),
                )
            }
            Misuse::BadAlignment { func, align } => {
                let why = match func {
                    AllocFn::PosixMemalign => {
                        " (should be non-zero, a power of 2 and a multiple of sizeof(void*))"
                    }
                    _ => " (should be power of 2)",
                };
                self.report(
                    host,
                    KeyKind::BadAlign,
                    ev.stack,
                    ev.tid,
                    "InvalidAlignment",
                    &|| text::invalid_alignment(align, why),
                    WhatQuirk::None,
                    &|_| Vec::new(),
                )
            }
            Misuse::Overlap {
                func,
                dst,
                src,
                len,
            } => self.report(
                host,
                KeyKind::Overlap { function: func },
                ev.stack,
                ev.tid,
                "Overlap",
                &|| text::overlap(func, dst, src, len),
                if len.is_none() {
                    WhatQuirk::NewlineThenNewline
                } else {
                    WhatQuirk::None
                },
                &|_| Vec::new(),
            ),
        }
    }

    fn exit_status_override(&self) -> Option<i32> {
        self.exit_status()
    }

    fn fini(&self, host: &dyn Host, exit: Exit) {
        self.ensure_started(host);
        if let Exit::Exec = exit {
            // Valgrind prints nothing when the program replaces itself: the summaries
            // belong to the process's real end (which still comes if the exec fails).
            return;
        }
        let live = self.program_blocks(host);
        // fini may run in a fatal-signal handler on a thread that was inside one of our
        // events: never wait for ever on our own lock.
        let Some(mut st) = self.lock_for_fini() else {
            host.log(&format!(
                "=={}== Memcheck: report skipped, the tool was busy when the program died\n",
                host.pid()
            ));
            return;
        };
        if st.finished {
            return;
        }
        st.finished = true;
        let pid = host.pid();
        st.errors.rep.pid = pid;
        let mut out = Output::default();
        // "Process terminating with default action of signal N", as Valgrind prints it.
        let fatal = match exit {
            Exit::Signal(_) => host.fatal_signal(),
            _ => None,
        };
        if let Some(f) = fatal {
            let frames = self.resolve_stack(host, f.stack, false).shown;
            if self.opts.xml {
                self.start_xml(&mut st, host);
                let tid = thread_number(&mut st.threads, f.tid, pid);
                xml::fatal_signal(&mut st.xml, tid, f.sig, f.code, f.addr, &frames);
            } else if self.opts.verbosity > 0 {
                let limits = ProcessLimits::read();
                let core =
                    matches!(f.sig, 3 | 4 | 5 | 6 | 7 | 8 | 11 | 24 | 25 | 31) && limits.core > 0;
                text::fatal_signal(
                    &mut out.text,
                    pid,
                    f.sig,
                    f.code,
                    f.addr,
                    &frames,
                    core,
                    limits.main_stack,
                );
            }
        }
        if self.opts.xml {
            self.start_xml(&mut st, host);
            st.xml.push('\n');
            xml::status(&mut st.xml, "FINISHED", host.elapsed_ms());
        } else if self.opts.verbosity > 0 {
            text::line(&mut out.text, pid, "");
            let in_use: u64 = live.iter().map(|b| b.size).sum();
            text::heap_summary(
                &mut out.text,
                pid,
                in_use,
                live.len() as u64,
                self.allocs.load(Ordering::Relaxed),
                self.frees.load(Ordering::Relaxed),
                self.bytes_allocated.load(Ordering::Relaxed),
            );
        }
        self.leak_check(host, &mut st, &mut out, &live);
        st.errors.finish(&mut out);
        if !out.text.is_empty() {
            host.log(&out.text);
        }
        if self.opts.xml {
            let body = std::mem::take(&mut out.xml);
            st.xml.push_str(&body);
            xml::footer(&mut st.xml);
            self.flush_xml(&mut st, host);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_numbered_like_valgrind_main_first() {
        let mut seen = Vec::new();
        assert_eq!(thread_number(&mut seen, 4242, 4242), 1);
        assert_eq!(thread_number(&mut seen, 4250, 4242), 2);
        assert_eq!(thread_number(&mut seen, 4247, 4242), 3);
        assert_eq!(thread_number(&mut seen, 4250, 4242), 2);
        assert_eq!(thread_number(&mut seen, 1, 4242), 1);
    }

    #[test]
    fn root_ranges_skip_the_shadow() {
        let parts = |s, e, h| outside(s, e, h).collect::<Vec<_>>();
        assert_eq!(parts(0, 100, (40, 60)), [(0, 40), (60, 100)]);
        assert_eq!(parts(50, 100, (40, 60)), [(60, 100)]);
        assert_eq!(parts(45, 55, (40, 60)), []);
        assert_eq!(parts(0, 10, (0, 0)), [(0, 10)]);
    }

    #[test]
    fn libc_code_is_classified_by_symbol_name() {
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        assert_eq!(classify(libc, Some("__strlen_avx2")), PcClass::LibcString);
        assert_eq!(
            classify(libc, Some("__memmove_avx_unaligned_erms")),
            PcClass::LibcString
        );
        assert_eq!(classify(libc, None), PcClass::LibcString);
        assert_eq!(classify(libc, Some("_int_free")), PcClass::LibcAllocator);
        assert_eq!(
            classify(libc, Some("__libc_malloc")),
            PcClass::LibcAllocator
        );
        assert_eq!(classify(libc, Some("tcache_put")), PcClass::LibcAllocator);
        assert_eq!(
            classify(libc, Some("cfree@GLIBC_2.2.5")),
            PcClass::LibcAllocator
        );
        assert_eq!(classify(libc, Some("qsort_r")), PcClass::Program);
        assert_eq!(classify("/tmp/prog", Some("strlen")), PcClass::Program);
    }

    #[test]
    fn heap_operands_are_probed_stack_rip_and_tls_ones_are_not() {
        use oxgrind_tool::instrument::iced_x86::{Decoder, DecoderOptions};
        let probed = |bytes: &[u8]| {
            let ins = Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE).decode();
            may_touch_heap(&ins)
        };
        assert!(probed(&[0x8b, 0x00])); // mov eax, [rax]
        assert!(probed(&[0x48, 0x89, 0x47, 0x08])); // mov [rdi+8], rax
        assert!(probed(&[0xff, 0x30])); // push qword [rax]
        assert!(probed(&[0xf3, 0xa4])); // rep movsb
        assert!(!probed(&[0x48, 0x8b, 0x44, 0x24, 0x08])); // mov rax, [rsp+8]
        assert!(!probed(&[0x48, 0x8b, 0x05, 0, 0, 0, 0])); // mov rax, [rip+0]
        assert!(!probed(&[0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0])); // mov rax, fs:[0x28]
        assert!(!probed(&[0x50])); // push rax
        assert!(!probed(&[0xc3])); // ret
        assert!(!probed(&[0xc9])); // leave
        assert!(!probed(&[0x48, 0x8d, 0x04, 0x07])); // lea rax, [rdi+rax]
    }

    #[test]
    fn below_main_names_are_valgrinds() {
        assert!(is_below_main("__libc_start_call_main"));
        assert!(is_below_main("__libc_start_main.constprop.0"));
        assert!(!is_below_main("main"));
        assert!(!is_below_main("start_thread"));
    }
}
