//! The native tries of the replaced string functions (`oxgrind_engine::native_try`): a
//! call the program makes to `memmove`/`memcpy`, `memcmp`/`bcmp`, `strlen`, `strchr`
//! (`index`), `strchrnul` or `strncpy` first runs here, natively, and does the
//! work itself when `replace.c`'s loop, run translated from this call, would report
//! nothing; otherwise it declines and the loop runs, reporting exactly what Valgrind's
//! replacement reports.
//!
//! Why: nearly all such calls are short (bench `containers`: 8-12 byte `std::string`
//! compares and copies, a fifth of its time; `churn`: Rust's short keys; `sqlite3` and
//! `python3`: their `strlen`s, searches and `strncpy`s) and clean, and the
//! translated loop's cost per call is its instrumented prologue and epilogue, a few hundred
//! host instructions, and for a long range an instrumented access per word.
//!
//! "Would report nothing" is, for each access the loop makes: its granules unmarked in the
//! tool's shadow map and outside the dead-frame window (`native_try::unprobed`), its address
//! computed from defined registers (the arguments, `native_try::arguments_defined`), and for
//! a comparison or a search, every byte its branches depend on defined (up to the first
//! difference or the stop byte; in memcmp's word loop, the whole word holding it). A copy's
//! effect includes its V bits, which follow the bytes (`definedness::copy`); with origins,
//! only a copy of defined bytes is done here (a store of defined bytes changes no origin
//! tag), one of undefined bytes declines. A string copy writes defined bytes only (its
//! source's bytes are defined, the rest zeros).
//!
//! Faults: a pointer into unmapped memory faults here as it would in the loop; the engine
//! then declines the try from its gate, and the loop makes the access and reports it. So
//! nothing here takes a lock or allocates, and a copy writes only what the loop would
//! write again the same way: ranges that overlap are first read at both ends of every page
//! of their union, so that the copy cannot fault half way on an unmapped page (a page
//! mapped without write permission can still stop it half way, as it stops the program,
//! which then ends with the same report either way).

use oxgrind_engine::definedness;
use oxgrind_engine::native_try::{arguments_defined, unprobed, Tried};

const PAGE: u64 = 4096;

/// `replace.c`'s `memmove` (also `memcpy`'s), done natively when it would report nothing.
///
/// # Safety
/// Only as the engine's try of that replacement (`Embedder::native_try`), with the
/// program's call's registers.
pub(super) unsafe extern "C" fn try_memmove(
    dst: u64,
    src: u64,
    n: u64,
    _: u64,
    _: u64,
    _: u64,
) -> Tried {
    // SAFETY (both): the caller's contract: this is a try function.
    if !unsafe { arguments_defined(3) } {
        return Tried::DECLINED;
    }
    if n == 0 {
        return Tried::done(dst);
    }
    // SAFETY: as above.
    if !unsafe { unprobed(src, n) && unprobed(dst, n) } {
        return Tried::DECLINED;
    }
    let undefined_source = !definedness::range_defined(src, n);
    if undefined_source && definedness::origins_tracked() {
        return Tried::DECLINED;
    }
    let overlap = src < dst.wrapping_add(n) && dst < src.wrapping_add(n);
    if overlap {
        // Every page of the ranges' union read first: an unmapped one faults (and declines)
        // before anything is written.
        let lo = src.min(dst);
        let hi = src.max(dst) + n;
        let mut p = lo;
        while p < hi {
            // SAFETY: a read of the program's memory, which the loop reads too (the union
            // of two overlapping ranges it accesses); a fault declines the try.
            unsafe { core::ptr::read_volatile(p as *const u8) };
            p = (p | (PAGE - 1)) + 1;
        }
        // SAFETY: as above.
        unsafe { core::ptr::read_volatile((hi - 1) as *const u8) };
    }
    // SAFETY: both ranges are the program's, which the loop would copy between (memmove's
    // effect, forwards or backwards as it chooses); a fault declines the try before any
    // V bit changes, and the loop then writes the same bytes again.
    unsafe { core::ptr::copy(src as *const u8, dst as *mut u8, n as usize) };
    if undefined_source {
        definedness::copy_short(src, dst, n);
    } else {
        definedness::make_defined(dst, n);
    }
    Tried::done(dst)
}

/// The first index below `n` where `[a, a + n)` and `[b, b + n)` differ.
///
/// # Safety
/// Reads the program's memory (a fault declines the try): at most the word holding the
/// first difference beyond it.
unsafe fn first_difference(a: u64, b: u64, n: u64) -> Option<u64> {
    let mut i = 0;
    while n - i >= 8 {
        // SAFETY: the caller's contract.
        let (x, y) = unsafe {
            (
                core::ptr::read_unaligned((a + i) as *const u64),
                core::ptr::read_unaligned((b + i) as *const u64),
            )
        };
        if x != y {
            return Some(i + ((x ^ y).trailing_zeros() / 8) as u64);
        }
        i += 8;
    }
    while i < n {
        // SAFETY: the caller's contract.
        let (x, y) = unsafe { (*((a + i) as *const u8), *((b + i) as *const u8)) };
        if x != y {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// `replace.c`'s `memcmp` (also `bcmp`'s), done natively when it would report nothing.
///
/// # Safety
/// As [`try_memmove`].
pub(super) unsafe extern "C" fn try_memcmp(
    a: u64,
    b: u64,
    n: u64,
    _: u64,
    _: u64,
    _: u64,
) -> Tried {
    // SAFETY (all): the caller's contract: this is a try function.
    if !unsafe { arguments_defined(3) } {
        return Tried::DECLINED;
    }
    if n == 0 {
        return Tried::done(0);
    }
    // SAFETY: reads of the program's memory up to the first difference's word; a fault
    // declines.
    let k = unsafe { first_difference(a, b, n) };
    // What the loop reads: with both sides 8-aligned, whole words up to the one holding the
    // first difference (whose bytes it then compares from registers); then, or otherwise,
    // bytes up to the first difference; all `n` bytes when there is none.
    let words = (a | b) & 7 == 0;
    let read = match k {
        Some(k) if words && (k & !7) + 8 <= n => (k & !7) + 8,
        Some(k) => k + 1,
        None => n,
    };
    if !unsafe { unprobed(a, read) && unprobed(b, read) } {
        return Tried::DECLINED;
    }
    if !definedness::range_defined(a, read) || !definedness::range_defined(b, read) {
        return Tried::DECLINED;
    }
    let result = match k {
        // SAFETY: bytes read above.
        Some(k) => unsafe { *((a + k) as *const u8) as i32 - *((b + k) as *const u8) as i32 },
        None => 0,
    };
    Tried::done(result as u32 as u64)
}

/// `0x80` in each byte of `x` that is zero, and possibly in bytes above the first zero one
/// (a borrow): the lowest one marked is exactly the first zero byte.
#[inline(always)]
fn zero_bytes(x: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    x.wrapping_sub(ONES) & !x & (ONES << 7)
}

/// The index from `s` of the first byte that is 0 or `c` (`stop_at_c`), or `max` when there
/// is none before it, reading aligned words: each word holds a byte the byte loop reads too
/// (the first from `s` on, or one before the stop and `max`), so a fault here is one the
/// loop meets on the same page.
///
/// # Safety
/// Reads the program's memory (a fault declines the try).
#[inline(always)]
unsafe fn first_stop(s: u64, c: u8, stop_at_c: bool, max: u64) -> u64 {
    let cc = 0x0101_0101_0101_0101u64 * c as u64;
    let mut a = s & !7;
    // The bytes before `s` in its word never stop.
    let mut keep = u64::MAX << (8 * (s - a) as u32);
    while a.wrapping_sub(s) < max || a < s {
        // SAFETY: an aligned word within one page holding a byte the loop reads.
        let x = unsafe { core::ptr::read_volatile(a as *const u64) };
        let mut t = zero_bytes(x);
        if stop_at_c {
            t |= zero_bytes(x ^ cc);
        }
        t &= keep;
        if t != 0 {
            return (a + (t.trailing_zeros() / 8) as u64 - s).min(max);
        }
        keep = u64::MAX;
        a += 8;
    }
    max
}

/// Whether the byte loop of a replacement reading `[s, s + n)`, branching on every byte,
/// reports nothing: addressable, unprobed and defined.
///
/// # Safety
/// Only from a try function.
#[inline(always)]
unsafe fn clean_read(s: u64, n: u64) -> bool {
    // SAFETY: the caller's contract.
    (unsafe { unprobed(s, n) }) && definedness::range_defined(s, n)
}

/// `replace.c`'s `strlen`, done natively when it would report nothing: every byte up to and
/// including the terminator is read and branched on.
///
/// # Safety
/// As [`try_memmove`].
pub(super) unsafe extern "C" fn try_strlen(
    s: u64,
    _: u64,
    _: u64,
    _: u64,
    _: u64,
    _: u64,
) -> Tried {
    // SAFETY (all): the caller's contract: this is a try function.
    if !unsafe { arguments_defined(1) } {
        return Tried::DECLINED;
    }
    let k = unsafe { first_stop(s, 0, false, u64::MAX) };
    if !unsafe { clean_read(s, k + 1) } {
        return Tried::DECLINED;
    }
    Tried::done(k)
}

/// `replace.c`'s `strchrnul`, done natively when it would report nothing: every byte up to
/// the first that is 0 or `c` is read and branched on.
///
/// # Safety
/// As [`try_memmove`].
pub(super) unsafe extern "C" fn try_strchrnul(
    s: u64,
    c: u64,
    _: u64,
    _: u64,
    _: u64,
    _: u64,
) -> Tried {
    // SAFETY (all): the caller's contract: this is a try function.
    if !unsafe { arguments_defined(2) } {
        return Tried::DECLINED;
    }
    let k = unsafe { first_stop(s, c as u8, true, u64::MAX) };
    if !unsafe { clean_read(s, k + 1) } {
        return Tried::DECLINED;
    }
    Tried::done(s + k)
}

/// `replace.c`'s `index` (`strchr`), done natively when it would report nothing: as
/// [`try_strchrnul`], whose stop byte it returns when it is `c`, else null.
///
/// # Safety
/// As [`try_memmove`].
pub(super) unsafe extern "C" fn try_index(s: u64, c: u64, _: u64, _: u64, _: u64, _: u64) -> Tried {
    // SAFETY (all): the caller's contract: this is a try function.
    if !unsafe { arguments_defined(2) } {
        return Tried::DECLINED;
    }
    let k = unsafe { first_stop(s, c as u8, true, u64::MAX) };
    if !unsafe { clean_read(s, k + 1) } {
        return Tried::DECLINED;
    }
    // SAFETY: read above.
    let stop = unsafe { *((s + k) as *const u8) };
    Tried::done(if stop == c as u8 { s + k } else { 0 })
}

/// `replace.c`'s `strncpy`, done natively when it would report nothing: it reads and
/// branches on the source's bytes up to its terminator or `n`, writes `n` bytes (the rest
/// zeros) and reports an overlap of the two ranges (declined here).
///
/// # Safety
/// As [`try_memmove`]. A fault stops it half way (ranges that do not overlap): the loop
/// then writes the same bytes again.
pub(super) unsafe extern "C" fn try_strncpy(
    dst: u64,
    src: u64,
    n: u64,
    _: u64,
    _: u64,
    _: u64,
) -> Tried {
    // SAFETY (all): the caller's contract: this is a try function.
    if !unsafe { arguments_defined(3) } {
        return Tried::DECLINED;
    }
    let m = unsafe { first_stop(src, 0, false, n) };
    let read = if m < n { m + 1 } else { n };
    // `replace.c`'s `overlaps(d0, s0, n, read)`.
    let overlap = n != 0 && read != 0 && src < dst.wrapping_add(n) && dst < src.wrapping_add(read);
    if overlap || !unsafe { clean_read(src, read) && unprobed(dst, n) } {
        return Tried::DECLINED;
    }
    // SAFETY: the program's ranges, apart, which the loop would copy and fill the same way.
    unsafe {
        core::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, m as usize);
        core::ptr::write_bytes((dst + m) as *mut u8, 0, (n - m) as usize);
    }
    definedness::make_defined(dst, n);
    Tried::done(dst)
}
