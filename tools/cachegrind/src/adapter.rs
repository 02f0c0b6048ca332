//! From the engine's probes to the simulator's event stream.
//!
//! [`crate::sim::Simulator`] wants, in program order: each instruction executed (its pc and
//! length), its data accesses (address, size, load or store), and the outcome of every
//! conditional and indirect branch. This module is the only place that knows how those are
//! obtained. Today that is with clean calls: an access probe before every instruction that
//! touches memory and a pc probe before each block's last instruction, the fetches of the
//! instructions between them charged in order at the next probe (slow, but exact). When the
//! per-thread trace buffer lands, a block record plus access records replace both probes;
//! the per-instruction table built here ([`InstrInfo`]) and the decisions made from it
//! (which instructions branch, which accesses Valgrind merges) stay as they are.
//!
//! What Valgrind counts, and how each case is reproduced here:
//!
//! * **Ir**: every instruction executed, and every entry of a `rep` string instruction (VEX
//!   makes it a one-iteration loop, entered once more with `rcx == 0` to leave it). The
//!   engine probes the iterations that run; the final entry is added after the iteration
//!   that ends the loop.
//! * **Dr/Dw**: one per load and per store VEX generates. A load followed by a store to the
//!   same address in one instruction (`add [m], r`, `inc [m]`, `cmpxchg`) is merged into one
//!   "modify", counted as a read. A locked read-modify-write other than `cmpxchg`
//!   (`lock add`, `xchg`, `lock xadd`) is a load plus a compare-and-swap in VEX: two reads.
//! * **Bc**: every conditional side exit: `jcc`, `loop*`, `jrcxz`, and the exits of a `rep`
//!   iteration (`rcx != 0` at each entry; for `repe`/`repne` also whether the comparison
//!   continues the loop), and the restart exit of a locked read-modify-write (VEX retries
//!   a failed compare-and-swap; never taken here). The outcome is computed before the
//!   instruction runs, from the flags and `rcx`, or for `cmps`/`scas` from the compared
//!   memory.
//! * **Bi**: every indirect `jmp` and `call` (returns are assumed perfectly predicted); the
//!   target is read from the register or from the memory operand before the jump.

use oxgrind_tool::instrument::{
    Access, AccessKind, Addressing, Cond, Flow, GuestRegs, Insn, Plan, RepString,
};

use crate::sim::Simulator;

/// What the simulator must do for an instruction beyond fetching it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Plain,
    CondJump(Cond),
    /// Indirect `jmp`/`call` through a register (index into `GuestRegs::gpr`).
    IndirectReg(u8),
    /// Indirect `jmp`/`call` through memory: the target is the first value read.
    IndirectMem,
    /// A `rep`/`repe`/`repne` string instruction; `compare`: `cmps`/`scas` (the loop also
    /// ends on the comparison), `repne`: continue while not equal.
    Rep {
        compare: bool,
        repne: bool,
        scas: bool,
        elem: u8,
    },
}

/// An instruction fetch charged at a later probe of the same block.
#[derive(Copy, Clone, Debug)]
pub struct Fetch {
    pub id: u32,
    pub pc: u64,
    pub len: u8,
}

/// One probed instruction as translated: what its probes carry (by address, as `data`).
#[derive(Debug)]
pub struct InstrInfo {
    /// Index of this instruction's costs in [`Simulator::costs`].
    pub id: u32,
    pub pc: u64,
    pub len: u8,
    pub kind: Kind,
    /// A locked read-modify-write that VEX turns into a load plus a compare-and-swap.
    pub locked_rmw: bool,
    /// The unprobed instructions of the block since the previous probe, fetched (and run)
    /// before this one.
    pub before: Vec<Fetch>,
    /// Whether the fetches are charged by the access probe (the instruction has one that
    /// always fires) rather than by a pc probe.
    pub fetch_on_access: bool,
}

/// Classifies one instruction. A pure function of the instruction, as retranslation needs.
pub fn classify(ins: &Insn) -> (Kind, bool) {
    let kind = match ins.flow {
        Flow::CondJump => ins.cond.map_or(Kind::Plain, Kind::CondJump),
        Flow::IndirectJump | Flow::IndirectCall => match ins.indirect_reg {
            Some(r) => Kind::IndirectReg(r),
            None if !ins.mem().is_empty() => Kind::IndirectMem,
            None => Kind::Plain,
        },
        _ => match ins.rep {
            Some(RepString {
                compare,
                scan,
                repne,
                elem,
            }) => Kind::Rep {
                compare,
                repne,
                scas: scan,
                elem,
            },
            None => Kind::Plain,
        },
    };
    (kind, ins.locked)
}

/// Whether a conditional branch is taken, from the registers before it runs.
pub fn taken(c: Cond, regs: &GuestRegs) -> bool {
    c.taken(regs)
}

/// Whether the instruction makes memory accesses the engine reports.
fn touches_memory(ins: &Insn) -> bool {
    !ins.mem().is_empty() || ins.rep_string()
}

/// Whether the access probe of `ins` may not fire although it runs (an empty gather or
/// masked access): such instructions get a pc probe for their fetches as well.
fn access_probe_may_skip(ins: &Insn) -> bool {
    !ins.rep_string()
        && ins
            .mem()
            .iter()
            .any(|m| m.conditional || m.addressing == Addressing::Vector)
}

/// Builds the [`InstrInfo`] of a block's probed instructions and asks for their probes.
/// `register` assigns each instruction's cost index (and records its pc for the report).
///
/// Clean calls are expensive, so not every instruction gets one. A block runs from its first
/// instruction to its last (its only exit), so the fetches of instructions that neither
/// touch memory nor branch are charged, in order, at the next probe: an instruction that
/// touches memory (access probe), or the block's last instruction (pc probe), whose
/// branch outcome is read from the registers just before it runs.
pub fn instrument(block: &[Insn], plan: &mut Plan, register: &mut dyn FnMut(u64) -> u32) {
    let mut before = Vec::new();
    for (i, ins) in block.iter().enumerate() {
        let (kind, locked_rmw) = classify(ins);
        let id = register(ins.pc);
        let mem = touches_memory(ins);
        let last = i + 1 == block.len();
        if !mem && !last && kind == Kind::Plain {
            before.push(Fetch {
                id,
                pc: ins.pc,
                len: ins.len,
            });
            continue;
        }
        let fetch_on_access = mem && !access_probe_may_skip(ins);
        let info: &'static InstrInfo = Box::leak(Box::new(InstrInfo {
            id,
            pc: ins.pc,
            len: ins.len,
            kind,
            locked_rmw,
            before: core::mem::take(&mut before),
            fetch_on_access,
        }));
        let data = info as *const InstrInfo as u64;
        if !fetch_on_access {
            plan.pc(i, data);
        }
        if mem {
            plan.accesses(i, data);
        }
    }
}

/// Reads `size` bytes (1, 2, 4 or 8) of guest memory the probed instruction is about to read.
///
/// # Safety
/// `addr` must be readable for `size` bytes: it is the address of an access the engine
/// reported for the instruction about to run on this (stopped) thread.
unsafe fn read_guest(addr: u64, size: u8) -> u64 {
    // SAFETY: by the caller's contract; unaligned reads are fine on x86-64.
    unsafe {
        match size {
            1 => core::ptr::read_volatile(addr as *const u8) as u64,
            2 => core::ptr::read_unaligned(addr as *const u16) as u64,
            4 => core::ptr::read_unaligned(addr as *const u32) as u64,
            _ => core::ptr::read_unaligned(addr as *const u64),
        }
    }
}

/// # Safety
/// `data` must be a probe's data set by [`instrument`] (a leaked, never freed `InstrInfo`).
pub unsafe fn info<'a>(data: u64) -> &'a InstrInfo {
    // SAFETY: by the caller's contract.
    unsafe { &*(data as *const InstrInfo) }
}

/// The pc probe (or the first part of the access probe): the instructions since the last
/// probe and this one are fetched; branch outcomes known from registers are recorded.
pub fn on_pc(sim: &mut Simulator, info: &InstrInfo, regs: &GuestRegs) {
    for f in &info.before {
        sim.instr(f.id, f.pc, f.len as u64);
    }
    sim.instr(info.id, info.pc, info.len as u64);
    match info.kind {
        Kind::CondJump(c) => sim.cond_branch(info.id, info.pc, taken(c, regs)),
        Kind::IndirectReg(r) => sim.ind_branch(info.id, info.pc, regs.gpr[r as usize]),
        // An iteration that runs was entered with rcx != 0: the exit is not taken, which
        // VEX's inverted guard records as "taken".
        Kind::Rep { .. } => sim.cond_branch(info.id, info.pc, true),
        _ => {}
    }
}

/// The access probe: data accesses in order, then what depends on the values read.
pub fn on_accesses(sim: &mut Simulator, info: &InstrInfo, accesses: &[Access], regs: &GuestRegs) {
    if info.fetch_on_access {
        on_pc(sim, info, regs);
    }
    let mut prev_read: Option<(u64, u32)> = None;
    for a in accesses {
        match a.kind {
            AccessKind::Read => {
                sim.data(info.id, a.addr, a.size as u64, false);
                prev_read = Some((a.addr, a.size));
            }
            AccessKind::Write => {
                // A store right after a load of the same bytes is one "modify" (a read).
                if prev_read == Some((a.addr, a.size)) {
                    prev_read = None;
                    continue;
                }
                sim.data(info.id, a.addr, a.size as u64, true);
                prev_read = None;
            }
            AccessKind::Modify => {
                sim.data(info.id, a.addr, a.size as u64, false);
                if info.locked_rmw {
                    sim.data(info.id, a.addr, a.size as u64, false);
                }
                prev_read = None;
            }
        }
    }
    if info.locked_rmw {
        // VEX's compare-and-swap restarts the instruction when it fails: a side exit,
        // which Cachegrind counts as a conditional branch (not taken).
        sim.cond_branch(info.id, info.pc, false);
    }
    match info.kind {
        Kind::IndirectMem => {
            if let Some(a) = accesses.iter().find(|a| a.kind != AccessKind::Write) {
                // SAFETY: the jump or call is about to read its target from there.
                let target = unsafe { read_guest(a.addr, 8) };
                sim.ind_branch(info.id, info.pc, target);
            }
        }
        Kind::Rep {
            compare,
            repne,
            scas,
            elem,
        } => {
            let remaining = regs.gpr[1].wrapping_sub(1);
            // The iteration jumps back to the instruction (which then leaves on rcx == 0),
            // unless a comparison ends the loop first.
            let mut again = true;
            if compare {
                let mask = if elem >= 8 {
                    u64::MAX
                } else {
                    (1u64 << (elem as u32 * 8)) - 1
                };
                let reads: Vec<&Access> = accesses
                    .iter()
                    .filter(|a| a.kind == AccessKind::Read)
                    .collect();
                // SAFETY: the iteration is about to read these elements.
                let equal = unsafe {
                    if scas {
                        reads
                            .first()
                            .map(|a| read_guest(a.addr, elem) == regs.gpr[0] & mask)
                    } else if reads.len() >= 2 {
                        Some(read_guest(reads[0].addr, elem) == read_guest(reads[1].addr, elem))
                    } else {
                        None
                    }
                };
                let go_on = !matches!(equal, Some(e) if e == repne);
                sim.cond_branch(info.id, info.pc, go_on);
                again = go_on;
            }
            if again && remaining == 0 {
                // The loop jumps back to itself once more and leaves on rcx == 0.
                sim.instr(info.id, info.pc, info.len as u64);
                sim.cond_branch(info.id, info.pc, false);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxgrind_tool::instrument::{MemOp, SpChange};

    fn insn(flow: Flow) -> Insn {
        Insn::new(0x1000, 2, flow)
    }

    #[test]
    fn branches_and_rmw_are_classified_as_valgrind_counts_them() {
        let mut j = insn(Flow::CondJump);
        j.cond = Some(Cond::E);
        assert_eq!(classify(&j).0, Kind::CondJump(Cond::E));
        let mut r = insn(Flow::IndirectJump);
        r.indirect_reg = Some(11);
        assert_eq!(classify(&r).0, Kind::IndirectReg(11));
        let m = insn(Flow::IndirectCall).with_mem(MemOp {
            size: 8,
            kind: AccessKind::Read,
            conditional: false,
            addressing: Addressing::Static,
        });
        assert_eq!(classify(&m).0, Kind::IndirectMem);
        let mut ret = insn(Flow::Return);
        ret.sp = SpChange::Delta(8);
        assert_eq!(classify(&ret).0, Kind::Plain, "ret is not counted");
        let mut scas = insn(Flow::Next);
        scas.rep = Some(RepString {
            compare: true,
            scan: true,
            repne: true,
            elem: 1,
        });
        assert!(matches!(
            classify(&scas).0,
            Kind::Rep {
                compare: true,
                repne: true,
                scas: true,
                elem: 1
            }
        ));
        let mut locked = insn(Flow::Next);
        locked.locked = true;
        assert!(classify(&locked).1);
    }

    #[test]
    fn conditions_follow_the_flags() {
        let mut r = GuestRegs {
            gpr: [0; 16],
            rip: 0,
            rflags: 0x40,
        };
        assert!(taken(Cond::E, &r));
        assert!(!taken(Cond::Ne, &r));
        assert!(taken(Cond::Le, &r));
        r.rflags = 0x880; // SF and OF: "greater or equal"
        assert!(taken(Cond::Ge, &r));
        assert!(taken(Cond::G, &r));
        r.gpr[1] = 1;
        assert!(!taken(Cond::Loop, &r));
        r.gpr[1] = 0;
        assert!(taken(Cond::Jrcxz, &r));
    }
}
