//! `--stacks=yes`: how many bytes of stack each thread uses, measured as Valgrind's core
//! measures it for Massif: every change of the stack pointer is an event, growth a
//! `new_mem_stack` and shrinkage a `die_mem_stack` (with a peak check first), and a change
//! bigger than `--max-stackframe` (2,000,000 bytes) is a switch to another stack, not counted.
//!
//! How: [`instrument`] asks the engine for a pc probe before each instruction that writes
//! `rsp`, with what the instruction will do to it encoded in the probe's data ([`Effect`]):
//! a known delta (push, pop, call, ret, enter, `sub`/`add rsp, imm`), `leave` (`rbp + 8`), or
//! "unknown" (`mov rsp, ...`, `and rsp, -16`, `lea rsp, ...`), for which the next instruction
//! of the block gets a probe that reads the result. Each probe first catches up with whatever
//! moved `rsp` unseen since the thread's previous probe (code the engine does not show us, a
//! signal frame, an unknown write at the end of a block), then applies the instruction's own
//! change. That is one clean call per stack-pointer change: slow but exact. A stack-pointer
//! facility in the engine would replace the probes (the tool-side logic would stay).
//!
//! Each thread counts from a baseline: the main thread from its stack pointer at process
//! entry (as Valgrind, which tracks from the first instruction; `/proc/self/stat` gives it),
//! other threads from where they are first seen. A thread's bytes are `baseline - rsp`,
//! never below zero. A thread that ends leaves its last depth counted, as under Valgrind
//! (which sees no stack event when a thread exits).

use core::cell::Cell;

use oxgrind_tool::instrument::iced_x86::{
    InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register,
};
use oxgrind_tool::instrument::{GuestRegs, Instruction, Plan};

/// Valgrind's default `--max-stackframe`.
const MAX_STACKFRAME: u64 = 2_000_000;

/// What a probed instruction does to `rsp`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    /// `rsp += delta`.
    Delta(i32),
    /// `rsp = rbp + 8`.
    Leave,
    /// Nothing known: only catch up with the current `rsp`.
    CatchUp,
}

impl Effect {
    fn encode(self) -> u64 {
        match self {
            Effect::Delta(d) => d as u32 as u64,
            Effect::Leave => 1 << 32,
            Effect::CatchUp => 2 << 32,
        }
    }

    fn decode(data: u64) -> Effect {
        match data >> 32 {
            0 => Effect::Delta(data as u32 as i32),
            1 => Effect::Leave,
            _ => Effect::CatchUp,
        }
    }

    /// `rsp` after the instruction, from the registers before it.
    fn rsp_after(self, regs: &GuestRegs) -> u64 {
        match self {
            Effect::Delta(d) => regs.rsp().wrapping_add(d as i64 as u64),
            Effect::Leave => regs.rbp().wrapping_add(8),
            Effect::CatchUp => regs.rsp(),
        }
    }
}

fn writes_rsp(factory: &mut InstructionInfoFactory, ins: &Instruction) -> bool {
    factory.info(ins).used_registers().iter().any(|r| {
        r.register() == Register::RSP
            && matches!(
                r.access(),
                OpAccess::Write
                    | OpAccess::ReadWrite
                    | OpAccess::CondWrite
                    | OpAccess::ReadCondWrite
            )
    })
}

/// What `ins`, which writes `rsp`, does to it.
pub(crate) fn effect(ins: &Instruction) -> Effect {
    let explicit = ins.op_count() > 0
        && ins.op0_kind() == OpKind::Register
        && ins.op0_register() == Register::RSP;
    if explicit {
        let imm = ins.op_count() == 2
            && matches!(
                ins.op1_kind(),
                OpKind::Immediate8to64
                    | OpKind::Immediate32to64
                    | OpKind::Immediate8
                    | OpKind::Immediate32
            );
        return match ins.mnemonic() {
            Mnemonic::Sub if imm => Effect::Delta((ins.immediate(1) as i64).wrapping_neg() as i32),
            Mnemonic::Add if imm => Effect::Delta(ins.immediate(1) as i64 as i32),
            // pop rsp, mov, lea, and, xchg, cmov...: read the result after the instruction.
            _ => Effect::CatchUp,
        };
    }
    if ins.mnemonic() == Mnemonic::Leave {
        return Effect::Leave;
    }
    match ins.stack_pointer_increment() {
        0 => Effect::CatchUp,
        d => Effect::Delta(d),
    }
}

/// Probes before every instruction of `block` that moves the stack pointer (and after those
/// whose effect is unknown).
pub(crate) fn instrument(block: &[Instruction], plan: &mut Plan) {
    let mut factory = InstructionInfoFactory::new();
    let mut catch_up = false;
    for (i, ins) in block.iter().enumerate() {
        if writes_rsp(&mut factory, ins) {
            let e = effect(ins);
            plan.pc(i, e.encode());
            catch_up = e == Effect::CatchUp;
        } else if catch_up {
            plan.pc(i, Effect::CatchUp.encode());
            catch_up = false;
        }
    }
}

/// One thread's view of its stack.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct ThreadStack {
    /// Where this thread's stack starts counting (0: not seen yet).
    baseline: u64,
    sp: u64,
    /// Bytes currently counted for this thread: `baseline - sp`, at least 0.
    counted: u64,
}

impl ThreadStack {
    /// The stack pointer moves to `to`: the change in counted bytes (positive: growth).
    pub(crate) fn step(&mut self, to: u64) -> i64 {
        if self.baseline == 0 {
            self.baseline = to;
            self.sp = to;
            return 0;
        }
        let jump = self.sp.wrapping_sub(to) as i64;
        if jump.unsigned_abs() > MAX_STACKFRAME {
            // Another stack (sigaltstack, a coroutine): the baseline moves with it, so what
            // is counted stays as it was, as Valgrind ignores the change.
            self.baseline = self.baseline.wrapping_sub(self.sp).wrapping_add(to);
            self.sp = to;
            return 0;
        }
        self.sp = to;
        let counted = self.baseline.saturating_sub(to);
        let d = counted as i64 - self.counted as i64;
        self.counted = counted;
        d
    }
}

thread_local! {
    // Static TLS of the preloaded runtime (const initialiser, no destructor): reading it
    // never allocates, from any thread, at any probe.
    static THREAD: Cell<ThreadStack> = const {
        Cell::new(ThreadStack { baseline: 0, sp: 0, counted: 0 })
    };
}

/// The calling thread (the main one, at start) counts from `sp`.
pub(crate) fn set_baseline(sp: u64) {
    THREAD.with(|t| {
        t.set(ThreadStack {
            baseline: sp,
            sp,
            counted: 0,
        })
    });
}

/// A probe: the changes in this thread's counted bytes, first the catch-up with `regs.rsp`,
/// then the probed instruction's own.
pub(crate) fn at_probe(regs: &GuestRegs, data: u64) -> [i64; 2] {
    let after = Effect::decode(data).rsp_after(regs);
    THREAD.with(|t| {
        let mut s = t.get();
        let d = [s.step(regs.rsp()), s.step(after)];
        t.set(s);
        d
    })
}

/// The main thread's stack pointer at process entry (where `argc` is), from the kernel:
/// field 28 of `/proc/self/stat`, `startstack`.
pub(crate) fn initial_stack_pointer() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may contain spaces: count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(25)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxgrind_tool::instrument::iced_x86::{Decoder, DecoderOptions};

    fn decode(bytes: &[u8]) -> Vec<Instruction> {
        let mut d = Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE);
        let mut v = Vec::new();
        while d.can_decode() {
            v.push(d.decode());
        }
        v
    }

    #[test]
    fn effects_of_the_usual_stack_instructions() {
        let cases: &[(&[u8], Option<Effect>)] = &[
            (&[0x55], Some(Effect::Delta(-8))),             // push rbp
            (&[0x5d], Some(Effect::Delta(8))),              // pop rbp
            (&[0xe8, 0, 0, 0, 0], Some(Effect::Delta(-8))), // call
            (&[0xc3], Some(Effect::Delta(8))),              // ret
            (&[0xc2, 0x10, 0], Some(Effect::Delta(24))),    // ret 16
            (&[0x48, 0x83, 0xec, 0x28], Some(Effect::Delta(-0x28))), // sub rsp, 0x28
            (&[0x48, 0x81, 0xc4, 0, 1, 0, 0], Some(Effect::Delta(256))), // add rsp, 256
            (&[0xc9], Some(Effect::Leave)),                 // leave
            (&[0x48, 0x89, 0xec], Some(Effect::CatchUp)),   // mov rsp, rbp
            (&[0x48, 0x83, 0xe4, 0xf0], Some(Effect::CatchUp)), // and rsp, -16
            (&[0x48, 0x89, 0xe5], None),                    // mov rbp, rsp
            (&[0x48, 0x8b, 0x44, 0x24, 8], None),           // mov rax, [rsp+8]
        ];
        let mut f = InstructionInfoFactory::new();
        for (bytes, want) in cases {
            let ins = decode(bytes)[0];
            let got = writes_rsp(&mut f, &ins).then(|| effect(&ins));
            assert_eq!(got, *want, "{bytes:02x?}");
            if let Some(e) = got {
                assert_eq!(Effect::decode(e.encode()), e);
            }
        }
    }

    #[test]
    fn an_unknown_write_is_read_back_at_the_next_instruction() {
        // mov rsp, rbp; pop rbp; ret
        let block = decode(&[0x48, 0x89, 0xec, 0x5d, 0xc3]);
        let mut f = InstructionInfoFactory::new();
        let probed: Vec<bool> = block.iter().map(|i| writes_rsp(&mut f, i)).collect();
        assert_eq!(probed, [true, true, true]);
    }

    #[test]
    fn a_thread_counts_from_its_baseline_and_ignores_stack_switches() {
        let mut t = ThreadStack::default();
        assert_eq!(t.step(0x10_0000), 0, "first sight: the baseline");
        assert_eq!(t.step(0x10_0000 - 64), 64);
        assert_eq!(t.step(0x10_0000 - 40), -24);
        // A jump to a signal stack far away: not counted, and back again.
        assert_eq!(t.step(0x7000_0000), 0);
        assert_eq!(t.step(0x7000_0000 - 100), 100);
        assert_eq!(t.step(0x7000_0000), -100);
        assert_eq!(t.step(0x10_0000 - 40), 0);
        // Above the baseline counts nothing, never less than nothing.
        assert_eq!(t.step(0x10_0000 + 16), -40);
        assert_eq!(t.step(0x10_0000 + 8), 0);
    }

    #[test]
    fn the_initial_stack_pointer_is_on_the_main_stack() {
        let sp = initial_stack_pointer().expect("/proc/self/stat");
        let local = 0u8;
        let here = &local as *const u8 as u64;
        // Test threads run on their own stacks; only check it is a plausible stack address.
        assert!(sp > here || sp > 0x7000_0000_0000, "{sp:#x}");
    }
}
