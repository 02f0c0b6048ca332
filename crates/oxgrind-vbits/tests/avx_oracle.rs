//! The soundness oracle for AVX2 and AVX-512 rules (this CPU has AVX-512; the test skips
//! itself where it does not). Inputs: zmm0 = a, zmm1 = b, k1 = a's low 64 bits, k2 = b's
//! low 64 bits; outputs compared: all of zmm0 (VEX and EVEX writes zero the upper lanes),
//! k1, rax and the flags.
#![cfg(target_arch = "x86_64")]

mod common;

use std::arch::asm;

use common::*;
use iced_x86::code_asm::*;
use iced_x86::Instruction;
use oxgrind_vbits::{FlagShadows, Interpreter, ShadowRegisters};

type V = [u8; 64];
/// (a, b) -> (zmm0, k1, rax, rflags)
type Native = fn(&V, &V) -> (V, u64, u64, u64);

macro_rules! native {
    ($t:literal) => {{
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,bmi1")]
        unsafe fn inner(a: &V, b: &V, out: &mut V) -> (u64, u64, u64) {
            let (k, g, f): (u64, u64, u64);
            // SAFETY: only the named registers are touched; the caller checked the CPU.
            unsafe {
                asm!(
                    "vmovdqu64 zmm0, [{a}]",
                    "vmovdqu64 zmm1, [{b}]",
                    "kmovq k1, [{a}]",
                    "kmovq k2, [{b}]",
                    "xor eax, eax",
                    $t,
                    "vmovdqu64 [{o}], zmm0",
                    "kmovq {k}, k1",
                    "pushfq",
                    "pop {f}",
                    a = in(reg) a.as_ptr(),
                    b = in(reg) b.as_ptr(),
                    o = in(reg) out.as_mut_ptr(),
                    k = out(reg) k,
                    f = out(reg) f,
                    out("rax") g,
                    out("zmm0") _,
                    out("zmm1") _,
                    out("k1") _,
                    out("k2") _,
                );
            }
            (k, g, f)
        }
        fn run(a: &V, b: &V) -> (V, u64, u64, u64) {
            let mut out = [0u8; 64];
            // SAFETY: tests call this only when the CPU has AVX-512 BW/VL/DQ.
            let (k, g, f) = unsafe { inner(a, b, &mut out) };
            (out, k, g, f)
        }
        run as Native
    }};
}

struct Case {
    insn: Instruction,
    native: Native,
    gpr_mask: u64,
    check_flags: bool,
}

fn c(insn: Instruction, native: Native) -> Case {
    Case {
        insn,
        native,
        gpr_mask: 0,
        check_flags: false,
    }
}

fn shadow_bytes(rng: &mut Rng) -> V {
    let mut v = [0u8; 64];
    match rng.below(5) {
        0 | 1 => {}
        2 => {
            let from = rng.below(64) as usize;
            v[from..].fill(0xff);
        }
        3 => {
            for b in v.iter_mut() {
                *b = (rng.next() & rng.next() & rng.next()) as u8;
            }
        }
        _ => {
            let bit = rng.below(512) as usize;
            v[bit / 8] = 1 << (bit % 8);
        }
    }
    v
}

fn positions(v: &V) -> Vec<usize> {
    (0..512).filter(|i| v[i / 8] >> (i % 8) & 1 != 0).collect()
}

fn check(case: &Case, samples: usize, seed: u64) {
    let mut rng = Rng(seed);
    let mut interp = Interpreter::new();
    for _ in 0..samples {
        let mut a = [0u8; 64];
        let mut b = [0u8; 64];
        let small = rng.below(2) == 0;
        for (x, y) in a.iter_mut().zip(b.iter_mut()) {
            *x = rng.next() as u8;
            *y = rng.next() as u8;
            if small {
                *x &= 3;
                *y &= 3;
            }
        }
        let (va, vb) = (shadow_bytes(&mut rng), shadow_bytes(&mut rng));
        let mut guest = TestGuest::default();
        guest.vector[0] = a;
        guest.vector[1] = b;
        guest.opmask[1] = u64::from_le_bytes(a[..8].try_into().unwrap());
        guest.opmask[2] = u64::from_le_bytes(b[..8].try_into().unwrap());
        let mut regs = ShadowRegisters::default();
        regs.vector[0] = va;
        regs.vector[1] = vb;
        regs.opmask[1] = u64::from_le_bytes(va[..8].try_into().unwrap());
        regs.opmask[2] = u64::from_le_bytes(vb[..8].try_into().unwrap());
        let mut mem = MapShadow::default();
        interp.step(&case.insn, &guest, &mut regs, &mut mem);
        let (out_z, out_k, out_g, out_f) =
            (regs.vector[0], regs.opmask[1], regs.gpr[RAX], regs.flags.0);

        let mut pos: Vec<usize> = positions(&va);
        pos.extend(positions(&vb).iter().map(|p| p + 512));
        let exhaustive = pos.len() <= 10;
        let count = if exhaustive { 1u64 << pos.len() } else { 1024 };
        let mut first: Option<(V, u64, u64, u64)> = None;
        for k in 0..count {
            let pick = if exhaustive { k } else { rng.next() };
            let (mut x, mut y) = (a, b);
            for (j, p) in pos.iter().enumerate() {
                let bit = ((pick >> (j % 64)) & 1) as u8;
                let (v, q) = if *p < 512 {
                    (&mut x, *p)
                } else {
                    (&mut y, *p - 512)
                };
                v[q / 8] = (v[q / 8] & !(1 << (q % 8))) | bit << (q % 8);
            }
            let r = (case.native)(&x, &y);
            match &first {
                None => first = Some(r),
                Some((z_first, k_first, g_first, f_first)) => {
                    let zbad = (0..64).any(|i| (r.0[i] ^ z_first[i]) & !out_z[i] != 0);
                    let kbad = (r.1 ^ k_first) & !out_k != 0;
                    let gbad = (r.2 ^ g_first) & case.gpr_mask & !out_g != 0;
                    let fbad = case.check_flags
                        && FlagShadows::RFLAGS_BITS
                            .iter()
                            .enumerate()
                            .any(|(i, fb)| out_f >> i & 1 == 0 && (r.3 ^ f_first) >> fb & 1 != 0);
                    assert!(
                        !(zbad || kbad || gbad || fbad),
                        "unsound: `{}` (zmm {zbad}, k1 {kbad}, rax {gbad}, flags {fbad})\n a={a:02x?}\n va={va:02x?}\n b={b:02x?}\n vb={vb:02x?}\n out zmm shadow={out_z:02x?} k={out_k:#x}",
                        format(&case.insn)
                    );
                }
            }
        }
    }
}

fn cases() -> Vec<Case> {
    let mut v = vec![
        c(
            asm(|a| a.vpaddd(ymm0, ymm0, ymm1)),
            native!("vpaddd ymm0, ymm0, ymm1"),
        ),
        c(
            asm(|a| a.vpcmpeqb(ymm0, ymm0, ymm1)),
            native!("vpcmpeqb ymm0, ymm0, ymm1"),
        ),
        c(
            asm(|a| a.vpshufb(ymm0, ymm0, ymm1)),
            native!("vpshufb ymm0, ymm0, ymm1"),
        ),
        c(
            asm(|a| a.vpunpcklbw(ymm0, ymm0, ymm1)),
            native!("vpunpcklbw ymm0, ymm0, ymm1"),
        ),
        c(
            asm(|a| a.vpunpckhqdq(ymm0, ymm0, ymm1)),
            native!("vpunpckhqdq ymm0, ymm0, ymm1"),
        ),
        c(
            asm(|a| a.vpalignr(ymm0, ymm0, ymm1, 5)),
            native!("vpalignr ymm0, ymm0, ymm1, 5"),
        ),
        c(
            asm(|a| a.vperm2i128(ymm0, ymm0, ymm1, 0x21)),
            native!("vperm2i128 ymm0, ymm0, ymm1, 0x21"),
        ),
        c(
            asm(|a| a.vperm2i128(ymm0, ymm0, ymm1, 0x83)),
            native!("vperm2i128 ymm0, ymm0, ymm1, 0x83"),
        ),
        c(
            asm(|a| a.vpermq(ymm0, ymm1, 0x4e)),
            native!("vpermq ymm0, ymm1, 0x4e"),
        ),
        c(
            asm(|a| a.vpermd(ymm0, ymm1, ymm0)),
            native!("vpermd ymm0, ymm1, ymm0"),
        ),
        c(
            asm(|a| a.vpsllvd(ymm0, ymm0, ymm1)),
            native!("vpsllvd ymm0, ymm0, ymm1"),
        ),
        c(
            asm(|a| a.vpsravd(ymm0, ymm0, ymm1)),
            native!("vpsravd ymm0, ymm0, ymm1"),
        ),
        c(
            asm(|a| a.vpbroadcastb(ymm0, xmm1)),
            native!("vpbroadcastb ymm0, xmm1"),
        ),
        c(
            asm(|a| a.vinserti128(ymm0, ymm0, xmm1, 1)),
            native!("vinserti128 ymm0, ymm0, xmm1, 1"),
        ),
        c(
            asm(|a| a.vextracti128(xmm0, ymm1, 1)),
            native!("vextracti128 xmm0, ymm1, 1"),
        ),
        c(
            asm(|a| a.vpblendvb(ymm0, ymm0, ymm1, ymm1)),
            native!("vpblendvb ymm0, ymm0, ymm1, ymm1"),
        ),
        c(
            asm(|a| a.vpblendd(ymm0, ymm0, ymm1, 0x5c)),
            native!("vpblendd ymm0, ymm0, ymm1, 0x5c"),
        ),
        c(
            asm(|a| a.vpmovzxbw(ymm0, xmm1)),
            native!("vpmovzxbw ymm0, xmm1"),
        ),
        c(
            asm(|a| a.vpand(xmm0, xmm0, xmm1)),
            native!("vpand xmm0, xmm0, xmm1"),
        ),
        c(
            asm(|a| a.vmovdqu(xmm0, xmm1)),
            native!("vmovdqu xmm0, xmm1"),
        ),
        c(
            asm(|a| a.vaddsd(xmm0, xmm0, xmm1)),
            native!("vaddsd xmm0, xmm0, xmm1"),
        ),
        c(
            asm(|a| a.vfmadd231ps(ymm0, ymm1, ymm1)),
            native!("vfmadd231ps ymm0, ymm1, ymm1"),
        ),
        c(
            asm(|a| a.vpminub(zmm0, zmm0, zmm1)),
            native!("vpminub zmm0, zmm0, zmm1"),
        ),
        c(
            asm(|a| a.vpmaxsq(zmm0, zmm0, zmm1)),
            native!("vpmaxsq zmm0, zmm0, zmm1"),
        ),
        c(
            asm(|a| a.vpminuq(zmm0, zmm0, zmm1)),
            native!("vpminuq zmm0, zmm0, zmm1"),
        ),
        c(
            asm(|a| a.vpaddb(zmm0.k2(), zmm0, zmm1)),
            native!("vpaddb zmm0{{k2}}, zmm0, zmm1"),
        ),
        c(
            asm(|a| a.vpaddd(zmm0.k2().z(), zmm0, zmm1)),
            native!("vpaddd zmm0{{k2}}{{z}}, zmm0, zmm1"),
        ),
        c(
            asm(|a| a.vmovdqu8(zmm0.k2(), zmm1)),
            native!("vmovdqu8 zmm0{{k2}}, zmm1"),
        ),
        c(
            asm(|a| a.vpternlogd(zmm0, zmm1, zmm1, 0x96)),
            native!("vpternlogd zmm0, zmm1, zmm1, 0x96"),
        ),
        c(
            asm(|a| a.vpxorq(zmm0, zmm0, zmm0)),
            native!("vpxorq zmm0, zmm0, zmm0"),
        ),
        c(
            asm(|a| a.vpcmpb(k1, zmm0, zmm1, 0)),
            native!("vpcmpb k1, zmm0, zmm1, 0"),
        ),
        c(
            asm(|a| a.vpcmpub(k1, zmm0, zmm1, 1)),
            native!("vpcmpub k1, zmm0, zmm1, 1"),
        ),
        c(
            asm(|a| a.vpcmpeqb(k1.k2(), zmm0, zmm1)),
            native!("vpcmpeqb k1{{k2}}, zmm0, zmm1"),
        ),
        c(
            asm(|a| a.vpcmpeqd(k1, zmm0, zmm0)),
            native!("vpcmpeqd k1, zmm0, zmm0"),
        ),
        c(
            asm(|a| a.vptestnmb(k1, zmm0, zmm1)),
            native!("vptestnmb k1, zmm0, zmm1"),
        ),
        c(asm(|a| a.vpmovb2m(k1, zmm0)), native!("vpmovb2m k1, zmm0")),
        c(asm(|a| a.kandq(k1, k1, k2)), native!("kandq k1, k1, k2")),
        c(asm(|a| a.korq(k1, k1, k2)), native!("korq k1, k1, k2")),
        c(asm(|a| a.kxorq(k1, k1, k2)), native!("kxorq k1, k1, k2")),
        c(asm(|a| a.kxnorq(k1, k1, k1)), native!("kxnorq k1, k1, k1")),
        c(asm(|a| a.kandnq(k1, k1, k2)), native!("kandnq k1, k1, k2")),
        c(asm(|a| a.knotd(k1, k2)), native!("knotd k1, k2")),
        c(
            asm(|a| a.kshiftlq(k1, k2, 9)),
            native!("kshiftlq k1, k2, 9"),
        ),
        c(
            asm(|a| a.kshiftrw(k1, k2, 3)),
            native!("kshiftrw k1, k2, 3"),
        ),
        c(
            asm(|a| a.kunpckdq(k1, k1, k2)),
            native!("kunpckdq k1, k1, k2"),
        ),
        c(asm(|a| a.kmovd(k1, k2)), native!("kmovd k1, k2")),
    ];
    let mut gpr = |insn: Instruction, native: Native, mask: u64| {
        v.push(Case {
            insn,
            native,
            gpr_mask: mask,
            check_flags: false,
        });
    };
    gpr(
        asm(|a| a.vpmovmskb(eax, ymm0)),
        native!("vpmovmskb eax, ymm0"),
        0xffff_ffff,
    );
    gpr(
        asm(|a| a.kmovq(rax, k1)),
        native!("kmovq rax, k1"),
        u64::MAX,
    );
    gpr(
        asm(|a| a.kmovb(eax, k2)),
        native!("kmovb eax, k2"),
        0xffff_ffff,
    );
    gpr(
        asm(|a| a.vmovd(eax, xmm1)),
        native!("vmovd eax, xmm1"),
        0xffff_ffff,
    );
    for (insn, native) in [
        (asm(|a| a.vptest(ymm0, ymm1)), native!("vptest ymm0, ymm1")),
        (asm(|a| a.kortestq(k1, k2)), native!("kortestq k1, k2")),
        (asm(|a| a.kortestd(k1, k1)), native!("kortestd k1, k1")),
        (asm(|a| a.ktestq(k1, k2)), native!("ktestq k1, k2")),
    ] {
        v.push(Case {
            insn,
            native,
            gpr_mask: 0,
            check_flags: true,
        });
    }
    v
}

#[test]
fn every_avx2_and_avx512_bit_called_defined_is_invariant_over_completions() {
    if !(is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512dq"))
    {
        eprintln!("skipped: this CPU lacks AVX-512 BW/VL/DQ");
        return;
    }
    for (i, case) in cases().iter().enumerate() {
        check(case, 150, 0xa5a5_0000 + i as u64);
    }
}
