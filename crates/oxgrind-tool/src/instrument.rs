//! The instrumentation vocabulary: how a tool sees the program's code and what it may ask
//! the engine to add to it.
//!
//! Tools never emit machine code, and never see the decoder the engine uses. Before a block
//! of guest code is translated the engine describes each instruction as an [`Insn`] (its
//! address and length, its memory operands, its control flow) and hands the block to
//! [`Tool::instrument`](crate::Tool::instrument), which answers with a [`Plan`]: probes to
//! run *before* chosen instructions. The kinds, cheapest first:
//!
//! | probe | what runs | cost per execution |
//! |---|---|---|
//! | [`Plan::count`] | `add` to one of the tool's per-thread counters, inline, no lock | one instruction (plus a flags save where they are live) |
//! | [`Plan::count_indexed`] | `add` to one of the thread's indexed counters (`Needs::indexed_counters`), inline | one instruction (plus a flags save where they are live) |
//! | [`Plan::trace_block`] | one [`TraceRecord`] appended inline to the thread's trace buffer | ~6 instructions |
//! | [`Plan::trace_block_new_lines`] | the same, only when a line of the block's code is not named in the thread's code-lines table | an inline check per line; a record when not named |
//! | [`Plan::trace_accesses`] | one record per memory access the instruction makes | ~10 instructions per access |
//! | [`Plan::trace_accesses_filtered`] | the same, only for accesses whose first byte's granule is marked in the tool's shadow map | an inline shadow check; a record when marked |
//! | [`Plan::trace_new_lines`] | the same, only for accesses to a line the thread's [`RecentLines`] table does not name | an inline table check; a record when not named |
//! | [`Plan::accesses_filtered`] | a clean call with the accesses, only when a granule is marked | an inline shadow check; a clean call when marked |
//! | [`Plan::accesses`] | a clean call, [`Tool::on_accesses`](crate::Tool::on_accesses), with every access | a clean call (~0.2-0.5 µs) |
//! | [`Plan::pc`] | a clean call, [`Tool::on_pc`](crate::Tool::on_pc) | a clean call |
//!
//! Everything a probe touches is *declared* in [`Needs`](crate::Needs) and allocated by the
//! engine: counters (`Needs::counters`), the shadow map the filters read (`Needs::shadow`),
//! the trace buffers (`Needs::trace`). Nothing is set globally by a tool.
//!
//! Trace records are drained in order, per thread, through
//! [`Tool::on_trace`](crate::Tool::on_trace): when a thread's buffer is full, when the thread
//! ends, when the tool asks ([`Host::flush_trace`](crate::Host::flush_trace)), and before
//! [`Tool::fini`](crate::Tool::fini). Block records give the control flow exactly (the
//! engine's blocks end at every control transfer), so a tool can tell a taken branch from
//! the next block record.

use crate::Addr;

/// Most memory operands one instruction is described with (`movs`: 2; `push [m]`: 2).
pub const MAX_MEM_OPS: usize = 4;

/// What an access does to memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessKind {
    Read,
    Write,
    /// Read, then written by the same instruction (`add [m], r`, `xchg`, `inc [m]`).
    Modify,
}

/// How an operand's address is formed: what it can point at, decided at translation time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addressing {
    /// Based on `rsp`, or an implicit stack access (`push`, `pop`, `call`, `ret`, `enter`,
    /// `leave`): the thread's stack.
    Stack,
    /// `rip`-relative or an absolute constant: a global, a constant, the GOT.
    Static,
    /// An `fs:`/`gs:` operand: thread-local storage, the stack protector's canary.
    ThreadLocal,
    /// A gather or scatter: one access per enabled element of a vector index.
    Vector,
    /// Through general registers: anything, the heap included.
    General,
}

/// amd64's red zone: the 128 bytes below `rsp` a function may use without moving it.
pub const RED_ZONE: u64 = 128;

/// One memory operand of an [`Insn`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemOp {
    /// Bytes per access (per element for gathers and scatters; per iteration for `rep`).
    pub size: u32,
    pub kind: AccessKind,
    /// Whether the access may not happen (`cmovcc [m]`, `maskmov`, masked lanes, `cmpxchg`'s
    /// write, a `rep` iteration with `rcx == 0`).
    pub conditional: bool,
    pub addressing: Addressing,
}

/// How an instruction leaves the straight line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Falls through to the next instruction.
    Next,
    /// `jmp rel`.
    Jump,
    /// `jcc`, `loop*`, `jrcxz`: taken or not.
    CondJump,
    /// `jmp reg/mem`.
    IndirectJump,
    /// `call rel`.
    Call,
    /// `call reg/mem`.
    IndirectCall,
    Return,
    /// `syscall`, `int`, `ud2`, `hlt`...: leaves to the kernel.
    Exception,
}

/// A `rep`-prefixed string instruction: how its loop ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RepString {
    /// `cmps`/`scas`: the loop also ends on the comparison.
    pub compare: bool,
    /// `scas` (compares `rax` with memory) rather than `cmps` (memory with memory).
    pub scan: bool,
    /// `repne`: the loop goes on while the elements differ (else while equal).
    pub repne: bool,
    /// Bytes per element.
    pub elem: u8,
}

/// The condition of a conditional jump.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    O,
    No,
    B,
    Ae,
    E,
    Ne,
    Be,
    A,
    S,
    Ns,
    P,
    Np,
    L,
    Ge,
    Le,
    G,
    /// `loop`: `rcx - 1 != 0` (the instruction decrements `rcx` first).
    Loop,
    Loope,
    Loopne,
    Jrcxz,
    Jecxz,
}

impl Cond {
    /// Whether the jump is taken, from the registers before it runs.
    pub fn taken(self, regs: &GuestRegs) -> bool {
        let f = regs.rflags;
        let (cf, pf, zf, sf, of) = (
            f & 1 != 0,
            f & 4 != 0,
            f & 0x40 != 0,
            f & 0x80 != 0,
            f & 0x800 != 0,
        );
        let rcx = regs.gpr[1];
        match self {
            Cond::O => of,
            Cond::No => !of,
            Cond::B => cf,
            Cond::Ae => !cf,
            Cond::E => zf,
            Cond::Ne => !zf,
            Cond::Be => cf || zf,
            Cond::A => !cf && !zf,
            Cond::S => sf,
            Cond::Ns => !sf,
            Cond::P => pf,
            Cond::Np => !pf,
            Cond::L => sf != of,
            Cond::Ge => sf == of,
            Cond::Le => zf || sf != of,
            Cond::G => !zf && sf == of,
            Cond::Loop => rcx.wrapping_sub(1) != 0,
            Cond::Loope => rcx.wrapping_sub(1) != 0 && zf,
            Cond::Loopne => rcx.wrapping_sub(1) != 0 && !zf,
            Cond::Jrcxz => rcx == 0,
            Cond::Jecxz => rcx as u32 == 0,
        }
    }
}

/// What an instruction does to the stack pointer, as far as the decoder can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpChange {
    /// `rsp` is not written.
    None,
    /// `rsp += delta` (`push`, `pop`, `call`, `ret`, `enter`, `sub`/`add rsp, imm`).
    Delta(i32),
    /// `rsp = rbp + 8` (`leave`).
    Leave,
    /// Written with a value only the registers after it tell (`mov rsp, ...`, `and rsp,
    /// -16`, `lea rsp, ...`, `pop rsp`, `xchg`).
    Unknown,
}

/// One decoded instruction of the program, as tools see it.
#[derive(Clone, Copy, Debug)]
pub struct Insn {
    pub pc: Addr,
    /// Bytes (1 to 15).
    pub len: u8,
    pub flow: Flow,
    /// The target of a direct jump, call or conditional jump.
    pub target: Option<Addr>,
    /// What it does to `rsp` (explicitly, or by `push`/`pop`/`call`/`ret`/`enter`/`leave`).
    pub sp: SpChange,
    /// A `rep`-prefixed string instruction: its probes run once per iteration.
    pub rep: Option<RepString>,
    /// The condition of a conditional jump (`jcc`, `loop*`, `jrcxz`).
    pub cond: Option<Cond>,
    /// The register an indirect jump or call goes through (index in `GuestRegs::gpr`);
    /// `None` for one through memory (its first read operand holds the target).
    pub indirect_reg: Option<u8>,
    /// A locked read-modify-write (a `lock` prefix, or `xchg` with memory), which Valgrind's
    /// IR splits into a load and a compare-and-swap; `cmpxchg` is not one.
    pub locked: bool,
    mem: [MemOp; MAX_MEM_OPS],
    nmem: u8,
    /// Per operand: `rsp + disp` (no index register), the displacement; see
    /// [`Insn::sp_offset`].
    sp_disp: [Option<i32>; MAX_MEM_OPS],
}

impl Insn {
    /// An instruction with no memory operand; [`Insn::with_mem`] adds them. (For the
    /// engine, which decodes, and for tools' tests.)
    pub const fn new(pc: Addr, len: u8, flow: Flow) -> Insn {
        const NONE: MemOp = MemOp {
            size: 0,
            kind: AccessKind::Read,
            conditional: false,
            addressing: Addressing::General,
        };
        Insn {
            pc,
            len,
            flow,
            target: None,
            sp: SpChange::None,
            rep: None,
            cond: None,
            indirect_reg: None,
            locked: false,
            mem: [NONE; MAX_MEM_OPS],
            nmem: 0,
            sp_disp: [None; MAX_MEM_OPS],
        }
    }

    /// Says that memory operand `op` (an index into [`Insn::mem`]) is `[rsp + disp]`.
    pub fn with_sp_offset(mut self, op: usize, disp: i32) -> Insn {
        if op < MAX_MEM_OPS {
            self.sp_disp[op] = Some(disp);
        }
        self
    }

    /// Where memory operand `op` lies relative to the stack pointer, when that is known at
    /// translation: `Some(d)` for an explicit `[rsp + d]` operand (no index register), the
    /// access starting `d` bytes from `rsp` as it is before the instruction runs. `None`
    /// for every other operand, implicit stack accesses (`push`, `call`) included. A tool
    /// can check the stack's addressability without a probe: `d < -128` is below amd64's
    /// red zone, memory the program does not own (Memcheck's "N bytes below stack
    /// pointer").
    pub fn sp_offset(&self, op: usize) -> Option<i32> {
        if op < self.nmem as usize {
            self.sp_disp[op]
        } else {
            None
        }
    }

    /// Adds a memory operand (reads are listed before writes, as the CPU does them); extra
    /// operands beyond [`MAX_MEM_OPS`] are dropped.
    pub fn with_mem(mut self, op: MemOp) -> Insn {
        if (self.nmem as usize) < MAX_MEM_OPS {
            self.mem[self.nmem as usize] = op;
            self.nmem += 1;
        }
        self
    }

    /// The memory operands the instruction really accesses (not `lea`'s, not a prefetch's).
    pub fn mem(&self) -> &[MemOp] {
        &self.mem[..self.nmem as usize]
    }

    pub fn next_pc(&self) -> Addr {
        self.pc + self.len as u64
    }

    /// Whether it is a `rep`-prefixed string instruction.
    pub fn rep_string(&self) -> bool {
        self.rep.is_some()
    }

    /// Whether it writes `rsp`.
    pub fn writes_sp(&self) -> bool {
        self.sp != SpChange::None
    }

    /// Whether an access of this instruction may touch a heap block: one of its operands is
    /// addressed through general registers (or a vector index). Shared by the tools that
    /// watch heap accesses (Memcheck, DHAT): a probe there costs at least an inline check,
    /// so it goes only where it can matter. Stack, static and thread-local operands are
    /// left out; `rbp`-based ones stay (without frame pointers `rbp` may point into a block).
    pub fn may_touch_heap(&self) -> bool {
        self.mem()
            .iter()
            .any(|m| matches!(m.addressing, Addressing::General | Addressing::Vector))
    }
}

/// One memory access an instruction is about to make (clean-call probes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub addr: u64,
    /// Bytes (1 to 64; 512 for `fxsave`...).
    pub size: u32,
    pub kind: AccessKind,
    /// The access depends on something besides the address (`maskmov`, `cmpxchg`'s write,
    /// a masked-store lane the mask enables). Elements a mask disables are not reported.
    pub conditional: bool,
}

/// The guest's registers at a probe (before the probed instruction executes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GuestRegs {
    /// General registers in hardware order: rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, r8-r15.
    pub gpr: [u64; 16],
    /// Guest address of the probed instruction.
    pub rip: u64,
    pub rflags: u64,
}

impl GuestRegs {
    pub fn rsp(&self) -> u64 {
        self.gpr[4]
    }
    pub fn rbp(&self) -> u64 {
        self.gpr[5]
    }
}

/// One of the tool's per-thread counters (`0 .. Needs::counters`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterId(pub u16);

/// Most counters a tool may declare.
pub const MAX_COUNTERS: u16 = 16;

/// The shadow map a tool declares: one shadow value of `bits` bits per `2^granule_shift`
/// bytes of the address space, 0 meaning "nothing to check here". The filtered probes
/// read it inline. Today the engine offers exactly one geometry: 8 bits per 8 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShadowSpec {
    pub granule_shift: u8,
    pub bits: u8,
    /// A value `k` below the granule's size means its first `k` bytes need no check
    /// (ASan's encoding of a block's last, partial granule): the probes still call the
    /// tool for an access to such a granule, but code that stands in for probed code
    /// natively (the engine's native tries of replaced functions) may take those bytes as
    /// unmarked.
    pub prefix_values: bool,
}

impl ShadowSpec {
    /// One byte per 8-byte granule (DHAT's marks).
    pub const BYTE_PER_GRANULE: ShadowSpec = ShadowSpec {
        granule_shift: 3,
        bits: 8,
        prefix_values: false,
    };
    /// One byte per 8-byte granule, values 1 to 7 in ASan's encoding ([`Self::prefix_values`]:
    /// Memcheck's A bits).
    pub const BYTE_PER_GRANULE_PREFIXED: ShadowSpec = ShadowSpec {
        prefix_values: true,
        ..Self::BYTE_PER_GRANULE
    };
}

/// Addresses at or above this have no shadow (the kernel half, the vsyscall page).
pub const SHADOW_ADDRESS_LIMIT: u64 = 1 << 47;

/// A tool's shadow map, allocated by the core (see [`ShadowSpec`]): the shadow byte of
/// address `a` is at `base + (a >> 3)`. Pages never written read as zero.
#[derive(Clone, Copy, Debug)]
pub struct ShadowMap {
    base: u64,
    /// Gives whole pages of the map back to the kernel (they read as zero again).
    discard: fn(u64, u64),
}

impl ShadowMap {
    /// # Safety
    /// `base` must be a readable and writable reservation of `2^44` bytes that is never
    /// unmapped, and `discard(start, len)` must only zero whole pages of it.
    pub const unsafe fn new(base: u64, discard: fn(u64, u64)) -> ShadowMap {
        ShadowMap { base, discard }
    }

    pub fn base(&self) -> u64 {
        self.base
    }

    /// Bytes of the reservation (it covers every address below [`SHADOW_ADDRESS_LIMIT`]).
    pub const LEN: u64 = SHADOW_ADDRESS_LIMIT >> 3;

    #[inline]
    fn cell(&self, addr: u64) -> &'static core::sync::atomic::AtomicU8 {
        debug_assert!(addr < SHADOW_ADDRESS_LIMIT);
        // SAFETY: callers keep `addr` below SHADOW_ADDRESS_LIMIT, so `base + (addr >> 3)`
        // lies inside the 2^44-byte reservation (`new`'s contract), which is never
        // unmapped; AtomicU8 has u8's layout and any byte value is valid.
        unsafe { &*((self.base + (addr >> 3)) as *const core::sync::atomic::AtomicU8) }
    }

    /// The shadow byte of `addr`'s granule (0 for addresses without shadow).
    #[inline]
    pub fn get(&self, addr: u64) -> u8 {
        if addr >= SHADOW_ADDRESS_LIMIT {
            return 0;
        }
        self.cell(addr).load(core::sync::atomic::Ordering::Relaxed)
    }

    /// Whether every granule of `[addr, addr + size)` has shadow 0.
    #[inline]
    pub fn all_clear(&self, addr: u64, size: u64) -> bool {
        if size == 0 || addr >= SHADOW_ADDRESS_LIMIT {
            return true;
        }
        let last = addr.saturating_add(size - 1).min(SHADOW_ADDRESS_LIMIT - 1);
        (addr >> 3..=last >> 3).all(|g| self.get(g << 3) == 0)
    }

    /// Sets the shadow of `addr`'s granule to `v` (a relaxed atomic store; nothing for an
    /// address without shadow): for a tool whose shadow bytes differ granule by granule.
    #[inline]
    pub fn set_granule(&self, addr: u64, v: u8) {
        if addr < SHADOW_ADDRESS_LIMIT {
            self.cell(addr)
                .store(v, core::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Sets the shadow of the granules `[lo, hi)` (both multiples of 8) to `v`. Bytes are
    /// written as relaxed atomics: a racing probe sees the old or the new state of a
    /// granule, never a torn one. Whole pages going back to 0 are discarded instead of
    /// written (a freed 1 GiB block has 128 MiB of shadow).
    #[inline]
    pub fn set_granules(&self, lo: u64, hi: u64, v: u8) {
        const PAGE: u64 = 4096;
        let hi = hi.min(SHADOW_ADDRESS_LIMIT);
        if lo >= hi {
            return;
        }
        let (mut s, e) = (self.base + (lo >> 3), self.base + (hi >> 3));
        if v == 0 && e - s >= 4 * PAGE {
            let (ps, pe) = (s.next_multiple_of(PAGE), e & !(PAGE - 1));
            if ps < pe {
                while s < ps {
                    self.cell_at(s)
                        .store(0, core::sync::atomic::Ordering::Relaxed);
                    s += 1;
                }
                (self.discard)(ps, pe - ps);
                s = pe;
            }
        }
        // Eight granules per store where the shadow is word-aligned: a block's shadow is
        // 2-40 bytes, and a byte loop was most of the allocator events' marking.
        while s < e && s & 7 != 0 {
            self.cell_at(s)
                .store(v, core::sync::atomic::Ordering::Relaxed);
            s += 1;
        }
        let word = u64::from_ne_bytes([v; 8]);
        while e - s >= 8 {
            // SAFETY: `s` is 8-aligned and `[s, s + 8)` lies in `[base + lo/8, base + hi/8)`,
            // inside the reservation (see `cell_at`); an aligned 8-byte store is seen by a
            // racing byte load as the old or the new value of each byte, never a torn one.
            unsafe { &*(s as *const core::sync::atomic::AtomicU64) }
                .store(word, core::sync::atomic::Ordering::Relaxed);
            s += 8;
        }
        while s < e {
            self.cell_at(s)
                .store(v, core::sync::atomic::Ordering::Relaxed);
            s += 1;
        }
    }

    /// Sets the shadow of the granules from `lo` (a multiple of 8) on to `bytes`, one byte
    /// per granule: as [`ShadowMap::set_granules`] for a run of different values (a heap
    /// block's redzones, bytes and tail in one pass), a word per store where the shadow is
    /// word-aligned. Granules at or above [`SHADOW_ADDRESS_LIMIT`] are left alone.
    #[inline]
    pub fn store_granules(&self, lo: u64, bytes: &[u8]) {
        let limit = SHADOW_ADDRESS_LIMIT >> 3;
        let first = lo >> 3;
        if first >= limit {
            return;
        }
        let bytes = &bytes[..bytes.len().min((limit - first) as usize)];
        let mut s = self.base + first;
        let mut i = 0;
        while i < bytes.len() && s & 7 != 0 {
            self.cell_at(s)
                .store(bytes[i], core::sync::atomic::Ordering::Relaxed);
            s += 1;
            i += 1;
        }
        while bytes.len() - i >= 8 {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i..i + 8]);
            // SAFETY: as in `set_granules`: `s` is 8-aligned, and `[s, s + 8)` lies in the
            // reservation (below `base + limit`).
            unsafe { &*(s as *const core::sync::atomic::AtomicU64) }
                .store(u64::from_ne_bytes(w), core::sync::atomic::Ordering::Relaxed);
            s += 8;
            i += 8;
        }
        while i < bytes.len() {
            self.cell_at(s)
                .store(bytes[i], core::sync::atomic::Ordering::Relaxed);
            s += 1;
            i += 1;
        }
    }

    #[inline]
    fn cell_at(&self, shadow_addr: u64) -> &'static core::sync::atomic::AtomicU8 {
        // SAFETY: `set_granules` only passes addresses in [base + lo/8, base + hi/8) with
        // hi <= SHADOW_ADDRESS_LIMIT: inside the reservation (see `cell`).
        unsafe { &*(shadow_addr as *const core::sync::atomic::AtomicU8) }
    }
}

/// The recent-lines table a tool may declare (`Needs::recent_lines`), which lets translated
/// code skip the records of accesses a cache simulator would see as hits that change
/// nothing.
///
/// Each thread has `slots` slots (a power of two, at most [`MAX_RECENT_LINE_SLOTS`]); a
/// line is `address >> line_shift`, and its slot is `line % slots`. Every access record the
/// thread appends, through any trace probe and whether inline or not, first sets the slot of
/// each line the access touches to that line, the access being taken as its first
/// `min(size, 1 << line_shift)` bytes (so at most two lines, in address order). So a slot
/// names the line among those of that slot that the thread's recorded accesses touched
/// last. [`Plan::trace_new_lines`] skips an access whose (so clamped) bytes lie in one line
/// that its slot names. A new thread's slots name no line; records dropped because they
/// were appended under a hold (the embedder's or the tool's own work) empty the table.
///
/// Why it helps: in a set-associative cache with LRU replacement whose set count is a
/// multiple of `slots` and whose lines are `1 << line_shift` bytes, lines of one set share
/// a slot, so a line its slot names is the most recently used of its set, as far as this
/// thread's accesses go: looking it up again hits and changes nothing.
///
/// With `Needs::recent_lines_two_ways` each slot names two lines, the last and the one
/// before it (a line moves to the first place, the first to the second). An access to the
/// second skips its record too: the two change places and the slot's swap bit flips. The
/// next record that touches a line of that slot carries the bit ([`TraceRecord::swaps`])
/// and clears it. For an LRU cache of at least two ways whose set count *equals* `slots`
/// the two lines are the set's two most recently used, as far as this thread's accesses
/// go: before looking a record's line up, the simulator swaps the set's first two ways
/// where the record's bit says so, and sees exactly what every access would have done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecentLines {
    pub line_shift: u8,
    pub slots: u16,
}

/// Most lines a code-lines slot may name (`Needs::recent_code_lines_ways`); the ways
/// times the slots must also be at most [`MAX_RECENT_LINE_SLOTS`]. A table asked for
/// beyond either has one line per slot (block records, no code-miss records).
pub const MAX_RECENT_CODE_WAYS: u8 = 8;

/// Most slots a [`RecentLines`] table may have.
pub const MAX_RECENT_LINE_SLOTS: u16 = 512;

/// Most indexed counters per thread (`Needs::indexed_counters`).
pub const MAX_INDEXED_COUNTERS: u32 = 1 << 20;

/// What a [`TraceRecord`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TraceKind {
    /// A block was entered: `addr` is its first pc.
    Block = 0,
    Read = 1,
    Write = 2,
    Modify = 3,
}

/// One entry of a thread's trace buffer: 16 bytes, written inline by translated code.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceRecord {
    /// The block's pc, or the accessed address.
    pub addr: u64,
    /// The tool's tag, given in the plan.
    pub tag: u32,
    /// Bytes accessed (0 for a block; a code-miss record's line index,
    /// [`TraceRecord::code_miss`]).
    pub size: u16,
    kind: u8,
    /// Swap bits of the recent-lines table's second way (`Needs::recent_lines_two_ways`);
    /// for a block record, [`CODE_MISS`] marks a code-miss record.
    swaps: u8,
}

impl TraceRecord {
    pub const fn new(addr: u64, tag: u32, size: u16, kind: TraceKind) -> TraceRecord {
        TraceRecord {
            addr,
            tag,
            size,
            kind: kind as u8,
            swaps: 0,
        }
    }

    /// The same record carrying swap bits ([`TraceRecord::swaps`]).
    pub const fn with_swaps(mut self, swaps: u8) -> TraceRecord {
        self.swaps = swaps;
        self
    }

    /// With `Needs::recent_lines_two_ways`, for an access record: bit 0 (bit 1) says that
    /// the slot of the first (second) line the access touches saw an odd number of skipped
    /// accesses to its second line since that slot's previous record: the two lines it
    /// names changed places that many times (see [`RecentLines`]). 0 otherwise.
    pub fn swaps(&self) -> u8 {
        self.swaps
    }

    /// With `Needs::recent_code_lines_ways`, a block whose `k`-th line (from the line of
    /// its first byte) was not among its code-lines slot's ways appends, instead of a
    /// block record, a record of kind `Block` with the block's tag that says so:
    /// `Some((k, evicted))`, where `evicted` is the line number that left the slot's ways
    /// for it (the slot's least recently used line; `u64::MAX` while the slot had an empty
    /// way). A block's code-miss records of one entry come together, in line order.
    pub fn code_miss(&self) -> Option<(u16, u64)> {
        (self.kind == TraceKind::Block as u8 && self.swaps == CODE_MISS)
            .then_some((self.size, self.addr))
    }

    pub fn kind(&self) -> TraceKind {
        match self.kind {
            0 => TraceKind::Block,
            1 => TraceKind::Read,
            2 => TraceKind::Write,
            _ => TraceKind::Modify,
        }
    }
}

const _: () = assert!(core::mem::size_of::<TraceRecord>() == 16);

/// The `swaps` byte of a code-miss record ([`TraceRecord::code_miss`]): its last dword,
/// as the engine writes it, is `line index | CODE_MISS << 24` (kind `Block`, 0).
pub const CODE_MISS: u8 = 1;

/// Hot ranges per thread (`Needs::hot_ranges`).
pub const HOT_RANGES: usize = 3;

/// One of a thread's hot ranges (`Needs::hot_ranges`, `Tool::on_trace_hot`): accesses whose
/// first byte is in `[lo, hi)` are counted here instead of recorded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HotRange {
    pub lo: u64,
    /// `hi <= lo`: the range is empty (nothing is counted in it).
    pub hi: u64,
    /// Bytes read, and written, by the accesses counted since the tool last saw the range
    /// (a read-modify-write counts in both).
    pub read_bytes: u64,
    pub write_bytes: u64,
}

/// One probe of a [`Plan`], for the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    Count {
        at: u8,
        counter: CounterId,
        n: u32,
    },
    Accesses {
        at: u8,
        data: u64,
    },
    AccessesFiltered {
        at: u8,
        data: u64,
    },
    /// [`Plan::accesses_filtered_or_below_sp`].
    AccessesFilteredOrBelowSp {
        at: u8,
        data: u64,
        depth: u32,
    },
    Pc {
        at: u8,
        data: u64,
    },
    TraceBlock {
        tag: u32,
    },
    TraceAccesses {
        at: u8,
        tag: u32,
        filtered: bool,
    },
    /// [`Plan::trace_new_lines`].
    TraceNewLines {
        at: u8,
        tag: u32,
    },
    /// [`Plan::count_indexed`].
    CountIndexed {
        at: u8,
        index: u32,
        n: u32,
    },
    /// [`Plan::count_indexed_iterations`].
    CountIndexedIterations {
        at: u8,
        index: u32,
        n: u32,
    },
    /// [`Plan::trace_block_new_lines`]; `len`: bytes of the block's code.
    TraceBlockNewLines {
        tag: u32,
        len: u32,
    },
}

impl Probe {
    /// The instruction the probe runs before.
    pub fn at(&self) -> usize {
        match *self {
            Probe::Count { at, .. }
            | Probe::Accesses { at, .. }
            | Probe::AccessesFiltered { at, .. }
            | Probe::AccessesFilteredOrBelowSp { at, .. }
            | Probe::Pc { at, .. }
            | Probe::TraceAccesses { at, .. }
            | Probe::TraceNewLines { at, .. }
            | Probe::CountIndexed { at, .. }
            | Probe::CountIndexedIterations { at, .. } => at as usize,
            Probe::TraceBlock { .. } | Probe::TraceBlockNewLines { .. } => 0,
        }
    }
}

/// Most probes one block may carry (a block has at most 64 instructions).
pub const MAX_PROBES: usize = 256;

/// The probes a tool wants in one block, by instruction index. Every method returns
/// `false` when the instruction is out of range or the plan is full (the probe is dropped).
pub struct Plan {
    /// The first `n` are written. Left uninitialised beyond: the engine makes a plan for
    /// every block it translates, and writing all 4 KiB of a fresh plan was a tenth of a
    /// short program's start-up under DHAT (`python3 -c 'print(1)'`).
    probes: [core::mem::MaybeUninit<Probe>; MAX_PROBES],
    n: usize,
    insns: usize,
}

impl Plan {
    /// An empty plan for a block of `insns` instructions.
    pub fn new(insns: usize) -> Plan {
        Plan {
            probes: [const { core::mem::MaybeUninit::uninit() }; MAX_PROBES],
            n: 0,
            insns,
        }
    }

    /// Adds a probe as it is (the methods below are the usual way).
    pub fn push_probe(&mut self, p: Probe) -> bool {
        if p.at() >= self.insns || self.n == MAX_PROBES {
            return false;
        }
        self.probes[self.n].write(p);
        self.n += 1;
        true
    }

    /// Adds `n` to the calling thread's copy of `counter` each time instruction `insn` is
    /// about to run. [`Host::counter`](crate::Host::counter) sums the threads' copies.
    pub fn count(&mut self, insn: usize, counter: CounterId, n: u32) -> bool {
        self.push_probe(Probe::Count {
            at: insn as u8,
            counter,
            n: n.min(i32::MAX as u32),
        })
    }

    /// Adds `n` to the calling thread's indexed counter `index` (`0 ..
    /// Needs::indexed_counters`; a probe beyond is dropped) each time instruction `insn`
    /// is about to run (a `rep` instruction: at every entry, the last included).
    /// [`Host::indexed_counter_totals`](crate::Host::indexed_counter_totals) sums the
    /// threads' copies. For counts per block or per instruction where [`Plan::count`]'s
    /// few counters do not reach.
    pub fn count_indexed(&mut self, insn: usize, index: u32, n: u32) -> bool {
        self.push_probe(Probe::CountIndexed {
            at: insn as u8,
            index,
            n: n.min(i32::MAX as u32),
        })
    }

    /// [`Plan::count_indexed`], but before a `rep` string instruction's iterations only
    /// (not at its last entry, with `rcx == 0`, which makes no access); before any other
    /// instruction the same as `count_indexed`.
    pub fn count_indexed_iterations(&mut self, insn: usize, index: u32, n: u32) -> bool {
        self.push_probe(Probe::CountIndexedIterations {
            at: insn as u8,
            index,
            n: n.min(i32::MAX as u32),
        })
    }

    /// A clean call to [`Tool::on_accesses`](crate::Tool::on_accesses) before `insn`, with
    /// the accesses it is about to make (none: no call, e.g. a `rep` iteration with
    /// `rcx == 0`).
    pub fn accesses(&mut self, insn: usize, data: u64) -> bool {
        self.push_probe(Probe::Accesses {
            at: insn as u8,
            data,
        })
    }

    /// Like [`Plan::accesses`], but the call is made only when a granule an access touches
    /// has a nonzero byte in the tool's shadow map (`Needs::shadow`), read in ASan's
    /// encoding: a granule's byte `k` in 1..=7 means its first `k` bytes are unmarked, so
    /// an access within them makes no call (any other nonzero byte marks the whole
    /// granule); operands the inline check cannot compute (gathers, 32-bit addressing)
    /// always call.
    pub fn accesses_filtered(&mut self, insn: usize, data: u64) -> bool {
        self.push_probe(Probe::AccessesFiltered {
            at: insn as u8,
            data,
        })
    }

    /// Like [`Plan::accesses_filtered`], and the call is also made when an operand
    /// addressed through general registers ([`Addressing::General`]: not `rsp`) starts in
    /// `[rsp - depth, rsp - RED_ZONE)`, below amd64's red zone: a pointer into a frame
    /// whose function has returned (Memcheck's "N bytes below stack pointer" through a
    /// pointer). An inline compare of the address with `rsp`, next to the shadow check.
    pub fn accesses_filtered_or_below_sp(&mut self, insn: usize, data: u64, depth: u32) -> bool {
        self.push_probe(Probe::AccessesFilteredOrBelowSp {
            at: insn as u8,
            data,
            depth,
        })
    }

    /// A clean call to [`Tool::on_pc`](crate::Tool::on_pc) before `insn`.
    pub fn pc(&mut self, insn: usize, data: u64) -> bool {
        self.push_probe(Probe::Pc {
            at: insn as u8,
            data,
        })
    }

    /// A [`TraceKind::Block`] record (the block's first pc, `tag`) each time the block is
    /// entered (`Needs::trace`).
    pub fn trace_block(&mut self, tag: u32) -> bool {
        self.push_probe(Probe::TraceBlock { tag })
    }

    /// Like [`Plan::trace_block`], but the record is left out when every line of the
    /// block's code (`code_len` bytes from its pc) is named by its slot in the thread's
    /// code-lines table (`Needs::recent_code_lines`, a [`RecentLines`] of its own); a record
    /// sets the slots of the block's lines, in address order. (Without a table: every
    /// entry appends, as [`Plan::trace_block`].) For an instruction cache simulated with
    /// LRU whose set count is a multiple of the slots, a left-out entry's fetches all hit
    /// the most recently used lines of their sets and change nothing; a tool that needs
    /// the count of entries counts them otherwise ([`Plan::count_indexed`]).
    pub fn trace_block_new_lines(&mut self, tag: u32, code_len: u32) -> bool {
        self.push_probe(Probe::TraceBlockNewLines { tag, len: code_len })
    }

    /// A record per memory access `insn` makes (address, size, kind, `tag`), appended
    /// before it runs (`Needs::trace`).
    pub fn trace_accesses(&mut self, insn: usize, tag: u32) -> bool {
        self.push_probe(Probe::TraceAccesses {
            at: insn as u8,
            tag,
            filtered: false,
        })
    }

    /// Like [`Plan::trace_accesses`], for accesses whose first byte lies in a granule marked
    /// in the tool's shadow map (`Needs::shadow` and `Needs::trace`); an access whose other
    /// granules only are marked may be recorded or not.
    pub fn trace_accesses_filtered(&mut self, insn: usize, tag: u32) -> bool {
        self.push_probe(Probe::TraceAccesses {
            at: insn as u8,
            tag,
            filtered: true,
        })
    }

    /// Like [`Plan::trace_accesses`], except that an access to a line the thread's
    /// recent-lines table names is skipped (see [`RecentLines`]; `Needs::recent_lines` and
    /// `Needs::trace`; without a table it is [`Plan::trace_accesses`]). Skipping is the
    /// engine's choice: operands it cannot address inline (gathers, 32-bit addressing)
    /// always get their records. A masked vector access (AVX-512) is taken whole, as if
    /// every element were enabled, with the table (one record of the operand, or none);
    /// without it, one per enabled element. So a tool counts such an instruction's
    /// accesses from [`Insn::mem`], not from its records; and it is meant for
    /// instructions that make each access of [`Insn::mem`] every time they run, or whose
    /// conditional ones it counts as made.
    pub fn trace_new_lines(&mut self, insn: usize, tag: u32) -> bool {
        self.push_probe(Probe::TraceNewLines {
            at: insn as u8,
            tag,
        })
    }

    /// The probes asked for, in the order they were asked.
    pub fn probes(&self) -> &[Probe] {
        let written = &self.probes[..self.n];
        // SAFETY: `push_probe`, the only writer, initialises `probes[n]` before counting
        // it, so the first `n` are initialised; `MaybeUninit<Probe>` has `Probe`'s layout.
        unsafe { &*(written as *const [core::mem::MaybeUninit<Probe>] as *const [Probe]) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_drops_probes_out_of_range() {
        let mut p = Plan::new(2);
        assert!(p.count(1, CounterId(0), 3));
        assert!(!p.pc(2, 0));
        assert!(p.trace_block(7));
        assert_eq!(p.probes().len(), 2);
    }

    #[test]
    fn conditions_follow_the_flags() {
        let mut r = GuestRegs {
            gpr: [0; 16],
            rip: 0,
            rflags: 0x40,
        };
        assert!(Cond::E.taken(&r));
        assert!(!Cond::Ne.taken(&r));
        assert!(Cond::Le.taken(&r));
        r.rflags = 0x880; // SF and OF: "greater or equal"
        assert!(Cond::Ge.taken(&r));
        assert!(Cond::G.taken(&r));
        r.gpr[1] = 1;
        assert!(!Cond::Loop.taken(&r));
        r.gpr[1] = 0;
        assert!(Cond::Jrcxz.taken(&r));
    }

    #[test]
    fn heap_operands_are_the_general_ones() {
        let stack = MemOp {
            size: 8,
            kind: AccessKind::Write,
            conditional: false,
            addressing: Addressing::Stack,
        };
        let push = Insn::new(0x1000, 1, Flow::Next).with_mem(stack);
        assert!(!push.may_touch_heap());
        let push_mem = push.with_mem(MemOp {
            addressing: Addressing::General,
            kind: AccessKind::Read,
            ..stack
        });
        assert!(push_mem.may_touch_heap());
        assert_eq!(push_mem.mem().len(), 2);
    }
}
