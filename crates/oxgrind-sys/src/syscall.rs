//! The `syscall` instruction, wrapped.
//!
//! The kernel clobbers `rcx` (return address) and `r11` (saved flags); every wrapper lists
//! them, as rustix does. Results are returned raw: a value in `-4095..=-1` is `-errno`.
//! Nothing here reads or writes the C library's `errno`, so a hook that makes a system call
//! leaves the program's `errno` exactly as it was.
#![allow(unsafe_code)]

use core::arch::asm;

/// Result of a raw system call: non-negative on success, `-errno` on failure.
pub type SysResult = isize;

/// Turns a raw result into `Ok(value)` or `Err(errno)`.
#[inline]
pub fn check(ret: SysResult) -> Result<usize, i32> {
    if (-4095..0).contains(&ret) {
        Err(-ret as i32)
    } else {
        Ok(ret as usize)
    }
}

/// # Safety
/// The caller must pass arguments that are valid for system call `n`.
#[inline]
pub unsafe fn syscall0(n: usize) -> SysResult {
    let ret: isize;
    // SAFETY: the caller vouches for the arguments; rcx and r11 are declared clobbered.
    unsafe {
        asm!("syscall", inlateout("rax") n as isize => ret,
             lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret
}

/// # Safety
/// The caller must pass arguments that are valid for system call `n`.
#[inline]
pub unsafe fn syscall1(n: usize, a1: usize) -> SysResult {
    let ret: isize;
    // SAFETY: the caller vouches for the arguments; rcx and r11 are declared clobbered.
    unsafe {
        asm!("syscall", inlateout("rax") n as isize => ret, in("rdi") a1,
             lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret
}

/// # Safety
/// The caller must pass arguments that are valid for system call `n`.
#[inline]
pub unsafe fn syscall2(n: usize, a1: usize, a2: usize) -> SysResult {
    let ret: isize;
    // SAFETY: the caller vouches for the arguments; rcx and r11 are declared clobbered.
    unsafe {
        asm!("syscall", inlateout("rax") n as isize => ret, in("rdi") a1, in("rsi") a2,
             lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret
}

/// # Safety
/// The caller must pass arguments that are valid for system call `n`.
#[inline]
pub unsafe fn syscall3(n: usize, a1: usize, a2: usize, a3: usize) -> SysResult {
    let ret: isize;
    // SAFETY: the caller vouches for the arguments; rcx and r11 are declared clobbered.
    unsafe {
        asm!("syscall", inlateout("rax") n as isize => ret, in("rdi") a1, in("rsi") a2,
             in("rdx") a3, lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret
}

/// # Safety
/// The caller must pass arguments that are valid for system call `n`.
#[inline]
pub unsafe fn syscall4(n: usize, a1: usize, a2: usize, a3: usize, a4: usize) -> SysResult {
    let ret: isize;
    // SAFETY: the caller vouches for the arguments; rcx and r11 are declared clobbered.
    unsafe {
        asm!("syscall", inlateout("rax") n as isize => ret, in("rdi") a1, in("rsi") a2,
             in("rdx") a3, in("r10") a4, lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret
}

/// # Safety
/// The caller must pass arguments that are valid for system call `n`.
#[inline]
pub unsafe fn syscall6(
    n: usize,
    a1: usize,
    a2: usize,
    a3: usize,
    a4: usize,
    a5: usize,
    a6: usize,
) -> SysResult {
    let ret: isize;
    // SAFETY: the caller vouches for the arguments; rcx and r11 are declared clobbered.
    unsafe {
        asm!("syscall", inlateout("rax") n as isize => ret, in("rdi") a1, in("rsi") a2,
             in("rdx") a3, in("r10") a4, in("r8") a5, in("r9") a6,
             lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret
}
