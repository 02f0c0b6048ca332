//! The runtime's policy for the engine (`oxgrind_engine::probe::Embedder`): the engine calls
//! the tool itself, and asks here only where and when it may, and which functions are
//! replaced.
//!
//! It exists to keep two things out of the tool's sight. Our own code (the allocator
//! hooks, the private heap, the tools themselves running translated) is never offered for
//! instrumentation: a probe there would call the tool while that code holds its locks.
//! And accesses made by glibc's allocator on our behalf, inside a hook, are not the
//! program's: Valgrind's tools never see its malloc's internals either.
//!
//! A tool that wants no allocator events (`Needs::ignores_heap`: Cachegrind, Nulgrind) still finds
//! our allocator entry points between the program and glibc, where each only passes the
//! call on: calls to them are redirected to the definitions they would reach without us
//! ([`prepare_allocator_bypass`]), as under Valgrind's tools that replace nothing.

use std::sync::atomic::{AtomicPtr, Ordering};

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

    /// The functions the runtime replaces (the objects' own allocators; Memcheck's checked
    /// string functions), then the tool's own redirections.
    fn redirect(&self, pc: u64) -> Option<u64> {
        if let Some(to) = allocator_bypass(pc) {
            return Some(to);
        }
        if self.is_own_code(pc) {
            return None;
        }
        let rt = state::runtime()?;
        if let Some(to) = crate::replace::redirect(pc) {
            return Some(to);
        }
        rt.tool.redirect(&HOST, pc)
    }

    fn native_try(&self, to: u64) -> Option<u64> {
        crate::replace::native_try(to)
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

/// Our allocator entry points, by name (NUL-terminated), besides C++'s operators
/// (`replace::CXX_ALLOCATION_FUNCTIONS`).
pub(crate) const C_ALLOCATION_FUNCTIONS: [&[u8]; 11] = [
    b"malloc\0",
    b"free\0",
    b"calloc\0",
    b"realloc\0",
    b"cfree\0",
    b"reallocarray\0",
    b"memalign\0",
    b"aligned_alloc\0",
    b"posix_memalign\0",
    b"valloc\0",
    b"pvalloc\0",
];

/// The allocator bypass: (our entry point, the next definition of its name), sorted.
static BYPASS: AtomicPtr<Vec<(u64, u64)>> = AtomicPtr::new(core::ptr::null_mut());

/// With a tool that wants no allocator events, where a hook only passes the call on to
/// glibc (`state::passthrough`), makes the engine send calls to our allocator entry
/// points to the definition of the same name next in the lookup order, the one the
/// program reaches without us (glibc's `malloc`, libstdc++'s `operator new`): nothing of
/// ours runs per allocation (Cachegrind on an allocation-heavy program spent 4% of its
/// time translating and running the hooks, uninstrumented, and their calls and returns).
/// Call once, before the engine starts (`dlsym` takes the loader's lock and may allocate).
pub fn prepare_allocator_bypass() {
    if !state::passthrough() || !BYPASS.load(Ordering::Acquire).is_null() {
        return;
    }
    let cxx = crate::replace::CXX_ALLOCATION_FUNCTIONS
        .iter()
        .map(|n| format!("{n}\0").into_bytes());
    let mut table: Vec<(u64, u64)> = C_ALLOCATION_FUNCTIONS
        .iter()
        .map(|n| n.to_vec())
        .chain(cxx)
        .filter_map(|name| {
            let ours = crate::hooks::own_address(&name, 0)?;
            let next = crate::libc_api::next_symbol(&name) as u64;
            (ours != 0 && next != 0 && next != ours).then_some((ours, next))
        })
        .collect();
    table.sort_unstable();
    table.dedup_by_key(|e| e.0);
    BYPASS.store(Box::into_raw(Box::new(table)), Ordering::Release);
}

/// The engine's `Config::redirect` when there is no client to ask (`--tool=none`, Massif
/// without `--stacks`): the allocator bypass, then the objects' own allocation functions
/// (`replace::redirect`; a tool without heap events has none).
pub fn redirect_without_client(pc: u64) -> Option<u64> {
    allocator_bypass(pc).or_else(|| crate::replace::redirect(pc))
}

/// Where the allocator bypass sends a call to `pc`, if it is one of our entry points (for
/// a tool without heap events: `--tool=none`, Cachegrind, DHAT without them): a passthrough
/// hook run translated cost `--tool=none` about as much again as glibc's allocator beneath
/// it (the way into and out of the native hook, its return through the shared
/// indirect-branch lookup): bench `alloc` 2.2x native CPU.
pub fn allocator_bypass(pc: u64) -> Option<u64> {
    let t = BYPASS.load(Ordering::Acquire);
    if t.is_null() {
        return None;
    }
    // SAFETY: the table is leaked once built and never freed or changed.
    let t = unsafe { &*t };
    t.binary_search_by_key(&pc, |e| e.0).ok().map(|i| t[i].1)
}
