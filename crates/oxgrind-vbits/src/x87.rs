//! x87 floating point: shadows for the register stack, kept in stack order (`x87[0]` is
//! ST(0)), so loads push and `fstp` pops them exactly as the instructions move `TOP`.
//!
//! As in VEX, which holds x87 registers as 64-bit doubles: a 64-bit `fld`/`fst` copies the V
//! bits, every other load or store converts (PCast), arithmetic is PCast of its operands,
//! exchanges and register copies move shadows. The C0..C3 condition bits of compares get one
//! V bit (`fnstsw` hands it on); `fcomi` writes the EFLAGS shadows. Keeping stack order
//! means every instruction that moves `TOP` must come through here, or find every shadow
//! zero, where a rotation changes nothing: the engine's inline fast path takes an x87
//! instruction only then (its `FastForm::x87` check), else its slow path comes here.

use iced_x86::Mnemonic;

use crate::algebra::pcast;
use crate::ctx::Ctx;
use crate::flags;
use crate::state::{FlagShadows, Guest, ShadowMemory};

/// C0, C1, C2, C3 in the status word.
const CONDITION_BITS: u64 = 0x4700;

pub(crate) fn rule<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>) -> bool {
    use Mnemonic::*;
    let m = cx.insn.mnemonic();
    match m {
        Fld => {
            let s = if cx.is_mem(0) {
                load_converted(cx, 8)
            } else {
                st(cx, reg_index(cx, 0))
            };
            push(cx, s);
        }
        Fild => {
            let s = load_converted(cx, 0);
            push(cx, s);
        }
        Fldz | Fld1 | Fldpi | Fldl2e | Fldln2 | Fldlg2 | Fldl2t => push(cx, 0),
        Fst | Fstp => {
            let s0 = st(cx, 0);
            if cx.is_mem(0) {
                store_converted(cx, s0, 8);
            } else {
                let i = reg_index(cx, 0);
                set_st(cx, i, s0);
            }
            if m == Fstp {
                pop(cx);
            }
        }
        Fist | Fistp | Fisttp => {
            let s0 = st(cx, 0);
            store_converted(cx, s0, 0);
            if m != Fist {
                pop(cx);
            }
        }
        Fxch => {
            let i = if cx.op_count() >= 2 {
                reg_index(cx, 1)
            } else {
                1
            };
            let (a, b) = (st(cx, 0), st(cx, i));
            set_st(cx, 0, b);
            set_st(cx, i, a);
        }
        Fadd | Faddp | Fsub | Fsubp | Fsubr | Fsubrp | Fmul | Fmulp | Fdiv | Fdivp | Fdivr
        | Fdivrp | Fiadd | Fisub | Fisubr | Fimul | Fidiv | Fidivr => {
            let pops = matches!(m, Faddp | Fsubp | Fsubrp | Fmulp | Fdivp | Fdivrp);
            if cx.op_count() == 1 && cx.is_mem(0) {
                let src = load_converted(cx, 0);
                let s0 = st(cx, 0);
                set_st(cx, 0, pcast(s0 | src, 64));
            } else {
                let (d, s) = if cx.op_count() >= 2 {
                    (reg_index(cx, 0), reg_index(cx, 1))
                } else {
                    (1, 0)
                };
                let r = pcast(st(cx, d) | st(cx, s), 64);
                set_st(cx, d, r);
            }
            if pops {
                pop(cx);
            }
        }
        Fchs | Fabs | Fsqrt | Frndint | Fsin | Fcos | F2xm1 => {
            let s0 = st(cx, 0);
            set_st(cx, 0, pcast(s0, 64));
        }
        Fptan => {
            let s0 = st(cx, 0);
            set_st(cx, 0, pcast(s0, 64));
            push(cx, 0); // 1.0
        }
        Fsincos | Fxtract => {
            let s0 = pcast(st(cx, 0), 64);
            set_st(cx, 0, s0);
            push(cx, s0);
        }
        Fpatan | Fyl2x | Fyl2xp1 => {
            let r = pcast(st(cx, 0) | st(cx, 1), 64);
            set_st(cx, 1, r);
            pop(cx);
        }
        Fscale | Fprem | Fprem1 => {
            let r = pcast(st(cx, 0) | st(cx, 1), 64);
            set_st(cx, 0, r);
            if m != Fscale {
                cx.regs.x87_status = r != 0;
            }
        }
        Fcom | Fcomp | Fcompp | Fucom | Fucomp | Fucompp | Ficom | Ficomp | Ftst | Fxam => {
            let other = match m {
                Ftst | Fxam => 0,
                _ if cx.is_mem(0) => load_converted(cx, 0),
                _ if cx.op_count() >= 2 => st(cx, reg_index(cx, 1)),
                _ if cx.op_count() == 1 && cx.is_reg(0) => st(cx, reg_index(cx, 0)),
                _ => st(cx, 1),
            };
            cx.regs.x87_status = st(cx, 0) | other != 0;
            match m {
                Fcomp | Fucomp | Ficomp => pop(cx),
                Fcompp | Fucompp => {
                    pop(cx);
                    pop(cx);
                }
                _ => {}
            }
        }
        Fcomi | Fcomip | Fucomi | Fucomip => {
            let i = if cx.op_count() >= 2 {
                reg_index(cx, 1)
            } else {
                1
            };
            let und = st(cx, 0) | st(cx, i) != 0;
            cx.regs.flags = FlagShadows(if und {
                FlagShadows::ZF | FlagShadows::PF | FlagShadows::CF
            } else {
                0
            });
            if matches!(m, Fcomip | Fucomip) {
                pop(cx);
            }
        }
        Fcmovb | Fcmove | Fcmovbe | Fcmovu | Fcmovnb | Fcmovne | Fcmovnbe | Fcmovnu => {
            let cc = cx.insn.condition_code();
            let i = if cx.op_count() >= 2 {
                reg_index(cx, 1)
            } else {
                1
            };
            let taken = flags::condition_holds(cc, cx.guest.rflags());
            let und = flags::condition_undefined(cc, cx.regs.flags);
            let chosen = if taken { st(cx, i) } else { st(cx, 0) };
            set_st(cx, 0, chosen | pcast(und as u64, 64));
        }
        Fnstsw | Fstsw => {
            let s = if cx.regs.x87_status {
                CONDITION_BITS
            } else {
                0
            };
            cx.write(0, s);
        }
        Fnstcw | Fstcw => cx.write(0, 0),
        Fldcw | Fnclex | Fclex | Fnop | Wait | Ffree => {
            if cx.is_mem(0) {
                cx.address();
            }
        }
        Ffreep => pop(cx),
        Fninit | Finit => {
            cx.regs.x87 = [0; 8];
            cx.regs.x87_status = false;
        }
        Fincstp => cx.regs.x87.rotate_left(1),
        Fdecstp => cx.regs.x87.rotate_right(1),
        _ => return false,
    }
    true
}

fn reg_index<G: Guest, M: ShadowMemory>(cx: &Ctx<G, M>, op: u32) -> usize {
    let r = cx.reg(op);
    if r.is_st() {
        r.number() & 7
    } else {
        0
    }
}

fn st<G: Guest, M: ShadowMemory>(cx: &Ctx<G, M>, i: usize) -> u64 {
    cx.regs.x87[i & 7]
}

fn set_st<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, i: usize, s: u64) {
    cx.regs.x87[i & 7] = s;
}

fn push<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, s: u64) {
    cx.regs.x87.rotate_right(1);
    cx.regs.x87[0] = s;
}

fn pop<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>) {
    cx.regs.x87[0] = 0;
    cx.regs.x87.rotate_left(1);
}

/// Loads the memory operand's shadow: copied for a 64-bit float (`copy_size`), PCast for
/// every other size and for integers (`copy_size` 0).
fn load_converted<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, copy_size: usize) -> u64 {
    let bytes = cx.mem_bytes().clamp(1, 10);
    let addr = cx.address();
    let mut s = [0u8; 10];
    cx.mem.load(addr, &mut s[..bytes]);
    if bytes == copy_size {
        u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]])
    } else {
        pcast(s.iter().any(|b| *b != 0) as u64, 64)
    }
}

/// Stores a register shadow to the memory operand: copied for a 64-bit float, PCast for other
/// sizes and integer stores.
fn store_converted<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, s: u64, copy_size: usize) {
    let bytes = cx.mem_bytes().clamp(1, 10);
    let addr = cx.address();
    let out: [u8; 10] = if bytes == copy_size {
        let b = s.to_le_bytes();
        [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], 0, 0]
    } else if s != 0 {
        [0xff; 10]
    } else {
        [0; 10]
    };
    cx.mem.store(addr, &out[..bytes]);
}
