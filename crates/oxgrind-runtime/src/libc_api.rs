//! The handful of libc functions the runtime calls, declared here so every use is visible.
//!
//! The allocator entry points are glibc's own exported names for its malloc
//! (`__libc_malloc` ...): calling them reaches glibc's allocator directly, never our
//! interposed `malloc`. Everything else is only called outside the hot path.
#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_int, c_void};

extern "C" {
    pub fn __libc_malloc(size: usize) -> *mut c_void;
    pub fn __libc_free(p: *mut c_void);
    pub fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    pub fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    pub fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    pub fn __libc_valloc(size: usize) -> *mut c_void;
    pub fn __libc_pvalloc(size: usize) -> *mut c_void;
    pub fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    pub fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void;
    pub fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> c_int;
    pub fn fflush(stream: *mut c_void) -> c_int;
    pub fn unsetenv(name: *const c_char) -> c_int;
    pub fn clock_gettime(clock: c_int, ts: *mut [i64; 2]) -> c_int;
    pub fn on_exit(f: extern "C" fn(c_int, *mut c_void), arg: *mut c_void) -> c_int;
    pub static mut environ: *mut *mut c_char;
}

/// `RTLD_NEXT`: the next definition after the calling object's.
pub const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;
/// `RTLD_DEFAULT`: the global search order.
pub const RTLD_DEFAULT: *mut c_void = core::ptr::null_mut();

/// Looks up the next definition of `name` (NUL-terminated) after ours.
pub fn next_symbol(name: &[u8]) -> *mut c_void {
    debug_assert_eq!(name.last(), Some(&0));
    // SAFETY: name is NUL-terminated; dlsym only reads it.
    unsafe { dlsym(RTLD_NEXT, name.as_ptr().cast()) }
}

pub fn default_symbol(name: &[u8]) -> *mut c_void {
    debug_assert_eq!(name.last(), Some(&0));
    // SAFETY: name is NUL-terminated; dlsym only reads it.
    unsafe { dlsym(RTLD_DEFAULT, name.as_ptr().cast()) }
}

/// Monotonic nanoseconds through the vDSO (no system call). `clock_gettime` touches `errno`
/// only on failure, which CLOCK_MONOTONIC does not have.
pub fn monotonic_ns() -> u64 {
    let mut ts = [0i64; 2];
    // SAFETY: ts is a valid `struct timespec`; CLOCK_MONOTONIC is 1.
    if unsafe { clock_gettime(1, &mut ts) } != 0 {
        return oxgrind_sys::raw::monotonic_ns();
    }
    ts[0] as u64 * 1_000_000_000 + ts[1] as u64
}
