//! The translation engine: runs the program's own code out of a code cache, so that tools
//! can see (and later instrument) every instruction.
//!
//! This is the in-process *copy-and-annotate* design measured in
//! `shared/reference/engine-study.md` (§3, §4): a library loaded into the program takes
//! the calling thread over, decodes the program's code one basic block at a time with
//! iced-x86, copies the instructions into an executable arena near the original code
//! (patching RIP-relative operands), and replaces control transfers with exits into a
//! dispatcher. Guest return addresses stay on the guest stack; all engine state lives in
//! a per-thread context page addressed through `%gs`.
//!
//! Where to start reading: [`start_from_constructor`] (takeover), [`translate`] (what a
//! block becomes), `dispatch` (what happens between blocks), `signals` (how guest
//! handlers run translated).
//!
//! # Phase-1 scope
//!
//! * Takeover happens at the *return of the caller* of [`start_from_constructor`], the way
//!   DynamoRIO's `dr_app_start` does: when called from a preloaded library's constructor,
//!   the rest of that constructor, the remaining constructors, `_start`, `main`, `atexit`
//!   handlers and `exit` all run from the code cache. What ran before (the dynamic
//!   loader, libc's own initialisation) is not seen.
//! * Threads created with `clone`/`clone3` and `CLONE_VM` start on their own context in the
//!   code cache; `fork`-like clones continue on a copy of the parent's.
//! * One instrumentation client: exact instruction counting ([`Config::count_instructions`]),
//!   counting each `rep` iteration as Valgrind does.
//!
//! * Translations of code that is unmapped (`munmap`, `mremap`) or made non-executable
//!   (`mprotect`) are dropped, so `dlclose` + `dlopen` at the same address runs new code.
//! * Guest signal handlers run translated (see `signals`), including `siglongjmp` out of
//!   a `SIGSEGV` handler; a fault handler sees the guest `RIP` and registers and may
//!   change them (skip the faulting instruction and return).
//! * Self-modifying code and JITs (see `pages`): a block translated from a page the
//!   program can write compares its guest bytes with a stored copy at every entry and is
//!   retranslated when they changed; `mprotect` is performed by the engine so that a page
//!   turning writable loses its unchecked translations. Node.js (V8) and Java (HotSpot,
//!   which patches its code in place) run.
//! * Code in pages that are not executable is not translated: the program jumps there
//!   natively and faults as it would without the engine.
//! * Engine code runs with `EFLAGS.AC` clear whatever the guest set (HotSpot sets it while
//!   probing the CPU; it used to die with `SIGBUS`/`BUS_ADRALN` at start-up).
//!
//! Not handled yet (phase 2 and later):
//! * the `ucontext` of an asynchronous signal that arrives inside engine code in the code
//!   cache (stubs, IBL) holds the host pc (synchronous faults, and signals that arrive
//!   between two guest instructions, show the guest pc and registers); signals that arrive
//!   while the thread is in the engine are re-raised later (with their `siginfo`);
//! * guest `gs:` operands of string instructions, transfers through `gs:` memory and
//!   moves of the `gs` selector (the program is stopped with a report); other `gs:`
//!   operands, `arch_prctl(ARCH_SET_GS/ARCH_GET_GS)` and `rdgsbase`/`wrgsbase` work
//!   against a guest gs base the engine keeps per thread;
//! * thread contexts are never unmapped (a gone thread's context is reused by the next
//!   new thread, so the cost is per *concurrent* thread: ≈16 KiB + 2 MiB of mostly
//!   untouched virtual memory);
//! * a process whose last thread ends with `SYS_exit` instead of `exit_group` gets no
//!   exit report;
//! * `call`/`ret` go through the indirect-branch lookup (no return-stack-buffer
//!   prediction: the main cost on call-heavy code);
//! * static executables and code that runs before the constructor are not seen;
//! * under `gdb`, breakpoints gdb writes into the original (read-only) code are copied
//!   into translations (writes through `ptrace` are not seen; see `pages`).
//!
//! # For the embedder (oxgrind-runtime)
//!
//! From the preloaded library's ELF constructor, after the runtime's own set-up and before
//! returning to the dynamic loader, call [`start_from_constructor`] once with a [`Config`]
//! (`on_exit` is where tools write their reports: it runs on the engine stack just before
//! the program's `exit_group`). Requirements: `#[global_allocator]` is
//! `oxgrind_sys::heap::PrivateHeap`; the library is linked with `-Wl,-z,now`; no other
//! thread exists yet. [`instructions_executed`] gives the running total in counting mode.
//!
//! # Isolation rules
//!
//! Code reachable while guest code runs (the dispatcher, the translator, the signal entry)
//! uses only `core`/`alloc` and [`oxgrind_sys`] raw system calls: no libc call, no `errno`,
//! nothing below the guest's stack pointer. Rust allocations go to the embedding library's
//! `#[global_allocator]`, which must be [`oxgrind_sys::heap::PrivateHeap`] (or another
//! allocator that never calls into the program). The XSAVE state engine code can change is saved around every
//! dispatcher entry (`asm::ENGINE_XSTATE`). One exception to "no libc": the compiler emits calls to `memcpy`,
//! `memset` and `memmove` for Rust code, and in a shared library those bind to libc's.
//! They are stateless and async-signal-safe, and the XSAVE around the engine covers their
//! vector use; the embedding library must be linked with `-z now` so that these calls never
//! go through the dynamic loader's lazy-binding resolver (which takes its lock).
#![cfg_attr(not(test), no_std)]
#![allow(clippy::missing_safety_doc)]

extern crate alloc;

mod asm;
mod cache;
pub mod census;
mod context;
pub mod definedness;
mod describe;
mod dispatch;
pub mod native_try;
mod pages;
pub mod probe;
mod recent_lines;
pub mod shadow;
mod signals;
mod thread_state;
mod trace;
mod trace_checks;
pub mod translate;

use core::sync::atomic::{AtomicBool, Ordering};

pub use dispatch::instructions_executed;
pub use thread_state::{each as each_thread_state, with_current as with_thread_state};
pub use trace::{
    flush_all as flush_all_traces, flush_current as flush_trace, forget_hot_range,
    hold as hold_trace,
};

/// Adds every thread's indexed counters (`Needs::indexed_counters`) into `totals`.
pub fn indexed_counter_totals(totals: &mut [u64]) {
    context::indexed_counter_totals(totals)
}

/// The sum over all threads of the tool's per-thread counter `id` (`Plan::count`).
pub fn counter_total(id: oxgrind_tool::instrument::CounterId) -> u64 {
    if id.0 >= oxgrind_tool::instrument::MAX_COUNTERS {
        return 0;
    }
    context::counter_total(id.0 as usize)
}

/// [`counter_total`] as the calling thread sees it, for a clock read at every event: its own
/// copy exactly, the other threads' as read a bounded number of its own counts ago
/// (`context::counter_total_seen_by`). Successive readings on one thread never decrease;
/// exact while no other thread runs (so with one thread, always).
pub fn counter_total_seen(id: oxgrind_tool::instrument::CounterId) -> u64 {
    if id.0 >= oxgrind_tool::instrument::MAX_COUNTERS {
        return 0;
    }
    match current_context() {
        // SAFETY: current_context is the calling thread's own context; the id is in range.
        Some(ctx) => unsafe { context::counter_total_seen_by(ctx, id.0 as usize) },
        None => context::counter_total(id.0 as usize),
    }
}

/// What the engine should do; fixed at start.
#[derive(Clone, Copy)]
pub struct Config {
    /// Count every guest instruction executed (each `rep` iteration counts once).
    pub count_instructions: bool,
    /// Print the count (and statistics if `stats`) to `out_fd` at `exit_group`.
    pub report_at_exit: bool,
    /// Print translation statistics at exit.
    pub stats: bool,
    /// Descriptor for engine messages. It is duplicated to a high, close-on-exec number at
    /// start, so the program closing its stderr does not silence the engine.
    pub out_fd: i32,
    /// Testing knob: put the code cache far (> 2 GiB) from all code so that every
    /// RIP-relative operand and cross-arena link takes the far path.
    pub far_code_cache: bool,
    /// Called once, on the engine stack, just before the guest's `exit_group` executes
    /// (the process is about to end; the argument is the exit status). Tools write their
    /// reports here. When the program made the call, [`guest_regs_in_tool_call`] answers
    /// with its registers at the `syscall` instruction. The hook may end the process itself
    /// (with another status); if it returns, the program's call goes ahead.
    pub on_exit: Option<unsafe extern "C" fn(i32)>,
    /// Called when a fatal signal arises in code running natively for the embedder
    /// ([`run_native`]): a fault (signal 4, 5, 7, 8 or 11 from the kernel) or an `abort`
    /// (SIGABRT the process sent itself), in the embedder's own work or in a library it
    /// called natively (glibc's allocator on a heap the program corrupted). It cannot reach
    /// the program's handler from there (that would run in the middle of the embedder's
    /// call), and deferring it is no answer: a fault repeats, and `abort` resets the action
    /// and raises again, uncaught. Arguments: the signal, the kernel's siginfo and ucontext
    /// (the native code's registers). The embedder writes its report and ends the process;
    /// returning `true` says the kernel's action is now the default one (a fault then
    /// repeats and ends the process); `false` leaves a fault to the engine's internal
    /// error and an abort deferred.
    pub on_fatal_in_native: Option<unsafe extern "C" fn(i32, *const u8, *mut u8) -> bool>,
    /// The tool that instruments the program: asked about every block before it is
    /// translated, called by its probes (see [`probe`]).
    pub client: Option<probe::Client>,
    /// Give every thread a trace buffer (the tool's `Needs::trace`).
    pub trace: bool,
    /// A recent-lines table per thread (the tool's `Needs::recent_lines`; see
    /// [`oxgrind_tool::instrument::RecentLines`]), with `trace`.
    pub recent_lines: Option<oxgrind_tool::instrument::RecentLines>,
    /// Two lines per slot in `recent_lines` (the tool's `Needs::recent_lines_two_ways`).
    pub recent_lines_two_ways: bool,
    /// With `trace`: the filtered trace probes test each thread's hot ranges first and
    /// count accesses there inline (the tool's `Needs::hot_ranges`; see `trace`).
    pub hot_ranges: bool,
    /// A code-lines table per thread (the tool's `Needs::recent_code_lines`), with `trace`.
    pub recent_code_lines: Option<oxgrind_tool::instrument::RecentLines>,
    /// Lines per slot in `recent_code_lines` (`Needs::recent_code_lines_ways`).
    pub recent_code_lines_ways: u8,
    /// Indexed counters per thread (the tool's `Needs::indexed_counters`).
    pub indexed_counters: u32,
    /// Bytes of tool state per thread (the tool's `Needs::thread_state`).
    pub thread_state: u32,
    /// Track definedness (the tool's `Needs::definedness`; see [`definedness`]).
    pub definedness: bool,
    /// With `definedness`: also track origins (the tool's `Needs::origins`; see
    /// [`definedness::enable_origins`]).
    pub origins: bool,
    /// Called on the engine stack, with the thread stopped, after each guest `mmap`,
    /// `munmap`, `mremap` and `brk` (which the engine then performs itself), and after each
    /// `mprotect` and `pkey_mprotect` (which it always performs): the page-level view of
    /// memory (Massif's `--pages-as-heap`; how each mapping got its permissions, which
    /// Memcheck's addressability follows), without a seccomp trap, which cannot work under
    /// the engine (the guest's system calls run from the code cache). Like a probe
    /// callback, it must not call into the program or block on a lock guest code may hold.
    pub on_memory_syscall: Option<fn(&MemorySyscall)>,
    /// Called like `on_memory_syscall`, after each guest system call that creates or closes
    /// file descriptors (open, openat, openat2, creat, socket, socketpair, accept, accept4,
    /// pipe, pipe2, dup, dup2, dup3, fcntl, close, close_range): `--track-fds`, which needs
    /// the descriptor a call returned and the stack that made it. The call itself runs in
    /// the code cache as any other: with this set, every `syscall` block comes back to the
    /// dispatcher with its result (`translate::Options::syscall_returns`), so a call that
    /// blocks (accept, open of a FIFO) can be interrupted by a signal whose handler runs,
    /// the call restarting (`SA_RESTART`) or failing with EINTR as natively.
    pub on_fd_syscall: Option<fn(&MemorySyscall)>,
    /// Call the client's `Tool::before_syscall` before each of the program's system calls
    /// (the tool's `Needs::before_syscalls`), from the same place in the dispatcher as the
    /// definedness checks of syscall arguments.
    pub before_syscalls: bool,
    /// Client requests the embedder answers for every tool, with or without a client
    /// (`VALGRIND_PRINTF`, `VALGRIND_STACK_REGISTER`, ...): asked before the tool, on the
    /// engine stack; `Some(v)` is the request's result. `RUNNING_ON_VALGRIND` is the
    /// engine's own (1).
    pub core_requests: Option<fn(&[u64; 6], &oxgrind_tool::instrument::GuestRegs) -> Option<u64>>,
    /// Called after each block is translated, with the cache lock held: the guest pc, and
    /// the host code's address and length (the runtime's perf map for profiling the code
    /// cache). Must not run guest code nor translate.
    pub on_translated: Option<fn(guest_pc: u64, host: u64, len: u64)>,
    /// With no `client`: functions the embedder replaces all the same (asked once per
    /// translated block start, as `probe::Embedder::redirect` is with a client). The runtime
    /// sends its allocator entry points straight to glibc's when the tool wants no
    /// allocator events (`--tool=none`), as `Embedder::redirect` does for an instrumenting
    /// tool that wants none (Cachegrind), and a program's own allocation functions to its
    /// hooks when the tool wants them (Massif).
    pub redirect: Option<fn(pc: u64) -> Option<u64>>,
}

/// A guest system call the engine has just performed, or seen come back, for the embedder (see
/// [`Config::on_memory_syscall`] and [`Config::on_fd_syscall`]).
#[derive(Clone, Copy, Debug)]
pub struct MemorySyscall {
    /// The system call number (`mmap` 9, `munmap` 11, `brk` 12, `mremap` 25, `open` 2, ...).
    pub nr: u64,
    /// rdi, rsi, rdx, r10, r8, r9.
    pub args: [u64; 6],
    /// What the kernel returned (negative: `-errno`).
    pub result: i64,
    /// The guest's registers before the call; `rip` is the `syscall` instruction.
    pub regs: oxgrind_tool::instrument::GuestRegs,
}

impl core::fmt::Debug for Config {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Config")
            .field("count_instructions", &self.count_instructions)
            .field("report_at_exit", &self.report_at_exit)
            .field("stats", &self.stats)
            .field("out_fd", &self.out_fd)
            .field("far_code_cache", &self.far_code_cache)
            .field("client", &self.client.is_some())
            .field("trace", &self.trace)
            .field("recent_lines", &self.recent_lines)
            .field("recent_code_lines", &self.recent_code_lines)
            .field("recent_lines_two_ways", &self.recent_lines_two_ways)
            .field("recent_code_lines_ways", &self.recent_code_lines_ways)
            .field("indexed_counters", &self.indexed_counters)
            .field("thread_state", &self.thread_state)
            .field("on_memory_syscall", &self.on_memory_syscall.is_some())
            .field("on_fd_syscall", &self.on_fd_syscall.is_some())
            .field("on_translated", &self.on_translated.is_some())
            .finish()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            count_instructions: false,
            report_at_exit: false,
            stats: false,
            out_fd: 2,
            far_code_cache: false,
            on_exit: None,
            on_fatal_in_native: None,
            client: None,
            trace: false,
            recent_lines: None,
            hot_ranges: false,
            recent_code_lines: None,
            recent_lines_two_ways: false,
            recent_code_lines_ways: 0,
            indexed_counters: 0,
            thread_state: 0,
            definedness: false,
            origins: false,
            on_memory_syscall: None,
            on_fd_syscall: None,
            on_translated: None,
            before_syscalls: false,
            core_requests: None,
            redirect: None,
        }
    }
}

/// Why the engine did not start (the program then simply continues natively).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StartError {
    /// [`start_from_constructor`] was already called in this process.
    AlreadyStarted,
    /// The CPU or kernel lacks XSAVE, or its state does not fit the context page.
    NoXsave,
    /// `mmap` failed for the engine's own memory.
    NoMemory,
    /// `arch_prctl(ARCH_SET_GS)` failed (errno).
    SetGs(i32),
}

static STARTED: AtomicBool = AtomicBool::new(false);

fn xsave_ok() -> bool {
    // cpuid is available on every x86-64 CPU.
    let l1 = core::arch::x86_64::__cpuid(1);
    if l1.ecx & (1 << 27) == 0 {
        return false; // OSXSAVE
    }
    // Leaf 0xD exists when XSAVE is enabled (checked above).
    let d = core::arch::x86_64::__cpuid_count(0xD, 0);
    (d.ebx as usize) <= context::XSAVE_SIZE
}

/// Blocks translated ahead from each of the private heap's entry points: enough for their
/// whole bodies and the helpers they call with a lock held (measured: the slow paths of
/// `alloc` are a few hundred blocks away breadth first).
const PREWARM_BLOCKS: usize = 1500;

/// Translates the private heap's entry points before the program runs (see
/// `CodeCache::prewarm`): the embedder's allocator is `oxgrind_sys::heap::PrivateHeap`, whose
/// code runs translated and must not need the translator while it holds its locks.
fn prewarm_allocator() {
    use core::alloc::{GlobalAlloc, Layout};
    use oxgrind_sys::heap::PrivateHeap;
    let alloc: unsafe fn(&PrivateHeap, Layout) -> *mut u8 = <PrivateHeap as GlobalAlloc>::alloc;
    let dealloc: unsafe fn(&PrivateHeap, *mut u8, Layout) = <PrivateHeap as GlobalAlloc>::dealloc;
    let realloc: unsafe fn(&PrivateHeap, *mut u8, Layout, usize) -> *mut u8 =
        <PrivateHeap as GlobalAlloc>::realloc;
    if let Some(cache) = dispatch::CACHE.lock().as_mut() {
        for f in [
            alloc as *const () as u64,
            dealloc as *const () as u64,
            realloc as *const () as u64,
        ] {
            cache.prewarm(f, PREWARM_BLOCKS);
        }
    }
}

/// Takes the calling thread over: when this function returns, its caller (and everything
/// after it, including other threads it creates) runs from the code cache.
///
/// The runtime calls this from its ELF constructor (`.init_array`) of the preloaded
/// library, once its own initialisation is done and before returning to the dynamic
/// loader; the engine then sees the remaining constructors, `main` and exit processing.
/// Returns `Ok(())` under the engine, or an error with the program still native.
///
/// # Safety
/// * Call at most once per process, from the main thread, while no other thread exists.
/// * The embedding library's global allocator must never call the program's code
///   (use [`oxgrind_sys::heap::PrivateHeap`]).
/// * The caller must not be running on a signal stack or inside a signal handler.
#[inline(never)]
pub unsafe fn start_from_constructor(config: Config) -> Result<(), StartError> {
    if STARTED.swap(true, Ordering::AcqRel) {
        return Err(StartError::AlreadyStarted);
    }
    if !xsave_ok() {
        return Err(StartError::NoXsave);
    }
    asm::detect_xsaveopt();
    let out_fd = oxgrind_sys::raw::dup_high(config.out_fd, 700).unwrap_or(config.out_fd);
    {
        let mut g = dispatch::GLOBAL.lock();
        g.out_fd = out_fd;
        g.count = config.count_instructions;
        g.report = config.report_at_exit;
        g.stats = config.stats;
        g.on_exit = config.on_exit;
        g.on_fatal_in_native = config.on_fatal_in_native;
        g.on_memory_syscall = config.on_memory_syscall;
        g.on_fd_syscall = config.on_fd_syscall;
        g.before_syscalls = config.before_syscalls && config.client.is_some();
        g.core_requests = config.core_requests;
    }
    cache::set_on_translated(config.on_translated);
    *dispatch::CACHE.lock() = Some(cache::CodeCache::new(
        translate::Options {
            count: config.count_instructions,
            check: false,
            instrument: config.client.is_some(),
            syscall_returns: config.on_fd_syscall.is_some(),
        },
        config.far_code_cache,
    ));
    probe::set_client(config.client);
    if config.client.is_none() {
        translate::set_plain_redirect(config.redirect);
    }
    if config.definedness && config.client.is_some() && !definedness::enable() {
        let mut w = oxgrind_sys::fd::FdWriter::new(out_fd);
        let _ = core::fmt::Write::write_str(
            &mut w,
            "oxgrind-engine: no memory for the definedness shadow; definedness is not tracked\n",
        );
        w.flush();
    }
    if config.definedness && config.origins && definedness::enabled() {
        definedness::enable_origins();
    }
    if config.trace && config.client.is_some() {
        trace::enable();
        if let Some(r) = config.recent_lines {
            recent_lines::configure(recent_lines::Table::Data, r, config.recent_lines_two_ways);
        }
        if let Some(r) = config.recent_code_lines {
            recent_lines::configure_code(r, config.recent_code_lines_ways);
        }
        if config.hot_ranges {
            trace::enable_hot();
        }
    }
    thread_state::configure(config.thread_state);
    if config.client.is_some() {
        context::configure_indexed_counters(config.indexed_counters);
    }
    probe::prepare();
    prewarm_allocator();
    let ctx =
        context::new_ctx(asm::oxg_dispatch as *const () as u64).ok_or(StartError::NoMemory)?;
    context::set_gs(ctx).map_err(StartError::SetGs)?;
    // SAFETY: ctx is the fresh context just made this thread's.
    context::register_alt_stack(unsafe { &*ctx });
    signals::adopt_installed_handlers();
    signals::install_trap_entry();
    // SAFETY: gs points at ctx; oxg_attach saves this thread's registers and continues at
    // its return address from the code cache (it "returns" with the translated code).
    unsafe { asm::oxg_attach(ctx) };
    RUNNING.store(true, Ordering::Release);
    Ok(())
}

/// Set once the calling thread of [`start_from_constructor`] runs translated: from then
/// on every thread of the process runs under the engine with `%gs` at its context.
static RUNNING: AtomicBool = AtomicBool::new(false);

/// The engine's own copy of its output descriptor (duplicated at or above 700 at start), which
/// is not the program's (`--track-fds` leaves it out); `None` before the engine starts or if
/// it could not duplicate.
pub fn own_fd() -> Option<i32> {
    let fd = dispatch::GLOBAL.lock().out_fd;
    (fd >= 700).then_some(fd)
}

/// Guest instructions the calling thread has executed (counting mode; 0 when the engine is
/// not running). With [`set_thread_instructions`], lets the embedder leave its own work
/// (an allocator hook, say) out of the program's count.
pub fn thread_instructions() -> u64 {
    if !RUNNING.load(Ordering::Acquire) {
        return 0;
    }
    // SAFETY: the engine runs, so this thread runs translated with %gs at its context;
    // the routine's gs: operand is left as it is by the translator (`asm::native_gs`).
    unsafe { asm::oxg_count_get() }
}

/// The calling thread's context, when the engine runs (every thread then has one).
pub(crate) fn current_context() -> Option<*mut context::ThreadCtx> {
    if !RUNNING.load(Ordering::Acquire) {
        return None;
    }
    // SAFETY: as in thread_instructions: %gs is this thread's context, read through a
    // routine whose gs: operand the translator leaves alone.
    Some(unsafe { asm::oxg_ctx_get() })
}

/// The guest registers of the tool call in progress on the calling thread (a probe, a
/// system call's check, a fault, a definedness report), if there is one. The tool then runs
/// on the engine's stack: the embedder describes the program's stack (which thread's, which
/// frame an address is in) from these, not from its own stack pointer.
pub fn guest_regs_in_tool_call() -> Option<oxgrind_tool::instrument::GuestRegs> {
    let ctx = current_context()?;
    // SAFETY: the context is this thread's and never unmapped; a non-zero slot is a loan
    // for the length of the call that is running this code (`probe::ToolRegsLent` clears
    // it before the call returns), read on this thread.
    unsafe {
        let p = (*ctx).tool_regs.load(Ordering::Relaxed);
        (p != 0).then(|| probe::lent_regs(&*ctx, p))
    }
}

/// The program's registers of the calling thread when it was interrupted (by a signal
/// whose handler calls this) at stack pointer `sp` on its own engine stack: those of the
/// tool call in progress ([`guest_regs_in_tool_call`]), or else those the engine saved in
/// the context when it left the program's code (the dispatcher and the gates save every
/// general register before switching stacks). `None` when `sp` is not on the engine
/// stack: the interrupted registers are then the program's own (or the runtime's, on the
/// program's stack).
pub fn guest_regs_at_engine_sp(sp: u64) -> Option<oxgrind_tool::instrument::GuestRegs> {
    let ctx = current_context()?;
    // SAFETY: the context is this thread's and never unmapped; plain reads.
    let (top, gregs, flags, pc) = unsafe {
        (
            (*ctx).estack + 64,
            (*ctx).gregs,
            (*ctx).gflags,
            (*ctx).next_pc,
        )
    };
    if !(top - context::ENGINE_STACK as u64..top).contains(&sp) {
        return None;
    }
    guest_regs_in_tool_call().or(Some(oxgrind_tool::instrument::GuestRegs {
        gpr: gregs,
        rip: pc,
        rflags: flags,
    }))
}

/// Runs `f` natively, out of the code cache, and returns when it has.
///
/// The embedder's own code runs translated when a program's thread calls it (an allocator
/// hook, the report at exit); work of its own that is long and sees nothing of the program
/// (symbolising: inflating and parsing debug sections) is many times slower there than
/// natively. Under the engine, `f` runs as a clean call does: on the thread's engine stack
/// (1 MiB), with the guest state saved, signals deferred until it returns, and
/// [`guest_regs_in_tool_call`] answering with the caller's registers as the call will return
/// to it (pc at the return address: an unwinder starts in the caller); its system calls are
/// not the program's (the engine does not see them), nor are the libc functions it calls
/// (no probe, no redirection). Outside the engine, or already native (a tool call, the
/// dispatcher), `f` is simply called. `f` must not call into the program, and must not
/// change the guest's code or its signal handling.
pub fn run_native(f: &mut dyn FnMut()) {
    unsafe extern "C" fn call(data: *mut u8) {
        // SAFETY: `data` is the `&mut &mut dyn FnMut()` below, alive for the whole call.
        let f = unsafe { &mut *(data as *mut &mut dyn FnMut()) };
        f();
    }
    let mut f = f;
    // SAFETY: `oxg_run_native` calls `call(data)`, natively (a tail call) or, when reached
    // from translated code, from the dispatcher (`probe::KIND_NATIVE`).
    unsafe { asm::oxg_run_native(&mut f as *mut &mut dyn FnMut() as *mut u8, call) }
}

/// An entry point of the embedder's whose whole work runs natively, out of the code cache,
/// when the program calls it from translated code: the entry point puts a function of up
/// to six integer arguments (`unsafe extern "C" fn(u64, u64, u64, u64, u64, u64) -> u64`)
/// in `r11`, leaves its arguments in `rdi`, `rsi`, `rdx`, `rcx`, `r8`, `r9` and `rsp` at its
/// caller's return address (the entry point was called, it jumps here). Natively this is
/// a tail call to the function; translated, once [`set_native_entries`] said so, the
/// function is called natively as [`run_native`] calls (engine stack, signals deferred,
/// [`guest_regs_in_tool_call`] answering with the caller's registers as the call returns
/// to it), its result is the guest's `rax`, and the caller continues at its return
/// address. No instruction of the function is counted or seen by the tool: the call costs
/// the caller the instructions of the entry point before the jump, and one `ret`.
///
/// Why: an allocator hook's own translated code (entry, closures, the hand-off to
/// [`run_native`]) cost the program about 300 translated instructions per call before its
/// work went native (Massif's `--time-unit=i` on an allocation loop: a fifth of its time).
pub use asm::oxg_native_entry as native_entry;

/// Whether translated code calls [`native_entry`]'s function natively.
static NATIVE_ENTRIES: AtomicBool = AtomicBool::new(false);

/// Makes [`native_entry`] run its function natively from translated code (`true`), or
/// translate it as any code (`false`, the default: a tool that sees the embedder's
/// allocator work as the program's). Set before the engine starts.
pub fn set_native_entries(on: bool) {
    NATIVE_ENTRIES.store(on, Ordering::Relaxed);
}

pub(crate) fn native_entries() -> bool {
    NATIVE_ENTRIES.load(Ordering::Relaxed)
}

/// Sets the calling thread's instruction count (see [`thread_instructions`]).
pub fn set_thread_instructions(v: u64) {
    if !RUNNING.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: as in thread_instructions; only this thread writes its own counter.
    unsafe { asm::oxg_count_set(v) }
}

/// Adds `delta` (negative: subtracts) to the calling thread's instruction count: what
/// [`thread_instructions`] then [`set_thread_instructions`] do around work that counts
/// nothing (run natively), without their two sums over the count's words.
pub fn add_thread_instructions(delta: i64) {
    if !RUNNING.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: as in thread_instructions; only this thread writes its own counter. The sum
    // wraps, as the count's words do.
    unsafe { asm::oxg_count_add(delta as u64) }
}
