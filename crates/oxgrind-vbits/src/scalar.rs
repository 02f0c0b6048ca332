//! Rules for the general-purpose instructions: moves, arithmetic, logic, shifts, multiply and
//! divide, compares and conditions, bit scans, and control transfers.
//!
//! Each rule follows the Memcheck rule for the IR VEX makes of the instruction
//! (`guest_amd64_toIR.c`), with Memcheck's expensive interpretations where its `auto` level
//! uses them (add, sub, `==`): see the algebra module for the formulas.

use iced_x86::{ConditionCode, Mnemonic, OpKind, Register};

use crate::algebra::{self, left, mask, pcast, sar_shadow, sext, shl, shl_shadow, shr, shr_shadow};
use crate::ctx::{Ctx, Sv};
use crate::flags;
use crate::state::{FlagShadows, Guest, ShadowMemory};
use crate::ValueUse;

/// Applies the rule for the instruction in `cx` if this module has one.
pub(crate) fn rule<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>) -> bool {
    use Mnemonic::*;
    // Every rule below works on general registers, memory and immediates only; vector forms
    // of the same mnemonic (none today) would go to the vector module.
    for op in 0..cx.op_count() {
        if cx.is_reg(op) {
            let r = cx.reg(op);
            if r.is_vector_register() || r.is_k() || r.is_mm() || r.is_st() {
                return false;
            }
        }
    }
    let insn = cx.insn;
    let m = insn.mnemonic();
    match m {
        Nop | Endbr64 | Endbr32 | Pause | Lfence | Mfence | Sfence | Prefetch | Prefetchnta
        | Prefetcht0 | Prefetcht1 | Prefetcht2 | Prefetchw | Prefetchwt1 | Cld | Std | Ud2
        | Int3 | Hlt | Cmc => {
            // No address check: VEX drops prefetches and hinting nops without computing the
            // address. `cmc` keeps CF's V bit.
            true
        }
        Clc | Stc => {
            cx.regs.flags.0 &= !FlagShadows::CF;
            true
        }
        Mov | Movbe => mov(cx, m == Movbe),
        Movzx => {
            let s = cx.read(1);
            cx.write(0, s.s);
            true
        }
        Movsx | Movsxd => {
            let s = cx.read(1);
            let w = cx.width(0);
            cx.write(0, sext(s.s, s.w) & mask(w));
            true
        }
        Xchg => {
            let a = cx.read(0);
            let b = cx.read(1);
            cx.write(0, b.s);
            cx.write(1, a.s);
            true
        }
        Bswap => {
            let a = cx.read(0);
            cx.write(0, algebra::bswap(a.s, a.w));
            true
        }
        Lea => lea(cx),
        Push => push(cx),
        Pop => pop(cx),
        Leave => {
            let (rbp, vrbp) = cx.gpr(5);
            let (_, vslot) = cx.load(rbp, 8);
            cx.check_value(vrbp, ValueUse::Address);
            cx.set_gpr(4, vrbp);
            cx.set_gpr(5, vslot);
            true
        }
        Add | Adc | Sub | Sbb | Cmp | And | Or | Xor | Test => alu(cx, m),
        Inc | Dec | Neg | Not => unary(cx, m),
        Shl | Sal | Shr | Sar | Rol | Ror => shift(cx, m),
        Rcl | Rcr => rotate_through_carry(cx, m),
        Shld | Shrd => double_shift(cx, m),
        Mul | Imul => multiply(cx, m),
        Div | Idiv => divide(cx),
        Mulx => {
            let w = cx.width(0);
            let src = cx.read(2);
            let rdx = cx.read_reg(Register::RDX.with_width(w));
            let lo = left(src.s | rdx.s, w);
            cx.write(1, lo);
            cx.write(0, pcast(lo, w));
            true
        }
        Cbw | Cwde | Cdqe => {
            let (from, to) = match m {
                Cbw => (Register::AL, Register::AX),
                Cwde => (Register::AX, Register::EAX),
                _ => (Register::EAX, Register::RAX),
            };
            let a = cx.read_reg(from);
            cx.write_reg(to, sext(a.s, a.w));
            true
        }
        Cwd | Cdq | Cqo => {
            let (acc, hi) = match m {
                Cwd => (Register::AX, Register::DX),
                Cdq => (Register::EAX, Register::EDX),
                _ => (Register::RAX, Register::RDX),
            };
            let a = cx.read_reg(acc);
            cx.write_reg(hi, sar_shadow(a.s, a.w - 1, a.w));
            true
        }
        Seta | Setae | Setb | Setbe | Sete | Setg | Setge | Setl | Setle | Setne | Setno
        | Setnp | Setns | Seto | Setp | Sets => {
            // Memcheck: 1Uto8 of the condition's V bit; bits 7:1 are defined zeros.
            let und = flags::condition_undefined(insn.condition_code(), cx.regs.flags);
            cx.write(0, und as u64);
            true
        }
        Cmova | Cmovae | Cmovb | Cmovbe | Cmove | Cmovg | Cmovge | Cmovl | Cmovle | Cmovne
        | Cmovno | Cmovnp | Cmovns | Cmovo | Cmovp | Cmovs => cmov(cx),
        Ja | Jae | Jb | Jbe | Je | Jg | Jge | Jl | Jle | Jne | Jno | Jnp | Jns | Jo | Jp | Js => {
            let und = flags::condition_undefined(insn.condition_code(), cx.regs.flags);
            cx.check_condition(und);
            true
        }
        Jrcxz | Jecxz => {
            let r = cx.read_reg(if m == Jrcxz {
                Register::RCX
            } else {
                Register::ECX
            });
            cx.check_condition(algebra::zero_test_undefined(r.v, r.s, r.w));
            true
        }
        Loop | Loope | Loopne => {
            let (rcx, vrcx) = cx.gpr(1);
            let vnew = algebra::sub(rcx, vrcx, 1, 0, 0, 0, 64);
            let new = rcx.wrapping_sub(1);
            let mut und = algebra::zero_test_undefined(new, vnew, 64);
            if m != Loop {
                und |= cx.regs.flags.any(FlagShadows::ZF);
            }
            cx.check_condition(und);
            cx.set_gpr(1, vnew);
            true
        }
        Jmp | Call => branch(cx, m == Call),
        Ret => {
            let (rsp, vrsp) = cx.gpr(4);
            cx.check_value(vrsp, ValueUse::Address);
            let (_, vtarget) = cx.load(rsp, 8);
            cx.check_value(vtarget, ValueUse::JumpTarget);
            true
        }
        Bt | Bts | Btr | Btc => bit_test(cx, m),
        Bsf | Bsr | Tzcnt | Lzcnt | Popcnt => count_bits(cx, m),
        Xadd => {
            let a = cx.read(0);
            let b = cx.read_as(1, a.w);
            let r = a.v.wrapping_add(b.v) & mask(a.w);
            let vr = algebra::add(a.v, a.s, b.v, b.s, 0, 0, a.w);
            cx.write(1, a.s);
            cx.write(0, vr);
            cx.regs.flags = flags::add(a.s, b.s, 0, r, vr, a.w);
            true
        }
        Cmpxchg => cmpxchg(cx),
        Pushf | Pushfq => {
            let (rsp, vrsp) = cx.gpr(4);
            let size = if m == Pushf { 2 } else { 8 };
            let addr = rsp.wrapping_sub(size);
            cx.check_value(vrsp, ValueUse::Address);
            let s = cx.regs.flags.to_rflags();
            cx.store(addr, size as usize, s);
            true
        }
        Popf | Popfq => {
            let (rsp, vrsp) = cx.gpr(4);
            let size = if m == Popf { 2 } else { 8 };
            cx.check_value(vrsp, ValueUse::Address);
            let (_, s) = cx.load(rsp, size);
            cx.regs.flags = FlagShadows::from_rflags(s);
            true
        }
        Lahf => {
            let f = cx.regs.flags;
            let keep = FlagShadows(f.0 & !FlagShadows::OF);
            cx.write_reg(Register::AH, keep.to_rflags() & 0xff);
            true
        }
        Sahf => {
            let ah = cx.read_reg(Register::AH);
            let of = cx.regs.flags.0 & FlagShadows::OF;
            cx.regs.flags = FlagShadows((FlagShadows::from_rflags(ah.s).0 & !FlagShadows::OF) | of);
            true
        }
        Cpuid => {
            for r in [Register::EAX, Register::EBX, Register::ECX, Register::EDX] {
                cx.write_reg(r, 0);
            }
            true
        }
        Rdtsc | Xgetbv => {
            cx.write_reg(Register::EAX, 0);
            cx.write_reg(Register::EDX, 0);
            true
        }
        Rdtscp => {
            cx.write_reg(Register::EAX, 0);
            cx.write_reg(Register::EDX, 0);
            cx.write_reg(Register::ECX, 0);
            true
        }
        Rdrand | Rdseed => {
            cx.write(0, 0);
            cx.regs.flags = flags::all(false);
            true
        }
        Syscall => {
            // The kernel's results are defined; which memory it reads or writes is the
            // engine's and the tool's business (Memcheck's syscall wrappers).
            cx.set_gpr(0, 0);
            cx.set_gpr(1, 0);
            cx.set_gpr(11, 0);
            true
        }
        Andn => {
            let a = cx.read(1);
            let b = cx.read(2);
            let r = !a.v & b.v & mask(a.w);
            let vr = algebra::andn(a.v, a.s, b.v, b.s) & mask(a.w);
            cx.write(0, vr);
            cx.regs.flags = flags::logic(r, vr, a.w);
            true
        }
        Blsr | Blsmsk | Blsi => {
            // x & (x - 1), x ^ (x - 1), x & -x: functions of the lowest set bit (glibc's string
            // code applies them to lane masks whose lanes past the end are undefined).
            let a = cx.read(1);
            let w = a.w;
            let x = a.v & mask(w);
            let (r, vr) = lowest_set_bit_op(m, x, a.s & mask(w), w);
            cx.write(0, vr);
            // SF and ZF from the result (ZF is cleared by blsmsk), CF from "source == 0" (blsi:
            // "source != 0"), OF cleared, AF and PF architecturally undefined.
            let mut f = 0u8;
            if vr & algebra::sign_bit(w) != 0 {
                f |= FlagShadows::SF;
            }
            if m != Blsmsk && algebra::zero_test_undefined(r, vr, w) {
                f |= FlagShadows::ZF;
            }
            if algebra::zero_test_undefined(x, a.s, w) {
                f |= FlagShadows::CF;
            }
            if pcast(a.s, w) != 0 {
                f |= FlagShadows::AF | FlagShadows::PF;
            }
            cx.regs.flags = flags::with_old(
                FlagShadows(f),
                cx.regs.flags,
                FlagShadows::AF | FlagShadows::PF,
            );
            true
        }
        Bextr => {
            // Start and length come from the control operand's low two bytes.
            let a = cx.read(1);
            let c = cx.read(2);
            let w = a.w;
            let (start, len) = ((c.v & 0xff) as u32, ((c.v >> 8) & 0xff) as u32);
            let vr = if c.s & 0xffff != 0 {
                mask(w)
            } else {
                let keep = if len >= 64 { u64::MAX } else { mask(len) };
                shr(a.s & mask(w), start) & keep & mask(w)
            };
            let r = if start >= w {
                0
            } else {
                shr(a.v & mask(w), start) & if len >= 64 { u64::MAX } else { mask(len) }
            };
            cx.write(0, vr);
            let mut f = 0u8;
            if algebra::zero_test_undefined(r, vr, w) {
                f |= FlagShadows::ZF;
            }
            if vr != 0 {
                f |= FlagShadows::AF | FlagShadows::PF | FlagShadows::SF;
            }
            cx.regs.flags = flags::with_old(
                FlagShadows(f),
                cx.regs.flags,
                FlagShadows::AF | FlagShadows::PF | FlagShadows::SF,
            );
            true
        }
        Cmpxchg8b | Cmpxchg16b => cmpxchg_double(cx, m == Cmpxchg16b),
        Shlx | Shrx | Sarx => {
            let a = cx.read(1);
            let c = cx.read(2);
            let cm = if a.w == 64 { 63 } else { 31 };
            let n = (c.v & cm) as u32;
            let vr = if c.s & cm != 0 {
                mask(a.w)
            } else {
                match m {
                    Shlx => shl_shadow(a.s, n, a.w),
                    Shrx => shr_shadow(a.s, n, a.w),
                    _ => sar_shadow(a.s, n, a.w),
                }
            };
            cx.write(0, vr);
            true
        }
        Rorx => {
            let a = cx.read(1);
            let n = (cx.insn.immediate(2) as u32) & (a.w - 1);
            cx.write(0, algebra::ror(a.s, n, a.w));
            true
        }
        Bzhi => {
            let a = cx.read(1);
            let c = cx.read(2);
            let n = (c.v & 0xff) as u32;
            let vr = if c.s & 0xff != 0 {
                mask(a.w)
            } else if n >= a.w {
                a.s
            } else {
                a.s & mask(n)
            };
            cx.write(0, vr);
            cx.regs.flags = flags::with_old(
                flags::all(vr != 0 || c.s & 0xff != 0),
                cx.regs.flags,
                flags::MUL_UNDEFINED,
            );
            true
        }
        Adcx | Adox => {
            // Add with the carry in CF (adcx) or OF (adox), writing only that flag.
            let flag = if m == Adcx {
                FlagShadows::CF
            } else {
                FlagShadows::OF
            };
            let bitpos = if m == Adcx { 0 } else { 11 };
            let a = cx.read(0);
            let b = cx.read_as(1, a.w);
            let c = (cx.guest.rflags() >> bitpos) & 1;
            let vc = cx.regs.flags.any(flag) as u64;
            let vr = algebra::add(a.v, a.s, b.v, b.s, c, vc, a.w);
            cx.write(0, vr);
            let und = pcast(a.s | b.s | vc, a.w) != 0;
            cx.regs.flags.0 = (cx.regs.flags.0 & !flag) | if und { flag } else { 0 };
            true
        }
        _ => false,
    }
}

trait WithWidth {
    fn with_width(self, w: u32) -> Register;
}

impl WithWidth for Register {
    /// `rax`-family register of width `w` bits (for the implicit accumulator operands).
    fn with_width(self, w: u32) -> Register {
        let i = self.full_register().number();
        let table: [[Register; 4]; 4] = [
            [Register::AL, Register::AX, Register::EAX, Register::RAX],
            [Register::CL, Register::CX, Register::ECX, Register::RCX],
            [Register::DL, Register::DX, Register::EDX, Register::RDX],
            [Register::BL, Register::BX, Register::EBX, Register::RBX],
        ];
        let col = match w {
            8 => 0,
            16 => 1,
            32 => 2,
            _ => 3,
        };
        table.get(i).map(|row| row[col]).unwrap_or(self)
    }
}

fn mov<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, byteswap: bool) -> bool {
    if cx.is_reg(0) && !cx.reg(0).is_gpr() {
        // Writes to segment, control or debug registers: no shadow.
        let _ = cx.read(1);
        return true;
    }
    let w = cx.width(0);
    let s = cx.read_as(1, w);
    let s = if byteswap {
        algebra::bswap(s.s, w)
    } else {
        s.s
    };
    cx.write(0, s);
    true
}

/// `lea`: an addition, so exact (Memcheck's `auto` level makes an `Add64` that does not feed
/// an address expensive, and LLVM uses `lea` for bitfield inserts). No address check: nothing
/// is accessed.
fn lea<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>) -> bool {
    let insn = cx.insn;
    let base = insn.memory_base();
    let index = insn.memory_index();
    let (mut v, mut s) = (insn.memory_displacement64(), 0u64);
    if base != Register::None && base.is_gpr() {
        let b = cx.read_reg(base);
        s = algebra::add(v, s, b.v, b.s, 0, 0, 64);
        v = v.wrapping_add(b.v);
    }
    if index != Register::None && index.is_gpr() {
        let i = cx.read_reg(index);
        if index == base && insn.memory_index_scale() == 1 {
            // `[x + x*1]` is `x << 1` plus the displacement, as VEX's folding makes it
            // (Add(t,t) ==> Shl(t,1)): the doubled value's lowest bit is defined, and an
            // undefined top bit of x leaves no trace (gcc's cc1 doubles bit-field words so).
            let d = insn.memory_displacement64();
            let (xv, xs) = (shl(i.v, 1), shl(i.s, 1));
            s = algebra::add(d, 0, xv, xs, 0, 0, 64);
        } else {
            let sh = insn.memory_index_scale().trailing_zeros();
            let (iv, is) = (shl(i.v, sh), shl(i.s, sh));
            s = algebra::add(v, s, iv, is, 0, 0, 64);
        }
    }
    let w = cx.width(0);
    let addr_w = if base.size() == 4 || index.size() == 4 {
        32
    } else {
        64
    };
    cx.write(0, s & mask(w.min(addr_w)));
    true
}

fn push<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>) -> bool {
    let size = if cx.is_reg(0) && cx.reg(0).size() == 2 || cx.is_mem(0) && cx.mem_bytes() == 2 {
        2
    } else {
        8
    };
    let src = if cx.is_reg(0) && !cx.reg(0).is_gpr() {
        Sv { v: 0, s: 0, w: 64 } // push fs/gs
    } else {
        cx.read_as(0, size * 8)
    };
    let (rsp, vrsp) = cx.gpr(4);
    cx.check_value(vrsp, ValueUse::Address);
    let src_s = if cx.is_imm(0) { 0 } else { src.s };
    cx.store(rsp.wrapping_sub(size as u64), size as usize, src_s);
    true
}

fn pop<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>) -> bool {
    let size = if cx.is_reg(0) && cx.reg(0).size() == 2 || cx.is_mem(0) && cx.mem_bytes() == 2 {
        2
    } else {
        8
    };
    let (rsp, vrsp) = cx.gpr(4);
    cx.check_value(vrsp, ValueUse::Address);
    let (_, s) = cx.load(rsp, size);
    if cx.is_reg(0) && !cx.reg(0).is_gpr() {
        return true;
    }
    if cx.is_mem(0) && cx.insn.memory_base() == Register::RSP {
        // `pop [rsp+d]` addresses with the incremented rsp: leave such rare forms to the
        // generic rule rather than compute the address twice.
        return false;
    }
    cx.write(0, s);
    true
}

fn alu<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    use Mnemonic::*;
    let same = cx.same_regs(0, 1);
    let a = cx.read(0);
    let w = a.w;
    let b = cx.read_as(1, w);
    let cf = cx.guest.rflags() & 1;
    let vcf = cx.regs.flags.any(FlagShadows::CF) as u64;
    match m {
        Add | Adc if same => {
            // `add r,r` is `r << 1` (plus the carry): VEX folds Add(t,t) to Shl(t,1), whose
            // V bits are the operand's shifted, not an addition's.
            let (c, vc) = if m == Adc { (cf, vcf) } else { (0, 0) };
            let (x, vx) = ((a.v << 1) & mask(w), (a.s << 1) & mask(w));
            let r = x.wrapping_add(c) & mask(w);
            let vr = algebra::add(x, vx, 0, 0, c, vc, w);
            cx.write(0, vr);
            cx.regs.flags = flags::add(a.s, b.s, vc, r, vr, w);
        }
        Add | Adc => {
            let (c, vc) = if m == Adc { (cf, vcf) } else { (0, 0) };
            let r = a.v.wrapping_add(b.v).wrapping_add(c) & mask(w);
            let vr = algebra::add(a.v, a.s, b.v, b.s, c, vc, w);
            cx.write(0, vr);
            cx.regs.flags = flags::add(a.s, b.s, vc, r, vr, w);
        }
        Sub | Cmp if same => {
            // `sub r,r` is the constant 0 (VEX's special case); so are its flags. `cmp r,r`
            // is not special-cased by VEX, but its flags are constant all the same.
            if m == Sub {
                cx.write(0, 0);
            }
            cx.regs.flags = flags::all(false);
        }
        Sbb if same => {
            // `sbb r,r` is 0 - 0 - CF: it depends on CF only (definedness.md trap 5).
            cx.write(0, pcast(vcf, w));
            cx.regs.flags = flags::all(vcf != 0);
        }
        Sub | Sbb | Cmp => {
            let (c, vc) = if m == Sbb { (cf, vcf) } else { (0, 0) };
            let r = a.v.wrapping_sub(b.v).wrapping_sub(c) & mask(w);
            let vr = algebra::sub(a.v, a.s, b.v, b.s, c, vc, w);
            if m != Cmp {
                cx.write(0, vr);
            }
            cx.regs.flags = flags::sub(a.v, a.s, b.v, b.s, c, vc, r, vr, w);
        }
        Xor if same => {
            cx.write(0, 0);
            cx.regs.flags = flags::all(false);
        }
        Xor => {
            let r = (a.v ^ b.v) & mask(w);
            let vr = (a.s | b.s) & mask(w);
            cx.write(0, vr);
            cx.regs.flags = flags::logic(r, vr, w);
        }
        And | Test => {
            let r = a.v & b.v & mask(w);
            let vr = algebra::and(a.v, a.s, b.v, b.s) & mask(w);
            if m == And {
                cx.write(0, vr);
            }
            cx.regs.flags = flags::logic(r, vr, w);
        }
        Or => {
            let r = (a.v | b.v) & mask(w);
            let vr = algebra::or(a.v, a.s, b.v, b.s) & mask(w);
            cx.write(0, vr);
            cx.regs.flags = flags::logic(r, vr, w);
        }
        _ => return false,
    }
    true
}

fn unary<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    use Mnemonic::*;
    let a = cx.read(0);
    let w = a.w;
    match m {
        Not => cx.write(0, a.s),
        Inc | Dec => {
            let (r, vr) = if m == Inc {
                (
                    a.v.wrapping_add(1) & mask(w),
                    algebra::add(a.v, a.s, 1, 0, 0, 0, w),
                )
            } else {
                (
                    a.v.wrapping_sub(1) & mask(w),
                    algebra::sub(a.v, a.s, 1, 0, 0, 0, w),
                )
            };
            cx.write(0, vr);
            cx.regs.flags = flags::inc_dec(cx.regs.flags, a.s, r, vr, w);
        }
        Neg => {
            let r = 0u64.wrapping_sub(a.v) & mask(w);
            let vr = algebra::sub(0, 0, a.v, a.s, 0, 0, w);
            cx.write(0, vr);
            cx.regs.flags = flags::sub(0, 0, a.v, a.s, 0, 0, r, vr, w);
        }
        _ => return false,
    }
    true
}

/// The count operand of a shift: an immediate, `cl`, or the implicit 1.
fn shift_count<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, op: u32) -> Sv {
    if op < cx.op_count() {
        cx.read(op)
    } else {
        Sv { v: 1, s: 0, w: 8 }
    }
}

fn shift<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    use Mnemonic::*;
    let a = cx.read(0);
    let c = shift_count(cx, 1);
    let w = a.w;
    let cmask = if w == 64 { 63 } else { 31 };
    let n = (c.v & cmask) as u32;
    if c.s & cmask != 0 {
        // An undefined count: Memcheck's `scalarShift` UifUs PCast(count) into the result;
        // the flags may or may not have changed.
        cx.write(0, mask(w));
        if matches!(m, Rol | Ror) {
            cx.regs.flags.0 |= FlagShadows::CF | FlagShadows::OF;
        } else {
            cx.regs.flags = flags::all(true);
        }
        return true;
    }
    if n == 0 {
        // Nothing changes, flags included. (The register is not even written: we keep the
        // old upper half of a 32-bit destination, which is the pessimistic choice.)
        return true;
    }
    match m {
        Shl | Sal | Shr | Sar => {
            let (r, vr, vcf) = match m {
                Shl | Sal => {
                    let r = shl(a.v, n) & mask(w);
                    let vcf = n <= w && shr(a.s, w - n) & 1 != 0;
                    (r, shl_shadow(a.s, n, w), vcf || (n > w && a.s != 0))
                }
                Shr => {
                    let r = shr(a.v, n);
                    let vcf = shr(a.s, n - 1) & 1 != 0;
                    (r, shr_shadow(a.s, n, w), vcf)
                }
                _ => {
                    let r = (sext(a.v, w) as i64 >> n.min(63)) as u64 & mask(w);
                    let vcf = sar_shadow(a.s, (n - 1).min(w - 1), w) & 1 != 0;
                    (r, sar_shadow(a.s, n, w), vcf)
                }
            };
            cx.write(0, vr);
            cx.regs.flags = flags::shift(cx.regs.flags, a.s, vcf, r, vr, w);
        }
        _ => {
            // Rotates move V bits with their bits; CF is the bit rotated into the end, OF is
            // defined by the architecture for 1-bit rotates only: PCast of the input.
            let vr = if m == Rol {
                algebra::rol(a.s, n, w)
            } else {
                algebra::ror(a.s, n, w)
            };
            cx.write(0, vr);
            let vcf = if m == Rol {
                vr & 1 != 0
            } else {
                vr & algebra::sign_bit(w) != 0
            };
            // OF is architecturally undefined for counts above 1: this CPU keeps the old one.
            let vof = pcast(a.s, w) != 0 || (n != 1 && cx.regs.flags.any(FlagShadows::OF));
            let mut f = cx.regs.flags.0 & !(FlagShadows::CF | FlagShadows::OF);
            if vcf {
                f |= FlagShadows::CF;
            }
            if vof {
                f |= FlagShadows::OF;
            }
            cx.regs.flags.0 = f;
        }
    }
    true
}

/// `rcl`/`rcr`: a rotate of the (width + 1)-bit quantity CF:x, exact on the shadows.
fn rotate_through_carry<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    let a = cx.read(0);
    let c = shift_count(cx, 1);
    let w = a.w;
    let cmask = if w == 64 { 63 } else { 31 };
    let vcf = cx.regs.flags.any(FlagShadows::CF) as u128;
    if c.s & cmask != 0 {
        cx.write(0, mask(w));
        cx.regs.flags.0 |= FlagShadows::CF | FlagShadows::OF;
        return true;
    }
    let n = ((c.v & cmask) as u32) % (w + 1);
    if n == 0 {
        if c.v & cmask != 0 {
            // A whole turn (8- and 16-bit forms, counts of 9 or 17 and their multiples):
            // the value and CF come back unchanged, but the CPU still writes OF, which is
            // architecturally undefined for counts other than 1: AMD computes it from the
            // result's top bit and CF (Intel leaves it), so it is only as defined as they.
            if vcf != 0 || pcast(a.s, w) != 0 {
                cx.regs.flags.0 |= FlagShadows::OF;
            }
        }
        return true;
    }
    let wide = (vcf << w) | a.s as u128;
    let full = w + 1;
    let fmask: u128 = (1u128 << full) - 1;
    let k = if m == Mnemonic::Rcl { n } else { full - n };
    let rot = ((wide << k) | (wide >> (full - k))) & fmask;
    cx.write(0, (rot as u64) & mask(w));
    let new_cf = (rot >> w) & 1 != 0;
    let vof =
        new_cf || vcf != 0 || pcast(a.s, w) != 0 || (n != 1 && cx.regs.flags.any(FlagShadows::OF));
    let mut f = cx.regs.flags.0 & !(FlagShadows::CF | FlagShadows::OF);
    if new_cf {
        f |= FlagShadows::CF;
    }
    if vof {
        f |= FlagShadows::OF;
    }
    cx.regs.flags.0 = f;
    true
}

/// `shld`/`shrd`: bits shift in from the second operand; the shadows follow them.
fn double_shift<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    let a = cx.read(0);
    let b = cx.read(1);
    let c = shift_count(cx, 2);
    let w = a.w;
    let cmask = if w == 64 { 63 } else { 31 };
    if c.s & cmask != 0 {
        cx.write(0, mask(w));
        cx.regs.flags = flags::all(true);
        return true;
    }
    let n = (c.v & cmask) as u32;
    if n == 0 {
        return true;
    }
    if n > w {
        // 16-bit forms with counts above 16: the result is architecturally undefined.
        cx.write(0, mask(w));
        cx.regs.flags = flags::all(true);
        return true;
    }
    let f = |x: u64, y: u64| -> u64 {
        if m == Mnemonic::Shld {
            (shl(x, n) | shr(y & mask(w), w - n)) & mask(w)
        } else {
            (shr(x & mask(w), n) | shl(y, w - n)) & mask(w)
        }
    };
    let r = f(a.v, b.v);
    let vr = f(a.s, b.s);
    let vcf = if m == Mnemonic::Shld {
        shr(a.s, w - n) & 1 != 0
    } else {
        shr(a.s, n - 1) & 1 != 0
    };
    cx.write(0, vr);
    cx.regs.flags = flags::shift(cx.regs.flags, a.s | b.s, vcf, r, vr, w);
    true
}

/// Multiplication: Memcheck's `Left(UifU)` for the low half (bit i of a product depends on
/// bits 0..=i of the factors) and PCast of that for the high half; flags PCast.
fn multiply<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    match cx.op_count() {
        1 => {
            let s = cx.read(0);
            let w = s.w;
            if w == 8 {
                let al = cx.read_reg(Register::AL);
                let lo = left(al.s | s.s, 8);
                cx.write_reg(Register::AX, (pcast(lo, 8) << 8) | lo);
                cx.regs.flags =
                    flags::with_old(flags::all(lo != 0), cx.regs.flags, flags::MUL_UNDEFINED);
            } else {
                let acc = cx.read_reg(Register::RAX.with_width(w));
                let lo = left(acc.s | s.s, w);
                cx.write_reg(Register::RAX.with_width(w), lo);
                cx.write_reg(Register::RDX.with_width(w), pcast(lo, w));
                cx.regs.flags =
                    flags::with_old(flags::all(lo != 0), cx.regs.flags, flags::MUL_UNDEFINED);
            }
            true
        }
        2 | 3 if m == Mnemonic::Imul => {
            let w = cx.width(0);
            let (x, y) = if cx.op_count() == 2 {
                (cx.read(0), cx.read(1))
            } else {
                (cx.read(1), cx.read_as(2, w))
            };
            let y_s = if cx.op_count() == 3 { 0 } else { y.s };
            let lo = left(x.s | y_s, w);
            cx.write(0, lo);
            cx.regs.flags =
                flags::with_old(flags::all(lo != 0), cx.regs.flags, flags::MUL_UNDEFINED);
            true
        }
        _ => false,
    }
}

/// Division: PCast of dividend and divisor into quotient and remainder (`mkLazy2`), as
/// Memcheck. It does not report an undefined divisor either.
fn divide<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>) -> bool {
    let s = cx.read(0);
    let w = s.w;
    if w == 8 {
        let ax = cx.read_reg(Register::AX);
        let u = pcast(ax.s | s.s, 16);
        cx.write_reg(Register::AX, u);
        cx.regs.flags = flags::with_old(flags::all(u != 0), cx.regs.flags, flags::DIV_UNDEFINED);
    } else {
        let lo = cx.read_reg(Register::RAX.with_width(w));
        let hi = cx.read_reg(Register::RDX.with_width(w));
        let u = pcast(lo.s | hi.s | s.s, w);
        cx.write_reg(Register::RAX.with_width(w), u);
        cx.write_reg(Register::RDX.with_width(w), u);
        cx.regs.flags = flags::with_old(flags::all(u != 0), cx.regs.flags, flags::DIV_UNDEFINED);
    }
    true
}

/// `cmov`: Memcheck's ITE: the shadow of the chosen source, UifU'd with PCast of the
/// condition's V bit. Never a report. A 32-bit `cmov` writes (zero-extends) its destination
/// even when the condition is false.
fn cmov<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>) -> bool {
    let cc: ConditionCode = cx.insn.condition_code();
    let d = cx.read(0);
    let s = cx.read(1);
    let taken = flags::condition_holds(cc, cx.guest.rflags());
    let und = flags::condition_undefined(cc, cx.regs.flags);
    let chosen = if taken { s.s } else { d.s };
    cx.write(0, chosen | pcast(und as u64, d.w));
    true
}

fn branch<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, call: bool) -> bool {
    let indirect = cx.op_count() >= 1 && matches!(cx.kind(0), OpKind::Register | OpKind::Memory);
    let mut ok = true;
    if indirect {
        if cx.is_reg(0) && !cx.reg(0).is_gpr() {
            ok = false;
        } else {
            let t = cx.read(0);
            cx.check_value(t.s, ValueUse::JumpTarget);
        }
    }
    if call {
        // The return address `call` pushes is defined.
        let (rsp, vrsp) = cx.gpr(4);
        cx.check_value(vrsp, ValueUse::Address);
        cx.store(rsp.wrapping_sub(8), 8, 0);
    }
    ok
}

/// `bt`/`bts`/`btr`/`btc`. CF takes the tested bit's V bit; an undefined bit offset makes
/// everything it could select undefined (and its bits that VEX turns into an address are
/// checked as one). A register offset into memory addresses a bit string beyond the
/// operand: [`bit_string`].
fn bit_test<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    if cx.is_mem(0) && !cx.is_imm(1) {
        return bit_string(cx, m);
    }
    let a = cx.read(0);
    let o = cx.read(1);
    let w = a.w;
    let omask = (w - 1) as u64;
    let pos = (o.v & omask) as u32;
    let und_offset = o.s & omask != 0;
    if !cx.is_imm(1) {
        // VEX stores a register operand below the stack pointer and tests bit
        // `offset & 7` of the byte at `+ (offset & mask) >> 3`: the offset's bits above
        // the third are part of an address ("Use of uninitialised value of size 8").
        cx.check_value(o.s & omask & !7, ValueUse::Address);
    }
    let vbit = und_offset || shr(a.s, pos) & 1 != 0;
    // CF is the tested bit; the other flags are architecturally undefined: give them CF's,
    // and keep their old V bits (this CPU leaves them unchanged).
    // ZF is unaffected.
    let old = cx.regs.flags;
    let new = flags::with_old(flags::all(vbit), old, flags::BT_UNDEFINED).0 & !FlagShadows::ZF;
    cx.regs.flags = FlagShadows(new | (old.0 & FlagShadows::ZF));
    if m != Mnemonic::Bt {
        let vr = if und_offset {
            mask(w)
        } else if m == Mnemonic::Btc {
            a.s
        } else {
            a.s & !shl(1, pos)
        };
        cx.write(0, vr);
    }
    true
}

/// `bt [mem], reg` and friends address a bit string: the byte at `ea + (offset >>s 3)`,
/// bit `offset & 7` (as VEX computes it). The offset's upper bits form part of an address,
/// so their undefinedness is an address error; its low three bits select the bit.
fn bit_string<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    let o = cx.read(1);
    let ea = cx.address();
    let off = sext(o.v, o.w) as i64;
    let voff = sext(o.s, o.w);
    cx.check_value(voff & !7, ValueUse::Address);
    let addr = ea.wrapping_add((off >> 3) as u64);
    let pos = (off & 7) as u32;
    let (_, s) = cx.load(addr, 1);
    let und_pos = voff & 7 != 0;
    let vbit = und_pos || (s >> pos) & 1 != 0;
    let old = cx.regs.flags;
    let new = flags::with_old(flags::all(vbit), old, flags::BT_UNDEFINED).0 & !FlagShadows::ZF;
    cx.regs.flags = FlagShadows(new | (old.0 & FlagShadows::ZF));
    if m != Mnemonic::Bt {
        let vr = if und_pos {
            0xff
        } else if m == Mnemonic::Btc {
            s
        } else {
            s & !(1u64 << pos)
        };
        cx.store(addr, 1, vr);
    }
    true
}

/// `bsf`, `bsr`, `tzcnt`, `lzcnt`, `popcnt`.
fn count_bits<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    use Mnemonic::*;
    let s = cx.read(1);
    let w = s.w;
    let x = s.v & mask(w);
    let zero_und = algebra::zero_test_undefined(x, s.s, w);
    match m {
        Bsf | Bsr => {
            let und = if m == Bsf {
                algebra::ctz_undefined(x, s.s, w)
            } else {
                algebra::clz_undefined(x, s.s, w)
            };
            if und {
                cx.write(0, mask(w));
            } else if x != 0 {
                cx.write(0, 0);
            }
            // A defined zero source leaves the destination as it was.
            let mut f = flags::with_old(flags::all(und), cx.regs.flags, flags::BSF_UNDEFINED);
            if zero_und {
                f.0 |= FlagShadows::ZF;
            } else {
                f.0 &= !FlagShadows::ZF;
            }
            cx.regs.flags = f;
        }
        Tzcnt | Lzcnt => {
            let und = if m == Tzcnt {
                algebra::ctz_undefined(x, s.s, w)
            } else {
                algebra::clz_undefined(x, s.s, w)
            };
            cx.write(0, pcast(und as u64, w));
            // CF: source == 0; ZF: result == 0, i.e. the lowest (tzcnt) or highest (lzcnt)
            // source bit is set.
            let zf_bit = if m == Tzcnt {
                s.s & 1
            } else {
                shr(s.s, w - 1) & 1
            };
            let mut f = flags::with_old(flags::all(und), cx.regs.flags, flags::TZCNT_UNDEFINED).0
                & !(FlagShadows::CF | FlagShadows::ZF);
            if zero_und {
                f |= FlagShadows::CF;
            }
            if zf_bit != 0 {
                f |= FlagShadows::ZF;
            }
            cx.regs.flags = FlagShadows(f);
        }
        _ => {
            // popcnt: every source bit counts (Memcheck: PCast); ZF is "source == 0", the
            // other flags are cleared.
            cx.write(0, pcast(s.s, w));
            cx.regs.flags = FlagShadows(if zero_und { FlagShadows::ZF } else { 0 });
        }
    }
    true
}

/// `cmpxchg`: the accumulator is compared with the destination (flags as `cmp`, so ZF is
/// exact); the real outcome steers the shadows, as Memcheck's CAS handling does (the
/// comparison inside a CAS counts as defined: `COMMENT_ON_CasCmpEQ`).
fn cmpxchg<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>) -> bool {
    let d = cx.read(0);
    let w = d.w;
    let s = cx.read(1);
    let acc_reg = Register::RAX.with_width(w);
    let acc = cx.read_reg(acc_reg);
    let r = acc.v.wrapping_sub(d.v) & mask(w);
    let vr = algebra::sub(acc.v, acc.s, d.v, d.s, 0, 0, w);
    cx.regs.flags = flags::sub(acc.v, acc.s, d.v, d.s, 0, 0, r, vr, w);
    if acc.v == d.v {
        cx.write(0, s.s);
    } else {
        cx.write_reg(acc_reg, d.s);
        if cx.is_mem(0) {
            // The processor writes the old value back.
            cx.write(0, d.s);
        }
    }
    true
}

/// `cmpxchg8b`/`cmpxchg16b`: edx:eax (rdx:rax) against the memory operand, ZF exact over the
/// whole width; the real outcome steers the shadows, as for `cmpxchg`.
fn cmpxchg_double<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, wide: bool) -> bool {
    let half = if wide { 8 } else { 4 };
    let w = (half * 8) as u32;
    let addr = cx.address();
    let (lo, vlo) = cx.load(addr, half);
    let (hi, vhi) = cx.load(addr.wrapping_add(half as u64), half);
    let (acc_lo, acc_hi, new_lo, new_hi) = if wide {
        (Register::RAX, Register::RDX, Register::RBX, Register::RCX)
    } else {
        (Register::EAX, Register::EDX, Register::EBX, Register::ECX)
    };
    let (a, b) = (cx.read_reg(acc_lo), cx.read_reg(acc_hi));
    let (c, d) = (cx.read_reg(new_lo), cx.read_reg(new_hi));
    // Equal iff both halves are: decided by a defined differing bit in either half.
    let lo_und = algebra::eq_undefined(a.v, a.s, lo, vlo, w);
    let hi_und = algebra::eq_undefined(b.v, b.s, hi, vhi, w);
    let differs = |x: u64, vx: u64, y: u64, vy: u64| (x ^ y) & !(vx | vy) & mask(w) != 0;
    let lo_ne_decided = differs(a.v, a.s, lo, vlo);
    let hi_ne_decided = differs(b.v, b.s, hi, vhi);
    let zf_und = (lo_und || hi_und) && !(lo_ne_decided || hi_ne_decided);
    let old = cx.regs.flags;
    cx.regs.flags =
        FlagShadows((old.0 & !FlagShadows::ZF) | if zf_und { FlagShadows::ZF } else { 0 });
    if a.v & mask(w) == lo & mask(w) && b.v & mask(w) == hi & mask(w) {
        cx.store(addr, half, c.s);
        cx.store(addr.wrapping_add(half as u64), half, d.s);
    } else {
        cx.write_reg(acc_lo, vlo);
        cx.write_reg(acc_hi, vhi);
    }
    true
}

/// `blsr`, `blsmsk`, `blsi` exactly: each result is a function of the position of the lowest
/// set bit (and, for `blsr`, the bits above it). When that position is defined (the bits up
/// to it are), the result is as defined as those bits; when not, it lies between the lowest
/// undefined bit `u` and the lowest defined 1 above it `d`, and only bits in that range (plus,
/// for `blsr`, the undefined bits above `d`) are undefined. VEX's composition (`x ^ (x - 1)`
/// with UifU) loses that `x` and `x - 1` agree above the lowest set bit; this does not, so
/// `blsmsk` of a lane mask with a defined NUL lane is fully defined.
fn lowest_set_bit_op(m: Mnemonic, x: u64, vx: u64, w: u32) -> (u64, u64) {
    let full = mask(w);
    let r = match m {
        Mnemonic::Blsr => x & x.wrapping_sub(1) & full,
        Mnemonic::Blsmsk => (x ^ x.wrapping_sub(1)) & full,
        _ => x & x.wrapping_neg() & full,
    };
    let below_and_at = |p: u32| {
        if p + 1 >= 64 {
            u64::MAX
        } else {
            (1u64 << (p + 1)) - 1
        }
    };
    if !algebra::ctz_undefined(x, vx, w) {
        // The lowest set bit is known (x == 0 included: every bit is defined then).
        let vr = if m == Mnemonic::Blsr && x != 0 {
            vx & !below_and_at(x.trailing_zeros())
        } else {
            0
        };
        return (r, vr & full);
    }
    let u = vx.trailing_zeros();
    let defined_ones_above = x & !vx & full & !below_and_at(u);
    let range_top = if defined_ones_above == 0 {
        full
    } else {
        below_and_at(defined_ones_above.trailing_zeros())
    };
    let vr = match m {
        // bit u is 1 whatever the lowest set bit is (it is at u or above).
        Mnemonic::Blsmsk => range_top & !below_and_at(u),
        // A defined 0 of x in the range is neither the lowest set bit (blsi) nor kept as a 1
        // (blsr): defined 0 in the result.
        Mnemonic::Blsi => range_top & !(below_and_at(u) >> 1) & (vx | x),
        _ => (range_top & !(below_and_at(u) >> 1) & (vx | x)) | (vx & !range_top),
    };
    (r, vr & full)
}
