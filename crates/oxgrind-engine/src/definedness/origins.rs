//! Origin tracking (`--track-origins=yes`, the tool's `Needs::origins`): after an
//! uninitialised-value error, Memcheck says what made the value undefined (a heap block's
//! allocation, a new stack frame, a client request). Memcheck keeps a 32-bit origin tag per
//! 4 bytes of memory and per register and propagates it beside the V bits; we keep an
//! [`Otag`] per 4-byte granule of memory (a sparse table beside the V-bit shadow) and per
//! register (in the thread's slow-path state), maintained by the slow path only:
//!
//! * **Only undefined bits carry an origin.** Before an instruction, its origin is that of
//!   its first undefined input (a register, the flags, or memory as the interpreter loads
//!   it); after it, each register or memory byte it wrote that holds undefined bits takes
//!   that origin. The inline fast path runs only when every input is defined, so every
//!   output is defined and its (stale) tag is never read: the fast path needs no origin
//!   work, except for the stack moves, which create undefined bits (with origins on they
//!   take the slow path: `fast_form`).
//! * **Sources**: the tool's [`Origin::Heap`] and [`Origin::ClientRequest`] marks
//!   (`set_undefined_from`), and the stack rule's new frames ([`Origin::Stack`]: the pc of
//!   the instruction that moved `rsp` down, or the pc entered by a `call` or `ret`, whose
//!   red zone is then garbage: Memcheck's `nia`).
//!
//! Memcheck combines the tags of an operation's inputs with a maximum, defined inputs
//! included; taking the first undefined input's tag is as cheap and never names the origin
//! of a defined input. Where the table cannot say (a pool exhausted, a granule whose bytes
//! came from two origins), the error is printed without an origin line, as Memcheck's are
//! when its cache lost the tag.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use iced_x86::{Instruction, OpAccess, Register};
use oxgrind_tool::Origin;
use oxgrind_vbits::{FlagShadows, ShadowMemory, ShadowRegisters};

use super::{pieces, reserve, ADDR_LIMIT, PRIMARY_BYTES, SPAN, SPAN_BITS};

static ON: AtomicBool = AtomicBool::new(false);

/// Whether origins are tracked (set once before the engine starts).
#[inline]
pub(crate) fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// An origin tag: 0 = none; else the kind in the low 2 bits and the stack id or pc above
/// them (user pcs are below 2^47, so they fit).
pub(crate) type Otag = u64;

const KIND_HEAP: u64 = 1;
const KIND_STACK: u64 = 2;
const KIND_CLIENT: u64 = 3;

pub(crate) fn encode(origin: Origin) -> Otag {
    match origin {
        Origin::Heap(id) => (id.0 as u64) << 2 | KIND_HEAP,
        Origin::ClientRequest(id) => (id.0 as u64) << 2 | KIND_CLIENT,
        Origin::Stack { pc } => pc << 2 | KIND_STACK,
    }
}

pub(crate) fn decode(tag: Otag) -> Option<Origin> {
    let id = oxgrind_tool::StackId((tag >> 2) as u32);
    match tag & 3 {
        KIND_HEAP => Some(Origin::Heap(id)),
        KIND_CLIENT => Some(Origin::ClientRequest(id)),
        KIND_STACK => Some(Origin::Stack { pc: tag >> 2 }),
        _ => None,
    }
}

/// The tag of new stack made by (or entered at) `pc`.
pub(crate) fn stack(pc: u64) -> Otag {
    encode(Origin::Stack { pc })
}

// ---- memory: one tag per 4-byte granule ----

/// Bytes of memory per tag.
const GRANULE: u64 = 4;
/// Bytes of tags per 64 KiB chunk of memory.
const TAG_CHUNK: u64 = SPAN / GRANULE * 8;
/// Most tag memory the chunks can take (address space only: `MAP_NORESERVE`).
const POOL_BYTES: u64 = 1 << 38;

static PRIMARY: AtomicU64 = AtomicU64::new(0);
static POOL_NEXT: AtomicU64 = AtomicU64::new(0);
static POOL_END: AtomicU64 = AtomicU64::new(0);

/// The tag table's primary (for the inline stack tagging; 0 when origins are off).
pub(crate) fn primary() -> u64 {
    PRIMARY.load(Ordering::Acquire)
}

/// Reserves the tag table and turns origins on (after the V-bit shadow is enabled). False
/// (and origins stay off) if the reservations fail.
pub(crate) fn enable() -> bool {
    if enabled() {
        return true;
    }
    let Some(primary) = reserve(PRIMARY_BYTES, 0) else {
        return false;
    };
    let Some(pool) = reserve(POOL_BYTES, 0) else {
        return false;
    };
    PRIMARY.store(primary, Ordering::Release);
    POOL_NEXT.store(pool, Ordering::Release);
    POOL_END.store(pool + POOL_BYTES, Ordering::Release);
    ON.store(true, Ordering::Release);
    true
}

/// The tag chunk of `addr`'s 64 KiB span (made, all "none", when `make`); 0 when there is
/// none (or none can be made).
fn chunk(addr: u64, make: bool) -> u64 {
    let primary = PRIMARY.load(Ordering::Acquire);
    if primary == 0 || addr >= ADDR_LIMIT {
        return 0;
    }
    // SAFETY: the primary covers every address below ADDR_LIMIT, is never unmapped, and
    // its words are only accessed atomically.
    let e = unsafe { &*((primary + (addr >> SPAN_BITS) * 8) as *const AtomicU64) };
    let cur = e.load(Ordering::Acquire);
    if cur != 0 || !make {
        return cur;
    }
    let fresh = POOL_NEXT.fetch_add(TAG_CHUNK, Ordering::AcqRel);
    if fresh + TAG_CHUNK > POOL_END.load(Ordering::Acquire) {
        return 0;
    }
    match e.compare_exchange(0, fresh, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => fresh,
        // Another thread made it first; this piece of the pool stays untouched.
        Err(other) => other,
    }
}

/// Tags every granule `[addr, addr + len)` touches with `tag`.
pub(crate) fn set_memory(addr: u64, len: u64, tag: Otag) {
    if !enabled() || len == 0 {
        return;
    }
    let len = len.min(ADDR_LIMIT.saturating_sub(addr));
    pieces(addr, len, |a, off, _, n| {
        let c = chunk(a, tag != 0);
        if c == 0 {
            return;
        }
        let first = off as u64 / GRANULE;
        let last = (off + n - 1) as u64 / GRANULE;
        // SAFETY: a tag chunk holds SPAN / GRANULE words; last < SPAN / GRANULE.
        let tags = unsafe {
            core::slice::from_raw_parts_mut(
                (c as *mut u64).add(first as usize),
                (last - first + 1) as usize,
            )
        };
        tags.fill(tag);
    });
}

/// The tag of the granule holding `addr`.
pub(crate) fn memory(addr: u64) -> Otag {
    let c = chunk(addr, false);
    if c == 0 {
        return 0;
    }
    let i = (addr & (SPAN - 1)) / GRANULE;
    // SAFETY: i < SPAN / GRANULE, within the tag chunk.
    unsafe { *(c as *const u64).add(i as usize) }
}

/// Copies the tags of `len` bytes from `src` to `dst` (`realloc`), granule by granule.
pub(crate) fn copy_memory(src: u64, dst: u64, len: u64) {
    if !enabled() {
        return;
    }
    let mut i = 0;
    while i < len {
        let tag = memory(src + i);
        if tag != 0 {
            set_memory(dst + i, GRANULE.min(len - i), tag);
        }
        i += GRANULE;
    }
}

/// The memory shadow with origins: loads note the tag of the first undefined byte read
/// (when no input had one yet), stores of undefined bytes tag their granules with the
/// instruction's origin.
pub(crate) struct TaggedMemory<'a, M: ShadowMemory> {
    pub inner: &'a mut M,
    /// The instruction's origin so far.
    pub origin: Otag,
}

impl<M: ShadowMemory> ShadowMemory for TaggedMemory<'_, M> {
    fn load(&mut self, address: u64, out: &mut [u8]) {
        self.inner.load(address, out);
        if self.origin == 0 {
            if let Some(i) = out.iter().position(|&b| b != 0) {
                self.origin = memory(address.wrapping_add(i as u64));
            }
        }
    }

    fn store(&mut self, address: u64, shadow: &[u8]) {
        self.inner.store(address, shadow);
        if self.origin == 0 {
            return;
        }
        // Each run of undefined bytes tags its granules.
        let mut i = 0;
        while i < shadow.len() {
            if shadow[i] == 0 {
                i += 1;
                continue;
            }
            let start = i;
            while i < shadow.len() && shadow[i] != 0 {
                i += 1;
            }
            set_memory(
                address.wrapping_add(start as u64),
                (i - start) as u64,
                self.origin,
            );
        }
    }
}

// ---- registers: one tag per register ----

/// Tags per thread: 16 general registers, 32 vector registers, 8 opmasks, the flags, the
/// x87 stack.
pub(crate) const SLOTS: usize = 58;
const VECTOR_SLOT: usize = 16;
const OPMASK_SLOT: usize = 48;
const FLAGS_SLOT: usize = 56;
const X87_SLOT: usize = 57;

/// The registers an instruction reads and writes, found at translation (iced-x86's
/// instruction info), so the step needs no decoder of its own.
#[derive(Clone, Copy, Default)]
pub(crate) struct RegUse {
    reads: [Register; 8],
    writes: [Register; 8],
    /// Flags read and written, as `FlagShadows` bits.
    flags_read: u8,
    flags_written: u8,
}

/// What `ins` reads and writes, for its step record (empty when origins are off).
pub(crate) fn reg_use(ins: &Instruction) -> RegUse {
    let mut u = RegUse::default();
    if !enabled() {
        return u;
    }
    u.flags_read = FlagShadows::bits_of_iced(ins.rflags_read());
    u.flags_written = FlagShadows::bits_of_iced(ins.rflags_modified());
    crate::probe::with_factory(|f| {
        let (mut nr, mut nw) = (0, 0);
        for r in f.info(ins).used_registers() {
            if slot(r.register()).is_none() {
                continue;
            }
            let (read, write) = match r.access() {
                OpAccess::Read | OpAccess::CondRead => (true, false),
                OpAccess::Write => (false, true),
                OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite => (true, true),
                _ => (false, false),
            };
            if read && nr < u.reads.len() {
                u.reads[nr] = r.register();
                nr += 1;
            }
            if write && nw < u.writes.len() {
                u.writes[nw] = r.register();
                nw += 1;
            }
        }
    });
    u
}

/// The tag slot of register `r`, if it has one.
fn slot(r: Register) -> Option<usize> {
    if r.is_gpr() {
        Some(r.full_register().number())
    } else if r.is_xmm() || r.is_ymm() || r.is_zmm() {
        Some(VECTOR_SLOT + r.number())
    } else if r.is_k() {
        Some(OPMASK_SLOT + r.number())
    } else if r.is_st() {
        Some(X87_SLOT)
    } else {
        None
    }
}

/// Whether the part of the register file `r` names holds undefined bits.
fn undefined(regs: &ShadowRegisters, r: Register) -> bool {
    if r.is_gpr() {
        let v = regs.gpr[r.full_register().number() & 15];
        match r.size() {
            8 => v != 0,
            4 => v as u32 != 0,
            2 => v as u16 != 0,
            _ if matches!(r, Register::AH | Register::CH | Register::DH | Register::BH) => {
                (v >> 8) as u8 != 0
            }
            _ => v as u8 != 0,
        }
    } else if r.is_xmm() || r.is_ymm() || r.is_zmm() {
        let v = &regs.vector[r.number() & 31];
        v[..r.size().min(64)].iter().any(|&b| b != 0)
    } else if r.is_k() {
        regs.opmask[r.number() & 7] != 0
    } else if r.is_st() {
        regs.x87.iter().any(|&v| v != 0)
    } else {
        false
    }
}

/// The origin of the first undefined register (or flag) `u` reads; 0 if none.
pub(crate) fn registers_read(u: &RegUse, regs: &ShadowRegisters, tags: &[Otag; SLOTS]) -> Otag {
    for &r in u.reads.iter().take_while(|&&r| r != Register::None) {
        if undefined(regs, r) {
            if let Some(s) = slot(r) {
                if tags[s] != 0 {
                    return tags[s];
                }
            }
        }
    }
    if regs.flags.any(u.flags_read) {
        return tags[FLAGS_SLOT];
    }
    0
}

/// After the step: each register (and the flags) written that now holds undefined bits
/// takes `origin` (when there is one; else it keeps its old tag).
pub(crate) fn registers_written(
    u: &RegUse,
    regs: &ShadowRegisters,
    tags: &mut [Otag; SLOTS],
    origin: Otag,
) {
    if origin == 0 {
        return;
    }
    for &r in u.writes.iter().take_while(|&&r| r != Register::None) {
        if undefined(regs, r) {
            if let Some(s) = slot(r) {
                tags[s] = origin;
            }
        }
    }
    if regs.flags.any(u.flags_written) {
        tags[FLAGS_SLOT] = origin;
    }
}

/// The tag of general register `n` (a system call's argument).
pub(crate) fn gpr(tags: &[Otag; SLOTS], n: usize) -> Otag {
    tags[n & 15]
}
