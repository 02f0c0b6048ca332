//! The shared out-of-line body of the shadow-filtered trace probe
//! (`Plan::trace_accesses_filtered`, DHAT's probe before every instruction that may touch
//! the heap): one routine per operand size, access kind and whether the guest flags are
//! live, made once at start-up and called from every translation.
//!
//! Inline, the whole probe was about 250 bytes per memory operand (the hot-range tests,
//! two shadow compares, the append of a record, the drain check and its out-of-line
//! call), which made DHAT's code cache 3.3 times `--tool=none`'s: translating, page-faulting
//! and fetching that code was most of what DHAT added to a short run (`python3 -c
//! print`). A call site is now 27 bytes for most operands:
//!
//! ```text
//!     mov gs:[STUB_RAX], rax; lea rax, [operand]
//!     lea rsp, [rsp - 128]; call gs:[trace_checks + 8 * k]
//! ```
//!
//! and routine `k` (`rax` = the operand's first byte) tests the thread's hot ranges,
//! then the shadow map, appends the record, checks the drain mark, and gives back the
//! flags and the guest `rax` before it returns with `ret 128`: the code after the call is
//! at the guest instruction again. That is the form where the guest flags are live. Where
//! they are dead the call site makes the tests itself, inline, and calls a routine that
//! only appends, for an access to be recorded (`Emitter::trace_check_inline`): a call
//! and return per access made a loop over a hot block (bench `compute`) 1.6 times as slow.
//!
//! The call's return address goes on the guest's stack, beyond its red zone: the 8 bytes
//! at `rsp - 136`, which the ABI lets a signal frame overwrite at any instruction, so no
//! program may keep anything there (the kernel writes a whole frame below the red zone
//! when a signal arrives). The engine's other code keeps its temporaries in the context
//! page, never on the guest stack; this is one of two exceptions (the other: the shared
//! recent-lines routines, `translate::recent_line_routines`), for speed: the call on the
//! engine stack (`mov gs:[slot], rsp; mov rsp, gs:[estack]; call; mov rsp, gs:[slot]`,
//! safe even for a program whose stack ends right below `rsp`) made every probed access
//! wait for `rsp` to come back through memory: xz under DHAT ran 6-9% slower than with the
//! inline probe, this form as fast (paired runs, session 13).
//!
//! A full buffer is drained as the inline probe did: the routine gives back every guest
//! register but `rax` (in `STUB_RAX`), puts the guest `rsp` back, and makes the clean call
//! [`probe::trace_full_record_at`] returning to the call's return address (a guest
//! instruction boundary, where the dispatcher may raise a deferred signal). A signal
//! arriving inside a routine is deferred and the thread single-stepped to the next
//! boundary, as in any engine code of the cache (`signals::between_guest_instructions`
//! asks [`contains`]).
//!
//! Only the tag 0 (DHAT's) has routines; other tags, other sizes and tools with a
//! recent-lines table keep the inline form.
//!
//! [`probe::trace_full_record_at`]: crate::probe::trace_full_record_at

use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use iced_x86::{OpAccess, UsedMemory};
use oxgrind_sys::lock::SpinLock;
use oxgrind_tool::instrument::{TraceKind, HOT_RANGES};

use crate::context::{self as c, ThreadCtx};

/// Operand sizes with routines (1 to 64 bytes, powers of two).
const SIZES: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];
/// Whole probes: per size, per kind (read, write, modify), flags dead or live.
const FULL: usize = SIZES.len() * 3 * 2;
/// Routines, the whole probes first, then per size and kind the flags-dead routine that
/// only appends, for call sites that test inline ([`index_append`]).
pub const COUNT: usize = FULL + SIZES.len() * 3;

/// What a call site moves `rsp` down by before its call: the guest's red zone, which the
/// return address must not overwrite (`ret 128` gives it back).
pub(crate) const RED_ZONE_SKIP: u8 = 128;

/// 0: not made yet; 1: made (`START`..`END`, `TABLE`); 2: could not be made.
static STATE: AtomicU8 = AtomicU8::new(0);
static MAKING: SpinLock<()> = SpinLock::new(());
static START: AtomicU64 = AtomicU64::new(0);
static END: AtomicU64 = AtomicU64::new(0);
static TABLE: [AtomicU64; COUNT] = [const { AtomicU64::new(0) }; COUNT];

/// The routine of an operand of `size` bytes and kind `kind`, when there is one.
pub(crate) fn index(size: u32, kind: TraceKind, flags_live: bool) -> Option<usize> {
    let s = SIZES.iter().position(|&x| x == size)?;
    let k = match kind {
        TraceKind::Read => 0,
        TraceKind::Write => 1,
        TraceKind::Modify => 2,
        TraceKind::Block => return None,
    };
    Some((s * 3 + k) * 2 + flags_live as usize)
}

/// The flags-dead routine of an operand of `size` bytes and kind `kind` that appends its
/// record and tests nothing: for a call site that tested the hot ranges and the shadow
/// map itself.
pub(crate) fn index_append(size: u32, kind: TraceKind) -> Option<usize> {
    let full = index(size, kind, false)?;
    Some(FULL + full / 2)
}

/// The trace kind of operand `m`, as the inline probe records it.
pub(crate) fn kind_of(m: &UsedMemory) -> TraceKind {
    match m.access() {
        OpAccess::Read | OpAccess::CondRead => TraceKind::Read,
        OpAccess::Write | OpAccess::CondWrite => TraceKind::Write,
        _ => TraceKind::Modify,
    }
}

/// Whether the routines exist (translations may call them).
pub(crate) fn ready() -> bool {
    STATE.load(Ordering::Acquire) == 1
}

/// Whether host pc `host` lies in a routine (engine code: not a guest instruction boundary).
pub(crate) fn contains(host: u64) -> bool {
    ready() && (START.load(Ordering::Relaxed)..END.load(Ordering::Relaxed)).contains(&host)
}

/// Gives a new context the routines' addresses, making them first if they are not made
/// yet (the first context is made before anything is translated, so every context that
/// runs a call has them). Without the shadow map or memory, nothing: the probes stay
/// inline.
pub(crate) fn attach(ctx: &mut ThreadCtx) {
    if STATE.load(Ordering::Acquire) == 0 {
        let _making = MAKING.lock();
        if STATE.load(Ordering::Acquire) == 0 {
            let made = crate::shadow::base() != 0 && make();
            STATE.store(if made { 1 } else { 2 }, Ordering::Release);
        }
    }
    if ready() {
        for (slot, r) in ctx.trace_checks.iter_mut().zip(TABLE.iter()) {
            *slot = r.load(Ordering::Relaxed);
        }
    }
}

/// Writes every routine into one fresh executable mapping.
fn make() -> bool {
    let Some(full) = crate::probe::trace_full_record_at(0) else {
        return false;
    };
    let hot = crate::trace::hot_enabled();
    let mut code = alloc::vec::Vec::with_capacity(16 << 10);
    let mut at = [0usize; COUNT];
    for (s, &size) in SIZES.iter().enumerate() {
        for (k, kind) in [TraceKind::Read, TraceKind::Write, TraceKind::Modify]
            .into_iter()
            .enumerate()
        {
            for flags in [false, true] {
                while code.len() % 16 != 0 {
                    code.push(0xCC);
                }
                at[(s * 3 + k) * 2 + flags as usize] = code.len();
                routine(&mut code, size, kind, flags, Tests::All, hot, full);
            }
            while code.len() % 16 != 0 {
                code.push(0xCC);
            }
            at[FULL + s * 3 + k] = code.len();
            routine(&mut code, size, kind, false, Tests::None, hot, full);
        }
    }
    let len = code.len().next_multiple_of(4096);
    let Some(p) = oxgrind_sys::raw::mmap_anon(len) else {
        return false;
    };
    // SAFETY: a fresh private mapping of `len` >= code.len() bytes, ours alone.
    unsafe { core::ptr::copy_nonoverlapping(code.as_ptr(), p, code.len()) };
    const SYS_MPROTECT: usize = 10;
    const PROT_READ_EXEC: usize = 5;
    // SAFETY: changes the protection of the mapping just made, which nothing else uses.
    let r =
        unsafe { oxgrind_sys::syscall::syscall3(SYS_MPROTECT, p as usize, len, PROT_READ_EXEC) };
    if oxgrind_sys::syscall::check(r).is_err() {
        return false;
    }
    let base = p as u64;
    for (slot, &off) in TABLE.iter().zip(at.iter()) {
        slot.store(base + off as u64, Ordering::Relaxed);
    }
    START.store(base, Ordering::Relaxed);
    END.store(base + code.len() as u64, Ordering::Relaxed);
    true
}

/// A little encoder of the few instruction forms the routines use.
struct Code<'a>(&'a mut alloc::vec::Vec<u8>);

impl Code<'_> {
    fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }
    fn d32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// `op r64, gs:[off]` (`op` = 0x8B mov, 0x2B sub, 0x3B cmp, 0x03 add), r < 8.
    fn gs_op(&mut self, op: u8, reg: u8, off: usize) {
        self.bytes(&[0x65, 0x48, op, (reg << 3) | 0x04, 0x25]);
        self.d32(off as u32);
    }
    /// `mov gs:[off], r64`, r < 8.
    fn store_gs(&mut self, reg: u8, off: usize) {
        self.bytes(&[0x65, 0x48, 0x89, (reg << 3) | 0x04, 0x25]);
        self.d32(off as u32);
    }
    /// A rel32 jump (`op` = [0x0F, 0x82] jb, [0x0F, 0x85] jne, [0xE9] jmp) to be patched;
    /// returns the position of its rel32.
    fn jump(&mut self, op: &[u8]) -> usize {
        self.bytes(op);
        let at = self.0.len();
        self.d32(0);
        at
    }
    /// Aims the rel32 at `at` at the current end.
    fn land(&mut self, at: usize) {
        let rel = (self.0.len() - (at + 4)) as u32;
        self.0[at..at + 4].copy_from_slice(&rel.to_le_bytes());
    }
    /// Gives back the flags (saved by `push rax; lahf; seto al; push rax`: the address
    /// under the flags, both dropped).
    fn flags_back(&mut self, flags: bool) {
        if flags {
            // pop rax; add al, 0x7f; sahf; pop rax
            self.bytes(&[0x58, 0x04, 0x7F, 0x9E, 0x58]);
        }
    }
    /// The routine's end: the flags and the guest `rax` back, and `ret`.
    fn done(&mut self, flags: bool) {
        self.flags_back(flags);
        self.gs_op(0x8B, 0, c::scratch_off(c::S_STUB_RAX)); // mov rax, gs:[STUB_RAX]
        self.bytes(&[0xC2, RED_ZONE_SKIP, 0x00]); // ret 128
    }
}

/// What a routine tests before it appends a record.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tests {
    /// The hot ranges (when the tool has them), then the shadow map: a whole probe.
    All,
    /// None: the call site tested both inline (`Emitter::trace_check_inline`) and calls
    /// only when the access is to be recorded.
    None,
}

/// One routine: `rax` = the operand's address, `rsp` 128 bytes below the guest's and the
/// return address there, the guest `rax` in `STUB_RAX`, every other register the guest's.
/// Its own pushes go below the return address (beyond the red zone, as the call).
/// The paths that append nothing (a hot range's access, an unmarked granule) use no other
/// register. An access is recorded when the granule of its first byte is marked: DHAT
/// charges an access to the block that holds its first byte (Valgrind's
/// `find_Block_containing(addr)`), so the other granules' marks decide nothing.
///
/// ```text
///     [push rax; lahf; seto al; push rax; mov rax, [rsp+8]]      (flags live)
///     [per hot range: sub rax, gs:[step]; cmp rax, gs:[len]; jb hot_r
///      add rax, gs:[hot[last].lo]]                  (the address again: the steps add up)
///     push rcx; mov rcx, rax
///     [shr rax, 3; add rax, gs:[shadow]; cmp byte [rax], 0; jne append
///     pop rcx
/// done:
///     [pop rax; add al, 0x7f; sahf; pop rax]; mov rax, gs:[STUB_RAX]; ret 128
/// hot_r:
///     add gs:[hot_r.read_bytes / write_bytes], size; as done]          (`Tests::All`)
/// append:
///     record (rcx, tag 0, size | kind << 16) at gs:[trace_ptr], advanced; pop rcx;
///     below gs:[trace_end]: jmp done
///     else: the flags back; pop rax (return address); PROBE_RET = it;
///     lea rsp, [rsp + 128]; rax = the drain's record; jmp gs:[probe_entry]
/// [done: as above]                                                    (`Tests::None`)
/// ```
fn routine(
    out: &mut alloc::vec::Vec<u8>,
    size: u32,
    kind: TraceKind,
    flags: bool,
    tests: Tests,
    hot: bool,
    full: u64,
) {
    const MOV: u8 = 0x8B;
    const SUB: u8 = 0x2B;
    const CMP: u8 = 0x3B;
    const ADD: u8 = 0x03;
    const RANGE: usize = core::mem::size_of::<oxgrind_tool::instrument::HotRange>();
    let hot = hot && tests == Tests::All;
    let mut a = Code(out);
    if flags {
        // push rax; lahf; seto al; push rax; mov rax, [rsp+8]
        a.bytes(&[
            0x50, 0x9F, 0x0F, 0x90, 0xC0, 0x50, 0x48, 0x8B, 0x44, 0x24, 0x08,
        ]);
    }
    let mut to_hot = [0usize; HOT_RANGES];
    if hot {
        const TEST: usize = core::mem::size_of::<crate::trace::HotTest>();
        for (r, j) in to_hot.iter_mut().enumerate() {
            a.gs_op(SUB, 0, c::OFF_HOT_TESTS + r * TEST);
            a.gs_op(CMP, 0, c::OFF_HOT_TESTS + r * TEST + 8);
            *j = a.jump(&[0x0F, 0x82]);
        }
        // (`trace::sync_hot_tests`: the steps add up to the last range's start.)
        a.gs_op(ADD, 0, c::OFF_HOT + (HOT_RANGES - 1) * RANGE);
    }
    a.bytes(&[0x51, 0x48, 0x89, 0xC1]); // push rcx; mov rcx, rax
    let mut done = None;
    let mut to_append = None;
    if tests == Tests::All {
        a.bytes(&[0x48, 0xC1, 0xE8, 0x03]); // shr rax, 3
        a.gs_op(ADD, 0, c::OFF_SHADOW);
        a.bytes(&[0x80, 0x38, 0x00]); // cmp byte [rax], 0
        to_append = Some(a.jump(&[0x0F, 0x85]));
        a.bytes(&[0x59]); // pop rcx
        done = Some(a.0.len());
        a.done(flags);
    }
    if hot {
        let counts: &[usize] = match kind {
            TraceKind::Read => &[16],
            TraceKind::Write => &[24],
            _ => &[16, 24],
        };
        for (r, &j) in to_hot.iter().enumerate() {
            a.land(j);
            for &off in counts {
                // add qword ptr gs:[hot[r] + off], size
                a.bytes(&[0x65, 0x48, 0x81, 0x04, 0x25]);
                a.d32((c::OFF_HOT + r * RANGE + off) as u32);
                a.d32(size);
            }
            a.done(flags);
        }
    }
    if let Some(j) = to_append {
        a.land(j);
    }
    a.gs_op(MOV, 0, c::OFF_TRACE_PTR);
    a.bytes(&[0x48, 0x89, 0x08]); // mov [rax], rcx
    let word = (size | (kind as u32) << 16) as u64;
    a.bytes(&[0x48, 0xB9]); // mov rcx, (size | kind << 16) << 32 | tag 0
    a.bytes(&(word << 32).to_le_bytes());
    a.bytes(&[0x48, 0x89, 0x48, 0x08]); // mov [rax+8], rcx
    a.bytes(&[0x48, 0x8D, 0x40, 0x10]); // lea rax, [rax+16]
    a.store_gs(0, c::OFF_TRACE_PTR);
    a.gs_op(CMP, 0, c::OFF_TRACE_END);
    a.bytes(&[0x59]); // pop rcx (the flags stay)
    let not_full = a.jump(&[0x0F, 0x82]);
    if let Some(done) = done {
        let rel = done as i64 - a.0.len() as i64;
        a.0[not_full..not_full + 4].copy_from_slice(&(rel as i32).to_le_bytes());
    }
    // Full: the clean call, from the call site's end, with the guest's registers.
    a.flags_back(flags);
    a.bytes(&[0x58]); // pop rax (the return address)
    a.store_gs(0, c::scratch_off(c::S_PROBE_RET));
    a.bytes(&[0x48, 0x8D, 0xA4, 0x24]); // lea rsp, [rsp + 128]: the guest's
    a.d32(RED_ZONE_SKIP as u32);
    a.bytes(&[0x48, 0xB8]); // mov rax, full
    a.bytes(&full.to_le_bytes());
    a.bytes(&[0x65, 0xFF, 0x24, 0x25]); // jmp gs:[probe_entry]
    a.d32(c::OFF_PROBE_ENTRY as u32);
    if done.is_none() {
        a.land(not_full);
        a.done(flags);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic};

    /// Every routine decodes whole; each branch lands on one of its own instructions; it
    /// leaves only by `ret 128` (one per path that appends nothing or a record below the
    /// mark) or by the drain's `jmp gs:[probe_entry]`; and its pushes and pops balance
    /// on every way out (checked by walking each path).
    #[test]
    fn every_routine_is_well_formed_and_leaves_with_its_stack_balanced() {
        for &size in &SIZES {
            for kind in [TraceKind::Read, TraceKind::Write, TraceKind::Modify] {
                for flags in [false, true] {
                    for hot in [false, true] {
                        for tests in [Tests::All, Tests::None] {
                            let mut code = alloc::vec::Vec::new();
                            routine(&mut code, size, kind, flags, tests, hot, 0x1234_5678);
                            check(&code, size, flags, hot && tests == Tests::All);
                        }
                    }
                }
            }
        }
    }

    fn check(code: &[u8], size: u32, flags: bool, hot: bool) {
        let base = 0x10_0000u64;
        let mut d = Decoder::with_ip(64, code, base, DecoderOptions::NONE);
        let mut ins = alloc::vec::Vec::new();
        while d.can_decode() {
            let i = d.decode();
            assert!(!i.is_invalid(), "size {size}: invalid at {:#x}", i.ip());
            ins.push(i);
        }
        let at = |ip: u64| ins.iter().position(|i| i.ip() == ip);
        let rets = ins
            .iter()
            .filter(|i| i.mnemonic() == Mnemonic::Ret && i.immediate16() == RED_ZONE_SKIP as u16)
            .count();
        // done, one per hot range.
        let want = 1 + if hot { HOT_RANGES } else { 0 };
        assert_eq!(rets, want, "size {size} flags {flags} hot {hot}");
        // Walk every path from the entry with its stack depth (pushes minus pops).
        let mut seen = alloc::vec![None; ins.len()];
        let mut todo = alloc::vec![(0usize, 0i32)];
        let mut exits = 0;
        while let Some((mut k, mut depth)) = todo.pop() {
            loop {
                if let Some(d) = seen[k] {
                    assert_eq!(d, depth, "size {size}: two depths at {:#x}", ins[k].ip());
                    break;
                }
                seen[k] = Some(depth);
                let i = &ins[k];
                match i.mnemonic() {
                    Mnemonic::Push => depth += 1,
                    Mnemonic::Pop => depth -= 1,
                    _ => {}
                }
                match i.flow_control() {
                    FlowControl::Return => {
                        assert_eq!(depth, 0, "size {size}: ret with pushes left");
                        exits += 1;
                        break;
                    }
                    FlowControl::IndirectBranch => {
                        // The drain: the return address popped too.
                        assert_eq!(depth, -1, "size {size}: drain with a wrong stack");
                        exits += 1;
                        break;
                    }
                    FlowControl::UnconditionalBranch => {
                        k = at(i.near_branch_target()).expect("a jump into the routine");
                    }
                    FlowControl::ConditionalBranch => {
                        let t = at(i.near_branch_target()).expect("a branch into the routine");
                        todo.push((t, depth));
                        k += 1;
                    }
                    _ => k += 1,
                }
                assert!(k < ins.len(), "size {size}: runs off the end");
            }
        }
        assert!(exits > want, "size {size}: every exit reached");
        assert!(seen.iter().all(|s| s.is_some()), "size {size}: dead code");
    }
}
