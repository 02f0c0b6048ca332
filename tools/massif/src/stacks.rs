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

/// Most steps one probe replays (see [`Effect::Steps`]).
const MAX_STEPS: usize = 7;

/// What a probe does, encoded in its data.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Catch up with `rsp`, then `rsp += delta` (the probed instruction).
    Delta(i32),
    /// Catch up with `rsp`, then the instructions of a run one after the other: `leave`
    /// first (`rsp = rbp + 8`) if `leave` is set, then `rsp += 8 * unit` for each unit.
    Steps {
        leave: bool,
        units: [i8; MAX_STEPS],
        n: u8,
    },
    /// Catch up with `rsp` only.
    CatchUp,
}

impl Effect {
    fn encode(self) -> u64 {
        match self {
            Effect::Delta(d) => d as u32 as u64,
            Effect::Steps { leave, units, n } => {
                let mut v = 1 << 62 | (leave as u64) << 61 | n as u64;
                for (i, &u) in units.iter().enumerate() {
                    v |= (u as u8 as u64) << (4 + 8 * i);
                }
                v
            }
            Effect::CatchUp => 2 << 62,
        }
    }

    fn decode(data: u64) -> Effect {
        match data >> 62 {
            0 => Effect::Delta(data as u32 as i32),
            1 => {
                let mut units = [0i8; MAX_STEPS];
                for (i, u) in units.iter_mut().enumerate() {
                    *u = (data >> (4 + 8 * i)) as u8 as i8;
                }
                Effect::Steps {
                    leave: data >> 61 & 1 != 0,
                    units,
                    n: (data & 0xf) as u8,
                }
            }
            _ => Effect::CatchUp,
        }
    }

    /// A run of one step.
    fn leave() -> Effect {
        Effect::Steps {
            leave: true,
            units: [0; MAX_STEPS],
            n: 0,
        }
    }

    /// The run made of this step (a delta of a multiple of 8 within a unit's range).
    fn small(d: i32) -> Option<Effect> {
        Effect::Steps {
            leave: false,
            units: [0; MAX_STEPS],
            n: 0,
        }
        .then_small(d)
    }

    /// This run followed by `rsp += d`, if `d` is a multiple of 8 a unit can hold and the
    /// run has room.
    fn then_small(self, d: i32) -> Option<Effect> {
        let Effect::Steps {
            leave,
            mut units,
            n,
        } = self
        else {
            return None;
        };
        if d % 8 != 0 || n as usize == MAX_STEPS {
            return None;
        }
        units[n as usize] = i8::try_from(d / 8).ok()?;
        Some(Effect::Steps {
            leave,
            units,
            n: n + 1,
        })
    }

    /// The stack pointer after each instruction the probe stands for, from the registers
    /// before the first: calls `f` with each in order.
    fn each_rsp(self, regs: &GuestRegs, mut f: impl FnMut(u64)) {
        match self {
            Effect::Delta(d) => f(regs.rsp().wrapping_add(d as i64 as u64)),
            Effect::Steps { leave, units, n } => {
                let mut sp = regs.rsp();
                if leave {
                    sp = regs.rbp().wrapping_add(8);
                    f(sp);
                }
                for &u in &units[..n as usize] {
                    sp = sp.wrapping_add((u as i64 * 8) as u64);
                    f(sp);
                }
            }
            Effect::CatchUp => {}
        }
    }
}

/// The probes a block whose instructions change `rsp` as `sps` says needs:
/// `(instruction index, effect)`.
///
/// Consecutive changes of one direction share one probe, at the first of them, which
/// replays them in order (`push rbp; mov rbp, rsp; sub rsp, 32`; `leave; ret`): nothing
/// can watch the stack in between (a block has no call inside it, and a signal's handler
/// catches up at its first probe), so Massif sees Valgrind's events, one per instruction,
/// from one clean call instead of one per instruction. A run starts again at a change of
/// direction, at a `leave` (its `rbp` is read when its probe runs), around a write of
/// unknown effect, and at a change that is not a multiple of 8 or is larger than 1016
/// bytes (such a change gets a probe of its own).
pub(crate) fn probes(sps: &[SpChange]) -> Vec<(usize, Effect)> {
    let mut out: Vec<(usize, Effect)> = Vec::new();
    // The direction of the run the last probe of `out` stands for (true: growth), if it
    // may take more.
    let mut run: Option<bool> = None;
    for (i, &sp) in sps.iter().enumerate() {
        let after_unknown = i > 0 && sps[i - 1] == SpChange::Unknown;
        match sp {
            SpChange::Delta(d) => {
                let grows = d < 0;
                if run == Some(grows) && !after_unknown {
                    let last = out.last_mut().expect("a run has its probe");
                    if let Some(e) = last.1.then_small(d) {
                        last.1 = e;
                        continue;
                    }
                }
                match Effect::small(d) {
                    Some(e) => {
                        out.push((i, e));
                        run = Some(grows);
                    }
                    None => {
                        out.push((i, Effect::Delta(d)));
                        run = None;
                    }
                }
            }
            SpChange::Leave => {
                out.push((i, Effect::leave()));
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

/// Most changes one probe reports: the catch-up and a run's steps.
pub(crate) const MAX_CHANGES: usize = MAX_STEPS + 2;

/// A probe: the changes in this thread's counted bytes, first the catch-up with `regs.rsp`,
/// then each instruction's own, in order (zeros where nothing changed).
pub(crate) fn at_probe(regs: &GuestRegs, data: u64) -> [i64; MAX_CHANGES] {
    let effect = Effect::decode(data);
    THREAD.with(|t| {
        let mut s = t.get();
        let mut d = [0i64; MAX_CHANGES];
        d[0] = s.step(regs.rsp());
        let mut i = 1;
        effect.each_rsp(regs, |sp| {
            d[i] = s.step(sp);
            i += 1;
        });
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
        let steps = |leave: bool, u: &[i8]| {
            let mut units = [0i8; MAX_STEPS];
            units[..u.len()].copy_from_slice(u);
            Effect::Steps {
                leave,
                units,
                n: u.len() as u8,
            }
        };
        // push rbp; mov rbp, rsp; sub rsp, 0x10; and rsp, -16; mov eax, 1; call rel32
        let sps = [Delta(-8), None, Delta(-16), Unknown, None, Delta(-8)];
        assert_eq!(
            probes(&sps),
            [
                (0, steps(false, &[-1, -2])),
                (3, Effect::CatchUp),
                (4, Effect::CatchUp),
                (5, steps(false, &[-1])),
            ]
        );
        // leave; ret 16
        assert_eq!(probes(&[Leave, Delta(24)]), [(0, steps(true, &[3]))]);
        // add rsp, 8; pop rbx; push rax; leave; leave; sub rsp, 0x2000; sub rsp, 4
        assert_eq!(
            probes(&[
                Delta(8),
                Delta(8),
                Delta(-8),
                Leave,
                Leave,
                Delta(-0x2000),
                Delta(-4)
            ]),
            [
                (0, steps(false, &[1, 1])),
                (2, steps(false, &[-1])),
                (3, steps(true, &[])),
                (4, steps(true, &[])),
                (5, Effect::Delta(-0x2000)),
                (6, Effect::Delta(-4)),
            ]
        );
        for e in [
            Effect::Delta(-8),
            Effect::Delta(24),
            steps(true, &[3, -1, 127, -128, 0, 5, 6]),
            steps(false, &[-1]),
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
