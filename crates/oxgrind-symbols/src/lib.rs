//! Stacks for oxgrind: capturing them inside the program, and naming their frames the way
//! Valgrind does.
//!
//! * [`unwind`] runs inside the profiled program, in every allocation hook: [`capture`]
//!   writes the return addresses of the calling frames using the modules' in-memory DWARF
//!   CFI (`.eh_frame`) behind a lock-free per-address rule cache. It takes no libc lock and
//!   reads `/proc/self/maps` with raw system calls.
//! * [`symbolize`] runs at report time: [`Symbolizer::describe`] turns one code address into
//!   [`Frame`](oxgrind_formats::frame::Frame)s (inlined calls expanded, innermost first) with
//!   Valgrind's function names, file, line and object, from DWARF (also separate debug files
//!   found by build-id or `.gnu_debuglink`), else ELF symbol tables.
//! * [`below_main`] holds Valgrind's rules for the frames under `main`.
//!
//! The capture side only produces addresses; naming them is left to the report writers, so
//! the hot path never touches DWARF line tables or files.
//!
//! # Inside the program: what the runtime may rely on
//!
//! * [`capture`] is lock-free once warm (one cache probe and one or two checked stack reads
//!   per frame: about 10 ns a frame, 140–200 ns for 15 frames of `-O2` C without frame
//!   pointers on the project machine; `cargo test --release --test unwind -- --ignored`).
//! * A cache miss takes a spin lock, may read `/proc/self/maps` (raw `open`/`read`) and
//!   allocates through Rust's global allocator (the runtime's private heap). A thread that
//!   captures from a signal handler while it is itself inside the miss path gets a truncated
//!   stack instead of a deadlock.
//! * After `fork`, the child calls [`after_fork_child`]; after `dlopen`/`dlclose`, the
//!   runtime may call [`invalidate`] (unknown addresses trigger a re-read anyway, at most
//!   every 5 ms).
//! * The return addresses are raw; Valgrind looks callers up (and prints them) at
//!   return address − 1, and so should the caller before [`Symbolizer::describe`].
//!
//! # At report time
//!
//! [`Symbolizer`] is a plain `&mut` object using `std` (files, `mmap`, `HashMap`). C++ names
//! go through libstdc++'s `__cxa_demangle` ([`cxxabi`]), which may `dlopen` libstdc++ on the
//! first C++ name: not from an allocation hook or an async signal handler.
#![deny(unsafe_op_in_unsafe_fn)]

extern crate alloc;

pub use oxgrind_formats::below_main;
pub mod cxxabi;
mod dwarf;
mod elfmem;
pub mod maps;
pub mod symbolize;
pub mod unwind;

pub use below_main::{
    below_main_name, cut_below_main, fn_name_kind, frames_kind, is_below_main, FnNameKind,
    BELOW_MAIN,
};
pub use symbolize::{demangle, modules_from_maps, Module, SymbolizeError, Symbolizer};
pub use unwind::{
    after_fork_child, capture, capture_from, capture_from_call, capture_from_call_logged,
    capture_with_cfas, capture_with_cfas_from, current_stack_bounds, invalidate, rules_generation,
    set_thread_slots, stack_bounds_at, text_range_of, Regs, WalkLog, THREAD_SLOTS_BYTES,
};
