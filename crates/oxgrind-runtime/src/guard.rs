//! The per-thread "inside oxgrind" flag.
//!
//! While the runtime works on a thread, a `malloc` on that thread can only come from the
//! runtime itself (through a libc function it called) or from a signal handler that
//! interrupted it. Both must bypass the tool: the first would recurse, the second would
//! re-enter non-reentrant state. [`Entered`] sets the flag for a scope.
//!
//! The flag lives in a `thread_local!` with a `const` initialiser and no destructor: for a
//! library loaded at start-up, that is static TLS, allocated with the thread, so reading it
//! never allocates (a `dlopen`ed library would get lazily allocated TLS and could not do
//! this).

use std::cell::Cell;

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
    /// Set while glibc's allocator runs for the program inside a hook
    /// ([`on_behalf_of_program`]): its memory accesses are the allocator's bookkeeping,
    /// which tools do not see (Valgrind's malloc runs outside the client altogether).
    static IN_ALLOCATOR: Cell<bool> = const { Cell::new(false) };
    /// This thread's kernel id, cached: a `gettid` system call per allocation cost about a
    /// fifth of Massif's time per event. 0 until first asked.
    static TID: Cell<i32> = const { Cell::new(0) };
}

/// The calling thread's kernel thread id.
#[inline]
pub fn tid() -> i32 {
    TID.with(|t| {
        let v = t.get();
        if v != 0 {
            return v;
        }
        let v = oxgrind_sys::raw::gettid();
        t.set(v);
        v
    })
}

/// In a forked child the surviving thread has a new id.
pub fn forget_tid() {
    TID.with(|t| t.set(0));
}

/// Proof that this thread was not inside the runtime and now is, until dropped.
pub struct Entered(());

impl Entered {
    #[inline]
    pub fn try_enter() -> Option<Entered> {
        INSIDE.with(|f| {
            if f.get() {
                None
            } else {
                f.set(true);
                // What our code does from here on (its calls into libc run translated) is
                // not the program's: the engine drops its trace records.
                oxgrind_engine::hold_trace(true);
                Some(Entered(()))
            }
        })
    }
}

impl Drop for Entered {
    #[inline]
    fn drop(&mut self) {
        oxgrind_engine::hold_trace(false);
        INSIDE.with(|f| f.set(false));
        crate::exit::run_pending_signal();
    }
}

/// Runs `f` with the flag cleared: for calls into glibc's allocator made on the program's
/// behalf from inside a hook. What they cause (glibc's own `mmap`s, which `--pages-as-heap`
/// traps) is the program's, not oxgrind's. They never call back into our hooks.
#[inline]
pub fn on_behalf_of_program<T>(f: impl FnOnce() -> T) -> T {
    let was = INSIDE.with(|x| x.replace(false));
    let was_alloc = IN_ALLOCATOR.with(|x| x.replace(true));
    let r = f();
    IN_ALLOCATOR.with(|x| x.set(was_alloc));
    INSIDE.with(|x| x.set(was));
    r
}

/// Whether the current thread is in the runtime or in glibc's allocator called by it: the
/// engine's probes there are not the program's.
#[inline]
pub fn in_runtime_or_allocator() -> bool {
    INSIDE.with(|f| f.get()) || IN_ALLOCATOR.with(|f| f.get())
}

/// Whether the current thread is inside the runtime (for signal handlers).
#[inline]
pub fn inside() -> bool {
    INSIDE.with(|f| f.get())
}
