//! oxgrind's own file descriptors, kept out of the program's reach.
//!
//! The log, the XML output and the files we write live on descriptors duplicated above 900
//! (host.rs). A program that closes every descriptor it did not open (daemons, Python's
//! `subprocess` in a child, `closefrom`) would otherwise silence the report. As Valgrind
//! does, we refuse: `close` of one of ours fails with EBADF, `close_range`/`closefrom` skip
//! ours, and `dup2`/`dup3` onto ours fail with EBADF.

use core::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use oxgrind_sys::syscall::{syscall1, syscall3};

const SYS_CLOSE: usize = 3;
const SYS_DUP3: usize = 292;
const SYS_CLOSE_RANGE: usize = 436;
const EBADF: c_int = 9;

/// Our descriptors, as a bit set over [BASE, BASE + 256).
const BASE: i32 = 900;
static OURS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

pub fn register(fd: i32) {
    if (BASE..BASE + 256).contains(&fd) {
        let i = (fd - BASE) as usize;
        OURS[i / 64].fetch_or(1 << (i % 64), Ordering::AcqRel);
    }
}

pub fn unregister(fd: i32) {
    if (BASE..BASE + 256).contains(&fd) {
        let i = (fd - BASE) as usize;
        OURS[i / 64].fetch_and(!(1 << (i % 64)), Ordering::AcqRel);
    }
}

#[inline]
pub fn is_ours(fd: i64) -> bool {
    if !(BASE as i64..BASE as i64 + 256).contains(&fd) {
        return false;
    }
    let i = (fd - BASE as i64) as usize;
    OURS[i / 64].load(Ordering::Acquire) & (1 << (i % 64)) != 0
}

extern "C" {}

/// Turns a raw result into libc's convention (-1 and errno).
fn libc_result(r: isize) -> c_int {
    if (-4095..0).contains(&r) {
        // SAFETY: this thread's errno slot.
        unsafe { *crate::guard::errno_slot() = -r as c_int };
        -1
    } else {
        r as c_int
    }
}

fn ebadf() -> c_int {
    libc_result(-(EBADF as isize))
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if is_ours(fd as i64) {
        return ebadf();
    }
    // SAFETY: close with the caller's descriptor.
    libc_result(unsafe { syscall1(SYS_CLOSE, fd as usize) })
}

/// libc's own `dup2`/`dup3`, which the program's calls reach when they do not touch ours:
/// the system call is then made from libc, where `--track-fds` finds it (trackfds.rs) with
/// libc's frame on top, as Valgrind shows it. Looked up once (0: not yet).
static LIBC_DUP2: AtomicUsize = AtomicUsize::new(0);
static LIBC_DUP3: AtomicUsize = AtomicUsize::new(0);

fn libc_fn(slot: &AtomicUsize, name: &[u8]) -> usize {
    let mut f = slot.load(Ordering::Acquire);
    if f == 0 {
        f = crate::libc_api::next_symbol(name) as usize;
        slot.store(f, Ordering::Release);
    }
    f
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if is_ours(new as i64) {
        return ebadf();
    }
    let f = libc_fn(&LIBC_DUP2, b"dup2\0");
    if f != 0 {
        // SAFETY: dlsym found libc's dup2, whose signature this is.
        let f: unsafe extern "C" fn(c_int, c_int) -> c_int = unsafe { core::mem::transmute(f) };
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { f(old, new) };
    }
    if old == new {
        // dup2(fd, fd) checks fd and returns it: what fcntl(F_GETFD) tells.
        // SAFETY: fcntl F_GETFD reads descriptor flags only.
        let r = unsafe { syscall3(72, old as usize, 1, 0) };
        return if r < 0 { libc_result(r) } else { old };
    }
    // SAFETY: dup3 with the caller's descriptors (dup2 is dup3 without flags for old != new).
    libc_result(unsafe { syscall3(SYS_DUP3, old as usize, new as usize, 0) })
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if is_ours(new as i64) {
        return ebadf();
    }
    let f = libc_fn(&LIBC_DUP3, b"dup3\0");
    if f != 0 {
        // SAFETY: dlsym found libc's dup3, whose signature this is.
        let f: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int =
            unsafe { core::mem::transmute(f) };
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { f(old, new, flags) };
    }
    // SAFETY: dup3 with the caller's arguments.
    libc_result(unsafe { syscall3(SYS_DUP3, old as usize, new as usize, flags as usize) })
}

/// `close_range`, around our descriptors: each sub-range between two of ours is closed.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let (first, last) = (first as i64, last as i64);
    if first > last {
        return libc_result(-22); // EINVAL
    }
    let mut start = first;
    let mut fd = first.max(BASE as i64);
    while fd <= last.min(BASE as i64 + 255) {
        if is_ours(fd) {
            if start < fd {
                // SAFETY: close_range over descriptors that are not ours.
                let r = unsafe {
                    syscall3(
                        SYS_CLOSE_RANGE,
                        start as usize,
                        (fd - 1) as usize,
                        flags as usize,
                    )
                };
                if r < 0 {
                    return libc_result(r);
                }
            }
            start = fd + 1;
        }
        fd += 1;
    }
    if start > last {
        return 0;
    }
    // SAFETY: as above, for the rest of the range.
    libc_result(unsafe {
        syscall3(
            SYS_CLOSE_RANGE,
            start as usize,
            last as usize,
            flags as usize,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    // SAFETY: our close_range, which keeps our descriptors.
    unsafe { close_range(lowfd.max(0) as c_uint, c_uint::MAX, 0) };
}
