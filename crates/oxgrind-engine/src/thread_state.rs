//! Per-thread tool state (`Needs::thread_state`): bytes of the tool's own, one block per
//! thread, zeroed when the thread starts, kept when it ends so the tool can merge every
//! thread's at the end (`Host::each_thread_state`).
//!
//! A block is reached through the thread's context (no TLS, no lock). It is lent to the
//! tool one call at a time (`tool_state_busy`): a probe in a signal handler that interrupts
//! the thread while it holds its state gets none rather than an alias.

use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};

use oxgrind_sys::lock::SpinLock;

use crate::context::ThreadCtx;

/// Bytes per thread (0: the tool declared none).
static SIZE: AtomicU32 = AtomicU32::new(0);
/// The blocks of threads whose contexts were given to new threads.
static ENDED: SpinLock<Vec<u64>> = SpinLock::new(Vec::new());

/// Holds the list of ended threads' blocks for a `fork` (see `dispatch::hold_for_fork`).
pub(crate) fn try_hold_ended() -> Option<oxgrind_sys::lock::SpinGuard<'static, Vec<u64>>> {
    ENDED.try_lock()
}

/// # Safety
/// Only after `try_hold_ended` succeeded and its guard was forgotten, once per process.
pub(crate) unsafe fn release_ended() {
    // SAFETY: forwarded.
    unsafe { ENDED.force_unlock() }
}

/// Most bytes a tool may declare.
pub const MAX: u32 = 64 << 10;

/// Sets the size for every context made from now on (before the engine starts).
pub(crate) fn configure(bytes: u32) {
    SIZE.store(bytes.min(MAX), Ordering::Release);
}

fn fresh() -> Option<u64> {
    let size = SIZE.load(Ordering::Acquire) as usize;
    let block = oxgrind_sys::raw::mmap_anon(size)? as u64;
    // Tool bookkeeping, not the program's: not a leak root.
    oxgrind_sys::heap::note_private_mapping(block as usize, size);
    Some(block)
}

/// Gives a new context its block; `false` if memory is exhausted.
pub(crate) fn attach(ctx: &mut ThreadCtx) -> bool {
    if SIZE.load(Ordering::Acquire) == 0 || ctx.tool_state != 0 {
        return true;
    }
    match fresh() {
        Some(b) => {
            ctx.tool_state = b;
            true
        }
        None => false,
    }
}

/// A context is reused by a new thread: the old thread's block is kept among the ended
/// ones and the new thread starts from a zeroed one (none if memory is exhausted).
pub(crate) fn renew(ctx: &mut ThreadCtx) {
    if ctx.tool_state == 0 {
        return;
    }
    ENDED.lock().push(ctx.tool_state);
    ctx.tool_state = fresh().unwrap_or(0);
    ctx.tool_state_busy.store(0, Ordering::Relaxed);
}

/// Runs `f` with the calling thread's block (see the module doc).
pub fn with_current(f: &mut dyn FnMut(&mut [u8])) -> bool {
    let size = SIZE.load(Ordering::Acquire) as usize;
    let Some(ctx) = crate::current_context() else {
        return false;
    };
    // SAFETY: the calling thread's own live context.
    let ctx = unsafe { &*ctx };
    if size == 0 || ctx.tool_state == 0 {
        return false;
    }
    if ctx
        .tool_state_busy
        .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return false;
    }
    // SAFETY: the block is `size` bytes of this thread's own mapping, never unmapped; the
    // busy flag (taken above) makes this the only reference to it until it is released.
    let block = unsafe { core::slice::from_raw_parts_mut(ctx.tool_state as *mut u8, size) };
    f(block);
    ctx.tool_state_busy.store(0, Ordering::Release);
    true
}

/// Calls `f` with a copy of every thread's block, live and ended.
pub fn each(f: &mut dyn FnMut(&[u8])) {
    let size = SIZE.load(Ordering::Acquire) as usize;
    if size == 0 {
        return;
    }
    let mut copy = alloc::vec![0u8; size];
    let mut visit = |block: u64| {
        if block == 0 {
            return;
        }
        for (i, b) in copy.iter_mut().enumerate() {
            // SAFETY: blocks are `size`-byte mappings that are never unmapped; their owner
            // may be writing them, so each byte is read once, volatile, into our copy.
            *b = unsafe { core::ptr::read_volatile((block as *const u8).add(i)) };
        }
        f(&copy);
    };
    let mut live = Vec::new();
    crate::context::for_each(|ctx| {
        // SAFETY: contexts are never freed.
        live.push(unsafe { (*ctx).tool_state });
    });
    for b in live {
        visit(b);
    }
    let ended = ENDED.lock().clone();
    for b in ended {
        visit(b);
    }
}
