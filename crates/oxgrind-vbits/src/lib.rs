//! Memcheck's definedness rules ("V bits") for x86-64, as one interpreter.
//!
//! Given one decoded instruction, the machine's values before it runs and the V bits of
//! registers and memory, [`Interpreter::step`] writes the V bits the instruction leaves behind
//! and returns the checks Memcheck makes there: the condition of a conditional branch,
//! the address of a memory operand, an indirect branch target, the `rcx` of `rep`/`loop`/
//! `jrcxz` ("Conditional jump or move depends on uninitialised value(s)", "Use of
//! uninitialised value of size 8").
//!
//! This is the slow path of the design in `docs/definedness.md` (Dr. Memory's split): the
//! engine copies shadows inline for moves and handles the all-defined case inline, and calls
//! this interpreter for everything else. Correctness lives here, where it can be tested
//! against the machine itself: `tests/oracle.rs` runs each modelled instruction natively over
//! every completion of the undefined input bits and checks that every bit called defined
//! never changes.
//!
//! Where Memcheck is precise (exact add/sub, `and`/`or` improved by defined bits, exact
//! `==`/`!=`, shifts by defined amounts, count-zeros improvers, lane-wise SIMD, constant
//! idioms such as `xor r,r` and `sbb r,r`), the rules here are at least as precise; where
//! Memcheck is pessimistic (relational compares, multiply, divide, floating point) they are
//! pessimistic in the same way. An instruction without a specific rule gets the generic
//! pessimistic one (every written bit undefined if any read bit is), never silence:
//! [`Outcome::rule`] says which was used, so coverage can be measured.
//!
//! The crate is `no_std` + `alloc`, never panics on any instruction or value (arithmetic is
//! wrapping, indexing is checked), and knows nothing of the engine: the caller supplies the
//! values ([`Guest`]), owns the register shadows ([`ShadowRegisters`]) and backs memory
//! shadows ([`ShadowMemory`]). It does not mark memory undefined on allocation or stack
//! growth, nor check system calls: those are the engine's and the tool's.
#![no_std]
extern crate alloc;

pub mod algebra;
mod ctx;
mod flags;
mod generic;
mod scalar;
mod state;
mod strings;
mod vector;
mod x87;
mod xsave;

pub use flags::{condition_holds, condition_undefined};
pub use state::{FlagShadows, Guest, Segment, ShadowMemory, ShadowRegisters};
pub use vector::is_whole_register_move;

use iced_x86::{Instruction, InstructionInfoFactory};

/// Why a value's definedness was checked; Memcheck words all of them "Use of uninitialised
/// value of size N".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueUse {
    /// The address of a memory operand (its base and index registers).
    Address,
    /// The target of an indirect `jmp`, `call` or a `ret`.
    JumpTarget,
    /// The amount of a vector shift taken from a register (Memcheck's known over-report).
    ShiftAmount,
}

/// One check Memcheck makes at this instruction that found undefined bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// "Conditional jump or move depends on uninitialised value(s)": the condition of a
    /// `jcc`, or the `rcx` test of `jrcxz`, `loop`, `rep`.
    Condition,
    /// "Use of uninitialised value of size `size`".
    Value { size: u8, reason: ValueUse },
}

/// The failed checks of one instruction, in the order Memcheck would make them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checks {
    items: [Option<Check>; 4],
    len: u8,
}

impl Checks {
    pub(crate) fn push(&mut self, check: Check) {
        if let Some(slot) = self.items.get_mut(self.len as usize) {
            *slot = Some(check);
            self.len += 1;
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn len(&self) -> usize {
        self.len as usize
    }
    pub fn iter(&self) -> impl Iterator<Item = Check> + '_ {
        self.items.iter().take(self.len as usize).filter_map(|c| *c)
    }
}

/// Which kind of rule handled an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// A rule written for this instruction (as precise as Memcheck's, or more).
    Specific,
    /// The generic rule: every output bit undefined if any input bit is.
    Pessimistic,
}

/// What [`Interpreter::step`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub checks: Checks,
    pub rule: Rule,
}

/// The definedness interpreter. Holds the scratch space of iced-x86's instruction-info
/// factory (used by the generic rule) and the shadow files saved by `xsave` (restored by
/// `xrstor`), so keep one per thread.
pub struct Interpreter {
    info: InstructionInfoFactory,
    save_areas: xsave::SaveAreas,
}

impl Default for Interpreter {
    fn default() -> Self {
        Self::new()
    }
}

impl Interpreter {
    pub fn new() -> Self {
        Interpreter {
            info: InstructionInfoFactory::new(),
            save_areas: xsave::SaveAreas::default(),
        }
    }

    /// Propagates V bits through `insn`, which is about to run with the values `guest`
    /// shows: updates `regs` and `mem`, and returns the checks that found undefined bits.
    ///
    /// Checks are made on the shadows before the instruction, as Memcheck does; a check
    /// does not mark anything defined (Memcheck marks only its temporary, not the register).
    pub fn step<G: Guest, M: ShadowMemory>(
        &mut self,
        insn: &Instruction,
        guest: &G,
        regs: &mut ShadowRegisters,
        mem: &mut M,
    ) -> Outcome {
        let mut cx = ctx::Ctx::new(insn, guest, regs, mem);
        let specific = scalar::rule(&mut cx)
            || vector::rule(&mut cx)
            || strings::rule(&mut cx)
            || x87::rule(&mut cx)
            || self.save_areas.rule(&mut cx);
        let rule = if specific {
            Rule::Specific
        } else {
            generic::rule(&mut cx, &mut self.info);
            Rule::Pessimistic
        };
        Outcome {
            checks: cx.checks,
            rule,
        }
    }
}
