//! String instructions (`movs`, `stos`, `lods`, `cmps`, `scas`), with and without `rep`.
//!
//! VEX turns a `rep` instruction into one loop iteration per block execution: "if rcx == 0
//! leave; do one element; rcx -= 1; (for cmps/scas) if the condition fails leave". Memcheck
//! therefore checks `rcx` (a conditional exit) and, for `repe`/`repne`, the compare's ZF on
//! each iteration. The slow path sees the whole instruction at once, so it does all the
//! iterations the hardware will do, with the real values deciding when `cmps`/`scas`
//! stop, and reports each kind of check once. Copies move shadows byte for byte (copying
//! undefined bytes is legal: definedness.md trap 7).

use iced_x86::{Mnemonic, Register};

use crate::algebra::{self, mask};
use crate::ctx::Ctx;
use crate::flags;
use crate::state::{Guest, ShadowMemory};
use crate::{Check, ValueUse};

pub(crate) fn rule<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>) -> bool {
    if !cx.insn.is_string_instruction() {
        return false;
    }
    use Mnemonic::*;
    let m = cx.insn.mnemonic();
    let kind = match m {
        Movsb | Movsw | Movsd | Movsq => Kind::Movs,
        Stosb | Stosw | Stosd | Stosq => Kind::Stos,
        Lodsb | Lodsw | Lodsd | Lodsq => Kind::Lods,
        Cmpsb | Cmpsw | Cmpsd | Cmpsq => Kind::Cmps,
        Scasb | Scasw | Scasd | Scasq => Kind::Scas,
        _ => return false,
    };
    let e = cx.insn.memory_size().size().clamp(1, 8);
    let w = (e * 8) as u32;
    let repeated =
        cx.insn.has_rep_prefix() || cx.insn.has_repe_prefix() || cx.insn.has_repne_prefix();
    let addr32 = cx.insn.memory_base().size() == 4 || cx.insn.memory_index().size() == 4;
    let amask = if addr32 { 0xffff_ffff } else { u64::MAX };
    let backwards = cx.guest.rflags() & (1 << 10) != 0;
    let step = |addr: u64, k: u64| -> u64 {
        let d = k.wrapping_mul(e as u64);
        (if backwards {
            addr.wrapping_sub(d)
        } else {
            addr.wrapping_add(d)
        }) & amask
    };

    let (rcx, vrcx) = cx.gpr(1);
    let (rcx, vrcx) = if addr32 {
        (rcx & amask, vrcx & amask)
    } else {
        (rcx, vrcx)
    };
    let cw = if addr32 { 32 } else { 64 };
    let count = if repeated {
        // rcx is decremented exactly; its undefined bits never become defined, so the last
        // "rcx == 0" test (at 0, with no defined 1 bit left) is undefined whenever any bit
        // of rcx is. cmps/scas may stop earlier: they test each iteration below.
        if vrcx != 0 && !matches!(kind, Kind::Cmps | Kind::Scas) {
            cx.checks.push(Check::Condition);
        }
        rcx
    } else {
        1
    };
    let (rsi, vrsi) = cx.gpr(6);
    let (rdi, vrdi) = cx.gpr(7);
    let uses_rsi = matches!(kind, Kind::Movs | Kind::Lods | Kind::Cmps);
    let uses_rdi = matches!(kind, Kind::Movs | Kind::Stos | Kind::Cmps | Kind::Scas);
    let vaddr = if uses_rsi { vrsi } else { 0 } | if uses_rdi { vrdi } else { 0 };
    if count != 0 {
        cx.check_value(vaddr & amask, ValueUse::Address);
    }
    let acc = match e {
        1 => Register::AL,
        2 => Register::AX,
        4 => Register::EAX,
        _ => Register::RAX,
    };

    match kind {
        Kind::Movs => {
            if count == 0 {
                return true;
            }
            if backwards {
                for k in 0..count {
                    let (_, s) = cx.load(step(rsi, k), e);
                    cx.store(step(rdi, k), e, s);
                }
            } else {
                let len = count.wrapping_mul(e as u64);
                cx.mem.copy(rdi & amask, rsi & amask, len);
            }
        }
        Kind::Stos => {
            let s = cx.read_reg(acc).s.to_le_bytes();
            let mut buf = [0u8; 256];
            for (i, b) in buf.iter_mut().enumerate() {
                *b = s[i % e];
            }
            if backwards {
                for k in 0..count {
                    cx.store(step(rdi, k), e, cx.read_reg(acc).s);
                }
            } else {
                let len = count.wrapping_mul(e as u64);
                let chunk = (256 / e * e) as u64;
                let mut done = 0u64;
                while done < len {
                    let n = (len - done).min(chunk) as usize;
                    cx.mem.store((rdi & amask).wrapping_add(done), &buf[..n]);
                    done += n as u64;
                }
            }
        }
        Kind::Lods => {
            if count == 0 {
                return true;
            }
            let (_, s) = cx.load(step(rsi, count - 1), e);
            cx.write_reg(acc, s);
        }
        Kind::Cmps | Kind::Scas => {
            let repe = cx.insn.has_repe_prefix();
            let mut reported = false;
            let mut k = 0u64;
            let (mut c, mut vc) = (rcx, vrcx);
            loop {
                if repeated {
                    if vc != 0 && algebra::zero_test_undefined(c, vc, cw) {
                        cx.checks.push(Check::Condition);
                        reported = true;
                    }
                    if c == 0 {
                        break;
                    }
                    vc = algebra::sub(c, vc, 1, 0, 0, 0, cw);
                    c = c.wrapping_sub(1) & amask;
                } else if k >= count {
                    break;
                }
                let (b, vb) = cx.load(step(rdi, k), e);
                let (a, va) = if kind == Kind::Cmps {
                    cx.load(step(rsi, k), e)
                } else {
                    let r = cx.read_reg(acc);
                    (r.v, r.s)
                };
                // cmps compares [rsi] with [rdi]; scas the accumulator with [rdi].
                let r = a.wrapping_sub(b) & mask(w);
                let vr = algebra::sub(a, va, b, vb, 0, 0, w);
                cx.regs.flags = flags::sub(a, va, b, vb, 0, 0, r, vr, w);
                k += 1;
                if !repeated {
                    break;
                }
                if cx.regs.flags.any(crate::FlagShadows::ZF) && !reported {
                    cx.checks.push(Check::Condition);
                    reported = true;
                }
                // VEX tests ZF after every element, the last one included.
                let equal = a & mask(w) == b & mask(w);
                if equal != repe {
                    break;
                }
            }
        }
    }
    true
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Movs,
    Stos,
    Lods,
    Cmps,
    Scas,
}
