//! Which guest pages may change under translated code (self-modifying code and JITs).
//!
//! A translation is a copy: if the program rewrites the bytes it came from, the copy is
//! stale. Two classic answers exist, and this engine uses the second:
//!
//! * **write-protect** the page a block was translated from, and treat the write fault
//!   (invalidate, unprotect, let the write proceed). Cheap when code is never written, but
//!   the engine must own `SIGSEGV` before the program's handlers, lie to the program about
//!   its page protections, re-protect after every write (one fault per write burst on a
//!   page that mixes code and data, e.g. a JIT's constant pools or a trampoline page), and
//!   a system call that writes into a protected page (`read(fd, jit_page, n)`) fails with
//!   `EFAULT` instead of faulting, so the engine would have to emulate those too. Threads
//!   make the unprotect/re-protect window racy.
//! * **check at block entry** (DynamoRIO's "sandboxing", Valgrind's `--smc-check=all-non-file`):
//!   a block translated from a page the program *can* write keeps a copy of its guest bytes
//!   and compares them at every entry; on a mismatch it exits to the dispatcher, which
//!   drops the block and translates the new bytes. No fault handling, no change to what
//!   the program sees, correct with any number of threads (a thread entering a block after
//!   the write sees the new bytes). The price is a few compares per block entry, paid
//!   only by code in writable pages: JIT output in `RWX` memory, code on the stack. Code in
//!   ordinary read-only text pays nothing.
//!
//! So the engine needs to know, at translation time, whether a page is writable (or a
//! shared mapping, which another view may write). This module keeps that knowledge: ranges
//! read from `/proc/self/maps`, kept up to date by the memory system calls the dispatcher
//! sees (`mprotect` is performed by the engine itself, under the code-cache lock, so the
//! knowledge and the protection change together), and re-read when a pc falls outside
//! every known range.
//!
//! A page that turns writable (`mprotect` adding `PROT_WRITE`) has its unchecked
//! translations dropped, so a program that makes its own text writable, patches it and
//! runs it again gets the new code (the retranslation is checked while the page stays
//! writable).
//!
//! Limits: code changed without any write permission visible to this process (another
//! process through `/proc/pid/mem` or `ptrace`, a debugger's breakpoints) is not seen; a
//! block that writes into its own bytes, after its entry check, runs the old bytes to the
//! end of the block; `mmap`/`munmap`/`mremap` are not performed under the lock, so a
//! thread translating code in a range at the very moment another thread remaps it may
//! record the old protection for it.

use alloc::vec::Vec;

/// One known mapping: `[start, end)`, and whether its contents may change (writable or
/// shared).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    start: u64,
    end: u64,
    mutable: bool,
    /// Writable in this view (`mutable` also covers shared mappings).
    writable: bool,
    readable: bool,
    executable: bool,
}

/// What the engine knows about the protections of the address space.
#[derive(Default)]
pub struct Pages {
    /// Sorted, non-overlapping.
    ranges: Vec<Range>,
    /// `/proc/self/maps` reads (statistics).
    pub reloads: u64,
}

const PROT_WRITE: u64 = 2;
const PROT_EXEC: u64 = 4;

impl Pages {
    /// Whether the bytes at `addr` may be changed by the program (without an unmap). An
    /// address outside every mapping reads as "no".
    pub fn mutable(&mut self, addr: u64) -> bool {
        if let Some(m) = self.find(addr) {
            return m;
        }
        self.reload();
        self.find(addr).unwrap_or(false)
    }

    /// Whether the guest's `[addr, addr+len)` can be read (`write`: and written) by the
    /// engine on the guest's behalf, as the kernel would for a system call; a pointer that
    /// fails gets `EFAULT` instead of faulting inside the engine.
    pub fn accessible(&mut self, addr: u64, len: u64, write: bool) -> bool {
        let Some(last) = addr.checked_add(len.max(1) - 1) else {
            return false;
        };
        let ok = |r: &Range| r.readable && (!write || r.writable);
        let mut at = addr;
        loop {
            let r = match self.range_of(at) {
                Some(r) => r,
                None => {
                    self.reload();
                    match self.range_of(at) {
                        Some(r) => r,
                        None => return false,
                    }
                }
            };
            if !ok(&r) {
                return false;
            }
            if r.end > last {
                return true;
            }
            at = r.end;
        }
    }

    /// Whether code at `addr` may run: the page is mapped executable. A "no" is always
    /// confirmed against fresh maps (the cost is paid only by programs that jump to data,
    /// and a stale answer must not stop a program that is right).
    pub fn executable(&mut self, addr: u64) -> bool {
        if self.range_of(addr).is_some_and(|r| r.executable) {
            return true;
        }
        self.reload();
        // Unmapped: not this module's call (the translator jumps there natively anyway).
        self.range_of(addr).is_none_or(|r| r.executable)
    }

    fn range_of(&self, addr: u64) -> Option<Range> {
        let i = self.ranges.partition_point(|r| r.end <= addr);
        self.ranges.get(i).filter(|r| r.start <= addr).copied()
    }

    fn find(&self, addr: u64) -> Option<bool> {
        let i = self.ranges.partition_point(|r| r.end <= addr);
        let r = self.ranges.get(i)?;
        (r.start <= addr).then_some(r.mutable)
    }

    /// Forgets `[start, end)` (it is being unmapped or replaced).
    ///
    /// In place, without allocating in the usual case: this runs in the dispatcher before
    /// `munmap`, which the embedder's own heap calls while holding one of its locks (see
    /// `translate::ALLOC_NOTE`); spare capacity is reserved when the maps are read.
    pub fn punch(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut split = None;
        self.ranges.retain_mut(|r| {
            if r.end <= start || r.start >= end {
                return true;
            }
            if r.start < start && r.end > end {
                split = Some(Range { start: end, ..*r });
                r.end = start;
                return true;
            }
            if r.start < start {
                r.end = start;
                return true;
            }
            if r.end > end {
                r.start = end;
                return true;
            }
            false
        });
        if let Some(tail) = split {
            let i = self.ranges.partition_point(|r| r.start < tail.start);
            self.ranges.insert(i, tail);
        }
    }

    /// Records that `[start, end)` now has protection `prot` (after a successful
    /// `mprotect`). A range that loses write permission is forgotten instead: whether it
    /// is a shared mapping (writable through another view) is read from the maps again.
    pub fn protect(&mut self, start: u64, end: u64, prot: u64) {
        self.punch(start, end);
        let exec = prot & PROT_EXEC != 0;
        if start < end && prot & PROT_WRITE != 0 {
            let i = self.ranges.partition_point(|r| r.start < start);
            self.ranges.insert(
                i,
                Range {
                    start,
                    end,
                    mutable: true,
                    writable: true,
                    readable: true,
                    executable: exec,
                },
            );
        }
    }

    /// Replaces everything known by the current contents of `/proc/self/maps`.
    fn reload(&mut self) {
        self.reloads += 1;
        let Some(text) = read_maps() else {
            return;
        };
        self.ranges = parse_maps(&text);
        // Room for the splits and inserts of later `punch`/`protect` calls.
        self.ranges.reserve(64);
    }
}

/// Parses `/proc/self/maps` lines: `start-end perms offset dev inode path`.
fn parse_maps(text: &[u8]) -> Vec<Range> {
    let mut out = Vec::with_capacity(64);
    for line in text.split(|&b| b == b'\n') {
        let mut fields = line.split(|&b| b == b' ');
        let (Some(span), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some(dash) = span.iter().position(|&b| b == b'-') else {
            continue;
        };
        let (Some(start), Some(end)) = (hex(&span[..dash]), hex(&span[dash + 1..])) else {
            continue;
        };
        if perms.len() < 4 || start >= end {
            continue;
        }
        out.push(Range {
            start,
            end,
            mutable: perms[1] == b'w' || perms[3] == b's',
            writable: perms[1] == b'w',
            readable: perms[0] == b'r',
            executable: perms[2] == b'x',
        });
    }
    out.sort_unstable_by_key(|r| r.start);
    out
}

fn hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v = 0u64;
    for &b in s {
        let d = (b as char).to_digit(16)?;
        v = (v << 4) | d as u64;
    }
    Some(v)
}

/// The whole of `/proc/self/maps` (raw system calls only: this runs inside the engine).
fn read_maps() -> Option<Vec<u8>> {
    oxgrind_sys::procself::read(oxgrind_sys::procself::SelfFile::Maps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_give_writable_and_shared_ranges_as_mutable() {
        let text = b"00400000-00401000 r-xp 00000000 08:01 1 /bin/x\n\
00401000-00402000 rw-p 00000000 00:00 0\n\
7f0000000000-7f0000002000 r-xs 00000000 00:05 7 /memfd:jit (deleted)\n\
7ffc0000-7ffc1000 rwxp 00000000 00:00 0 [stack]\n";
        let mut p = Pages {
            ranges: parse_maps(text),
            reloads: 0,
        };
        assert_eq!(p.find(0x400800), Some(false));
        assert_eq!(p.find(0x401000), Some(true));
        assert_eq!(p.find(0x7f0000001fff), Some(true));
        assert_eq!(p.find(0x7ffc0010), Some(true));
        assert_eq!(p.find(0x500000), None);
        p.punch(0x401800, 0x7ffc0800);
        assert_eq!(p.find(0x401000), Some(true));
        assert_eq!(p.find(0x401800), None);
        assert_eq!(p.find(0x7ffc0800), Some(true));
        p.protect(0x400000, 0x401000, 7);
        assert_eq!(p.find(0x400000), Some(true));
    }

    #[test]
    fn accessible_checks_every_range_a_buffer_spans() {
        let text = b"1000-2000 r--p 0 0:0 0\n2000-3000 rw-p 0 0:0 0\n3000-4000 ---p 0 0:0 0\n";
        let mut p = Pages {
            ranges: parse_maps(text),
            reloads: 0,
        };
        assert!(p.accessible(0x1ff8, 16, false));
        assert!(!p.accessible(0x1ff8, 16, true), "first page read-only");
        assert!(p.accessible(0x2ff0, 16, true));
        assert!(
            !p.accessible(0x2ff8, 16, false),
            "runs into a PROT_NONE page"
        );
        assert!(!p.accessible(u64::MAX - 4, 8, false));
    }

    #[test]
    fn this_process_sees_its_heap_writable_and_its_code_not() {
        let mut p = Pages::default();
        let heap = alloc::vec![0u8; 64];
        assert!(p.mutable(heap.as_ptr() as u64));
        let code = this_process_sees_its_heap_writable_and_its_code_not as *const () as u64;
        assert!(!p.mutable(code));
        assert_eq!(p.reloads, 1);
    }
}
