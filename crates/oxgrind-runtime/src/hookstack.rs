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
//! the hook stack, which the heap path's entry points switch to for the event ([`on_hook_stack`]); its
//! lower part is the thread's alternate signal stack, registered unless the program has set
//! one. The two are disjoint, so a signal arriving during an event is delivered below the
//! hook's frames, never over them. A guard page under both turns an overrun into a fault.
//! A thread-specific key's destructor retires it when the thread exits, for a later thread
//! to reuse once the kernel says the exiting one is gone.
//!
//! Under the engine none of this is done: the engine gives each thread an alternate stack of
//! its own and runs heap events on its engine stack. The main thread keeps its own stack
//! (it grows to the stack limit) and gets only the alternate stack.

use core::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use oxgrind_sys::raw;

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

extern "C" {
    /// This thread's `oxg_hook_stack_top` (`shim.c`): the top of its hook stack while the
    /// switch may use it, 0 when it has none or is on it.
    fn oxg_hook_stack_slot() -> *mut u64;
}

/// Defines `$name`, with `$target`'s signature (at most six integer arguments, all in
/// registers), which runs `$target`, a heap-path event, on the thread's hook stack when it
/// has one free, else where it is (the main thread; a thread not started by
/// `pthread_create`; an event a signal handler makes while another is on the hook stack;
/// any thread under the engine): four instructions then, a load of the slot and a jump.
/// The stack walk is not affected: it starts from the program's registers at its call,
/// which the entry point read before any code of ours ran.
macro_rules! on_hook_stack {
    ($(fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? => $target:path;)*) => {$(
        #[unsafe(naked)]
        unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? {
            // SAFETY: the argument registers are left as they are (rax, r10, r11, rcx are
            // not arguments' and the ABI lets a call clobber them). With a hook stack: the
            // slot is 0 while it is in use, so an event interrupting this one stays where
            // it is; the program's rsp and the slot's TLS offset are kept at the hook
            // stack's top, which is 16-aligned, so the call's frame is as the ABI wants;
            // back on the program's stack (`pop rsp`) before the slot says free again, so
            // a signal's event can never overwrite the saved rsp. `$target` returns in rax.
            core::arch::naked_asm!(
                "mov rax, qword ptr [rip + oxg_hook_stack_top@GOTTPOFF]",
                "mov r10, qword ptr fs:[rax]",
                "test r10, r10",
                "jz {target}",
                "mov qword ptr fs:[rax], 0",
                "mov r11, rsp",
                "mov rsp, r10",
                "push r11",
                "push rax",
                "call {target}",
                "pop rcx",
                "lea r11, [rsp + 8]",
                "pop rsp",
                "mov qword ptr fs:[rcx], r11",
                "ret",
                target = sym $target,
            )
        }
    )*};
}
pub(crate) use on_hook_stack;

/// The start routine and argument the program gave `pthread_create`.
#[repr(C)]
struct Start {
    routine: u64,
    arg: u64,
}

/// What the new thread needs: the program's [`Start`], and the signal mask it is to run
/// with (the creating thread's at the call).
struct Starting {
    start: Start,
    mask: u64,
}

/// Every signal but those a fault or a system call raises in the thread itself (SIGILL,
/// SIGTRAP, SIGBUS, SIGFPE, SIGSEGV, SIGSYS): what a thread's set-up keeps blocked. A
/// blocked SIGSYS of seccomp's (`--pages-as-heap`: the set-up's own mmap traps) or a
/// blocked fault kills the process.
const ASYNCHRONOUS_SIGNALS: u64 = !((1 << (4 - 1))
    | (1 << (5 - 1))
    | (1 << (7 - 1))
    | (1 << (8 - 1))
    | (1 << (11 - 1))
    | (1 << (31 - 1)));

/// `rt_sigprocmask(SIG_SETMASK, set, old)`: this thread's signal mask.
fn set_signal_mask(set: u64, old: Option<&mut u64>) {
    const SYS_RT_SIGPROCMASK: usize = 14;
    const SIG_SETMASK: usize = 2;
    let old = old.map_or(0, |o| o as *mut u64 as usize);
    // SAFETY: `set` is one 8-byte sigset_t read by the kernel, `old` null or one written.
    unsafe {
        oxgrind_sys::syscall::syscall4(
            SYS_RT_SIGPROCMASK,
            SIG_SETMASK,
            &set as *const u64 as usize,
            old,
            8,
        )
    };
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
    // The thread starts with every asynchronous signal blocked (glibc's start_thread gives it the mask
    // the creator had at the call) until it has its stacks: a signal pending for the
    // process was delivered there at once, and its handler's `malloc` ran the hook on
    // the thread's small stack. `setup_thread` gives it the program's mask back.
    // A mask the attributes set (`pthread_attr_setsigmask_np`) is the one the routine
    // gets, and glibc gives it the thread at its start: then that is the mask kept.
    let mut mask = 0u64;
    set_signal_mask(ASYNCHRONOUS_SIGNALS, Some(&mut mask));
    let starting = Box::into_raw(Box::new(Starting {
        start: Start {
            routine,
            arg: arg as u64,
        },
        mask: attr_sigmask(attr).unwrap_or(mask),
    }));
    // SAFETY: the thread starts in `thread_start` with `starting`, which it takes back.
    let r = unsafe {
        real(
            thread,
            attr,
            thread_start as *const () as u64,
            starting.cast(),
        )
    };
    set_signal_mask(mask, None);
    if r != 0 {
        // SAFETY: no thread was started: `starting` is still ours alone.
        drop(unsafe { Box::from_raw(starting) });
    }
    r
}

/// The signal mask `attr` gives the thread (`pthread_attr_getsigmask_np`), if it sets one.
fn attr_sigmask(attr: *const c_void) -> Option<u64> {
    type GetSigmask = unsafe extern "C" fn(*const c_void, *mut [u64; 16]) -> c_int;
    static GET: AtomicUsize = AtomicUsize::new(0);
    if attr.is_null() {
        return None;
    }
    let mut f = GET.load(Ordering::Relaxed);
    if f == 0 {
        f = crate::libc_api::next_symbol(b"pthread_attr_getsigmask_np\0") as usize;
        GET.store(f.max(1), Ordering::Relaxed);
    }
    if f <= 1 {
        return None; // a glibc older than 2.32: no attribute sets a mask
    }
    let mut set = [0u64; 16];
    // SAFETY: glibc's pthread_attr_getsigmask_np, reading the program's attributes and
    // writing one sigset_t (128 bytes) into `set`; 0: a mask is set.
    let r = unsafe { core::mem::transmute::<usize, GetSigmask>(f)(attr, &mut set) };
    (r == 0).then_some(set[0])
}

/// A new thread's first code (rdi = its [`Starting`]), with every asynchronous signal blocked: gives the thread its stacks, then jumps
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

/// Gives the thread its stacks ([`give_this_thread`]) and the program's signal mask, and
/// returns the program's start routine and argument, freeing the [`Starting`].
extern "C" fn setup_thread(starting: *mut Starting) -> Start {
    // SAFETY: `starting` came from Box::into_raw in `pthread_create`, for this thread only.
    let starting = *unsafe { Box::from_raw(starting) };
    give_this_thread();
    set_signal_mask(starting.mask, None);
    starting.start
}

/// Maps this thread's stacks and registers them: the hook stack in the thread's state,
/// the alternate stack with the kernel unless the thread has one, the mapping with the key
/// whose destructor frees it.
fn give_this_thread() {
    let base = match reuse_retired() {
        Some(base) => base,
        None => {
            let Some(base) = raw::mmap_anon(SIZE) else {
                return; // the thread runs on its own stack, as without this
            };
            const SYS_MPROTECT: usize = 10;
            // SAFETY: PROT_NONE on the first page of the fresh mapping above: nothing is
            // there.
            unsafe { oxgrind_sys::syscall::syscall3(SYS_MPROTECT, base as usize, GUARD, 0) };
            base
        }
    };
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
    // SAFETY: the key was created in `enable`; its value is the mapping's base. The slot
    // is this thread's, read only by this thread.
    unsafe {
        pthread_setspecific(KEY.load(Ordering::Relaxed), base.cast());
        *oxg_hook_stack_slot() = base as u64 + SIZE as u64;
    }
}

const SYS_SIGALTSTACK: usize = 131;
const SS_DISABLE: u64 = 2;

/// Mappings of threads that were exiting when their key's destructor ran (`base`, the
/// thread's id): a thread still runs code of glibc's and the program's after that (later
/// destructors, glibc's per-thread clean-up), and a signal's handler there may allocate,
/// so its stacks stay its own until the kernel says the thread is gone. Touched only as
/// threads start and end, never per event.
static RETIRED: oxgrind_sys::lock::SpinLock<Vec<(usize, i32)>> =
    oxgrind_sys::lock::SpinLock::new(Vec::new());

/// More retired mappings than this, and those of threads gone are unmapped as a thread
/// ends, rather than kept for threads to come.
const KEEP_RETIRED: usize = 16;

/// Whether thread `tid` of this process has exited (a thread id is not reused while the
/// thread lives; a reused one only keeps a mapping longer).
fn gone(tid: i32) -> bool {
    const ESRCH: i32 = 3;
    matches!(raw::tgkill(raw::getpid(), tid, 0), Err(e) if e == ESRCH)
}

/// A retired mapping whose thread is gone, for a starting thread.
fn reuse_retired() -> Option<*mut u8> {
    let mut r = RETIRED.lock();
    let i = r.iter().position(|&(_, tid)| gone(tid))?;
    Some(r.swap_remove(i).0 as *mut u8)
}

/// The key's destructor, as the thread exits: its mapping is retired ([`RETIRED`]), still
/// the thread's hook and alternate stack until it is gone; a later thread reuses it, or
/// it is unmapped here once too many are kept.
extern "C" fn release(base: *mut c_void) {
    let mut unmap = Vec::new();
    {
        let mut r = RETIRED.lock();
        if r.len() >= KEEP_RETIRED {
            r.retain(|&(b, tid)| {
                let keep = !gone(tid);
                if !keep {
                    unmap.push(b);
                }
                keep
            });
        }
        r.push((base as usize, raw::gettid()));
    }
    for b in unmap {
        // SAFETY: the mapping of `SIZE` bytes `give_this_thread` made for a thread the
        // kernel says is gone: nothing uses it, and it was taken out of the list above.
        unsafe { raw::munmap(b as *mut u8, SIZE) };
    }
}
