//! Signal delivery to translated handlers (phase-1 subset of the study's §4.7).
//!
//! Without this, a guest signal handler would run natively: uninstrumented, and a handler
//! that `siglongjmp`s would leave the code cache for good (the spike's failure). What is
//! done instead:
//!
//! * `rt_sigaction` is emulated: for a real handler the kernel gets `oxg_sig_entry`
//!   instead, with the guest's flags, mask and restorer plus `SA_SIGINFO`; the guest's
//!   handler is kept in a table and reported back through `oldact`.
//! * When a signal arrives while the thread runs translated code, the kernel has already
//!   built the right frame on the right stack (guest stack or the guest's alternate stack).
//!   The entry saves the context's scratch slots (a stub or the IBL may have been
//!   interrupted between two instructions that use them) and enters the dispatcher at the
//!   guest handler with the kernel's `rdi/rsi/rdx/rsp`. The handler runs translated and
//!   returns into the guest's restorer, translated too; its `rt_sigreturn` goes through
//!   `sigreturn_tramp`, which puts the scratch slots back right before the kernel
//!   restores the interrupted registers. `siglongjmp` out of a handler is an ordinary
//!   indirect jump and stays in the code cache.
//! * A signal that ends a system call arrives right after the block's `syscall`, which the
//!   pc map makes a boundary (`translate::special::syscall_block`): it is delivered there,
//!   under the mask the call had. Held back instead, a signal that pselect, ppoll,
//!   epoll_pwait or sigsuspend unblock for the call only would be raised again under the
//!   program's usual mask, which blocks it.
//! * When a signal arrives while the thread is inside the engine (dispatcher, translation),
//!   it is recorded with its `siginfo` and re-raised with `rt_tgsigqueueinfo` (same
//!   `siginfo`) right after the dispatcher has put the guest registers back
//!   (`maybe_raise`).
//! * The handler sees guest state (`show_guest_context`): a synchronous fault (`SIGSEGV`,
//!   `SIGBUS`, `SIGFPE`, `SIGILL`, `SIGTRAP` raised by an instruction) always stops in the
//!   copy of a guest instruction, so `RIP` is that instruction's guest address (after it,
//!   for `int3`), registers the translation had borrowed are put back, and a `si_addr`
//!   naming the host pc names the guest pc. Each translation carries a map from its host
//!   offsets to guest instructions for this (`translate::PcMapEntry`). At `rt_sigreturn`
//!   the pc goes back to host terms; a pc the handler changed (skipping the faulting
//!   instruction, say) is a guest address and is reached through the dispatcher.
//!
//! Not emulated yet (documented limits): an asynchronous signal that arrives in engine
//! code inside the code cache (exit stubs, the IBL, counter updates; anywhere but exactly
//! between two guest instructions) shows the *host* pc and may show engine scratch values
//! in registers; two instances of a real-time signal that both arrive while the thread is
//! in the engine are merged into one; synchronous faults inside engine code are reported as engine bugs; counts
//! can miss the instructions of a handler that interrupted a counter update, and count the
//! rest of a block twice when a handler returns into the middle of a block whose registers
//! had to be fixed up.

use core::fmt::Write;
use core::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use oxgrind_sys::raw;
use oxgrind_sys::raw::{KernelSigaction, SA_RESTORER, SA_SIGINFO};

use crate::asm;
use crate::context::{self as c, ThreadCtx};

const NSIG: usize = 65;

/// The guest's handler and flags per signal (0 = not intercepted).
static HANDLER: [AtomicU64; NSIG] = [const { AtomicU64::new(0) }; NSIG];
static FLAGS: [AtomicU64; NSIG] = [const { AtomicU64::new(0) }; NSIG];

/// The process whose handlers [`HANDLER`] and [`FLAGS`] hold: set when the engine starts
/// and in a forked child. A child made by `vfork` (or `clone(CLONE_VM)` without
/// `CLONE_THREAD`, as `posix_spawn` does) shares this memory, tables included, but has
/// dispositions of its own: what it sets (gdb's and posix_spawn's children put every
/// handler back to the default before they exec) must not become the parent's.
static TABLE_PID: AtomicI32 = AtomicI32::new(0);

/// Records the calling process as the owner of the handler table (engine start, and the
/// child of a fork, which has a copy of the table of its own).
pub(crate) fn own_handler_table() {
    TABLE_PID.store(raw::getpid(), Ordering::Release);
}

/// Performs the guest's `rt_sigaction` with our entry substituted; `None` to let the
/// kernel handle the call unchanged (invalid arguments, SIGKILL/SIGSTOP, a process that
/// shares our memory but not our dispositions: see [`TABLE_PID`]).
pub(crate) fn emulate_sigaction(ctx: &ThreadCtx) -> Option<i64> {
    let sig = ctx.gregs[c::RDI] as usize;
    let act = ctx.gregs[c::RSI];
    let oact = ctx.gregs[c::RDX];
    if sig == 0 || sig >= NSIG || sig == 9 || sig == 19 || ctx.gregs[c::R10] != 8 {
        return None;
    }
    if raw::getpid() != TABLE_PID.load(Ordering::Acquire) {
        // A vfork-like child: the kernel sets its own disposition; a handler it installs
        // runs natively there (it is about to exec or exit), and the parent's table stays.
        return None;
    }
    let prev_handler = HANDLER[sig].load(Ordering::Acquire);
    let prev_flags = FLAGS[sig].load(Ordering::Acquire);
    {
        // The kernel answers EFAULT for bad pointers; the engine must not fault on them.
        let mut guard = crate::dispatch::CACHE.lock();
        if let Some(cache) = guard.as_mut() {
            let size = core::mem::size_of::<KernelSigaction>() as u64;
            if (act != 0 && !cache.pages.accessible(act, size, false))
                || (oact != 0 && !cache.pages.accessible(oact, size, true))
            {
                return Some(-14);
            }
        }
    }
    let mut new = KernelSigaction::default();
    if act != 0 {
        // SAFETY: the guest passed `act` to the kernel, which would read it the same way;
        // it was checked readable above.
        new = unsafe { core::ptr::read_unaligned(act as *const KernelSigaction) };
        if new.handler > 1 || sig == SIGTRAP {
            // Record first: the signal may arrive as soon as the kernel has the new action.
            // SIGTRAP stays ours even at the guest's default (see `install_trap_entry`).
            FLAGS[sig].store(new.flags, Ordering::Release);
            HANDLER[sig].store(new.handler, Ordering::Release);
            new.handler = asm::oxg_sig_entry as *const () as u64;
            new.flags |= SA_SIGINFO;
            if new.flags & SA_RESTORER == 0 {
                new.flags |= SA_RESTORER;
                new.restorer = asm::oxg_restorer as *const () as u64;
            }
        }
    }
    let mut old = KernelSigaction::default();
    // SAFETY: the guest's action with our entry (a three-argument handler, SA_SIGINFO) and
    // restorer substituted, or the guest's own SIG_DFL/SIG_IGN.
    let r = unsafe { raw::rt_sigaction(sig, (act != 0).then_some(&new), Some(&mut old)) } as i64;
    if r != 0 {
        HANDLER[sig].store(prev_handler, Ordering::Release);
        FLAGS[sig].store(prev_flags, Ordering::Release);
        return Some(r);
    }
    if act != 0 && new.handler <= 1 {
        HANDLER[sig].store(0, Ordering::Release);
    }
    if oact != 0 {
        if old.handler == asm::oxg_sig_entry as *const () as u64 {
            old.handler = prev_handler;
            old.flags = prev_flags;
        }
        // SAFETY: the guest passed `oact` for the kernel to write this structure.
        unsafe { core::ptr::write_unaligned(oact as *mut KernelSigaction, old) };
    }
    Some(0)
}

/// Routes handlers installed before the engine started (by the dynamic loader, libc, or
/// an earlier preloaded library) through `oxg_sig_entry` too, so they run translated like
/// handlers installed later.
pub(crate) fn adopt_installed_handlers() {
    own_handler_table();
    for sig in 1..NSIG {
        if sig == 9 || sig == 19 {
            continue;
        }
        let mut cur = KernelSigaction::default();
        // SAFETY: querying only (act = NULL); `cur` is a valid kernel_sigaction buffer.
        let r = unsafe { raw::rt_sigaction(sig, None, Some(&mut cur)) };
        if r != 0 || cur.handler <= 1 || cur.handler == asm::oxg_sig_entry as *const () as u64 {
            continue;
        }
        FLAGS[sig].store(cur.flags, Ordering::Release);
        HANDLER[sig].store(cur.handler, Ordering::Release);
        let mut new = cur;
        new.handler = asm::oxg_sig_entry as *const () as u64;
        new.flags |= SA_SIGINFO;
        // SAFETY: installs a valid action for a catchable signal.
        let r = unsafe { raw::rt_sigaction(sig, Some(&new), None) };
        if r != 0 {
            HANDLER[sig].store(0, Ordering::Release);
        }
    }
}

/// Performs the guest's `sigaltstack` with the engine's own alternate stack
/// (`ThreadCtx::alt_stack`) hidden: the program sees only the stack it set itself (none,
/// `SS_DISABLE`, until it does), and when it disables its own the engine's is registered
/// again. The kernel performs the call as asked, so its checks and errors (`EFAULT`,
/// `EINVAL`, `ENOMEM` for a small stack, `EPERM` while running on the stack) are the
/// program's.
pub(crate) fn emulate_sigaltstack(ctx: &ThreadCtx) -> i64 {
    const SYS_SIGALTSTACK: usize = 131;
    const SS_DISABLE: u32 = 2;
    let (ss, oss) = (ctx.gregs[c::RDI], ctx.gregs[c::RSI]);
    // SAFETY: the guest's own system call with its own arguments; the kernel validates them.
    let r = unsafe { oxgrind_sys::syscall::syscall2(SYS_SIGALTSTACK, ss as usize, oss as usize) }
        as i64;
    if r != 0 {
        return r;
    }
    if oss != 0 {
        // SAFETY: the kernel has just written a stack_t (24 bytes) at `oss`.
        let old = unsafe { core::ptr::read_unaligned(oss as *const [u64; 3]) };
        if old[0] == ctx.alt_stack[0] && old[2] == ctx.alt_stack[2] {
            // What the kernel had was the engine's stack: the program had none.
            // SAFETY: as above, the kernel wrote there.
            unsafe { core::ptr::write_unaligned(oss as *mut [u64; 3], [0, SS_DISABLE as u64, 0]) };
        }
    }
    if ss != 0 {
        // SAFETY: the kernel has just read a stack_t at `ss`; ss_flags is its int at 8.
        let flags = unsafe { core::ptr::read_unaligned((ss + 8) as *const u32) };
        if flags & SS_DISABLE != 0 {
            crate::context::register_alt_stack(ctx);
        }
    }
    0
}

/// Rust half of `oxg_sig_entry`. Returns the guest handler to enter, or 0 when the signal
/// was deferred (the entry then returns to the kernel's restorer).
///
/// # Safety
/// Only called from `oxg_sig_entry` with the kernel's arguments.
pub(crate) unsafe extern "C" fn on_signal(sig: u64, info: *const u8, uc: *const u8) -> u64 {
    let gs = c::gs_base();
    let sig = sig as usize;
    if gs == 0 || sig >= NSIG {
        return 0;
    }
    let handler = HANDLER[sig].load(Ordering::Acquire);
    // SAFETY: gs points at this thread's context (the engine sets it for every thread).
    let ctx = unsafe { &mut *(gs as *mut ThreadCtx) };
    let uc = uc as *mut u8;
    // SAFETY: the kernel passes a valid siginfo_t; si_code is the i32 at offset 8.
    let code = unsafe { core::ptr::read(info.add(8) as *const i32) };
    if sig == SIGTRAP && ctx.stepping != 0 && code > 0 {
        // Signals arriving while this runs are deferred like any signal in the engine
        // (this code takes the cache lock: a nested delivery would spin on it).
        let was_in_engine = ctx.in_engine;
        ctx.in_engine = 1;
        // SAFETY: uc is the kernel's writable ucontext for this trap.
        unsafe { step(ctx, uc, was_in_engine != 0) };
        ctx.in_engine = was_in_engine;
        return 0;
    }
    if ctx.in_engine != 0 {
        let fault = matches!(sig, 4 | 5 | 7 | 8 | 11) && code > 0;
        if ctx.native_try != 0 && matches!(sig, 7 | 11) && code > 0 {
            // A replaced function's native try touched the program's memory where it
            // cannot (unmapped, or not writable): the try declines, from its gate's call,
            // and the instrumented replacement makes the access and reports it
            // (`asm::oxg_native_try_fault`).
            // SAFETY: uc is the kernel's writable ucontext for this fault.
            unsafe {
                *(uc.add(UC_GREGS) as *mut u64).add(REG_RIP) =
                    asm::oxg_native_try_fault as *const () as u64
            };
            return 0;
        }
        if ctx.native_calls.load(Ordering::Relaxed) != 0
            && (fault || (sig == SIGABRT && unsafe { sent_by_own_process(info, code) }))
        {
            // Native code the embedder runs (its own work, or glibc's allocator on a heap
            // the program smashed) faulted or aborted: neither can reach the program's
            // handler from here, and a deferred abort would be raised again, uncaught, once
            // glibc resets its action. The embedder reports and ends the process.
            // SAFETY: written once before the engine takes over, only read afterwards; not
            // locked, since the interrupted code may hold the lock.
            let on_fatal = unsafe { crate::dispatch::GLOBAL.get_unchecked() }.on_fatal_in_native;
            // SAFETY: the embedder's callback, with the kernel's arguments for this signal.
            let taken = on_fatal.is_some_and(|f| unsafe { f(sig as i32, info, uc) });
            if taken || !fault {
                if !taken {
                    defer(ctx, sig, info);
                }
                return 0;
            }
        }
        if fault {
            // SAFETY: uc is the kernel's ucontext; the rip is gregs[REG_RIP=16] at 40.
            let rip = unsafe { core::ptr::read(uc.add(40 + 16 * 8) as *const u64) };
            fault_inside_engine(sig, rip);
        }
        defer(ctx, sig, info);
        return 0;
    }
    let sync = matches!(sig, 4 | 5 | 7 | 8 | 11 | 31) && code > 0;
    // From here on, signals arriving meanwhile are deferred (the code below takes the
    // cache lock; a nested delivery would spin on it).
    ctx.in_engine = 1;
    // SAFETY: uc is the kernel's writable ucontext for this delivery.
    unsafe {
        if rip_of(uc) == asm::oxg_raise_after as *const () as u64 {
            show_raise_target(ctx, uc);
        }
        if !sync && between_guest_instructions(rip_of(uc)) == Some(false) {
            // Engine code in the cache (a stub, the indirect-branch lookup, a probe): the
            // guest state is not whole here. Step to the next guest instruction and
            // deliver the signal there (`step`).
            defer(ctx, sig, info);
            ctx.stepping = 1;
            set_trap_flag(uc, true);
            ctx.in_engine = 0;
            return 0;
        }
    }
    if handler <= 1 {
        ctx.in_engine = 0;
        if sig == SIGTRAP {
            default_trap(handler, code);
        }
        return 0;
    }
    let level = (ctx.sig_depth as usize) % c::SIG_RING;
    ctx.sig_ring[level] = ctx.scratch;
    // SAFETY: info and uc are the kernel's siginfo and ucontext for this delivery.
    unsafe { show_guest_context(ctx, level, sig, info, uc) };
    if matches!(sig, 7 | 11) && sync && ctx.sig_shown_guest[level] != SHOWN_HOST {
        // SAFETY: info and uc are the kernel's, now showing the guest's registers.
        unsafe { tell_memory_fault(ctx, level, sig, code, info, uc) };
    }
    ctx.sig_depth += 1;
    crate::definedness::signal_delivered(ctx);
    handler
}

/// A synchronous fault in the engine's own code: an engine bug, said in one line, and the
/// end. Out of line and cold: its writer's 4 KiB buffer must not be in `on_signal`'s frame,
/// which may be on the program's small alternate stack.
#[cold]
#[inline(never)]
fn fault_inside_engine(sig: usize, rip: u64) -> ! {
    let mut w = oxgrind_sys::fd::FdWriter::new(crate::dispatch::GLOBAL.lock().out_fd);
    let _ = writeln!(
        w,
        "oxgrind-engine: internal error: signal {sig} at {rip:#x} inside the engine"
    );
    w.flush();
    raw::exit_group(128 + sig as i32)
}

/// A guest instruction's access faulted: the tool hears of it before the program's handler
/// (or the default action) does (`Tool::on_memory_fault`).
///
/// # Safety
/// `info` and `uc` must be the kernel's arguments for this signal, after
/// `show_guest_context` put the guest's registers in `uc`.
unsafe fn tell_memory_fault(
    ctx: &mut ThreadCtx,
    level: usize,
    sig: usize,
    code: i32,
    info: *const u8,
    uc: *mut u8,
) {
    let gregs = uc.wrapping_add(UC_GREGS) as *const u64;
    let mut gpr = [0u64; 16];
    // SAFETY: gregs has 23 entries; GREG_OF's and REG_EFL are among them; si_addr is the
    // u64 at offset 16 of a fault's siginfo.
    let (rflags, addr) = unsafe {
        for (r, &g) in gpr.iter_mut().zip(GREG_OF.iter()) {
            *r = core::ptr::read(gregs.add(g));
        }
        (
            core::ptr::read(gregs.add(REG_EFL)),
            core::ptr::read(info.add(16) as *const u64),
        )
    };
    let fault = oxgrind_tool::MemoryFault {
        sig: sig as i32,
        code,
        addr,
    };
    crate::probe::memory_fault(ctx, &fault, ctx.sig_shown_pc[level], gpr, rflags);
}

const SIGTRAP: usize = 5;
const SIGABRT: usize = 6;

/// Whether the signal came from this process (`kill`, `raise`, `abort`): si_code
/// `SI_USER` (0) or `SI_TKILL` (-6) with si_pid (the i32 at offset 16) ours.
///
/// # Safety
/// `info` must be the kernel's siginfo for the signal.
unsafe fn sent_by_own_process(info: *const u8, code: i32) -> bool {
    // SAFETY: the caller's contract: si_pid is within the 128-byte siginfo.
    (code == 0 || code == -6)
        && unsafe { core::ptr::read(info.add(16) as *const i32) } == raw::getpid() as i32
}
/// `gregs` index of the flags, and the trap flag in them.
const REG_EFL: usize = 17;
const EFLAGS_TF: u64 = 0x100;
/// CF PF AF ZF SF OF: what `lahf; seto al` saves.
const STATUS_FLAGS: u64 = 0x8D5;
/// Steps after which stepping gives up and leaves the signal to the next dispatcher entry.
const MAX_STEPS: u64 = 100_000;

/// Records a signal to be raised again later (its first instance's siginfo is kept).
fn defer(ctx: &mut ThreadCtx, sig: usize, info: *const u8) {
    // SAFETY: pending_signals is only accessed atomically.
    let pending = unsafe { AtomicU64::from_ptr(&mut ctx.pending_signals) };
    // Bit 0 stands for signal 64 (there is no signal 0).
    let bit = 1u64 << (sig % 64);
    if pending.load(Ordering::Acquire) & bit == 0 {
        // A second instance of a pending signal merges with the first, as the kernel
        // does for standard signals; the first one's siginfo is kept.
        // SAFETY: the kernel's siginfo is 128 bytes; the slot is this thread's.
        unsafe {
            core::ptr::copy_nonoverlapping(
                info,
                c::siginfo_slot(ctx as *mut ThreadCtx, sig),
                c::SIGINFO_SIZE,
            )
        };
    }
    pending.fetch_or(bit, Ordering::AcqRel);
}

/// # Safety
/// `uc` must be a kernel ucontext.
unsafe fn rip_of(uc: *mut u8) -> u64 {
    // SAFETY: gregs[REG_RIP] of the ucontext.
    unsafe { core::ptr::read((uc.add(UC_GREGS) as *const u64).add(REG_RIP)) }
}

/// # Safety
/// `uc` must be a writable kernel ucontext.
unsafe fn set_trap_flag(uc: *mut u8, on: bool) {
    // SAFETY: gregs[REG_EFL] of the ucontext.
    unsafe {
        let efl = (uc.add(UC_GREGS) as *mut u64).add(REG_EFL);
        *efl = if on {
            *efl | EFLAGS_TF
        } else {
            *efl & !EFLAGS_TF
        };
    }
}

/// For a host pc of engine code in the cache: whether it is exactly between two guest
/// instructions (`Some(true)`) or inside engine code (`Some(false)`). `None` for pcs
/// outside the cache, its lookup routine and the filtered trace probe's routines.
fn between_guest_instructions(host: u64) -> Option<bool> {
    let ibl2 = asm::oxg_ibl2 as *const () as u64..asm::oxg_ibl2_end as *const () as u64;
    let guard = crate::dispatch::CACHE.lock();
    let cache = guard.as_ref()?;
    if !cache.in_cache(host) && !ibl2.contains(&host) && !crate::trace_checks::contains(host) {
        return None;
    }
    Some(matches!(cache.guest_at(host), Some(g) if g.boundary && g.fix == 0))
}

/// A single-step trap while a deferred signal waits for a guest instruction boundary
/// (`in_engine`: the trap stopped the thread inside the dispatcher).
///
/// # Safety
/// `uc` must be the kernel's writable ucontext of the trap.
unsafe fn step(ctx: &mut ThreadCtx, uc: *mut u8, in_engine: bool) {
    // SAFETY: forwarded.
    let host = unsafe { rip_of(uc) };
    let stop = |ctx: &mut ThreadCtx| {
        ctx.stepping = 0;
        // SAFETY: forwarded.
        unsafe { set_trap_flag(uc, false) };
    };
    if in_engine {
        // Reached the dispatcher: it raises pending signals on its way out.
        stop(ctx);
        return;
    }
    match between_guest_instructions(host) {
        Some(true) => {
            stop(ctx);
            // Raise the signal from here; it arrives in `oxg_raise_tramp`, which
            // `show_raise_target` presents as this boundary.
            let target = maybe_raise(ctx, host);
            if target != host {
                // SAFETY: gregs[REG_RIP] of the writable ucontext.
                unsafe { *(uc.add(UC_GREGS) as *mut u64).add(REG_RIP) = target };
            }
        }
        Some(false) if ctx.stepping < MAX_STEPS => ctx.stepping += 1,
        // Left the cache another way (or too long): the next dispatcher entry delivers.
        _ => stop(ctx),
    }
}

/// A signal re-raised by `oxg_raise_tramp` arrives right after its system call, with
/// seven registers borrowed: put their guest values in the context and present the pc the
/// tramp was going to continue at, so the handler sees the guest state there.
///
/// # Safety
/// `uc` must be the kernel's writable ucontext, stopped at `oxg_raise_after`.
unsafe fn show_raise_target(ctx: &ThreadCtx, uc: *mut u8) {
    let gregs = uc.wrapping_add(UC_GREGS) as *mut u64;
    // Hardware numbers of rax, rdi, rsi, rdx, rcx, r11, r10: the order of T0..T6.
    const SAVED: [usize; 7] = [0, 7, 6, 2, 1, 11, 10];
    // SAFETY: indices come from GREG_OF (all < 23) or are REG_RIP.
    unsafe {
        for (i, &r) in SAVED.iter().enumerate() {
            *gregs.add(GREG_OF[r]) = ctx.scratch[c::S_T0 + i];
        }
        *gregs.add(REG_RIP) = ctx.scratch[c::S_RAISE_TARGET];
    }
}

/// The guest left `SIGTRAP` at its default (or ignored it) and a trap that is not the
/// engine's arrived: do what the kernel would have done.
fn default_trap(handler: u64, code: i32) {
    if handler == 1 && code <= 0 {
        return; // ignored, and sent by kill(): the kernel would have dropped it
    }
    let dfl = KernelSigaction::default();
    // SAFETY: installs SIG_DFL for SIGTRAP; the re-sent signal is delivered once this
    // handler returns, and kills the process as the trap would have natively.
    unsafe {
        raw::rt_sigaction(SIGTRAP, Some(&dfl), None);
    }
    let _ = raw::tgkill(raw::getpid(), raw::gettid(), SIGTRAP as i32);
}

/// Keeps `oxg_sig_entry` installed for `SIGTRAP` even when the guest has no handler: the
/// engine single-steps with the trap flag (see `step`).
pub(crate) fn install_trap_entry() {
    let mut cur = KernelSigaction::default();
    // SAFETY: querying only; `cur` is a valid kernel_sigaction buffer.
    let r = unsafe { raw::rt_sigaction(SIGTRAP, None, Some(&mut cur)) };
    if r != 0 || cur.handler > 1 {
        return; // a real handler: adopt_installed_handlers routes it
    }
    FLAGS[SIGTRAP].store(cur.flags, Ordering::Release);
    HANDLER[SIGTRAP].store(cur.handler, Ordering::Release);
    let mut new = cur;
    new.handler = asm::oxg_sig_entry as *const () as u64;
    new.flags |= SA_SIGINFO | SA_RESTORER;
    new.restorer = asm::oxg_restorer as *const () as u64;
    // SAFETY: installs a valid action for SIGTRAP.
    unsafe { raw::rt_sigaction(SIGTRAP, Some(&new), None) };
}

/// Offset of `uc_mcontext.gregs` in the kernel's `ucontext_t`, and of `REG_RIP` in it.
pub(crate) const UC_GREGS: usize = 40;
const REG_RIP: usize = 16;
/// `REG_RSP` in `uc_mcontext.gregs`.
pub(crate) const REG_RSP: usize = 15;
/// `gregs` index of each hardware register number (rax, rcx, rdx, rbx, rsp, rbp, rsi,
/// rdi, r8..r15).
const GREG_OF: [usize; 16] = [13, 14, 12, 11, 15, 10, 9, 8, 0, 1, 2, 3, 4, 5, 6, 7];

/// What `sig_shown_guest` records for a ring level.
const SHOWN_HOST: u64 = 0;
/// A guest pc at a point where the host code can simply continue.
const SHOWN_GUEST_EXACT: u64 = 1;
/// A guest pc whose registers were fixed up: continuing means re-entering the dispatcher.
const SHOWN_GUEST_FIXED: u64 = 2;

/// Rewrites the signal context so that the guest handler sees guest state: when the
/// thread was stopped in translated code at a place that stands for a guest instruction,
/// `RIP` becomes that instruction's guest address, registers the engine had borrowed get
/// their guest values back, and a `si_addr` equal to the host pc (SIGILL, SIGFPE...)
/// becomes the guest pc too.
///
/// Synchronous faults (raised by the instruction itself) always stop inside the copy of
/// a guest instruction, so they are always mapped. Asynchronous signals are mapped when
/// they arrived exactly between two guest instructions; elsewhere (exit stubs, the
/// indirect-branch lookup, counter updates) the handler sees the host pc, as before.
///
/// # Safety
/// `info` and `uc` must be the kernel's arguments for this signal, `uc` writable.
unsafe fn show_guest_context(
    ctx: &mut ThreadCtx,
    level: usize,
    sig: usize,
    info: *const u8,
    uc: *mut u8,
) {
    use crate::translate::{FIX_FAR_SHIFT, FIX_FLAGS_IN_SLOT, FIX_RAX_IN_STUB, FIX_RCX_PLUS_ONE};
    let gregs = uc.wrapping_add(UC_GREGS) as *mut u64;
    // SAFETY: gregs has 23 entries; REG_RIP is one of them.
    let host = unsafe { core::ptr::read(gregs.add(REG_RIP)) };
    // SAFETY: si_code is the i32 at offset 8 of every siginfo.
    let code = unsafe { core::ptr::read(info.add(8) as *const i32) };
    let sync = matches!(sig, 4 | 5 | 7 | 8 | 11 | 31) && code > 0;
    let mut shown = host;
    let mut kind = SHOWN_HOST;
    {
        let guard = crate::dispatch::CACHE.lock();
        if let Some(cache) = guard.as_ref() {
            match cache.guest_at(host) {
                Some(g) if sync || (g.boundary && g.fix == 0) => {
                    shown = g.pc;
                    kind = if g.fix == 0 {
                        SHOWN_GUEST_EXACT
                    } else {
                        SHOWN_GUEST_FIXED
                    };
                    // SAFETY: indices come from GREG_OF (all < 16) or are REG_RIP.
                    unsafe {
                        if g.fix & FIX_RAX_IN_STUB != 0 {
                            *gregs.add(GREG_OF[0]) = ctx.scratch[c::S_STUB_RAX];
                        }
                        if g.fix & FIX_FLAGS_IN_SLOT != 0 {
                            // `lahf; seto al`: SF ZF AF PF CF in ah (their places in
                            // EFLAGS' low byte), OF in al's bit 0.
                            let saved = ctx.scratch[c::S_PROBE_FLAGS];
                            let efl = gregs.add(REG_EFL);
                            *efl = (*efl & !STATUS_FLAGS)
                                | ((saved >> 8) & 0xD5)
                                | ((saved & 1) << 11);
                        }
                        if g.fix & FIX_RCX_PLUS_ONE != 0 {
                            let r = gregs.add(GREG_OF[1]);
                            *r = (*r).wrapping_add(1);
                        }
                        let far = (g.fix >> FIX_FAR_SHIFT) as usize;
                        if (1..=16).contains(&far) {
                            *gregs.add(GREG_OF[far - 1]) = ctx.scratch[c::S_FAR_SAVE];
                        }
                    }
                }
                Some(_) => {}
                // The guest jumped to code that was not mapped: the pc is a guest one already;
                // continuing must go through the dispatcher (the handler may have mapped it).
                None if cache.is_native_jump(host) => kind = SHOWN_GUEST_FIXED,
                None => {}
            }
        }
    }
    if kind != SHOWN_HOST && shown != host {
        // SAFETY: as above; si_addr is the u64 at offset 16 of a fault's siginfo, and the
        // kernel's siginfo lives in the writable signal frame.
        unsafe {
            *gregs.add(REG_RIP) = shown;
            let addr = info.add(16) as *mut u64;
            if sync && core::ptr::read(addr) == host {
                *addr = shown;
            }
        }
    }
    ctx.sig_host_pc[level] = host;
    ctx.sig_shown_pc[level] = shown;
    ctx.sig_shown_guest[level] = kind;
}

/// Host code that performs a guest `rt_sigreturn`: restores the scratch slots saved when the
/// signal was entered, then makes the system call (all registers come from the frame).
///
/// The context's pc is put back in host terms: unchanged by the handler, the thread
/// continues where it was stopped (or, when registers had been fixed up for the handler,
/// re-enters the dispatcher at the guest pc); changed by the handler, it is a guest
/// address, reached through the dispatcher (`oxg_resume`).
pub(crate) fn sigreturn_tramp(ctx: &mut ThreadCtx) -> u64 {
    // The shared span lookups of the block the thread may go back into were made for
    // registers the handler could have changed, and its own blocks used the same slots:
    // the operands that follow a leader there take the slow path once instead.
    ctx.vbits_span = [0; 2];
    if ctx.sig_depth == 0 {
        ctx.sigret_src = 0;
    } else {
        ctx.sig_depth -= 1;
        let level = (ctx.sig_depth as usize) % c::SIG_RING;
        ctx.sigret_src = ctx.sig_ring[level].as_ptr() as u64;
        // At `rt_sigreturn` the stack pointer is at the frame's ucontext (the restorer's
        // `ret` popped the return address).
        let rip_p = (ctx.gregs[c::RSP] as usize + UC_GREGS + 8 * REG_RIP) as *mut u64;
        // SAFETY: the frame the kernel built for this signal, which `rt_sigreturn` is about
        // to read; a guest that moved its stack elsewhere would fault in the kernel too.
        let rip = unsafe { core::ptr::read_volatile(rip_p) };
        let (host, shown, kind) = (
            ctx.sig_host_pc[level],
            ctx.sig_shown_pc[level],
            ctx.sig_shown_guest[level],
        );
        let target = if rip == shown {
            match kind {
                SHOWN_HOST | SHOWN_GUEST_EXACT => Some(host),
                _ => None,
            }
        } else {
            None
        };
        if target.is_some() && kind == SHOWN_GUEST_EXACT {
            // Between two guest instructions the stub slot either is dead or holds the
            // guest `rax` for the borrows that follow, which leave out their store
            // (`Emitter::stub_has_rax`): the slot restored here must hold the `rax` the
            // handler returns with, which it may have changed in the frame.
            let rax_p = (ctx.gregs[c::RSP] as usize + UC_GREGS + 8 * GREG_OF[0]) as *const u64;
            // SAFETY: the same frame as `rip_p` above, read by `rt_sigreturn` next.
            ctx.sig_ring[level][c::S_STUB_RAX] = unsafe { core::ptr::read_volatile(rax_p) };
        }
        match target {
            Some(h) if h != rip => {
                // SAFETY: as above.
                unsafe { core::ptr::write_volatile(rip_p, h) };
            }
            Some(_) => {}
            None => {
                ctx.resume_pc = rip;
                // SAFETY: as above.
                unsafe { core::ptr::write_volatile(rip_p, asm::oxg_resume as *const () as u64) };
            }
        }
    }
    asm::oxg_sigreturn_tramp as *const () as u64
}

/// If signals were deferred while in the engine, re-raise the lowest one now: the thread
/// goes through `oxg_raise_tramp` (guest registers in place) before `host`.
pub(crate) fn maybe_raise(ctx: &mut ThreadCtx, host: u64) -> u64 {
    // SAFETY: pending_signals is only accessed atomically.
    let pending = unsafe { AtomicU64::from_ptr(&mut ctx.pending_signals) };
    let p = pending.load(Ordering::Acquire);
    if p == 0 {
        return host;
    }
    let sig = p.trailing_zeros() as u64;
    pending.fetch_and(!(1 << sig), Ordering::AcqRel);
    let sig = if sig == 0 { 64 } else { sig };
    ctx.raise_pid = raw::getpid() as u64;
    ctx.raise_tid = raw::gettid() as u64;
    ctx.raise_sig = sig;
    ctx.raise_info = c::siginfo_slot(ctx as *mut ThreadCtx, sig as usize) as u64;
    ctx.scratch[c::S_RAISE_TARGET] = host;
    asm::oxg_raise_tramp as *const () as u64
}
