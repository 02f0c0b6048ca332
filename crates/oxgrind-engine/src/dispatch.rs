//! The dispatcher: where a thread lands whenever translated code does not know where to go.
//!
//! Entered from `oxg_dispatch` (see `asm.rs`) on the thread's engine stack, with the
//! guest's registers saved in its context. It finds or makes the translation of the next
//! guest pc, fills the thread's IBL table, runs the pre-system-call hooks for syscall
//! blocks (clone, exit_group, rt_sigaction, rt_sigreturn) and returns the host address to
//! continue at.
//!
//! Everything here runs while the guest is stopped at an arbitrary instruction: no libc, no
//! program `malloc` (the engine's allocations go to the embedding library's private heap),
//! output only through raw `write` on the engine's own descriptor.

use core::fmt::Write;
use core::sync::atomic::{AtomicU64, Ordering};

use oxgrind_sys::fd::FdWriter;
use oxgrind_sys::lock::SpinLock;
use oxgrind_sys::raw;

use crate::asm;
use crate::cache::{BlockRec, CacheError, CodeCache};
use crate::context::{self as c, ThreadCtx};
use crate::signals;
use crate::translate::{BlockKind, TranslateError};

pub(crate) static CACHE: SpinLock<Option<CodeCache>> = SpinLock::new(None);

/// Engine-wide settings fixed at start.
pub(crate) struct Global {
    pub out_fd: i32,
    pub count: bool,
    pub report: bool,
    pub stats: bool,
    pub on_exit: Option<unsafe extern "C" fn(i32)>,
    pub on_fatal_in_native: Option<unsafe extern "C" fn(i32, *const u8, *mut u8) -> bool>,
    pub on_memory_syscall: Option<fn(&crate::MemorySyscall)>,
    pub on_fd_syscall: Option<fn(&crate::MemorySyscall)>,
    /// The client's tool is told of each program system call before it runs.
    pub before_syscalls: bool,
    /// The embedder's answers to core client requests (`Config::core_requests`).
    pub core_requests: Option<fn(&[u64; 6], &oxgrind_tool::instrument::GuestRegs) -> Option<u64>>,
}

pub(crate) static GLOBAL: SpinLock<Global> = SpinLock::new(Global {
    out_fd: 2,
    count: false,
    report: false,
    stats: false,
    on_exit: None,
    on_fatal_in_native: None,
    on_memory_syscall: None,
    on_fd_syscall: None,
    before_syscalls: false,
    core_requests: None,
});

static EXIT_REPORTED: AtomicU64 = AtomicU64::new(0);

const SYS_RT_SIGACTION: u64 = 13;
const SYS_RT_SIGRETURN: u64 = 15;
const SYS_SIGALTSTACK: u64 = 131;
const SYS_MMAP: u64 = 9;
const MAP_FIXED: u64 = 0x10;
const SYS_MPROTECT: u64 = 10;
const SYS_MUNMAP: u64 = 11;
const SYS_BRK: u64 = 12;
const SYS_MREMAP: u64 = 25;
const PROT_EXEC: u64 = 4;
const PROT_WRITE: u64 = 2;
const SYS_PKEY_MPROTECT: u64 = 329;
const SYS_CLONE: u64 = 56;
const SYS_FORK: u64 = 57;
const SYS_ARCH_PRCTL: u64 = 158;
const SYS_EXIT_GROUP: u64 = 231;
const SYS_CLONE3: u64 = 435;
const CLONE_VM: u64 = 0x100;
const SYS_EXIT: u64 = 60;
const ARCH_SET_GS: u64 = 0x1001;
const ARCH_SET_FS: u64 = 0x1002;
const ARCH_GET_GS: u64 = 0x1004;

/// `arch_prctl(ARCH_SET_GS | ARCH_GET_GS)` against the guest's gs base.
fn arch_prctl_gs(ctx: &mut ThreadCtx) -> i64 {
    let arg = ctx.gregs[c::RSI];
    if ctx.gregs[c::RDI] == ARCH_SET_GS {
        // The kernel refuses non-canonical bases.
        if arg >= 1 << 47 {
            return -1; // EPERM, as the kernel answers
        }
        ctx.guest_gs = arg;
        return 0;
    }
    // A bad pointer must give EFAULT, not a fault inside the engine.
    let writable = CACHE
        .lock()
        .as_mut()
        .is_some_and(|c| c.pages.accessible(arg, 8, true));
    if !writable {
        return -14; // EFAULT
    }
    // SAFETY: the guest passed `arg` for the kernel to write a u64; it is mapped writable.
    unsafe { core::ptr::write_unaligned(arg as *mut u64, ctx.guest_gs) };
    0
}

fn out_fd() -> i32 {
    // SAFETY: GLOBAL is written once before takeover and only read afterwards.
    unsafe { GLOBAL.get_unchecked().out_fd }
}

/// Reports a block that cannot be translated and ends the process with status 1 (the
/// embedder's exit hook runs first).
fn fatal_translate(err: CacheError) -> ! {
    let mut w = FdWriter::new(out_fd());
    match err {
        CacheError::Translate(TranslateError::Invalid { pc, len, bytes })
        | CacheError::Translate(TranslateError::Unsupported { pc, len, bytes }) => {
            let what = if matches!(err, CacheError::Translate(TranslateError::Invalid { .. })) {
                "invalid"
            } else {
                "unsupported"
            };
            let _ = write!(w, "oxgrind-engine: {what} instruction at {pc:#x}, bytes:");
            for b in &bytes[..len.min(16)] {
                let _ = write!(w, " {b:02x}");
            }
            let _ = writeln!(w, "; stopping the program");
        }
        CacheError::Translate(TranslateError::Encode { pc }) => {
            let _ = writeln!(
                w,
                "oxgrind-engine: cannot re-encode instruction at {pc:#x}; stopping the program"
            );
        }
        CacheError::NoMemory => {
            let _ = writeln!(
                w,
                "oxgrind-engine: out of code-cache memory; stopping the program"
            );
        }
    }
    w.flush();
    // Tools still get to write their reports, as for any other exit.
    report_exit(1);
    raw::exit_group(1)
}

fn block_for(pc: u64) -> BlockRec {
    let mut guard = CACHE.lock();
    let cache = guard.as_mut().expect("engine started before any dispatch");
    cache.stats.dispatches += 1;
    #[cfg(feature = "debug-dispatch")]
    {
        *cache.hot.entry(pc).or_insert(0) += 1;
    }
    match cache.get_or_translate(pc) {
        Ok(b) => b,
        Err(e) => {
            drop(guard);
            fatal_translate(e)
        }
    }
}

fn ibl_insert(ctx: &ThreadCtx, pc: u64, host: u64) {
    let keys = c::ibl_keys(ctx).wrapping_add(c::ibl_index(pc));
    let hosts = keys.wrapping_byte_add(c::IBL_HOSTS_OFF - c::IBL_KEYS_OFF);
    let key = pc.wrapping_neg();
    // SAFETY: the arrays have IBL_ENTRIES + 1 words and belong to this thread; only this
    // thread's IBL reads them. A key is written last so a half-written entry (signal in
    // between) never matches; keys are stored negated (see `IBL_KEYS_OFF`).
    unsafe {
        let (k0, k1) = (
            core::ptr::read_volatile(keys),
            core::ptr::read_volatile(keys.add(1)),
        );
        let slot = if k0 == 0 || k0 == key {
            0
        } else if k1 == 0 || k1 == key {
            1
        } else {
            // Both taken: the older entry moves to the second probe, the new one goes first.
            let h0 = core::ptr::read_volatile(hosts);
            core::ptr::write_volatile(keys.add(1), 0);
            core::ptr::write_volatile(hosts.add(1), h0);
            core::ptr::write_volatile(keys.add(1), k0);
            0
        };
        core::ptr::write_volatile(keys.add(slot), 0);
        core::ptr::write_volatile(hosts.add(slot), host);
        core::ptr::write_volatile(keys.add(slot), key);
    }
}

enum Action {
    /// Continue at this host address.
    Run(u64),
    /// The system call was performed by the engine; the result is in the guest's rax.
    Emulated,
}

/// Called by `oxg_dispatch` with the thread's context; returns the host pc to run.
///
/// # Safety
/// Only called from the dispatcher entry, on the engine stack, with `ctx` the calling
/// thread's context and the guest state saved in it.
pub(crate) unsafe extern "C" fn dispatch(ctx: *mut ThreadCtx) -> u64 {
    // SAFETY: forwarded from the caller contract: ctx is this thread's live context.
    let ctx = unsafe { &mut *ctx };
    if ctx.forked != 0 {
        let child = ctx.forked == FORKED_CHILD;
        ctx.forked = 0;
        // First: the child's shadow table must be its own before anything reads it.
        crate::definedness::views::after_fork(child);
        release_after_fork();
        if child {
            after_fork_child();
        }
    }
    if ctx.pending_child != 0 {
        clone_handshake(ctx);
    }
    if ctx.probe_rec != 0 {
        let rec = ctx.probe_rec;
        ctx.probe_rec = 0;
        crate::census::probe(rec, {
            if ctx.vbits_need_step != 0 {
                crate::census::STEP_DUE
            } else if ctx.vbits_own_code | ctx.vbits_signal != 0 {
                crate::census::STEP_CATCH_UP
            } else {
                crate::census::STEP_OTHER
            }
        });
        crate::probe::run(ctx, rec);
        return signals::maybe_raise(ctx, ctx.scratch[c::S_PROBE_RET]);
    }
    let mut pc = ctx.next_pc;
    if ctx.smc_stale != 0 {
        ctx.smc_stale = 0;
        if let Some(cache) = CACHE.lock().as_mut() {
            cache.drop_stale(pc);
        }
    }
    if ctx.scratch[c::S_CALL_RETURNED] != 0 {
        ctx.scratch[c::S_CALL_RETURNED] = 0;
        match syscall_returned(ctx, pc) {
            // Performed again: its block is run anew.
            Some(again) => return signals::maybe_raise(ctx, again),
            None => pc += 2,
        }
    }
    let host = loop {
        crate::census::lookup(pc);
        let b = block_for(pc);
        match b.kind {
            BlockKind::Normal => {
                if b.cached {
                    ibl_insert(ctx, pc, b.host);
                }
                break b.host;
            }
            BlockKind::Syscall => match {
                if crate::definedness::enabled() {
                    crate::definedness::before_syscall(ctx, pc);
                }
                // SAFETY: GLOBAL is written once before takeover and only read afterwards.
                if unsafe { GLOBAL.get_unchecked().before_syscalls } {
                    tool_before_syscall(ctx, pc);
                }
                pre_syscall(ctx, pc, b.host)
            } {
                Action::Run(h) => {
                    if h == b.host {
                        ctx.scratch[c::S_CALL_NR] = ctx.gregs[c::RAX];
                        ctx.scratch[c::S_CALL_LOANS] = oxgrind_sys::lent_fd::loans();
                    }
                    break h;
                }
                Action::Emulated => {
                    if GLOBAL.lock().count {
                        ctx.count += 1;
                    }
                    pc += 2;
                }
            },
        }
    };
    signals::maybe_raise(ctx, host)
}

/// The program's system call at `pc`, which its `syscall` block has just made, is back
/// (see `translate::special::syscall_block`) with its result in `rax`: every call when
/// `Config::on_fd_syscall` is set, which hears here what a descriptor call did, else one
/// that failed with `EMFILE`. If oxgrind held one of the program's descriptor slots during
/// the call (`oxgrind_sys::lent_fd`), that failure is ours: the call is set up to run
/// again once the slot is returned, with its number back in `rax`, and its block's host
/// address is returned. `None`: the program goes on after the call.
fn syscall_returned(ctx: &mut ThreadCtx, pc: u64) -> Option<u64> {
    let (nr, result) = (ctx.scratch[c::S_CALL_NR], ctx.gregs[c::RAX] as i64);
    if oxgrind_sys::lent_fd::retry_emfile(result, ctx.scratch[c::S_CALL_LOANS]) {
        ctx.gregs[c::RAX] = nr;
        ctx.scratch[c::S_CALL_LOANS] = oxgrind_sys::lent_fd::loans();
        return Some(block_for(pc).host);
    }
    // SAFETY: GLOBAL is written once before takeover and only read afterwards.
    let hook = unsafe { GLOBAL.get_unchecked() }.on_fd_syscall;
    if let (Some(hook), true) = (hook, is_fd_syscall(nr)) {
        // The arguments are still in their registers: the kernel keeps all but rax, rcx
        // and r11. The registers are shown as they were at the call.
        let g = &ctx.gregs;
        let args = c::syscall_args(g);
        let mut gpr = ctx.gregs;
        gpr[c::RAX] = nr;
        hook(&crate::MemorySyscall {
            nr,
            args,
            result,
            regs: oxgrind_tool::instrument::GuestRegs {
                gpr,
                rip: pc,
                rflags: ctx.gflags,
            },
        });
    }
    None
}

/// The system calls that create or close descriptors (`Config::on_fd_syscall`): open,
/// close, pipe, dup, dup2, socket, socketpair, accept, fcntl, creat, openat, accept4,
/// dup3, pipe2, close_range, openat2.
fn is_fd_syscall(nr: u64) -> bool {
    matches!(
        nr,
        2 | 3 | 22 | 32 | 33 | 41 | 43 | 53 | 72 | 85 | 257 | 288 | 292 | 293 | 436 | 437
    )
}

/// Tells the tool of the program's system call at `pc` before anything runs it
/// (`Tool::before_syscall`: Memcheck checks the memory its arguments name). The runtime's
/// own calls are not the program's.
fn tool_before_syscall(ctx: &mut ThreadCtx, pc: u64) {
    let Some(cl) = crate::probe::client() else {
        return;
    };
    if cl.embedder.is_own_code(pc) {
        return;
    }
    let g = &ctx.gregs;
    let nr = g[c::RAX];
    let args = c::syscall_args(g);
    let regs = oxgrind_tool::instrument::GuestRegs {
        gpr: ctx.gregs,
        rip: pc,
        rflags: ctx.gflags,
    };
    let _lent = crate::probe::ToolRegsLent::new(ctx, &regs);
    cl.embedder.call(true, &mut || {
        cl.tool.before_syscall(cl.host, nr, &args, &regs)
    });
}

fn pre_syscall(ctx: &mut ThreadCtx, pc: u64, host: u64) -> Action {
    let nr = ctx.gregs[c::RAX];
    match nr {
        SYS_EXIT => {
            crate::trace::drain(ctx, true);
            c::retire(ctx);
            Action::Run(host)
        }
        SYS_EXIT_GROUP => {
            // The embedder's report sees the program as it makes the call: its leak
            // check scans this thread's stack from here and its registers, as Valgrind's
            // does at this moment.
            let regs = oxgrind_tool::instrument::GuestRegs {
                gpr: ctx.gregs,
                rip: pc,
                rflags: ctx.gflags,
            };
            let _lent = crate::probe::ToolRegsLent::new(ctx, &regs);
            report_exit(ctx.gregs[c::RDI] as i32);
            Action::Run(host)
        }
        SYS_CLONE | SYS_CLONE3 => {
            let flags = if nr == SYS_CLONE {
                ctx.gregs[c::RDI]
            } else {
                let args = ctx.gregs[c::RDI];
                let readable = CACHE
                    .lock()
                    .as_mut()
                    .is_some_and(|c| c.pages.accessible(args, 8, false));
                if !readable {
                    ctx.gregs[c::RAX] = (-14i64) as u64; // EFAULT
                    return Action::Emulated;
                }
                // SAFETY: clone3's first argument points at struct clone_args, whose first
                // field is the flags word (checked readable); the kernel reads it too.
                unsafe { core::ptr::read_volatile(args as *const u64) }
            };
            if flags & CLONE_VM == 0 {
                // fork-like: the child is a copy of this thread, context included.
                return fork(ctx, pc + 2);
            }
            match prepare_clone(ctx, pc + 2) {
                Some(()) => {
                    if GLOBAL.lock().count {
                        ctx.count += 1;
                    }
                    Action::Run(asm::oxg_clone_tramp as *const () as u64)
                }
                None => {
                    ctx.gregs[c::RAX] = (-12i64) as u64; // ENOMEM
                    Action::Emulated
                }
            }
        }
        SYS_FORK => fork(ctx, pc + 2),
        SYS_RT_SIGACTION => match signals::emulate_sigaction(ctx) {
            Some(r) => {
                ctx.gregs[c::RAX] = r as u64;
                Action::Emulated
            }
            None => Action::Run(host),
        },
        SYS_SIGALTSTACK => {
            ctx.gregs[c::RAX] = signals::emulate_sigaltstack(ctx) as u64;
            Action::Emulated
        }
        SYS_RT_SIGRETURN => {
            if GLOBAL.lock().count {
                ctx.count += 1;
            }
            Action::Run(signals::sigreturn_tramp(ctx))
        }
        SYS_MMAP | SYS_MUNMAP | SYS_MREMAP | SYS_BRK
            if GLOBAL.lock().on_memory_syscall.is_some() =>
        {
            let hook = GLOBAL.lock().on_memory_syscall;
            if let Some(hook) = hook {
                performed_memory_syscall(ctx, pc, hook);
            }
            Action::Emulated
        }
        // mmap(MAP_FIXED) replaces whatever was mapped there, code included.
        SYS_MMAP if ctx.gregs[c::R10] & MAP_FIXED != 0 => {
            invalidate(ctx.gregs[c::RDI], ctx.gregs[c::RSI]);
            Action::Run(host)
        }
        SYS_MUNMAP | SYS_MREMAP => {
            invalidate(ctx.gregs[c::RDI], ctx.gregs[c::RSI]);
            Action::Run(host)
        }
        SYS_MPROTECT | SYS_PKEY_MPROTECT => {
            let regs = oxgrind_tool::instrument::GuestRegs {
                gpr: ctx.gregs,
                rip: pc,
                rflags: ctx.gflags,
            };
            let result = mprotect(ctx, nr);
            ctx.gregs[c::RAX] = result as u64;
            // SAFETY: GLOBAL is written once before takeover and only read afterwards.
            if let Some(hook) = unsafe { GLOBAL.get_unchecked() }.on_memory_syscall {
                hook(&crate::MemorySyscall {
                    nr,
                    args: c::syscall_args(&regs.gpr),
                    result,
                    regs,
                });
            }
            Action::Emulated
        }
        SYS_ARCH_PRCTL if ctx.gregs[c::RDI] == ARCH_SET_FS => {
            ctx.fs_base = 0; // read again at the next probe that needs it
            Action::Run(host)
        }
        SYS_ARCH_PRCTL if matches!(ctx.gregs[c::RDI], ARCH_SET_GS | ARCH_GET_GS) => {
            // The hardware gs base is the engine's; the guest's is kept in the context and
            // applied by the translations of its `gs:` operands.
            ctx.gregs[c::RAX] = arch_prctl_gs(ctx) as u64;
            Action::Emulated
        }
        _ => Action::Run(host),
    }
}

/// Performs a guest `mmap`, `munmap`, `mremap` or `brk` here, dropping the translations of
/// what it unmaps or replaces first, and tells the embedder what it did
/// (`Config::on_memory_syscall`). These calls cannot be interrupted by a signal (no `EINTR`,
/// no restart) nor fail with `EMFILE`. Running them from the dispatcher changes nothing the
/// guest can see but `rcx` and `r11`, which the `syscall` instruction clobbers anyway.
fn performed_memory_syscall(ctx: &mut ThreadCtx, pc: u64, hook: fn(&crate::MemorySyscall)) {
    let g = &ctx.gregs;
    let nr = g[c::RAX];
    let args = c::syscall_args(g);
    let regs = oxgrind_tool::instrument::GuestRegs {
        gpr: ctx.gregs,
        rip: pc,
        rflags: ctx.gflags,
    };
    match nr {
        SYS_MMAP if args[3] & MAP_FIXED != 0 => invalidate(args[0], args[1]),
        SYS_MUNMAP | SYS_MREMAP => invalidate(args[0], args[1]),
        _ => {}
    }
    // SAFETY: the guest's own system call with its own arguments; the kernel validates
    // them.
    let result = unsafe {
        oxgrind_sys::syscall::syscall6(
            nr as usize,
            args[0] as usize,
            args[1] as usize,
            args[2] as usize,
            args[3] as usize,
            args[4] as usize,
            args[5] as usize,
        )
    } as i64;
    ctx.gregs[c::RAX] = result as u64;
    hook(&crate::MemorySyscall {
        nr,
        args,
        result,
        regs,
    });
}

/// `ThreadCtx::forked` while a fork is in flight: the parent keeps [`FORKING`], the child's
/// copy is set to [`FORKED_CHILD`] by `oxg_fork_tramp`; the next dispatch of each releases
/// what [`hold_for_fork`] took.
const FORKING: u64 = 2;
const FORKED_CHILD: u64 = 1;

/// Runs a fork-like system call through `oxg_fork_tramp`, so the child can repair locks.
fn fork(ctx: &mut ThreadCtx, next_pc: u64) -> Action {
    ctx.clone_next_pc = next_pc;
    if GLOBAL.lock().count {
        ctx.count += 1;
    }
    hold_for_fork();
    if !crate::definedness::views::copy_for_child() {
        // No copy of the shadow's table for the child (address space exhausted): the fork
        // fails as the kernel's would for want of memory.
        crate::definedness::views::after_fork(false);
        release_after_fork();
        ctx.gregs[c::RAX] = (-12i64) as u64; // ENOMEM
        return Action::Emulated;
    }
    ctx.forked = FORKING;
    Action::Run(asm::oxg_fork_tramp as *const () as u64)
}

/// Takes the locks other threads may hold in the middle of an update the child could not
/// repair (the private heap, the registries of exited threads), so the child inherits them
/// consistent; the engine's caches are repaired in the child instead (`after_fork_child`).
/// All or nothing with a yield in between: a holder may need another of them (a thread
/// exiting allocates), and waiting while holding could deadlock.
fn hold_for_fork() {
    loop {
        if let Some(exited) = crate::context::try_hold_exited() {
            if let Some(ended) = crate::thread_state::try_hold_ended() {
                // The lock new entries of the shadow's table are made under (its holders
                // take no other lock): the child's copy of the table is made under it.
                if crate::definedness::views::try_hold_for_fork().is_some() {
                    // Last: the holders of the two above allocate.
                    oxgrind_sys::heap::hold_for_fork();
                    core::mem::forget((exited, ended));
                    return;
                }
            }
        }
        oxgrind_sys::raw::sched_yield();
    }
}

/// Gives back what [`hold_for_fork`] took, in the parent and in the child.
fn release_after_fork() {
    // SAFETY: right after the fork this thread prepared with hold_for_fork, which took these
    // locks and forgot their guards; each process releases its copy once.
    unsafe {
        oxgrind_sys::heap::release_after_fork();
        crate::thread_state::release_ended();
        crate::context::release_exited();
    }
}

/// First dispatch in the child of a fork: only this thread exists now, so a lock held by
/// another thread of the parent will never be released. The cache it was updating is
/// abandoned (its code stays valid and mapped) for a fresh one. Every thread's trace
/// records are the parent's, already its to report.
fn after_fork_child() {
    crate::signals::own_handler_table();
    // SAFETY: the child has a single thread, this one, which holds no engine lock here.
    unsafe {
        if GLOBAL.try_lock().is_none() {
            GLOBAL.force_unlock();
        }
        if CACHE.try_lock().is_none() {
            let cache = CACHE.get_unchecked();
            if let Some(old) = cache.take() {
                *cache = Some(old.fresh());
                core::mem::forget(old);
            }
            CACHE.force_unlock();
        }
    }
    crate::context::for_each(|p| {
        // SAFETY: contexts are never freed, and no other thread exists to use them.
        crate::trace::forget(unsafe { &mut *p })
    });
}

/// Drops translations of `[addr, addr+len)` before the program unmaps or replaces it.
fn invalidate(addr: u64, len: u64) {
    crate::translate::forget_mapped_pages();
    let end = addr.saturating_add(len.saturating_add(4095) & !4095);
    if let Some(cache) = CACHE.lock().as_mut() {
        cache.pages.punch(addr, end);
        cache.invalidate(addr, end);
    }
}

/// Performs the guest's `mprotect` (or `pkey_mprotect`) under the code-cache lock, so that
/// no block is translated with the old protection in mind once the new one holds. On
/// success, translations of the range are dropped when it becomes writable (they were
/// made without an entry check) or non-executable (`dlclose`-like reuse of the range).
fn mprotect(ctx: &ThreadCtx, nr: u64) -> i64 {
    let (addr, len, prot) = (ctx.gregs[c::RDI], ctx.gregs[c::RSI], ctx.gregs[c::RDX]);
    let mut guard = CACHE.lock();
    crate::translate::forget_mapped_pages();
    // SAFETY: the guest's own system call with its own arguments; the kernel validates them.
    let r = unsafe {
        oxgrind_sys::syscall::syscall6(
            nr as usize,
            addr as usize,
            len as usize,
            prot as usize,
            ctx.gregs[c::R10] as usize,
            0,
            0,
        )
    } as i64;
    if r == 0 {
        if let Some(cache) = guard.as_mut() {
            let end = addr.saturating_add(len.saturating_add(4095) & !4095);
            cache.pages.protect(addr, end, prot);
            if prot & PROT_WRITE != 0 || prot & PROT_EXEC == 0 {
                cache.invalidate(addr, end);
            }
        }
    }
    r
}

/// Sets up the context of a thread about to be created by `clone(CLONE_VM)`.
fn prepare_clone(ctx: &mut ThreadCtx, next_pc: u64) -> Option<()> {
    crate::definedness::note_thread_created();
    let child = match c::reuse_exited() {
        Some(p) => p,
        None => c::new_ctx(ctx.dispatch)?,
    };
    // SAFETY: child is a fresh (or recycled, reset) context nobody else uses.
    unsafe {
        (*child).gregs[c::RDI] = ctx.gregs[c::RDI];
        (*child).gregs[c::RSI] = ctx.gregs[c::RSI];
        (*child).clone_next_pc = next_pc;
        (*child).guest_gs = ctx.guest_gs;
    }
    ctx.clone_child = child as u64;
    ctx.clone_next_pc = next_pc;
    ctx.pending_child = child as u64;
    Some(())
}

/// Parent side, on its first dispatch after `clone`: wait until the child has moved to its
/// own context, so the next clone may reuse `clone_child`.
fn clone_handshake(ctx: &mut ThreadCtx) {
    let child = ctx.pending_child as *mut ThreadCtx;
    ctx.pending_child = 0;
    let ret = ctx.gregs[c::RAX] as i64;
    if ret <= 0 {
        return; // failed: the child never ran (its context is leaked, phase 1)
    }
    // SAFETY: child is a live context; `started` is written by the child thread.
    let started = unsafe { AtomicU64::from_ptr(&mut (*child).started) };
    let mut spins = 0u32;
    while started.load(Ordering::Acquire) == 0 {
        spins += 1;
        if spins % 64 == 0 {
            raw::sched_yield();
        } else {
            core::hint::spin_loop();
        }
    }
}

/// Writes the engine's exit report (once) and calls the embedder's exit hook.
fn report_exit(status: i32) {
    // Once per process: a vfork child shares this memory with its parent, and its exit
    // must not take the parent's report.
    let pid = raw::getpid() as u64;
    if EXIT_REPORTED.swap(pid, Ordering::AcqRel) == pid {
        return;
    }
    let (count, stats, on_exit) = {
        let g = GLOBAL.lock();
        (g.count && g.report, g.stats, g.on_exit)
    };
    if count || stats {
        let mut w = FdWriter::new(out_fd());
        if count {
            let _ = writeln!(
                w,
                "oxgrind-engine: instructions executed: {}",
                c::total_count()
            );
        }
        if stats {
            if let Some(cache) = CACHE.lock().as_ref() {
                let s = cache.stats;
                let _ = writeln!(
                    w,
                    "oxgrind-engine: blocks translated: {}, code bytes: {}, dispatches: {}, arenas: {}, invalidated: {}, far rip-relative rewrites: {}",
                    s.blocks,
                    s.bytes,
                    s.dispatches,
                    s.arenas,
                    s.invalidated,
                    crate::translate::FAR_REWRITES.load(Ordering::Relaxed)
                );
                let _ = writeln!(
                    w,
                    "oxgrind-engine: checked blocks: {}, stale blocks retranslated: {}, maps reads: {}",
                    s.checked, s.stale, cache.pages.reloads
                );
                let _ = writeln!(
                    w,
                    "oxgrind-engine: thread contexts created: {}, reused: {}",
                    c::CREATED.load(Ordering::Relaxed),
                    c::REUSED.load(Ordering::Relaxed)
                );
                #[cfg(feature = "debug-dispatch")]
                {
                    let mut v: alloc::vec::Vec<(u64, u64)> =
                        cache.hot.iter().map(|(a, b)| (*b, *a)).collect();
                    v.sort_unstable();
                    for (n, pc) in v.iter().rev().take(15) {
                        let k = cache.lookup(*pc).map(|b| b.kind);
                        let _ = writeln!(w, "  {pc:#x}: {n} {k:?}");
                    }
                }
            }
        }
        w.flush();
    }
    if let Some(f) = on_exit {
        // SAFETY: the embedder registered this hook for exactly this moment.
        unsafe { f(status) };
    }
}

/// Total guest instructions executed so far by all threads (counting mode), as the calling
/// thread sees it: exact while no other thread runs, otherwise the others' counts may lag by
/// a bounded amount (`context::total_count_seen_by`).
pub fn instructions_executed() -> u64 {
    match crate::current_context() {
        // SAFETY: current_context is the calling thread's own context.
        Some(ctx) => unsafe { c::total_count_seen_by(ctx) },
        None => c::total_count(),
    }
}
