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
//! Locking: one mutex guards the error manager and the freed-block queue, which each thread
//! feeds in batches (`freed::FreedBatches`: the mutex once per 16 frees); `on_alloc` takes
//! no lock (counters are atomics), `on_free` takes it briefly. Errors are rendered (stacks
//! symbolized) under the lock, and only for a new context. `fini` never waits for ever on
//! it, since it may run in a fatal-signal handler.
//!
//! Invalid reads and writes of heap memory: the allocator events keep an addressability
//! shadow ([`shadow`]); [`instrument`](Tool::instrument) asks the engine for a probe on
//! every instruction that may address the heap, and [`on_accesses`](Tool::on_accesses)
//! checks each access against the shadow (one load per granule when all is well), then
//! reports as Memcheck does.
//!
//! Where things are: `events` (allocator events and runtime-detected misuse), `access`
//! (probes and the access check), `describe` (what an address is), `report` (preamble,
//! XML stream, the path of every error into [`errors`]), `leak_report` (the leak search's
//! verdicts as loss records and LEAK SUMMARY), `fatal` (the fatal-signal block); this file
//! holds the tool's state and its `Tool` implementation, which only dispatches.
//!
//! Outside the heap (`outside_heap`): accesses below the stack pointer's red zone (through
//! `[rsp + d]` operands, and through pointers into dead frames), and accesses to unmapped
//! memory, reported when they fault.

extern crate alloc;

mod access;
mod client;
mod definedness;
mod describe;
pub mod errors;
mod events;
mod fatal;
pub mod freed;
mod gone_threads;
pub mod leak;
mod leak_report;
mod mempool;
pub mod options;
mod outside_heap;
mod report;
pub mod shadow;
mod syscall;
mod totals;

pub use shadow::shadow_base;

use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use oxgrind_formats::memcheck_text as text;
use oxgrind_formats::memcheck_xml as xml;
use oxgrind_formats::suppressions::{self as supp, SuppParseError};
use oxgrind_tool::{
    Addr, Alloc, Exit, Free, Host, LiveBlock, MisuseEvent, Needs, OptionError, Tool,
};

use access::PcClass;
use errors::{ErrorManager, Output};
use freed::{FreedBatches, FreedQueue};
use options::Options;
use oxgrind_tool::instrument::{Access, GuestRegs, Insn, Plan, ShadowSpec};
use oxgrind_tool::sync::SpinLock;
use report::reporting;

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
    /// HEAP SUMMARY's allocs, frees and bytes allocated, counted per thread.
    totals: totals::HeapTotals,
    state: Mutex<State>,
    /// Each thread's latest frees, on their way into `State::freed`.
    batches: FreedBatches,
    /// The engine asked for probes: the shadow is kept from then on. Before, no one reads
    /// it, and events may come from a host that is no real process (tests).
    probing: AtomicBool,
    /// Blocks of the program's own allocators, announced by client requests
    /// (`VALGRIND_MALLOCLIKE_BLOCK`): reported, described and leak-checked as heap blocks.
    client_blocks: SpinLock<Vec<LiveBlock>>,
    /// The stacks of client requests that made or freed those blocks: frame 0 is the
    /// program's code, not our allocator (see [`Memcheck::resolve`]).
    client_stacks: SpinLock<Vec<oxgrind_tool::StackId>>,
    /// The program's memory pools and their chunks (`VALGRIND_CREATE_MEMPOOL` ...).
    pools: SpinLock<mempool::Pools>,
    /// What the code at each pc that made a bad access is ([`PcClass`]), found once.
    pc_classes: SpinLock<Option<std::collections::HashMap<u64, PcClass>>>,
    /// Where exited threads last were on their stacks: no leak roots below.
    gone: gone_threads::GoneThreads,
}

pub(crate) struct State {
    errors: ErrorManager,
    /// Recently freed blocks: for descriptions, and which of them go back to glibc when
    /// (the only freed-block queue: the runtime keeps the memory while we hold it).
    freed: FreedQueue,
    xml: String,
    xml_started: bool,
    finished: bool,
    /// OS thread ids → Valgrind-style thread numbers (main thread 1, then in order of
    /// first appearance).
    threads: Vec<i32>,
    /// The leak check's totals, for the core's `--max-leaked` budget ([`Tool::leaked`]).
    leaked: Option<oxgrind_tool::Leaked>,
    /// What the last leak search found, for the next one's changes and for
    /// `VALGRIND_COUNT_LEAKS`.
    last_leak: leak_report::LastLeakSearch,
}

impl Default for Memcheck {
    fn default() -> Self {
        Self::new()
    }
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
                leaked: None,
                last_leak: Default::default(),
                xml_started: false,
                finished: false,
                threads: Vec::new(),
            }),
            batches: FreedBatches::new(opts.freelist_vol),
            opts,
            supp_texts: Vec::new(),
            started: AtomicBool::new(false),
            totals: totals::HeapTotals::default(),
            probing: AtomicBool::new(false),
            client_blocks: SpinLock::new(Vec::new()),
            client_stacks: SpinLock::new(Vec::new()),
            pools: SpinLock::new(mempool::Pools::default()),
            pc_classes: SpinLock::new(None),
            gone: gone_threads::GoneThreads::new(),
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
            self.opts.core.num_callers
        };
        let entries = supp::parse(name, contents, "Memcheck", depth)?;
        self.state_mut().errors.add_suppressions(entries);
        Ok(())
    }

    pub(crate) fn state_mut(&mut self) -> &mut State {
        // A poisoned lock only means a panic elsewhere; the data is still what we have.
        self.state.get_mut().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state lock, given up after a long while: another thread may hold it for a
    /// moment (it is released by every event), the interrupted thread never.
    pub(crate) fn lock_for_fini(&self) -> Option<std::sync::MutexGuard<'_, State>> {
        for _ in 0..200_000 {
            match self.state.try_lock() {
                Ok(g) => return Some(g),
                Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
            }
        }
        None
    }
    /// The exit status to force when the program ends normally: `--error-exitcode=N` if
    /// errors were counted. Call after `fini`.
    pub fn exit_status(&self) -> Option<i32> {
        let st = self.lock();
        (self.opts.core.error_exitcode != 0 && st.errors.any_errors())
            .then_some(self.opts.core.error_exitcode)
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
    --undef-value-errors=no|yes      check for undefined value errors [yes]
    --track-origins=no|yes           show origins of undefined values? [no]
    --expensive-definedness-checks=no|auto|yes
                                     accepted; the rules are always as precise as
                                     Memcheck's =yes (add, sub, ==, != exact)
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

    fn core_options(&mut self, core: &oxgrind_tool::CoreView) {
        self.opts.apply_core(core);
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
        self.batches = FreedBatches::new(vol);
        let fatal = |e: SuppParseError| OptionError(e.fatal_lines().join("\n"));
        if self.opts.core.default_suppressions {
            self.load_suppressions(DEFAULT_SUPPRESSIONS_NAME, DEFAULT_SUPPRESSIONS)
                .map_err(fatal)?;
        }
        for name in self.opts.core.suppressions.clone() {
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
            stack_depth: self.opts.core.num_callers,
            free_stacks: true,
            freelist_vol: self.opts.freelist_vol,
            page_events: false,
            // A fault in a `PROT_NONE` mapping is an error only where `mmap` made it so
            // (`outside_heap.rs`).
            mapping_access: true,
            // Valgrind's default --redzone-size for Memcheck.
            redzone: shadow::REDZONE,
            check_overlaps: true,
            // Probes on the program's memory accesses: Invalid read / Invalid write.
            instrument: true,
            // A-bits of the heap, one byte per granule: the probes' inline filter.
            shadow: Some(ShadowSpec::BYTE_PER_GRANULE_PREFIXED),
            // VALGRIND_MAKE_MEM_NOACCESS, CHECK_MEM_IS_ADDRESSABLE, MALLOCLIKE_BLOCK, ...
            client_requests: true,
            // V bits (`--undef-value-errors`, yes by default).
            definedness: self.opts.undef_value_errors,
            // Where undefined values came from (`--track-origins=yes`).
            origins: self.opts.undef_value_errors && self.opts.track_origins,
            // Syscall param ... points to unaddressable byte(s).
            before_syscalls: true,
            // glibc's allocator runs natively in a heap event, as Valgrind's own allocator
            // runs outside the program: its chunk headers and links are not the program's
            // accesses, and a block's V bits are set by the event (`definedness.rs`).
            allocator_unseen: true,
            ..Needs::default()
        }
    }

    fn on_alloc(&self, host: &dyn Host, ev: &Alloc) -> u32 {
        self.alloc_event(host, ev);
        0
    }

    fn client_request(&self, host: &dyn Host, args: &[u64; 6], regs: &GuestRegs) -> Option<u64> {
        self.client_request_event(host, args, regs)
    }

    fn on_free(&self, host: &dyn Host, ev: &Free) {
        let giving = self.free_event(host, ev);
        self.give_back(host, giving);
    }

    fn on_realloc(&self, host: &dyn Host, old: &Free, new: &Alloc) -> u32 {
        let giving = self.free_event_keeping_vbits(host, old);
        self.alloc_event(host, new);
        self.definedness_realloc(host, old, new);
        self.give_back(host, giving);
        0
    }

    fn on_undefined(&self, host: &dyn Host, regs: &GuestRegs, what: &oxgrind_tool::Undefined) {
        self.undefined_event(host, regs, what)
    }

    fn before_syscall(&self, host: &dyn Host, nr: u64, args: &[u64; 6], regs: &GuestRegs) {
        self.gone.before_syscall(host, nr, args, regs.rsp());
        self.syscall_event(host, nr, args, regs)
    }

    fn instrument(&self, pc: Addr, block: &[Insn], plan: &mut Plan) {
        self.instrument_block(pc, block, plan)
    }

    fn on_accesses(&self, host: &dyn Host, accesses: &[Access], regs: &GuestRegs, data: u64) {
        if data & outside_heap::BELOW_SP_PROBE != 0 {
            self.below_sp_event(host, accesses, regs, data & 0xffff_ffff)
        } else {
            self.accesses_event(host, accesses, regs, data)
        }
    }

    fn on_memory_fault(
        &self,
        host: &dyn Host,
        fault: &oxgrind_tool::MemoryFault,
        accesses: &[Access],
        regs: &GuestRegs,
    ) {
        self.memory_fault_event(host, fault, accesses, regs)
    }

    fn on_misuse(&self, host: &dyn Host, ev: &MisuseEvent) {
        self.misuse_event(host, ev)
    }

    fn exit_status_override(&self) -> Option<i32> {
        self.exit_status()
    }

    fn leaked(&self) -> Option<oxgrind_tool::Leaked> {
        self.lock().leaked
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
        self.fatal_signal_block(host, &mut st, &mut out, exit);
        if self.opts.core.xml {
            self.start_xml(&mut st, host);
            st.xml.push('\n');
            xml::status(&mut st.xml, "FINISHED", host.elapsed_ms());
            // --track-fds's stacks, which Valgrind writes here.
            if let Some(stacks) = host.track_fds_xml() {
                st.xml.push_str(&stacks);
            }
        } else if self.opts.core.verbosity > 0 {
            text::line(&mut out.text, pid, "");
            let in_use: u64 = live.iter().map(|b| b.size).sum();
            let (allocs, frees, bytes) = self.totals.sum();
            text::heap_summary(
                &mut out.text,
                pid,
                in_use,
                live.len() as u64,
                allocs,
                frees,
                bytes,
            );
        }
        self.leak_check(host, &mut st, &mut out, &live);
        st.errors.finish(&mut out);
        if !out.text.is_empty() {
            host.log(&out.text);
        }
        if self.opts.core.xml {
            let body = std::mem::take(&mut out.xml);
            st.xml.push_str(&body);
            xml::footer(&mut st.xml);
            self.flush_xml(&mut st, host);
        }
    }
}
