//! Reads of the process's own `/proc/self` files without taking a descriptor from the program.
//!
//! An `open` takes the lowest free descriptor, and the program's `RLIMIT_NOFILE` is the
//! kernel's (the runtime keeps its own descriptors above it, see the runtime's `limits.rs`):
//! a program that opens files up to its limit loses one `open` to EMFILE whenever one of
//! its threads is inside oxgrind reading `/proc/self/maps` at that instant (Memcheck's stack
//! lookups, the unwinder meeting a new object, a leak search). So the files oxgrind reads
//! while the program runs are opened once, at start-up and again in a forked child (a
//! descriptor of `/proc/self` names the process that opened it), moved up among oxgrind's
//! own descriptors by the caller of [`keep_open`], and read with `pread` from offset 0,
//! which makes the kernel produce the file afresh. Threads share a descriptor safely:
//! `pread` has no file position, and the kernel serialises reads of one `/proc` file.
//! Where no kept descriptor belongs to the calling process (a `vfork` child, a forked child
//! before its fork handler ran, tests), the file is opened for the read, as before.

use core::sync::atomic::{AtomicU64, Ordering};

use crate::raw;
use crate::syscall::{check, syscall4};

/// The `/proc/self` files oxgrind reads while the program runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SelfFile {
    /// `/proc/self/maps`: the mappings.
    Maps,
    /// `/proc/self/stat`: `start_brk`, the main thread's initial stack pointer.
    Stat,
    /// `/proc/self/limits`: the soft limits as text.
    Limits,
    /// `/proc/self/statm`: the resident size (the definedness shadow's sweeps).
    Statm,
}

impl SelfFile {
    const ALL: [SelfFile; 4] = [
        SelfFile::Maps,
        SelfFile::Stat,
        SelfFile::Limits,
        SelfFile::Statm,
    ];

    fn path(self) -> &'static [u8] {
        match self {
            SelfFile::Maps => b"/proc/self/maps\0",
            SelfFile::Stat => b"/proc/self/stat\0",
            SelfFile::Limits => b"/proc/self/limits\0",
            SelfFile::Statm => b"/proc/self/statm\0",
        }
    }
}

/// Per file: the kept descriptor in the low 32 bits and the pid that opened it in the high
/// ones; 0 when none is kept.
static KEPT: [AtomicU64; SelfFile::ALL.len()] = [const { AtomicU64::new(0) }; SelfFile::ALL.len()];

const SYS_PREAD64: usize = 17;

/// Opens each file and keeps it for later reads: `place` moves a fresh descriptor where it
/// belongs (among the caller's own, out of the program's way) and returns the one to keep,
/// or `None` to give the file up (it is then opened for each read). Descriptors kept before
/// (inherited over fork: they name the parent's files) go first, through `release`. Called
/// at start-up and in a forked child, while no other thread of the process runs oxgrind's
/// code.
pub fn keep_open(place: &mut dyn FnMut(i32) -> Option<i32>, release: &mut dyn FnMut(i32)) {
    forget_kept(release);
    let pid = raw::getpid() as u32 as u64;
    for (slot, file) in KEPT.iter().zip(SelfFile::ALL) {
        let Ok(fd) = raw::open(file.path(), raw::O_RDONLY | raw::O_CLOEXEC, 0) else {
            continue;
        };
        if let Some(kept) = place(fd) {
            slot.store(pid << 32 | kept as u32 as u64, Ordering::Release);
        }
    }
}

/// Closes the kept descriptors, handing each to `release` first (the caller's own-descriptor
/// table gives it up).
pub fn forget_kept(release: &mut dyn FnMut(i32)) {
    for slot in &KEPT {
        let old = slot.swap(0, Ordering::AcqRel);
        if old != 0 {
            release(old as u32 as i32);
            let _ = raw::close(old as u32 as i32);
        }
    }
}

/// Hands `f` the file's bytes, chunk after chunk, reading into `buf`; false when the file
/// could not be opened. No allocation: usable from a fault handler.
pub fn for_each_chunk(file: SelfFile, buf: &mut [u8], f: &mut dyn FnMut(&[u8])) -> bool {
    let i = SelfFile::ALL.iter().position(|&x| x == file).unwrap_or(0);
    let kept = KEPT[i].load(Ordering::Acquire);
    let mine = kept != 0 && (kept >> 32) as u32 == raw::getpid() as u32;
    // Opened for this read only: the slot is the program's, lent until the close below.
    let lent = (!mine).then(crate::lent_fd::Lent::take);
    let fd = if mine {
        kept as u32 as i32
    } else {
        match raw::open(file.path(), raw::O_RDONLY | raw::O_CLOEXEC, 0) {
            Ok(fd) => fd,
            Err(_) => return false,
        }
    };
    let mut offset = 0usize;
    loop {
        // SAFETY: `buf` is writable for its length for the duration of the call; pread
        // writes at most that many bytes into it.
        let r = check(unsafe {
            syscall4(
                SYS_PREAD64,
                fd as usize,
                buf.as_mut_ptr() as usize,
                buf.len(),
                offset,
            )
        });
        match r {
            Ok(0) => break,
            Ok(n) => {
                f(&buf[..n]);
                offset += n;
            }
            Err(4) => continue, // EINTR
            Err(_) => break,
        }
    }
    if !mine {
        let _ = raw::close(fd);
    }
    drop(lent);
    true
}

/// The whole file; `None` when it cannot be opened (no `/proc` in a sandbox).
pub fn read(file: SelfFile) -> Option<alloc::vec::Vec<u8>> {
    let mut text = alloc::vec::Vec::with_capacity(16 << 10);
    let mut buf = [0u8; 8192];
    for_each_chunk(file, &mut buf, &mut |chunk| text.extend_from_slice(chunk)).then_some(text)
}

/// The whole file as text (lossy: `/proc/self/maps` paths may hold any bytes).
pub fn read_string(file: SelfFile) -> Option<alloc::string::String> {
    read(file).map(|bytes| match alloc::string::String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => alloc::string::String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn a_kept_descriptor_reads_the_file_afresh_each_time() {
        // Kept high, as the runtime keeps them, out of the way of other tests' descriptors.
        keep_open(
            &mut |fd| {
                let high = raw::dup_high(fd, 700).ok();
                let _ = raw::close(fd);
                high
            },
            &mut |_| {},
        );
        let before = read_string(SelfFile::Maps).unwrap();
        assert!(before.contains("[stack]"), "{before}");
        // A mapping made after the descriptor was opened shows in the next read.
        let v = std::vec![0u8; 64 << 20];
        let after = read_string(SelfFile::Maps).unwrap();
        assert_ne!(before, after);
        drop(v);
        forget_kept(&mut |_| {});
        assert!(read(SelfFile::Limits).unwrap().starts_with(b"Limit"));
    }
}
