//! Flag shadows: what each flag-writing instruction leaves in CF, PF, AF, ZF, SF and OF, and
//! which flags a condition code reads.
//!
//! VEX keeps the flags as a lazy thunk (operation, operands) and Memcheck's precision comes
//! from VEX rewriting "condition after operation" into a plain comparison
//! (`guest_amd64_helpers.c`, `guest_amd64_spechelper`): `cmp a,b; je` becomes `a == b`,
//! instrumented exactly; `cmp a,b; jl` becomes `a <s b`, instrumented pessimistically. We
//! compute one V bit per flag eagerly instead, choosing each so that a condition's V bit,
//! the OR of the flags it reads, is what Memcheck gives for the specialised pair:
//!
//! * ZF is exact: `a == b` for `sub`/`cmp` (`expensiveCmpEQorNE`), "result == 0" for
//!   everything else, from the exact result shadow (defined as soon as the result has a
//!   defined 1 bit).
//! * SF is the V bit of the result's sign bit (VEX specialises `S` after `sub`, `add` and the
//!   8, 16 and 32-bit logic operations to the sign bit of the result; after a 64-bit logic
//!   operation it is PCast, see [`logic`]).
//! * CF and OF after add and subtract are PCast of the operands: Memcheck's relational
//!   compares (`<u`, `<s`, `<=`) are pessimistic, and `b`, `l`, `le`, `be` read these.
//! * PF depends on the low byte of the result only: PCast of that byte.
//! * Flags the architecture leaves undefined get PCast of the inputs (a `pushf` could read
//!   them).

use iced_x86::ConditionCode;

use crate::algebra::{eq_undefined, pcast, sign_bit, zero_test_undefined};
use crate::state::FlagShadows;

const CF: u8 = FlagShadows::CF;
const PF: u8 = FlagShadows::PF;
const AF: u8 = FlagShadows::AF;
const ZF: u8 = FlagShadows::ZF;
const SF: u8 = FlagShadows::SF;
const OF: u8 = FlagShadows::OF;

#[inline]
fn bit(cond: bool, flag: u8) -> u8 {
    if cond {
        flag
    } else {
        0
    }
}

/// The flags a condition code reads.
pub(crate) fn read_by(cc: ConditionCode) -> u8 {
    match cc {
        ConditionCode::o | ConditionCode::no => OF,
        ConditionCode::b | ConditionCode::ae => CF,
        ConditionCode::e | ConditionCode::ne => ZF,
        ConditionCode::be | ConditionCode::a => CF | ZF,
        ConditionCode::s | ConditionCode::ns => SF,
        ConditionCode::p | ConditionCode::np => PF,
        ConditionCode::l | ConditionCode::ge => SF | OF,
        ConditionCode::le | ConditionCode::g => ZF | SF | OF,
        _ => FlagShadows::ALL,
    }
}

/// Is condition `cc` undefined under these flag shadows?
pub fn condition_undefined(cc: ConditionCode, flags: FlagShadows) -> bool {
    flags.any(read_by(cc))
}

/// Does condition `cc` hold for these RFLAGS (the real values)?
pub fn condition_holds(cc: ConditionCode, rflags: u64) -> bool {
    let f = |b: u32| rflags >> b & 1 != 0;
    let (cf, pf, zf, sf, of) = (f(0), f(2), f(6), f(7), f(11));
    match cc {
        ConditionCode::o => of,
        ConditionCode::no => !of,
        ConditionCode::b => cf,
        ConditionCode::ae => !cf,
        ConditionCode::e => zf,
        ConditionCode::ne => !zf,
        ConditionCode::be => cf || zf,
        ConditionCode::a => !cf && !zf,
        ConditionCode::s => sf,
        ConditionCode::ns => !sf,
        ConditionCode::p => pf,
        ConditionCode::np => !pf,
        ConditionCode::l => sf != of,
        ConditionCode::ge => sf == of,
        ConditionCode::le => zf || sf != of,
        ConditionCode::g => !zf && sf == of,
        _ => false,
    }
}

/// SF, ZF and PF from a result and its shadow (ZF exact).
fn szp(r: u64, vr: u64, w: u32) -> u8 {
    bit(vr & sign_bit(w) != 0, SF)
        | bit(zero_test_undefined(r, vr, w), ZF)
        | bit(vr & 0xff != 0, PF)
}

/// After `add`/`adc`/`xadd` of `a + b + carry` with result `r` (shadow `vr`).
pub(crate) fn add(va: u64, vb: u64, vcarry: u64, r: u64, vr: u64, w: u32) -> FlagShadows {
    let any = pcast(va | vb | vcarry, w) != 0;
    FlagShadows(szp(r, vr, w) | bit(any, CF | OF) | bit((va | vb | vr) & 0x10 != 0, AF))
}

/// After `sub`/`cmp`/`sbb`/`neg` of `a - b - borrow` with result `r` (shadow `vr`). Without a
/// borrow-in, ZF is `a == b`, exactly as Memcheck's specialised `cmp; je`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sub(
    a: u64,
    va: u64,
    b: u64,
    vb: u64,
    borrow: u64,
    vborrow: u64,
    r: u64,
    vr: u64,
    w: u32,
) -> FlagShadows {
    let any = pcast(va | vb | vborrow, w) != 0;
    let zf = if vborrow == 0 && borrow & 1 == 0 {
        eq_undefined(a, va, b, vb, w)
    } else {
        zero_test_undefined(r, vr, w)
    };
    FlagShadows(
        bit(vr & sign_bit(w) != 0, SF)
            | bit(zf, ZF)
            | bit(vr & 0xff != 0, PF)
            | bit(any, CF | OF)
            | bit((va | vb | vr) & 0x10 != 0, AF),
    )
}

/// After `and`/`or`/`xor`/`test`/`andn` (CF, OF and AF are zeros).
///
/// VEX specialises only some conditions after a LOGIC thunk (`guest_amd64_spechelper`):
/// `z`/`nz` at every width (exact), `s`/`ns` at 8, 16 and 32 bits (the sign bit), and the
/// signed relations `l` (64 bits) and `le` (32 bits) as `CmpLT`/`CmpLE` against 0, which
/// Memcheck instruments as PCast of the result. Every other condition calls the
/// flags helper, whose V bit is PCast of the thunk's result. So OF, read only by `o`, `l`,
/// `le` and their negations, is PCast of the result (those conditions are pessimistic at
/// every width), and SF is the sign bit below 64 bits but PCast at 64 (`test rax,rax; js`
/// reads the helper). CF stays defined: `adc`/`sbb`/`setc` read VEX's specialised carry,
/// a constant 0 after logic (`jb`/`jbe` after `test` are less pessimistic than Memcheck's
/// helper: a missed report, never a false one).
pub(crate) fn logic(r: u64, vr: u64, w: u32) -> FlagShadows {
    let any = pcast(vr, w) != 0;
    let sign = if w == 64 { any } else { vr & sign_bit(w) != 0 };
    FlagShadows(
        bit(sign, SF)
            | bit(zero_test_undefined(r, vr, w), ZF)
            | bit(vr & 0xff != 0, PF)
            | bit(any, OF),
    )
}

/// After `inc`/`dec`: like add/sub of a defined 1, but CF is kept.
pub(crate) fn inc_dec(old: FlagShadows, va: u64, r: u64, vr: u64, w: u32) -> FlagShadows {
    FlagShadows(
        (old.0 & CF) | szp(r, vr, w) | bit(pcast(va, w) != 0, OF) | bit((va | vr) & 0x10 != 0, AF),
    )
}

/// After a shift by a defined, nonzero count: CF is the last bit shifted out (`vcf`), OF and
/// AF are PCast of the input (OF is defined by the architecture for 1-bit shifts only).
pub(crate) fn shift(old: FlagShadows, va: u64, vcf: bool, r: u64, vr: u64, w: u32) -> FlagShadows {
    let any = pcast(va, w) != 0;
    with_old(
        FlagShadows(szp(r, vr, w) | bit(vcf, CF) | bit(any, OF | AF)),
        old,
        SHIFT_UNDEFINED,
    )
}

/// Every flag undefined if `undefined`, else every flag defined (multiply, divide, the generic
/// rule).
pub(crate) fn all(undefined: bool) -> FlagShadows {
    FlagShadows(bit(undefined, FlagShadows::ALL))
}

/// For flags the architecture leaves undefined after an instruction: the hardware may keep
/// the old value (this CPU's `bt` does), so their V bits keep the old ones too.
pub(crate) fn with_old(new: FlagShadows, old: FlagShadows, arch_undefined: u8) -> FlagShadows {
    FlagShadows(new.0 | (old.0 & arch_undefined))
}

pub(crate) const MUL_UNDEFINED: u8 = SF | ZF | AF | PF;
pub(crate) const DIV_UNDEFINED: u8 = FlagShadows::ALL;
pub(crate) const BSF_UNDEFINED: u8 = CF | OF | SF | AF | PF;
pub(crate) const TZCNT_UNDEFINED: u8 = OF | SF | AF | PF;
pub(crate) const BT_UNDEFINED: u8 = OF | SF | AF | PF;
pub(crate) const SHIFT_UNDEFINED: u8 = OF | AF;
