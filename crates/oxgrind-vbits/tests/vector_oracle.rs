//! The soundness oracle for SSE rules: as `oracle.rs`, with two xmm operands. The result
//! (an xmm register, a general register for `pmovmskb`, the flags for `ptest`) runs natively
//! over completions of the undefined input bits; every bit called defined must not change.
#![cfg(target_arch = "x86_64")]

mod common;

use std::arch::asm;

use common::*;
use iced_x86::code_asm::*;
use iced_x86::Instruction;
use oxgrind_vbits::{FlagShadows, Interpreter, ShadowRegisters};

/// (a, b) -> (xmm result, general register result, rflags)
type Native = fn(u128, u128) -> (u128, u64, u64);

macro_rules! native_xmm {
    ($t:literal) => {{
        fn run(a: u128, b: u128) -> (u128, u64, u64) {
            use std::arch::x86_64::__m128i;
            // SAFETY: u128 and __m128i are both 16 plain bytes.
            let mut x: __m128i = unsafe { std::mem::transmute(a) };
            let y: __m128i = unsafe { std::mem::transmute(b) };
            let g: u64;
            let f: u64;
            // SAFETY: the template computes on the given xmm registers and one general
            // register; flags are read back with pushfq.
            unsafe {
                asm!("/* {x} {y} {g} */", $t, "pushfq", "pop {f}",
                     x = inout(xmm_reg) x, y = in(xmm_reg) y, g = out(reg) g, f = lateout(reg) f);
            }
            // SAFETY: as above.
            (unsafe { std::mem::transmute::<__m128i, u128>(x) }, g, f)
        }
        run as Native
    }};
}

#[derive(Clone, Copy, PartialEq)]
enum Out {
    Xmm,
    Gpr,
    Flags,
}

struct Case {
    insn: Instruction,
    native: Native,
    out: Out,
    /// Bits of the gpr result that are meaningful.
    gpr_mask: u64,
}

fn xmm(insn: Instruction, native: Native) -> Case {
    Case {
        insn,
        native,
        out: Out::Xmm,
        gpr_mask: 0,
    }
}

fn bits128(x: u128) -> Vec<u32> {
    (0..128).filter(|i| x >> i & 1 != 0).collect()
}

/// A 128-bit shadow with the patterns string code meets: whole undefined bytes past an end,
/// sparse bits, nothing.
fn shadow128(rng: &mut Rng) -> u128 {
    match rng.below(5) {
        0 | 1 => 0,
        2 => {
            let from = rng.below(16) * 8;
            u128::MAX << from
        }
        3 => {
            (rng.next() as u128 & rng.next() as u128 & rng.next() as u128)
                | ((rng.next() as u128 & rng.next() as u128 & rng.next() as u128) << 64)
        }
        _ => 1u128 << rng.below(128),
    }
}

fn check(c: &Case, samples: usize, seed: u64) {
    let mut rng = Rng(seed);
    let mut interp = Interpreter::new();
    for _ in 0..samples {
        // Values with repeated bytes, so that compares find equal lanes.
        let pick = |rng: &mut Rng| -> u128 {
            let x = (rng.next() as u128) | ((rng.next() as u128) << 64);
            if rng.below(2) == 0 {
                x & 0x0303_0303_0303_0303_0303_0303_0303_0303
            } else {
                x
            }
        };
        let (a, b) = (pick(&mut rng), pick(&mut rng));
        let (va, vb) = (shadow128(&mut rng), shadow128(&mut rng));
        let mut guest = TestGuest::default();
        guest.vector[0][..16].copy_from_slice(&a.to_le_bytes());
        guest.vector[1][..16].copy_from_slice(&b.to_le_bytes());
        let mut regs = ShadowRegisters::default();
        regs.vector[0][..16].copy_from_slice(&va.to_le_bytes());
        regs.vector[1][..16].copy_from_slice(&vb.to_le_bytes());
        let mut mem = MapShadow::default();
        interp.step(&c.insn, &guest, &mut regs, &mut mem);
        let out_x = u128::from_le_bytes(regs.vector[0][..16].try_into().unwrap());
        let out_g = regs.gpr[RAX];
        let out_f = regs.flags.0;

        let mut positions = bits128(va);
        positions.extend(bits128(vb).iter().map(|p| p + 128));
        let exhaustive = positions.len() <= 12;
        let count = if exhaustive {
            1u64 << positions.len()
        } else {
            2048
        };
        let mut first = None;
        for k in 0..count {
            let pick = if exhaustive { k } else { rng.next() };
            let (mut x, mut y) = (a, b);
            for (j, p) in positions.iter().enumerate() {
                let bit = ((pick >> (j % 64)) & 1) as u128;
                if *p < 128 {
                    x = (x & !(1u128 << p)) | bit << p;
                } else {
                    y = (y & !(1u128 << (p - 128))) | bit << (p - 128);
                }
            }
            let r = (c.native)(x, y);
            match first {
                None => first = Some(r),
                Some((x0, g0, f0)) => {
                    let bad = match c.out {
                        Out::Xmm => (r.0 ^ x0) & !out_x != 0,
                        Out::Gpr => (r.1 ^ g0) & c.gpr_mask & !out_g != 0,
                        Out::Flags => FlagShadows::RFLAGS_BITS
                            .iter()
                            .enumerate()
                            .any(|(i, fb)| out_f >> i & 1 == 0 && (r.2 ^ f0) >> fb & 1 != 0),
                    };
                    assert!(
                        !bad,
                        "unsound: `{}` a={a:#x} va={va:#x} b={b:#x} vb={vb:#x}: shadows xmm {out_x:#x} gpr {out_g:#x} flags {out_f:#x}",
                        format(&c.insn)
                    );
                }
            }
        }
    }
}

fn cases() -> Vec<Case> {
    vec![
        xmm(
            asm(|a| a.pcmpeqb(xmm0, xmm1)),
            native_xmm!("pcmpeqb {x}, {y}"),
        ),
        xmm(
            asm(|a| a.pcmpeqd(xmm0, xmm1)),
            native_xmm!("pcmpeqd {x}, {y}"),
        ),
        xmm(
            asm(|a| a.pcmpgtw(xmm0, xmm1)),
            native_xmm!("pcmpgtw {x}, {y}"),
        ),
        xmm(asm(|a| a.paddb(xmm0, xmm1)), native_xmm!("paddb {x}, {y}")),
        xmm(asm(|a| a.psubq(xmm0, xmm1)), native_xmm!("psubq {x}, {y}")),
        xmm(
            asm(|a| a.pminub(xmm0, xmm1)),
            native_xmm!("pminub {x}, {y}"),
        ),
        xmm(
            asm(|a| a.pmaxub(xmm0, xmm1)),
            native_xmm!("pmaxub {x}, {y}"),
        ),
        xmm(
            asm(|a| a.pminsw(xmm0, xmm1)),
            native_xmm!("pminsw {x}, {y}"),
        ),
        xmm(
            asm(|a| a.pmaxsw(xmm0, xmm1)),
            native_xmm!("pmaxsw {x}, {y}"),
        ),
        xmm(
            asm(|a| a.pminsb(xmm0, xmm1)),
            native_xmm!("pminsb {x}, {y}"),
        ),
        xmm(
            asm(|a| a.pmaxud(xmm0, xmm1)),
            native_xmm!("pmaxud {x}, {y}"),
        ),
        xmm(
            asm(|a| a.pminsd(xmm0, xmm1)),
            native_xmm!("pminsd {x}, {y}"),
        ),
        xmm(
            asm(|a| a.pmaddwd(xmm0, xmm1)),
            native_xmm!("pmaddwd {x}, {y}"),
        ),
        xmm(
            asm(|a| a.pmuludq(xmm0, xmm1)),
            native_xmm!("pmuludq {x}, {y}"),
        ),
        xmm(
            asm(|a| a.psadbw(xmm0, xmm1)),
            native_xmm!("psadbw {x}, {y}"),
        ),
        xmm(
            asm(|a| a.packuswb(xmm0, xmm1)),
            native_xmm!("packuswb {x}, {y}"),
        ),
        xmm(
            asm(|a| a.packssdw(xmm0, xmm1)),
            native_xmm!("packssdw {x}, {y}"),
        ),
        xmm(asm(|a| a.pand(xmm0, xmm1)), native_xmm!("pand {x}, {y}")),
        xmm(asm(|a| a.pandn(xmm0, xmm1)), native_xmm!("pandn {x}, {y}")),
        xmm(asm(|a| a.por(xmm0, xmm1)), native_xmm!("por {x}, {y}")),
        xmm(asm(|a| a.pxor(xmm0, xmm1)), native_xmm!("pxor {x}, {y}")),
        xmm(asm(|a| a.pxor(xmm0, xmm0)), native_xmm!("pxor {x}, {x}")),
        xmm(
            asm(|a| a.pcmpeqb(xmm0, xmm0)),
            native_xmm!("pcmpeqb {x}, {x}"),
        ),
        xmm(
            asm(|a| a.pshufb(xmm0, xmm1)),
            native_xmm!("pshufb {x}, {y}"),
        ),
        xmm(
            asm(|a| a.pshufd(xmm0, xmm1, 0x1b)),
            native_xmm!("pshufd {x}, {y}, 0x1b"),
        ),
        xmm(
            asm(|a| a.pshuflw(xmm0, xmm1, 0x4e)),
            native_xmm!("pshuflw {x}, {y}, 0x4e"),
        ),
        xmm(
            asm(|a| a.pshufhw(xmm0, xmm1, 0x93)),
            native_xmm!("pshufhw {x}, {y}, 0x93"),
        ),
        xmm(
            asm(|a| a.shufps(xmm0, xmm1, 0xb1)),
            native_xmm!("shufps {x}, {y}, 0xb1"),
        ),
        xmm(
            asm(|a| a.shufpd(xmm0, xmm1, 2)),
            native_xmm!("shufpd {x}, {y}, 2"),
        ),
        xmm(
            asm(|a| a.punpcklbw(xmm0, xmm1)),
            native_xmm!("punpcklbw {x}, {y}"),
        ),
        xmm(
            asm(|a| a.punpckhwd(xmm0, xmm1)),
            native_xmm!("punpckhwd {x}, {y}"),
        ),
        xmm(
            asm(|a| a.punpckldq(xmm0, xmm1)),
            native_xmm!("punpckldq {x}, {y}"),
        ),
        xmm(
            asm(|a| a.punpckhqdq(xmm0, xmm1)),
            native_xmm!("punpckhqdq {x}, {y}"),
        ),
        xmm(
            asm(|a| a.unpcklps(xmm0, xmm1)),
            native_xmm!("unpcklps {x}, {y}"),
        ),
        xmm(
            asm(|a| a.palignr(xmm0, xmm1, 5)),
            native_xmm!("palignr {x}, {y}, 5"),
        ),
        xmm(
            asm(|a| a.pblendw(xmm0, xmm1, 0x5a)),
            native_xmm!("pblendw {x}, {y}, 0x5a"),
        ),
        xmm(
            asm(|a| a.blendps(xmm0, xmm1, 0x6)),
            native_xmm!("blendps {x}, {y}, 6"),
        ),
        xmm(asm(|a| a.pslldq(xmm0, 3)), native_xmm!("pslldq {x}, 3")),
        xmm(asm(|a| a.psrldq(xmm0, 7)), native_xmm!("psrldq {x}, 7")),
        xmm(asm(|a| a.psrlw(xmm0, 3)), native_xmm!("psrlw {x}, 3")),
        xmm(asm(|a| a.psrad(xmm0, 9)), native_xmm!("psrad {x}, 9")),
        xmm(asm(|a| a.psllq(xmm0, 13)), native_xmm!("psllq {x}, 13")),
        xmm(
            asm(|a| a.pmovzxbw(xmm0, xmm1)),
            native_xmm!("pmovzxbw {x}, {y}"),
        ),
        xmm(
            asm(|a| a.pmovsxwd(xmm0, xmm1)),
            native_xmm!("pmovsxwd {x}, {y}"),
        ),
        xmm(asm(|a| a.movss(xmm0, xmm1)), native_xmm!("movss {x}, {y}")),
        xmm(
            asm(|a| a.movsd_2(xmm0, xmm1)),
            native_xmm!("movsd {x}, {y}"),
        ),
        xmm(
            asm(|a| a.movhlps(xmm0, xmm1)),
            native_xmm!("movhlps {x}, {y}"),
        ),
        xmm(
            asm(|a| a.movlhps(xmm0, xmm1)),
            native_xmm!("movlhps {x}, {y}"),
        ),
        xmm(asm(|a| a.movq(xmm0, xmm1)), native_xmm!("movq {x}, {y}")),
        xmm(
            asm(|a| a.movddup(xmm0, xmm1)),
            native_xmm!("movddup {x}, {y}"),
        ),
        xmm(
            asm(|a| a.movshdup(xmm0, xmm1)),
            native_xmm!("movshdup {x}, {y}"),
        ),
        xmm(
            asm(|a| a.insertps(xmm0, xmm1, 0x9c)),
            native_xmm!("insertps {x}, {y}, 0x9c"),
        ),
        xmm(asm(|a| a.addps(xmm0, xmm1)), native_xmm!("addps {x}, {y}")),
        xmm(asm(|a| a.mulpd(xmm0, xmm1)), native_xmm!("mulpd {x}, {y}")),
        xmm(asm(|a| a.addsd(xmm0, xmm1)), native_xmm!("addsd {x}, {y}")),
        xmm(
            asm(|a| a.sqrtss(xmm0, xmm1)),
            native_xmm!("sqrtss {x}, {y}"),
        ),
        xmm(
            asm(|a| a.cvtps2pd(xmm0, xmm1)),
            native_xmm!("cvtps2pd {x}, {y}"),
        ),
        xmm(
            asm(|a| a.cvtpd2ps(xmm0, xmm1)),
            native_xmm!("cvtpd2ps {x}, {y}"),
        ),
        xmm(
            asm(|a| a.cvtss2sd(xmm0, xmm1)),
            native_xmm!("cvtss2sd {x}, {y}"),
        ),
        xmm(
            asm(|a| a.cmpps(xmm0, xmm1, 1)),
            native_xmm!("cmpltps {x}, {y}"),
        ),
        Case {
            insn: asm(|a| a.pmovmskb(eax, xmm1)),
            native: native_xmm!("pmovmskb {g:e}, {y}"),
            out: Out::Gpr,
            gpr_mask: 0xffff_ffff,
        },
        Case {
            insn: asm(|a| a.movmskps(eax, xmm1)),
            native: native_xmm!("movmskps {g:e}, {y}"),
            out: Out::Gpr,
            gpr_mask: 0xffff_ffff,
        },
        Case {
            insn: asm(|a| a.pextrw(eax, xmm1, 5)),
            native: native_xmm!("pextrw {g:e}, {y}, 5"),
            out: Out::Gpr,
            gpr_mask: 0xffff_ffff,
        },
        Case {
            insn: asm(|a| a.cvttsd2si(rax, xmm1)),
            native: native_xmm!("cvttsd2si {g}, {y}"),
            out: Out::Gpr,
            gpr_mask: u64::MAX,
        },
        Case {
            insn: asm(|a| a.ptest(xmm0, xmm1)),
            native: native_xmm!("ptest {x}, {y}"),
            out: Out::Flags,
            gpr_mask: 0,
        },
        Case {
            insn: asm(|a| a.ucomisd(xmm0, xmm1)),
            native: native_xmm!("ucomisd {x}, {y}"),
            out: Out::Flags,
            gpr_mask: 0,
        },
    ]
}

#[test]
fn every_vector_bit_called_defined_is_invariant_over_completions() {
    for (i, c) in cases().iter().enumerate() {
        check(c, 300, 0x5eed_0000 + i as u64);
    }
}
