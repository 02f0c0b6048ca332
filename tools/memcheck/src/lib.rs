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
//! Not here: definedness and addressability of every access (Memcheck part 2 needs the
//! engine), descriptions of stack and global addresses (the `Host` cannot describe them),
//! `--exit-on-first-error` (the `Host` cannot end the program).

extern crate alloc;

pub mod errors;
pub mod freed;
pub mod leak;
pub mod options;

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
use freed::{FreedBlock, FreedQueue, REDZONE};
use options::{KeepStacks, LeakCheck, Options};

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
}

struct State {
    errors: ErrorManager,
    freed: FreedQueue,
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
        let live: Option<LiveBlock> = host
            .live_blocks()
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
            let r = self.resolve(host, stack);
            let class_name = match &class_kind {
                KeyKind::InvalidFree | KeyKind::MismatchedFree => "Free",
                KeyKind::FishyValue { .. } => "FishyValue",
                KeyKind::Overlap { .. } => "Overlap",
                KeyKind::BadAlign => "BadAlign",
            };
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
            search.run(&mut |sink| {
                for r in roots {
                    let len = r.end.saturating_sub(r.start);
                    leak::Memory::read_words(&mem, r.start, len, &mut |_, w| sink(w));
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

  (Invalid reads and writes and undefined values need the translation engine's
  instrumentation and are not reported yet.)
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
            redzone: 16,
            check_overlaps: true,
            ..Needs::default()
        }
    }

    fn on_alloc(&self, host: &dyn Host, ev: &Alloc) {
        self.ensure_started(host);
        self.allocs.fetch_add(1, Ordering::Relaxed);
        self.bytes_allocated.fetch_add(ev.size, Ordering::Relaxed);
    }

    fn on_free(&self, host: &dyn Host, ev: &Free) {
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
    }

    fn on_misuse(&self, host: &dyn Host, ev: &MisuseEvent) {
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
        let live = host.live_blocks();
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
    fn below_main_names_are_valgrinds() {
        assert!(is_below_main("__libc_start_call_main"));
        assert!(is_below_main("__libc_start_main.constprop.0"));
        assert!(!is_below_main("main"));
        assert!(!is_below_main("start_thread"));
    }
}
