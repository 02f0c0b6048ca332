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
//! Instrumentation (phase 1: instruction counting) is added at block entry. In counting
//! mode `rep`-prefixed string instructions are expanded into a one-iteration loop, so each
//! iteration counts as one instruction, exactly as Valgrind's VEX front end does.
//!
//! The translator never executes anything and never writes the code cache: it returns
//! bytes positioned for a given host address plus the list of exit stubs.

use alloc::vec::Vec;

use iced_x86::{
    Code, ConstantOffsets, Decoder, DecoderError, DecoderOptions, Encoder, FlowControl,
    Instruction, InstructionInfoFactory, OpKind, Register,
};

use crate::context as c;
use crate::probe::Client;
use oxgrind_tool::instrument::{Flow, Insn, Plan, Probe};

mod probes;

/// Maximum guest bytes one block can span (MAX_INSNS instructions of at most 15 bytes).
pub const MAX_GUEST_SPAN: u64 = MAX_INSNS as u64 * 15;

/// Maximum guest instructions in one block.
const MAX_INSNS: usize = 64;

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
    let mapped = page_mapped_syscall(page);
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

fn is_gpr64(r: Register) -> bool {
    r.is_gpr64()
}

/// Whether a `gs:` memory operand can be rewritten: an ordinary (non-transfer)
/// instruction with 64-bit addressing by general registers, not RIP-relative, not the
/// `moffs` forms.
fn gs_rewritable(ins: &Instruction) -> bool {
    matches!(ins.flow_control(), FlowControl::Next)
        && !ins.is_ip_rel_memory_operand()
        && (ins.memory_base() == Register::None || is_gpr64(ins.memory_base()))
        && (ins.memory_index() == Register::None || is_gpr64(ins.memory_index()))
        && !matches!(
            ins.code(),
            Code::Mov_AL_moffs8
                | Code::Mov_AX_moffs16
                | Code::Mov_EAX_moffs32
                | Code::Mov_RAX_moffs64
                | Code::Mov_moffs8_AL
                | Code::Mov_moffs16_AX
                | Code::Mov_moffs32_EAX
                | Code::Mov_moffs64_RAX
        )
}

/// The "translation" of code that cannot run: a jump to it, natively, so that the guest
/// faults exactly as it would without the engine (SIGSEGV at that address, handled or
/// fatal). Used for unmapped and non-executable pages.
pub fn native_jump(pc: u64) -> Translation {
    let mut bytes = Vec::with_capacity(16);
    bytes.extend_from_slice(&[0xFF, 0x25, 0, 0, 0, 0]);
    bytes.extend_from_slice(&pc.to_le_bytes());
    bytes.resize(16, 0xCC);
    Translation {
        bytes,
        stubs: Vec::new(),
        kind: BlockKind::Normal,
        insns: 0,
        guest_len: 1,
        pcmap: Vec::new(),
    }
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
    let avail = readable_len(pc);
    let mut e = Emitter {
        buf: Vec::with_capacity(512),
        base,
        stubs: Vec::new(),
        fixups: Vec::new(),
        guest: Vec::new(),
        guest_pc: pc,
        check: None,
        // Sized like `buf` (see `ALLOC_NOTE`): engine allocations during a translation
        // stay in the heap size classes the translator has always used.
        pcmap: Vec::with_capacity(32),
        slow: Vec::new(),
    };
    if avail == 0 {
        return Ok(native_jump(pc));
    }
    let tool = if opts.instrument {
        crate::probe::client().filter(|c| !c.embedder.is_own_code(pc))
    } else {
        None
    };
    if let Some(to) = tool.and_then(|c| c.embedder.redirect(pc)) {
        e.mark(pc, 0);
        e.stub_jump(to);
        e.finish();
        return Ok(Translation {
            bytes: e.buf,
            stubs: e.stubs,
            kind: BlockKind::Normal,
            insns: 0,
            guest_len: 1,
            pcmap: core::mem::take(&mut e.pcmap),
        });
    }
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
    loop {
        if insns.len() >= MAX_INSNS {
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
                && d.ins.rflags_modified() & STATUS_FLAGS == STATUS_FLAGS
        }) {
            count_at = Some(i);
        } else {
            e.count_prologue(insns.len() as u32, false);
        }
    }
    let n = insns.len();
    let mut plan = None;
    let mut live = 0u64;
    if let Some(tool) = tool {
        let mut block = [Instruction::default(); MAX_INSNS];
        for (slot, d) in block.iter_mut().zip(&insns) {
            *slot = d.ins;
        }
        plan = Some(plan_for(tool, pc, &block[..n]));
        let mut refs: [&Instruction; MAX_INSNS] = [&block[0]; MAX_INSNS];
        for (slot, d) in refs.iter_mut().zip(&insns) {
            *slot = &d.ins;
        }
        live = crate::probe::flags_live_before(&refs[..n]);
    }
    for (i, d) in insns.iter().enumerate() {
        e.mark(d.ins.ip(), 0);
        if count_at == Some(i) {
            e.count_prologue(n as u32, true);
            e.mark(d.ins.ip(), 0);
        }
        if let Some(p) = &plan {
            for r in p.probes().iter().filter(|r| r.at() == i) {
                e.probe(r, &d.ins, live & (1 << i) != 0)?;
            }
            if tool.is_some() && is_client_request_at(&insns, i) {
                if let Some(rec) = crate::probe::client_request_record(&d.ins) {
                    e.clean_call(d.ins.ip(), rec);
                }
            }
        }
        let last = i + 1 == n;
        if last && matches!(end, End::Transfer) {
            e.transfer(d)?;
        } else {
            e.copy(d)?;
        }
    }
    match end {
        End::Before(next) | End::Limit(next) => {
            e.mark(next, 0);
            e.stub_jump(next)
        }
        End::Transfer => {}
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

/// Describes `block` to the tool and takes back its plan. Block records go first: whatever
/// else the tool asks for before the first instruction, the record says the block began.
fn plan_for(client: Client, pc: u64, block: &[Instruction]) -> Plan {
    let mut described = [Insn::new(0, 0, Flow::Next); MAX_INSNS];
    crate::probe::with_factory(|f| {
        for (slot, ins) in described.iter_mut().zip(block) {
            *slot = crate::describe::describe(ins, f);
        }
    });
    let mut asked = Plan::new(block.len());
    client.tool.instrument(pc, &described[..block.len()], &mut asked);
    let mut plan = Plan::new(block.len());
    let trace = crate::trace::enabled();
    for p in asked.probes() {
        if matches!(p, Probe::TraceBlock { .. }) && trace {
            plan.push_probe(*p);
        }
    }
    for p in asked.probes() {
        match p {
            Probe::TraceBlock { .. } => {}
            // Without buffers (the tool did not declare `Needs::trace`) there is nowhere to
            // append to.
            Probe::TraceAccesses { .. } if !trace => {}
            _ => {
                plan.push_probe(*p);
            }
        }
    }
    plan
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
        written |= d.ins.rflags_modified() & STATUS_FLAGS;
        if written == STATUS_FLAGS {
            return true;
        }
    }
    false
}

fn syscall_block(e: &mut Emitter, ins: &Instruction, opts: Options) -> Translation {
    if opts.check {
        e.smc_check(ins.ip(), ins.len(), false);
    }
    if opts.count {
        // The kernel restores the guest flags on return from `syscall`; they are live.
        e.count_prologue(1, false);
    }
    // A signal that restarts the system call (SA_RESTART) shows the pc of the `syscall`
    // itself: that must read as the guest instruction, not engine code.
    e.mark(ins.ip(), 0);
    e.buf.extend_from_slice(&[0x0F, 0x05]);
    e.stub_jump(ins.next_ip());
    e.finish();
    Translation {
        bytes: core::mem::take(&mut e.buf),
        stubs: core::mem::take(&mut e.stubs),
        kind: BlockKind::Syscall,
        insns: 1,
        guest_len: ins.len() as u64,
        pcmap: core::mem::take(&mut e.pcmap),
    }
}

/// One iteration of a `rep` string instruction, looping on itself through its own exit stub,
/// as VEX translates it: every entry (including the final one with `rcx == 0`) counts one.
fn rep_block(
    e: &mut Emitter,
    ins: &Instruction,
    pc: u64,
    opts: Options,
    tool: Option<Client>,
) -> Result<Translation, TranslateError> {
    let plan = match tool {
        Some(t) => plan_for(t, pc, core::slice::from_ref(ins)),
        None => Plan::new(1),
    };
    e.mark(pc, 0);
    if opts.check {
        e.smc_check(pc, ins.len(), false);
    }
    let raw = bytes_at(&e.guest, pc, pc, ins.len());
    let raw = &raw[..ins.len()];
    // Address-size override (ecx-counted) forms are left as they are.
    let prefixes = &raw[..raw.len() - 1];
    // Counter probes run at every entry, the final one with `rcx == 0` included (as the
    // instruction count does); the others only before an iteration that runs.
    let every_entry = |p: &Probe| matches!(p, Probe::Count { .. } | Probe::TraceBlock { .. });
    let counts = |e: &mut Emitter| -> Result<(), TranslateError> {
        for r in plan.probes().iter().filter(|p| every_entry(p)) {
            e.probe(r, ins, true)?;
        }
        Ok(())
    };
    if prefixes.contains(&0x67) {
        counts(e)?;
        if opts.count {
            e.count_prologue(1, false);
        }
        e.mark(pc, 0);
        e.buf.extend_from_slice(raw);
        e.unmark();
        e.stub_jump(ins.next_ip());
        e.finish();
        return Ok(Translation {
            bytes: core::mem::take(&mut e.buf),
            stubs: core::mem::take(&mut e.stubs),
            kind: BlockKind::Normal,
            insns: 1,
            guest_len: ins.len() as u64,
            pcmap: core::mem::take(&mut e.pcmap),
        });
    }
    counts(e)?;
    if opts.count {
        e.count_prologue(1, false);
    }
    e.mark(pc, 0);
    // jrcxz +2; jmp +5; jmp rel32 -> exit(next)
    e.buf.extend_from_slice(&[0xE3, 0x02, 0xEB, 0x05, 0xE9]);
    let exit_fix = e.buf.len();
    e.buf.extend_from_slice(&[0; 4]);
    let exit_stub = e.new_stub(ins.next_ip());
    e.fixups.push((exit_fix, exit_stub));
    e.mark(pc, 0);
    for r in plan.probes().iter().filter(|p| !every_entry(p)) {
        e.probe(r, ins, true)?;
    }
    e.unmark();
    // lea rcx, [rcx-1]
    e.buf.extend_from_slice(&[0x48, 0x8D, 0x49, 0xFF]);
    // A fault in the iteration leaves the guest at the `rep` instruction with rcx counting
    // this iteration too, as natively.
    e.mark(pc, FIX_RCX_PLUS_ONE);
    // The instruction without its rep/repne prefix (REX, if any, stays last).
    for &b in raw {
        if b != 0xF3 && b != 0xF2 {
            e.buf.push(b);
        }
    }
    e.unmark();
    let conditional = matches!(
        ins.mnemonic(),
        iced_x86::Mnemonic::Cmpsb
            | iced_x86::Mnemonic::Cmpsw
            | iced_x86::Mnemonic::Cmpsd
            | iced_x86::Mnemonic::Cmpsq
            | iced_x86::Mnemonic::Scasb
            | iced_x86::Mnemonic::Scasw
            | iced_x86::Mnemonic::Scasd
            | iced_x86::Mnemonic::Scasq
    );
    if conditional {
        // repe: continue while ZF=1 (jz); repne: while ZF=0 (jnz).
        let cc = if ins.has_repne_prefix() { 0x85 } else { 0x84 };
        e.buf.extend_from_slice(&[0x0F, cc]);
        let fix = e.buf.len();
        e.buf.extend_from_slice(&[0; 4]);
        let s = e.new_stub(pc);
        e.fixups.push((fix, s));
        e.stub_jump_existing(exit_stub);
    } else {
        e.stub_jump(pc);
    }
    e.finish();
    Ok(Translation {
        bytes: core::mem::take(&mut e.buf),
        stubs: core::mem::take(&mut e.stubs),
        kind: BlockKind::Normal,
        insns: 1,
        guest_len: ins.len() as u64,
        pcmap: core::mem::take(&mut e.pcmap),
    })
}

struct Emitter {
    buf: Vec<u8>,
    base: u64,
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
}

/// The out-of-line half of a filtered access probe (see `Emitter::filtered_call`).
struct SlowCall {
    /// Positions of the rel32 of each `jne slow` of the inline check.
    jumps: [usize; 2 * crate::probe::MAX_MEM],
    njumps: usize,
    rec: u64,
    flags_live: bool,
    /// Where the call returns: the probed instruction, guest state exact.
    back: usize,
    ip: u64,
}

/// The pieces of an entry check that `finish` places after the stubs.
struct Check {
    pc: u64,
    flags_dead: bool,
    /// Copy words, then mask words (8-byte aligned once placed).
    data: Vec<u8>,
    /// (position of a rel32 `cmp` displacement, offset into the guest copy).
    data_refs: Vec<(usize, usize)>,
    /// Positions of the rel32 of each `jne mismatch`.
    mismatch_refs: Vec<usize>,
}

/// `gs:[disp32]` ModRM/SIB bytes for register field `reg` (low 3 bits).
fn gs_modrm(reg: u8) -> [u8; 2] {
    [((reg & 7) << 3) | 0x04, 0x25]
}

impl Emitter {
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

    fn count_prologue(&mut self, n: u32, flags_dead: bool) {
        if flags_dead {
            // add qword ptr gs:[count], n
            self.buf.extend_from_slice(&[0x65, 0x48, 0x81, 0x04, 0x25]);
            self.d32(c::OFF_COUNT as u32);
            self.d32(n);
        } else {
            // Flag-free: mov/lea only.
            self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
            self.load_gs(0, c::OFF_COUNT);
            self.buf.extend_from_slice(&[0x48, 0x8D, 0x80]);
            self.d32(n);
            self.store_gs(0, c::OFF_COUNT);
            self.load_gs(0, c::scratch_off(c::S_STUB_RAX));
        }
    }

    fn new_stub(&mut self, target: u64) -> usize {
        self.stubs.push(Stub {
            offset: usize::MAX,
            target,
        });
        self.stubs.len() - 1
    }

    /// `jmp rel32` to a (new) exit stub for `target`.
    fn stub_jump(&mut self, target: u64) {
        let s = self.new_stub(target);
        self.stub_jump_existing(s);
    }

    fn stub_jump_existing(&mut self, s: usize) {
        self.buf.push(0xE9);
        let fix = self.buf.len();
        self.d32(0);
        self.fixups.push((fix, s));
    }

    /// Lays out the stubs after the code and resolves the jumps to them.
    fn finish(&mut self) {
        self.unmark();
        for i in 0..self.stubs.len() {
            while self.buf.len() % 8 != 0 {
                self.buf.push(0xCC);
            }
            let off = self.buf.len();
            self.stubs[i].offset = off;
            let target = self.stubs[i].target;
            // A stub is the way to its target: at its first byte (linked or not) the guest
            // is exactly at the target; after its first store, with rax borrowed.
            self.push_map_at(off, target, 0);
            self.push_map_at(off + STUB_RAX_STORE_LEN, target, FIX_RAX_IN_STUB);
            self.push_map_at(off + STUB_FAR_SLOT, UNMAPPED, 0);
            emit_stub(&mut self.buf, target);
        }
        for &(fix, s) in &self.fixups {
            let rel = self.stubs[s].offset as i64 - (fix as i64 + 4);
            self.buf[fix..fix + 4].copy_from_slice(&(rel as i32).to_le_bytes());
        }
        if !self.slow.is_empty() {
            self.finish_slow_calls();
        }
        if let Some(chk) = self.check.take() {
            self.finish_check(chk);
        }
        // A stub has no successor; keep the tail aligned for the next block.
        while self.buf.len() % 16 != 0 {
            self.buf.push(0xCC);
        }
    }

    /// Guest bytes `[ip, ip+len)` from the snapshot.
    fn guest_bytes(&self, ip: u64, len: usize) -> &[u8] {
        let from = (ip - self.guest_pc) as usize;
        &self.guest[from..from + len]
    }

    /// Entry check: compares the guest bytes `[pc, pc+len)` with the copy the block was
    /// translated from (placed after the stubs by `finish_check`), one aligned 8-byte word
    /// at a time: `mov rax, [moffs64]; xor rax, [rip+copy]` (plus `test [rip+mask], rax`
    /// for the two edge words, which hold bytes outside the block). Only `rax` and, unless
    /// dead, the arithmetic flags are used; both are restored on either path. The loads are
    /// aligned so that a guest running with `EFLAGS.AC` set (HotSpot does while probing the
    /// CPU) takes no alignment fault here, and they never leave the pages of the block.
    fn smc_check(&mut self, pc: u64, len: usize, flags_dead: bool) {
        self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.unmark();
        if !flags_dead {
            self.buf.extend_from_slice(&[0x9F, 0x0F, 0x90, 0xC0]); // lahf; seto al
            self.store_gs(0, c::scratch_off(c::S_IBL_FLAGS));
        }
        let first = pc & !7;
        let end = (pc + len as u64 + 7) & !7;
        let nwords = ((end - first) / 8) as usize;
        let from = (pc - self.guest_pc) as usize;
        // Copy words (bytes outside the block zero), then one mask word per edge word.
        let mut data = alloc::vec![0u8; nwords * 8];
        let lead = (pc - first) as usize;
        data[lead..lead + len].copy_from_slice(&self.guest[from..from + len]);
        let mut chk = Check {
            pc,
            flags_dead,
            data_refs: Vec::new(),
            mismatch_refs: Vec::new(),
            data: Vec::new(),
        };
        let mut masks: Vec<u8> = Vec::new();
        for i in 0..nwords {
            let lo = (i * 8).max(lead);
            let hi = (i * 8 + 8).min(lead + len);
            // mov rax, [moffs64]
            self.buf.extend_from_slice(&[0x48, 0xA1]);
            self.buf
                .extend_from_slice(&(first + 8 * i as u64).to_le_bytes());
            // xor rax, [rip+copy]
            self.buf.extend_from_slice(&[0x48, 0x33, 0x05]);
            chk.data_refs.push((self.buf.len(), i * 8));
            self.d32(0);
            if lo != i * 8 || hi != i * 8 + 8 {
                let mut m = [0u8; 8];
                for b in &mut m[lo - i * 8..hi - i * 8] {
                    *b = 0xFF;
                }
                // test [rip+mask], rax
                self.buf.extend_from_slice(&[0x48, 0x85, 0x05]);
                chk.data_refs
                    .push((self.buf.len(), nwords * 8 + masks.len()));
                self.d32(0);
                masks.extend_from_slice(&m);
            }
            self.buf.extend_from_slice(&[0x0F, 0x85]); // jnz mismatch
            chk.mismatch_refs.push(self.buf.len());
            self.d32(0);
        }
        data.extend_from_slice(&masks);
        chk.data = data;
        if !flags_dead {
            self.restore_check_flags();
        }
        self.load_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.check = Some(chk);
    }

    /// `mov rax, gs:[ibl_flags]; add al, 0x7f; sahf`
    fn restore_check_flags(&mut self) {
        self.load_gs(0, c::scratch_off(c::S_IBL_FLAGS));
        self.buf.extend_from_slice(&[0x04, 0x7F, 0x9E]);
    }

    /// The mismatch exit (guest flags back, guest rax in `STUB_RAX` as for a stub, guest pc
    /// in `rax`, on to `oxg_smc_dispatch`) and the copy and masks of the guest words.
    fn finish_check(&mut self, chk: Check) {
        let mismatch = self.buf.len();
        for &at in &chk.mismatch_refs {
            let rel = mismatch as i64 - (at as i64 + 4);
            self.buf[at..at + 4].copy_from_slice(&(rel as i32).to_le_bytes());
        }
        if !chk.flags_dead {
            self.restore_check_flags();
        }
        self.mov_imm64(0, chk.pc);
        self.jmp_gs(c::OFF_SMC_DISPATCH);
        while self.buf.len() % 8 != 0 {
            self.buf.push(0xCC);
        }
        let data = self.buf.len();
        self.buf.extend_from_slice(&chk.data);
        for &(at, off) in &chk.data_refs {
            let rel = (data + off) as i64 - (at as i64 + 4);
            self.buf[at..at + 4].copy_from_slice(&(rel as i32).to_le_bytes());
        }
    }

    /// Copies a non-transfer instruction, fixing a RIP-relative operand.
    fn copy(&mut self, d: &Decoded) -> Result<(), TranslateError> {
        let ins = &d.ins;
        let len = ins.len();
        let src = ins.ip();
        match ins.code() {
            Code::Rdgsbase_r64 | Code::Rdgsbase_r32 | Code::Wrgsbase_r64 | Code::Wrgsbase_r32 => {
                return self.gs_base_access(ins);
            }
            _ => {}
        }
        if (0..ins.op_count()).any(|i| ins.op_kind(i) == OpKind::Memory)
            && ins.memory_segment() == Register::GS
            && !crate::asm::native_gs(src)
        {
            return self.gs_operand(ins);
        }
        if !ins.is_ip_rel_memory_operand() {
            let from = (src - self.guest_pc) as usize;
            self.buf.extend_from_slice(&self.guest[from..from + len]);
            return Ok(());
        }
        let target = ins.ip_rel_memory_address();
        let new_end = self.here() as i64 + len as i64;
        let disp = target as i64 - new_end;
        if disp == disp as i32 as i64
            && d.offs.has_displacement()
            && d.offs.displacement_size() == 4
        {
            let start = self.buf.len();
            let from = (src - self.guest_pc) as usize;
            self.buf.extend_from_slice(&self.guest[from..from + len]);
            let at = start + d.offs.displacement_offset();
            self.buf[at..at + 4].copy_from_slice(&(disp as i32).to_le_bytes());
            return Ok(());
        }
        self.far_rip(ins)
    }

    /// `rdgsbase`/`wrgsbase`: the guest's gs base lives in the context (`guest_gs`).
    fn gs_base_access(&mut self, ins: &Instruction) -> Result<(), TranslateError> {
        let r = ins.op0_register();
        let num = r.full_register().number() as u8;
        let off = c::OFF_GUEST_GS as u32;
        let rex_r = if num >= 8 { 0x44 } else { 0 };
        match ins.code() {
            Code::Rdgsbase_r64 => self.load_gs(num, c::OFF_GUEST_GS),
            Code::Wrgsbase_r64 => self.store_gs(num, c::OFF_GUEST_GS),
            Code::Rdgsbase_r32 => {
                // mov r32, gs:[guest_gs] (zero-extends, as rdgsbase r32 does)
                self.buf.push(0x65);
                if rex_r != 0 {
                    self.buf.push(rex_r);
                }
                self.buf.push(0x8B);
                self.buf.extend_from_slice(&gs_modrm(num));
                self.d32(off);
            }
            _ => {
                // mov gs:[guest_gs], r32; mov dword gs:[guest_gs+4], 0
                self.buf.push(0x65);
                if rex_r != 0 {
                    self.buf.push(rex_r);
                }
                self.buf.push(0x89);
                self.buf.extend_from_slice(&gs_modrm(num));
                self.d32(off);
                self.buf.extend_from_slice(&[0x65, 0xC7, 0x04, 0x25]);
                self.d32(off + 4);
                self.d32(0);
            }
        }
        Ok(())
    }

    /// `insn gs:[base + index*s + d]` (the guest's gs, not the engine's): `mov gs:[save], t;
    /// mov t, gs:[guest_gs]; lea t, [t + base]; insn [t + index*s + d]; mov t, gs:[save]`
    /// with a scratch register `t` the instruction does not use.
    fn gs_operand(&mut self, ins: &Instruction) -> Result<(), TranslateError> {
        let err = TranslateError::Encode { pc: ins.ip() };
        let (reg, num) = self.free_register(ins).ok_or(err)?;
        let mut m = *ins;
        m.set_segment_prefix(Register::None);
        m.set_memory_base(reg);
        let disp = ins.memory_displacement64();
        m.set_memory_displacement64(disp);
        // iced: 1 = "as short as the value allows" (it widens to disp32 when needed).
        m.set_memory_displ_size(if disp == 0 { 0 } else { 1 });
        let mut enc = Encoder::new(64);
        self.store_gs(num, c::scratch_off(c::S_FAR_SAVE));
        self.mark(ins.ip(), ((num as u16) + 1) << FIX_FAR_SHIFT);
        self.load_gs(num, c::OFF_GUEST_GS);
        let base = ins.memory_base();
        if base != Register::None {
            let lea = Instruction::with2(
                Code::Lea_r64_m,
                reg,
                iced_x86::MemoryOperand::with_base_index(base, reg),
            )
            .map_err(|_| err)?;
            enc.encode(&lea, self.here()).map_err(|_| err)?;
            let b = enc.take_buffer();
            self.buf.extend_from_slice(&b);
        }
        enc.encode(&m, self.here()).map_err(|_| err)?;
        let body = enc.take_buffer();
        self.buf.extend_from_slice(&body);
        self.unmark();
        self.load_gs(num, c::scratch_off(c::S_FAR_SAVE));
        Ok(())
    }

    /// A general register `ins` neither reads nor writes, explicitly or implicitly.
    fn free_register(&self, ins: &Instruction) -> Option<(Register, u8)> {
        let mut factory = InstructionInfoFactory::new();
        let info = factory.info(ins);
        const CANDIDATES: [(Register, u8); 10] = [
            (Register::RAX, 0),
            (Register::RCX, 1),
            (Register::RDX, 2),
            (Register::RBX, 3),
            (Register::RSI, 6),
            (Register::RDI, 7),
            (Register::R8, 8),
            (Register::R9, 9),
            (Register::R10, 10),
            (Register::R11, 11),
        ];
        let used = |r: Register| {
            info.used_registers()
                .iter()
                .any(|u| u.register().full_register() == r)
        };
        CANDIDATES.iter().copied().find(|(r, _)| !used(*r))
    }

    /// `insn [rip+X]` too far from the code cache: `mov gs:[save], s; mov s, X; insn [s];
    /// mov s, gs:[save]` with a scratch register `s` the instruction does not use.
    fn far_rip(&mut self, ins: &Instruction) -> Result<(), TranslateError> {
        let Some((reg, num)) = self.free_register(ins) else {
            return Err(TranslateError::Encode { pc: ins.ip() });
        };
        let target = ins.ip_rel_memory_address();
        note_far_rewrite();
        let mut m = *ins;
        m.set_memory_base(reg);
        m.set_memory_index(Register::None);
        m.set_memory_displacement64(0);
        m.set_memory_displ_size(0);
        let mut enc = Encoder::new(64);
        enc.encode(&m, self.here())
            .map_err(|_| TranslateError::Encode { pc: ins.ip() })?;
        let body = enc.take_buffer();
        self.store_gs(num, c::scratch_off(c::S_FAR_SAVE));
        let ip = ins.ip();
        self.mark(ip, ((num as u16) + 1) << FIX_FAR_SHIFT);
        self.mov_imm64(num, target);
        self.buf.extend_from_slice(&body);
        self.unmark();
        self.load_gs(num, c::scratch_off(c::S_FAR_SAVE));
        Ok(())
    }

    /// mov r64, imm64
    fn mov_imm64(&mut self, reg: u8, v: u64) {
        let rex = if reg >= 8 { 0x49 } else { 0x48 };
        self.buf.extend_from_slice(&[rex, 0xB8 + (reg & 7)]);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Pushes the guest return address `ra` without touching flags or memory below `rsp`.
    fn push_return(&mut self, ra: u64, ip: u64, fix: u16) {
        let sign_ext = (ra as u32 as i32 as i64) as u64;
        if sign_ext == ra {
            self.buf.push(0x68); // push imm32
            self.d32(ra as u32);
            return;
        }
        // One 8-byte store: `push imm32` + `mov dword [rsp+4]` would make the `pop` at the
        // matching `ret` load from two stores, which defeats store forwarding (measurably
        // slower on short calls). rcx is spilled to a scratch slot (rax may hold an
        // indirect call's target).
        self.store_gs(1, c::scratch_off(c::S_FAR_SAVE));
        self.mark(ip, fix | (2 << FIX_FAR_SHIFT));
        self.mov_imm64(1, ra);
        self.buf.push(0x51); // push rcx
        self.unmark();
        self.load_gs(1, c::scratch_off(c::S_FAR_SAVE));
    }

    /// The first probe of the indirect-branch lookup, inlined at each indirect exit so that
    /// every site has its own final `jmp` (and branch-predictor entry); the second probe and
    /// the miss path are shared (`oxg_ibl2`). Protocol: rax = guest
    /// target, guest rax in STUB_RAX; flags saved with lahf/seto, no stack use.
    fn inline_ibl(&mut self) {
        self.store_gs(1, c::scratch_off(c::S_IBL_RCX)); // mov gs:[ibl_rcx], rcx
        self.buf.extend_from_slice(&[0x48, 0x89, 0xC1]); // mov rcx, rax
        self.buf.extend_from_slice(&[0x9F, 0x0F, 0x90, 0xC0]); // lahf; seto al
        self.store_gs(0, c::scratch_off(c::S_IBL_FLAGS));
        self.buf.extend_from_slice(&[0x48, 0x69, 0xC1]); // imul rax, rcx, K
        self.d32(c::IBL_MUL);
        self.buf
            .extend_from_slice(&[0x48, 0xC1, 0xE8, c::IBL_SHIFT as u8]); // shr rax, S
        self.buf.push(0x25); // and eax, mask
        self.d32((c::IBL_ENTRIES - 1) as u32);
        self.buf.extend_from_slice(&[0x48, 0xC1, 0xE0, 0x04]); // shl rax, 4
        self.buf.extend_from_slice(&[0x65, 0x48, 0x03, 0x04, 0x25]); // add rax, gs:[table]
        self.d32(c::OFF_IBL_TABLE as u32);
        self.buf.extend_from_slice(&[0x48, 0x3B, 0x08]); // cmp rcx, [rax]
        self.buf.extend_from_slice(&[0x75, 0x00]); // jne miss
        let jne = self.buf.len();
        self.buf.extend_from_slice(&[0x48, 0x8B, 0x40, 0x08]); // mov rax, [rax+8]
        self.store_gs(0, c::scratch_off(c::S_HOST_TARGET));
        self.load_gs(0, c::scratch_off(c::S_IBL_FLAGS));
        self.buf.extend_from_slice(&[0x04, 0x7F, 0x9E]); // add al, 0x7f; sahf
        self.load_gs(1, c::scratch_off(c::S_IBL_RCX));
        self.load_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.jmp_gs(c::scratch_off(c::S_HOST_TARGET));
        let rel = self.buf.len() - jne;
        self.buf[jne - 1] = rel as u8;
        self.jmp_gs(c::OFF_IBL2);
    }

    /// `mov rax, <operand 0 of ins>` for an indirect jump or call.
    fn load_target(&mut self, ins: &Instruction) -> Result<(), TranslateError> {
        match ins.op0_kind() {
            OpKind::Register => {
                let r = ins.op0_register();
                if r == Register::RAX {
                    return Ok(());
                }
                let m = Instruction::with2(Code::Mov_r64_rm64, Register::RAX, r)
                    .map_err(|_| TranslateError::Encode { pc: ins.ip() })?;
                self.encode(&m, ins.ip())
            }
            OpKind::Memory => {
                if ins.is_ip_rel_memory_operand() {
                    let target = ins.ip_rel_memory_address();
                    let mut m = *ins;
                    m.set_code(Code::Mov_r64_rm64);
                    m.set_op0_kind(OpKind::Register);
                    m.set_op0_register(Register::RAX);
                    m.set_op1_kind(OpKind::Memory);
                    let mut enc = Encoder::new(64);
                    if enc.encode(&m, self.here()).is_ok() {
                        self.buf.extend_from_slice(&enc.take_buffer());
                        return Ok(());
                    }
                    // Far: the address is a constant.
                    note_far_rewrite();
                    self.mov_imm64(0, target);
                    self.buf.extend_from_slice(&[0x48, 0x8B, 0x00]); // mov rax, [rax]
                    return Ok(());
                }
                let mut m = *ins;
                m.set_code(Code::Mov_r64_rm64);
                m.set_op0_kind(OpKind::Register);
                m.set_op0_register(Register::RAX);
                m.set_op1_kind(OpKind::Memory);
                self.encode(&m, ins.ip())
            }
            _ => Err(TranslateError::Encode { pc: ins.ip() }),
        }
    }

    fn encode(&mut self, m: &Instruction, pc: u64) -> Result<(), TranslateError> {
        let mut enc = Encoder::new(64);
        enc.encode(m, self.here())
            .map_err(|_| TranslateError::Encode { pc })?;
        self.buf.extend_from_slice(&enc.take_buffer());
        Ok(())
    }

    /// Emits the replacement for the control transfer that ends the block.
    fn transfer(&mut self, d: &Decoded) -> Result<(), TranslateError> {
        let ins = &d.ins;
        let next = ins.next_ip();
        let ip = ins.ip();
        self.mark(ip, 0);
        match ins.flow_control() {
            FlowControl::UnconditionalBranch => {
                self.stub_jump(ins.near_branch_target());
            }
            FlowControl::ConditionalBranch => {
                let target = ins.near_branch_target();
                if ins.is_jcc_short_or_near() {
                    let cc = ins.condition_code() as u8 - 1;
                    self.buf.extend_from_slice(&[0x0F, 0x80 + cc]);
                    let fix = self.buf.len();
                    self.d32(0);
                    let s = self.new_stub(target);
                    self.fixups.push((fix, s));
                } else {
                    // loop/loope/loopne/jrcxz/jecxz (rel8 only): keep the instruction with
                    // rel8 = 2, skip over a jmp to the taken stub otherwise.
                    let bytes = self.guest_bytes(ins.ip(), ins.len()).to_vec();
                    self.buf.extend_from_slice(&bytes[..bytes.len() - 1]);
                    self.buf.extend_from_slice(&[0x02, 0xEB, 0x05, 0xE9]);
                    let fix = self.buf.len();
                    self.d32(0);
                    let s = self.new_stub(target);
                    self.fixups.push((fix, s));
                }
                self.mark(next, 0);
                self.stub_jump(next);
            }
            FlowControl::Call => {
                self.push_return(next, ip, 0);
                self.unmark();
                self.stub_jump(ins.near_branch_target());
            }
            FlowControl::IndirectBranch => {
                self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
                self.mark(ip, FIX_RAX_IN_STUB);
                self.load_target(ins)?;
                self.unmark();
                self.inline_ibl();
            }
            FlowControl::IndirectCall => {
                self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
                self.mark(ip, FIX_RAX_IN_STUB);
                self.load_target(ins)?;
                self.push_return(next, ip, FIX_RAX_IN_STUB);
                self.unmark();
                self.inline_ibl();
            }
            FlowControl::Return => {
                self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
                self.mark(ip, FIX_RAX_IN_STUB);
                self.buf.push(0x58); // pop rax
                self.unmark();
                if ins.op_count() == 1 && ins.op0_kind() == OpKind::Immediate16 {
                    let imm = ins.immediate16() as u32;
                    // lea rsp, [rsp+imm32]
                    self.buf.extend_from_slice(&[0x48, 0x8D, 0xA4, 0x24]);
                    self.d32(imm);
                }
                self.inline_ibl();
            }
            // int3, int n, ud2, hlt...: run as they are; the kernel reports the trap with
            // the host pc. Then carry on at the next guest instruction.
            FlowControl::Interrupt
            | FlowControl::Exception
            | FlowControl::XbeginXabortXend
            | FlowControl::Next => {
                self.copy(d)?;
                // A trap (int3, int n) reports the pc after the instruction.
                self.mark(next, 0);
                self.stub_jump(next);
            }
        }
        Ok(())
    }
}

/// Whether an inline address computation can be encoded for `m` (with the offset of its
/// last byte): a constant, or a displacement that stays a disp32.
fn ea_encodable(m: &iced_x86::UsedMemory) -> bool {
    if m.base() == Register::None && m.index() == Register::None {
        return true;
    }
    let last = m
        .displacement()
        .wrapping_add((m.memory_size().size() as u64).saturating_sub(1)) as i64;
    let d = m.displacement() as i64;
    d == d as i32 as i64 && last == last as i32 as i64
}

/// An exit stub: `mov gs:[STUB_RAX], rax; mov rax, target; jmp gs:[DISPATCH]`, padded to
/// [`STUB_FAR_SLOT`], then an 8-byte slot for a far link. Linking rewrites its first 8
/// bytes in one aligned store (stubs are 8-byte aligned).
fn emit_stub(buf: &mut Vec<u8>, target: u64) {
    let start = buf.len();
    buf.extend_from_slice(&[0x65, 0x48, 0x89, 0x04, 0x25]);
    buf.extend_from_slice(&(c::scratch_off(c::S_STUB_RAX) as u32).to_le_bytes());
    buf.extend_from_slice(&[0x48, 0xB8]);
    buf.extend_from_slice(&target.to_le_bytes());
    buf.extend_from_slice(&[0x65, 0xFF, 0x24, 0x25]);
    buf.extend_from_slice(&(c::OFF_DISPATCH as u32).to_le_bytes());
    while buf.len() - start < STUB_FAR_SLOT {
        buf.push(0xCC);
    }
    buf.extend_from_slice(&0u64.to_le_bytes());
    debug_assert_eq!(buf.len() - start, STUB_SIZE);
}

/// Reverts a linked stub to its unlinked form (enter the dispatcher).
///
/// # Safety
/// `stub` must be an exit stub in a writable code-cache arena.
pub unsafe fn unlink_stub(stub: u64) {
    let mut first = [0u8; 8];
    first[..5].copy_from_slice(&[0x65, 0x48, 0x89, 0x04, 0x25]);
    first[5..].copy_from_slice(&(c::scratch_off(c::S_STUB_RAX) as u32).to_le_bytes()[..3]);
    // SAFETY: the caller guarantees an 8-byte aligned stub; bytes 8.. were never changed.
    unsafe { core::ptr::write_volatile(stub as *mut u64, u64::from_le_bytes(first)) };
}

/// Makes the stub at host address `stub` jump straight to host address `to`.
///
/// # Safety
/// `stub` must be an exit stub in a writable code-cache arena; `to` a translated block.
pub unsafe fn link_stub(stub: u64, to: u64) {
    let p = stub as *mut u64;
    // SAFETY: the caller guarantees stub is an 8-byte aligned stub of STUB_SIZE bytes.
    unsafe {
        let old = core::ptr::read_volatile(p).to_le_bytes();
        let rel = to as i64 - (stub as i64 + 5);
        let mut new = old;
        if rel == rel as i32 as i64 {
            new[0] = 0xE9;
            new[1..5].copy_from_slice(&(rel as i32).to_le_bytes());
        } else {
            core::ptr::write_volatile((stub + STUB_FAR_SLOT as u64) as *mut u64, to);
            // jmp [rip + (FAR_SLOT - 6)]
            new[0] = 0xFF;
            new[1] = 0x25;
            new[2..6].copy_from_slice(&((STUB_FAR_SLOT - 6) as i32).to_le_bytes());
        }
        // One aligned 8-byte store: a thread running the stub sees the old or new bytes.
        core::ptr::write_volatile(p, u64::from_le_bytes(new));
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
    }

    #[test]
    fn counting_mode_turns_rep_stosb_into_a_self_loop_counted_per_iteration() {
        let (_buf, pc) = guest(&[0xF3, 0xAA, 0xC3]); // rep stosb; ret
        let t = translate(
            pc,
            pc + 0x1000,
            Options {
                count: true,
                check: false,
                instrument: false,
            },
        )
        .unwrap();
        let insns = decode_all(&t.bytes, pc + 0x1000);
        assert!(insns.iter().any(|i| i.mnemonic() == Mnemonic::Jrcxz));
        let stos = insns
            .iter()
            .find(|i| i.mnemonic() == Mnemonic::Stosb)
            .unwrap();
        assert!(!stos.has_rep_prefix());
        let targets: Vec<u64> = t.stubs.iter().map(|s| s.target).collect();
        assert!(targets.contains(&pc) && targets.contains(&(pc + 2)));
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
            },
        )
        .unwrap();
        let insns = decode_all(&t.bytes, pc + 0x1000);
        assert_eq!(insns[0].mnemonic(), Mnemonic::Setb);
        assert_eq!(insns[1].mnemonic(), Mnemonic::Add);
        assert_eq!(insns[1].segment_prefix(), Register::GS);
        assert_eq!(insns[1].immediate32(), 3);
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
            .find(|i| i.mnemonic() == Mnemonic::Lahf)
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
