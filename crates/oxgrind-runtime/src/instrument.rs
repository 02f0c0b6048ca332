//! The bridge between the engine's probes and the tool: `oxgrind_engine::probe::Instrument`
//! implemented by forwarding to the [`Tool`](oxgrind_tool::Tool).
//!
//! It exists to keep two things out of the tool's sight. Our own code (the allocator
//! hooks, the private heap, the tools themselves running translated) is never offered for
//! instrumentation: a probe there would call the tool while that code holds its locks.
//! And accesses made by glibc's allocator on our behalf, inside a hook, are not the
//! program's: Valgrind's tools never see its malloc's internals either.

use oxgrind_engine::probe::{iced_x86::Instruction, Access, GuestRegs, Instrument, Plan};

use crate::host::HOST;
use crate::state;

pub struct ToolInstrument;

pub static TOOL_INSTRUMENT: ToolInstrument = ToolInstrument;

/// Our own code, never instrumented; except the replacements of the program's string
/// functions (`replace.rs`), which run on its behalf and are checked as its code is.
fn ours(pc: u64) -> bool {
    let (lo, hi) = crate::stacks::self_text();
    lo <= pc && pc < hi && !crate::replace::contains(pc)
}

impl Instrument for ToolInstrument {
    fn instrument(&self, pc: u64, block: &[Instruction], plan: &mut Plan) {
        if ours(pc) {
            return;
        }
        if let Some(rt) = state::runtime() {
            rt.tool.instrument(pc, block, plan);
        }
    }

    fn on_accesses(&self, accesses: &[Access], regs: &GuestRegs, data: u64) {
        if crate::guard::in_runtime_or_allocator() {
            return;
        }
        // The tool's own libc calls (symbolising while it reports) are ours, not the
        // program's: inside the runtime, the allocator hooks pass them to glibc untracked.
        let Some(_inside) = crate::guard::Entered::try_enter() else {
            return;
        };
        if let Some(rt) = state::runtime() {
            rt.tool.on_accesses(&HOST, accesses, regs, data);
        }
    }

    fn on_pc(&self, regs: &GuestRegs, data: u64) {
        if crate::guard::in_runtime_or_allocator() {
            return;
        }
        let Some(_inside) = crate::guard::Entered::try_enter() else {
            return;
        };
        if let Some(rt) = state::runtime() {
            rt.tool.on_pc(&HOST, regs, data);
        }
    }

    fn redirect(&self, pc: u64) -> Option<u64> {
        if ours(pc) {
            return None;
        }
        let rt = state::runtime()?;
        if rt.needs.check_overlaps {
            if let Some(to) = crate::replace::redirect(pc) {
                return Some(to);
            }
        }
        rt.tool.redirect(&HOST, pc)
    }
}
