//! `--stacks=yes`: how many bytes of stack each thread uses, measured as Valgrind's core
//! measures it for Massif: every change of the stack pointer is an event, growth a
//! `new_mem_stack` and shrinkage a `die_mem_stack` (with a peak check first), and a change
//! bigger than `--max-stackframe` (2,000,000 bytes) is a switch to another stack, not counted.
//!
//! How: the engine tells which instructions write `rsp` (explicitly, or as `push`, `pop`,
//! `call`, `ret`, `enter`, `leave` do). [`instrument`] puts a pc probe right after each of
//! them (before the next instruction of the block), which reads the new `rsp`; calls and
//! returns end a block, so they are probed before and their effect (8 bytes pushed or popped)
//! applied there. Each probe first catches up with whatever moved `rsp` since the thread's
//! previous probe, then applies the probed instruction's own change. So a change is seen
//! right after it happens, or at the latest at the next probe (a write at the end of a block
//! cut at 64 instructions, a signal frame, `ret 16`'s extra bytes, code the engine does not
//! show us). That is a clean call per stack-pointer change: slow but exact. A stack-pointer
//! facility in the engine would replace the probes (the tool-side logic would stay).
//!
//! Each thread counts from a baseline: the main thread from its stack pointer at process
//! entry (as Valgrind, which tracks from the first instruction; `/proc/self/stat` gives it),
//! other threads from where they are first seen. A thread's bytes are `baseline - rsp`,
//! never below zero. A thread that ends leaves its last depth counted, as under Valgrind
//! (which sees no stack event when a thread exits).

use core::cell::Cell;

use oxgrind_tool::instrument::{Flow, GuestRegs, Insn, Plan};

/// Valgrind's default `--max-stackframe`.
const MAX_STACKFRAME: u64 = 2_000_000;

/// What an instruction does to the stack pointer, as far as probing goes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum SpKind {
    /// Leaves `rsp` alone.
    Keeps,
    /// Writes it and falls through: read the result before the next instruction.
    Writes,
    /// `call`: pushes 8 bytes and leaves the block.
    Call,
    /// `ret`: pops 8 bytes (and `ret n`'s `n`, seen at the next probe) and leaves the block.
    Return,
}

/// What a probe does, encoded in its data.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Catch up with `rsp`, then add `delta` (the probed call or return).
    Delta(i32),
    /// Catch up with `rsp` only.
    CatchUp,
}

impl Effect {
    fn encode(self) -> u64 {
        match self {
            Effect::Delta(d) => d as u32 as u64,
            Effect::CatchUp => 1 << 32,
        }
    }

    fn decode(data: u64) -> Effect {
        match data >> 32 {
            0 => Effect::Delta(data as u32 as i32),
            _ => Effect::CatchUp,
        }
    }
}

/// The probes a block with these instructions needs: `(instruction index, effect)`.
pub(crate) fn probes(kinds: &[SpKind]) -> Vec<(usize, Effect)> {
    let mut out = Vec::new();
    for (i, &k) in kinds.iter().enumerate() {
        let after_write = i > 0 && kinds[i - 1] == SpKind::Writes;
        match k {
            SpKind::Call => out.push((i, Effect::Delta(-8))),
            SpKind::Return => out.push((i, Effect::Delta(8))),
            _ if after_write => out.push((i, Effect::CatchUp)),
            _ => {}
        }
    }
    out
}

/// What the engine's description of an instruction says of its stack-pointer use.
fn sp_kind(ins: &Insn) -> SpKind {
    match ins.flow {
        Flow::Call | Flow::IndirectCall => SpKind::Call,
        Flow::Return => SpKind::Return,
        _ if ins.writes_sp() => SpKind::Writes,
        _ => SpKind::Keeps,
    }
}

/// Asks for the probes of one block.
pub(crate) fn instrument(block: &[Insn], plan: &mut Plan) {
    let kinds: Vec<SpKind> = block.iter().map(sp_kind).collect();
    for (i, e) in probes(&kinds) {
        plan.pc(i, e.encode());
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
    let after = match Effect::decode(data) {
        Effect::Delta(d) => regs.rsp().wrapping_add(d as i64 as u64),
        Effect::CatchUp => regs.rsp(),
    };
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
    use oxgrind_tool::instrument::SpChange;

    fn insn(flow: Flow, sp: SpChange) -> Insn {
        let mut i = Insn::new(0x1000, 1, flow);
        i.sp = sp;
        i
    }

    #[test]
    fn the_usual_stack_instructions_are_classified() {
        // (Which instructions write rsp, and how, is the engine's: its `describe` tests.)
        use SpKind::*;
        let cases = [
            (insn(Flow::Next, SpChange::Delta(-8)), Writes),
            (insn(Flow::Next, SpChange::Leave), Writes),
            (insn(Flow::Next, SpChange::Unknown), Writes),
            (insn(Flow::Call, SpChange::Delta(-8)), Call),
            (insn(Flow::IndirectCall, SpChange::Delta(-8)), Call),
            (insn(Flow::Return, SpChange::Delta(8)), Return),
            (insn(Flow::Next, SpChange::None), Keeps),
        ];
        for (ins, want) in cases {
            assert_eq!(sp_kind(&ins), want, "{ins:?}");
        }
    }

    #[test]
    fn each_write_is_read_right_after_and_calls_and_returns_before() {
        use SpKind::*;
        // push rbp; mov rbp, rsp; sub rsp, 0x10; mov eax, 1; call rel32
        let k = [Writes, Keeps, Writes, Keeps, Call];
        assert_eq!(
            probes(&k),
            [
                (1, Effect::CatchUp),
                (3, Effect::CatchUp),
                (4, Effect::Delta(-8))
            ]
        );
        // leave; ret
        assert_eq!(probes(&[Writes, Return]), [(1, Effect::Delta(8))]);
        for e in [Effect::Delta(-8), Effect::Delta(8), Effect::CatchUp] {
            assert_eq!(Effect::decode(e.encode()), e);
        }
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
