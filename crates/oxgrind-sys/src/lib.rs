//! Raw Linux x86-64 system calls, locks and a private heap for code that runs inside the
//! profiled program.
//!
//! Everything oxgrind does inside someone else's process (the runtime's hooks, the tools'
//! event handlers, the engine) can be entered at any instant: from inside the program's
//! `malloc`, from a signal handler, from a thread that is half created. This crate is the
//! floor those parts stand on. It never calls libc, never allocates through the program's
//! allocator, and never touches `errno`:
//!
//! * [`syscall`] issues system calls with inline assembly ([`raw`] lists the numbers used);
//! * [`fd`] writes to file descriptors oxgrind owns, with `core::fmt` formatting;
//! * [`lock`] is a spin lock that works before threads, TLS or futexes are set up;
//! * [`lent_fd`] marks the moments oxgrind holds one of the program's descriptor slots;
//! * [`mapfile`] maps files read-only, even when the program holds every descriptor;
//! * [`procself`] reads `/proc/self` files through descriptors kept out of the program's way;
//! * [`heap`] is the runtime's own allocator (`#[global_allocator]` of the runtime), built
//!   on `mmap`, so oxgrind's data never lives in the program's heap.
//!
//! It deliberately offers nothing that needs the program's libc to be in a sane state.
#![no_std]

extern crate alloc;

pub mod fd;
pub mod heap;
pub mod lent_fd;
pub mod mapfile;
/// The spin lock lives in its own crate (`oxgrind-sync`) so that the tool contract can offer
/// it without depending on this one.
pub use oxgrind_sync as lock;
pub mod procself;
pub mod raw;
pub mod syscall;
