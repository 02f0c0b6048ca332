//! In-process stack capture for allocation hooks: return addresses of the calling frames,
//! through code with or without frame pointers.
//!
//! This is the hottest code in oxgrind (it runs inside every `malloc`), so it is split in two:
//!
//! * **Fast path** ([`capture`]): for each frame, one probe of a global, lock-free rule cache
//!   keyed by code address. A rule is a packed `u64` saying how to find the caller's
//!   registers (`CFA = rsp+k` or `rbp+k`, return address at `CFA-8`, `rbp` saved at `CFA+j`),
//!   the same "recipe per address" idea as libunwind's fast trace and framehop's rule cache.
//!   Every stack read is checked against the current thread's stack mapping first, and the
//!   stack pointer must strictly grow, so a corrupt frame ends the capture instead of
//!   faulting or looping.
//! * **Miss path** (cold): under a spin lock, find the module containing the address (from
//!   `/proc/self/maps` read with raw system calls, refreshed at a bounded rate for `dlopen`ed
//!   objects and new thread stacks), evaluate its in-memory `.eh_frame` CFI with gimli (no
//!   allocation: the unwind context lives in the locked state), pack the result and publish
//!   it into the cache.
//!
//! Frame pointers are used only where there is no CFI for an address (JIT code, hand-written
//! assembly without annotations): on Debian, glibc and most libraries are built without them,
//! so an `rbp` chain cannot be trusted where CFI says otherwise.
//!
//! Limits: objects `dlclose`d while another thread is inside the miss path for that very
//! object can fault the miss path (the same race exists in libgcc's unwinder); frames whose
//! CFI uses general DWARF expressions (other than the compiler's stack-realignment form and
//! the kernel signal frame) end the capture.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::cell::Cell;
use core::sync::atomic::{AtomicU64, Ordering};

use gimli::{
    EhFrame, Register, RegisterRule, UnwindContext, UnwindContextStorage, UnwindSection,
    UnwindTableRow,
};
use oxgrind_sys::lock::SpinLock;

use crate::elfmem::{self, CfiModule, Slice};
use crate::maps;

const RSP: Register = Register(7);
const RBP: Register = Register(6);
const RA: Register = Register(16);

// ---------------------------------------------------------------------------------------
// Packed rules.

/// How to find the caller's `(pc, sp, bp)` from a frame's `(sp, bp)`. Packed into a `u64`
/// so a cache slot is two atomic words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    /// Stop: the outermost frame (`_start`, thread start: CFI marks the return address
    /// undefined), or CFI this unwinder does not follow.
    End,
    /// `cfa = base + cfa_off`, `ra = *(cfa - 8)`, `sp' = cfa`, then `bp'` per `bp`.
    Cfa {
        base: Base,
        cfa_off: i32,
        bp: BpRule,
    },
    /// The kernel's signal frame (`__restore_rt`): registers are in the `ucontext` at `sp`.
    SigFrame,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Base {
    Rsp,
    Rbp,
    /// `cfa = *(rbp + off)`: GCC's stack-realignment prologue (`DW_OP_breg6; DW_OP_deref`).
    DerefRbp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BpRule {
    /// `bp' = bp`.
    Same,
    /// `bp' = *(cfa + off)`.
    AtCfa(i16),
    /// `bp' = *(bp + off)` (`DW_CFA_expression rbp: DW_OP_breg6 off`).
    AtBp(i16),
    /// Not recoverable by this unwinder: `bp' = 0`, which later rbp-based frames reject.
    Lost,
}

const VALID: u64 = 1 << 63;
/// Rules other than the two common shapes below are decoded through [`Rule`] (cold).
const SPECIAL: u64 = 1 << 62;
/// Common shape, bits 0..32: `cfa_off`; bits 32..48: `bp` offset from the CFA.
const BASE_RBP: u64 = 1 << 48;
const BP_AT_CFA: u64 = 1 << 49;
/// [`Rule::End`] packed.
const END: u64 = VALID | SPECIAL | 1;

impl Rule {
    /// Packs the rule. The common shapes (`cfa = rsp|rbp + k`, `bp` same or saved at
    /// `CFA + j`) get a flat layout the walk applies without decoding; the rest carry
    /// [`SPECIAL`] and an enum-like encoding.
    fn pack(self) -> u64 {
        match self {
            Rule::Cfa {
                base: base @ (Base::Rsp | Base::Rbp),
                cfa_off,
                bp: bp @ (BpRule::Same | BpRule::AtCfa(_)),
            } => {
                let mut w = VALID | u64::from(cfa_off as u32);
                if base == Base::Rbp {
                    w |= BASE_RBP;
                }
                if let BpRule::AtCfa(o) = bp {
                    w |= BP_AT_CFA | (u64::from(o as u16) << 32);
                }
                w
            }
            Rule::End => END,
            Rule::SigFrame => VALID | SPECIAL | 2,
            Rule::Cfa { base, cfa_off, bp } => {
                let b = match base {
                    Base::Rsp => 3,
                    Base::Rbp => 4,
                    Base::DerefRbp => 5,
                };
                let (bk, bo) = match bp {
                    BpRule::Same => (0u64, 0i16),
                    BpRule::AtCfa(o) => (1, o),
                    BpRule::AtBp(o) => (2, o),
                    BpRule::Lost => (3, 0),
                };
                VALID
                    | SPECIAL
                    | b
                    | (bk << 4)
                    | (u64::from(cfa_off as u32) << 8)
                    | (u64::from(bo as u16) << 40)
            }
        }
    }

    fn unpack(w: u64) -> Option<Rule> {
        if w & VALID == 0 {
            return None;
        }
        if w & SPECIAL == 0 {
            let base = if w & BASE_RBP != 0 {
                Base::Rbp
            } else {
                Base::Rsp
            };
            let bp = if w & BP_AT_CFA != 0 {
                BpRule::AtCfa((w >> 32) as u16 as i16)
            } else {
                BpRule::Same
            };
            return Some(Rule::Cfa {
                base,
                cfa_off: w as u32 as i32,
                bp,
            });
        }
        let base = match w & 0xf {
            1 => return Some(Rule::End),
            2 => return Some(Rule::SigFrame),
            3 => Base::Rsp,
            4 => Base::Rbp,
            5 => Base::DerefRbp,
            _ => return None,
        };
        let bo = (w >> 40) as u16 as i16;
        let bp = match (w >> 4) & 0xf {
            0 => BpRule::Same,
            1 => BpRule::AtCfa(bo),
            2 => BpRule::AtBp(bo),
            _ => BpRule::Lost,
        };
        Some(Rule::Cfa {
            base,
            cfa_off: (w >> 8) as u32 as i32,
            bp,
        })
    }

    /// The rule for code without CFI that keeps a frame pointer: `push rbp; mov rbp, rsp`.
    const FRAME_POINTER: Rule = Rule::Cfa {
        base: Base::Rbp,
        cfa_off: 16,
        bp: BpRule::AtCfa(-16),
    };
}

// ---------------------------------------------------------------------------------------
// The rule cache: direct-mapped, lock-free. A slot holds `check = key ^ rule` and `rule`;
// a reader accepts the pair only when `check ^ rule == key`, so a slot torn by two racing
// writers is detected (Hyatt's lockless hashing) instead of yielding a wrong rule.

const CACHE_BITS: u32 = 14;
const CACHE_SLOTS: usize = 1 << CACHE_BITS;

struct Slot {
    check: AtomicU64,
    rule: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SLOT: Slot = Slot {
    check: AtomicU64::new(0),
    rule: AtomicU64::new(0),
};
static CACHE: [Slot; CACHE_SLOTS] = [EMPTY_SLOT; CACHE_SLOTS];

#[inline(always)]
fn slot_of(key: u64) -> &'static Slot {
    let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - CACHE_BITS);
    &CACHE[h as usize]
}

/// The packed rule cached for `key`, or 0.
#[inline(always)]
fn cache_get(key: u64) -> u64 {
    let s = slot_of(key);
    let check = s.check.load(Ordering::Relaxed);
    let rule = s.rule.load(Ordering::Relaxed);
    // An empty slot (0, 0) matches only key 0 and then yields 0, a miss, as it should.
    if check ^ rule == key {
        rule
    } else {
        0
    }
}

fn cache_put(key: u64, rule: Rule) {
    let s = slot_of(key);
    let w = rule.pack();
    s.rule.store(w, Ordering::Relaxed);
    s.check.store(key ^ w, Ordering::Relaxed);
}

fn cache_clear() {
    RULES_GENERATION.fetch_add(1, Ordering::AcqRel);
    for s in CACHE.iter() {
        s.rule.store(0, Ordering::Relaxed);
        s.check.store(0, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------
// Shared state of the miss path.

/// Inline storage for gimli's CFI evaluation, so the miss path never allocates.
struct InlineStore;
impl<T: gimli::ReaderOffset> UnwindContextStorage<T> for InlineStore {
    type Rules = [(Register, RegisterRule<T>); 32];
    type Stack = [UnwindTableRow<T, Self>; 4];
}

struct State {
    /// Executable ranges `(start, end, module index)`, sorted by start.
    text: Vec<(u64, u64, usize)>,
    modules: Vec<CfiModule>,
    /// Readable mappings `(start, end)`, sorted: where stacks are looked up.
    readable: Vec<(u64, u64)>,
    last_refresh_ns: u64,
    /// Whether the last refresh could read `/proc/self/maps`.
    maps_readable: bool,
    ctx: Box<UnwindContext<usize, InlineStore>>,
}

static STATE: SpinLock<Option<State>> = SpinLock::new(None);

/// Minimum time between two re-reads of `/proc/self/maps` caused by unknown addresses (JIT
/// code is never found, and must not make every capture read /proc). Within this window an
/// object `dlopen`ed since the last read is unwound by frame pointers only, or not at all;
/// the runtime's `dlopen` hook can call [`invalidate`] to close the window.
const REFRESH_INTERVAL_NS: u64 = 5_000_000;

/// The unwinder's per-thread state; all-zero bytes are its initial value.
#[repr(C)]
pub struct ThreadSlots {
    /// `[lo, hi)` of the mapping holding this thread's stack, as last looked up.
    stack: Cell<(u64, u64)>,
    /// Set while this thread is in the miss path: a signal handler that captures while the
    /// interrupted code holds the state lock must not wait for itself.
    in_slow_path: Cell<bool>,
}

/// Bytes an embedder's per-thread block for [`set_thread_slots`] must have (aligned to 8).
pub const THREAD_SLOTS_BYTES: usize = core::mem::size_of::<ThreadSlots>();

std::thread_local! {
    static OWN_SLOTS: ThreadSlots = const {
        ThreadSlots {
            stack: Cell::new((0, 0)),
            in_slow_path: Cell::new(false),
        }
    };
}

/// The embedder's function giving the calling thread's block (0: the unwinder's own
/// `thread_local!`).
static SLOTS_FN: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// Keeps the unwinder's per-thread state in `block()`: the calling thread's
/// [`THREAD_SLOTS_BYTES`] bytes, zeroed when the thread starts, 8-aligned, alive as long as
/// the thread. For a library preloaded into a program, whose own `thread_local!` is
/// general-dynamic (a call into the loader's `__tls_get_addr` on every capture), while an
/// initial-exec block of its own is one `%fs`-relative address.
pub fn set_thread_slots(block: unsafe extern "C" fn() -> *mut u8) {
    SLOTS_FN.store(block as usize, Ordering::Release);
}

#[inline(always)]
fn with_slots<R>(f: impl FnOnce(&ThreadSlots) -> R) -> R {
    let p = SLOTS_FN.load(Ordering::Relaxed);
    if p != 0 {
        // SAFETY: only `set_thread_slots` stores here, from such a function, whose block
        // is this thread's, large and aligned enough, and valid zeroed (all-zero bytes are
        // a valid ThreadSlots); ThreadSlots is not Sync, so the reference stays here.
        unsafe {
            let block: unsafe extern "C" fn() -> *mut u8 = core::mem::transmute(p);
            f(&*(block() as *const ThreadSlots))
        }
    } else {
        OWN_SLOTS.with(f)
    }
}

impl State {
    fn new() -> State {
        let mut st = State {
            text: Vec::new(),
            modules: Vec::new(),
            readable: Vec::new(),
            last_refresh_ns: 0,
            maps_readable: false,
            ctx: Box::new(UnwindContext::new_in()),
        };
        st.refresh();
        st
    }

    fn refresh(&mut self) {
        // The modules, hence the rules, may change: logged walks no longer hold.
        RULES_GENERATION.fetch_add(1, Ordering::AcqRel);
        self.last_refresh_ns = oxgrind_sys::raw::monotonic_ns();
        let Some(text) = maps::read_self_maps() else {
            self.maps_readable = false;
            return;
        };
        self.maps_readable = true;
        let maps = maps::parse_maps(&text);
        let modules = elfmem::modules_from_maps(&maps);
        // A module that went away (dlclose) may have its addresses reused by another one:
        // cached rules for it are no longer true.
        let gone = self.modules.iter().any(|old| {
            !modules
                .iter()
                .any(|new| new.base == old.base && new.inode == old.inode && new.path == old.path)
        });
        if gone {
            cache_clear();
        }
        let mut ranges: Vec<(u64, u64, usize)> = Vec::new();
        for (i, m) in modules.iter().enumerate() {
            for &(s, e) in &m.text {
                ranges.push((s, e, i));
            }
        }
        ranges.sort_unstable();
        self.text = ranges;
        self.modules = modules;
        self.readable = maps
            .iter()
            .filter(|m| m.readable)
            .map(|m| (m.start, m.end))
            .collect();
        self.readable.sort_unstable();
    }

    fn refresh_allowed(&self) -> bool {
        oxgrind_sys::raw::monotonic_ns().saturating_sub(self.last_refresh_ns) >= REFRESH_INTERVAL_NS
    }

    fn module_of(&self, addr: u64) -> Option<usize> {
        let i = self.text.partition_point(|r| r.0 <= addr);
        let r = self.text.get(i.checked_sub(1)?)?;
        (addr < r.1).then_some(r.2)
    }

    fn readable_of(&self, addr: u64) -> Option<(u64, u64)> {
        let i = self.readable.partition_point(|r| r.0 <= addr);
        let r = *self.readable.get(i.checked_sub(1)?)?;
        (addr < r.1).then_some(r)
    }

    /// The rule for `addr`, and whether it may be cached (it may not when it is a guess for
    /// an address outside every known module). CFI this unwinder cannot follow gives a
    /// cached [`Rule::End`], so an unusual frame costs one evaluation, not one per capture.
    fn rule_for(&mut self, addr: u64) -> Option<(Rule, bool)> {
        let mut idx = self.module_of(addr);
        if idx.is_none() && self.refresh_allowed() {
            self.refresh();
            idx = self.module_of(addr);
        }
        let Some(idx) = idx else {
            return Some((Rule::FRAME_POINTER, false));
        };
        let Some(cfi) = &self.modules[idx].cfi else {
            return Some((Rule::FRAME_POINTER, true));
        };
        let row = cfi.hdr.table()?.unwind_info_for_address(
            &cfi.eh_frame,
            &cfi.bases,
            &mut self.ctx,
            addr,
            |s, b, o| s.cie_from_offset(b, o),
        );
        match row {
            Ok(row) => Some((rule_from_row(row, &cfi.eh_frame).unwrap_or(Rule::End), true)),
            Err(gimli::Error::NoUnwindInfoForAddress) => Some((Rule::FRAME_POINTER, true)),
            Err(_) => Some((Rule::End, true)),
        }
    }
}

/// Decodes `DW_OP_bregN sleb` followed optionally by `DW_OP_deref`, the only expression
/// shapes x86-64 compilers and the kernel signal trampoline emit in practice.
fn breg_expr(bytes: &[u8]) -> Option<(u16, i64, bool)> {
    let (&op, rest) = bytes.split_first()?;
    if !(0x70..=0x8f).contains(&op) {
        return None;
    }
    let mut r = gimli::EndianSlice::new(rest, gimli::LittleEndian);
    let off = gimli::Reader::read_sleb128(&mut r).ok()?;
    let tail = r.slice();
    let deref = match tail {
        [] => false,
        [0x06] => true,
        _ => return None,
    };
    Some((u16::from(op - 0x70), off, deref))
}

fn expr_bytes(
    e: &gimli::UnwindExpression<usize>,
    eh_frame: &EhFrame<Slice>,
) -> Option<&'static [u8]> {
    e.get(eh_frame).ok().map(|x| x.0.slice())
}

/// Turns gimli's row for one address into a packed [`Rule`], or `None` when the row needs
/// more than this unwinder understands.
fn rule_from_row(
    row: &UnwindTableRow<usize, InlineStore>,
    eh_frame: &EhFrame<Slice>,
) -> Option<Rule> {
    match row.register(RA) {
        RegisterRule::Undefined => return Some(Rule::End),
        RegisterRule::Offset(-8) => {}
        RegisterRule::Expression(e) => {
            let (reg, off, deref) = breg_expr(expr_bytes(&e, eh_frame)?)?;
            return (reg == 7 && off == 168 && !deref).then_some(Rule::SigFrame);
        }
        _ => return None,
    }
    let (base, cfa_off) = match row.cfa() {
        gimli::CfaRule::RegisterAndOffset { register, offset } => {
            let base = match *register {
                RSP => Base::Rsp,
                RBP => Base::Rbp,
                _ => return None,
            };
            (base, i32::try_from(*offset).ok()?)
        }
        gimli::CfaRule::Expression(e) => match breg_expr(expr_bytes(e, eh_frame)?)? {
            (6, off, true) => (Base::DerefRbp, i32::try_from(off).ok()?),
            _ => return None,
        },
    };
    let bp = match row.register(RBP) {
        RegisterRule::Undefined | RegisterRule::SameValue => BpRule::Same,
        RegisterRule::Offset(o) => i16::try_from(o).map(BpRule::AtCfa).unwrap_or(BpRule::Lost),
        RegisterRule::Expression(e) => match expr_bytes(&e, eh_frame).and_then(breg_expr) {
            Some((6, off, false)) => i16::try_from(off).map(BpRule::AtBp).unwrap_or(BpRule::Lost),
            _ => BpRule::Lost,
        },
        _ => BpRule::Lost,
    };
    Some(Rule::Cfa { base, cfa_off, bp })
}

/// Runs `f` on the miss-path state, or returns `None` if this thread is already inside it
/// (capture from a signal handler that interrupted the miss path).
#[cold]
fn with_state<R>(f: impl FnOnce(&mut State) -> Option<R>) -> Option<R> {
    if with_slots(|t| t.in_slow_path.replace(true)) {
        return None;
    }
    let r = {
        let mut guard = STATE.lock();
        let st = guard.get_or_insert_with(State::new);
        f(st)
    };
    with_slots(|t| t.in_slow_path.set(false));
    r
}

/// The packed rule for `key` after a cache miss, or 0 when there is none.
#[cold]
#[inline(never)]
fn rule_slow(key: u64) -> u64 {
    with_state(|st| {
        let (rule, cacheable) = st.rule_for(key)?;
        if cacheable {
            cache_put(key, rule);
        }
        Some(rule.pack())
    })
    .unwrap_or(0)
}

/// The readable mapping holding `sp` (the thread's stack, or a signal stack).
#[cold]
#[inline(never)]
fn stack_bounds_slow(sp: u64) -> Option<(u64, u64)> {
    with_state(|st| {
        if let Some(r) = st.readable_of(sp) {
            return Some(r);
        }
        // A thread created since the last look: its stack is a new mapping. A running
        // thread's stack is always mapped, so this refreshes at most once per new stack;
        // only when /proc cannot be read at all is the rate limit needed.
        if st.maps_readable || st.refresh_allowed() {
            st.refresh();
        }
        st.readable_of(sp)
    })
}

#[inline(always)]
fn stack_bounds(sp: u64) -> Option<(u64, u64)> {
    let (lo, hi) = with_slots(|t| t.stack.get());
    if lo <= sp && sp < hi {
        return Some((lo, hi));
    }
    let b = stack_bounds_slow(sp)?;
    with_slots(|t| t.stack.set(b));
    Some(b)
}

// ---------------------------------------------------------------------------------------
// The walk.

/// Registers the walk needs: instruction pointer, stack pointer, frame pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regs {
    pub pc: u64,
    pub sp: u64,
    pub bp: u64,
}

struct Stack {
    lo: u64,
    hi: u64,
    /// `hi - lo - 8` (0 for a mapping too small to hold a word): the last offset from `lo`
    /// a word can be read at, computed once per walk rather than at every read.
    last: u64,
}

impl Stack {
    #[inline(always)]
    fn new(lo: u64, hi: u64) -> Stack {
        Stack {
            lo,
            hi,
            last: hi.saturating_sub(lo).saturating_sub(8),
        }
    }

    #[inline(always)]
    fn read(&self, addr: u64) -> Option<u64> {
        // One unsigned compare covers both ends (hi - lo >= 8 for any real mapping).
        if addr.wrapping_sub(self.lo) <= self.last && addr & 7 == 0 {
            // SAFETY: [addr, addr+8) lies inside a readable mapping that holds the stack of
            // the running thread (or its signal stack), which cannot be unmapped while the
            // thread runs on it.
            Some(unsafe { core::ptr::read(addr as *const u64) })
        } else {
            None
        }
    }
}

/// Applies a rule outside the common shapes; returns the caller's pc and the next cache key.
#[cold]
fn special_step(w: u64, regs: &mut Regs, stack: &mut Stack) -> Option<(u64, u64)> {
    match Rule::unpack(w)? {
        Rule::End => None,
        Rule::Cfa { base, cfa_off, bp } => {
            let cfa = match base {
                Base::Rsp => regs.sp.wrapping_add(cfa_off as i64 as u64),
                Base::Rbp => regs.bp.wrapping_add(cfa_off as i64 as u64),
                Base::DerefRbp => stack.read(regs.bp.wrapping_add(cfa_off as i64 as u64))?,
            };
            if cfa <= regs.sp {
                return None;
            }
            let ra = stack.read(cfa.wrapping_sub(8))?;
            let new_bp = match bp {
                BpRule::Same => regs.bp,
                BpRule::AtCfa(o) => stack.read(cfa.wrapping_add(o as i64 as u64))?,
                BpRule::AtBp(o) => stack.read(regs.bp.wrapping_add(o as i64 as u64))?,
                BpRule::Lost => 0,
            };
            *regs = Regs {
                pc: ra,
                sp: cfa,
                bp: new_bp,
            };
            Some((ra, ra.wrapping_sub(1)))
        }
        Rule::SigFrame => {
            // struct ucontext at sp: uc_mcontext.gregs[REG_RBP] at +120, RSP +160, RIP +168.
            let bp = stack.read(regs.sp.wrapping_add(120))?;
            let sp = stack.read(regs.sp.wrapping_add(160))?;
            let pc = stack.read(regs.sp.wrapping_add(168))?;
            // The interrupted code may run on another stack (sigaltstack).
            if !(stack.lo <= sp && sp < stack.hi) {
                let (lo, hi) = stack_bounds_slow(sp)?;
                *stack = Stack::new(lo, hi);
            }
            *regs = Regs { pc, sp, bp };
            // The interrupted pc is not a return address: look it up as is.
            Some((pc, pc))
        }
    }
}

/// Fills `out` with the return addresses of the frames above `regs` (whose `pc` is looked up
/// as is), skipping leading ones inside `skip`. `regs` must describe a frame of the calling
/// thread that is still live.
#[inline(always)]
fn walk(regs: Regs, out: &mut [u64], skip: (u64, u64)) -> usize {
    walk_recording(regs, regs.pc, out, &mut [], skip, &mut NoLog)
}

/// What a walk tells a [`WalkLog`]: enough for its caller to know later, without walking,
/// whether a walk from the same registers would give the same frames.
///
/// A walk is a function of its registers, the words it reads and the unwind rules: each
/// step's rule depends on the pc only, and the next registers on the current ones and the
/// words read at addresses computed from them. So when the registers are the same and every
/// word the walk read still holds the value it read, walking again reads the same words at
/// the same addresses and gives the same frames, for as long as the rules are the same
/// ([`rules_generation`]). A walk whose result could change otherwise (a rule not found: the
/// module may become known; a read refused as outside the stack; a signal frame, which may
/// switch stacks) says [`WalkLog::unrepeatable`].
pub trait WalkLog {
    /// The walk read `value` at `addr` (a return address, or a saved frame pointer that a
    /// rule then used), and its result depends on it.
    fn read(&mut self, addr: u64, value: u64);
    /// The walk used the frame pointer it was given (an rbp-based rule before any frame
    /// restored rbp): the result depends on it.
    fn initial_bp_used(&mut self);
    /// The walk's result depends on more than its registers, its reads and the rules.
    fn unrepeatable(&mut self);
}

/// No log: what the ordinary walks pass (every call inlines to nothing).
struct NoLog;

impl WalkLog for NoLog {
    #[inline(always)]
    fn read(&mut self, _: u64, _: u64) {}
    #[inline(always)]
    fn initial_bp_used(&mut self) {}
    #[inline(always)]
    fn unrepeatable(&mut self) {}
}

/// Changes whenever the unwind rules may have (the module list re-read, the rule cache
/// cleared): a [`WalkLog`]'s record holds only while this stays the same.
static RULES_GENERATION: AtomicU64 = AtomicU64::new(1);

/// See [`RULES_GENERATION`].
#[inline]
pub fn rules_generation() -> u64 {
    RULES_GENERATION.load(Ordering::Acquire)
}

/// [`walk`], also writing into `cfas[i]` the canonical frame address of the frame whose
/// return address is `out[i]` (the stack pointer of the caller at the call), when `cfas` is
/// long enough. The caller's frame then spans `[cfas[i], cfas[i + 1])`. `key`: the address
/// whose rule unwinds the first frame (`regs.pc`, or `regs.pc - 1` when it is a return
/// address: the call, not what follows it, which may be another function).
#[inline(always)]
fn walk_recording(
    mut regs: Regs,
    key: u64,
    out: &mut [u64],
    cfas: &mut [u64],
    skip: (u64, u64),
    log: &mut impl WalkLog,
) -> usize {
    let Some((lo, hi)) = stack_bounds(regs.sp) else {
        log.unrepeatable();
        return 0;
    };
    let mut stack = Stack::new(lo, hi);
    let mut n = 0;
    let mut skipping = true;
    let mut key = key;
    // Whether regs.bp is still the one the walk was given (see WalkLog::initial_bp_used).
    let mut bp_given = true;
    // Where regs.bp was restored from and the value, told to the log only when a rule uses
    // it: a saved rbp is often a data register of the caller (code without frame pointers)
    // and changes from call to call without changing the frames.
    let mut bp_from = (0u64, 0u64);
    // Hard bound on the walk, whatever the stack holds.
    for _ in 0..4096 {
        if n >= out.len() {
            break;
        }
        let mut w = cache_get(key);
        if w == 0 {
            w = rule_slow(key);
            if w == 0 {
                log.unrepeatable();
                break;
            }
        }
        let next = if w & SPECIAL == 0 {
            // The common shapes, applied without decoding.
            let base = if w & BASE_RBP != 0 {
                if bp_given {
                    log.initial_bp_used();
                } else {
                    log.read(bp_from.0, bp_from.1);
                }
                regs.bp
            } else {
                regs.sp
            };
            let cfa = base.wrapping_add(w as u32 as i32 as i64 as u64);
            if cfa <= regs.sp {
                break;
            }
            let at = cfa.wrapping_sub(8);
            let Some(ra) = stack.read(at) else {
                log.unrepeatable();
                break;
            };
            log.read(at, ra);
            if w & BP_AT_CFA != 0 {
                let at = cfa.wrapping_add((w >> 32) as u16 as i16 as i64 as u64);
                match stack.read(at) {
                    Some(v) => {
                        bp_from = (at, v);
                        regs.bp = v;
                        bp_given = false;
                    }
                    None => {
                        log.unrepeatable();
                        break;
                    }
                }
            }
            regs.pc = ra;
            regs.sp = cfa;
            key = ra.wrapping_sub(1);
            ra
        } else if w == END {
            // The outermost frame, met once per capture: not worth the cold decoder.
            break;
        } else {
            log.unrepeatable();
            match special_step(w, &mut regs, &mut stack) {
                Some((next, k)) => {
                    key = k;
                    next
                }
                None => break,
            }
        };
        if next == 0 {
            break;
        }
        if skipping && skip.0 <= next && next < skip.1 {
            continue;
        }
        skipping = false;
        out[n] = next;
        if let Some(c) = cfas.get_mut(n) {
            *c = regs.sp;
        }
        n += 1;
    }
    n
}

/// Captures the calling thread's stack: writes the return address of each frame above this
/// call into `out`, innermost first, and returns how many were written.
///
/// The first candidate is the return address into `capture`'s caller. Leading return
/// addresses inside `skip_range` (`[start, end)`, e.g. the runtime's own text, see
/// [`text_range_of`]) are not recorded, so with the runtime's range the first recorded
/// address is the program's call site of `malloc`. The walk stops at the outermost frame,
/// when `out` is full, or at the first frame it cannot unwind safely.
///
/// Signal-safe with respect to this crate's own locks; takes no libc lock and allocates only
/// on a cache miss (module discovery), through Rust's global allocator.
#[inline(never)]
pub fn capture(out: &mut [u64], skip_range: (u64, u64)) -> usize {
    walk(here(), out, skip_range)
}

/// The registers of the function this is inlined into (always inlined, so the walk starts
/// in that function's frame).
#[inline(always)]
fn here() -> Regs {
    let (pc, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers; touches no memory and leaves the stack alone.
    unsafe {
        core::arch::asm!(
            "lea {pc}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            pc = out(reg) pc,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags)
        );
    }
    Regs { pc, sp, bp }
}

/// Like [`capture`], also recording each frame's extent: `cfas[i]` is the stack pointer at
/// the call that `out[i]` returns to, so the function `out[i]` returns into owns
/// `[cfas[i], cfas[i + 1])`. For describing stack addresses ("in frame #2"); not hot.
#[inline(never)]
pub fn capture_with_cfas(out: &mut [u64], cfas: &mut [u64], skip_range: (u64, u64)) -> usize {
    let regs = here();
    walk_recording(regs, regs.pc, out, cfas, skip_range, &mut NoLog)
}

/// Like [`capture_with_cfas`], from explicit registers (a program thread's registers
/// while a tool runs on another stack): `cfas[k]` is the CFA of the frame `out[k]`
/// returns from.
pub fn capture_with_cfas_from(
    regs: Regs,
    out: &mut [u64],
    cfas: &mut [u64],
    skip_range: (u64, u64),
) -> usize {
    walk_recording(regs, regs.pc, out, cfas, skip_range, &mut NoLog)
}

/// The bounds `[sp, high)` of the stack mapping `sp` lies in (the part in use by a thread
/// whose stack pointer is `sp`).
#[inline]
pub fn stack_bounds_at(sp: u64) -> Option<(u64, u64)> {
    stack_bounds(sp).map(|(lo, hi)| (lo.max(sp), hi))
}

/// The bounds `[low, high)` of the stack mapping the calling thread runs on.
pub fn current_stack_bounds() -> Option<(u64, u64)> {
    let sp: u64;
    // SAFETY: reads the stack pointer only.
    unsafe {
        core::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    stack_bounds(sp).map(|(lo, hi)| (lo.max(sp), hi))
}

/// Like [`capture`], from explicit registers (e.g. a signal handler's `ucontext`): `regs.pc`
/// is recorded first (unless skipped), then the return addresses above it. `regs` must
/// describe a live frame of the calling thread, on a stack below (older than) this call.
pub fn capture_from(regs: Regs, out: &mut [u64], skip_range: (u64, u64)) -> usize {
    if out.is_empty() {
        return 0;
    }
    if skip_range.0 <= regs.pc && regs.pc < skip_range.1 {
        return walk(regs, out, skip_range);
    }
    out[0] = regs.pc;
    1 + walk(regs, &mut out[1..], (0, 0))
}

/// Like [`capture_from`], for the registers of a caller right after its `call`: `regs.pc`
/// is the return address (recorded first as is, unless inside `skip_range`), `regs.sp`
/// the stack pointer after the return, `regs.bp` the frame pointer at the call. What an
/// interposed function knows at its entry (`pc = *rsp`, `sp = rsp + 8`, `bp = rbp`): a walk
/// from there never walks the interposer's own frames. The return address's frame is
/// unwound by the rule of the call (`pc - 1`).
#[inline]
pub fn capture_from_call(regs: Regs, out: &mut [u64], skip_range: (u64, u64)) -> usize {
    if out.is_empty() {
        return 0;
    }
    let key = regs.pc.wrapping_sub(1);
    if skip_range.0 <= regs.pc && regs.pc < skip_range.1 {
        return walk_recording(regs, key, out, &mut [], skip_range, &mut NoLog);
    }
    out[0] = regs.pc;
    1 + walk_recording(regs, key, &mut out[1..], &mut [], (0, 0), &mut NoLog)
}

/// [`capture_from_call`], telling `log` what the walk read (see [`WalkLog`]), so that the
/// caller can tell when the same call site's stack has not changed without walking it.
#[inline]
pub fn capture_from_call_logged(
    regs: Regs,
    out: &mut [u64],
    skip_range: (u64, u64),
    log: &mut impl WalkLog,
) -> usize {
    if out.is_empty() {
        return 0;
    }
    let key = regs.pc.wrapping_sub(1);
    if skip_range.0 <= regs.pc && regs.pc < skip_range.1 {
        return walk_recording(regs, key, out, &mut [], skip_range, log);
    }
    out[0] = regs.pc;
    1 + walk_recording(regs, key, &mut out[1..], &mut [], (0, 0), log)
}

/// The executable range `[start, end)` of the loaded object containing `addr`, e.g.
/// `text_range_of(my_malloc as usize as u64)` for the runtime's own code. Not for the hot path.
pub fn text_range_of(addr: u64) -> Option<(u64, u64)> {
    with_state(|st| {
        if st.module_of(addr).is_none() {
            st.refresh();
        }
        let i = st.text.partition_point(|r| r.0 <= addr).checked_sub(1)?;
        let (s, e, m) = st.text[i];
        if addr >= e {
            return None;
        }
        // The union of the object's executable segments.
        let all = st.text.iter().filter(|r| r.2 == m);
        let lo = all.clone().map(|r| r.0).min().unwrap_or(s);
        let hi = all.map(|r| r.1).max().unwrap_or(e);
        Some((lo, hi))
    })
}

/// Re-reads the module list now and forgets every cached rule. For the runtime's `dlopen`
/// and `dlclose` hooks (after the call returns): unknown addresses do trigger a re-read by
/// themselves, but at a bounded rate, and an unloaded object's addresses may be reused.
pub fn invalidate() {
    with_state(|st| {
        st.refresh();
        Some(())
    });
    cache_clear();
}

/// Re-opens the miss-path lock in a child after `fork`, where the thread that held it no
/// longer exists.
///
/// # Safety
/// Call only in the child right after `fork`, before any other thread exists.
pub unsafe fn after_fork_child() {
    // SAFETY: the caller guarantees no other thread runs, so no live guard exists.
    unsafe { STATE.force_unlock() };
    with_slots(|t| t.in_slow_path.set(false));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_survive_packing() {
        let rules = [
            Rule::End,
            Rule::SigFrame,
            Rule::FRAME_POINTER,
            Rule::Cfa {
                base: Base::Rsp,
                cfa_off: 8,
                bp: BpRule::Same,
            },
            Rule::Cfa {
                base: Base::Rsp,
                cfa_off: 0x12345,
                bp: BpRule::AtCfa(-48),
            },
            Rule::Cfa {
                base: Base::DerefRbp,
                cfa_off: -8,
                bp: BpRule::AtBp(0),
            },
            Rule::Cfa {
                base: Base::Rbp,
                cfa_off: -16,
                bp: BpRule::Lost,
            },
        ];
        for r in rules {
            assert_eq!(Rule::unpack(r.pack()), Some(r), "{r:?}");
        }
    }

    #[test]
    fn torn_cache_slot_is_rejected() {
        let key = 0x1234_5678u64;
        cache_put(key, Rule::FRAME_POINTER);
        assert_eq!(Rule::unpack(cache_get(key)), Some(Rule::FRAME_POINTER));
        // Simulate a racing writer that replaced only the rule word.
        slot_of(key).rule.store(Rule::End.pack(), Ordering::Relaxed);
        assert_eq!(cache_get(key), 0);
    }

    #[test]
    fn breg_expressions_decode() {
        assert_eq!(breg_expr(&[0x76, 0x78, 0x06]), Some((6, -8, true)));
        assert_eq!(breg_expr(&[0x77, 0xa8, 0x01]), Some((7, 168, false)));
        assert_eq!(breg_expr(&[0x76, 0x00, 0x06, 0x06]), None);
        assert_eq!(breg_expr(&[0x08, 0x00]), None);
    }
}
