//! Memcheck's definedness algebra on scalars of 8 to 64 bits.
//!
//! A value travels with its shadow: one V bit per bit, 1 = undefined (Memcheck's
//! convention). Every function here takes the real values as well as the shadows, because the
//! precise rules (Memcheck's "expensive" ones) look at the defined bits of the operands: a
//! defined 0 decides an `and`, a defined carry chain decides an `add`. The value bits at
//! undefined positions are arbitrary, and no rule may depend on them in a way that changes a
//! bit it calls defined: that is what the brute-force oracle in `tests/` checks.
//!
//! The names follow `memcheck/mc_translate.c` (UifU, DifD, PCast, Left, ImproveAND/OR,
//! expensiveAddSub, expensiveCmpEQorNE, expensiveCountTrailingZeroes); the formulas are
//! written from the paper and the comments there, not copied.
//!
//! Widths are in bits and always one of 8, 16, 32, 64; results are truncated to the width.

/// All ones in the low `width` bits.
#[inline]
pub const fn mask(width: u32) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    }
}

/// Shift left that gives 0 for amounts of 64 and more (Rust's `<<` panics in debug builds).
#[inline]
pub const fn shl(x: u64, n: u32) -> u64 {
    if n >= 64 {
        0
    } else {
        x << n
    }
}

/// Logical shift right that gives 0 for amounts of 64 and more.
#[inline]
pub const fn shr(x: u64, n: u32) -> u64 {
    if n >= 64 {
        0
    } else {
        x >> n
    }
}

/// Sign-extends the low `width` bits of `x` to 64 bits.
#[inline]
pub const fn sext(x: u64, width: u32) -> u64 {
    if width >= 64 || width == 0 {
        x
    } else {
        let s = 64 - width;
        (((x << s) as i64) >> s) as u64
    }
}

/// The sign bit of a `width`-bit quantity.
#[inline]
pub const fn sign_bit(width: u32) -> u64 {
    shl(1, width.saturating_sub(1))
}

/// PCast: every bit undefined if any bit is (the pessimistic cast).
#[inline]
pub const fn pcast(v: u64, width: u32) -> u64 {
    if v & mask(width) != 0 {
        mask(width)
    } else {
        0
    }
}

/// Left: undefinedness smeared from the lowest undefined bit upwards (`v | -v`). The
/// cheap rule for add, sub and mul: bit i of a sum depends on bits 0..=i of the inputs only.
#[inline]
pub const fn left(v: u64, width: u32) -> u64 {
    (v | v.wrapping_neg()) & mask(width)
}

/// `and`: UifU improved by defined zeros. A result bit is defined if both inputs are defined
/// there, or if either input is a defined 0 there (`mkImproveAND`: `data | vbits` is 0 only
/// at a defined 0).
#[inline]
pub const fn and(a: u64, va: u64, b: u64, vb: u64) -> u64 {
    (va | vb) & (a | va) & (b | vb)
}

/// `or`: UifU improved by defined ones (`mkImproveOR`: `!data | vbits`).
#[inline]
pub const fn or(a: u64, va: u64, b: u64, vb: u64) -> u64 {
    (va | vb) & (!a | va) & (!b | vb)
}

/// `andn` as BMI1 and SSE's `pandn` compute it: `!a & b`.
#[inline]
pub const fn andn(a: u64, va: u64, b: u64, vb: u64) -> u64 {
    and(!a, va, b, vb)
}

/// Exact addition `a + b + carry_in` (`expensiveAddSub`, extended by the carry-in of
/// `adc`): the sums with every undefined bit forced to 0 and forced to 1 bound every
/// completion; a bit where they differ received an undefined carry. Undefined input bits
/// stay undefined. `vcarry` is the carry-in's V bit (0 or 1).
#[inline]
pub const fn add(a: u64, va: u64, b: u64, vb: u64, carry: u64, vcarry: u64, width: u32) -> u64 {
    let (a, b) = (a & mask(width), b & mask(width));
    let (va, vb) = (va & mask(width), vb & mask(width));
    let cmin = carry & !vcarry & 1;
    let cmax = (carry | vcarry) & 1;
    let lo = (a & !va).wrapping_add(b & !vb).wrapping_add(cmin);
    let hi = (a | va).wrapping_add(b | vb).wrapping_add(cmax);
    (va | vb | (lo ^ hi)) & mask(width)
}

/// Exact subtraction `a - b - borrow_in` (`expensiveAddSub`'s subtract case, extended by the
/// borrow of `sbb`): the smallest difference takes the smallest `a` and the largest `b`.
#[inline]
pub const fn sub(a: u64, va: u64, b: u64, vb: u64, borrow: u64, vborrow: u64, width: u32) -> u64 {
    let (a, b) = (a & mask(width), b & mask(width));
    let (va, vb) = (va & mask(width), vb & mask(width));
    let bmin = borrow & !vborrow & 1;
    let bmax = (borrow | vborrow) & 1;
    let lo = (a & !va).wrapping_sub(b | vb).wrapping_sub(bmax);
    let hi = (a | va).wrapping_sub(b & !vb).wrapping_sub(bmin);
    (va | vb | (lo ^ hi)) & mask(width)
}

/// Is `a == b` undefined? (`expensiveCmpEQorNE`.) The comparison is decided as soon as one
/// bit position holds defined, different bits in the two operands; otherwise it is defined
/// only if both operands are fully defined. This is exact, not just sound: without such a
/// position, the undefined bits can be completed both to equal and to different values.
#[inline]
pub const fn eq_undefined(a: u64, va: u64, b: u64, vb: u64, width: u32) -> bool {
    let m = mask(width);
    let naive = (va | vb) & m;
    if naive == 0 {
        return false;
    }
    let decided = !naive & (a ^ b) & m;
    decided == 0
}

/// Is `x == 0` undefined? Defined as soon as `x` has a defined 1 bit (`test r,r; jz`).
#[inline]
pub const fn zero_test_undefined(x: u64, vx: u64, width: u32) -> bool {
    eq_undefined(x, vx, 0, 0, width)
}

/// Is a count of trailing zeros (`bsf`, `tzcnt`, and `ZF` after `bsf`) undefined?
/// Only the bits up to and including the lowest set bit matter (`expensiveCountTrailingZeroes`:
/// the improver `x ^ (x - 1)` masks the rest). For a zero `x` every bit matters.
#[inline]
pub const fn ctz_undefined(x: u64, vx: u64, width: u32) -> bool {
    let x = x & mask(width);
    let improver = x ^ x.wrapping_sub(1);
    vx & improver & mask(width) != 0
}

/// Is a count of leading zeros (`bsr`, `lzcnt`) undefined? The mirror image of
/// [`ctz_undefined`] (`expensiveCountLeadingZeroes`): the bits from the top down to and
/// including the highest set bit matter.
#[inline]
pub const fn clz_undefined(x: u64, vx: u64, width: u32) -> bool {
    let x = x & mask(width);
    let mut right = x;
    right |= right >> 1;
    right |= right >> 2;
    right |= right >> 4;
    right |= right >> 8;
    right |= right >> 16;
    right |= right >> 32;
    let improver = !(right >> 1) & mask(width);
    vx & improver != 0
}

/// The shadow of `x << n` for a defined `n` (already masked as the instruction masks it).
#[inline]
pub const fn shl_shadow(vx: u64, n: u32, width: u32) -> u64 {
    shl(vx, n) & mask(width)
}

/// The shadow of `x >> n` (logical) for a defined `n`.
#[inline]
pub const fn shr_shadow(vx: u64, n: u32, width: u32) -> u64 {
    shr(vx & mask(width), n)
}

/// The shadow of `x >> n` (arithmetic): the sign bit's V bit is copied into the vacated bits,
/// as the sign bit itself is.
#[inline]
pub const fn sar_shadow(vx: u64, n: u32, width: u32) -> u64 {
    let s = sext(vx & mask(width), width) as i64;
    let n = if n > 63 { 63 } else { n };
    ((s >> n) as u64) & mask(width)
}

/// Rotate left within `width` bits (also used for shadows: a rotate moves V bits with
/// their bits).
#[inline]
pub const fn rol(x: u64, n: u32, width: u32) -> u64 {
    let x = x & mask(width);
    let n = n % width;
    if n == 0 {
        x
    } else {
        (shl(x, n) | shr(x, width - n)) & mask(width)
    }
}

/// Rotate right within `width` bits.
#[inline]
pub const fn ror(x: u64, n: u32, width: u32) -> u64 {
    let n = n % width;
    rol(x, (width - n) % width, width)
}

/// Byte swap of the low `width` bits (`bswap`, `movbe`).
#[inline]
pub const fn bswap(x: u64, width: u32) -> u64 {
    match width {
        16 => (x as u16).swap_bytes() as u64,
        32 => (x as u32).swap_bytes() as u64,
        64 => x.swap_bytes(),
        _ => x & mask(width),
    }
}

/// Helpers for vector registers: a vector value or shadow is up to 64 bytes, little endian,
/// lanes of 1, 2, 4 or 8 bytes.
pub mod lanes {
    /// A 512-bit register image (value or shadow).
    pub type Vec512 = [u8; 64];

    /// Reads lane `i` of `lane` bytes as an integer.
    #[inline]
    pub fn get(v: &Vec512, lane: usize, i: usize) -> u64 {
        let mut out = 0u64;
        let start = i * lane;
        for k in 0..lane.min(8) {
            if let Some(b) = v.get(start + k) {
                out |= (*b as u64) << (8 * k);
            }
        }
        out
    }

    /// Writes lane `i` of `lane` bytes.
    #[inline]
    pub fn set(v: &mut Vec512, lane: usize, i: usize, x: u64) {
        let start = i * lane;
        for k in 0..lane.min(8) {
            if let Some(b) = v.get_mut(start + k) {
                *b = (x >> (8 * k)) as u8;
            }
        }
    }

    /// Per-lane PCast of the first `bytes` bytes: a lane is all undefined if any of its bits is.
    #[inline]
    pub fn pcast(v: &Vec512, lane: usize, bytes: usize) -> Vec512 {
        let mut out = [0u8; 64];
        let lane = lane.max(1);
        let mut i = 0;
        while i < bytes.min(64) {
            let end = (i + lane).min(64);
            let any = v[i..end].iter().any(|b| *b != 0);
            if any {
                for b in &mut out[i..end] {
                    *b = 0xff;
                }
            }
            i += lane;
        }
        out
    }

    /// Bytewise OR (UifU) of two shadows.
    #[inline]
    pub fn uifu(a: &Vec512, b: &Vec512) -> Vec512 {
        let mut out = [0u8; 64];
        for i in 0..64 {
            out[i] = a[i] | b[i];
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcast_and_left_follow_memcheck() {
        assert_eq!(pcast(0, 32), 0);
        assert_eq!(pcast(0x100, 32), 0xffff_ffff);
        assert_eq!(pcast(0x100, 8), 0, "bits above the width are not looked at");
        assert_eq!(left(0b0100, 8), 0b1111_1100);
        assert_eq!(left(0, 64), 0);
    }

    #[test]
    fn and_with_defined_zero_is_defined() {
        // 0xUU & 0x0f: the high nibble is defined 0.
        assert_eq!(and(0x55, 0xff, 0x0f, 0), 0x0f);
        // 0xUU | 0xf0: the high nibble is defined 1.
        assert_eq!(or(0x55, 0xff, 0xf0, 0), 0x0f);
    }

    #[test]
    fn add_of_defined_low_bits_keeps_carry_defined() {
        // 0x10 + 0xU0 (undefined bits 4..7 of b) with defined low nibble: low nibble defined.
        assert_eq!(add(0x01, 0, 0x00, 0xf0, 0, 0, 8), 0xf0);
        // An undefined bit 0 with a defined 0 partner cannot carry into bit 1 when the
        // other operand has a 0 there ... but it can when the partner's bit 0 is 1.
        assert_eq!(add(0, 1, 0, 0, 0, 0, 8), 1);
        assert_eq!(add(0, 1, 1, 0, 0, 0, 8), 0b11);
    }

    #[test]
    fn equality_decided_by_one_defined_differing_bit() {
        assert!(!eq_undefined(0b10, 0b01, 0b00, 0, 8));
        assert!(eq_undefined(0b00, 0b01, 0b00, 0, 8));
        assert!(!eq_undefined(5, 0, 5, 0, 8));
    }

    #[test]
    fn ctz_ignores_bits_above_the_lowest_set_bit() {
        assert!(!ctz_undefined(0b1000, 0xf0, 8));
        assert!(ctz_undefined(0b1000, 0x04, 8));
        assert!(ctz_undefined(0, 0x80, 8), "zero input: all bits matter");
        assert!(!clz_undefined(0x10, 0x0f, 8));
        assert!(clz_undefined(0x10, 0x20, 8));
    }

    #[test]
    fn shifts_and_rotates_of_shadows() {
        assert_eq!(sar_shadow(0x80, 3, 8), 0xf0);
        assert_eq!(shr_shadow(0x80, 3, 8), 0x10);
        assert_eq!(rol(0x81, 1, 8), 0x03);
        assert_eq!(ror(0x81, 1, 8), 0xc0);
        assert_eq!(rol(5, 0, 64), 5);
    }
}
