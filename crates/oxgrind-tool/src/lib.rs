//! The contract between oxgrind's core and its tools, and nothing else.
//!
//! As in Valgrind, where tools include only `pub_tool_*.h`, a tool crate (`tools/massif`,
//! `tools/memcheck`, ...) depends on this crate and on `oxgrind-formats`, never on the
//! runtime or the engine. The core calls a [`Tool`] through a handful of events; optional ones
//! default to doing nothing (ripgrep's `Sink` manners). What the tool may ask of the core
//! (stacks, symbols, the clock, output files) goes through [`Host`].
//!
//! Events are delivered on the program's own thread, inside its allocator call: handlers must
//! not block on anything the program might hold, and must be quick. Allocation inside a
//! handler is fine: the runtime's global allocator is its private heap.
#![no_std]
extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

pub use oxgrind_formats::frame::Frame;

pub mod addr_table;
pub mod core_view;
pub mod instrument;
pub mod syscalls;

pub use core_view::{CoreView, GenSuppressions};

/// Hints to the CPU a tool's hot loops give (one place for the intrinsic and its reasoning).
pub mod hint {
    /// Starts loading the cache line of `*p` for reading: a hint, never faults, changes
    /// nothing visible.
    #[inline(always)]
    pub fn prefetch_read<T>(p: &T) {
        prefetch_read_at(p as *const T as u64)
    }

    /// Starts loading, for reading, the cache line at address `addr`, which need not be
    /// mapped: a hint, never faults, changes nothing visible.
    #[inline(always)]
    pub fn prefetch_read_at(addr: u64) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch never faults (whatever the address) and writes nothing.
        unsafe {
            core::arch::x86_64::_mm_prefetch(addr as *const i8, core::arch::x86_64::_MM_HINT_T0);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = addr;
    }

    /// Starts loading, for writing, the cache line at address `addr`, which need not be
    /// mapped: a hint, never faults, changes nothing visible.
    #[inline(always)]
    pub fn prefetch_write_at(addr: u64) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch never faults (whatever the address) and writes nothing.
        unsafe {
            core::arch::asm!("prefetchw [{}]", in(reg) addr, options(nostack, readonly, preserves_flags));
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = addr;
    }
}

/// Locks a tool may hold in its event handlers: a spin lock that needs no libc, so it works
/// inside the program's allocator, in a forked child and in signal handlers (see
/// the `oxgrind-sync` crate).
pub mod sync {
    pub use oxgrind_sync::{futex_wait, futex_wake, SpinGuard, SpinLock};
}

/// The process's own `/proc/self` files a tool may read while the program runs
/// ([`Host::read_self_file`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SelfFile {
    /// `/proc/self/maps`: the mappings.
    Maps,
    /// `/proc/self/stat`: `start_brk`, the main thread's initial stack pointer.
    Stat,
    /// `/proc/self/limits`: the soft and hard limits as text.
    Limits,
}

/// A guest address.
pub type Addr = u64;

/// An interned call stack. Frame 0 is the address of the allocation function the program
/// called (our replacement of `malloc`, `operator new`, ...); later frames are return
/// addresses minus one, so they point into the call instruction as Valgrind's do.
#[derive(Copy, Clone, Eq, PartialEq, Hash, Debug, Ord, PartialOrd)]
pub struct StackId(pub u32);

/// Which allocation family a block belongs to: `free` of a `new[]` block is a mismatch.
#[derive(Copy, Clone, Eq, PartialEq, Debug)]
pub enum Family {
    Malloc,
    New,
    NewArray,
}

/// Which entry point the program called, for messages such as `realloc() with size 0`
/// or `Argument 'size' of function malloc has a fishy (possibly negative) value`.
#[derive(Copy, Clone, Eq, PartialEq, Debug)]
pub enum AllocFn {
    Malloc,
    Calloc,
    Realloc,
    ReallocArray,
    Memalign,
    PosixMemalign,
    AlignedAlloc,
    Valloc,
    Pvalloc,
    New,
    NewArray,
    Free,
    Delete,
    DeleteArray,
}

impl AllocFn {
    pub fn family(self) -> Family {
        match self {
            AllocFn::New | AllocFn::Delete => Family::New,
            AllocFn::NewArray | AllocFn::DeleteArray => Family::NewArray,
            _ => Family::Malloc,
        }
    }
}

/// A block the program obtained.
#[derive(Copy, Clone, Debug)]
pub struct Alloc {
    pub addr: Addr,
    /// Bytes requested (`calloc(n, s)`: `n * s`).
    pub size: u64,
    /// Usable bytes beyond `size` as Valgrind's replacement allocator would give them
    /// (`round_up(size, 16) - size`; Massif counts it as extra heap).
    pub slop: u64,
    /// The alignment the program asked for, as it passed it (`memalign`, `posix_memalign`,
    /// `aligned_alloc`, the aligned forms of `operator new`); 0 for the functions that take
    /// none. The block's address may be more aligned than this by chance.
    pub align: u64,
    pub func: AllocFn,
    pub stack: StackId,
    pub tid: i32,
}

/// How the allocator holds a live block beyond its size ([`Host::block_extent`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BlockExtent {
    /// Where the memory only this block may use ends (glibc: the end of its chunk): past the
    /// block's size and up to here lies slack of the allocator's, then, when
    /// `header_follows`, the allocator's header of the next chunk.
    pub end: Addr,
    /// Whether the allocator's bookkeeping of another chunk starts at `end` (16 bytes for
    /// glibc); not for a block with a mapping of its own, which ends with it.
    pub header_follows: bool,
}

/// A block the program gave back (delivered before the memory is released, so a tool can
/// take its peak snapshot first, as Massif does).
#[derive(Copy, Clone, Debug)]
pub struct Free {
    pub addr: Addr,
    pub size: u64,
    pub slop: u64,
    pub alloc_stack: StackId,
    pub alloc_func: AllocFn,
    pub func: AllocFn,
    /// Stack of the call that freed it.
    pub stack: StackId,
    pub tid: i32,
    /// The number the tool gave the block when it was allocated ([`Tool::on_alloc`]'s or
    /// [`Tool::on_realloc`]'s result; 0 for a block the tool gave none).
    pub tool_word: u32,
}

/// How the program is ending, for [`Tool::fini`].
#[derive(Copy, Clone, Debug)]
pub enum Exit {
    /// `exit()`, return from `main`, or `_exit`; the status.
    Normal(i32),
    /// A signal that will kill the process once the report is written.
    Signal(i32),
    /// About to replace the program image with `execve`.
    Exec,
}

/// What a tool asks the core to do for it.
#[derive(Copy, Clone, Debug, Default)]
pub struct Needs {
    /// Frames to capture per allocation (0: no stacks).
    pub stack_depth: usize,
    /// Whether the tool wants to see the stack of `free` calls.
    pub free_stacks: bool,
    /// Nonzero: the tool keeps the program's freed blocks from the allocator (Memcheck's
    /// `--freelist-vol`, whose queue decides when each goes back), so a freed address is not
    /// handed out again soon and can still be described. The runtime then never gives a
    /// freed block of the program back by itself: the tool does, through
    /// [`Host::release_freed`]. 0: each goes back once the tool has heard of its free.
    pub freelist_vol: u64,
    /// Deliver [`Tool::on_map`] / [`Tool::on_unmap`] (Massif's `--pages-as-heap=yes`).
    pub page_events: bool,
    /// Under the engine: follow the program's `mmap`, `mprotect`, `munmap` and `mremap` to
    /// know which of its mappings Valgrind's Memcheck holds unaddressable
    /// ([`Host::noaccess_mapping`]).
    pub mapping_access: bool,
    /// Bytes of slack the runtime leaves after every block (Memcheck's redzone), so a small
    /// overrun lands in memory the program does not own rather than in glibc's chunk headers.
    pub redzone: u64,
    /// Run the program under the translation engine (every instruction passes through it).
    pub translation: bool,
    /// The tool wants no allocator events: the hooks pass straight to glibc.
    pub ignores_heap: bool,
    /// Check the copying string functions (`strcpy`, `strncat`, `__memcpy_chk`, ...) for
    /// overlapping source and destination and report [`Misuse::Overlap`]. Without it they
    /// are glibc's own, at no cost.
    pub check_overlaps: bool,
    /// Count guest instructions (implies `translation`): [`Host::instructions`] then gives
    /// the program's count so far, without the runtime's own work (Massif's
    /// `--time-unit=i`).
    pub count_instructions: bool,
    /// Ask [`Tool::instrument`] about every block of the program's code (implies
    /// `translation`). Without it blocks are translated as they are, which is faster
    /// (`rep` string instructions, for one, stay whole).
    pub instrument: bool,
    /// Per-thread counters the tool's [`instrument::Plan::count`] probes add to (at most
    /// [`instrument::MAX_COUNTERS`]); [`Host::counter`] sums them over all threads.
    pub counters: u16,
    /// The shadow map the filtered probes read ([`Host::shadow`] hands it to the tool).
    /// Allocated before the first allocator event.
    pub shadow: Option<instrument::ShadowSpec>,
    /// A per-thread trace buffer for [`instrument::Plan::trace_block`] and
    /// [`instrument::Plan::trace_accesses`], drained through [`Tool::on_trace`].
    pub trace: bool,
    /// A per-thread recent-lines table ([`instrument::RecentLines`]) that every access record
    /// updates and [`instrument::Plan::trace_new_lines`] probes read (with `trace`).
    pub recent_lines: Option<instrument::RecentLines>,
    /// Two lines per slot in the `recent_lines` table, the second one's accesses skipped
    /// too and counted as swaps ([`instrument::RecentLines`], [`instrument::TraceRecord::swaps`]).
    pub recent_lines_two_ways: bool,
    /// A code-lines table per thread for [`instrument::Plan::trace_block_new_lines`] (with
    /// `trace`).
    pub recent_code_lines: Option<instrument::RecentLines>,
    /// Lines per slot in the `recent_code_lines` table (0 or 1: one), kept in
    /// most-recently-used order: a block whose lines are all among them appends nothing,
    /// and each line that is not appends a code-miss record naming the line that left
    /// the slot's ways ([`instrument::TraceRecord::code_miss`]) instead of a block record.
    pub recent_code_lines_ways: u8,
    /// Counters per thread for [`instrument::Plan::count_indexed`] (at most
    /// [`instrument::MAX_INDEXED_COUNTERS`]; reserved, and backed by memory only where
    /// used); [`Host::indexed_counter_totals`] sums them over all threads.
    pub indexed_counters: u32,
    /// Answer the program's client requests (`valgrind.h`'s magic sequence) through
    /// [`Tool::client_request`] (implies `translation`).
    pub client_requests: bool,
    /// Bytes of state the tool keeps per thread (at most 64 KiB), zeroed when the thread
    /// starts: see [`Host::with_thread_state`]. Under the engine only.
    pub thread_state: u32,
    /// Track the definedness of every bit of registers and memory (Memcheck's V bits;
    /// implies `instrument`): the engine propagates it through every instruction of the
    /// program's code, marks new stack frames undefined and kernel-written buffers defined,
    /// and calls [`Tool::on_undefined`] where Memcheck checks a value. The tool marks heap
    /// blocks through [`Host::set_definedness`] and [`Host::copy_definedness`]. Memory
    /// starts defined.
    pub definedness: bool,
    /// With `definedness`: also track where undefined bits were made undefined
    /// (Memcheck's `--track-origins=yes`): an [`Origin`] per 4 bytes of memory and per
    /// register, kept by the engine's slow path, given back by [`Host::undefined_origin`]
    /// and [`Host::origin_of_memory`]. Slower (every stack move takes the slow path).
    pub origins: bool,
    /// Call [`Tool::before_syscall`] before each of the program's system calls (under the
    /// engine): Memcheck checks the memory its pointer arguments name
    /// ([`syscalls::for_each_range`]).
    pub before_syscalls: bool,
    /// With `trace` and `shadow`: every thread has [`instrument::HOT_RANGES`] address ranges
    /// that its filtered trace probes test first, inline: an access whose first byte lies in
    /// one adds its size to that range's read or write bytes (both for a read-modify-write)
    /// instead of appending a record. The tool chooses the ranges and takes the counts in
    /// [`Tool::on_trace_hot`], which the engine then calls instead of [`Tool::on_trace`]
    /// (DHAT: the last blocks without a histogram a thread touched, so a loop over a large
    /// array costs a compare and an add per access, not a record).
    pub hot_ranges: bool,
    /// The allocator's own work on the program's behalf is not the program's, as under
    /// Valgrind, whose replacement allocator runs on its host side: glibc's allocator,
    /// called by the runtime's hooks, is then neither instrumented nor counted by the
    /// tool's probes (DHAT's instruction clock, whose lifetimes would otherwise include
    /// hundreds of glibc's instructions per call). The runtime runs such a heap event
    /// natively as a whole, out of the code cache, unless the tool needs it translated for
    /// another reason (`page_events`: glibc's `mmap`s are then the program's pages; a tool
    /// tracking `definedness` sets the V bits of the event's blocks itself, glibc's writes
    /// being unseen: Memcheck). Without it, a tool
    /// that instruments code sees glibc's allocator run as the program's code (Cachegrind,
    /// whose counts include it, as Valgrind's Cachegrind does).
    pub allocator_unseen: bool,
}

/// A use of undefined bits that Memcheck reports ([`Tool::on_undefined`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Undefined {
    /// "Conditional jump or move depends on uninitialised value(s)": a conditional
    /// branch's condition, or the count of `rep`/`loop`/`jrcxz`.
    Condition,
    /// "Use of uninitialised value of size `size`": a memory address, an indirect jump
    /// target.
    Value { size: u8 },
    /// "Syscall param `param` contains uninitialised byte(s)": a system call argument
    /// register (`param` is Valgrind's name, e.g. `write(count)`).
    SyscallArg { param: &'static str },
    /// "Syscall param `param` points to uninitialised byte(s)": a buffer the kernel
    /// reads; `addr` is its first undefined byte.
    SyscallBuffer { param: &'static str, addr: Addr },
}

/// Where undefined bits came from (`--track-origins=yes`, [`Needs::origins`]): what made
/// them undefined, as Memcheck's origin tags say it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A heap block's allocation, at its stack (the tool's, [`Host::set_undefined_from`]).
    Heap(StackId),
    /// A client request (`VALGRIND_MAKE_MEM_UNDEFINED`), at its stack.
    ClientRequest(StackId),
    /// New stack, made by the instruction at `pc` (a `sub rsp`, a `push`) or by entering
    /// (or returning to) the code at `pc` (the red zone below `rsp` after a `call` or
    /// `ret`): Memcheck's one-frame "stack allocation" origin.
    Stack { pc: Addr },
}

/// Misuse of the allocator or string functions that the runtime detects on the program's
/// behalf; Memcheck reports these as errors. A mismatched free (`malloc` then `delete`) is
/// not here: [`Free`] carries both functions and the tool decides.
#[derive(Copy, Clone, Debug)]
pub enum Misuse {
    /// `free`/`delete`/`realloc` of an address that is not the start of a live block (never
    /// allocated, interior, or already freed). `size`: the new size asked of `realloc`
    /// (Memcheck counts it as allocated), else 0.
    InvalidFree {
        addr: Addr,
        func: AllocFn,
        size: u64,
    },
    /// A size argument that is negative when read as signed (`malloc(-1)`).
    FishyValue {
        func: AllocFn,
        arg: &'static str,
        value: u64,
    },
    /// With [`Needs::definedness`]: an argument of an allocation function (`arg`: its
    /// name, e.g. "size") holds undefined bits at the call. Memcheck's replacement
    /// branches on it, reporting "Conditional jump or move depends on uninitialised
    /// value(s)" at the function. `origin`: where its undefined bits came from (with
    /// [`Needs::origins`], if known).
    UndefinedArgument {
        func: AllocFn,
        arg: &'static str,
        origin: Option<Origin>,
    },
    /// An alignment that is not a power of two (or not a multiple of `sizeof(void*)` for
    /// `posix_memalign`).
    BadAlignment { func: AllocFn, align: u64 },
    /// Overlapping source and destination in `memcpy`, `strcpy`, ...: `func` is the C name;
    /// `len` is the byte count for the functions that take one.
    Overlap {
        func: &'static str,
        dst: Addr,
        src: Addr,
        len: Option<u64>,
    },
}

#[derive(Copy, Clone, Debug)]
pub struct MisuseEvent {
    pub kind: Misuse,
    pub stack: StackId,
    pub tid: i32,
}

/// Pages mapped or unmapped (`mmap`, `mremap`, `munmap`, `brk`), for page-level profiling.
#[derive(Copy, Clone, Debug)]
pub struct Mapping {
    pub addr: Addr,
    pub len: u64,
    pub stack: StackId,
    pub tid: i32,
}

/// A live heap block, as the leak checker sees it.
#[derive(Copy, Clone, Debug)]
pub struct LiveBlock {
    pub addr: Addr,
    pub size: u64,
    pub func: AllocFn,
    pub stack: StackId,
}

/// A leak check's result as Valgrind's LEAK SUMMARY counts it ([`Tool::leaked`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Leaked {
    /// Definitely plus indirectly lost bytes.
    pub bytes: u64,
    /// The largest definitely-lost loss record: its allocation stack and its bytes (with the
    /// indirect bytes it holds).
    pub largest: Option<(StackId, u64)>,
}

/// What a non-heap address is, for error descriptions.
#[derive(Clone, Debug)]
pub enum DataAddr {
    /// On the calling thread's stack; `frame`: the index of the frame owning the address in
    /// the error's stack (0 is the allocation function), and its function's first line.
    Stack { frame: Option<(usize, Frame)> },
    /// Inside a global variable: its name and the offset into it.
    Symbol { name: String, offset: u64 },
}

/// A memory access of the program's that the CPU refused ([`Tool::on_memory_fault`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MemoryFault {
    /// `SIGSEGV` (11) or `SIGBUS` (7).
    pub sig: i32,
    /// `si_code`: for `SIGSEGV`, 1 (`SEGV_MAPERR`) when nothing is mapped at `addr`, 2
    /// (`SEGV_ACCERR`) when the mapping forbids the access.
    pub code: i32,
    /// `si_addr`: the first byte the CPU could not access.
    pub addr: Addr,
}

/// The fatal signal a process is ending by, as the runtime caught it.
#[derive(Copy, Clone, Debug)]
pub struct FatalSignal {
    pub sig: i32,
    /// `si_code`: positive when the kernel raised it (a fault), 0 or negative when sent.
    pub code: i32,
    /// `si_addr` (the faulting address for SIGSEGV, SIGBUS, SIGILL, SIGFPE).
    pub addr: Addr,
    /// Where the thread was: frame 0 is the faulting or interrupted instruction.
    pub stack: StackId,
    pub tid: i32,
    /// The main thread's stack ran out (a `SIGSEGV` at an unmapped address next to its
    /// stack pointer, [`fault_is_stack_overflow`]): the page it could not grow to, as
    /// Valgrind's core names it ("Stack overflow in thread #1: can't grow stack to ...":
    /// the stack pointer less the 128-byte red zone, rounded down to its page).
    pub stack_overflow: Option<Addr>,
}

/// Whether a fault at `addr` (nothing mapped there, or a guard page) with the thread's
/// stack pointer at `sp` is the stack running out rather than a wild access: within 64 KiB
/// below `sp` (a `push`, a `call`, the red zone, a stack probe a page down) or 1 MiB above
/// it (a local of a frame just made, as big as a frame may be). Memcheck reports no
/// invalid access there, and the fatal-signal block names the overflow (Valgrind's
/// stack-extension test).
pub fn fault_is_stack_overflow(addr: Addr, sp: Addr) -> bool {
    const BELOW: u64 = 64 << 10;
    const ABOVE: u64 = 1 << 20;
    addr >= sp.saturating_sub(BELOW) && addr < sp.saturating_add(ABOVE)
}

/// The page a main thread's stack could not grow to when it ran out with its stack pointer
/// at `sp`, as Valgrind's core names it ("can't grow stack to ..."): the stack pointer less
/// the 128-byte red zone, rounded down to its page.
pub fn stack_overflow_page(sp: Addr) -> Addr {
    sp.wrapping_sub(128) & !4095
}

/// Where a root range came from (for `-v` diagnostics and heuristics).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RootKind {
    /// A thread's stack, from its stack pointer up.
    Stack { tid: i32 },
    /// A thread's saved general-purpose registers.
    Registers { tid: i32 },
    /// Writable data/bss of a loaded object, or thread-local storage.
    Global,
}

#[derive(Copy, Clone, Debug)]
pub struct RootRange {
    pub start: Addr,
    pub end: Addr,
    pub kind: RootKind,
}

/// A rejected command-line option: the text the user will read after `oxgrind: `.
#[derive(Clone, Debug)]
pub struct OptionError(pub String);

/// What the core offers a tool.
pub trait Host {
    /// The frames of an interned stack (see [`StackId`]).
    fn stack(&self, id: StackId) -> Vec<Addr>;
    /// Describes one code address: several frames when it lies in inlined code, innermost
    /// first, all with the same `ip`.
    fn describe(&self, ip: Addr) -> Vec<Frame>;
    /// Milliseconds since the program started.
    fn elapsed_ms(&self) -> u64;
    /// Current process id (changes in a forked child).
    fn pid(&self) -> i32;
    /// The program's command line as the user gave it (`cmd:` in a massif file).
    fn command_line(&self) -> &[String];
    /// Expands a Valgrind file-name template (`%p`, `%q{VAR}`, `%n`) to an absolute path.
    fn expand_output_path(&self, template: &str) -> Result<String, OptionError>;
    /// Creates (truncates) a file and writes `bytes` to it.
    fn write_file(&self, path: &str, bytes: &[u8]) -> Result<(), i32>;
    /// Writes a message to the log channel (stderr or `--log-file`); `text` is written as is.
    fn log(&self, text: &str);
    /// The tool's start-up banner as Valgrind prints it: the tool's `name` and `copyright`
    /// lines, the core's line, the command, `Parent PID:` when logging to a file, and an
    /// empty line. Every tool's banner comes from here.
    fn banner(&self, _name: &str, _copyright: &str) -> String {
        String::new()
    }
    /// Describes a non-heap address: on the calling thread's stack (and in which frame), or
    /// inside a global variable. Called from an event on the thread that caused it.
    fn describe_data(&self, _addr: Addr) -> Option<DataAddr> {
        None
    }
    /// The signal the process is ending by, during [`Tool::fini`] with `Exit::Signal`.
    fn fatal_signal(&self) -> Option<FatalSignal> {
        None
    }
    /// Appends to the XML output (`--xml-file` or `--xml-fd`), created on first use.
    fn xml(&self, _text: &str) {}
    /// Ends the process at once with `status`, writing nothing more (Memcheck's
    /// `--exit-on-first-error=yes`). The runtime's implementation does not return.
    fn exit_now(&self, _status: i32) {}
    /// With [`Needs::mapping_access`]: whether Valgrind's Memcheck holds `addr`
    /// unaddressable by how its mapping got its permissions. `Some(true)`: the program
    /// mapped it `PROT_NONE` (`mmap`, or the part `mremap` grew of such a mapping) and has
    /// given it no permission since (`mprotect`); `Some(false)`: it mapped it with some
    /// permission or gave it one since, so that it is addressable even if `mprotect` made
    /// it `PROT_NONE` later. `None`: no call of the program's for it was seen (mapped before
    /// the engine took over, or by glibc's allocator natively), or without the need. Takes
    /// a lock: for the error path (a fault).
    fn noaccess_mapping(&self, _addr: Addr) -> Option<bool> {
        None
    }
    /// One of the process's `/proc/self` files, read afresh, without taking a descriptor the
    /// program could need (a plain `open` in a handler takes the lowest free one, and a
    /// program at its descriptor limit would lose an `open` to it). `None` when it cannot
    /// be read (no `/proc`). Tools read these files here while the program runs, never with
    /// `std::fs`.
    fn read_self_file(&self, _file: SelfFile) -> Option<String> {
        None
    }
    /// Under `--xml=yes` with `--track-fds`, the `<stack>` elements of the descriptors open
    /// at exit that the program opened (the core's, as Valgrind 3.19 writes them into the
    /// XML right after the `FINISHED` status, before the tool's leak errors); handed out
    /// once. `None` otherwise.
    fn track_fds_xml(&self) -> Option<String> {
        None
    }
    /// Every live heap block (not the ones waiting in the freed-block queue).
    fn live_blocks(&self) -> Vec<LiveBlock>;
    /// Stops every other thread, hands `f` the root set (their stacks and registers, the
    /// writable data of every loaded object, TLS), and resumes them after `f` returns.
    fn with_roots(&self, f: &mut dyn FnMut(&[RootRange]));
    /// [`Host::with_roots`] for a search the program asks for in the middle of its run (a
    /// client request such as `VALGRIND_DO_LEAK_CHECK`): the calling thread's stack is
    /// offered from `sp`, the program's stack pointer at the request, not from inside the
    /// tool, whose own frames hold copies of block addresses (nor from the red zone below
    /// `sp`, where the runtime's allocator wrappers left theirs). The default ignores `sp`.
    fn with_roots_from(&self, _sp: Addr, f: &mut dyn FnMut(&[RootRange])) {
        self.with_roots(f)
    }
    /// Calls `f(address, value)` for every aligned 8-byte word in `[start, start + len)`
    /// that is readable; unreadable pages are skipped.
    fn read_words(&self, start: Addr, len: u64, f: &mut dyn FnMut(Addr, u64));
    /// The guest's call stack at a probe: frame 0 is `regs.rip` (the probed instruction),
    /// then return addresses minus one; at most `depth` frames.
    fn stack_at(&self, _regs: &instrument::GuestRegs, _depth: usize) -> StackId {
        StackId(0)
    }
    /// Guest instructions executed so far by all threads (with
    /// [`Needs::count_instructions`]; 0 otherwise).
    fn instructions(&self) -> u64 {
        0
    }
    /// The sum over all threads (live and gone) of one of the tool's counters
    /// ([`Needs::counters`]). Each thread's copy only grows, so successive sums never
    /// decrease; the sum is exact when the threads are stopped (at [`Tool::fini`]).
    fn counter(&self, _id: instrument::CounterId) -> u64 {
        0
    }
    /// [`Host::counter`] as the calling thread sees it, cheap enough for a clock read at
    /// every event: its own count exactly, the other threads' as read a bounded number of
    /// its own counts or readings ago (reading every thread's copy each time costs a cache miss per
    /// thread). Successive readings on one thread never decrease; exact while no other
    /// thread runs (with one thread, always). The default is [`Host::counter`].
    fn counter_seen(&self, id: instrument::CounterId) -> u64 {
        self.counter(id)
    }
    /// Adds, for every thread (live and gone), its indexed counter `i`
    /// ([`Needs::indexed_counters`]) to `totals[i]`, for each `i` below `totals.len()`. Exact
    /// when the threads are stopped (at [`Tool::fini`]).
    fn indexed_counter_totals(&self, _totals: &mut [u64]) {}
    /// The tool's shadow map ([`Needs::shadow`]), `None` if it could not be reserved (the
    /// tool then checks nothing, rather than fail the program).
    fn shadow(&self) -> Option<instrument::ShadowMap> {
        None
    }
    /// Drains the calling thread's trace buffer into [`Tool::on_trace`] now (a tool that
    /// must see a block's accesses before the block is freed, say).
    fn flush_trace(&self) {}
    /// No thread counts accesses in `[lo, hi)` any more ([`Needs::hot_ranges`]): every
    /// thread's hot range that overlaps it is emptied (a block is being freed; its own
    /// thread's counts should be flushed first, with [`Host::flush_trace`]). Another thread
    /// may still add an access it had begun to count: it arrives with the emptied range.
    fn forget_hot_range(&self, _lo: Addr, _hi: Addr) {}
    /// Runs `f` now, natively: out of the code cache when the calling thread runs the tool
    /// translated (its `fini`, reached from the program's exit), as a clean call would, on
    /// the thread's engine stack (1 MiB) with signals deferred until `f` returns. For a
    /// tool's own long work that sees nothing of the program (building and writing its
    /// output): translated, every block of it is translated first and then runs slower.
    /// `f` must not call into the program. The default simply calls `f`.
    fn run_native(&self, f: &mut dyn FnMut()) {
        f()
    }
    /// Bytes the allocator really made usable from the start of live block `addr` (at least
    /// its size; glibc's `malloc_usable_size`, the runtime's redzone included), asked when a
    /// tool needs it rather than computed at every allocation. 0 when it cannot say.
    fn usable_size(&self, _addr: Addr) -> u64 {
        0
    }
    /// Where the allocator's memory for block `addr` ends and whether its header of the next
    /// chunk follows ([`BlockExtent`]): for a live block, or the blocks of the event being
    /// handled (a freed block is still the allocator's until `on_free` returns). Cheap for
    /// those; `None` when the host cannot say.
    fn block_extent(&self, _addr: Addr) -> Option<BlockExtent> {
        None
    }
    /// With [`Needs::freelist_vol`]: gives the program's freed block `addr`, which the tool
    /// kept, back to the allocator. `before` runs first, with the block's extent (as
    /// [`Host::block_extent`] gives it for a live block), while the allocator cannot hand
    /// the memory out again (Memcheck makes the block's shadow ordinary memory there).
    /// Only from [`Tool::on_free`] or [`Tool::on_realloc`], once per block kept.
    fn release_freed(&self, _addr: Addr, before: &mut dyn FnMut(Option<BlockExtent>)) {
        before(None)
    }
    /// The calling thread's id (`gettid`).
    fn tid(&self) -> i32 {
        0
    }
    /// Runs `f` with the calling thread's state ([`Needs::thread_state`] bytes, zeroed when
    /// the thread started). `false`, without calling `f`, when there is none (no engine, none
    /// declared) or when the thread is already inside this call (a signal handler's probe
    /// interrupting it): the state is never aliased.
    fn with_thread_state(&self, _f: &mut dyn FnMut(&mut [u8])) -> bool {
        false
    }
    /// Calls `f` with a copy of every thread's state, live threads' and ended ones' (to merge
    /// them, at [`Tool::fini`]; a live thread's copy may be mid-update).
    fn each_thread_state(&self, _f: &mut dyn FnMut(&[u8])) {}
    /// With [`Needs::definedness`]: marks `[addr, addr + len)` defined or undefined
    /// (Memcheck's `make_mem_defined` / `make_mem_undefined`: a calloc'd block, a malloc'd
    /// one).
    fn set_definedness(&self, _addr: Addr, _len: u64, _defined: bool) {}
    /// With [`Needs::definedness`]: starts loading, for writing, the shadow that holds the
    /// definedness of `[addr, addr + len)` (a hint: nothing visible changes), ahead of a
    /// [`Host::set_definedness`] there.
    fn prefetch_definedness(&self, _addr: Addr, _len: u64) {}
    /// With [`Needs::definedness`]: copies the definedness of `len` bytes from `src` to
    /// `dst` (`realloc` moving a block).
    fn copy_definedness(&self, _src: Addr, _dst: Addr, _len: u64) {}
    /// With [`Needs::origins`]: marks `[addr, addr + len)` undefined, made so by `origin`
    /// (without origins, the same as `set_definedness(addr, len, false)`).
    fn set_undefined_from(&self, addr: Addr, len: u64, _origin: Origin) {
        self.set_definedness(addr, len, false)
    }
    /// With [`Needs::origins`]: where the undefined bits of the byte at `addr` came from
    /// (the first undefined byte of a system call's buffer), if known.
    fn origin_of_memory(&self, _addr: Addr) -> Option<Origin> {
        None
    }
    /// With [`Needs::origins`], inside [`Tool::on_undefined`]: where the undefined bits
    /// being reported came from, if known (Memcheck, too, sometimes loses them).
    fn undefined_origin(&self) -> Option<Origin> {
        None
    }
    /// With [`Needs::definedness`]: the first byte of `[addr, addr + len)` with an undefined
    /// bit, if any (Memcheck's check of the memory a system call reads, which weighs it
    /// against the first unaddressable byte: the first bad byte decides the one error).
    fn first_undefined(&self, _addr: Addr, _len: u64) -> Option<Addr> {
        None
    }
    /// Copies the program's memory at `addr` into `buf` without ever faulting (a wild
    /// pointer is read as far as it is mapped and readable); returns the bytes copied.
    fn read_memory(&self, _addr: Addr, _buf: &mut [u8]) -> usize {
        0
    }
}

/// A tool: Massif, Memcheck, DHAT, Cachegrind, ...
pub trait Tool: Send + Sync {
    /// `--tool=` name.
    fn name(&self) -> &'static str;
    /// The tool's part of `--help`: its options, one per line, in Valgrind's layout.
    fn help(&self) -> &'static str {
        ""
    }
    /// Takes one tool option (`--depth=10`). `Ok(false)`: not this tool's option.
    fn parse_option(&mut self, arg: &str) -> Result<bool, OptionError>;
    /// The core options that shape the tool's report (verbosity, `--num-callers`, the
    /// error-reporting options, ...), parsed by the core: once, after the tool's own options
    /// and before [`Tool::post_options`].
    fn core_options(&mut self, _core: &CoreView) {}
    /// Called once, after every option was parsed.
    fn post_options(&mut self) -> Result<(), OptionError> {
        Ok(())
    }
    fn needs(&self) -> Needs;
    /// The program is about to run (before its constructors and `main`): Memcheck prints its
    /// preamble here.
    fn on_start(&self, _host: &dyn Host) {}
    /// A block allocated. Returns a number of the tool's own for it (0: none), which the
    /// runtime keeps with the block in its live-block table and hands back as
    /// [`Free::tool_word`] when the block is freed or reallocated: so a tool that keeps
    /// something per block (Massif: where its replayed allocator put it) finds it without a
    /// table of its own keyed by address, whose lookup per event would repeat the runtime's.
    /// The number is the handler's result rather than a second call before it: one call
    /// into the tool per allocation (the two were two dynamic calls, each finding the
    /// thread's log again, on Massif's every allocation). Called on the allocating thread
    /// before the block is recorded in the table (the program does not have it yet, so no
    /// free of it can come first); not for blocks the tool never hears of (the runtime's
    /// own).
    fn on_alloc(&self, _host: &dyn Host, _ev: &Alloc) -> u32 {
        0
    }
    fn on_free(&self, _host: &dyn Host, _ev: &Free) {}
    /// A block moved or resized by `realloc`. By default a free then an alloc. Returns the
    /// new block's number, as [`Tool::on_alloc`] does.
    fn on_realloc(&self, host: &dyn Host, old: &Free, new: &Alloc) -> u32 {
        self.on_free(host, old);
        self.on_alloc(host, new)
    }
    fn on_misuse(&self, _host: &dyn Host, _ev: &MisuseEvent) {}
    fn on_map(&self, _host: &dyn Host, _ev: &Mapping) {}
    fn on_unmap(&self, _host: &dyn Host, _ev: &Mapping) {}
    /// A forked child starts: reset per-process state (the pid changes).
    fn on_fork_child(&self) {}
    /// After [`Tool::fini`] at a normal exit: the exit status to force instead of the
    /// program's (Memcheck's `--error-exitcode` when errors were found).
    fn exit_status_override(&self) -> Option<i32> {
        None
    }
    /// After [`Tool::fini`]: what the leak check found, for the core's `--max-leaked`
    /// budget; `None` when the tool ran none.
    fn leaked(&self) -> Option<Leaked> {
        None
    }
    /// Called exactly once per process: at exit, at a fatal signal, or before `execve`.
    fn fini(&self, host: &dyn Host, exit: Exit);

    // ---- with `Needs::translation`: see [`instrument`] ----

    /// A block of the program's code at `pc` is about to be translated: ask for probes in
    /// `plan`. Runs on the engine stack with the thread stopped, for program code only
    /// (never the runtime's own); must not take a lock the program's allocator calls into
    /// the tool may hold.
    fn instrument(&self, _pc: Addr, _block: &[instrument::Insn], _plan: &mut instrument::Plan) {}
    /// The accesses an instruction probed with `Plan::accesses` is about to make (never
    /// called for accesses made inside the runtime's allocator hooks).
    fn on_accesses(
        &self,
        _host: &dyn Host,
        _accesses: &[instrument::Access],
        _regs: &instrument::GuestRegs,
        _data: u64,
    ) {
    }
    /// An instruction of the program's code made a memory access the CPU refused (a
    /// synchronous `SIGSEGV` or `SIGBUS`), and the signal is about to be delivered (to the
    /// program's handler, or to the default action). `accesses`: what the instruction
    /// accesses, computed from `regs` (vector-indexed and masked operands whole, as their
    /// addresses' first element gives them). Memcheck reports the invalid access here,
    /// before the signal, as Valgrind does. Under the engine only; runs on the thread's
    /// engine stack with its signals deferred, whatever the instruction's probes.
    fn on_memory_fault(
        &self,
        _host: &dyn Host,
        _fault: &MemoryFault,
        _accesses: &[instrument::Access],
        _regs: &instrument::GuestRegs,
    ) {
    }
    /// An instruction probed with `Plan::pc` is about to run.
    fn on_pc(&self, _host: &dyn Host, _regs: &instrument::GuestRegs, _data: u64) {}
    /// Trace records of one thread, in the order it made them (see [`instrument`]). Runs
    /// on that thread, with nothing else of the tool's on the stack.
    fn on_trace(&self, _host: &dyn Host, _records: &[instrument::TraceRecord]) {}
    /// With [`Needs::hot_ranges`], instead of [`Tool::on_trace`]: one thread's records, and
    /// its hot ranges with the bytes counted inline in each since the last call (also called
    /// with no records when only counts are pending). The tool takes the counts and may set
    /// the ranges the thread counts in from now on (`lo`/`hi`; `hi <= lo`: none); the
    /// engine zeroes the counts afterwards. Counts made after the range was emptied by
    /// [`Host::forget_hot_range`] arrive with an empty range.
    fn on_trace_hot(
        &self,
        host: &dyn Host,
        records: &[instrument::TraceRecord],
        _hot: &mut [instrument::HotRange; instrument::HOT_RANGES],
    ) {
        self.on_trace(host, records)
    }
    /// A client request (`VALGRIND_DO_CLIENT_REQUEST`): `args[0]` is the request code, the
    /// rest its arguments. `Some(v)`: the request's result is `v`; `None`: not this tool's
    /// request, the program gets its default value (as natively).
    fn client_request(
        &self,
        _host: &dyn Host,
        _args: &[u64; 6],
        _regs: &instrument::GuestRegs,
    ) -> Option<u64> {
        None
    }
    /// With [`Needs::definedness`]: the program is about to use undefined bits as `what`
    /// says, at the instruction `regs.rip` (Memcheck reports and carries on; nothing is
    /// marked defined by the check).
    fn on_undefined(&self, _host: &dyn Host, _regs: &instrument::GuestRegs, _what: &Undefined) {}
    /// Replace the program's function at `pc` by the code at the returned address (Valgrind's
    /// function redirection); asked once per translated block start.
    fn redirect(&self, _host: &dyn Host, _pc: Addr) -> Option<Addr> {
        None
    }
    /// With [`Needs::before_syscalls`]: the program is about to make system call `nr` with
    /// `args` (rdi, rsi, rdx, r10, r8, r9) at the `syscall` instruction `regs.rip`. Runs on
    /// the engine stack with the thread stopped, before the engine's own handling of the
    /// call; [`syscalls::for_each_range`] says what memory the call names. Never called for
    /// the runtime's own system calls.
    fn before_syscall(
        &self,
        _host: &dyn Host,
        _nr: u64,
        _args: &[u64; 6],
        _regs: &instrument::GuestRegs,
    ) {
    }
}
