//! From the engine's trace records to the simulator's event stream.
//!
//! [`crate::sim::Simulator`] wants, in program order: each instruction executed (its pc and
//! length), its data accesses (address, size, load or store), and the outcome of every
//! conditional and indirect branch. This module is the only place that knows how those are
//! obtained: from the thread's trace buffer (`Needs::trace`). Each translated block gets a
//! [`BlockInfo`] (its instructions, their lengths and what kind of branch ends it) and a
//! block record at every entry; each instruction that touches memory gets a record per
//! access, tagged with the block and the instruction's index. From a thread's records, in
//! order: the block's instructions are fetched one by one up to the instruction whose
//! accesses come next, the rest when the next block starts, and that next block's address
//! tells whether the branch ending this one was taken, or where an indirect one went (the
//! engine ends a block at every control transfer). Nothing runs in the program's thread but
//! the inline appends; the simulation runs a batch at a time.
//!
//! What Valgrind counts, and how each case is reproduced here:
//!
//! Per record the work is kept small, since there is one per access: Ir is counted per block
//! run (every instruction of an entered block runs), and an instruction fetch looks the I1
//! cache up only where it reaches a line the previous instruction of the block did not end
//! on ([`Lookup`]); Valgrind's other lookups hit the most recently used line and change
//! nothing.
//!
//! * **Ir**: every instruction executed, and every entry of a `rep` string instruction (VEX
//!   makes it a one-iteration loop, entered once more with `rcx == 0` to leave it): the
//!   engine puts a `rep` instruction in a block of its own, whose block record is appended at
//!   every entry, the last one included.
//! * **Dr/Dw**: one per load and per store VEX generates. A load followed by a store to the
//!   same address in one instruction (`add [m], r`, `inc [m]`, `cmpxchg`) is merged into one
//!   "modify", counted as a read. A locked read-modify-write other than `cmpxchg`
//!   (`lock add`, `xchg`, `lock xadd`) is a load plus a compare-and-swap in VEX: two reads.
//! * **Bc**: every conditional side exit: `jcc`, `loop*`, `jrcxz` (taken when the next block
//!   is not the fall-through), the exits of a `rep` iteration (`rcx != 0` at each entry:
//!   the entry made accesses; for `repe`/`repne` also whether the comparison continued the
//!   loop: the next block is the instruction again), and the restart exit of a locked
//!   read-modify-write (VEX retries a failed compare-and-swap; never taken here).
//! * **Bi**: every indirect `jmp` and `call` (returns are assumed perfectly predicted); the
//!   target is the next block's address.

use oxgrind_tool::instrument::{
    AccessKind, Addressing, Cond, Flow, Insn, Plan, RepString, TraceKind, TraceRecord,
};

use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crate::sim::Simulator;

/// What the simulator must do for an instruction beyond fetching it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Plain,
    CondJump(Cond),
    /// Indirect `jmp`/`call` through a register (index into `GuestRegs::gpr`).
    IndirectReg(u8),
    /// Indirect `jmp`/`call` through memory: the target is the first value read.
    IndirectMem,
    /// A `rep`/`repe`/`repne` string instruction; `compare`: `cmps`/`scas` (the loop also
    /// ends on the comparison), `repne`: continue while not equal.
    Rep {
        compare: bool,
        repne: bool,
        scas: bool,
        elem: u8,
    },
}

/// Classifies one instruction. A pure function of the instruction, as retranslation needs.
pub fn classify(ins: &Insn) -> (Kind, bool) {
    let kind = match ins.flow {
        Flow::CondJump => ins.cond.map_or(Kind::Plain, Kind::CondJump),
        Flow::IndirectJump | Flow::IndirectCall => match ins.indirect_reg {
            Some(r) => Kind::IndirectReg(r),
            None if !ins.mem().is_empty() => Kind::IndirectMem,
            None => Kind::Plain,
        },
        _ => match ins.rep {
            Some(RepString {
                compare,
                scan,
                repne,
                elem,
            }) => Kind::Rep {
                compare,
                repne,
                scas: scan,
                elem,
            },
            None => Kind::Plain,
        },
    };
    (kind, ins.locked)
}

/// One instruction of a translated block.
#[derive(Debug)]
pub struct Instr {
    /// Index of this instruction's costs in [`Simulator::costs`].
    pub id: u32,
    pub pc: u64,
    pub len: u8,
    pub kind: Kind,
    /// A locked read-modify-write that VEX turns into a load plus a compare-and-swap.
    pub locked_rmw: bool,
    /// Its Dr and Dw per run when they are the same at every run ([`static_accesses`]):
    /// then they are charged per block run, and its records (where the engine did not skip
    /// them as recent lines) only look D1 up.
    pub fixed: Option<(u8, u8)>,
}

/// Dr and Dw of every run of `ins`, when they do not depend on the run: no gather or
/// scatter, no `rep` iteration, and no load and store of one size that could be one
/// "modify" at run time (see [`consume`]). A modify counts as a read, twice for a locked
/// read-modify-write. A conditional operand counts at every run, as VEX makes `cmov`'s
/// load and `cmpxchg`'s store (and as the engine records them); an AVX-512 masked one
/// (Valgrind has no AVX-512) counts as one access of the whole operand.
pub fn static_accesses(ins: &Insn, locked_rmw: bool) -> Option<(u8, u8)> {
    let mem = ins.mem();
    if ins.rep_string() || mem.iter().any(|m| m.addressing == Addressing::Vector) {
        return None;
    }
    let sizes = |k: AccessKind| mem.iter().filter(move |m| m.kind == k).map(|m| m.size);
    if sizes(AccessKind::Read).any(|r| sizes(AccessKind::Write).any(|w| w == r)) {
        return None;
    }
    let (mut reads, mut writes) = (0u8, 0u8);
    for m in mem {
        match m.kind {
            AccessKind::Read => reads += 1,
            AccessKind::Write => writes += 1,
            AccessKind::Modify => reads += 1 + u8::from(locked_rmw),
        }
    }
    Some((reads, writes))
}

/// An instruction fetch that must look the I1 cache up: one whose bytes are not all on
/// the line the previous instruction of the block ended on. The others hit that line,
/// which is the most recently used of its set (only fetches touch I1), so Valgrind's
/// lookup of them changes nothing: they are counted (Ir) but not looked up.
#[derive(Debug)]
pub struct Lookup {
    /// Index of the instruction in its block.
    pub insn: u8,
    pub len: u8,
    pub id: u32,
    pub pc: u64,
}

/// A block's I1 lookups: most blocks have few, kept in the block's first cache line (a
/// block record of a large program finds its block cold: one host miss, not two).
#[derive(Debug)]
#[repr(C)]
pub struct Lookups {
    len: u8,
    inline: [Lookup; INLINE_LOOKUPS],
    more: Vec<Lookup>,
}

const INLINE_LOOKUPS: usize = 3;
const _: () = assert!(core::mem::offset_of!(BlockInfo, lookups) + 8 + 16 * INLINE_LOOKUPS <= 64);

impl Lookups {
    fn new(all: Vec<Lookup>) -> Self {
        let none = || Lookup {
            insn: 0,
            len: 0,
            id: 0,
            pc: 0,
        };
        if all.len() > INLINE_LOOKUPS {
            return Lookups {
                len: u8::MAX,
                inline: core::array::from_fn(|_| none()),
                more: all,
            };
        }
        let len = all.len() as u8;
        let mut it = all.into_iter();
        Lookups {
            len,
            inline: core::array::from_fn(|_| it.next().unwrap_or_else(none)),
            more: Vec::new(),
        }
    }
}

impl core::ops::Deref for Lookups {
    type Target = [Lookup];
    #[inline(always)]
    fn deref(&self) -> &[Lookup] {
        if self.len == u8::MAX {
            &self.more
        } else {
            &self.inline[..self.len as usize]
        }
    }
}

/// A translated block, as its trace records refer to it (by index, in the tag). What a
/// block record reads first (`max_id`, the lookups) comes first, in one cache line.
#[derive(Debug)]
#[repr(C, align(64))]
pub struct BlockInfo {
    /// The largest cost index of its instructions (the simulator's costs are grown to it
    /// once per entry, not at every event).
    pub max_id: u32,
    /// The I1 lookups of a run through the block, in order.
    pub lookups: Lookups,
    pub instrs: Vec<Instr>,
    /// The locked read-modify-writes (indices), whose compare-and-swap restart is a
    /// conditional branch at every run.
    pub locked: Vec<u8>,
}

impl BlockInfo {
    /// `i1_line_bits`: log2 of the simulated I1 line size.
    /// `locked`: the indices of its locked read-modify-writes.
    pub fn new(instrs: Vec<Instr>, i1_line_bits: u32, locked: Vec<u8>) -> Self {
        let mut lookups = Vec::new();
        let mut last_line = None;
        for (i, ins) in instrs.iter().enumerate() {
            let first = ins.pc >> i1_line_bits;
            let last = (ins.pc + (ins.len.max(1) as u64) - 1) >> i1_line_bits;
            if first != last || last_line != Some(first) {
                lookups.push(Lookup {
                    insn: i as u8,
                    len: ins.len,
                    id: ins.id,
                    pc: ins.pc,
                });
            }
            last_line = Some(last);
        }
        BlockInfo {
            max_id: instrs.iter().map(|i| i.id).max().unwrap_or(0),
            instrs,
            lookups: Lookups::new(lookups),
            locked,
        }
    }
}

/// Every translated block, by index: appended by `instrument` on any thread, read by the
/// trace consumer without a lock (a block is published before its first record can exist).
/// Two levels, so that it grows without moving: chunks of [`CHUNK`] slots, made on demand.
pub struct BlockTable {
    chunks: Box<[AtomicPtr<[AtomicPtr<BlockInfo>; CHUNK]>]>,
    next: AtomicU32,
    /// The counted blocks' code lines, for their code-miss records.
    pub lines: LineTable,
}

const CHUNK_BITS: u32 = 12;
const CHUNK: usize = 1 << CHUNK_BITS;
/// Blocks one run may translate: as many as the tags name (retranslations of the same code
/// count again).
/// (One tag bit is left for [`ID_TAG`].)
const MAX_BLOCKS: usize = 1 << (31 - INSN_BITS);

/// Tags of the data records of counted blocks' fixed instructions ([`Tracing::counted_blocks`],
/// [`Instr::fixed`]): this bit, [`ID_TAG_LOCKED`] for a locked read-modify-write, and the
/// instruction's cost index below. Such a record is one D1 lookup, with no block context:
/// a counted block's fetches are all looked up when its record comes (so LL sees a block's
/// I1 misses before its D1 misses, where Valgrind interleaves them instruction by
/// instruction: only the order of LL lookups within a block differs).
const ID_TAG: u32 = 1 << 31;
const ID_TAG_LOCKED: u32 = 1 << 30;

/// The block records of counted blocks carry, in these tag bits above the block index, how
/// many I1 lines their code spans beyond the first ([`LINES_UNKNOWN`]: too many to say).
const LINES_SHIFT: u32 = 25;
const LINES_UNKNOWN: u32 = 31;
const _: () =
    assert!(MAX_BLOCKS == 1 << LINES_SHIFT && (LINES_UNKNOWN << LINES_SHIFT) < ID_TAG_LOCKED);

impl BlockTable {
    pub fn new() -> Self {
        BlockTable {
            chunks: (0..MAX_BLOCKS / CHUNK)
                .map(|_| AtomicPtr::new(core::ptr::null_mut()))
                .collect(),
            next: AtomicU32::new(0),
            lines: LineTable::new(),
        }
    }

    /// Keeps `info` for the rest of the run; its index, or `u32::MAX` when the table is full.
    pub fn push(&self, info: BlockInfo) -> u32 {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let Some(dir) = self.chunks.get(i as usize >> CHUNK_BITS) else {
            return u32::MAX;
        };
        let mut chunk = dir.load(Ordering::Acquire);
        if chunk.is_null() {
            let fresh: Box<[AtomicPtr<BlockInfo>; CHUNK]> = Box::new(core::array::from_fn(|_| {
                AtomicPtr::new(core::ptr::null_mut())
            }));
            let fresh = Box::into_raw(fresh);
            chunk = match dir.compare_exchange(
                core::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => fresh,
                Err(theirs) => {
                    // SAFETY: `fresh` was never published.
                    drop(unsafe { Box::from_raw(fresh) });
                    theirs
                }
            };
        }
        // SAFETY: published chunks are never freed.
        let slot = unsafe { &(*chunk)[i as usize & (CHUNK - 1)] };
        slot.store(Box::leak(Box::new(info)), Ordering::Release);
        i
    }

    /// How many blocks were registered.
    pub fn len(&self) -> u32 {
        self.next.load(Ordering::Acquire).min(MAX_BLOCKS as u32)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    pub fn get(&self, i: u32) -> Option<&'static BlockInfo> {
        let chunk = self
            .chunks
            .get(i as usize >> CHUNK_BITS)?
            .load(Ordering::Acquire);
        if chunk.is_null() {
            return None;
        }
        // SAFETY: published chunks are never freed; non-null slots hold leaked boxes.
        let p = unsafe { (*chunk)[i as usize & (CHUNK - 1)].load(Ordering::Acquire) };
        (!p.is_null()).then(|| unsafe { &*p })
    }
}

impl Default for BlockTable {
    fn default() -> Self {
        Self::new()
    }
}

/// What the replay of a code-miss record needs of its line ([`code_miss`]): the line, and
/// the lookup of the block's that a miss on it charges. Per line of every counted block's
/// code, kept apart from the blocks' descriptions in [`LineTable`], so that a code-miss
/// record reads one 16-byte entry (one host line) where finding the block's description
/// took two or three cold loads (the table's slot, the description, its lookups): ~3% of
/// sqlite3's run under Cachegrind (h22-cgcode's profile).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineEntry {
    /// The pc of the block's first lookup that reaches the line (the line's start when
    /// none does, which a block's contiguous code never leaves).
    pub pc: u64,
    /// That lookup's cost index and length, and its index in the block's lookups.
    pub id: u32,
    pub len: u8,
    pub lookup: Option<u8>,
    /// The lookup starts on the line before (it straddles into this one).
    pub from_before: bool,
}

impl LineEntry {
    /// The entries of `blk`'s code lines `first..=last`, in order, each naming the first
    /// lookup that reaches its line (what [`charge_lookup_miss`] searches for).
    fn of_block(blk: &BlockInfo, first: u64, last: u64, bits: u32) -> Vec<LineEntry> {
        (first..=last)
            .map(|line| match lookup_reaching(&blk.lookups, line, bits) {
                Some(i) => {
                    let l = &blk.lookups[i];
                    LineEntry {
                        pc: l.pc,
                        id: l.id,
                        len: l.len,
                        lookup: Some(i as u8),
                        from_before: l.pc >> bits != line,
                    }
                }
                None => LineEntry {
                    pc: line << bits,
                    id: 0,
                    len: 0,
                    lookup: None,
                    from_before: false,
                },
            })
            .collect()
    }

    /// The I1 line it describes.
    #[inline(always)]
    fn line(&self, bits: u32) -> u64 {
        (self.pc >> bits) + u64::from(self.from_before)
    }
}

/// The [`LineEntry`]s of counted blocks, appended by `instrument` on any thread (a block's
/// lines together, in order) and read by the trace consumer without a lock, as
/// [`BlockTable`]: a block's entries are written before its code can run. A code-miss
/// record's tag is the index of its block's first entry ([`Tracing::code_miss_records`]).
pub struct LineTable {
    chunks: Box<[AtomicPtr<[LineSlot; CHUNK]>]>,
    next: AtomicU32,
}

/// One [`LineEntry`], packed in two words: the pc, then `id | from_before << 32 |
/// len << 40 | lookup << 48 | WRITTEN` (lookup `u8::MAX`: none). 16 bytes, so that an
/// entry never straddles two host lines.
#[repr(C, align(16))]
struct LineSlot {
    pc: AtomicU64,
    charge: AtomicU64,
}

const WRITTEN: u64 = 1 << 63;

/// Entries one run may hold: every block that can be counted ([`MAX_INDEXED_COUNTERS`]
/// bounds them) with the most lines a block's code spans (64 instructions of 15 bytes, on
/// lines of at least 16 bytes), so that the table is never full.
const MAX_LINES: usize = 1 << 26;
const _: () = assert!(
    MAX_LINES >= oxgrind_tool::instrument::MAX_INDEXED_COUNTERS as usize * ((64 * 15) / 16 + 2)
);

impl LineTable {
    pub fn new() -> Self {
        LineTable {
            chunks: (0..MAX_LINES / CHUNK)
                .map(|_| AtomicPtr::new(core::ptr::null_mut()))
                .collect(),
            next: AtomicU32::new(0),
        }
    }

    /// Keeps `entries` for the rest of the run; the index of the first, or `None` when
    /// they do not fit (never: see [`MAX_LINES`]).
    pub fn push(&self, entries: &[LineEntry]) -> Option<u32> {
        let n = u32::try_from(entries.len()).ok()?;
        let first = self.next.fetch_add(n, Ordering::Relaxed);
        if first as usize + entries.len() > MAX_LINES {
            return None;
        }
        for (e, x) in (first..).zip(entries) {
            let slot = self.slot(e)?;
            slot.pc.store(x.pc, Ordering::Relaxed);
            let charge = u64::from(x.id)
                | u64::from(x.from_before) << 32
                | u64::from(x.len) << 40
                | u64::from(x.lookup.unwrap_or(u8::MAX)) << 48
                | WRITTEN;
            slot.charge.store(charge, Ordering::Release);
        }
        Some(first)
    }

    /// Entry `e`'s slot, its chunk made on demand.
    fn slot(&self, e: u32) -> Option<&LineSlot> {
        let dir = self.chunks.get(e as usize >> CHUNK_BITS)?;
        let mut chunk = dir.load(Ordering::Acquire);
        if chunk.is_null() {
            // Made on the heap: 64 KiB on the translating thread's stack, which may be a
            // small one of the program's, would be too much.
            let fresh: Box<[LineSlot]> = (0..CHUNK)
                .map(|_| LineSlot {
                    pc: AtomicU64::new(0),
                    charge: AtomicU64::new(0),
                })
                .collect();
            let fresh = Box::into_raw(fresh) as *mut [LineSlot; CHUNK];
            chunk = match dir.compare_exchange(
                core::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => fresh,
                Err(theirs) => {
                    // SAFETY: `fresh` was never published, and is the slice of `CHUNK`
                    // slots made above.
                    drop(unsafe { Box::from_raw(fresh as *mut [LineSlot]) });
                    theirs
                }
            };
        }
        // SAFETY: published chunks are never freed.
        Some(unsafe { &(*chunk)[e as usize & (CHUNK - 1)] })
    }

    /// Entry `e`, if it was written.
    #[inline(always)]
    pub fn get(&self, e: u32) -> Option<LineEntry> {
        let chunk = self
            .chunks
            .get(e as usize >> CHUNK_BITS)?
            .load(Ordering::Acquire);
        if chunk.is_null() {
            return None;
        }
        // SAFETY: published chunks are never freed.
        let slot = unsafe { &(*chunk)[e as usize & (CHUNK - 1)] };
        let charge = slot.charge.load(Ordering::Acquire);
        if charge & WRITTEN == 0 {
            return None;
        }
        let lookup = (charge >> 48) as u8;
        Some(LineEntry {
            pc: slot.pc.load(Ordering::Relaxed),
            id: charge as u32,
            len: (charge >> 40) as u8,
            lookup: (lookup != u8::MAX).then_some(lookup),
            from_before: charge & 1 << 32 != 0,
        })
    }
}

impl Default for LineTable {
    fn default() -> Self {
        Self::new()
    }
}

/// Instructions per block the access tags can name (the engine's blocks have at most 64).
const INSN_BITS: u32 = 6;

/// How blocks are traced.
#[derive(Clone, Copy, Debug)]
pub struct Tracing {
    /// log2 of the simulated I1 line size.
    pub i1_line_bits: u32,
    /// Records of data accesses (the cache simulation). Without them only `rep`
    /// instructions append access records: whether an entry ran an iteration is a branch
    /// outcome.
    pub data_records: bool,
    /// Runs counted inline for blocks below this index, whose block records are then only
    /// appended where a fetch may change I1 (`Needs::recent_code_lines`, set when branches
    /// are not simulated: their outcomes need every entry's record). 0: every entry
    /// appends its record, which counts the run.
    pub counted_blocks: u32,
    /// Block records at all (with the cache or the branch simulation). Without them a
    /// counted block appends none, and nothing else is recorded: only Ir is counted.
    pub block_records: bool,
    /// The code-lines table names several lines per slot (`Needs::recent_code_lines_ways`
    /// of 2 or more, which the engine then keeps): a counted block appends code-miss
    /// records, never a block record, and its tag names its first [`LineEntry`] instead
    /// of the block (see [`code_miss`]).
    pub code_miss_records: bool,
}

/// Builds the block's [`BlockInfo`] and asks for its trace records. `register_instr` assigns
/// each instruction's cost index (and records its pc for the report); `register_block`
/// keeps the block and returns its index. Returns false if the block could not be traced
/// (more instructions than a tag names; never with the engine's blocks).
pub fn instrument(
    block: &[Insn],
    plan: &mut Plan,
    how: Tracing,
    register_instr: &mut dyn FnMut(u64) -> u32,
    register_block: &mut dyn FnMut(BlockInfo) -> u32,
    register_lines: &mut dyn FnMut(&[LineEntry]) -> Option<u32>,
    register_rep: &mut dyn FnMut(u32, (u8, u8)) -> Option<u32>,
) -> bool {
    let Tracing {
        i1_line_bits,
        data_records,
        counted_blocks,
        block_records,
        code_miss_records,
    } = how;
    if block.is_empty() || block.len() > 1 << INSN_BITS {
        return false;
    }
    let instrs: Vec<Instr> = block
        .iter()
        .map(|ins| {
            let (kind, locked_rmw) = classify(ins);
            Instr {
                id: register_instr(ins.pc),
                pc: ins.pc,
                len: ins.len,
                kind,
                locked_rmw,
                fixed: if data_records {
                    static_accesses(ins, locked_rmw)
                } else {
                    None
                },
            }
        })
        .collect();
    let fixed: Vec<bool> = instrs.iter().map(|i| i.fixed.is_some()).collect();
    let ids: Vec<u32> = instrs.iter().map(|i| i.id).collect();
    // VEX's compare-and-swap of a locked read-modify-write (a modified operand).
    let locked = block
        .iter()
        .enumerate()
        .filter(|(_, ins)| ins.locked && ins.mem().iter().any(|m| m.kind == AccessKind::Modify))
        .map(|(i, _)| i as u8)
        .collect();
    let code_len = block
        .last()
        .map_or(0, |l| (l.pc + l.len as u64).saturating_sub(block[0].pc)) as u32;
    let info = BlockInfo::new(instrs, i1_line_bits, locked);
    let first = block[0].pc >> i1_line_bits;
    let last = (block[0].pc + u64::from(code_len.max(1)) - 1) >> i1_line_bits;
    let lines = (code_miss_records && block_records)
        .then(|| LineEntry::of_block(&info, first, last, i1_line_bits));
    let b = register_block(info);
    if b as usize >= MAX_BLOCKS {
        return false;
    }
    if b < counted_blocks {
        plan.count_indexed(0, b, 1);
        if let Some(lines) = lines {
            let Some(e) = register_lines(&lines) else {
                return false;
            };
            plan.trace_block_new_lines(e, code_len);
        } else if block_records {
            // The record says how many I1 lines the code spans (`LINES_SHIFT`): a run
            // whose fetches all hit is simulated without the block's description.
            let more = (last - first).min(u64::from(LINES_UNKNOWN)) as u32;
            plan.trace_block_new_lines(b | more << LINES_SHIFT, code_len);
        }
    } else {
        plan.trace_block(b);
    }
    for (i, ins) in block.iter().enumerate() {
        let tag = (b << INSN_BITS) | i as u32;
        if data_records && fixed[i] && !ins.mem().is_empty() {
            // Counted per run: only the accesses D1 might miss need records.
            let id = ids[i];
            let tag = if b < counted_blocks && id < ID_TAG_LOCKED {
                let locked = if classify(ins).1 { ID_TAG_LOCKED } else { 0 };
                ID_TAG | locked | id
            } else {
                tag
            };
            plan.trace_new_lines(i, tag);
        } else if let Some((counter, id)) = rep_counted(ins, ids[i])
            .filter(|_| data_records && b < counted_blocks)
            .and_then(|(id, rw)| Some((register_rep(id, rw)?, id)))
        {
            // Its iterations counted inline: each iteration's accesses only look D1 up.
            plan.count_indexed_iterations(i, counter, 1);
            plan.trace_new_lines(i, ID_TAG | id);
        } else if (ins.rep_string() && block_records) || (data_records && !ins.mem().is_empty()) {
            plan.trace_accesses(i, tag);
        }
    }
    true
}

/// A `rep` string instruction whose every iteration makes the same loads and stores (a
/// `movs`, `stos`, `lods`, `cmps` or `scas`): its cost index and (Dr, Dw) per iteration.
/// Its iterations can then be counted inline and its records only look D1 up.
fn rep_counted(ins: &Insn, id: u32) -> Option<(u32, (u8, u8))> {
    let mem = ins.mem();
    if !ins.rep_string()
        || ins.locked
        || id >= ID_TAG_LOCKED
        || mem.is_empty()
        || mem
            .iter()
            .any(|m| m.kind == AccessKind::Modify || m.addressing == Addressing::Vector)
    {
        return None;
    }
    let n = |k: AccessKind| mem.iter().filter(|m| m.kind == k).count() as u8;
    Some((id, (n(AccessKind::Read), n(AccessKind::Write))))
}

/// Where one thread is in its trace: the block it is in, how far its I1 lookups went, and
/// what the merging of a store into the load before it needs.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadState {
    /// The current block's index and description.
    block: Option<(u32, &'static BlockInfo)>,
    /// Its next I1 lookup (index into `lookups`).
    looked_up: usize,
    /// The instruction index of that lookup (`u8::MAX` when none is left): an access of an
    /// instruction before it has no fetch to do first, decided without reading the block.
    next_lookup: u8,
    /// The block made accesses (a `rep` entry ran an iteration).
    accessed: bool,
    /// The last load of the current instruction: (tag, address, size).
    last_read: Option<(u32, u64, u16)>,
    /// The block entered last (a loop enters the same one again: no table lookup).
    last: Option<(u32, &'static BlockInfo)>,
    /// The last code-miss or block record was a code-miss record that missed I1: its block
    /// (the index of its first [`LineEntry`]), line index and the lookup it charged
    /// ([`code_miss`]).
    code_charged: Option<(u32, u16, Option<u8>)>,
}

/// Blocks below this index are counted inline ([`Tracing::counted_blocks`]): their records
/// do not count runs, and their accesses may come without a block record.
#[derive(Clone, Copy, Debug)]
pub struct Counted(pub u32);

/// An instruction index beyond every real one (blocks have at most 64) but below
/// `u8::MAX`, which says no lookup is left: given to [`fetch_to`], it fetches the rest.
const ALL_INSNS: usize = 254;

/// The I1 lookups of the current block's instructions up to and including index `upto`.
#[inline(always)]
fn fetch_to(sim: &mut Simulator, blk: &BlockInfo, st: &mut ThreadState, upto: usize) {
    if (st.next_lookup as usize) <= upto {
        fetch_lookups_to(sim, blk, st, upto);
    }
}

/// [`fetch_to`] when at least one lookup is due.
#[inline(never)]
fn fetch_lookups_to(sim: &mut Simulator, blk: &BlockInfo, st: &mut ThreadState, upto: usize) {
    while let Some(l) = blk.lookups.get(st.looked_up) {
        if l.insn as usize > upto {
            st.next_lookup = l.insn;
            return;
        }
        sim.fetch(l.id, l.pc, l.len as u64);
        st.looked_up += 1;
    }
    st.next_lookup = u8::MAX;
}

/// Enters block `b`: every instruction of it runs (the engine's blocks have one exit), so
/// each is counted once now.
#[inline(always)]
fn start_block(
    sim: &mut Simulator,
    blocks: &BlockTable,
    st: &mut ThreadState,
    b: u32,
    counted: Counted,
) {
    let blk = match st.last {
        Some((last, blk)) if last == b => Some(blk),
        _ => blocks.get(b),
    };
    st.looked_up = 0;
    st.accessed = false;
    st.last_read = None;
    st.block = blk.map(|blk| (b, blk));
    if let Some(blk) = blk {
        sim.block_entered(b, blk.max_id, b >= counted.0);
        st.next_lookup = u8::MAX;
        if b < counted.0 {
            // Its data records carry no block context (see `ID_TAG`): every fetch now.
            for l in blk.lookups.iter() {
                sim.fetch(l.id, l.pc, l.len as u64);
            }
            st.looked_up = blk.lookups.len();
        } else if let Some(l) = blk.lookups.first() {
            // The first instruction is always looked up (nothing says which line the fetch
            // before it was on), and before any of the block's accesses: now.
            sim.fetch(l.id, l.pc, l.len as u64);
            st.looked_up = 1;
            st.next_lookup = blk.lookups.get(1).map_or(u8::MAX, |l| l.insn);
        }
        st.last = Some((b, blk));
    }
}

/// Enters counted block `b` (its record `r`, its code on `more + 1` I1 lines): as
/// [`start_block`] with every fetch looked up, but line by line from the record, without the
/// block's description unless a line misses. A run's lookups touch the block's lines in
/// order, each first by the first lookup that reaches it (a lookup that starts on the line
/// the one before it ended on finds that line most recently used: no change); a lookup
/// misses when a line it is the first to touch misses, once even if both its lines do.
/// The block becomes current again only if one of its access records needs it (see
/// [`consume`]).
#[inline(always)]
fn fetch_lines(
    sim: &mut Simulator,
    blocks: &BlockTable,
    st: &mut ThreadState,
    r: &TraceRecord,
    b: u32,
    more: u32,
) {
    st.block = None;
    let bits = sim.i1_line_bits();
    let first = r.addr >> bits;
    // The lookup charged last in this run (index into the block's lookups).
    let mut charged = None;
    for line in first..=first + u64::from(more) {
        if sim.i1_line_is_miss(line) {
            charge_line_miss(sim, blocks, b, line, bits, &mut charged);
        }
    }
}

/// A counted block's `k`-th I1 line was not among its code-lines slot's ways
/// (`TraceRecord::code_miss`; the block's run is counted inline and appends no block
/// record with such a table): its replay, and the miss charged to the first of the block's
/// lookups that reaches the line, once per run even where one lookup straddles two lines
/// that both missed (the records of one run come together, in line order: another run's
/// would follow the code-miss records of the lines that evicted the line in between, or a
/// block record, which forget the charge; data records between them need not). `first`:
/// the record's tag, the index of the block's first [`LineEntry`] (its line `k` is
/// `first + k`), which is all the replay reads: not the block's description. Inlined
/// into the consume loop, which is compiled for AVX2, so that the set's search
/// ([`Simulator::i1_replace`]) is inlined with its vector compare, not two calls (the
/// runtime's share of sqlite3's samples 24.3% -> 22.3%).
#[inline(always)]
fn code_miss(
    sim: &mut Simulator,
    blocks: &BlockTable,
    st: &mut ThreadState,
    first: u32,
    k: u16,
    evicted: u64,
) {
    end_block(sim, st, None);
    let Some(e) = blocks.lines.get(first.wrapping_add(u32::from(k))) else {
        return;
    };
    if !sim.i1_replace(e.line(sim.i1_line_bits()), evicted) {
        st.code_charged = None;
        return;
    }
    let mut charged = match st.code_charged {
        Some((cb, ck, i)) if cb == first && ck < k => i,
        _ => None,
    };
    if let Some(i) = e.lookup.filter(|&i| charged != Some(i)) {
        charged = Some(i);
        sim.i1_miss(e.id, e.pc, u64::from(e.len));
    }
    st.code_charged = Some((first, k, charged));
}

/// I1 missed on `line` in a run of block `b`: the first of its lookups that reaches the
/// line is charged the miss and its LL lookup, unless it was charged already (a lookup
/// straddling two lines that both missed).
#[inline(never)]
fn charge_line_miss(
    sim: &mut Simulator,
    blocks: &BlockTable,
    b: u32,
    line: u64,
    bits: u32,
    charged: &mut Option<usize>,
) {
    let Some(blk) = blocks.get(b) else { return };
    charge_lookup_miss(sim, blk, line, bits, charged);
}

/// [`charge_line_miss`] with the block's description at hand.
#[inline(always)]
fn charge_lookup_miss(
    sim: &mut Simulator,
    blk: &BlockInfo,
    line: u64,
    bits: u32,
    charged: &mut Option<usize>,
) {
    let Some(i) = lookup_reaching(&blk.lookups, line, bits) else {
        return;
    };
    if *charged != Some(i) {
        *charged = Some(i);
        let l = &blk.lookups[i];
        sim.i1_miss(l.id, l.pc, u64::from(l.len));
    }
}

/// The first of `lookups` whose bytes reach I1 line `line`.
#[inline(always)]
fn lookup_reaching(lookups: &[Lookup], line: u64, bits: u32) -> Option<usize> {
    lookups
        .iter()
        .position(|l| l.pc >> bits <= line && line <= (l.pc + u64::from(l.len.max(1)) - 1) >> bits)
}

/// The current block ends: its remaining instructions are fetched; `next`, the block
/// entered after it (unknown at the end of the run), settles the branch that ended it.
#[inline(always)]
pub fn end_block(sim: &mut Simulator, st: &mut ThreadState, next: Option<u64>) {
    let Some((_, blk)) = st.block else {
        return;
    };
    fetch_to(sim, blk, st, ALL_INSNS);
    st.block = None;
    if !sim.branch_sim() {
        return;
    }
    for &i in &blk.locked {
        // VEX retries a failed compare-and-swap: a side exit, never taken here.
        let ins = &blk.instrs[i as usize];
        sim.cond_branch(ins.id, ins.pc, false);
    }
    if let (Some(last), Some(next)) = (blk.instrs.last(), next) {
        match last.kind {
            Kind::CondJump(_) => {
                sim.cond_branch(last.id, last.pc, next != last.pc + last.len as u64)
            }
            Kind::IndirectReg(_) | Kind::IndirectMem => sim.ind_branch(last.id, last.pc, next),
            Kind::Rep { compare, .. } => {
                // Leaving on rcx == 0 is the exit VEX inverts: "taken" when an iteration ran.
                sim.cond_branch(last.id, last.pc, st.accessed);
                if compare && st.accessed {
                    sim.cond_branch(last.id, last.pc, next == last.pc);
                }
            }
            Kind::Plain => {}
        }
    }
}

/// At the end: each block's instructions are charged once per run of it, with the loads
/// and stores of those whose accesses are the same at every run. `inline_runs`: the runs
/// counted inline, by block index.
pub fn charge_instructions(sim: &mut Simulator, blocks: &BlockTable, inline_runs: &[u64]) {
    for b in 0..blocks.len() {
        if let Some(blk) = blocks.get(b) {
            sim.charge_runs(
                b,
                inline_runs.get(b as usize).copied().unwrap_or(0),
                blk.instrs.iter().map(|i| (i.id, i.fixed.unwrap_or((0, 0)))),
            );
        }
    }
}

/// Feeds one thread's records, in order, to the simulator.
pub fn consume(
    sim: &mut Simulator,
    blocks: &BlockTable,
    counted: Counted,
    st: &mut ThreadState,
    records: &[TraceRecord],
) {
    #[cfg(target_arch = "x86_64")]
    if sim.lookups_use_avx2() {
        // SAFETY: the simulator's caches use AVX2 only when the host has it.
        unsafe { consume_avx2(sim, blocks, counted, st, records) };
        return;
    }
    consume_records(sim, blocks, counted, st, records);
}

/// [`consume`] compiled for AVX2, so that the caches' lookups past a set's most recently
/// used line (`Cache::reorder_avx2`) are inlined into it rather than called.
///
/// # Safety
/// The host must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn consume_avx2(
    sim: &mut Simulator,
    blocks: &BlockTable,
    counted: Counted,
    st: &mut ThreadState,
    records: &[TraceRecord],
) {
    consume_records(sim, blocks, counted, st, records);
}

#[inline(always)]
fn consume_records(
    sim: &mut Simulator,
    blocks: &BlockTable,
    counted: Counted,
    st: &mut ThreadState,
    records: &[TraceRecord],
) {
    for r in records {
        let kind = r.kind();
        if r.tag & ID_TAG != 0 && kind != TraceKind::Block {
            // A fixed instruction's access in a counted block: one D1 lookup.
            let id = r.tag & (ID_TAG_LOCKED - 1);
            let (addr, size) = (r.addr, r.size as u64);
            sim.d1_swaps(addr, size, r.swaps());
            sim.d1_lookup(id, addr, size, kind == TraceKind::Write);
            if r.tag & ID_TAG_LOCKED != 0 && kind == TraceKind::Modify {
                sim.d1_lookup(id, addr, size, false);
            }
            continue;
        }
        if kind == TraceKind::Block {
            if let Some((k, evicted)) = r.code_miss() {
                code_miss(sim, blocks, st, r.tag, k, evicted);
                continue;
            }
            st.code_charged = None;
            end_block(sim, st, Some(r.addr));
            let (b, more) = (r.tag & (MAX_BLOCKS as u32 - 1), r.tag >> LINES_SHIFT);
            if b < counted.0 && more < LINES_UNKNOWN && sim.cache_sim() {
                fetch_lines(sim, blocks, st, r, b, more);
            } else {
                start_block(sim, blocks, st, b, counted);
            }
            continue;
        }
        let (b, i) = (
            r.tag >> INSN_BITS,
            (r.tag & ((1 << INSN_BITS) - 1)) as usize,
        );
        let blk = match st.block {
            Some((cur, blk)) if cur == b => blk,
            _ if b < counted.0 => {
                // An entry whose block record was left out: its fetches all hit the most
                // recently used lines and change nothing, and its run is counted inline.
                end_block(sim, st, None);
                let Some(blk) = blocks.get(b) else { continue };
                st.block = Some((b, blk));
                st.looked_up = blk.lookups.len();
                st.next_lookup = u8::MAX;
                st.accessed = false;
                st.last_read = None;
                blk
            }
            _ => {
                // Accesses without their block record (not made by the engine): start it.
                end_block(sim, st, None);
                start_block(sim, blocks, st, b, counted);
                match st.block {
                    Some((_, blk)) => blk,
                    None => continue,
                }
            }
        };
        let Some(ins) = blk.instrs.get(i) else {
            continue;
        };
        fetch_to(sim, blk, st, i);
        st.accessed = true;
        let (addr, size) = (r.addr, r.size as u64);
        sim.d1_swaps(addr, size, r.swaps());
        if ins.fixed.is_some() {
            // Counted per run; this access only looks D1 up.
            let write = kind == TraceKind::Write;
            sim.d1_lookup(ins.id, addr, size, write);
            if ins.locked_rmw && kind == TraceKind::Modify {
                sim.d1_lookup(ins.id, addr, size, false);
            }
            continue;
        }
        match kind {
            TraceKind::Read => {
                sim.data(ins.id, addr, size, false);
                st.last_read = Some((r.tag, r.addr, r.size));
            }
            TraceKind::Write => {
                // A store right after a load of the same bytes is one "modify" (a read).
                if st.last_read.take() != Some((r.tag, r.addr, r.size)) {
                    sim.data(ins.id, addr, size, true);
                }
            }
            _ => {
                sim.data(ins.id, addr, size, false);
                if ins.locked_rmw {
                    sim.data(ins.id, addr, size, false);
                }
                st.last_read = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxgrind_tool::instrument::{AccessKind, Addressing, MemOp, SpChange};

    fn insn(flow: Flow) -> Insn {
        Insn::new(0x1000, 2, flow)
    }

    #[test]
    fn i1_is_looked_up_only_where_a_fetch_reaches_another_line() {
        let instr = |pc: u64, len: u8, id: u32| Instr {
            id,
            pc,
            len,
            kind: Kind::Plain,
            locked_rmw: false,
            fixed: None,
        };
        // 64-byte lines: 0x1030..0x103e; 0x103f..0x1042 straddles into 0x1040; 0x1043 and
        // 0x1046..0x107f stay on that line; 0x1080 starts the next.
        let b = BlockInfo::new(
            vec![
                instr(0x1030, 15, 0),
                instr(0x103f, 4, 1),
                instr(0x1043, 3, 2),
                instr(0x1046, 0x3a, 3),
                instr(0x1080, 2, 4),
            ],
            6,
            vec![],
        );
        let looked: Vec<u8> = b.lookups.iter().map(|l| l.insn).collect();
        assert_eq!(looked, vec![0, 1, 4]);
    }

    /// A counted block's record simulated line by line ([`fetch_lines`]) charges what its
    /// lookups one by one ([`start_block`]) charge: same I1 and LL misses, same costs.
    /// A block of 1 to 40 plain instructions of 1 to 15 bytes (straddlers included) from
    /// `start`, numbered from `*id` on; and the address where it ends.
    fn random_block(next: &mut impl FnMut() -> u64, start: u64, id: &mut u32) -> (Vec<Instr>, u64) {
        let mut pc = start;
        let instrs = (0..1 + next() % 40)
            .map(|_| {
                let len = 1 + (next() % 15) as u8;
                let i = Instr {
                    id: *id,
                    pc,
                    len,
                    kind: Kind::Plain,
                    locked_rmw: false,
                    fixed: Some((0, 0)),
                };
                *id += 1;
                pc += u64::from(len);
                i
            })
            .collect();
        (instrs, pc)
    }

    #[test]
    fn counted_block_runs_fetched_line_by_line_count_as_lookup_by_lookup() {
        use oxgrind_formats::cachegrind::CacheConfig;
        let cfg = |size, assoc| CacheConfig {
            size,
            assoc,
            line: 64,
        };
        let (i1, d1, ll) = (cfg(1024, 2), cfg(1024, 2), cfg(4096, 2));
        let blocks = BlockTable::new();
        let mut x: u64 = 0x9E3779B97F4A7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut id = 0;
        let mut spans = Vec::new();
        for k in 0..24u64 {
            // Blocks at addresses that share I1's sets.
            let start = 0x40_0000 + k * 0x1a7 + (next() % 64);
            let (instrs, pc) = random_block(&mut next, start, &mut id);
            spans.push((start, ((pc - 1) >> 6) - (start >> 6)));
            blocks.push(BlockInfo::new(instrs, 6, vec![]));
        }
        let counted = Counted(1 << 20);
        let mut by_lookup = Simulator::new(&i1, &d1, &ll, true, false);
        let mut by_line = Simulator::new(&i1, &d1, &ll, true, false);
        let (mut st1, mut st2) = (ThreadState::default(), ThreadState::default());
        for _ in 0..20_000 {
            let b = (next() % 24) as u32;
            let (pc, more) = spans[b as usize];
            start_block(&mut by_lookup, &blocks, &mut st1, b, counted);
            let r = TraceRecord::new(pc, b | (more as u32) << LINES_SHIFT, 0, TraceKind::Block);
            consume(&mut by_line, &blocks, counted, &mut st2, &[r]);
        }
        by_lookup.flush();
        by_line.flush();
        let misses: u64 = by_lookup.costs.iter().map(|c| c[crate::sim::I1MR]).sum();
        assert!(misses > 1000, "the runs must miss I1: {misses}");
        assert_eq!(by_lookup.costs, by_line.costs);
    }

    /// A counted block's code-miss records replayed from its [`LineEntry`]s alone
    /// ([`code_miss`]) charge what its lookups one by one ([`start_block`]) charge under
    /// LRU: same I1 and LL misses, to the same instructions. The records are made as the
    /// engine makes them: a per-set table of the set's `ways` most recently used lines.
    #[test]
    fn code_miss_records_replayed_from_line_entries_count_as_lookup_by_lookup() {
        use oxgrind_formats::cachegrind::CacheConfig;
        use oxgrind_tool::instrument::CODE_MISS;
        let cfg = |size, assoc| CacheConfig {
            size,
            assoc,
            line: 64,
        };
        let (i1, d1, ll) = (cfg(2048, 4), cfg(1024, 2), cfg(4096, 2));
        let (sets, ways) = (8u64, 4usize);
        let blocks = BlockTable::new();
        let mut x: u64 = 0x2545F4914F6CDD1D;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut id = 0;
        let mut spans = Vec::new();
        for k in 0..40u64 {
            // Blocks at addresses that share I1's sets.
            let start = 0x40_0000 + k * 0x1a7 + (next() % 64);
            let (instrs, pc) = random_block(&mut next, start, &mut id);
            let (first, last) = (start >> 6, (pc - 1) >> 6);
            let info = BlockInfo::new(instrs, 6, vec![]);
            let e = blocks
                .lines
                .push(&LineEntry::of_block(&info, first, last, 6))
                .unwrap();
            blocks.push(info);
            spans.push((first, last, e));
        }
        let counted = Counted(1 << 20);
        let mut by_lookup = Simulator::new(&i1, &d1, &ll, true, false);
        let mut by_record = Simulator::new(&i1, &d1, &ll, true, false);
        by_record.set_code_table_ways(ways as u8);
        let (mut st1, mut st2) = (ThreadState::default(), ThreadState::default());
        // The engine's code-lines table: each set's lines, most recently used first.
        let mut table = vec![Vec::<u64>::new(); sets as usize];
        let mut records = 0;
        for _ in 0..20_000 {
            let b = (next() % spans.len() as u64) as u32;
            let (first, last, e) = spans[b as usize];
            start_block(&mut by_lookup, &blocks, &mut st1, b, counted);
            for (k, line) in (first..=last).enumerate() {
                let slot = &mut table[(line % sets) as usize];
                if let Some(w) = slot.iter().position(|&l| l == line) {
                    slot.remove(w);
                    slot.insert(0, line);
                    continue;
                }
                let evicted = if slot.len() == ways {
                    slot.pop().unwrap()
                } else {
                    u64::MAX
                };
                slot.insert(0, line);
                let r =
                    TraceRecord::new(evicted, e, k as u16, TraceKind::Block).with_swaps(CODE_MISS);
                consume(&mut by_record, &blocks, counted, &mut st2, &[r]);
                records += 1;
            }
        }
        by_lookup.flush();
        by_record.flush();
        let misses: u64 = by_lookup.costs.iter().map(|c| c[crate::sim::I1MR]).sum();
        assert!(misses > 1000, "the runs must miss I1: {misses}");
        assert!(records >= misses, "{records} records, {misses} misses");
        let charged = |costs: &[crate::sim::Costs]| -> Vec<(usize, u64, u64)> {
            costs
                .iter()
                .enumerate()
                .map(|(i, c)| (i, c[crate::sim::I1MR], c[crate::sim::ILMR]))
                .filter(|&(_, m, l)| m + l > 0)
                .collect()
        };
        assert_eq!(charged(&by_lookup.costs), charged(&by_record.costs));
    }

    #[test]
    fn branches_and_rmw_are_classified_as_valgrind_counts_them() {
        let mut j = insn(Flow::CondJump);
        j.cond = Some(Cond::E);
        assert_eq!(classify(&j).0, Kind::CondJump(Cond::E));
        let mut r = insn(Flow::IndirectJump);
        r.indirect_reg = Some(11);
        assert_eq!(classify(&r).0, Kind::IndirectReg(11));
        let m = insn(Flow::IndirectCall).with_mem(MemOp {
            size: 8,
            kind: AccessKind::Read,
            conditional: false,
            addressing: Addressing::Static,
        });
        assert_eq!(classify(&m).0, Kind::IndirectMem);
        let mut ret = insn(Flow::Return);
        ret.sp = SpChange::Delta(8);
        assert_eq!(classify(&ret).0, Kind::Plain, "ret is not counted");
        let mut scas = insn(Flow::Next);
        scas.rep = Some(RepString {
            compare: true,
            scan: true,
            repne: true,
            elem: 1,
        });
        assert!(matches!(
            classify(&scas).0,
            Kind::Rep {
                compare: true,
                repne: true,
                scas: true,
                elem: 1
            }
        ));
        let mut locked = insn(Flow::Next);
        locked.locked = true;
        assert!(classify(&locked).1);
    }
}
