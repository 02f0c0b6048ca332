//! However the process ends, the user gets the report.
//!
//! | how it ends | where we write the report |
//! |---|---|
//! | return from `main`, `exit()` | our destructor, after the program's `atexit` handlers |
//! | `_exit`, `_Exit` | our replacements of them |
//! | a fatal signal (Ctrl+C, SIGTERM, `abort()`, a crash) | our handler, then the signal is re-raised with its default action so the exit status is the one a shell expects |
//! | `execve` and friends | our replacements, before the image is replaced |
//!
//! Fatal-signal handlers are installed only for signals whose disposition is the default,
//! and the program never sees them: our `sigaction`/`signal` report the program's own
//! settings, and once the program installs a handler of its own, the signal is its business.
//!
//! `fork` goes through an [`EventGate`]: before the fork every allocator event in flight on
//! other threads finishes and new ones wait, so the child never inherits a lock held by a
//! thread that does not exist in it.

use core::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

use oxgrind_sys::raw;
use oxgrind_sys::raw::{
    KernelSigaction, SA_NODEFER, SA_ONSTACK, SA_RESTART, SA_RESTORER, SA_SIGINFO, SIG_DFL,
};
use oxgrind_sys::syscall::syscall4;
use oxgrind_tool::Exit;

use crate::guard::{self, Entered};
use crate::host::HOST;
use crate::libc_api;
use crate::state::{self, BLOCKS, STACKS};

// ---------------------------------------------------------------------------------------
// The fork gate.
//
// Each thread has its own "inside an event" flag, registered once; closing the gate sets
// GATE_CLOSED and waits until every flag is clear. A thread entering sets its flag, then
// (after a full fence) checks the gate: either it sees the gate closed and backs off, or the
// closer sees its flag. One shared counter instead cost two contended atomic operations per
// allocation, which dominated multi-threaded programs.
//
// The full fence is asymmetric where the kernel allows (Linux 4.14's membarrier
// MEMBARRIER_CMD_PRIVATE_EXPEDITED, registered at set-up and again in each forked child): the
// entering thread only keeps the compiler from reordering, and the closer, which is rare
// (fork, exit), has the kernel run a full barrier on every thread of the process between its
// store and its reading of the flags. The fence on each event drained the store buffer
// behind the program's own stores: about 5% of Massif's time on four allocating threads.

static GATE_CLOSED: AtomicBool = AtomicBool::new(false);
/// Set (at set-up, before any gate can close) when the closer issues the process-wide
/// barrier, so entering threads need none of their own.
static ASYMMETRIC_FENCE: AtomicBool = AtomicBool::new(false);

const SYS_MEMBARRIER: usize = 324;
const MEMBARRIER_CMD_QUERY: usize = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: usize = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: usize = 1 << 4;

/// Registers the process for private expedited membarriers; whether it can issue them.
fn register_membarrier() -> bool {
    let want = MEMBARRIER_CMD_PRIVATE_EXPEDITED | MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED;
    // SAFETY: membarrier takes two integer arguments and touches no memory of ours.
    let supported =
        unsafe { oxgrind_sys::syscall::syscall2(SYS_MEMBARRIER, MEMBARRIER_CMD_QUERY, 0) };
    supported >= 0
        && supported as usize & want == want
        // SAFETY: as above.
        && unsafe { oxgrind_sys::syscall::syscall2(SYS_MEMBARRIER, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0) }
            == 0
}

/// Chooses how entering threads fence: called where no other thread of the runtime can be
/// entering or closing the gate (set-up, a forked child before it runs on).
fn choose_gate_fence() {
    ASYMMETRIC_FENCE.store(register_membarrier(), Ordering::Release);
}

/// The closer's side of the fence: after it, every thread's flag store that came before its
/// own reading of GATE_CLOSED is visible here.
fn gate_fence_for_closer() {
    core::sync::atomic::fence(Ordering::SeqCst);
    if !ASYMMETRIC_FENCE.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: as in `register_membarrier`.
    let r = unsafe {
        oxgrind_sys::syscall::syscall2(SYS_MEMBARRIER, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0)
    };
    if r != 0 {
        // Cannot happen once registered (the registration is per process and kept across
        // fork). Entering threads fence fully from now on; the ones already past their
        // check published their flag without one: give their stores time to drain (far
        // longer than a store buffer holds one) before the caller reads the flags.
        ASYMMETRIC_FENCE.store(false, Ordering::SeqCst);
        for _ in 0..64 {
            raw::sched_yield();
        }
    }
}
static FLAGS: oxgrind_sys::lock::SpinLock<Vec<&'static AtomicBool>> =
    oxgrind_sys::lock::SpinLock::new(Vec::new());

/// The calling thread's gate flag (kept in `guard::ThreadState`), registered on first use.
#[inline]
fn flag_of(t: &guard::ThreadState) -> &'static AtomicBool {
    match t.gate_flag.get() {
        Some(flag) => flag,
        None => register_flag(t),
    }
}

/// A gate flag on cache lines of its own: each event writes its thread's flag twice, and
/// flags allocated one after the other shared a line, which then went from core to core at
/// every event of threads allocating at once.
#[repr(align(128))]
struct PaddedFlag(AtomicBool);

#[cold]
fn register_flag(t: &guard::ThreadState) -> &'static AtomicBool {
    let flag: &'static AtomicBool = &Box::leak(Box::new(PaddedFlag(AtomicBool::new(false)))).0;
    FLAGS.lock().push(flag);
    t.gate_flag.set(Some(flag));
    flag
}

fn my_flag() -> &'static AtomicBool {
    flag_of(guard::this_thread())
}

/// Held for the duration of one allocator event.
pub struct EventGate(&'static AtomicBool);

impl EventGate {
    #[inline]
    pub fn enter() -> EventGate {
        Self::enter_for(guard::this_thread())
    }

    /// [`EventGate::enter`] with the calling thread's state already at hand.
    #[inline]
    pub fn enter_for(t: &guard::ThreadState) -> EventGate {
        let flag = flag_of(t);
        loop {
            flag.store(true, Ordering::Relaxed);
            if ASYMMETRIC_FENCE.load(Ordering::Relaxed) {
                // The closer's membarrier orders this store before the load below.
                core::sync::atomic::compiler_fence(Ordering::SeqCst);
            } else {
                core::sync::atomic::fence(Ordering::SeqCst);
            }
            if !GATE_CLOSED.load(Ordering::Relaxed) {
                return EventGate(flag);
            }
            flag.store(false, Ordering::Release);
            while GATE_CLOSED.load(Ordering::Acquire) {
                raw::sched_yield();
            }
        }
    }
}

impl Drop for EventGate {
    #[inline]
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// In a forked child: the other threads' flags belong to threads that do not exist here. One
/// can read "inside an event" for ever: its thread had set it, about to see the closed gate
/// and back off, when `close_gate` had already passed it and the fork was made (the child
/// of the Rust program under Memcheck then spun in `close_gate` at exit).
fn forget_other_threads_flags() {
    let mine = my_flag();
    let mut flags = FLAGS.lock();
    flags.retain(|f| core::ptr::eq(*f, mine));
    if flags.is_empty() {
        flags.push(mine);
    }
}

/// Closes the gate: allocator events in flight finish, new ones wait. Afterwards no other
/// thread is inside oxgrind's code, so none holds one of its locks.
pub fn close_gate() {
    GATE_CLOSED.store(true, Ordering::Relaxed);
    gate_fence_for_closer();
    let mine = my_flag() as *const AtomicBool;
    let flags = FLAGS.lock().clone();
    for f in flags {
        if core::ptr::eq(f, mine) {
            continue;
        }
        while f.load(Ordering::Acquire) {
            raw::sched_yield();
        }
    }
}

/// Set while the final report is written: the gate stays closed (the leak scan's
/// `open_gate` leaves it so), see [`finish`].
static HELD_FOR_REPORT: AtomicBool = AtomicBool::new(false);

pub fn open_gate() {
    if HELD_FOR_REPORT.load(Ordering::Acquire) {
        return;
    }
    GATE_CLOSED.store(false, Ordering::Release);
}

extern "C" fn before_fork() {
    close_gate();
    // As oxgrind (a libc call that allocates must not wait at the gate just closed).
    let _inside = Entered::try_enter();
    crate::host::load_symbols_before_fork();
}

extern "C" fn after_fork_parent() {
    open_gate();
}

extern "C" fn after_fork_child() {
    // Only this thread exists now, and no event was in flight when it forked: every lock is
    // free except the ones a thread of the parent might have held outside events.
    // SAFETY: single-threaded child right after fork.
    unsafe {
        BLOCKS.force_unlock_all();
        STACKS.force_unlock_all();
        FLAGS.force_unlock();
    }
    forget_other_threads_flags();
    // Registered again in case the kernel does not carry the registration over (only this
    // thread exists, so none is entering meanwhile).
    choose_gate_fence();
    open_gate();
    guard::forget_tid();
    set_owner_pid();
    crate::host::silence_if_asked_after_fork();
    // SAFETY: single-threaded child right after fork, as the function requires.
    unsafe { oxgrind_symbols::after_fork_child() };
    if let Some(rt) = state::runtime() {
        rt.tool.on_fork_child();
    }
    crate::host::after_fork_child();
    crate::mapstate::after_fork_child();
    // SAFETY: single-threaded child right after fork, as the function requires.
    unsafe { crate::stacks::walk_caches_after_fork_child() };
}

// ---------------------------------------------------------------------------------------
// Writing the report once.

static FINISHED: AtomicBool = AtomicBool::new(false);

/// The process that owns this image's state: set at set-up and in a forked child. A
/// `vfork` child (or a raw `clone` sharing our memory) has another pid and runs no fork
/// handlers: it must not write the report, or mark it written, for the parent it shares
/// memory with.
static OWNER_PID: AtomicI32 = AtomicI32::new(0);

pub fn set_owner_pid() {
    OWNER_PID.store(raw::getpid(), Ordering::Release);
}

/// Runs the tool's `fini` once per process image (a forked child has its own).
///
/// Natively: reached from the program's exit (translated), the report's work would
/// otherwise run as guest code, slower and counted in the program's instruction clock
/// (DHAT's lifetimes of blocks live at exit, Massif's last snapshot's time).
pub fn finish(exit: Exit) {
    oxgrind_engine::run_native(&mut || finish_natively(exit));
}

fn finish_natively(exit: Exit) {
    let Some(rt) = state::runtime() else { return };
    if raw::getpid() != OWNER_PID.load(Ordering::Acquire) {
        return; // a vfork child about to exec or _exit: the memory is the parent's
    }
    if FINISHED.swap(true, Ordering::AcqRel) {
        return;
    }
    let _inside = Entered::try_enter();
    // Other threads' allocator events finish now and new ones wait until the process is
    // gone: a tool's `fini` holds its own state while it scans for leaks, which stops the
    // other threads after letting their events finish; one waiting for that state inside an
    // event would never finish (the deadlock found by fault_injection.rs, a thread freeing
    // while the main one died of SIGINT or called exit).
    close_gate();
    HELD_FOR_REPORT.store(true, Ordering::Release);
    if !matches!(exit, Exit::Exec) {
        crate::limits::lift_for_report();
    }
    crate::pages::deliver_queued();
    if let Exit::Signal(_) = exit {
        // Memcheck writes this block itself: in XML mode it belongs to the XML stream, with
        // Memcheck's thread numbering.
        // With -q, Valgrind still prints it for a core-dumping signal the kernel raised.
        let kernel_fault = FATAL_SIGNAL.lock().is_some_and(|f| {
            f.code > 0 && matches!(f.sig, 3 | 4 | 5 | 6 | 7 | 8 | 11 | 24 | 25 | 31)
        });
        if rt.core.tool != "memcheck" && (rt.core.view.verbosity > 0 || kernel_fault) {
            fatal_signal_block();
        }
    }
    // Trace records the threads have not handed over yet are part of the run.
    oxgrind_engine::flush_all_traces();
    crate::perfmap::write();
    if !matches!(exit, Exit::Exec) {
        crate::trackfds::report();
    }
    rt.tool.fini(&HOST, exit);
    if !matches!(exit, Exit::Exec) {
        crate::budget::check(&HOST, &*rt.tool);
    }
    if let Exit::Exec = exit {
        // The exec may fail and the program go on: its threads must not wait for ever.
        HELD_FOR_REPORT.store(false, Ordering::Release);
        open_gate();
    }
}

/// "Process terminating with default action of signal N" and where, as Valgrind's core
/// prints it for every tool before the tool's own summary.
fn fatal_signal_block() {
    use oxgrind_tool::Host;
    if state::runtime().is_none() {
        return;
    }
    let Some(f) = *FATAL_SIGNAL.lock() else {
        return;
    };
    let frames = core_frames(f.stack);
    let limits = oxgrind_sys::procself::read_string(oxgrind_sys::procself::SelfFile::Limits)
        .unwrap_or_default();
    let soft = |name: &str| -> Option<u64> {
        let l = limits.lines().find(|l| l.starts_with(name))?;
        let v = l[name.len()..].split_whitespace().next()?;
        if v == "unlimited" {
            Some(u64::MAX)
        } else {
            v.parse().ok()
        }
    };
    let core_size = soft("Max core file size").unwrap_or(0);
    let main_stack = soft("Max stack size")
        .unwrap_or(8 << 20)
        .clamp(1 << 20, 16 << 20);
    let dumping_core = matches!(f.sig, 3 | 4 | 5 | 6 | 7 | 8 | 11 | 24 | 25 | 31) && core_size > 0;
    let mut text = String::new();
    if let Some(base) = f.stack_overflow {
        // Valgrind's core says it at the fault; the tools that print this block hear of no
        // fault before the report (Memcheck, which prints its own block, says it there).
        oxgrind_formats::memcheck_text::stack_overflow(&mut text, HOST.pid(), base);
    }
    oxgrind_formats::memcheck_text::fatal_signal(
        &mut text,
        HOST.pid(),
        f.sig,
        f.code,
        f.addr,
        &frames,
        dumping_core,
        main_stack,
        f.stack_overflow,
    );
    HOST.log(&text);
}

/// A stack's frames as the core prints them (a fatal signal's, `--track-fds`'s): at most
/// `--num-callers`, inlined calls expanded, cut below `main` unless `--show-below-main`.
pub(crate) fn core_frames(stack: oxgrind_tool::StackId) -> Vec<oxgrind_tool::Frame> {
    use oxgrind_tool::Host;
    let Some(rt) = state::runtime() else {
        return Vec::new();
    };
    let mut frames = Vec::new();
    'stack: for ip in HOST.stack(stack).into_iter().take(rt.core.view.num_callers) {
        let mut group = HOST.describe(ip);
        if group.is_empty() {
            group.push(oxgrind_tool::Frame {
                ip,
                ..Default::default()
            });
        }
        for frame in group {
            let below_main = frame.function.as_deref() == Some("main");
            frames.push(frame);
            if below_main && !rt.core.view.show_below_main {
                break 'stack;
            }
        }
    }
    frames
}

/// The exit status to end with instead of the program's: a broken budget's, else the tool's
/// (`--error-exitcode`).
fn status_override() -> Option<i32> {
    crate::budget::exit_status()
        .or_else(|| state::runtime().and_then(|rt| rt.tool.exit_status_override()))
}

/// Whether our `on_exit` handler is registered (then it, not our destructor, ends the
/// process).
static EXIT_HANDLER: AtomicBool = AtomicBool::new(false);

/// Set when [`run_freeres`] ran: once per process.
static FREERES_RUN: AtomicBool = AtomicBool::new(false);

/// Runs glibc's and libstdc++'s "free everything" hooks, as Valgrind does at exit
/// (`--run-libc-freeres`, `--run-cxx-freeres`): memory they keep for the process's lifetime
/// on purpose (stdio buffers, locale data, the C++ emergency pool) is then not reported.
fn run_freeres() {
    if FREERES_RUN.swap(true, Ordering::AcqRel) {
        return;
    }
    // Look both up first, as oxgrind and natively (dlsym may allocate an error string, and
    // its symbol search is not the program's work: counted, it would add about 1,600
    // instructions to the clock of DHAT's blocks live at exit); then call them as the
    // program, so the tool sees what they free.
    let mut hooks = [core::ptr::null_mut(); 2];
    oxgrind_engine::run_native(&mut || {
        let _inside = Entered::try_enter();
        // libstdc++'s first, then glibc's, in Valgrind's order (vg_preloaded.c): Massif's
        // last snapshots show which block went first.
        hooks = [
            &b"_ZN9__gnu_cxx9__freeresEv\0"[..],
            &b"__libc_freeres\0"[..],
        ]
        .map(libc_api::default_symbol);
    });
    for f in hooks {
        if !f.is_null() {
            // glibc's clean-up frees its own buffers with its internal `free`, which reads
            // chunk headers our hooks never see: that bookkeeping is the allocator's, not
            // the program's, so the engine's probes leave it out (as `on_behalf_of_program`
            // does); the frees that go through our hooks still reach the tool.
            // SAFETY: both hooks are `void (void)` functions made to be called at exit.
            crate::guard::on_behalf_of_program(|| unsafe {
                core::mem::transmute::<*mut c_void, extern "C" fn()>(f)()
            });
        }
    }
}

/// The last exit handler. glibc runs a preloaded library's constructor before
/// `__libc_start_main` registers the dynamic loader's `_dl_fini`, so an `on_exit` handler
/// registered there runs after everything: the program's `atexit` handlers and static
/// destructors, and every library's destructors. Like Valgrind, we then flush the program's
/// streams, run the freeres hooks, write the report and end the process with the program's
/// status (or the tool's, for `--error-exitcode`).
#[unsafe(naked)]
extern "C" fn last_exit_handler(status: c_int, arg: *mut c_void) {
    // SAFETY: passes the stack pointer at entry (where glibc's return address is) as a
    // third argument and jumps: `last_exit_handler_at` returns to glibc itself.
    core::arch::naked_asm!(
        "mov rdx, rsp",
        "jmp {at}",
        at = sym last_exit_handler_at,
    )
}

/// [`last_exit_handler`] with the stack pointer at its entry.
extern "C" fn last_exit_handler_at(status: c_int, _arg: *mut c_void, entry_sp: u64) {
    if state::runtime().is_none() {
        return;
    }
    crate::roots::note_exit_sp_at(entry_sp);
    if FINISHED.load(Ordering::Acquire) {
        return;
    }
    if INJECT_PANIC_AT_EXIT.load(Ordering::Relaxed) {
        let _inside = Entered::try_enter();
        panic!("injected by OXGRIND_TEST_PANIC=exit");
    }
    // SAFETY: fflush(NULL) flushes every open stream; we are at exit, in the program's thread.
    unsafe { libc_api::fflush(core::ptr::null_mut()) };
    run_freeres();
    if REPORT_AT_EXIT_GROUP.load(Ordering::Acquire) {
        // The rest of glibc's exit runs as the program's, up to its exit_group, where the
        // report is written (at_exit_group).
        return;
    }
    finish(Exit::Normal(status));
    raw::exit_group(status_override().unwrap_or(status));
}

/// Set once the translation engine runs the program: it then sees the program's
/// `exit_group` and calls [`at_exit_group`] there.
static REPORT_AT_EXIT_GROUP: AtomicBool = AtomicBool::new(false);

/// The engine runs the program from now on (called once, from our constructor).
pub fn report_at_exit_group() {
    REPORT_AT_EXIT_GROUP.store(true, Ordering::Release);
}

/// The engine's exit hook: the program is making its `exit_group` system call. Valgrind
/// writes its report at this moment, and its leak check scans the stack from the stack
/// pointer here: by now the rest of glibc's exit (after the last exit handler: stdio's
/// clean-up, `_exit`) has overwritten slots of dead frames that the program's code left
/// block addresses in, such as main's temporaries below `__run_exit_handlers`' frame.
/// Scanned from inside our exit handler, one such slot kept a block reachable that
/// Valgrind reports lost. Also the only report of a program that calls `exit_group`
/// itself (`syscall(SYS_exit_group, n)`), skipping its exit handlers.
pub unsafe extern "C" fn at_exit_group(status: c_int) {
    if state::runtime().is_none() || FINISHED.load(Ordering::Acquire) {
        return; // the call goes ahead (after _exit's or a fatal signal's report)
    }
    if raw::getpid() != OWNER_PID.load(Ordering::Acquire) {
        return; // a vfork child: nothing here is its own to report
    }
    if let Some(regs) = oxgrind_engine::guest_regs_in_tool_call() {
        crate::roots::note_exit_sp_at(regs.rsp());
    }
    // Skipped exit handlers (the program's own call) skip none of this, as with Valgrind;
    // here glibc's clean-up runs natively, on the engine's stack.
    run_freeres();
    finish(Exit::Normal(status));
    raw::exit_group(status_override().unwrap_or(status));
}

/// Our destructor: only a fallback for when the exit handler could not be registered.
pub fn at_normal_exit() {
    if !EXIT_HANDLER.load(Ordering::Acquire) {
        finish(Exit::Normal(0));
    }
}

#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn _exit(code: c_int) -> ! {
    // SAFETY: passes the stack pointer at entry as a second argument and jumps;
    // `exit_at` never returns.
    core::arch::naked_asm!(
        "mov rsi, rsp",
        "jmp {at}",
        at = sym exit_at,
    )
}

/// [`_exit`] with the stack pointer at its entry.
unsafe extern "C" fn exit_at(code: c_int, entry_sp: u64) -> ! {
    if raw::getpid() != OWNER_PID.load(Ordering::Acquire) {
        raw::exit_group(code); // a vfork child: nothing here is its own to report
    }
    crate::roots::note_exit_sp_at(entry_sp);
    finish(Exit::Normal(code));
    let code = status_override().unwrap_or(code);
    raw::exit_group(code)
}

#[no_mangle]
pub unsafe extern "C" fn _Exit(code: c_int) -> ! {
    // SAFETY: same contract as _exit.
    unsafe { _exit(code) }
}

// ---------------------------------------------------------------------------------------
// Our own panics.

/// `OXGRIND_TEST_PANIC=exit`: the exit handler panics before the report, so the test suite
/// can check what a panic inside the runtime leaves (`launcher_errors.rs`).
static INJECT_PANIC_AT_EXIT: AtomicBool = AtomicBool::new(false);

/// Seconds the report may take after a panic before the process is ended anyway: the
/// panicking thread may hold a lock the report needs, and a hang would be worse than a
/// lost report.
const PANIC_REPORT_SECONDS: usize = 20;

/// The runtime's panic hook (the release build aborts on panic, so this runs on the
/// panicking thread, then the process ends). A bug of ours must not look like the
/// program's crash nor lose what was measured: one line saying it is ours and where, the
/// report, then exit status 1, as Valgrind's "the 'impossible' happened" panic ends.
fn on_panic(info: &std::panic::PanicHookInfo<'_>) {
    let place = info
        .location()
        .map(|l| format!("{}:{}", l.file(), l.line()))
        .unwrap_or_else(|| "an unknown place".into());
    let what = info
        .payload()
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| info.payload().downcast_ref::<String>().cloned())
        .unwrap_or_default();
    let line = format!(
        "oxgrind: internal error (the 'impossible' happened) in thread {} at {place}: {what}; writing the report\n",
        raw::gettid()
    );
    oxgrind_sys::fd::write_all(2, line.as_bytes());
    // A second panic (in the report itself) ends here: the first one's report is under way.
    static PANICKING: AtomicBool = AtomicBool::new(false);
    if PANICKING.swap(true, Ordering::AcqRel) {
        raw::exit_group(1);
    }
    const SYS_ALARM: usize = 37;
    // SAFETY: alarm only arms a timer; SIGALRM's default action (or our reporting handler,
    // which finds the report already started) ends the process if the report hangs.
    unsafe { oxgrind_sys::syscall::syscall4(SYS_ALARM, PANIC_REPORT_SECONDS, 0, 0, 0) };
    crate::roots::note_exit_sp();
    finish(Exit::Normal(1));
    raw::exit_group(1)
}

// ---------------------------------------------------------------------------------------
// Fatal signals.

/// Signals whose default action ends the process.
const FATAL: &[c_int] = &[
    1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 31,
];
const NSIG: usize = 65;

/// Per signal: whether our reporting handler is what the kernel has installed.
static OURS: [AtomicBool; NSIG] = [const { AtomicBool::new(false) }; NSIG];
/// A fatal signal that arrived while the thread was inside oxgrind, to act on when it
/// leaves (see `guard::Entered::drop`).
static PENDING: AtomicI32 = AtomicI32::new(0);

std::arch::global_asm!(
    ".globl oxgrind_sigreturn",
    ".type oxgrind_sigreturn,@function",
    "oxgrind_sigreturn:",
    "mov rax, 15", // rt_sigreturn
    "syscall",
);
extern "C" {
    fn oxgrind_sigreturn();
}

fn kernel_sigaction(
    sig: c_int,
    act: Option<&KernelSigaction>,
    old: Option<&mut KernelSigaction>,
) -> isize {
    // SAFETY: every action this module installs is SIG_DFL or one of its own handlers,
    // with the flags they are written for and `oxgrind_sigreturn` as the restorer.
    unsafe { raw::rt_sigaction(sig as usize, act, old) }
}

fn set_default(sig: c_int) {
    let act = KernelSigaction {
        handler: SIG_DFL,
        flags: SA_RESTORER,
        restorer: oxgrind_sigreturn as *const () as u64,
        mask: 0,
    };
    kernel_sigaction(sig, Some(&act), None);
    OURS[sig as usize].store(false, Ordering::Release);
}

fn unblock(sig: c_int) {
    let set: u64 = 1 << (sig - 1);
    // SAFETY: SIG_UNBLOCK (1) with a valid 8-byte set.
    unsafe {
        syscall4(
            raw::SYS_RT_SIGPROCMASK,
            1,
            &set as *const u64 as usize,
            0,
            8,
        )
    };
}

/// The fatal signal being reported (for `Host::fatal_signal`).
pub static FATAL_SIGNAL: oxgrind_sys::lock::SpinLock<Option<oxgrind_tool::FatalSignal>> =
    oxgrind_sys::lock::SpinLock::new(None);

/// Records what the tool's report says about the signal: from the handler's `siginfo` and
/// `ucontext` when there are some, else (a signal deferred while inside oxgrind) the current
/// stack, sent by no one in particular.
fn note_fatal(sig: c_int, info: *const c_void, ctx: *const c_void) {
    let Some(rt) = state::runtime() else { return };
    let Some(_inside) = Entered::try_enter() else {
        return;
    };
    let depth = rt.needs.stack_depth.max(12);
    let (code, addr, sp, stack) = if info.is_null() || ctx.is_null() {
        (
            0,
            0,
            0,
            crate::stacks::capture(
                &crate::state::STACKS,
                0,
                crate::stacks::Caller::UNKNOWN,
                depth,
            ),
        )
    } else {
        // SAFETY: the kernel's siginfo_t (si_code at 8, si_addr at 16) and ucontext_t (general
        // registers at 40), valid while the handler runs.
        unsafe {
            let code = *((info as *const u8).add(8) as *const i32);
            let addr = *((info as *const u8).add(16) as *const u64);
            let gregs = &*((ctx as *const u8).add(40) as *const [u64; 23]);
            (
                code,
                addr,
                gregs[15], // REG_RSP
                crate::stacks::capture_at(&crate::state::STACKS, gregs, depth),
            )
        }
    };
    let tid = guard::tid();
    if sp != 0 {
        crate::roots::note_exit_sp_of_program(sp);
    }
    // Valgrind grows the main thread's stack itself and says when it cannot; other
    // threads' stacks are fixed mappings (their overflow is a guard-page fault, ACCERR).
    let stack_overflow = (sig == 11
        && code == 1
        && tid == raw::getpid()
        && sp != 0
        && oxgrind_tool::fault_is_stack_overflow(addr, sp))
    .then(|| oxgrind_tool::stack_overflow_page(sp));
    *FATAL_SIGNAL.lock() = Some(oxgrind_tool::FatalSignal {
        sig,
        code,
        addr,
        stack,
        tid,
        stack_overflow,
    });
}

/// Ends the process by `sig`'s default action, after the report.
fn die_by(sig: c_int) -> ! {
    if FATAL_SIGNAL.lock().is_none() {
        note_fatal(sig, core::ptr::null(), core::ptr::null());
    }
    crate::roots::note_exit_sp();
    finish(Exit::Signal(sig));
    set_default(sig);
    unblock(sig);
    let _ = raw::tgkill(raw::getpid(), raw::gettid(), sig);
    // A synchronous fault re-executes the faulting instruction on return and dies then;
    // anything else is delivered at once above. If neither happened, exit as a shell would.
    raw::exit_group(128 + sig)
}

extern "C" fn on_fatal_signal(sig: c_int, info: *mut c_void, _ctx: *mut c_void) {
    let synchronous = matches!(sig, 4 | 5 | 7 | 8 | 11 | 31);
    if guard::inside() {
        if synchronous {
            // A fault in oxgrind's own code: say so rather than hide it as the program's,
            // with what a bug report needs to place it.
            oxgrind_sys::fd::write_all(
                2,
                b"oxgrind: internal error: fatal signal inside the runtime\n",
            );
            describe_internal_fault(sig, info, _ctx);
            set_default(sig);
            return; // the fault repeats with the default action and ends the process
        }
        PENDING.store(sig, Ordering::Release);
        return;
    }
    note_fatal(sig, info, _ctx);
    if synchronous {
        finish(Exit::Signal(sig));
        set_default(sig);
        // The faulting instruction re-executes on return and dies then, with the fault's
        // registers; but the report may have mapped something where it faulted (the
        // symboliser's views of object files land in the hole a `munmap` just left), and
        // then it would not fault again and the program would run on past its end. The
        // signal sent here, pending until the handler returns, ends it either way.
        let _ = raw::tgkill(raw::getpid(), raw::gettid(), sig);
        return;
    }
    die_by(sig)
}

/// [`on_fatal_signal`] for a signal the engine caught in code running natively for us
/// (`oxgrind_engine::Config::on_fatal_in_native`): glibc's allocator on a heap the program
/// smashed, under Massif's native heap events; a fault in our own code is told apart there
/// and said to be ours. Returns whether it was taken: a fault always is (its action is the
/// default now, and it repeats to end the process); an abort raised inside our own code is
/// left pending, as our own handler leaves it.
pub unsafe extern "C" fn fatal_signal_natively(sig: c_int, info: *const u8, uc: *mut u8) -> bool {
    on_fatal_signal(sig, info as *mut c_void, uc as *mut c_void);
    matches!(sig, 4 | 5 | 7 | 8 | 11 | 31)
}

/// Writes the signal, the faulting address, the interrupted pc and its return addresses,
/// then the executable mappings (to turn the addresses into places offline). Only raw
/// system calls and a stack buffer: this runs after a fault inside oxgrind, where its
/// heap and locks may be in any state.
fn describe_internal_fault(sig: c_int, info: *const c_void, ctx: *const c_void) {
    if info.is_null() || ctx.is_null() {
        return;
    }
    let mut line = LineBuf::new();
    // SAFETY: the kernel's siginfo_t (si_addr at 16) and ucontext_t (general registers at
    // 40: rsp 15, rip 16, rbp 10), valid while the handler runs.
    let (addr, pc, sp, bp) = unsafe {
        let gregs = (ctx as *const u8).add(40) as *const u64;
        (
            *((info as *const u8).add(16) as *const u64),
            *gregs.add(16),
            *gregs.add(15),
            *gregs.add(10),
        )
    };
    line.text(b"oxgrind:   signal ");
    line.dec(sig as u64);
    line.text(b", address 0x");
    line.hex(addr);
    line.text(b", pc 0x");
    line.hex(pc);
    line.text(b", sp 0x");
    line.hex(sp);
    line.text(b"\noxgrind:   return addresses:");
    let mut ras = [0u64; 24];
    let n = oxgrind_symbols::capture_from(oxgrind_symbols::Regs { pc, sp, bp }, &mut ras, (0, 0));
    for ra in &ras[..n] {
        line.text(b" 0x");
        line.hex(*ra);
    }
    line.text(b"\n");
    line.flush(2);
    // The executable mappings, for the offsets of those addresses.
    let _lent = oxgrind_sys::lent_fd::Lent::take();
    let Ok(fd) = raw::open(b"/proc/self/maps\0", 0, 0) else {
        return;
    };
    let mut buf = [0u8; 4096];
    let mut have = 0;
    loop {
        let Ok(got) = raw::read(fd, &mut buf[have..]) else {
            break;
        };
        have += got;
        let mut start = 0;
        while let Some(nl) = buf[start..have].iter().position(|&b| b == b'\n') {
            let l = &buf[start..start + nl + 1];
            if l.windows(4).any(|w| w == b"r-xp") {
                oxgrind_sys::fd::write_all(2, b"oxgrind:   ");
                oxgrind_sys::fd::write_all(2, l);
            }
            start += nl + 1;
        }
        buf.copy_within(start..have, 0);
        have -= start;
        if got == 0 || have == buf.len() {
            break;
        }
    }
    let _ = raw::close(fd);
}

/// A line built on the stack (no heap inside a fault handler).
struct LineBuf {
    buf: [u8; 1024],
    len: usize,
}

impl LineBuf {
    fn new() -> LineBuf {
        LineBuf {
            buf: [0; 1024],
            len: 0,
        }
    }

    fn text(&mut self, t: &[u8]) {
        let n = t.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&t[..n]);
        self.len += n;
    }

    fn hex(&mut self, v: u64) {
        self.number(v, 16);
    }

    fn dec(&mut self, v: u64) {
        self.number(v, 10);
    }

    fn number(&mut self, mut v: u64, base: u64) {
        let mut digits = [0u8; 20];
        let mut n = 0;
        loop {
            digits[n] = b"0123456789abcdef"[(v % base) as usize];
            n += 1;
            v /= base;
            if v == 0 {
                break;
            }
        }
        digits[..n].reverse();
        self.text(&digits[..n]);
    }

    fn flush(&mut self, fd: i32) {
        oxgrind_sys::fd::write_all(fd, &self.buf[..self.len]);
        self.len = 0;
    }
}

/// In [`PENDING`]: the private heap is living on its emergency reserve.
const OUT_OF_MEMORY: c_int = -1;

/// Acts on a fatal signal that arrived while this thread was inside oxgrind, or on the
/// private heap running out.
#[inline]
pub fn run_pending_signal() {
    if PENDING.load(Ordering::Relaxed) == 0 {
        return;
    }
    let sig = PENDING.swap(0, Ordering::AcqRel);
    if sig == OUT_OF_MEMORY {
        end_out_of_memory();
    }
    if sig > 0 {
        die_by(sig);
    }
}

/// The private heap's hook. On its emergency bytes, the program's allocations are refused
/// (`hooks::program_may_allocate`), so that what the program does next is its own reaction
/// to a full address space, as natively, while our memory lasts. Half of the emergency
/// bytes gone (our data still grows without the program allocating): the report is
/// written, when the thread leaves oxgrind, from what is left, and the process ends. Only
/// flags here: the hook runs inside the allocator.
fn on_heap_exhausted(step: oxgrind_sys::heap::Exhaustion) {
    if step == oxgrind_sys::heap::Exhaustion::HalfGone {
        let _ = PENDING.compare_exchange(0, OUT_OF_MEMORY, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// Our own memory ran out (the program's limits, or the machine's, leave none): one line,
/// the report from the emergency reserve, and the end, with Valgrind's status for its own
/// out-of-memory (1). Valgrind prints a page and writes no report; we keep what was measured.
fn end_out_of_memory() -> ! {
    oxgrind_sys::fd::write_all(
        2,
        b"oxgrind: out of memory for its own data (the program's memory limits, or the machine's, leave none): writing the report and ending the program\n",
    );
    crate::roots::note_exit_sp();
    finish(Exit::Normal(1));
    raw::exit_group(1)
}

/// Installs `handler` (an `extern "C" fn(c_int, *mut c_void, *mut c_void)`) for `sig` with
/// our restorer, not blocking `sig` inside it (the handler may be re-entered), taking the
/// signal from the program's view (our `sigaction` keeps it).
///
/// The handler runs on the stack the thread is on, never on the program's alternate
/// stack (as `take_for_report`'s): the one user, the `--pages-as-heap` system-call trap,
/// records the mapping with its stack, deeper than a Rust thread's 8 KiB alternate stack
/// holds beside the kernel's frame (on AMD EPYC every Rust program died of SIGSEGV at its
/// first trapped `mmap` after the standard library set that stack up). A trap comes from
/// a system call the thread makes, so its own stack has room as it would for a call.
pub fn set_handler_nodefer(sig: c_int, handler: usize) {
    let act = KernelSigaction {
        handler: handler as u64,
        flags: SA_SIGINFO | SA_RESTORER | SA_RESTART | SA_NODEFER,
        restorer: oxgrind_sigreturn as *const () as u64,
        mask: 0,
    };
    kernel_sigaction(sig, Some(&act), None);
    OURS[sig as usize].store(false, Ordering::Release);
}

fn install_signal_handlers() {
    for &sig in FATAL {
        let mut old = KernelSigaction::default();
        if kernel_sigaction(sig, None, Some(&mut old)) != 0 || old.handler != SIG_DFL {
            continue; // ignored or handled by someone already: not ours to take
        }
        take_for_report(sig, matches!(sig, 7 | 11));
    }
}

/// Installs our reporting handler for the fatal signal `sig`.
///
/// The handler runs on the thread's own stack, except (`on_alt_stack`, at start) for
/// `SIGSEGV` and `SIGBUS`: a stack overflow's fault cannot be delivered there (no room: the
/// kernel would kill the process, report lost), so those two take the thread's alternate
/// stack: the engine gives
/// every thread one of its own, 512 KiB (`oxgrind_engine`'s `ThreadCtx::alt_stack`),
/// hidden from the program. The other signals stay off it: a program's own alternate stack
/// is small (Rust's is a few pages per thread), and writing Massif's report on it for a
/// `SIGTERM` overflowed it (a Rust program with threads died of SIGSEGV without its file).
/// Where the program set a small stack of its own and handles neither signal, a fault's
/// report is written there (a program that handled them and gives the default back, as
/// Rust's standard library does for a fault that is not its stack's, gets ours without
/// the alternate stack); without the engine (the heap path) the main thread gets one of
/// ours ([`give_main_thread_an_alt_stack`]) and every thread `pthread_create` starts one
/// as it starts (`hookstack`).
fn take_for_report(sig: c_int, on_alt_stack: bool) {
    let act = KernelSigaction {
        handler: on_fatal_signal as *const () as u64,
        flags: SA_SIGINFO | SA_RESTORER | SA_RESTART | if on_alt_stack { SA_ONSTACK } else { 0 },
        restorer: oxgrind_sigreturn as *const () as u64,
        mask: 0,
    };
    if kernel_sigaction(sig, Some(&act), None) == 0 {
        OURS[sig as usize].store(true, Ordering::Release);
    }
}

/// Without the engine (which gives every thread an alternate signal stack of its own,
/// hidden from the program), the main thread gets one of ours, 512 KiB, unless it has
/// one: a stack overflow's `SIGSEGV` is delivered there and the report written
/// ([`take_for_report`]). The program sees it (`sigaltstack` is not emulated without the
/// engine): Rust's standard library, finding it, uses it rather than making its own.
/// Other threads get theirs as they start (`hookstack`).
pub fn give_main_thread_an_alt_stack() {
    const SYS_SIGALTSTACK: usize = 131;
    const SS_DISABLE: u64 = 2;
    const SIZE: usize = 512 << 10;
    let mut old = [0u64; 3];
    // SAFETY: sigaltstack(NULL, &old) writes one stack_t (24 bytes) into `old`.
    let r =
        unsafe { oxgrind_sys::syscall::syscall2(SYS_SIGALTSTACK, 0, old.as_mut_ptr() as usize) };
    if r != 0 || old[1] & SS_DISABLE == 0 {
        return;
    }
    let Some(p) = raw::mmap_anon(SIZE) else {
        return;
    };
    // Ours, not the program's: no roots of its heap there.
    oxgrind_sys::heap::note_private_mapping(p as usize, SIZE);
    let ss = [p as u64, 0, SIZE as u64];
    // SAFETY: `ss` is a valid stack_t naming a fresh mapping that is never unmapped.
    unsafe { oxgrind_sys::syscall::syscall2(SYS_SIGALTSTACK, ss.as_ptr() as usize, 0) };
}

/// glibc's `struct sigaction` (what the program passes to `sigaction`).
#[repr(C)]
pub struct LibcSigaction {
    handler: usize,
    mask: [u64; 16],
    flags: c_int,
    restorer: usize,
}

type SigactionFn = unsafe extern "C" fn(c_int, *const LibcSigaction, *mut LibcSigaction) -> c_int;

fn real_sigaction() -> Option<SigactionFn> {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let mut f = REAL.load(Ordering::Acquire);
    if f == 0 {
        f = libc_api::next_symbol(b"sigaction\0") as usize;
        REAL.store(f, Ordering::Release);
    }
    // SAFETY: dlsym returned libc's sigaction, whose signature is SigactionFn.
    (f != 0).then(|| unsafe { core::mem::transmute::<usize, SigactionFn>(f) })
}

/// The program's `sigaction`: while our reporting handler holds a signal, the program sees
/// the default disposition it believes is there; any other disposition it sets replaces ours.
#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const LibcSigaction,
    old: *mut LibcSigaction,
) -> c_int {
    let Some(real) = real_sigaction() else {
        return -1;
    };
    let ours = (1..NSIG as c_int).contains(&sig) && OURS[sig as usize].load(Ordering::Acquire);
    if !ours {
        // SAFETY: forwarded as given.
        let r = unsafe { real(sig, act, old) };
        // The program gives a fatal signal back its default action (Python's SIG_DFL, Rust's
        // SIGSEGV handler when the fault is not a stack overflow): the default is to end,
        // and the report comes first, so ours takes it again (the program still sees
        // SIG_DFL).
        // SAFETY: act, when not null, points to the caller's struct.
        if r == 0
            && !act.is_null()
            && unsafe { (*act).handler } as u64 == SIG_DFL
            && FATAL.contains(&sig)
        {
            // On the thread's own stack: the program that gives the default back ran its
            // own handler on its own (small) alternate stack, and the fault repeating now
            // is not the stack running out (Rust's handler takes those).
            take_for_report(sig, false);
        }
        return r;
    }
    if !old.is_null() {
        // SAFETY: the caller's out-parameter; a zeroed struct is SIG_DFL with no flags.
        unsafe { core::ptr::write_bytes(old, 0, 1) };
        // Written by our code, which runs without definedness steps.
        oxgrind_engine::definedness::set(
            old as u64,
            core::mem::size_of::<LibcSigaction>() as u64,
            true,
        );
    }
    // SAFETY: act, when not null, points to the caller's struct.
    if act.is_null() || unsafe { (*act).handler } as u64 == SIG_DFL {
        return 0; // still the default as far as the program knows; we keep reporting
    }
    OURS[sig as usize].store(false, Ordering::Release);
    // SAFETY: forwarded; old was already filled with what the program believes.
    unsafe { real(sig, act, core::ptr::null_mut()) }
}

/// `signal()` with glibc's BSD semantics, routed through our `sigaction`.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: usize) -> usize {
    let act = LibcSigaction {
        handler,
        mask: [0; 16],
        flags: SA_RESTART as c_int,
        restorer: 0,
    };
    let mut old = LibcSigaction {
        handler: 0,
        mask: [0; 16],
        flags: 0,
        restorer: 0,
    };
    // SAFETY: both structs are valid for the call.
    if unsafe { sigaction(sig, &act, &mut old) } != 0 {
        return usize::MAX; // SIG_ERR
    }
    old.handler
}

#[no_mangle]
pub unsafe extern "C" fn bsd_signal(sig: c_int, handler: usize) -> usize {
    // SAFETY: same contract as signal.
    unsafe { signal(sig, handler) }
}

// ---------------------------------------------------------------------------------------
// exec.

type ExecveFn =
    unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
type ExecvpeFn = ExecveFn;

fn real_fn(name: &'static [u8], slot: &AtomicUsize) -> usize {
    let mut f = slot.load(Ordering::Acquire);
    if f == 0 {
        f = libc_api::next_symbol(name) as usize;
        slot.store(f, Ordering::Release);
    }
    f
}

/// Writes the report of the image about to be replaced. If the exec fails, the program
/// goes on, and a later exit does not write a second report (the first one stands).
fn before_exec() {
    finish(Exit::Exec);
    // Without --trace-children the new image runs natively: it gets the limits the program
    // set, not the ones we raised for our own memory.
    if state::runtime().is_some_and(|rt| !rt.core.trace_children) {
        crate::limits::apply_program_limits();
    }
}

/// The `exec` failed and the program goes on: our raised limits come back.
fn after_failed_exec() {
    crate::limits::restore_after_failed_exec();
}

#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let f = real_fn(b"execve\0", &REAL);
    before_exec();
    // SAFETY: libc's execve with the caller's arguments.
    let r = unsafe { core::mem::transmute::<usize, ExecveFn>(f)(path, argv, envp) };
    after_failed_exec();
    r
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: environ is libc's current environment.
    unsafe { execve(path, argv, libc_api::environ as *const *const c_char) }
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let f = real_fn(b"execvpe\0", &REAL);
    before_exec();
    // SAFETY: libc's execvpe with the caller's arguments.
    let r = unsafe { core::mem::transmute::<usize, ExecvpeFn>(f)(file, argv, envp) };
    after_failed_exec();
    r
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: environ is libc's current environment.
    unsafe { execvpe(file, argv, libc_api::environ as *const *const c_char) }
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    type F = unsafe extern "C" fn(c_int, *const *const c_char, *const *const c_char) -> c_int;
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let f = real_fn(b"fexecve\0", &REAL);
    before_exec();
    // SAFETY: libc's fexecve with the caller's arguments.
    let r = unsafe { core::mem::transmute::<usize, F>(f)(fd, argv, envp) };
    after_failed_exec();
    r
}

// ---------------------------------------------------------------------------------------

/// Address space of the private heap's reserve (see `oxgrind_sys::heap`): untouched pages
/// cost no memory.
const HEAP_RESERVE: usize = 256 << 20;

/// Called once set-up made this image active.
pub fn install() {
    // At set-up, when no other thread exists yet, and before the fork handler that closes
    // the gate is installed.
    choose_gate_fence();
    set_owner_pid();
    crate::stacks::give_unwinder_thread_slots();
    // OXGRIND_TEST_RESERVE_MIB: a smaller reserve, so a test can outgrow it cheaply.
    let reserve = state::env_var("OXGRIND_TEST_RESERVE_MIB")
        .and_then(|v| core::str::from_utf8(v).ok()?.parse::<usize>().ok())
        .map_or(HEAP_RESERVE, |mib| mib << 20);
    oxgrind_sys::heap::take_reserve(reserve);
    oxgrind_sys::heap::set_exhausted_hook(on_heap_exhausted);
    oxgrind_sys::heap::serve_forks(&crate::HEAP);
    oxgrind_sys::heap::set_mapping_hooks(
        crate::limits::map_outside_the_program_limit,
        crate::limits::unmapped_outside_the_program_limit,
    );
    std::panic::set_hook(Box::new(on_panic));
    INJECT_PANIC_AT_EXIT.store(
        state::env_var("OXGRIND_TEST_PANIC").is_some_and(|v| v.starts_with(b"exit")),
        Ordering::Relaxed,
    );
    // SAFETY: plain registration of three extern "C" fns with no arguments.
    unsafe {
        libc_api::pthread_atfork(
            Some(before_fork),
            Some(after_fork_parent),
            Some(after_fork_child),
        )
    };
    // SAFETY: registers a handler that ignores its argument.
    if unsafe { libc_api::on_exit(last_exit_handler, core::ptr::null_mut()) } == 0 {
        EXIT_HANDLER.store(true, Ordering::Release);
    }
    install_signal_handlers();
}
