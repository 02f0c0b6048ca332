//! The copying string functions (`strcpy`, `strncat`, `__memcpy_chk`, ...): checked for
//! overlapping source and destination when the tool asks (`Needs::check_overlaps`, Memcheck),
//! glibc's own at the cost of one indirect jump otherwise.
//!
//! Each exported name is a naked function that jumps through [`JUMP`]. The table starts
//! out pointing at the C versions in `strings.c`, which work before anything is set up
//! (plain loops: other libraries' constructors copy strings before our constructor runs).
//! The first call after set-up resolves glibc's functions with `dlsym(RTLD_NEXT)` and, when
//! the tool does not check, points the table at them: from then on a Massif or `none` run
//! executes `jmp [table]` and glibc's code, nothing else. When the tool checks, the C
//! versions stay and call [`oxgrind_strings_overlap`] for each overlap, which reports
//! `Misuse::Overlap` with frame 0 our exported function, as Valgrind's frame 0 is its
//! preload's replacement.
//!
//! Which functions, and the exact rules, are Valgrind 3.19's (see `strings.c`). `memcpy` is
//! not among them: Valgrind 3.19 does not check it on amd64, where glibc's `memcpy` is its
//! `memmove` (Valgrind bug 402833), and interposing it would cost every program.

use core::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicU8, Ordering};

use oxgrind_tool::{Misuse, MisuseEvent};

use crate::exit::EventGate;
use crate::guard::Entered;
use crate::host::HOST;
use crate::state::{self, STACKS};

/// The functions, in `strings.c`'s order (its `F_*` indices): exported name (NUL-terminated,
/// also frame 0 of a report) and the name Valgrind's report gives the function.
const FNS: [(&[u8], &str); N] = [
    (b"strcpy\0", "strcpy"),
    (b"strncpy\0", "strncpy"),
    (b"strcat\0", "strcat"),
    (b"strncat\0", "strncat"),
    (b"stpcpy\0", "stpcpy"),
    (b"stpncpy\0", "stpncpy"),
    (b"mempcpy\0", "mempcpy"),
    (b"__memcpy_chk\0", "memcpy_chk"),
    (b"memccpy\0", "memccpy"),
    (b"wcscpy\0", "wcscpy"),
    // Reported as the strncpy and stpncpy glibc tail-calls (strings.c passes those indices).
    (b"__strncpy_chk\0", "strncpy"),
    (b"__stpncpy_chk\0", "stpncpy"),
];
const N: usize = 12;
/// `__memcpy_chk`'s index in [`FNS`].
const F_MEMCPY_CHK: usize = 7;

extern "C" {
    fn oxgrind_c_strcpy();
    fn oxgrind_c_strncpy();
    fn oxgrind_c_strcat();
    fn oxgrind_c_strncat();
    fn oxgrind_c_stpcpy();
    fn oxgrind_c_stpncpy();
    fn oxgrind_c_mempcpy();
    fn oxgrind_c___memcpy_chk();
    fn oxgrind_c_memccpy();
    fn oxgrind_c_wcscpy();
    fn oxgrind_c___strncpy_chk();
    fn oxgrind_c___stpncpy_chk();
    /// `checked`: bit `i` set when function `i` is checked by the C version.
    fn oxgrind_strings_install(fns: *const *mut c_void, n: c_int, checked: c_int);
}

/// Where each exported function jumps: the C version, or glibc's once set-up found the tool
/// does not check overlaps. Read by the naked functions below with one `jmp [rip + ...]`.
static JUMP: [AtomicPtr<c_void>; N] = [
    AtomicPtr::new(oxgrind_c_strcpy as *mut c_void),
    AtomicPtr::new(oxgrind_c_strncpy as *mut c_void),
    AtomicPtr::new(oxgrind_c_strcat as *mut c_void),
    AtomicPtr::new(oxgrind_c_strncat as *mut c_void),
    AtomicPtr::new(oxgrind_c_stpcpy as *mut c_void),
    AtomicPtr::new(oxgrind_c_stpncpy as *mut c_void),
    AtomicPtr::new(oxgrind_c_mempcpy as *mut c_void),
    AtomicPtr::new(oxgrind_c___memcpy_chk as *mut c_void),
    AtomicPtr::new(oxgrind_c_memccpy as *mut c_void),
    AtomicPtr::new(oxgrind_c_wcscpy as *mut c_void),
    AtomicPtr::new(oxgrind_c___strncpy_chk as *mut c_void),
    AtomicPtr::new(oxgrind_c___stpncpy_chk as *mut c_void),
];

macro_rules! jump_through_table {
    ($($name:ident => $i:expr;)*) => {
        $(
            #[unsafe(naked)]
            #[no_mangle]
            pub unsafe extern "C" fn $name() {
                // SAFETY: a tail jump with every argument register untouched, to a function
                // with the exported function's exact signature (C version or glibc's).
                core::arch::naked_asm!(
                    "jmp qword ptr [rip + {table} + {offset}]",
                    table = sym JUMP,
                    offset = const $i * 8,
                )
            }
        )*
        /// Our exported functions, by index: the fallback address of frame 0.
        const EXPORTS: [unsafe extern "C" fn(); N] = [$($name),*];
    };
}

jump_through_table! {
    strcpy => 0;
    strncpy => 1;
    strcat => 2;
    strncat => 3;
    stpcpy => 4;
    stpncpy => 5;
    mempcpy => 6;
    __memcpy_chk => 7;
    memccpy => 8;
    wcscpy => 9;
    __strncpy_chk => 10;
    __stpncpy_chk => 11;
}

const UNRESOLVED: u8 = 0;
const RESOLVING: u8 = 1;
const RESOLVED: u8 = 2;
const FAILED: u8 = 3;
static RESOLUTION: AtomicU8 = AtomicU8::new(UNRESOLVED);

/// Called by the C versions until glibc's functions are known: resolves them once set-up
/// has run, and decides once whether calls are checked. Returns 1 when the C versions may
/// use glibc's functions, 0 while they must use their plain loops (before set-up, while
/// another thread resolves, from inside the runtime, or if a function is missing).
#[no_mangle]
pub extern "C" fn oxgrind_strings_resolve() -> c_int {
    match RESOLUTION.load(Ordering::Acquire) {
        RESOLVED => return 1,
        RESOLVING | FAILED => return 0,
        _ => {}
    }
    if !state::settled() {
        return 0;
    }
    // dlsym may call malloc and free (its error string): those must pass through the hooks.
    let Some(_inside) = Entered::try_enter() else {
        return 0;
    };
    if RESOLUTION
        .compare_exchange(UNRESOLVED, RESOLVING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return c_int::from(RESOLUTION.load(Ordering::Acquire) == RESOLVED);
    }
    let mut real = [core::ptr::null_mut::<c_void>(); N];
    for (slot, (name, _)) in real.iter_mut().zip(FNS) {
        *slot = crate::libc_api::next_symbol(name);
    }
    if let Some(i) = real.iter().position(|p| p.is_null()) {
        let name = String::from_utf8_lossy(&FNS[i].0[..FNS[i].0.len() - 1]).into_owned();
        oxgrind_sys::fd::write_all(
            2,
            format!("oxgrind: libc has no {name}; string functions are not checked\n").as_bytes(),
        );
        RESOLUTION.store(FAILED, Ordering::Release);
        return 0;
    }
    let check = state::runtime().is_some_and(|rt| rt.needs.check_overlaps);
    // When the engine replaces glibc's functions (`replace.rs`), a call through our export
    // goes to glibc's, whose code is replaced by the checked version: one mechanism checks
    // every call, the program's and libc's own. Except `__memcpy_chk`: glibc's shares its
    // code with `__memmove_chk`, which must not report overlaps, so it keeps its check here.
    let replaced = check && crate::replace::active();
    let checked_here = |i: usize| check && (!replaced || i == F_MEMCPY_CHK);
    let mask = (0..N)
        .filter(|&i| checked_here(i))
        .fold(0, |m, i| m | 1 << i);
    // SAFETY: `real` holds N function pointers of the signatures strings.c expects.
    unsafe { oxgrind_strings_install(real.as_ptr(), N as c_int, mask) };
    for (i, (slot, p)) in JUMP.iter().zip(real).enumerate() {
        if !checked_here(i) {
            slot.store(p, Ordering::Release);
        }
    }
    RESOLUTION.store(RESOLVED, Ordering::Release);
    1
}

/// Frame 0 of a report: our exported function's address as the program sees it (see
/// `hooks::own_address`), resolved once.
fn entry(which: usize) -> u64 {
    static ENTRIES: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
    match ENTRIES[which].load(Ordering::Relaxed) {
        0 => {
            let fallback = EXPORTS[which] as usize as u64;
            match crate::hooks::own_address(FNS[which].0, fallback) {
                Some(a) => {
                    ENTRIES[which].store(a, Ordering::Relaxed);
                    a
                }
                None => fallback,
            }
        }
        a => a,
    }
}

/// Reports an overlap found by `strings.c`: `which` is the function (an `F_*` index),
/// `len` 0 for the functions whose report prints no length.
#[no_mangle]
pub extern "C" fn oxgrind_strings_overlap(
    which: c_int,
    dst: *const c_void,
    src: *const c_void,
    len: usize,
) {
    let Some(rt) = state::runtime() else {
        return;
    };
    let which = (which.max(0) as usize).min(N - 1);
    // Before entering: own_address takes the re-entrancy flag itself.
    let entry = entry(which);
    let Some(inside) = Entered::try_enter() else {
        return;
    };
    let gate = EventGate::enter();
    // SAFETY: this thread's errno slot.
    let errno = unsafe { *crate::guard::errno_slot() };
    let depth = rt.needs.stack_depth;
    let stack = if depth == 0 {
        crate::hooks::NO_STACK
    } else {
        crate::stacks::capture(&STACKS, entry, crate::stacks::Caller::UNKNOWN, depth)
    };
    let ev = MisuseEvent {
        kind: Misuse::Overlap {
            func: FNS[which].1,
            dst: dst as u64,
            src: src as u64,
            len: (len != 0).then_some(len as u64),
        },
        stack,
        tid: crate::guard::tid(),
    };
    rt.tool.on_misuse(&HOST, &ev);
    // SAFETY: as above.
    unsafe { *crate::guard::errno_slot() = errno };
    drop(gate);
    drop(inside);
}
