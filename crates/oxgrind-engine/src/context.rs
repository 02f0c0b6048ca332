//! The per-thread context page that `%gs` points at while a thread runs under the engine.
//!
//! Translated code needs somewhere to spill a register without touching the guest's stack
//! (the red zone below `rsp` belongs to the program) and without a free register: a page
//! addressed as `gs:[disp32]` is both. Each thread under the engine owns one
//! [`ThreadCtx`]; `%gs` (unused by glibc on x86-64, which keeps TLS at `%fs`) holds its
//! address. The hand-written assembly in [`crate::asm`] and the code the translator emits
//! address its fields by the `OFF_*` constants below, so the layout is `repr(C)` and checked
//! at compile time.
//!
//! Slots come in three groups:
//! * *scratch* ([`ThreadCtx::scratch`]): values translated code keeps in flight between two
//!   instructions (the guest `rax` while an exit stub holds the target, the IBL's saved
//!   `rcx` and flags...). A signal may arrive between those instructions, and the guest's
//!   handler runs translated code that uses the same slots, so the signal path saves and
//!   restores the whole group (see [`crate::signals`]).
//! * *guest registers* ([`ThreadCtx::gregs`]): the full guest GPR state while the thread is
//!   inside the dispatcher.
//! * engine bookkeeping (engine stack, IBL table, counters, clone hand-shake).
//!
//! The XSAVE area for the guest's vector state lives in the same mapping at
//! [`XSAVE_OFF`].

use core::mem::offset_of;
use core::ptr;
use core::sync::atomic::{AtomicPtr, Ordering};

use alloc::vec::Vec;

use oxgrind_sys::lock::SpinLock;
use oxgrind_sys::raw;

/// Number of scratch slots saved across a translated signal handler.
pub const SCRATCH_SLOTS: usize = 18;
/// Depth of the per-thread stack of saved scratch groups (nested translated handlers; a
/// handler that `siglongjmp`s away leaves its level behind, so the stack wraps).
pub const SIG_RING: usize = 8;

/// Scratch slot indices.
pub const S_STUB_RAX: usize = 0;
pub const S_IBL_RCX: usize = 1;
pub const S_IBL_FLAGS: usize = 2;
pub const S_HOST_TARGET: usize = 3;
pub const S_FAR_SAVE: usize = 4;
pub const S_RAISE_TARGET: usize = 5;
pub const S_T0: usize = 6; // ..S_T0+6: registers saved around the re-raise system call
/// Host address a probe call returns to (see `probe`).
pub const S_PROBE_RET: usize = 13;
/// The guest flags (`lahf`/`seto` form) while a counter probe runs.
pub const S_PROBE_FLAGS: usize = 14;
/// The program's system call in flight, as the dispatcher sent its `syscall` block to
/// run: its number and `lent_fd::loans()` just before. Read when the call comes back to
/// the dispatcher (`dispatch::syscall_returned`); scratch, so that a handler of a signal
/// that interrupts the call, whose own calls set them too, leaves them as they were.
pub const S_CALL_NR: usize = 15;
pub const S_CALL_LOANS: usize = 16;
/// Set to 1 by a `syscall` block right after the call, on its way back to the
/// dispatcher at its own pc (`translate::special::syscall_block`); cleared there.
pub const S_CALL_RETURNED: usize = 17;

/// Guest register indices in [`ThreadCtx::gregs`] (hardware encoding order).
pub const RAX: usize = 0;
pub const RCX: usize = 1;
pub const RDX: usize = 2;
pub const RSP: usize = 4;
pub const RSI: usize = 6;
pub const RDI: usize = 7;
pub const R8: usize = 8;
pub const R9: usize = 9;
pub const R10: usize = 10;
pub const R11: usize = 11;

/// A system call's argument registers, in order (rdi, rsi, rdx, r10, r8, r9).
pub const SYSCALL_ARGS: [usize; 6] = [RDI, RSI, RDX, R10, R8, R9];

/// The arguments of the system call the guest registers `gregs` make.
pub fn syscall_args(gregs: &[u64; 16]) -> [u64; 6] {
    SYSCALL_ARGS.map(|r| gregs[r])
}

#[repr(C)]
pub struct ThreadCtx {
    /// Address of this context (so `mov rdi, gs:[0]` yields a pointer).
    pub self_ptr: u64,
    pub scratch: [u64; SCRATCH_SLOTS],
    /// Host address of the dispatcher entry (`jmp gs:[..]` from exit stubs).
    pub dispatch: u64,
    /// Host address of the IBL's second probe / miss path (`oxg_ibl2`).
    pub ibl2: u64,
    /// Top of this thread's private engine stack.
    pub estack: u64,
    /// Non-zero while the thread runs engine code (dispatcher or signal entry): signals
    /// arriving then are deferred.
    pub in_engine: u64,
    /// Guest pc the dispatcher is asked to continue at.
    pub next_pc: u64,
    /// Guest instructions executed by this thread (counting mode): the sum of `count` and
    /// `count_lanes` (see [`COUNT_LANES`]). The dispatcher's own counts go to `count`.
    pub count: u64,
    pub count_lanes: [u64; COUNT_LANES - 1],
    /// Clone hand-shake: the child's context, read by the child before it switches `%gs`.
    pub clone_child: u64,
    /// Guest pc after the `clone` system call.
    pub clone_next_pc: u64,
    /// Set by a new thread once it runs on its own context.
    pub started: u64,
    pub raise_pid: u64,
    pub raise_tid: u64,
    pub raise_sig: u64,
    /// The saved siginfo the re-raise sends (`rt_tgsigqueueinfo`).
    pub raise_info: u64,
    pub gregs: [u64; 16],
    pub gflags: u64,
    /// Set by `oxg_fork_tramp` in the child of a fork.
    pub forked: u64,
    /// Saved scratch group for `oxg_sigreturn_tramp` to restore (0: none).
    pub sigret_src: u64,
    /// Host address of `oxg_smc_dispatch` (a block's entry check failed).
    pub smc_dispatch: u64,
    /// Set by `oxg_smc_dispatch`: the block at `next_pc` no longer matches its guest bytes.
    pub smc_stale: u64,
    /// Guest pc `oxg_resume` continues at (a signal handler's context changed by it).
    pub resume_pc: u64,
    /// The guest's own gs base (`arch_prctl(ARCH_SET_GS)`, `wrgsbase`); the hardware gs
    /// base points at this context.
    pub guest_gs: u64,
    /// Host address of `oxg_probe` (a tool's probe call, see `probe`).
    pub probe_entry: u64,
    /// Set by `oxg_probe`: the probe record of the call in flight (0: an ordinary dispatch).
    pub probe_rec: u64,
    /// The tool's shadow map for filtered probes (see `shadow`).
    pub shadow: u64,
    /// The tool's per-thread counters (`Plan::count`), bumped inline without a lock.
    pub counters: [u64; oxgrind_tool::instrument::MAX_COUNTERS as usize],
    /// Next free record of this thread's trace buffer (see `trace`), and the point from
    /// which a probe drains it (room for one instruction's records is left beyond).
    pub trace_ptr: u64,
    pub trace_end: u64,
    /// Start of this thread's trace buffer (0: no tracing).
    pub trace_base: u64,
    /// The guest `rcx` while an inline trace probe writes a record with it.
    pub probe_rcx: u64,
    /// This thread's tool state (`Needs::thread_state` bytes; 0: none), and whether it is
    /// lent out (see `thread_state`).
    pub tool_state: u64,
    pub tool_state_busy: core::sync::atomic::AtomicU64,
    /// The tool's hot ranges (`Needs::hot_ranges`, see `trace`): tested, and counted in,
    /// inline by the filtered trace probes. While a hold is in force (the embedder's or the
    /// tool's own work) each `hi` is 0, so nothing is counted, and waits in `hot_hi_held`.
    pub hot: [oxgrind_tool::instrument::HotRange; oxgrind_tool::instrument::HOT_RANGES],
    pub hot_hi_held: [u64; oxgrind_tool::instrument::HOT_RANGES],
    /// What the probes test the hot ranges by (`trace::sync_hot_tests`, after every change
    /// of `hot`'s bounds): per range, the step from the previous range's start to its own
    /// and its live length, so that one `sub` and one unsigned compare test a range.
    pub hot_tests: [crate::trace::HotTest; oxgrind_tool::instrument::HOT_RANGES],
    /// Where this thread's indexed counters are added to: its own (at
    /// `INDEXED_COUNTERS_OFF` in this mapping), or, while a trace hold is in force (the
    /// embedder's or the tool's own work runs translated), a scratch array that is never
    /// read, so that only the program's work is counted.
    pub indexed_at: u64,
    /// The shared routines of the shadow-filtered trace probe (`trace_checks`), called as
    /// `call gs:[trace_checks + 8 * k]`; the same in every context.
    pub trace_checks: [u64; crate::trace_checks::COUNT],
    // ---- touched by Rust only ----
    /// The guest's fs base, read lazily for `fs:` operands at probes (0: not read yet);
    /// forgotten when the guest sets it with `arch_prctl`.
    pub fs_base: u64,
    /// Set while this context's trace buffer is being handed to the tool (taken with a
    /// compare-and-swap: the exiting thread may drain another thread's buffer).
    pub trace_draining: core::sync::atomic::AtomicU64,
    /// Where the records that are not the program's begin (0: all are): set while the
    /// embedder's or the tool's own code runs on this thread (`trace::hold`), whose calls
    /// into the program's libraries run translated and append records (see `trace`).
    pub trace_hold: u64,
    /// How many holds are in force on this thread (the embedder's, and a drain's own while
    /// it hands the buffer to the tool).
    pub trace_holders: u64,
    /// How many holds (`trace::hold`) are in force on this thread, with or without a trace
    /// buffer: the embedder's own work is running, whose accesses are not the program's
    /// (the slow half of a filtered access probe skips the tool call while it is non-zero).
    pub own_work: u64,
    /// The guest registers of the tool call in flight on this thread (a `GuestRegs` on
    /// the engine stack; 0: none), lent for the call's length (`probe::ToolRegsLent`) so
    /// that the embedder describes the program's stack, not the engine's.
    pub tool_regs: core::sync::atomic::AtomicU64,
    /// Child context of a `clone` in flight (parent side).
    pub pending_child: u64,
    /// Signals that arrived while the thread was inside the engine (bit n = signal n).
    pub pending_signals: u64,
    pub sig_depth: u64,
    /// Non-zero while the thread single-steps engine code in the cache towards the next
    /// guest instruction boundary, where a deferred asynchronous signal is delivered
    /// (see `signals`); counts the steps.
    pub stepping: u64,
    /// Definedness (`definedness`): this thread's shadow registers and slow-path state
    /// (0 until its first step).
    pub vbits: u64,
    /// Set by a clean call made where the guest's vector registers are dead (the call to
    /// `run_native`, a function call: the ABI leaves every vector and mask register to the
    /// caller): the dispatcher then neither saves nor restores the XSAVE state, most of a
    /// short clean call's cost, and clears it.
    pub vectors_dead: u64,
    /// How many entries of the memory shadow's primary table this thread's view holds
    /// (`definedness::views`: the table seen at `gs:[VIEW_OFF]`): all of them, or 0 when
    /// the view could not be made, and then every inline lookup takes the slow path. The
    /// inline fast path bounds each span index by it.
    pub vbits_limit: u64,
    /// A temporary of the inline fast path (a shadow chunk's address).
    pub vbits_temp: u64,
    /// Origins: the origin tag of the undefined value being reported (`definedness`).
    pub vbits_origin: u64,
    /// Origins' inline stack tagging: a temporary, and the program's `rcx` while it is
    /// borrowed (`translate::definedness`).
    pub vbits_temp2: u64,
    pub vbits_saved_rcx: u64,
    /// The program's `xmm7` (low 128 bits; legacy SSE code leaves the bits above alone)
    /// while the inline stack rule borrows it to mark 16 new stack bytes undefined per
    /// store (`translate::definedness`, `Emitter::mark_undefined`).
    pub vbits_saved_xmm: [u64; 2],
    /// Definedness: the shadow (V bits) of the general registers in encoding order, and
    /// of the flags (an `oxgrind_vbits::FlagShadows` in the low byte). Here, not with the
    /// rest of the thread's definedness state (`vbits`), so that the inline fast path
    /// reaches each with one `gs:`-relative operand, without borrowing a register.
    pub vbits_gpr: [u64; 16],
    pub vbits_flags: u64,
    /// Definedness: what the program's next stepped instruction must see to first, one
    /// byte each in one word ([`OFF_VBITS_ENTRY`]), so that a block's first stepped
    /// instruction tests all three with one compare (`translate::definedness`):
    ///
    /// * `vbits_need_step`: nonzero when the next instruction must take the slow path
    ///   (see `definedness::step`); also until the thread's first step (`vbits` is 0
    ///   until then). The only one of the three tested inside a block.
    /// * `vbits_own_code`: set to 1 by every block of the runtime's own code (inline).
    /// * `vbits_signal`: set to 1 when a signal handler is entered (`signals`).
    ///
    /// Every writer, Rust or the code cache, stores its own byte alone (no read-modify-
    /// write of the word), so a signal's delivery, which sets `vbits_signal` between any
    /// two instructions of the thread, never loses or is lost to another's write. Only
    /// this thread writes them. The padding stays zero (the mapping's).
    pub vbits_need_step: u8,
    pub vbits_own_code: u8,
    pub vbits_signal: u8,
    vbits_entry_pad: [u8; 5],
    /// Definedness: the primary entries that a block's memory operands with the same base
    /// register share, as offsets from this context in its view of the table
    /// (`translate::definedness::SpanShare`, `definedness::views`), 0 when the
    /// operand that leads the sharing went slow. Written and read inside one block only;
    /// a guest `rt_sigreturn`, which may resume in the middle of a block after a handler
    /// ran translated code (or changed a register), clears them (`signals`).
    pub vbits_span: [u64; 2],
    /// Definedness: the guest pc whose step the interpreter already made, for a block that
    /// left through a slow call's side exit (`translate::definedness::Proofs`): the block
    /// at that pc makes the step again (`vbits_need_step` is 1 then), and
    /// `definedness::step` skips it once. 0: none. The next step consumes it.
    pub vbits_stepped_pc: u64,
    /// Definedness's stack rule (`definedness::new_stack`, `catch_up`): the program's
    /// `rsp` at its last stepped instruction, or where the inline fast path moved it since
    /// (0: no step yet), and whether that stepped instruction wrote `rsp` (its decrease is
    /// then new stack) or was a `call` or `ret` (VEX's "AbiHint": the red zone below the
    /// new `rsp` is undefined); a slow step after either is due (`vbits_need_step`), so
    /// both are 0 wherever the fast path runs. Here, not with the rest of the thread's
    /// definedness state (`vbits`), so that the fast path's `rsp` moves update it with one
    /// `gs:`-relative store and its compares read it without a pointer load.
    pub vbits_last_rsp: u64,
    pub vbits_last_writes_rsp: u8,
    pub vbits_last_call_or_ret: u8,
    vbits_last_pad: [u8; 6],
    pub sig_ring: [[u64; SCRATCH_SLOTS]; SIG_RING],
    /// Per ring level: the pc the kernel put in the context, and the pc the guest handler
    /// was shown (the guest pc when the host pc could be mapped, else the same).
    pub sig_host_pc: [u64; SIG_RING],
    pub sig_shown_pc: [u64; SIG_RING],
    /// Per ring level: whether the shown pc is a guest pc.
    pub sig_shown_guest: [u64; SIG_RING],
    /// [`total_count_seen_by`]: the other threads' counts summed when this thread's own
    /// count was `others_at`, under thread generation `others_generation`.
    pub others: u64,
    pub others_at: u64,
    pub others_generation: u64,
    /// [`counter_total_seen_by`], as `others*` for [`total_count_seen_by`]: the other
    /// threads' copies of counter `counter_others_id` summed when this thread's own copy
    /// was `counter_others_at`, under thread generation `counter_others_generation`.
    pub counter_others: u64,
    pub counter_others_at: u64,
    pub counter_others_generation: u64,
    pub counter_others_id: u64,
    /// Readings since the last refresh (see [`counter_total_seen_by`]).
    pub counter_others_reads: u64,
    /// Calls running natively for the embedder on this thread (`crate::run_native`): a fatal
    /// signal there is the embedder's to report (`Config::on_fatal_in_native`).
    pub native_calls: core::sync::atomic::AtomicU64,
    /// Nonzero when `[self + VIEW_OFF, + the primary's length)` is this context's own
    /// reservation, where its view of the shadow's primary table lies (`definedness::views`).
    pub vbits_view_room: u64,
    /// Non-zero while a replaced function's native try runs on this thread
    /// (`crate::native_try`): a synchronous fault there (the program's memory, unmapped)
    /// declines the try instead of ending the process (`signals`).
    pub native_try: u64,
    /// The engine's alternate signal stack for this thread, as the kernel's `stack_t`
    /// (`ss_sp`, `ss_flags`, `ss_size`): the lower half of the engine stack, registered
    /// when the thread starts (`register_alt_stack`) unless the program has one of its own.
    /// A stack overflow's `SIGSEGV` can only be delivered on an alternate stack: without
    /// one the kernel kills the process, and the report is lost.
    pub alt_stack: [u64; 3],
    /// Next context in the global list of all contexts (for totals at exit).
    pub next: *mut ThreadCtx,
}

macro_rules! off {
    ($name:ident, $field:ident) => {
        pub const $name: usize = offset_of!(ThreadCtx, $field);
    };
}
off!(OFF_SCRATCH, scratch);
off!(OFF_DISPATCH, dispatch);
off!(OFF_IBL2, ibl2);
off!(OFF_ESTACK, estack);
off!(OFF_IN_ENGINE, in_engine);
off!(OFF_NEXT_PC, next_pc);
off!(OFF_COUNT, count);
// A block's lane is `OFF_COUNT + 8 * lane` (`count_lane_off`).
const _: () = assert!(offset_of!(ThreadCtx, count_lanes) == OFF_COUNT + 8);
off!(OFF_CLONE_CHILD, clone_child);
off!(OFF_CLONE_NEXT_PC, clone_next_pc);
off!(OFF_STARTED, started);
off!(OFF_ALT_STACK, alt_stack);
off!(OFF_RAISE_PID, raise_pid);
off!(OFF_RAISE_TID, raise_tid);
off!(OFF_RAISE_SIG, raise_sig);
off!(OFF_RAISE_INFO, raise_info);
off!(OFF_GREGS, gregs);
off!(OFF_GFLAGS, gflags);
off!(OFF_SIGRET_SRC, sigret_src);
off!(OFF_FORKED, forked);
off!(OFF_SMC_DISPATCH, smc_dispatch);
off!(OFF_SMC_STALE, smc_stale);
off!(OFF_RESUME_PC, resume_pc);
off!(OFF_GUEST_GS, guest_gs);
off!(OFF_PROBE_ENTRY, probe_entry);
off!(OFF_PROBE_REC, probe_rec);
off!(OFF_SHADOW, shadow);
off!(OFF_COUNTERS, counters);
off!(OFF_TRACE_PTR, trace_ptr);
off!(OFF_TRACE_END, trace_end);
off!(OFF_PROBE_RCX, probe_rcx);
off!(OFF_HOT, hot);
off!(OFF_HOT_TESTS, hot_tests);
off!(OFF_INDEXED_AT, indexed_at);
off!(OFF_TRACE_CHECKS, trace_checks);
off!(OFF_VECTORS_DEAD, vectors_dead);
off!(OFF_OWN_WORK, own_work);
off!(OFF_PENDING_CHILD, pending_child);
off!(OFF_PENDING_SIGNALS, pending_signals);
off!(OFF_NATIVE_TRY, native_try);
off!(OFF_TOOL_REGS, tool_regs);
off!(OFF_NATIVE_CALLS, native_calls);
off!(OFF_VBITS, vbits);
off!(OFF_VBITS_LIMIT, vbits_limit);
off!(OFF_VBITS_TEMP, vbits_temp);
off!(OFF_VBITS_TEMP2, vbits_temp2);
off!(OFF_VBITS_SAVED_RCX, vbits_saved_rcx);
off!(OFF_VBITS_SAVED_XMM, vbits_saved_xmm);
off!(OFF_VBITS_GPR, vbits_gpr);
off!(OFF_VBITS_FLAGS, vbits_flags);
off!(OFF_VBITS_NEED_STEP, vbits_need_step);
off!(OFF_VBITS_OWN_CODE, vbits_own_code);
off!(OFF_VBITS_SIGNAL, vbits_signal);
/// The word of the three entry bytes (`ThreadCtx::vbits_need_step`): nonzero when a block's
/// first stepped instruction cannot go straight to its checks.
pub const OFF_VBITS_ENTRY: usize = OFF_VBITS_NEED_STEP;
const _: () = assert!(OFF_VBITS_ENTRY & 7 == 0);
const _: () = assert!(OFF_VBITS_OWN_CODE == OFF_VBITS_ENTRY + 1);
const _: () = assert!(OFF_VBITS_SIGNAL == OFF_VBITS_ENTRY + 2);
const _: () = assert!(offset_of!(ThreadCtx, vbits_entry_pad) == OFF_VBITS_ENTRY + 3);
off!(OFF_VBITS_SPAN, vbits_span);
off!(OFF_VBITS_STEPPED_PC, vbits_stepped_pc);
off!(OFF_VBITS_LAST_RSP, vbits_last_rsp);
off!(OFF_VBITS_LAST_WRITES_RSP, vbits_last_writes_rsp);
off!(OFF_VBITS_LAST_CALL_OR_RET, vbits_last_call_or_ret);
// The inline catch-up zeroes the registers' and the flags' shadows as one run of qwords.
const _: () = assert!(OFF_VBITS_FLAGS == OFF_VBITS_GPR + 16 * 8);

/// Words the instruction count is spread over. Each translated block adds its count to one
/// of them, chosen by its guest address (`count_lane_off`): with a single word, every block
/// entry's `add gs:[count], n` waited for the block before's (a store-to-load dependency
/// through one memory word, about 5 cycles on this AMD host), which bounded short blocks
/// of a hot loop to that pace; with the blocks of a loop on different words, their adds
/// overlap. Readers sum the words ([`count_of`], `asm::oxg_count_get`).
pub const COUNT_LANES: usize = 8;

/// The offset of the count word a block starting at guest `pc` adds to.
pub fn count_lane_off(pc: u64) -> usize {
    let lane = (pc ^ (pc >> 4) ^ (pc >> 8)) as usize % COUNT_LANES;
    OFF_COUNT + 8 * lane
}

/// The instructions counted by the thread of context `p` (the sum of its count words).
///
/// # Safety
/// `p` points to a live context (contexts are never freed). Its owner may be adding to
/// the words meanwhile: each aligned u64 load is whole on x86-64, so a reading by another
/// thread is at worst a little behind, as a single word's was.
pub unsafe fn count_of(p: *const ThreadCtx) -> u64 {
    // SAFETY: the caller's promise; volatile because translated code writes the words
    // behind the compiler's back.
    unsafe {
        let mut sum = ptr::read_volatile(&(*p).count);
        for i in 0..COUNT_LANES - 1 {
            sum = sum.wrapping_add(ptr::read_volatile(&(*p).count_lanes[i]));
        }
        sum
    }
}

/// Offset of scratch slot `i`.
pub const fn scratch_off(i: usize) -> usize {
    OFF_SCRATCH + 8 * i
}
/// Offset of guest register `r`.
pub const fn greg_off(r: usize) -> usize {
    OFF_GREGS + 8 * r
}

/// Where the XSAVE area starts (64-byte alignment required; the mapping is page aligned).
pub const XSAVE_OFF: usize = 0x1000;
/// Room reserved for XSAVE state (AVX-512 needs about 2.7 KiB).
pub const XSAVE_SIZE: usize = 0x3000;
/// Where the `siginfo` of each deferred signal is kept (one 128-byte slot per signal
/// number), so that its re-raise carries the original one.
pub const SIGINFO_OFF: usize = XSAVE_OFF + XSAVE_SIZE;
pub const SIGINFO_SIZE: usize = 128;
/// The first offset at or after `after` whose low 12 bits are `low`: where a recent-lines
/// array starts. Translated code stores to one array and soon loads from another (a
/// second-way hit swaps the data table's two lines; a record updates a slot, then the
/// next block's code lines are compared), and the processor takes a load whose address
/// equals an earlier store's in its low 12 bits for dependent on it until the store's
/// address is known ("4K aliasing"): arrays at a multiple of 4 KiB from each other made
/// every slot's entries alias. With each array at its own low bits, apart from each other
/// and from the hot fields of the context's first page (scratch slots, trace pointer),
/// no two entries alias for up to 64 slots (an L1 cache of 64 sets, the common size).
const fn recent_array_at(after: usize, low: usize) -> usize {
    let page = after & !0xfff;
    if page + low >= after {
        page + low
    } else {
        page + 0x1000 + low
    }
}

const RECENT_MAX: usize = oxgrind_tool::instrument::MAX_RECENT_LINE_SLOTS as usize;

// The fields the trace probes store to lie below the first array's low bits.
const _: () = assert!(
    OFF_TRACE_PTR < 0x400
        && OFF_TRACE_END < 0x400
        && OFF_PROBE_RCX < 0x400
        && OFF_INDEXED_AT < 0x400
);

/// Where the thread's recent-lines table starts (see `recent_lines`): one line key per
/// slot (`recent_lines::data_key`), addressed by translated code as
/// `gs:[RECENT_LINES_OFF + slot * 8]`.
pub const RECENT_LINES_OFF: usize = recent_array_at(SIGINFO_OFF + 65 * SIGINFO_SIZE, 0x400);
/// The data table's second line per slot (`Needs::recent_lines_two_ways`):
/// `gs:[RECENT_SECOND_LINES_OFF + slot * 8]`.
pub const RECENT_SECOND_LINES_OFF: usize =
    recent_array_at(RECENT_LINES_OFF + 8 * RECENT_MAX, 0x600);
/// The same for the code-lines table.
pub const RECENT_CODE_LINES_OFF: usize =
    recent_array_at(RECENT_SECOND_LINES_OFF + 8 * RECENT_MAX, 0x800);
/// The data table's swap bit per slot, one byte each (`gs:[RECENT_SWAPS_OFF + slot]`).
pub const RECENT_SWAPS_OFF: usize = recent_array_at(RECENT_CODE_LINES_OFF + 8 * RECENT_MAX, 0xc00);
/// The swap bits of the data record being appended, gathered from its lines' slots (a
/// byte).
pub const RECENT_RECORD_SWAPS_OFF: usize = recent_array_at(RECENT_SWAPS_OFF + RECENT_MAX, 0xe00);
/// The thread's IBL table, in two arrays of `IBL_ENTRIES + 1` words (the last slot's second
/// probe is one more) at fixed offsets of the context, so that translated code reads slot
/// `i` as `gs:[IBL_KEYS_OFF + i * 8]` and `gs:[IBL_HOSTS_OFF + i * 8]` with the slot number
/// as the only register: a key is the guest pc *negated* (0 in an empty slot), the host
/// pc beside it. The lookup then needs no flags: `lea rcx, [rcx + rax]` of the negated key
/// and the target is 0 exactly on a hit, which `jrcxz` tests (see `translate::branches`).
pub const IBL_KEYS_OFF: usize = (RECENT_RECORD_SWAPS_OFF + 64 + 0xfff) & !0xfff;
pub const IBL_HOSTS_OFF: usize = IBL_KEYS_OFF + IBL_ARRAY_BYTES;

/// The keys array of the IBL table of the thread whose context is `ctx` (its host pcs
/// follow at [`IBL_HOSTS_OFF`]).
pub fn ibl_keys(ctx: *const ThreadCtx) -> *mut u64 {
    ctx.cast::<u8>()
        .wrapping_add(IBL_KEYS_OFF)
        .cast_mut()
        .cast()
}
/// Bytes of one IBL array, rounded to pages.
const IBL_ARRAY_BYTES: usize = ((IBL_ENTRIES + 1) * 8 + 0xfff) & !0xfff;
/// Where the thread's indexed counters start (`Needs::indexed_counters`; translated code
/// adds to `gs:[INDEXED_COUNTERS_OFF + index * 8]`): the mapping's last part, as long as
/// the tool asked for.
pub const INDEXED_COUNTERS_OFF: usize = IBL_HOSTS_OFF + IBL_ARRAY_BYTES;
/// The context mapping without indexed counters.
pub const CTX_SIZE: usize = INDEXED_COUNTERS_OFF;

/// How many indexed counters every context has (set once, before the first context).
static INDEXED_COUNTERS: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// Gives every context made from now on `n` indexed counters (at most the contract's limit).
pub fn configure_indexed_counters(n: u32) {
    let n = n.min(oxgrind_tool::instrument::MAX_INDEXED_COUNTERS) as usize;
    INDEXED_COUNTERS.store(n, Ordering::Release);
}

/// How many indexed counters each context has.
pub fn indexed_counters() -> usize {
    INDEXED_COUNTERS.load(Ordering::Acquire)
}

/// Where indexed counters are added while a hold is in force (see
/// [`ThreadCtx::indexed_at`]): made with the first context, shared by every thread.
static INDEXED_SCRATCH: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// Points `ctx`'s indexed counting at its own counters (`own`) or at the scratch array.
pub(crate) fn count_indexed_into_own(ctx: &mut ThreadCtx, own: bool) {
    ctx.indexed_at = if own {
        ctx.self_ptr + INDEXED_COUNTERS_OFF as u64
    } else {
        INDEXED_SCRATCH.load(Ordering::Acquire)
    };
}

/// Bytes of a context mapping: the struct and its tables, and the indexed counters (pages
/// of them that are never written cost no memory).
fn ctx_size() -> usize {
    CTX_SIZE + 8 * indexed_counters()
}

/// Adds every context's indexed counters into `totals`.
pub fn indexed_counter_totals(totals: &mut [u64]) {
    let n = indexed_counters().min(totals.len());
    for_each(|p| {
        let base = (p as *const u8).wrapping_add(INDEXED_COUNTERS_OFF) as *const u64;
        for (i, t) in totals[..n].iter_mut().enumerate() {
            // SAFETY: contexts are never unmapped and each has `indexed_counters()` words
            // at INDEXED_COUNTERS_OFF (the count is fixed before the first context); the
            // owner may be adding concurrently, and an aligned u64 load is never torn.
            let count = unsafe { ptr::read_volatile(base.add(i)) };
            // Only a count adds: the caller's zeroed totals keep their untouched pages
            // (Cachegrind's span the 4 Mi counters, whose rep counters sit at the end:
            // 32 MiB written at exit for a few hundred thousand used).
            if count != 0 {
                *t = t.wrapping_add(count);
            }
        }
    });
}

/// The siginfo slot of signal `sig` (< 65) in the context mapping at `ctx`.
pub fn siginfo_slot(ctx: *mut ThreadCtx, sig: usize) -> *mut u8 {
    (ctx as *mut u8).wrapping_add(SIGINFO_OFF + SIGINFO_SIZE * sig.min(64))
}

const _: () = assert!(core::mem::size_of::<ThreadCtx>() <= XSAVE_OFF);

/// IBL table geometry: 64 Ki slots (plus one, for the second probe of the last slot; see
/// [`IBL_KEYS_OFF`]), indexed by the guest pc's low 16 bits: one `movzx`, which leaves the
/// flags alone (a multiplicative hash needed the guest's flags saved and restored around
/// it, `lahf`/`seto`/`sahf`, most of the lookup's instructions). Code addresses spread
/// evenly over their low bits; two hot targets 64 KiB apart at the same offset share a
/// slot, and the second probe keeps both.
pub const IBL_BITS: u32 = 16;
pub const IBL_ENTRIES: usize = 1 << IBL_BITS;

/// The first IBL slot for guest `pc` (the lookup also tries the next one).
pub fn ibl_index(pc: u64) -> usize {
    pc as usize & (IBL_ENTRIES - 1)
}
pub(crate) const ENGINE_STACK: usize = 1 << 20;

/// Every context ever created (contexts are never unmapped; see `reuse_exited`).
static ALL: AtomicPtr<ThreadCtx> = AtomicPtr::new(ptr::null_mut());

/// Creates a context with its engine stack and IBL table; `None` if memory is exhausted.
pub fn new_ctx(dispatch: u64) -> Option<*mut ThreadCtx> {
    let size = ctx_size();
    if indexed_counters() > 0 && INDEXED_SCRATCH.load(Ordering::Acquire) == 0 {
        let scratch = raw::mmap_anon(8 * indexed_counters())?;
        oxgrind_sys::heap::note_private_mapping(scratch as usize, 8 * indexed_counters());
        INDEXED_SCRATCH.store(scratch as u64, Ordering::Release);
    }
    // With definedness, room for the context's view of the shadow's primary table after
    // it (`definedness::views`); without that room (address space exhausted), the context
    // alone, and its thread's lookups all take the slow path.
    let with_view = crate::definedness::views::context_bytes(size);
    let (page, reserved) = match raw::mmap_anon(with_view) {
        Some(p) => (p, with_view),
        None => (raw::mmap_anon(size)?, size),
    };
    let stack = raw::mmap_anon(ENGINE_STACK)?;
    // The context and the engine stack hold copies of the guest's registers (also after the
    // thread is gone): not roots of the program's heap; nor is the view.
    oxgrind_sys::heap::note_private_mapping(page as usize, reserved);
    oxgrind_sys::heap::note_private_mapping(stack as usize, ENGINE_STACK);
    let ctx = page as *mut ThreadCtx;
    CREATED.fetch_add(1, Ordering::Relaxed);
    GENERATION.fetch_add(1, Ordering::AcqRel);
    // SAFETY: the mapping is fresh, zero-filled and large enough for ThreadCtx (asserted).
    unsafe {
        (*ctx).self_ptr = ctx as u64;
        (*ctx).dispatch = dispatch;
        (*ctx).ibl2 = crate::asm::oxg_ibl2 as *const () as u64;
        (*ctx).smc_dispatch = crate::asm::oxg_smc_dispatch as *const () as u64;
        (*ctx).probe_entry = crate::asm::oxg_probe as *const () as u64;
        (*ctx).shadow = crate::shadow::base();
        if crate::definedness::enabled() {
            crate::definedness::views::attach(&mut *ctx, reserved > size);
        }
        // Definedness: the thread's first instruction takes the slow step, which makes
        // its state (`definedness::thread`).
        (*ctx).vbits_need_step = 1;
        if !crate::thread_state::attach(&mut *ctx) || !crate::trace::attach(&mut *ctx) {
            return None; // (the mappings above are leaked: memory is exhausted anyway)
        }
        crate::recent_lines::clear(&mut *ctx);
        count_indexed_into_own(&mut *ctx, true);
        (*ctx).estack = stack as u64 + ENGINE_STACK as u64 - 64;
        // The lower half: the engine's own code runs from the top (and a signal arriving
        // there is taken below the upper half's frames); a handler delivered on the
        // alternate stack starts at the half's top, clear of both.
        (*ctx).alt_stack = [stack as u64, 0, ENGINE_STACK as u64 / 2];
        let mut head = ALL.load(Ordering::Acquire);
        loop {
            (*ctx).next = head;
            match ALL.compare_exchange(head, ctx, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
    }
    Some(ctx)
}

/// Contexts of threads that made the `exit` system call, with their thread ids.
static EXITED: SpinLock<Vec<(usize, i32)>> = SpinLock::new(Vec::new());
/// Contexts created and reused (statistics).
pub static CREATED: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
pub static REUSED: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// Records that the calling thread, which owns `ctx`, is about to exit: its context may be
/// reused once the thread is gone.
pub fn retire(ctx: &ThreadCtx) {
    EXITED.lock().push((ctx.self_ptr as usize, raw::gettid()));
    // Its count is final now: the others read it again (`total_count_seen_by`).
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Holds the registry of exited threads for a `fork` (see `dispatch::hold_for_fork`).
pub(crate) fn try_hold_exited() -> Option<oxgrind_sys::lock::SpinGuard<'static, Vec<(usize, i32)>>>
{
    EXITED.try_lock()
}

/// # Safety
/// Only after `try_hold_exited` succeeded and its guard was forgotten, once per process.
pub(crate) unsafe fn release_exited() {
    // SAFETY: forwarded.
    unsafe { EXITED.force_unlock() }
}

/// Whether thread `tid` of this process is gone. `tgkill(.., 0)` fails with `ESRCH` only
/// once the thread has left user space for good. (A recycled tid reads as alive: the
/// context is then simply not reused yet.)
fn thread_gone(tid: i32) -> bool {
    matches!(raw::tgkill(raw::getpid(), tid, 0), Err(3))
}

/// A context of a thread that is gone, reset for a new thread (its instruction count is
/// kept: it is part of the process total), or `None`.
pub fn reuse_exited() -> Option<*mut ThreadCtx> {
    let mut list = EXITED.lock();
    // Bounded scan: threads exit roughly in creation order, and a clone must stay cheap.
    let n = list.len().min(8);
    let i = (0..n).find(|&i| thread_gone(list[i].1))?;
    let (p, _) = list.swap_remove(i);
    drop(list);
    let ctx = p as *mut ThreadCtx;
    REUSED.fetch_add(1, Ordering::Relaxed);
    GENERATION.fetch_add(1, Ordering::AcqRel);
    // SAFETY: the thread that owned ctx is gone (checked above) and nobody else holds it.
    unsafe {
        let c = &mut *ctx;
        c.scratch = [0; SCRATCH_SLOTS];
        c.in_engine = 0;
        c.next_pc = 0;
        c.clone_child = 0;
        c.clone_next_pc = 0;
        c.started = 0;
        c.gregs = [0; 16];
        c.gflags = 0;
        c.forked = 0;
        c.sigret_src = 0;
        c.smc_stale = 0;
        c.resume_pc = 0;
        c.guest_gs = 0;
        c.probe_rec = 0;
        c.trace_ptr = c.trace_base;
        c.trace_draining.store(0, Ordering::Relaxed);
        c.trace_hold = 0;
        c.trace_holders = 0;
        c.own_work = 0;
        crate::recent_lines::clear(c);
        c.hot = Default::default();
        c.hot_hi_held = [0; oxgrind_tool::instrument::HOT_RANGES];
        c.hot_tests = Default::default();
        count_indexed_into_own(c, true);
        crate::thread_state::renew(c);
        c.fs_base = 0;
        c.pending_child = 0;
        c.pending_signals = 0;
        crate::definedness::reuse(c);
        c.sig_depth = 0;
        c.stepping = 0;
        // Drop the old thread's IBL entries (and their memory): the pages read as zero.
        oxgrind_sys::raw::discard(ibl_keys(c).cast(), 2 * IBL_ARRAY_BYTES);
    }
    Some(ctx)
}

/// Calls `f` with every context ever created.
pub fn for_each(mut f: impl FnMut(*mut ThreadCtx)) {
    let mut p = ALL.load(Ordering::Acquire);
    while !p.is_null() {
        f(p);
        // SAFETY: contexts are never freed.
        p = unsafe { (*p).next };
    }
}

/// Sum over every thread, live or gone, of the tool's counter `id` (a gone thread's
/// context keeps its counts, and a new thread reusing it adds to them).
pub fn counter_total(id: usize) -> u64 {
    let mut sum = 0u64;
    for_each(|p| {
        // SAFETY: contexts are never freed; the owner thread may be adding to the counter
        // concurrently, and an aligned u64 load is never torn on x86-64.
        sum = sum.wrapping_add(unsafe { ptr::read_volatile(&(*p).counters[id]) });
    });
    sum
}

/// Changes whenever a thread starts or ends (see [`total_count_seen_by`]).
static GENERATION: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// How many of its own instructions a thread runs on one reading of the other threads'
/// counts (see [`total_count_seen_by`]).
const OTHERS_REFRESH: u64 = 1 << 17;

/// The process total as thread `ctx` sees it, for a clock read at every allocator event
/// (Massif's `--time-unit=i`): its own count exactly, plus the other threads' counts as read
/// at most [`OTHERS_REFRESH`] of its own instructions ago, or since a thread started or
/// ended. Reading every other thread's count at every event cost a cache miss per thread
/// and event (each owner writes its count at every block), which on two cores was the
/// largest single cost of a threaded program under Massif. While no other thread runs
/// (a single-threaded program, or after the others were joined) the others' counts do not
/// change, so the result is [`total_count`]'s; while others run, it lags behind their
/// progress since the last reading, which is as uncertain as the order of events across
/// threads already is (Valgrind itself switches threads every 100,000 blocks).
///
/// # Safety
/// `ctx` is the calling thread's own context.
pub unsafe fn total_count_seen_by(ctx: *mut ThreadCtx) -> u64 {
    // SAFETY: the caller's own context: only this thread writes the `others*` fields, and
    // its count only by its own translated code, which is not running now.
    unsafe {
        let own = count_of(ctx);
        let generation = GENERATION.load(Ordering::Acquire);
        let c = &mut *ctx;
        if c.others_generation != generation || own.wrapping_sub(c.others_at) >= OTHERS_REFRESH {
            let mut others = 0u64;
            let mut p = ALL.load(Ordering::Acquire);
            while !p.is_null() {
                if p != ctx {
                    // Contexts are never freed; see `total_count`.
                    others = others.wrapping_add(count_of(p));
                }
                p = (*p).next;
            }
            c.others = others;
            c.others_at = own;
            c.others_generation = generation;
        }
        own.wrapping_add(c.others)
    }
}

/// Readings of [`counter_total_seen_by`] on one thread between two readings of the other
/// threads' counts, whatever its own count did: a thread that runs few instructions between
/// events (a loop of frees) still sees the others' progress.
const OTHERS_REFRESH_READS: u64 = 256;

/// The sum of the tool's counter `id` over every thread as thread `ctx` sees it, for a
/// clock read at every allocator event (DHAT's lifetimes and t-gmax): its own copy exactly,
/// the other threads' as read at most [`OTHERS_REFRESH`] of its own counts or
/// [`OTHERS_REFRESH_READS`] readings ago, or since a thread started or ended, as
/// [`total_count_seen_by`] does for the instruction count. Each
/// owner writes its copy at every block: reading all of them at every event
/// ([`counter_total`]) cost a cache miss per thread and event, which on four allocating
/// threads was a seventh of DHAT's time.
///
/// # Safety
/// `ctx` is the calling thread's own context; `id` is below `MAX_COUNTERS`.
pub unsafe fn counter_total_seen_by(ctx: *mut ThreadCtx, id: usize) -> u64 {
    // SAFETY: the caller's own context: only this thread writes the `counter_others*`
    // fields, and its counters only by its own translated code, which is not running now.
    unsafe {
        let own = ptr::read_volatile(&(*ctx).counters[id]);
        let generation = GENERATION.load(Ordering::Acquire);
        let c = &mut *ctx;
        if c.counter_others_generation != generation
            || c.counter_others_id != id as u64
            || own.wrapping_sub(c.counter_others_at) >= OTHERS_REFRESH
            || c.counter_others_reads >= OTHERS_REFRESH_READS
        {
            let mut others = 0u64;
            for_each(|p| {
                if p != ctx {
                    // Contexts are never freed; see `counter_total`.
                    others = others.wrapping_add(ptr::read_volatile(&(*p).counters[id]));
                }
            });
            c.counter_others = others;
            c.counter_others_at = own;
            c.counter_others_generation = generation;
            c.counter_others_id = id as u64;
            c.counter_others_reads = 0;
        }
        c.counter_others_reads += 1;
        own.wrapping_add(c.counter_others)
    }
}

/// Sum of the instruction counters of every thread.
pub fn total_count() -> u64 {
    let mut sum = 0u64;
    let mut p = ALL.load(Ordering::Acquire);
    while !p.is_null() {
        // SAFETY: contexts are never freed; `count` may be updated concurrently by its
        // thread, and a torn read of a u64 cannot happen on x86-64 aligned loads.
        unsafe {
            sum = sum.wrapping_add(count_of(p));
            p = (*p).next;
        }
    }
    sum
}

/// Points `%gs` of the calling thread at `ctx`.
pub fn set_gs(ctx: *mut ThreadCtx) -> Result<(), i32> {
    const SYS_ARCH_PRCTL: usize = 158;
    const ARCH_SET_GS: usize = 0x1001;
    // SAFETY: arch_prctl(ARCH_SET_GS) only changes this thread's gs base.
    oxgrind_sys::syscall::check(unsafe {
        oxgrind_sys::syscall::syscall2(SYS_ARCH_PRCTL, ARCH_SET_GS, ctx as usize)
    })
    .map(|_| ())
}

/// Gives the calling thread, which owns `ctx`, the engine's alternate signal stack
/// (`ThreadCtx::alt_stack`) unless it has one already (the program's). The clone
/// trampoline does the same for a new thread in assembly (`asm::oxg_clone_tramp`).
pub fn register_alt_stack(ctx: &ThreadCtx) {
    const SYS_SIGALTSTACK: usize = 131;
    const SS_DISABLE: u64 = 2;
    let mut old = [0u64; 3];
    // SAFETY: sigaltstack(NULL, &old) writes one stack_t (24 bytes) into `old`.
    let r =
        unsafe { oxgrind_sys::syscall::syscall2(SYS_SIGALTSTACK, 0, old.as_mut_ptr() as usize) };
    if r == 0 && old[1] & SS_DISABLE != 0 {
        // SAFETY: `alt_stack` is a valid stack_t naming memory of this context's engine
        // stack, which lives as long as the process (contexts are never unmapped).
        unsafe {
            oxgrind_sys::syscall::syscall2(SYS_SIGALTSTACK, ctx.alt_stack.as_ptr() as usize, 0)
        };
    }
}

/// The thread's `%gs` base, 0 if none (a thread that is not under the engine).
pub fn gs_base() -> u64 {
    const SYS_ARCH_PRCTL: usize = 158;
    const ARCH_GET_GS: usize = 0x1004;
    let mut v: u64 = 0;
    // SAFETY: arch_prctl(ARCH_GET_GS) writes one u64 to the pointer given.
    let r = unsafe {
        oxgrind_sys::syscall::syscall2(SYS_ARCH_PRCTL, ARCH_GET_GS, &mut v as *mut u64 as usize)
    };
    if r < 0 {
        0
    } else {
        v
    }
}

/// Clears every thread's IBL entries whose guest pc lies in `[start, end)`.
pub fn purge_ibl(start: u64, end: u64) {
    let mut p = ALL.load(Ordering::Acquire);
    while !p.is_null() {
        // SAFETY: contexts and their tables are never freed; each entry's key is written
        // with one aligned store, so the owner thread sees the old key or 0.
        unsafe {
            let keys = ibl_keys(p);
            for i in 0..=IBL_ENTRIES {
                let k = keys.add(i);
                let key = ptr::read_volatile(k).wrapping_neg();
                if key >= start && key < end {
                    ptr::write_volatile(k, 0);
                }
            }
            p = (*p).next;
        }
    }
}
