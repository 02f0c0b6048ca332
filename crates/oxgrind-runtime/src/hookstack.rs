//! Each thread's stack for the heap path's hooks, and its alternate signal stack, when the
//! program runs without the translation engine (Massif's `--time-unit=B` and `ms`).
//!
//! Why: there the hooks run on the program's own thread, and the tool's work for one event
//! can go deep (Massif's first sight of a stack symbolises its frames: about 24 KiB), so a
//! thread the program made with the smallest stack POSIX allows (`PTHREAD_STACK_MIN`, 16
//! KiB) died of SIGSEGV at its first `malloc`, where it runs natively and under Valgrind
//! (whose tools run on stacks of their own). And a thread's stack overflow ended with no
//! report at all: the kernel can deliver that SIGSEGV only on an alternate signal stack,
//! and without the engine only the main thread had one (`exit::give_main_thread_an_alt_stack`).
//!
//! So every thread the program starts with `pthread_create` gets one mapping of ours as it
//! starts (our `pthread_create` puts [`thread_start`] before the program's start routine,
//! which it then jumps to: no frame of ours stays on the thread's stack). Its upper part is
//! the hook stack, which the heap path's entry points switch to for the event ([`run`]); its
//! lower part is the thread's alternate signal stack, registered unless the program has set
//! one. The two are disjoint, so a signal arriving during an event is delivered below the
//! hook's frames, never over them. A guard page under both turns an overrun into a fault.
//! A thread-specific key's destructor unmaps it when the thread exits.
//!
//! Under the engine none of this is done: the engine gives each thread an alternate stack of
//! its own and runs heap events on its engine stack. The main thread keeps its own stack
//! (it grows to the stack limit) and gets only the alternate stack.

use core::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use oxgrind_sys::raw;

use crate::guard::{this_thread, ThreadState};

/// The lowest page: inaccessible, so that running past the alternate stack faults.
const GUARD: usize = 4096;
/// The alternate signal stack: room for the report of a fatal signal (Massif's file,
/// symbolised), written there when the thread's own stack is exhausted.
const ALT: usize = 256 << 10;
/// The hook stack: Massif's deepest event (symbolising a new stack) needs about 24 KiB.
const HOOK: usize = 256 << 10;
const SIZE: usize = GUARD + ALT + HOOK;

/// Set once, without the engine: threads started from then on get their stacks.
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The thread-specific key whose destructor frees a thread's mapping ([`release`]).
static KEY: AtomicU32 = AtomicU32::new(0);

extern "C" {
    fn pthread_key_create(key: *mut u32, destructor: Option<extern "C" fn(*mut c_void)>) -> c_int;
    fn pthread_setspecific(key: u32, value: *const c_void) -> c_int;
}

/// Turns the per-thread stacks on for threads started from now on: called once at set-up
/// when the program runs without the engine.
pub fn enable() {
    let mut key = 0u32;
    // SAFETY: pthread_key_create writes the new key into `key`; `release` has the
    // destructor's signature.
    if unsafe { pthread_key_create(&mut key, Some(release)) } != 0 {
        return; // no way to free them: threads run on their own stacks, as before
    }
    KEY.store(key, Ordering::Relaxed);
    ACTIVE.store(true, Ordering::Release);
}

/// Runs `f`, an event of the heap path, on the thread's hook stack when it has one free,
/// else where it is (the main thread; a thread not started by `pthread_create`; a signal
/// handler's event that interrupted an event on the hook stack; any thread under the
/// engine). The stack walk is not affected: it starts from the program's registers at its
/// call, which the entry point read before any code of ours ran.
#[inline(always)]
pub fn run<R>(f: impl FnOnce() -> R) -> R {
    let t = this_thread();
    let top = t.hook_stack.get();
    if top == 0 {
        return f();
    }
    switched(t, top, f)
}

/// [`run`] on the hook stack whose top is `top`.
#[inline(never)]
fn switched<R, F: FnOnce() -> R>(t: &ThreadState, top: u64, f: F) -> R {
    struct Call<F, R> {
        f: Option<F>,
        out: Option<R>,
    }
    extern "C" fn call<F: FnOnce() -> R, R>(c: *mut Call<F, R>) {
        // SAFETY: `c` is the `Call` on the switching frame below, alive and not otherwise
        // reached while the asm runs this.
        let c = unsafe { &mut *c };
        if let Some(f) = c.f.take() {
            c.out = Some(f());
        }
    }
    let mut c = Call {
        f: Some(f),
        out: None,
    };
    // In use: an event that interrupts this one (a signal handler's `malloc`) runs where it
    // is instead of over this one's frames. Cleared and set around the asm, which the
    // compiler does not move memory accesses across.
    t.hook_stack.set(0);
    // SAFETY: `top` is the 16-aligned top of this thread's hook stack, mapped and unused
    // (the slot said so, and is 0 until we are back): the call's frame starts there as
    // the ABI wants. The program's stack pointer is kept in r12, which the callee saves,
    // and restored after; every register the C ABI lets the call clobber is declared so.
    unsafe {
        core::arch::asm!(
            "mov r12, rsp",
            "mov rsp, {top}",
            "call {call}",
            "mov rsp, r12",
            top = in(reg) top,
            call = in(reg) call::<F, R> as *const () as usize,
            in("rdi") &mut c as *mut Call<F, R>,
            out("r12") _,
            clobber_abi("C"),
        );
    }
    t.hook_stack.set(top);
    match c.out {
        Some(r) => r,
        None => unreachable!("the hook stack's call returned without running its closure"),
    }
}

/// The start routine and argument the program gave `pthread_create`.
#[repr(C)]
struct Start {
    routine: u64,
    arg: u64,
}

type PthreadCreate = unsafe extern "C" fn(*mut u64, *const c_void, u64, *mut c_void) -> c_int;

fn real_pthread_create() -> Option<PthreadCreate> {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let mut f = REAL.load(Ordering::Acquire);
    if f == 0 {
        f = crate::libc_api::next_symbol(b"pthread_create\0") as usize;
        REAL.store(f, Ordering::Release);
    }
    // SAFETY: dlsym returned libc's pthread_create, whose signature is PthreadCreate.
    (f != 0).then(|| unsafe { core::mem::transmute::<usize, PthreadCreate>(f) })
}

/// The program's `pthread_create`: without the engine, the thread starts in
/// [`thread_start`], which gives it its stacks and jumps to the program's routine.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut u64,
    attr: *const c_void,
    routine: u64,
    arg: *mut c_void,
) -> c_int {
    let Some(real) = real_pthread_create() else {
        return 11; // EAGAIN: libc's pthread_create is not there to call
    };
    if !ACTIVE.load(Ordering::Acquire) {
        // SAFETY: forwarded as given.
        return unsafe { real(thread, attr, routine, arg) };
    }
    let start = Box::into_raw(Box::new(Start {
        routine,
        arg: arg as u64,
    }));
    // SAFETY: the thread starts in `thread_start` with `start`, which it takes back.
    let r = unsafe { real(thread, attr, thread_start as *const () as u64, start.cast()) };
    if r != 0 {
        // SAFETY: no thread was started: `start` is still ours alone.
        drop(unsafe { Box::from_raw(start) });
    }
    r
}

/// A new thread's first code (rdi = its [`Start`]): gives the thread its stacks, then jumps
/// to the program's start routine with its argument, so that the routine returns to glibc's
/// `start_thread` as without us and no frame of ours is on the thread's stack.
#[unsafe(naked)]
unsafe extern "C" fn thread_start(start: *mut c_void) -> *mut c_void {
    // SAFETY: rsp is as at a function's entry (8 below a 16-byte boundary); the `sub`
    // aligns it for the call, which returns the routine in rax and its argument in rdx
    // (a 16-byte struct of two integers); the `add` puts rsp back where the routine
    // expects it at its entry, with start_thread's return address at rsp.
    core::arch::naked_asm!(
        "sub rsp, 8",
        "call {setup}",
        "add rsp, 8",
        "mov rdi, rdx",
        "jmp rax",
        setup = sym setup_thread,
    )
}

/// Gives the thread its stacks ([`give_this_thread`]) and returns the program's start
/// routine and argument, freeing the [`Start`].
extern "C" fn setup_thread(start: *mut Start) -> Start {
    // SAFETY: `start` came from Box::into_raw in `pthread_create`, for this thread only.
    let start = *unsafe { Box::from_raw(start) };
    give_this_thread();
    start
}

/// Maps this thread's stacks and registers them: the hook stack in the thread's state,
/// the alternate stack with the kernel unless the thread has one, the mapping with the key
/// whose destructor frees it.
fn give_this_thread() {
    let Some(base) = raw::mmap_anon(SIZE) else {
        return; // the thread runs on its own stack, as without this
    };
    const SYS_MPROTECT: usize = 10;
    // SAFETY: PROT_NONE on the first page of the fresh mapping above: nothing is there.
    unsafe { oxgrind_sys::syscall::syscall3(SYS_MPROTECT, base as usize, GUARD, 0) };
    let alt = base as u64 + GUARD as u64;
    let mut old = [0u64; 3];
    // SAFETY: sigaltstack(NULL, &old) writes one stack_t (24 bytes) into `old`.
    let r =
        unsafe { oxgrind_sys::syscall::syscall2(SYS_SIGALTSTACK, 0, old.as_mut_ptr() as usize) };
    if r == 0 && old[1] & SS_DISABLE != 0 {
        let ss = [alt, 0, ALT as u64];
        // SAFETY: `ss` is a valid stack_t naming the part of the mapping for it, which
        // stays mapped until `release` has unregistered it.
        unsafe { oxgrind_sys::syscall::syscall2(SYS_SIGALTSTACK, ss.as_ptr() as usize, 0) };
    }
    // SAFETY: the key was created in `enable`; its value is the mapping's base.
    unsafe { pthread_setspecific(KEY.load(Ordering::Relaxed), base.cast()) };
    this_thread().hook_stack.set(base as u64 + SIZE as u64);
}

const SYS_SIGALTSTACK: usize = 131;
const SS_DISABLE: u64 = 2;

/// The key's destructor, as the thread exits: the thread no longer switches to the hook
/// stack, the alternate stack is unregistered if it is still ours, and the mapping goes.
/// It runs between events (glibc calls destructors after the start routine returned, or
/// from `pthread_exit`), so neither stack is in use.
extern "C" fn release(base: *mut c_void) {
    this_thread().hook_stack.set(0);
    let alt = base as u64 + GUARD as u64;
    let mut old = [0u64; 3];
    // SAFETY: as in `give_this_thread`.
    let r =
        unsafe { oxgrind_sys::syscall::syscall2(SYS_SIGALTSTACK, 0, old.as_mut_ptr() as usize) };
    if r == 0 && old[0] == alt && old[1] & SS_DISABLE == 0 {
        let ss = [0u64, SS_DISABLE, 0];
        // SAFETY: a valid stack_t disabling the alternate stack.
        unsafe { oxgrind_sys::syscall::syscall2(SYS_SIGALTSTACK, ss.as_ptr() as usize, 0) };
    }
    // SAFETY: `base` is the mapping of `SIZE` bytes `give_this_thread` made for this
    // thread; nothing of it is in use or registered any more (above).
    unsafe { raw::munmap(base.cast(), SIZE) };
}
