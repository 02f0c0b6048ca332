//! The engine's side of the tool contract (`oxgrind_tool::instrument`): the tool, its host
//! and the embedder's policy, and the clean calls that translated probes make.
//!
//! The translator (`translate`) describes each block to the tool as `Insn`s (`describe`),
//! takes back a `Plan`, and emits each probe: counter bumps, trace appends and filtered
//! checks inline; everything else as a *clean call*: the call site spills one register to
//! the thread context and enters the dispatcher, which saves the full guest state (general
//! registers, flags, the XSAVE state), runs [`run`] on the engine stack and returns to the
//! call site; signals arriving meanwhile are deferred like any other signal in the engine.
//! A clean call costs about as much as a dispatcher entry (a few hundred cycles).
//!
//! The accesses a probe reports are computed from the guest registers: explicit operands,
//! implicit stack accesses (`push`, `pop`, `call`, `ret`, `enter`, `leave`), each iteration
//! of a `rep` string instruction, each enabled element of a gather or scatter, and of a
//! masked vector access only the elements its mask enables (EVEX `{k}`, `vmaskmov`,
//! `maskmovdqu`; see [`Lanes`]).
//!
//! The embedder must keep its tool from probing the embedder's own code (a probe call
//! inside its allocator would run the tool while that allocator holds its lock): the
//! engine asks [`Embedder::is_own_code`] before offering a block.

use core::sync::atomic::{AtomicU64, Ordering};

use iced_x86::{Instruction, InstructionInfoFactory, OpAccess, Register, UsedMemory};
use oxgrind_sys::lock::SpinLock;
use oxgrind_tool::instrument::{Access, AccessKind, GuestRegs, TraceKind, TraceRecord};
use oxgrind_tool::{Host, Tool};

use crate::context::{self as c, ThreadCtx};

pub use iced_x86;

/// The embedder's say over where and when its tool runs; the engine has no policy of its
/// own.
pub trait Embedder: Sync {
    /// Code the tool must never see (the embedder's own: its hooks, its heap, the tool).
    fn is_own_code(&self, pc: u64) -> bool;
    /// Runs `f`, a call into the tool, unless the thread is somewhere the tool must not be
    /// called. `probe`: an access or pc probe, which may be dropped (inside the embedder's
    /// allocator hooks the accesses are not the program's); otherwise `f` must run.
    fn call(&self, probe: bool, f: &mut dyn FnMut());
    /// The function at `pc` is to be replaced by the code at the returned address (the
    /// caller's return address is kept: the replacement returns to it). Asked once per
    /// translated block start, its own code's included.
    fn redirect(&self, _pc: u64) -> Option<u64> {
        None
    }
    /// For `to`, a replacement [`Embedder::redirect`] returned: a native function
    /// (`crate::native_try::TryFn`) to try first on every call, which either does the
    /// replacement's whole work, exactly as its translated code would have with nothing to
    /// report, or declines, and the replacement then runs translated (see
    /// `crate::native_try`). Asked once per redirected block.
    fn native_try(&self, _to: u64) -> Option<u64> {
        None
    }
}

/// What instruments the program: the tool, the host it is given, the embedder's policy.
#[derive(Clone, Copy)]
pub struct Client {
    pub tool: &'static dyn Tool,
    pub host: &'static (dyn Host + Sync),
    pub embedder: &'static dyn Embedder,
}

/// The client, set once before takeover.
static CLIENT: SpinLock<Option<Client>> = SpinLock::new(None);

pub(crate) fn set_client(c: Option<Client>) {
    *CLIENT.lock() = c;
}

pub(crate) fn client() -> Option<Client> {
    // SAFETY: written once before the engine takes over (or by tests before translating),
    // only read afterwards.
    unsafe { *CLIENT.get_unchecked() }
}

/// Most memory operands one instruction is described with (`movs`: 2; `push [m]`: 2).
pub(crate) const MAX_MEM: usize = 4;

const KIND_ACCESSES: u32 = 1;
const KIND_PC: u32 = 2;
/// Append each access to the trace buffer (`tag` in `data`; filtered by the shadow map when
/// `filtered`): the fallback of accesses the inline append cannot compute.
const KIND_TRACE: u32 = 3;
/// The trace buffer is past its mark: drain it.
const KIND_TRACE_FULL: u32 = 4;
/// A client request at its `xchg rbx, rbx`.
const KIND_CLIENT_REQUEST: u32 = 5;
/// Definedness's slow path (`definedness::step`; `data` is its `StepRec`).
const KIND_DEFINEDNESS: u32 = 6;
/// The embedder's code asks to run a function natively (`crate::run_native`): the
/// function is in the guest's `rsi`, its argument in `rdi`.
const KIND_NATIVE: u32 = 7;
/// The embedder's entry point jumped to `asm::oxg_native_entry` (`crate::native_entry`):
/// the function is in the guest's `r11`, its arguments in `rdi`, `rsi`, `rdx`, `rcx`, `r8`,
/// `r9`, its result goes to the guest's `rax`.
const KIND_NATIVE_ENTRY: u32 = 8;

/// What a probe call site passes to the dispatcher: everything needed to compute the
/// accesses from the guest registers, decided at translation time. Records live in
/// [`STORE`] and are never freed (a thread may still be inside an invalidated block); each
/// is followed there by its `nmem` memory operands ([`operands_of`]), no more: most
/// instructions have one, and room for [`MAX_MEM`] made a record 112 bytes, not 64.
#[repr(C)]
pub(crate) struct ProbeRec {
    kind: u32,
    nmem: u32,
    /// KIND_TRACE: whether only accesses to marked granules are recorded.
    filtered: bool,
    data: u64,
    pc: u64,
    next_ip: u64,
    /// Which parts of the memory operand the instruction really touches.
    lanes: Lanes,
}

/// Where a stored [`ProbeRec`] at `p` keeps its memory operands.
fn operands_at(p: u64) -> u64 {
    let align = core::mem::align_of::<UsedMemory>() as u64;
    (p + core::mem::size_of::<ProbeRec>() as u64).next_multiple_of(align)
}

/// The memory operands of the stored record at `rec`.
fn operands_of(rec: u64) -> &'static [UsedMemory] {
    // SAFETY: `record` wrote the record and its `nmem` operands after it, at
    // `operands_at`; records are never freed.
    unsafe {
        let n = (*(rec as *const ProbeRec)).nmem as usize;
        core::slice::from_raw_parts(operands_at(rec) as *const UsedMemory, n)
    }
}

/// How an instruction's memory operand splits into the accesses it really makes, decided
/// at translation; the mask itself is read from the guest state when the probe runs.
///
/// A masked vector instruction touches only the elements its mask enables: the CPU
/// suppresses faults on the others, and glibc relies on it (its AVX-512 `memset` of a
/// 5-byte block is one byte-masked 64-byte store). Reporting the whole operand would be a
/// false alarm on every short string or block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lanes {
    /// The whole operand, once.
    Whole,
    /// A gather or scatter: `elems` elements, each at an address from the vector index;
    /// element `i` is accessed when `mask` enables it ([`mask_bits`]; `Register::None`:
    /// all are).
    Vsib { elems: u8, mask: Register },
    /// Element `i` of the operand (`elem` bytes each, `elems` of them) is accessed when
    /// `mask` enables it: EVEX `{k}` masking (an opmask register, a bit per element), or
    /// `vmaskmov`/`vpmaskmov`/`maskmovdqu` (a vector register, the sign bit of each
    /// element). Each run of enabled elements is one access.
    Masked { elems: u8, elem: u8, mask: Register },
    /// `vcompress*`/`vpcompress*` stores and `vexpand*`/`vpexpand*` loads: as many
    /// contiguous elements as `mask` enables, from the start of the operand.
    Packed { elem: u8, mask: Register },
}

/// Bump allocator for probe records over chunks mapped for it (never the program's heap,
/// and no size-class games with the embedder's heap). Records are 8-byte aligned (their
/// widest field is a `u64`), and so are their sizes here: a definedness step record of 56
/// bytes takes 56, not 64.
const STORE_ALIGN: usize = 8;
const _: () = assert!(
    core::mem::align_of::<ProbeRec>() <= STORE_ALIGN
        && core::mem::align_of::<DefinednessRec>() <= STORE_ALIGN
        && core::mem::align_of::<crate::definedness::RegUse>() <= STORE_ALIGN
        && core::mem::align_of::<UsedMemory>() <= STORE_ALIGN
);

struct Store {
    next: u64,
    end: u64,
}

static STORE: SpinLock<Store> = SpinLock::new(Store { next: 0, end: 0 });
const STORE_CHUNK: usize = 1 << 20;

fn store_alloc(size: usize) -> Option<*mut u8> {
    let size = size.next_multiple_of(STORE_ALIGN);
    let mut s = STORE.lock();
    if s.next + size as u64 > s.end {
        let chunk = oxgrind_sys::raw::mmap_anon(STORE_CHUNK)? as u64;
        // Probe records keep copies of the program's values (a site's last address):
        // the engine's bookkeeping, not a leak root. Found keeping a block Valgrind reports
        // lost reachable (mc_cxx_access.cpp at -O1).
        oxgrind_sys::heap::note_private_mapping(chunk as usize, STORE_CHUNK);
        s.next = chunk;
        s.end = chunk + STORE_CHUNK as u64;
    }
    let p = s.next;
    s.next += size as u64;
    Some(p as *mut u8)
}

/// One factory for the translator (it keeps its buffers between calls).
static FACTORY: SpinLock<Option<InstructionInfoFactory>> = SpinLock::new(None);

/// Creates the factory's buffers before the engine takes over.
pub(crate) fn prepare() {
    let mut f = FACTORY.lock();
    if f.is_none() {
        *f = Some(InstructionInfoFactory::new());
    }
}

/// Runs `f` with the translator's instruction-info factory.
pub(crate) fn with_factory<R>(f: impl FnOnce(&mut InstructionInfoFactory) -> R) -> R {
    let mut guard = FACTORY.lock();
    f(guard.get_or_insert_with(InstructionInfoFactory::new))
}

/// Memory operands of `ins` that access memory, reads before writes as the CPU does them.
fn used_memory(ins: &Instruction, out: &mut [UsedMemory; MAX_MEM]) -> usize {
    let mut guard = FACTORY.lock();
    let f = guard.get_or_insert_with(InstructionInfoFactory::new);
    // Memory only: iced's register usage is half its work.
    let info = f.info_options(ins, iced_x86::InstructionInfoOptions::NO_REGISTER_USAGE);
    // iced describes a `rep`-prefixed string operand as a conditional access of unknown
    // size (the count may be 0); a probe runs per iteration, where it is one element.
    let rep_string =
        ins.is_string_instruction() && (ins.has_rep_prefix() || ins.has_repne_prefix());
    let mut n = 0;
    for pass in 0..2 {
        for m in info.used_memory() {
            let m = &if rep_string {
                let access = match m.access() {
                    OpAccess::CondRead => OpAccess::Read,
                    OpAccess::CondWrite => OpAccess::Write,
                    a => a,
                };
                UsedMemory::new2(
                    m.segment(),
                    m.base(),
                    m.index(),
                    m.scale(),
                    m.displacement(),
                    ins.memory_size(),
                    access,
                    m.address_size(),
                    m.vsib_size(),
                )
            } else {
                *m
            };
            let write_only = matches!(m.access(), OpAccess::Write | OpAccess::CondWrite);
            let touches = !matches!(m.access(), OpAccess::None | OpAccess::NoMemAccess)
                && m.memory_size().size() > 0;
            if touches && (pass == 1) == write_only && n < MAX_MEM {
                out[n] = *m;
                n += 1;
            }
        }
    }
    n
}

/// Makes the record for an access probe on `ins`; `None` when it touches no memory.
pub(crate) fn access_record(ins: &Instruction, data: u64) -> Option<u64> {
    access_record_of(ins, KIND_ACCESSES, data, false)
}

/// Makes the record for the Rust fallback of a trace probe on `ins` (see `KIND_TRACE`).
pub(crate) fn trace_record(ins: &Instruction, tag: u32, filtered: bool) -> Option<u64> {
    access_record_of(ins, KIND_TRACE, tag as u64, filtered)
}

fn access_record_of(ins: &Instruction, kind: u32, data: u64, filtered: bool) -> Option<u64> {
    let mut mem = [UsedMemory::default(); MAX_MEM];
    let nmem = used_memory(ins, &mut mem);
    if nmem == 0 {
        return None;
    }
    record(
        ProbeRec {
            kind,
            nmem: nmem as u32,
            filtered,
            data,
            pc: ins.ip(),
            next_ip: ins.next_ip(),
            lanes: lanes(ins, &mem[0]),
        },
        &mem[..nmem],
    )
}

/// The [`Lanes`] of `ins`, whose (first) memory operand is `m`.
fn lanes(ins: &Instruction, m: &UsedMemory) -> Lanes {
    use iced_x86::{Mnemonic as M, OpKind};
    let opmask = ins.op_mask();
    if ins.is_vsib() {
        // The data register is the first register operand (a scatter's comes after its
        // memory operand); the element count is the smaller of its elements and the
        // index's (`vpgatherqd xmm, [ymm]` has 4 of each; `vpgatherdq xmm, [xmm]` uses 2
        // of the index's 4).
        let elem = m.memory_size().size().max(1);
        let data = (0..ins.op_count())
            .find(|&i| ins.op_kind(i) == OpKind::Register)
            .map_or(Register::None, |i| ins.op_register(i));
        let index = m.index();
        let mut elems = data.size() / elem;
        if m.vsib_size() > 0 && index.is_vector_register() {
            elems = elems.min(index.size() / m.vsib_size() as usize);
        }
        let mask = if opmask != Register::None {
            opmask
        } else if ins.op_count() == 3 && ins.op2_register().is_vector_register() {
            ins.op2_register()
        } else {
            Register::None
        };
        return Lanes::Vsib {
            elems: elems.clamp(1, 64) as u8,
            mask,
        };
    }
    let size = m.memory_size();
    let sign_mask = |elem: usize, mask: Register| Lanes::Masked {
        elems: (size.size() / elem).clamp(1, 64) as u8,
        elem: elem as u8,
        mask,
    };
    // The mask is the middle operand of `vmaskmov` (load or store form) and the last of
    // `maskmovdqu [rdi], data, mask` (iced shows the implicit destination first).
    match ins.mnemonic() {
        M::Vmaskmovps | M::Vpmaskmovd => return sign_mask(4, ins.op1_register()),
        M::Vmaskmovpd | M::Vpmaskmovq => return sign_mask(8, ins.op1_register()),
        M::Maskmovdqu | M::Vmaskmovdqu => {
            return sign_mask(1, ins.op_register(ins.op_count().saturating_sub(1)))
        }
        _ => {}
    }
    if opmask == Register::None || size.is_broadcast() {
        return Lanes::Whole;
    }
    let elem = size.element_size();
    if elem == 0 || size.size() <= elem {
        return Lanes::Whole;
    }
    match ins.mnemonic() {
        M::Vcompressps
        | M::Vcompresspd
        | M::Vpcompressd
        | M::Vpcompressq
        | M::Vpcompressb
        | M::Vpcompressw
        | M::Vexpandps
        | M::Vexpandpd
        | M::Vpexpandd
        | M::Vpexpandq
        | M::Vpexpandb
        | M::Vpexpandw => {
            return Lanes::Packed {
                elem: elem as u8,
                mask: opmask,
            }
        }
        // These spread a narrower operand over the whole destination, whose elements the
        // mask selects: memory element `i` is not destination element `i`, so the
        // operand is read whole (as the CPU does when any element is enabled).
        M::Vinsertf32x4
        | M::Vinsertf32x8
        | M::Vinsertf64x2
        | M::Vinsertf64x4
        | M::Vinserti32x4
        | M::Vinserti32x8
        | M::Vinserti64x2
        | M::Vinserti64x4
        | M::Vbroadcastf32x2
        | M::Vbroadcastf32x4
        | M::Vbroadcastf32x8
        | M::Vbroadcastf64x2
        | M::Vbroadcastf64x4
        | M::Vbroadcasti32x2
        | M::Vbroadcasti32x4
        | M::Vbroadcasti32x8
        | M::Vbroadcasti64x2
        | M::Vbroadcasti64x4 => return Lanes::Whole,
        _ => {}
    }
    // Everything else with a full, half, quarter or eighth memory operand (moves,
    // arithmetic, compares, zero/sign extensions, down-converting stores) maps memory
    // element `i` to mask bit `i`.
    Lanes::Masked {
        elems: (size.size() / elem).min(64) as u8,
        elem: elem as u8,
        mask: opmask,
    }
}

/// The memory operands of access record `rec` when every one can be checked inline: plain
/// 64-bit addressing by general registers or a constant, no vector index. `None`
/// otherwise. (`fs:` operands are fine: the x86-64 TLS ABI keeps the thread pointer itself
/// at `fs:0`; `gs:` ones use the guest's gs base the engine keeps.)
pub(crate) fn inline_operands(rec: u64) -> Option<([UsedMemory; MAX_MEM], usize)> {
    let ops = operands_of(rec);
    let n = ops.len();
    let plain = |r: Register| r == Register::None || r.is_gpr64();
    let ok = ops.iter().all(|m| {
        matches!(
            m.segment(),
            Register::None
                | Register::ES
                | Register::CS
                | Register::SS
                | Register::DS
                | Register::FS
                | Register::GS
        ) && m.address_size() == iced_x86::CodeSize::Code64
            && m.vsib_size() == 0
            && plain(m.base())
            && plain(m.index())
            && m.memory_size().size() > 0
    });
    let mut mem = [UsedMemory::default(); MAX_MEM];
    mem[..n].copy_from_slice(ops);
    ok.then_some((mem, n))
}

/// The memory operand of trace record `rec`, with its element count, element size (1, 2,
/// 4 or 8 bytes) and opmask register, when the instruction's one operand is EVEX-masked
/// element by element by `k1`-`k7` ([`Lanes::Masked`]) and can be addressed inline: the
/// trace probe then reads the mask inline (glibc's AVX-512 string functions' tails).
pub(crate) fn inline_opmask_operand(rec: u64) -> Option<(UsedMemory, u8, u8, Register)> {
    // SAFETY: records are written once at translation and never freed.
    let r = unsafe { &*(rec as *const ProbeRec) };
    let Lanes::Masked { elems, elem, mask } = r.lanes else {
        return None;
    };
    let opmask = (Register::K1 as u32..=Register::K7 as u32).contains(&(mask as u32));
    if r.nmem != 1 || !opmask || !matches!(elem, 1 | 2 | 4 | 8) || !elems.is_power_of_two() {
        return None;
    }
    let (mem, _) = inline_operands(rec)?;
    Some((mem[0], elems, elem, mask))
}

/// Makes the record for a pc probe on `ins`.
pub(crate) fn pc_record(ins: &Instruction, data: u64) -> Option<u64> {
    plain_record(KIND_PC, ins, data)
}

/// Makes the record of the drain call placed after the trace appends at guest `pc`.
pub(crate) fn trace_full_record_at(pc: u64) -> Option<u64> {
    record(
        ProbeRec {
            kind: KIND_TRACE_FULL,
            nmem: 0,
            filtered: false,
            data: 0,
            pc,
            next_ip: pc,
            lanes: Lanes::Whole,
        },
        &[],
    )
}

/// Makes the record for the client request whose `xchg rbx, rbx` is `ins`.
pub(crate) fn client_request_record(ins: &Instruction) -> Option<u64> {
    plain_record(KIND_CLIENT_REQUEST, ins, 0)
}

/// Makes the record of the clean call that stands for the block at `asm::oxg_run_native`
/// (`crate::run_native`), which continues at `next_ip`.
pub(crate) fn native_call_record(pc: u64, next_ip: u64) -> Option<u64> {
    native_record(KIND_NATIVE, pc, next_ip)
}

/// [`native_call_record`] for the block at `asm::oxg_native_entry` (`crate::native_entry`).
pub(crate) fn native_entry_record(pc: u64, next_ip: u64) -> Option<u64> {
    native_record(KIND_NATIVE_ENTRY, pc, next_ip)
}

fn native_record(kind: u32, pc: u64, next_ip: u64) -> Option<u64> {
    record(
        ProbeRec {
            kind,
            nmem: 0,
            filtered: false,
            data: 0,
            pc,
            next_ip,
            lanes: Lanes::Whole,
        },
        &[],
    )
}

/// The record of a definedness step (`definedness::StepRec`), with the two fields `run`
/// reads first at the offsets a [`ProbeRec`] has them (`kind`) or not at all, and the
/// flags in `kind`'s padding: one per instruction of the program's code translated (bench
/// `python3`: 190,000, most of its records' 18 MB). With origins on, the instruction's
/// registers (`definedness::reg_use`, 18 bytes that only origins read) follow it in the
/// same allocation: 56 bytes without them, not 80.
#[repr(C)]
struct DefinednessRec {
    kind: u32,
    writes_rsp: bool,
    call_or_ret: bool,
    /// The record is followed by the instruction's `origins::RegUse`.
    has_reg_use: bool,
    pc: u64,
    ins: Instruction,
}

const _: () = assert!(core::mem::size_of::<DefinednessRec>() == 56);

/// Where a [`DefinednessRec`] at `p` keeps its `RegUse` (when it has one).
fn reg_use_at(p: u64) -> u64 {
    let align = core::mem::align_of::<crate::definedness::RegUse>() as u64;
    (p + core::mem::size_of::<DefinednessRec>() as u64).next_multiple_of(align)
}

/// Makes the record of the definedness step before `ins` (`definedness::step`).
pub(crate) fn definedness_record(ins: &Instruction) -> Option<u64> {
    let has_reg_use = crate::definedness::records_reg_use();
    let size = if has_reg_use {
        (reg_use_at(0) as usize) + core::mem::size_of::<crate::definedness::RegUse>()
    } else {
        core::mem::size_of::<DefinednessRec>()
    };
    let p = store_alloc(size)? as *mut DefinednessRec;
    // SAFETY: fresh memory from the store, aligned for it (`STORE_ALIGN`), `size` bytes:
    // the record and, when it has one, its `RegUse` at `reg_use_at` (aligned for it,
    // within `size`).
    unsafe {
        p.write(DefinednessRec {
            kind: KIND_DEFINEDNESS,
            writes_rsp: crate::definedness::writes_rsp(ins),
            call_or_ret: crate::definedness::is_call_or_ret(ins),
            has_reg_use,
            pc: ins.ip(),
            ins: *ins,
        });
        if has_reg_use {
            (reg_use_at(p as u64) as *mut crate::definedness::RegUse)
                .write(crate::definedness::reg_use(ins));
        }
    }
    Some(p as u64)
}

fn plain_record(kind: u32, ins: &Instruction, data: u64) -> Option<u64> {
    record(
        ProbeRec {
            kind,
            nmem: 0,
            filtered: false,
            data,
            pc: ins.ip(),
            next_ip: ins.next_ip(),
            lanes: Lanes::Whole,
        },
        &[],
    )
}

/// Stores record `r` and its memory operands `mem` (`r.nmem` of them).
fn record(r: ProbeRec, mem: &[UsedMemory]) -> Option<u64> {
    debug_assert_eq!(r.nmem as usize, mem.len());
    let size = operands_at(0) as usize + core::mem::size_of_val(mem);
    let p = store_alloc(size)? as *mut ProbeRec;
    // SAFETY: fresh memory from the store, aligned for both types (`STORE_ALIGN`), `size`
    // bytes: the record, then its operands at `operands_at`.
    unsafe {
        p.write(r);
        let ops = operands_at(p as u64) as *mut UsedMemory;
        core::ptr::copy_nonoverlapping(mem.as_ptr(), ops, mem.len());
    }
    Some(p as u64)
}

/// The guest registers of a tool call, lent through the context while the call runs
/// ([`crate::guest_regs_in_tool_call`]); the previous loan is restored when dropped
/// (calls nest: a fault inside a probe's tool call).
pub(crate) struct ToolRegsLent {
    slot: *const core::sync::atomic::AtomicU64,
    prev: u64,
}

/// The loan of [`ToolRegsLent::gate_caller`]: no `GuestRegs` of its own, but the registers
/// saved in the context, as the gate's return will leave them ([`lent_regs`] builds them
/// when asked). Never a `GuestRegs`'s address, which is 8-byte aligned and not 1.
pub(crate) const LENT_GATE_CALLER: u64 = 1;

impl ToolRegsLent {
    pub(crate) fn new(ctx: &ThreadCtx, regs: &GuestRegs) -> ToolRegsLent {
        Self::lend(ctx, regs as *const GuestRegs as u64)
    }

    /// Lends the registers of a native call out of the code cache (the gates' and their
    /// dispatcher fall-back's) without copying them: they are `ctx.gregs` and
    /// `ctx.gflags` with the return address popped, which nothing rewrites while the
    /// call runs (it runs natively with signals deferred: no dispatcher entry on this
    /// thread until it returns). An allocator call copied 16 registers for a loan that
    /// Massif's heap path never reads: about 35 of the gate's 69 instructions per call.
    pub(crate) fn gate_caller(ctx: &ThreadCtx) -> ToolRegsLent {
        Self::lend(ctx, LENT_GATE_CALLER)
    }

    fn lend(ctx: &ThreadCtx, value: u64) -> ToolRegsLent {
        // A load and a store, not a swap (a locked exchange, most of a short native call's
        // cost): only this thread reads or writes its slot, and a nested loan (a signal
        // between the two) restores what it found before this store runs.
        let prev = ctx.tool_regs.load(Ordering::Relaxed);
        ctx.tool_regs.store(value, Ordering::Relaxed);
        ToolRegsLent {
            slot: &ctx.tool_regs,
            prev,
        }
    }
}

/// The registers a loan's slot value `p` (non-zero) stands for (`ToolRegsLent`).
///
/// # Safety
/// `p` was read from `ctx.tool_regs` on `ctx`'s own thread, while the loan it names is in
/// force (the slot is cleared or restored before a loan's registers go away).
pub(crate) unsafe fn lent_regs(ctx: &ThreadCtx, p: u64) -> GuestRegs {
    if p == LENT_GATE_CALLER {
        let mut regs = GuestRegs {
            gpr: ctx.gregs,
            rip: 0,
            rflags: ctx.gflags,
        };
        return_to_caller(&mut regs);
        return regs;
    }
    // SAFETY: any other value is the address of a `GuestRegs` on this thread's engine
    // stack, alive while its loan is (the caller's contract).
    unsafe { *(p as *const GuestRegs) }
}

impl Drop for ToolRegsLent {
    fn drop(&mut self) {
        // SAFETY: the context outlives every tool call made on its thread (contexts are
        // never unmapped), and the guard lives within one such call.
        unsafe { (*self.slot).store(self.prev, Ordering::Relaxed) };
    }
}

/// The guest registers of a call to the gate (`asm::oxg_run_native`) as the gate's `ret`
/// will leave them (its return address popped), in place: an unwinder starts there, in a
/// function with call-frame information, not in the gate (`Host` stack captures of a hook
/// run natively). [`lent_regs`] applies it to a [`ToolRegsLent::gate_caller`] loan.
#[inline]
fn return_to_caller(regs: &mut GuestRegs) {
    let sp = regs.gpr[c::RSP];
    // SAFETY: the gate is reached only by `run_native`'s `call`, which has just pushed
    // its return address at the guest's `rsp`, or by a jump from an entry point of the
    // embedder's that the program called (`crate::native_entry`): mapped and 8-byte
    // readable either way (and left so while the call runs: it runs on the engine stack).
    regs.rip = unsafe { core::ptr::read_unaligned(sp as *const u64) };
    regs.gpr[c::RSP] = sp + 8;
}

/// The guest register `r` as saved in the context by the gate or the dispatcher.
#[inline(always)]
fn saved(ctx: &ThreadCtx, r: usize) -> u64 {
    // One register at a time: the routine has just stored them 8 bytes at a time, and a
    // wider load spanning two of those stores cannot be forwarded from them.
    // SAFETY: a plain read of this thread's own context.
    unsafe { core::ptr::read_volatile(&ctx.gregs[r]) }
}

/// The call `crate::run_native` asked for, on the engine stack, with the registers of its
/// caller, saved in the context, lent to the embedder ([`ToolRegsLent::gate_caller`]).
fn native_call(ctx: &ThreadCtx) {
    let _lent = ToolRegsLent::gate_caller(ctx);
    let _native = NativeCall::new(ctx);
    let (f, data) = (saved(ctx, c::RSI), saved(ctx, c::RDI));
    // SAFETY: `crate::run_native` is the only caller of `oxg_run_native`, and passes a
    // function of this type in rsi and its argument in rdi.
    let f: unsafe extern "C" fn(*mut u8) = unsafe { core::mem::transmute(f) };
    // SAFETY: as `run_native` asked; the guest state is saved in the context, and this
    // runs on the engine stack with signals deferred, as every clean call.
    unsafe { f(data as *mut u8) };
}

/// Counts a native call in flight on this thread (`ThreadCtx::native_calls`), for the
/// signal entry: a fatal signal there goes to the embedder (`Config::on_fatal_in_native`).
struct NativeCall<'a>(&'a ThreadCtx);

impl<'a> NativeCall<'a> {
    fn new(ctx: &'a ThreadCtx) -> Self {
        // A load and a store, not a locked add: only this thread writes its own count (as
        // `ToolRegsLent`), and a signal between the two restores what it found.
        let n = ctx.native_calls.load(Ordering::Relaxed);
        ctx.native_calls.store(n + 1, Ordering::Relaxed);
        NativeCall(ctx)
    }
}

impl Drop for NativeCall<'_> {
    fn drop(&mut self) {
        let n = self.0.native_calls.load(Ordering::Relaxed);
        self.0.native_calls.store(n - 1, Ordering::Relaxed);
    }
}

/// The translation of `asm::oxg_run_native` calls this through `asm::oxg_native_gate`,
/// which has just saved the guest's registers in the context: the native call without a
/// dispatcher entry (`translate::Emitter::native_gate_call`).
///
/// # Safety
/// Only from `oxg_native_gate`, with `ctx` the calling thread's context.
pub(crate) unsafe extern "C" fn native_gate(ctx: *mut ThreadCtx) {
    // SAFETY: the caller's contract.
    native_call(unsafe { &*ctx });
}

/// The call an embedder's entry point asked for by jumping to `asm::oxg_native_entry`
/// (`crate::native_entry`), with the registers of the program's call, saved in the
/// context (rsp at the program's return address), lent to the embedder as the entry's
/// return will leave them ([`ToolRegsLent::gate_caller`]). Returns the function's result,
/// the guest's `rax` after it. The dispatcher's fall-back (`KIND_NATIVE_ENTRY`); the
/// translation's own gate, `asm::oxg_native_entry_gate`, makes the same call in assembly
/// (keep the two alike).
fn native_entry_call(ctx: &ThreadCtx) -> u64 {
    let _lent = ToolRegsLent::gate_caller(ctx);
    let _native = NativeCall::new(ctx);
    // SAFETY: `asm::oxg_native_entry` is reached only by the embedder's entry points, which
    // put a function of this type in r11 (`crate::native_entry`'s contract).
    let f: unsafe extern "C" fn(u64, u64, u64, u64, u64, u64) -> u64 =
        unsafe { core::mem::transmute(saved(ctx, c::R11)) };
    // SAFETY: as the embedder asked; the guest state is saved in the context, and this runs
    // on the engine stack with signals deferred, as every clean call.
    unsafe {
        f(
            saved(ctx, c::RDI),
            saved(ctx, c::RSI),
            saved(ctx, c::RDX),
            saved(ctx, c::RCX),
            saved(ctx, c::R8),
            saved(ctx, c::R9),
        )
    }
}

/// What a stored probe record is, for the census (`crate::census`).
pub(crate) enum RecordKind {
    /// A definedness step: the guest pc and instruction.
    Definedness(u64, &'static Instruction),
    /// Any other probe: its pc and kind's name.
    Other(u64, &'static str),
}

/// Names the record at `rec` (a `ProbeRec` or a `DefinednessRec` from [`STORE`]).
pub(crate) fn describe_record(rec: u64) -> RecordKind {
    // SAFETY: as in `run`: every record starts with its kind, is written once and never
    // freed; the kind says which it is.
    unsafe {
        if *(rec as *const u32) == KIND_DEFINEDNESS {
            let d = &*(rec as *const DefinednessRec);
            return RecordKind::Definedness(d.pc, &d.ins);
        }
        let r = &*(rec as *const ProbeRec);
        let name = match r.kind {
            KIND_ACCESSES => "accesses",
            KIND_PC => "pc",
            KIND_TRACE => "trace",
            KIND_TRACE_FULL => "trace full",
            KIND_CLIENT_REQUEST => "client request",
            KIND_NATIVE => "native call",
            KIND_NATIVE_ENTRY => "native entry",
            _ => "unknown",
        };
        RecordKind::Other(r.pc, name)
    }
}

/// Runs the probe whose record the call site passed (from `dispatch`, with the guest
/// state saved in `ctx` and its XSAVE area).
pub(crate) fn run(ctx: &mut ThreadCtx, rec: u64) {
    // SAFETY: every record (a `ProbeRec` or a `DefinednessRec`, both `repr(C)`) starts
    // with its kind; records are written once at translation and never freed.
    if unsafe { *(rec as *const u32) } == KIND_DEFINEDNESS {
        // SAFETY: as above; the kind says which record this is.
        let d = unsafe { &*(rec as *const DefinednessRec) };
        let regs_used = if d.has_reg_use {
            // SAFETY: `has_reg_use` says a `RegUse` follows the record, written with it.
            Some(unsafe { &*(reg_use_at(rec) as *const crate::definedness::RegUse) })
        } else {
            None
        };
        let regs = GuestRegs {
            gpr: ctx.gregs,
            rip: d.pc,
            rflags: ctx.gflags,
        };
        let _lent = ToolRegsLent::new(ctx, &regs);
        if let Some(cl) = client() {
            let step = crate::definedness::StepRec {
                ins: &d.ins,
                writes_rsp: d.writes_rsp,
                call_or_ret: d.call_or_ret,
                regs: regs_used,
            };
            crate::definedness::step(ctx, &step, d.pc, cl);
        }
        return;
    }
    let ops = operands_of(rec);
    // SAFETY: as above: any other kind is a `ProbeRec`.
    let rec = unsafe { &*(rec as *const ProbeRec) };
    let regs = GuestRegs {
        gpr: ctx.gregs,
        rip: rec.pc,
        rflags: ctx.gflags,
    };
    if rec.kind == KIND_NATIVE {
        native_call(ctx);
        return;
    }
    if rec.kind == KIND_NATIVE_ENTRY {
        ctx.gregs[c::RAX] = native_entry_call(ctx);
        return;
    }
    let _lent = ToolRegsLent::new(ctx, &regs);
    let Some(cl) = client() else {
        // Without a tool only the engine's own requests are answered.
        if rec.kind == KIND_CLIENT_REQUEST {
            client_request(ctx, None, &regs);
        }
        return;
    };
    // Only the access probes need the buffer: zeroing its 68 entries cost definedness's
    // step, which runs before every instruction, a tenth of its time.
    let buf = || {
        [Access {
            addr: 0,
            size: 0,
            kind: AccessKind::Read,
            conditional: false,
        }; MAX_ACCESSES]
    };
    match rec.kind {
        KIND_PC => cl
            .embedder
            .call(true, &mut || cl.tool.on_pc(cl.host, &regs, rec.data)),
        KIND_ACCESSES => {
            let mut buf = buf();
            let n = accesses(ctx, rec, ops, &mut buf);
            if n > 0 {
                cl.embedder.call(true, &mut || {
                    cl.tool.on_accesses(cl.host, &buf[..n], &regs, rec.data)
                });
            }
        }
        KIND_TRACE => {
            let mut buf = buf();
            let n = accesses(ctx, rec, ops, &mut buf);
            let shadow = crate::shadow::base();
            for a in &buf[..n] {
                if rec.filtered && (shadow == 0 || shadow_clear(shadow, a.addr, a.size)) {
                    continue;
                }
                let kind = match a.kind {
                    AccessKind::Read => TraceKind::Read,
                    AccessKind::Write => TraceKind::Write,
                    AccessKind::Modify => TraceKind::Modify,
                };
                let size = a.size.min(u16::MAX as u32) as u16;
                let swaps = crate::recent_lines::note(ctx, a.addr, a.size as u64);
                crate::trace::push(
                    ctx,
                    TraceRecord::new(a.addr, rec.data as u32, size, kind).with_swaps(swaps),
                );
            }
        }
        KIND_TRACE_FULL => crate::trace::drain(ctx, false),
        KIND_CLIENT_REQUEST => client_request(ctx, Some(cl), &regs),
        _ => {}
    }
}

/// Tells the tool that the guest instruction at `pc` made a memory access the CPU refused
/// (`Tool::on_memory_fault`): its accesses are computed from `gpr` and `rflags`, the
/// guest's registers at the fault (the signal context, already in guest terms). Called
/// from the signal entry with signals deferred.
///
/// All of it (the decoding, the accesses' table, the tool) runs on the engine stack, which
/// is free while the thread runs translated code (every dispatcher entry starts at its
/// top): the signal entry may be on the program's alternate stack, which is small (Rust's
/// is 8 KiB a thread, of which the kernel's frame with the AVX-512 state takes about 3),
/// and a fault reported from there overflowed it: the process died of a second SIGSEGV
/// without its report.
pub(crate) fn memory_fault(
    ctx: &mut ThreadCtx,
    fault: &oxgrind_tool::MemoryFault,
    pc: u64,
    gpr: [u64; 16],
    rflags: u64,
) {
    let top = ctx.estack;
    let mut call = || memory_fault_here(ctx, fault, pc, gpr, rflags);
    // SAFETY: `estack` is the top of this thread's engine stack, unused while the thread
    // runs translated code (the fault stopped it there: faults inside the engine never get
    // here), and at least a page below the context's guard.
    unsafe { call_on_stack(top, &mut call) };
}

/// [`memory_fault`]'s work, on the engine stack.
#[inline(never)]
fn memory_fault_here(
    ctx: &mut ThreadCtx,
    fault: &oxgrind_tool::MemoryFault,
    pc: u64,
    gpr: [u64; 16],
    rflags: u64,
) {
    let Some(cl) = client() else { return };
    let mut bytes = [0u8; 15];
    let n = oxgrind_sys::raw::read_own_memory(pc, &mut bytes);
    if n == 0 {
        return;
    }
    let ins =
        iced_x86::Decoder::with_ip(64, &bytes[..n], pc, iced_x86::DecoderOptions::NONE).decode();
    if ins.is_invalid() {
        return;
    }
    let mut mem = [UsedMemory::default(); MAX_MEM];
    let nmem = used_memory(&ins, &mut mem);
    // Operands whole: the vector state (masks, indices) is in the signal frame, not in the
    // context the lanes are read from; the CPU faulted on an enabled element anyway.
    let rec = ProbeRec {
        kind: KIND_ACCESSES,
        nmem: nmem as u32,
        filtered: false,
        data: 0,
        pc,
        next_ip: ins.next_ip(),
        lanes: Lanes::Whole,
    };
    // The context's copy of the guest registers is the dispatcher's, rewritten at its next
    // entry; the addresses are computed from the fault's (put back afterwards all the same).
    let saved = ctx.gregs;
    ctx.gregs = gpr;
    let mut buf = [Access {
        addr: 0,
        size: 0,
        kind: AccessKind::Read,
        conditional: false,
    }; MAX_ACCESSES];
    let n = accesses(ctx, &rec, &mem[..nmem], &mut buf);
    ctx.gregs = saved;
    let regs = GuestRegs {
        gpr,
        rip: pc,
        rflags,
    };
    let _lent = ToolRegsLent::new(ctx, &regs);
    cl.embedder.call(true, &mut || {
        cl.tool.on_memory_fault(cl.host, fault, &buf[..n], &regs)
    });
}

/// Runs `f` on the stack whose top is `top` (16-byte aligned here), then returns to the
/// caller's stack.
///
/// # Safety
/// `top` must be the top of a stack no one else uses meanwhile, large enough for `f`.
unsafe fn call_on_stack(top: u64, f: &mut dyn FnMut()) {
    extern "C" fn trampoline(f: *mut &mut dyn FnMut()) {
        // SAFETY: `f` points at the caller's `&mut dyn FnMut()`, alive across the call.
        unsafe { (*f)() }
    }
    let mut f = f;
    let fp: *mut &mut dyn FnMut() = &mut f;
    // SAFETY: per the caller, `top` is a free stack; r12 (callee-saved, so `trampoline`
    // keeps it) holds the caller's stack pointer across the call, which is made with an
    // aligned stack as the ABI wants; every caller-saved register is declared clobbered.
    unsafe {
        core::arch::asm!(
            "mov r12, rsp",
            "mov rsp, {top}",
            "call {tramp}",
            "mov rsp, r12",
            top = in(reg) top & !15,
            tramp = sym trampoline,
            in("rdi") fp,
            out("r12") _,
            clobber_abi("C"),
        )
    };
}

/// Most accesses one instruction is reported with: a 64-lane gather, or the runs of a
/// byte-masked 64-byte operand (at most 32), plus the other operands.
const MAX_ACCESSES: usize = 64 + MAX_MEM;

/// Whether every granule of `[addr, addr + size)` has a zero shadow byte.
fn shadow_clear(base: u64, addr: u64, size: u32) -> bool {
    // SAFETY: `base` is the engine's shadow reservation (`shadow::reserve`).
    let map = unsafe { oxgrind_tool::instrument::ShadowMap::new(base, |_, _| {}) };
    map.all_clear(addr, size as u64)
}

/// `valgrind.h`'s client request: `rax` points at six words (the request code and its
/// arguments), the default result is in `rdx`, and the result goes back in `rdx`.
/// `RUNNING_ON_VALGRIND` is answered here, for every tool and without one, as Valgrind's
/// core answers it (the number of Valgrinds the program runs under: one); the embedder's
/// core requests (`Config::core_requests`) come next, then the tool's.
fn client_request(ctx: &mut ThreadCtx, cl: Option<Client>, regs: &GuestRegs) {
    const RUNNING_ON_VALGRIND: u64 = 0x1001;
    let p = ctx.gregs[c::RAX];
    let mut bytes = [0u8; 48];
    if p == 0 || oxgrind_sys::raw::read_own_memory(p, &mut bytes) != bytes.len() {
        return;
    }
    let mut args = [0u64; 6];
    for (a, w) in args.iter_mut().zip(bytes.chunks_exact(8)) {
        *a = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
    }
    let mut result = None;
    // SAFETY: GLOBAL is written once before takeover and only read afterwards.
    let core = unsafe { crate::dispatch::GLOBAL.get_unchecked().core_requests };
    if args[0] == RUNNING_ON_VALGRIND {
        result = Some(1);
    } else if let Some(v) = core.and_then(|f| f(&args, regs)) {
        result = Some(v);
    } else if let Some(cl) = cl {
        cl.embedder.call(false, &mut || {
            result = cl.tool.client_request(cl.host, &args, regs)
        });
    }
    if let Some(v) = result {
        ctx.gregs[c::RDX] = v;
    }
}

/// The accesses of `rec`, whose memory operands are `mem`.
fn accesses(ctx: &mut ThreadCtx, rec: &ProbeRec, mem: &[UsedMemory], out: &mut [Access]) -> usize {
    let mut n = 0;
    let mut push = |a: Access| {
        if n < out.len() {
            out[n] = a;
            n += 1;
        }
    };
    for (i, m) in mem.iter().enumerate() {
        let (kind, conditional) = match m.access() {
            OpAccess::Read => (AccessKind::Read, false),
            OpAccess::CondRead => (AccessKind::Read, true),
            OpAccess::Write => (AccessKind::Write, false),
            OpAccess::CondWrite => (AccessKind::Write, true),
            OpAccess::ReadWrite => (AccessKind::Modify, false),
            OpAccess::ReadCondWrite => (AccessKind::Modify, true),
            _ => continue,
        };
        let size = m.memory_size().size() as u32;
        let at = |addr, size, conditional| Access {
            addr,
            size,
            kind,
            conditional,
        };
        // Only the instruction's vector operand (its first memory operand) has lanes.
        let lanes = if i == 0 { rec.lanes } else { Lanes::Whole };
        match lanes {
            Lanes::Whole => {
                let addr =
                    m.virtual_address(0, |r, el, el_size| register_value(ctx, rec, r, el, el_size));
                if let Some(addr) = addr {
                    push(at(addr, size, conditional));
                }
            }
            Lanes::Vsib { elems, mask } => {
                let enabled = mask_bits(ctx, mask, elems as usize, size as usize);
                for e in 0..elems as usize {
                    if enabled & (1 << e) == 0 {
                        continue;
                    }
                    let addr = m.virtual_address(e, |r, el, el_size| {
                        register_value(ctx, rec, r, el, el_size)
                    });
                    if let Some(addr) = addr {
                        push(at(addr, size, true));
                    }
                }
            }
            Lanes::Masked { elems, elem, mask } => {
                let Some(base) =
                    m.virtual_address(0, |r, el, el_size| register_value(ctx, rec, r, el, el_size))
                else {
                    continue;
                };
                let mut bits = mask_bits(ctx, mask, elems as usize, elem as usize);
                // One access per run of enabled elements.
                while bits != 0 {
                    let first = bits.trailing_zeros();
                    let run = (bits >> first).trailing_ones();
                    let addr = base + (first * elem as u32) as u64;
                    push(at(addr, run * elem as u32, true));
                    bits &= !(u64::MAX >> (64 - run) << first);
                }
            }
            Lanes::Packed { elem, mask } => {
                let Some(base) =
                    m.virtual_address(0, |r, el, el_size| register_value(ctx, rec, r, el, el_size))
                else {
                    continue;
                };
                let elems = (size / elem as u32) as usize;
                let count = mask_bits(ctx, mask, elems, elem as usize).count_ones();
                if count > 0 {
                    push(at(base, count * elem as u32, true));
                }
            }
        }
    }
    n
}

/// The elements `0..elems` that `mask` enables, as a bit set: all for `Register::None`;
/// for an opmask register (`k0`-`k7`), its low `elems` bits; for a vector register, the
/// sign bit of each `elem_size`-byte element. All when the state cannot be read.
fn mask_bits(ctx: &ThreadCtx, mask: Register, elems: usize, elem_size: usize) -> u64 {
    let all = if elems >= 64 {
        u64::MAX
    } else {
        (1u64 << elems) - 1
    };
    if mask == Register::None {
        return all;
    }
    if (Register::K0 as u32..=Register::K7 as u32).contains(&(mask as u32)) {
        return opmask(ctx, mask.number()).map_or(all, |k| k & all);
    }
    let mut bits = 0u64;
    for e in 0..elems.min(64) {
        // The sign bit is the top bit of the element's last byte.
        let mut top = [0u8; 1];
        if !vector_bytes(ctx, mask, (e + 1) * elem_size - 1, &mut top) {
            return all;
        }
        if top[0] & 0x80 != 0 {
            bits |= 1 << e;
        }
    }
    bits
}

/// Standard-format XSAVE area offsets of the components probes read (CPUID 0xD, sub-leaf
/// `i`): 2 = upper halves of ymm0-15, 5 = opmask k0-k7, 6 = upper halves of zmm0-15,
/// 7 = zmm16-31. 0 when the CPU lacks the component.
fn xsave_offset(component: u32) -> usize {
    static OFF: [AtomicU64; 8] = [const { AtomicU64::new(u64::MAX) }; 8];
    let v = OFF[component as usize].load(Ordering::Relaxed);
    if v != u64::MAX {
        return v as usize;
    }
    let l = core::arch::x86_64::__cpuid_count(0xD, component);
    let off = if l.eax == 0 { 0 } else { l.ebx as u64 };
    OFF[component as usize].store(off, Ordering::Relaxed);
    off as usize
}

/// Whether the saved XSAVE area holds component `c` (its `XSTATE_BV` bit); when it does
/// not, the component is in its initial state (all zeroes) and its bytes there are stale.
fn xsave_has(area: *const u8, c: u32) -> bool {
    // SAFETY: XSTATE_BV is the first u64 of the XSAVE header at offset 512, inside the
    // area the dispatcher entry just wrote.
    let bv = unsafe { (area.add(512) as *const u64).read_unaligned() };
    bv & (1 << c) != 0
}

fn xsave_area(ctx: &ThreadCtx) -> *const u8 {
    (ctx as *const ThreadCtx as *const u8).wrapping_add(c::XSAVE_OFF)
}

/// Opmask register `k<num>` from the saved XSAVE area.
pub(crate) fn opmask(ctx: &ThreadCtx, num: usize) -> Option<u64> {
    let off = xsave_offset(5);
    if off == 0 || num > 7 {
        return None;
    }
    let area = xsave_area(ctx);
    if !xsave_has(area, 5) {
        return Some(0);
    }
    // SAFETY: the opmask component is inside the saved area (its offset is below the
    // XSAVE size the engine checked at start-up against `XSAVE_SIZE`).
    Some(unsafe { (area.add(off + 8 * num) as *const u64).read_unaligned() })
}

/// Copies bytes `[at, at+out.len())` of vector register `r` (xmm, ymm or zmm 0-31) from
/// the saved XSAVE area. False when the state is not there.
fn vector_bytes(ctx: &ThreadCtx, r: Register, at: usize, out: &mut [u8]) -> bool {
    vector_reg_bytes(ctx, r.number(), at, out)
}

/// [`vector_bytes`] of `zmm<num>`.
pub(crate) fn vector_reg_bytes(ctx: &ThreadCtx, num: usize, at: usize, out: &mut [u8]) -> bool {
    if num >= 32 || at + out.len() > 64 {
        return false;
    }
    let area = xsave_area(ctx);
    // The register's pieces: (first byte, end, component, offset of the first byte in the
    // area), copied a piece at a time: the definedness interpreter reads whole registers
    // at every slow step (a byte at a time, bench `compute` with definedness took twice
    // as long).
    let pieces: [(usize, usize, u32, usize); 3] = if num >= 16 {
        [
            (0, 64, 7, xsave_offset(7) + 64 * (num - 16)),
            (64, 64, 1, 0),
            (64, 64, 1, 0),
        ]
    } else {
        [
            (0, 16, 1, 160 + 16 * num),
            (16, 32, 2, xsave_offset(2) + 16 * num),
            (32, 64, 6, xsave_offset(6) + 32 * num),
        ]
    };
    let end = at + out.len();
    for (lo, hi, comp, off) in pieces {
        let (a, b) = (lo.max(at), hi.min(end));
        if a >= b {
            continue;
        }
        if comp != 1 && xsave_offset(comp) == 0 {
            return false;
        }
        let dst = &mut out[a - at..b - at];
        if xsave_has(area, comp) {
            // SAFETY: the XSAVE area of this context was just written by the dispatcher
            // entry; the bytes [off + a - lo, off + b - lo) lie inside the component,
            // which is inside the area, and do not overlap `out` (the caller's buffer).
            unsafe {
                core::ptr::copy_nonoverlapping(area.add(off + (a - lo)), dst.as_mut_ptr(), b - a)
            };
        } else {
            dst.fill(0);
        }
    }
    true
}

fn register_value(
    ctx: &mut ThreadCtx,
    rec: &ProbeRec,
    r: Register,
    elem: usize,
    elem_size: usize,
) -> Option<u64> {
    if r.is_gpr() {
        return Some(ctx.gregs[r.full_register().number()]);
    }
    match r {
        Register::RIP | Register::EIP => Some(rec.next_ip),
        Register::ES | Register::CS | Register::SS | Register::DS => Some(0),
        Register::GS => Some(ctx.guest_gs),
        Register::FS => Some(fs_base(ctx)),
        _ if r.is_vector_register() => {
            let mut b = [0u8; 8];
            if !vector_bytes(ctx, r, elem * elem_size, &mut b[..elem_size.min(8)]) {
                return None;
            }
            Some(u64::from_le_bytes(b))
        }
        _ => None,
    }
}

pub(crate) fn fs_base(ctx: &mut ThreadCtx) -> u64 {
    if ctx.fs_base == 0 {
        const SYS_ARCH_PRCTL: usize = 158;
        const ARCH_GET_FS: usize = 0x1003;
        let mut v: u64 = 0;
        // SAFETY: arch_prctl(ARCH_GET_FS) writes one u64 to the pointer given.
        unsafe {
            oxgrind_sys::syscall::syscall2(SYS_ARCH_PRCTL, ARCH_GET_FS, &mut v as *mut u64 as usize)
        };
        ctx.fs_base = v;
    }
    ctx.fs_base
}

/// The flags instruction `ins` writes whatever its operands: iced's `rflags_modified`, less
/// all of them for a shift or rotate whose count may be 0 (a count in `cl`, or an immediate
/// that masks to 0), which leaves every flag as it was. The one rule every "the flags
/// before this are dead" decision of the translator uses (inline checks' saves, where the
/// counter update goes): compilers never read flags across such a shift, hand-written code
/// may.
pub(crate) fn flags_surely_written(ins: &Instruction) -> u32 {
    use iced_x86::{Mnemonic as M, OpKind};
    if !matches!(
        ins.mnemonic(),
        M::Shl | M::Sal | M::Shr | M::Sar | M::Rol | M::Ror | M::Rcl | M::Rcr | M::Shld | M::Shrd
    ) {
        return ins.rflags_modified();
    }
    let count = ins.op_count() - 1;
    let mask = if ins.op0_register().size() == 8 || ins.memory_size().size() == 8 {
        0x3f
    } else {
        0x1f
    };
    match ins.op_kind(count) {
        // (`shl r/m, 1` too: iced gives its implicit count as an immediate 1.)
        OpKind::Immediate8 if u64::from(ins.immediate8()) & mask != 0 => ins.rflags_modified(),
        // A count in `cl`, or an immediate that masks to 0.
        OpKind::Immediate8 | OpKind::Register => 0,
        _ => ins.rflags_modified(),
    }
}

/// Per-instruction liveness of the arithmetic flags: bit `i` of the result is set when
/// some flag may be read after instruction `i` starts, before being overwritten (flags are
/// taken as live wherever the block is left).
pub(crate) fn flags_live_before<'a>(
    insns: impl DoubleEndedIterator<Item = &'a Instruction> + ExactSizeIterator,
) -> u64 {
    const STATUS: u32 = 0x3f;
    let mut live = STATUS;
    let mut out = 0u64;
    for (i, ins) in insns.enumerate().rev() {
        if !matches!(ins.flow_control(), iced_x86::FlowControl::Next) {
            live = STATUS;
        }
        live = (live & !flags_surely_written(ins)) | (ins.rflags_read() & STATUS);
        if live != 0 {
            out |= 1 << i;
        }
    }
    out
}
