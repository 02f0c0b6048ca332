//! Hand-written transitions between translated guest code and the engine.
//!
//! These routines run with guest registers live and may not assume anything about them, so
//! they are assembly, and every temporary lives in the thread's context page (`gs:`), never
//! below the guest's `rsp`:
//!
//! * `oxg_dispatch`: entered from an exit stub or an IBL miss with the guest pc in `rax`
//!   and the guest `rax` in scratch slot `STUB_RAX`. Saves every GPR and the flags, switches
//!   to the engine stack, saves the XSAVE state engine code may touch ([`ENGINE_XSTATE`]:
//!   the engine is Rust code and calls libc's `memcpy`, which may use any vector or opmask
//!   register, and the study's spike lost guest YMM state exactly this way), calls
//!   [`crate::dispatch::dispatch`], restores everything and jumps to the host address it
//!   returned.
//! * `oxg_attach`: takes over the calling thread: the guest continues at the caller's
//!   return address, with the caller's registers and `rax = 0`.
//! * `oxg_ibl2`: second probe and miss path of the indirect-branch lookup whose first probe
//!   translated code inlines at every indirect exit (the target's low 16 bits, two probes,
//!   so that two hot targets sharing a slot do not evict each other); no flag is changed
//!   and the stack is not used; a miss enters the dispatcher.
//! * `oxg_clone_tramp`: executes a guest `clone` whose child shares the address space and
//!   moves the child onto its own context before it runs any translated code.
//! * `oxg_fork_tramp`: executes a `fork`-like system call and flags the child.
//! * `oxg_raise_tramp`: re-raises a signal that arrived while the thread was inside the
//!   engine, at a point where all guest registers are in place.
//! * `oxg_sig_entry`: the host handler installed for every signal the guest handles.
//! * `oxg_smc_dispatch`: where a block whose guest bytes changed exits (see `pages`).
//! * `oxg_resume`: where a signal context resumes when its pc is a guest address.
//! * `oxg_probe`: a tool's probe call (see `probe`): enters the dispatcher with the probe
//!   record in `probe_rec`; the dispatcher runs the tool and returns to the call site.

use crate::context as c;

extern "C" {
    pub fn oxg_dispatch();
    pub fn oxg_attach(ctx: *mut c::ThreadCtx);
    pub fn oxg_ibl2();
    pub fn oxg_clone_tramp();
    pub fn oxg_fork_tramp();
    pub fn oxg_raise_tramp();
    pub fn oxg_sig_entry();
    pub fn oxg_sigreturn_tramp();
    pub fn oxg_smc_dispatch();
    pub fn oxg_resume();
    pub fn oxg_probe();
    pub fn oxg_ibl2_end();
    pub fn oxg_raise_after();
    pub fn oxg_restorer();
    pub fn oxg_count_get() -> u64;
    pub fn oxg_count_set(v: u64);
    pub fn oxg_count_add(delta: u64);
    pub fn oxg_ctx_get() -> *mut c::ThreadCtx;
    pub fn oxg_native_gs_begin();
    pub fn oxg_native_gs_end();
    pub fn oxg_count_routines_end();
    pub fn oxg_run_native(data: *mut u8, f: unsafe extern "C" fn(*mut u8));
    pub fn oxg_run_native_done();
    pub fn oxg_native_gate();
    pub fn oxg_native_entry();
    pub fn oxg_native_entry_gate();
    pub fn oxg_native_try_fault();
}

/// Where translated code that reached [`oxg_run_native`] continues after the native call
/// (a plain `ret`, translated as usual).
pub(crate) fn run_native_pcs() -> (u64, u64) {
    (
        oxg_run_native as *const () as u64,
        oxg_run_native_done as *const () as u64,
    )
}

/// The address of [`oxg_native_entry`] (see `crate::native_entry`).
pub(crate) fn native_entry_pc() -> u64 {
    oxg_native_entry as *const () as u64
}

/// Whether `pc` lies in the routines whose `gs:` operands address the engine's context on
/// purpose (`oxg_count_get`/`_set`/`_add`): the embedder calls them from translated
/// code, where every other `gs:` operand is the guest's and is rewritten.
pub(crate) fn native_gs(pc: u64) -> bool {
    (oxg_native_gs_begin as *const () as u64..oxg_native_gs_end as *const () as u64).contains(&pc)
}

/// Whether `pc` lies in `oxg_count_get`/`_set`/`_add`, which the translator does not
/// count: they are the engine's, and what they sum must not depend on how many words
/// there are (`context::COUNT_LANES`). (Before the count had several words they were two
/// instructions each and counted; `hooks::wrapper_cost` in the runtime says so.)
pub(crate) fn count_routine(pc: u64) -> bool {
    (oxg_native_gs_begin as *const () as u64..oxg_count_routines_end as *const () as u64)
        .contains(&pc)
}

/// The XSAVE components the dispatcher saves and restores: x87, SSE, AVX, MPX, opmask and
/// the AVX-512 state (bits 0-7), everything Rust code and libc's string functions can
/// change. Not the AMX tiles (17, 18: 8 KiB that no engine code touches; saving them made
/// every clean call three times as slow on this host, whose XCR0 enables them) nor PKRU (9:
/// never written by the engine).
pub(crate) const ENGINE_XSTATE: u32 = 0xFF;

/// Nonzero when the CPU has `xsaveopt` (set by [`detect_xsaveopt`] before the engine
/// starts): the dispatcher then saves with it, which skips the components the guest left
/// unchanged since the dispatcher's last `xrstor` from the same area (the AVX-512 state,
/// most of the bytes, between two clean calls of definedness) or in their initial state.
/// Nothing else writes the area between the `xrstor` and the next save, the condition
/// under which the skipped bytes are still the registers' values; a kernel context switch
/// or a signal frame restore makes the next `xsaveopt` a full save.
static XSAVEOPT: core::sync::atomic::AtomicU8 = core::sync::atomic::AtomicU8::new(0);

/// Sets [`XSAVEOPT`] from CPUID (leaf 0xD, sub-leaf 1, EAX bit 0).
pub(crate) fn detect_xsaveopt() {
    let l = core::arch::x86_64::__cpuid_count(0xD, 1);
    XSAVEOPT.store((l.eax & 1) as u8, core::sync::atomic::Ordering::Relaxed);
}

/// The guest's general registers but rsp stored in their context slots: how a gate begins,
/// on the guest's stack still (rsp has its own slot, saved by the caller's translation).
macro_rules! save_guest_registers_but_rsp {
    () => {
        concat!(
            "mov gs:[{g_rax}], rax\n",
            "mov gs:[{g_rcx}], rcx\n",
            "mov gs:[{g_rdx}], rdx\n",
            "mov gs:[{g_rbx}], rbx\n",
            "mov gs:[{g_rbp}], rbp\n",
            "mov gs:[{g_rsi}], rsi\n",
            "mov gs:[{g_rdi}], rdi\n",
            "mov gs:[{g_r8}], r8\n",
            "mov gs:[{g_r9}], r9\n",
            "mov gs:[{g_r10}], r10\n",
            "mov gs:[{g_r11}], r11\n",
            "mov gs:[{g_r12}], r12\n",
            "mov gs:[{g_r13}], r13\n",
            "mov gs:[{g_r14}], r14\n",
            "mov gs:[{g_r15}], r15\n",
        )
    };
}

core::arch::global_asm!(
    ".pushsection .text.oxg_engine,\"ax\",@progbits",
    // ------------------------------------------------------------------ dispatcher
    ".p2align 4",
    ".globl oxg_dispatch",
    ".hidden oxg_dispatch",
    "oxg_dispatch:",
    "mov qword ptr gs:[{in_engine}], 1",
    "mov gs:[{next_pc}], rax",
    "mov rax, gs:[{stub_rax}]",
    "mov gs:[{g_rax}], rax",
    "mov gs:[{g_rcx}], rcx",
    "mov gs:[{g_rdx}], rdx",
    "mov gs:[{g_rbx}], rbx",
    "mov gs:[{g_rsp}], rsp",
    "mov gs:[{g_rbp}], rbp",
    "mov gs:[{g_rsi}], rsi",
    "mov gs:[{g_rdi}], rdi",
    "mov gs:[{g_r8}], r8",
    "mov gs:[{g_r9}], r9",
    "mov gs:[{g_r10}], r10",
    "mov gs:[{g_r11}], r11",
    "mov gs:[{g_r12}], r12",
    "mov gs:[{g_r13}], r13",
    "mov gs:[{g_r14}], r14",
    "mov gs:[{g_r15}], r15",
    "oxg_dispatch_core:",
    "mov rsp, gs:[{estack}]",
    "pushfq",
    "pop rax",
    "mov gs:[{g_flags}], rax",
    // Engine code must not run with the guest's EFLAGS.AC (alignment checking, which
    // HotSpot sets while probing the CPU): Rust code makes unaligned accesses.
    "and eax, 0xFFFBFFFF",
    "push rax",
    "popfq",
    "cld",
    "mov eax, {xmask}",
    "xor edx, edx",
    "mov rdi, gs:[0]",
    // A call made where the vector registers are dead keeps them as they are
    // (`ThreadCtx::vectors_dead`).
    "cmp qword ptr gs:[{vectors_dead}], 0",
    "jne 3f",
    "cmp byte ptr [rip + {xsaveopt}], 0",
    "je 2f",
    "xsaveopt64 [rdi + {xsave}]",
    "jmp 3f",
    "2:",
    "xsave64 [rdi + {xsave}]",
    "3:",
    "call {rust}",
    "mov gs:[{host_target}], rax",
    "cmp qword ptr gs:[{vectors_dead}], 0",
    "je 4f",
    "mov qword ptr gs:[{vectors_dead}], 0",
    "jmp 5f",
    "4:",
    "mov rdi, gs:[0]",
    "mov eax, {xmask}",
    "xor edx, edx",
    "xrstor64 [rdi + {xsave}]",
    "5:",
    "push qword ptr gs:[{g_flags}]",
    "popfq",
    "mov rcx, gs:[{g_rcx}]",
    "mov rdx, gs:[{g_rdx}]",
    "mov rbx, gs:[{g_rbx}]",
    "mov rbp, gs:[{g_rbp}]",
    "mov rsi, gs:[{g_rsi}]",
    "mov rdi, gs:[{g_rdi}]",
    "mov r8, gs:[{g_r8}]",
    "mov r9, gs:[{g_r9}]",
    "mov r10, gs:[{g_r10}]",
    "mov r11, gs:[{g_r11}]",
    "mov r12, gs:[{g_r12}]",
    "mov r13, gs:[{g_r13}]",
    "mov r14, gs:[{g_r14}]",
    "mov r15, gs:[{g_r15}]",
    "mov rsp, gs:[{g_rsp}]",
    "mov rax, gs:[{g_rax}]",
    "mov qword ptr gs:[{in_engine}], 0",
    "jmp qword ptr gs:[{host_target}]",
    // ------------------------------------------------------------------ attach
    ".p2align 4",
    ".globl oxg_attach",
    ".hidden oxg_attach",
    "oxg_attach:",
    "mov qword ptr gs:[{in_engine}], 1",
    "mov qword ptr gs:[{g_rax}], 0",
    "mov gs:[{g_rcx}], rcx",
    "mov gs:[{g_rdx}], rdx",
    "mov gs:[{g_rbx}], rbx",
    "mov gs:[{g_rbp}], rbp",
    "mov gs:[{g_rsi}], rsi",
    "mov gs:[{g_rdi}], rdi",
    "mov gs:[{g_r8}], r8",
    "mov gs:[{g_r9}], r9",
    "mov gs:[{g_r10}], r10",
    "mov gs:[{g_r11}], r11",
    "mov gs:[{g_r12}], r12",
    "mov gs:[{g_r13}], r13",
    "mov gs:[{g_r14}], r14",
    "mov gs:[{g_r15}], r15",
    "mov rax, [rsp]",
    "mov gs:[{next_pc}], rax",
    "lea rax, [rsp + 8]",
    "mov gs:[{g_rsp}], rax",
    "jmp oxg_dispatch_core",
    // ------------------------------------------------------------------ IBL
    // Second probe and miss path of the lookup that translated code inlines at each
    // indirect exit (see translate/branches.rs): rax = guest target, guest rcx in IBL_RCX,
    // guest rax in STUB_RAX, the flags the guest's (nothing here changes them). The second
    // probe is the slot after the first: the key array's next word.
    ".p2align 4",
    ".globl oxg_ibl2",
    ".hidden oxg_ibl2",
    "oxg_ibl2:",
    "movzx ecx, ax",
    "mov rcx, gs:[rcx * 8 + {ibl_keys} + 8]",
    "lea rcx, [rcx + rax]",
    "jrcxz 2f",
    "mov rcx, gs:[{ibl_rcx}]",
    "jmp oxg_dispatch",
    "2:",
    "movzx ecx, ax",
    "mov rcx, gs:[rcx * 8 + {ibl_hosts} + 8]",
    "mov gs:[{host_target}], rcx",
    "mov rcx, gs:[{ibl_rcx}]",
    "mov rax, gs:[{stub_rax}]",
    "jmp qword ptr gs:[{host_target}]",
    ".globl oxg_ibl2_end",
    ".hidden oxg_ibl2_end",
    "oxg_ibl2_end:",
    // ------------------------------------------------------------------ clone
    // Guest registers are in place for the clone system call. The kernel clobbers rcx and
    // r11 anyway, so rcx is free after the syscall.
    ".p2align 4",
    ".globl oxg_clone_tramp",
    ".hidden oxg_clone_tramp",
    "oxg_clone_tramp:",
    "syscall",
    "mov rcx, rax",
    "jrcxz 3f",
    "mov gs:[{stub_rax}], rax",
    "mov rax, gs:[{clone_next_pc}]",
    "jmp oxg_dispatch",
    "3:",
    // Child: still on the parent's context (shared memory); the parent waits for
    // `started` before it can reuse clone_child.
    "mov rsi, gs:[{clone_child}]",
    "mov edi, 0x1001",
    "mov eax, 158",
    "syscall",
    // The engine's alternate signal stack (a new thread has none): sigaltstack(&alt, 0).
    // rsi still holds the context (`syscall` keeps it).
    "lea rdi, [rsi + {alt_stack}]",
    "xor esi, esi",
    "mov eax, 131",
    "syscall",
    "mov rdi, gs:[{g_rdi}]",
    "mov rsi, gs:[{g_rsi}]",
    "mov qword ptr gs:[{started}], 1",
    "mov qword ptr gs:[{stub_rax}], 0",
    "mov rax, gs:[{clone_next_pc}]",
    "jmp oxg_dispatch",
    // ------------------------------------------------------------------ fork
    // A clone without CLONE_VM (or fork): the child continues on a copy of this context
    // and tells its first dispatch that it is a fresh process (see dispatch.rs).
    ".p2align 4",
    ".globl oxg_fork_tramp",
    ".hidden oxg_fork_tramp",
    "oxg_fork_tramp:",
    "syscall",
    "mov rcx, rax",
    "jrcxz 6f",
    "mov gs:[{stub_rax}], rax",
    "mov rax, gs:[{clone_next_pc}]",
    "jmp oxg_dispatch",
    "6:",
    "mov qword ptr gs:[{forked}], 1",
    "mov gs:[{stub_rax}], rax",
    "mov rax, gs:[{clone_next_pc}]",
    "jmp oxg_dispatch",
    // ------------------------------------------------------------------ re-raise
    ".p2align 4",
    ".globl oxg_raise_tramp",
    ".hidden oxg_raise_tramp",
    "oxg_raise_tramp:",
    "mov gs:[{t0}], rax",
    "mov gs:[{t1}], rdi",
    "mov gs:[{t2}], rsi",
    "mov gs:[{t3}], rdx",
    "mov gs:[{t4}], rcx",
    "mov gs:[{t5}], r11",
    "mov gs:[{t6}], r10",
    // rt_tgsigqueueinfo(pid, tid, sig, info): to itself, a thread may send any siginfo,
    // so the handler gets the one the kernel built.
    "mov eax, 297",
    "mov rdi, gs:[{raise_pid}]",
    "mov rsi, gs:[{raise_tid}]",
    "mov rdx, gs:[{raise_sig}]",
    "mov r10, gs:[{raise_info}]",
    "syscall",
    // The re-raised signal is delivered here, with the registers above borrowed: the
    // signal entry shows the handler the state at the raise target instead.
    ".globl oxg_raise_after",
    ".hidden oxg_raise_after",
    "oxg_raise_after:",
    "mov rax, gs:[{t0}]",
    "mov rdi, gs:[{t1}]",
    "mov rsi, gs:[{t2}]",
    "mov rdx, gs:[{t3}]",
    "mov rcx, gs:[{t4}]",
    "mov r11, gs:[{t5}]",
    "mov r10, gs:[{t6}]",
    "jmp qword ptr gs:[{raise_target}]",
    // ------------------------------------------------------------------ signals
    // Entered by the kernel: rdi = sig, rsi = siginfo, rdx = ucontext, [rsp] = restorer.
    ".p2align 4",
    ".globl oxg_sig_entry",
    ".hidden oxg_sig_entry",
    "oxg_sig_entry:",
    "push rdi",
    "push rsi",
    "push rdx",
    // The flags at entry are kept (the deferred path returns with them); the Rust half
    // runs with EFLAGS.AC and DF clear. Five pushes keep the call's stack aligned.
    "pushfq",
    "sub rsp, 8",
    "pushfq",
    "and dword ptr [rsp], 0xFFFBFFFF",
    "popfq",
    "cld",
    "call {sigrust}",
    "add rsp, 8",
    "popfq",
    "pop rdx",
    "pop rsi",
    "pop rdi",
    "test rax, rax",
    "jz 4f",
    "mov qword ptr gs:[{stub_rax}], 0",
    "jmp oxg_dispatch",
    "4:",
    "ret",
    // ------------------------------------------------------------------ stale block
    // A block's entry check found its guest bytes changed: same protocol as an exit stub
    // (rax = guest pc, guest rax in STUB_RAX), plus the flag that tells the dispatcher to
    // drop the block first. The flag is set after `in_engine`, so a signal handler that
    // interrupts this sequence never sees it.
    ".p2align 4",
    ".globl oxg_smc_dispatch",
    ".hidden oxg_smc_dispatch",
    "oxg_smc_dispatch:",
    "mov qword ptr gs:[{in_engine}], 1",
    "mov qword ptr gs:[{smc_stale}], 1",
    "jmp oxg_dispatch",
    // ------------------------------------------------------------------ resume
    // Where a signal context whose pc is a guest address (shown to the handler, or set by
    // it) resumes after `rt_sigreturn`: all guest registers are in place; enter the
    // dispatcher at the guest pc like an exit stub would.
    ".p2align 4",
    ".globl oxg_resume",
    ".hidden oxg_resume",
    "oxg_resume:",
    "mov gs:[{stub_rax}], rax",
    "mov rax, gs:[{resume_pc}]",
    "jmp oxg_dispatch",
    // ------------------------------------------------------------------ probe
    // A probe call site did `mov gs:[STUB_RAX], rax`, stored its return address in
    // PROBE_RET and loaded the probe record into rax: the guest state is otherwise exactly
    // that before the probed instruction. The dispatcher saves it like any entry.
    ".p2align 4",
    ".globl oxg_probe",
    ".hidden oxg_probe",
    "oxg_probe:",
    "mov qword ptr gs:[{in_engine}], 1",
    "mov gs:[{probe_rec}], rax",
    "jmp oxg_dispatch",
    // ------------------------------------------------------------------ counters
    // The calling thread's instruction count, for the embedder (see `native_gs`).
    ".p2align 4",
    ".globl oxg_native_gs_begin",
    ".hidden oxg_native_gs_begin",
    "oxg_native_gs_begin:",
    ".globl oxg_count_get",
    ".hidden oxg_count_get",
    // The count is spread over `context::COUNT_LANES` (8) words; the sum is the count.
    // Translated, these two routines count nothing (`count_routine`).
    "oxg_count_get:",
    "mov rax, gs:[{count}]",
    "add rax, gs:[{count} + 8]",
    "add rax, gs:[{count} + 16]",
    "add rax, gs:[{count} + 24]",
    "add rax, gs:[{count} + 32]",
    "add rax, gs:[{count} + 40]",
    "add rax, gs:[{count} + 48]",
    "add rax, gs:[{count} + 56]",
    "ret",
    // Sets the sum: the first word takes what the others do not hold.
    ".globl oxg_count_set",
    ".hidden oxg_count_set",
    "oxg_count_set:",
    "sub rdi, gs:[{count} + 8]",
    "sub rdi, gs:[{count} + 16]",
    "sub rdi, gs:[{count} + 24]",
    "sub rdi, gs:[{count} + 32]",
    "sub rdi, gs:[{count} + 40]",
    "sub rdi, gs:[{count} + 48]",
    "sub rdi, gs:[{count} + 56]",
    "mov gs:[{count}], rdi",
    "ret",
    // Adds rdi (two's complement: a negative amount subtracts) to the sum, in the first
    // word: one instruction where a read and a set would be two sums of eight words.
    ".globl oxg_count_add",
    ".hidden oxg_count_add",
    "oxg_count_add:",
    "add gs:[{count}], rdi",
    "ret",
    ".globl oxg_count_routines_end",
    ".hidden oxg_count_routines_end",
    "oxg_count_routines_end:",
    // The calling thread's own context (its first field is its address).
    ".globl oxg_ctx_get",
    ".hidden oxg_ctx_get",
    "oxg_ctx_get:",
    "mov rax, gs:[0]",
    "ret",
    ".globl oxg_native_gs_end",
    ".hidden oxg_native_gs_end",
    "oxg_native_gs_end:",
    // ------------------------------------------------------------------ run natively
    // `crate::run_native`: rdi = the closure, rsi = the function that calls it. Run
    // natively, a tail call. Translated, the translator replaces the block at
    // `oxg_run_native` by a clean call (`probe::KIND_NATIVE`) that makes the same call on
    // the engine stack, then continues at `oxg_run_native_done`.
    ".p2align 4",
    ".globl oxg_run_native",
    ".hidden oxg_run_native",
    "oxg_run_native:",
    "jmp rsi",
    ".globl oxg_run_native_done",
    ".hidden oxg_run_native_done",
    "oxg_run_native_done:",
    "ret",
    // The translation of `oxg_run_native` calls this, natively, on the engine stack (the
    // guest's rsp saved in its slot, `in_engine` set): the guest registers of the call
    // are saved for `guest_regs_in_tool_call`, then Rust makes the call and returns to
    // the translation (see `translate::Emitter::native_gate_call`).
    ".p2align 4",
    ".globl oxg_native_gate",
    ".hidden oxg_native_gate",
    "oxg_native_gate:",
    save_guest_registers_but_rsp!(),
    "mov rdi, gs:[0]",
    "jmp {native_gate}",
    // `crate::native_entry`: r11 = a function of up to six integer arguments, which are
    // in rdi, rsi, rdx, rcx, r8, r9, and rsp at the program's
    // return address (the embedder's entry point jumped here). Natively, a tail call.
    // Translated, when the embedder asked for it (`crate::set_native_entries`), the
    // translator replaces this block by the same call made natively on the engine stack
    // (through `oxg_native_entry_gate`), whose result stays in rax, then continues at
    // `oxg_run_native_done`: the `ret` to the program.
    ".p2align 4",
    ".globl oxg_native_entry",
    ".hidden oxg_native_entry",
    "oxg_native_entry:",
    "jmp r11",
    // As `oxg_native_gate`, for `oxg_native_entry`: the guest registers saved, then the
    // call made here, its result left in rax. Reached by the translation's `call` on the
    // engine stack (rsp = its top - 8), the arguments still in rdi, rsi, rdx, rcx, r8, r9
    // and the function in r11, as the program's call and the embedder's entry left them.
    // What `probe::native_entry_call` does for the dispatcher's fall-back, without a Rust
    // frame between: the registers lent to the embedder as the caller's
    // (`ToolRegsLent::gate_caller`: the previous loan kept on the engine stack, restored
    // after), and the call counted in `native_calls` (`NativeCall`: plain `inc`/`dec`, only
    // this thread writes it, and a signal in between restores what it found). Every
    // allocator call of a heap tool comes here: the Rust wrapper's seven reloads of the
    // arguments, its frame and its call were a third of the gate's instructions. The
    // flags are the caller's to lose (a function call).
    ".p2align 4",
    ".globl oxg_native_entry_gate",
    ".hidden oxg_native_entry_gate",
    "oxg_native_entry_gate:",
    save_guest_registers_but_rsp!(),
    "push qword ptr gs:[{tool_regs}]",
    "mov qword ptr gs:[{tool_regs}], {lent_gate_caller}",
    "inc qword ptr gs:[{native_calls}]",
    // rsp is 16-byte aligned here (the top - 16): the callee's frame is as the ABI wants.
    "call r11",
    "dec qword ptr gs:[{native_calls}]",
    "pop qword ptr gs:[{tool_regs}]",
    "ret",
    // ------------------------------------------------------------------ native try fault
    // A synchronous fault inside a replaced function's native try (`crate::native_try`,
    // `ThreadCtx::native_try` set): the signal entry resumes here instead. The try's
    // frames are abandoned (it holds no lock and has changed nothing it must undo: see
    // `native_try`), the callee-saved registers its gate saved come back, and the gate's
    // call returns "declined" (rax = rdx = 0) from the engine stack's top, where the
    // gate's `call` left its return address.
    ".p2align 4",
    ".globl oxg_native_try_fault",
    ".hidden oxg_native_try_fault",
    "oxg_native_try_fault:",
    "mov rbx, gs:[{g_rbx}]",
    "mov rbp, gs:[{g_rbp}]",
    "mov r12, gs:[{g_r12}]",
    "mov r13, gs:[{g_r13}]",
    "mov r14, gs:[{g_r14}]",
    "mov r15, gs:[{g_r15}]",
    "mov rsp, gs:[{estack}]",
    "sub rsp, 8",
    "xor eax, eax",
    "xor edx, edx",
    "ret",
    // ------------------------------------------------------------------ restorer
    // The `sa_restorer` of actions the engine installs on its own (SIGTRAP at the guest's
    // default): runs natively after the entry returned.
    ".p2align 4",
    ".globl oxg_restorer",
    ".hidden oxg_restorer",
    "oxg_restorer:",
    "mov eax, 15",
    "syscall",
    "ud2",
    // ------------------------------------------------------------------ sigreturn
    // rax = 15 and rsp at the signal frame; rt_sigreturn reloads every other register from
    // the frame, so rsi/rdi/rcx/flags may be used to copy the scratch slots back.
    ".p2align 4",
    ".globl oxg_sigreturn_tramp",
    ".hidden oxg_sigreturn_tramp",
    "oxg_sigreturn_tramp:",
    "mov rsi, gs:[{sigret_src}]",
    "test rsi, rsi",
    "jz 5f",
    "mov rdi, gs:[0]",
    "add rdi, {scratch}",
    "mov ecx, {nscratch}",
    "cld",
    "rep movsq",
    "5:",
    "mov eax, 15",
    "syscall",
    "ud2",
    ".popsection",
    in_engine = const c::OFF_IN_ENGINE,
    next_pc = const c::OFF_NEXT_PC,
    stub_rax = const c::scratch_off(c::S_STUB_RAX),
    ibl_rcx = const c::scratch_off(c::S_IBL_RCX),
    ibl_keys = const c::IBL_KEYS_OFF,
    ibl_hosts = const c::IBL_HOSTS_OFF,
    host_target = const c::scratch_off(c::S_HOST_TARGET),
    raise_target = const c::scratch_off(c::S_RAISE_TARGET),
    t0 = const c::scratch_off(c::S_T0),
    t1 = const c::scratch_off(c::S_T0 + 1),
    t2 = const c::scratch_off(c::S_T0 + 2),
    t3 = const c::scratch_off(c::S_T0 + 3),
    t4 = const c::scratch_off(c::S_T0 + 4),
    t5 = const c::scratch_off(c::S_T0 + 5),
    t6 = const c::scratch_off(c::S_T0 + 6),
    raise_info = const c::OFF_RAISE_INFO,
    g_rax = const c::greg_off(0),
    g_rcx = const c::greg_off(1),
    g_rdx = const c::greg_off(2),
    g_rbx = const c::greg_off(3),
    g_rsp = const c::greg_off(4),
    g_rbp = const c::greg_off(5),
    g_rsi = const c::greg_off(6),
    g_rdi = const c::greg_off(7),
    g_r8 = const c::greg_off(8),
    g_r9 = const c::greg_off(9),
    g_r10 = const c::greg_off(10),
    g_r11 = const c::greg_off(11),
    g_r12 = const c::greg_off(12),
    g_r13 = const c::greg_off(13),
    g_r14 = const c::greg_off(14),
    g_r15 = const c::greg_off(15),
    g_flags = const c::OFF_GFLAGS,
    estack = const c::OFF_ESTACK,
    xsave = const c::XSAVE_OFF,
    vectors_dead = const c::OFF_VECTORS_DEAD,
    xmask = const ENGINE_XSTATE,
    xsaveopt = sym XSAVEOPT,
    clone_child = const c::OFF_CLONE_CHILD,
    clone_next_pc = const c::OFF_CLONE_NEXT_PC,
    started = const c::OFF_STARTED,
    alt_stack = const c::OFF_ALT_STACK,
    raise_pid = const c::OFF_RAISE_PID,
    raise_tid = const c::OFF_RAISE_TID,
    raise_sig = const c::OFF_RAISE_SIG,
    sigret_src = const c::OFF_SIGRET_SRC,
    forked = const c::OFF_FORKED,
    smc_stale = const c::OFF_SMC_STALE,
    resume_pc = const c::OFF_RESUME_PC,
    probe_rec = const c::OFF_PROBE_REC,
    count = const c::OFF_COUNT,
    scratch = const c::OFF_SCRATCH,
    nscratch = const c::SCRATCH_SLOTS,
    rust = sym crate::dispatch::dispatch,
    sigrust = sym crate::signals::on_signal,
    native_gate = sym crate::probe::native_gate,
    tool_regs = const c::OFF_TOOL_REGS,
    native_calls = const c::OFF_NATIVE_CALLS,
    lent_gate_caller = const crate::probe::LENT_GATE_CALLER,
);
