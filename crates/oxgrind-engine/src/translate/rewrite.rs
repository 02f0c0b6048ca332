//! Copying guest instructions into the cache, and the few rewrites a copy needs: a
//! RIP-relative operand re-aimed at the same guest address (or addressed through a spilled
//! scratch register when the cache is more than 2 GiB away), and the guest's `gs:` operands,
//! which address the guest's own gs base rather than the engine's context.

use iced_x86::{Code, Instruction, Register};

use super::*;
use crate::context as c;

impl Emitter {
    /// Copies a non-transfer instruction, fixing a RIP-relative operand.
    pub(super) fn copy(&mut self, d: &Decoded) -> Result<(), TranslateError> {
        let ins = &d.ins;
        let len = ins.len();
        let src = ins.ip();
        match ins.code() {
            Code::Rdgsbase_r64 | Code::Rdgsbase_r32 | Code::Wrgsbase_r64 | Code::Wrgsbase_r32 => {
                return self.gs_base_access(ins);
            }
            _ => {}
        }
        if (0..ins.op_count()).any(|i| ins.op_kind(i) == OpKind::Memory)
            && ins.memory_segment() == Register::GS
            && !crate::asm::native_gs(src)
        {
            return self.gs_operand(ins);
        }
        if !ins.is_ip_rel_memory_operand() {
            let from = (src - self.guest_pc) as usize;
            self.buf.extend_from_slice(&self.guest[from..from + len]);
            return Ok(());
        }
        let target = ins.ip_rel_memory_address();
        let new_end = self.here() as i64 + len as i64;
        let disp = target as i64 - new_end;
        if disp == disp as i32 as i64
            && d.offs.has_displacement()
            && d.offs.displacement_size() == 4
        {
            let start = self.buf.len();
            let from = (src - self.guest_pc) as usize;
            self.buf.extend_from_slice(&self.guest[from..from + len]);
            let at = start + d.offs.displacement_offset();
            self.buf[at..at + 4].copy_from_slice(&(disp as i32).to_le_bytes());
            return Ok(());
        }
        self.far_rip(ins)
    }

    /// `rdgsbase`/`wrgsbase`: the guest's gs base lives in the context (`guest_gs`).
    pub(super) fn gs_base_access(&mut self, ins: &Instruction) -> Result<(), TranslateError> {
        let r = ins.op0_register();
        let num = r.full_register().number() as u8;
        let off = c::OFF_GUEST_GS as u32;
        let rex_r = if num >= 8 { 0x44 } else { 0 };
        match ins.code() {
            Code::Rdgsbase_r64 => self.load_gs(num, c::OFF_GUEST_GS),
            Code::Wrgsbase_r64 => self.store_gs(num, c::OFF_GUEST_GS),
            Code::Rdgsbase_r32 => {
                // mov r32, gs:[guest_gs] (zero-extends, as rdgsbase r32 does)
                self.buf.push(0x65);
                if rex_r != 0 {
                    self.buf.push(rex_r);
                }
                self.buf.push(0x8B);
                self.buf.extend_from_slice(&gs_modrm(num));
                self.d32(off);
            }
            _ => {
                // mov gs:[guest_gs], r32; mov dword gs:[guest_gs+4], 0
                self.buf.push(0x65);
                if rex_r != 0 {
                    self.buf.push(rex_r);
                }
                self.buf.push(0x89);
                self.buf.extend_from_slice(&gs_modrm(num));
                self.d32(off);
                self.buf.extend_from_slice(&[0x65, 0xC7, 0x04, 0x25]);
                self.d32(off + 4);
                self.d32(0);
            }
        }
        Ok(())
    }

    /// `insn gs:[base + index*s + d]` (the guest's gs, not the engine's): `mov gs:[save], t;
    /// mov t, gs:[guest_gs]; lea t, [t + base]; insn [t + index*s + d]; mov t, gs:[save]`
    /// with a scratch register `t` the instruction does not use.
    pub(super) fn gs_operand(&mut self, ins: &Instruction) -> Result<(), TranslateError> {
        let err = TranslateError::Encode { pc: ins.ip() };
        let (reg, num) = self.free_register(ins).ok_or(err)?;
        let mut m = *ins;
        m.set_segment_prefix(Register::None);
        m.set_memory_base(reg);
        let disp = ins.memory_displacement64();
        m.set_memory_displacement64(disp);
        // iced: 1 = "as short as the value allows" (it widens to disp32 when needed).
        m.set_memory_displ_size(if disp == 0 { 0 } else { 1 });
        let mut enc = Encoder::new(64);
        self.store_gs(num, c::scratch_off(c::S_FAR_SAVE));
        self.mark(ins.ip(), ((num as u16) + 1) << FIX_FAR_SHIFT);
        self.load_gs(num, c::OFF_GUEST_GS);
        let base = ins.memory_base();
        if base != Register::None {
            let lea = Instruction::with2(
                Code::Lea_r64_m,
                reg,
                iced_x86::MemoryOperand::with_base_index(base, reg),
            )
            .map_err(|_| err)?;
            enc.encode(&lea, self.here()).map_err(|_| err)?;
            let b = enc.take_buffer();
            self.buf.extend_from_slice(&b);
        }
        enc.encode(&m, self.here()).map_err(|_| err)?;
        let body = enc.take_buffer();
        self.buf.extend_from_slice(&body);
        self.unmark();
        self.load_gs(num, c::scratch_off(c::S_FAR_SAVE));
        Ok(())
    }

    /// A general register `ins` neither reads nor writes, explicitly or implicitly.
    pub(super) fn free_register(&self, ins: &Instruction) -> Option<(Register, u8)> {
        let mut factory = InstructionInfoFactory::new();
        let info = factory.info(ins);
        const CANDIDATES: [(Register, u8); 10] = [
            (Register::RAX, 0),
            (Register::RCX, 1),
            (Register::RDX, 2),
            (Register::RBX, 3),
            (Register::RSI, 6),
            (Register::RDI, 7),
            (Register::R8, 8),
            (Register::R9, 9),
            (Register::R10, 10),
            (Register::R11, 11),
        ];
        let used = |r: Register| {
            info.used_registers()
                .iter()
                .any(|u| u.register().full_register() == r)
        };
        CANDIDATES.iter().copied().find(|(r, _)| !used(*r))
    }

    /// `insn [rip+X]` too far from the code cache: `mov gs:[save], s; mov s, X; insn [s];
    /// mov s, gs:[save]` with a scratch register `s` the instruction does not use.
    pub(super) fn far_rip(&mut self, ins: &Instruction) -> Result<(), TranslateError> {
        let Some((reg, num)) = self.free_register(ins) else {
            return Err(TranslateError::Encode { pc: ins.ip() });
        };
        let target = ins.ip_rel_memory_address();
        note_far_rewrite();
        let mut m = *ins;
        m.set_memory_base(reg);
        m.set_memory_index(Register::None);
        m.set_memory_displacement64(0);
        m.set_memory_displ_size(0);
        let mut enc = Encoder::new(64);
        enc.encode(&m, self.here())
            .map_err(|_| TranslateError::Encode { pc: ins.ip() })?;
        let body = enc.take_buffer();
        self.store_gs(num, c::scratch_off(c::S_FAR_SAVE));
        let ip = ins.ip();
        self.mark(ip, ((num as u16) + 1) << FIX_FAR_SHIFT);
        self.mov_imm64(num, target);
        self.buf.extend_from_slice(&body);
        self.unmark();
        self.load_gs(num, c::scratch_off(c::S_FAR_SAVE));
        Ok(())
    }

    pub(super) fn encode(&mut self, m: &Instruction, pc: u64) -> Result<(), TranslateError> {
        // The encoder appends to the translation's own buffer: a buffer of its own was an
        // allocation and a free per encoded instruction.
        let here = self.here();
        let mut enc = Encoder::new(64);
        enc.set_buffer(core::mem::take(&mut self.buf));
        let done = enc.encode(m, here);
        self.buf = enc.take_buffer();
        done.map(|_| ()).map_err(|_| TranslateError::Encode { pc })
    }

    /// `lea rax, [base + index * scale + disp]` (the displacement as short as it allows),
    /// for the guest instruction at `pc`: how the inline checks compute an address.
    pub(super) fn lea_rax(
        &mut self,
        base: Register,
        index: Register,
        scale: u32,
        disp: i64,
        pc: u64,
    ) -> Result<(), TranslateError> {
        if let Some(lea) = lea_rax_bytes(base, index, scale, disp) {
            self.buf.extend_from_slice(lea.bytes());
            return Ok(());
        }
        let lea = lea_rax_by_iced(base, index, scale, disp).ok_or(TranslateError::Encode { pc })?;
        self.encode(&lea, pc)
    }
}

/// `lea rax, [base + index * scale + disp]` as iced builds it: the forms
/// [`lea_rax_bytes`] does not encode by hand, and that function's test oracle.
fn lea_rax_by_iced(base: Register, index: Register, scale: u32, disp: i64) -> Option<Instruction> {
    // iced: displacement size 1 = "as short as the value allows" (disp8 or disp32).
    let op = iced_x86::MemoryOperand::new(
        base,
        index,
        scale,
        disp,
        if disp == 0 { 0 } else { 1 },
        false,
        Register::None,
    );
    Instruction::with2(iced_x86::Code::Lea_r64_m, Register::RAX, op).ok()
}

/// An encoded `lea rax, [...]`: at most REX, opcode, ModRM, SIB and a disp32.
#[derive(Clone, Copy)]
pub(super) struct LeaBytes {
    bytes: [u8; 8],
    len: usize,
}

impl LeaBytes {
    /// REX, opcode `8D`, ModRM, then SIB and displacement as present: the definedness
    /// checks reuse all but the opcode as the memory operand of another instruction
    /// (`Emitter::on_shadow`).
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// `lea rax, [base + index * scale + disp]` encoded by hand, byte for byte as iced encodes
/// it with the shortest displacement, for 64-bit general base and index registers (either
/// may be absent, not both) and a displacement that fits 32 bits; `None` otherwise (RIP,
/// 32-bit or vector registers), for iced. The inline checks compute an address this way
/// several times per probed operand, and iced's encoder was a tenth of DHAT's translation
/// time.
pub(super) fn lea_rax_bytes(
    base: Register,
    index: Register,
    scale: u32,
    disp: i64,
) -> Option<LeaBytes> {
    let gpr = |r: Register| r.is_gpr64().then(|| r.number() as u8);
    let base = match base {
        Register::None => None,
        r => Some(gpr(r)?),
    };
    let index = match index {
        Register::None => None,
        Register::RSP => return None, // not encodable as an index
        r => Some(gpr(r)?),
    };
    if base.is_none() && index.is_none() {
        return None;
    }
    let disp = i32::try_from(disp).ok()?;
    let scale_bits = match scale {
        1 => 0u8,
        2 => 1,
        4 => 2,
        8 => 3,
        _ => return None,
    };
    let mut out = LeaBytes {
        bytes: [0; 8],
        len: 0,
    };
    let mut put = |b: u8| {
        out.bytes[out.len] = b;
        out.len += 1;
    };
    let rex = 0x48 | (index.unwrap_or(0) >> 3) << 1 | (base.unwrap_or(0) >> 3);
    put(rex);
    put(0x8D);
    // mod: no base means disp32 with mod 00 (SIB base 101); rbp and r13 as base have no
    // displacement-free form.
    let (md, disp_len) = match base {
        None => (0b00, 4),
        Some(b) if disp == 0 && b & 7 != 5 => (0b00, 0),
        Some(_) if disp == disp as i8 as i32 => (0b01, 1),
        Some(_) => (0b10, 4),
    };
    // iced keeps a scale given without an index, in a SIB byte.
    let sib =
        index.is_some() || base.is_none() || base.is_some_and(|b| b & 7 == 4) || scale_bits != 0;
    let rm = if sib { 0b100 } else { base.unwrap_or(0) & 7 };
    put(md << 6 | rm);
    if sib {
        let idx = index.map_or(0b100, |i| i & 7);
        let bas = base.map_or(0b101, |b| b & 7);
        put(scale_bits << 6 | idx << 3 | bas);
    }
    for b in &disp.to_le_bytes()[..disp_len] {
        put(*b);
    }
    Some(out)
}

/// Whether an inline address computation can be encoded for `m` (with the offset of its
/// last byte): a constant, or a displacement that stays a disp32.
pub(super) fn ea_encodable(m: &iced_x86::UsedMemory) -> bool {
    if m.base() == Register::None && m.index() == Register::None {
        return true;
    }
    let last = m
        .displacement()
        .wrapping_add((m.memory_size().size() as u64).saturating_sub(1)) as i64;
    let d = m.displacement() as i64;
    d == d as i32 as i64 && last == last as i32 as i64
}

/// Whether a `gs:` memory operand can be rewritten: an ordinary (non-transfer)
/// instruction with 64-bit addressing by general registers, not RIP-relative, not the
/// `moffs` forms.
pub(super) fn gs_rewritable(ins: &Instruction) -> bool {
    matches!(ins.flow_control(), FlowControl::Next)
        && !ins.is_ip_rel_memory_operand()
        && (ins.memory_base() == Register::None || is_gpr64(ins.memory_base()))
        && (ins.memory_index() == Register::None || is_gpr64(ins.memory_index()))
        && !matches!(
            ins.code(),
            Code::Mov_AL_moffs8
                | Code::Mov_AX_moffs16
                | Code::Mov_EAX_moffs32
                | Code::Mov_RAX_moffs64
                | Code::Mov_moffs8_AL
                | Code::Mov_moffs16_AX
                | Code::Mov_moffs32_EAX
                | Code::Mov_moffs64_RAX
        )
}

pub(super) fn is_gpr64(r: Register) -> bool {
    r.is_gpr64()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand encoding is byte for byte iced's, for every base, index, scale and
    /// displacement class it takes on; the rest are left to iced.
    #[test]
    fn lea_rax_by_hand_is_iceds_encoding() {
        use Register::*;
        let regs = [
            None, RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8, R9, R10, R11, R12, R13, R14, R15,
        ];
        let disps = [0i64, 1, -1, 127, -128, 128, -129, 0x7fff_ffff, -0x8000_0000];
        let mut checked = 0;
        for base in regs {
            for index in regs {
                for scale in [1, 2, 4, 8] {
                    for disp in disps {
                        let Some(hand) = lea_rax_bytes(base, index, scale, disp) else {
                            assert!(
                                (base == None && index == None) || index == RSP,
                                "{base:?} {index:?}"
                            );
                            continue;
                        };
                        let lea = lea_rax_by_iced(base, index, scale, disp).unwrap();
                        let mut enc = Encoder::new(64);
                        enc.encode(&lea, 0x1000).unwrap();
                        assert_eq!(
                            hand.bytes(),
                            &enc.take_buffer()[..],
                            "{base:?} {index:?} {scale} {disp}"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 2000);
        assert!(lea_rax_bytes(RIP, None, 1, 8).is_none());
        assert!(lea_rax_bytes(EAX, None, 1, 8).is_none());
        assert!(lea_rax_bytes(RAX, None, 1, 1 << 40).is_none());
    }
}
