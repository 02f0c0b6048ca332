//! What the memory shadow costs in resident pages, and how it is kept near what the
//! program's own memory costs (issue 12's peak RSS target: no more than Memcheck's).
//!
//! One shadow byte per byte makes every page of shadow a page of RSS once written, though
//! most of it holds nothing worth a page: Memcheck shares one "distinguished" secondary map
//! for every all-defined or all-undefined 64 KiB, behind a check on each access. Our
//! inline forms reach a shadow byte as the address plus its span's entry, with no such
//! check, so the sharing is done with the kernel's page tables instead:
//!
//! * **All defined is zero**: a page of zeros can be dropped (`MADV_DONTNEED`) and reads as
//!   zeros again, costing nothing until written. Ranges made defined give their whole pages
//!   back at once ([`release_pages`]), and a sweep ([`note_mark`] → `sweep`) finds the
//!   pages that became all zero byte by byte (blocks the program wrote in full: most of a
//!   heap) and drops them.
//! * **All undefined is `0xff`**: a whole 64 KiB span made undefined (a large `malloc`,
//!   most of which a program may never touch: xz's match finder) gets its chunk mapped
//!   copy-on-write from a small file of `0xff` bytes ([`map_undefined`]): a shadow page
//!   then costs a page only once the program touches its memory (the inline check reads
//!   it) and a private page only once written.
//!
//! The sweep drops pages whose zeros it has just read; a shadow byte written by another
//! thread between that read and the drop would be lost (its V bits would read defined: a
//! missed error). The sweep therefore runs only while the process has never had a second
//! thread ([`note_thread_created`]); the other two are what the filling they replace
//! would have done, race for race.

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

use oxgrind_sys::raw::{
    MAP_ANONYMOUS, MAP_FIXED, MAP_NORESERVE, MAP_PRIVATE, MAP_SHARED, PROT_READ, PROT_WRITE,
    SYS_MMAP,
};
use oxgrind_sys::syscall::{check, syscall2, syscall3, syscall6};

use super::layout::{CHUNK_BYTES, UNDEFINED_FILL};

const PAGE: u64 = 4096;

const SYS_FSTAT: usize = 5;
const SYS_MINCORE: usize = 27;
const PROT_RW: usize = PROT_READ | PROT_WRITE;

/// The pool the chunks come from (`super::enable`), for chunk indices.
static POOL_START: AtomicU64 = AtomicU64::new(0);
/// One bit per chunk of the pool: its span has (or had) pages mapped from the undefined
/// file, so dropping pages must map anonymous memory over them (`MADV_DONTNEED` would give
/// the file's `0xff` back, not zeros). A `MAP_NORESERVE` reservation.
static FILE_BACKED: AtomicU64 = AtomicU64::new(0);

/// The file of `0xff` bytes (a memfd of [`UNDEFINED_FILE`] bytes, kept above 900 where the
/// runtime guards its own descriptors), -1 when there is none; and its inode, checked
/// before each use in case the descriptor was replaced anyway.
static UNDEFINED_FD: AtomicI32 = AtomicI32::new(-1);
static UNDEFINED_INODE: AtomicU64 = AtomicU64::new(0);
/// The file holds 16 chunks' worth, mapped at offset `(chunk index % 16) * CHUNK_BYTES`, so that
/// neighbouring chunks made undefined together form one mapping (the kernel merges them)
/// rather than one each.
const UNDEFINED_FILE: u64 = 16 * CHUNK_BYTES;
/// Chunks mapped from the file so far, and the most we map: each costs the kernel a mapping
/// entry at worst (`vm.max_map_count` is 65530 by default, and the program needs its own);
/// beyond, undefined spans are filled as before.
static UNDEFINED_MAPPED: AtomicU64 = AtomicU64::new(0);
const MAX_UNDEFINED_MAPPED: u64 = 16384;

/// When to sweep: the process's resident memory (`/proc/self/statm`, read every
/// [`CHECK_EVERY`] marks or [`CHECK_BYTES`] bytes made undefined) is an eighth (at least
/// [`MIN_GROWTH`]) above where the last sweep began: a new high, since sweeps only begin
/// at one. Shadow pages come back without any marking too (a store of a defined value
/// into a dropped page faults a page of zeros in), so the marks only pace the checks; the
/// sweeps' cost (reading the resident shadow: bench `sqlite3` makes a few dozen of about
/// 5 ms) stays in proportion to the growth of the peak. Paced from what a sweep left
/// instead, a program that frees and allocates again in a loop (bench `alloc`: freed
/// blocks' shadow is zeros, dropped, then faulted in by the next blocks) swept again and
/// again: system time for page faults and `madvise`, twice its CPU in all.
static MARKS: AtomicU64 = AtomicU64::new(0);
static UNDEFINED_SINCE_CHECK: AtomicU64 = AtomicU64::new(0);
static RSS_AT_LAST_SWEEP: AtomicU64 = AtomicU64::new(0);
const CHECK_EVERY: u64 = 256;
const CHECK_BYTES: u64 = 1 << 20;
const MIN_GROWTH: u64 = 4 << 20;
static SWEEPING: AtomicBool = AtomicBool::new(false);
/// Set for good when the program makes its first thread (see the module comment).
static MULTITHREADED: AtomicBool = AtomicBool::new(false);

/// Sweep statistics, for `OXGRIND_ENGINE_STATS`-like inspection in tests and by hand.
static SWEEPS: AtomicU64 = AtomicU64::new(0);
static SWEPT_PAGES: AtomicU64 = AtomicU64::new(0);

/// Sets up the bookkeeping for the pool `[pool, pool + len)`, and the undefined file when
/// the kernel can make one (without it, undefined spans are filled).
pub(super) fn init(pool: u64, len: u64) {
    let bitmap_bytes = (len / CHUNK_BYTES).div_ceil(8).next_multiple_of(PAGE);
    if let Some(bitmap) = super::reserve(bitmap_bytes, 0) {
        FILE_BACKED.store(bitmap, Ordering::Release);
        POOL_START.store(pool, Ordering::Release);
        make_undefined_file();
    }
}

fn make_undefined_file() {
    let Ok(fd) = oxgrind_sys::raw::memfd_high(c"oxgrind-undefined", UNDEFINED_FILE as usize, 900)
    else {
        return;
    };
    let filled = (|| {
        // SAFETY: a fresh shared mapping of our file, placed by the kernel.
        let p = check(unsafe {
            syscall6(
                SYS_MMAP,
                0,
                UNDEFINED_FILE as usize,
                PROT_RW,
                MAP_SHARED,
                fd as usize,
                0,
            )
        })
        .ok()?;
        // SAFETY: the mapping is UNDEFINED_FILE bytes, ours, writable; unmapped right after.
        unsafe {
            super::fill(p as *mut u8, UNDEFINED_FILL, UNDEFINED_FILE as usize);
            oxgrind_sys::raw::munmap(p as *mut u8, UNDEFINED_FILE as usize);
        }
        inode(fd)
    })();
    match filled {
        Some(ino) => {
            UNDEFINED_INODE.store(ino, Ordering::Release);
            UNDEFINED_FD.store(fd, Ordering::Release);
        }
        None => {
            let _ = oxgrind_sys::raw::close(fd);
        }
    }
}

/// The undefined file's descriptor, for the runtime to guard as its own.
pub fn undefined_file_fd() -> Option<i32> {
    let fd = UNDEFINED_FD.load(Ordering::Acquire);
    (fd >= 0).then_some(fd)
}

fn inode(fd: i32) -> Option<u64> {
    let mut st = [0u64; 18]; // struct stat: 144 bytes; st_ino is its second word
                             // SAFETY: fstat writes one struct stat into our buffer of that size.
    check(unsafe { syscall2(SYS_FSTAT, fd as usize, st.as_mut_ptr() as usize) }).ok()?;
    Some(st[1])
}

fn chunk_index(chunk: u64) -> u64 {
    (chunk - POOL_START.load(Ordering::Relaxed)) / CHUNK_BYTES
}

fn bitmap_word(index: u64) -> &'static AtomicU64 {
    let p = FILE_BACKED.load(Ordering::Relaxed) + index / 64 * 8;
    // SAFETY: `init` reserved a bit per chunk of the pool (index < pool / CHUNK_BYTES); the words
    // are only accessed atomically.
    unsafe { &*(p as *const AtomicU64) }
}

fn file_backed(chunk: u64) -> bool {
    if FILE_BACKED.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let i = chunk_index(chunk);
    bitmap_word(i).load(Ordering::Acquire) & (1 << (i % 64)) != 0
}

/// Makes the whole `chunk` read as undefined (`0xff`) without resident pages, by mapping
/// it from the undefined file; false when that cannot be done (the caller fills it).
pub(super) fn map_undefined(chunk: u64) -> bool {
    let fd = UNDEFINED_FD.load(Ordering::Acquire);
    if fd < 0 || FILE_BACKED.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let i = chunk_index(chunk);
    let was = bitmap_word(i).load(Ordering::Acquire) & (1 << (i % 64)) != 0;
    if !was && UNDEFINED_MAPPED.load(Ordering::Relaxed) >= MAX_UNDEFINED_MAPPED {
        return false;
    }
    if inode(fd) != Some(UNDEFINED_INODE.load(Ordering::Acquire)) {
        // The program replaced our descriptor (dup2 onto it from outside the runtime's
        // guard): stop using it.
        UNDEFINED_FD.store(-1, Ordering::Release);
        return false;
    }
    // Marked first, so that a drop racing with the mapping maps anonymous memory, which
    // is right for either state.
    if !was {
        bitmap_word(i).fetch_or(1 << (i % 64), Ordering::AcqRel);
        UNDEFINED_MAPPED.fetch_add(1, Ordering::Relaxed);
    }
    // SAFETY: the chunk is CHUNK_BYTES bytes of our pool; a fixed private mapping of our file
    // replaces its pages (as filling them with 0xff would) and nothing else. Faults on it
    // from other threads wait for the mapping to be complete (the kernel's mmap lock).
    let r = unsafe {
        syscall6(
            SYS_MMAP,
            chunk as usize,
            CHUNK_BYTES as usize,
            PROT_RW,
            MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE,
            fd as usize,
            ((i % (UNDEFINED_FILE / CHUNK_BYTES)) * CHUNK_BYTES) as usize,
        )
    };
    check(r).ok() == Some(chunk as usize)
}

/// Makes `[p, p + len)` (page-aligned, within one chunk) read as zeros, all defined,
/// without resident pages.
pub(super) fn release_pages(p: u64, len: u64) {
    if file_backed(p) {
        // SAFETY: the range is our pool's; anonymous memory over it reads as zeros.
        let r = unsafe {
            syscall6(
                SYS_MMAP,
                p as usize,
                len as usize,
                PROT_RW,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
                usize::MAX,
                0,
            )
        };
        if check(r).ok() == Some(p as usize) {
            return;
        }
        // SAFETY: as above; the pages stay ours and writable.
        unsafe { super::fill(p as *mut u8, 0, len as usize) };
        return;
    }
    // SAFETY: the range is our private anonymous pool's: dropping its pages only zeroes
    // them, which is the state the caller was about to write.
    unsafe { oxgrind_sys::raw::discard(p as *mut u8, len as usize) };
}

/// The program made its first thread: no more sweeps (see the module comment).
pub(crate) fn note_thread_created() {
    MULTITHREADED.store(true, Ordering::Relaxed);
}

/// A range was just marked, `undefined` bytes of it filled as undefined (their shadow
/// pages are resident now): sweeps when the process has grown enough since the last sweep.
pub(super) fn note_mark(undefined: u64) {
    // Sweeps are for single-threaded processes only, so the counts are too: a plain load
    // and store, not a locked add, which cost every allocation and free a process-wide
    // cache line and the wait for the shadow stores before it (bench `alloc` took twice
    // its time with those).
    if MULTITHREADED.load(Ordering::Relaxed) {
        return;
    }
    let marks = MARKS.load(Ordering::Relaxed);
    MARKS.store(marks + 1, Ordering::Relaxed);
    let since = UNDEFINED_SINCE_CHECK.load(Ordering::Relaxed) + undefined;
    UNDEFINED_SINCE_CHECK.store(since, Ordering::Relaxed);
    if marks % CHECK_EVERY != 0 && since < CHECK_BYTES {
        return;
    }
    UNDEFINED_SINCE_CHECK.store(0, Ordering::Relaxed);
    let Some(rss) = resident_bytes() else { return };
    let last = RSS_AT_LAST_SWEEP.load(Ordering::Relaxed);
    if rss < last + (last / 8).max(MIN_GROWTH) || SWEEPING.swap(true, Ordering::Acquire) {
        return;
    }
    sweep();
    RSS_AT_LAST_SWEEP.store(rss, Ordering::Relaxed);
    SWEEPING.store(false, Ordering::Release);
}

/// The process's resident memory, from `/proc/self/statm` (its second field, in pages).
fn resident_bytes() -> Option<u64> {
    let mut buf = [0u8; 128];
    let mut chunk = [0u8; 128];
    let mut n = 0;
    let read = oxgrind_sys::procself::for_each_chunk(
        oxgrind_sys::procself::SelfFile::Statm,
        &mut chunk,
        &mut |bytes| {
            let k = bytes.len().min(buf.len() - n);
            buf[n..n + k].copy_from_slice(&bytes[..k]);
            n += k;
        },
    );
    if !read {
        return None;
    }
    let text = &buf[..n];
    let field = text.split(|&b| b == b' ').nth(1)?;
    let mut pages = 0u64;
    for &d in field {
        if !d.is_ascii_digit() {
            return None;
        }
        pages = pages * 10 + (d - b'0') as u64;
    }
    Some(pages * PAGE)
}

/// Drops every resident page of the handed-out chunks that holds only zeros; returns the
/// bytes of resident shadow kept. Chunks mapped from the undefined file are left alone
/// (their untouched pages would be read in from the file, as `0xff`, only to be kept).
fn sweep() -> u64 {
    const BATCH: u64 = 16 * CHUNK_BYTES;
    let start = POOL_START.load(Ordering::Relaxed);
    let end = super::POOL_NEXT
        .load(Ordering::Acquire)
        .min(super::POOL_END.load(Ordering::Relaxed));
    if start == 0 {
        return 0;
    }
    let mut kept = 0;
    let mut resident = [0u8; (BATCH / PAGE) as usize];
    let mut at = start;
    while at < end {
        let n = BATCH.min(end - at);
        // SAFETY: mincore reads our own mapping's page state into a buffer of n / PAGE
        // bytes.
        let r = unsafe {
            syscall3(
                SYS_MINCORE,
                at as usize,
                n as usize,
                resident.as_mut_ptr() as usize,
            )
        };
        if check(r).is_err() {
            break;
        }
        // A run of pages to drop: its start, and whether it holds a resident zero page
        // (a run of pages that are not resident has nothing to give back).
        let mut run: Option<(u64, bool)> = None;
        let mut skip = false;
        for (k, &state) in resident[..(n / PAGE) as usize].iter().enumerate() {
            let page = at + k as u64 * PAGE;
            if (page - start) % CHUNK_BYTES == 0 {
                drop_run(run.take(), page);
                skip = file_backed(page);
            }
            if skip {
                continue;
            }
            if state & 1 == 0 {
                run.get_or_insert((page, false));
            // SAFETY: a resident page of our pool, readable.
            } else if unsafe { page_is_zero(page) } {
                run.get_or_insert((page, false)).1 = true;
                SWEPT_PAGES.fetch_add(1, Ordering::Relaxed);
            } else {
                kept += PAGE;
                drop_run(run.take(), page);
            }
        }
        drop_run(run, at + n);
        at += n;
    }
    SWEEPS.fetch_add(1, Ordering::Relaxed);
    kept
}

fn drop_run(run: Option<(u64, bool)>, end: u64) {
    if let Some((start, true)) = run {
        release_pages(start, end - start);
    }
}

/// Whether the page at `p` holds only zeros.
///
/// # Safety
/// `p` must be a readable page.
unsafe fn page_is_zero(p: u64) -> bool {
    // SAFETY: the caller's contract; a page holds PAGE / 8 aligned words.
    let words = unsafe { core::slice::from_raw_parts(p as *const u64, (PAGE / 8) as usize) };
    words
        .chunks_exact(8)
        .all(|w| w.iter().fold(0, |a, &b| a | b) == 0)
}

/// (sweeps made, zero pages they dropped, chunks mapped from the undefined file).
pub fn stats() -> (u64, u64, u64) {
    (
        SWEEPS.load(Ordering::Relaxed),
        SWEPT_PAGES.load(Ordering::Relaxed),
        UNDEFINED_MAPPED.load(Ordering::Relaxed),
    )
}
