//! Precision against Memcheck: for random values and V bits, the interpreter must call
//! defined every bit Memcheck's rule calls defined (we may be more precise, never less).
//!
//! The reference formulas are written here from `memcheck/mc_translate.c`'s descriptions
//! (`expensiveAddSub`, `mkImproveAND`/`OR`, `expensiveCmpEQorNE` with its OCast, `mkLeft`,
//! `expensiveCountTrailingZeroes`, `scalarShift`, `expr2vbits_ITE`), in the IR's own
//! formulation, independently of the crate's code.

mod common;

use common::*;
use iced_x86::code_asm::*;
use iced_x86::Instruction;
use oxgrind_vbits::{Check, FlagShadows, Interpreter, ShadowRegisters};

fn pcast(v: u64) -> u64 {
    if v != 0 {
        u64::MAX
    } else {
        0
    }
}

/// Memcheck's OCast: all ones if `v` is all ones, else 0, as `(v - (v >>u 1)) >>s 63`.
fn ocast(v: u64) -> u64 {
    ((v.wrapping_sub(v >> 1)) as i64 >> 63) as u64
}

fn mc_add(a: u64, qa: u64, b: u64, qb: u64) -> u64 {
    (qa | qb) | ((a & !qa).wrapping_add(b & !qb) ^ (a | qa).wrapping_add(b | qb))
}

fn mc_sub(a: u64, qa: u64, b: u64, qb: u64) -> u64 {
    (qa | qb) | ((a & !qa).wrapping_sub(b | qb) ^ (a | qa).wrapping_sub(b & !qb))
}

fn mc_and(a: u64, qa: u64, b: u64, qb: u64) -> u64 {
    (qa | qb) & ((a | qa) & (b | qb))
}

fn mc_or(a: u64, qa: u64, b: u64, qb: u64) -> u64 {
    (qa | qb) & ((!a | qa) & (!b | qb))
}

/// expensiveCmpEQorNE: PCastTo<1>(DifD(naive, OCast(naive | ~(a ^ b)))) as a bool.
fn mc_eq_undefined(a: u64, qa: u64, b: u64, qb: u64) -> bool {
    let naive = qa | qb;
    let vec = naive | !(a ^ b);
    (naive & ocast(vec)) != 0
}

fn mc_ctz_undefined(a: u64, qa: u64) -> bool {
    qa & (a ^ a.wrapping_sub(1)) != 0
}

fn step1(
    insn: &Instruction,
    guest: &TestGuest,
    regs: &mut ShadowRegisters,
) -> oxgrind_vbits::Outcome {
    let mut mem = MapShadow::default();
    Interpreter::new().step(insn, guest, regs, &mut mem)
}

/// Runs a two-register instruction on rax, rbx and returns rax's shadow.
fn binary(insn: &Instruction, a: u64, qa: u64, b: u64, qb: u64) -> (u64, FlagShadows) {
    let mut guest = TestGuest::default();
    guest.gpr[RAX] = a;
    guest.gpr[RBX] = b;
    let mut regs = ShadowRegisters::default();
    regs.gpr[RAX] = qa;
    regs.gpr[RBX] = qb;
    step1(insn, &guest, &mut regs);
    (regs.gpr[RAX], regs.flags)
}

fn samples() -> impl Iterator<Item = (u64, u64, u64, u64)> {
    let mut rng = Rng(0xfeed_beef);
    (0..20000).map(move |_| (rng.value(64), rng.shadow(64), rng.value(64), rng.shadow(64)))
}

#[test]
fn add_and_sub_are_exactly_expensive_add_sub() {
    let add = asm(|a| a.add(rax, rbx));
    let sub = asm(|a| a.sub(rax, rbx));
    for (a, qa, b, qb) in samples() {
        assert_eq!(
            binary(&add, a, qa, b, qb).0,
            mc_add(a, qa, b, qb),
            "add {a:#x}/{qa:#x} {b:#x}/{qb:#x}"
        );
        assert_eq!(
            binary(&sub, a, qa, b, qb).0,
            mc_sub(a, qa, b, qb),
            "sub {a:#x}/{qa:#x} {b:#x}/{qb:#x}"
        );
    }
}

#[test]
fn and_or_are_improved_as_memcheck() {
    let and = asm(|a| a.and(rax, rbx));
    let or = asm(|a| a.or(rax, rbx));
    let xor = asm(|a| a.xor(rax, rbx));
    for (a, qa, b, qb) in samples() {
        assert_eq!(binary(&and, a, qa, b, qb).0, mc_and(a, qa, b, qb));
        assert_eq!(binary(&or, a, qa, b, qb).0, mc_or(a, qa, b, qb));
        assert_eq!(binary(&xor, a, qa, b, qb).0, qa | qb);
    }
}

#[test]
fn multiply_is_left_of_uifu() {
    let imul = asm(|a| a.imul_2(rax, rbx));
    for (a, qa, b, qb) in samples() {
        let v = qa | qb;
        assert_eq!(binary(&imul, a, qa, b, qb).0, v | v.wrapping_neg());
    }
}

/// Runs `first` (a flag writer on rax, rbx) then `jcc`, and says whether the jcc reported.
fn branch_reports(
    first: &Instruction,
    jcc: &Instruction,
    a: u64,
    qa: u64,
    b: u64,
    qb: u64,
) -> bool {
    let mut guest = TestGuest::default();
    guest.gpr[RAX] = a;
    guest.gpr[RBX] = b;
    let mut regs = ShadowRegisters::default();
    regs.gpr[RAX] = qa;
    regs.gpr[RBX] = qb;
    step1(first, &guest, &mut regs);
    let out = step1(jcc, &guest, &mut regs);
    let reported = out.checks.iter().any(|c| c == Check::Condition);
    reported
}

#[test]
fn cmp_then_je_is_exact_equality() {
    let cmp = asm(|a| a.cmp(rax, rbx));
    let je = asm(|a| a.je(0x1000u64));
    for (a, qa, b, qb) in samples() {
        assert_eq!(
            branch_reports(&cmp, &je, a, qa, b, qb),
            mc_eq_undefined(a, qa, b, qb)
        );
    }
}

#[test]
fn test_reg_reg_then_jz_is_exact() {
    // VEX: LOGIC thunk, Z specialised to CmpEQ64(dep1, 0) with dep1 = rax & rax.
    let test = asm(|a| a.test(rax, rax));
    let jz = asm(|a| a.je(0x1000u64));
    for (a, qa, _, _) in samples() {
        let dep1_shadow = mc_and(a, qa, a, qa);
        assert_eq!(
            branch_reports(&test, &jz, a, qa, a, qa),
            mc_eq_undefined(a, dep1_shadow, 0, 0)
        );
    }
}

/// After a LOGIC thunk VEX specialises `s` below 64 bits to the result's sign bit, and
/// sends `s` at 64 bits and the signed relations (`l`, `le`, `g`, `o`) at every width to
/// PCast of the result (`CmpLT64S`/`CmpLE32S` against 0, or the flags helper). The
/// printf of `x > 3` with an undefined `x` reaches `test rax,rax; js` in vfprintf with
/// bit 0 undefined: Valgrind reports it.
#[test]
fn sign_and_signed_relations_after_test_are_as_memcheck() {
    let js = asm(|a| a.js(0x1000u64));
    let test64 = asm(|a| a.test(rax, rax));
    let test32 = asm(|a| a.test(eax, eax));
    let test8 = asm(|a| a.test(al, al));
    for (a, qa, _, _) in samples() {
        let q = mc_and(a, qa, a, qa);
        assert_eq!(
            branch_reports(&test64, &js, a, qa, a, qa),
            q != 0,
            "test rax; js"
        );
        assert_eq!(
            branch_reports(&test32, &js, a, qa, a, qa),
            q >> 31 & 1 != 0,
            "test eax; js"
        );
        assert_eq!(
            branch_reports(&test8, &js, a, qa, a, qa),
            q >> 7 & 1 != 0,
            "test al; js"
        );
        for jcc in [
            asm(|a| a.jl(0x1000u64)),
            asm(|a| a.jle(0x1000u64)),
            asm(|a| a.jg(0x1000u64)),
            asm(|a| a.jo(0x1000u64)),
        ] {
            assert_eq!(branch_reports(&test64, &jcc, a, qa, a, qa), q != 0);
            assert_eq!(
                branch_reports(&test32, &jcc, a, qa, a, qa),
                q as u32 != 0,
                "{}",
                format(&jcc)
            );
        }
    }
    // The case itself: bit 0 undefined, the sign defined.
    assert!(branch_reports(&test64, &js, 0, 1, 0, 1));
    assert!(!branch_reports(&test32, &js, 0, 1, 0, 1));
}

#[test]
fn relational_conditions_are_pessimistic_as_memcheck() {
    let cmp = asm(|a| a.cmp(rax, rbx));
    for jcc in [
        asm(|a| a.jl(0x1000u64)),
        asm(|a| a.jb(0x1000u64)),
        asm(|a| a.jbe(0x1000u64)),
        asm(|a| a.jg(0x1000u64)),
    ] {
        for (a, qa, b, qb) in samples().take(3000) {
            assert_eq!(
                branch_reports(&cmp, &jcc, a, qa, b, qb),
                pcast(qa | qb) != 0,
                "{}",
                format(&jcc)
            );
        }
    }
}

#[test]
fn sign_after_sub_is_the_sign_bit_of_the_exact_difference() {
    // VEX specialises SUBQ + CondS to (dep1 - dep2) >>u 63, instrumented with the exact sub.
    let cmp = asm(|a| a.cmp(rax, rbx));
    let js = asm(|a| a.js(0x1000u64));
    for (a, qa, b, qb) in samples() {
        assert_eq!(
            branch_reports(&cmp, &js, a, qa, b, qb),
            mc_sub(a, qa, b, qb) >> 63 != 0
        );
    }
}

#[test]
fn tzcnt_and_bsf_use_the_trailing_zeros_improver() {
    let tzcnt = asm(|a| a.tzcnt(rax, rbx));
    for (_, _, b, qb) in samples() {
        let (out, _) = binary(&tzcnt, 0, 0, b, qb);
        assert_eq!(out != 0, mc_ctz_undefined(b, qb));
    }
}

#[test]
fn shifts_by_defined_amounts_shift_the_shadow() {
    for n in 0..64u32 {
        let shl = asm(|a| a.shl(rax, n));
        let shr = asm(|a| a.shr(rax, n));
        let sar = asm(|a| a.sar(rax, n));
        for (a, qa, _, _) in samples().take(200) {
            assert_eq!(binary(&shl, a, qa, 0, 0).0, qa << n);
            assert_eq!(binary(&shr, a, qa, 0, 0).0, qa >> n);
            assert_eq!(binary(&sar, a, qa, 0, 0).0, ((qa as i64) >> n) as u64);
        }
    }
}

#[test]
fn shift_by_undefined_count_is_pcast_of_the_count() {
    let shl = asm(|a| a.shl(rax, cl));
    let mut guest = TestGuest::default();
    guest.gpr[RAX] = 1;
    guest.gpr[RCX] = 3;
    let mut regs = ShadowRegisters::default();
    regs.gpr[RCX] = 0x4; // undefined bit 2 of the count
    step1(&shl, &guest, &mut regs);
    assert_eq!(regs.gpr[RAX], u64::MAX);
    // Bits of cl above the 6 the instruction uses do not matter (VEX masks the count).
    let mut regs = ShadowRegisters::default();
    regs.gpr[RCX] = 0xc0;
    step1(&shl, &guest, &mut regs);
    assert_eq!(regs.gpr[RAX], 0);
}

#[test]
fn cmov_is_memcheck_ite() {
    // ITE(cond, src, dst) shadows UifU PCast(cond#): an undefined condition poisons all.
    let cmovl = asm(|a| a.cmovl(rax, rbx));
    let mut rng = Rng(99);
    for _ in 0..2000 {
        let (qa, qb) = (rng.shadow(64), rng.shadow(64));
        let taken = rng.below(2) == 1;
        let cond_undefined = rng.below(3) == 0;
        let guest = TestGuest {
            rflags: 0x202 | if taken { 0x80 } else { 0 },
            ..Default::default()
        }; // SF != OF
        let mut regs = ShadowRegisters::default();
        regs.gpr[RAX] = qa;
        regs.gpr[RBX] = qb;
        regs.flags = FlagShadows(if cond_undefined { FlagShadows::SF } else { 0 });
        let out = step1(&cmovl, &guest, &mut regs);
        assert!(out.checks.is_empty(), "Memcheck does not report at cmov");
        let expect = if taken { qb } else { qa } | if cond_undefined { u64::MAX } else { 0 };
        assert_eq!(regs.gpr[RAX], expect);
    }
}

#[test]
fn bmi_lowest_bit_ops_are_at_least_as_precise_as_vex_composition() {
    // VEX: blsmsk = x ^ (x - 1), blsr = x & (x - 1), blsi = x & (0 - x), each instrumented
    // with the expensive sub and the improved and. Ours may only be more defined.
    let blsmsk = asm(|a| a.blsmsk(rax, rbx));
    let blsr = asm(|a| a.blsr(rax, rbx));
    let blsi = asm(|a| a.blsi(rax, rbx));
    for (_, _, b, qb) in samples() {
        let vdec = mc_sub(b, qb, 1, 0);
        let subset = |ours: u64, memcheck: u64| ours & !memcheck == 0;
        assert!(subset(binary(&blsmsk, 0, 0, b, qb).0, qb | vdec));
        assert!(subset(
            binary(&blsr, 0, 0, b, qb).0,
            mc_and(b, qb, b.wrapping_sub(1), vdec)
        ));
        let vneg = mc_sub(0, 0, b, qb);
        assert!(subset(
            binary(&blsi, 0, 0, b, qb).0,
            mc_and(b, qb, 0u64.wrapping_sub(b), vneg)
        ));
    }
    // A lane mask with a defined NUL lane (bit 5) and undefined lanes above it: the mask
    // up to the NUL is exactly known (Memcheck's composition leaves bits 6.. undefined).
    let nul_mask = 1u64 << 5;
    let lanes_past_end = !0u64 << 6;
    assert_eq!(binary(&blsmsk, 0, 0, nul_mask, lanes_past_end).0, 0);
    assert_eq!(binary(&blsi, 0, 0, nul_mask, lanes_past_end).0, 0);
    assert_eq!(
        binary(&blsr, 0, 0, nul_mask, lanes_past_end).0,
        lanes_past_end
    );
}
