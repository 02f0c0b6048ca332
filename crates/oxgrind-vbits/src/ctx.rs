//! Operand access for the rules: reads an operand's value and shadow, writes an operand's
//! shadow with x86's partial-register semantics, and makes the address check of a memory
//! operand exactly once per instruction.
//!
//! Writes touch shadows only: the instruction itself writes the values when it runs after
//! the slow path. Rules read every input before they write any output, so an instruction
//! that reads what it writes (`xchg`, `xadd`, `pop [rsp]`) sees its inputs as they were.

use iced_x86::{EncodingKind, Instruction, OpKind, Register};

use crate::algebra::lanes::Vec512;
use crate::algebra::{mask, shl};
use crate::state::{Guest, Segment, ShadowMemory, ShadowRegisters};
use crate::{Check, Checks, ValueUse};

/// A scalar operand: value, shadow (1 = undefined) and width in bits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sv {
    pub v: u64,
    pub s: u64,
    pub w: u32,
}

pub(crate) struct Ctx<'a, G: Guest, M: ShadowMemory> {
    pub insn: &'a Instruction,
    pub guest: &'a G,
    pub regs: &'a mut ShadowRegisters,
    pub mem: &'a mut M,
    pub checks: Checks,
    address: Option<u64>,
}

/// Where the high-byte registers live inside their full register.
fn high_byte(reg: Register) -> bool {
    matches!(
        reg,
        Register::AH | Register::CH | Register::DH | Register::BH
    )
}

impl<'a, G: Guest, M: ShadowMemory> Ctx<'a, G, M> {
    pub fn new(
        insn: &'a Instruction,
        guest: &'a G,
        regs: &'a mut ShadowRegisters,
        mem: &'a mut M,
    ) -> Self {
        Ctx {
            insn,
            guest,
            regs,
            mem,
            checks: Checks::default(),
            address: None,
        }
    }

    pub fn op_count(&self) -> u32 {
        self.insn.op_count()
    }

    pub fn kind(&self, op: u32) -> OpKind {
        self.insn.try_op_kind(op).unwrap_or(OpKind::Register)
    }

    pub fn reg(&self, op: u32) -> Register {
        self.insn.try_op_register(op).unwrap_or(Register::None)
    }

    pub fn is_reg(&self, op: u32) -> bool {
        op < self.op_count() && self.kind(op) == OpKind::Register
    }

    pub fn is_mem(&self, op: u32) -> bool {
        op < self.op_count() && self.kind(op) == OpKind::Memory
    }

    pub fn is_imm(&self, op: u32) -> bool {
        op < self.op_count()
            && matches!(
                self.kind(op),
                OpKind::Immediate8
                    | OpKind::Immediate8_2nd
                    | OpKind::Immediate16
                    | OpKind::Immediate32
                    | OpKind::Immediate64
                    | OpKind::Immediate8to16
                    | OpKind::Immediate8to32
                    | OpKind::Immediate8to64
                    | OpKind::Immediate32to64
            )
    }

    /// Both operands name the same register (the constant-result idioms).
    pub fn same_regs(&self, a: u32, b: u32) -> bool {
        self.is_reg(a) && self.is_reg(b) && self.reg(a) == self.reg(b)
    }

    /// Width in bits of a scalar operand.
    pub fn width(&self, op: u32) -> u32 {
        match self.kind(op) {
            OpKind::Register => (self.reg(op).size() * 8) as u32,
            OpKind::Memory => (self.insn.memory_size().size() * 8) as u32,
            OpKind::Immediate8 | OpKind::Immediate8_2nd => 8,
            OpKind::Immediate16 | OpKind::Immediate8to16 => 16,
            OpKind::Immediate32 | OpKind::Immediate8to32 => 32,
            _ => 64,
        }
    }

    /// Memory size of the explicit memory operand, in bytes.
    pub fn mem_bytes(&self) -> usize {
        self.insn.memory_size().size()
    }

    // ----- general registers -----

    pub fn gpr(&self, index: usize) -> (u64, u64) {
        (self.guest.gpr(index & 15), self.regs.gpr[index & 15])
    }

    pub fn set_gpr(&mut self, index: usize, shadow: u64) {
        self.regs.gpr[index & 15] = shadow;
    }

    /// Reads a general register of any width; other registers (segment, control) read as
    /// defined.
    pub fn read_reg(&self, reg: Register) -> Sv {
        let w = (reg.size() * 8) as u32;
        if !reg.is_gpr() {
            return Sv {
                v: 0,
                s: 0,
                w: w.clamp(8, 64),
            };
        }
        let (v, s) = self.gpr(reg.full_register().number());
        if high_byte(reg) {
            Sv {
                v: (v >> 8) & 0xff,
                s: (s >> 8) & 0xff,
                w: 8,
            }
        } else {
            Sv {
                v: v & mask(w),
                s: s & mask(w),
                w,
            }
        }
    }

    /// Writes a general register's shadow with x86's rules: 32-bit writes zero bits 63:32,
    /// 8- and 16-bit writes merge.
    pub fn write_reg(&mut self, reg: Register, shadow: u64) {
        if !reg.is_gpr() {
            return;
        }
        let index = reg.full_register().number();
        let old = self.regs.gpr[index & 15];
        let new = match reg.size() {
            8 => shadow,
            4 => shadow & 0xffff_ffff,
            2 => (old & !0xffff) | (shadow & 0xffff),
            _ if high_byte(reg) => (old & !0xff00) | ((shadow & 0xff) << 8),
            _ => (old & !0xff) | (shadow & 0xff),
        };
        self.regs.gpr[index & 15] = new;
    }

    // ----- memory -----

    /// The effective address of the explicit memory operand. The first call makes
    /// Memcheck's address check: base and index must be defined.
    pub fn address(&mut self) -> u64 {
        if let Some(a) = self.address {
            return a;
        }
        let insn = self.insn;
        let base = insn.memory_base();
        let index = insn.memory_index();
        let mut addr = insn.memory_displacement64();
        let mut vaddr = 0u64;
        if base == Register::RIP || base == Register::EIP {
            // iced-x86 gives the absolute target as the displacement.
        } else if base != Register::None {
            let r = self.read_reg(base);
            addr = addr.wrapping_add(r.v);
            vaddr |= r.s;
        }
        if index != Register::None && index.is_gpr() {
            let r = self.read_reg(index);
            let scale = insn.memory_index_scale().trailing_zeros();
            addr = addr.wrapping_add(shl(r.v, scale));
            vaddr |= shl(r.s, scale);
        }
        match insn.memory_segment() {
            Register::FS => addr = addr.wrapping_add(self.guest.segment_base(Segment::Fs)),
            Register::GS => addr = addr.wrapping_add(self.guest.segment_base(Segment::Gs)),
            _ => {}
        }
        if base.size() == 4 || (base == Register::None && index.size() == 4) {
            addr &= 0xffff_ffff;
            vaddr &= 0xffff_ffff;
        }
        self.check_value(vaddr, ValueUse::Address);
        self.address = Some(addr);
        addr
    }

    /// Memcheck's check of a 64-bit value used as an address or jump target.
    pub fn check_value(&mut self, shadow: u64, reason: ValueUse) {
        if shadow != 0 {
            self.checks.push(Check::Value { size: 8, reason });
        }
    }

    pub fn check_condition(&mut self, undefined: bool) {
        if undefined {
            self.checks.push(Check::Condition);
        }
    }

    /// Loads value and shadow of up to 8 bytes at `addr`.
    pub fn load(&mut self, addr: u64, bytes: usize) -> (u64, u64) {
        let n = bytes.min(8);
        let mut v = [0u8; 8];
        let mut s = [0u8; 8];
        if !self.guest.read_memory(addr, &mut v[..n]) {
            v = [0; 8];
        }
        self.mem.load(addr, &mut s[..n]);
        (u64::from_le_bytes(v), u64::from_le_bytes(s))
    }

    pub fn store(&mut self, addr: u64, bytes: usize, shadow: u64) {
        let n = bytes.min(8);
        let s = shadow.to_le_bytes();
        self.mem.store(addr, &s[..n]);
    }

    /// Loads value and shadow of up to 64 bytes at `addr`.
    pub fn load_wide(&mut self, addr: u64, bytes: usize) -> (Vec512, Vec512) {
        let n = bytes.min(64);
        let mut v = [0u8; 64];
        let mut s = [0u8; 64];
        if !self.guest.read_memory(addr, &mut v[..n]) {
            v = [0; 64];
        }
        self.mem.load(addr, &mut s[..n]);
        (v, s)
    }

    // ----- scalar operands -----

    /// Reads operand `op` (register, memory or immediate) as a scalar of at most 64 bits.
    pub fn read(&mut self, op: u32) -> Sv {
        match self.kind(op) {
            OpKind::Register => self.read_reg(self.reg(op)),
            OpKind::Memory => {
                let bytes = self.mem_bytes().clamp(1, 8);
                let addr = self.address();
                let (v, s) = self.load(addr, bytes);
                Sv {
                    v,
                    s,
                    w: (bytes * 8) as u32,
                }
            }
            _ => {
                let w = self.width(op);
                let v = self.insn.try_immediate(op).unwrap_or(0);
                Sv {
                    v: v & mask(w),
                    s: 0,
                    w,
                }
            }
        }
    }

    /// Reads operand `op` sign- or zero-extended to `w` bits (immediates are already
    /// sign-extended by iced-x86).
    pub fn read_as(&mut self, op: u32, w: u32) -> Sv {
        let r = self.read(op);
        if self.is_imm(op) {
            let v = self.insn.try_immediate(op).unwrap_or(0);
            return Sv {
                v: v & mask(w),
                s: 0,
                w,
            };
        }
        Sv {
            v: r.v & mask(w),
            s: r.s & mask(w),
            w,
        }
    }

    /// Writes the shadow of scalar operand `op`.
    pub fn write(&mut self, op: u32, shadow: u64) {
        match self.kind(op) {
            OpKind::Register => self.write_reg(self.reg(op), shadow),
            OpKind::Memory => {
                let bytes = self.mem_bytes().clamp(1, 8);
                let addr = self.address();
                self.store(addr, bytes, shadow);
            }
            _ => {}
        }
    }

    // ----- vector operands -----

    /// Is this instruction VEX or EVEX encoded (its register writes zero the upper lanes)?
    pub fn vex_like(&self) -> bool {
        matches!(
            self.insn.encoding(),
            EncodingKind::VEX | EncodingKind::EVEX | EncodingKind::XOP
        )
    }

    /// Reads a vector operand (xmm/ymm/zmm register, or memory of any size up to 64 bytes,
    /// broadcast expanded), returning value, shadow and its size in bytes.
    pub fn read_vec(&mut self, op: u32) -> (Vec512, Vec512, usize) {
        match self.kind(op) {
            OpKind::Register => {
                let reg = self.reg(op);
                if reg.is_vector_register() {
                    let i = reg.number() & 31;
                    (
                        self.guest.vector(i),
                        self.regs.vector[i],
                        reg.size().min(64),
                    )
                } else if reg.is_gpr() {
                    let r = self.read_reg(reg);
                    let mut v = [0u8; 64];
                    let mut s = [0u8; 64];
                    v[..8].copy_from_slice(&r.v.to_le_bytes());
                    s[..8].copy_from_slice(&r.s.to_le_bytes());
                    (v, s, (r.w / 8) as usize)
                } else if reg.is_k() {
                    let i = reg.number() & 7;
                    let mut v = [0u8; 64];
                    let mut s = [0u8; 64];
                    v[..8].copy_from_slice(&self.guest.opmask(i).to_le_bytes());
                    s[..8].copy_from_slice(&self.regs.opmask[i].to_le_bytes());
                    (v, s, 8)
                } else {
                    ([0; 64], [0; 64], 16)
                }
            }
            OpKind::Memory => {
                let addr = self.address();
                if self.insn.is_broadcast() {
                    let elem = self.insn.memory_size().element_size().clamp(1, 8);
                    let total = self.broadcast_bytes();
                    let (v1, s1) = self.load(addr, elem);
                    let mut v = [0u8; 64];
                    let mut s = [0u8; 64];
                    let mut i = 0;
                    while i + elem <= total.min(64) {
                        crate::algebra::lanes::set(&mut v, elem, i / elem, v1);
                        crate::algebra::lanes::set(&mut s, elem, i / elem, s1);
                        i += elem;
                    }
                    (v, s, total)
                } else {
                    let bytes = self.mem_bytes().min(64);
                    let (v, s) = self.load_wide(addr, bytes);
                    (v, s, bytes)
                }
            }
            _ => {
                let v = self.insn.try_immediate(op).unwrap_or(0);
                let mut out = [0u8; 64];
                out[..8].copy_from_slice(&v.to_le_bytes());
                (out, [0; 64], 8)
            }
        }
    }

    /// The vector length of an EVEX broadcast (the destination register's size).
    fn broadcast_bytes(&self) -> usize {
        for op in 0..self.op_count() {
            if self.kind(op) == OpKind::Register && self.reg(op).is_vector_register() {
                return self.reg(op).size().min(64);
            }
        }
        16
    }

    /// Writes `bytes` bytes of shadow to vector operand `op`, with the encoding's rules:
    /// legacy SSE keeps the bytes above, VEX and EVEX zero them up to 64; an EVEX opmask
    /// merges or zeroes whole `lane`-byte elements (an element whose mask bit is undefined
    /// becomes undefined).
    pub fn write_vec(&mut self, op: u32, shadow: &Vec512, bytes: usize, lane: usize) {
        let bytes = bytes.min(64);
        let lane = lane.clamp(1, 64);
        let masked = self.insn.op_mask() != Register::None;
        let (mask_v, mask_s) = if masked {
            let k = self.insn.op_mask().number() & 7;
            (self.guest.opmask(k), self.regs.opmask[k])
        } else {
            (u64::MAX, 0)
        };
        let zeroing = self.insn.zeroing_masking();
        match self.kind(op) {
            OpKind::Register => {
                let reg = self.reg(op);
                if reg.is_gpr() {
                    let mut s = [0u8; 8];
                    s[..bytes.min(8)].copy_from_slice(&shadow[..bytes.min(8)]);
                    self.write_reg(reg, u64::from_le_bytes(s));
                    return;
                }
                if reg.is_k() {
                    let mut s = [0u8; 8];
                    s[..bytes.min(8)].copy_from_slice(&shadow[..bytes.min(8)]);
                    self.regs.opmask[reg.number() & 7] = u64::from_le_bytes(s);
                    return;
                }
                if !reg.is_vector_register() {
                    return;
                }
                let i = reg.number() & 31;
                let vex = self.vex_like();
                let old = self.regs.vector[i];
                let dst = &mut self.regs.vector[i];
                for e in 0..bytes.div_ceil(lane) {
                    let bit = shl(1, e as u32);
                    let range = (e * lane)..((e + 1) * lane).min(bytes);
                    for b in range {
                        dst[b] = if !masked || mask_v & bit != 0 && mask_s & bit == 0 {
                            shadow[b]
                        } else if mask_s & bit != 0 {
                            0xff
                        } else if zeroing {
                            0
                        } else {
                            old[b]
                        };
                    }
                }
                if vex {
                    for b in &mut dst[bytes..] {
                        *b = 0;
                    }
                }
            }
            OpKind::Memory => {
                let addr = self.address();
                if !masked {
                    self.mem.store(addr, &shadow[..bytes]);
                    return;
                }
                for e in 0..bytes.div_ceil(lane) {
                    let bit = shl(1, e as u32);
                    let start = e * lane;
                    let end = ((e + 1) * lane).min(bytes);
                    if mask_s & bit != 0 {
                        let ones = [0xffu8; 64];
                        self.mem
                            .store(addr.wrapping_add(start as u64), &ones[..end - start]);
                    } else if mask_v & bit != 0 {
                        self.mem
                            .store(addr.wrapping_add(start as u64), &shadow[start..end]);
                    }
                }
            }
            _ => {}
        }
    }
}
