//! Read-only mappings of whole files, made even when the program holds every descriptor its
//! limit allows.
//!
//! Mapping a file takes a descriptor for a moment (`open`, `mmap`, `close`), and `open`
//! takes the lowest free number below the soft `RLIMIT_NOFILE`: a program that has used all
//! of them (and goes on running: an error report is written while it runs) left the
//! symboliser without its objects, and every frame of the report was `???`. Valgrind keeps
//! descriptors of its own above the limit it shows the program; a descriptor cannot be made
//! there, though, once the kernel's limit is the program's.
//!
//! So when the `open` fails with `EMFILE`, the mapping is made by a helper: a child that
//! shares our memory but not our descriptor table or limits (`clone(CLONE_VM | CLONE_VFORK)`
//! without `CLONE_FILES` or `CLONE_THREAD`, like `posix_spawn`'s child). It raises its own
//! copy of the soft limit to the hard one (the runtime keeps the kernel's hard limit above
//! the program's, `limits.rs`), or, when there is no room above, closes its copy of the
//! table, opens, maps and closes the file, and exits. The mapping is in the shared address
//! space; this process's descriptor table and limits were never touched, so no thread of the
//! program can see a descriptor or a limit it would not see natively. The child is reaped at
//! once; it has no exit signal, so the program never hears of it, and it runs with every
//! signal blocked.

use crate::raw;
use crate::syscall::{check, syscall1, syscall2, syscall3, syscall4, syscall6};

const SYS_FSTAT: usize = 5;
const SYS_MADVISE: usize = 28;
const SYS_CLONE: usize = 56;
const SYS_WAIT4: usize = 61;
const SYS_PRLIMIT64: usize = 302;
const SYS_CLOSE_RANGE: usize = 436;
const CLONE_VM: usize = 0x100;
const CLONE_VFORK: usize = 0x4000;
const RLIMIT_NOFILE: usize = 7;
const WALL: usize = 0x4000_0000;
const EMFILE: i32 = 24;
const MADV_DONTNEED: usize = 4;
/// `st_size` in the kernel's `struct stat` (x86-64), 144 bytes long.
const ST_SIZE: usize = 48;
const STAT_LEN: usize = 144;
/// The helper's stack: it runs a few system calls and nothing else.
const HELPER_STACK: usize = 64 << 10;

/// A private read-only mapping of a whole file, unmapped when dropped.
pub struct MappedFile {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value; sharing or moving a read-only
// view of memory between threads is sound.
unsafe impl Send for MappedFile {}
// SAFETY: as above.
unsafe impl Sync for MappedFile {}

impl MappedFile {
    /// Maps the file at `path` (NUL-terminated), through the helper when this process has
    /// no descriptor free. The error is the `errno` of what failed.
    pub fn open(path: &[u8]) -> Result<MappedFile, i32> {
        if path.last() != Some(&0) {
            return Err(22); // EINVAL
        }
        match map_here(path) {
            Err(EMFILE) => map_beside(path),
            r => r,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops the pages of `[offset, offset + len)` from memory: a later read faults them in
    /// from the file again (the mapping is private and never written, so nothing is lost).
    pub fn dont_need(&self, offset: usize, len: usize) {
        let Some(end) = offset.checked_add(len).filter(|&e| e <= self.len) else {
            return;
        };
        // madvise wants a page-aligned start: the whole pages inside the range.
        let start = (self.ptr as usize + offset + 4095) & !4095;
        let stop = (self.ptr as usize + end) & !4095;
        if stop > start {
            // SAFETY: the pages lie inside this mapping, which is private and read-only:
            // dropping them changes no byte a reader sees.
            unsafe { syscall3(SYS_MADVISE, start, stop - start, MADV_DONTNEED) };
        }
    }
}

impl core::ops::Deref for MappedFile {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` maps `len` readable bytes for this value's life.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: the mapping is this value's and no borrow of it outlives the value.
            unsafe { raw::munmap(self.ptr as *mut u8, self.len) };
        }
    }
}

impl core::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "MappedFile({:p}, {} bytes)", self.ptr, self.len)
    }
}

/// `open`, `fstat`, `mmap`, `close`, with this process's descriptor table.
fn map_here(path: &[u8]) -> Result<MappedFile, i32> {
    let fd = raw::open(path, raw::O_RDONLY | raw::O_CLOEXEC, 0)?;
    let r = map_fd(fd);
    let _ = raw::close(fd);
    r
}

fn map_fd(fd: i32) -> Result<MappedFile, i32> {
    let mut st = [0u64; STAT_LEN / 8];
    // SAFETY: `st` is a writable buffer of the kernel's `struct stat` size.
    check(unsafe { syscall2(SYS_FSTAT, fd as usize, st.as_mut_ptr() as usize) })?;
    let len = st[ST_SIZE / 8] as usize;
    if len == 0 {
        return Ok(MappedFile {
            ptr: core::ptr::null(),
            len: 0,
        });
    }
    // SAFETY: a new private read-only mapping at an address the kernel picks.
    let p = check(unsafe {
        syscall6(
            raw::SYS_MMAP,
            0,
            len,
            raw::PROT_READ,
            raw::MAP_PRIVATE,
            fd as usize,
            0,
        )
    })?;
    Ok(MappedFile {
        ptr: p as *const u8,
        len,
    })
}

/// What the helper is asked and answers; in our memory, which it shares.
#[repr(C)]
struct Job {
    path: *const u8,
    path_len: usize,
    /// The mapping's address, or `-errno`.
    result: isize,
    len: usize,
}

/// [`map_here`] from a helper process that shares our memory, not our descriptors (see the
/// module's doc).
fn map_beside(path: &[u8]) -> Result<MappedFile, i32> {
    let mut job = Job {
        path: path.as_ptr(),
        path_len: path.len(),
        result: -(EMFILE as isize),
        len: 0,
    };
    let stack = raw::mmap_anon(HELPER_STACK).ok_or(12)?; // ENOMEM
                                                         // The helper starts with our signal mask: all blocked, so that no handler of the
                                                         // program runs in it (this thread's signals wait the few microseconds until the mask
                                                         // is put back).
    let all: u64 = !0;
    let mut old: u64 = 0;
    // SAFETY: 8-byte signal sets, ours for the call.
    unsafe {
        syscall4(
            raw::SYS_RT_SIGPROCMASK,
            2, // SIG_SETMASK
            &all as *const u64 as usize,
            &mut old as *mut u64 as usize,
            8,
        )
    };
    // SAFETY: the helper runs `helper_main` on its own stack (16-byte aligned top of a fresh
    // mapping) with our memory; CLONE_VFORK suspends this thread until it has exited, so
    // `job` and `stack` outlive it.
    let pid = unsafe { spawn_helper(&mut job, stack.add(HELPER_STACK)) };
    // SAFETY: as above.
    unsafe {
        syscall4(
            raw::SYS_RT_SIGPROCMASK,
            2,
            &old as *const u64 as usize,
            0,
            8,
        )
    };
    if pid > 0 {
        let mut status = 0i32;
        // SAFETY: reaps our own helper (no exit signal: __WALL); status is ours.
        unsafe {
            syscall4(
                SYS_WAIT4,
                pid as usize,
                &mut status as *mut i32 as usize,
                WALL,
                0,
            )
        };
    }
    // SAFETY: the helper's stack, no longer used (the helper has exited).
    unsafe { raw::munmap(stack, HELPER_STACK) };
    if pid < 0 {
        return Err(-pid as i32);
    }
    // SAFETY: the helper wrote `job` before exiting; the volatile reads keep the compiler
    // from assuming the values it stored before the clone.
    let (result, len) = unsafe {
        (
            core::ptr::read_volatile(&job.result),
            core::ptr::read_volatile(&job.len),
        )
    };
    if result < 0 {
        return Err(-result as i32);
    }
    Ok(MappedFile {
        ptr: result as *const u8,
        len,
    })
}

/// Starts the helper with `clone(CLONE_VM | CLONE_VFORK)`, no exit signal, on `stack_top`;
/// returns its pid (this thread resumes once it has exited) or `-errno`.
///
/// # Safety
/// `job` must stay valid and `stack_top` be the top of a writable stack until the helper
/// exits (CLONE_VFORK waits for that).
unsafe fn spawn_helper(job: *mut Job, stack_top: *mut u8) -> isize {
    let ret: isize;
    // SAFETY: the caller's contract. The child starts after `syscall` on the new stack with
    // our registers: rax 0, r12 the job; it calls helper_main, which never returns. The
    // parent sees the pid (or -errno) in rax; rcx and r11 are clobbered by `syscall`.
    unsafe {
        core::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "mov rdi, r12",
            "call {main}",
            "ud2",
            "2:",
            main = sym helper_main,
            inlateout("rax") SYS_CLONE as isize => ret,
            in("rdi") CLONE_VM | CLONE_VFORK,
            in("rsi") stack_top,
            in("rdx") 0usize,
            in("r10") 0usize,
            in("r8") 0usize,
            in("r12") job,
            lateout("rcx") _,
            lateout("r11") _,
        );
    }
    ret
}

/// The helper: raises its copy of the soft descriptor limit to the hard one (or, when that
/// does not make room, closes its copy of the descriptor table), maps the file into the
/// memory it shares with us, and exits. System calls only: it shares our thread's TLS and
/// must not touch it, nor allocate, nor unwind.
extern "C" fn helper_main(job: *mut Job) -> ! {
    // SAFETY: the parent passed its live Job and waits (CLONE_VFORK) until we exit.
    let job = unsafe { &mut *job };
    // SAFETY: the path slice the parent borrowed for the call.
    let path = unsafe { core::slice::from_raw_parts(job.path, job.path_len) };
    let mut lim = [0u64; 2];
    // SAFETY: prlimit64 on ourselves with a 16-byte struct rlimit buffer.
    let got = unsafe {
        syscall4(
            SYS_PRLIMIT64,
            0,
            RLIMIT_NOFILE,
            0,
            lim.as_mut_ptr() as usize,
        )
    };
    if got == 0 && lim[0] < lim[1] {
        lim[0] = lim[1];
        // SAFETY: as above, setting: affects only this helper (no CLONE_THREAD).
        unsafe { syscall4(SYS_PRLIMIT64, 0, RLIMIT_NOFILE, lim.as_ptr() as usize, 0) };
    }
    let mut r = map_here(path);
    if r.as_ref().err() == Some(&EMFILE) {
        // Our copy of the table only (no CLONE_FILES): the program's descriptors are
        // untouched.
        // SAFETY: closing descriptors has no memory-safety effect.
        unsafe { syscall3(SYS_CLOSE_RANGE, 0, u32::MAX as usize, 0) };
        r = map_here(path);
    }
    match r {
        Ok(m) => {
            job.result = m.ptr as isize;
            job.len = m.len;
            // The mapping is the parent's to unmap now.
            core::mem::forget(m);
        }
        Err(e) => job.result = -(e as isize),
    }
    loop {
        // SAFETY: ends this helper only (SYS_EXIT, not exit_group: it is its own process
        // anyway, and the parent resumes).
        unsafe { syscall1(raw::SYS_EXIT, 0) };
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn maps_a_file_here_and_through_the_helper_alike() {
        let path = b"/proc/self/exe\0";
        let here = MappedFile::open(path).unwrap();
        let beside = map_beside(path).unwrap();
        assert!(here.len() > 4096);
        assert_eq!(&here[..], &beside[..]);
        assert_eq!(&here[..4], b"\x7fELF");
        assert_eq!(map_beside(b"/nonexistent/file\0").err(), Some(2)); // ENOENT
    }
}
