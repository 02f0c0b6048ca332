//! The heap path's hooks: `malloc`, `calloc`, `realloc`, `free`, `operator new` and
//! `operator delete` for a tool that wants of each event only the block, its stack and its
//! tool word, and runs without the translation engine (Massif's `--time-unit=B` and `ms`) or
//! with it only to count the program's instructions (Massif's default `--time-unit=i`):
//! there every event runs natively from the program's call on (`super::set_events_native`), so
//! the only difference from a run without the engine is the call's cost, added to the count
//! once before the tool hears of the event, as the general path adds it
//! (`super::Uncounted::entered`).
//!
//! The general path ([`super::allocate_aligned_here`], [`super::deallocate_here`]) serves
//! every tool and mode: the instruction count kept out of the hook ([`super::Uncounted`],
//! [`super::wrapper_cost`]), hand-offs to native code, page events, redzones, the freed-block
//! queue and its discards, misuse checks. With none of them wanted that was about 600
//! instructions per malloc/free pair of tests and set-up on bench `alloc`, a quarter of
//! what the heap path adds. Here an event is the re-entrancy flag, the fork gate, `errno`,
//! the stack, the block table and the tool's handlers; anything unusual (a call from
//! inside the runtime, a fishy size, an address the table does not know) goes back to the
//! general path before anything was done, so its answers are the general path's.
//!
//! glibc's allocator is called outside the event (neither the re-entrancy flag nor the
//! fork gate held), as the general path calls it with the flag cleared: its locks are its
//! own, kept across `fork` by its own handlers. A block is freed in glibc only after the
//! tool has heard of its free.

use core::ffi::c_void;
use std::sync::atomic::{AtomicPtr, Ordering};

use oxgrind_tool::{AllocFn, Free};

use super::{
    fishy, gated_cost, program_may_allocate, slop, Entry, Event, Uncounted, NOT_COUNTING, NO_STACK,
    PASS_CALLER_COUNTED,
};
use crate::exit::EventGate;
use crate::guard::this_thread;
use crate::host::HOST;
use crate::libc_api::*;
use crate::state::{Runtime, BLOCKS};

/// The runtime, when its heap events take this path ([`enable`]); null otherwise.
static FAST: AtomicPtr<Runtime> = AtomicPtr::new(core::ptr::null_mut());

/// Whether the runtime's events need nothing of the general path beyond what this one
/// does: the engine does not run (`on_load` starts it for the tool's needs or for
/// `--track-fds`) or runs only to count instructions with every event run natively from
/// the program's call on ([`counts_only`]), and there is no redzone, no freed-block queue,
/// no page events, no free stacks, no alignment beyond glibc's 16.
fn suits(rt: &Runtime) -> bool {
    let n = &rt.needs;
    !n.ignores_heap
        && !n.page_events
        && n.redzone == 0
        && n.freelist_vol == 0
        && !n.free_stacks
        && rt.core.alignment <= 16
        && (!crate::wants_engine(n) || counts_only(n))
        && rt.core.track_fds == oxgrind_options::TrackFds::No
}

/// Whether the engine runs only to count the program's instructions (nothing translated
/// for a tool's probes, no definedness, no client requests, no system calls watched), and
/// every allocator call from translated code runs natively as a whole from the program's
/// call on (`super::set_events_native`, decided from the same needs when the engine starts):
/// then none of the hook's own work is translated or counted, as without the engine, and
/// the general path's only extra work is the call's cost added to the count.
fn counts_only(n: &oxgrind_tool::Needs) -> bool {
    n.count_instructions
        && !(n.translation || n.instrument || n.client_requests || n.definedness)
        && !n.before_syscalls
        && super::events_run_natively(n)
}

/// Turns the heap path on for `rt` if it suits ([`suits`]): once, at the end of set-up
/// (`state::ensure_init`). Until then every event takes the general path.
pub fn enable(rt: &'static Runtime) {
    if suits(rt) {
        FAST.store(rt as *const Runtime as *mut Runtime, Ordering::Relaxed);
    }
}

/// Whether heap events take this path.
#[inline(always)]
pub(super) fn on() -> bool {
    !FAST.load(Ordering::Relaxed).is_null()
}

/// The runtime, if heap events take this path.
#[inline(always)]
pub(super) fn runtime() -> Option<&'static Runtime> {
    let p = FAST.load(Ordering::Relaxed);
    // SAFETY: FAST holds null or the runtime, leaked at set-up and never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// An allocation of `size` bytes by `func` (`align`: as the program passed it, 0 if none)
/// that `get` makes in glibc's allocator: the block, or `None` when the general path must
/// serve the call (nothing done yet).
#[inline(always)]
pub(super) fn allocate(
    size: u64,
    align: u64,
    func: AllocFn,
    entry: Entry,
    get: impl FnOnce() -> *mut c_void,
) -> Option<*mut c_void> {
    let rt = runtime()?;
    let thread = this_thread();
    if thread.is_inside() || fishy(size) {
        return None;
    }
    let cost = || super::wrapper_cost(func, &entry);
    if !program_may_allocate(thread) {
        count_call(rt, cost);
        // SAFETY: errno slot of this thread.
        unsafe { *crate::guard::errno_slot() = 12 }; // ENOMEM
        return Some(core::ptr::null_mut());
    }
    // On failure glibc's `errno` is the program's result, and no event follows.
    let p = get();
    if p.is_null() {
        count_call(rt, cost);
        return Some(p);
    }
    let Some(ev) = enter(rt, thread) else {
        // Not inside before glibc's call, so not now: a signal handler that entered the
        // runtime has left it. Recorded as the general path records a block it cannot
        // tell the tool of.
        super::record_alloc(None, p, size, align, func, entry);
        return Some(p);
    };
    count_call(rt, cost);
    super::tell_alloc(&ev, p as u64, size, align, func, entry);
    Some(p)
}

/// A free of `p` (not null) by `func`: `false` when the general path must serve it
/// (nothing done yet).
#[inline(always)]
pub(super) fn deallocate(p: *mut c_void, func: AllocFn) -> bool {
    let Some(rt) = runtime() else {
        return false;
    };
    let thread = this_thread();
    let Some(ev) = enter(rt, thread) else {
        return false;
    };
    let addr = p as u64;
    let removed = BLOCKS.remove(addr);
    if removed.is_some() {
        // Every deallocation function passes its caller on (`pass_caller`).
        count_call(rt, || gated_cost(func, PASS_CALLER_COUNTED));
    }
    // Matched by reference, each field loaded where used (see `deallocate_here`).
    match &removed {
        Some(b) if !b.internal => {
            let f = Free {
                addr,
                size: b.size,
                slop: slop(b.size),
                alloc_stack: b.stack,
                alloc_func: b.func,
                func,
                stack: NO_STACK,
                tid: thread.tid(),
                tool_word: b.tool_word,
            };
            thread.with_event_blocks(0, addr, || rt.tool.on_free(&HOST, &f));
        }
        // The runtime's own block (`internal`): straight back to glibc.
        Some(_) => {}
        // Not a block of the table: an invalid free, or a block made before the engine
        // started by an object's own allocator; the general path tells which.
        None => return false,
    }
    drop(ev);
    // SAFETY: `p` came from glibc's allocator through us, the program freed it and the
    // tool has heard of it; glibc's `free` keeps `errno`.
    unsafe { __libc_free(p) };
    true
}

/// A `realloc` of block `p` to `size` bytes by `func`: the new block (or null, glibc's
/// failure), or `None` when the general path must serve the call (nothing done yet but the
/// look at the room left, which the general path repeats: a counter and a flag). A null
/// `p` or a size of 0 (a `malloc` or a `free`) take the general path, as does a block the
/// table does not know or the runtime's own.
#[inline(always)]
pub(super) fn reallocate(
    p: *mut c_void,
    size: usize,
    func: AllocFn,
    entry: Entry,
) -> Option<*mut c_void> {
    let rt = runtime()?;
    if p.is_null() || size == 0 || fishy(size as u64) {
        return None;
    }
    let thread = this_thread();
    if thread.is_inside() {
        return None;
    }
    let cost = || super::wrapper_cost(func, &entry);
    if !program_may_allocate(thread) {
        count_call(rt, cost);
        // The block stays the program's, as realloc leaves it.
        // SAFETY: errno slot of this thread.
        unsafe { *crate::guard::errno_slot() = 12 }; // ENOMEM
        return Some(core::ptr::null_mut());
    }
    let mut ev = enter(rt, thread)?;
    let addr = p as u64;
    let old = match BLOCKS.remove(addr) {
        Some(b) if !b.internal => b,
        other => {
            if let Some(b) = other {
                BLOCKS.insert(addr, b);
            }
            return None;
        }
    };
    count_call(rt, cost);
    // No freed-block queue, redzone or extra alignment (`suits`): resized where glibc
    // chooses, the old block glibc's again once it returns.
    // SAFETY: `p` is a live block glibc's allocator gave the program.
    let q = super::in_glibc(thread, || unsafe { __libc_realloc(p, size) });
    if q.is_null() {
        BLOCKS.insert(addr, old);
        ev.keep_errno();
        return Some(q);
    }
    super::realloc_event(&ev, entry, addr, q, size, old, func, false);
    Some(q)
}

/// Enters an event on `thread`: `None` when the thread is already inside the runtime.
/// No page events to deliver ([`suits`]); the call's cost is counted apart ([`count_call`]).
#[inline(always)]
fn enter(rt: &'static Runtime, thread: &'static crate::guard::ThreadState) -> Option<Event> {
    let inside = thread.try_enter()?;
    let gate = EventGate::enter_for(thread);
    Some(Event::entered(
        rt,
        thread,
        gate,
        inside,
        Uncounted(NOT_COUNTING),
    ))
}

/// With the engine counting instructions ([`counts_only`]): adds the call's `cost`
/// (`super::wrapper_cost`) to the thread's count, once per call and before the tool hears
/// of the event, wherever the general path would have counted it (its `Event::enter`, for
/// an event run natively): at every outcome of a call this path serves, never before a
/// return to the general path, which counts it itself.
#[inline(always)]
fn count_call(rt: &Runtime, cost: impl FnOnce() -> i64) {
    if rt.needs.count_instructions {
        Uncounted::entered(rt, cost());
    }
}
