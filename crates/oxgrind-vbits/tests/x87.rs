//! x87: shadows follow the register stack; long doubles are converted (PCast), doubles
//! copied; compares report at the branch that reads their result.

mod common;

use common::*;
use iced_x86::code_asm::*;
use oxgrind_vbits::{Check, Interpreter, ShadowRegisters};

fn run_seq(
    insns: &[iced_x86::Instruction],
    guest: &TestGuest,
    regs: &mut ShadowRegisters,
    mem: &mut MapShadow,
) -> Vec<Check> {
    let mut interp = Interpreter::new();
    let mut checks = Vec::new();
    for i in insns {
        let out = interp.step(i, guest, regs, mem);
        assert_eq!(out.rule, oxgrind_vbits::Rule::Specific, "{}", format(i));
        checks.extend(out.checks.iter());
    }
    checks
}

const SRC: u64 = 0x1000;
const DST: u64 = 0x2000;

fn machine() -> (TestGuest, ShadowRegisters, MapShadow) {
    let mut g = TestGuest::default();
    g.gpr[RDI] = SRC;
    g.gpr[RSI] = DST;
    (g, ShadowRegisters::default(), MapShadow::default())
}

#[test]
fn an_undefined_long_double_stays_undefined_through_the_stack() {
    let (g, mut regs, mut mem) = machine();
    mem.set(SRC, &[0, 0, 0, 0, 0, 0, 0x01, 0, 0, 0]); // one undefined mantissa bit
    let seq = asm_seq(|a| {
        a.fld(tword_ptr(rdi))?;
        a.fldz()?;
        a.fxch(st0, st1)?;
        a.fstp(tword_ptr(rsi))?;
        a.fstp(qword_ptr(rsi + 16))
    });
    assert!(run_seq(&seq, &g, &mut regs, &mut mem).is_empty());
    assert_eq!(mem.get(DST, 10), vec![0xff; 10], "converted: PCast");
    assert_eq!(mem.get(DST + 16, 8), vec![0; 8], "the fldz constant");
    assert_eq!(regs.x87, [0; 8], "the stack is empty again");
}

#[test]
fn doubles_are_copied_bit_for_bit() {
    let (g, mut regs, mut mem) = machine();
    mem.set(SRC, &[0, 0xf0, 0, 0, 0, 0, 0, 0]);
    let seq = asm_seq(|a| {
        a.fld(qword_ptr(rdi))?;
        a.fld(st0)?;
        a.fstp(qword_ptr(rsi))?;
        a.fstp(dword_ptr(rsi + 8))
    });
    run_seq(&seq, &g, &mut regs, &mut mem);
    assert_eq!(mem.get(DST, 8), vec![0, 0xf0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(mem.get(DST + 8, 4), vec![0xff; 4], "to float: converted");
}

#[test]
fn arithmetic_is_pcast_and_defined_inputs_give_defined_results() {
    let (g, mut regs, mut mem) = machine();
    let seq = asm_seq(|a| {
        a.fild(dword_ptr(rdi))?;
        a.fld1()?;
        a.faddp(st1, st0)?;
        a.fsqrt()?;
        a.fistp(dword_ptr(rsi))
    });
    run_seq(&seq, &g, &mut regs, &mut mem);
    assert_eq!(mem.get(DST, 4), vec![0; 4]);
    mem.set(SRC, &[0, 0, 0, 0x80]);
    run_seq(&seq, &g, &mut regs, &mut mem);
    assert_eq!(mem.get(DST, 4), vec![0xff; 4]);
}

#[test]
fn compares_report_at_the_branch() {
    let (g, mut regs, mut mem) = machine();
    mem.set(SRC, &[0xff; 8]);
    let fcomi = asm_seq(|a| {
        a.fld(qword_ptr(rdi))?;
        a.fldz()?;
        a.fcomip(st0, st1)?;
        a.fstp(st0)?;
        a.jb(0x1000u64)
    });
    assert_eq!(
        run_seq(&fcomi, &g, &mut regs, &mut mem),
        vec![Check::Condition]
    );
    let fnstsw = asm_seq(|a| {
        a.fld(qword_ptr(rdi))?;
        a.ftst()?;
        a.fnstsw(ax)?;
        a.fstp(st0)?;
        a.test(ah, 0x45)?;
        a.jne(0x1000u64)
    });
    assert_eq!(
        run_seq(&fnstsw, &g, &mut regs, &mut mem),
        vec![Check::Condition]
    );
    mem.set(SRC, &[0; 8]);
    assert!(run_seq(&fnstsw, &g, &mut regs, &mut mem).is_empty());
}
