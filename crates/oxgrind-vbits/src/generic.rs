//! The generic pessimistic rule, for every instruction without a specific one: if any bit
//! the instruction reads is undefined, every bit it writes is undefined; otherwise every bit
//! it writes is defined. This is Memcheck's `mkLazyN` applied to the whole instruction, and
//! what keeps an unmodelled instruction from silently laundering undefined values.
//!
//! What is read and written comes from iced-x86's instruction info (registers, memory with
//! sizes, flags). Two refinements keep it from being absurd: the stack pointer's shadow is
//! never changed (`push`/`pop`-like instructions move it by constants), and flags the
//! instruction always clears or sets are defined.

use iced_x86::{InstructionInfoFactory, OpAccess, Register};

use crate::algebra::lanes::Vec512;
use crate::algebra::mask;
use crate::ctx::Ctx;
use crate::state::{FlagShadows, Guest, Segment, ShadowMemory};
use crate::ValueUse;

fn reads(access: OpAccess) -> bool {
    matches!(
        access,
        OpAccess::Read | OpAccess::CondRead | OpAccess::ReadWrite | OpAccess::ReadCondWrite
    )
}

fn writes(access: OpAccess) -> bool {
    matches!(
        access,
        OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
    )
}

fn conditional(access: OpAccess) -> bool {
    matches!(access, OpAccess::CondWrite | OpAccess::ReadCondWrite)
}

pub(crate) fn rule<G: Guest, M: ShadowMemory>(
    cx: &mut Ctx<G, M>,
    factory: &mut InstructionInfoFactory,
) {
    let insn = cx.insn;
    let info = factory.info(insn);
    let guest = cx.guest;
    let mut undefined = false;

    // Inputs: registers.
    for used in info.used_registers() {
        let reg = used.register();
        if !reads(used.access()) || reg.full_register() == Register::RSP {
            continue;
        }
        undefined |= register_shadow_nonzero(cx, reg);
    }
    // Inputs: flags.
    undefined |= cx
        .regs
        .flags
        .any(FlagShadows::bits_of_iced(insn.rflags_read()));
    // Inputs: memory, with the address check of each access.
    for mem in info.used_memory() {
        let mut vaddr = 0u64;
        for reg in [mem.base(), mem.index()] {
            if reg != Register::None && reg.is_gpr() && reg.full_register() != Register::RSP {
                vaddr |= cx.read_reg(reg).s;
            }
        }
        cx.check_value(vaddr, ValueUse::Address);
        if !reads(mem.access()) {
            continue;
        }
        let Some(addr) = mem.virtual_address(0, |reg, element, element_size| {
            register_value(guest, reg, element, element_size)
        }) else {
            undefined = true;
            continue;
        };
        let size = mem.memory_size().size();
        let mut offset = 0usize;
        let mut buf = [0u8; 64];
        while offset < size {
            let n = (size - offset).min(64);
            cx.mem.load(addr.wrapping_add(offset as u64), &mut buf[..n]);
            undefined |= buf[..n].iter().any(|b| *b != 0);
            offset += n;
        }
    }

    // Outputs: registers.
    let fill: u8 = if undefined { 0xff } else { 0 };
    let vex = cx.vex_like();
    for used in info.used_registers() {
        let reg = used.register();
        let access = used.access();
        if !writes(access) || reg.full_register() == Register::RSP {
            continue;
        }
        let cond = conditional(access);
        if reg.is_gpr() {
            let w = (reg.size() * 8) as u32;
            let new = if undefined { mask(w) } else { 0 };
            let old = cx.read_reg(reg).s;
            cx.write_reg(reg, if cond { old | new } else { new });
        } else if reg.is_vector_register() {
            let i = reg.number() & 31;
            let bytes = reg.size().min(64);
            let v = &mut cx.regs.vector[i];
            for b in &mut v[..bytes] {
                *b = if cond { *b | fill } else { fill };
            }
            if vex && !cond {
                for b in &mut v[bytes..] {
                    *b = 0;
                }
            }
        } else if reg.is_k() {
            let i = reg.number() & 7;
            let new = if undefined { u64::MAX } else { 0 };
            let k = &mut cx.regs.opmask[i];
            *k = if cond { *k | new } else { new };
        }
    }
    // Outputs: memory.
    for mem in info.used_memory() {
        if !writes(mem.access()) {
            continue;
        }
        let Some(addr) = mem.virtual_address(0, |reg, element, element_size| {
            register_value(guest, reg, element, element_size)
        }) else {
            continue;
        };
        let size = mem.memory_size().size();
        let cond = conditional(mem.access());
        let mut offset = 0usize;
        let mut buf = [0u8; 64];
        while offset < size {
            let n = (size - offset).min(64);
            let a = addr.wrapping_add(offset as u64);
            if cond {
                cx.mem.load(a, &mut buf[..n]);
                for b in &mut buf[..n] {
                    *b |= fill;
                }
            } else {
                buf[..n].fill(fill);
            }
            cx.mem.store(a, &buf[..n]);
            offset += n;
        }
    }
    // Outputs: flags.
    let modified = FlagShadows::bits_of_iced(insn.rflags_modified());
    let constant = FlagShadows::bits_of_iced(insn.rflags_cleared() | insn.rflags_set());
    let mut f = cx.regs.flags.0 & !modified;
    if undefined {
        f |= modified & !constant;
    }
    cx.regs.flags = FlagShadows(f);
}

fn register_shadow_nonzero<G: Guest, M: ShadowMemory>(cx: &Ctx<G, M>, reg: Register) -> bool {
    if reg.is_gpr() {
        cx.read_reg(reg).s != 0
    } else if reg.is_vector_register() {
        let v: &Vec512 = &cx.regs.vector[reg.number() & 31];
        v[..reg.size().min(64)].iter().any(|b| *b != 0)
    } else if reg.is_k() {
        cx.regs.opmask[reg.number() & 7] != 0
    } else {
        false
    }
}

/// Register values for iced-x86's address computation (VSIB indexes read vector lanes).
fn register_value<G: Guest>(
    guest: &G,
    reg: Register,
    element: usize,
    element_size: usize,
) -> Option<u64> {
    if reg.is_gpr() {
        let full = guest.gpr(reg.full_register().number() & 15);
        let w = (reg.size() * 8) as u32;
        if matches!(
            reg,
            Register::AH | Register::CH | Register::DH | Register::BH
        ) {
            return Some((full >> 8) & 0xff);
        }
        return Some(full & mask(w));
    }
    if reg.is_vector_register() {
        let v = guest.vector(reg.number() & 31);
        let lane = crate::algebra::lanes::get(&v, element_size.clamp(1, 8), element);
        return Some(crate::algebra::sext(
            lane,
            (element_size.clamp(1, 8) * 8) as u32,
        ));
    }
    Some(match reg {
        Register::FS => guest.segment_base(Segment::Fs),
        Register::GS => guest.segment_base(Segment::Gs),
        // RIP-relative displacements are already absolute; other segments have base 0.
        _ => 0,
    })
}
