//! Per-thread trace buffers: where the inline `trace_block`/`trace_accesses` probes append
//! their records, and how they reach the tool (`Tool::on_trace`) in batches.
//!
//! A buffer belongs to one thread context and is written only by that thread's translated
//! code (no lock, no atomic). Appends are engine code in the cache, so an asynchronous
//! signal is never delivered in the middle of one (see `signals`): a handler's records
//! follow the interrupted instruction's. A buffer is drained, in order, when a probe finds
//! it past its mark, when the tool asks (`Host::flush_trace`), when its thread exits, and
//! before the tool's `fini`.

use core::sync::atomic::{compiler_fence, AtomicBool, Ordering};

use oxgrind_tool::instrument::TraceRecord;

use crate::context::ThreadCtx;

/// Records per buffer (64 KiB).
pub const CAPACITY: usize = 4096;
/// Records left free beyond the drain mark: an inline probe appends all of one
/// instruction's records before it checks the mark (at most `MAX_MEM_OPS`).
const SLACK: usize = 16;
const RECORD: usize = core::mem::size_of::<TraceRecord>();

static ON: AtomicBool = AtomicBool::new(false);
/// The tool declared `Needs::hot_ranges`.
static HOT: AtomicBool = AtomicBool::new(false);

/// Turns hot ranges on (before the engine starts).
pub(crate) fn enable_hot() {
    HOT.store(true, Ordering::Release);
}

/// Whether filtered trace probes test the thread's hot ranges first.
pub(crate) fn hot_enabled() -> bool {
    HOT.load(Ordering::Acquire)
}

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
    crate::trace_checks::attach(ctx);
    true
}

/// Appends one record from Rust (the clean-call fallback of an access the inline probe
/// cannot compute, e.g. a gather), draining first if the buffer is past its mark.
pub(crate) fn push(ctx: &mut ThreadCtx, rec: TraceRecord) {
    if ctx.trace_base == 0 {
        return;
    }
    if ctx.trace_ptr >= ctx.trace_end {
        drain(ctx, false);
    }
    // SAFETY: trace_ptr lies in [base, end + SLACK records) of this thread's buffer, and
    // only this thread writes it.
    unsafe { core::ptr::write(ctx.trace_ptr as *mut TraceRecord, rec) };
    ctx.trace_ptr += RECORD as u64;
}

/// How the probes test one hot range (`ThreadCtx::hot_tests`): with `rax` holding the
/// previous range's `rax - lo` (the address, for the first range), `sub rax, step` gives
/// `address - lo` of this one, and the access lies in the range when that is below `len`
/// (unsigned: an address below `lo` wraps to a large number). An empty range has `len` 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HotTest {
    pub step: u64,
    pub len: u64,
}

/// Recomputes `ctx.hot_tests` from `ctx.hot` (each `hi`, 0 under a hold, as it is now).
fn sync_hot_tests(ctx: &mut ThreadCtx) {
    let mut prev = 0u64;
    for (t, h) in ctx.hot_tests.iter_mut().zip(ctx.hot.iter()) {
        t.step = h.lo.wrapping_sub(prev);
        t.len = h.hi.saturating_sub(h.lo);
        prev = h.lo;
    }
}

/// Starts a hold on `ctx`'s buffer: records appended from now on are not the program's, and
/// nothing is counted in the hot ranges (their ends wait in `hot_hi_held`).
///
/// The embedder's hold runs translated, so a probe of its own code may drain the buffer
/// between any two of its steps (as a signal handler would run): the steps are ordered so
/// that such a drain always finds a consistent state (`holders` counts the hold before the
/// hold point is set, and a hold point of 0 is "not set yet", which a drain leaves alone).
fn push_hold(ctx: &mut ThreadCtx) {
    ctx.trace_holders += 1;
    compiler_fence(Ordering::SeqCst);
    if ctx.trace_holders == 1 {
        ctx.trace_hold = ctx.trace_ptr;
        for (h, held) in ctx.hot.iter_mut().zip(ctx.hot_hi_held.iter_mut()) {
            *held = h.hi;
            h.hi = 0;
        }
        sync_hot_tests(ctx);
        crate::context::count_indexed_into_own(ctx, false);
    }
}

/// Ends a hold; with the last one, what was appended under the holds is dropped and the hot
/// ranges count again.
/// (Ordered for a drain between any two steps, as `push_hold`: the hold is counted until
/// its records are dropped and its point cleared.)
fn pop_hold(ctx: &mut ThreadCtx) {
    if ctx.trace_holders == 0 {
        return;
    }
    if ctx.trace_holders > 1 {
        ctx.trace_holders -= 1;
        return;
    }
    drop_to_hold(ctx);
    for (h, held) in ctx.hot.iter_mut().zip(ctx.hot_hi_held.iter()) {
        h.hi = *held;
    }
    sync_hot_tests(ctx);
    compiler_fence(Ordering::SeqCst);
    ctx.trace_hold = 0;
    compiler_fence(Ordering::SeqCst);
    ctx.trace_holders = 0;
    crate::context::count_indexed_into_own(ctx, true);
}

/// Whether `ctx`'s hot ranges hold counts the tool has not seen.
fn hot_pending(ctx: &ThreadCtx) -> bool {
    hot_enabled()
        && ctx
            .hot
            .iter()
            .any(|h| h.read_bytes != 0 || h.write_bytes != 0)
}

/// Hands `records` of `ctx`'s thread to the tool, with its hot ranges and their counts
/// (`Tool::on_trace_hot`) when there are any. Called under a hold (the drain's own): each
/// range's end is in `hot_hi_held`, where the range the tool sets goes too.
fn deliver(ctx: &mut ThreadCtx, records: &[TraceRecord]) {
    let Some(c) = crate::probe::client() else {
        return;
    };
    if !hot_enabled() {
        c.embedder
            .call(false, &mut || c.tool.on_trace(c.host, records));
        return;
    }
    let mut hot = ctx.hot;
    for (h, held) in hot.iter_mut().zip(ctx.hot_hi_held.iter()) {
        h.hi = *held;
    }
    c.embedder.call(false, &mut || {
        c.tool.on_trace_hot(c.host, records, &mut hot)
    });
    for ((live, held), new) in ctx
        .hot
        .iter_mut()
        .zip(ctx.hot_hi_held.iter_mut())
        .zip(hot.iter())
    {
        live.lo = new.lo;
        *held = new.hi;
        live.read_bytes = 0;
        live.write_bytes = 0;
    }
    // (Under the drain's hold: every `hi` is 0, so only the steps change.)
    sync_hot_tests(ctx);
}

/// No thread counts in `[lo, hi)` any more (`Host::forget_hot_range`): the overlapping hot
/// ranges of every context are emptied, their starts and counts kept for the tool. Another
/// thread may be adding to one meanwhile (its count then arrives with the empty range), or
/// be delivering its own (the range it sets then stands: the tool must check a range's
/// block when it takes its counts).
pub fn forget_hot_range(lo: u64, hi: u64) {
    if !hot_enabled() {
        return;
    }
    crate::context::for_each(|p| {
        // SAFETY: contexts are never freed; the fields are plain words another thread may
        // write at the same time (see above), read and written volatile.
        unsafe {
            for r in 0..oxgrind_tool::instrument::HOT_RANGES {
                let h = core::ptr::addr_of_mut!((*p).hot[r]);
                let held = core::ptr::addr_of_mut!((*p).hot_hi_held[r]);
                let start = core::ptr::addr_of!((*h).lo).read_volatile();
                let end = core::ptr::addr_of!((*h).hi)
                    .read_volatile()
                    .max(held.read_volatile());
                if start < hi && lo < end {
                    core::ptr::addr_of_mut!((*h).hi).write_volatile(0);
                    core::ptr::addr_of_mut!((*p).hot_tests[r].len).write_volatile(0);
                    held.write_volatile(0);
                }
            }
        }
    });
}

/// Drops the records appended since the hold began. The recent-lines table described
/// them too (it must name only lines the tool sees): it starts empty again.
fn drop_to_hold(ctx: &mut ThreadCtx) {
    if ctx.trace_hold == 0 {
        return; // the hold point is not set (yet, or any more): nothing is known to drop
    }
    if ctx.trace_ptr != ctx.trace_hold {
        crate::recent_lines::clear(ctx);
    }
    ctx.trace_ptr = ctx.trace_hold;
}

/// Hands the program's records in `ctx`'s buffer (those before a hold) to the tool and
/// empties it; records appended under a hold are dropped. `ctx` is the calling thread's.
/// `asked`: the tool asked for it (`Host::flush_trace`) or the thread ends, so the tool
/// may be called under the embedder's hold; otherwise the buffer is merely full, and under
/// a hold (the embedder or the tool is running, maybe in the middle of its own work) only
/// the records appended under it are dropped, to make room.
///
/// The tool's and the embedder's own code runs translated when it is called from the
/// program's thread (an allocator hook, `fini`, `Host::flush_trace`), and the libc
/// functions it calls (`memcpy` of a growing vector) are instrumented like the program's:
/// their records must neither reach the tool as the program's nor make it re-enter itself
/// (a tool's lock held by the interrupted call: a deadlock), and a buffer must never grow
/// past its end because a drain could not run (records written over the memory after it).
/// So a drain holds the buffer while it delivers, and a drain that finds the buffer being
/// delivered drops what was appended since: both are the tool's own work.
pub(crate) fn drain(ctx: &mut ThreadCtx, asked: bool) {
    if ctx.trace_base == 0 {
        return;
    }
    if !asked && ctx.trace_holders != 0 {
        drop_to_hold(ctx);
        return;
    }
    loop {
        if ctx
            .trace_draining
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            break;
        }
        if ctx.trace_holders != 0 {
            // Re-entered by the tool's own work while this thread delivers (or the
            // embedder's, while another thread delivers at the end): none of it is the
            // program's.
            drop_to_hold(ctx);
            return;
        }
        // Another thread delivers this buffer (`flush_all` at the end of the process): the
        // appends must wait for the room it makes.
        oxgrind_sys::raw::sched_yield();
    }
    let end = if ctx.trace_holders != 0 {
        ctx.trace_hold
    } else {
        ctx.trace_ptr
    };
    if end > ctx.trace_base || hot_pending(ctx) {
        let n = ((end.saturating_sub(ctx.trace_base)) as usize / RECORD).min(CAPACITY);
        push_hold(ctx);
        // SAFETY: the first `n` records of the buffer were written by this thread's probes
        // (or `push`); the buffer stays mapped for the life of the process, and nothing
        // writes them while the hold lasts (appends go after it).
        let records =
            unsafe { core::slice::from_raw_parts(ctx.trace_base as *const TraceRecord, n) };
        deliver(ctx, records);
        // Everything after the delivered records was appended under a hold.
        if ctx.trace_ptr != end {
            crate::recent_lines::clear(ctx);
        }
        // The delivered records are the tool's now: the buffer is emptied here, not by the
        // hold's end below, which would take them for dropped ones and empty the
        // recent-lines tables at every drain (losing the swap bits they keep, so that the
        // simulator kept lines in another order, and recording every slot's lines again).
        ctx.trace_ptr = ctx.trace_base;
        ctx.trace_hold = ctx.trace_base;
        pop_hold(ctx);
    } else if ctx.trace_holders != 0 {
        drop_to_hold(ctx);
    }
    ctx.trace_draining.store(0, Ordering::Release);
}

/// Another thread's buffer, at the end of the process: the records it has appended so far
/// (before its hold, if it is inside the embedder). It may still run: a record it appends
/// meanwhile may be missed, and its own drains wait for this one (see `drain`).
fn drain_other(ctx: &mut ThreadCtx) {
    if ctx
        .trace_draining
        .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    let (base, hold, ptr) = (ctx.trace_base, ctx.trace_hold, ctx.trace_ptr);
    let end = if hold != 0 { hold } else { ptr };
    if base != 0 && (end > base || hot_pending(ctx)) {
        let n = ((end.saturating_sub(base)) as usize / RECORD).min(CAPACITY);
        // SAFETY: as in `drain`; the owner only appends after `end` or waits for this drain.
        let records = unsafe { core::slice::from_raw_parts(base as *const TraceRecord, n) };
        if let Some(c) = crate::probe::client() {
            if hot_enabled() {
                // The counts so far, with each range as it stands; the ranges are left as
                // they are (the thread is about to be ended with the process).
                let mut hot = ctx.hot;
                for (h, held) in hot.iter_mut().zip(ctx.hot_hi_held.iter()) {
                    h.hi = h.hi.max(*held);
                }
                c.embedder.call(false, &mut || {
                    c.tool.on_trace_hot(c.host, records, &mut hot)
                });
                for h in ctx.hot.iter_mut() {
                    h.read_bytes = 0;
                    h.write_bytes = 0;
                }
            } else {
                c.embedder
                    .call(false, &mut || c.tool.on_trace(c.host, records));
            }
        }
        ctx.trace_ptr = base;
        if ctx.trace_hold != 0 {
            ctx.trace_hold = base;
        }
    }
    ctx.trace_draining.store(0, Ordering::Release);
}

/// Drains the calling thread's buffer (`Host::flush_trace`), if it runs under the engine.
pub fn flush_current() {
    if let Some(ctx) = crate::current_context() {
        // SAFETY: the calling thread's own live context; only this thread drains it here.
        drain(unsafe { &mut *ctx }, true);
    }
}

/// The embedder's own code starts (`true`) or stops running on the calling thread: the
/// records appended meanwhile (by the libc functions it calls, which run translated) are
/// not the program's and are dropped when the hold ends, and a full buffer is emptied of
/// them without calling the tool; a filtered access probe whose inline check fails does not
/// call the tool either (`ThreadCtx::own_work`: glibc's allocator, called by a hook, reads
/// the chunk headers around the program's blocks, which a tool's shadow marks). Holds nest
/// (each `true` needs its `false`).
pub fn hold(on: bool) {
    let Some(ctx) = crate::current_context() else {
        return;
    };
    // SAFETY: the calling thread's own live context; only this thread changes its holds.
    let ctx = unsafe { &mut *ctx };
    if on {
        ctx.own_work += 1;
    } else {
        ctx.own_work = ctx.own_work.saturating_sub(1);
    }
    if !enabled() || ctx.trace_base == 0 {
        return;
    }
    if on {
        push_hold(ctx);
    } else {
        pop_hold(ctx);
    }
}

/// Before the tool's report: the calling thread's records first, then those the other
/// threads have not handed over (they are about to be killed by `exit_group`; a record
/// they append meanwhile may be missed). Natively ([`crate::run_native`]): reached from
/// the program's exit, the tool's work on the last records would otherwise run translated,
/// slower, and counted by the tool's instruction counters as the program's instructions
/// (DHAT's lifetimes of the blocks live at the end).
pub fn flush_all() {
    crate::run_native(&mut flush_all_here);
}

fn flush_all_here() {
    let Some(own) = crate::current_context() else {
        return;
    };
    // SAFETY: the calling thread's own live context.
    drain(unsafe { &mut *own }, true);
    let own_ptr = own;
    crate::context::for_each(|p| {
        if p != own_ptr {
            // SAFETY: contexts are never freed. Another thread may still run: see
            // `drain_other`.
            drain_other(unsafe { &mut *p });
        }
    });
}

/// In a forked child: the records in the buffer are the parent's, already its to report.
pub(crate) fn forget(ctx: &mut ThreadCtx) {
    if ctx.trace_ptr != ctx.trace_base {
        crate::recent_lines::clear(ctx);
    }
    for h in ctx.hot.iter_mut() {
        h.read_bytes = 0;
        h.write_bytes = 0;
    }
    ctx.trace_ptr = ctx.trace_base;
    if ctx.trace_hold != 0 {
        ctx.trace_hold = ctx.trace_base;
    }
    ctx.trace_draining.store(0, Ordering::Relaxed);
}
