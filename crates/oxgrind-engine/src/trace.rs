//! Per-thread trace buffers: where the inline `trace_block`/`trace_accesses` probes append
//! their records, and how they reach the tool (`Tool::on_trace`) in batches.
//!
//! A buffer belongs to one thread context and is written only by that thread's translated
//! code (no lock, no atomic). Appends are engine code in the cache, so an asynchronous
//! signal is never delivered in the middle of one (see `signals`): a handler's records
//! follow the interrupted instruction's. A buffer is drained, in order, when a probe finds
//! it past its mark, when the tool asks (`Host::flush_trace`), when its thread exits, and
//! before the tool's `fini`.

use core::sync::atomic::{AtomicBool, Ordering};

use oxgrind_tool::instrument::TraceRecord;

use crate::context::ThreadCtx;

/// Records per buffer (64 KiB).
pub const CAPACITY: usize = 4096;
/// Records left free beyond the drain mark: an inline probe appends all of one
/// instruction's records before it checks the mark (at most `MAX_MEM_OPS`).
const SLACK: usize = 16;
const RECORD: usize = core::mem::size_of::<TraceRecord>();

static ON: AtomicBool = AtomicBool::new(false);

/// Turns tracing on for every context made from now on (before the engine starts).
pub(crate) fn enable() {
    ON.store(true, Ordering::Release);
}

pub(crate) fn enabled() -> bool {
    ON.load(Ordering::Acquire)
}

/// Gives a new context its buffer when tracing is on; `false` if memory is exhausted (the
/// context must then not be used: its translated code would append through a null pointer).
pub(crate) fn attach(ctx: &mut ThreadCtx) -> bool {
    if !enabled() || ctx.trace_base != 0 {
        return true;
    }
    let Some(buf) = oxgrind_sys::raw::mmap_anon(CAPACITY * RECORD) else {
        return false;
    };
    // Records hold program addresses, not pointers the program owns: not leak roots.
    oxgrind_sys::heap::note_private_mapping(buf as usize, CAPACITY * RECORD);
    ctx.trace_base = buf as u64;
    ctx.trace_ptr = buf as u64;
    ctx.trace_end = buf as u64 + ((CAPACITY - SLACK) * RECORD) as u64;
    true
}

/// Appends one record from Rust (the clean-call fallback of an access the inline probe
/// cannot compute, e.g. a gather), draining first if the buffer is past its mark.
pub(crate) fn push(ctx: &mut ThreadCtx, rec: TraceRecord) {
    if ctx.trace_base == 0 {
        return;
    }
    if ctx.trace_ptr >= ctx.trace_end {
        drain(ctx);
    }
    // SAFETY: trace_ptr lies in [base, end + SLACK records) of this thread's buffer, and
    // only this thread writes it.
    unsafe { core::ptr::write(ctx.trace_ptr as *mut TraceRecord, rec) };
    ctx.trace_ptr += RECORD as u64;
}

/// Hands the records of `ctx`'s buffer to the tool and empties it. Re-entry (the tool
/// asking for a flush from inside `on_trace`), or a drain of the same buffer by another
/// thread at the end of the process, does nothing.
pub(crate) fn drain(ctx: &mut ThreadCtx) {
    if ctx.trace_base == 0 || ctx.trace_ptr == ctx.trace_base {
        return;
    }
    if ctx
        .trace_draining
        .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    let n = ((ctx.trace_ptr - ctx.trace_base) as usize / RECORD).min(CAPACITY);
    // SAFETY: the first `n` records of the buffer were written by this thread's probes
    // (or `push`); the buffer stays mapped for the life of the process.
    let records = unsafe { core::slice::from_raw_parts(ctx.trace_base as *const TraceRecord, n) };
    if let Some(c) = crate::probe::client() {
        c.embedder
            .call(false, &mut || c.tool.on_trace(c.host, records));
    }
    ctx.trace_ptr = ctx.trace_base;
    ctx.trace_draining.store(0, Ordering::Release);
}

/// Drains the calling thread's buffer (`Host::flush_trace`), if it runs under the engine.
pub fn flush_current() {
    if let Some(ctx) = crate::current_context() {
        // SAFETY: the calling thread's own live context; only this thread drains it here.
        drain(unsafe { &mut *ctx });
    }
}

/// Before the tool's report: the calling thread's records first, then those the other
/// threads have not handed over (they are about to be killed by `exit_group`; a record
/// they append meanwhile may be missed).
pub fn flush_all() {
    let Some(own) = crate::current_context() else {
        return;
    };
    // SAFETY: the calling thread's own live context.
    drain(unsafe { &mut *own });
    let own_ptr = own;
    crate::context::for_each(|p| {
        if p != own_ptr {
            // SAFETY: contexts are never freed. Another thread may still run: a drain it
            // makes at the same time is excluded by `trace_draining`; records it appends
            // meanwhile may be missed (the process is ending).
            drain(unsafe { &mut *p });
        }
    });
}

/// In a forked child: the records in the buffer are the parent's, already its to report.
pub(crate) fn forget(ctx: &mut ThreadCtx) {
    ctx.trace_ptr = ctx.trace_base;
    ctx.trace_draining.store(0, Ordering::Relaxed);
}
