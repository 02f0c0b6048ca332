//! The runtime's policy for the engine (`oxgrind_engine::probe::Embedder`): the engine calls
//! the tool itself, and asks here only where and when it may, and which functions are
//! replaced.
//!
//! It exists to keep two things out of the tool's sight. Our own code (the allocator
//! hooks, the private heap, the tools themselves running translated) is never offered for
//! instrumentation: a probe there would call the tool while that code holds its locks.
//! And accesses made by glibc's allocator on our behalf, inside a hook, are not the
//! program's: Valgrind's tools never see its malloc's internals either.

use oxgrind_engine::probe::{Client, Embedder};

use crate::host::HOST;
use crate::state;

pub struct RuntimePolicy;

pub static POLICY: RuntimePolicy = RuntimePolicy;

impl Embedder for RuntimePolicy {
    /// Our own code, never instrumented; except the replacements of the program's string
    /// functions (`replace.rs`), which run on its behalf and are checked as its code is.
    fn is_own_code(&self, pc: u64) -> bool {
        let (lo, hi) = crate::stacks::self_text();
        lo <= pc && pc < hi && !crate::replace::contains(pc)
    }

    fn call(&self, probe: bool, f: &mut dyn FnMut()) {
        if probe && crate::guard::in_runtime_or_allocator() {
            return;
        }
        // The tool's own libc calls (symbolising while it reports) are ours, not the
        // program's: inside the runtime, the allocator hooks pass them to glibc untracked.
        match crate::guard::Entered::try_enter() {
            Some(_inside) => f(),
            // Already inside the runtime on this thread: a probe is dropped; anything else
            // (a trace drain, a client request) must still reach the tool.
            None if !probe => f(),
            None => {}
        }
    }

    /// The string functions the runtime replaces (Memcheck's checked versions), then the
    /// tool's own redirections.
    fn redirect(&self, pc: u64) -> Option<u64> {
        if self.is_own_code(pc) {
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

/// The engine's client: the tool, our host, our policy.
pub fn client() -> Option<Client> {
    let rt = state::runtime()?;
    Some(Client {
        tool: &*rt.tool,
        host: &HOST,
        embedder: &POLICY,
    })
}
