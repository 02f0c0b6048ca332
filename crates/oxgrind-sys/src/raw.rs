//! Safe wrappers over the few system calls oxgrind needs, by number.
//!
//! Each wrapper is safe because its arguments are plain values or borrowed Rust slices whose
//! lifetime covers the call; wrappers that hand out raw memory ([`mmap`]) return pointers the
//! caller must treat as unsafe to use.
#![allow(unsafe_code)]

use crate::syscall::*;

pub const SYS_READ: usize = 0;
pub const SYS_WRITE: usize = 1;
pub const SYS_CLOSE: usize = 3;
pub const SYS_LSEEK: usize = 8;
pub const SYS_MMAP: usize = 9;
pub const SYS_MUNMAP: usize = 11;
pub const SYS_RT_SIGACTION: usize = 13;
pub const SYS_RT_SIGPROCMASK: usize = 14;
pub const SYS_SCHED_YIELD: usize = 24;
pub const SYS_GETPID: usize = 39;
pub const SYS_EXIT: usize = 60;
pub const SYS_KILL: usize = 62;
pub const SYS_FCNTL: usize = 72;
pub const SYS_RENAME: usize = 82;
pub const SYS_GETPPID: usize = 110;
pub const SYS_GETTID: usize = 186;
pub const SYS_TKILL: usize = 200;
pub const SYS_FUTEX: usize = 202;
pub const SYS_CLOCK_GETTIME: usize = 228;
pub const SYS_EXIT_GROUP: usize = 231;
pub const SYS_TGKILL: usize = 234;
pub const SYS_OPENAT: usize = 257;

pub const AT_FDCWD: isize = -100;
pub const O_RDONLY: usize = 0;
pub const O_WRONLY: usize = 1;
pub const O_CREAT: usize = 0o100;
pub const O_TRUNC: usize = 0o1000;
pub const O_APPEND: usize = 0o2000;
pub const O_CLOEXEC: usize = 0o2000000;

pub const PROT_READ: usize = 1;
pub const PROT_WRITE: usize = 2;
pub const MAP_SHARED: usize = 1;
pub const MAP_PRIVATE: usize = 2;
pub const MAP_FIXED: usize = 0x10;
pub const MAP_ANONYMOUS: usize = 0x20;
pub const MAP_NORESERVE: usize = 0x4000;

pub fn write(fd: i32, buf: &[u8]) -> Result<usize, i32> {
    // SAFETY: buf is a valid readable slice for the duration of the call.
    check(unsafe { syscall3(SYS_WRITE, fd as usize, buf.as_ptr() as usize, buf.len()) })
}

pub fn read(fd: i32, buf: &mut [u8]) -> Result<usize, i32> {
    // SAFETY: buf is a valid writable slice for the duration of the call.
    check(unsafe { syscall3(SYS_READ, fd as usize, buf.as_mut_ptr() as usize, buf.len()) })
}

/// Opens `path`, which must end with a NUL byte (checked).
pub fn open(path: &[u8], flags: usize, mode: usize) -> Result<i32, i32> {
    if path.last() != Some(&0) {
        return Err(22); // EINVAL
    }
    // SAFETY: path is NUL-terminated (checked above) and outlives the call.
    check(unsafe {
        syscall4(
            SYS_OPENAT,
            AT_FDCWD as usize,
            path.as_ptr() as usize,
            flags,
            mode,
        )
    })
    .map(|fd| fd as i32)
}

pub fn close(fd: i32) -> Result<usize, i32> {
    // SAFETY: closing a descriptor number has no memory-safety effect.
    check(unsafe { syscall1(SYS_CLOSE, fd as usize) })
}

/// `fcntl(fd, F_DUPFD_CLOEXEC, min)`: moves oxgrind's descriptors out of the program's way.
pub fn dup_high(fd: i32, min: i32) -> Result<i32, i32> {
    const F_DUPFD_CLOEXEC: usize = 1030;
    // SAFETY: plain integer arguments.
    check(unsafe { syscall3(SYS_FCNTL, fd as usize, F_DUPFD_CLOEXEC, min as usize) })
        .map(|fd| fd as i32)
}

/// A new file of `len` zero bytes in memory (`memfd_create`, close-on-exec), at descriptor
/// `min` or above (as [`dup_high`]): for shadow memory oxgrind maps shared.
pub fn memfd_high(name: &core::ffi::CStr, len: usize, min: i32) -> Result<i32, i32> {
    const SYS_MEMFD_CREATE: usize = 319;
    const SYS_FTRUNCATE: usize = 77;
    const MFD_CLOEXEC: usize = 1;
    // SAFETY: `name` is NUL-terminated; the call creates a descriptor.
    let fd =
        check(unsafe { syscall2(SYS_MEMFD_CREATE, name.as_ptr() as usize, MFD_CLOEXEC) })? as i32;
    let high = dup_high(fd, min);
    let _ = close(fd);
    let fd = high?;
    // SAFETY: sizing our own fresh descriptor's file (sparse: no page until written).
    if let Err(e) = check(unsafe { syscall2(SYS_FTRUNCATE, fd as usize, len) }) {
        let _ = close(fd);
        return Err(e);
    }
    Ok(fd)
}

pub fn getpid() -> i32 {
    // SAFETY: getpid has no arguments and cannot fail.
    unsafe { syscall0(SYS_GETPID) as i32 }
}

pub fn getppid() -> i32 {
    // SAFETY: getppid has no arguments and cannot fail.
    unsafe { syscall0(SYS_GETPPID) as i32 }
}

pub fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { syscall0(SYS_GETTID) as i32 }
}

pub fn sched_yield() {
    // SAFETY: no arguments.
    unsafe {
        syscall0(SYS_SCHED_YIELD);
    }
}

/// Sends `sig` to thread `tid` of process `pid`.
pub fn tgkill(pid: i32, tid: i32, sig: i32) -> Result<usize, i32> {
    // SAFETY: plain integer arguments.
    check(unsafe { syscall3(SYS_TGKILL, pid as usize, tid as usize, sig as usize) })
}

/// The kernel's `struct sigaction` on x86-64, as `rt_sigaction` takes it (not glibc's,
/// which orders its fields differently).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelSigaction {
    /// The handler's address, or `SIG_DFL` (0) or `SIG_IGN` (1).
    pub handler: u64,
    pub flags: u64,
    pub restorer: u64,
    pub mask: u64,
}

pub const SIG_DFL: u64 = 0;
pub const SA_SIGINFO: u64 = 4;
pub const SA_RESTORER: u64 = 0x0400_0000;
pub const SA_ONSTACK: u64 = 0x0800_0000;
pub const SA_RESTART: u64 = 0x1000_0000;
pub const SA_NODEFER: u64 = 0x4000_0000;

/// `rt_sigaction(sig, act, old)` with an 8-byte signal set: 0, or the kernel's negative
/// errno (a bad signal number, SIGKILL or SIGSTOP).
///
/// # Safety
/// A handler in `act` must be able to run as that signal's handler with `act`'s flags (a
/// `SA_SIGINFO` one takes three arguments), and `act`'s restorer, with `SA_RESTORER`, must
/// be a routine that calls `rt_sigreturn`.
pub unsafe fn rt_sigaction(
    sig: usize,
    act: Option<&KernelSigaction>,
    old: Option<&mut KernelSigaction>,
) -> isize {
    let a = act.map_or(0, |a| a as *const KernelSigaction as usize);
    let o = old.map_or(0, |o| o as *mut KernelSigaction as usize);
    // SAFETY: both structs have the kernel's layout and outlive the call; what the new
    // action does is the caller's contract.
    unsafe { syscall4(SYS_RT_SIGACTION, sig, a, o, 8) as isize }
}

/// Ends the whole process at once, running nothing.
pub fn exit_group(code: i32) -> ! {
    // SAFETY: exit_group does not return.
    unsafe {
        syscall1(SYS_EXIT_GROUP, code as usize);
    }
    #[allow(clippy::empty_loop)]
    loop {}
}

/// Monotonic clock in nanoseconds (raw system call: usable before libc is ready).
pub fn monotonic_ns() -> u64 {
    let mut ts = [0i64; 2];
    // SAFETY: ts is a valid `struct timespec` sized buffer; CLOCK_MONOTONIC = 1.
    unsafe {
        syscall2(SYS_CLOCK_GETTIME, 1, ts.as_mut_ptr() as usize);
    }
    ts[0] as u64 * 1_000_000_000 + ts[1] as u64
}

/// Anonymous private mapping of `len` bytes, or `None`.
pub fn mmap_anon(len: usize) -> Option<*mut u8> {
    // SAFETY: an anonymous mapping with a null hint touches no existing memory.
    let r = unsafe {
        syscall6(
            SYS_MMAP,
            0,
            len,
            PROT_READ | PROT_WRITE,
            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
            usize::MAX,
            0,
        )
    };
    check(r).ok().map(|p| p as *mut u8)
}

/// Address space only: an inaccessible anonymous mapping of `len` bytes, or `None`. It
/// counts against `RLIMIT_AS` but not the kernel's commit charge (for probing the room
/// left without asking for memory).
pub fn mmap_inaccessible(len: usize) -> Option<*mut u8> {
    // SAFETY: an anonymous mapping with a null hint touches no existing memory.
    let r = unsafe {
        syscall6(
            SYS_MMAP,
            0,
            len,
            0, // PROT_NONE
            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
            usize::MAX,
            0,
        )
    };
    check(r).ok().map(|p| p as *mut u8)
}

/// # Safety
/// `[ptr, ptr+len)` must be a mapping oxgrind made and nothing may use it afterwards.
pub unsafe fn munmap(ptr: *mut u8, len: usize) {
    // SAFETY: forwarded to the caller.
    unsafe {
        syscall2(SYS_MUNMAP, ptr as usize, len);
    }
}

/// Gives the physical pages of `[ptr, ptr+len)` back to the kernel and keeps the address
/// range mapped (`madvise(MADV_DONTNEED)`): the next touch of a page reads zeros.
///
/// # Safety
/// `[ptr, ptr+len)` must be page-aligned memory of a private anonymous mapping oxgrind made,
/// whose contents nothing needs any more.
pub unsafe fn discard(ptr: *mut u8, len: usize) {
    const SYS_MADVISE: usize = 28;
    const MADV_DONTNEED: usize = 4;
    // SAFETY: forwarded to the caller; madvise changes no mapping, only drops its pages.
    unsafe {
        syscall3(SYS_MADVISE, ptr as usize, len, MADV_DONTNEED);
    }
}

/// Copies `buf.len()` bytes of this process's memory at `addr` into `buf` without ever
/// faulting: the kernel reads them (`process_vm_readv` on ourselves) and stops at the first
/// unmapped or unreadable page. Returns the bytes copied.
pub fn read_own_memory(addr: u64, buf: &mut [u8]) -> usize {
    const SYS_PROCESS_VM_READV: usize = 310;
    if buf.is_empty() {
        return 0;
    }
    let local = [buf.as_mut_ptr() as usize, buf.len()];
    let remote = [addr as usize, buf.len()];
    // SAFETY: the kernel writes at most `buf.len()` bytes to `buf` and reads the remote
    // range itself, failing with EFAULT (or a short count) instead of faulting.
    let got = unsafe {
        syscall6(
            SYS_PROCESS_VM_READV,
            getpid() as usize,
            local.as_ptr() as usize,
            1,
            remote.as_ptr() as usize,
            1,
            0,
        )
    };
    if got > 0 {
        got as usize
    } else {
        0
    }
}
