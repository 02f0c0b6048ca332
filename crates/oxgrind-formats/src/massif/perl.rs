//! Just enough of Perl 5's number semantics to print what `/usr/bin/ms_print` prints.
//!
//! ms_print is a Perl script, and its output depends on how Perl 5.36 (x86-64, 64-bit IV,
//! double NV) computes: `+`, `*` and `int` stay exact integers while the result fits an IV/UV
//! and fall back to doubles otherwise; `/` is floating point except when an operand is too big
//! for a double to hold exactly and the quotient is an exact integer; comparisons are exact
//! between integers; a double is stringified as `%.15g`. These only matter for huge values
//! (beyond 2^53), but the renderer promises byte-identical output, so they are modelled here
//! rather than approximated with `f64` everywhere. Perl's behaviour was checked with
//! `Devel::Peek` on this machine; the tests compare against the real ms_print.

use alloc::string::String;
use alloc::vec::Vec;
use core::cmp::Ordering;

const IV_MIN: i128 = i64::MIN as i128;
const UV_MAX: i128 = u64::MAX as i128;
/// `1 << NV_PRESERVES_UV_BITS`: integers a double holds exactly.
const PRESERVED: i128 = 1 << 53;

/// `f64::trunc`, which `core` lacks: doubles of magnitude 2^52 or more are already integral,
/// the others fit an `i64`.
fn trunc(f: f64) -> f64 {
    if !f.is_finite() || f.abs() >= 4_503_599_627_370_496.0 {
        f
    } else {
        (f as i64) as f64
    }
}

/// A Perl numeric value: an integer (IV or UV, so the range is `i64::MIN..=u64::MAX`) or a
/// double (NV).
#[derive(Copy, Clone, Debug, PartialEq)]
pub(crate) enum PerlNum {
    Int(i128),
    Num(f64),
}

use PerlNum::{Int, Num};

impl PerlNum {
    /// The value as an integer if Perl would treat it as one (`SvIV_please`): integers, and
    /// doubles that are integral and below 2^53 in magnitude.
    fn int_like(self) -> Option<i128> {
        match self {
            Int(i) => Some(i),
            Num(f) => {
                if f.is_finite() && trunc(f) == f && f.abs() < PRESERVED as f64 {
                    Some(f as i128)
                } else {
                    None
                }
            }
        }
    }

    pub(crate) fn to_f64(self) -> f64 {
        match self {
            Int(i) => i as f64,
            Num(f) => f,
        }
    }

    fn from_exact(r: i128) -> Option<PerlNum> {
        (IV_MIN..=UV_MAX).contains(&r).then_some(Int(r))
    }

    /// `a + b` (pp_add).
    pub(crate) fn add(self, other: PerlNum) -> PerlNum {
        if let (Some(a), Some(b)) = (self.int_like(), other.int_like()) {
            if let Some(r) = a.checked_add(b).and_then(PerlNum::from_exact) {
                return r;
            }
        }
        Num(self.to_f64() + other.to_f64())
    }

    /// `a * b` (pp_multiply).
    pub(crate) fn mul(self, other: PerlNum) -> PerlNum {
        if let (Some(a), Some(b)) = (self.int_like(), other.int_like()) {
            if let Some(r) = a.checked_mul(b).and_then(PerlNum::from_exact) {
                return r;
            }
        }
        Num(self.to_f64() * other.to_f64())
    }

    /// `a / b` (pp_divide with PERL_TRY_UV_DIVIDE); `None` is Perl's "Illegal division by
    /// zero".
    pub(crate) fn div(self, other: PerlNum) -> Option<PerlNum> {
        if let (Some(a), Some(b)) = (self.int_like(), other.int_like()) {
            if b == 0 {
                return None;
            }
            let (ua, ub) = (a.unsigned_abs(), b.unsigned_abs());
            if ua >= ub && ua > PRESERVED as u128 && ua % ub == 0 {
                let q = (ua / ub) as i128;
                let q = if (a < 0) != (b < 0) { -q } else { q };
                return Some(PerlNum::from_exact(q).unwrap_or(Num(q as f64)));
            }
        }
        let d = other.to_f64();
        if d == 0.0 {
            return None;
        }
        Some(Num(self.to_f64() / d))
    }

    /// `int(a)` (pp_int).
    pub(crate) fn int(self) -> PerlNum {
        if let Some(i) = self.int_like() {
            return Int(i);
        }
        let v = self.to_f64();
        if v.is_nan() || v.is_infinite() {
            Num(v)
        } else if v >= 0.0 {
            if v < u64::MAX as f64 {
                Int(trunc(v) as i128)
            } else {
                // floor(v): a double this big is integral.
                Num(v)
            }
        } else if v > i64::MIN as f64 {
            Int(trunc(v) as i128)
        } else {
            // ceil(v): integral as well.
            Num(v)
        }
    }

    /// Numeric comparison (`<=>`); `None` when a NaN is involved.
    pub(crate) fn cmp(self, other: PerlNum) -> Option<Ordering> {
        if let (Some(a), Some(b)) = (self.int_like(), other.int_like()) {
            return Some(a.cmp(&b));
        }
        self.to_f64().partial_cmp(&other.to_f64())
    }

    pub(crate) fn ge(self, other: PerlNum) -> bool {
        matches!(self.cmp(other), Some(Ordering::Greater | Ordering::Equal))
    }
    pub(crate) fn gt(self, other: PerlNum) -> bool {
        matches!(self.cmp(other), Some(Ordering::Greater))
    }
    pub(crate) fn lt(self, other: PerlNum) -> bool {
        matches!(self.cmp(other), Some(Ordering::Less))
    }
    pub(crate) fn eq(self, other: PerlNum) -> bool {
        matches!(self.cmp(other), Some(Ordering::Equal))
    }
    /// Perl truthiness of a number.
    pub(crate) fn is_true(self) -> bool {
        match self {
            Int(i) => i != 0,
            Num(f) => f != 0.0,
        }
    }

    /// The value as an array index (`SvIV`): doubles truncate and saturate.
    pub(crate) fn to_index(self) -> i128 {
        match self {
            Int(i) => i,
            Num(f) if f.is_nan() => 0,
            Num(f) => trunc(f).clamp(i64::MIN as f64, u64::MAX as f64) as i128,
        }
    }

    /// Perl's stringification: integers in decimal, doubles with `%.15g`.
    pub(crate) fn to_perl_string(self) -> String {
        match self {
            Int(i) => alloc::format!("{i}"),
            Num(f) => fmt_g15(f),
        }
    }
}

/// Perl's `isSPACE` on bytes (no locale, no UTF-8): `\s` in ms_print's regexes.
pub(crate) fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// Perl's numification of a string, as `grok_number` then `Atof` do it: optional leading
/// whitespace, sign, digits with an optional fraction and exponent, optional trailing
/// whitespace. Returns the value of the longest numeric prefix (0 if none, as Perl does with
/// a warning) and whether the whole string looked like a number (no warning).
pub(crate) fn numify(s: &[u8]) -> (PerlNum, bool) {
    let mut i = 0;
    while i < s.len() && is_space(s[i]) {
        i += 1;
    }
    let start = i;
    if i < s.len() && (s[i] == b'+' || s[i] == b'-') {
        i += 1;
    }
    let int_start = i;
    while i < s.len() && s[i].is_ascii_digit() {
        i += 1;
    }
    let int_digits = i - int_start;
    let mut frac_digits = 0;
    let mut is_int = true;
    if i < s.len() && s[i] == b'.' {
        let dot = i;
        i += 1;
        while i < s.len() && s[i].is_ascii_digit() {
            i += 1;
        }
        frac_digits = i - dot - 1;
        if int_digits == 0 && frac_digits == 0 {
            i = dot;
        } else {
            is_int = false;
        }
    }
    if int_digits == 0 && frac_digits == 0 {
        return (Int(0), false);
    }
    if i < s.len() && (s[i] == b'e' || s[i] == b'E') {
        let mut j = i + 1;
        if j < s.len() && (s[j] == b'+' || s[j] == b'-') {
            j += 1;
        }
        let exp_start = j;
        while j < s.len() && s[j].is_ascii_digit() {
            j += 1;
        }
        if j > exp_start {
            i = j;
            is_int = false;
        }
    }
    let end = i;
    while i < s.len() && is_space(s[i]) {
        i += 1;
    }
    let whole = i == s.len();
    // The slice holds only ASCII sign, digits, '.', 'e'.
    let text = core::str::from_utf8(&s[start..end]).unwrap_or("0");
    let value = if is_int {
        match text.parse::<i128>().ok().and_then(PerlNum::from_exact) {
            Some(v) => v,
            None => Num(text.parse::<f64>().unwrap_or(0.0)),
        }
    } else {
        Num(text.parse::<f64>().unwrap_or(0.0))
    };
    (value, whole)
}

/// ms_print's `commify`: `1 while s/^(\d+)(\d{3})/$1,$2/`, i.e. commas in the run of digits
/// the string starts with; anything else (a sign, a fraction, spaces) is left alone.
pub(crate) fn commify(s: &[u8]) -> Vec<u8> {
    let run = s.iter().take_while(|b| b.is_ascii_digit()).count();
    let mut out = Vec::with_capacity(s.len() + run / 3);
    for (i, &b) in s[..run].iter().enumerate() {
        if i > 0 && (run - i) % 3 == 0 {
            out.push(b',');
        }
        out.push(b);
    }
    out.extend_from_slice(&s[run..]);
    out
}

/// C's `%.15g`, which Perl uses to stringify doubles (NV_DIG is 15), with Perl's spelling of
/// infinities and NaN.
pub(crate) fn fmt_g15(f: f64) -> String {
    if f.is_nan() {
        return String::from("NaN");
    }
    if f.is_infinite() {
        return String::from(if f < 0.0 { "-Inf" } else { "Inf" });
    }
    if f == 0.0 {
        // Perl special-cases zero (also -0.0) as "0".
        return String::from("0");
    }
    const P: i32 = 15;
    let sci = alloc::format!("{:.*e}", (P - 1) as usize, f);
    let (mantissa, exp) = match sci.split_once('e') {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (sci.as_str(), 0),
    };
    if !(-4..P).contains(&exp) {
        let m = trim_fraction_zeros(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        alloc::format!("{m}e{sign}{:02}", exp.unsigned_abs())
    } else {
        let decimals = (P - 1 - exp) as usize;
        let fixed = alloc::format!("{:.*}", decimals, f);
        String::from(trim_fraction_zeros(&fixed))
    }
}

fn trim_fraction_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// C's `%W.Pf` on a Perl number, with Perl's `Inf`/`NaN`.
pub(crate) fn fmt_f(n: PerlNum, width: usize, precision: usize, zero_pad: bool) -> String {
    let f = n.to_f64();
    if !f.is_finite() {
        let s = if f.is_nan() {
            "NaN"
        } else if f < 0.0 {
            "-Inf"
        } else {
            "Inf"
        };
        return alloc::format!("{s:>width$}");
    }
    if zero_pad {
        alloc::format!("{f:0width$.precision$}")
    } else {
        alloc::format!("{f:width$.precision$}")
    }
}

/// C's `%Wd` on a Perl number (doubles truncate toward zero).
pub(crate) fn fmt_d(n: PerlNum, width: usize) -> String {
    let i = match n {
        Int(i) => i,
        Num(f) if f.is_nan() => 0,
        Num(f) => trunc(f).clamp(i64::MIN as f64, u64::MAX as f64) as i128,
    };
    alloc::format!("{i:width$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_stringify_like_perl_percent_15g() {
        assert_eq!(fmt_g15(18446744073709551616.0), "1.84467440737096e+19");
        assert_eq!(fmt_g15(1e20), "1e+20");
        assert_eq!(fmt_g15(0.5), "0.5");
        assert_eq!(fmt_g15(123456789012345.0), "123456789012345");
        assert_eq!(fmt_g15(1e15), "1e+15");
        assert_eq!(fmt_g15(0.0001), "0.0001");
        assert_eq!(fmt_g15(0.00001), "1e-05");
        assert_eq!(fmt_g15(-2.5), "-2.5");
    }

    #[test]
    fn integer_arithmetic_falls_back_to_doubles_on_overflow() {
        let max = Int(u64::MAX as i128);
        assert_eq!(max.add(Int(0)), max);
        assert_eq!(max.add(Int(1)), Num(18446744073709551616.0));
        assert_eq!(Int(100).mul(Int(3)), Int(300));
        assert!(matches!(max.mul(Int(100)), Num(_)));
    }

    #[test]
    fn division_is_exact_only_for_big_exact_quotients() {
        assert_eq!(Int(1 << 60).div(Int(1024)), Some(Int(1 << 50)));
        assert_eq!(Int(10).div(Int(4)), Some(Num(2.5)));
        assert_eq!(Int(20).div(Int(5)), Some(Num(4.0)));
        assert_eq!(Int(1).div(Int(0)), None);
    }

    #[test]
    fn numify_takes_the_numeric_prefix() {
        assert_eq!(numify(b" 12 "), (Int(12), true));
        assert_eq!(numify(b"1.2.3"), (Num(1.2), false));
        assert_eq!(numify(b"."), (Int(0), false));
        assert_eq!(numify(b"abc"), (Int(0), false));
        assert_eq!(numify(b"5."), (Num(5.0), true));
        assert_eq!(numify(b"1e3"), (Num(1000.0), true));
        assert_eq!(numify(b"99999999999999999999"), (Num(1e20), true));
    }

    #[test]
    fn commify_only_touches_the_leading_digit_run() {
        assert_eq!(commify(b"1234567"), b"1,234,567");
        assert_eq!(commify(b"-1234"), b"-1234");
        assert_eq!(commify(b"12345  "), b"12,345  ");
        assert_eq!(commify(b"1.84467440737096e+19"), b"1.84467440737096e+19");
        assert_eq!(commify(b""), b"");
    }

    /// Expected strings are Perl's `printf("%05.2f")` on this machine (not bash's printf,
    /// which uses long double).
    #[test]
    fn fixed_point_rounds_the_exact_binary_value() {
        for (v, s) in [
            (0.125, "00.12"),
            (2.675, "02.67"),
            (0.375, "00.38"),
            (1.005, "01.00"),
            (99.995, "100.00"), // the double is 99.99500000000000454...
            (99.985, "99.98"),  // the double is 99.98499999999999943...
            (0.005, "00.01"),
            (100.0, "100.00"),
        ] {
            assert_eq!(fmt_f(Num(v), 5, 2, true), s, "{v}");
        }
    }
}
