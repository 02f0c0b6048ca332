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
//! * When a signal arrives while the thread is inside the engine (dispatcher, translation),
//!   it is recorded and re-raised with `tgkill` right after the dispatcher has put the
//!   guest registers back (`maybe_raise`).
//!
//! Not emulated yet (documented limits): the `ucontext` a handler sees holds the *host* pc
//! and may show engine scratch values in registers if the signal hit an exit stub; a
//! re-raised signal loses its original `siginfo` (it arrives as `SI_TKILL`); synchronous
//! faults inside engine code are reported as engine bugs; counts can miss the instructions
//! of a handler that interrupted a counter update.

use core::fmt::Write;
use core::sync::atomic::{AtomicU64, Ordering};

use oxgrind_sys::raw;
use oxgrind_sys::syscall::syscall4;

use crate::asm;
use crate::context::{self as c, ThreadCtx};

const NSIG: usize = 65;
const SA_SIGINFO: u64 = 4;

/// The guest's handler and flags per signal (0 = not intercepted).
static HANDLER: [AtomicU64; NSIG] = [const { AtomicU64::new(0) }; NSIG];
static FLAGS: [AtomicU64; NSIG] = [const { AtomicU64::new(0) }; NSIG];

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KSigaction {
    handler: u64,
    flags: u64,
    restorer: u64,
    mask: u64,
}

/// Performs the guest's `rt_sigaction` with our entry substituted; `None` to let the
/// kernel handle the call unchanged (invalid arguments, SIGKILL/SIGSTOP).
pub(crate) fn emulate_sigaction(ctx: &ThreadCtx) -> Option<i64> {
    let sig = ctx.gregs[c::RDI] as usize;
    let act = ctx.gregs[c::RSI];
    let oact = ctx.gregs[c::RDX];
    if sig == 0 || sig >= NSIG || sig == 9 || sig == 19 || ctx.gregs[c::R10] != 8 {
        return None;
    }
    let prev_handler = HANDLER[sig].load(Ordering::Acquire);
    let prev_flags = FLAGS[sig].load(Ordering::Acquire);
    let mut new = KSigaction::default();
    if act != 0 {
        // SAFETY: the guest passed `act` to the kernel, which would read it the same way.
        // A bad pointer faults here as an engine fault (phase 1 limit) instead of EFAULT.
        new = unsafe { core::ptr::read_unaligned(act as *const KSigaction) };
        if new.handler > 1 {
            // Record first: the signal may arrive as soon as the kernel has the new action.
            FLAGS[sig].store(new.flags, Ordering::Release);
            HANDLER[sig].store(new.handler, Ordering::Release);
            new.handler = asm::oxg_sig_entry as *const () as u64;
            new.flags |= SA_SIGINFO;
        }
    }
    let mut old = KSigaction::default();
    // SAFETY: both structures are valid kernel_sigaction buffers of sigsetsize 8.
    let r = unsafe {
        syscall4(
            13,
            sig,
            if act != 0 {
                &new as *const KSigaction as usize
            } else {
                0
            },
            &mut old as *mut KSigaction as usize,
            8,
        )
    } as i64;
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
        unsafe { core::ptr::write_unaligned(oact as *mut KSigaction, old) };
    }
    Some(0)
}

/// Routes handlers installed before the engine started (by the dynamic loader, libc, or
/// an earlier preloaded library) through `oxg_sig_entry` too, so they run translated like
/// handlers installed later.
pub(crate) fn adopt_installed_handlers() {
    for sig in 1..NSIG {
        if sig == 9 || sig == 19 {
            continue;
        }
        let mut cur = KSigaction::default();
        // SAFETY: querying only (act = NULL); `cur` is a valid kernel_sigaction buffer.
        let r = unsafe { syscall4(13, sig, 0, &mut cur as *mut KSigaction as usize, 8) };
        if r != 0 || cur.handler <= 1 || cur.handler == asm::oxg_sig_entry as *const () as u64 {
            continue;
        }
        FLAGS[sig].store(cur.flags, Ordering::Release);
        HANDLER[sig].store(cur.handler, Ordering::Release);
        let mut new = cur;
        new.handler = asm::oxg_sig_entry as *const () as u64;
        new.flags |= SA_SIGINFO;
        // SAFETY: installs a valid action for a catchable signal.
        let r = unsafe { syscall4(13, sig, &new as *const KSigaction as usize, 0, 8) };
        if r != 0 {
            HANDLER[sig].store(0, Ordering::Release);
        }
    }
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
    if ctx.in_engine != 0 {
        // SAFETY: the kernel passes a valid siginfo_t; si_code is the i32 at offset 8.
        let code = unsafe { core::ptr::read(info.add(8) as *const i32) };
        if matches!(sig, 4 | 5 | 7 | 8 | 11) && code > 0 {
            // SAFETY: uc is the kernel's ucontext; the rip is gregs[REG_RIP=16] at 40.
            let rip = unsafe { core::ptr::read(uc.add(40 + 16 * 8) as *const u64) };
            let mut w = oxgrind_sys::fd::FdWriter::new(crate::dispatch::GLOBAL.lock().out_fd);
            let _ = writeln!(
                w,
                "oxgrind-engine: internal error: signal {sig} at {rip:#x} inside the engine"
            );
            w.flush();
            raw::exit_group(128 + sig as i32);
        }
        // SAFETY: pending_signals is only accessed atomically.
        let pending = unsafe { AtomicU64::from_ptr(&mut ctx.pending_signals) };
        pending.fetch_or(1 << sig, Ordering::AcqRel);
        return 0;
    }
    if handler <= 1 {
        return 0;
    }
    ctx.in_engine = 1;
    let level = (ctx.sig_depth as usize) % c::SIG_RING;
    ctx.sig_ring[level] = ctx.scratch;
    ctx.sig_depth += 1;
    handler
}

/// Host code that performs a guest `rt_sigreturn`: restores the scratch slots saved when the
/// signal was entered, then makes the system call (all registers come from the frame).
pub(crate) fn sigreturn_tramp(ctx: &mut ThreadCtx) -> u64 {
    if ctx.sig_depth == 0 {
        ctx.sigret_src = 0;
    } else {
        ctx.sig_depth -= 1;
        let level = (ctx.sig_depth as usize) % c::SIG_RING;
        ctx.sigret_src = ctx.sig_ring[level].as_ptr() as u64;
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
    ctx.raise_pid = raw::getpid() as u64;
    ctx.raise_tid = raw::gettid() as u64;
    ctx.raise_sig = sig;
    ctx.scratch[c::S_RAISE_TARGET] = host;
    asm::oxg_raise_tramp as *const () as u64
}
