//! `--stacks=yes`: how many bytes of stack each thread uses, measured as Valgrind's core
//! measures it for Massif: every change of the stack pointer is an event, growth a
//! `new_mem_stack` and shrinkage a `die_mem_stack` (with a peak check first), and a change
//! bigger than `--max-stackframe` (2,000,000 bytes) is a switch to another stack, not counted.
//!
//! How: the engine tells what each instruction does to `rsp` ([`SpChange`]): a known
//! delta (`push`, `pop`, `call`, `ret n`, `enter`, `sub`/`add rsp, imm`), `leave`
//! (`rbp + 8`), or a value only the registers after it tell (`mov rsp, ...`, `and rsp, -16`).
//! [`instrument`] puts a pc probe before each instruction that writes `rsp`; it first catches
//! up with whatever moved `rsp` unseen since the thread's previous probe (a signal frame, code
//! the engine does not show us), then applies the instruction's own change, computed from the
//! registers before it. An unknown write gets a second probe after it, which reads the result.
//! Probing *before* keeps a switch to another stack (a signal handler on its alternate stack,
//! a coroutine) apart from the first change made there: the jump is seen alone, then the
//! handler's `sub rsp` as the growth it is. Consecutive changes of one direction in a block
//! share one probe (see [`probes`]): a clean call per run of stack-pointer changes, about
//! two per function call. A stack-pointer facility in the engine would replace the probes
//! (the tool-side logic would stay).
//!
//! Each thread counts from a baseline: the main thread from its stack pointer at process
//! entry (as Valgrind, which tracks from the first instruction; `/proc/self/stat` gives it),
//! other threads from where they are first seen. A thread's bytes are `baseline - rsp`,
//! never below zero. A thread that ends leaves its last depth counted, as under Valgrind
//! (which sees no stack event when a thread exits).

use core::cell::Cell;

use oxgrind_tool::instrument::{GuestRegs, Insn, Plan, SpChange};

/// Valgrind's default `--max-stackframe`.
const MAX_STACKFRAME: u64 = 2_000_000;

/// What a probe does, encoded in its data.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Catch up with `rsp`, then `rsp += delta` (the probed instruction, and the ones of its
    /// run after it).
    Delta(i32),
    /// Catch up with `rsp`, then `rsp = rbp + offset` (`leave`: 8; `leave; ret`: 16).
    FromRbp(i32),
    /// Catch up with `rsp` only.
    CatchUp,
}

impl Effect {
    fn encode(self) -> u64 {
        match self {
            Effect::Delta(d) => d as u32 as u64,
            Effect::FromRbp(d) => 1 << 32 | d as u32 as u64,
            Effect::CatchUp => 2 << 32,
        }
    }

    fn decode(data: u64) -> Effect {
        match data >> 32 {
            0 => Effect::Delta(data as u32 as i32),
            1 => Effect::FromRbp(data as u32 as i32),
            _ => Effect::CatchUp,
        }
    }

    /// `rsp` after the probed instruction (and its run), from the registers before it.
    fn rsp_after(self, regs: &GuestRegs) -> u64 {
        match self {
            Effect::Delta(d) => regs.rsp().wrapping_add(d as i64 as u64),
            Effect::FromRbp(d) => regs.rbp().wrapping_add(d as i64 as u64),
            Effect::CatchUp => regs.rsp(),
        }
    }

    /// The same effect followed by `rsp += d`.
    fn then(self, d: i32) -> Option<Effect> {
        match self {
            Effect::Delta(a) => a.checked_add(d).map(Effect::Delta),
            Effect::FromRbp(a) => a.checked_add(d).map(Effect::FromRbp),
            Effect::CatchUp => None,
        }
    }
}

/// The probes a block whose instructions change `rsp` as `sps` says needs:
/// `(instruction index, effect)`.
///
/// Consecutive changes of one direction make one probe, at the first of them, with their
/// sum (`push rbp; mov rbp, rsp; sub rsp, 32`: one growth of 40; `leave; ret`: `rsp = rbp +
/// 16`). Nothing can watch the stack in between (a block has no call inside it, and a
/// signal's handler catches up at its first probe), a peak is still checked before the
/// first byte of a shrink (at the deepest point, as Valgrind checks it), and the bytes of
/// each direction, hence `--time-unit=B`, add up the same: what changes is only how many
/// clean calls the block makes (one instead of three in a typical prologue). A run starts
/// again at a change of direction, at a `leave` (its `rbp` is read when its probe runs),
/// and around a write of unknown effect.
pub(crate) fn probes(sps: &[SpChange]) -> Vec<(usize, Effect)> {
    let mut out: Vec<(usize, Effect)> = Vec::new();
    // The run the last probe of `out` stands for, and its direction (true: growth).
    let mut run: Option<bool> = None;
    for (i, &sp) in sps.iter().enumerate() {
        let after_unknown = i > 0 && sps[i - 1] == SpChange::Unknown;
        match sp {
            SpChange::Delta(d) => {
                let grows = d < 0;
                if run == Some(grows) && !after_unknown {
                    let last = out.last_mut().expect("a run has its probe");
                    if let Some(e) = last.1.then(d) {
                        last.1 = e;
                        continue;
                    }
                }
                out.push((i, Effect::Delta(d)));
                run = Some(grows);
            }
            SpChange::Leave => {
                out.push((i, Effect::FromRbp(8)));
                run = Some(false);
            }
            SpChange::Unknown => {
                out.push((i, Effect::CatchUp));
                run = None;
            }
            SpChange::None if after_unknown => {
                out.push((i, Effect::CatchUp));
                run = None;
            }
            SpChange::None => {}
        }
    }
    out
}

/// Asks for the probes of one block.
pub(crate) fn instrument(block: &[Insn], plan: &mut Plan) {
    let sps: Vec<SpChange> = block.iter().map(|i| i.sp).collect();
    for (i, e) in probes(&sps) {
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
    use oxgrind_tool::instrument::SpChange;

    #[test]
    fn each_run_is_probed_before_and_an_unknown_write_after_too() {
        use SpChange::*;
        // push rbp; mov rbp, rsp; sub rsp, 0x10; and rsp, -16; mov eax, 1; call rel32
        let sps = [Delta(-8), None, Delta(-16), Unknown, None, Delta(-8)];
        assert_eq!(
            probes(&sps),
            [
                (0, Effect::Delta(-24)),
                (3, Effect::CatchUp),
                (4, Effect::CatchUp),
                (5, Effect::Delta(-8)),
            ]
        );
        // leave; ret 16
        assert_eq!(probes(&[Leave, Delta(24)]), [(0, Effect::FromRbp(32))]);
        // add rsp, 8; pop rbx; push rax; leave; leave: direction changes and leaves split
        assert_eq!(
            probes(&[Delta(8), Delta(8), Delta(-8), Leave, Leave]),
            [
                (0, Effect::Delta(16)),
                (2, Effect::Delta(-8)),
                (3, Effect::FromRbp(8)),
                (4, Effect::FromRbp(8)),
            ]
        );
        for e in [
            Effect::Delta(-8),
            Effect::Delta(24),
            Effect::FromRbp(8),
            Effect::FromRbp(-40),
            Effect::CatchUp,
        ] {
            assert_eq!(Effect::decode(e.encode()), e);
        }
    }

    #[test]
    fn a_handler_on_another_stack_counts_its_own_frame() {
        // The probe before the handler's `sub rsp` sees the switch alone, then the growth.
        let mut t = ThreadStack::default();
        t.step(0x7fff_0000);
        t.step(0x7fff_0000 - 100);
        let alt = 0x5000_0000u64;
        assert_eq!(t.step(alt), 0, "the switch");
        assert_eq!(t.step(alt - 3016), 3016, "the handler's frame");
        assert_eq!(t.step(alt), -3016);
        assert_eq!(t.step(0x7fff_0000 - 100), 0, "back");
        assert_eq!(t.counted, 100);
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
