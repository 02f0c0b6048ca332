//! SSE, AVX, AVX2 and AVX-512 rules.
//!
//! Memcheck's vector rules, lane by lane: data movement (moves, shuffles, unpacks, inserts,
//! broadcasts) moves the shadow exactly as it moves the data; bitwise operations are
//! bitwise (and/or improved by defined bits, as scalars); integer lane arithmetic and
//! compares are PCast within each lane of the UifU of the operands (`binary8Ix16` and
//! friends); floating point is PCast per lane, and scalar FP (`addsd`) touches lane 0 only;
//! `pmovmskb` gathers the lanes' top V bits (`GetMSBs8x16` applied to the shadow).
//! AVX-512 compares into opmask registers give one V bit per lane; opmask registers have
//! shadows like any other.
//!
//! Operands: legacy SSE forms are `dst = dst op src` (operands 0 and 1), VEX and EVEX forms
//! `dst = src1 op src2` (operands 1 and 2); writes follow the encoding's rules (see
//! `Ctx::write_vec`: legacy keeps the upper bytes, VEX/EVEX zero them, EVEX masks merge or
//! zero).

use iced_x86::{Mnemonic, OpKind, Register};

use crate::algebra::lanes::{self, Vec512};
use crate::algebra::{self, mask, pcast, shl};
use crate::ctx::Ctx;
use crate::state::{FlagShadows, Guest, ShadowMemory};
use crate::{Check, ValueUse};

/// Applies the vector rule for the instruction in `cx` if this module has one.
/// The moves whose rule copies a whole vector register's shadow bytes as they are (to or
/// from memory, or between registers): one list for the interpreter and for the engine's
/// inline copy of the same moves.
pub fn is_whole_register_move(m: Mnemonic) -> bool {
    use Mnemonic::*;
    matches!(
        m,
        Movdqa
            | Movdqu
            | Movaps
            | Movups
            | Movapd
            | Movupd
            | Vmovdqa
            | Vmovdqu
            | Vmovdqa32
            | Vmovdqa64
            | Vmovdqu8
            | Vmovdqu16
            | Vmovdqu32
            | Vmovdqu64
            | Vmovaps
            | Vmovups
            | Vmovapd
            | Vmovupd
            | Movntdq
            | Movntps
            | Movntpd
            | Vmovntdq
            | Vmovntps
            | Vmovntpd
            | Lddqu
            | Vlddqu
            | Movntdqa
            | Vmovntdqa
    )
}

pub(crate) fn rule<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>) -> bool {
    if cx.insn.is_string_instruction() {
        return false;
    }
    // VSIB gathers and scatters address through vector lanes: the generic rule.
    let index = cx.insn.memory_index();
    if index != Register::None && index.is_vector_register() {
        return false;
    }
    use Mnemonic::*;
    let m = cx.insn.mnemonic();
    match m {
        // ----- whole-register moves -----
        _ if is_whole_register_move(m) => {
            let (_, s, bytes) = cx.read_vec(1);
            let bytes = dst_bytes(cx, bytes);
            cx.write_vec(0, &s, bytes, move_lane(m));
            true
        }
        Movd | Movq | Vmovd | Vmovq => movd(cx),
        Movss | Movsd | Vmovss | Vmovsd => {
            move_scalar(cx, if matches!(m, Movss | Vmovss) { 4 } else { 8 })
        }
        Movhps | Movhpd | Movlps | Movlpd | Vmovhps | Vmovhpd | Vmovlps | Vmovlpd | Movhlps
        | Movlhps | Vmovhlps | Vmovlhps => move_half(cx, m),

        // ----- bitwise -----
        Pand | Vpand | Vpandd | Vpandq | Andps | Andpd | Vandps | Vandpd => {
            bitwise(cx, Bitwise::And)
        }
        Por | Vpor | Vpord | Vporq | Orps | Orpd | Vorps | Vorpd => bitwise(cx, Bitwise::Or),
        Pxor | Vpxor | Vpxord | Vpxorq | Xorps | Xorpd | Vxorps | Vxorpd => {
            bitwise(cx, Bitwise::Xor)
        }
        Pandn | Vpandn | Vpandnd | Vpandnq | Andnps | Andnpd | Vandnps | Vandnpd => {
            bitwise(cx, Bitwise::AndNot)
        }
        Vpternlogd | Vpternlogq => {
            // Each result bit is a function of the three operands' bits at that position.
            let (_, d, bytes) = cx.read_vec(0);
            let (_, b, _) = cx.read_vec(1);
            let (_, c, _) = cx.read_vec(2);
            let s = lanes::uifu(&lanes::uifu(&d, &b), &c);
            cx.write_vec(0, &s, bytes, if m == Vpternlogd { 4 } else { 8 });
            true
        }

        // ----- integer lane arithmetic and compares: PCast per lane of the UifU -----
        Paddb | Vpaddb | Psubb | Vpsubb | Paddsb | Vpaddsb | Paddusb | Vpaddusb | Psubsb
        | Vpsubsb | Psubusb | Vpsubusb | Pminub | Vpminub | Pmaxub | Vpmaxub | Pminsb | Vpminsb
        | Pmaxsb | Vpmaxsb | Pavgb | Vpavgb | Pcmpeqb | Vpcmpeqb | Pcmpgtb | Vpcmpgtb | Pabsb
        | Vpabsb | Psignb | Vpsignb => lanewise(cx, 1, m),
        Paddw | Vpaddw | Psubw | Vpsubw | Paddsw | Vpaddsw | Paddusw | Vpaddusw | Psubsw
        | Vpsubsw | Psubusw | Vpsubusw | Pminuw | Vpminuw | Pmaxuw | Vpmaxuw | Pminsw | Vpminsw
        | Pmaxsw | Vpmaxsw | Pavgw | Vpavgw | Pcmpeqw | Vpcmpeqw | Pcmpgtw | Vpcmpgtw | Pmullw
        | Vpmullw | Pmulhw | Vpmulhw | Pmulhuw | Vpmulhuw | Pmulhrsw | Vpmulhrsw | Pabsw
        | Vpabsw | Psignw | Vpsignw | Pmaddubsw | Vpmaddubsw => lanewise(cx, 2, m),
        Paddd | Vpaddd | Psubd | Vpsubd | Pminud | Vpminud | Pmaxud | Vpmaxud | Pminsd
        | Vpminsd | Pmaxsd | Vpmaxsd | Pcmpeqd | Vpcmpeqd | Pcmpgtd | Vpcmpgtd | Pmulld
        | Vpmulld | Pabsd | Vpabsd | Psignd | Vpsignd | Pmaddwd | Vpmaddwd => lanewise(cx, 4, m),
        Paddq | Vpaddq | Psubq | Vpsubq | Pcmpeqq | Vpcmpeqq | Pcmpgtq | Vpcmpgtq | Pmuludq
        | Vpmuludq | Pmuldq | Vpmuldq | Psadbw | Vpsadbw | Vpminuq | Vpmaxuq | Vpminsq
        | Vpmaxsq | Vpabsq | Vpmullq => lanewise(cx, 8, m),
        Packsswb | Vpacksswb | Packuswb | Vpackuswb => pack(cx, 2),
        Packssdw | Vpackssdw | Packusdw | Vpackusdw => pack(cx, 4),

        // ----- shifts -----
        Psllw | Vpsllw | Psrlw | Vpsrlw | Psraw | Vpsraw => lane_shift(cx, 2, m),
        Pslld | Vpslld | Psrld | Vpsrld | Psrad | Vpsrad => lane_shift(cx, 4, m),
        Psllq | Vpsllq | Psrlq | Vpsrlq | Vpsraq => lane_shift(cx, 8, m),
        Pslldq | Vpslldq | Psrldq | Vpsrldq => byte_shift(cx, m),
        Vpsllvd | Vpsrlvd | Vpsravd => variable_shift(cx, 4, m),
        Vpsllvq | Vpsrlvq | Vpsravq => variable_shift(cx, 8, m),

        // ----- lanes to bits -----
        Pmovmskb | Vpmovmskb => movemask(cx, 1),
        Movmskps | Vmovmskps => movemask(cx, 4),
        Movmskpd | Vmovmskpd => movemask(cx, 8),
        Ptest | Vptest => ptest(cx),

        // ----- shuffles, unpacks, inserts, extracts, broadcasts -----
        Pshufd | Vpshufd | Pshuflw | Vpshuflw | Pshufhw | Vpshufhw | Shufps | Vshufps | Shufpd
        | Vshufpd | Punpcklbw | Vpunpcklbw | Punpcklwd | Vpunpcklwd | Punpckldq | Vpunpckldq
        | Punpcklqdq | Vpunpcklqdq | Punpckhbw | Vpunpckhbw | Punpckhwd | Vpunpckhwd
        | Punpckhdq | Vpunpckhdq | Punpckhqdq | Vpunpckhqdq | Unpcklps | Vunpcklps | Unpcklpd
        | Vunpcklpd | Unpckhps | Vunpckhps | Unpckhpd | Vunpckhpd | Palignr | Vpalignr
        | Pblendw | Vpblendw | Vpblendd | Blendps | Vblendps | Blendpd | Vblendpd | Movddup
        | Vmovddup | Movshdup | Vmovshdup | Movsldup | Vmovsldup | Vperm2i128 | Vperm2f128
        | Vpermq | Vpermpd | Vpermilps | Vpermilpd | Vinserti128 | Vinsertf128 | Vextracti128
        | Vextractf128 | Vinserti32x4 | Vinserti64x4 | Vextracti32x4 | Vextracti64x4
        | Vinsertf32x4 | Vinsertf64x4 | Vextractf32x4 | Vextractf64x4 | Pinsrb | Vpinsrb
        | Pinsrw | Vpinsrw | Pinsrd | Vpinsrd | Pinsrq | Vpinsrq | Pextrb | Vpextrb | Pextrw
        | Vpextrw | Pextrd | Vpextrd | Pextrq | Vpextrq | Insertps | Vinsertps | Extractps
        | Vextractps | Vpbroadcastb | Vpbroadcastw | Vpbroadcastd | Vpbroadcastq | Vbroadcastss
        | Vbroadcastsd | Vbroadcasti128 | Vbroadcastf128 | Pmovzxbw | Vpmovzxbw | Pmovzxbd
        | Vpmovzxbd | Pmovzxbq | Vpmovzxbq | Pmovzxwd | Vpmovzxwd | Pmovzxwq | Vpmovzxwq
        | Pmovzxdq | Vpmovzxdq | Pmovsxbw | Vpmovsxbw | Pmovsxbd | Vpmovsxbd | Pmovsxbq
        | Vpmovsxbq | Pmovsxwd | Vpmovsxwd | Pmovsxwq | Vpmovsxwq | Pmovsxdq | Vpmovsxdq => {
            shuffle(cx, m)
        }
        Pshufb | Vpshufb => pshufb(cx),
        Vpermd | Vpermps => permute_by_index(cx),
        Pblendvb | Vpblendvb | Blendvps | Vblendvps | Blendvpd | Vblendvpd => blend_variable(cx, m),

        // ----- floating point: PCast per lane -----
        Addps | Vaddps | Subps | Vsubps | Mulps | Vmulps | Divps | Vdivps | Minps | Vminps
        | Maxps | Vmaxps | Sqrtps | Vsqrtps | Rcpps | Vrcpps | Rsqrtps | Vrsqrtps | Cmpps
        | Vcmpps | Roundps | Vroundps | Cvtdq2ps | Vcvtdq2ps | Cvtps2dq | Vcvtps2dq | Cvttps2dq
        | Vcvttps2dq | Vfmadd132ps | Vfmadd213ps | Vfmadd231ps | Vfmsub132ps | Vfmsub213ps
        | Vfmsub231ps | Vfnmadd132ps | Vfnmadd213ps | Vfnmadd231ps => fp_packed(cx, 4),
        Addpd | Vaddpd | Subpd | Vsubpd | Mulpd | Vmulpd | Divpd | Vdivpd | Minpd | Vminpd
        | Maxpd | Vmaxpd | Sqrtpd | Vsqrtpd | Cmppd | Vcmppd | Roundpd | Vroundpd | Vfmadd132pd
        | Vfmadd213pd | Vfmadd231pd | Vfmsub132pd | Vfmsub213pd | Vfmsub231pd | Vfnmadd132pd
        | Vfnmadd213pd | Vfnmadd231pd => fp_packed(cx, 8),
        Addss | Vaddss | Subss | Vsubss | Mulss | Vmulss | Divss | Vdivss | Minss | Vminss
        | Maxss | Vmaxss | Sqrtss | Vsqrtss | Cmpss | Vcmpss | Roundss | Vroundss | Rcpss
        | Vrcpss | Rsqrtss | Vrsqrtss | Vfmadd132ss | Vfmadd213ss | Vfmadd231ss | Vfmsub132ss
        | Vfmsub213ss | Vfmsub231ss | Vfnmadd132ss | Vfnmadd213ss | Vfnmadd231ss => {
            fp_scalar(cx, 4, 4)
        }
        Addsd | Vaddsd | Subsd | Vsubsd | Mulsd | Vmulsd | Divsd | Vdivsd | Minsd | Vminsd
        | Maxsd | Vmaxsd | Sqrtsd | Vsqrtsd | Cmpsd | Vcmpsd | Roundsd | Vroundsd | Vfmadd132sd
        | Vfmadd213sd | Vfmadd231sd | Vfmsub132sd | Vfmsub213sd | Vfmsub231sd | Vfnmadd132sd
        | Vfnmadd213sd | Vfnmadd231sd => fp_scalar(cx, 8, 8),
        Cvtss2sd | Vcvtss2sd => fp_scalar(cx, 4, 8),
        Cvtsd2ss | Vcvtsd2ss => fp_scalar(cx, 8, 4),
        Cvtsi2sd | Vcvtsi2sd | Cvtsi2ss | Vcvtsi2ss | Vcvtusi2sd | Vcvtusi2ss => {
            int_to_fp_scalar(cx, m)
        }
        Cvttsd2si | Vcvttsd2si | Cvtsd2si | Vcvtsd2si | Cvttss2si | Vcvttss2si | Cvtss2si
        | Vcvtss2si => fp_to_int(cx, m),
        Cvtdq2pd | Vcvtdq2pd | Cvtps2pd | Vcvtps2pd => convert_lanes(cx, 4, 8),
        Cvtpd2ps | Vcvtpd2ps | Cvtpd2dq | Vcvtpd2dq | Cvttpd2dq | Vcvttpd2dq => {
            convert_lanes(cx, 8, 4)
        }
        Ucomiss | Vucomiss | Comiss | Vcomiss => fp_compare(cx, 4),
        Ucomisd | Vucomisd | Comisd | Vcomisd => fp_compare(cx, 8),

        // ----- AVX-512 opmasks -----
        Vpcmpb | Vpcmpub | Vptestmb | Vptestnmb => compare_to_mask(cx, 1),
        Vpcmpw | Vpcmpuw | Vptestmw | Vptestnmw => compare_to_mask(cx, 2),
        Vpcmpd | Vpcmpud | Vptestmd | Vptestnmd => compare_to_mask(cx, 4),
        Vpcmpq | Vpcmpuq | Vptestmq | Vptestnmq => compare_to_mask(cx, 8),
        Vpmovb2m => movemask(cx, 1),
        Vpmovw2m => movemask(cx, 2),
        Vpmovd2m => movemask(cx, 4),
        Vpmovq2m => movemask(cx, 8),
        Kmovb | Kmovw | Kmovd | Kmovq => kmov(cx, m),
        Kandb | Kandw | Kandd | Kandq | Korb | Korw | Kord | Korq | Kxorb | Kxorw | Kxord
        | Kxorq | Kandnb | Kandnw | Kandnd | Kandnq | Kxnorb | Kxnorw | Kxnord | Kxnorq => {
            kbitwise(cx, m)
        }
        Knotb | Knotw | Knotd | Knotq => {
            let w = kwidth(m);
            let (_, s) = kread(cx, 1);
            kwrite(cx, 0, s & mask(w));
            true
        }
        Kortestb | Kortestw | Kortestd | Kortestq | Ktestb | Ktestw | Ktestd | Ktestq => {
            ktest(cx, m)
        }
        Kshiftlb | Kshiftlw | Kshiftld | Kshiftlq | Kshiftrb | Kshiftrw | Kshiftrd | Kshiftrq => {
            let w = kwidth(m);
            let (_, s) = kread(cx, 1);
            let n = cx.insn.immediate(2) as u32;
            let left = matches!(m, Kshiftlb | Kshiftlw | Kshiftld | Kshiftlq);
            let r = if n >= w {
                0
            } else if left {
                shl(s, n) & mask(w)
            } else {
                (s & mask(w)) >> n
            };
            kwrite(cx, 0, r);
            true
        }
        Kunpckbw | Kunpckwd | Kunpckdq => {
            let half = match m {
                Kunpckbw => 8,
                Kunpckwd => 16,
                _ => 32,
            };
            let (_, hi) = kread(cx, 1);
            let (_, lo) = kread(cx, 2);
            kwrite(cx, 0, (shl(hi & mask(half), half)) | (lo & mask(half)));
            true
        }
        Vzeroupper | Vzeroall => {
            let all = m == Vzeroall;
            let n = 16;
            for v in cx.regs.vector.iter_mut().take(n) {
                let from = if all { 0 } else { 16 };
                for b in &mut v[from..32] {
                    *b = 0;
                }
            }
            true
        }
        _ => false,
    }
}

/// Bytes written to operand 0: its register size, or what was read for a memory store.
fn dst_bytes<G: Guest, M: ShadowMemory>(cx: &Ctx<G, M>, read: usize) -> usize {
    if cx.is_reg(0) {
        cx.reg(0).size().min(64)
    } else if cx.is_mem(0) {
        cx.mem_bytes().min(64)
    } else {
        read
    }
}

/// The element size an EVEX mask applies to, for moves.
fn move_lane(m: Mnemonic) -> usize {
    use Mnemonic::*;
    match m {
        Vmovdqu8 => 1,
        Vmovdqu16 => 2,
        Vmovdqa64 | Vmovdqu64 | Vmovapd | Vmovupd => 8,
        _ => 4,
    }
}

/// The two data sources of a binary operation: `(0, 1)` for legacy SSE, `(1, 2)` for VEX and
/// EVEX three-operand forms.
fn sources<G: Guest, M: ShadowMemory>(cx: &Ctx<G, M>) -> (u32, u32) {
    let non_imm = (0..cx.op_count()).filter(|op| !cx.is_imm(*op)).count();
    if cx.vex_like() && non_imm >= 3 {
        (1, 2)
    } else {
        (0, 1)
    }
}

fn movd<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>) -> bool {
    let dst_is_vec = cx.is_reg(0) && cx.reg(0).is_vector_register();
    let src_is_vec = cx.is_reg(1) && cx.reg(1).is_vector_register();
    if dst_is_vec {
        // xmm <- r/m32, r/m64 or xmm (movq xmm, xmm/m64): the low bytes, zeros above up to
        // 128 bits (and beyond for VEX, by write_vec).
        let n = if src_is_vec {
            8
        } else {
            (cx.width(1) / 8) as usize
        };
        let (_, s, _) = cx.read_vec(1);
        let mut out = [0u8; 64];
        out[..n.min(16)].copy_from_slice(&s[..n.min(16)]);
        cx.write_vec(0, &out, 16, 16);
    } else if src_is_vec {
        let (_, s, _) = cx.read_vec(1);
        let n = (cx.width(0) / 8) as usize;
        if cx.is_reg(0) && cx.reg(0).is_gpr() {
            let mut b = [0u8; 8];
            b[..n.min(8)].copy_from_slice(&s[..n.min(8)]);
            cx.write(0, u64::from_le_bytes(b));
        } else {
            let addr = cx.address();
            cx.mem.store(addr, &s[..n.min(8)]);
        }
    } else {
        return false; // MMX forms
    }
    true
}

/// `movss`/`movsd` (SSE, not the string instruction) and their VEX forms.
fn move_scalar<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, n: usize) -> bool {
    if cx.is_mem(0) {
        let (_, s, _) = cx.read_vec(1);
        let addr = cx.address();
        cx.mem.store(addr, &s[..n]);
        return true;
    }
    if cx.is_mem(1) {
        // Load: the scalar, zeros above (to 128 bits for legacy; VEX zeroes beyond too).
        let (_, s, _) = cx.read_vec(1);
        let mut out = [0u8; 64];
        out[..n].copy_from_slice(&s[..n]);
        cx.write_vec(0, &out, 16, 16);
        return true;
    }
    // Register forms merge: legacy keeps dst's bytes n..16; VEX takes them from src1.
    let (upper_src, low_src) = if cx.op_count() >= 3 { (1, 2) } else { (0, 1) };
    let (_, up, _) = cx.read_vec(upper_src);
    let (_, lo, _) = cx.read_vec(low_src);
    let mut out = up;
    out[..n].copy_from_slice(&lo[..n]);
    cx.write_vec(0, &out, 16, 16);
    true
}

/// `movhps`/`movlps`/`movhpd`/`movlpd`/`movhlps`/`movlhps`: 64-bit halves.
fn move_half<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    use Mnemonic::*;
    let high = matches!(m, Movhps | Movhpd | Vmovhps | Vmovhpd);
    if cx.is_mem(0) {
        let (_, s, _) = cx.read_vec(1);
        let addr = cx.address();
        let from = if high { 8 } else { 0 };
        cx.mem.store(addr, &s[from..from + 8]);
        return true;
    }
    let (keep, take) = if cx.op_count() >= 3 { (1, 2) } else { (0, 1) };
    let (_, k, _) = cx.read_vec(keep);
    let (_, t, _) = cx.read_vec(take);
    let mut out = k;
    match m {
        Movhlps | Vmovhlps => out[..8].copy_from_slice(&t[8..16]),
        Movlhps | Vmovlhps => out[8..16].copy_from_slice(&t[..8]),
        _ if high => out[8..16].copy_from_slice(&t[..8]),
        _ => out[..8].copy_from_slice(&t[..8]),
    }
    cx.write_vec(0, &out, 16, 16);
    true
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Bitwise {
    And,
    Or,
    Xor,
    AndNot,
}

fn bitwise<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, op: Bitwise) -> bool {
    let (s1, s2) = sources(cx);
    let lane = if matches!(
        cx.insn.mnemonic(),
        Mnemonic::Vpandq | Mnemonic::Vporq | Mnemonic::Vpxorq | Mnemonic::Vpandnq
    ) {
        8
    } else {
        4
    };
    let bytes = dst_bytes(cx, 16);
    if cx.same_regs(s1, s2) && matches!(op, Bitwise::Xor | Bitwise::AndNot) {
        // pxor x,x / xorps x,x / pandn x,x: constant zero (definedness.md trap 4).
        cx.write_vec(0, &[0; 64], bytes, lane);
        return true;
    }
    let (a, sa, _) = cx.read_vec(s1);
    let (b, sb, _) = cx.read_vec(s2);
    let mut out = [0u8; 64];
    for i in 0..8 {
        let (x, vx) = (lanes::get(&a, 8, i), lanes::get(&sa, 8, i));
        let (y, vy) = (lanes::get(&b, 8, i), lanes::get(&sb, 8, i));
        let r = match op {
            Bitwise::And => algebra::and(x, vx, y, vy),
            Bitwise::Or => algebra::or(x, vx, y, vy),
            Bitwise::Xor => vx | vy,
            Bitwise::AndNot => algebra::andn(x, vx, y, vy),
        };
        lanes::set(&mut out, 8, i, r);
    }
    cx.write_vec(0, &out, bytes, lane);
    true
}

/// Integer lane operations: PCast per `lane`-byte lane of the UifU (Memcheck's
/// `binary8Ix16` family). `pcmpeq`/`pcmpgt`/`psub` of a register with itself are constants.
fn lanewise<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, lane: usize, m: Mnemonic) -> bool {
    use Mnemonic::*;
    if cx.is_reg(0) && cx.reg(0).is_k() {
        // The EVEX forms of pcmpeq/pcmpgt write an opmask.
        return compare_to_mask(cx, lane);
    }
    let (s1, s2) = sources(cx);
    let bytes = dst_bytes(cx, 16);
    let unary = matches!(m, Pabsb | Vpabsb | Pabsw | Vpabsw | Pabsd | Vpabsd | Vpabsq);
    if !unary && cx.same_regs(s1, s2) {
        let constant = matches!(
            m,
            Pcmpeqb
                | Vpcmpeqb
                | Pcmpeqw
                | Vpcmpeqw
                | Pcmpeqd
                | Vpcmpeqd
                | Pcmpeqq
                | Vpcmpeqq
                | Pcmpgtb
                | Vpcmpgtb
                | Pcmpgtw
                | Vpcmpgtw
                | Pcmpgtd
                | Vpcmpgtd
                | Pcmpgtq
                | Vpcmpgtq
                | Psubb
                | Vpsubb
                | Psubw
                | Vpsubw
                | Psubd
                | Vpsubd
                | Psubq
                | Vpsubq
        );
        if constant {
            cx.write_vec(0, &[0; 64], bytes, lane);
            return true;
        }
    }
    if let Some(kind) = min_max_kind(m) {
        return min_max(cx, lane, kind, s1, s2, bytes);
    }
    let s = if unary {
        let src = if cx.op_count() >= 2 { 1 } else { 0 };
        cx.read_vec(src).1
    } else {
        let (_, a, _) = cx.read_vec(s1);
        let (_, b, _) = cx.read_vec(s2);
        lanes::uifu(&a, &b)
    };
    let out = lanes::pcast(&s, lane, bytes);
    cx.write_vec(0, &out, bytes, lane);
    true
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum MinMax {
    MinUnsigned,
    MaxUnsigned,
    MinSigned,
    MaxSigned,
}

fn min_max_kind(m: Mnemonic) -> Option<MinMax> {
    use Mnemonic::*;
    Some(match m {
        Pminub | Vpminub | Pminuw | Vpminuw | Pminud | Vpminud | Vpminuq => MinMax::MinUnsigned,
        Pmaxub | Vpmaxub | Pmaxuw | Vpmaxuw | Pmaxud | Vpmaxud | Vpmaxuq => MinMax::MaxUnsigned,
        Pminsb | Vpminsb | Pminsw | Vpminsw | Pminsd | Vpminsd | Vpminsq => MinMax::MinSigned,
        Pmaxsb | Vpmaxsb | Pmaxsw | Vpmaxsw | Pmaxsd | Vpmaxsd | Vpmaxsq => MinMax::MaxSigned,
        _ => return None,
    })
}

/// The smallest and largest values a partly undefined lane can take, in the given order.
fn lane_range(x: u64, vx: u64, bits: u32, signed: bool) -> (i128, i128) {
    let m = mask(bits);
    let (x, vx) = (x & m, vx & m);
    let sign = 1u64 << (bits - 1);
    if !signed {
        return ((x & !vx) as i128, (x | vx) as i128);
    }
    let to_signed = |v: u64| algebra::sext(v, bits) as i64 as i128;
    // Smallest: sign bit set if it may be, every other undefined bit clear; largest: the
    // reverse.
    let lo = (x & !vx & !sign) | if vx & sign != 0 { sign } else { x & sign };
    let hi = ((x | vx) & !sign) | if vx & sign != 0 { 0 } else { x & sign };
    (to_signed(lo), to_signed(hi))
}

/// `pmin*`/`pmax*`: where one lane's whole range lies on the chosen side of the other's, the
/// result is that lane, V bits included (`pminub` with a defined 0 is that 0, which glibc's
/// SSE2 `strlen` and `strchr` rely on when they fold four vectors with `pminub`); otherwise
/// Memcheck's PCast of the UifU.
fn min_max<G: Guest, M: ShadowMemory>(
    cx: &mut Ctx<G, M>,
    lane: usize,
    kind: MinMax,
    s1: u32,
    s2: u32,
    bytes: usize,
) -> bool {
    let (a, va, _) = cx.read_vec(s1);
    let (b, vb, _) = cx.read_vec(s2);
    let bits = (lane * 8) as u32;
    let signed = matches!(kind, MinMax::MinSigned | MinMax::MaxSigned);
    let want_min = matches!(kind, MinMax::MinUnsigned | MinMax::MinSigned);
    let mut out = [0u8; 64];
    for k in 0..bytes / lane {
        let (x, vx) = (lanes::get(&a, lane, k), lanes::get(&va, lane, k));
        let (y, vy) = (lanes::get(&b, lane, k), lanes::get(&vb, lane, k));
        let (xlo, xhi) = lane_range(x, vx, bits, signed);
        let (ylo, yhi) = lane_range(y, vy, bits, signed);
        let r = if (vx | vy) & mask(bits) == 0 {
            0
        } else if (want_min && xhi <= ylo) || (!want_min && xlo >= yhi) {
            vx
        } else if (want_min && yhi <= xlo) || (!want_min && ylo >= xhi) {
            vy
        } else {
            mask(bits)
        };
        lanes::set(&mut out, lane, k, r);
    }
    cx.write_vec(0, &out, bytes, lane);
    true
}

/// `packss*`/`packus*`: PCast the wide lanes, then narrow (Memcheck's `vectorNarrowBin`).
/// Per 128-bit block: the low half from the first source, the high half from the second.
fn pack<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, wide: usize) -> bool {
    let (s1, s2) = sources(cx);
    let bytes = dst_bytes(cx, 16);
    let (_, a, _) = cx.read_vec(s1);
    let (_, b, _) = cx.read_vec(s2);
    let pa = lanes::pcast(&a, wide, 64);
    let pb = lanes::pcast(&b, wide, 64);
    let narrow = wide / 2;
    let per_block = 16 / wide;
    let mut out = [0u8; 64];
    for block in 0..bytes / 16 {
        for i in 0..per_block {
            let from_a = lanes::get(&pa, wide, block * per_block + i);
            let from_b = lanes::get(&pb, wide, block * per_block + i);
            lanes::set(&mut out, narrow, block * 2 * per_block + i, from_a);
            lanes::set(
                &mut out,
                narrow,
                block * 2 * per_block + per_block + i,
                from_b,
            );
        }
    }
    cx.write_vec(0, &out, bytes, narrow);
    true
}

/// Lane shifts by an immediate or by the low 64 bits of a register or memory operand.
/// A count from a register or memory that is undefined is reported, as Memcheck does for
/// vector shifts (its known over-report), and then makes everything undefined.
fn lane_shift<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, lane: usize, m: Mnemonic) -> bool {
    use Mnemonic::*;
    let last = cx.op_count().saturating_sub(1);
    let src = if cx.vex_like() || cx.op_count() >= 3 {
        1
    } else {
        0
    };
    let (count, vcount) = if cx.is_imm(last) {
        (cx.insn.immediate(last), 0)
    } else {
        let (v, s, _) = cx.read_vec(last);
        (lanes::get(&v, 8, 0), lanes::get(&s, 8, 0))
    };
    if vcount != 0 {
        cx.checks.push(Check::Value {
            size: 8,
            reason: ValueUse::ShiftAmount,
        });
    }
    let bytes = dst_bytes(cx, 16);
    let (_, s, _) = cx.read_vec(src);
    let bits = (lane * 8) as u32;
    let n = count.min(bits as u64) as u32;
    let mut out = [0u8; 64];
    for i in 0..bytes / lane {
        let x = lanes::get(&s, lane, i);
        let r = match m {
            Psllw | Vpsllw | Pslld | Vpslld | Psllq | Vpsllq => algebra::shl_shadow(x, n, bits),
            Psrlw | Vpsrlw | Psrld | Vpsrld | Psrlq | Vpsrlq => algebra::shr_shadow(x, n, bits),
            _ => algebra::sar_shadow(x, n.min(bits - 1), bits),
        };
        lanes::set(&mut out, lane, i, if vcount != 0 { mask(bits) } else { r });
    }
    cx.write_vec(0, &out, bytes, lane);
    true
}

/// `pslldq`/`psrldq`: byte shifts within each 128-bit block.
fn byte_shift<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    let left = matches!(m, Mnemonic::Pslldq | Mnemonic::Vpslldq);
    let src = if cx.op_count() >= 3 { 1 } else { 0 };
    let n = (cx.insn.immediate(cx.op_count() - 1) as usize).min(16);
    let (_, s, _) = cx.read_vec(src);
    let bytes = dst_bytes(cx, 16);
    let mut out = [0u8; 64];
    for block in (0..bytes).step_by(16) {
        for i in 0..16usize {
            let from = if left {
                i.checked_sub(n)
            } else {
                Some(i + n).filter(|j| *j < 16)
            };
            out[block + i] = from.map(|j| s[block + j]).unwrap_or(0);
        }
    }
    cx.write_vec(0, &out, bytes, 16);
    true
}

/// `vpsllv*`/`vpsrlv*`/`vpsrav*`: each lane shifted by its own count lane (PCast of the
/// lane on an undefined count, as a scalar shift).
fn variable_shift<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, lane: usize, m: Mnemonic) -> bool {
    use Mnemonic::*;
    let (_, s, _) = cx.read_vec(1);
    let (c, vc, _) = cx.read_vec(2);
    let bytes = dst_bytes(cx, 16);
    let bits = (lane * 8) as u32;
    let mut out = [0u8; 64];
    for i in 0..bytes / lane {
        let x = lanes::get(&s, lane, i);
        let n = lanes::get(&c, lane, i).min(bits as u64) as u32;
        let r = if lanes::get(&vc, lane, i) != 0 {
            mask(bits)
        } else {
            match m {
                Vpsllvd | Vpsllvq => algebra::shl_shadow(x, n, bits),
                Vpsrlvd | Vpsrlvq => algebra::shr_shadow(x, n, bits),
                _ => algebra::sar_shadow(x, n.min(bits - 1), bits),
            }
        };
        lanes::set(&mut out, lane, i, r);
    }
    cx.write_vec(0, &out, bytes, lane);
    true
}

/// `pmovmskb`, `movmskps`, `movmskpd`, `vpmov*2m`: result bit i is the V bit of lane i's top
/// bit (Memcheck applies `GetMSBs8x16` to the shadow); the other result bits are defined
/// zeros.
fn movemask<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, lane: usize) -> bool {
    let (_, s, bytes) = cx.read_vec(1);
    let mut r = 0u64;
    for i in 0..bytes / lane {
        let top = s[(i + 1) * lane - 1] & 0x80 != 0;
        if top {
            r |= 1 << i;
        }
    }
    if cx.is_reg(0) && cx.reg(0).is_k() {
        kwrite(cx, 0, r);
    } else {
        cx.write(0, r);
    }
    true
}

/// `ptest`: ZF = (a & b) == 0, CF = (!a & b) == 0, each exact like a scalar `test`.
fn ptest<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>) -> bool {
    let (a, sa, bytes) = cx.read_vec(0);
    let (b, sb, _) = cx.read_vec(1);
    let (mut zf_decided, mut cf_decided, mut any) = (false, false, false);
    for i in 0..bytes / 8 {
        let (x, vx, y, vy) = (
            lanes::get(&a, 8, i),
            lanes::get(&sa, 8, i),
            lanes::get(&b, 8, i),
            lanes::get(&sb, 8, i),
        );
        let and = algebra::and(x, vx, y, vy);
        let andn = algebra::andn(x, vx, y, vy);
        zf_decided |= x & y & !and != 0;
        cf_decided |= !x & y & !andn != 0;
        any |= vx | vy != 0;
    }
    let mut f = 0;
    if any && !zf_decided {
        f |= FlagShadows::ZF;
    }
    if any && !cf_decided {
        f |= FlagShadows::CF;
    }
    cx.regs.flags = FlagShadows(f);
    true
}

/// Byte-level data movement, the same for values and shadows: computes the result of a
/// shuffle-like instruction from its operands' bytes.
fn shuffle<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    use Mnemonic::*;
    let n = cx.op_count();
    let imm = if n > 0 && cx.is_imm(n - 1) {
        cx.insn.immediate(n - 1)
    } else {
        0
    };
    let non_imm: u32 = (0..n).filter(|op| !cx.is_imm(*op)).count() as u32;
    let bytes = dst_bytes(cx, 16);
    // Unary forms read operand 1; binary forms read (0, 1) legacy or (1, 2) VEX.
    let (s1, s2) = if non_imm >= 3 {
        (1, 2)
    } else if cx.vex_like() || non_imm == 2 {
        (1, 1)
    } else {
        (0, 1)
    };
    let binary_legacy = !cx.vex_like() && non_imm == 2 && is_binary_shuffle(m);
    let (s1, s2) = if binary_legacy { (0, 1) } else { (s1, s2) };
    let (_, a, a_bytes) = cx.read_vec(s1);
    let (_, b, b_bytes) = cx.read_vec(s2);
    let mut out = [0u8; 64];
    let blocks = (bytes / 16).max(1);
    let lane_op = |out: &mut Vec512, f: &dyn Fn(usize, usize) -> u8| {
        for blk in 0..blocks {
            for i in 0..16 {
                out[blk * 16 + i] = f(blk * 16, i);
            }
        }
    };
    match m {
        Pshufd | Vpshufd => lane_op(&mut out, &|base, i| {
            let sel = ((imm >> (2 * (i / 4))) & 3) as usize;
            b[base + sel * 4 + i % 4]
        }),
        Pshuflw | Vpshuflw | Pshufhw | Vpshufhw => {
            let high = matches!(m, Pshufhw | Vpshufhw);
            lane_op(&mut out, &|base, i| {
                let in_half = if high { i >= 8 } else { i < 8 };
                if !in_half {
                    return b[base + i];
                }
                let half = if high { 8 } else { 0 };
                let word = (i - half) / 2;
                let sel = ((imm >> (2 * word)) & 3) as usize;
                b[base + half + sel * 2 + i % 2]
            })
        }
        Shufps | Vshufps => lane_op(&mut out, &|base, i| {
            let e = i / 4;
            let sel = ((imm >> (2 * e)) & 3) as usize;
            let src = if e < 2 { &a } else { &b };
            src[base + sel * 4 + i % 4]
        }),
        Shufpd | Vshufpd => lane_op(&mut out, &|base, i| {
            let e = i / 8;
            let bit = (base / 16) * 2 + e;
            let sel = ((imm >> bit) & 1) as usize;
            let src = if e == 0 { &a } else { &b };
            src[base + sel * 8 + i % 8]
        }),
        Punpcklbw | Vpunpcklbw | Punpcklwd | Vpunpcklwd | Punpckldq | Vpunpckldq | Punpcklqdq
        | Vpunpcklqdq | Unpcklps | Vunpcklps | Unpcklpd | Vunpcklpd | Punpckhbw | Vpunpckhbw
        | Punpckhwd | Vpunpckhwd | Punpckhdq | Vpunpckhdq | Punpckhqdq | Vpunpckhqdq | Unpckhps
        | Vunpckhps | Unpckhpd | Vunpckhpd => {
            let e = match m {
                Punpcklbw | Vpunpcklbw | Punpckhbw | Vpunpckhbw => 1,
                Punpcklwd | Vpunpcklwd | Punpckhwd | Vpunpckhwd => 2,
                Punpckldq | Vpunpckldq | Punpckhdq | Vpunpckhdq | Unpcklps | Vunpcklps
                | Unpckhps | Vunpckhps => 4,
                _ => 8,
            };
            let high = matches!(
                m,
                Punpckhbw
                    | Vpunpckhbw
                    | Punpckhwd
                    | Vpunpckhwd
                    | Punpckhdq
                    | Vpunpckhdq
                    | Punpckhqdq
                    | Vpunpckhqdq
                    | Unpckhps
                    | Vunpckhps
                    | Unpckhpd
                    | Vunpckhpd
            );
            lane_op(&mut out, &|base, i| {
                let k = i / e; // output element
                let src = if k % 2 == 0 { &a } else { &b };
                let idx = (k / 2) * e + i % e + if high { 8 } else { 0 };
                src[base + idx]
            })
        }
        Palignr | Vpalignr => {
            let sh = (imm & 0xff) as usize;
            lane_op(&mut out, &|base, i| {
                // (a:b) >> (sh * 8), per 128-bit block; a is the high half.
                let j = i + sh;
                if j < 16 {
                    b[base + j]
                } else if j < 32 {
                    a[base + j - 16]
                } else {
                    0
                }
            })
        }
        Pblendw | Vpblendw => lane_op(&mut out, &|base, i| {
            if imm >> ((i / 2) % 8) & 1 != 0 {
                b[base + i]
            } else {
                a[base + i]
            }
        }),
        Vpblendd | Blendps | Vblendps => lane_op(&mut out, &|base, i| {
            let e = (base + i) / 4;
            if imm >> (e % 8) & 1 != 0 {
                b[base + i]
            } else {
                a[base + i]
            }
        }),
        Blendpd | Vblendpd => lane_op(&mut out, &|base, i| {
            let e = (base + i) / 8;
            if imm >> (e % 8) & 1 != 0 {
                b[base + i]
            } else {
                a[base + i]
            }
        }),
        Movddup | Vmovddup => lane_op(&mut out, &|base, i| b[base + i % 8]),
        Movshdup | Vmovshdup => lane_op(&mut out, &|base, i| b[base + (i / 8) * 8 + 4 + i % 4]),
        Movsldup | Vmovsldup => lane_op(&mut out, &|base, i| b[base + (i / 8) * 8 + i % 4]),
        Vpermilps | Vpermilpd if cx.is_imm(n - 1) => {
            let e = if m == Vpermilps { 4 } else { 8 };
            lane_op(&mut out, &|base, i| {
                let k = i / e;
                let sel = if e == 4 {
                    ((imm >> (2 * k)) & 3) as usize
                } else {
                    ((imm >> ((base / 16) * 2 + k)) & 1) as usize
                };
                b[base + sel * e + i % e]
            })
        }
        Vperm2i128 | Vperm2f128 => {
            for half in 0..2 {
                let ctl = (imm >> (4 * half)) & 0xf;
                for i in 0..16 {
                    out[half * 16 + i] = if ctl & 8 != 0 {
                        0
                    } else {
                        let src = if ctl & 2 == 0 { &a } else { &b };
                        src[((ctl & 1) as usize) * 16 + i]
                    };
                }
            }
        }
        Vpermq | Vpermpd if cx.is_imm(n - 1) => {
            for blk in 0..(bytes / 32).max(1) {
                for i in 0..32 {
                    let sel = ((imm >> (2 * (i / 8))) & 3) as usize;
                    out[blk * 32 + i] = b[blk * 32 + sel * 8 + i % 8];
                }
            }
        }
        Vinserti128 | Vinsertf128 | Vinserti32x4 | Vinsertf32x4 | Vinserti64x4 | Vinsertf64x4 => {
            let chunk = if matches!(m, Vinserti64x4 | Vinsertf64x4) {
                32
            } else {
                16
            };
            out = a;
            let at = ((imm as usize) * chunk) % bytes.max(chunk);
            out[at..at + chunk].copy_from_slice(&b[..chunk]);
        }
        Vextracti128 | Vextractf128 | Vextracti32x4 | Vextractf32x4 | Vextracti64x4
        | Vextractf64x4 => {
            let chunk = if matches!(m, Vextracti64x4 | Vextractf64x4) {
                32
            } else {
                16
            };
            let from = ((imm as usize) * chunk) % a_bytes.max(chunk);
            let (_, src, _) = cx.read_vec(1);
            out[..chunk].copy_from_slice(&src[from..from + chunk]);
            let _ = b;
            cx.write_vec(0, &out, chunk, 4);
            return true;
        }
        Pinsrb | Vpinsrb | Pinsrw | Vpinsrw | Pinsrd | Vpinsrd | Pinsrq | Vpinsrq => {
            let e = match m {
                Pinsrb | Vpinsrb => 1,
                Pinsrw | Vpinsrw => 2,
                Pinsrd | Vpinsrd => 4,
                _ => 8,
            };
            // The inserted element comes from a general register or memory.
            let src_op = if cx.vex_like() { 2 } else { 1 };
            let ins = cx.read(src_op);
            out = a;
            let k = (imm as usize) % (16 / e);
            lanes::set(&mut out, e, k, ins.s);
            cx.write_vec(0, &out, 16, 16);
            return true;
        }
        Pextrb | Vpextrb | Pextrw | Vpextrw | Pextrd | Vpextrd | Pextrq | Vpextrq | Extractps
        | Vextractps => {
            let e = match m {
                Pextrb | Vpextrb => 1,
                Pextrw | Vpextrw => 2,
                Pextrq | Vpextrq => 8,
                _ => 4,
            };
            let (_, src, _) = cx.read_vec(1);
            let k = (imm as usize) % (16 / e);
            let s = lanes::get(&src, e, k);
            cx.write(0, s);
            return true;
        }
        Insertps | Vinsertps => {
            let src_sel = ((imm >> 6) & 3) as usize;
            let dst_sel = ((imm >> 4) & 3) as usize;
            out = a;
            let elem = if cx.is_mem(s2) {
                lanes::get(&b, 4, 0)
            } else {
                lanes::get(&b, 4, src_sel)
            };
            lanes::set(&mut out, 4, dst_sel, elem);
            for k in 0..4 {
                if imm >> k & 1 != 0 {
                    lanes::set(&mut out, 4, k, 0);
                }
            }
            cx.write_vec(0, &out, 16, 16);
            return true;
        }
        Vpbroadcastb | Vpbroadcastw | Vpbroadcastd | Vpbroadcastq | Vbroadcastss | Vbroadcastsd
        | Vbroadcasti128 | Vbroadcastf128 => {
            let e = match m {
                Vpbroadcastb => 1,
                Vpbroadcastw => 2,
                Vpbroadcastd | Vbroadcastss => 4,
                Vpbroadcastq | Vbroadcastsd => 8,
                _ => 16,
            };
            for i in 0..bytes {
                out[i] = b[i % e];
            }
            let _ = b_bytes;
        }
        Pmovzxbw | Vpmovzxbw | Pmovzxbd | Vpmovzxbd | Pmovzxbq | Vpmovzxbq | Pmovzxwd
        | Vpmovzxwd | Pmovzxwq | Vpmovzxwq | Pmovzxdq | Vpmovzxdq | Pmovsxbw | Vpmovsxbw
        | Pmovsxbd | Vpmovsxbd | Pmovsxbq | Vpmovsxbq | Pmovsxwd | Vpmovsxwd | Pmovsxwq
        | Vpmovsxwq | Pmovsxdq | Vpmovsxdq => {
            let (from, to) = match m {
                Pmovzxbw | Vpmovzxbw | Pmovsxbw | Vpmovsxbw => (1, 2),
                Pmovzxbd | Vpmovzxbd | Pmovsxbd | Vpmovsxbd => (1, 4),
                Pmovzxbq | Vpmovzxbq | Pmovsxbq | Vpmovsxbq => (1, 8),
                Pmovzxwd | Vpmovzxwd | Pmovsxwd | Vpmovsxwd => (2, 4),
                Pmovzxwq | Vpmovzxwq | Pmovsxwq | Vpmovsxwq => (2, 8),
                _ => (4, 8),
            };
            let signed = matches!(
                m,
                Pmovsxbw
                    | Vpmovsxbw
                    | Pmovsxbd
                    | Vpmovsxbd
                    | Pmovsxbq
                    | Vpmovsxbq
                    | Pmovsxwd
                    | Vpmovsxwd
                    | Pmovsxwq
                    | Vpmovsxwq
                    | Pmovsxdq
                    | Vpmovsxdq
            );
            for k in 0..bytes / to {
                let x = lanes::get(&b, from, k);
                let y = if signed {
                    algebra::sext(x, (from * 8) as u32) & mask((to * 8) as u32)
                } else {
                    x
                };
                lanes::set(&mut out, to, k, y);
            }
            cx.write_vec(0, &out, bytes, to);
            return true;
        }
        _ => return false,
    }
    let lane = match m {
        Vpbroadcastb => 1,
        Vpbroadcastw => 2,
        Shufpd | Vshufpd | Unpcklpd | Vunpcklpd | Unpckhpd | Vunpckhpd | Vpermq | Vpermpd
        | Vpbroadcastq | Vbroadcastsd | Blendpd | Vblendpd | Movddup | Vmovddup | Vpermilpd => 8,
        _ => 4,
    };
    cx.write_vec(0, &out, bytes, lane);
    true
}

/// Legacy two-operand shuffles that combine `dst` and `src` (the others take one source).
fn is_binary_shuffle(m: Mnemonic) -> bool {
    use Mnemonic::*;
    matches!(
        m,
        Shufps
            | Shufpd
            | Punpcklbw
            | Punpcklwd
            | Punpckldq
            | Punpcklqdq
            | Punpckhbw
            | Punpckhwd
            | Punpckhdq
            | Punpckhqdq
            | Unpcklps
            | Unpcklpd
            | Unpckhps
            | Unpckhpd
            | Palignr
            | Pblendw
            | Blendps
            | Blendpd
            | Pinsrb
            | Pinsrw
            | Pinsrd
            | Pinsrq
            | Insertps
    )
}

/// `pshufb`: each result byte is a source byte chosen by an index byte's value; an index
/// whose V bits (of the bits that matter: 7 and 3:0) are undefined makes the byte undefined.
fn pshufb<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>) -> bool {
    let (s1, s2) = sources(cx);
    let (_, a, _) = cx.read_vec(s1);
    let (idx, vidx, _) = cx.read_vec(s2);
    let bytes = dst_bytes(cx, 16);
    let mut out = [0u8; 64];
    for blk in (0..bytes).step_by(16) {
        for i in 0..16 {
            let (x, vx) = (idx[blk + i], vidx[blk + i]);
            out[blk + i] = if vx & 0x8f != 0 {
                0xff
            } else if x & 0x80 != 0 {
                0
            } else {
                a[blk + (x & 15) as usize]
            };
        }
    }
    cx.write_vec(0, &out, bytes, 1);
    true
}

/// `vpermd`/`vpermps`: lanes chosen by an index vector (operand 1), data in operand 2.
fn permute_by_index<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>) -> bool {
    let (idx, vidx, _) = cx.read_vec(1);
    let (_, a, _) = cx.read_vec(2);
    let bytes = dst_bytes(cx, 32);
    let count = bytes / 4;
    let sel_mask = (count as u64).saturating_sub(1);
    let mut out = [0u8; 64];
    for k in 0..count {
        let r = if lanes::get(&vidx, 4, k) & sel_mask != 0 {
            u32::MAX as u64
        } else {
            lanes::get(&a, 4, (lanes::get(&idx, 4, k) & sel_mask) as usize)
        };
        lanes::set(&mut out, 4, k, r);
    }
    cx.write_vec(0, &out, bytes, 4);
    true
}

/// `pblendvb`/`blendvps`/`blendvpd`: per lane an ITE on the mask lane's top bit (its V bit
/// poisons the lane, as Memcheck's ITE does).
fn blend_variable<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    use Mnemonic::*;
    let lane = match m {
        Pblendvb | Vpblendvb => 1,
        Blendvps | Vblendvps => 4,
        _ => 8,
    };
    let (s1, s2, selector) = if cx.vex_like() {
        (1, 2, cx.reg(3))
    } else {
        (0, 1, Register::XMM0)
    };
    let (_, a, _) = cx.read_vec(s1);
    let (_, b, _) = cx.read_vec(s2);
    let sel_i = selector.number() & 31;
    let (sel, vsel) = (cx.guest.vector(sel_i), cx.regs.vector[sel_i]);
    let bytes = dst_bytes(cx, 16);
    let mut out = [0u8; 64];
    for k in 0..bytes / lane {
        let top = (k + 1) * lane - 1;
        for i in k * lane..(k + 1) * lane {
            out[i] = if vsel[top] & 0x80 != 0 {
                0xff
            } else if sel[top] & 0x80 != 0 {
                b[i]
            } else {
                a[i]
            };
        }
    }
    cx.write_vec(0, &out, bytes, lane);
    true
}

/// Packed floating point: PCast per lane over all sources (FMA reads the destination too).
fn fp_packed<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, lane: usize) -> bool {
    let bytes = dst_bytes(cx, 16);
    let fma = is_fma(cx.insn.mnemonic());
    let mut s = [0u8; 64];
    let first = if cx.vex_like() && !fma { 1 } else { 0 };
    for op in first..cx.op_count() {
        if cx.is_imm(op) {
            continue;
        }
        if op == 0 && !fma && cx.vex_like() {
            continue;
        }
        let (_, x, _) = cx.read_vec(op);
        s = lanes::uifu(&s, &x);
    }
    let unary_legacy = !cx.vex_like() && is_unary_fp(cx.insn.mnemonic());
    if unary_legacy {
        s = cx.read_vec(1).1;
    }
    let out = lanes::pcast(&s, lane, bytes);
    cx.write_vec(0, &out, bytes, lane);
    true
}

fn is_fma(m: Mnemonic) -> bool {
    use Mnemonic::*;
    matches!(
        m,
        Vfmadd132ps
            | Vfmadd213ps
            | Vfmadd231ps
            | Vfmsub132ps
            | Vfmsub213ps
            | Vfmsub231ps
            | Vfnmadd132ps
            | Vfnmadd213ps
            | Vfnmadd231ps
            | Vfmadd132pd
            | Vfmadd213pd
            | Vfmadd231pd
            | Vfmsub132pd
            | Vfmsub213pd
            | Vfmsub231pd
            | Vfnmadd132pd
            | Vfnmadd213pd
            | Vfnmadd231pd
            | Vfmadd132ss
            | Vfmadd213ss
            | Vfmadd231ss
            | Vfmsub132ss
            | Vfmsub213ss
            | Vfmsub231ss
            | Vfnmadd132ss
            | Vfnmadd213ss
            | Vfnmadd231ss
            | Vfmadd132sd
            | Vfmadd213sd
            | Vfmadd231sd
            | Vfmsub132sd
            | Vfmsub213sd
            | Vfmsub231sd
            | Vfnmadd132sd
            | Vfnmadd213sd
            | Vfnmadd231sd
    )
}

/// Legacy SSE operations that read only their source (`sqrtps xmm1, xmm2`).
fn is_unary_fp(m: Mnemonic) -> bool {
    use Mnemonic::*;
    matches!(
        m,
        Sqrtps
            | Sqrtpd
            | Rcpps
            | Rsqrtps
            | Roundps
            | Roundpd
            | Cvtdq2ps
            | Cvtps2dq
            | Cvttps2dq
            | Sqrtss
            | Sqrtsd
            | Rcpss
            | Rsqrtss
            | Cvtss2sd
            | Cvtsd2ss
            | Roundss
            | Roundsd
            | Vsqrtss
            | Vsqrtsd
            | Vrcpss
            | Vrsqrtss
            | Vcvtss2sd
            | Vcvtsd2ss
            | Vroundss
            | Vroundsd
    )
}

/// Scalar floating point (`addsd`, `cvtss2sd`): lane 0 of `out` bytes is PCast of the lane-0
/// inputs (`inp` bytes each); the rest of the low 128 bits comes from the first source
/// (legacy: the destination itself).
fn fp_scalar<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, inp: usize, out_n: usize) -> bool {
    let m = cx.insn.mnemonic();
    let fma = is_fma(m);
    let (upper_op, data_ops): (u32, &[u32]) = if fma {
        (0, &[0, 1, 2])
    } else if cx.vex_like() && is_unary_fp(m) {
        // vsqrtsd xmm1, xmm2, xmm3: lane 0 from xmm3 only; compilers pass a stale xmm2.
        (1, &[2])
    } else if cx.vex_like() {
        (1, &[1, 2])
    } else if is_unary_fp(m) {
        (0, &[1])
    } else {
        (0, &[0, 1])
    };
    let mut any = false;
    for &op in data_ops {
        if op >= cx.op_count() || cx.is_imm(op) {
            continue;
        }
        let (_, s, _) = cx.read_vec(op);
        any |= s[..inp].iter().any(|b| *b != 0);
    }
    let (_, up, _) = cx.read_vec(upper_op);
    let mut out = up;
    for b in &mut out[..out_n] {
        *b = if any { 0xff } else { 0 };
    }
    for b in &mut out[16..] {
        *b = 0;
    }
    cx.write_vec(0, &out, 16, out_n);
    true
}

/// `cvtsi2sd` and friends: lane 0 from PCast of the integer, the rest as `fp_scalar`.
fn int_to_fp_scalar<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    use Mnemonic::*;
    let n = if matches!(m, Cvtsi2sd | Vcvtsi2sd | Vcvtusi2sd) {
        8
    } else {
        4
    };
    let (upper_op, src) = if cx.vex_like() { (1, 2) } else { (0, 1) };
    let i = cx.read(src);
    let (_, up, _) = cx.read_vec(upper_op);
    let mut out = up;
    let fill = if i.s != 0 { 0xff } else { 0 };
    for b in &mut out[..n] {
        *b = fill;
    }
    cx.write_vec(0, &out, 16, n);
    true
}

/// `cvttsd2si` and friends: the integer is PCast of lane 0.
fn fp_to_int<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    use Mnemonic::*;
    let n = if matches!(m, Cvttsd2si | Vcvttsd2si | Cvtsd2si | Vcvtsd2si) {
        8
    } else {
        4
    };
    let (_, s, _) = cx.read_vec(1);
    let any = s[..n].iter().any(|b| *b != 0);
    let w = cx.width(0);
    cx.write(0, pcast(any as u64, w));
    true
}

/// Conversions that change the lane size (`cvtdq2pd`, `cvtpd2ps`): output lane k is PCast of
/// input lane k; lanes past the input's count are zero.
fn convert_lanes<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, from: usize, to: usize) -> bool {
    let (_, s, in_bytes) = cx.read_vec(1);
    let out_bytes = dst_bytes(cx, 16);
    let count = if from < to {
        out_bytes / to
    } else {
        in_bytes / from
    };
    let mut out = [0u8; 64];
    for k in 0..count {
        let u = lanes::get(&s, from, k) != 0;
        lanes::set(&mut out, to, k, if u { mask((to * 8) as u32) } else { 0 });
    }
    cx.write_vec(0, &out, out_bytes.max(16), to);
    true
}

/// `ucomis*`/`comis*`: ZF, PF and CF are PCast of the two lane-0 values; OF, SF and AF are
/// cleared.
fn fp_compare<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, n: usize) -> bool {
    let (_, a, _) = cx.read_vec(0);
    let (_, b, _) = cx.read_vec(1);
    let any = a[..n].iter().chain(&b[..n]).any(|x| *x != 0);
    cx.regs.flags = FlagShadows(if any {
        FlagShadows::ZF | FlagShadows::PF | FlagShadows::CF
    } else {
        0
    });
    true
}

/// AVX-512 compares and tests into an opmask: bit k is PCast of lane k of the UifU; bits
/// beyond the lane count are defined zeros; a write mask `{k}` clears bits (its own V bits
/// count).
fn compare_to_mask<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, lane: usize) -> bool {
    if !(cx.is_reg(0) && cx.reg(0).is_k()) {
        // Vpcmpeqb and Vpcmpgtb also have VEX forms writing a vector register.
        let m = cx.insn.mnemonic();
        return lanewise(cx, lane, m);
    }
    let (_, a, bytes) = cx.read_vec(1);
    let (_, b, _) = cx.read_vec(2);
    let same = cx.same_regs(1, 2);
    let m = cx.insn.mnemonic();
    let s = lanes::uifu(&a, &b);
    let mut r = 0u64;
    for k in 0..bytes / lane {
        if lanes::get(&s, lane, k) != 0 {
            r |= 1 << k;
        }
    }
    // vpcmpeq*/vpcmpgt* of a register with itself are constants (vptestnm x,x is not: it
    // depends on x).
    let constant = matches!(
        m,
        Mnemonic::Vpcmpeqb
            | Mnemonic::Vpcmpeqw
            | Mnemonic::Vpcmpeqd
            | Mnemonic::Vpcmpeqq
            | Mnemonic::Vpcmpgtb
            | Mnemonic::Vpcmpgtw
            | Mnemonic::Vpcmpgtd
            | Mnemonic::Vpcmpgtq
    );
    if same && constant {
        r = 0;
    }
    let mk = cx.insn.op_mask();
    if mk != Register::None {
        let i = mk.number() & 7;
        let (mv, ms) = (cx.guest.opmask(i), cx.regs.opmask[i]);
        // The compare's own values are not computed here, so only the mask's defined zeros
        // improve the AND.
        r = algebra::and(u64::MAX, r, mv, ms);
    }
    kwrite(cx, 0, r);
    true
}

fn kwidth(m: Mnemonic) -> u32 {
    use Mnemonic::*;
    match m {
        Kmovb | Kandb | Korb | Kxorb | Kandnb | Kxnorb | Knotb | Kortestb | Ktestb | Kshiftlb
        | Kshiftrb => 8,
        Kmovw | Kandw | Korw | Kxorw | Kandnw | Kxnorw | Knotw | Kortestw | Ktestw | Kshiftlw
        | Kshiftrw => 16,
        Kmovd | Kandd | Kord | Kxord | Kandnd | Kxnord | Knotd | Kortestd | Ktestd | Kshiftld
        | Kshiftrd => 32,
        _ => 64,
    }
}

/// Reads an opmask-like operand (k register, general register or memory).
fn kread<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, op: u32) -> (u64, u64) {
    if cx.is_reg(op) && cx.reg(op).is_k() {
        let i = cx.reg(op).number() & 7;
        (cx.guest.opmask(i), cx.regs.opmask[i])
    } else {
        let r = cx.read(op);
        (r.v, r.s)
    }
}

fn kwrite<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, op: u32, shadow: u64) {
    if cx.is_reg(op) && cx.reg(op).is_k() {
        cx.regs.opmask[cx.reg(op).number() & 7] = shadow;
    } else {
        cx.write(op, shadow);
    }
}

fn kmov<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    let w = kwidth(m);
    let (_, s) = kread(cx, 1);
    let s = s & mask(w);
    if cx.kind(0) == OpKind::Memory {
        let addr = cx.address();
        let bytes = s.to_le_bytes();
        cx.mem.store(addr, &bytes[..(w / 8) as usize]);
    } else {
        kwrite(cx, 0, s);
    }
    true
}

fn kbitwise<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    use Mnemonic::*;
    let w = kwidth(m);
    let (a, va) = kread(cx, 1);
    let (b, vb) = kread(cx, 2);
    let same = cx.same_regs(1, 2);
    let r = match m {
        Kandb | Kandw | Kandd | Kandq => algebra::and(a, va, b, vb),
        Korb | Korw | Kord | Korq => algebra::or(a, va, b, vb),
        Kandnb | Kandnw | Kandnd | Kandnq if same => 0,
        Kandnb | Kandnw | Kandnd | Kandnq => algebra::andn(a, va, b, vb),
        // kxor k,k,k / kxnor k,k,k: constants (glibc's way to make an all-ones mask).
        _ if same => 0,
        _ => va | vb,
    };
    kwrite(cx, 0, r & mask(w));
    true
}

/// `kortest` (ZF: (a | b) == 0, CF: (a | b) all ones) and `ktest` (ZF: (a & b) == 0, CF:
/// (!a & b) == 0), each exact like a scalar test.
fn ktest<G: Guest, M: ShadowMemory>(cx: &mut Ctx<G, M>, m: Mnemonic) -> bool {
    use Mnemonic::*;
    let w = kwidth(m);
    let (a, va) = kread(cx, 0);
    let (b, vb) = kread(cx, 1);
    let (zf_und, cf_und) = if matches!(m, Kortestb | Kortestw | Kortestd | Kortestq) {
        let r = (a | b) & mask(w);
        let vr = algebra::or(a, va, b, vb) & mask(w);
        // All ones is "the complement is zero".
        (
            algebra::zero_test_undefined(r, vr, w),
            algebra::zero_test_undefined(!r & mask(w), vr, w),
        )
    } else {
        let r = a & b & mask(w);
        let vr = algebra::and(a, va, b, vb) & mask(w);
        let rn = !a & b & mask(w);
        let vrn = algebra::andn(a, va, b, vb) & mask(w);
        (
            algebra::zero_test_undefined(r, vr, w),
            algebra::zero_test_undefined(rn, vrn, w),
        )
    };
    let mut f = 0;
    if zf_und {
        f |= FlagShadows::ZF;
    }
    if cf_und {
        f |= FlagShadows::CF;
    }
    cx.regs.flags = FlagShadows(f);
    true
}
