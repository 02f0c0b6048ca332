//! The leak checker's root set: what the program can still reach without the heap.
//!
//! As Memcheck does, we stop every other thread, then offer as roots: each thread's stack
//! from its stack pointer (less the 128-byte red zone) to the top of its stack mapping (which
//! on glibc also holds the thread's static TLS), each thread's saved general registers, and
//! every other writable mapping of the process except
//! * glibc's heap (the brk heap and any mapping holding live blocks: blocks are scanned as
//!   blocks, only when reached),
//! * oxgrind's own memory (our library's data and our private heap, full of pointers to the
//!   program's blocks).
//!
//! Threads are stopped by a real-time signal whose handler saves the interrupted registers and
//! waits; no ptrace, so it works in containers. A thread that has the signal blocked does not
//! answer within the time limit: its whole stack mapping is scanned instead.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use oxgrind_sys::lock::SpinLock;
use oxgrind_sys::raw;
use oxgrind_sys::raw::KernelSigaction;
use oxgrind_tool::{Addr, RootKind, RootRange};

use crate::state::BLOCKS;

/// One line of /proc/self/maps.
#[derive(Clone, Debug)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub readable: bool,
    pub writable: bool,
    pub executable: bool,
    /// A shared mapping (`s` in the permissions), not a private one (`p`).
    pub shared: bool,
    pub path: String,
}

/// Reads /proc/self/maps with raw system calls (`oxgrind_sys::procself`).
pub fn read_maps() -> Vec<Mapping> {
    let text =
        oxgrind_sys::procself::read(oxgrind_sys::procself::SelfFile::Maps).unwrap_or_default();
    let mut out = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        let line = String::from_utf8_lossy(line);
        let mut it = line.split_whitespace();
        let (Some(range), Some(perms)) = (it.next(), it.next()) else {
            continue;
        };
        let Some((s, e)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) else {
            continue;
        };
        let path = it.nth(3).unwrap_or("").to_string();
        let p = perms.as_bytes();
        out.push(Mapping {
            start,
            end,
            readable: p[0] == b'r',
            writable: p.get(1) == Some(&b'w'),
            executable: p.get(2) == Some(&b'x'),
            shared: p.get(3) == Some(&b's'),
            path,
        });
    }
    out
}

static READABLE: SpinLock<Vec<(u64, u64)>> = SpinLock::new(Vec::new());

fn refresh_readable(maps: &[Mapping]) {
    let mut r = READABLE.lock();
    r.clear();
    r.extend(
        maps.iter()
            .filter(|m| m.readable && m.path != "[vvar]")
            .map(|m| (m.start, m.end)),
    );
}

/// Calls `f(addr, word)` for each aligned word in `[start, start+len)` that lies in readable
/// memory (as of the last map snapshot). Never faults: the words are copied by the kernel
/// (`process_vm_readv` on ourselves), a chunk at a time, and a page that is gone by the time
/// it is read (under the engine our own large allocations can be unmapped while a scan
/// runs) is skipped.
pub fn read_words(start: Addr, len: u64, f: &mut dyn FnMut(Addr, u64)) {
    if READABLE.lock().is_empty() {
        refresh_readable(&read_maps());
    }
    let ranges = READABLE.lock().clone();
    let end = start.saturating_add(len);
    let mut a = (start + 7) & !7;
    while a + 8 <= end {
        // Find the readable mapping containing `a`.
        let idx = ranges.partition_point(|&(_, e)| e <= a);
        match ranges.get(idx) {
            Some(&(s, e)) if s <= a => {
                read_range(a, end.min(e), f);
                a = end.min(e).next_multiple_of(8);
            }
            Some(&(s, _)) => a = (s + 7) & !7,
            None => break,
        }
    }
}

/// The aligned words of `[a, stop)` (`a` aligned), through the kernel.
fn read_range(mut a: Addr, stop: Addr, f: &mut dyn FnMut(Addr, u64)) {
    const PAGE: u64 = 4096;
    const CHUNK_WORDS: usize = 16 * PAGE as usize / 8;
    let mut buf = [0u64; CHUNK_WORDS];
    while a + 8 <= stop {
        let want = (((stop - a) & !7) as usize).min(CHUNK_WORDS * 8);
        // SAFETY: `buf` is CHUNK_WORDS words long and `want` is at most that many bytes;
        // any byte pattern is a valid u64.
        let bytes = unsafe { core::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u8, want) };
        let got = oxgrind_sys::raw::read_own_memory(a, bytes) / 8;
        for (i, &w) in buf[..got].iter().enumerate() {
            f(a + 8 * i as u64, w);
        }
        if got * 8 == want {
            a += want as u64;
        } else {
            // Unreadable at a + got*8: skip to the next page.
            a = ((a + got as u64 * 8) & !(PAGE - 1)) + PAGE;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Stopping the world.

const STOP_SIGNAL: i32 = 62;
const MAX_THREADS: usize = 4096;
const NREGS: usize = 17;

static ARRIVED: AtomicUsize = AtomicUsize::new(0);
static DEPARTED: AtomicUsize = AtomicUsize::new(0);
static RELEASE: AtomicBool = AtomicBool::new(false);
/// Registers saved by stopped threads: (tid, regs), written by their handlers.
static mut SAVED: [(i32, [u64; NREGS]); MAX_THREADS] = [(0, [0; NREGS]); MAX_THREADS];
/// Where each stopped thread's runtime blocks are ([`own_thread_memory`]), beside `SAVED`.
static mut SAVED_OWN: [OwnThreadMemory; MAX_THREADS] = [[(0, 0); 2]; MAX_THREADS];

/// The runtime's per-thread blocks of a thread, as `[start, end)` ranges.
type OwnThreadMemory = [(u64, u64); 2];

/// The calling thread's runtime blocks: static TLS of our library, which lives in the
/// program's memory (the main thread's in the loader's allocation, another thread's at the
/// top of its stack). The cache of recent stack walks holds the frame pointers and stack
/// words the walks read: at -O1 and above `rbp` is an ordinary register, and a block
/// address it held at an allocation kept that block "reachable" for ever (a block
/// Valgrind reports definitely lost, mc_cxx_access.cpp at -O1).
fn own_thread_memory() -> OwnThreadMemory {
    [
        crate::stacks::walk_cache_range(),
        crate::guard::thread_block_range(),
    ]
}

extern "C" fn on_stop(_sig: i32, _info: *mut core::ffi::c_void, ctx: *mut core::ffi::c_void) {
    let i = ARRIVED.fetch_add(1, Ordering::AcqRel);
    if i < MAX_THREADS {
        // ucontext_t: uc_flags, uc_link, uc_stack (24 bytes), then mcontext's 23 gregs.
        // SAFETY: the kernel passes a valid ucontext_t; slot i is this thread's alone.
        unsafe {
            let gregs = (ctx as *const u8).add(40) as *const u64;
            *core::ptr::addr_of_mut!(SAVED_OWN[i]) = own_thread_memory();
            let slot = &mut *core::ptr::addr_of_mut!(SAVED[i]);
            slot.0 = raw::gettid();
            for (r, v) in slot.1.iter_mut().enumerate() {
                *v = *gregs.add(r);
            }
            // Stopped inside the engine (the dispatcher, a clean call, a hook run natively):
            // the program's registers are the ones the engine saved. Its stack pointer on
            // the engine stack would make the program's stack look like no thread's (scanned
            // whole, dead frames included) and the engine stack's register copies roots.
            if let Some(g) = oxgrind_engine::guest_regs_at_engine_sp(slot.1[15]) {
                // ucontext's order: r8-r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip.
                const FROM_GPR: [usize; 16] =
                    [8, 9, 10, 11, 12, 13, 14, 15, 7, 6, 5, 3, 2, 0, 1, 4];
                for (r, &from) in FROM_GPR.iter().enumerate() {
                    slot.1[r] = g.gpr[from];
                }
                slot.1[16] = g.rip;
            }
        }
    }
    while !RELEASE.load(Ordering::Acquire) {
        raw::sched_yield();
    }
    DEPARTED.fetch_add(1, Ordering::AcqRel);
}

extern "C" {
    fn oxgrind_sigreturn();
}

/// Installs the stop handler (`install`, the action it replaces saved in `old`), or puts
/// `old` back.
fn set_stop_handler(install: bool, old: &mut KernelSigaction) {
    use raw::{SA_RESTART, SA_RESTORER, SA_SIGINFO};
    let act = KernelSigaction {
        handler: on_stop as *const () as u64,
        flags: SA_SIGINFO | SA_RESTORER | SA_RESTART,
        restorer: oxgrind_sigreturn as *const () as u64,
        mask: !0,
    };
    // SAFETY: `on_stop` is a three-argument handler made for this signal (SA_SIGINFO), and
    // `oxgrind_sigreturn` calls rt_sigreturn; `old` is the action found at install.
    unsafe {
        if install {
            raw::rt_sigaction(STOP_SIGNAL as usize, Some(&act), Some(&mut *old));
        } else {
            raw::rt_sigaction(STOP_SIGNAL as usize, Some(&*old), None);
        }
    }
}

fn other_threads() -> Vec<i32> {
    let me = raw::gettid();
    let mut tids = Vec::new();
    // The directory's descriptor holds one of the program's slots while it is read.
    let _lent = oxgrind_sys::lent_fd::Lent::take();
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            if let Some(t) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) {
                if t != me {
                    tids.push(t);
                }
            }
        }
    }
    tids
}

/// The stack pointer where the process began to end (our exit handler, `_exit`, a fatal
/// signal): the exiting thread's stack is scanned from here, not from deep inside the
/// report code, whose frames would hide stale pointers only by luck.
static EXIT_SP: AtomicUsize = AtomicUsize::new(0);

pub fn note_exit_sp() {
    note_exit_sp_at(current_sp());
}

/// [`note_exit_sp`] with the stack pointer at the entry of the function that ends the
/// process (our exit handler, `_exit`): the depth at which Valgrind's program makes its
/// `exit_group` system call, so the scan covers the slots Valgrind's covers and not the
/// deeper ones, where our allocator hooks' translated frames left copies of block
/// addresses that Valgrind's program never had.
pub fn note_exit_sp_at(sp: u64) {
    EXIT_SP.store(sp as usize, Ordering::Release);
}

/// Set when [`EXIT_SP`] is the program's own stack pointer at a fatal signal (from the
/// signal's context), which the report may be written far from: on an alternate stack,
/// whose mapping says nothing of the program's stack.
static EXIT_SP_IS_PROGRAMS: AtomicBool = AtomicBool::new(false);

/// [`note_exit_sp_at`] with the program's stack pointer where a fatal signal interrupted
/// it: the exiting thread's stack is scanned from there wherever the handler runs.
pub fn note_exit_sp_of_program(sp: u64) {
    note_exit_sp_at(sp);
    EXIT_SP_IS_PROGRAMS.store(true, Ordering::Release);
}

#[inline(never)]
fn current_sp() -> u64 {
    let sp: u64;
    // SAFETY: reads the stack pointer only.
    unsafe {
        core::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    sp
}

pub fn with_roots(f: &mut dyn FnMut(&[RootRange])) {
    // No other thread may be stopped while holding one of our locks: let events in flight
    // finish first, and keep new ones out until the scan is over.
    crate::exit::close_gate();
    with_roots_gated(f, None);
    crate::exit::open_gate();
}

/// [`with_roots`] with the calling thread's stack scanned from `sp` (the program's stack
/// pointer at a client request).
pub fn with_roots_from(sp: u64, f: &mut dyn FnMut(&[RootRange])) {
    crate::exit::close_gate();
    with_roots_gated(f, Some(sp));
    crate::exit::open_gate();
}

fn with_roots_gated(f: &mut dyn FnMut(&[RootRange]), request_sp: Option<u64>) {
    let tids = other_threads();
    let pid = raw::getpid();
    let mut old = KernelSigaction::default();
    ARRIVED.store(0, Ordering::Release);
    DEPARTED.store(0, Ordering::Release);
    RELEASE.store(false, Ordering::Release);
    let mut signalled = 0;
    if !tids.is_empty() {
        set_stop_handler(true, &mut old);
        for &t in &tids {
            if raw::tgkill(pid, t, STOP_SIGNAL).is_ok() {
                signalled += 1;
            }
        }
        let deadline = raw::monotonic_ns() + 1_000_000_000;
        while ARRIVED.load(Ordering::Acquire) < signalled && raw::monotonic_ns() < deadline {
            raw::sched_yield();
        }
    }
    let arrived = ARRIVED.load(Ordering::Acquire).min(MAX_THREADS);

    let maps = read_maps();
    refresh_readable(&maps);
    // SAFETY: handlers wrote slots 0..arrived before incrementing ARRIVED (AcqRel) and do
    // not touch them again; we copy them out.
    let saved: Vec<(i32, [u64; NREGS])> = (0..arrived)
        .map(|i| unsafe { *core::ptr::addr_of!(SAVED[i]) })
        .collect();

    let mut roots: Vec<RootRange> = Vec::new();
    let find = |addr: u64| maps.iter().find(|m| m.start <= addr && addr < m.end);
    let mut stack_maps: Vec<u64> = Vec::new();
    let mut stack_of = |tid: i32, sp: u64, roots: &mut Vec<RootRange>| {
        if let Some(m) = find(sp) {
            roots.push(RootRange {
                start: sp.saturating_sub(128).max(m.start),
                end: m.end,
                kind: RootKind::Stack { tid },
            });
            stack_maps.push(m.start);
        }
    };
    // Where this thread's program stack is now: in a call run natively from translated
    // code (the report at exit, a client request) we are on the engine's stack, and the
    // program's is where the guest's stack pointer was.
    let here = oxgrind_engine::guest_regs_in_tool_call().map_or_else(current_sp, |regs| regs.rsp());
    let exit_sp = EXIT_SP.load(Ordering::Acquire) as u64;
    let same_stack = find(exit_sp)
        .zip(find(here))
        .is_some_and(|(a, b)| a.start == b.start);
    match request_sp {
        // From the program's stack pointer itself, not its red zone: our allocator
        // wrappers ran just below it, on the program's stack, and left copies of block
        // addresses there that Valgrind's program never had.
        Some(sp) => {
            stack_of(raw::gettid(), sp, &mut roots);
            if let Some(r) = roots.last_mut() {
                r.start = r.start.max(sp);
            }
        }
        // At exit, likewise from the stack pointer where the process began to end: below
        // it, the red zone holds what our hooks' translated frames left there.
        None if exit_sp != 0 && (same_stack || EXIT_SP_IS_PROGRAMS.load(Ordering::Acquire)) => {
            stack_of(raw::gettid(), exit_sp, &mut roots);
            if let Some(r) = roots.last_mut() {
                r.start = r.start.max(exit_sp);
            }
        }
        None => stack_of(raw::gettid(), here, &mut roots),
    }
    for (tid, regs) in &saved {
        stack_of(*tid, regs[15], &mut roots); // REG_RSP
    }
    // At the exit_group the engine saw, this thread's own registers, as Valgrind scans
    // every thread's.
    let exit_regs: Option<[u64; 16]> = request_sp
        .is_none()
        .then(oxgrind_engine::guest_regs_in_tool_call)
        .flatten()
        .map(|r| r.gpr);
    if let Some(regs) = &exit_regs {
        roots.push(RootRange {
            start: regs.as_ptr() as u64,
            end: regs.as_ptr() as u64 + 16 * 8,
            kind: RootKind::Registers { tid: raw::gettid() },
        });
    }
    for (tid, regs) in &saved {
        roots.push(RootRange {
            start: regs.as_ptr() as u64,
            end: regs.as_ptr() as u64 + (NREGS as u64) * 8,
            kind: RootKind::Registers { tid: *tid },
        });
    }

    // Everything writable that is neither a stack we already cut at its SP, nor heap, nor ours.
    let mut ours: Vec<(u64, u64)> = Vec::with_capacity(MAX_REGIONS_HINT);
    oxgrind_sys::heap::for_each_region(|s, l| {
        if ours.len() < ours.capacity() {
            ours.push((s as u64, (s + l) as u64));
        }
    });
    let self_path = crate::stacks::self_path();
    let mut blocks: Vec<(u64, u64)> = BLOCKS
        .live_blocks()
        .iter()
        .map(|b| (b.addr, b.addr + b.size))
        .collect();
    blocks.sort_unstable();
    for m in &maps {
        if !m.writable || !m.readable || stack_maps.contains(&m.start) {
            continue;
        }
        if m.path == "[heap]"
            || m.path.starts_with("[v")
            || (!self_path.is_empty() && m.path == self_path)
        {
            continue; // glibc's main arena (its blocks are scanned when reached), or ours
        }
        let ours_here: Vec<(u64, u64)> = ours
            .iter()
            .filter(|&&(s, e)| s < m.end && m.start < e)
            .copied()
            .collect();
        let mut holes = heap_holes(m.start, m.end, &blocks);
        // Arena heaps are looked for only outside our own regions: those are no roots
        // anyway, and the shadow maps' reservations span terabytes of 64 MiB steps whose
        // every header read would fault a page in.
        for (s, e) in complement(m.start, m.end, ours_here.clone()) {
            holes.extend(arena_heaps(s, e).map(|a| (a, e.min(a + ARENA_HEAP))));
        }
        holes.extend(ours_here);
        for (s, e) in complement(m.start, m.end, holes) {
            roots.push(RootRange {
                start: s,
                end: e,
                kind: RootKind::Global,
            });
        }
    }
    // A thread that never answered has no saved SP, so its stack mapping was not cut above:
    // it was offered whole as a writable mapping, which over-approximates but misses nothing.

    // Our per-thread blocks, wherever they lie: not the program's.
    let mut own: Vec<(u64, u64)> = own_thread_memory().to_vec();
    // SAFETY: as for SAVED above (written before ARRIVED counted the thread).
    own.extend((0..arrived).flat_map(|i| unsafe { *core::ptr::addr_of!(SAVED_OWN[i]) }));
    own.retain(|&(s, e)| s < e);
    let roots: Vec<RootRange> = roots
        .into_iter()
        .flat_map(|r| {
            let holes: Vec<(u64, u64)> = own
                .iter()
                .filter(|&&(s, e)| s < r.end && r.start < e)
                .copied()
                .collect();
            let parts = if holes.is_empty() {
                vec![(r.start, r.end)]
            } else {
                complement(r.start, r.end, holes)
            };
            parts.into_iter().map(move |(start, end)| RootRange {
                start,
                end,
                kind: r.kind,
            })
        })
        .collect();

    f(&roots);

    if !tids.is_empty() {
        RELEASE.store(true, Ordering::Release);
        let deadline = raw::monotonic_ns() + 1_000_000_000;
        while DEPARTED.load(Ordering::Acquire) < arrived && raw::monotonic_ns() < deadline {
            raw::sched_yield();
        }
        set_stop_handler(false, &mut old);
    }
}

const MAX_REGIONS_HINT: usize = 16384;

/// glibc's non-main arenas live in heaps of this size, aligned to it.
const ARENA_HEAP: u64 = 64 << 20;

/// The live blocks in `[start, end)`: not roots (each is scanned only when reached). The
/// kernel merges neighbouring anonymous mappings, so a mapping holding a block may also hold
/// the program's own memory (Python's object arenas): only the blocks are cut, and glibc's
/// thread-arena heaps around them by their headers ([`arena_heaps`]).
fn heap_holes(start: u64, end: u64, blocks: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let first = blocks.partition_point(|&(a, _)| a < start);
    blocks[first..]
        .iter()
        .take_while(|&&(a, _)| a < end)
        .map(|&(a, e)| (a, e.min(end)))
        .collect()
}

/// The glibc thread-arena heaps that start in `[start, end)`, told by their header
/// ([`is_heap_header`]) whether or not a live block lies in them: a thread's arena whose
/// blocks were all freed still holds their stale pointers in its free chunks (a block that
/// only a freed one pointed to would read as reachable, where Valgrind, whose allocator has
/// no such arenas, says definitely lost).
fn arena_heaps(start: u64, end: u64) -> impl Iterator<Item = u64> {
    arena_heaps_read(start, end, |a| {
        let mut w = [0u64; 4];
        read_words(a, 32, &mut |at, v| w[((at - a) / 8) as usize] = v);
        w
    })
}

/// [`arena_heaps`] with the first four words at an address read by `read`.
fn arena_heaps_read(
    start: u64,
    end: u64,
    read: impl Fn(u64) -> [u64; 4],
) -> impl Iterator<Item = u64> {
    let first = start.next_multiple_of(ARENA_HEAP);
    (first..end)
        .step_by(ARENA_HEAP as usize)
        .filter(move |&a| a + 32 <= end && is_heap_header(&read(a)))
}

/// Whether the first words of a 64 MiB-aligned address are glibc's `heap_info` (malloc's
/// `arena.c`): `ar_ptr` to an arena just after the header of its first heap (32 bytes, or
/// 48 since glibc 2.35 added `pagesize`), `prev` 0 or another heap, and `size` within
/// `mprotect_size` within the heap, in whole pages.
fn is_heap_header(w: &[u64; 4]) -> bool {
    let [ar_ptr, prev, size, mprotect_size] = *w;
    matches!(ar_ptr & (ARENA_HEAP - 1), 32 | 48)
        && prev % ARENA_HEAP == 0
        && size != 0
        && size % 4096 == 0
        && size <= mprotect_size
        && mprotect_size <= ARENA_HEAP
}

/// `[start, end)` less the union of `holes`.
fn complement(start: u64, end: u64, mut holes: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    holes.sort_unstable();
    let mut out = Vec::new();
    let mut at = start;
    for (s, e) in holes {
        if s > at {
            out.push((at, s.min(end)));
        }
        at = at.max(e);
        if at >= end {
            break;
        }
    }
    if at < end {
        out.push((at, end));
    }
    out.retain(|(s, e)| s < e);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_keep_memory_merged_with_a_block_but_not_the_block() {
        // A mapping [0x1000, 0x9000) holding a block [0x4000, 0x5000): the rest is roots.
        let holes = heap_holes(0x1000, 0x9000, &[(0x4000, 0x5000)]);
        assert_eq!(
            complement(0x1000, 0x9000, holes),
            vec![(0x1000, 0x4000), (0x5000, 0x9000)]
        );
    }

    #[test]
    fn a_heap_header_is_told_from_other_words() {
        let heap = 3 * ARENA_HEAP;
        // An arena's first heap (glibc 2.35's 48-byte header), then a later heap of it.
        assert!(is_heap_header(&[heap + 48, 0, 0x21000, 0x21000]));
        assert!(is_heap_header(&[heap + 32, heap, 0x4000, 0x8000]));
        // The program's own data: pointers, small numbers, zeros.
        assert!(!is_heap_header(&[0, 0, 0, 0]));
        assert!(!is_heap_header(&[heap + 0x40, 0, 0x21000, 0x21000]));
        assert!(!is_heap_header(&[heap + 48, heap + 8, 0x21000, 0x21000]));
        assert!(!is_heap_header(&[heap + 48, 0, 0x21010, 0x22000]));
        assert!(!is_heap_header(&[heap + 48, 0, 0x22000, 0x21000]));
        assert!(!is_heap_header(&[heap + 48, 0, 0x1000, 2 * ARENA_HEAP]));
    }

    #[test]
    fn a_glibc_thread_arena_is_not_a_root() {
        let arena = 7 * ARENA_HEAP;
        let (start, end) = (arena - 0x2000, arena + 0x21000);
        let header = |a| {
            if a == arena {
                [arena + 48, 0, 0x21000, 0x21000]
            } else {
                [0; 4]
            }
        };
        let mut holes = heap_holes(start, end, &[(arena + 0x900, arena + 0x980)]);
        holes.extend(arena_heaps_read(start, end, header).map(|a| (a, end.min(a + ARENA_HEAP))));
        // Only what precedes the arena (merged from elsewhere) remains.
        assert_eq!(complement(start, end, holes), vec![(start, arena)]);
    }

    #[test]
    fn a_block_past_a_64_mib_boundary_cuts_only_itself_without_an_arena_header() {
        // A large block glibc mapped alone, merged with the program's memory across a
        // 64 MiB boundary: no heap header there, so the program's memory stays a root.
        let boundary = 5 * ARENA_HEAP;
        let (start, end) = (boundary - 0x4000, boundary + 0x80000);
        let block = (boundary + 0x40010, boundary + 0x60000);
        let mut holes = heap_holes(start, end, &[block]);
        holes.extend(arena_heaps_read(start, end, |_| [0; 4]).map(|a| (a, a + ARENA_HEAP)));
        assert_eq!(
            complement(start, end, holes),
            vec![(start, block.0), (block.1, end)]
        );
    }
}
