//! Guest basic block → host code: decode with iced-x86, copy, patch, add exits.
//!
//! This is a *copy-and-annotate* translator (DynamoRIO/Pin style, see the engine study
//! §4.3): an instruction without a RIP-relative operand is copied byte for byte; one with a
//! RIP-relative operand gets its disp32 re-aimed at the same guest address from its new
//! location, or, when the code cache is more than ±2 GiB away, is rewritten to address
//! through a spilled scratch register. Control transfers are replaced:
//!
//! * direct jumps, calls and the fall-through become *exit stubs* that enter the dispatcher
//!   until the target is translated, then are patched into direct jumps (linking);
//! * `call` pushes the *guest* return address, so the guest stack looks exactly as it
//!   would natively (unwinders, `backtrace()`, `longjmp` keep working);
//! * `ret` and indirect `jmp`/`call` load the guest target into `rax` and go to the
//!   indirect-branch lookup (IBL);
//! * a `syscall` gets a block of its own, reached only through the dispatcher, so the
//!   engine sees every system call before it executes.
//!
//! Instrumentation: the engine's own instruction count at block entry, and the tool's
//! probes before the instructions it chose. In counting mode and under probes,
//! `rep`-prefixed string instructions are expanded into a one-iteration loop, so each
//! iteration counts as one instruction, exactly as Valgrind's VEX front end does.
//!
//! The translator never executes anything and never writes the code cache: it returns
//! bytes positioned for a given host address plus the list of exit stubs.
//!
//! Where each part lives: this module decodes a block and drives the [`Emitter`];
//! `rewrite` copies instructions (RIP-relative and `gs:` rewrites), `branches` replaces
//! control transfers (stubs, linking, the indirect-branch lookup), `probes` emits the
//! tool's probes, `smc` the entry check of blocks from writable pages, `special` the
//! blocks of one `syscall` or one `rep` iteration.

use alloc::vec::Vec;

use iced_x86::{
    Code, ConstantOffsets, Decoder, DecoderError, DecoderOptions, Encoder, FlowControl,
    Instruction, InstructionInfoFactory, OpKind, Register,
};

use crate::context as c;
use crate::probe::Client;
use oxgrind_tool::instrument::{Insn, Plan, Probe, MAX_PROBES};

mod branches;
mod definedness;
mod probes;
mod rewrite;
mod smc;
mod special;

pub use branches::{link_stub, native_jump, unlink_stub};
pub(crate) use definedness::{definedness_routines, set_catch_up_routine};
pub(crate) use probes::{
    recent_line_routines, recent_routines_wanted, set_recent_routines, set_slow_tails,
    slow_call_tails,
};
use rewrite::{ea_encodable, gs_rewritable};
use smc::Check;
use special::{rep_block, syscall_block};

/// Maximum guest bytes one block can span (MAX_INSNS instructions of at most 15 bytes).
pub const MAX_GUEST_SPAN: u64 = MAX_INSNS as u64 * 15;

/// Maximum guest instructions in one block.
const MAX_INSNS: usize = 64;
/// The same with definedness tracked (see `definedness`'s inline fast path).
const MAX_INSNS_DEFINEDNESS: usize = 24;

/// Size of an exit stub, see `emit_stub`.
pub const STUB_SIZE: usize = 40;
/// Offset of the 8-byte far-link slot inside a stub.
pub const STUB_FAR_SLOT: usize = 32;
/// Length of a stub's first instruction (`mov gs:[STUB_RAX], rax`).
const STUB_RAX_STORE_LEN: usize = 9;

/// What kind of block a translation is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BlockKind {
    /// Ordinary code: may be linked to and entered from the IBL.
    Normal,
    /// A lone `syscall`: only ever entered through the dispatcher.
    Syscall,
}

/// An exit stub that still needs its target.
#[derive(Clone, Copy, Debug)]
pub struct Stub {
    /// Offset of the stub in the translation.
    pub offset: usize,
    /// Guest address it leads to.
    pub target: u64,
}

/// Where one stretch of a translation stands in guest terms, for the signal context a guest
/// handler sees (see `signals`). An entry covers the host bytes from `host_off` to the next
/// entry; the guest state there is that of the guest instruction at `guest`, not yet
/// executed, once the fix-ups in `fix` are applied to the registers. An exit stub stands
/// for its target. `guest == UNMAPPED`: engine code with no guest equivalent (the IBL, the
/// middle of an entry check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PcMapEntry {
    pub host_off: u16,
    pub fix: u16,
    pub guest: u64,
}

/// `guest` of engine code that corresponds to no guest instruction.
pub const UNMAPPED: u64 = u64::MAX;
/// The guest `rax` is in scratch slot `STUB_RAX` (rax holds a branch target).
pub const FIX_RAX_IN_STUB: u16 = 1;
/// The guest `rcx` is one more than the register (an expanded `rep` iteration).
pub const FIX_RCX_PLUS_ONE: u16 = 2;
/// With [`FIX_RAX_IN_STUB`]: the guest flags are in scratch slot `PROBE_FLAGS`, as
/// `lahf; seto al` saved them (a borrow carried over an instruction that does not touch
/// the flags: `Emitter::carry_flags`).
pub const FIX_FLAGS_IN_SLOT: u16 = 4;
/// `(r + 1) << FIX_FAR_SHIFT`: guest register `r` is in scratch slot `FAR_SAVE`.
pub const FIX_FAR_SHIFT: u16 = 8;

/// A finished translation, positioned for host address `base`.
pub struct Translation {
    pub bytes: Vec<u8>,
    pub stubs: Vec<Stub>,
    pub kind: BlockKind,
    /// Guest instructions in the block.
    pub insns: usize,
    /// Guest bytes the block was translated from.
    pub guest_len: u64,
    /// Host offset → guest instruction, ordered by `host_off`.
    pub pcmap: Vec<PcMapEntry>,
}

/// Why a block could not be translated.
#[derive(Clone, Copy, Debug)]
pub enum TranslateError {
    /// The bytes at `pc` are not a valid x86-64 instruction.
    Invalid {
        pc: u64,
        len: usize,
        bytes: [u8; 16],
    },
    /// A valid instruction the engine cannot run yet (far transfers, `gs:` string operands,
    /// TSX...).
    Unsupported {
        pc: u64,
        len: usize,
        bytes: [u8; 16],
    },
    /// The iced encoder rejected a rewritten instruction.
    Encode { pc: u64 },
}

/// RIP-relative operands rewritten through a scratch register because the code cache was
/// out of rel32 reach (reported by `OXGRIND_ENGINE_STATS`).
pub static FAR_REWRITES: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

fn note_far_rewrite() {
    FAR_REWRITES.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
}

/// When `pc` is `asm::oxg_native_entry` (`crate::native_entry`) and native entries are in
/// use: the probe record of its native call and the pc of the gate's `ret` after it. Asked
/// for a block that starts there and for a `jmp` to it (`Emitter::native_entry_here`).
fn native_entry_at(pc: u64) -> Option<(u64, u64)> {
    if pc != crate::asm::native_entry_pc() || !crate::native_entries() {
        return None;
    }
    let (_, done) = crate::asm::run_native_pcs();
    crate::probe::native_entry_record(pc, done).map(|rec| (rec, done))
}

/// Options that shape translations.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub count: bool,
    /// Check at every entry that the guest bytes are still those translated (the block
    /// comes from a page the program can write; see `pages`). A mismatch exits to the
    /// dispatcher through `oxg_smc_dispatch`, which drops the block and translates again.
    pub check: bool,
    /// Ask the tool (`crate::probe::Client`) for probes (and redirections).
    pub instrument: bool,
    /// Every system call comes back to the dispatcher with its result
    /// (`dispatch::syscall_returned`), for `Config::on_fd_syscall`; otherwise only one
    /// that failed with `EMFILE` does.
    pub syscall_returns: bool,
}

/// `Config::redirect` as a plain address (0: none): the embedder's replacements when
/// there is no client to ask.
static PLAIN_REDIRECT: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// Sets `Config::redirect`, once before the engine starts.
pub(crate) fn set_plain_redirect(hook: Option<fn(u64) -> Option<u64>>) {
    PLAIN_REDIRECT.store(
        hook.map_or(0, |f| f as usize),
        core::sync::atomic::Ordering::Relaxed,
    );
}

/// Where `Config::redirect` sends a block starting at `pc`, if anywhere.
fn plain_redirect(pc: u64) -> Option<u64> {
    match PLAIN_REDIRECT.load(core::sync::atomic::Ordering::Relaxed) {
        0 => None,
        f => {
            // SAFETY: the only non-zero value stored is a `fn(u64) -> Option<u64>`.
            let f: fn(u64) -> Option<u64> = unsafe { core::mem::transmute(f) };
            f(pc)
        }
    }
}

/// Readable length from `pc`: to the end of its page, plus the next page if it is mapped.
/// `0` if `pc`'s own page is not mapped.
fn readable_len(pc: u64) -> usize {
    const PAGE: u64 = 4096;
    let page = pc & !(PAGE - 1);
    if !page_mapped(page) {
        return 0;
    }
    let mut len = (page + PAGE - pc) as usize;
    if page_mapped(page + PAGE) {
        len += PAGE as usize;
    }
    len
}

/// Pages recently found mapped (direct-mapped by page number): saves the `mincore` system
/// calls for most blocks. Forgotten whenever the program unmaps or re-protects memory.
static MAPPED: [core::sync::atomic::AtomicU64; 512] =
    [const { core::sync::atomic::AtomicU64::new(0) }; 512];

/// Forgets every remembered mapped page (called before `munmap`, `mremap`, `mprotect`).
pub fn forget_mapped_pages() {
    for e in &MAPPED {
        e.store(0, core::sync::atomic::Ordering::Relaxed);
    }
}

fn page_mapped(page: u64) -> bool {
    use core::sync::atomic::Ordering;
    let slot = &MAPPED[(page >> 12) as usize % MAPPED.len()];
    if page != 0 && slot.load(Ordering::Relaxed) == page {
        return true;
    }
    let mapped = page_mapped_syscall(page) && !page_unreadable(page);
    if mapped {
        slot.store(page, Ordering::Relaxed);
    }
    mapped
}

fn page_mapped_syscall(page: u64) -> bool {
    const SYS_MINCORE: usize = 27;
    let mut vec = 0u8;
    // SAFETY: mincore only writes one byte per page into `vec`; it fails with ENOMEM for an
    // unmapped range and never faults on the queried address.
    let r = unsafe {
        oxgrind_sys::syscall::syscall3(
            SYS_MINCORE,
            page as usize,
            4096,
            &mut vec as *mut u8 as usize,
        )
    };
    r == 0
}

/// Whether a mapped page is known unreadable: a `PROT_NONE` page, which `mincore` reports as
/// mapped, sits between the text and read-only segments of every shared object linked with
/// a separate code segment; a block near the end of the text would otherwise copy past it
/// and fault. Asked of the kernel by `process_vm_readv` on ourselves (one byte), which fails
/// with `EFAULT` there; any other failure (the call filtered out) says nothing.
fn page_unreadable(page: u64) -> bool {
    const SYS_PROCESS_VM_READV: usize = 310;
    const EFAULT: isize = 14;
    let mut byte = 0u8;
    let local = [&mut byte as *mut u8 as usize, 1];
    let remote = [page as usize, 1];
    // SAFETY: the kernel writes at most one byte to `byte` and reads the remote byte
    // itself, failing with EFAULT instead of faulting.
    let r = unsafe {
        oxgrind_sys::syscall::syscall6(
            SYS_PROCESS_VM_READV,
            oxgrind_sys::raw::getpid() as usize,
            local.as_ptr() as usize,
            1,
            remote.as_ptr() as usize,
            1,
            0,
        )
    };
    r == -EFAULT
}

/// Up to 16 bytes of the snapshot `code` (taken at guest `base`) from guest `pc`.
fn bytes_at(code: &[u8], base: u64, pc: u64, len: usize) -> [u8; 16] {
    let mut b = [0u8; 16];
    let from = ((pc - base) as usize).min(code.len());
    let n = len.min(16).min(code.len() - from);
    b[..n].copy_from_slice(&code[from..from + n]);
    b
}

struct Decoded {
    ins: Instruction,
    offs: ConstantOffsets,
}

/// How the last decoded instruction ends the block.
enum End {
    /// Block ends before instruction at pc (fall through into a new block).
    Before(u64),
    /// The last instruction in `insns` is a control transfer.
    Transfer,
    /// Block limit reached after the last instruction.
    Limit(u64),
}

const STATUS_FLAGS: u32 = 0x3f; // OF SF ZF AF CF PF in iced's RflagsBits

fn is_rep_string(ins: &Instruction) -> bool {
    ins.is_string_instruction() && (ins.has_rep_prefix() || ins.has_repne_prefix())
}

fn unsupported(ins: &Instruction) -> bool {
    if ins.is_jmp_far()
        || ins.is_call_far()
        || ins.is_jmp_far_indirect()
        || ins.is_call_far_indirect()
    {
        return true;
    }
    if matches!(
        ins.code(),
        Code::Xbegin_rel32
            | Code::Xbegin_rel16
            | Code::Retfq
            | Code::Retfq_imm16
            | Code::Retfd
            | Code::Retfd_imm16
            | Code::Retfw
            | Code::Retfw_imm16
            | Code::Iretq
            | Code::Iretd
            | Code::Iretw
            | Code::Sysenter
            | Code::Sysexitq
            | Code::Sysretq
    ) {
        return true;
    }
    // Guest `gs:` operands would address the engine's context page: an explicit memory
    // operand is rewritten against the guest's own gs base (`gs_operand`) when its form
    // allows; string instructions and segment-register moves are refused.
    for i in 0..ins.op_count() {
        if ins.op_kind(i) == OpKind::Memory
            && ins.memory_segment() == Register::GS
            && !gs_rewritable(ins)
        {
            return true;
        }
        if matches!(
            ins.op_kind(i),
            OpKind::MemorySegRSI | OpKind::MemorySegESI | OpKind::MemorySegSI
        ) && ins.memory_segment() == Register::GS
        {
            return true;
        }
        if ins.op_kind(i) == OpKind::Register && ins.op_register(i) == Register::GS {
            return true;
        }
    }
    // EIP-relative (0x67 + RIP) addressing: rare, not handled by the fix-up.
    if ins.is_ip_rel_memory_operand() && ins.memory_base() == Register::EIP {
        return true;
    }
    false
}

/// Why the translator's allocations keep to a few sizes (512 and 1024 bytes, plus the
/// 64-byte vectors of stubs and fix-ups).
///
/// The engine shares the embedder's global allocator (`oxgrind_sys::heap::PrivateHeap`)
/// with the embedder's own code, which runs *translated* like the rest of the program.
/// That heap holds a per-size-class spin lock while it maps a new chunk (a system call,
/// hence a dispatcher entry) and while it runs code that may not be translated yet; if
/// the translation made then needs the same size class, the thread deadlocks on itself.
/// Until the heap gives the engine its own classes (or never calls out under its locks),
/// the translator only allocates in the classes it has used from the start, which the
/// embedder's heap has normally carved before the engine took over.
pub const ALLOC_NOTE: () = ();

/// Translates the block at guest `pc` for host address `base`.
pub fn translate(pc: u64, base: u64, opts: Options) -> Result<Translation, TranslateError> {
    translate_at_most(pc, base, opts, usize::MAX)
}

/// [`translate`], ending the block after at most `limit` instructions: for a translation
/// whose probes made it larger than the cache's block size.
pub fn translate_at_most(
    pc: u64,
    base: u64,
    opts: Options,
    limit: usize,
) -> Result<Translation, TranslateError> {
    let avail = readable_len(pc);
    let mut e = Emitter::new(pc, base, opts.count);
    if avail == 0 {
        return Ok(native_jump(pc));
    }
    let (native_gate, native_done) = crate::asm::run_native_pcs();
    if pc == native_gate {
        // `crate::run_native`: the call is made natively on the engine stack, then the
        // gate's `ret` runs translated.
        if let Some(rec) = crate::probe::native_call_record(pc, native_done) {
            e.mark(pc, 0);
            let gate = crate::asm::oxg_native_gate as *const () as u64;
            e.native_gate_call(pc, rec, native_done, gate);
            return Ok(e.jump_only(native_done, native_done - pc));
        }
    }
    if let Some((rec, done)) = native_entry_at(pc) {
        // `crate::native_entry`: the embedder's function is called natively on the engine
        // stack, its result kept in rax, then the `ret` after the gate returns to the
        // program. The block stands for the one `jmp r11` it replaces.
        e.mark(pc, 0);
        let gate = crate::asm::oxg_native_entry_gate as *const () as u64;
        e.native_gate_call(pc, rec, done, gate);
        return Ok(e.jump_only(done, 3));
    }
    let client = if opts.instrument {
        crate::probe::client()
    } else {
        None
    };
    // Asked of the embedder's own code too, which it may bypass.
    let redirect = match client {
        Some(c) => c.embedder.redirect(pc),
        None => plain_redirect(pc),
    };
    if let Some(to) = redirect {
        e.mark(pc, 0);
        // A native try first (`crate::native_try`), where nothing counts the replacement's
        // instructions (they would go uncounted when the try does the work).
        let try_fn = client
            .filter(|_| !opts.count)
            .and_then(|c| c.embedder.native_try(to));
        if let Some(f) = try_fn {
            e.native_try_here(to, f);
        }
        return Ok(e.jump_only(to, 1));
    }
    let tool = client.filter(|c| !c.embedder.is_own_code(pc));
    let window = avail.min(MAX_INSNS * 15 + 16);
    // Everything is decoded and copied from one snapshot, which is also what an entry check
    // compares against: a write racing with the translation makes the check fail rather
    // than go unnoticed.
    // SAFETY: readable_len checked that these bytes are mapped.
    let snapshot = unsafe { core::slice::from_raw_parts(pc as *const u8, window) }.to_vec();
    let code = &snapshot[..];
    let mut dec = Decoder::with_ip(64, code, pc, DecoderOptions::NONE);
    let mut insns: Vec<Decoded> = Vec::with_capacity(16);
    let end;
    // Definedness's inline code is up to a few hundred bytes per instruction: shorter
    // blocks keep a translation within the cache's block size.
    let max_insns = if tool.is_some() && crate::definedness::enabled() {
        MAX_INSNS_DEFINEDNESS
    } else {
        MAX_INSNS
    }
    .min(limit.max(1));
    loop {
        if insns.len() >= max_insns {
            end = End::Limit(dec.ip());
            break;
        }
        let ip = dec.ip();
        if !dec.can_decode() {
            end = End::Before(ip);
            break;
        }
        let ins = dec.decode();
        let offs = dec.get_constant_offsets(&ins);
        let first = insns.is_empty();
        if ins.is_invalid() {
            if dec.last_error() == DecoderError::NoMoreBytes && !first {
                end = End::Before(ip);
                break;
            }
            if first {
                let len = if dec.last_error() == DecoderError::NoMoreBytes {
                    window.min(15)
                } else {
                    ins.len().max(1)
                };
                return Err(TranslateError::Invalid {
                    pc: ip,
                    len,
                    bytes: bytes_at(code, pc, ip, len),
                });
            }
            end = End::Before(ip);
            break;
        }
        if unsupported(&ins) {
            if first {
                return Err(TranslateError::Unsupported {
                    pc: ip,
                    len: ins.len(),
                    bytes: bytes_at(code, pc, ip, ins.len()),
                });
            }
            end = End::Before(ip);
            break;
        }
        if ins.code() == Code::Syscall {
            if first {
                e.guest = snapshot;
                return Ok(syscall_block(&mut e, &ins, opts));
            }
            end = End::Before(ip);
            break;
        }
        if (opts.count || tool.is_some()) && is_rep_string(&ins) && !ins.has_op_mask() {
            if first {
                e.guest = snapshot;
                return rep_block(&mut e, &ins, pc, opts, tool);
            }
            end = End::Before(ip);
            break;
        }
        let transfer = !matches!(ins.flow_control(), FlowControl::Next);
        insns.push(Decoded { ins, offs });
        if transfer {
            end = End::Transfer;
            break;
        }
    }

    // Every instruction of a block runs once the block is entered (barring a fault), so
    // the counter may be bumped anywhere in it: at entry if the flags are dead there, else
    // just before the first instruction that overwrites all of them without reading any
    // (one `add`), else at entry with a flag-free sequence.
    e.guest = snapshot;
    let guest_len = insns.last().map_or(0, |d| d.ins.next_ip() - pc);
    e.mark(pc, 0);
    if opts.instrument && tool.is_none() && crate::definedness::enabled() {
        // The runtime's own code runs without definedness steps: say so, for the program's
        // next step (`definedness::catch_up`). mov byte gs:[own_code], 1 (no flags; its
        // byte alone: `ThreadCtx::vbits_need_step`).
        e.buf.extend_from_slice(&[0x65, 0xC6, 0x04, 0x25]);
        e.d32(c::OFF_VBITS_OWN_CODE as u32);
        e.buf.push(1);
    }
    if opts.check {
        e.smc_check(pc, guest_len as usize, flags_dead_at_entry(&insns));
    }
    let mut count_at = None;
    if opts.count {
        if flags_dead_at_entry(&insns) {
            e.count_prologue(insns.len() as u32, true);
        } else if let Some(i) = insns.iter().position(|d| {
            matches!(d.ins.flow_control(), FlowControl::Next)
                && d.ins.rflags_read() & STATUS_FLAGS == 0
                && crate::probe::flags_surely_written(&d.ins) & STATUS_FLAGS == STATUS_FLAGS
        }) {
            count_at = Some(i);
        } else {
            e.count_prologue(insns.len() as u32, false);
        }
    }
    let n = insns.len();
    let mut plan_space = Plan::new(n);
    let mut plan = None;
    let mut live = 0u64;
    // The plan's probes by instruction: those of instruction `i` are
    // `by_insn[starts[i]..starts[i + 1]]` (indices into the plan), in the plan's order.
    let mut by_insn = [0u8; MAX_PROBES];
    let mut starts = [0u16; MAX_INSNS + 1];
    if let Some(tool) = tool {
        plan_for(tool, pc, insns.iter().map(|d| &d.ins), &mut plan_space);
        index_by_insn(&plan_space, &mut by_insn, &mut starts[..n + 1]);
        plan = Some(&plan_space);
        live = crate::probe::flags_live_before(insns.iter().map(|d| &d.ins));
    }
    // Whether no instruction of the block was stepped yet (`Emitter::catch_up_inline`).
    let mut block_entry = true;
    // Whether the instruction before was stepped and cannot leave a slow step due: a fast
    // form that does not move `rsp` (its slow step sets `need_step` to 0; see
    // `definedness::step`).
    let mut after_plain = false;
    let mut continue_after_plain = false;
    // The instructions whose zeroing of the flags' shadow (`FastForm::flags_overwritten`)
    // is dead: the next instruction of the block that touches a flag overwrites them all
    // too, and every one in between has a fast form that touches none. Nothing reads the
    // shadow in between (a slow step of such a form leaves it as it is, a signal handler
    // starts with defined flags), and the overwriting one writes it whichever way it goes:
    // zero on its fast path, its operands' on its slow one. (Not put off to a later
    // instruction instead: had this one gone slow, the interpreter's shadow would be lost.)
    let mut flags_zero_dead = 0u64;
    if tool.is_some() && crate::definedness::enabled() {
        let mut overwritten_next = false;
        for (i, d) in insns.iter().enumerate().rev() {
            match crate::definedness::fast_form(&d.ins) {
                Some(f) if f.flags_overwritten => {
                    if overwritten_next {
                        flags_zero_dead |= 1 << i;
                    }
                    overwritten_next = true;
                }
                Some(f) if !f.flags => {}
                _ => overwritten_next = false,
            }
        }
    }
    // Each instruction's definedness step record (made before the loop, for the look-ahead
    // below), and the instructions whose store of the thread's last `rsp` is dead
    // (`Emitter::last_rsp_dead`).
    let mut recs = [None; MAX_INSNS];
    let mut last_rsp_dead = 0u64;
    if tool.is_some() && crate::definedness::enabled() {
        for (rec, d) in recs.iter_mut().zip(&insns) {
            *rec = crate::probe::definedness_record(&d.ins);
        }
        last_rsp_dead = definedness::last_rsp_dead(
            insns.iter().map(|d| &d.ins).take(MAX_INSNS),
            |i| recs[i].is_some(),
            |i| is_client_request_at(&insns, i),
        );
    }
    // Memory operands that share one span lookup (`definedness::span_shares`).
    let mut span_shares = [[definedness::SpanShare::Own; 2]; MAX_INSNS];
    if tool.is_some() && crate::definedness::enabled() && n > 0 {
        let mut ins = [&insns[0].ins; MAX_INSNS];
        for (slot, d) in ins.iter_mut().zip(&insns) {
            *slot = &d.ins;
        }
        definedness::span_shares(
            &ins[..n.min(MAX_INSNS)],
            |i| crate::definedness::fast_form(&insns[i].ins),
            |i| is_client_request_at(&insns, i),
            &mut span_shares,
        );
    }
    // Which slots of `span_shares` a leading operand filled in this block: one whose
    // instruction got no definedness record (the store is full) leaves its followers on
    // their own lookups.
    let mut span_led = [false; 2];
    // Register and flag proofs (`definedness::Proofs`), and each instruction's definedness
    // slow call (an index into `e.slow`), which leaves the block where a later check
    // relies on its fast path. (Not with instruction counting: its count is per block.)
    let mut proofs = definedness::Proofs::new();
    let proofs_on = !opts.count;
    let mut definedness_slow = [usize::MAX; MAX_INSNS];
    for (i, d) in insns.iter().enumerate() {
        // (A borrow of `rax` carried over the instruction before: the guest's is in the stub.)
        let fix = match e.kept {
            Some((true, _)) => FIX_RAX_IN_STUB | FIX_FLAGS_IN_SLOT,
            Some(_) => FIX_RAX_IN_STUB,
            None => 0,
        };
        e.mark(d.ins.ip(), fix);
        // Carried over: the borrow the definedness inline part keeps, and the one a
        // two-way recent-lines check keeps (`Emitter::check_recent_two_ways`).
        let recent_check = crate::recent_lines::two_ways()
            && plan.as_ref().is_some_and(|p| {
                by_insn[starts[i] as usize..starts[i + 1] as usize]
                    .iter()
                    .any(|&k| matches!(p.probes()[k as usize], Probe::TraceNewLines { .. }))
            });
        let keeps_borrow = crate::definedness::enabled() || recent_check;
        e.carry = (tool.is_some()
            && keeps_borrow
            && i + 1 < n
            && count_at != Some(i + 1)
            && !is_client_request_at(&insns, i))
        .then(|| insns[i + 1].ins.ip())
        .filter(|_| definedness::borrow_may_carry_over(&d.ins));
        e.carry_flags = e.carry.is_some()
            && (recent_check || crate::definedness::enabled())
            && d.ins.rflags_read() == 0
            && d.ins.rflags_modified() == 0;
        e.carry_past_rax = (tool.is_some()
            && crate::definedness::enabled()
            && e.carry.is_none()
            && i + 1 < n
            && count_at != Some(i + 1)
            && !is_client_request_at(&insns, i)
            && definedness::flags_carry_past(&d.ins))
        .then(|| insns[i + 1].ins.ip());
        e.drop_rax = tool.is_some()
            && crate::definedness::enabled()
            && !is_client_request_at(&insns, i)
            && definedness::overwrites_rax(&d.ins);
        if count_at == Some(i) {
            e.settle();
            e.count_prologue(n as u32, true);
            e.mark(d.ins.ip(), 0);
        }
        if tool.is_some() && crate::definedness::enabled() {
            let rec = recs.get(i).copied().flatten();
            e.last_rsp_dead = last_rsp_dead & (1 << i) != 0;
            let mut shares = span_shares.get(i).copied().unwrap_or_default();
            for share in &mut shares {
                match *share {
                    definedness::SpanShare::Lead { slot, .. } => {
                        span_led[slot as usize] = rec.is_some()
                    }
                    definedness::SpanShare::Follow { slot } if !span_led[slot as usize] => {
                        *share = definedness::SpanShare::Own
                    }
                    _ => {}
                }
            }
            if let Some(rec) = rec {
                let form = crate::definedness::fast_form(&d.ins);
                match &form {
                    Some(form) => {
                        let skip = if proofs_on {
                            proofs.skip(i, form)
                        } else {
                            definedness::Skip::default()
                        };
                        let slow_at = e.slow.len();
                        e.definedness_fast(
                            d.ins.ip(),
                            rec,
                            form,
                            live & (1 << i) != 0,
                            block_entry,
                            after_plain,
                            true,
                            flags_zero_dead & (1 << i) != 0,
                            shares,
                            skip,
                        )?;
                        e.last_rsp_dead = false;
                        if e.slow.len() > slow_at {
                            definedness_slow[i] = slow_at;
                        }
                        if block_entry {
                            // The first step of a block proves nothing: its slow call
                            // must return into the block, or a side exit to its own pc
                            // would come back to the same step forever.
                            proofs.forget();
                        } else {
                            proofs.after(
                                i,
                                form,
                                definedness::gprs_written(&d.ins),
                                flags_zero_dead & (1 << i) != 0,
                                skip,
                            );
                        }
                    }
                    None => {
                        e.clean_call(d.ins.ip(), rec);
                        proofs.forget();
                    }
                }
                block_entry = false;
                after_plain = form.is_some() && !crate::definedness::writes_rsp(&d.ins);
                continue_after_plain = true;
            } else {
                proofs.forget();
            }
        }
        if !core::mem::take(&mut continue_after_plain) {
            after_plain = false;
        }
        if let Some(p) = &plan {
            // A block's indexed count and its code-lines check share one borrow of `rax`
            // (and of the flags).
            let here = || {
                by_insn[starts[i] as usize..starts[i + 1] as usize]
                    .iter()
                    .map(|&k| &p.probes()[k as usize])
            };
            let block_check = here().any(|r| matches!(r, Probe::TraceBlockNewLines { .. }));
            let merged_count = here().find_map(|r| match *r {
                Probe::CountIndexed { index, n, .. } if block_check => Some((index, n)),
                _ => None,
            });
            let mut merged_skipped = false;
            // The code-lines check keeps its borrow for a recent-lines access check after it.
            let access_check = here().any(|r| matches!(r, Probe::TraceNewLines { .. }));
            for r in here() {
                // The indexed count emitted with the block's check emits nothing here.
                let merged = !merged_skipped
                    && matches!(*r, Probe::CountIndexed { index, n, .. }
                        if merged_count == Some((index, n)));
                // A borrow the definedness inline part kept goes to the access check only;
                // the code-lines check's, and the previous instruction's recent-lines
                // check's carried over this one, to the recent-lines check (past the
                // merged count: giving the borrow back there cost a return and a borrow,
                // eight instructions with live flags, at every entry of a block whose first
                // instruction touches memory).
                let takes_kept = match r {
                    Probe::AccessesFiltered { .. } | Probe::AccessesFilteredOrBelowSp { .. } => {
                        true
                    }
                    Probe::TraceNewLines { .. } => true,
                    _ => merged,
                };
                if !takes_kept {
                    e.settle();
                }
                match *r {
                    Probe::TraceBlockNewLines { tag, len } => {
                        let live = live & (1 << i) != 0;
                        e.trace_block_new_lines(
                            d.ins.ip(),
                            tag,
                            len,
                            live,
                            merged_count,
                            access_check,
                        );
                    }
                    Probe::CountIndexed { .. } if merged => {
                        merged_skipped = true; // emitted with the block's check
                    }
                    _ => e.probe(r, &d.ins, live & (1 << i) != 0)?,
                }
            }
        }
        e.carry_borrow(d.ins.ip());
        // Client requests: with a tool, in the program's code (never the embedder's own);
        // without one, the engine still answers RUNNING_ON_VALGRIND.
        if (tool.is_some() || !opts.instrument) && is_client_request_at(&insns, i) {
            if let Some(rec) = crate::probe::client_request_record(&d.ins) {
                e.clean_call(d.ins.ip(), rec);
            }
            proofs.forget();
        }
        let last = i + 1 == n;
        if last && matches!(end, End::Transfer) {
            e.transfer(d)?;
        } else {
            e.copy(d)?;
        }
        if !definedness::leaves_rax(&d.ins) {
            e.stub_has_rax = false;
        }
        e.carried_over(d.ins.ip());
    }
    e.settle();
    match end {
        End::Before(next) | End::Limit(next) => {
            e.mark(next, 0);
            e.stub_jump(next)
        }
        End::Transfer => {}
    }
    for (i, &at) in definedness_slow[..n].iter().enumerate() {
        if proofs.exits & (1 << i) != 0 && at != usize::MAX {
            e.slow[at].exit = true;
        }
    }
    e.finish();
    Ok(Translation {
        bytes: e.buf,
        stubs: e.stubs,
        kind: BlockKind::Normal,
        insns: n,
        guest_len,
        pcmap: core::mem::take(&mut e.pcmap),
    })
}

/// Describes `block` to the tool and puts its plan in `plan` (empty, made for the block's
/// length). Block records go first: whatever else the tool asks for before the first
/// instruction, the record says the block began.
///
/// Nothing here is sized for the largest block and then filled: the descriptions and
/// plans are left uninitialised past what the block uses (initialising the 64 `Insn`s
/// and two 256-probe plans of every translation, and copying them about, was
/// ~0.1 of `python3 -c 'print(1)'`'s start-up under DHAT).
fn plan_for<'a>(
    client: Client,
    pc: u64,
    block: impl ExactSizeIterator<Item = &'a Instruction>,
    plan: &mut Plan,
) {
    use core::mem::MaybeUninit;
    let mut described = [const { MaybeUninit::<Insn>::uninit() }; MAX_INSNS];
    let n = block.len().min(MAX_INSNS);
    crate::probe::with_factory(|f| {
        for (slot, ins) in described.iter_mut().zip(block) {
            slot.write(crate::describe::describe(ins, f));
        }
    });
    // SAFETY: the loop above wrote the first `n` (the iterator's exact length, at most
    // MAX_INSNS); `MaybeUninit<Insn>` has `Insn`'s layout.
    let described = unsafe { &*(&described[..n] as *const [MaybeUninit<Insn>] as *const [Insn]) };
    let mut asked = Plan::new(n);
    client.tool.instrument(pc, described, &mut asked);
    let trace = crate::trace::enabled();
    for p in asked.probes() {
        if matches!(
            p,
            Probe::TraceBlock { .. } | Probe::TraceBlockNewLines { .. }
        ) && trace
        {
            plan.push_probe(*p);
        }
    }
    for p in asked.probes() {
        match p {
            Probe::TraceBlock { .. } | Probe::TraceBlockNewLines { .. } => {}
            // Without buffers (the tool did not declare `Needs::trace`) there is nowhere to
            // append to.
            Probe::TraceAccesses { .. } | Probe::TraceNewLines { .. } if !trace => {}
            _ => {
                plan.push_probe(*p);
            }
        }
    }
}

/// Orders `plan`'s probes by instruction, keeping the plan's order among one instruction's
/// (a counting sort): instruction `i`'s are `by_insn[starts[i]..starts[i + 1]]`, for
/// `starts` one longer than the block. Asking every probe of the plan at every instruction
/// was a pass over up to 256 probes per instruction.
fn index_by_insn(plan: &Plan, by_insn: &mut [u8; MAX_PROBES], starts: &mut [u16]) {
    let insns = starts.len() - 1;
    starts.fill(0);
    for p in plan.probes() {
        // `Plan::push_probe` refuses a probe beyond the block.
        starts[p.at() + 1] += 1;
    }
    for i in 0..insns {
        starts[i + 1] += starts[i];
    }
    let mut next = [0u16; MAX_INSNS];
    next[..insns].copy_from_slice(&starts[..insns]);
    for (k, p) in plan.probes().iter().enumerate() {
        let slot = &mut next[p.at()];
        by_insn[*slot as usize] = k as u8;
        *slot += 1;
    }
}

/// Whether instruction `i` is the `xchg rbx, rbx` of a client request.
fn is_client_request_at(insns: &[Decoded], i: usize) -> bool {
    if i < 4 {
        return false;
    }
    let mut w = [Instruction::default(); 5];
    for (k, slot) in w.iter_mut().enumerate() {
        *slot = insns[i - 4 + k].ins;
    }
    crate::describe::is_client_request(&w, 4)
}

/// Whether the arithmetic flags are overwritten before being read in the block (so the
/// counter update at entry may clobber them).
fn flags_dead_at_entry(insns: &[Decoded]) -> bool {
    let mut written = 0u32;
    for d in insns {
        if d.ins.rflags_read() & STATUS_FLAGS & !written != 0 {
            return false;
        }
        // Transfers leave the block: what follows may read the flags.
        if !matches!(d.ins.flow_control(), FlowControl::Next) {
            return false;
        }
        written |= crate::probe::flags_surely_written(&d.ins) & STATUS_FLAGS;
        if written == STATUS_FLAGS {
            return true;
        }
    }
    false
}

struct Emitter {
    buf: Vec<u8>,
    base: u64,
    /// Instructions are counted (`Options::count`).
    count: bool,
    /// Stubs by index; offsets are filled in by `finish`.
    stubs: Vec<Stub>,
    /// (position of a rel32 in buf, stub index) to patch once stubs are placed.
    fixups: Vec<(usize, usize)>,
    /// Snapshot of the guest bytes from `guest_pc` that the block is made of.
    guest: Vec<u8>,
    guest_pc: u64,
    /// Entry check in this block, completed by `finish`.
    check: Option<Check>,
    pcmap: Vec<PcMapEntry>,
    /// Out-of-line clean calls of filtered access probes, placed by `finish`.
    slow: Vec<SlowCall>,
    /// Out-of-line upper halves of below-the-stack-pointer compares, placed by `finish`.
    above_sp: Vec<AboveSp>,
    /// Out-of-line thunks of new-stack markings that straddle two shadow spans
    /// (definedness's stack-split routine), placed by `finish`.
    stack_split: Vec<definedness::StackSplit>,
    /// Out-of-line exact addressability checks behind the one wide inline compare,
    /// placed by `finish`.
    exact_a: Vec<ExactA>,
    /// Out-of-line register-to-shadow copies of store copies whose register is not all
    /// defined (`Emitter::store_copy`), placed by `finish`.
    store_copies: Vec<definedness::StoreCopyCold>,
    /// Out-of-line rest of the recent-lines checks of one-operand instructions, placed by
    /// `finish` (see `Emitter::append_unless_recent_two_ways`).
    recent_cold: Vec<probes::RecentCold>,
    /// The same for blocks' code-lines checks (`Emitter::trace_block_new_lines_two_ways`).
    block_cold: Vec<probes::BlockCold>,
    /// Out-of-line parts of filtered trace probes with inline tests
    /// (`Emitter::trace_check_inline`), placed by `finish`.
    trace_cold: Vec<probes::TraceCold>,
    /// `rax` (and the guest flags, when the flag is true) are still borrowed from the
    /// inline part just emitted for the guest instruction at the pc (see
    /// [`Emitter::keep_borrow`]): the next [`Emitter::borrow_rax`] with the same flags
    /// takes them over instead of a return and a borrow back to back; anything else must
    /// [`Emitter::settle`] first.
    kept: Option<(bool, u64)>,
    /// While the inline parts of a guest instruction are emitted: the next instruction's
    /// pc when a borrow of `rax` alone may be carried over this one's copy to the next
    /// one's inline part (`Emitter::carry_borrow`), else `None`.
    carry: Option<u64>,
    /// With `carry`: the instruction neither reads nor writes any flag, so a borrow of
    /// `rax` and the flags together may be carried over it (a recent-lines check's, and
    /// Memcheck's inline parts': consecutive checked instructions with live flags, such
    /// as the `pop`s before a `ret`, then save and restore the flags once for all).
    carry_flags: bool,
    /// Memcheck, where `carry` is `None`: the next instruction's pc when the instruction is
    /// a plain move that uses `rax` but touches no flag (`definedness::flags_carry_past`),
    /// so that a borrow of `rax` and the live flags kept up to its copy gives only `rax`
    /// back around the copy and is kept again after it (`Emitter::carry_borrow`).
    carry_past_rax: Option<u64>,
    /// While the inline parts of a guest instruction are emitted: the instruction writes
    /// all of `rax` and reads none of it, so a borrow kept up to its copy ends there
    /// without giving `rax` back (`Emitter::carry_borrow`; `definedness::overwrites_rax`).
    drop_rax: bool,
    /// The stub slot holds the guest `rax` on every path to here (a borrow stored it, or a
    /// return loaded `rax` from it, and no copy since wrote any part of `rax`:
    /// [`definedness::leaves_rax`]): the next inline borrow needs no store
    /// (`Emitter::borrow_rax`; `mov gs:[stub], rax` after a return and the copy of an
    /// instruction that only reads `rax`, a third of xz's borrows). Cleared by copies that
    /// may write `rax`, clean calls and native gates. A signal handler run at a boundary
    /// in between finds the slot restored on its return, holding the `rax` it returns with
    /// (`signals::sigreturn_tramp`).
    stub_has_rax: bool,
    /// The length of `buf` at which the host `rax` holds the guest `rax` on every path
    /// (`usize::MAX`: none): right after a borrow's store (`mov gs:[stub], rax`), a return's
    /// load, or a borrow that needed no store at a guest boundary, and kept across the
    /// register and flags compares of a fast form, which write no `rax` and whose jumps
    /// leave for the slow call. An operand address computed right there needs no reload of
    /// the guest `rax` (`Emitter::effective_address`: `mov rax, gs:[stub]` after
    /// `mov gs:[stub], rax; cmp gs:[shadow of r], 0; jne slow`). Any other emission leaves
    /// `buf` longer, which ends it by itself; a slow call's return point that a thunk
    /// borrowing anew reaches (`Emitter::keep_borrow`) ends it explicitly.
    rax_guest_at: usize,
    /// While the fast form of a guest instruction that moves `rsp` is emitted: its store
    /// of the thread's last `rsp` is left out, a later one of the same block overwriting
    /// it before anything can read it (`definedness::last_rsp_dead`).
    last_rsp_dead: bool,
    /// The slow calls (indices into `slow`) whose inline part kept its borrow: they return
    /// through a thunk that borrows again (`finish_slow_calls`).
    reborrow: Vec<usize>,
    /// The slow calls whose inline part borrowed nothing: they save the guest `rax` first.
    unborrowed: Vec<usize>,
    /// The slow calls whose inline part had `rcx` borrowed (in `vbits_saved_rcx`): they
    /// give it back first.
    rcx_lent: Vec<usize>,
}

/// Most conditional jumps to one out-of-line call (definedness's fast path: the state
/// checks, the registers read, the flags, a compare per 8 shadow bytes of vector
/// registers and memory operands; `definedness::fast_form` keeps within it).
const MAX_SLOW_JUMPS: usize = 64;

/// The out-of-line half of a filtered access probe (see `Emitter::filtered_call`) or of
/// definedness's fast path (`definedness`).
struct SlowCall {
    /// Positions of the rel32 of each `jne slow` of the inline check.
    jumps: [usize; MAX_SLOW_JUMPS],
    njumps: usize,
    rec: u64,
    flags_live: bool,
    /// Where the call returns: the probed instruction, guest state exact.
    back: usize,
    ip: u64,
    /// An access probe's call, which the embedder's own work skips (`ThreadCtx::own_work`).
    skipped_in_own_work: bool,
    /// A definedness step whose block relies on its fast path later (`definedness::Proofs`):
    /// the call returns not to `back` but to a side exit to the instruction's own pc
    /// (`Emitter::exit_thunk`).
    exit: bool,
    /// Slots of `gs:[vbits_span]` (a bit each) that the call clears first: those of the
    /// sharings this instruction leads (`definedness::SpanShare::Lead`), which its fast
    /// path fills; cleared, they send the operands that follow to their slow calls.
    clears_span: u8,
}

impl SlowCall {
    /// The slow call of the instruction at `ip` (probe record `rec`), no jump to it yet.
    fn new(ip: u64, rec: u64, flags_live: bool, skipped_in_own_work: bool) -> SlowCall {
        SlowCall {
            jumps: [0; MAX_SLOW_JUMPS],
            njumps: 0,
            rec,
            flags_live,
            back: 0,
            ip,
            skipped_in_own_work,
            exit: false,
            clears_span: 0,
        }
    }

    /// A slow call reached by one jump (rel32 at `jump`), returning to `back`.
    fn one_jump(ip: u64, rec: u64, flags_live: bool, back: usize, jump: usize) -> SlowCall {
        let mut slow = SlowCall::new(ip, rec, flags_live, false);
        slow.back = back;
        slow.jumps[0] = jump;
        slow.njumps = 1;
        slow
    }

    /// Records a jump to the call, its rel32 at `at`; an error when the call already has
    /// [`MAX_SLOW_JUMPS`].
    fn add_jump(&mut self, at: usize) -> Result<(), TranslateError> {
        if self.njumps == self.jumps.len() {
            return Err(TranslateError::Encode { pc: self.ip });
        }
        self.jumps[self.njumps] = at;
        self.njumps += 1;
        Ok(())
    }
}

/// The out-of-line half of a below-the-stack-pointer compare (`Emitter::shadow_checks`):
/// an operand at or above `rsp - depth` leaves the inline path for the check against
/// `rsp - RED_ZONE`.
struct AboveSp {
    /// Position of the rel32 of the inline `jae`.
    jump: usize,
    /// Where the inline path continues (`rax` = the operand's address + `depth` again).
    resume: usize,
    depth: u32,
    /// The filtered probe's slow call (index into `Emitter::slow`).
    slow: usize,
    ip: u64,
}

/// The out-of-line exact half of a filtered probe's addressability check
/// (`Emitter::shadow_checks`): the inline part compares, in one read, every granule an
/// operand of its size could touch from where it starts (up to 7 granules more than it
/// does); when one of them is not 0, this checks the granules it does touch, in ASan's
/// encoding (`Emitter::exact_a_checks`), each into the slow call, and goes back.
struct ExactA {
    /// Position of the rel32 of the inline `jne`.
    jump: usize,
    /// Where the inline path continues.
    resume: usize,
    m: iced_x86::UsedMemory,
    /// The filtered probe's slow call (index into `Emitter::slow`).
    slow: usize,
    ip: u64,
}

/// `gs:[disp32]` ModRM/SIB bytes for register field `reg` (low 3 bits).
fn gs_modrm(reg: u8) -> [u8; 2] {
    [((reg & 7) << 3) | 0x04, 0x25]
}

impl Emitter {
    /// An emitter for code placed at host address `base`, translating from guest `pc`
    /// (`count`: [`Options::count`]).
    fn new(pc: u64, base: u64, count: bool) -> Emitter {
        Emitter {
            buf: Vec::with_capacity(512),
            base,
            count,
            stubs: Vec::new(),
            fixups: Vec::new(),
            guest: Vec::new(),
            guest_pc: pc,
            check: None,
            // Sized like `buf` (see `ALLOC_NOTE`): engine allocations during a translation
            // stay in the heap size classes the translator has always used.
            pcmap: Vec::with_capacity(32),
            slow: Vec::new(),
            above_sp: Vec::new(),
            stack_split: Vec::new(),
            exact_a: Vec::new(),
            store_copies: Vec::new(),
            recent_cold: Vec::new(),
            block_cold: Vec::new(),
            trace_cold: Vec::new(),
            kept: None,
            carry: None,
            carry_flags: false,
            carry_past_rax: None,
            drop_rax: false,
            stub_has_rax: false,
            rax_guest_at: usize::MAX,
            last_rsp_dead: false,
            reborrow: Vec::new(),
            unborrowed: Vec::new(),
            rcx_lent: Vec::new(),
        }
    }

    fn here(&self) -> u64 {
        self.base + self.buf.len() as u64
    }

    /// From here on, the host code stands for the guest instruction at `ip` (with fix-ups).
    fn mark(&mut self, ip: u64, fix: u16) {
        self.push_map(ip, fix);
    }

    /// From here on, the host code has no guest equivalent.
    fn unmark(&mut self) {
        self.push_map(UNMAPPED, 0);
    }

    fn push_map(&mut self, guest: u64, fix: u16) {
        self.push_map_at(self.buf.len(), guest, fix);
    }

    fn push_map_at(&mut self, host_off: usize, guest: u64, fix: u16) {
        let host_off = host_off.min(u16::MAX as usize) as u16;
        let e = PcMapEntry {
            host_off,
            fix,
            guest,
        };
        match self.pcmap.last_mut() {
            Some(last) if last.host_off == host_off => *last = e,
            // Same guest state again: still a new entry, its start is a boundary (a signal
            // there may simply continue at the host pc).
            _ => self.pcmap.push(e),
        }
    }

    fn d32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// mov gs:[off], r64 (r < 8)
    /// Ends a block of no guest instruction (a redirection, the `run_native` gate) with a
    /// jump to `to`; `guest_len` is the guest range it stands for.
    fn jump_only(mut self, to: u64, guest_len: u64) -> Translation {
        self.stub_jump(to);
        self.finish();
        Translation {
            bytes: self.buf,
            stubs: self.stubs,
            kind: BlockKind::Normal,
            insns: 0,
            guest_len,
            pcmap: self.pcmap,
        }
    }

    fn store_gs(&mut self, reg: u8, off: usize) {
        let rex = if reg >= 8 { 0x4C } else { 0x48 };
        self.buf.extend_from_slice(&[0x65, rex, 0x89]);
        self.buf.extend_from_slice(&gs_modrm(reg));
        self.d32(off as u32);
    }

    /// mov r64, gs:[off]
    fn load_gs(&mut self, reg: u8, off: usize) {
        let rex = if reg >= 8 { 0x4C } else { 0x48 };
        self.buf.extend_from_slice(&[0x65, rex, 0x8B]);
        self.buf.extend_from_slice(&gs_modrm(reg));
        self.d32(off as u32);
    }

    /// jmp qword ptr gs:[off]
    fn jmp_gs(&mut self, off: usize) {
        self.buf.extend_from_slice(&[0x65, 0xFF, 0x24, 0x25]);
        self.d32(off as u32);
    }

    /// Adds the block's `n` instructions to the thread's count, to the word its guest
    /// address picks (`context::count_lane_off`).
    fn count_prologue(&mut self, n: u32, flags_dead: bool) {
        if crate::asm::count_routine(self.guest_pc) {
            return;
        }
        let off = c::count_lane_off(self.guest_pc);
        if flags_dead {
            // add qword ptr gs:[count], n
            self.buf.extend_from_slice(&[0x65, 0x48, 0x81, 0x04, 0x25]);
            self.d32(off as u32);
            self.d32(n);
        } else {
            // Flag-free: mov/lea only.
            self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
            self.load_gs(0, off);
            self.buf.extend_from_slice(&[0x48, 0x8D, 0x80]);
            self.d32(n);
            self.store_gs(0, off);
            self.load_gs(0, c::scratch_off(c::S_STUB_RAX));
        }
    }

    /// Adds `rcx + 1` to the count word at `off`, flag-free (a `rep` instruction run
    /// whole: see `special::rep_block`).
    fn count_rep(&mut self, off: usize) {
        self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.load_gs(0, off);
        // lea rax, [rax + rcx + 1]
        self.buf.extend_from_slice(&[0x48, 0x8D, 0x44, 0x08, 0x01]);
        self.store_gs(0, off);
        self.load_gs(0, c::scratch_off(c::S_STUB_RAX));
    }

    /// mov r64, imm64
    fn mov_imm64(&mut self, reg: u8, v: u64) {
        let rex = if reg >= 8 { 0x49 } else { 0x48 };
        self.buf.extend_from_slice(&[rex, 0xB8 + (reg & 7)]);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};

    fn decode_all(bytes: &[u8], ip: u64) -> Vec<Instruction> {
        let mut d = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
        let mut v = Vec::new();
        while d.can_decode() {
            v.push(d.decode());
        }
        v
    }

    /// Guest code lives in a heap buffer (mapped, readable): enough for the translator.
    fn guest(code: &[u8]) -> (Vec<u8>, u64) {
        let mut buf = code.to_vec();
        buf.resize(64, 0xCC);
        let pc = buf.as_ptr() as u64;
        (buf, pc)
    }

    const OPTS: Options = Options {
        count: false,
        check: false,
        instrument: false,
        syscall_returns: false,
    };

    #[test]
    fn rip_relative_operand_points_at_the_same_guest_address_from_the_cache() {
        // mov rax, [rip+0x100]; ret
        let (_buf, pc) = guest(&[0x48, 0x8B, 0x05, 0x00, 0x01, 0x00, 0x00, 0xC3]);
        let base = pc + 0x10_0000;
        let t = translate(pc, base, OPTS).unwrap();
        let insns = decode_all(&t.bytes, base);
        assert_eq!(insns[0].mnemonic(), Mnemonic::Mov);
        assert!(insns[0].is_ip_rel_memory_operand());
        assert_eq!(insns[0].ip_rel_memory_address(), pc + 7 + 0x100);
        assert_eq!(t.bytes.len() % 16, 0);
    }

    #[test]
    fn far_rip_relative_operand_goes_through_a_spilled_scratch_register() {
        let (_buf, pc) = guest(&[0x48, 0x8B, 0x05, 0x00, 0x01, 0x00, 0x00, 0xC3]);
        let base = pc.wrapping_add(0x100_0000_0000); // 1 TiB away
        let t = translate(pc, base, OPTS).unwrap();
        let insns = decode_all(&t.bytes, base);
        // mov gs:[far_save], rcx; mov rcx, target; mov rax, [rcx]; mov rcx, gs:[far_save]
        assert_eq!(insns[0].segment_prefix(), Register::GS);
        assert_eq!(insns[0].op1_register(), Register::RCX);
        assert_eq!(insns[1].op0_register(), Register::RCX);
        assert_eq!(insns[1].immediate64(), pc + 7 + 0x100);
        assert_eq!(insns[2].memory_base(), Register::RCX);
        assert_eq!(insns[2].op0_register(), Register::RAX);
        assert_eq!(insns[3].op0_register(), Register::RCX);
        assert_eq!(
            insns[3].memory_displacement64(),
            c::scratch_off(c::S_FAR_SAVE) as u64
        );
    }

    #[test]
    fn call_pushes_the_guest_return_address_and_exits_to_the_callee() {
        // call +0x20
        let (_buf, pc) = guest(&[0xE8, 0x20, 0x00, 0x00, 0x00]);
        let t = translate(pc, pc + 0x1000, OPTS).unwrap();
        let insns = decode_all(&t.bytes, pc + 0x1000);
        if (pc + 5) >> 31 == 0 {
            assert_eq!(insns[0].mnemonic(), Mnemonic::Push);
            assert_eq!(insns[0].immediate32(), (pc + 5) as u32);
        } else {
            assert_eq!(insns[1].immediate64(), pc + 5);
            assert_eq!(insns[2].mnemonic(), Mnemonic::Push);
            assert_eq!(insns[2].op0_register(), Register::RCX);
        }
        assert_eq!(t.stubs.len(), 1);
        assert_eq!(t.stubs[0].target, pc + 5 + 0x20);
    }

    #[test]
    fn block_ends_before_a_syscall_which_gets_a_block_of_its_own() {
        // mov eax, 39; syscall; ret
        let (_buf, pc) = guest(&[0xB8, 0x27, 0x00, 0x00, 0x00, 0x0F, 0x05, 0xC3]);
        let t = translate(pc, pc + 0x1000, OPTS).unwrap();
        assert_eq!(t.kind, BlockKind::Normal);
        assert_eq!(t.insns, 1);
        assert_eq!(t.stubs.len(), 1);
        assert_eq!(t.stubs[0].target, pc + 5);
        let s = translate(pc + 5, pc + 0x2000, OPTS).unwrap();
        assert_eq!(s.kind, BlockKind::Syscall);
        assert_eq!(&s.bytes[..2], &[0x0F, 0x05]);
        assert_eq!(s.stubs[0].target, pc + 7);
        // EMFILE comes back to the call itself (`dispatch::syscall_returned`): the jrcxz
        // after the call lands on the store that says so, then the jump to that stub,
        // whatever padding aligns the jumps.
        assert_eq!(s.stubs[1].target, pc + 5);
        let host = 0x10_0000u64;
        let mut d = Decoder::with_ip(64, &s.bytes, host, DecoderOptions::NONE);
        let insns: Vec<Instruction> = (0..10).map(|_| d.decode()).collect();
        let jrcxz = insns
            .iter()
            .find(|i| i.mnemonic() == Mnemonic::Jrcxz)
            .unwrap();
        let at = insns
            .iter()
            .position(|i| i.ip() == jrcxz.near_branch_target())
            .expect("jrcxz lands on an instruction boundary");
        assert_returns_to(&insns[at..], host + s.stubs[1].offset as u64);
        assert_way_back_is_no_guest_boundary(&s, 1);
        assert_call_returns_at_the_next_instruction(&s, pc + 7);
    }

    /// The host pc right after the `syscall` stands for the guest instruction after it (a
    /// boundary, no fix-ups): a signal that ends the call is delivered there at once, with
    /// the mask the call had (`special::syscall_block`).
    fn assert_call_returns_at_the_next_instruction(t: &Translation, next: u64) {
        let after = t.bytes.windows(2).position(|w| w == [0x0F, 0x05]).unwrap() + 2;
        let e = t
            .pcmap
            .iter()
            .find(|m| m.host_off as usize == after)
            .unwrap_or_else(|| panic!("no entry at {after}: {:?}", t.pcmap));
        assert_eq!((e.guest, e.fix), (next, 0), "{:?}", t.pcmap);
    }

    /// `insns` begin with the store of `S_CALL_RETURNED` and a jump to `stub`.
    fn assert_returns_to(insns: &[Instruction], stub: u64) {
        assert_eq!(insns[0].mnemonic(), Mnemonic::Mov);
        assert_eq!(insns[0].segment_prefix(), Register::GS);
        assert_eq!(
            insns[0].memory_displacement64(),
            c::scratch_off(c::S_CALL_RETURNED) as u64
        );
        assert_eq!(insns[0].immediate32(), 1);
        let jump = insns[1..]
            .iter()
            .find(|i| i.mnemonic() != Mnemonic::Nop)
            .unwrap();
        assert_eq!(jump.mnemonic(), Mnemonic::Jmp);
        assert_eq!(
            jump.near_branch_target(),
            stub,
            "to the stub back to the call"
        );
    }

    /// A signal that ends the call is stepped on into the dispatcher: the stub back to
    /// the call maps to no guest pc.
    fn assert_way_back_is_no_guest_boundary(t: &Translation, stub: usize) {
        let off = t.stubs[stub].offset;
        let within: Vec<_> = t
            .pcmap
            .iter()
            .filter(|m| (off..off + STUB_SIZE).contains(&(m.host_off as usize)))
            .collect();
        assert!(!within.is_empty());
        assert!(within.iter().all(|m| m.guest == UNMAPPED), "{within:?}");
    }

    #[test]
    fn with_syscall_returns_every_call_comes_back_to_the_dispatcher() {
        // syscall; ret
        let (_buf, pc) = guest(&[0x0F, 0x05, 0xC3]);
        let opts = Options {
            syscall_returns: true,
            ..OPTS
        };
        let s = translate(pc, pc + 0x2000, opts).unwrap();
        assert_eq!(s.kind, BlockKind::Syscall);
        // No way on to the next instruction but through the dispatcher.
        assert_eq!(s.stubs.len(), 1);
        assert_eq!(s.stubs[0].target, pc);
        let host = 0x10_0000u64;
        let mut d = Decoder::with_ip(64, &s.bytes, host, DecoderOptions::NONE);
        let insns: Vec<Instruction> = (0..6).map(|_| d.decode()).collect();
        assert_eq!(insns[0].mnemonic(), Mnemonic::Syscall);
        assert_returns_to(&insns[1..], host + s.stubs[0].offset as u64);
        assert_way_back_is_no_guest_boundary(&s, 0);
        assert_call_returns_at_the_next_instruction(&s, pc + 2);
    }

    #[test]
    fn counting_mode_turns_repe_cmpsb_into_a_self_loop_counted_per_iteration() {
        let (_buf, pc) = guest(&[0xF3, 0xA6, 0xC3]); // repe cmpsb; ret
        let t = translate(
            pc,
            pc + 0x1000,
            Options {
                count: true,
                check: false,
                instrument: false,
                syscall_returns: false,
            },
        )
        .unwrap();
        let insns = decode_all(&t.bytes, pc + 0x1000);
        assert!(insns.iter().any(|i| i.mnemonic() == Mnemonic::Jrcxz));
        let cmps = insns
            .iter()
            .find(|i| i.mnemonic() == Mnemonic::Cmpsb)
            .unwrap();
        assert!(!cmps.has_repe_prefix());
        let targets: Vec<u64> = t.stubs.iter().map(|s| s.target).collect();
        assert!(targets.contains(&pc) && targets.contains(&(pc + 2)));
    }

    #[test]
    fn counting_mode_runs_rep_stosb_whole_counting_rcx_plus_one() {
        let (_buf, pc) = guest(&[0xF3, 0xAA, 0xC3]); // rep stosb; ret
        let t = translate(
            pc,
            pc + 0x1000,
            Options {
                count: true,
                check: false,
                instrument: false,
                syscall_returns: false,
            },
        )
        .unwrap();
        let insns = decode_all(&t.bytes, pc + 0x1000);
        let lea = insns
            .iter()
            .find(|i| i.mnemonic() == Mnemonic::Lea)
            .unwrap();
        assert_eq!(
            (
                lea.memory_base(),
                lea.memory_index(),
                lea.memory_displacement64()
            ),
            (Register::RAX, Register::RCX, 1)
        );
        let stos = insns
            .iter()
            .find(|i| i.mnemonic() == Mnemonic::Stosb)
            .unwrap();
        assert!(stos.has_rep_prefix());
        assert!(!insns.iter().any(|i| i.mnemonic() == Mnemonic::Jrcxz));
        let targets: Vec<u64> = t.stubs.iter().map(|s| s.target).collect();
        assert_eq!(targets, [pc + 2]);
    }

    #[test]
    fn counter_is_a_single_add_placed_where_the_flags_are_dead() {
        // setc al; cmp edi, 5; jbe +0x10 -- flags live at entry (setc reads CF), dead
        // before the cmp.
        let (_buf, pc) = guest(&[0x0F, 0x92, 0xC0, 0x83, 0xFF, 0x05, 0x76, 0x10]);
        let t = translate(
            pc,
            pc + 0x1000,
            Options {
                count: true,
                check: false,
                instrument: false,
                syscall_returns: false,
            },
        )
        .unwrap();
        let insns = decode_all(&t.bytes, pc + 0x1000);
        assert_eq!(insns[0].mnemonic(), Mnemonic::Setb);
        assert_eq!(insns[1].mnemonic(), Mnemonic::Add);
        assert_eq!(insns[1].segment_prefix(), Register::GS);
        assert_eq!(insns[1].immediate32(), 3);
        assert_eq!(
            insns[1].memory_displacement64(),
            c::count_lane_off(pc) as u64,
            "the word the block's address picks"
        );
        assert_eq!(insns[2].mnemonic(), Mnemonic::Cmp);
    }

    #[test]
    fn checked_block_compares_its_guest_bytes_with_a_copy_before_running_them() {
        // adc eax, 1 (reads CF: the flags are live at entry); nop x7; ret
        let code = [
            0x83, 0xD0, 0x01, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0xC3,
        ];
        let (_buf, pc) = guest(&code);
        let opts = Options {
            count: false,
            check: true,
            instrument: false,
            syscall_returns: false,
        };
        let t = translate(pc, pc + 0x1000, opts).unwrap();
        let insns = decode_all(&t.bytes, pc + 0x1000);
        assert_eq!(insns[1].mnemonic(), Mnemonic::Lahf, "flags saved first");
        // Aligned 8-byte loads of the words holding the guest code, each xor-ed with the
        // copy (edge words also masked) and followed by a jnz to the mismatch exit.
        let first = pc & !7;
        let end = (pc + code.len() as u64 + 7) & !7;
        let loads: Vec<u64> = insns
            .iter()
            .take_while(|i| i.mnemonic() != Mnemonic::Adc)
            .filter(|i| i.mnemonic() == Mnemonic::Mov && i.op1_kind() == OpKind::Memory)
            .filter(|i| i.memory_segment() == Register::DS)
            .map(|i| i.memory_displacement64())
            .collect();
        assert_eq!(loads, (first..end).step_by(8).collect::<Vec<u64>>());
        let xors: Vec<&Instruction> = insns
            .iter()
            .take_while(|i| i.mnemonic() != Mnemonic::Adc)
            .filter(|i| i.mnemonic() == Mnemonic::Xor)
            .collect();
        assert_eq!(xors.len(), loads.len());
        let base = pc + 0x1000;
        let copy_at = (xors[0].ip_rel_memory_address() - base) as usize;
        let lead = (pc - first) as usize;
        assert_eq!(copy_at % 8, 0);
        assert_eq!(&t.bytes[copy_at + lead..copy_at + lead + code.len()], &code);
        // Unchecked, the block starts with the guest's own instruction.
        let plain = translate(pc, base, OPTS).unwrap();
        assert_eq!(decode_all(&plain.bytes, base)[0].mnemonic(), Mnemonic::Adc);
    }

    #[test]
    fn pc_map_ties_each_copied_instruction_and_the_ret_pop_to_its_guest_pc() {
        // mov eax, [rdi]; ret
        let (_buf, pc) = guest(&[0x8B, 0x07, 0xC3]);
        let base = pc + 0x1000;
        let t = translate(pc, base, OPTS).unwrap();
        let insns = decode_all(&t.bytes, base);
        let at = |host: u64| {
            let off = (host - base) as u16;
            let i = t.pcmap.partition_point(|e| e.host_off <= off);
            t.pcmap[i - 1]
        };
        let load = insns
            .iter()
            .find(|i| i.mnemonic() == Mnemonic::Mov)
            .unwrap();
        assert_eq!((at(load.ip()).guest, at(load.ip()).fix), (pc, 0));
        let pop = insns
            .iter()
            .find(|i| i.mnemonic() == Mnemonic::Pop)
            .unwrap();
        assert_eq!(
            (at(pop.ip()).guest, at(pop.ip()).fix),
            (pc + 2, FIX_RAX_IN_STUB)
        );
        // The IBL after the pop stands for no guest instruction.
        let ibl = insns
            .iter()
            .find(|i| i.mnemonic() == Mnemonic::Movzx)
            .unwrap();
        assert_eq!(at(ibl.ip()).guest, UNMAPPED);
    }

    #[test]
    fn pc_map_shows_an_exit_stub_as_its_guest_target() {
        // jmp +0x20
        let (_buf, pc) = guest(&[0xEB, 0x20]);
        let base = pc + 0x1000;
        let t = translate(pc, base, OPTS).unwrap();
        let stub = t.stubs[0].offset as u16;
        let i = t.pcmap.partition_point(|e| e.host_off <= stub);
        let e = t.pcmap[i - 1];
        assert_eq!((e.host_off, e.guest, e.fix), (stub, pc + 2 + 0x20, 0));
        let j = t.pcmap.partition_point(|e| e.host_off <= stub + 9);
        assert_eq!(t.pcmap[j - 1].fix, FIX_RAX_IN_STUB);
    }

    #[test]
    fn undecodable_bytes_are_an_error_with_address_and_bytes() {
        let (_buf, pc) = guest(&[0x06]);
        match translate(pc, pc + 0x1000, OPTS) {
            Err(TranslateError::Invalid { pc: at, bytes, .. }) => {
                assert_eq!(at, pc);
                assert_eq!(bytes[0], 0x06);
            }
            other => panic!("expected Invalid, got {:?}", other.map(|t| t.bytes)),
        }
    }
}
