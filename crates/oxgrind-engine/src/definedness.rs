//! Definedness tracking (Memcheck's V bits) under the engine: the shadow of memory, each
//! thread's shadow registers, and the slow path that runs `oxgrind_vbits`'s interpreter
//! before every instruction of the program's code (`Needs::definedness`).
//!
//! This is the first, correctness-first form of `docs/definedness.md`'s design: every
//! instruction of the program's code gets a clean call (no inline fast path yet), which
//! costs a dispatcher entry and an interpretation per instruction. What the interpreter
//! does not know is done here, as Memcheck's core does it:
//!
//! * **Memory** starts defined. Its V bits live in a two-level table: a primary of one
//!   word per 64 KiB of the 47-bit address space (a shared mapping of a sparse 16 GiB
//!   file, untouched pages cost nothing, which every thread also sees from its `gs` base:
//!   [`views`]), pointing at 64 KiB chunks of shadow (one shadow byte
//!   per byte, bit-exact) handed out from a reserved pool when a byte of the chunk first
//!   becomes undefined. An absent chunk means "all defined", so programs that never make
//!   anything undefined cost no shadow memory.
//! * **New stack** is undefined: when `rsp` went down because of the instruction before,
//!   `[new rsp - 128, old rsp - 128)` is marked undefined (Memcheck's rule with the
//!   System V red zone), and after a `call` or `ret` the red zone below the new `rsp` is
//!   undefined (VEX's "AbiHint" on amd64). A decrease the program's code did not make (a signal frame
//!   written by the kernel) marks the frame defined instead.
//! * **System calls**: before one, its argument registers and the buffers the kernel
//!   reads are checked (a small table, `SYSCALLS`); after it, the buffers the kernel wrote
//!   are marked defined, as are `rax`, `rcx` and `r11`; mapped and unmapped memory is
//!   defined. A system call not in the table is checked for nothing (missed errors, never
//!   false ones); one that writes memory and is not in the table leaves that memory's V
//!   bits as they were (`docs/differences-from-valgrind.md`).
//! * **The runtime's own code** (the allocator hooks: `malloc` itself) runs without
//!   probes. Entering it sets a flag in the thread context (one inline store per block);
//!   the next instruction of the program marks the registers the ABI lets a call clobber
//!   (and its results) defined, as Memcheck does for its replacement allocator's results.
//!
//! Shadow bytes are read and written without atomics: a race between threads on one byte's
//! V bits is a race on the byte itself, as in Memcheck.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use alloc::boxed::Box;
use alloc::vec::Vec;
use iced_x86::{Instruction, Mnemonic, OpKind, Register};
use oxgrind_tool::instrument::GuestRegs;
use oxgrind_tool::Undefined;
use oxgrind_vbits::{Check, Guest, Interpreter, Segment, ShadowMemory, ShadowRegisters, ValueUse};

use crate::context::{self as c, ThreadCtx};
use crate::probe::Client;

mod layout;
mod origins;
mod residency;
pub(crate) mod views;

pub(crate) use layout::MEMORY_BYTES_PER_SHADOW_BYTE;
pub(crate) use origins::RegUse;
pub(crate) use residency::note_thread_created;
pub use residency::{stats as residency_stats, undefined_file_fd};
pub use views::table_fd as primary_table_fd;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether definedness is tracked (set once before the engine starts).
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Reserves the shadow of memory and turns tracking on. False (and tracking stays off) if
/// the reservations fail.
pub fn enable() -> bool {
    if enabled() {
        return true;
    }
    let Some(primary) = views::reserve_primary(PRIMARY_HINT) else {
        return false;
    };
    // Smaller pools when the address space is short (a `ulimit -v`, or under Valgrind's
    // tools, whose address space manager refuses 256 GiB after the tool's own 16 TiB of
    // A bits: bench/hookcost.py measures this way): fewer chunks, then bytes whose V bits
    // stay defined once it is used up.
    let Some((pool, pool_bytes)) = (0..=8)
        .map(|k| POOL_BYTES >> k)
        .find_map(|len| reserve(len, 0).map(|p| (p, len)))
    else {
        return false;
    };
    PRIMARY.store(primary, Ordering::Release);
    POOL_NEXT.store(pool, Ordering::Release);
    POOL_END.store(pool + pool_bytes, Ordering::Release);
    residency::init(pool, pool_bytes);
    ENABLED.store(true, Ordering::Release);
    true
}

/// Turns origin tracking on (`--track-origins=yes`; see [`origins`]), after [`enable`]
/// and before the engine translates anything. False (origins stay off) if its table cannot
/// be reserved.
pub fn enable_origins() -> bool {
    enabled() && origins::enable()
}

/// Marks `[addr, addr + len)` undefined, made so by `origin` (the tool's heap blocks and
/// client requests).
pub fn set_undefined_from(addr: u64, len: u64, origin: oxgrind_tool::Origin) {
    set(addr, len, false);
    origins::set_memory(addr, len, origins::encode(origin));
}

/// Where the undefined bits of the byte at `addr` came from, if known.
pub fn origin_of_memory(addr: u64) -> Option<oxgrind_tool::Origin> {
    if !origins::enabled() {
        return None;
    }
    origins::decode(origins::memory(addr))
}

/// During `Tool::on_undefined`: the origin of the undefined value being reported.
pub fn undefined_origin() -> Option<oxgrind_tool::Origin> {
    if !origins::enabled() {
        return None;
    }
    let ctx = crate::current_context()?;
    // SAFETY: the calling thread's own live context; the field is written by this thread
    // only, before the report that reads it.
    origins::decode(unsafe { (*ctx).vbits_origin })
}

// ---- the shadow of memory ----

use layout::{chunk_from_entry, entry_value, SPAN, SPAN_BITS};
/// User addresses are below 2^47; the kernel's (vsyscall) are taken as defined.
const ADDR_LIMIT: u64 = 1 << 47;
const PRIMARY_BYTES: u64 = (ADDR_LIMIT >> SPAN_BITS) * 8;
/// Right after the tool's A-bit map (placed at 2^44, 2^44 bytes long): low in the address
/// space, so the program's own mappings land where they would natively.
const PRIMARY_HINT: u64 = 1 << 45;
/// Most shadow the chunks can take (256 GiB: the program's undefined-at-some-point
/// memory, at 64 KiB granularity).
const POOL_BYTES: u64 = 1 << 38;

static PRIMARY: AtomicU64 = AtomicU64::new(0);
static POOL_NEXT: AtomicU64 = AtomicU64::new(0);
static POOL_END: AtomicU64 = AtomicU64::new(0);

fn reserve(len: u64, hint: u64) -> Option<u64> {
    const SYS_MMAP: usize = 9;
    const PROT_RW: usize = 0x1 | 0x2;
    const MAP_PRIVATE_ANON_NORESERVE: usize = 0x02 | 0x20 | 0x4000;
    // SAFETY: an anonymous mapping with a hint (no MAP_FIXED) replaces nothing.
    let r = unsafe {
        oxgrind_sys::syscall::syscall6(
            SYS_MMAP,
            hint as usize,
            len as usize,
            PROT_RW,
            MAP_PRIVATE_ANON_NORESERVE,
            usize::MAX,
            0,
        )
    };
    let p = oxgrind_sys::syscall::check(r).ok()? as u64;
    // Shadow holds no pointers into the program's heap.
    oxgrind_sys::heap::note_private_mapping(p as usize, len as usize);
    Some(p)
}

/// The primary entry of `addr` (`None` above the user address space or when disabled).
fn entry(addr: u64) -> Option<&'static AtomicU64> {
    let primary = PRIMARY.load(Ordering::Acquire);
    if primary == 0 || addr >= ADDR_LIMIT {
        return None;
    }
    let p = (primary + (addr >> SPAN_BITS) * 8) as *const AtomicU64;
    // SAFETY: the primary covers every address below ADDR_LIMIT, is never unmapped, and
    // its words are only accessed atomically.
    Some(unsafe { &*p })
}

/// The chunk holding `addr`'s shadow, 0 when there is none (all defined).
fn chunk_of(addr: u64) -> u64 {
    entry(addr).map_or(0, |e| chunk_from_entry(e.load(Ordering::Acquire), addr))
}

/// The chunk holding `addr`'s shadow, made (all defined) if there is none yet; 0 when no
/// shadow can be kept for `addr` (beyond the user address space, or the pool exhausted:
/// its V bits then stay defined).
fn chunk_for_write(addr: u64) -> u64 {
    let Some(e) = entry(addr) else { return 0 };
    let cur = e.load(Ordering::Acquire);
    if cur != 0 {
        return chunk_from_entry(cur, addr);
    }
    let Some(fresh) = layout::new_chunk(&POOL_NEXT, POOL_END.load(Ordering::Acquire)) else {
        return 0;
    };
    let v = entry_value(fresh, addr);
    // Under the lock a fork copies the table under (`views`): an entry is either in the
    // child's copy or made after the fork.
    let _making = views::MAKE.lock();
    match e.compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            views::note_made(addr >> SPAN_BITS);
            chunk_from_entry(v, addr)
        }
        // Another thread made it first; this chunk of the pool stays unused (never
        // touched, so it costs address space only).
        Err(other) => chunk_from_entry(other, addr),
    }
}

/// Calls `f(chunk, offset in chunk, offset in the range, length)` for each piece of
/// `[addr, addr + len)` lying in one chunk's span.
fn pieces(addr: u64, len: u64, mut f: impl FnMut(u64, usize, usize, usize)) {
    let mut done = 0u64;
    while done < len {
        let a = addr.wrapping_add(done);
        let in_chunk = (a & (SPAN - 1)) as usize;
        let n = (SPAN - in_chunk as u64).min(len - done);
        f(a, in_chunk, done as usize, n as usize);
        done += n;
    }
}

/// Most cache lines of V bits [`prefetch_for_write`] starts loading for one range: a
/// large block's are not worth the fill buffers (and its whole pages go back to the kernel).
const PREFETCH_LINES: u64 = 16;

/// Starts loading, for writing, the V bits of `[addr, addr + len)` (at most their first
/// [`PREFETCH_LINES`] lines) where they have a chunk: a hint, which changes nothing
/// visible. For a freed block going back to glibc (Memcheck): the next `malloc` of its
/// chunk marks them undefined, and they were last written at its free, a whole freed-block
/// queue before (a miss to memory per line, on the `malloc`'s path).
///
/// A heap block's range (the caller's, a freed block going back to glibc) lies in one
/// span almost always: that case looks up its chunk once and loops over its lines, without
/// the general walk over spans (about half of the 97 instructions a call took on bench
/// `alloc`, `hookcost.py` at the steady state).
pub fn prefetch_for_write(addr: u64, len: u64) {
    if !enabled() {
        return;
    }
    let mut lines = PREFETCH_LINES;
    let off = addr & (SPAN - 1);
    if len <= SPAN - off && addr < ADDR_LIMIT {
        prefetch_piece(chunk_of(addr), off as usize, len as usize, &mut lines);
        return;
    }
    let len = len.min(ADDR_LIMIT.saturating_sub(addr));
    pieces(addr, len, |a, off, _, n| {
        prefetch_piece(chunk_of(a), off, n, &mut lines)
    });
}

/// Prefetches for writing the shadow lines of `n` bytes at `off` in `chunk` (none if 0), at
/// most `lines` of them, counted down.
#[inline(always)]
fn prefetch_piece(chunk: u64, off: usize, n: usize, lines: &mut u64) {
    if chunk == 0 {
        return;
    }
    let (start, end) = layout::covered(off, n);
    let (mut line, end) = ((chunk + start as u64) & !63, chunk + end as u64);
    while line < end && *lines > 0 {
        oxgrind_tool::hint::prefetch_write_at(line);
        line += 64;
        *lines -= 1;
    }
}

/// Marks `[addr, addr + len)` defined or undefined.
///
/// A heap block's range (every `malloc` and `free` under Memcheck marks one) is short and
/// lies in one span almost always: no whole pages to give back, no whole span to map, so it
/// is the general walk's one piece filled, done here without the walk over spans.
pub fn set(addr: u64, len: u64, defined: bool) {
    if !enabled() {
        return;
    }
    let off = addr & (SPAN - 1);
    // Shorter than RELEASE_MIN: the general path's page release (at least RELEASE_MIN
    // bytes of whole pages) and whole-span mapping cannot apply.
    if len < RELEASE_MIN && len <= SPAN - off && addr < ADDR_LIMIT {
        let chunk = chunk_to_mark(addr, defined);
        let filled_undefined = if chunk == 0 {
            0
        } else {
            fill_piece(chunk, off as usize, len as usize, defined)
        };
        residency::note_mark(filled_undefined);
        return;
    }
    let len = len.min(ADDR_LIMIT.saturating_sub(addr));
    let mut filled_undefined = 0;
    pieces(addr, len, |a, off, _, n| {
        let chunk = chunk_to_mark(a, defined);
        if chunk == 0 {
            return;
        }
        if defined {
            // Whole pages go back to the kernel, which reads them as zeros, all defined,
            // again (`residency`); the chunk stays the span's.
            let (start, end) = layout::covered(off, n);
            let first = (chunk + start as u64).next_multiple_of(PAGE);
            let last = (chunk + end as u64) & !(PAGE - 1);
            if last >= first + RELEASE_MIN {
                let first_off = layout::span_offset((first - chunk) as usize);
                let last_off = layout::span_offset((last - chunk) as usize);
                // SAFETY: the chunk is one of the pool's; both pieces lie in [off, off + n),
                // within the span.
                unsafe {
                    layout::fill(chunk, off, first_off - off, true);
                    layout::fill(chunk, last_off, off + n - last_off, true);
                }
                residency::release_pages(first, last - first);
                return;
            }
        } else if n as u64 == SPAN && residency::map_undefined(chunk) {
            // A whole span undefined (a large block): its chunk reads `0xff` from the
            // undefined file, with no page of its own until the program touches it.
            return;
        }
        filled_undefined += fill_piece(chunk, off, n, defined);
    });
    residency::note_mark(filled_undefined);
}

/// The chunk of `a`'s span that marking it touches: for undefined bytes one is made if the
/// span has none ([`chunk_for_write`]); 0 when there is none to mark (defined bytes of a
/// span without one, which reads as defined, or no shadow for `a`).
#[inline(always)]
fn chunk_to_mark(a: u64, defined: bool) -> u64 {
    if defined {
        chunk_of(a)
    } else {
        chunk_for_write(a)
    }
}

/// Fills `n` bytes at `off` of `chunk` (not 0; `off + n <= SPAN`) defined or undefined;
/// returns the shadow bytes filled undefined, for `residency::note_mark`.
#[inline(always)]
fn fill_piece(chunk: u64, off: usize, n: usize, defined: bool) -> u64 {
    let filled_undefined = if defined {
        0
    } else {
        let (start, end) = layout::covered(off, n);
        (end - start) as u64
    };
    // SAFETY: the chunk is one of the pool's (the callers' `chunk_to_mark`); off + n <= SPAN.
    unsafe { layout::fill(chunk, off, n, defined) };
    filled_undefined
}

const PAGE: u64 = 4096;
/// Ranges made defined give back their whole pages when they hold at least this many
/// bytes of them; smaller ones are filled with zeros (a system call and a page fault on
/// reuse cost more than clearing a page or two).
const RELEASE_MIN: u64 = 4 * PAGE;

/// Writes `len` bytes of `byte` at `p` with one `rep stosb`, never a call to `memset`:
/// `set` also runs in the runtime's translated code (`entering_program_code`, before each
/// call into glibc's allocator), where `memset` is the program's checked replacement, an
/// instrumented word loop (a third of bench `alloc`'s time with definedness on).
/// A short range (a heap block's, mostly under a few hundred bytes) is written a word at a
/// time instead: `rep stosb`'s start-up cost is most of a short one's. Volatile stores, so
/// that the loop is never made into a call to `memset` either.
///
/// # Safety
/// `[p, p + len)` must be writable memory of ours.
#[inline]
unsafe fn fill(p: *mut u8, byte: u8, len: usize) {
    /// Longer ranges go to `rep stosb`, which then writes whole lines at a time.
    const SHORT: usize = 512;
    if len <= SHORT {
        let (mut at, end) = (p as usize, p as usize + len);
        // SAFETY: every store below is inside `[p, p + len)` (the caller's contract); the
        // volatile word stores are at 8-aligned addresses, the volatile 16-byte ones at
        // 16-aligned ones (SSE2 is part of x86-64), the tail's are unaligned stores.
        unsafe {
            while at < end && at & 7 != 0 {
                core::ptr::write_volatile(at as *mut u8, byte);
                at += 1;
            }
            let word = u64::from_ne_bytes([byte; 8]);
            // Sixteen bytes per store once 16-aligned (a heap block's shadow is: blocks
            // are, and so are chunks), two per turn: a block of 150 bytes took 19 word
            // stores and their loop, half of the allocator events' V-bit marking.
            if end - at >= 32 && at & 8 != 0 {
                core::ptr::write_volatile(at as *mut u64, word);
                at += 8;
            }
            let wide = core::arch::x86_64::_mm_set1_epi8(byte as i8);
            while end - at >= 32 {
                core::ptr::write_volatile(at as *mut core::arch::x86_64::__m128i, wide);
                core::ptr::write_volatile((at + 16) as *mut core::arch::x86_64::__m128i, wide);
                at += 32;
            }
            // The rest, under 32 bytes, in at most three stores: whole 16 and 8 bytes from
            // `at`, then the last 8 bytes of the range ending at `end` (of a range under 8
            // bytes: its first and last 4), unaligned and overlapping what is written already
            // (the same byte), never outside `[p, p + len)`. A heap block's size is any
            // number of bytes: a word loop then a byte loop for its last 1-31 bytes were a
            // good part of every fill's instructions.
            let len = end - at;
            let start = p as usize;
            if len >= 16 {
                core::ptr::write_unaligned(at as *mut core::arch::x86_64::__m128i, wide);
                at += 16;
            }
            if end - at >= 8 {
                core::ptr::write_volatile(at as *mut u64, word);
                at += 8;
            }
            if at < end {
                if end - start >= 8 {
                    core::ptr::write_unaligned((end - 8) as *mut u64, word);
                } else if end - start >= 4 {
                    core::ptr::write_unaligned(start as *mut u32, word as u32);
                    core::ptr::write_unaligned((end - 4) as *mut u32, word as u32);
                } else {
                    while at < end {
                        core::ptr::write_volatile(at as *mut u8, byte);
                        at += 1;
                    }
                }
            }
        }
        return;
    }
    // SAFETY: the caller's contract. `rep stosb` writes rcx bytes of al at rdi upwards
    // (the direction flag is clear in Rust code, by the ABI) and changes rdi and rcx only,
    // declared.
    unsafe {
        core::arch::asm!(
            "rep stosb",
            inout("rdi") p => _,
            inout("rcx") len => _,
            in("al") byte,
            options(nostack, preserves_flags)
        );
    }
}

/// The first undefined byte of `[addr, addr + len)`, if any.
pub fn first_undefined(addr: u64, len: u64) -> Option<u64> {
    if !enabled() {
        return None;
    }
    let mut found = None;
    pieces(
        addr,
        len.min(ADDR_LIMIT.saturating_sub(addr)),
        |a, off, _, n| {
            if found.is_some() {
                return;
            }
            let chunk = chunk_of(a);
            if chunk == 0 {
                return;
            }
            // SAFETY: the chunk is one of the pool's; off + n <= SPAN.
            if let Some(i) = unsafe { layout::first_undefined(chunk, off, n) } {
                found = Some(a + i as u64);
            }
        },
    );
    found
}

/// Copies the V bits of `len` bytes from `src` to `dst` (`realloc`), as `memmove` would.
pub fn copy(src: u64, dst: u64, len: u64) {
    if !enabled() || len == 0 || src == dst {
        return;
    }
    let mut buf = [0u8; 256];
    let step = buf.len() as u64;
    let chunks = len.div_ceil(step);
    for k in 0..chunks {
        // Backwards when the destination is above an overlapping source.
        let i = if dst > src { chunks - 1 - k } else { k };
        let off = i * step;
        let n = (len - off).min(step) as usize;
        ShadowMem.load(src + off, &mut buf[..n]);
        ShadowMem.store(dst + off, &buf[..n]);
    }
    origins::copy_memory(src, dst, len);
}

/// Most bytes the short forms below ([`range_defined`], [`make_defined`], [`copy_short`])
/// handle in a few loads or stores; longer ranges, and ranges across a span's end, take the
/// general functions.
const SHORT_RANGE: u64 = 32;

/// The first shadow byte of `[addr, addr + len)` when the range is short (1 to
/// [`SHORT_RANGE`] bytes) and lies in one span: `Some(0)` when that span has no chunk (all
/// defined); `None` when the general path must decide (or tracking is off: `Some(0)`).
/// The primary read directly, inline: the native tries call this twice or three times per
/// replaced call, where `chunk_of`'s calls were most of their cost.
#[inline(always)]
fn short_shadow(addr: u64, len: u64) -> Option<u64> {
    let primary = PRIMARY.load(Ordering::Relaxed);
    if primary == 0 {
        return Some(0);
    }
    let end = addr.wrapping_add(len);
    if len.wrapping_sub(1) >= SHORT_RANGE
        || end > ADDR_LIMIT
        || (addr ^ (end - 1)) >> SPAN_BITS != 0
    {
        return None;
    }
    // SAFETY: the primary covers every address below ADDR_LIMIT and is never unmapped; its
    // words are written atomically (a racing reader sees the old or the new entry).
    let v = unsafe {
        (*((primary + (addr >> SPAN_BITS) * 8) as *const AtomicU64)).load(Ordering::Acquire)
    };
    let chunk = chunk_from_entry(v, addr);
    if chunk == 0 {
        return Some(0);
    }
    let (first, _) = layout::covered((addr & (SPAN - 1)) as usize, len as usize);
    Some(chunk + first as u64)
}

/// Whether every byte of `[addr, addr + len)` is defined (exact: [`first_undefined`] is
/// `None`), a short range within one span in a few loads.
#[inline(always)]
pub fn range_defined(addr: u64, len: u64) -> bool {
    if len == 0 {
        return true;
    }
    match short_shadow(addr, len) {
        Some(0) => true,
        // SAFETY: `short_shadow` found `len` shadow bytes at `p` within one pool chunk.
        Some(p) => unsafe { layout::short_all_defined(p, len as usize) },
        None => first_undefined(addr, len).is_none(),
    }
}

/// Marks `[addr, addr + len)` defined ([`set`]), a short range within one span in a few
/// stores.
#[inline(always)]
pub fn make_defined(addr: u64, len: u64) {
    if len == 0 {
        return;
    }
    match short_shadow(addr, len) {
        Some(0) => {}
        // SAFETY: as in `range_defined`; the chunk is ours to write.
        Some(p) => unsafe { layout::short_fill_defined(p, len as usize) },
        None => set(addr, len, true),
    }
}

/// [`copy`], a short range within one span each side, without origins, in a few loads and
/// stores.
pub fn copy_short(src: u64, dst: u64, len: u64) {
    if !enabled() || len == 0 || src == dst {
        return;
    }
    if !origins::enabled() {
        if let (Some(from), Some(_)) = (short_shadow(src, len), short_shadow(dst, len)) {
            if from == 0 {
                make_defined(dst, len);
                return;
            }
            let to = chunk_for_write(dst);
            if to != 0 {
                let (first, _) = layout::covered((dst & (SPAN - 1)) as usize, len as usize);
                // SAFETY: both are `len` shadow bytes within pool chunks (one span each);
                // `copy` is memmove's, as the bytes' own copy is when the ranges overlap.
                unsafe {
                    core::ptr::copy(
                        from as *const u8,
                        (to + first as u64) as *mut u8,
                        len as usize,
                    )
                };
            }
            return;
        }
    }
    copy(src, dst, len);
}

/// The memory shadow as the interpreter sees it.
struct ShadowMem;

impl ShadowMemory for ShadowMem {
    fn load(&mut self, address: u64, out: &mut [u8]) {
        pieces(address, out.len() as u64, |a, off, at, n| {
            let chunk = if a < ADDR_LIMIT { chunk_of(a) } else { 0 };
            let dst = &mut out[at..at + n];
            if chunk == 0 {
                dst.fill(0);
            } else {
                // SAFETY: the chunk is one of the pool's; off + n <= SPAN.
                unsafe { layout::load(chunk, off, dst) };
            }
        });
    }

    fn store(&mut self, address: u64, shadow: &[u8]) {
        pieces(address, shadow.len() as u64, |a, off, at, n| {
            let src = &shadow[at..at + n];
            let chunk = if layout::all_defined(src) {
                chunk_of(a)
            } else {
                chunk_for_write(a)
            };
            if chunk != 0 {
                // SAFETY: the chunk is one of the pool's; off + n <= SPAN.
                unsafe { layout::store(chunk, off, src) };
            }
        });
    }
}

// ---- per-thread state ----

/// A system call whose results are applied at the next instruction (`next_pc`).
#[derive(Clone, Copy)]
struct Pending {
    nr: u64,
    args: [u64; 6],
    next_pc: u64,
}

/// What a signal handler's return (`rt_sigreturn`) gives back to the point it interrupted,
/// as Valgrind keeps the shadow registers in its signal frame: that point's register shadows
/// and origins (the handler's code changed them; the kernel restores the registers
/// themselves), and the system call whose results were still to be applied there (a call
/// the handler interrupted, or one that returned just before it: the handler's own calls,
/// its `rt_sigreturn` included, take [`ThreadShadow::pending`] meanwhile).
struct Interrupted {
    /// `ThreadCtx::vbits_stepped_pc`: a side exit's step, made at the interrupted point.
    stepped_pc: u64,
    regs: ShadowRegisters,
    vectors_stale: u32,
    reg_origins: [origins::Otag; origins::SLOTS],
    pending: Option<Pending>,
}

/// Handlers nested deeper than this on one thread are rare; past it the oldest interrupted
/// point is forgotten (a handler left by `longjmp` never returns, and its entry must not
/// grow the stack for good). Its return then restores a newer point's state: at worst
/// defined bits where the kernel wrote nothing, a missed error rather than a false one.
const MAX_INTERRUPTED: usize = 8;

/// `rt_sigreturn`'s number.
const RT_SIGRETURN: u64 = 15;

/// Pages this thread found readable, so that the interpreter's reads of guest memory (the
/// values of memory operands) are plain loads instead of a `process_vm_readv` each. Any
/// `munmap`, `mremap`, `mprotect` or fixed `mmap` of the program empties every thread's
/// cache (`MAPS_GENERATION`). The instruction about to run reads the same bytes: a page
/// unmapped by another thread in between would fault there anyway.
#[derive(Default)]
struct PageCache {
    pages: [u64; 16],
    next: usize,
    generation: u64,
}

static MAPS_GENERATION: AtomicU64 = AtomicU64::new(1);

impl PageCache {
    fn readable(&mut self, page: u64) -> bool {
        let g = MAPS_GENERATION.load(Ordering::Acquire);
        if g != self.generation {
            self.pages = [0; 16];
            self.generation = g;
        }
        let tag = page + 1; // 0 = empty slot
        if self.pages.contains(&tag) {
            return true;
        }
        let mut b = [0u8; 1];
        if oxgrind_sys::raw::read_own_memory(page << 12, &mut b) != 1 {
            return false;
        }
        self.pages[self.next % 16] = tag;
        self.next = self.next.wrapping_add(1);
        true
    }
}

struct ThreadShadow {
    pages: PageCache,
    regs: ShadowRegisters,
    interp: Interpreter,
    pending: Option<Pending>,
    /// The points the running signal handlers interrupted, innermost last.
    interrupted: Vec<Interrupted>,
    /// A `rep` instruction being iterated (the engine re-enters it once per iteration):
    /// its pc and the `rcx` of its next iteration. The interpreter did all iterations at
    /// its first entry.
    rep_next: (u64, u64),
    /// Bit `n`: the shadow of vector register `n` is all defined, its bytes not yet
    /// written so. The inline catch-up after the runtime's own code sets every bit
    /// ([`ALL_VECTORS_STALE`]: zeroing 2 KiB there would cost more than the step it saves);
    /// a fast-form load into a register (`FastForm::vec_copy`) zeroes the rest of its
    /// shadow and clears its bit, so that a load of partly undefined memory after a
    /// `malloc` (sqlite3's `Mem` copies) stays inline; the next slow step zeroes the
    /// registers still marked.
    vectors_stale: u32,
    /// Origins (`--track-origins=yes`): each register's tag (see [`origins`]).
    reg_origins: [origins::Otag; origins::SLOTS],
    /// The pc of the instruction last stepped (the origin of the stack it made).
    last_pc: u64,
}

fn thread(ctx: &mut ThreadCtx) -> &'static mut ThreadShadow {
    if ctx.vbits == 0 {
        let t = Box::new(ThreadShadow {
            pages: PageCache::default(),
            regs: ShadowRegisters::default(),
            interp: Interpreter::new(),
            pending: None,
            interrupted: Vec::new(),
            rep_next: (0, 0),
            vectors_stale: 0,
            reg_origins: [0; origins::SLOTS],
            last_pc: 0,
        });
        ctx.vbits = Box::into_raw(t) as u64;
        ctx.vbits_need_step = 1;
    }
    // SAFETY: `vbits` is this thread's own state, made above and never freed (a reused
    // context's is reset by `reuse`); only this thread touches it.
    unsafe { &mut *(ctx.vbits as *mut ThreadShadow) }
}

/// A context is reused for a new thread: its shadow registers start all defined.
pub(crate) fn reuse(ctx: &mut ThreadCtx) {
    if ctx.vbits != 0 {
        let t = thread(ctx);
        t.regs = ShadowRegisters::default();
        t.pending = None;
        t.interrupted.clear();
        t.rep_next = (0, 0);
        t.vectors_stale = 0;
        t.reg_origins = [0; origins::SLOTS];
        t.last_pc = 0;
    }
    ctx.vbits_own_code = 0;
    ctx.vbits_signal = 0;
    ctx.vbits_gpr = [0; 16];
    ctx.vbits_flags = 0;
    ctx.vbits_need_step = 1;
    ctx.vbits_stepped_pc = 0;
    // Offsets into the view written by the thread before (`translate::definedness`).
    ctx.vbits_span = [0; 2];
    set_last_rsp(ctx, 0);
}

/// The stack rule starts afresh at `rsp` (see `ThreadCtx::vbits_last_rsp`): nothing
/// pending from an instruction that moved it.
fn set_last_rsp(ctx: &mut ThreadCtx, rsp: u64) {
    ctx.vbits_last_rsp = rsp;
    ctx.vbits_last_writes_rsp = 0;
    ctx.vbits_last_call_or_ret = 0;
}

/// The general registers' and the flags' shadows live in the thread context (for the
/// inline fast path: `ThreadCtx::vbits_gpr`); the interpreter works on the thread's
/// [`ShadowRegisters`]: copied in at the start of a slow step, out at its end.
fn regs_in(ctx: &ThreadCtx, t: &mut ThreadShadow) {
    t.regs.gpr = ctx.vbits_gpr;
    t.regs.flags = oxgrind_vbits::FlagShadows(ctx.vbits_flags as u8);
}

/// See [`regs_in`].
fn regs_out(ctx: &mut ThreadCtx, t: &ThreadShadow) {
    ctx.vbits_gpr = t.regs.gpr;
    ctx.vbits_flags = t.regs.flags.0 as u64;
}

/// A signal handler is about to run on this thread (from the signal entry).
pub(crate) fn signal_delivered(ctx: &mut ThreadCtx) {
    ctx.vbits_signal = 1;
}

// ---- the slow path ----

/// What a step call site passes: the instruction, decoded once at translation (its
/// record is `probe::DefinednessRec`'s).
pub(crate) struct StepRec<'a> {
    pub ins: &'a Instruction,
    pub writes_rsp: bool,
    pub call_or_ret: bool,
    /// The registers it reads and writes, for origins (`None` when they are off).
    pub regs: Option<&'a origins::RegUse>,
}

/// Whether step records made now carry the registers their instruction uses: while
/// origins are tracked.
pub(crate) fn records_reg_use() -> bool {
    origins::enabled()
}

/// The registers `ins` reads and writes, for its [`StepRec`].
pub(crate) fn reg_use(ins: &Instruction) -> origins::RegUse {
    origins::reg_use(ins)
}

/// Whether `ins` is a `call` or a `ret` (see `ThreadCtx::vbits_last_call_or_ret`).
pub(crate) fn is_call_or_ret(ins: &Instruction) -> bool {
    use iced_x86::FlowControl as F;
    matches!(ins.flow_control(), F::Call | F::IndirectCall | F::Return)
        && !matches!(
            ins.mnemonic(),
            Mnemonic::Iret | Mnemonic::Iretd | Mnemonic::Iretq | Mnemonic::Syscall
        )
}

/// Whether `ins` writes `rsp` (pushes, calls, `sub rsp`, `and rsp`, `mov rsp`, `enter`...).
pub(crate) fn writes_rsp(ins: &Instruction) -> bool {
    if ins.stack_pointer_increment() != 0 {
        return true;
    }
    if matches!(
        ins.mnemonic(),
        Mnemonic::Cmp | Mnemonic::Test | Mnemonic::Push
    ) {
        return false;
    }
    ins.op_count() > 0
        && ins.op0_kind() == OpKind::Register
        && matches!(
            ins.op0_register(),
            Register::RSP | Register::ESP | Register::SP
        )
}

/// The guest's values as the dispatcher saved them.
struct SavedGuest<'a> {
    ctx: &'a ThreadCtx,
    fs: u64,
    pages: core::cell::RefCell<&'a mut PageCache>,
}

impl Guest for SavedGuest<'_> {
    fn gpr(&self, index: usize) -> u64 {
        self.ctx.gregs.get(index).copied().unwrap_or(0)
    }
    fn rflags(&self) -> u64 {
        self.ctx.gflags
    }
    fn vector(&self, index: usize) -> [u8; 64] {
        let mut v = [0u8; 64];
        crate::probe::vector_reg_bytes(self.ctx, index, 0, &mut v);
        v
    }
    fn opmask(&self, index: usize) -> u64 {
        crate::probe::opmask(self.ctx, index).unwrap_or(0)
    }
    fn segment_base(&self, segment: Segment) -> u64 {
        match segment {
            Segment::Fs => self.fs,
            Segment::Gs => self.ctx.guest_gs,
        }
    }
    fn read_memory(&self, address: u64, out: &mut [u8]) -> bool {
        if out.is_empty() {
            return true;
        }
        let Some(last) = address.checked_add(out.len() as u64 - 1) else {
            return false;
        };
        let mut pages = self.pages.borrow_mut();
        if !(address >> 12..=last >> 12).all(|p| pages.readable(p)) {
            return false;
        }
        // SAFETY: every page of the range was found readable (see `PageCache`).
        unsafe {
            core::ptr::copy_nonoverlapping(address as *const u8, out.as_mut_ptr(), out.len())
        };
        true
    }
}

fn is_rep_string(ins: &Instruction) -> bool {
    ins.is_string_instruction() && (ins.has_rep_prefix() || ins.has_repne_prefix())
}

/// Whether a `rep` string instruction ends on a condition as well as on `rcx` (`cmps`,
/// `scas`).
fn may_stop_early(ins: &Instruction) -> bool {
    use Mnemonic as M;
    matches!(
        ins.mnemonic(),
        M::Cmpsb | M::Cmpsw | M::Cmpsd | M::Cmpsq | M::Scasb | M::Scasw | M::Scasd | M::Scasq
    )
}

/// The slow path before guest instruction `rec.ins` at `pc` (a clean call).
pub(crate) fn step(ctx: &mut ThreadCtx, rec: &StepRec, pc: u64, cl: Client) {
    let t = thread(ctx);
    regs_in(ctx, t);
    step_with(ctx, t, rec, pc, cl);
}

/// Whether the instruction after `rec`'s must take the slow path (`vbits_need_step`).
fn need_step_after(rec: &StepRec) -> u8 {
    let ins = rec.ins;
    (rec.writes_rsp || rec.call_or_ret || is_rep_string(ins) && may_stop_early(ins)) as u8
}

/// [`step`] with the thread's state, its registers' shadows copied in ([`regs_in`]);
/// copies them out before any report.
fn step_with(ctx: &mut ThreadCtx, t: &mut ThreadShadow, rec: &StepRec, pc: u64, cl: Client) {
    let stale = core::mem::take(&mut t.vectors_stale);
    if stale != 0 {
        for (n, v) in t.regs.vector.iter_mut().enumerate() {
            if stale & (1 << n) != 0 {
                *v = [0; 64];
            }
        }
    }
    catch_up(ctx, t, pc);
    let ins = rec.ins;
    let rsp = ctx.gregs[c::RSP];
    new_stack(ctx, t, rsp);
    if ctx.vbits_last_call_or_ret != 0 {
        // VEX's AbiHint after a call or a return: the red zone is garbage now, made so by
        // entering the code here (Memcheck's `nia`).
        set(rsp.wrapping_sub(RED_ZONE), RED_ZONE, false);
        origins::set_memory(rsp.wrapping_sub(RED_ZONE), RED_ZONE, origins::stack(pc));
    }
    ctx.vbits_last_rsp = rsp;
    t.last_pc = pc;
    ctx.vbits_last_writes_rsp = rec.writes_rsp as u8;
    ctx.vbits_last_call_or_ret = rec.call_or_ret as u8;
    // After a `rep` that may stop early (`repe`/`repne` `cmps`/`scas`), `rep_next` may keep
    // a count a later run of it could meet: the next step resets it. Another `rep` always
    // runs down to `rcx` 0, where the engine makes no step (`translate::special`), so the
    // instruction after it need not be slow.
    ctx.vbits_need_step = need_step_after(rec);
    // A block left through a slow call's side exit after this very step
    // (`translate::definedness::Proofs`): the block it went to, which starts at the same
    // instruction, makes the step again. Only what comes before the instruction is done
    // again (nothing, unless a signal handler ran in between: its return's catch-up);
    // the instruction was stepped. Any other step drops the mark (a signal handler's
    // keeps it for the handler's return: `catch_up`).
    if ctx.vbits_stepped_pc != 0 && core::mem::take(&mut ctx.vbits_stepped_pc) == pc {
        regs_out(ctx, t);
        return;
    }
    if is_rep_string(ins) {
        let rcx = ctx.gregs[1];
        let again = t.rep_next == (pc, rcx);
        t.rep_next = (pc, rcx.wrapping_sub(1));
        if again {
            regs_out(ctx, t);
            return;
        }
    } else {
        t.rep_next = (0, 0);
    }
    let fs = if ins.segment_prefix() == Register::FS || ins.memory_segment() == Register::FS {
        crate::probe::fs_base(ctx)
    } else {
        0
    };
    let guest = SavedGuest {
        ctx,
        fs,
        pages: core::cell::RefCell::new(&mut t.pages),
    };
    let (outcome, regs_origin, origin) = if let Some(reg_use) = rec.regs {
        let regs_origin = origins::registers_read(reg_use, &t.regs, &t.reg_origins);
        let mut mem = origins::TaggedMemory {
            inner: &mut ShadowMem,
            origin: regs_origin,
        };
        let outcome = t.interp.step(ins, &guest, &mut t.regs, &mut mem);
        origins::registers_written(reg_use, &t.regs, &mut t.reg_origins, mem.origin);
        (outcome, regs_origin, mem.origin)
    } else {
        let outcome = t.interp.step(ins, &guest, &mut t.regs, &mut ShadowMem);
        (outcome, 0, 0)
    };
    regs_out(ctx, t);
    // A check's value is a register's (a condition's flags, an address's base and index)
    // when one read is undefined; else a loaded one's.
    ctx.vbits_origin = if regs_origin != 0 {
        regs_origin
    } else {
        origin
    };
    for check in outcome.checks.iter() {
        let what = match check {
            Check::Condition => Undefined::Condition,
            Check::Value {
                size,
                reason: ValueUse::Address | ValueUse::JumpTarget | ValueUse::ShiftAmount,
            } => Undefined::Value { size },
        };
        report(ctx, cl, pc, &what);
    }
}

fn report(ctx: &ThreadCtx, cl: Client, pc: u64, what: &Undefined) {
    let regs = GuestRegs {
        gpr: ctx.gregs,
        rip: pc,
        rflags: ctx.gflags,
    };
    let _lent = crate::probe::ToolRegsLent::new(ctx, &regs);
    cl.embedder
        .call(true, &mut || cl.tool.on_undefined(cl.host, &regs, what));
}

/// What happened on this thread since its last stepped instruction where no probe runs:
/// the runtime's own code, a signal delivery, a system call's results.
///
/// The fast path does the runtime's part inline when the runtime left nothing below the
/// program's last `rsp` (a return into the program) or only the return address of its
/// call into the program's code: see `translate::definedness`.
fn catch_up(ctx: &mut ThreadCtx, t: &mut ThreadShadow, pc: u64) {
    if ctx.vbits_own_code | ctx.vbits_signal != 0 {
        if core::mem::take(&mut ctx.vbits_own_code) != 0 {
            // The runtime's code ran since the last step: a call into it returned, or it
            // calls the program's code (ld.so's `__tls_get_addr`, a replaced string
            // function). Every register may hold its values, which are defined, and so
            // are its frames on the stack, between the program's last `rsp` and this one.
            // Except, when it returned (nothing of it left below the program's last
            // `rsp`), the callee-saved registers: the ABI has them hold the program's
            // values again, whose V bits are still the last step's (Valgrind's allocator
            // replacements keep them too). Should the runtime have called the program's
            // code meanwhile, that code's steps started from all defined and left them so.
            let rsp = ctx.gregs[c::RSP];
            let last_rsp = ctx.vbits_last_rsp;
            if returned_into_program(last_rsp, rsp) {
                for r in CALLER_SAVED {
                    t.regs.gpr[r] = 0;
                }
            } else {
                t.regs.gpr = [0; 16];
            }
            t.regs.flags = oxgrind_vbits::FlagShadows::DEFINED;
            for v in t.regs.vector.iter_mut() {
                *v = [0; 64];
            }
            if last_rsp > rsp && last_rsp - rsp < (2 << 20) {
                set(rsp, last_rsp - rsp, true);
            }
            set_last_rsp(ctx, rsp);
        }
        if core::mem::take(&mut ctx.vbits_signal) != 0 {
            // A handler starts: its arguments and the frame the kernel wrote are defined
            // (the frame: siginfo, ucontext and the saved vector state, within a page or
            // two above the new rsp; capped at the interrupted red zone).
            if t.interrupted.len() == MAX_INTERRUPTED {
                t.interrupted.remove(0);
            }
            t.interrupted.push(Interrupted {
                stepped_pc: core::mem::take(&mut ctx.vbits_stepped_pc),
                regs: t.regs.clone(),
                vectors_stale: t.vectors_stale,
                reg_origins: t.reg_origins,
                pending: t.pending.take(),
            });
            let rsp = ctx.gregs[c::RSP];
            // The interrupted stack pointer, from the frame's ucontext (the kernel's `rdx`,
            // our entry installs every handler with SA_SIGINFO): not the last step's, which
            // is a previous handler's when this signal was pending at its `rt_sigreturn`
            // (the new frame then lies where that one was, and nothing was marked: dash's
            // second SIGCHLD returned through an undefined return address).
            let mut interrupted = [0u8; 8];
            let at = ctx.gregs[2]
                .wrapping_add((crate::signals::UC_GREGS + 8 * crate::signals::REG_RSP) as u64);
            let interrupted_rsp = if oxgrind_sys::raw::read_own_memory(at, &mut interrupted) == 8 {
                u64::from_le_bytes(interrupted)
            } else {
                ctx.vbits_last_rsp
            };
            for r in [0usize, 2, 6, 7] {
                t.regs.gpr[r] = 0;
            }
            let mut end = rsp + 8192;
            if interrupted_rsp > rsp {
                end = end.min(interrupted_rsp - 128);
            }
            set(rsp, end.saturating_sub(rsp), true);
            set_last_rsp(ctx, rsp);
        }
    }
    if let Some(p) = t.pending {
        if p.next_pc == pc {
            t.pending = None;
            after_syscall(t, &p, ctx.gregs[c::RAX]);
        }
    }
}

/// The general registers (encoding order) a call may change under the System V ABI, and
/// `rsp`, whose shadow is always defined: all but rbx, rbp and r12-r15.
pub(crate) const CALLER_SAVED: [usize; 10] = [0, 1, 2, 4, 6, 7, 8, 9, 10, 11];

/// Whether the runtime's code, run since the program's last step at `last_rsp`, returned
/// into the program at `rsp` (it left nothing below the program's stack pointer) rather
/// than called the program's code: the inline catch-up (`translate::definedness`) decides
/// the same way. (A thread with no step yet, `last_rsp` 0, has all its shadows defined.)
fn returned_into_program(last_rsp: u64, rsp: u64) -> bool {
    last_rsp <= rsp
}

/// Register numbers (encoding order, the shadow file's) of the integer arguments in the
/// System V order: rdi, rsi, rdx, rcx, r8, r9.
const ARGS: [usize; 6] = [7, 6, 2, 1, 8, 9];

/// The first of the first `count` integer arguments (System V: rdi, rsi, rdx, rcx, r8, r9)
/// of the call the program just made into the runtime (an allocator hook, entered
/// natively: no step ran since the program's `call`) that holds undefined bits, by its
/// index. Memcheck's allocator replacements branch on their arguments
/// (`TRIGGER_MEMCHECK_ERROR_IF_UNDEFINED`), and so report an undefined size as a
/// conditional jump inside `malloc` ([`argument_origin`]: where its undefined bits came
/// from). The shadow file is the one of the program's last step (the `call`, or the PLT's
/// `jmp`): the runtime's code on the way (its entry block, the C++ shim's `operator new`)
/// is not stepped and passes the arguments on unchanged; the hooks' own nested calls are
/// not checked (the runtime refuses events inside events). None when tracking is off or a
/// signal handler was entered since the last step. One look at the context for all the
/// arguments: every allocator call asks (one register test per argument after it; one
/// call per argument was about 100 instructions per malloc/free pair of Memcheck's).
#[inline]
pub fn first_undefined_argument(count: usize) -> Option<usize> {
    if !enabled() {
        return None;
    }
    let ctx = crate::current_context()?;
    // SAFETY: the calling thread's own live context, which only this thread touches; the
    // hook runs between two guest instructions.
    let ctx = unsafe { &*ctx };
    if ctx.vbits == 0 || ctx.vbits_signal != 0 {
        return None;
    }
    ARGS[..count.min(ARGS.len())]
        .iter()
        .position(|&reg| ctx.vbits_gpr[reg] != 0)
}

/// Whether origins are tracked (`--track-origins=yes`).
pub fn origins_tracked() -> bool {
    origins::enabled()
}

/// With origins: where the undefined bits of integer argument `index` of the call the
/// program just made into the runtime came from (see [`first_undefined_argument`]).
pub fn argument_origin(index: usize) -> Option<oxgrind_tool::Origin> {
    if !origins::enabled() {
        return None;
    }
    let reg = *ARGS.get(index)?;
    let ctx = crate::current_context()?;
    // SAFETY: as in `first_undefined_argument`.
    let ctx = unsafe { &mut *ctx };
    if ctx.vbits == 0 {
        return None;
    }
    origins::decode(origins::gpr(&thread(ctx).reg_origins, reg))
}

/// The runtime is about to call the program's code from its own (glibc's allocator, on the
/// program's behalf): its frames between the program's last `rsp` and here become defined
/// now (the called code may read them: arguments, results it writes through pointers
/// there), and so does the stack below, down to [`RUNTIME_CALL_DEPTH`], where the
/// runtime's calls on the way push their frames and return addresses; the stack rule
/// starts afresh from there. So the called code's first step finds no runtime frames to
/// mark, and the inline fast path does the rest of its catch-up instead of a slow step per
/// call, and its `ret` finds its return address defined.
pub fn entering_program_code() {
    if !enabled() {
        return;
    }
    let Some(ctx) = crate::current_context() else {
        return;
    };
    // SAFETY: the calling thread's own live context, which only this thread touches; its
    // code here runs between two guest instructions.
    let ctx = unsafe { &mut *ctx };
    if ctx.vbits == 0 {
        return;
    }
    let rsp: u64;
    // SAFETY: reads the stack pointer only.
    unsafe {
        core::arch::asm!("mov {}, rsp", out(reg) rsp, options(nomem, nostack, preserves_flags))
    };
    // Also the stack the runtime's calls on the way to the program's code will use (the
    // freed-block queue's release, a closure): its frames, written without probes, and the
    // return address the program's code returns with, read by its `ret`. Code entered
    // deeper than that takes the slow catch-up, which marks the rest.
    let low = rsp.saturating_sub(RUNTIME_CALL_DEPTH);
    let last_rsp = ctx.vbits_last_rsp;
    let top = if last_rsp > rsp && last_rsp - rsp < (2 << 20) {
        last_rsp
    } else {
        rsp
    };
    set(low, top - low, true);
    // The registers hold the runtime's values, all defined, callee-saved ones included
    // (the catch-up would keep those, taking the program's code entered above `low` for
    // a return into it).
    ctx.vbits_gpr = [0; 16];
    set_last_rsp(ctx, low);
}

/// How far below `entering_program_code`'s own frame the runtime's frames may reach when
/// it calls the program's code (glibc's `free` from the freed-block queue's release, a few
/// frames down); deeper is correct, only slower (a slow catch-up).
const RUNTIME_CALL_DEPTH: u64 = 1024;

/// Memcheck's new-stack rule: a decrease of `rsp` by the previous instruction makes
/// `[new - 128, old - 128)` undefined.
/// The System V red zone below `rsp`.
const RED_ZONE: u64 = 128;

fn new_stack(ctx: &ThreadCtx, t: &ThreadShadow, rsp: u64) {
    /// A larger move is a switch to another stack (Valgrind's heuristic is 2 MB).
    const SWITCH: u64 = 2 << 20;
    let old = ctx.vbits_last_rsp;
    if old == 0 || rsp >= old || ctx.vbits_last_writes_rsp == 0 || old - rsp > SWITCH {
        return;
    }
    set(rsp.wrapping_sub(RED_ZONE), old - rsp, false);
    origins::set_memory(
        rsp.wrapping_sub(RED_ZONE),
        old - rsp,
        origins::stack(t.last_pc),
    );
}

// ---- system calls ----

/// The system calls whose scalar arguments are checked ("Syscall param NAME contains
/// uninitialised byte(s)", Valgrind's `PRE_REG_READ`), with Valgrind's parameter names in
/// argument order. The memory their pointer arguments name is checked by the tool, from the
/// table all checkers share, `oxgrind_tool::syscalls`.
const SYSCALLS: &[(u64, &[&str])] = &[
    (0, &["read(fd)", "read(buf)", "read(count)"]),
    (1, &["write(fd)", "write(buf)", "write(count)"]),
    (3, &["close(fd)"]),
    (
        17,
        &[
            "pread64(fd)",
            "pread64(buf)",
            "pread64(count)",
            "pread64(offset)",
        ],
    ),
    (
        18,
        &[
            "pwrite64(fd)",
            "pwrite64(buf)",
            "pwrite64(count)",
            "pwrite64(offset)",
        ],
    ),
    (60, &["exit(status)"]),
    (231, &["exit_group(status)"]),
];

/// Reads the program's memory without faulting (`oxgrind_tool::syscalls`'s `read`).
fn read_guest(addr: u64, out: &mut [u8]) -> usize {
    oxgrind_sys::raw::read_own_memory(addr, out)
}

/// Before a `syscall` instruction of the program's code at `pc` (from the dispatcher):
/// checks its arguments, and notes it so that its results are applied at the next
/// instruction.
pub(crate) fn before_syscall(ctx: &mut ThreadCtx, pc: u64) {
    let Some(cl) = crate::probe::client() else {
        return;
    };
    // munmap, mremap, mprotect, pkey_mprotect, a fixed mmap (anyone's, ours too): pages
    // found readable may not be any more.
    let nr = ctx.gregs[c::RAX];
    if matches!(nr, 10 | 11 | 25 | 329) || (nr == 9 && ctx.gregs[10] & 0x10 != 0) {
        MAPS_GENERATION.fetch_add(1, Ordering::AcqRel);
    }
    if cl.embedder.is_own_code(pc) {
        return;
    }
    let t = thread(ctx);
    regs_in(ctx, t);
    catch_up(ctx, t, pc);
    let interrupted = if nr == RT_SIGRETURN {
        t.interrupted.pop()
    } else {
        None
    };
    if let Some(i) = &interrupted {
        ctx.vbits_stepped_pc = i.stepped_pc;
        t.regs = i.regs.clone();
        t.vectors_stale = i.vectors_stale;
        t.reg_origins = i.reg_origins;
    }
    regs_out(ctx, t);
    let g = ctx.gregs;
    let args = c::syscall_args(&g);
    // Valgrind's order: the scalar arguments, then the memory the kernel reads.
    if let Some((_, params)) = SYSCALLS.iter().find(|(n, _)| *n == nr) {
        for (i, name) in params.iter().enumerate() {
            if t.regs.gpr[c::SYSCALL_ARGS[i]] != 0 {
                ctx.vbits_origin = origins::gpr(&t.reg_origins, c::SYSCALL_ARGS[i]);
                report(ctx, cl, pc, &Undefined::SyscallArg { param: name });
            }
        }
    }
    // The memory the kernel reads is the tool's to check (`Tool::before_syscall`, asking
    // `Host::first_undefined`): Memcheck weighs its first undefined byte against its first
    // unaddressable one, and reports one error for the range, as Valgrind does.
    t.pending = match interrupted {
        // The handler returns: the interrupted point's call, if any, is the one whose
        // results are due (at its next instruction, or anew if it restarts).
        Some(i) => i.pending,
        None => Some(Pending {
            nr,
            args,
            next_pc: pc + 2,
        }),
    };
    ctx.vbits_need_step = 1;
    set_last_rsp(ctx, g[c::RSP]);
}

/// A system call's results, at the instruction after it: what the kernel wrote is
/// defined.
fn after_syscall(t: &mut ThreadShadow, p: &Pending, result: u64) {
    for r in [0usize, 1, 11] {
        t.regs.gpr[r] = 0;
    }
    let a = p.args;
    // (buffer, length) pairs the kernel wrote.
    let wrote = |addr: u64, len: u64| {
        if addr != 0 && len > 0 {
            set(addr, len.min(1 << 36), true);
        }
    };
    if !oxgrind_tool::syscalls::failed(result) {
        match p.nr {
            // mmap, mremap: the new mapping; munmap: forgotten (no buffer the kernel
            // fills: the shared table has no place for them).
            9 => wrote(result, a[1]),
            25 => wrote(result, a[2]),
            11 => wrote(a[0], a[1]),
            _ => {}
        }
    }
    // What the shared table says the kernel wrote (Valgrind's POST_MEM_WRITEs; a failed
    // call writes nothing, except an interrupted sleep's remainder).
    oxgrind_tool::syscalls::for_each_written(p.nr, &a, result, &mut read_guest, &mut |r| {
        wrote(r.addr, r.len)
    });
}

// ---- the inline fast path ----

/// Whether translated code may use the inline fast path (`translate::definedness`); off
/// only to test that it changes nothing ([`set_fast_path`]).
static FAST_PATH: AtomicBool = AtomicBool::new(true);

/// Turns the inline fast path on or off (before the engine starts): off, every instruction
/// takes the slow path, which is the reference the fast path must equal.
pub fn set_fast_path(on: bool) {
    FAST_PATH.store(on, Ordering::Relaxed);
}

/// Offsets in [`ThreadShadow`] (through `ctx.vbits`) the inline code reads and writes.
/// (The general registers' and the flags' shadows, whether a slow step is due and the
/// stack rule's last `rsp` are in the thread context: `context::OFF_VBITS_GPR`,
/// `OFF_VBITS_FLAGS`, `OFF_VBITS_NEED_STEP`, `OFF_VBITS_LAST_RSP`.)
pub(crate) const OFF_VECTORS_STALE: usize = core::mem::offset_of!(ThreadShadow, vectors_stale);
/// [`ThreadShadow::vectors_stale`] after the runtime's own code ran: every vector register.
pub(crate) const ALL_VECTORS_STALE: u32 = u32::MAX;
pub(crate) const OFF_REP_PC: usize = core::mem::offset_of!(ThreadShadow, rep_next.0);
pub(crate) const OFF_REP_RCX: usize = core::mem::offset_of!(ThreadShadow, rep_next.1);

/// Whether `ins` is a `rep` string instruction (`translate::definedness`'s inline re-entry).
pub(crate) fn is_rep(ins: &Instruction) -> bool {
    FAST_PATH.load(Ordering::Relaxed) && is_rep_string(ins)
}
pub(crate) const OFF_SHADOW_VECTOR: usize =
    core::mem::offset_of!(ThreadShadow, regs) + core::mem::offset_of!(ShadowRegisters, vector);
pub(crate) const OFF_SHADOW_X87: usize =
    core::mem::offset_of!(ThreadShadow, regs) + core::mem::offset_of!(ShadowRegisters, x87);
pub(crate) const OFF_SHADOW_X87_STATUS: usize =
    core::mem::offset_of!(ThreadShadow, regs) + core::mem::offset_of!(ShadowRegisters, x87_status);
const _: () = assert!(core::mem::size_of::<oxgrind_vbits::FlagShadows>() == 1);

/// A general register the fast path zeroes the shadow of: encoding number and which bytes
/// the instruction writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Written {
    /// 32- and 64-bit writes (a 32-bit write zero-extends: its shadow too).
    Qword(u8),
    Word(u8),
    Byte(u8),
    /// `ah`, `ch`, `dh`, `bh`: byte 1.
    HighByte(u8),
}

/// What the inline fast path of one instruction checks and writes (see
/// `translate::definedness`): when the shadows of every register it reads are zero, the
/// flags' shadow is zero (if it reads or writes flags), and the memory it touches has no
/// shadow chunk (all defined), the interpreter would find every input defined, report
/// nothing and make every output defined; the inline code then zeroes the shadows of the
/// registers written. Anything else (an undefined input, a chunk, the bookkeeping of the
/// stack rule and of `catch_up` pending) takes the slow path, so the two agree bit for bit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FastForm {
    /// Bit `n`: the shadow of general register `n` must be zero, in the bytes of
    /// [`FastForm::read_bytes`]`[n]`.
    pub reads: u16,
    /// For each general register read, bit `i`: shadow byte `i` must be zero (what the
    /// instruction reads of it: `and eax, 0xfff` reads 4 bytes, `mov al, ah` byte 1; an
    /// address's base and index all 8).
    pub read_bytes: [u8; 16],
    pub writes: [Option<Written>; 4],
    /// The flags' shadow must be zero (unless [`FastForm::flags_overwritten`]).
    pub flags: bool,
    /// The instruction reads no flag and the interpreter's rule sets all six flags' V bits
    /// from its operands alone (`add`, `sub`, `cmp`, `neg`, `and`, `or`, `xor`, `test`,
    /// `fcomi`):
    /// their shadow is not checked but written zero, as every operand is checked defined.
    pub flags_overwritten: bool,
    pub mem: [Option<iced_x86::UsedMemory>; 2],
    /// For `push`, `pop`, `sub rsp, imm`, `add rsp, imm`, `call` and `ret`: how far `rsp`
    /// moves. The inline code then does the stack rule's work at once instead of at the
    /// next step (which then need not be slow): the thread's last `rsp` becomes
    /// `rsp + delta`, and the bytes of [`FastForm::undefined`] become undefined.
    pub rsp_delta: i32,
    /// Stack bytes the instruction leaves undefined, `(offset from rsp before it, length)`
    /// (their span must have a chunk, else slow): a decrease of `d` bytes makes `[rsp - d -
    /// 128, rsp - 128)` undefined (the new stack below the red zone); a `call` or `ret`
    /// makes the whole red zone below the new `rsp` undefined (VEX's "AbiHint": what the
    /// caller or callee left there is garbage to the other).
    pub undefined: Option<(i32, i32)>,
    /// For `mov rsp, r64`, `lea rsp, [r64 + d]` and `leave` (`rbp + 8`): `rsp` becomes
    /// general register `n` plus `d`, a move known at run time only `(n, d)`. Function
    /// epilogues that set `rsp` from `rbp` (frame-pointer code, V8's generated code, -O0
    /// builds): the stack rule marks nothing when `rsp` goes up, so the inline code goes
    /// slow only when the new `rsp` is below the current one, and else makes it the
    /// thread's last `rsp`, as [`FastForm::rsp_delta`] does (the instruction after it is
    /// then no slow step either).
    pub rsp_from: Option<(u8, i32)>,
    /// With origins on: the tag the bytes of [`FastForm::undefined`] take.
    pub origin: Option<StackOrigin>,
    /// Vector registers read: the first `len` bytes of the shadow of `zmm<n>` must be zero
    /// (unless the vector shadows are stale, i.e. all defined: `OFF_VECTORS_STALE`).
    pub vec_reads: [Option<VecBytes>; 4],
    /// Vector registers written: the first `len` bytes of their shadow become zero (a
    /// legacy SSE write keeps the bytes above the xmm register, a VEX or EVEX one zeroes
    /// them, so its shadow too).
    pub vec_writes: [Option<VecBytes>; 2],
    /// A load into a general register (`mov r64/r32, m`, `movzx`, `movsx`, `movsxd`)
    /// whose loaded shadow is copied, not required to be zero: the memory operand's
    /// shadow bytes become the register's, extended as the value is (origins off only:
    /// with them on, an undefined load needs its tag, which the slow path gives).
    pub load: Option<LoadCopy>,
    /// A store of a general register (`mov m, r`) whose shadow is copied, not required to
    /// be zero: the register's shadow bytes become the memory operand's when its span has
    /// a chunk (origins off only, as for [`FastForm::load`]).
    pub store: Option<StoreCopy>,
    /// A whole-register vector move between memory and an `xmm` or `ymm` register
    /// (`movdqu`, `movups`, `vmovdqa`...) whose shadow is copied, not required to be zero
    /// (origins off only, as for [`FastForm::load`]): a partly initialised struct copied
    /// through a vector register (sqlite3's `Mem` copies) is no slow step. The register's
    /// shadow is then neither in [`FastForm::vec_reads`] nor in [`FastForm::vec_writes`]:
    /// `translate::definedness` writes it.
    pub vec_copy: Option<VecCopy>,
    /// An x87 instruction ([`fast_x87_mnemonic`]): the shadows of the whole register stack
    /// must be zero and the condition bits defined (the interpreter keeps the stack's
    /// shadows in stack order; with all of them zero, the rotation a push or pop makes
    /// changes nothing).
    pub x87: bool,
}

/// How [`FastForm::vec_copy`] moves shadow between memory and a vector register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct VecCopy {
    /// The register's number (`xmm<n>`/`ymm<n>`).
    pub n: u8,
    /// The bytes moved (16 or 32).
    pub size: u8,
    /// A load (memory to register), else a store.
    pub load: bool,
    /// The register bytes a load writes: `size`, or 64 when the encoding (VEX, EVEX) zeroes
    /// the bytes above.
    pub written: u8,
}

/// How [`FastForm::store`] moves a register's shadow into memory's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StoreCopy {
    /// The source's encoding number.
    pub n: u8,
    /// The bytes stored (1, 2, 4 or 8).
    pub size: u8,
}

/// How [`FastForm::load`] moves the loaded shadow into the register's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LoadCopy {
    /// The destination's encoding number.
    pub n: u8,
    /// The bytes loaded (1, 2, 4 or 8).
    pub size: u8,
    /// Sign-extended (`movsx`, `movsxd`) to the destination's width, else zero-extended.
    pub signed: bool,
    /// The destination's width in bytes (4 or 8).
    pub width: u8,
}

/// The first `len` bytes (a multiple of 8) of vector register `zmm<n>`'s shadow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct VecBytes {
    pub n: u8,
    pub len: u8,
}

/// The origin tag of the stack a fast form makes undefined (see `origins`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StackOrigin {
    /// A constant: the instruction's own pc (`push`, `sub rsp`) or a direct call's target.
    Tag(u64),
    /// `ret`: the return address it pops (the code entered).
    ReturnAddress,
}

/// The origins' tag table, for the inline stack tagging (0 when origins are off).
pub(crate) fn origins_primary() -> u64 {
    origins::primary()
}

/// Largest decrease of `rsp` the inline code marks (qword stores, one per 8 bytes): perl's
/// `Perl_pp_multiconcat` opens a 1,144-byte frame per call (`sub rsp, 0x478`), which at 512
/// was a step through the interpreter and one more for the instruction after it.
pub(crate) const MAX_INLINE_STACK: i32 = 2048;

/// `rsp`'s move by `ins` when the fast path may do its stack rule inline.
fn inline_rsp_delta(ins: &Instruction) -> Option<i32> {
    let reg_or_imm = |i: u32| {
        matches!(ins.op_kind(i), OpKind::Register)
            && ins.op_register(i).size() == 8
            && ins.op_register(i) != Register::RSP
            || matches!(
                ins.op_kind(i),
                OpKind::Immediate8to64 | OpKind::Immediate32to64
            )
    };
    let delta = match ins.mnemonic() {
        // `push m64` too (ld.so's symbol lookup, libcrypto, sqlite3, perl's pp_substcont
        // `push 0x28(%rbp)`): its source is checked as any memory operand, the pushed slot
        // is a second one.
        Mnemonic::Push
            if ins.op_count() == 1
                && (reg_or_imm(0)
                    || ins.op0_kind() == OpKind::Memory && ins.memory_size().size() == 8) =>
        {
            -8
        }
        Mnemonic::Pop
            if ins.op_count() == 1
                && ins.op0_kind() == OpKind::Register
                && ins.op0_register().size() == 8
                && ins.op0_register() != Register::RSP =>
        {
            8
        }
        Mnemonic::Sub | Mnemonic::Add
            if ins.op_count() == 2
                && ins.op0_kind() == OpKind::Register
                && ins.op0_register() == Register::RSP
                && matches!(
                    ins.op1_kind(),
                    OpKind::Immediate8to64 | OpKind::Immediate32to64
                ) =>
        {
            let imm = ins.immediate(1) as i64;
            let d = if ins.mnemonic() == Mnemonic::Sub {
                -imm
            } else {
                imm
            };
            if d < -(MAX_INLINE_STACK as i64) || d > i32::MAX as i64 || d % 8 != 0 {
                return None;
            }
            d as i32
        }
        // A near call: its target is a constant, a register or memory (checked as any
        // operand); the return address it pushes is defined.
        Mnemonic::Call
            if ins.op_count() == 1
                && (ins.op0_kind() == OpKind::NearBranch64
                    || ins.op0_kind() == OpKind::Register
                        && ins.op0_register().size() == 8
                        && ins.op0_register() != Register::RSP
                    || ins.op0_kind() == OpKind::Memory && ins.memory_size().size() == 8) =>
        {
            -8
        }
        Mnemonic::Ret if ins.op_count() == 0 => 8,
        Mnemonic::Ret if ins.op_count() == 1 && ins.immediate(0) % 8 == 0 => {
            8 + ins.immediate(0) as i32
        }
        _ => return None,
    };
    Some(delta)
}

/// The [`FastForm::rsp_from`] of `ins`: `rsp` set from a general register other than
/// `rax` (borrowed by the inline code) and `rsp`.
fn inline_rsp_from(ins: &Instruction) -> Option<(u8, i32)> {
    let source = |r: Register| {
        (r.is_gpr64() && r != Register::RAX && r != Register::RSP).then(|| r.number() as u8)
    };
    let to_rsp = ins.op_count() == 2
        && ins.op0_kind() == OpKind::Register
        && ins.op0_register() == Register::RSP;
    match ins.mnemonic() {
        Mnemonic::Leave if ins.code() == iced_x86::Code::Leaveq => Some((5, 8)),
        Mnemonic::Mov if to_rsp && ins.op1_kind() == OpKind::Register => {
            Some((source(ins.op1_register())?, 0))
        }
        Mnemonic::Lea
            if to_rsp
                && ins.memory_index() == Register::None
                && ins.memory_segment() != Register::FS
                && ins.memory_segment() != Register::GS
                && !ins.is_ip_rel_memory_operand() =>
        {
            let d = ins.memory_displacement64() as i64;
            (d == d as i32 as i64).then_some(())?;
            Some((source(ins.memory_base())?, d as i32))
        }
        _ => None,
    }
}

/// The stack bytes an instruction moving `rsp` by `delta` leaves undefined (see
/// [`FastForm::undefined`]).
fn undefined_by(ins: &Instruction, delta: i32) -> Option<(i32, i32)> {
    if is_call_or_ret(ins) {
        Some((delta - RED_ZONE as i32, RED_ZONE as i32))
    } else if delta < 0 {
        Some((delta - RED_ZONE as i32, -delta))
    } else {
        None
    }
}

/// The instruction forms with an inline fast path: integer instructions on general
/// registers, flags and memory, whose interpreter rule makes every output defined when
/// every input is (no rule creates undefined bits from defined ones), that do not move
/// `rsp` (the stack rule is the slow path's) and are not string, `rep`, x87, vector or
/// system instructions.
fn fast_mnemonic(m: Mnemonic) -> bool {
    use Mnemonic as M;
    matches!(
        m,
        M::Mov
            | M::Movzx
            | M::Movsx
            | M::Movsxd
            | M::Lea
            | M::Add
            | M::Sub
            | M::Adc
            | M::Sbb
            | M::And
            | M::Or
            | M::Xor
            | M::Not
            | M::Neg
            | M::Inc
            | M::Dec
            | M::Cmp
            | M::Test
            | M::Shl
            | M::Shr
            | M::Sar
            | M::Rol
            | M::Ror
            | M::Shld
            | M::Shrd
            | M::Imul
            | M::Mul
            | M::Div
            | M::Idiv
            | M::Fldcw
            | M::Fnstcw
            | M::Ldmxcsr
            | M::Stmxcsr
            | M::Xchg
            | M::Xadd
            | M::Cmpxchg
            | M::Bswap
            | M::Bt
            | M::Bts
            | M::Btr
            | M::Btc
            | M::Bsf
            | M::Bsr
            | M::Tzcnt
            | M::Lzcnt
            | M::Popcnt
            | M::Cbw
            | M::Cwde
            | M::Cdqe
            | M::Cwd
            | M::Cdq
            | M::Cqo
            | M::Movbe
            | M::Andn
            | M::Bextr
            | M::Blsr
            | M::Blsi
            | M::Blsmsk
            | M::Bzhi
            | M::Shlx
            | M::Shrx
            | M::Sarx
            | M::Rorx
            | M::Pdep
            | M::Pext
            | M::Mulx
            // Add with carry or overflow flag (OpenSSL's Montgomery multiplication).
            | M::Adcx
            | M::Adox
            | M::Crc32
            | M::Seta
            | M::Setae
            | M::Setb
            | M::Setbe
            | M::Sete
            | M::Setg
            | M::Setge
            | M::Setl
            | M::Setle
            | M::Setne
            | M::Setno
            | M::Setnp
            | M::Setns
            | M::Seto
            | M::Setp
            | M::Sets
            | M::Cmova
            | M::Cmovae
            | M::Cmovb
            | M::Cmovbe
            | M::Cmove
            | M::Cmovg
            | M::Cmovge
            | M::Cmovl
            | M::Cmovle
            | M::Cmovne
            | M::Cmovno
            | M::Cmovnp
            | M::Cmovns
            | M::Cmovo
            | M::Cmovp
            | M::Cmovs
            | M::Ja
            | M::Jae
            | M::Jb
            | M::Jbe
            | M::Je
            | M::Jg
            | M::Jge
            | M::Jl
            | M::Jle
            | M::Jne
            | M::Jno
            | M::Jnp
            | M::Jns
            | M::Jo
            | M::Jp
            | M::Js
            | M::Jmp
            | M::Nop
            | M::Endbr64
            // A store of the accumulator, a copy of one element (`fast_form` takes no other
            // string instruction; `movsd` is also the vector mnemonic's).
            | M::Stosb
            | M::Stosw
            | M::Stosd
            | M::Stosq
            | M::Movsb
            | M::Movsw
            | M::Movsq
    )
}

/// x87 instruction forms with an inline fast path (sqlite3's printf and atof of doubles:
/// ~130 k steps a run): loads, stores, exchanges, arithmetic and compares, whose
/// interpreter rules (`oxgrind_vbits`'s x87) copy, rotate or PCast the register stack's
/// shadows and the memory operand's. With every register's shadow and the condition bits
/// defined before ([`FastForm::x87`]) and every other input checked, everything they write
/// is defined, and a push or pop rotates zeros: the stack needs no update. Not the
/// environment and state saves (`fnsave`, `fxrstor`...) nor 80-bit and BCD operands.
fn fast_x87_mnemonic(m: Mnemonic) -> bool {
    use Mnemonic as M;
    matches!(
        m,
        M::Fld
            | M::Fild
            | M::Fldz
            | M::Fld1
            | M::Fldpi
            | M::Fldl2e
            | M::Fldln2
            | M::Fldlg2
            | M::Fldl2t
            | M::Fst
            | M::Fstp
            | M::Fist
            | M::Fistp
            | M::Fisttp
            | M::Fxch
            | M::Fadd
            | M::Faddp
            | M::Fsub
            | M::Fsubp
            | M::Fsubr
            | M::Fsubrp
            | M::Fmul
            | M::Fmulp
            | M::Fdiv
            | M::Fdivp
            | M::Fdivr
            | M::Fdivrp
            | M::Fiadd
            | M::Fisub
            | M::Fisubr
            | M::Fimul
            | M::Fidiv
            | M::Fidivr
            | M::Fchs
            | M::Fabs
            | M::Fsqrt
            | M::Frndint
            | M::Fcom
            | M::Fcomp
            | M::Fcompp
            | M::Fucom
            | M::Fucomp
            | M::Fucompp
            | M::Ficom
            | M::Ficomp
            | M::Ftst
            | M::Fxam
            | M::Fcomi
            | M::Fcomip
            | M::Fucomi
            | M::Fucomip
            | M::Fcmovb
            | M::Fcmove
            | M::Fcmovbe
            | M::Fcmovu
            | M::Fcmovnb
            | M::Fcmovne
            | M::Fcmovnbe
            | M::Fcmovnu
            | M::Fnstsw
    )
}

/// Vector instruction forms with an inline fast path: SSE and AVX moves, floating-point
/// arithmetic, compares and conversions, and the integer lane operations compiled code
/// and glibc use most, whose interpreter rules (PCast of the inputs, exact bitwise rules,
/// data movement) give all defined outputs from all defined inputs. `movsd` and `cmpsd`
/// are also string instructions: those are excluded by `fast_form`. Masked (EVEX `{k}`)
/// forms take the slow path.
fn fast_vector_mnemonic(m: Mnemonic) -> bool {
    use Mnemonic as M;
    matches!(
        m,
        // The cryptographic instructions (AES-NI, SHA-NI) have no rule of their own: the
        // interpreter's generic one makes every output defined when every input is, as
        // here. OpenSSL runs them in loops; stepping each through the interpreter cost
        // more than the rest of the program.
        M::Aesenc
            | M::Aesenclast
            | M::Aesdec
            | M::Aesdeclast
            | M::Aesimc
            | M::Aeskeygenassist
            | M::Vaesenc
            | M::Vaesenclast
            | M::Vaesdec
            | M::Vaesdeclast
            | M::Vaesimc
            | M::Vaeskeygenassist
            | M::Sha1rnds4
            | M::Sha1nexte
            | M::Sha1msg1
            | M::Sha1msg2
            | M::Sha256rnds2
            | M::Sha256msg1
            | M::Sha256msg2
            | M::Movaps
            | M::Movapd
            | M::Movups
            | M::Movupd
            | M::Movdqa
            | M::Movdqu
            | M::Movss
            | M::Movsd
            | M::Movd
            | M::Movq
            | M::Movlps
            | M::Movlpd
            | M::Movhps
            | M::Movhpd
            | M::Movhlps
            | M::Movlhps
            | M::Movddup
            | M::Movshdup
            | M::Movsldup
            | M::Movntdq
            | M::Movntps
            | M::Movntpd
            | M::Movnti
            | M::Lddqu
            | M::Addss
            | M::Addsd
            | M::Addps
            | M::Addpd
            | M::Subss
            | M::Subsd
            | M::Subps
            | M::Subpd
            | M::Mulss
            | M::Mulsd
            | M::Mulps
            | M::Mulpd
            | M::Divss
            | M::Divsd
            | M::Divps
            | M::Divpd
            | M::Minss
            | M::Minsd
            | M::Minps
            | M::Minpd
            | M::Maxss
            | M::Maxsd
            | M::Maxps
            | M::Maxpd
            | M::Sqrtss
            | M::Sqrtsd
            | M::Sqrtps
            | M::Sqrtpd
            | M::Andps
            | M::Andpd
            | M::Andnps
            | M::Andnpd
            | M::Orps
            | M::Orpd
            | M::Xorps
            | M::Xorpd
            | M::Ucomiss
            | M::Ucomisd
            | M::Comiss
            | M::Comisd
            | M::Cmpss
            | M::Cmpsd
            | M::Cmpps
            | M::Cmppd
            | M::Cvtsi2ss
            | M::Cvtsi2sd
            | M::Cvtss2sd
            | M::Cvtsd2ss
            | M::Cvttss2si
            | M::Cvttsd2si
            | M::Cvtss2si
            | M::Cvtsd2si
            | M::Cvtdq2pd
            | M::Cvtdq2ps
            | M::Cvtps2pd
            | M::Cvtpd2ps
            | M::Cvttpd2dq
            | M::Cvttps2dq
            | M::Cvtps2dq
            | M::Cvtpd2dq
            | M::Roundss
            | M::Roundsd
            | M::Roundps
            | M::Roundpd
            | M::Unpcklps
            | M::Unpcklpd
            | M::Unpckhps
            | M::Unpckhpd
            | M::Shufps
            | M::Shufpd
            | M::Blendps
            | M::Blendpd
            | M::Pxor
            | M::Por
            | M::Pand
            | M::Pandn
            | M::Paddb
            | M::Paddw
            | M::Paddd
            | M::Paddq
            | M::Psubb
            | M::Psubw
            | M::Psubd
            | M::Psubq
            | M::Paddusb
            | M::Paddusw
            | M::Psubusb
            | M::Psubusw
            | M::Pcmpeqb
            | M::Pcmpeqw
            | M::Pcmpeqd
            | M::Pcmpeqq
            | M::Pcmpgtb
            | M::Pcmpgtw
            | M::Pcmpgtd
            | M::Pcmpgtq
            | M::Pminub
            | M::Pmaxub
            | M::Pminsw
            | M::Pmaxsw
            | M::Pminud
            | M::Pmaxud
            | M::Pminsd
            | M::Pmaxsd
            | M::Pmullw
            | M::Pmulld
            | M::Pmuludq
            | M::Pmulhw
            | M::Pmulhuw
            | M::Pmaddwd
            | M::Psadbw
            | M::Pavgb
            | M::Pmovmskb
            | M::Movmskps
            | M::Movmskpd
            | M::Pshufd
            | M::Pshuflw
            | M::Pshufhw
            | M::Pshufb
            | M::Palignr
            | M::Pblendw
            | M::Punpcklbw
            | M::Punpcklwd
            | M::Punpckldq
            | M::Punpcklqdq
            | M::Punpckhbw
            | M::Punpckhwd
            | M::Punpckhdq
            | M::Punpckhqdq
            | M::Packuswb
            | M::Packsswb
            | M::Packssdw
            | M::Packusdw
            | M::Pslldq
            | M::Psrldq
            | M::Psllw
            | M::Pslld
            | M::Psllq
            | M::Psrlw
            | M::Psrld
            | M::Psrlq
            | M::Psraw
            | M::Psrad
            | M::Pextrb
            | M::Pextrw
            | M::Pextrd
            | M::Pextrq
            | M::Pinsrb
            | M::Pinsrw
            | M::Pinsrd
            | M::Pinsrq
            | M::Pmovzxbw
            | M::Pmovzxbd
            | M::Pmovzxbq
            | M::Pmovzxwd
            | M::Pmovzxwq
            | M::Pmovzxdq
            | M::Pmovsxbw
            | M::Pmovsxbd
            | M::Pmovsxbq
            | M::Pmovsxwd
            | M::Pmovsxwq
            | M::Pmovsxdq
            | M::Ptest
            | M::Pclmulqdq
            | M::Vpclmulqdq
            | M::Vmovaps
            | M::Vmovapd
            | M::Vmovups
            | M::Vmovupd
            | M::Vmovdqa
            | M::Vmovdqu
            | M::Vmovdqa32
            | M::Vmovdqa64
            | M::Vmovdqu8
            | M::Vmovdqu16
            | M::Vmovdqu32
            | M::Vmovdqu64
            | M::Vmovss
            | M::Vmovsd
            | M::Vmovd
            | M::Vmovq
            | M::Vmovlps
            | M::Vmovlpd
            | M::Vmovhps
            | M::Vmovhpd
            | M::Vmovhlps
            | M::Vmovlhps
            | M::Vmovddup
            | M::Vmovshdup
            | M::Vmovsldup
            | M::Vmovntdq
            | M::Vmovntps
            | M::Vmovntpd
            | M::Vlddqu
            | M::Vaddss
            | M::Vaddsd
            | M::Vaddps
            | M::Vaddpd
            | M::Vsubss
            | M::Vsubsd
            | M::Vsubps
            | M::Vsubpd
            | M::Vmulss
            | M::Vmulsd
            | M::Vmulps
            | M::Vmulpd
            | M::Vdivss
            | M::Vdivsd
            | M::Vdivps
            | M::Vdivpd
            | M::Vminss
            | M::Vminsd
            | M::Vminps
            | M::Vminpd
            | M::Vmaxss
            | M::Vmaxsd
            | M::Vmaxps
            | M::Vmaxpd
            | M::Vsqrtss
            | M::Vsqrtsd
            | M::Vsqrtps
            | M::Vsqrtpd
            | M::Vandps
            | M::Vandpd
            | M::Vandnps
            | M::Vandnpd
            | M::Vorps
            | M::Vorpd
            | M::Vxorps
            | M::Vxorpd
            | M::Vucomiss
            | M::Vucomisd
            | M::Vcomiss
            | M::Vcomisd
            | M::Vcvtsi2ss
            | M::Vcvtsi2sd
            | M::Vcvtss2sd
            | M::Vcvtsd2ss
            | M::Vcvttss2si
            | M::Vcvttsd2si
            | M::Vcvtss2si
            | M::Vcvtsd2si
            | M::Vcvtdq2pd
            | M::Vcvtdq2ps
            | M::Vcvtps2pd
            | M::Vcvtpd2ps
            | M::Vcvttpd2dq
            | M::Vcvttps2dq
            | M::Vcvtps2dq
            | M::Vcvtpd2dq
            | M::Vroundss
            | M::Vroundsd
            | M::Vroundps
            | M::Vroundpd
            | M::Vunpcklps
            | M::Vunpcklpd
            | M::Vunpckhps
            | M::Vunpckhpd
            | M::Vshufps
            | M::Vshufpd
            | M::Vfmadd132sd
            | M::Vfmadd213sd
            | M::Vfmadd231sd
            | M::Vfmadd132pd
            | M::Vfmadd213pd
            | M::Vfmadd231pd
            | M::Vfmadd132ss
            | M::Vfmadd213ss
            | M::Vfmadd231ss
            | M::Vfmadd132ps
            | M::Vfmadd213ps
            | M::Vfmadd231ps
            | M::Vfmsub132sd
            | M::Vfmsub213sd
            | M::Vfmsub231sd
            | M::Vfnmadd132sd
            | M::Vfnmadd213sd
            | M::Vfnmadd231sd
            | M::Vpxor
            | M::Vpor
            | M::Vpand
            | M::Vpandn
            | M::Vpxord
            | M::Vpxorq
            | M::Vpord
            | M::Vporq
            | M::Vpandd
            | M::Vpandq
            | M::Vpandnd
            | M::Vpandnq
            | M::Vpternlogd
            | M::Vpternlogq
            | M::Vpaddb
            | M::Vpaddw
            | M::Vpaddd
            | M::Vpaddq
            | M::Vpsubb
            | M::Vpsubw
            | M::Vpsubd
            | M::Vpsubq
            | M::Vpcmpeqb
            | M::Vpcmpeqw
            | M::Vpcmpeqd
            | M::Vpcmpeqq
            | M::Vpcmpgtb
            | M::Vpcmpgtw
            | M::Vpcmpgtd
            | M::Vpcmpgtq
            | M::Vpminub
            | M::Vpmaxub
            | M::Vpminud
            | M::Vpmaxud
            | M::Vpminsd
            | M::Vpmaxsd
            | M::Vpmovmskb
            | M::Vmovmskps
            | M::Vmovmskpd
            | M::Vpshufd
            | M::Vpshufb
            | M::Vpalignr
            | M::Vpblendd
            | M::Vpblendvb
            | M::Vpunpcklbw
            | M::Vpunpcklwd
            | M::Vpunpckldq
            | M::Vpunpcklqdq
            | M::Vpunpckhbw
            | M::Vpunpckhwd
            | M::Vpunpckhdq
            | M::Vpunpckhqdq
            | M::Vpackuswb
            | M::Vpslldq
            | M::Vpsrldq
            | M::Vpsllq
            | M::Vpsrlq
            | M::Vpslld
            | M::Vpsrld
            | M::Vpbroadcastb
            | M::Vpbroadcastw
            | M::Vpbroadcastd
            | M::Vpbroadcastq
            | M::Vbroadcastss
            | M::Vbroadcastsd
            | M::Vinserti128
            | M::Vinsertf128
            | M::Vextracti128
            | M::Vextractf128
            | M::Vperm2i128
            | M::Vperm2f128
            | M::Vpermq
            | M::Vpermd
            | M::Vpextrb
            | M::Vpextrw
            | M::Vpextrd
            | M::Vpextrq
            | M::Vpinsrb
            | M::Vpinsrw
            | M::Vpinsrd
            | M::Vpinsrq
            | M::Vpmovzxbw
            | M::Vpmovzxbd
            | M::Vpmovzxwd
            | M::Vpmovzxdq
            | M::Vptest
    )
}

/// The fast form of `ins`, if it has one.
pub(crate) fn fast_form(ins: &Instruction) -> Option<FastForm> {
    use iced_x86::OpAccess as A;
    let rsp_delta = inline_rsp_delta(ins);
    let rsp_from = inline_rsp_from(ins);
    if !FAST_PATH.load(Ordering::Relaxed)
        || !(fast_mnemonic(ins.mnemonic())
            || fast_vector_mnemonic(ins.mnemonic())
            || fast_x87_mnemonic(ins.mnemonic())
            || rsp_delta.is_some()
            || rsp_from.is_some())
        || (writes_rsp(ins) && rsp_delta.is_none() && rsp_from.is_none())
        || ins.has_op_mask()
        || ins.is_string_instruction() && !is_stos(ins) && !is_movs(ins)
        || ins.has_rep_prefix()
        || ins.has_repne_prefix()
    {
        return None;
    }
    let mut form = FastForm {
        reads: 0,
        read_bytes: [0; 16],
        writes: [None; 4],
        flags: false,
        flags_overwritten: false,
        mem: [None; 2],
        rsp_delta: rsp_delta.unwrap_or(0),
        undefined: rsp_delta.and_then(|d| undefined_by(ins, d)),
        rsp_from,
        origin: None,
        vec_reads: [None; 4],
        vec_writes: [None; 2],
        load: None,
        store: None,
        vec_copy: None,
        x87: fast_x87_mnemonic(ins.mnemonic()),
    };
    if origins::enabled() && form.undefined.is_some() {
        // What the slow path would tag the new stack with: the red zone after a call or
        // ret with the pc entered, a decrease with the instruction's own pc.
        form.origin = Some(match ins.mnemonic() {
            Mnemonic::Call if ins.op0_kind() == OpKind::NearBranch64 => {
                StackOrigin::Tag(origins::stack(ins.near_branch_target()))
            }
            Mnemonic::Call => return None, // the target is known at run time only
            Mnemonic::Ret => StackOrigin::ReturnAddress,
            _ => StackOrigin::Tag(origins::stack(ins.ip())),
        });
    }
    const STATUS: u32 = 0x3f; // iced's OF SF ZF AF CF PF
    form.flags = (ins.rflags_read() | ins.rflags_modified()) & STATUS != 0;
    form.flags_overwritten = ins.rflags_read() & STATUS == 0
        && matches!(
            ins.mnemonic(),
            Mnemonic::Add
                | Mnemonic::Sub
                | Mnemonic::Cmp
                | Mnemonic::Neg
                | Mnemonic::And
                | Mnemonic::Or
                | Mnemonic::Xor
                | Mnemonic::Test
                // ZF, PF and CF from the compare, OF, SF and AF cleared.
                | Mnemonic::Fcomi
                | Mnemonic::Fcomip
                | Mnemonic::Fucomi
                | Mnemonic::Fucomip
        );
    use Mnemonic as M;
    let is_shift = matches!(
        ins.mnemonic(),
        M::Shl | M::Shr | M::Sar | M::Rol | M::Ror | M::Rcl | M::Rcr | M::Shld | M::Shrd
    );
    if matches!(ins.mnemonic(), M::Shld | M::Shrd)
        && ins.op0_kind() == OpKind::Register
        && ins.op0_register().size() == 2
        || matches!(ins.mnemonic(), M::Shld | M::Shrd) && ins.memory_size().size() == 2
    {
        // A 16-bit count above 16 leaves result and flags undefined by the architecture,
        // which the interpreter marks undefined: the one rule that makes undefined bits
        // from defined ones.
        return None;
    }
    let ok = crate::probe::with_factory(|f| {
        let info = f.info(ins);
        let mut nw = 0;
        let (mut nvr, mut nvw) = (0, 0);
        let vex_like = !matches!(ins.encoding(), iced_x86::EncodingKind::Legacy);
        for u in info.used_registers() {
            let r = u.register();
            if r.is_xmm() || r.is_ymm() || r.is_zmm() {
                let n = r.number() as u8;
                if matches!(u.access(), A::Read | A::CondRead | A::ReadWrite) {
                    if nvr == form.vec_reads.len() {
                        return false;
                    }
                    let len = r.size() as u8;
                    form.vec_reads[nvr] = Some(VecBytes { n, len });
                    nvr += 1;
                }
                match u.access() {
                    A::Write | A::ReadWrite => {
                        if nvw == form.vec_writes.len() {
                            return false;
                        }
                        let len = if vex_like { 64 } else { r.size() as u8 };
                        form.vec_writes[nvw] = Some(VecBytes { n, len });
                        nvw += 1;
                    }
                    A::Read | A::CondRead => {}
                    _ => return false, // masked or conditional writes: the slow path
                }
                continue;
            }
            if matches!(r, Register::ES | Register::CS | Register::SS | Register::DS) {
                continue; // segment "registers" of plain memory operands
            }
            if r == Register::FS || r == Register::GS {
                if matches!(u.access(), A::Read) {
                    continue; // a segment prefix: its base is the address's, not a value
                }
                return false;
            }
            if r.is_st() && form.x87 {
                continue; // the whole stack is checked (`FastForm::x87`)
            }
            if !r.is_gpr() {
                return false; // rip-relative operands show no register; anything else is rare
            }
            let n = r.full_register().number() as u8;
            // A shift or rotate by a count that turns out 0 leaves its destination's
            // shadow as it was (the interpreter does not zero-extend then): its whole
            // register must be defined.
            // (iced-x86 shows a 32-bit destination as a 32-bit read and a 64-bit write.)
            let bytes: u8 = match r.size() {
                _ if is_shift => 0xff,
                8 => 0xff,
                4 => 0x0f,
                2 => 0x03,
                _ if matches!(r, Register::AH | Register::CH | Register::DH | Register::BH) => 0x02,
                _ => 0x01,
            };
            match u.access() {
                A::Read | A::CondRead => {
                    form.reads |= 1 << n;
                    form.read_bytes[n as usize] |= bytes;
                }
                A::Write | A::CondWrite | A::ReadWrite | A::ReadCondWrite => {
                    if matches!(u.access(), A::ReadWrite | A::ReadCondWrite | A::CondWrite) {
                        form.reads |= 1 << n;
                        form.read_bytes[n as usize] |= bytes;
                    }
                    if nw == form.writes.len() {
                        return false;
                    }
                    form.writes[nw] = Some(match r.size() {
                        8 | 4 => Written::Qword(n),
                        2 => Written::Word(n),
                        _ if matches!(
                            r,
                            Register::AH | Register::CH | Register::DH | Register::BH
                        ) =>
                        {
                            Written::HighByte(n & 3)
                        }
                        _ => Written::Byte(n),
                    });
                    nw += 1;
                }
                A::None | A::NoMemAccess => {}
            }
        }
        let mut nm = 0;
        for m in info.used_memory() {
            let plain = |r: Register| r == Register::None || r.is_gpr64();
            if !plain(m.base())
                || !plain(m.index())
                || m.vsib_size() != 0
                || m.address_size() != iced_x86::CodeSize::Code64
                || !matches!(
                    m.segment(),
                    Register::None
                        | Register::ES
                        | Register::CS
                        | Register::SS
                        | Register::DS
                        | Register::FS
                        | Register::GS
                )
            {
                return false;
            }
            for r in [m.base(), m.index()] {
                if r != Register::None {
                    form.reads |= 1 << r.number();
                    form.read_bytes[r.number()] = 0xff;
                }
            }
            if matches!(m.access(), A::None | A::NoMemAccess) || m.memory_size().size() == 0 {
                continue; // lea: an address, no access
            }
            if nm == form.mem.len()
                || !matches!(m.memory_size().size(), 1 | 2 | 4 | 8 | 16 | 32 | 64)
            {
                return false;
            }
            form.mem[nm] = Some(*m);
            nm += 1;
        }
        true
    });
    if ok && !origins::enabled() {
        form.load = load_copy(ins);
        form.store = store_copy(ins);
        if let Some(st) = form.store {
            // Its shadow is copied, not checked.
            form.reads &= !(1 << st.n);
            form.read_bytes[st.n as usize] = 0;
        }
        form.vec_copy = vec_copy(ins);
        if let Some(vc) = form.vec_copy {
            // Its shadow is copied, not checked nor zeroed.
            for v in form.vec_reads.iter_mut().chain(form.vec_writes.iter_mut()) {
                if v.is_some_and(|v| v.n == vc.n) {
                    *v = None;
                }
            }
        }
    }
    (ok && slow_jumps(&form) <= MAX_FAST_JUMPS).then_some(form)
}

/// Whether `ins` is a `stos` (the one string instruction with fast forms: a store of
/// `al`/`ax`/`eax`/`rax` to `[rdi]`, `rdi` moved on; alone, or one iteration of a `rep`,
/// [`rep_iteration_form`]).
fn is_stos(ins: &Instruction) -> bool {
    matches!(
        ins.mnemonic(),
        Mnemonic::Stosb | Mnemonic::Stosw | Mnemonic::Stosd | Mnemonic::Stosq
    ) && ins.op0_kind() == OpKind::MemoryESRDI
}

/// Whether `ins` is a `movs` (`[rsi]` to `[rdi]`, both moved on): alone, the interpreter's
/// rule copies the element's shadow, which the fast form requires defined (Python's
/// object copies run one in a hot loop).
fn is_movs(ins: &Instruction) -> bool {
    matches!(
        ins.mnemonic(),
        Mnemonic::Movsb | Mnemonic::Movsw | Mnemonic::Movsd | Mnemonic::Movsq
    ) && ins.op0_kind() == OpKind::MemoryESRDI
        && ins.op1_kind() == OpKind::MemorySegRSI
}

/// The fast form of one iteration of a `rep stos` (`translate::special`'s `rep` block runs
/// one iteration per entry): that of the `stos` alone, with `rcx`, the count the block
/// tests and decrements, defined too. The interpreter's rule for the whole `rep` (its
/// first entry's step) checks `rcx` and `rdi` and stores the accumulator's shadow to every
/// element: with all three defined, every element's shadow defined, as each iteration's
/// fast form makes its own. Python's dict and frame set-up runs `rep stos` hundreds of
/// thousands of times; each run's first entry went through the interpreter.
pub(crate) fn rep_iteration_form(ins: &Instruction) -> Option<FastForm> {
    if !is_stos(ins) || !ins.has_rep_prefix() || ins.has_repne_prefix() {
        return None;
    }
    let mut one = *ins;
    one.set_has_rep_prefix(false);
    let mut form = fast_form(&one)?;
    form.reads |= 1 << 1;
    form.read_bytes[1] = 0xff;
    Some(form)
}

/// The [`LoadCopy`] of `ins`, if it is a plain load into a 32- or 64-bit general register,
/// or a `pop` into a 64-bit one (a load from `[rsp]`, which `inline_rsp_delta` then moves:
/// a slot `sub rsp` left undefined is popped without a slow step, and without the one the
/// next instruction would take for the stack rule).
fn load_copy(ins: &Instruction) -> Option<LoadCopy> {
    if ins.mnemonic() == Mnemonic::Pop {
        return inline_rsp_delta(ins).map(|_| LoadCopy {
            n: ins.op0_register().number() as u8,
            size: 8,
            signed: false,
            width: 8,
        });
    }
    if ins.op_count() != 2
        || ins.op0_kind() != OpKind::Register
        || ins.op1_kind() != OpKind::Memory
        || !ins.op0_register().is_gpr()
    {
        return None;
    }
    let width = ins.op0_register().size() as u8;
    let size = ins.memory_size().size() as u8;
    let signed = match ins.mnemonic() {
        Mnemonic::Mov if size == width => false,
        Mnemonic::Movzx if size < 4 => false,
        Mnemonic::Movsx | Mnemonic::Movsxd if size < width => true,
        _ => return None,
    };
    if !matches!(width, 4 | 8) || !matches!(size, 1 | 2 | 4 | 8) {
        return None;
    }
    Some(LoadCopy {
        n: ins.op0_register().full_register().number() as u8,
        size,
        signed,
        width,
    })
}

/// The [`StoreCopy`] of `ins`, if it stores a general register (not `ah`..`bh`, and not one
/// of its address's registers, which must be defined).
fn store_copy(ins: &Instruction) -> Option<StoreCopy> {
    if ins.mnemonic() != Mnemonic::Mov
        || ins.op_count() != 2
        || ins.op0_kind() != OpKind::Memory
        || ins.op1_kind() != OpKind::Register
        || !ins.op1_register().is_gpr()
        || matches!(
            ins.op1_register(),
            Register::AH | Register::CH | Register::DH | Register::BH
        )
    {
        return None;
    }
    let full = ins.op1_register().full_register();
    let size = ins.op1_register().size() as u8;
    if full == ins.memory_base().full_register()
        || full == ins.memory_index().full_register()
        || full == Register::RSP
        || !matches!(size, 1 | 2 | 4 | 8)
        || ins.memory_size().size() != size as usize
    {
        return None;
    }
    Some(StoreCopy {
        n: full.number() as u8,
        size,
    })
}

/// The [`VecCopy`] of `ins`, if it is a whole-register move of 16 or 32 bytes between an
/// `xmm`/`ymm` register and memory, without masking or broadcast (whose interpreter rule
/// copies the shadow bytes as they are: `oxgrind_vbits::is_whole_register_move`).
fn vec_copy(ins: &Instruction) -> Option<VecCopy> {
    if !oxgrind_vbits::is_whole_register_move(ins.mnemonic())
        || ins.op_count() != 2
        || ins.has_op_mask()
        || ins.is_broadcast()
    {
        return None;
    }
    let (reg, load) = match (ins.op0_kind(), ins.op1_kind()) {
        (OpKind::Register, OpKind::Memory) => (ins.op0_register(), true),
        (OpKind::Memory, OpKind::Register) => (ins.op1_register(), false),
        _ => return None,
    };
    let size = reg.size();
    if !(reg.is_xmm() || reg.is_ymm())
        || !matches!(size, 16 | 32)
        || ins.memory_size().size() != size
    {
        return None;
    }
    let vex_like = !matches!(ins.encoding(), iced_x86::EncodingKind::Legacy);
    Some(VecCopy {
        n: reg.number() as u8,
        size: size as u8,
        load,
        written: if vex_like { 64 } else { size as u8 },
    })
}

/// Most jumps to the slow call a fast form's inline code may have (the emitter's limit,
/// less the state checks).
const MAX_FAST_JUMPS: usize = 56;

/// How many jumps to the slow call the inline code of `form` has (an upper bound): one
/// per compare of 8 shadow bytes or of a register's shadow, two more per memory operand.
fn slow_jumps(form: &FastForm) -> usize {
    let gprs = form.reads.count_ones() as usize;
    let vectors: usize = form
        .vec_reads
        .iter()
        .flatten()
        .map(|v| v.len as usize / 8)
        .sum();
    let mem: usize = form
        .mem
        .iter()
        .flatten()
        .map(|m| 2 + (m.memory_size().size() / 8).max(1))
        .sum();
    // A vector store copy checks the register's shadow when the span has no chunk.
    let copied = form
        .vec_copy
        .filter(|v| !v.load)
        .map_or(0, |v| v.size as usize / 8);
    // The x87 stack's eight shadows and its condition bits.
    let x87 = if form.x87 { 9 } else { 0 };
    gprs + vectors + mem + copied + x87 + form.rsp_from.is_some() as usize + 1
}

#[cfg(test)]
mod tests {
    //! The fast forms against the interpreter: for every instruction with a fast form, the
    //! interpreter run on a state where only what the form checks is defined (every other
    //! register byte, flag and opmask random) must report nothing, make every byte the form
    //! zeroes defined, and change nothing else. Instructions come from a systematic walk of
    //! the legacy 0F, 0F 38 and 0F 3A maps, VEX and EVEX opcode spaces, with register and
    //! memory operands.
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};
    use oxgrind_vbits::FlagShadows;
    use std::collections::BTreeSet;
    use std::vec::Vec;

    #[test]
    fn fill_writes_exactly_its_range() {
        // Every start offset within a line and every length up to past the short form's
        // limit: the bytes of the range hold the fill byte, every byte around it is left.
        let mut buf = [0u8; 1024];
        for start in 0..64 {
            for len in 0..600 {
                buf.fill(0x5a);
                // SAFETY: start + len <= 664 < 1024: the range lies in `buf`.
                unsafe { fill(buf.as_mut_ptr().add(start), 0xff, len) };
                for (i, &b) in buf.iter().enumerate() {
                    let inside = i >= start && i < start + len;
                    assert_eq!(b, if inside { 0xff } else { 0x5a }, "{start} {len} {i}");
                }
            }
        }
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    struct RandomGuest {
        gpr: [u64; 16],
        rflags: u64,
        vector: [[u8; 64]; 32],
        opmask: [u64; 8],
        seed: u64,
    }

    /// A guest with random general registers and flags, and shadows of them with random
    /// undefined bits (about a quarter); vector and mask registers zero and defined.
    fn random_guest(rng: &mut Rng) -> (RandomGuest, ShadowRegisters) {
        let mut guest = RandomGuest {
            gpr: [0; 16],
            rflags: rng.next() & 0xcd5,
            vector: [[0; 64]; 32],
            opmask: [0; 8],
            seed: rng.next(),
        };
        let mut regs = ShadowRegisters::default();
        for i in 0..16 {
            guest.gpr[i] = rng.next();
            regs.gpr[i] = rng.next() & rng.next();
        }
        (guest, regs)
    }

    impl Guest for RandomGuest {
        fn gpr(&self, index: usize) -> u64 {
            self.gpr[index]
        }
        fn rflags(&self) -> u64 {
            self.rflags
        }
        fn vector(&self, index: usize) -> [u8; 64] {
            self.vector[index]
        }
        fn opmask(&self, index: usize) -> u64 {
            self.opmask[index]
        }
        fn segment_base(&self, _segment: Segment) -> u64 {
            0
        }
        fn read_memory(&self, address: u64, out: &mut [u8]) -> bool {
            for (i, b) in out.iter_mut().enumerate() {
                *b = (address.wrapping_add(i as u64) ^ self.seed).wrapping_mul(0x9E37_79B9) as u8;
            }
            true
        }
    }

    /// Memory whose shadow is all defined (what the fast form's memory checks require);
    /// stores are kept.
    /// With `undefined_seed` (a [`LoadCopy`] form), loads give random shadow bytes, kept
    /// in `loaded`.
    #[derive(Default)]
    struct DefinedMemory {
        stored: Vec<(u64, Vec<u8>)>,
        undefined_seed: Option<u64>,
        loaded: Vec<u8>,
    }

    impl ShadowMemory for DefinedMemory {
        fn load(&mut self, address: u64, out: &mut [u8]) {
            match self.undefined_seed {
                None => out.fill(0),
                Some(seed) => {
                    for (i, b) in out.iter_mut().enumerate() {
                        let x = (address.wrapping_add(i as u64) ^ seed)
                            .wrapping_mul(0x2545_F491_4F6C_DD1D);
                        *b = (x >> 56) as u8 & (x >> 40) as u8;
                    }
                    self.loaded.extend_from_slice(out);
                }
            }
        }
        fn store(&mut self, address: u64, shadow: &[u8]) {
            self.stored.push((address, shadow.to_vec()));
        }
    }

    /// Encodings to try: legacy SSE maps with each mandatory prefix, VEX (3-byte form),
    /// EVEX without masking, each with a register-register and two memory ModRMs and an
    /// immediate byte.
    fn encodings(rng: &mut Rng) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let modrms = [
            0xC1u8, 0xD3, 0x04, 0x48, 0xE5, 0x3C, 0xF1, 0x33, 0x28, 0x10, 0x18,
        ];
        let tail = |v: &mut Vec<u8>, modrm: u8, rng: &mut Rng| {
            v.push(modrm);
            if modrm == 0x04 {
                v.push(0x24); // [rsp]
            }
            if modrm == 0x3C {
                v.push(0x8B); // [rbx+rcx*4]
            }
            if modrm == 0x48 {
                v.push(0x10); // [rax+0x10]
            }
            v.push(rng.next() as u8); // imm8, if any
        };
        for prefix in [None, Some(0x66u8), Some(0xF2), Some(0xF3)] {
            for map in [&[][..], &[0x0Fu8][..], &[0x0F, 0x38], &[0x0F, 0x3A]] {
                for rex in [None, Some(0x40u8), Some(0x48u8), Some(0x4Du8)] {
                    for op in 0..=255u8 {
                        for &modrm in &modrms {
                            let mut v = Vec::new();
                            v.extend(prefix);
                            v.extend(rex);
                            v.extend_from_slice(map);
                            v.push(op);
                            tail(&mut v, modrm, rng);
                            out.push(v);
                        }
                    }
                }
            }
        }
        // Every x87 register form (the ModRM values above have few of them).
        for op in 0xD8..=0xDFu8 {
            for modrm in 0xC0..=0xFFu8 {
                out.push(vec![op, modrm]);
            }
        }
        for mmmmm in 1..=3u8 {
            for w in 0..2u8 {
                for l in 0..2u8 {
                    for pp in 0..4u8 {
                        for op in 0..=255u8 {
                            for &modrm in &modrms {
                                let vvvv =
                                    (rng.next() & 15 & (rng.next() & 1).wrapping_neg()) as u8;
                                let r = (rng.next() & 0xE0) as u8;
                                let mut v = vec![0xC4, r | mmmmm];
                                v.push((w << 7) | ((!vvvv & 15) << 3) | (l << 2) | pp);
                                v.push(op);
                                tail(&mut v, modrm, rng);
                                out.push(v);
                            }
                        }
                    }
                }
            }
        }
        for mm in 1..=3u8 {
            for w in 0..2u8 {
                for ll in 0..3u8 {
                    for pp in 0..4u8 {
                        for op in 0..=255u8 {
                            for &modrm in &modrms {
                                let r = (rng.next() & 0xF0) as u8;
                                let vvvv =
                                    (rng.next() & 15 & (rng.next() & 1).wrapping_neg()) as u8;
                                let vprime = (rng.next() & 8) as u8;
                                let mut v = vec![0x62, r | mm];
                                v.push((w << 7) | ((!vvvv & 15) << 3) | 4 | pp);
                                v.push((ll << 5) | vprime); // z = 0, b = 0, aaa = 0
                                v.push(op);
                                tail(&mut v, modrm, rng);
                                out.push(v);
                            }
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn fast_forms_agree_with_the_interpreter() {
        let mut rng = Rng(0x0123_4567_89ab_cdef);
        let mut interp = Interpreter::new();
        let mut covered = BTreeSet::new();
        let mut failures = Vec::new();
        let mut loads_checked = 0;
        let mut vector_copies = 0;
        let mut moves_rsp = BTreeSet::new();
        for bytes in encodings(&mut rng) {
            let mut decoder = Decoder::with_ip(64, &bytes, 0x40_0000, DecoderOptions::NONE);
            let ins = decoder.decode();
            if ins.is_invalid() {
                continue;
            }
            let Some(form) = fast_form(&ins) else {
                continue;
            };
            // Forms that move `rsp` (push, pop, call, ret, `sub rsp`) are compared too: the
            // stack rule (`FastForm::undefined`, the new `rsp` remembered) is the engine's,
            // not the interpreter's, but what they check and write is the same as any form's.
            covered.insert(ins.mnemonic());
            if form.rsp_delta != 0 {
                moves_rsp.insert((ins.mnemonic(), ins.op0_kind() == OpKind::Memory));
            }
            for _ in 0..6 {
                let (mut guest, mut regs) = random_guest(&mut rng);
                for i in 0..32 {
                    for b in 0..64 {
                        guest.vector[i][b] = rng.next() as u8;
                        regs.vector[i][b] = (rng.next() & rng.next()) as u8;
                    }
                }
                for i in 0..8 {
                    guest.opmask[i] = rng.next();
                    regs.opmask[i] = rng.next() & rng.next();
                }
                regs.flags = FlagShadows((rng.next() & 0x3f) as u8);
                for s in regs.x87.iter_mut() {
                    *s = rng.next() & rng.next();
                }
                regs.x87_status = rng.next() & 1 != 0;
                if form.x87 {
                    regs.x87 = [0; 8];
                    regs.x87_status = false;
                }
                // What the fast form checks is defined.
                for n in 0..16 {
                    if form.reads & (1 << n) != 0 {
                        for i in 0..8 {
                            if form.read_bytes[n] & (1 << i) != 0 {
                                regs.gpr[n] &= !(0xff << (8 * i));
                            }
                        }
                    }
                }
                if form.flags && !form.flags_overwritten {
                    regs.flags = FlagShadows::DEFINED;
                }
                for v in form.vec_reads.iter().flatten() {
                    regs.vector[v.n as usize][..v.len as usize].fill(0);
                }
                // What the fast form would leave.
                let mut expect = regs.clone();
                for w in form.writes.iter().flatten() {
                    match *w {
                        Written::Qword(n) => expect.gpr[n as usize] = 0,
                        Written::Word(n) => expect.gpr[n as usize] &= !0xffff,
                        Written::Byte(n) => expect.gpr[n as usize] &= !0xff,
                        Written::HighByte(n) => expect.gpr[n as usize] &= !0xff00,
                    }
                }
                for v in form.vec_writes.iter().flatten() {
                    expect.vector[v.n as usize][..v.len as usize].fill(0);
                }
                if form.flags_overwritten {
                    expect.flags = FlagShadows::DEFINED;
                }
                let mut mem = DefinedMemory {
                    undefined_seed: (form.load.is_some() || form.vec_copy.is_some_and(|v| v.load))
                        .then(|| rng.next()),
                    ..DefinedMemory::default()
                };
                let outcome = interp.step(&ins, &guest, &mut regs, &mut mem);
                if let Some(l) = form.load {
                    // The loaded shadow, extended as the inline code extends it.
                    let mut raw = [0u8; 8];
                    let got = mem.loaded.len().min(l.size as usize);
                    raw[..got].copy_from_slice(&mem.loaded[..got]);
                    let mut v = u64::from_le_bytes(raw);
                    let bits = 8 * l.size as u32;
                    if l.signed && bits < 64 {
                        v = (((v << (64 - bits)) as i64) >> (64 - bits)) as u64;
                    }
                    if l.width == 4 {
                        v &= 0xffff_ffff;
                    }
                    expect.gpr[l.n as usize] = v;
                    loads_checked += 1;
                }
                if let Some(vc) = form.vec_copy.filter(|v| v.load) {
                    // The loaded shadow as it is, zeros above it up to what the write covers.
                    let reg = &mut expect.vector[vc.n as usize];
                    reg[..vc.written as usize].fill(0);
                    let got = mem.loaded.len().min(vc.size as usize);
                    reg[..got].copy_from_slice(&mem.loaded[..got]);
                    loads_checked += 1;
                    vector_copies += 1;
                }
                // A store copy leaves the register's shadow in memory; else all is defined.
                let stored_undefined = match (form.store, form.vec_copy.filter(|v| !v.load)) {
                    (Some(st), _) => {
                        let want = expect.gpr[st.n as usize].to_le_bytes();
                        mem.stored
                            .iter()
                            .any(|(_, s)| s.as_slice() != &want[..st.size as usize])
                    }
                    (None, Some(vc)) => {
                        vector_copies += 1;
                        let want = &expect.vector[vc.n as usize][..vc.size as usize];
                        mem.stored.iter().any(|(_, s)| s.as_slice() != want)
                    }
                    (None, None) => mem.stored.iter().any(|(_, s)| s.iter().any(|&b| b != 0)),
                };
                let same = regs.gpr == expect.gpr
                    && regs.vector == expect.vector
                    && regs.opmask == expect.opmask
                    && regs.x87 == expect.x87
                    && regs.x87_status == expect.x87_status
                    && (regs.flags == expect.flags || form.flags && regs.flags.0 == 0);
                if !outcome.checks.is_empty() || stored_undefined || !same {
                    failures.push(std::format!(
                        "{:?} bytes {bytes:02x?}: checks {}, stored undefined {stored_undefined}, \
                         gpr {}, vector {}, opmask {}, flags {:?} vs {:?}",
                        ins.code(),
                        outcome.checks.len(),
                        regs.gpr == expect.gpr,
                        regs.vector == expect.vector,
                        regs.opmask == expect.opmask,
                        regs.flags,
                        expect.flags,
                    ));
                    break;
                }
            }
        }
        assert!(
            failures.is_empty(),
            "{} failures:\n{}",
            failures.len(),
            failures.join("\n")
        );
        let missing: Vec<_> = [
            Mnemonic::Movsd,
            Mnemonic::Addsd,
            Mnemonic::Mulsd,
            Mnemonic::Ucomisd,
            Mnemonic::Cvtsi2sd,
            Mnemonic::Cvttsd2si,
            Mnemonic::Pxor,
            Mnemonic::Movdqu,
            Mnemonic::Vmovdqu,
            Mnemonic::Vaddpd,
            Mnemonic::Vfmadd231sd,
            Mnemonic::Vpxorq,
            Mnemonic::Pmovmskb,
            Mnemonic::Mov,
            Mnemonic::And,
            Mnemonic::Add,
            Mnemonic::Cmovne,
            Mnemonic::Setne,
            Mnemonic::Movzx,
            Mnemonic::Imul,
            Mnemonic::Div,
            Mnemonic::Idiv,
            Mnemonic::Fldcw,
            Mnemonic::Fnstcw,
            Mnemonic::Fld,
            Mnemonic::Fild,
            Mnemonic::Fstp,
            Mnemonic::Fistp,
            Mnemonic::Fxch,
            Mnemonic::Fmul,
            Mnemonic::Fsubp,
            Mnemonic::Fdivrp,
            Mnemonic::Fcomi,
            Mnemonic::Fcomip,
            Mnemonic::Fucomip,
            Mnemonic::Fldz,
            Mnemonic::Fld1,
            Mnemonic::Fcmove,
            Mnemonic::Fnstsw,
            Mnemonic::Ldmxcsr,
            Mnemonic::Stmxcsr,
            Mnemonic::Adcx,
            Mnemonic::Adox,
            Mnemonic::Crc32,
            Mnemonic::Aesenc,
            Mnemonic::Vaesenc,
            Mnemonic::Aeskeygenassist,
            Mnemonic::Sha256rnds2,
            Mnemonic::Sha1rnds4,
            Mnemonic::Stosb,
            Mnemonic::Stosq,
            Mnemonic::Movsb,
            Mnemonic::Movsq,
            Mnemonic::Leave,
        ]
        .into_iter()
        .filter(|m| !covered.contains(m))
        .collect();
        assert!(missing.is_empty(), "not covered: {missing:?}");
        assert!(
            [
                (Mnemonic::Push, false),
                (Mnemonic::Push, true),
                (Mnemonic::Pop, false),
                (Mnemonic::Call, false),
                (Mnemonic::Call, true),
                (Mnemonic::Ret, false),
            ]
            .iter()
            .all(|m| moves_rsp.contains(m)),
            "forms that move rsp covered: {moves_rsp:?}"
        );
        assert!(
            loads_checked > 100,
            "{loads_checked} loads with undefined shadow"
        );
        assert!(
            vector_copies > 100,
            "{vector_copies} vector loads and stores of undefined shadow"
        );
        std::eprintln!("{} mnemonics covered", covered.len());
    }

    /// Epilogues that set `rsp` from another register have a fast form with the run-time
    /// move (`FastForm::rsp_from`): `leave` (from `rbp` + 8, its saved `rbp` a checked
    /// memory operand), `mov rsp, r64` and `lea rsp, [r64 + d]`; not from `rax` (the inline
    /// code's borrowed register) nor from `rsp` itself, and no other write of `rsp`.
    #[test]
    fn moves_of_rsp_from_a_register_have_fast_forms() {
        let form = |bytes: &[u8]| {
            let mut decoder = Decoder::with_ip(64, bytes, 0x40_0000, DecoderOptions::NONE);
            fast_form(&decoder.decode())
        };
        let leave = form(&[0xC9]).unwrap();
        assert_eq!(leave.rsp_from, Some((5, 8)));
        assert!(leave.mem[0].is_some_and(|m| m.base() == Register::RBP));
        assert!(leave.reads & (1 << 5) != 0);
        assert_eq!(leave.rsp_delta, 0);
        assert!(leave.undefined.is_none());
        // mov rsp, rbp; mov rsp, r12; lea rsp, [rbp-0x28]; lea rsp, [r13+0x10]
        assert_eq!(form(&[0x48, 0x89, 0xEC]).unwrap().rsp_from, Some((5, 0)));
        assert_eq!(form(&[0x4C, 0x89, 0xE4]).unwrap().rsp_from, Some((12, 0)));
        assert_eq!(
            form(&[0x48, 0x8D, 0x65, 0xD8]).unwrap().rsp_from,
            Some((5, -0x28))
        );
        assert_eq!(
            form(&[0x49, 0x8D, 0x65, 0x10]).unwrap().rsp_from,
            Some((13, 0x10))
        );
        // mov rsp, rax; lea rsp, [rsp+8]; lea rsp, [rbp+rbx*8]; mov esp, ebp; 16-bit leave
        for bytes in [
            &[0x48, 0x89, 0xC4][..],
            &[0x48, 0x8D, 0x64, 0x24, 0x08],
            &[0x48, 0x8D, 0x64, 0xDD, 0x00],
            &[0x89, 0xEC],
            &[0x66, 0xC9],
        ] {
            assert!(form(bytes).is_none(), "{bytes:x?}");
        }
    }

    /// A `rep stos` whose iteration form's inputs are defined (every other register byte,
    /// flag and direction random): the interpreter's step of the whole instruction, which
    /// the iterations' fast forms stand for, reports nothing, stores only defined shadow
    /// (as each iteration's fast form zeroes its element's) and changes no register's.
    #[test]
    fn rep_stos_iterations_agree_with_the_interpreter() {
        let mut rng = Rng(0x5eed_0123_4567_89ab);
        let mut interp = Interpreter::new();
        let encodings: [&[u8]; 4] = [
            &[0xF3, 0xAA],
            &[0x66, 0xF3, 0xAB],
            &[0xF3, 0xAB],
            &[0xF3, 0x48, 0xAB],
        ];
        for bytes in encodings {
            let ins = Decoder::with_ip(64, bytes, 0x40_0000, DecoderOptions::NONE).decode();
            assert!(
                fast_form(&ins).is_none(),
                "{:?}: a rep has no fast form itself",
                ins.code()
            );
            let form = rep_iteration_form(&ins).expect("a rep stos has an iteration form");
            assert!(
                form.reads & (1 << 1) != 0 && form.reads & (1 << 7) != 0 && form.reads & 1 != 0
            );
            assert!(form.mem[0].is_some() && form.mem[1].is_none());
            for _ in 0..64 {
                let (mut guest, mut regs) = random_guest(&mut rng);
                guest.gpr[1] = rng.next() % 40 + 1;
                guest.gpr[7] = 0x10_0000 + (rng.next() & 0xfff);
                regs.flags = FlagShadows((rng.next() & 0x3f) as u8);
                for n in 0..16 {
                    for i in 0..8 {
                        if form.reads & (1 << n) != 0 && form.read_bytes[n] & (1 << i) != 0 {
                            regs.gpr[n] &= !(0xff << (8 * i));
                        }
                    }
                }
                let before = regs.clone();
                let mut mem = DefinedMemory::default();
                let outcome = interp.step(&ins, &guest, &mut regs, &mut mem);
                assert!(outcome.checks.is_empty(), "{:?} reported", ins.code());
                assert!(!mem.stored.is_empty());
                assert!(
                    mem.stored.iter().all(|(_, s)| s.iter().all(|&b| b == 0)),
                    "{:?} stored undefined shadow",
                    ins.code()
                );
                assert!(regs.gpr == before.gpr && regs.flags == before.flags);
            }
        }
    }
}
