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
#![deny(unsafe_op_in_unsafe_fn)]

extern crate alloc;

pub mod below_main;
pub mod cxxabi;
mod elfmem;
pub mod maps;
pub mod symbolize;
pub mod unwind;

pub use below_main::{
    below_main_name, cut_below_main, fn_name_kind, is_below_main, FnNameKind, BELOW_MAIN,
};
pub use symbolize::{demangle, modules_from_maps, Module, SymbolizeError, Symbolizer};
pub use unwind::{after_fork_child, capture, capture_from, invalidate, text_range_of, Regs};
