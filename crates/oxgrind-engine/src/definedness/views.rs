//! The primary table of the memory shadow seen by every thread at one fixed offset from its
//! own `gs` base, so that the inline fast path reads a span's entry with one `gs:`-relative
//! load, `mov rax, gs:[index * 8 + VIEW_OFF]`, where it took `shl rax, 3; add rax,
//! gs:[primary]; mov rax, [rax]` (the span lookup is on every memory operand the fast path
//! handles: each of those three was ~2.6% of the code cache's instructions on sqlite3).
//!
//! Translated code is shared by all threads and `gs` is each thread's context, so each
//! context gets its own mapping of the table: the primary is a shared mapping of a memfd
//! (kept at descriptor 900 or above, which the runtime guards as its own), and a view is a
//! second shared mapping of the same file, placed at `ctx + VIEW_OFF` inside the context's
//! own reservation (`new_ctx`). The Rust side keeps using the primary's own address; both
//! name the same pages. (Not `mremap` with an old size of 0 of a shared anonymous mapping:
//! Valgrind refuses that, and Callgrind, which measures us, would see every lookup slow.)
//!
//! What this costs and what keeps it sound:
//!
//! * **Address space**: 16 GiB per context (contexts are reused, never unmapped): about
//!   7,000 contexts fit in the 128 TiB user address space beside the A-bit map (16 TiB)
//!   and the chunk pool (256 GiB); Valgrind's own default is 500 threads. A context whose
//!   view cannot be made (the address space or the mapping count exhausted) gets a limit
//!   of 0 (`ThreadCtx::vbits_limit`, which the inline code bounds every span index by), so
//!   its thread takes the slow path for every lookup: slower, never wrong.
//! * **fork**: a shared table would stay shared with the child. The parent, holding the
//!   lock every new entry is made under ([`MAKE`]) from before the copy until the fork is
//!   made, copies the table's written pages (recorded on the rare path that makes an entry,
//!   [`note_made`]) into a new memfd; the child maps that file over the primary and every
//!   context's view and puts it at the old descriptor's number, the parent closes it. If
//!   the copy cannot be made, the fork fails with `ENOMEM`.
//! * `vfork` and `clone(CLONE_VM)` share the address space, so the table too, as they
//!   should; exec drops it all (the descriptor is close-on-exec).
//! * The views, like the table, are oxgrind's own memory: the context's whole reservation
//!   is recorded as private (`note_private_mapping`), never a leak root.

use core::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use oxgrind_sys::lock::SpinLock;
use oxgrind_sys::raw;
use oxgrind_sys::syscall::{check, syscall6};

use super::PRIMARY_BYTES;
use crate::context::ThreadCtx;

/// Where a context's view of the primary table starts, from the context: above every part
/// of the context mapping (its tables and the most indexed counters a tool may ask for),
/// and small enough for a 32-bit displacement (the view's end, `VIEW_OFF + 2^34`, is
/// reached through the index register).
pub(crate) const VIEW_OFF: usize = 1 << 24;
const _: () = assert!(
    crate::context::CTX_SIZE + 8 * oxgrind_tool::instrument::MAX_INDEXED_COUNTERS as usize
        <= VIEW_OFF
);
const VIEW_LEN: usize = PRIMARY_BYTES as usize;
/// `vbits_limit` of a context with its view: every entry.
const FULL: u64 = PRIMARY_BYTES / 8;

const SYS_MMAP: usize = 9;
const SYS_DUP3: usize = 292;
const PROT_RW: usize = 0x1 | 0x2;
const MAP_SHARED: usize = 0x01;
const MAP_PRIVATE: usize = 0x02;
const MAP_FIXED: usize = 0x10;
const MAP_ANONYMOUS: usize = 0x20;
const MAP_NORESERVE: usize = 0x4000;
const O_CLOEXEC: usize = 0o2000000;

const PAGE: u64 = 4096;
/// Pages of the primary table: one bit each in [`POPULATED`].
const TABLE_PAGES: u64 = PRIMARY_BYTES / PAGE;

/// Taken around the making of a primary entry (rare: once per span that ever holds an
/// undefined byte) and by a fork from before it copies the table until the fork is made,
/// so that the child's copy holds every entry made before the fork and none after.
pub(super) static MAKE: SpinLock<()> = SpinLock::new(());
/// A bitmap of the primary's pages that hold an entry (one bit per page, a `MAP_NORESERVE`
/// mapping): what a fork copies.
static POPULATED: AtomicU64 = AtomicU64::new(0);
/// The table's file (-1: none).
static FD: AtomicI32 = AtomicI32::new(-1);
/// The child's copy of the table, made by the parent before a fork (-1: none).
static CHILD_FD: AtomicI32 = AtomicI32::new(-1);

/// Reserves the primary table in its file, and the record of its written pages; `None`
/// if either cannot be had.
pub(super) fn reserve_primary(hint: u64) -> Option<u64> {
    let bitmap = raw::mmap_anon((TABLE_PAGES / 8) as usize)? as u64;
    oxgrind_sys::heap::note_private_mapping(bitmap as usize, (TABLE_PAGES / 8) as usize);
    POPULATED.store(bitmap, Ordering::Release);
    let fd = table_file()?;
    let Some(primary) = map(hint, fd, 0) else {
        let _ = raw::close(fd);
        return None;
    };
    oxgrind_sys::heap::note_private_mapping(primary as usize, VIEW_LEN);
    FD.store(fd, Ordering::Release);
    Some(primary)
}

/// The table's descriptor, for the runtime to guard as its own.
pub fn table_fd() -> Option<i32> {
    let fd = FD.load(Ordering::Acquire);
    (fd >= 0).then_some(fd)
}

/// A new file as long as the table, all zeros, at descriptor 900 or above.
fn table_file() -> Option<i32> {
    raw::memfd_high(c"oxgrind-vbits-primary", VIEW_LEN, 900).ok()
}

/// Maps the table file `fd` shared at `at` (`flags`: `MAP_FIXED` there, else a hint).
fn map(at: u64, fd: i32, flags: usize) -> Option<u64> {
    // SAFETY: a shared mapping of our own file; with MAP_FIXED, the callers replace only
    // mappings of their own (the primary, a context's room).
    let r = unsafe {
        syscall6(
            SYS_MMAP,
            at as usize,
            VIEW_LEN,
            PROT_RW,
            MAP_SHARED | MAP_NORESERVE | flags,
            fd as usize,
            0,
        )
    };
    check(r).ok().map(|p| p as u64)
}

/// Records that the entry of span `index` was made (under [`MAKE`]).
pub(super) fn note_made(index: u64) {
    let bitmap = POPULATED.load(Ordering::Acquire);
    let page = index * 8 / PAGE;
    let word = (bitmap + page / 64 * 8) as *const AtomicU64;
    // SAFETY: the bitmap has a bit for every page of the table (index < 2^31) and is never
    // unmapped; its words are only accessed atomically.
    unsafe { (*word).fetch_or(1 << (page % 64), Ordering::Relaxed) };
}

/// The bytes a new context must reserve from its start for a context mapping of `size`
/// bytes, with room for its view when definedness is on.
pub(crate) fn context_bytes(size: usize) -> usize {
    if super::enabled() {
        VIEW_OFF + VIEW_LEN
    } else {
        size
    }
}

/// Makes the view of the primary table in a new context whose reservation has room for
/// it (`has_room`, from [`context_bytes`]), and sets its limit: 0 (every lookup slow)
/// when there is no view.
pub(crate) fn attach(ctx: &mut ThreadCtx, has_room: bool) {
    ctx.vbits_view_room = has_room as u64;
    ctx.vbits_limit = 0;
    if has_room {
        remake(ctx);
    }
}

/// (Re)maps `ctx`'s view of the table's file over its room, and sets its limit.
fn remake(ctx: &mut ThreadCtx) {
    let at = ctx.self_ptr + VIEW_OFF as u64;
    // `[at, at + VIEW_LEN)` is this context's own reservation (`vbits_view_room`), which
    // only its view ever occupies.
    if map(at, FD.load(Ordering::Acquire), MAP_FIXED).is_some() {
        ctx.vbits_limit = FULL;
        return;
    }
    // No view: an old one (a forked child's, of its parent's table) must not stay; a
    // private mapping keeps the room this context's.
    ctx.vbits_limit = 0;
    ctx.vbits_span = [0; 2];
    private_over(at);
}

/// Replaces `[at, at + VIEW_LEN)`, a mapping of ours, with untouched private memory.
fn private_over(at: u64) {
    // SAFETY: the callers' range is theirs; MAP_FIXED replaces only it.
    let _ = unsafe {
        syscall6(
            SYS_MMAP,
            at as usize,
            VIEW_LEN,
            PROT_RW,
            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
            usize::MAX,
            0,
        )
    };
}

/// Before a fork (after `dispatch::hold_for_fork` took the engine's locks): takes [`MAKE`]
/// (or `None`: try again) for the all-or-nothing hold.
pub(crate) fn try_hold_for_fork() -> Option<()> {
    if !super::enabled() {
        return Some(());
    }
    core::mem::forget(MAKE.try_lock()?);
    Some(())
}

/// With [`MAKE`] held: makes the child's copy of the table. False when it cannot be made
/// (the fork must then fail).
pub(crate) fn copy_for_child() -> bool {
    if !super::enabled() {
        return true;
    }
    let Some(fd) = table_file() else {
        return false;
    };
    let Some(copy) = map(0, fd, 0) else {
        let _ = raw::close(fd);
        return false;
    };
    let primary = super::PRIMARY.load(Ordering::Acquire);
    let bitmap = POPULATED.load(Ordering::Acquire) as *const u64;
    for w in 0..TABLE_PAGES / 64 {
        // SAFETY: the bitmap's words, read while [`MAKE`] is held (no writer).
        let mut bits = unsafe { core::ptr::read_volatile(bitmap.add(w as usize)) };
        while bits != 0 {
            let page = w * 64 + bits.trailing_zeros() as u64;
            bits &= bits - 1;
            let (from, to) = (
                (primary + page * PAGE) as *const u64,
                (copy + page * PAGE) as *mut u64,
            );
            for i in 0..(PAGE / 8) as usize {
                // SAFETY: both pages lie within mappings of VIEW_LEN bytes of ours; no
                // entry is being written (MAKE held). Word loads and stores, never a call
                // to `memcpy`.
                unsafe {
                    core::ptr::write_volatile(to.add(i), core::ptr::read_volatile(from.add(i)))
                };
            }
        }
    }
    // SAFETY: our own temporary mapping of the copy; the file keeps its pages.
    unsafe { raw::munmap(copy as *mut u8, VIEW_LEN) };
    CHILD_FD.store(fd, Ordering::Release);
    true
}

/// After a fork (or its failure), in each process, first thing: the child maps its copy of
/// the table over the primary and every context's view, the parent closes the copy; both
/// release [`MAKE`].
pub(crate) fn after_fork(child: bool) {
    if !super::enabled() {
        return;
    }
    let copy = CHILD_FD.swap(-1, Ordering::AcqRel);
    if copy >= 0 {
        if child {
            let fd = FD.load(Ordering::Acquire);
            // The copy takes the table's descriptor number (the one the runtime guards).
            // SAFETY: both descriptors are ours.
            let moved = check(unsafe {
                syscall6(SYS_DUP3, copy as usize, fd as usize, O_CLOEXEC, 0, 0, 0)
            });
            let _ = raw::close(copy);
            let primary = super::PRIMARY.load(Ordering::Acquire);
            if moved.is_err() || map(primary, fd, MAP_FIXED).is_none() {
                // The parent's table must not stay shared: an empty private one (V bits
                // lost, all defined: missed errors, never false ones), and no views.
                private_over(primary);
                crate::context::for_each(|p| {
                    // SAFETY: contexts are never freed; in the child no other thread
                    // exists to use them.
                    let ctx = unsafe { &mut *p };
                    ctx.vbits_limit = 0;
                    ctx.vbits_span = [0; 2];
                    if ctx.vbits_view_room != 0 {
                        private_over(ctx.self_ptr + VIEW_OFF as u64);
                    }
                });
            } else {
                crate::context::for_each(|p| {
                    // SAFETY: as above.
                    let ctx = unsafe { &mut *p };
                    if ctx.vbits_view_room != 0 {
                        remake(ctx);
                    }
                });
            }
        } else {
            let _ = raw::close(copy);
        }
    }
    // SAFETY: taken and forgotten by `try_hold_for_fork` before this fork; each process
    // releases its copy once.
    unsafe { MAKE.force_unlock() };
}
