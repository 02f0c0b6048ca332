//! The allocator entry points the program calls instead of glibc's.
//!
//! Each hook is one path: serve the request from glibc's allocator (`__libc_malloc` & co),
//! then, if this image is measured and the thread is not already inside oxgrind, capture
//! the stack, record the block and tell the tool. The order matters for `free`: the tool
//! hears of the free *before* the memory is released (Massif takes its peak snapshot then).
//!
//! Blocks allocated while oxgrind is working on the thread (through libc functions the
//! runtime calls) or before set-up finished are recorded as `internal`: `free` still finds
//! them, tools never see them. An address `free` cannot find is the program's bug, reported
//! as an invalid free and never passed to glibc (which would abort or corrupt its heap).
//!
//! `operator new` lives in `shim.c` (it must be able to throw) and calls [`oxgrind_new`].

use core::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use oxgrind_tool::{Alloc, AllocFn, Free, Misuse, MisuseEvent, StackId};

use crate::blocks::{BlockInfo, ShardBusy};
use crate::exit::EventGate;
use crate::guard::{Entered, ThreadState};
use crate::host::HOST;
use crate::libc_api::*;
use crate::stacks;
use crate::state::{self, Runtime, BLOCKS, STACKS};

mod fast;
pub use fast::enable as enable_heap_path;

/// A stack id meaning "not captured" (the tool did not ask for free stacks).
pub const NO_STACK: StackId = StackId(u32::MAX);

/// Where the program called one of our allocation functions: the address of our entry
/// point (frame 0 of the call's stack, see [`own_address`]) and, for the entry points that
/// pass them on ([`malloc`], [`free`], [`calloc`], [`realloc`], the aligned allocation
/// functions, `operator new`, `operator delete`), the program's registers at the call,
/// where the stack walk starts ([`stacks::Caller`]).
#[derive(Clone, Copy)]
struct Entry {
    addr: u64,
    caller: stacks::Caller,
    /// The call came through `oxgrind_engine::native_entry` (`pass_caller`, `operator new`)
    /// when non-zero: when events run natively ([`set_events_native`]), the instructions of
    /// ours that are counted (translated) on the call's way in and out; none of the rest is.
    gated: i64,
    /// What Valgrind's wrapper counts on this call's way beyond the function's own cost
    /// ([`wrapper_cost`]): non-zero only for `reallocarray` of a null pointer.
    extra_cost: i64,
}

/// What the way in and out of an entry point of `pass_caller` counts of ours when it runs
/// natively ([`set_events_native`]): the entry point's two moves, lea and jmp, and the `ret`
/// after the native call.
const PASS_CALLER_COUNTED: i64 = 5;

impl Entry {
    /// An entry point whose caller's registers are not known: the walk starts in the hook
    /// and drops our own frames.
    #[inline]
    fn at(addr: u64) -> Entry {
        Entry {
            addr,
            caller: stacks::Caller::UNKNOWN,
            gated: 0,
            extra_cost: 0,
        }
    }

    /// The entry point of `pass_caller` the program called: its registers at the call.
    #[inline]
    fn gated_from(self, sp: u64, bp: u64) -> Entry {
        self.gated_from_counting(sp, bp, PASS_CALLER_COUNTED)
    }

    /// [`Entry::gated_from`] for a way in that counts `counted` instructions of ours.
    #[inline]
    fn gated_from_counting(self, sp: u64, bp: u64, counted: i64) -> Entry {
        Entry {
            gated: counted,
            ..self.called_from(sp, bp)
        }
    }

    #[inline]
    fn called_from(self, sp: u64, bp: u64) -> Entry {
        Entry {
            caller: stacks::Caller { sp, bp },
            ..self
        }
    }
}

/// Set when every heap event runs natively from its start, glibc's allocator included
/// ([`events_run_natively`]).
static EVENTS_NATIVE: AtomicBool = AtomicBool::new(false);

/// Whether a tool with these needs has its heap events run natively as a whole, glibc's
/// allocator included, by one call out of the code cache (`host::native`) at the hook's
/// start: the tool asks the engine only to count the program's instructions (Massif's
/// `--time-unit=i`), or says the allocator's work is not the program's
/// (`Needs::allocator_unseen`: DHAT, Memcheck), as Valgrind's tools never see its
/// allocator, which runs on its host side. Then nothing of glibc's allocator or of our hook
/// is the tool's to see: the engine's probes would drop their accesses anyway (the
/// allocator's chunk headers are not the program's), Massif's and DHAT's clocks leave their
/// instructions out ([`Uncounted`]), and Memcheck's V bits of a block are set by the event
/// itself (malloc'd undefined, calloc'd defined, realloc's copied, freed defined) whatever
/// glibc wrote into it. Translated, our hook's own code (entry, the re-entrancy flag, the
/// fork gate, the block table) and glibc's cost about five times what they cost natively
/// (most of Massif's time on an allocation loop), and under Memcheck with V bits glibc's
/// code also ran the definedness instrumentation (a third of bench `alloc`'s time). Not
/// when the tool watches system calls as pages (`--pages-as-heap`: glibc's `mmap`s are the
/// program's pages), nor for a tool that instruments code and sees the allocator as the
/// program's (Cachegrind), nor when it runs natively anyway (no engine).
///
/// Natively, glibc's allocator runs as the runtime's own work does: signals wait until the
/// event ends, its system calls are not seen by the engine (its `munmap`s drop no
/// translations, which is sound: heap pages are writable, and translations of writable
/// pages check their code at every entry; the memory it maps keeps the V bits it had,
/// where the blocks the program gets are marked by their events), and a heap that the
/// program corrupted so badly that glibc aborts or faults in it is reported as the
/// program's own fatal signal would be (`exit::fatal_signal_natively`, which the engine
/// calls for a fatal signal in native code).
pub fn events_run_natively(n: &oxgrind_tool::Needs) -> bool {
    crate::wants_engine(n)
        && !n.page_events
        && (n.allocator_unseen || !(n.instrument || n.definedness || n.before_syscalls))
}

/// Decides [`events_run_natively`] once, before the engine starts, and with it that the
/// entry points of `pass_caller` run natively from the program's translated call on
/// (`oxgrind_engine::native_entry`): their work then runs here as a whole, with no second
/// hand-off.
///
/// With V bits tracked (Memcheck) too: the entry points that jump to `native_entry` are
/// the runtime's own code, and the translation of every block of it tells the program's
/// next definedness step so (`vbits_own_code`), whose catch-up takes the caller-saved
/// registers, the result's `rax` among them, as defined: what it did when the hook's code
/// ran translated up to its own hand-off to native code. The argument checks
/// ([`check_arguments`]) read the shadows of the program's call, which nothing on the way
/// changes (the entry point's code is not stepped), natively as translated. Running the
/// hook's prologue (entry, argument check, closures, `run_native`) translated cost
/// Memcheck 490 instructions per malloc/free pair (bench/hookcost.py memcheck 3,758 ->
/// 3,266).
pub fn set_events_native(n: &oxgrind_tool::Needs) {
    let native = events_run_natively(n);
    EVENTS_NATIVE.store(native, Ordering::Relaxed);
    oxgrind_engine::set_native_entries(native);
}

/// Runs a hook's work `f`: natively as a whole when [`EVENTS_NATIVE`] says so, else here.
#[inline(always)]
fn event<R>(f: impl FnOnce() -> R) -> R {
    if EVENTS_NATIVE.load(Ordering::Relaxed) {
        // Set only when the engine runs.
        crate::host::native_from_cache(f)
    } else {
        f()
    }
}

/// Runs `f`, the part of a hook's work that is long and sees nothing of the program (stack
/// capture, block table, the tool's handler), natively: [`crate::host::native`], unless the
/// whole event already runs natively ([`EVENTS_NATIVE`]; every caller is inside [`event`]).
#[inline(always)]
fn natively<R>(f: impl FnOnce() -> R) -> R {
    if EVENTS_NATIVE.load(Ordering::Relaxed) {
        f()
    } else {
        crate::host::native(f)
    }
}

/// Calls glibc's allocator (`f`) on the program's behalf from inside a hook (see
/// `guard::on_behalf_of_program`); when the event runs natively nothing of the program's
/// runs translated on the way.
#[inline(always)]
fn in_glibc<T>(thread: &crate::guard::ThreadState, f: impl FnOnce() -> T) -> T {
    thread.on_behalf_of_program_from(EVENTS_NATIVE.load(Ordering::Relaxed), f)
}

/// Being inside a hook on behalf of the program: holds the re-entrancy flag, the fork gate
/// and the program's `errno`, restored on drop.
struct Event {
    rt: &'static Runtime,
    /// The calling thread's state, looked up once per event (see `guard`).
    thread: &'static ThreadState,
    /// This thread's `errno` (`guard::errno_slot`), found once per event.
    errno_at: *mut c_int,
    errno: c_int,
    _gate: EventGate,
    _inside: Entered,
    /// Last, so that it is dropped last: see [`Uncounted`].
    uncounted: Uncounted,
}

/// With `Needs::count_instructions` (Massif's `--time-unit=i`): keeps a hook's own work out
/// of the thread's instruction count, which the engine keeps for every translated
/// instruction, ours (the hook, glibc's allocator, the tool) included.
///
/// Valgrind's replacement allocator runs on its host side, uncounted, apart from a small
/// wrapper in the program (`vg_replace_malloc.c`: init check, trace, client request), so a
/// call counts the same few dozen instructions whatever the allocator does. Here the count
/// is read when the hook starts and set back to that plus [`wrapper_cost`] before the tool
/// hears of the event (Massif reads the count then, as the snapshot time) and when the
/// hook ends; when the whole event runs natively, where nothing is counted, the cost is
/// added once instead ([`Uncounted::entered`]).
struct Uncounted(u64);

/// [`Uncounted`] when the engine does not count instructions.
const NOT_COUNTING: u64 = u64::MAX;

/// What one call of `func` adds to the count beyond the program's own instructions, as in
/// Valgrind 3.19, less what our hook executes outside the span [`Uncounted`] covers (its
/// prologue up to the reading, its epilogue after the drop: 45 to 108 instructions in the
/// dev profile, measured the same way; calloc has two spans). When the event runs natively
/// ([`events_run_natively`]) that is the translated code up to the call out of the code
/// cache and back from it (native code is never counted). Negative: the count is set below
/// its value at the start. For the entry points that pass their caller's registers on
/// (`pass_caller`), ours includes the entry's two moves and jump. Every allocation function
/// but `cfree` passes its caller on, so when events run natively (always, under Massif's
/// default `--time-unit=i`) the count does not depend on how long the hook's translated
/// code is, which differs between build profiles (posix_memalign: 11 instructions).
///
/// Valgrind's wrapper costs, measured with `valgrind --tool=massif` on loops of N calls
/// (time between consecutive snapshots minus the loop's own instructions): malloc 32,
/// free 25, calloc 50, realloc 34, new/new[] 30, delete/delete[] 25, memalign and
/// aligned_alloc 42, posix_memalign 67, valloc 56, reallocarray 40 (54 of a null pointer,
/// [`Entry::extra_cost`]).
/// `crates/oxgrind/tests/massif_time_i.rs` checks the per-call totals against Valgrind's.
fn wrapper_cost(func: AllocFn, entry: &Entry) -> i64 {
    if entry.gated != 0 && EVENTS_NATIVE.load(Ordering::Relaxed) {
        // Run natively from the program's call on (`oxgrind_engine::native_entry`): what
        // the way in and out translates is all that is counted of ours, in any profile.
        return gated_cost(func, entry.gated) + entry.extra_cost;
    }
    let (valgrind, ours) = wrapper_costs(func);
    valgrind + entry.extra_cost - ours
}

/// [`wrapper_cost`] of a call of `func` that runs natively from the program's call on
/// ([`set_events_native`]), whose way in and out counts `gated` instructions of ours
/// ([`Entry::gated`]).
#[inline]
fn gated_cost(func: AllocFn, gated: i64) -> i64 {
    wrapper_costs(func).0 - gated
}

/// (Valgrind's wrapper, what stays counted of ours with a cost of 0) for `func`
/// ([`wrapper_cost`]).
#[inline]
fn wrapper_costs(func: AllocFn) -> (i64, i64) {
    // Ours: dev profile; the entry points of `pass_caller` when their calls are translated
    // (two more than the measured numbers: the lea and the jump through `native_entry`).
    // (Each "ours" is 2 less than measured then: the engine's `oxg_count_get`, which read
    // the count, counted its 2 instructions until the count was spread over several words;
    // the engine counts nothing of it now.)
    match func {
        AllocFn::Malloc => (32, 82),
        AllocFn::Free => (25, 87),
        AllocFn::Calloc => (50, 65),
        AllocFn::Realloc => (34, 74),
        AllocFn::ReallocArray => (40, 48),
        AllocFn::Memalign => (42, 86),
        AllocFn::PosixMemalign => (67, 119),
        AllocFn::AlignedAlloc => (42, 92),
        // Valgrind 3.19 aborts the program at pvalloc; counted as valloc.
        AllocFn::Valloc | AllocFn::Pvalloc => (56, 71),
        AllocFn::New | AllocFn::NewArray => (30, 109),
        // Through `pass_caller` as free is (74 before, when no delete passed its caller).
        AllocFn::Delete | AllocFn::DeleteArray => (25, 87),
    }
}

impl Uncounted {
    #[inline]
    fn start(rt: &Runtime, cost: i64) -> Uncounted {
        if !rt.needs.count_instructions || EVENTS_NATIVE.load(Ordering::Relaxed) {
            // Run natively, the event counts nothing of its own: see `Uncounted::entered`.
            return Uncounted(NOT_COUNTING);
        }
        let now = oxgrind_engine::thread_instructions();
        Uncounted(now.saturating_add_signed(cost).min(NOT_COUNTING - 1))
    }

    /// Once the event is entered (not a call from inside the runtime): when events run
    /// natively ([`EVENTS_NATIVE`], every caller of `Event::enter` then runs inside
    /// [`event`] or natively from its entry point, [`set_events_native`]), nothing from the
    /// start to the end is counted, so the call's cost is added to the count once, here,
    /// before the tool hears of the event: the same count as the reading at the start and
    /// the two settings to it plus the cost, without their three sums of the count's words
    /// (about 70 instructions per malloc/free pair).
    #[inline]
    fn entered(rt: &Runtime, cost: i64) {
        if cost != 0 && rt.needs.count_instructions && EVENTS_NATIVE.load(Ordering::Relaxed) {
            oxgrind_engine::add_thread_instructions(cost);
        }
    }

    /// Sets the thread's count to what it was at the start plus the call's cost. One
    /// predictable branch when the engine does not count.
    #[inline]
    fn apply(&self) {
        if self.0 != NOT_COUNTING {
            oxgrind_engine::set_thread_instructions(self.0);
        }
    }
}

impl Drop for Uncounted {
    #[inline]
    fn drop(&mut self) {
        self.apply();
    }
}

impl Event {
    /// `cost`: what the call should count as ([`wrapper_cost`]), 0 for an event that
    /// another one of the same call follows.
    #[inline(always)]
    fn enter(cost: i64) -> Option<Event> {
        if !state::settled() {
            state::ensure_init();
        }
        if state::passthrough() {
            return None;
        }
        let rt = state::runtime()?;
        // Read as early as possible: everything from here to the drop is left out.
        let uncounted = Uncounted::start(rt, cost);
        let thread = crate::guard::this_thread();
        let Some(inside) = thread.try_enter() else {
            // Called from inside the runtime: the outer work's count is not ours to set.
            core::mem::forget(uncounted);
            return None;
        };
        Uncounted::entered(rt, cost);
        let gate = EventGate::enter_for(thread);
        crate::pages::deliver_queued();
        Some(Event::entered(rt, thread, gate, inside, uncounted))
    }

    /// The event of a thread that has entered the runtime and passed the fork gate: the
    /// program's `errno` is saved here and put back at the event's end.
    #[inline(always)]
    fn entered(
        rt: &'static Runtime,
        thread: &'static ThreadState,
        gate: EventGate,
        inside: Entered,
        uncounted: Uncounted,
    ) -> Event {
        let errno_at = crate::guard::errno_slot();
        // SAFETY: this thread's errno slot.
        let errno = unsafe { *errno_at };
        Event {
            rt,
            thread,
            errno_at,
            errno,
            _gate: gate,
            _inside: inside,
            uncounted,
        }
    }

    /// The call failed in glibc: the `errno` it set is the program's result, kept past the
    /// event's end (which restores the value it found).
    #[cold]
    fn keep_errno(&mut self) {
        // SAFETY: this thread's errno slot (an event never leaves its thread).
        self.errno = unsafe { *self.errno_at };
    }

    /// See [`Uncounted`]: called just before the tool hears of the event.
    #[inline]
    fn uncount(&self) {
        self.uncounted.apply();
    }

    #[inline]
    fn tid(&self) -> i32 {
        self.thread.tid()
    }

    #[inline]
    fn stack(&self, entry: Entry) -> StackId {
        let depth = self.rt.needs.stack_depth;
        if depth == 0 {
            return NO_STACK;
        }
        stacks::capture(&STACKS, entry.addr, entry.caller, depth)
    }

    fn misuse(&self, entry: Entry, kind: Misuse) {
        let ev = MisuseEvent {
            kind,
            stack: self.stack(entry),
            tid: self.tid(),
        };
        self.thread
            .reporting_misuse(|| self.rt.tool.on_misuse(&HOST, &ev));
    }
}

impl Drop for Event {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: this thread's errno slot, found in `enter` (an event never leaves its
        // thread).
        unsafe { *self.errno_at = self.errno };
    }
}

/// Valgrind's `round_up(size, 16) - size`: the usable bytes past the request its allocator
/// gives, which Massif counts as extra heap. Modelled rather than read from glibc so our
/// numbers match Valgrind's whatever glibc's bins do.
#[inline]
fn slop(size: u64) -> u64 {
    size.next_multiple_of(16) - size
}

/// Valgrind's "fishy" test: a size that is negative when read as signed.
#[inline]
fn fishy(v: u64) -> bool {
    (v as i64) < 0
}

/// Memcheck's `TRIGGER_MEMCHECK_ERROR_IF_UNDEFINED`: with definedness tracked, an argument
/// (`names`: those of the call's first integer arguments, in order) holding undefined bits
/// at the program's call is reported, once per call, as Memcheck's replacement reports
/// the branch it makes on it. Never a reason to refuse the call. Called first thing in
/// the hook, and `entry` only after the shadows are read: finding the entry the first
/// time may run the program's code (a symbol lookup), whose first step takes every
/// register as defined. Without definedness it is one compare in the hook's prologue.
#[inline(always)]
fn check_arguments(entry: impl FnOnce() -> Entry, func: AllocFn, names: &[&'static str]) {
    if oxgrind_engine::definedness::enabled() {
        if let Some(i) = oxgrind_engine::definedness::first_undefined_argument(names.len()) {
            report_undefined_argument(entry, func, i, names[i]);
        }
    }
}

#[inline(never)]
#[cold]
fn report_undefined_argument(
    entry: impl FnOnce() -> Entry,
    func: AllocFn,
    index: usize,
    arg: &'static str,
) {
    let origin = oxgrind_engine::definedness::argument_origin(index);
    if let Some(ev) = Event::enter(0) {
        ev.misuse(entry(), Misuse::UndefinedArgument { func, arg, origin });
    }
}

/// Records a new block; `p` is non-null.
#[inline]
fn record_alloc(
    ev: Option<&Event>,
    p: *mut c_void,
    size: u64,
    align: u64,
    func: AllocFn,
    entry: Entry,
) {
    let addr = p as u64;
    match ev {
        Some(ev) => natively(
            #[inline(always)]
            || tell_alloc(&ev, addr, size, align, func, entry),
        ),
        None => {
            if state::runtime().is_some() || !state::settled() {
                BLOCKS.insert_without_event(
                    addr,
                    BlockInfo {
                        size,
                        stack: NO_STACK,
                        func,
                        internal: true,
                        tool_word: 0,
                    },
                );
            }
        }
    }
}

/// A new block, for an event that has entered the runtime: its stack captured, its table
/// entry written and the tool told, on the general path and the heap path alike.
#[inline(always)]
fn tell_alloc(ev: &Event, addr: u64, size: u64, align: u64, func: AllocFn, entry: Entry) {
    // The table's entry is written after the stack capture: its miss (the table outgrows
    // the cache) overlaps the capture. (At free the only work before the removal is the
    // event's set-up, too short: prefetching there moved the stall onto the prefetch, perf
    // on bench `containers`.)
    BLOCKS.prefetch(addr);
    let stack = ev.stack(entry);
    let a = Alloc {
        addr,
        size,
        slop: slop(size),
        align,
        func,
        stack,
        tid: ev.tid(),
    };
    ev.uncount();
    // The entry is written once the tool has given its number: the program does not have
    // the block yet, so nothing can look for it before (`Host::block_extent` answers for
    // the event's block without the table).
    let tool_word = ev
        .thread
        .with_event_blocks(addr, 0, || ev.rt.tool.on_alloc(&HOST, &a));
    BLOCKS.insert(
        addr,
        BlockInfo {
            size,
            stack,
            func,
            internal: false,
            tool_word,
        },
    );
}

/// What a free gives back to glibc once the tool has heard of it: the freed block itself,
/// unless the tool keeps freed blocks (`Needs::freelist_vol`: Memcheck's queue gives each
/// back through `Host::release_freed`). Given back after the tool's handler, which may ask
/// for the block's chunk (`Host::block_extent`).
struct GiveBack(Option<u64>);

impl GiveBack {
    /// Decided before the tool hears of the free of `addr`, applied after it (`release`).
    #[inline]
    fn after_tool(ev: &Event, addr: u64) -> GiveBack {
        GiveBack((ev.rt.needs.freelist_vol == 0).then_some(addr))
    }

    #[inline]
    fn release(self, ev: &Event) {
        if let Some(a) = self.0 {
            // SAFETY: `a` came from glibc's allocator, the program freed it and the tool
            // has heard of it.
            in_glibc(ev.thread, || unsafe { __libc_free(a as *mut c_void) });
        }
    }
}

/// Whole pages of a freed block the tool keeps ([`GiveBack`]) are given back to the kernel
/// once at least this many bytes of them lie inside it.
const DISCARD_MIN: u64 = 16 << 10;

/// The program freed block `addr` of `size` bytes, which the tool keeps from glibc for a
/// while (`Needs::freelist_vol`: Memcheck's freed-block queue, 20 MB by default): its
/// contents are no one's any more, so the whole pages inside it go back to the kernel now
/// rather than when glibc reuses them. Called before the tool hears of the free (a tool may
/// give the block back to glibc from its handler, and then it is glibc's). Valgrind keeps
/// its freed blocks' memory resident; a program that reads one after freeing it (an
/// invalid read, reported either way) reads zeros there instead of the old bytes.
#[inline]
fn discard_kept(ev: &Event, addr: u64, size: u64) {
    if ev.rt.needs.freelist_vol == 0 || size < DISCARD_MIN {
        return;
    }
    let lo = addr.next_multiple_of(4096);
    let hi = (addr + size) & !4095;
    if hi > lo && hi - lo >= DISCARD_MIN {
        // SAFETY: `[lo, hi)` is whole pages inside a block the program freed and glibc
        // still counts as allocated (the tool keeps it): glibc's own bookkeeping (the chunk
        // headers before and after) lies outside, and nothing reads the block's bytes again
        // before it is reused, when zeros are as good as any.
        unsafe { oxgrind_sys::raw::discard(lo as *mut u8, (hi - lo) as usize) };
    }
}

/// `Host::release_freed`: the tool gives back a freed block it kept. Natively, as the
/// rest of the tool's work in an event.
pub(crate) fn release_kept(addr: u64, before: &mut dyn FnMut(Option<oxgrind_tool::BlockExtent>)) {
    // SAFETY: the tool kept this block of the program's, freed, from glibc (it never went
    // back): still glibc's chunk, given back once only (the contract of release_freed).
    before(Some(unsafe { glibc_extent(addr) }));
    // glibc's per-thread cache hands the chunk out again first, often a few allocations
    // later, whose table entry (last touched at the block's free, a whole queue ago) then
    // missed: it starts loading now.
    BLOCKS.prefetch(addr);
    // SAFETY: as above; the tool is done with it.
    in_glibc(crate::guard::this_thread(), || unsafe {
        __libc_free(addr as *mut c_void)
    });
}

/// Extra bytes to allocate after a block of the program's (see `Needs::redzone`).
#[inline]
fn redzone(rt: Option<&Runtime>) -> usize {
    rt.map_or(0, |rt| rt.needs.redzone as usize)
}

#[inline]
fn base_alloc(rt: Option<&Runtime>, size: usize) -> *mut c_void {
    let align = rt.map_or(16, |rt| rt.core.alignment as usize);
    let size = size.saturating_add(redzone(rt));
    // SAFETY: plain calls into glibc's allocator.
    unsafe {
        if align > 16 {
            __libc_memalign(align, size)
        } else {
            __libc_malloc(size)
        }
    }
}

/// Whether a new block may be given to the program: not while oxgrind's own memory is short
/// (`oxgrind_sys::heap::exhausted`: the address space is full, by a limit the program
/// started under or the machine's). Refusing the program's allocation, as its limit would a
/// little later, keeps room for tracking what the program already has and for the report.
/// Every 4,096th allocation of a thread looks at the room left (the program's own
/// allocations take address space the heap does not see go); allocations are allowed again
/// once there is room (the program freed some).
#[inline]
fn program_may_allocate(thread: &ThreadState) -> bool {
    const LOOK_EVERY: u32 = 4096;
    let n = thread.allocations.get().wrapping_add(1);
    thread.allocations.set(n);
    if oxgrind_sys::heap::exhausted() {
        oxgrind_sys::heap::try_recover()
    } else {
        n % LOOK_EVERY != 0 || oxgrind_sys::heap::keep_room_to_report()
    }
}

/// The program's allocation refused ([`program_may_allocate`]): NULL with `errno` ENOMEM,
/// set once the event is over (its end restores the `errno` it found).
#[cold]
fn refuse(ev: Option<Event>) -> *mut c_void {
    drop(ev);
    // SAFETY: errno slot of this thread.
    unsafe { *crate::guard::errno_slot() = 12 }; // ENOMEM
    core::ptr::null_mut()
}

/// Zeroes `len` bytes at `p` with one `rep stosb`: never a call to `memset` (under the
/// engine that is the program's replacement, instrumented).
///
/// # Safety
/// `[p, p + len)` must be writable memory the caller owns.
#[inline]
unsafe fn zero(p: *mut u8, len: usize) {
    // SAFETY: the caller's contract: the range is ours to write. `rep stosb` writes rcx
    // bytes of al at rdi upwards (the direction flag is clear at a call, by the ABI) and
    // changes rdi and rcx only, declared.
    unsafe {
        core::arch::asm!(
            "rep stosb",
            inout("rdi") p => _,
            inout("rcx") len => _,
            in("al") 0u8,
            options(nostack, preserves_flags)
        );
    }
}

/// The common path of every allocation function.
#[inline]
fn allocate(
    size: u64,
    func: AllocFn,
    entry: Entry,
    get: impl FnOnce(Option<&Runtime>) -> *mut c_void,
) -> *mut c_void {
    allocate_aligned(size, 0, func, entry, get)
}

/// [`allocate`] for the functions given an alignment (`align`, as the program passed it).
#[inline]
fn allocate_aligned(
    size: u64,
    align: u64,
    func: AllocFn,
    entry: Entry,
    get: impl FnOnce(Option<&Runtime>) -> *mut c_void,
) -> *mut c_void {
    event(|| allocate_aligned_here(size, align, func, entry, get))
}

#[inline]
fn allocate_aligned_here(
    size: u64,
    align: u64,
    func: AllocFn,
    entry: Entry,
    get: impl FnOnce(Option<&Runtime>) -> *mut c_void,
) -> *mut c_void {
    if state::passthrough() {
        return get(None);
    }
    let mut ev = Event::enter(wrapper_cost(func, &entry));
    if let Some(ev) = &ev {
        if fishy(size) {
            ev.misuse(
                entry,
                Misuse::FishyValue {
                    func,
                    arg: "size",
                    value: size,
                },
            );
            return core::ptr::null_mut();
        }
    }
    let thread = ev
        .as_ref()
        .map_or_else(crate::guard::this_thread, |e| e.thread);
    if !program_may_allocate(thread) {
        return refuse(ev);
    }
    let rt = ev.as_ref().map(|e| e.rt);
    let p = match &ev {
        Some(ev) => in_glibc(ev.thread, || get(rt)),
        None => in_glibc(crate::guard::this_thread(), || get(rt)),
    };
    if !p.is_null() {
        record_alloc(ev.as_ref(), p, size, align, func, entry);
    } else if let Some(ev) = &mut ev {
        ev.keep_errno();
    }
    p
}

/// The common path of every deallocation function.
#[inline]
fn deallocate(p: *mut c_void, func: AllocFn, entry: Entry) {
    if p.is_null() {
        return;
    }
    event(|| deallocate_here(p, func, entry))
}

#[inline]
fn deallocate_here(p: *mut c_void, func: AllocFn, entry: Entry) {
    if state::passthrough() {
        // Blocks recorded before set-up decided on pass-through are glibc's too.
        // SAFETY: p came from glibc's allocator through us.
        return unsafe { __libc_free(p) };
    }
    let addr = p as u64;
    let ev = Event::enter(wrapper_cost(func, &entry));
    // Matched by reference: a copy of the whole entry, which `remove` has just stored field
    // by field, would load it in wider pieces than were stored and wait for the stores (a
    // failed store-to-load forward, 2% of the heap path's time on bench `alloc`); each field
    // read where it is used loads what one store wrote.
    let removed = match &ev {
        Some(_) => BLOCKS.remove(addr),
        None => match BLOCKS.remove_without_event(addr) {
            Ok(removed) => removed,
            // A signal handler's free while its thread held the block's shard: the block
            // stays (`remove_without_event`).
            Err(ShardBusy) => return,
        },
    };
    match (&removed, &ev) {
        (Some(b), Some(ev)) if !b.internal => {
            let give_back = GiveBack::after_tool(ev, addr);
            discard_kept(ev, addr, b.size);
            natively(
                #[inline(always)]
                || {
                    let f = Free {
                        addr,
                        size: b.size,
                        slop: slop(b.size),
                        alloc_stack: b.stack,
                        alloc_func: b.func,
                        func,
                        stack: if ev.rt.needs.free_stacks {
                            ev.stack(entry)
                        } else {
                            NO_STACK
                        },
                        tid: ev.tid(),
                        tool_word: b.tool_word,
                    };
                    ev.uncount();
                    ev.thread
                        .with_event_blocks(0, addr, || ev.rt.tool.on_free(&HOST, &f));
                },
            );
            give_back.release(ev);
        }
        // Ours (`internal`), or freed while no event may run: straight back to glibc.
        // SAFETY: p came from glibc's allocator through us and is no longer used.
        (Some(_), _) => in_glibc(crate::guard::this_thread(), || unsafe { __libc_free(p) }),
        (None, Some(ev)) => {
            if let Some(f) = crate::replace::early_original(addr, releasing_name(func)) {
                type F = unsafe extern "C" fn(*mut c_void);
                // SAFETY: `f` is the object's own `free`/`operator delete` (one argument),
                // and `p` a block its allocator made before the engine started
                // (`replace::early_original`): its own release, run natively as it would
                // have run without us.
                return in_glibc(ev.thread, || unsafe {
                    core::mem::transmute::<u64, F>(f)(p)
                });
            }
            ev.misuse(
                entry,
                Misuse::InvalidFree {
                    addr,
                    func,
                    size: 0,
                },
            )
        }
        (None, None) => {
            // Not measured, or oxgrind's own libc call freeing what it allocated before
            // set-up: trust it, as glibc would.
            if state::runtime().is_none() {
                // SAFETY: the caller got p from glibc's allocator (we only pass through).
                unsafe { __libc_free(p) }
            }
        }
    }
}

/// The one-argument function of an object's own allocator that releases what `func`
/// releases (`replace::early_original`).
fn releasing_name(func: AllocFn) -> &'static str {
    match func.family() {
        oxgrind_tool::Family::New => "_ZdlPv",
        oxgrind_tool::Family::NewArray => "_ZdaPv",
        oxgrind_tool::Family::Malloc => "free",
    }
}

/// Our library's own handle, for [`own_address`].
static SELF_HANDLE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

/// Opens our own library by path (already loaded: RTLD_NOLOAD), at set-up.
pub fn open_self(path: &str) {
    const RTLD_LAZY: c_int = 1;
    const RTLD_NOLOAD: c_int = 4;
    let mut c = path.as_bytes().to_vec();
    c.push(0);
    // SAFETY: c is NUL-terminated; RTLD_NOLOAD only returns the existing handle.
    let h = unsafe { dlopen(c.as_ptr().cast(), RTLD_LAZY | RTLD_NOLOAD) };
    SELF_HANDLE.store(h, Ordering::Release);
}

/// The address of our own definition of `name` (NUL-terminated). Taking `malloc as usize`
/// is not enough: in a non-PIE executable that calls `malloc` (Debian's python3.11), the
/// canonical address of the function is the executable's PLT stub, which symbolizes as
/// `??? (in /usr/bin/python3.11)`. `dlsym` on our own handle finds ours.
///
/// `None` means "not now" (the caller uses its fallback without caching it): before set-up,
/// and when called re-entrantly — `dlsym` itself frees its error string through our `free`.
pub fn own_address(name: &[u8], fallback: u64) -> Option<u64> {
    let h = SELF_HANDLE.load(Ordering::Acquire);
    if h.is_null() {
        return None;
    }
    let _inside = Entered::try_enter()?;
    // SAFETY: h is our own handle; name is NUL-terminated.
    let p = unsafe { dlsym(h, name.as_ptr().cast()) };
    Some(if p.is_null() { fallback } else { p as u64 })
}

/// Frame 0 of a stack: the address of our entry point `$f`, resolved once (see
/// [`own_address`]).
macro_rules! entry {
    ($f:ident) => {{
        static ENTRY: AtomicU64 = AtomicU64::new(0);
        Entry::at(match ENTRY.load(Ordering::Relaxed) {
            0 => {
                let fallback = $f as *const () as usize as u64;
                match own_address(concat!(stringify!($f), "\0").as_bytes(), fallback) {
                    Some(a) => {
                        ENTRY.store(a, Ordering::Relaxed);
                        a
                    }
                    None => fallback,
                }
            }
            a => a,
        })
    }};
}

/// The C++ allocation functions of `shim.c`, by the index it passes.
const NEW_NAMES: [&[u8]; 8] = [
    b"_Znwm\0",
    b"_Znam\0",
    b"_ZnwmRKSt9nothrow_t\0",
    b"_ZnamRKSt9nothrow_t\0",
    b"_ZnwmSt11align_val_t\0",
    b"_ZnamSt11align_val_t\0",
    b"_ZnwmSt11align_val_tRKSt9nothrow_t\0",
    b"_ZnamSt11align_val_tRKSt9nothrow_t\0",
];
static NEW_ENTRIES: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

fn new_entry(which: usize) -> u64 {
    let which = which.min(7);
    match NEW_ENTRIES[which].load(Ordering::Relaxed) {
        0 => match own_address(NEW_NAMES[which], 0) {
            Some(a) => {
                NEW_ENTRIES[which].store(a, Ordering::Relaxed);
                a
            }
            None => 0,
        },
        a => a,
    }
}

/// Entry points that pass the program's registers at the call on to their implementation:
/// `$name(args...)` becomes `$imp(args..., sp, bp)`, `sp` being the stack pointer at our
/// entry (where the return address is) and `bp` the frame pointer, both still the caller's.
/// The stack walk then starts in the caller ([`stacks::Caller`]) instead of walking the
/// hook's own frames and dropping them (about a third of the capture's cost). `$sp` and
/// `$bp` name the argument registers after the function's own (at most six in all).
/// The call goes through `oxgrind_engine::native_entry`: from translated code, when
/// events run natively ([`set_events_native`]), `$imp` then runs natively as a whole (see
/// [`events_run_natively`]), with none of its own code translated on the way.
macro_rules! pass_caller {
    ($(fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? => $imp:ident($sp:literal, $bp:literal);)*) => {$(
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? {
            // SAFETY: copies rsp and rbp into the two argument registers after the
            // function's own and jumps: the implementation has the same arguments plus
            // those two, and returns to our caller. Nothing else is touched.
            core::arch::naked_asm!(
                concat!("mov ", $sp, ", rsp"),
                concat!("mov ", $bp, ", rbp"),
                "lea r11, [rip + {imp}]",
                "jmp {entry}",
                imp = sym $imp,
                entry = sym oxgrind_engine::native_entry,
            )
        }
    )*};
}

pass_caller! {
    fn malloc(size: usize) -> *mut c_void => malloc_at("rsi", "rdx");
    fn free(p: *mut c_void) => free_at("rsi", "rdx");
    fn calloc(n: usize, size: usize) -> *mut c_void => calloc_at("rdx", "rcx");
    fn realloc(p: *mut c_void, size: usize) -> *mut c_void => realloc_at("rdx", "rcx");
}

// The heap path's events, on the thread's hook stack when it has one (`hookstack`).
crate::hookstack::on_hook_stack! {
    fn malloc_fast_here(size: usize, sp: u64, bp: u64) -> *mut c_void => malloc_fast;
    fn free_fast_here(p: *mut c_void, sp: u64, bp: u64) => free_fast;
    fn calloc_fast_here(n: usize, size: usize, sp: u64, bp: u64) -> *mut c_void => calloc_fast;
    fn realloc_fast_here(p: *mut c_void, size: usize, sp: u64, bp: u64) -> *mut c_void
        => realloc_fast;
    fn new_fast_here(size: usize, align: usize, which: c_int, sp: u64, bp: u64) -> *mut c_void
        => new_fast;
}

/// [`malloc`] with its caller's registers: the heap path ([`fast`]) or the general one.
///
/// Each entry point only chooses and jumps (a load into a register that is not an
/// argument's: the jumps pass them on), both paths out of line. With either inline, its
/// frame was set up before the choice (LLVM did not shrink-wrap it): about 20 instructions
/// a call on the heap path, or a larger frame on the general one, which Memcheck runs
/// translated.
unsafe extern "C" fn malloc_at(size: usize, sp: u64, bp: u64) -> *mut c_void {
    if fast::on() {
        return malloc_fast_here(size, sp, bp);
    }
    malloc_general(size, sp, bp)
}

#[inline(never)]
unsafe extern "C" fn malloc_fast(size: usize, sp: u64, bp: u64) -> *mut c_void {
    let entry = entry!(malloc).gated_from(sp, bp);
    // SAFETY: plain call into glibc's allocator.
    let get = || unsafe { __libc_malloc(size) };
    match fast::allocate(size as u64, 0, AllocFn::Malloc, entry, get) {
        Some(p) => p,
        None => malloc_general(size, sp, bp),
    }
}

#[inline(never)]
unsafe fn malloc_general(size: usize, sp: u64, bp: u64) -> *mut c_void {
    check_arguments(|| entry!(malloc), AllocFn::Malloc, &["size"]);
    let entry = entry!(malloc).gated_from(sp, bp);
    allocate_aligned_here(size as u64, 0, AllocFn::Malloc, entry, |rt| {
        base_alloc(rt, size)
    })
}

/// [`free`] with its caller's registers (chosen as in [`malloc_at`]).
unsafe extern "C" fn free_at(p: *mut c_void, sp: u64, bp: u64) {
    if fast::on() {
        return free_fast_here(p, sp, bp);
    }
    free_general(p, sp, bp)
}

#[inline(never)]
unsafe extern "C" fn free_fast(p: *mut c_void, sp: u64, bp: u64) {
    if !p.is_null() && !fast::deallocate(p, AllocFn::Free) {
        free_general(p, sp, bp)
    }
}

#[inline(never)]
unsafe fn free_general(p: *mut c_void, sp: u64, bp: u64) {
    check_arguments(|| entry!(free), AllocFn::Free, &["ptr"]);
    if p.is_null() {
        return;
    }
    let entry = entry!(free).gated_from(sp, bp);
    deallocate_here(p, AllocFn::Free, entry)
}

#[no_mangle]
pub unsafe extern "C" fn cfree(p: *mut c_void) {
    deallocate(p, AllocFn::Free, entry!(cfree))
}

/// [`calloc`] with its caller's registers (chosen as in [`malloc_at`]).
unsafe extern "C" fn calloc_at(n: usize, size: usize, sp: u64, bp: u64) -> *mut c_void {
    if fast::on() {
        return calloc_fast_here(n, size, sp, bp);
    }
    calloc_general(n, size, sp, bp)
}

#[inline(never)]
unsafe extern "C" fn calloc_fast(n: usize, size: usize, sp: u64, bp: u64) -> *mut c_void {
    // A fishy argument or an overflowing product: the general path.
    if !fishy(n as u64) && !fishy(size as u64) {
        if let Some(total) = n.checked_mul(size) {
            let entry = entry!(calloc).gated_from(sp, bp);
            // SAFETY: plain call into glibc's allocator (no redzone: `fast::suits`).
            let get = || unsafe { __libc_calloc(n, size) };
            if let Some(p) = fast::allocate(total as u64, 0, AllocFn::Calloc, entry, get) {
                return p;
            }
        }
    }
    calloc_general(n, size, sp, bp)
}

#[inline(never)]
unsafe fn calloc_general(n: usize, size: usize, sp: u64, bp: u64) -> *mut c_void {
    let args = &["nmemb", "size"];
    check_arguments(|| entry!(calloc), AllocFn::Calloc, args);
    let entry = entry!(calloc).gated_from(sp, bp);
    calloc_here(n, size, entry)
}

fn calloc_here(n: usize, size: usize, entry: Entry) -> *mut c_void {
    // An event of its own only for a fishy argument (rare): its set-up and end cost about
    // as much as the rest of the hook. Cost 0: `allocate` below counts the call.
    if fishy(n as u64) || fishy(size as u64) {
        if let Some(ev) = Event::enter(0) {
            for (arg, v) in [("nmemb", n), ("size", size)] {
                if fishy(v as u64) {
                    ev.misuse(
                        entry,
                        Misuse::FishyValue {
                            func: AllocFn::Calloc,
                            arg,
                            value: v as u64,
                        },
                    );
                    return core::ptr::null_mut();
                }
            }
        }
    }
    let Some(total) = n.checked_mul(size) else {
        // SAFETY: __libc_calloc detects the overflow itself and sets ENOMEM.
        return unsafe { __libc_calloc(n, size) };
    };
    // Already inside the event (`calloc_at`).
    allocate_aligned_here(total as u64, 0, AllocFn::Calloc, entry, |rt| {
        let align = rt.map_or(16, |rt| rt.core.alignment as usize);
        // SAFETY: plain calls into glibc's allocator; memalign'd memory is zeroed by hand.
        unsafe {
            let rz = redzone(rt);
            if align > 16 {
                let p = __libc_memalign(align, total.saturating_add(rz));
                if !p.is_null() {
                    core::ptr::write_bytes(p as *mut u8, 0, total);
                }
                p
            } else if rz > 0 {
                // glibc's calloc would clear the block with `memset`, which runs as the
                // program's code (our checked replacement, a word loop with every store
                // checked): one `rep stosb` here instead, and the tool marks the block.
                let p = __libc_malloc(total.saturating_add(rz));
                if !p.is_null() {
                    zero(p as *mut u8, total);
                }
                p
            } else {
                __libc_calloc(n, size)
            }
        }
    })
}

fn reallocate_here(p: *mut c_void, size: usize, func: AllocFn, entry: Entry) -> *mut c_void {
    if state::passthrough() {
        // SAFETY: p is null or came from glibc's allocator through us.
        return unsafe { __libc_realloc(p, size) };
    }
    if p.is_null() {
        let entry = match func {
            // Valgrind 3.19 counts reallocarray of a null pointer 14 instructions more than
            // of a block (measured as in `wrapper_cost`: 54 and 40); realloc's are equal.
            AllocFn::ReallocArray => Entry {
                extra_cost: 14,
                ..entry
            },
            _ => entry,
        };
        return allocate(size as u64, func, entry, |rt| base_alloc(rt, size));
    }
    let ev = Event::enter(wrapper_cost(func, &entry));
    if let Some(ev) = &ev {
        if fishy(size as u64) {
            ev.misuse(
                entry,
                Misuse::FishyValue {
                    func,
                    arg: "size",
                    value: size as u64,
                },
            );
            return core::ptr::null_mut();
        }
    }
    if size == 0 {
        // glibc (and Valgrind 3.19) free the block and return NULL.
        drop(ev);
        deallocate(p, func, entry);
        return core::ptr::null_mut();
    }
    let thread = ev
        .as_ref()
        .map_or_else(crate::guard::this_thread, |e| e.thread);
    if !program_may_allocate(thread) {
        return refuse(ev); // the block stays the program's, as realloc leaves it
    }
    let addr = p as u64;
    let Some(mut ev) = ev else {
        let Ok(old) = BLOCKS.remove_without_event(addr) else {
            // A signal handler's realloc while its thread held the block's shard
            // (`remove_without_event`): it fails as glibc's fails, the block unchanged.
            // SAFETY: errno slot of this thread.
            unsafe { *crate::guard::errno_slot() = 12 }; // ENOMEM
            return core::ptr::null_mut();
        };
        // SAFETY: p is glibc's (we only pass through when not measuring).
        let q = unsafe { __libc_realloc(p, size) };
        if !q.is_null() && (old.is_some() || !state::settled()) {
            BLOCKS.insert_without_event(
                q as u64,
                BlockInfo {
                    size: size as u64,
                    stack: NO_STACK,
                    func,
                    internal: true,
                    tool_word: 0,
                },
            );
        } else if q.is_null() {
            if let Some(b) = old {
                BLOCKS.insert_without_event(addr, b);
            }
        }
        return q;
    };
    let Some(old) = BLOCKS.remove(addr) else {
        if let Some(f) = crate::replace::early_original(addr, "realloc") {
            type F = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
            // SAFETY: `f` is the object's own `realloc` and `p` a block its allocator made
            // before the engine started (`replace::early_original`); the block stays that
            // allocator's, unseen, as every block it made then.
            let q = in_glibc(ev.thread, || unsafe {
                core::mem::transmute::<u64, F>(f)(p, size)
            });
            ev.keep_errno();
            return q;
        }
        ev.misuse(
            entry,
            Misuse::InvalidFree {
                addr,
                func,
                size: size as u64,
            },
        );
        return core::ptr::null_mut();
    };
    if old.internal {
        // SAFETY: an internal block is glibc's.
        let q = unsafe { __libc_realloc(p, size) };
        let keep = if q.is_null() { addr } else { q as u64 };
        BLOCKS.insert(
            keep,
            BlockInfo {
                size: if q.is_null() { old.size } else { size as u64 },
                ..old
            },
        );
        if q.is_null() {
            ev.keep_errno();
        }
        return q;
    }
    let rt = ev.rt;
    // With a freed-block queue the old block must stay unreleased for a while, so always move.
    let moved = rt.needs.freelist_vol > 0 || rt.needs.redzone > 0 || rt.core.alignment > 16;
    let q = in_glibc(ev.thread, || {
        if moved {
            let q = base_alloc(Some(rt), size);
            if !q.is_null() {
                // SAFETY: both blocks are valid for the copied length and distinct.
                unsafe {
                    core::ptr::copy_nonoverlapping(
                        p as *const u8,
                        q as *mut u8,
                        (old.size as usize).min(size),
                    )
                };
            }
            q
        } else {
            // SAFETY: p is a live glibc block of the program.
            unsafe { __libc_realloc(p, size) }
        }
    });
    if q.is_null() {
        BLOCKS.insert(addr, old);
        ev.keep_errno();
        return q;
    }
    // The old block, moved from, is freed as `free` frees: kept by the tool, or given back
    // only after the tool has heard of the event.
    let give_back = moved.then(|| GiveBack::after_tool(&ev, addr));
    if moved {
        discard_kept(&ev, addr, old.size);
    }
    natively(|| realloc_event(&ev, entry, addr, q, size, old, func, moved));
    if let Some(g) = give_back {
        g.release(&ev);
    }
    q
}

/// The end of a successful `realloc` (run natively): the new block recorded, the tool told.
#[allow(clippy::too_many_arguments)]
fn realloc_event(
    ev: &Event,
    entry: Entry,
    addr: u64,
    q: *mut c_void,
    size: usize,
    old: BlockInfo,
    func: AllocFn,
    moved: bool,
) {
    let rt = ev.rt;
    let stack = ev.stack(entry);
    let tid = ev.tid();
    let f = Free {
        addr,
        size: old.size,
        slop: slop(old.size),
        alloc_stack: old.stack,
        alloc_func: old.func,
        func,
        stack,
        tid,
        tool_word: old.tool_word,
    };
    let a = Alloc {
        addr: q as u64,
        size: size as u64,
        slop: slop(size as u64),
        align: 0,
        func,
        stack,
        tid,
    };
    ev.uncount();
    // A block moved from is still glibc's live chunk: `reallocate_here` gives it back (or
    // queues it) only after this; one resized in place is gone. The new block's entry is
    // written once the tool has given its number (see `tell_alloc`).
    let old_held = if moved { addr } else { 0 };
    let tool_word = ev
        .thread
        .with_event_blocks(q as u64, old_held, || rt.tool.on_realloc(&HOST, &f, &a));
    BLOCKS.insert(
        q as u64,
        BlockInfo {
            size: size as u64,
            stack,
            func,
            internal: false,
            tool_word,
        },
    );
}

/// [`realloc`] with its caller's registers (chosen as in [`malloc_at`]).
unsafe extern "C" fn realloc_at(p: *mut c_void, size: usize, sp: u64, bp: u64) -> *mut c_void {
    if fast::on() {
        return realloc_fast_here(p, size, sp, bp);
    }
    realloc_general(p, size, sp, bp)
}

#[inline(never)]
unsafe extern "C" fn realloc_fast(p: *mut c_void, size: usize, sp: u64, bp: u64) -> *mut c_void {
    let entry = entry!(realloc).gated_from(sp, bp);
    match fast::reallocate(p, size, AllocFn::Realloc, entry) {
        Some(q) => q,
        None => realloc_general(p, size, sp, bp),
    }
}

#[inline(never)]
unsafe fn realloc_general(p: *mut c_void, size: usize, sp: u64, bp: u64) -> *mut c_void {
    let args = &["ptr", "size"];
    check_arguments(|| entry!(realloc), AllocFn::Realloc, args);
    let entry = entry!(realloc).gated_from(sp, bp);
    reallocate_here(p, size, AllocFn::Realloc, entry)
}

pass_caller! {
    fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void
        => reallocarray_at("rcx", "r8");
}

/// [`reallocarray`] with its caller's registers.
unsafe extern "C" fn reallocarray_at(
    p: *mut c_void,
    n: usize,
    size: usize,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    match n.checked_mul(size) {
        Some(total) => {
            let entry = entry!(reallocarray).gated_from(sp, bp);
            reallocate_here(p, total, AllocFn::ReallocArray, entry)
        }
        None => {
            // SAFETY: errno slot of this thread.
            unsafe { *crate::guard::errno_slot() = 12 }; // ENOMEM
            core::ptr::null_mut()
        }
    }
}

/// The common path of the functions given an alignment, inside the call's event.
fn aligned_here(align: usize, size: usize, func: AllocFn, entry: Entry) -> *mut c_void {
    allocate_aligned_here(size as u64, align as u64, func, entry, |rt| {
        let align = align.max(rt.map_or(16, |rt| rt.core.alignment as usize));
        // SAFETY: plain call into glibc's allocator (it rounds odd alignments up).
        unsafe { __libc_memalign(align, size.saturating_add(redzone(rt))) }
    })
}

fn bad_alignment_here(align: usize, func: AllocFn, entry: Entry) {
    if let Some(ev) = Event::enter(wrapper_cost(func, &entry)) {
        ev.misuse(
            entry,
            Misuse::BadAlignment {
                func,
                align: align as u64,
            },
        );
    }
}

// The aligned and page-aligned allocation functions pass their caller's registers on as
// malloc does (`pass_caller`): under Massif's `--time-unit=i` what a call counts of ours
// is then the entry's few instructions in any build profile (`Entry::gated`), not the
// translated hook, whose length differs between the dev and release profiles.
pass_caller! {
    fn memalign(align: usize, size: usize) -> *mut c_void => memalign_at("rdx", "rcx");
    fn aligned_alloc(align: usize, size: usize) -> *mut c_void => aligned_alloc_at("rdx", "rcx");
    fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int
        => posix_memalign_at("rcx", "r8");
    fn valloc(size: usize) -> *mut c_void => valloc_at("rsi", "rdx");
    fn pvalloc(size: usize) -> *mut c_void => pvalloc_at("rsi", "rdx");
}

/// [`memalign`] with its caller's registers.
unsafe extern "C" fn memalign_at(align: usize, size: usize, sp: u64, bp: u64) -> *mut c_void {
    let entry = entry!(memalign).gated_from(sp, bp);
    aligned_here(align, size, AllocFn::Memalign, entry)
}

/// [`aligned_alloc`] with its caller's registers.
unsafe extern "C" fn aligned_alloc_at(align: usize, size: usize, sp: u64, bp: u64) -> *mut c_void {
    let entry = entry!(aligned_alloc).gated_from(sp, bp);
    if !align.is_power_of_two() {
        bad_alignment_here(align, AllocFn::AlignedAlloc, entry);
        // SAFETY: errno slot of this thread.
        unsafe { *crate::guard::errno_slot() = 22 }; // EINVAL
        return core::ptr::null_mut();
    }
    aligned_here(align, size, AllocFn::AlignedAlloc, entry)
}

/// [`posix_memalign`] with its caller's registers.
unsafe extern "C" fn posix_memalign_at(
    out: *mut *mut c_void,
    align: usize,
    size: usize,
    sp: u64,
    bp: u64,
) -> c_int {
    let entry = entry!(posix_memalign).gated_from(sp, bp);
    if !align.is_power_of_two() || align % core::mem::size_of::<usize>() != 0 {
        bad_alignment_here(align, AllocFn::PosixMemalign, entry);
        return 22; // EINVAL
    }
    let p = aligned_here(align, size, AllocFn::PosixMemalign, entry);
    if p.is_null() {
        return 12; // ENOMEM
    }
    // SAFETY: the caller passes a valid out-pointer, as posix_memalign requires.
    unsafe { *out = p };
    // Written by our code, which runs without definedness steps.
    oxgrind_engine::definedness::set(out as u64, 8, true);
    0
}

/// [`valloc`] with its caller's registers.
unsafe extern "C" fn valloc_at(size: usize, sp: u64, bp: u64) -> *mut c_void {
    let entry = entry!(valloc).gated_from(sp, bp);
    // SAFETY: plain call into glibc's allocator.
    allocate_aligned_here(size as u64, 0, AllocFn::Valloc, entry, |_| unsafe {
        __libc_valloc(size)
    })
}

/// [`pvalloc`] with its caller's registers.
unsafe extern "C" fn pvalloc_at(size: usize, sp: u64, bp: u64) -> *mut c_void {
    // pvalloc rounds the request up to whole pages; the block is that big.
    let rounded = size.max(1).next_multiple_of(4096);
    let entry = entry!(pvalloc).gated_from(sp, bp);
    // SAFETY: plain call into glibc's allocator.
    allocate_aligned_here(rounded as u64, 0, AllocFn::Pvalloc, entry, |_| unsafe {
        __libc_pvalloc(size)
    })
}

/// glibc's own `malloc_usable_size` of a live block (`Host::usable_size`): the bytes its
/// chunk really gives, the runtime's redzone included. Looked up once.
///
/// # Safety
/// `p` must be a live block of glibc's allocator (glibc reads its chunk header).
pub unsafe fn glibc_usable_size(p: *mut c_void) -> u64 {
    type F = unsafe extern "C" fn(*mut c_void) -> usize;
    static GLIBC: core::sync::atomic::AtomicPtr<c_void> =
        core::sync::atomic::AtomicPtr::new(core::ptr::null_mut());
    let mut f = GLIBC.load(core::sync::atomic::Ordering::Relaxed);
    if f.is_null() {
        f = next_symbol(b"malloc_usable_size\0");
        if f.is_null() {
            return 0;
        }
        GLIBC.store(f, core::sync::atomic::Ordering::Relaxed);
    }
    // SAFETY: dlsym found glibc's malloc_usable_size, whose signature is F, and `p` is a
    // live block glibc's allocator returned (the caller's contract).
    unsafe { core::mem::transmute::<*mut c_void, F>(f)(p) as u64 }
}

/// Where glibc's chunk of live block `p` ends ([`oxgrind_tool::BlockExtent`]), from the
/// chunk's size word (the 8 bytes before `p`): chunk start + size, which is where the next
/// chunk's 16-byte header starts (its first word, `prev_size`, doubles as the last usable
/// word of an in-use chunk: glibc's `malloc_usable_size` is 8 bytes more); a chunk glibc
/// mapped by itself (`IS_MMAPPED`) has no next chunk.
///
/// # Safety
/// `p` must be a chunk glibc's allocator returned and has not been given back.
pub unsafe fn glibc_extent(p: u64) -> oxgrind_tool::BlockExtent {
    const IS_MMAPPED: u64 = 2;
    const HEADER: u64 = 16;
    // SAFETY: per the caller, the 8 bytes before `p` are the chunk's size field.
    let raw = unsafe { core::ptr::read_volatile((p - 8) as *const u64) };
    oxgrind_tool::BlockExtent {
        end: (p - HEADER).wrapping_add(raw & !7),
        header_follows: raw & IS_MMAPPED == 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    // Valgrind's replacement answers the requested size: bytes past it are not the program's.
    // When we track blocks, a pointer that is not a live block's start (freed, interior, on
    // the stack, garbage) gets 0 as under Valgrind: glibc's own would read a chunk header
    // that is not there, and crash.
    let tracked = !state::passthrough() && state::runtime().is_some();
    match BLOCKS.get(p as u64) {
        Some(b) if !b.internal => b.size as usize,
        None if tracked => match crate::replace::early_original(p as u64, "malloc_usable_size") {
            // SAFETY: the object's own `malloc_usable_size`, of a block its allocator made
            // before the engine started (`replace::early_original`).
            Some(f) => unsafe {
                core::mem::transmute::<u64, unsafe extern "C" fn(*mut c_void) -> usize>(f)(p)
            },
            None => 0,
        },
        _ => {
            type F = unsafe extern "C" fn(*mut c_void) -> usize;
            let f = next_symbol(b"malloc_usable_size\0");
            if f.is_null() {
                return 0;
            }
            // SAFETY: dlsym found glibc's malloc_usable_size, whose signature is F.
            unsafe { core::mem::transmute::<*mut c_void, F>(f)(p) }
        }
    }
}

/// What an `operator new` call counts of ours when it runs natively
/// ([`set_events_native`]), by entry point ([`NEW_NAMES`]): the exported entry point (two
/// moves, jmp), its function in `shim.c` as gcc -O2 compiles it (a call and the null test
/// for the throwing forms, a tail call for the others), [`oxgrind_new_entry`] (lea, jmp)
/// and the `ret` after the native call. `objdump -d` of the runtime shows them; a different
/// compiler may need new numbers (`crates/oxgrind/tests/massif_time_i.rs` compares new and
/// new[] with Valgrind).
const NEW_COUNTED: [i64; 8] = [17, 17, 11, 11, 16, 16, 8, 8];

/// `operator new` and friends, called from `shim.c` through [`oxgrind_new_entry`]:
/// `which`, the entry point, an index into [`NEW_NAMES`] (odd: `new[]`); `sp`, `bp`: the
/// program's registers at its call ([`stacks::Caller`]), passed on by the entry point.
/// Returns NULL on failure; the shim throws `std::bad_alloc` for the throwing forms (in its
/// own frame, translated: never through this one).
unsafe extern "C" fn oxgrind_new(
    size: usize,
    align: usize,
    which: c_int,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    // Chosen as in `malloc_at`.
    if fast::on() {
        return new_fast_here(size, align, which, sp, bp);
    }
    new_general(size, align, which, sp, bp)
}

#[inline(never)]
unsafe extern "C" fn new_fast(
    size: usize,
    align: usize,
    which: c_int,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    let func = new_func(which);
    let counted = NEW_COUNTED[(which as usize).min(7)];
    let entry = Entry::at(new_entry(which as usize)).gated_from_counting(sp, bp, counted);
    // SAFETY: plain calls into glibc's allocator (no redzone: `fast::suits`).
    let get = || unsafe {
        if align > 16 {
            __libc_memalign(align, size)
        } else {
            __libc_malloc(size)
        }
    };
    match fast::allocate(size as u64, align as u64, func, entry, get) {
        Some(p) => p,
        None => new_general(size, align, which, sp, bp),
    }
}

#[inline(never)]
unsafe fn new_general(size: usize, align: usize, which: c_int, sp: u64, bp: u64) -> *mut c_void {
    let func = new_func(which);
    // The shim's code is the runtime's: the shadow registers are still the program's call's.
    check_arguments(|| Entry::at(new_entry(which as usize)), func, &["size"]);
    let counted = NEW_COUNTED[(which as usize).min(7)];
    let entry = Entry::at(new_entry(which as usize)).gated_from_counting(sp, bp, counted);
    allocate_aligned_here(size as u64, align as u64, func, entry, |rt| {
        if align > 16 {
            // SAFETY: plain call into glibc's allocator.
            unsafe { __libc_memalign(align, size.saturating_add(redzone(rt))) }
        } else {
            base_alloc(rt, size)
        }
    })
}

/// The allocating function of `operator new`'s entry point `which` (odd: `new[]`).
#[inline]
fn new_func(which: c_int) -> AllocFn {
    if which & 1 == 1 {
        AllocFn::NewArray
    } else {
        AllocFn::New
    }
}

/// How `shim.c` calls [`oxgrind_new`]: through `oxgrind_engine::native_entry`, so that when
/// events run natively ([`set_events_native`]) none of it runs translated (the shim's
/// frame, which may throw, stays the program's).
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn oxgrind_new_entry(
    size: usize,
    align: usize,
    which: c_int,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    // SAFETY: leaves the five arguments where they are and jumps with `oxgrind_new`, which
    // takes them, in r11 (`native_entry`'s contract); it returns to our caller.
    core::arch::naked_asm!(
        "lea r11, [rip + {imp}]",
        "jmp {entry}",
        imp = sym oxgrind_new,
        entry = sym oxgrind_engine::native_entry,
    )
}

/// The heap path's `operator delete` of `p`, not null: `false` when the general path must
/// serve the call ([`fast::deallocate`]).
#[inline(never)]
fn delete_fast(p: *mut c_void, func: AllocFn) -> bool {
    fast::deallocate(p, func)
}

/// `operator delete` in all its forms: each entry point passes its caller's registers on
/// (`pass_caller`) to its implementation `$imp`, which frees as `free` does.
macro_rules! delete_fns {
    ($($name:ident ( $($arg:ident : $ty:ty),* ) => $imp:ident($sp:literal, $bp:literal), $func:expr;)*) => {$(
        pass_caller! {
            fn $name(p: *mut c_void $(, $arg: $ty)*) => $imp($sp, $bp);
        }

        /// Chosen as in `malloc_at`.
        unsafe extern "C" fn $imp(p: *mut c_void $(, $arg: $ty)*, sp: u64, bp: u64) {
            #[inline(never)]
            extern "C" fn heap_path(p: *mut c_void, sp: u64, bp: u64) {
                if !p.is_null() && !delete_fast(p, $func) {
                    general(p, sp, bp)
                }
            }
            #[inline(never)]
            fn general(p: *mut c_void, sp: u64, bp: u64) {
                if p.is_null() {
                    return;
                }
                let entry = entry!($name).gated_from(sp, bp);
                deallocate_here(p, $func, entry)
            }
            $(let _ = $arg;)*
            if fast::on() {
                crate::hookstack::on_hook_stack! {
                    fn heap_path_here(p: *mut c_void, sp: u64, bp: u64) => heap_path;
                }
                return heap_path_here(p, sp, bp);
            }
            general(p, sp, bp)
        }
    )*};
}

delete_fns! {
    _ZdlPv() => delete_at("rsi", "rdx"), AllocFn::Delete;
    _ZdaPv() => delete_array_at("rsi", "rdx"), AllocFn::DeleteArray;
    _ZdlPvm(size: usize) => delete_sized_at("rdx", "rcx"), AllocFn::Delete;
    _ZdaPvm(size: usize) => delete_array_sized_at("rdx", "rcx"), AllocFn::DeleteArray;
    _ZdlPvSt11align_val_t(align: usize) => delete_aligned_at("rdx", "rcx"), AllocFn::Delete;
    _ZdaPvSt11align_val_t(align: usize) => delete_array_aligned_at("rdx", "rcx"), AllocFn::DeleteArray;
    _ZdlPvmSt11align_val_t(size: usize, align: usize) => delete_sized_aligned_at("rcx", "r8"), AllocFn::Delete;
    _ZdaPvmSt11align_val_t(size: usize, align: usize) => delete_array_sized_aligned_at("rcx", "r8"), AllocFn::DeleteArray;
    _ZdlPvRKSt9nothrow_t(nt: *const c_void) => delete_nothrow_at("rdx", "rcx"), AllocFn::Delete;
    _ZdaPvRKSt9nothrow_t(nt: *const c_void) => delete_array_nothrow_at("rdx", "rcx"), AllocFn::DeleteArray;
    _ZdlPvSt11align_val_tRKSt9nothrow_t(align: usize, nt: *const c_void) => delete_aligned_nothrow_at("rcx", "r8"), AllocFn::Delete;
    _ZdaPvSt11align_val_tRKSt9nothrow_t(align: usize, nt: *const c_void) => delete_array_aligned_nothrow_at("rcx", "r8"), AllocFn::DeleteArray;
}
