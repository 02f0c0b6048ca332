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
        let mut enc = Encoder::new(64);
        enc.encode(m, self.here())
            .map_err(|_| TranslateError::Encode { pc })?;
        self.buf.extend_from_slice(&enc.take_buffer());
        Ok(())
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
        let lea = Instruction::with2(iced_x86::Code::Lea_r64_m, Register::RAX, op)
            .map_err(|_| TranslateError::Encode { pc })?;
        self.encode(&lea, pc)
    }
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
