//! How the V bits of memory are laid out in a span's shadow chunk: the one place for the
//! rule. Everything in Rust that reads or writes a chunk's bytes goes through here (the
//! interpreter's loads and stores, `set`, `first_undefined`, `copy`, the residency module's
//! undefined file and page release), and the primary entry's meaning, which the inline
//! forms' address arithmetic depends on, is here too. The other half of the rule is the
//! inline forms' code (`translate::definedness`: checks, zeroing, load and store copies,
//! the new stack's marking), which asserts [`MEMORY_BYTES_PER_SHADOW_BYTE`] at compile
//! time, so that a change of encoding here cannot build without them.
//!
//! The encoding today: one shadow byte per byte of memory, bit i for bit i of the byte (1 =
//! undefined). Whatever the encoding, two things hold and the rest of the engine relies on
//! them: a shadow of all zero bytes is all defined (so a chunk's untouched pages, and pages
//! given back to the kernel, read as defined), and a shadow of all `0xff` bytes is all
//! undefined (the residency module's undefined file). The compact encoding this is meant to
//! make room for (2 bits per byte, `docs/definedness.md`, "Memory cost") keeps both.

use core::sync::atomic::Ordering;

/// A span: the memory one chunk shadows, and one primary entry's worth.
pub(super) const SPAN_BITS: u32 = 16;
pub(super) const SPAN: u64 = 1 << SPAN_BITS;
/// How many bytes of memory one byte of shadow covers.
pub(crate) const MEMORY_BYTES_PER_SHADOW_BYTE: u64 = 1;
/// The bytes of shadow a span's chunk takes (the pool's unit).
pub(super) const CHUNK_BYTES: u64 = SPAN / MEMORY_BYTES_PER_SHADOW_BYTE;
/// A shadow byte of an all-undefined stretch.
pub(super) const UNDEFINED_FILL: u8 = 0xff;
const _: () = assert!(
    MEMORY_BYTES_PER_SHADOW_BYTE == 1,
    "the functions below read a byte per byte"
);

/// A primary entry holds its span's chunk minus the span's address (wrapping), 0 when the
/// span has none: the inline fast path reaches an address's shadow byte as the address
/// plus its entry, without masking the offset in the span out (`translate::definedness`).
/// (A chunk handed out for the span of its own addresses would read as none: only the
/// program writing into our reserved, not yet handed out pool could ask for that.)
pub(super) fn entry_value(chunk: u64, addr: u64) -> u64 {
    chunk.wrapping_sub(addr & !(SPAN - 1))
}

/// The chunk an entry's value `v` names for `addr` (see [`entry_value`]).
pub(super) fn chunk_from_entry(v: u64, addr: u64) -> u64 {
    if v == 0 {
        0
    } else {
        v.wrapping_add(addr & !(SPAN - 1))
    }
}

/// The shadow bytes, as offsets in the chunk, that hold the V bits of span offsets
/// `[off, off + n)` and of no other byte: what `set` may fill whole or give back to the
/// kernel.
pub(super) fn covered(off: usize, n: usize) -> (usize, usize) {
    (off, off + n)
}

/// The span offset of the first byte whose V bits a chunk offset holds (the inverse of
/// [`covered`] at its ends).
pub(super) fn span_offset(shadow_off: usize) -> usize {
    shadow_off
}

/// Marks span offsets `[off, off + n)` of `chunk` defined or undefined.
///
/// # Safety
/// `chunk` is a chunk of the pool (`CHUNK_BYTES` writable bytes); `off + n <= SPAN`.
pub(super) unsafe fn fill(chunk: u64, off: usize, n: usize, defined: bool) {
    let (first, last) = covered(off, n);
    let byte = if defined { 0 } else { UNDEFINED_FILL };
    // SAFETY: the caller's contract; [first, last) lies in the chunk.
    unsafe { super::fill((chunk + first as u64) as *mut u8, byte, last - first) };
}

/// Reads the V bits of span offsets `[off, off + out.len())` of `chunk` into `out`, one
/// byte per byte (the interpreter's `ShadowMemory` form).
///
/// # Safety
/// As [`fill`], with `n = out.len()`.
pub(super) unsafe fn load(chunk: u64, off: usize, out: &mut [u8]) {
    // SAFETY: the caller's contract.
    let src = unsafe { core::slice::from_raw_parts((chunk as *const u8).add(off), out.len()) };
    out.copy_from_slice(src);
}

/// Writes the V bits `shadow` (one byte per byte) at span offsets `[off, off +
/// shadow.len())` of `chunk`.
///
/// # Safety
/// As [`fill`], with `n = shadow.len()`.
pub(super) unsafe fn store(chunk: u64, off: usize, shadow: &[u8]) {
    // SAFETY: the caller's contract.
    let dst = unsafe { core::slice::from_raw_parts_mut((chunk as *mut u8).add(off), shadow.len()) };
    dst.copy_from_slice(shadow);
}

/// The first span offset in `[off, off + n)` of `chunk` with an undefined bit, as an index
/// from `off`.
///
/// Read a word at a time, four words a turn while they are all zero: the ranges asked
/// about (a native try's copied or compared bytes, `range_defined` past 32 bytes) are
/// nearly always all defined, and a byte loop was a turn per byte (0.4% of sqlite3's
/// samples under Memcheck, in the compare of one byte).
///
/// # Safety
/// As [`fill`].
pub(super) unsafe fn first_undefined(chunk: u64, off: usize, n: usize) -> Option<usize> {
    let p = chunk + off as u64;
    // SAFETY (every load): within `[p, p + n)`, inside the chunk by the caller's contract;
    // unaligned loads.
    let word = |i: usize| unsafe { core::ptr::read_unaligned((p + i as u64) as *const u64) };
    let mut i = 0;
    while n - i >= 32 {
        if word(i) | word(i + 8) | word(i + 16) | word(i + 24) != 0 {
            break;
        }
        i += 32;
    }
    while n - i >= 8 {
        let w = word(i);
        if w != 0 {
            // Little-endian: the lowest nonzero byte of the word is the first in memory.
            return Some(i + (w.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    // SAFETY: as above, the tail's bytes.
    (i..n).find(|&k| unsafe { *((p + k as u64) as *const u8) } != 0)
}

/// Whether the `n` shadow bytes at `p` (1 to 32) are all defined: at most four loads,
/// overlapping, where a byte loop would take `n` turns.
///
/// # Safety
/// `[p, p + n)` lies in one chunk of the pool; `1 <= n <= 32`.
#[inline(always)]
pub(super) unsafe fn short_all_defined(p: u64, n: usize) -> bool {
    let end = p + n as u64;
    // SAFETY (every load): within `[p, p + n)`, the caller's contract; unaligned loads.
    unsafe {
        let word = |at: u64| core::ptr::read_unaligned(at as *const u64);
        if n >= 8 {
            let mut acc = word(p) | word(end - 8);
            if n > 16 {
                acc |= word(p + 8) | word(end - 16);
            }
            return acc == 0;
        }
        if n >= 4 {
            let half = |at: u64| core::ptr::read_unaligned(at as *const u32);
            return half(p) | half(end - 4) == 0;
        }
        (*(p as *const u8) | *((p + (n as u64 >> 1)) as *const u8) | *((end - 1) as *const u8)) == 0
    }
}

/// Marks the `n` shadow bytes at `p` defined (1 to 32, as [`short_all_defined`]).
///
/// # Safety
/// As [`short_all_defined`], and the chunk is writable.
#[inline(always)]
pub(super) unsafe fn short_fill_defined(p: u64, n: usize) {
    let end = p + n as u64;
    // SAFETY (every store): within `[p, p + n)`, the caller's contract; unaligned stores,
    // volatile so that they never become a call to `memset` (the program's, translated,
    // when this runs in the runtime's translated code).
    unsafe {
        let word = |at: u64| core::ptr::write_volatile(at as *mut [u8; 8], [0; 8]);
        if n >= 8 {
            word(p);
            word(end - 8);
            if n > 16 {
                word(p + 8);
                word(end - 16);
            }
            return;
        }
        if n >= 4 {
            core::ptr::write_volatile(p as *mut [u8; 4], [0; 4]);
            core::ptr::write_volatile((end - 4) as *mut [u8; 4], [0; 4]);
            return;
        }
        core::ptr::write_volatile(p as *mut u8, 0);
        core::ptr::write_volatile((p + (n as u64 >> 1)) as *mut u8, 0);
        core::ptr::write_volatile((end - 1) as *mut u8, 0);
    }
}

/// Whether the V bits `shadow` (one byte per byte) are all defined: a store of them needs
/// no chunk where there is none.
pub(super) fn all_defined(shadow: &[u8]) -> bool {
    shadow.iter().all(|&b| b == 0)
}

/// A fresh chunk from the pool `[next, end)` (its pages untouched: all defined), or
/// `None` when the pool is used up.
pub(super) fn new_chunk(next: &core::sync::atomic::AtomicU64, end: u64) -> Option<u64> {
    let fresh = next.fetch_add(CHUNK_BYTES, Ordering::AcqRel);
    (fresh + CHUNK_BYTES <= end).then_some(fresh)
}

#[cfg(test)]
mod tests {
    use super::first_undefined;

    /// The word-at-a-time search finds the same byte as a byte loop, for every length and
    /// start up to a few words, with the first undefined byte anywhere (or nowhere) and
    /// undefined bytes after it.
    #[test]
    fn first_undefined_finds_the_first_nonzero_byte() {
        let mut buf = [0u8; 160];
        for off in 0..9 {
            for n in 0..100 {
                for first in (0..n).map(Some).chain([None]) {
                    buf.fill(0);
                    if let Some(f) = first {
                        buf[off + f] = 0x10;
                        // Bytes after the first one, in the same word and further on.
                        buf[off + n - 1] |= 0x01;
                        buf[(off + f + 3).min(off + n - 1)] = 0x80;
                    }
                    // Outside the range: never reported.
                    buf[off + n] = 0xff;
                    if off > 0 {
                        buf[off - 1] = 0xff;
                    }
                    // SAFETY: `[off, off + n)` lies in `buf`.
                    let got = unsafe { first_undefined(buf.as_ptr() as u64, off, n) };
                    assert_eq!(got, first, "off {off} n {n}");
                }
            }
        }
    }
}
