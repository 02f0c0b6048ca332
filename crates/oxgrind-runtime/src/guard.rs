//! The per-thread "inside oxgrind" flag, and the rest of the runtime's per-thread state.
//!
//! While the runtime works on a thread, a `malloc` on that thread can only come from the
//! runtime itself (through a libc function it called) or from a signal handler that
//! interrupted it. Both must bypass the tool: the first would recurse, the second would
//! re-enter non-reentrant state. [`Entered`] sets the flag for a scope.
//!
//! All of it lives in one block ([`ThreadState`]) of static TLS defined in C (`shim.c`,
//! `oxg_thread_block`) with the initial-exec model: for a library loaded at start-up it is
//! allocated with the thread, and reaching it is an `%fs`-relative address, with no
//! allocation and no call into the dynamic loader. A Rust `thread_local!` in a shared
//! library would call `__tls_get_addr` on every lookup; that runs translated, before the
//! runtime can hold the engine's trace, and its reads of the thread's DTV (a heap block)
//! were the program's to a heap tool: DHAT counted 5.7 times Valgrind's bytes read on a
//! multi-threaded allocation loop (issue 13).

use core::ffi::c_int;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

/// What the runtime keeps per thread.
pub struct ThreadState {
    inside: Cell<bool>,
    /// Set while glibc's allocator runs for the program inside a hook
    /// ([`on_behalf_of_program`]): its memory accesses are the allocator's bookkeeping,
    /// which tools do not see (Valgrind's malloc runs outside the client altogether).
    in_allocator: Cell<bool>,
    /// This thread's kernel id, cached: a `gettid` system call per allocation cost about a
    /// fifth of Massif's time per event. 0 until first asked.
    tid: Cell<i32>,
    /// This thread's flag of the fork gate (`exit::EventGate`), registered on first use.
    pub(crate) gate_flag: Cell<Option<&'static AtomicBool>>,
    /// The blocks of the allocator event this thread is telling the tool of (allocated,
    /// freed; 0 when none): live chunks of glibc's for the handler's duration, which
    /// `Host::block_extent` may look at. A freed block is no longer in the block table
    /// then, and looking an allocated one up there would cost a shard lock.
    event_blocks: [Cell<u64>; 2],
    /// The program's allocations on this thread, for the periodic look at the room left
    /// for oxgrind's own memory (`hooks::program_may_allocate`).
    pub(crate) allocations: Cell<u32>,
    /// Set while the tool hears, from inside an allocator hook, of the program's misuse of
    /// the call ([`ThreadState::reporting_misuse`]).
    misuse: Cell<bool>,
}

extern "C" {
    /// This thread's block of `size_of::<ThreadState>()` bytes or more, zeroed when the thread
    /// starts, aligned to 16 (`shim.c`).
    fn oxg_thread_block_addr() -> *mut u8;
}

const _: () = assert!(
    core::mem::size_of::<ThreadState>() <= 64 && core::mem::align_of::<ThreadState>() <= 16
);

/// The calling thread's state.
///
/// `'static` is sound here: the value lives in the thread's static TLS block until the
/// thread exits, and [`ThreadState`] holds `Cell`s, so it is not `Sync` and the reference
/// cannot reach another thread; a reference outlives the thread only if stored in a static,
/// which nothing does.
#[inline]
pub fn this_thread() -> &'static ThreadState {
    // SAFETY: the block is this thread's, large and aligned enough (checked above), and
    // all-zero bytes are a valid ThreadState (false, 0, None: the null niche of
    // Option<&T>, and zero counters), which is the state every thread starts with; only
    // this thread reaches it (see above).
    unsafe { &*(oxg_thread_block_addr() as *const ThreadState) }
}

/// The calling thread's [`ThreadState`] block, as `[start, end)`: not a root of the
/// program's heap (it holds the blocks of the event in progress).
pub fn thread_block_range() -> (u64, u64) {
    let start = this_thread() as *const ThreadState as u64;
    (start, start + core::mem::size_of::<ThreadState>() as u64)
}

impl ThreadState {
    /// The thread's kernel thread id.
    #[inline]
    pub fn tid(&self) -> i32 {
        let v = self.tid.get();
        if v != 0 {
            return v;
        }
        let v = oxgrind_sys::raw::gettid();
        self.tid.set(v);
        v
    }

    /// Whether the thread is inside the runtime (see [`Entered`]).
    #[inline]
    pub fn is_inside(&self) -> bool {
        self.inside.get()
    }

    /// See [`Entered::try_enter`].
    #[inline]
    pub fn try_enter(&'static self) -> Option<Entered> {
        if self.inside.get() {
            None
        } else {
            self.inside.set(true);
            // What our code does from here on (its calls into libc run translated) is
            // not the program's: the engine drops its trace records.
            let held = HOLDS_TRACE.load(Ordering::Relaxed);
            if held {
                oxgrind_engine::hold_trace(true);
            }
            Some(Entered(self, held))
        }
    }

    /// Runs `f` (the tool's handler of an event) with `allocated` and `freed` (0: none)
    /// known as the event's blocks, which glibc holds as live chunks meanwhile.
    #[inline]
    pub fn with_event_blocks<T>(&self, allocated: u64, freed: u64, f: impl FnOnce() -> T) -> T {
        self.event_blocks[0].set(allocated);
        self.event_blocks[1].set(freed);
        let r = f();
        self.event_blocks[0].set(0);
        self.event_blocks[1].set(0);
        r
    }

    /// Runs `f`, the tool hearing of the program's misuse of the allocator call this thread
    /// is in (an invalid free, ...): its description of a stack address numbers the frames
    /// of the guest registers lent, the hook's caller's as the call returns when the hook
    /// runs natively from its entry point, from Valgrind's frame #1 (its replacement
    /// function is #0; `Host::describe_data`).
    pub fn reporting_misuse<T>(&self, f: impl FnOnce() -> T) -> T {
        let was = self.misuse.replace(true);
        let r = f();
        self.misuse.set(was);
        r
    }

    /// See [`ThreadState::reporting_misuse`].
    pub fn is_reporting_misuse(&self) -> bool {
        self.misuse.get()
    }

    /// Whether `addr` is a block of the event the tool is handling on this thread.
    #[inline]
    pub fn is_event_block(&self, addr: u64) -> bool {
        addr != 0 && (self.event_blocks[0].get() == addr || self.event_blocks[1].get() == addr)
    }

    /// See [`on_behalf_of_program`].
    #[inline]
    pub fn on_behalf_of_program<T>(&self, f: impl FnOnce() -> T) -> T {
        self.on_behalf_of_program_from(false, f)
    }

    /// [`ThreadState::on_behalf_of_program`]; `native`: `f` runs natively (a heap event run
    /// out of the code cache as a whole, `hooks::events_run_natively`), so none of the
    /// program's code runs translated from here and its stack's V bits are left alone.
    #[inline]
    pub fn on_behalf_of_program_from<T>(&self, native: bool, f: impl FnOnce() -> T) -> T {
        let was = self.inside.replace(false);
        let was_alloc = self.in_allocator.replace(true);
        // The flag is read here, inline: the call costs more than its work when
        // definedness is not tracked (Massif's heap path makes two per malloc/free pair).
        if !native && oxgrind_engine::definedness::enabled() {
            oxgrind_engine::definedness::entering_program_code();
        }
        let r = f();
        self.in_allocator.set(was_alloc);
        self.inside.set(was);
        r
    }
}

/// The calling thread's pointer (`fs:0` in the x86-64 TLS ABI: the thread control block
/// points to itself), which tells threads apart without a thread-local access: from a
/// shared library that is a call into the dynamic loader, costly under the engine.
#[inline(always)]
pub fn thread_pointer() -> u64 {
    let v: u64;
    // SAFETY: every thread of a process with glibc TLS has a thread control block at fs:0
    // whose first word points to itself; the load has no other effect.
    unsafe {
        core::arch::asm!("mov {}, fs:[0]", out(reg) v, options(nostack, readonly, preserves_flags));
    }
    v
}

extern "C" {
    fn __errno_location() -> *mut c_int;
}

/// `errno`'s distance from the thread pointer (`isize::MIN`: not known yet).
static ERRNO_OFFSET: AtomicIsize = AtomicIsize::new(isize::MIN);

/// The calling thread's `errno`, without calling libc's `__errno_location` each time (the
/// hooks save and restore it around every event). `errno` is libc's initial-exec thread
/// variable: it lies at the same distance from every thread's pointer, learnt once. Under
/// the engine, each call into libc from the runtime's own code cost the program's next
/// instruction a slow definedness step.
#[inline]
pub fn errno_slot() -> *mut c_int {
    let tp = thread_pointer() as isize;
    let off = ERRNO_OFFSET.load(Ordering::Relaxed);
    if off != isize::MIN {
        return tp.wrapping_add(off) as *mut c_int;
    }
    // SAFETY: __errno_location has no preconditions.
    let p = unsafe { __errno_location() };
    ERRNO_OFFSET.store((p as isize).wrapping_sub(tp), Ordering::Relaxed);
    p
}

/// The calling thread's kernel thread id.
#[inline]
pub fn tid() -> i32 {
    this_thread().tid()
}

/// In a forked child the surviving thread has a new id.
pub fn forget_tid() {
    this_thread().tid.set(0);
}

/// Whether the runtime's own work is held from the engine's trace (`oxgrind_engine::hold_trace`)
/// while this thread is inside it. Only a tool with trace buffers (`Needs::trace`: the held
/// records are dropped) or filtered probes (`Needs::shadow`: their slow calls skip held work)
/// has anything the hold changes; for the others (Massif, the tools without the engine) it
/// was two calls into the engine per event, four per malloc/free pair, changing nothing.
static HOLDS_TRACE: AtomicBool = AtomicBool::new(false);

/// Decides [`HOLDS_TRACE`] from the tool's needs, once, before the engine starts (an
/// [`Entered`] already alive keeps what it found: it releases only a hold it took).
pub fn set_holds_trace(n: &oxgrind_tool::Needs) {
    HOLDS_TRACE.store(n.trace || n.shadow.is_some(), Ordering::Relaxed);
}

/// Proof that this thread was not inside the runtime and now is, until dropped; the flag
/// says whether it holds the engine's trace ([`HOLDS_TRACE`]).
pub struct Entered(&'static ThreadState, bool);

impl Entered {
    #[inline]
    pub fn try_enter() -> Option<Entered> {
        this_thread().try_enter()
    }
}

impl Drop for Entered {
    #[inline]
    fn drop(&mut self) {
        if self.1 {
            oxgrind_engine::hold_trace(false);
        }
        self.0.inside.set(false);
        crate::exit::run_pending_signal();
    }
}

/// Runs `f` with the flag cleared: for calls into glibc's allocator made on the program's
/// behalf from inside a hook. What they cause (glibc's own `mmap`s, which `--pages-as-heap`
/// traps) is the program's, not oxgrind's. They never call back into our hooks.
#[inline]
pub fn on_behalf_of_program<T>(f: impl FnOnce() -> T) -> T {
    this_thread().on_behalf_of_program(f)
}

/// Whether the current thread is in the runtime or in glibc's allocator called by it: the
/// engine's probes there are not the program's.
#[inline]
pub fn in_runtime_or_allocator() -> bool {
    let t = this_thread();
    t.inside.get() || t.in_allocator.get()
}

/// Whether the current thread is inside the runtime (for signal handlers).
#[inline]
pub fn inside() -> bool {
    this_thread().inside.get()
}
