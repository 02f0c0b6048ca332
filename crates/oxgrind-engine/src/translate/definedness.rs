//! Definedness's inline fast path (Dr. Memory's design, `docs/definedness.md`): before an
//! instruction with a fast form (`definedness::fast_form`), a few compares in the code
//! cache stand in for the clean call into the interpreter when every input is defined,
//! which is nearly always. The general registers' and the flags' shadows are in the thread
//! context (`gs:`-relative): a register-only form where the flags are dead borrows
//! nothing, one where they are live tests each shadow in a borrowed `rcx` with `jrcxz`
//! (`Emitter::definedness_live_flags`); anything else borrows `rax` (and saves the flags
//! where live, as the filtered probes do, keeping the borrow for the tool's access check
//! of the same instruction: `Emitter::keep_borrow`). It checks, each with a jump to the
//! out-of-line slow call:
//!
//! * at a block's first stepped instruction, what happened since the program's last one:
//!   a signal handler starts (`vbits_signal`: slow), or the runtime's own code ran
//!   (`vbits_own_code`: its catch-up is done inline when it returned into the program);
//! * no slow step is due: the last step asked for one (`vbits_need_step`: after a move of
//!   `rsp` the fast forms do not handle, a `rep` instruction, a system call; also until
//!   the thread's first step, which makes its state, `ctx.vbits`);
//! * the shadow of each general register read is zero, and the flags' shadow if the
//!   instruction reads or writes a flag;
//! * each memory operand lies in one 64 KiB span of the memory shadow, and its shadow
//!   bytes are zero (or the span has no chunk: all defined); an address above the user
//!   space goes slow. A written-only operand's shadow bytes are zeroed instead, or, for
//!   a store copy (`mov m, r`), get the register's (`Emitter::store_copy`).
//!
//! Operands of a block addressed by the same base register at nearby displacements, with
//! the register unwritten in between, share one span check and primary lookup
//! ([`span_shares`]): the first checks that the span of all of them is one and keeps
//! where its primary entry is (an offset from `gs`) in `gs:[vbits_span]`; the later ones
//! read the entry from there.
//!
//! Every thread sees the primary table at `gs:[VIEW_OFF]` (`definedness::views`), so a
//! span's entry is one load, `mov rax, gs:[index*8 + VIEW_OFF]`, after the index is
//! bounded by the thread's `gs:[vbits_limit]` (all of user space, or nothing for a thread
//! whose view could not be made).
//!
//! Then it zeroes the shadow bytes of the registers written, gives back what it borrowed,
//! and the instruction runs. The slow call runs the interpreter exactly as without
//! the fast path and returns after the inline part.

use super::{Emitter, SlowCall, TranslateError};
use crate::context as c;
use crate::definedness::{
    FastForm, StackOrigin, Written, ALL_VECTORS_STALE, CALLER_SAVED, OFF_REP_PC, OFF_REP_RCX,
    OFF_SHADOW_VECTOR, OFF_SHADOW_X87, OFF_SHADOW_X87_STATUS, OFF_VECTORS_STALE,
};
use core::sync::atomic::{AtomicU64, Ordering};
use iced_x86::Register;

// Every form below that reaches memory's shadow (checks, zeroing, load and store copies of
// general and vector registers, the new stack's marking) is the inline half of the
// layout's rule (`definedness::layout`): an address's shadow byte is the address plus its
// span's primary entry, one byte per byte.
const _: () = assert!(crate::definedness::MEMORY_BYTES_PER_SHADOW_BYTE == 1);
/// Where each thread sees the memory shadow's primary table, from its context (`gs`).
const VIEW_OFF: u32 = crate::definedness::views::VIEW_OFF as u32;

/// Host address of the catch-up routine (`catch_up_routine`) of the arena the block being
/// translated goes to; 0 when it has none (the catch-up is then emitted in the block).
/// Set by the code cache, under its lock, before each translation.
static CATCH_UP_ROUTINE: AtomicU64 = AtomicU64::new(0);

/// Says which catch-up routine (0: none) the next translations may jump to; the arena's
/// stack-split routine lies [`CATCH_UP_ROOM`] bytes after it ([`definedness_routines`]).
pub(crate) fn set_catch_up_routine(at: u64) {
    CATCH_UP_ROUTINE.store(at, Ordering::Relaxed);
}

/// Bytes from the start of an arena's definedness routines to its stack-split routine:
/// the catch-up routine's room (about 200 bytes used).
const CATCH_UP_ROOM: usize = 512;

/// Host address of the stack-split routine (`stack_split_routine`) of the arena the block
/// being translated goes to; 0: none.
fn stack_split_routine_at() -> u64 {
    match CATCH_UP_ROUTINE.load(Ordering::Relaxed) {
        0 => 0,
        at => at + CATCH_UP_ROOM as u64,
    }
}

/// The definedness routines of one code-cache arena, placed at host address `base`: the
/// catch-up routine ([`catch_up_routine`]) at `base`, the stack-split routine
/// ([`stack_split_routine`]) at `base + CATCH_UP_ROOM`.
pub(crate) fn definedness_routines(base: u64) -> Result<alloc::vec::Vec<u8>, TranslateError> {
    let mut code = catch_up_routine(base)?;
    if code.len() > CATCH_UP_ROOM {
        return Err(TranslateError::Encode { pc: 0 });
    }
    code.resize(CATCH_UP_ROOM, 0xCC);
    code.extend_from_slice(&stack_split_routine());
    Ok(code)
}

/// What [`stack_split_routine`] does besides marking the new stack: the fast form's own
/// stack operand (bits 28-29 of its parameters).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SplitOperand {
    None = 0,
    /// `push`, `call`: the qword at `[rsp - 8]` written (its shadow zeroed).
    WrittenBelow = 1,
    /// `ret`: the qword at `[rsp]` read (its shadow must be zero, else slow).
    ReadAt = 2,
}

/// The parameters [`stack_split_routine`] takes in `gs:[vbits_temp2]` for a
/// [`StackAtOnce`]: the new undefined bytes' offset from `rsp` (bits 0-15, signed), their
/// length (bits 16-27) and the [`SplitOperand`] (bits 28-29); `None` for a plan it does
/// not do (the straddling case then stays slow).
fn split_params(plan: StackAtOnce) -> Option<u32> {
    let (off, len) = plan.undefined;
    let operand = match plan.operand {
        None => SplitOperand::None,
        Some((-8, 8, false)) => SplitOperand::WrittenBelow,
        Some((0, 8, true)) => SplitOperand::ReadAt,
        Some(_) => return None,
    };
    if off % 8 != 0 || len % 8 != 0 || !(8..=0xfff).contains(&len) || off != off as i16 as i32 {
        return None;
    }
    Some(off as u16 as u32 | (len as u32) << 16 | (operand as u32) << 28)
}

/// The stack-split routine: a fast form's stack marking when its range straddles two
/// 64 KiB spans of the memory shadow (`Emitter::stack_at_once`'s one span check failed).
/// When a hot call depth sits just above a span boundary, every `call`, `ret` and `push`
/// there would otherwise take the slow path, and the step after it too (h16's census:
/// 8 M steps, 40x, on a loop of calls 100 bytes above a boundary; ASLR decides where the
/// boundaries fall). Entered by a `jmp` from a block's out-of-line thunk
/// (`Emitter::stack_split_thunk`) with the return address in `rax`, the guest `rax`
/// borrowed and the flags free, the parameters in `gs:[vbits_temp2]` ([`split_params`]);
/// borrows `rcx` (in `gs:[vbits_saved_rcx]`) and gives it back. Returns by a `jmp` with ZF
/// set when it did the marking, clear when the instruction must take its slow call
/// (`rsp` not 8-aligned, a span without chunk or above user space, an undefined return
/// address), before any new stack byte is marked (a written operand may already be
/// zeroed: the instruction writes it defined anyway).
///
/// ```text
///     mov gs:[probe_ret], rax; test spl, 7; jnz fail_rcx_kept; mov gs:[saved_rcx], rcx
///     (operand) rcx = rsp - 8 or rsp; rax = its span's entry (jz fail); add rax, rcx
///               mov qword [rax], 0   or   cmp qword [rax], 0; jne fail
///     rcx = rsp + off; the spans of the first and last qword have chunks, else fail
///     gs:[temp] = rcx + len
///   piece: rax = the shadow of [rcx] (its span's entry + rcx)
///   qword: mov qword [rax], -1; add rcx, 8; cmp rcx, gs:[temp]; jae done
///          add rax, 8; test cx, cx; jnz qword; jmp piece      (a new span)
///   done:  mov rcx, gs:[saved_rcx]; cmp eax, eax; jmp gs:[probe_ret]
///   fail:  mov rcx, gs:[saved_rcx]
///   fail_rcx_kept: test rsp, rsp; jmp gs:[probe_ret]
/// ```
///
/// Engine code with no guest pc, as the catch-up routine: an asynchronous signal steps on
/// to the next guest instruction, after `rcx` is back.
fn stack_split_routine() -> alloc::vec::Vec<u8> {
    let mut e = Emitter::new(0, 0, false);
    let temp2 = c::OFF_VBITS_TEMP2 as u32;
    // Jumps (positions of rel32) to `fail` and `fail_rcx_kept`.
    let mut to_fail: alloc::vec::Vec<usize> = alloc::vec::Vec::new();
    let jcc = |e: &mut Emitter, cc: u8, to: &mut alloc::vec::Vec<usize>| {
        e.buf.extend_from_slice(&[0x0F, cc]);
        to.push(e.buf.len());
        e.d32(0);
    };
    e.store_gs(0, c::scratch_off(c::S_PROBE_RET));
    // test spl, 7; jnz fail_rcx_kept
    e.buf
        .extend_from_slice(&[0x40, 0xF6, 0xC4, 0x07, 0x0F, 0x85]);
    let unaligned = e.buf.len();
    e.d32(0);
    e.store_gs(1, c::OFF_VBITS_SAVED_RCX);
    // The operand: test byte gs:[temp2+3], 0x30; jz range
    e.buf.extend_from_slice(&[0x65, 0xF6, 0x04, 0x25]);
    e.d32(temp2 + 3);
    e.buf.extend_from_slice(&[0x30, 0x0F, 0x84]);
    let no_operand = e.buf.len();
    e.d32(0);
    // lea rcx, [rsp-8]; test byte gs:[temp2+3], 0x20; jz below; add rcx, 8; below:
    e.buf.extend_from_slice(&[0x48, 0x8D, 0x4C, 0x24, 0xF8]);
    e.buf.extend_from_slice(&[0x65, 0xF6, 0x04, 0x25]);
    e.d32(temp2 + 3);
    e.buf
        .extend_from_slice(&[0x20, 0x74, 0x04, 0x48, 0x83, 0xC1, 0x08]);
    e.span_entry_of_rcx(&mut to_fail, true);
    // add rax, rcx (the operand's shadow); test byte gs:[temp2+3], 0x20; jnz read
    e.buf
        .extend_from_slice(&[0x48, 0x01, 0xC8, 0x65, 0xF6, 0x04, 0x25]);
    e.d32(temp2 + 3);
    // jnz read (rel8 over the 7-byte store and the 2-byte jmp); mov qword [rax], 0;
    // jmp range (rel8 over the 10-byte compare and jump)
    e.buf.extend_from_slice(&[0x20, 0x75, 0x09]);
    e.buf
        .extend_from_slice(&[0x48, 0xC7, 0x00, 0x00, 0x00, 0x00, 0x00, 0xEB, 0x0A]);
    // read: cmp qword [rax], 0; jne fail
    e.buf.extend_from_slice(&[0x48, 0x83, 0x38, 0x00]);
    jcc(&mut e, 0x85, &mut to_fail);
    // range: movsx rcx, word gs:[temp2]; add rcx, rsp
    let range = e.buf.len();
    let rel = (range - (no_operand + 4)) as u32;
    e.buf[no_operand..no_operand + 4].copy_from_slice(&rel.to_le_bytes());
    e.buf
        .extend_from_slice(&[0x65, 0x48, 0x0F, 0xBF, 0x0C, 0x25]);
    e.d32(temp2);
    e.buf.extend_from_slice(&[0x48, 0x01, 0xE1]);
    // mov eax, gs:[temp2]; shr eax, 16; and eax, 0xfff: the length
    let length = |e: &mut Emitter| {
        e.buf.extend_from_slice(&[0x65, 0x8B, 0x04, 0x25]);
        e.d32(temp2);
        e.buf
            .extend_from_slice(&[0xC1, 0xE8, 0x10, 0x25, 0xFF, 0x0F, 0x00, 0x00]);
    };
    // The last qword's span (it is the higher, so its index is the one to bound):
    // lea rax, [rcx+rax-8]; shr rax, 16; cmp rax, gs:[limit]; jae fail;
    // cmp qword gs:[rax*8+view], 0; je fail
    length(&mut e);
    e.buf.extend_from_slice(&[0x48, 0x8D, 0x44, 0x01, 0xF8]);
    e.buf.extend_from_slice(&[0x48, 0xC1, 0xE8, 0x10]);
    e.cmp_rax_limit();
    jcc(&mut e, 0x83, &mut to_fail);
    e.cmp_entry_zero();
    jcc(&mut e, 0x84, &mut to_fail);
    // The first qword's span: mov rax, rcx; shr rax, 16; cmp qword gs:[rax*8+view], 0;
    // je fail
    e.buf
        .extend_from_slice(&[0x48, 0x89, 0xC8, 0x48, 0xC1, 0xE8, 0x10]);
    e.cmp_entry_zero();
    jcc(&mut e, 0x84, &mut to_fail);
    // gs:[temp] = the end: (length) add rax, rcx; mov gs:[temp], rax
    length(&mut e);
    e.buf.extend_from_slice(&[0x48, 0x01, 0xC8]);
    e.store_gs(0, c::OFF_VBITS_TEMP);
    // piece: rax = the shadow of [rcx] (its chunk checked above)
    let piece = e.buf.len();
    e.span_entry_of_rcx(&mut to_fail, false);
    e.buf.extend_from_slice(&[0x48, 0x01, 0xC8]);
    // qword: mov qword [rax], -1; add rcx, 8; cmp rcx, gs:[temp]; jae done
    let qword = e.buf.len();
    e.buf
        .extend_from_slice(&[0x48, 0xC7, 0x00, 0xFF, 0xFF, 0xFF, 0xFF]);
    e.buf.extend_from_slice(&[0x48, 0x83, 0xC1, 0x08]);
    e.buf.extend_from_slice(&[0x65, 0x48, 0x3B, 0x0C, 0x25]);
    e.d32(c::OFF_VBITS_TEMP as u32);
    // jae done (rel8 over add, test, jnz, jmp: 4 + 3 + 2 + 2)
    e.buf.extend_from_slice(&[0x73, 11]);
    // add rax, 8; test cx, cx; jnz qword; jmp piece
    e.buf
        .extend_from_slice(&[0x48, 0x83, 0xC0, 0x08, 0x66, 0x85, 0xC9, 0x75]);
    e.buf
        .push((qword as i64 - (e.buf.len() as i64 + 1)) as i8 as u8);
    e.buf.push(0xEB);
    e.buf
        .push((piece as i64 - (e.buf.len() as i64 + 1)) as i8 as u8);
    // done: mov rcx, gs:[saved_rcx]; cmp eax, eax; jmp gs:[probe_ret]
    e.load_gs(1, c::OFF_VBITS_SAVED_RCX);
    e.buf.extend_from_slice(&[0x39, 0xC0]);
    e.jmp_gs(c::scratch_off(c::S_PROBE_RET));
    // fail: mov rcx, gs:[saved_rcx]
    let fail = e.buf.len();
    e.load_gs(1, c::OFF_VBITS_SAVED_RCX);
    // fail_rcx_kept: test rsp, rsp (ZF clear: rsp is never 0); jmp gs:[probe_ret]
    let fail_rcx_kept = e.buf.len();
    e.buf.extend_from_slice(&[0x48, 0x85, 0xE4]);
    e.jmp_gs(c::scratch_off(c::S_PROBE_RET));
    for (jumps, to) in [(&to_fail[..], fail), (&[unaligned][..], fail_rcx_kept)] {
        for &j in jumps {
            let rel = (to - (j + 4)) as u32;
            e.buf[j..j + 4].copy_from_slice(&rel.to_le_bytes());
        }
    }
    while e.buf.len() % 16 != 0 {
        e.buf.push(0xCC);
    }
    e.buf
}

/// The code of the catch-up routine placed at host address `base`: one per code-cache
/// arena, shared by its blocks (`Emitter::catch_up_inline`). Entered by a `jmp` with the
/// return address in `rax`, the guest `rax` borrowed and the flags free; returns by a `jmp`
/// with ZF set when the catch-up is done, clear when the block must take its slow call
/// (which does it all again in the interpreter). No guest instruction stands for it: the
/// cache maps it as engine code, where an asynchronous signal steps on to the next guest
/// instruction (`signals`), as it does in a block's inline part.
pub(crate) fn catch_up_routine(base: u64) -> Result<alloc::vec::Vec<u8>, TranslateError> {
    let mut e = Emitter::new(0, base, false);
    let mut fail = SlowCall::new(0, 0, false, false);
    e.unmark();
    // mov gs:[probe_ret], rax: no probe call is under way at a block's entry.
    e.store_gs(0, c::scratch_off(c::S_PROBE_RET));
    e.catch_up_body(&mut fail)?;
    // cmp eax, eax (ZF set); jmp gs:[probe_ret]
    e.buf.extend_from_slice(&[0x39, 0xC0]);
    e.jmp_gs(c::scratch_off(c::S_PROBE_RET));
    let at = e.buf.len();
    for &j in &fail.jumps[..fail.njumps] {
        let rel = at as i64 - (j as i64 + 4);
        e.buf[j..j + 4].copy_from_slice(&(rel as i32).to_le_bytes());
    }
    // test rsp, rsp (ZF clear: rsp is never 0); jmp gs:[probe_ret]
    e.buf.extend_from_slice(&[0x48, 0x85, 0xE4]);
    e.jmp_gs(c::scratch_off(c::S_PROBE_RET));
    while e.buf.len() % 16 != 0 {
        e.buf.push(0xCC);
    }
    Ok(e.buf)
}

impl Emitter {
    /// The fast path of `form` before the instruction at `ip`, falling back to the clean
    /// call with definedness step record `rec`.
    pub(super) fn definedness_fast(
        &mut self,
        ip: u64,
        rec: u64,
        form: &FastForm,
        flags_live: bool,
        block_entry: bool,
        after_plain: bool,
        keep: bool,
        flags_zero_dead: bool,
        shares: [SpanShare; 2],
        skip: Skip,
    ) -> Result<(), TranslateError> {
        // Register-only forms where the flags are dead borrow nothing: every check and write
        // is one `gs:`-relative operand (the slow call saves `rax` first).
        let vectors = form.vec_reads.iter().any(Option::is_some)
            || form.vec_writes.iter().any(Option::is_some)
            || form.x87;
        let registers_only = !block_entry
            && !vectors
            && form.mem.iter().all(Option::is_none)
            && form.undefined.is_none()
            && form.rsp_delta == 0
            && form.rsp_from.is_none()
            && form.load.is_none();
        // A borrow carried over the instruction before (`Emitter::carry_borrow`) is taken
        // over rather than given back, where it saved the flags or they are dead here: its
        // checks then need no `rcx` nor a flags save of their own, and the borrow can be
        // carried on over this one's copy (a run of checked instructions with live flags,
        // such as the `push`es and `mov`s before a `call`, saves and restores them once).
        let kept_here = self
            .kept
            .is_some_and(|(kept_flags, k)| k == ip && (kept_flags || !flags_live));
        if registers_only && flags_live && !kept_here {
            return self.definedness_live_flags(ip, rec, form, after_plain, flags_zero_dead, skip);
        }
        let borrow = !registers_only || flags_live || kept_here;
        if borrow {
            self.borrow_rax(ip, flags_live);
        } else {
            self.settle();
        }
        let mut slow = SlowCall::new(ip, rec, flags_live, false);
        // A sharing this instruction leads is filled by its fast path, which either gets
        // past the slot's store or jumps to this slow call before it: the slow call starts
        // with "none" (mov qword gs:[span], 0; `Emitter::clear_span_slots`), so that the
        // operands that follow go slow too. (Out of line: the fast path pays nothing.)
        for share in shares {
            if let SpanShare::Lead { slot, .. } = share {
                slow.clears_span |= 1 << slot;
            }
        }
        if block_entry {
            self.catch_up_inline(&mut slow)?;
        }
        // cmp byte gs:[need_step], 0; jne slow: the pending step (none can be pending
        // after a plain instruction of the block: `after_plain`; the block entry's word
        // compare has tested it), then each register read, in the bytes it reads (cmp
        // dword/word/byte gs:[off], 0). A step is pending until the thread's first, which
        // makes its state (`ctx.vbits`) that the inline parts after it use.
        // These compares write no `rax`: a guest `rax` in it stays (`Emitter::rax_guest_at`).
        let rax_guest = self.rax_guest_at == self.buf.len();
        if !after_plain && !block_entry {
            self.buf.extend_from_slice(&[0x65, 0x80, 0x3C, 0x25]);
            self.d32(c::OFF_VBITS_NEED_STEP as u32);
            self.buf.push(0x00);
            self.jcc_slow(0x85, &mut slow)?;
        }
        for n in (0..16usize).filter(|n| form.reads & !skip.regs & (1 << n) != 0) {
            let off = (c::OFF_VBITS_GPR + 8 * n) as u32;
            match form.read_bytes[n] {
                0x01 => {
                    self.buf.extend_from_slice(&[0x65, 0x80, 0x3C, 0x25]);
                    self.d32(off);
                }
                0x02 => {
                    self.buf.extend_from_slice(&[0x65, 0x80, 0x3C, 0x25]);
                    self.d32(off + 1);
                }
                0x03 => {
                    self.buf.extend_from_slice(&[0x65, 0x66, 0x83, 0x3C, 0x25]);
                    self.d32(off);
                }
                0x04..=0x0f => {
                    self.buf.extend_from_slice(&[0x65, 0x83, 0x3C, 0x25]);
                    self.d32(off);
                }
                _ => {
                    self.buf.extend_from_slice(&[0x65, 0x48, 0x83, 0x3C, 0x25]);
                    self.d32(off);
                }
            }
            self.buf.push(0x00);
            self.jcc_slow(0x85, &mut slow)?;
        }
        if form.flags && !form.flags_overwritten && !skip.flags {
            // cmp byte gs:[flags], 0; jne slow
            self.buf.extend_from_slice(&[0x65, 0x80, 0x3C, 0x25]);
            self.d32(c::OFF_VBITS_FLAGS as u32);
            self.buf.push(0x00);
            self.jcc_slow(0x85, &mut slow)?;
        }
        if rax_guest {
            self.rax_guest_at = self.buf.len();
        }
        if let Some((n, d)) = form.rsp_from {
            // The new rsp is not below this one (else the slow path's stack rule marks the
            // new stack): lea rax, [src+d]; cmp rax, rsp; jb slow
            let src = gpr64(n);
            self.lea_rax(src, Register::None, 1, d as i64, ip)?;
            self.buf.extend_from_slice(&[0x48, 0x39, 0xE0]);
            self.jcc_slow(0x82, &mut slow)?;
        }
        if vectors {
            self.load_gs(0, c::OFF_VBITS);
        }
        for v in form.vec_reads.iter().flatten() {
            // A stale vector shadow is all defined: test dword [rax+stale], 1 << n; jnz done.
            // Else cmp qword [rax+zmm_n+8i], 0; jne slow for each 8 bytes read.
            self.test_vector_stale(0, v.n);
            self.buf.extend_from_slice(&[0x0F, 0x85]);
            let done = self.buf.len();
            self.d32(0);
            for i in 0..v.len as usize / 8 {
                self.buf.extend_from_slice(&[0x48, 0x83, 0xB8]);
                self.d32((OFF_SHADOW_VECTOR + 64 * v.n as usize + 8 * i) as u32);
                self.buf.push(0x00);
                self.jcc_slow(0x85, &mut slow)?;
            }
            let rel = (self.buf.len() - (done + 4)) as u32;
            self.buf[done..done + 4].copy_from_slice(&rel.to_le_bytes());
        }
        if form.x87 {
            // cmp qword [rax+st_i], 0; jne slow for each of the eight; cmp byte
            // [rax+x87_status], 0; jne slow.
            for i in 0..8 {
                self.buf.extend_from_slice(&[0x48, 0x83, 0xB8]);
                self.d32((OFF_SHADOW_X87 + 8 * i) as u32);
                self.buf.push(0x00);
                self.jcc_slow(0x85, &mut slow)?;
            }
            self.buf.extend_from_slice(&[0x80, 0xB8]);
            self.d32(OFF_SHADOW_X87_STATUS as u32);
            self.buf.push(0x00);
            self.jcc_slow(0x85, &mut slow)?;
        }
        // Whether `rax` holds `gs:[vbits]`.
        let mut rax_vbits = vectors;
        // Whether `rax` holds a load's shadow (`memory_shadow`), for its register.
        let mut rax_loaded = false;
        // The stack bytes the instruction leaves undefined: with its stack operand at once
        // when it can, else after its memory operands.
        let mut new_stack = form.undefined;
        if let Some(plan) = stack_at_once(form) {
            self.stack_at_once(plan, ip, &mut slow)?;
            rax_vbits = false;
            new_stack = None;
        } else {
            for (m, share) in form.mem.iter().zip(shares) {
                let Some(m) = m else { continue };
                rax_loaded |= self.memory_shadow(m, form, ip, &mut slow, share)?;
                rax_vbits = false;
            }
        }
        let vec_writes = form.vec_writes.iter().any(Option::is_some);
        if rax_loaded
            && (form.undefined.is_some()
                || form.rsp_delta != 0
                || form.rsp_from.is_some()
                || vec_writes)
        {
            // Kept for the register while `rax` does other work.
            self.store_gs(0, c::OFF_VBITS_TEMP2);
        }
        if let Some((off, len)) = new_stack {
            rax_vbits = false;
            self.stack_chunk(off, len, ip, Some(&mut slow))?;
            if form.origin.is_some() {
                // Origins: the span's tag chunk must exist, and the bytes start on a
                // 4-byte granule. lea rax, [rsp+off]; test al, 3; jnz slow
                self.lea_rsp(off, ip)?;
                self.buf.extend_from_slice(&[0xA8, 0x03]);
                self.jcc_slow(0x85, &mut slow)?;
                self.tag_chunk(off, ip)?;
                // test rax, rax; jz slow
                self.buf.extend_from_slice(&[0x48, 0x85, 0xC0]);
                self.jcc_slow(0x84, &mut slow)?;
            }
        }
        if let Some((off, len)) = new_stack {
            // rax = the shadow of [rsp + off]; mov qword [rax + 8i], -1
            self.stack_chunk(off, len, ip, None)?;
            self.mark_undefined(0, len);
            if let Some(origin) = form.origin {
                self.tag_stack(off, len, origin, ip)?;
            }
        }
        if form.rsp_delta != 0 && !self.last_rsp_dead {
            // The thread's last rsp, the new one: lea rax, [rsp+delta]; mov gs:[last], rax
            self.lea_rsp(form.rsp_delta, ip)?;
            self.store_gs(0, c::OFF_VBITS_LAST_RSP);
            rax_vbits = false;
        }
        if let Some((n, d)) = form.rsp_from.filter(|_| !self.last_rsp_dead) {
            // The thread's last rsp, the new one: mov gs:[last], src, or
            // lea rax, [src+d]; mov gs:[last], rax
            if d == 0 {
                self.store_gs(n, c::OFF_VBITS_LAST_RSP);
            } else {
                self.lea_rax(gpr64(n), Register::None, 1, d as i64, ip)?;
                self.store_gs(0, c::OFF_VBITS_LAST_RSP);
                rax_vbits = false;
            }
        }
        if vec_writes {
            if !rax_vbits {
                self.load_gs(0, c::OFF_VBITS);
            }
            // mov qword [rax+zmm_n+8i], 0 for each 8 bytes written
            for v in form.vec_writes.iter().flatten() {
                for i in 0..v.len as usize / 8 {
                    self.buf.extend_from_slice(&[0x48, 0xC7, 0x80]);
                    self.d32((OFF_SHADOW_VECTOR + 64 * v.n as usize + 8 * i) as u32);
                    self.d32(0);
                }
            }
        }
        for w in form.writes.iter().flatten() {
            match w {
                _ if checked_zero(form, *w) => {}
                _ if skip.writes & (1 << written_bytes(*w).0) != 0 => {}
                Written::Qword(n) if form.load.is_some_and(|l| l.n == *n) => {
                    let off = written_shadow_off(*w);
                    // The loaded shadow: (mov rax, gs:[temp2];) mov gs:[off], rax
                    if !(rax_loaded
                        && form.undefined.is_none()
                        && form.rsp_delta == 0
                        && form.rsp_from.is_none()
                        && !vec_writes)
                    {
                        self.load_gs(0, c::OFF_VBITS_TEMP2);
                    }
                    self.store_gs(0, off as usize);
                }
                _ => self.zero_written_shadow(*w),
            }
        }
        if form.flags_overwritten && !flags_zero_dead && !skip.flags_write {
            self.zero_flags_shadow();
        }
        if !borrow {
            if slow.njumps == 0 {
                // Every check left out (`Proofs`): no way to the slow call.
                return Ok(());
            }
            // Nothing borrowed: the slow call saves `rax` first.
            slow.back = self.buf.len();
            self.unborrowed.push(self.slow.len());
            self.slow.push(slow);
            return Ok(());
        }
        if keep {
            self.keep_borrow(slow, flags_live);
        } else {
            self.return_rax(flags_live);
            slow.back = self.buf.len();
            self.mark(ip, 0);
            self.slow.push(slow);
        }
        Ok(())
    }

    /// Marks the flags defined, for a form that overwrites all of them
    /// (`FastForm::flags_overwritten`): `mov byte gs:[flags], 0`. (Left out where a later
    /// instruction of the block overwrites them again: `flags_zero_dead`.)
    fn zero_flags_shadow(&mut self) {
        self.buf.extend_from_slice(&[0x65, 0xC6, 0x04, 0x25]);
        self.d32(c::OFF_VBITS_FLAGS as u32);
        self.buf.push(0);
    }

    /// A fast form's results, after its checks passed: every register it writes (but the
    /// ones its checks already found zero) and, unless dead, the flags, defined.
    fn zero_written_shadows(&mut self, form: &FastForm, flags_zero_dead: bool, skip: Skip) {
        for w in
            form.writes.iter().flatten().filter(|w| {
                !checked_zero(form, **w) && skip.writes & (1 << written_bytes(**w).0) == 0
            })
        {
            self.zero_written_shadow(*w);
        }
        if form.flags_overwritten && !flags_zero_dead && !skip.flags_write {
            self.zero_flags_shadow();
        }
    }

    /// Marks a register the fast form writes defined: zeroes the bytes of its shadow the
    /// write covers (`mov qword/word/byte gs:[off], 0`).
    fn zero_written_shadow(&mut self, w: Written) {
        let off = written_shadow_off(w);
        match w {
            Written::Qword(_) => {
                self.buf.extend_from_slice(&[0x65, 0x48, 0xC7, 0x04, 0x25]);
                self.d32(off);
                self.d32(0);
            }
            Written::Word(_) => {
                self.buf.extend_from_slice(&[0x65, 0x66, 0xC7, 0x04, 0x25]);
                self.d32(off);
                self.buf.extend_from_slice(&[0, 0]);
            }
            Written::Byte(_) | Written::HighByte(_) => {
                self.buf.extend_from_slice(&[0x65, 0xC6, 0x04, 0x25]);
                self.d32(off);
                self.buf.push(0);
            }
        }
    }

    /// The inline part of a register-only form where the guest flags are live (a `jcc`,
    /// `setcc`, `cmovcc`, or an instruction between a compare and its branch): each check
    /// loads the shadow bytes into a borrowed `rcx` and tests it with `jrcxz`, which leaves
    /// the flags alone, so they need no saving.
    ///
    /// ```text
    ///     mov gs:[saved_rcx], rcx
    ///     mov(zx) rcx/ecx, gs:[shadow]; jrcxz ok; jmp slow; ok:    (each check)
    ///     mov gs:[written], 0                                      (each register written)
    ///     mov rcx, gs:[saved_rcx]
    /// ```
    ///
    /// The slow call gives `rcx` back first (`finish_slow_calls`).
    fn definedness_live_flags(
        &mut self,
        ip: u64,
        rec: u64,
        form: &FastForm,
        after_plain: bool,
        flags_zero_dead: bool,
        skip: Skip,
    ) -> Result<(), TranslateError> {
        self.settle();
        let mut slow = SlowCall::new(ip, rec, false, false);
        // (how many bytes to load, offset)
        let mut checks: [(u8, usize); 18] = [(0, 0); 18];
        let mut n = 0;
        if !after_plain {
            checks[n] = (1, c::OFF_VBITS_NEED_STEP);
            n += 1;
        }
        for r in (0..16usize).filter(|r| form.reads & !skip.regs & (1 << r) != 0) {
            let off = c::OFF_VBITS_GPR + 8 * r;
            checks[n] = match form.read_bytes[r] {
                0x01 => (1, off),
                0x02 => (1, off + 1),
                0x03 => (2, off),
                0x04..=0x0f => (4, off),
                _ => (8, off),
            };
            n += 1;
        }
        if form.flags && !form.flags_overwritten && !skip.flags {
            checks[n] = (1, c::OFF_VBITS_FLAGS);
            n += 1;
        }
        if n == 0 {
            // Nothing left to check (all proven: `Proofs`): only the writes, which need
            // no `rcx`, and no way to the slow call.
            self.zero_written_shadows(form, flags_zero_dead, skip);
            return Ok(());
        }
        self.store_gs(1, c::OFF_VBITS_SAVED_RCX);
        for &(len, off) in &checks[..n] {
            match len {
                // movzx ecx, byte gs:[off]
                1 => self.buf.extend_from_slice(&[0x65, 0x0F, 0xB6, 0x0C, 0x25]),
                // movzx ecx, word gs:[off]
                2 => self.buf.extend_from_slice(&[0x65, 0x0F, 0xB7, 0x0C, 0x25]),
                // mov ecx, dword gs:[off]
                4 => self.buf.extend_from_slice(&[0x65, 0x8B, 0x0C, 0x25]),
                // mov rcx, gs:[off]
                _ => self.buf.extend_from_slice(&[0x65, 0x48, 0x8B, 0x0C, 0x25]),
            }
            self.d32(off as u32);
            // jrcxz ok; jmp slow; ok:
            self.buf.extend_from_slice(&[0xE3, 0x05, 0xE9]);
            slow.add_jump(self.buf.len())?;
            self.d32(0);
        }
        self.zero_written_shadows(form, flags_zero_dead, skip);
        self.load_gs(1, c::OFF_VBITS_SAVED_RCX);
        slow.back = self.buf.len();
        self.rcx_lent.push(self.slow.len());
        self.unborrowed.push(self.slow.len());
        self.slow.push(slow);
        Ok(())
    }

    /// Ends an inline part with `rax` (and the flags, where `flags_live`) still borrowed,
    /// its slow call `slow` returning through a thunk that borrows them again: the next
    /// inline part of the same instruction (the tool's access check) takes the borrow over
    /// (`Emitter::borrow_rax`), saving a return and a borrow back to back (two or, with
    /// live flags, eight instructions). Whatever else comes next [`Emitter::settle`]s.
    pub(super) fn keep_borrow(&mut self, mut slow: SlowCall, flags_live: bool) {
        slow.back = self.buf.len();
        // The thunk's borrow may save the flags through `rax` before coming back here.
        self.rax_guest_at = usize::MAX;
        self.reborrow.push(self.slow.len());
        self.kept = Some((flags_live, slow.ip));
        self.slow.push(slow);
    }

    /// After the inline parts of the guest instruction at `ip`, before its copy: a borrow
    /// of `rax` alone (the flags given back) that those parts kept stays over the copy when
    /// the block allows it (`Emitter::carry`, set where the instruction neither reads nor
    /// writes `rax` and is copied as it is: [`borrow_may_carry_over`]), so that the next
    /// instruction's inline part takes it over instead of a return and a borrow back to back
    /// (`mov rax, gs:[stub]` before the copy, `mov gs:[stub], rax` after it: two of the
    /// twenty-odd host instructions around a guest one with a memory operand). The copy is
    /// mapped with the guest `rax` in the stub, so a fault in it shows the guest's. A borrow
    /// of the flags too (a recent-lines check's) stays likewise where the instruction
    /// touches no flag (`Emitter::carry_flags`), the copy mapped with the flags in their
    /// slot. Where the instruction writes all of `rax` and reads none of it
    /// (`Emitter::drop_rax`: [`overwrites_rax`]), the borrow ends at the copy without a
    /// return (only live flags are given back): the copy is mapped with the guest `rax` in
    /// the stub, as a carried one, and its own write makes the register the guest's again
    /// (`mov rax, gs:[stub]` before a `mov eax, [m]` would load what the copy overwrites).
    /// Anything else gives the borrow back here.
    pub(super) fn carry_borrow(&mut self, ip: u64) {
        match (self.carry, self.kept) {
            (Some(_), Some((false, k))) if k == ip => self.mark(ip, super::FIX_RAX_IN_STUB),
            (Some(_), Some((true, k))) if k == ip && self.carry_flags => {
                self.mark(ip, super::FIX_RAX_IN_STUB | super::FIX_FLAGS_IN_SLOT)
            }
            (_, Some((true, k))) if k == ip && self.carry_past_rax.is_some() => {
                // `rax` back for the copy (unless the copy overwrites it unread), the flags
                // left in their slot; the stub still holds the guest `rax` the copy starts
                // with, where a fault in it shows it.
                if !self.drop_rax {
                    self.load_gs(0, c::scratch_off(c::S_STUB_RAX));
                }
                self.mark(ip, super::FIX_RAX_IN_STUB | super::FIX_FLAGS_IN_SLOT);
            }
            (_, Some((flags_live, k))) if k == ip && self.drop_rax => {
                self.kept = None;
                if flags_live {
                    self.restore_probe_flags();
                }
                self.mark(ip, super::FIX_RAX_IN_STUB);
            }
            _ => self.settle(),
        }
    }

    /// After the copy of the guest instruction at `ip`: a borrow [`Emitter::carry_borrow`]
    /// carried over it is now kept for the next instruction.
    pub(super) fn carried_over(&mut self, ip: u64) {
        if let (Some(next), Some((true, k))) = (self.carry_past_rax.take(), self.kept) {
            if k == ip {
                // Borrowed again at once: the guest `rax` the copy left to its stub. (Mapped
                // as the next instruction: nothing here can fault, and an asynchronous
                // signal waits for a point without fix-ups.)
                self.mark(next, super::FIX_RAX_IN_STUB | super::FIX_FLAGS_IN_SLOT);
                self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
                self.rax_guest_at = self.buf.len();
                self.kept = Some((true, next));
                return;
            }
        }
        if let (Some(next), Some((flags, k))) = (self.carry.take(), self.kept) {
            if k == ip {
                self.kept = Some((flags, next));
            }
        }
    }

    /// Gives back a borrow [`Emitter::keep_borrow`] kept, if any.
    pub(super) fn settle(&mut self) {
        if let Some((flags_live, ip)) = self.kept.take() {
            self.return_rax(flags_live);
            self.mark(ip, 0);
        }
    }

    /// Before a `rep` string instruction: the engine enters it once per iteration, and the
    /// interpreter did every iteration at the first entry (`definedness::step` returns at
    /// once when `rep_next` is this pc and `rcx`). That re-entry is checked inline and
    /// does what the step would: `rep_next`'s count goes down by one. Anything the step
    /// would have more to do for (a signal handler started, the runtime's code ran, `rsp`
    /// moved, another instruction or count) makes the clean call `rec`.
    ///
    /// ```text
    ///     (save rax, flags)
    ///     cmp word gs:[own_code], 0; jne slow        (own_code and signal: one word)
    ///     mov rax, pc; mov gs:[temp], rax; mov rax, gs:[vbits]; test rax, rax; jz slow
    ///     cmp [rax+last_rsp], rsp; jne slow; cmp byte [rax+last_call_or_ret], 0; jne slow
    ///     cmp [rax+rep_rcx], rcx; jne slow
    ///     mov rax, [rax+rep_pc]; cmp rax, gs:[temp]; jne slow
    ///     mov rax, gs:[vbits]; dec qword [rax+rep_rcx]
    ///     (restore rax, flags)
    /// ```
    ///
    /// with the out-of-line clean call after the block, as for the fast forms.
    ///
    /// With `iteration` (`definedness::rep_iteration_form`: a `rep stos`), an entry that is
    /// not such a re-entry (the first of each run of the instruction) takes the fast form
    /// of one iteration instead of the clean call: every entry of a run whose inputs are
    /// defined is then inline. `rep_next` is left as it is there: it names this pc only
    /// while a run the step started goes on (its count follows `rcx` down to 0, where no
    /// entry checks it), so a run of fast entries never meets a stale one.
    pub(super) fn definedness_rep(
        &mut self,
        ip: u64,
        rec: u64,
        flags_live: bool,
        iteration: Option<&FastForm>,
    ) -> Result<(), TranslateError> {
        self.borrow_rax(ip, flags_live);
        let mut slow = SlowCall::new(ip, rec, flags_live, false);
        // Where a failed re-entry check goes: the clean call, or the iteration's fast form.
        let mut to_fast: alloc::vec::Vec<usize> = alloc::vec::Vec::new();
        let mut not_again = |e: &mut Emitter, cc: u8, slow: &mut SlowCall| {
            if iteration.is_some() {
                e.buf.extend_from_slice(&[0x0F, cc]);
                to_fast.push(e.buf.len());
                e.d32(0);
                Ok(())
            } else {
                e.jcc_slow(cc, slow)
            }
        };
        // cmp word gs:[own_code], 0; jne slow: `vbits_own_code` and `vbits_signal` side by
        // side (`ThreadCtx::vbits_need_step`).
        const _: () = assert!(c::OFF_VBITS_SIGNAL == c::OFF_VBITS_OWN_CODE + 1);
        self.buf.extend_from_slice(&[0x65, 0x66, 0x83, 0x3C, 0x25]);
        self.d32(c::OFF_VBITS_OWN_CODE as u32);
        self.buf.push(0x00);
        self.jcc_slow(0x85, &mut slow)?;
        self.mov_imm64(0, ip);
        self.store_gs(0, c::OFF_VBITS_TEMP);
        self.load_gs(0, c::OFF_VBITS);
        self.buf.extend_from_slice(&[0x48, 0x85, 0xC0]);
        not_again(self, 0x84, &mut slow)?;
        // cmp gs:[last_rsp], rsp; jne slow
        self.buf.extend_from_slice(&[0x65, 0x48, 0x39, 0x24, 0x25]);
        self.d32(c::OFF_VBITS_LAST_RSP as u32);
        not_again(self, 0x85, &mut slow)?;
        // cmp byte gs:[last_call_or_ret], 0; jne slow (the red zone to mark)
        self.buf.extend_from_slice(&[0x65, 0x80, 0x3C, 0x25]);
        self.d32(c::OFF_VBITS_LAST_CALL_OR_RET as u32);
        self.buf.push(0x00);
        not_again(self, 0x85, &mut slow)?;
        // cmp [rax+rep_rcx], rcx; jne slow
        self.buf.extend_from_slice(&[0x48, 0x39, 0x88]);
        self.d32(OFF_REP_RCX as u32);
        not_again(self, 0x85, &mut slow)?;
        // mov rax, [rax+rep_pc]; cmp rax, gs:[temp]; jne slow
        self.buf.extend_from_slice(&[0x48, 0x8B, 0x80]);
        self.d32(OFF_REP_PC as u32);
        self.buf.extend_from_slice(&[0x65, 0x48, 0x3B, 0x04, 0x25]);
        self.d32(c::OFF_VBITS_TEMP as u32);
        not_again(self, 0x85, &mut slow)?;
        // mov rax, gs:[vbits]; dec qword [rax+rep_rcx]
        self.load_gs(0, c::OFF_VBITS);
        self.buf.extend_from_slice(&[0x48, 0xFF, 0x88]);
        self.d32(OFF_REP_RCX as u32);
        self.return_rax(flags_live);
        slow.back = self.buf.len();
        self.mark(ip, 0);
        self.slow.push(slow);
        let Some(form) = iteration else {
            return Ok(());
        };
        // jmp <done>; fast: (give back rax and the flags) <the iteration's fast form>; done:
        self.buf.push(0xE9);
        let done = self.buf.len();
        self.d32(0);
        let fast = self.buf.len();
        for at in to_fast {
            let rel = (fast - (at + 4)) as u32;
            self.buf[at..at + 4].copy_from_slice(&rel.to_le_bytes());
        }
        self.push_map_at(fast, ip, super::FIX_RAX_IN_STUB);
        self.return_rax(flags_live);
        self.mark(ip, 0);
        self.definedness_fast(
            ip,
            rec,
            form,
            flags_live,
            false,
            false,
            false,
            false,
            [SpanShare::Own; 2],
            Skip::default(),
        )?;
        let rel = (self.buf.len() - (done + 4)) as u32;
        self.buf[done..done + 4].copy_from_slice(&rel.to_le_bytes());
        self.mark(ip, 0);
        Ok(())
    }

    /// At a block's first stepped instruction: what happened since the program's last
    /// one. Only there, since the runtime's own code and signal handlers are entered and
    /// left by control transfers, which end blocks. One compare of the word of the three
    /// entry bytes (`ThreadCtx::vbits_need_step`) passes when nothing did and no step is
    /// pending; a pending step or a signal handler starting goes slow.
    /// After the runtime's own code, the inline part does `definedness::catch_up`'s work
    /// when the runtime left nothing below the program's last `rsp` (it returned into the
    /// program) or only the return address of its call into this code (made defined here;
    /// more goes slow, to make those frames defined): every register's shadow defined
    /// (the vectors' by the next slow step) but, after a return into the program, the
    /// callee-saved registers' (`definedness::catch_up`), and the stack rule's state reset.
    ///
    /// The work after the runtime's code (some 300 bytes) is the same for every block:
    /// when the block's arena has it as a routine (`catch_up_routine`, within rel32 reach),
    /// the block only calls it, returning with ZF clear for the slow path:
    ///
    /// ```text
    /// cmp qword gs:[entry], 0; je done
    /// cmp qword gs:[entry], own_code; jne slow          (the runtime's code alone)
    /// lea rax, [rip+back]; jmp routine; back: jne slow; done:
    /// ```
    ///
    /// (`rax` and the flags are borrowed here.) At one block entry in four instructions
    /// on average, this was a third of the code cache (python3 bench: 48,000 blocks).
    fn catch_up_inline(&mut self, slow: &mut SlowCall) -> Result<(), TranslateError> {
        // The value of the entry word when only the runtime's own code ran.
        const OWN_CODE_ALONE: u32 = 1 << (8 * (c::OFF_VBITS_OWN_CODE - c::OFF_VBITS_ENTRY));
        // cmp qword gs:[entry], 0
        self.buf.extend_from_slice(&[0x65, 0x48, 0x83, 0x3C, 0x25]);
        self.d32(c::OFF_VBITS_ENTRY as u32);
        self.buf.push(0x00);
        // What follows the `je`, up to `done`: cmp qword gs:[entry], imm32 (13 bytes);
        // jne slow (6); then the routine's call or the body.
        const OWN_ALONE_TEST: usize = 13 + 6;
        let routine = CATCH_UP_ROUTINE.load(Ordering::Relaxed);
        // From the `jmp`'s end (the `je`, the test, the `lea` and the `jmp`) to the routine.
        let rel =
            (routine as i64).wrapping_sub(self.here() as i64 + 2 + OWN_ALONE_TEST as i64 + 7 + 5);
        let call_routine = routine != 0 && rel == rel as i32 as i64;
        let done = if call_routine {
            // je done (rel8)
            self.buf
                .extend_from_slice(&[0x74, (OWN_ALONE_TEST + 7 + 5 + 6) as u8]);
            None
        } else {
            // je done
            self.buf.extend_from_slice(&[0x0F, 0x84]);
            let done = self.buf.len();
            self.d32(0);
            Some(done)
        };
        // cmp qword gs:[entry], OWN_CODE_ALONE; jne slow
        let test_at = self.buf.len();
        self.buf.extend_from_slice(&[0x65, 0x48, 0x81, 0x3C, 0x25]);
        self.d32(c::OFF_VBITS_ENTRY as u32);
        self.d32(OWN_CODE_ALONE);
        self.jcc_slow(0x85, slow)?;
        debug_assert_eq!(self.buf.len() - test_at, OWN_ALONE_TEST);
        let Some(done) = done else {
            // lea rax, [rip+back]; jmp routine; back: jne slow; done:
            self.buf.extend_from_slice(&[0x48, 0x8D, 0x05]);
            self.d32(5);
            self.buf.push(0xE9);
            self.d32(rel as i32 as u32);
            return self.jcc_slow(0x85, slow);
        };
        self.catch_up_body(slow)?;
        let rel = (self.buf.len() - (done + 4)) as u32;
        self.buf[done..done + 4].copy_from_slice(&rel.to_le_bytes());
        Ok(())
    }

    /// The catch-up after the runtime's own code ran (`catch_up_inline`), `rax` borrowed
    /// and the flags free: into `slow` when it cannot be done here.
    fn catch_up_body(&mut self, slow: &mut SlowCall) -> Result<(), TranslateError> {
        // mov rax, gs:[vbits]; test rax, rax; jz slow
        self.load_gs(0, c::OFF_VBITS);
        self.buf.extend_from_slice(&[0x48, 0x85, 0xC0]);
        self.jcc_slow(0x84, slow)?;
        // cmp gs:[last_rsp], rsp; jbe returned
        self.buf.extend_from_slice(&[0x65, 0x48, 0x39, 0x24, 0x25]);
        self.d32(c::OFF_VBITS_LAST_RSP as u32);
        self.buf.extend_from_slice(&[0x0F, 0x86]);
        let returned = self.buf.len();
        self.d32(0);
        // The runtime's code calls the program's (glibc's allocator, a replaced string
        // function): its frames between here and the last `rsp` become defined, as the
        // slow catch-up makes them. Inline only when that is the return address its `call`
        // pushed (the runtime calls again from the frame a call of it returned to, or
        // from just below `entering_program_code`'s mark): its slot may still hold the V
        // bits of an earlier frame, since the runtime's code runs without probes, and
        // every `ret` to the runtime would take the slow path. Else slow.
        // mov rax, gs:[last_rsp]; sub rax, rsp; cmp rax, 8; jne slow
        self.load_gs(0, c::OFF_VBITS_LAST_RSP);
        self.buf
            .extend_from_slice(&[0x48, 0x29, 0xE0, 0x48, 0x83, 0xF8, 0x08]);
        self.jcc_slow(0x85, slow)?;
        // The slot within one span (else slow), nothing to do when it has no chunk.
        self.lea_rsp(0, slow.ip)?;
        self.within_one_span(8, slow)?;
        self.span_index(Some(&mut *slow))?;
        self.chunk_of_span();
        // test rax, rax; jz reload
        self.buf.extend_from_slice(&[0x48, 0x85, 0xC0]);
        self.buf.extend_from_slice(&[0x0F, 0x84]);
        let reload = self.buf.len();
        self.d32(0);
        self.lea_rsp_plus_rax(0, slow.ip)?;
        // mov qword [rax], 0
        self.buf.extend_from_slice(&[0x48, 0xC7, 0x00]);
        self.d32(0);
        let rel = (self.buf.len() - (reload + 4)) as u32;
        self.buf[reload..reload + 4].copy_from_slice(&rel.to_le_bytes());
        self.load_gs(0, c::OFF_VBITS);
        // mov qword gs:[gpr+8i], 0 for the callee-saved registers: they hold the runtime's
        // values, defined.
        for i in (0..16).filter(|r| !CALLER_SAVED.contains(r)) {
            self.buf.extend_from_slice(&[0x65, 0x48, 0xC7, 0x04, 0x25]);
            self.d32((c::OFF_VBITS_GPR + 8 * i) as u32);
            self.d32(0);
        }
        let rel = (self.buf.len() - (returned + 4)) as u32;
        self.buf[returned..returned + 4].copy_from_slice(&rel.to_le_bytes());
        // mov qword gs:[gpr+8i], 0 for the registers a call may change (a return into the
        // program keeps the callee-saved ones' shadows: `definedness::catch_up`); mov
        // qword gs:[flags], 0 (the slot after the registers').
        for i in CALLER_SAVED.into_iter().chain([16]) {
            self.buf.extend_from_slice(&[0x65, 0x48, 0xC7, 0x04, 0x25]);
            self.d32((c::OFF_VBITS_GPR + 8 * i) as u32);
            self.d32(0);
        }
        // mov dword [rax+stale], all: every vector register's shadow stale (all defined).
        self.buf.extend_from_slice(&[0xC7, 0x80]);
        self.d32(OFF_VECTORS_STALE as u32);
        self.d32(ALL_VECTORS_STALE);
        // mov word gs:[last_writes_rsp], 0: no rsp write or call/ret pending for the stack
        // rule (`last_call_or_ret` the byte after).
        const _: () = assert!(c::OFF_VBITS_LAST_CALL_OR_RET == c::OFF_VBITS_LAST_WRITES_RSP + 1);
        self.buf.extend_from_slice(&[0x65, 0x66, 0xC7, 0x04, 0x25]);
        self.d32(c::OFF_VBITS_LAST_WRITES_RSP as u32);
        self.buf.extend_from_slice(&[0, 0]);
        // mov gs:[last_rsp], rsp; mov byte gs:[own_code], 0
        self.store_gs(4, c::OFF_VBITS_LAST_RSP);
        self.buf.extend_from_slice(&[0x65, 0xC6, 0x04, 0x25]);
        self.d32(c::OFF_VBITS_OWN_CODE as u32);
        self.buf.push(0);
        Ok(())
    }

    /// The inline part for memory operand `m` (1, 2, 4, 8, 16, 32 or 64 bytes): within one 64 KiB
    /// span (else slow), nothing to do when the span has no shadow chunk (all defined);
    /// otherwise a written-only operand's shadow bytes become zero (the value stored is
    /// defined once every check passes, and should one fail, the interpreter writes them
    /// anew), and any other operand's must be zero (else slow).
    ///
    /// With `load` (the instruction is a load into a general register), a read operand's
    /// shadow is not checked but loaded, extended as the value is, into `rax` (0 when the
    /// span has no chunk) for the register's shadow: then true.
    fn memory_shadow(
        &mut self,
        m: &iced_x86::UsedMemory,
        form: &FastForm,
        ip: u64,
        slow: &mut SlowCall,
        share: SpanShare,
    ) -> Result<bool, TranslateError> {
        let (load, store) = (form.load, form.store);
        let size = m.memory_size().size() as u32;
        match share {
            SpanShare::Own => {
                self.effective_address(m, 0, ip)?;
                if size > 1 {
                    // (A byte lies in one span.)
                    self.within_one_span(size, slow)?;
                }
                self.span_index(Some(&mut *slow))?;
                self.chunk_of_span();
            }
            SpanShare::Lead { slot, lo, hi } => {
                // The span of [base + lo, base + hi), which holds every operand of the
                // sharing: lea rax, [base + lo]; (the span checks);
                // lea rax, [rax*8+view]; mov gs:[span], rax; mov rax, gs:[rax]
                self.lea_rax(m.base(), Register::None, 1, lo as i64, ip)?;
                if hi - lo > 1 {
                    self.within_one_span((hi - lo) as u32, slow)?;
                }
                self.span_index(Some(&mut *slow))?;
                self.primary_entry_of_span();
                self.store_gs(0, span_slot_off(slot) as usize);
                self.buf.extend_from_slice(&[0x65, 0x48, 0x8B, 0x00]);
            }
            SpanShare::Follow { slot } => {
                // mov rax, gs:[span]; test rax, rax; jz slow; mov rax, gs:[rax]
                self.load_gs(0, span_slot_off(slot) as usize);
                self.buf.extend_from_slice(&[0x48, 0x85, 0xC0]);
                self.jcc_slow(0x84, slow)?;
                self.buf.extend_from_slice(&[0x65, 0x48, 0x8B, 0x00]);
            }
        }
        if let Some(st) = store.filter(|_| matches!(m.access(), iced_x86::OpAccess::Write)) {
            return self.store_copy(m, st, ip, slow);
        }
        if let Some(vc) = form.vec_copy {
            return self.vector_copy(m, vc, ip, slow);
        }
        // test rax, rax; jz done
        self.buf.extend_from_slice(&[0x48, 0x85, 0xC0]);
        self.buf.extend_from_slice(&[0x0F, 0x84]);
        let done = self.buf.len();
        self.d32(0);
        let at = self.shadow_operand(m, ip)?;
        let write_only = matches!(m.access(), iced_x86::OpAccess::Write);
        if let Some(l) = load.filter(|_| !write_only) {
            // (rex_w, opcode): the load into rax (eax) of the shadow, extended as the value.
            let (w, op): (bool, &[u8]) = match (l.size, l.signed, l.width) {
                (8, _, _) => (true, &[0x8B]),            // mov rax, m64
                (4, false, _) => (false, &[0x8B]),       // mov eax, m32
                (4, true, _) => (true, &[0x63]),         // movsxd rax, m32
                (1, false, _) => (false, &[0x0F, 0xB6]), // movzx eax, m8
                (2, false, _) => (false, &[0x0F, 0xB7]), // movzx eax, m16
                (1, true, 4) => (false, &[0x0F, 0xBE]),  // movsx eax, m8
                (2, true, 4) => (false, &[0x0F, 0xBF]),  // movsx eax, m16
                (1, true, _) => (true, &[0x0F, 0xBE]),   // movsx rax, m8
                _ => (true, &[0x0F, 0xBF]),              // movsx rax, m16
            };
            self.on_shadow(&at, false, w, op, 0, &[]);
            // done: (rax = 0 when there is no chunk)
            let rel = (self.buf.len() - (done + 4)) as u32;
            self.buf[done..done + 4].copy_from_slice(&rel.to_le_bytes());
            return Ok(true);
        }
        if size > 8 {
            // Vector operands: a qword at a time, from the shadow's address in rax.
            if let ShadowAt::Operand(lea) = at {
                self.buf.extend_from_slice(lea.bytes());
            }
            for i in 0..size / 8 {
                if write_only {
                    // mov qword [rax+8i], 0
                    self.buf
                        .extend_from_slice(&[0x48, 0xC7, 0x40, (8 * i) as u8]);
                    self.d32(0);
                } else {
                    // cmp qword [rax+8i], 0; jne slow
                    self.buf
                        .extend_from_slice(&[0x48, 0x83, 0x78, (8 * i) as u8, 0x00]);
                    self.jcc_slow(0x85, slow)?;
                }
            }
            let rel = (self.buf.len() - (done + 4)) as u32;
            self.buf[done..done + 4].copy_from_slice(&rel.to_le_bytes());
            return Ok(false);
        }
        let (p66, w) = (size == 2, size == 8);
        if write_only {
            // mov size [shadow], 0
            if size == 1 {
                self.on_shadow(&at, false, false, &[0xC6], 0, &[0]);
            } else {
                let imm: &[u8] = if size == 2 { &[0, 0] } else { &[0, 0, 0, 0] };
                self.on_shadow(&at, p66, w, &[0xC7], 0, imm);
            }
        } else {
            // cmp size [shadow], 0; jne slow
            let op = if size == 1 { 0x80 } else { 0x83 };
            self.on_shadow(&at, p66, w, &[op], 7, &[0]);
            self.jcc_slow(0x85, slow)?;
        }
        let rel = (self.buf.len() - (done + 4)) as u32;
        self.buf[done..done + 4].copy_from_slice(&rel.to_le_bytes());
        Ok(false)
    }

    /// A store copy (`FastForm::store`), `rax` the chunk of the operand's span: without a
    /// chunk (all defined) the register's shadow bytes must be zero, else the slow path
    /// makes one; with one, they are copied into the operand's. A stored register is
    /// nearly always all defined, so the inline path writes zeros after testing that, and
    /// the copy itself (through a borrowed `rcx`) is out of line (`StoreCopyCold`): two or
    /// three of the seven or eight instructions of the path with a chunk (the borrow and
    /// give-back of `rcx`, the `lea` of the shadow's address that the zeroing store takes
    /// as its operand), about 1.3% of xz's code-cache instructions.
    ///
    /// ```text
    ///     test rax, rax; jnz chunk
    ///     cmp size gs:[gpr n], 0; jne slow; jmp done
    /// chunk:
    ///     cmp size gs:[gpr n], 0; jne copy
    ///     mov size [shadow], 0          (the operand's shadow: `Emitter::on_shadow`)
    /// done:
    ///
    /// copy: (out of line)
    ///     (lea rax, [the operand's shadow], when not in rax already)
    ///     mov gs:[saved_rcx], rcx; mov rcx, gs:[gpr n]; mov size [rax], rcx
    ///     mov rcx, gs:[saved_rcx]; jmp done
    /// ```
    fn store_copy(
        &mut self,
        m: &iced_x86::UsedMemory,
        st: crate::definedness::StoreCopy,
        ip: u64,
        slow: &mut SlowCall,
    ) -> Result<bool, TranslateError> {
        let off = (c::OFF_VBITS_GPR + 8 * st.n as usize) as u32;
        // cmp size gs:[gpr n], 0
        let cmp_register = |e: &mut Self| {
            let cmp: &[u8] = match st.size {
                1 => &[0x65, 0x80, 0x3C, 0x25],
                2 => &[0x65, 0x66, 0x83, 0x3C, 0x25],
                4 => &[0x65, 0x83, 0x3C, 0x25],
                _ => &[0x65, 0x48, 0x83, 0x3C, 0x25],
            };
            e.buf.extend_from_slice(cmp);
            e.d32(off);
            e.buf.push(0x00);
        };
        // test rax, rax; jnz chunk
        self.buf.extend_from_slice(&[0x48, 0x85, 0xC0, 0x0F, 0x85]);
        let chunk = self.buf.len();
        self.d32(0);
        cmp_register(self);
        self.jcc_slow(0x85, slow)?;
        // jmp done
        self.buf.push(0xE9);
        let done = self.buf.len();
        self.d32(0);
        let rel = (self.buf.len() - (chunk + 4)) as u32;
        self.buf[chunk..chunk + 4].copy_from_slice(&rel.to_le_bytes());
        let at = self.shadow_operand(m, ip)?;
        cmp_register(self);
        // jne copy
        self.buf.extend_from_slice(&[0x0F, 0x85]);
        let jump = self.buf.len();
        self.d32(0);
        // mov size [shadow], 0
        let (p66, w) = (st.size == 2, st.size == 8);
        if st.size == 1 {
            self.on_shadow(&at, false, false, &[0xC6], 0, &[0]);
        } else {
            let imm: &[u8] = if st.size == 2 { &[0, 0] } else { &[0, 0, 0, 0] };
            self.on_shadow(&at, p66, w, &[0xC7], 0, imm);
        }
        let rel = (self.buf.len() - (done + 4)) as u32;
        self.buf[done..done + 4].copy_from_slice(&rel.to_le_bytes());
        // The copy runs in the same guest state as the inline code it leaves.
        let (guest, fix) = self
            .pcmap
            .last()
            .map_or((super::UNMAPPED, 0), |e| (e.guest, e.fix));
        self.store_copies.push(StoreCopyCold {
            jump,
            resume: self.buf.len(),
            lea: match at {
                ShadowAt::Operand(lea) => Some(lea),
                ShadowAt::Rax => None,
            },
            off,
            size: st.size,
            guest,
            fix,
        });
        Ok(false)
    }

    /// The out-of-line copy of a store copy ([`StoreCopyCold`]): the register's shadow
    /// into the operand's through a borrowed `rcx`, then back to the inline path.
    pub(super) fn store_copy_cold(&mut self, x: &StoreCopyCold) {
        let at = self.buf.len();
        let rel = at as i64 - (x.jump as i64 + 4);
        self.buf[x.jump..x.jump + 4].copy_from_slice(&(rel as i32).to_le_bytes());
        self.push_map_at(at, x.guest, x.fix);
        if let Some(lea) = x.lea {
            // lea rax, [rax + ...]: the operand's shadow, before `rcx` (which the operand
            // may be addressed by) is borrowed.
            self.buf.extend_from_slice(lea.bytes());
        }
        self.store_gs(1, c::OFF_VBITS_SAVED_RCX);
        self.load_gs(1, x.off as usize);
        let mov: &[u8] = match x.size {
            1 => &[0x88, 0x08],       // mov [rax], cl
            2 => &[0x66, 0x89, 0x08], // mov [rax], cx
            4 => &[0x89, 0x08],       // mov [rax], ecx
            _ => &[0x48, 0x89, 0x08], // mov [rax], rcx
        };
        self.buf.extend_from_slice(mov);
        self.load_gs(1, c::OFF_VBITS_SAVED_RCX);
        self.jmp_to(x.resume);
    }

    /// A vector copy (`FastForm::vec_copy`), `rax` the primary entry of the operand's
    /// span. A load copies the operand's shadow into the register's (zeros without a
    /// chunk), then zeroes the register's bytes above it that a VEX or EVEX write zeroes;
    /// a store copies the register's shadow into the operand's when the span has a chunk,
    /// else the register's shadow must be zero (or the slow path makes a chunk). A stale
    /// vector shadow (its bit in `OFF_VECTORS_STALE`: all defined, its bytes not yet
    /// cleared) is read as zeros; a load of a chunk's bytes into one first zeroes the
    /// bytes the load leaves (a legacy SSE load keeps the register's upper bytes, defined)
    /// and clears its bit.
    ///
    /// ```text
    /// load:   test rax, rax; jz zero
    ///         (rax = the operand's shadow)
    ///         mov gs:[saved_rcx], rcx; mov gs:[temp2], rdx; mov rcx, gs:[vbits]
    ///         test dword [rcx+stale], 1 << n; jz fresh
    ///         mov qword [rcx+zmm_n+8i], 0                            (each one not written)
    ///         and dword [rcx+stale], !(1 << n)
    /// fresh:  mov rdx, [rax+8i]; mov [rcx+zmm_n+8i], rdx              (each qword loaded)
    ///         mov qword [rcx+zmm_n+8i], 0                            (each one above)
    ///         mov rcx, gs:[saved_rcx]; mov rdx, gs:[temp2]; jmp done
    /// zero:   mov rax, gs:[vbits]; mov qword [rax+zmm_n+8i], 0      (each qword written)
    /// done:
    ///
    /// store:  test rax, rax; jnz chunk
    ///         mov rax, gs:[vbits]; test dword [rax+stale], 1 << n; jnz done
    ///         cmp qword [rax+zmm_n+8i], 0; jne slow; ...; jmp done
    /// chunk:  (rax = the operand's shadow)
    ///         mov gs:[saved_rcx], rcx; mov gs:[temp2], rdx; mov rcx, gs:[vbits]
    ///         test dword [rcx+stale], 1 << n; jnz stale
    ///         mov rdx, [rcx+zmm_n+8i]; mov [rax+8i], rdx; ...; jmp back
    /// stale:  mov qword [rax+8i], 0; ...
    /// back:   mov rcx, gs:[saved_rcx]; mov rdx, gs:[temp2]
    /// done:
    /// ```
    fn vector_copy(
        &mut self,
        m: &iced_x86::UsedMemory,
        vc: crate::definedness::VecCopy,
        ip: u64,
        slow: &mut SlowCall,
    ) -> Result<bool, TranslateError> {
        let reg = |i: usize| (OFF_SHADOW_VECTOR + 64 * vc.n as usize + 8 * i) as u32;
        let qwords = vc.size as usize / 8;
        // jz/jnz rel32 to patch later: the position of its displacement.
        let jump = |e: &mut Self, cc: u8| {
            e.buf.extend_from_slice(&[0x0F, cc]);
            let at = e.buf.len();
            e.d32(0);
            at
        };
        let jmp = |e: &mut Self| {
            e.buf.push(0xE9);
            let at = e.buf.len();
            e.d32(0);
            at
        };
        let patch = |e: &mut Self, at: usize| {
            let rel = (e.buf.len() - (at + 4)) as u32;
            e.buf[at..at + 4].copy_from_slice(&rel.to_le_bytes());
        };
        let borrow = |e: &mut Self| {
            e.store_gs(1, c::OFF_VBITS_SAVED_RCX);
            e.store_gs(2, c::OFF_VBITS_TEMP2);
            e.load_gs(1, c::OFF_VBITS);
            e.test_vector_stale(1, vc.n);
        };
        let give_back = |e: &mut Self| {
            e.load_gs(1, c::OFF_VBITS_SAVED_RCX);
            e.load_gs(2, c::OFF_VBITS_TEMP2);
        };
        // test rax, rax
        self.buf.extend_from_slice(&[0x48, 0x85, 0xC0]);
        if vc.load {
            let zero = jump(self, 0x84);
            self.operand_shadow(m, ip)?;
            borrow(self);
            let fresh = jump(self, 0x84);
            for i in vc.written as usize / 8..8 {
                // mov qword [rcx+zmm_n+8i], 0
                self.buf.extend_from_slice(&[0x48, 0xC7, 0x81]);
                self.d32(reg(i));
                self.d32(0);
            }
            // and dword [rcx+stale], !(1 << n)
            self.buf.extend_from_slice(&[0x81, 0xA1]);
            self.d32(OFF_VECTORS_STALE as u32);
            self.d32(!(1u32 << vc.n));
            patch(self, fresh);
            for i in 0..qwords {
                // mov rdx, [rax+8i]; mov [rcx+zmm_n+8i], rdx
                self.buf
                    .extend_from_slice(&[0x48, 0x8B, 0x50, (8 * i) as u8]);
                self.buf.extend_from_slice(&[0x48, 0x89, 0x91]);
                self.d32(reg(i));
            }
            for i in qwords..vc.written as usize / 8 {
                // mov qword [rcx+zmm_n+8i], 0
                self.buf.extend_from_slice(&[0x48, 0xC7, 0x81]);
                self.d32(reg(i));
                self.d32(0);
            }
            give_back(self);
            let done = jmp(self);
            patch(self, zero);
            self.load_gs(0, c::OFF_VBITS);
            for i in 0..vc.written as usize / 8 {
                // mov qword [rax+zmm_n+8i], 0
                self.buf.extend_from_slice(&[0x48, 0xC7, 0x80]);
                self.d32(reg(i));
                self.d32(0);
            }
            patch(self, done);
            return Ok(false);
        }
        let chunk = jump(self, 0x85);
        self.load_gs(0, c::OFF_VBITS);
        // test dword [rax+stale], 1 << n; jnz done
        self.test_vector_stale(0, vc.n);
        let done_stale = jump(self, 0x85);
        for i in 0..qwords {
            // cmp qword [rax+zmm_n+8i], 0; jne slow
            self.buf.extend_from_slice(&[0x48, 0x83, 0xB8]);
            self.d32(reg(i));
            self.buf.push(0x00);
            self.jcc_slow(0x85, slow)?;
        }
        let done = jmp(self);
        patch(self, chunk);
        self.operand_shadow(m, ip)?;
        borrow(self);
        let stale = jump(self, 0x85);
        for i in 0..qwords {
            // mov rdx, [rcx+zmm_n+8i]; mov [rax+8i], rdx
            self.buf.extend_from_slice(&[0x48, 0x8B, 0x91]);
            self.d32(reg(i));
            self.buf
                .extend_from_slice(&[0x48, 0x89, 0x50, (8 * i) as u8]);
        }
        let back = jmp(self);
        patch(self, stale);
        for i in 0..qwords {
            // mov qword [rax+8i], 0
            self.buf
                .extend_from_slice(&[0x48, 0xC7, 0x40, (8 * i) as u8]);
            self.d32(0);
        }
        patch(self, back);
        give_back(self);
        patch(self, done);
        patch(self, done_stale);
        Ok(false)
    }

    /// With `rax` the primary entry of operand `m`'s span: `rax` = the address of the
    /// operand's shadow.
    fn operand_shadow(&mut self, m: &iced_x86::UsedMemory, ip: u64) -> Result<(), TranslateError> {
        if !self.shadow_of_operand(m, ip)? {
            self.store_gs(0, c::OFF_VBITS_TEMP);
            self.effective_address(m, 0, ip)?;
            self.add_offset_in_span();
        }
        Ok(())
    }

    /// The stack rule's new undefined bytes and the instruction's own stack operand
    /// (`push`, `call`: the slot written; `ret`: the return address read) with one span
    /// check and one chunk lookup (see [`stack_at_once`]): both lie in one span with a
    /// chunk, else slow.
    ///
    /// ```text
    ///     lea rax, [rsp+lo]; add ax, hi-lo-1; jc slow; shr rax, 16
    ///     cmp rax, gs:[limit]; jae slow; mov rax, gs:[rax*8+view]; test rax, rax; jz slow
    ///     lea rax, [rsp+rax]                      (the shadow of [rsp])
    ///     cmp size [rax+d], 0; jne slow           (a read operand), or
    ///     mov size [rax+d], 0                     (a written one)
    ///     mov qword [rax+off+8i], -1              (each new undefined qword)
    /// ```
    fn stack_at_once(
        &mut self,
        plan: StackAtOnce,
        ip: u64,
        slow: &mut SlowCall,
    ) -> Result<(), TranslateError> {
        let (off, len) = plan.undefined;
        let (lo, hi) = match plan.operand {
            Some((d, size, _)) => (off.min(d), (off + len).max(d + size as i32)),
            None => (off, off + len),
        };
        self.lea_rsp(lo, ip)?;
        // A range straddling two spans goes to the stack-split routine, through a thunk
        // placed after the block's slow calls (`stack_split_thunk`), when there is one.
        let split = split_params(plan).filter(|_| stack_split_routine_at() != 0);
        let split_at = match split {
            Some(params) => {
                // add ax, hi-lo-1; jc split
                let last = (hi - lo - 1) as u32;
                if last < 0x80 {
                    self.buf.extend_from_slice(&[0x66, 0x83, 0xC0, last as u8]);
                } else {
                    self.buf.extend_from_slice(&[0x66, 0x05]);
                    self.buf.extend_from_slice(&(last as u16).to_le_bytes());
                }
                self.buf.extend_from_slice(&[0x0F, 0x82]);
                let jump = self.buf.len();
                self.d32(0);
                Some((jump, params))
            }
            None => {
                self.within_one_span((hi - lo) as u32, slow)?;
                None
            }
        };
        self.span_index(Some(&mut *slow))?;
        self.chunk_of_span();
        // test rax, rax; jz slow
        self.buf.extend_from_slice(&[0x48, 0x85, 0xC0]);
        self.jcc_slow(0x84, slow)?;
        self.lea_rsp_plus_rax(0, ip)?;
        if let Some((d, size, read)) = plan.operand {
            let prefix: &[u8] = match size {
                2 => &[0x66],
                8 => &[0x48],
                _ => &[],
            };
            self.buf.extend_from_slice(prefix);
            if read {
                // cmp size [rax+d], 0; jne slow
                self.buf.extend_from_slice(if size == 1 {
                    &[0x80, 0xB8]
                } else {
                    &[0x83, 0xB8]
                });
                self.d32(d as u32);
                self.buf.push(0x00);
                self.jcc_slow(0x85, slow)?;
            } else {
                // mov size [rax+d], 0
                self.buf.extend_from_slice(if size == 1 {
                    &[0xC6, 0x80]
                } else {
                    &[0xC7, 0x80]
                });
                self.d32(d as u32);
                match size {
                    1 => self.buf.push(0),
                    2 => self.buf.extend_from_slice(&[0, 0]),
                    _ => self.d32(0),
                }
            }
        }
        self.mark_undefined(off, len);
        if let Some((jump, params)) = split_at {
            // The slow call is pushed when the instruction's inline part ends: next.
            self.stack_split.push(StackSplit {
                jump,
                resume: self.buf.len(),
                params,
                slow: self.slow.len(),
                ip,
            });
        }
        Ok(())
    }

    /// Marks the `len` shadow bytes (a multiple of 8) at `[rax + disp]` undefined: the stack
    /// rule's new stack, 128 bytes at every `call` and `ret` (VEX's "AbiHint"), a quarter
    /// of the inline stack code's instructions as one `mov qword [rax+disp+8i], -1` each.
    /// From 8 qwords on, 16 bytes a store through the program's `xmm7`, borrowed:
    ///
    /// ```text
    ///     movups gs:[saved_xmm], xmm7; pcmpeqd xmm7, xmm7
    ///     movups [rax+disp+16i], xmm7             (each 16 bytes)
    ///     mov qword [rax+disp+len-8], -1          (an odd qword)
    ///     movups xmm7, gs:[saved_xmm]
    /// ```
    ///
    /// Legacy SSE encodings, which leave the bits of `ymm7`/`zmm7` above the low 128 as
    /// they are (a VEX or EVEX write would zero them), need no more than SSE2, raise no
    /// floating-point exception and touch neither the flags nor MXCSR: the program's
    /// vector state is whole again after the last `movups`. No guest instruction boundary
    /// lies between the borrow and its end, so an asynchronous signal steps on past the
    /// restore (`signals`), and the stores are to a chunk the inline code found present,
    /// as the qword stores were.
    fn mark_undefined(&mut self, disp: i32, len: i32) {
        // `mov qword [rax+d], -1` (disp8 or disp32).
        let qword = |e: &mut Emitter, d: i32| {
            if d == d as i8 as i32 {
                e.buf.extend_from_slice(&[0x48, 0xC7, 0x40, d as u8]);
            } else {
                e.buf.extend_from_slice(&[0x48, 0xC7, 0x80]);
                e.d32(d as u32);
            }
            e.d32(u32::MAX);
        };
        let qwords = len / 8;
        if qwords < 8 {
            for i in 0..qwords {
                qword(self, disp + 8 * i);
            }
            return;
        }
        // movups gs:[saved_xmm], xmm7; pcmpeqd xmm7, xmm7
        self.buf.extend_from_slice(&[0x65, 0x0F, 0x11, 0x3C, 0x25]);
        self.d32(c::OFF_VBITS_SAVED_XMM as u32);
        self.buf.extend_from_slice(&[0x66, 0x0F, 0x76, 0xFF]);
        for i in 0..qwords / 2 {
            // movups [rax+d], xmm7 (disp8 or disp32)
            let d = disp + 16 * i;
            if d == d as i8 as i32 {
                self.buf.extend_from_slice(&[0x0F, 0x11, 0x78, d as u8]);
            } else {
                self.buf.extend_from_slice(&[0x0F, 0x11, 0xB8]);
                self.d32(d as u32);
            }
        }
        if qwords % 2 != 0 {
            qword(self, disp + len - 8);
        }
        // movups xmm7, gs:[saved_xmm]
        self.buf.extend_from_slice(&[0x65, 0x0F, 0x10, 0x3C, 0x25]);
        self.d32(c::OFF_VBITS_SAVED_XMM as u32);
    }

    /// `rax` = the origins' tag chunk of the span of `[rsp + off]` (0: none).
    /// `lea rax, [rsp+off]; shr rax, 16; shl rax, 3; mov gs:[temp], rax;
    /// mov rax, primary; add rax, gs:[temp]; mov rax, [rax]`
    fn tag_chunk(&mut self, off: i32, ip: u64) -> Result<(), TranslateError> {
        self.lea_rsp(off, ip)?;
        self.buf.extend_from_slice(&[0x48, 0xC1, 0xE8, 0x10]);
        self.buf.extend_from_slice(&[0x48, 0xC1, 0xE0, 0x03]);
        self.store_gs(0, c::OFF_VBITS_TEMP);
        self.buf.extend_from_slice(&[0x48, 0xB8]);
        self.buf
            .extend_from_slice(&crate::definedness::origins_primary().to_le_bytes());
        self.buf.extend_from_slice(&[0x65, 0x48, 0x03, 0x04, 0x25]);
        self.d32(c::OFF_VBITS_TEMP as u32);
        self.buf.extend_from_slice(&[0x48, 0x8B, 0x00]);
        Ok(())
    }

    /// Origins: the `len` new stack bytes at `[rsp + off]` (granule-aligned, their tag
    /// chunk present: checked before) take `origin`'s tag, as the slow path's stack rule
    /// would tag them. Borrows `rcx` for the tag (the program's value is back before the
    /// instruction runs; the only load that can fault, `ret`'s return address, is made
    /// before it is borrowed).
    fn tag_stack(
        &mut self,
        off: i32,
        len: i32,
        origin: StackOrigin,
        ip: u64,
    ) -> Result<(), TranslateError> {
        if origin == StackOrigin::ReturnAddress {
            // mov rax, [rsp]; shl rax, 2; or rax, 2 (the stack kind); mov gs:[temp2], rax
            self.buf.extend_from_slice(&[0x48, 0x8B, 0x04, 0x24]);
            self.buf.extend_from_slice(&[0x48, 0xC1, 0xE0, 0x02]);
            self.buf.extend_from_slice(&[0x48, 0x83, 0xC8, 0x02]);
            self.store_gs(0, c::OFF_VBITS_TEMP2);
        }
        // rax = &tags[granule of rsp+off]: the chunk, plus (addr & 0xffff) / 4 * 8.
        self.tag_chunk(off, ip)?;
        self.store_gs(0, c::OFF_VBITS_TEMP);
        self.lea_rsp(off, ip)?;
        // movzx eax, ax; add eax, eax; add rax, gs:[temp]
        self.buf.extend_from_slice(&[0x0F, 0xB7, 0xC0, 0x01, 0xC0]);
        self.buf.extend_from_slice(&[0x65, 0x48, 0x03, 0x04, 0x25]);
        self.d32(c::OFF_VBITS_TEMP as u32);
        // mov gs:[saved_rcx], rcx; rcx = the tag
        self.buf.extend_from_slice(&[0x65, 0x48, 0x89, 0x0C, 0x25]);
        self.d32(c::OFF_VBITS_SAVED_RCX as u32);
        match origin {
            StackOrigin::Tag(tag) => {
                self.buf.extend_from_slice(&[0x48, 0xB9]);
                self.buf.extend_from_slice(&tag.to_le_bytes());
            }
            StackOrigin::ReturnAddress => {
                self.buf.extend_from_slice(&[0x65, 0x48, 0x8B, 0x0C, 0x25]);
                self.d32(c::OFF_VBITS_TEMP2 as u32);
            }
        }
        // mov [rax + 8i], rcx for each granule
        for i in 0..(len / 4) as u32 {
            self.buf.extend_from_slice(&[0x48, 0x89, 0x88]);
            self.d32(8 * i);
        }
        // mov rcx, gs:[saved_rcx]
        self.buf.extend_from_slice(&[0x65, 0x48, 0x8B, 0x0C, 0x25]);
        self.d32(c::OFF_VBITS_SAVED_RCX as u32);
        Ok(())
    }

    /// `rax` = the address of the shadow of `[rsp + off]`, whose `len` bytes must lie in
    /// one span with a chunk: checked (with jumps to `slow`) when `slow` is given, else
    /// taken as checked before.
    fn stack_chunk(
        &mut self,
        off: i32,
        len: i32,
        ip: u64,
        mut slow: Option<&mut SlowCall>,
    ) -> Result<(), TranslateError> {
        self.lea_rsp(off, ip)?;
        if let Some(slow) = slow.as_deref_mut() {
            self.within_one_span(len as u32, slow)?;
        }
        self.span_index(slow.as_deref_mut())?;
        self.chunk_of_span();
        if let Some(slow) = slow {
            // test rax, rax; jz slow
            self.buf.extend_from_slice(&[0x48, 0x85, 0xC0]);
            self.jcc_slow(0x84, slow)?;
            return Ok(());
        }
        self.lea_rsp_plus_rax(off, ip)
    }

    /// With `rax` an address: `len` bytes from it stay in one 64 KiB span of the memory
    /// shadow, else slow. `add ax, len - 1; jc slow`: the carry out of the low 16 bits is
    /// the crossing, and without it the bits above stay those of the address, so its span
    /// index follows (`span_index`) without computing the address again. (The 8-bit
    /// immediate form: a 16-bit immediate would stall the decoder on its length prefix.)
    fn within_one_span(&mut self, len: u32, slow: &mut SlowCall) -> Result<(), TranslateError> {
        let last = len - 1;
        if last < 0x80 {
            self.buf.extend_from_slice(&[0x66, 0x83, 0xC0, last as u8]);
        } else {
            self.buf.extend_from_slice(&[0x66, 0x05]);
            self.buf.extend_from_slice(&(last as u16).to_le_bytes());
        }
        self.jcc_slow(0x82, slow)
    }

    /// With `rax` an address: `rax` = its span's index. `shr rax, 16`, then (when `slow`
    /// is given) `cmp rax, gs:[limit]; jae slow`: an address above user space goes slow,
    /// and every address does in a thread without a view of the primary table
    /// (`definedness::views`).
    fn span_index(&mut self, slow: Option<&mut SlowCall>) -> Result<(), TranslateError> {
        self.buf.extend_from_slice(&[0x48, 0xC1, 0xE8, 0x10]);
        if let Some(slow) = slow {
            self.cmp_rax_limit();
            self.jcc_slow(0x83, slow)?;
        }
        Ok(())
    }

    /// `cmp rax, gs:[limit]`: a span index against the entries of the thread's view of
    /// the primary table (`ThreadCtx::vbits_limit`; `jae` leaves for the slow path).
    fn cmp_rax_limit(&mut self) {
        self.buf.extend_from_slice(&[0x65, 0x48, 0x3B, 0x04, 0x25]);
        self.d32(c::OFF_VBITS_LIMIT as u32);
    }

    /// With `rax` a span index (bounded): `cmp qword gs:[rax*8 + view], 0`, ZF set when
    /// its span has no chunk.
    fn cmp_entry_zero(&mut self) {
        self.buf.extend_from_slice(&[0x65, 0x48, 0x83, 0x3C, 0xC5]);
        self.d32(VIEW_OFF);
        self.buf.push(0x00);
    }

    /// `rax` = the primary entry of the span of the address in `rcx` (the stack-split
    /// routine's): `mov rax, rcx; shr rax, 16; mov rax, gs:[rax*8+view]`; when `checked`,
    /// an index beyond the thread's view or an entry of 0 (no chunk) jumps to a rel32
    /// recorded in `fail`.
    fn span_entry_of_rcx(&mut self, fail: &mut alloc::vec::Vec<usize>, checked: bool) {
        self.buf
            .extend_from_slice(&[0x48, 0x89, 0xC8, 0x48, 0xC1, 0xE8, 0x10]);
        if checked {
            // cmp rax, gs:[limit]; jae fail
            self.cmp_rax_limit();
            self.buf.extend_from_slice(&[0x0F, 0x83]);
            fail.push(self.buf.len());
            self.d32(0);
        }
        self.chunk_of_span();
        if checked {
            // test rax, rax; jz fail
            self.buf.extend_from_slice(&[0x48, 0x85, 0xC0, 0x0F, 0x84]);
            fail.push(self.buf.len());
            self.d32(0);
        }
    }

    /// The out-of-line thunk of a `stack_at_once` whose range straddled two spans: calls
    /// the arena's stack-split routine with the plan's parameters, then goes on after the
    /// inline marking, or to the instruction's slow call (at `slow_at`) when the routine
    /// could not do it (the slow call itself, when the routine is out of reach).
    ///
    /// ```text
    ///     mov qword gs:[temp2], params; lea rax, [rip+back]; jmp routine
    ///     back: jne slow; jmp resume
    /// ```
    pub(super) fn stack_split_thunk(&mut self, x: &StackSplit, slow_at: usize) {
        let at = self.buf.len();
        let rel = at as i64 - (x.jump as i64 + 4);
        self.buf[x.jump..x.jump + 4].copy_from_slice(&(rel as i32).to_le_bytes());
        self.push_map_at(at, x.ip, super::FIX_RAX_IN_STUB);
        let routine = stack_split_routine_at();
        // From the end of the `jmp` (13 + 7 + 5 bytes on) to the routine.
        let rel = (routine as i64).wrapping_sub(self.here() as i64 + 13 + 7 + 5);
        if routine == 0 || rel != rel as i32 as i64 {
            self.jmp_to(slow_at);
            return;
        }
        self.buf.extend_from_slice(&[0x65, 0x48, 0xC7, 0x04, 0x25]);
        self.d32(c::OFF_VBITS_TEMP2 as u32);
        self.d32(x.params);
        // lea rax, [rip+5]: back, after the jmp
        self.buf.extend_from_slice(&[0x48, 0x8D, 0x05]);
        self.d32(5);
        self.buf.push(0xE9);
        self.d32(rel as i32 as u32);
        // back: jne slow; jmp resume
        self.buf.extend_from_slice(&[0x0F, 0x85]);
        let rel = slow_at as i64 - (self.buf.len() as i64 + 4);
        self.d32(rel as i32 as u32);
        self.jmp_to(x.resume);
    }

    /// With `rax` a span index (bounded by the thread's limit: `span_index`): `rax` = its
    /// primary entry, read through the thread's view of the table (0: no chunk, all
    /// defined). `mov rax, gs:[rax*8 + view]`
    fn chunk_of_span(&mut self) {
        self.buf.extend_from_slice(&[0x65, 0x48, 0x8B, 0x04, 0xC5]);
        self.d32(VIEW_OFF);
    }

    /// With `rax` a span index (bounded): `rax` = where its primary entry is, as an offset
    /// from the thread's context (`gs:[rax]` reads it). `lea rax, [rax*8 + view]`
    fn primary_entry_of_span(&mut self) {
        self.buf.extend_from_slice(&[0x48, 0x8D, 0x04, 0xC5]);
        self.d32(VIEW_OFF);
    }

    /// With `rax` an address and its span's primary entry in `gs:[temp]`: `rax` = the
    /// address of its shadow byte (an entry is the chunk minus the span's address:
    /// `definedness::layout::entry_value`). `add rax, gs:[temp]`
    fn add_offset_in_span(&mut self) {
        self.buf.extend_from_slice(&[0x65, 0x48, 0x03, 0x04, 0x25]);
        self.d32(c::OFF_VBITS_TEMP as u32);
    }

    /// With `rax` the primary entry of operand `m`'s span: `rax` = the address of the
    /// operand's shadow (see [`Emitter::shadow_address`]); false and nothing emitted for
    /// an operand it does not handle.
    fn shadow_of_operand(
        &mut self,
        m: &iced_x86::UsedMemory,
        ip: u64,
    ) -> Result<bool, TranslateError> {
        match self.shadow_address(m, ip)? {
            None => Ok(false),
            Some(ShadowAt::Rax) => Ok(true),
            Some(ShadowAt::Operand(lea)) => {
                self.buf.extend_from_slice(lea.bytes());
                Ok(true)
            }
        }
    }

    /// Where the operand's shadow is: [`shadow_address`](Self::shadow_address)'s folded
    /// form, else computed into rax (the operand's address plus its span's offset).
    fn shadow_operand(
        &mut self,
        m: &iced_x86::UsedMemory,
        ip: u64,
    ) -> Result<ShadowAt, TranslateError> {
        Ok(match self.shadow_address(m, ip)? {
            Some(at) => at,
            None => {
                self.store_gs(0, c::OFF_VBITS_TEMP);
                self.effective_address(m, 0, ip)?;
                self.add_offset_in_span();
                ShadowAt::Rax
            }
        })
    }

    /// With `rax` the primary entry of operand `m`'s span: the address of the operand's
    /// shadow is `[rax + reg + disp]` when `m` is addressed by one or two general registers
    /// and a 32-bit displacement, without a segment. Returned as the encoded `lea rax,
    /// [...]`, not emitted: the one access to the shadow that follows takes its memory
    /// operand (`on_shadow`), one instruction fewer on each lookup. Two registers take a
    /// `lea rax, [base + rax]` first; the guest `rax` (kept in `STUB_RAX`) as the base or
    /// an unscaled index is added first (`add rax, gs:[STUB_RAX]`), an `fs` base likewise
    /// (`add rax, fs:[0]`); an absolute 32-bit address is the displacement alone. `None`,
    /// nothing emitted, for any other operand (RIP-relative: its 64-bit target does not fit
    /// a displacement).
    fn shadow_address(
        &mut self,
        m: &iced_x86::UsedMemory,
        ip: u64,
    ) -> Result<Option<ShadowAt>, TranslateError> {
        let gpr64 = |r: Register| r.is_gpr64() && r != Register::RAX;
        let d = m.displacement() as i64;
        let fs = m.segment() == Register::FS;
        if d != d as i32 as i64
            || !(fs
                || matches!(
                    m.segment(),
                    Register::None | Register::DS | Register::SS | Register::ES | Register::CS
                ))
            || matches!(m.base(), Register::RIP | Register::EIP)
        {
            return Ok(None);
        }
        // What comes before the access: `lea rax, [b + rax]` for a second register, or
        // the guest `rax` added.
        enum Before {
            Nothing,
            TwoRegisters(Register),
            GuestRax,
        }
        let (before, base, index, scale) = match (m.base(), m.index()) {
            (Register::RSP, Register::None) => (Before::Nothing, Register::RSP, Register::RAX, 1),
            (b, Register::None) if gpr64(b) => (Before::Nothing, Register::RAX, b, 1),
            (Register::None, i) if gpr64(i) => (Before::Nothing, Register::RAX, i, m.scale()),
            (b, i) if gpr64(b) && gpr64(i) => {
                (Before::TwoRegisters(b), Register::RAX, i, m.scale())
            }
            (Register::RAX, Register::None) => (Before::GuestRax, Register::RAX, Register::None, 1),
            (Register::None, Register::RAX) if m.scale() == 1 => {
                (Before::GuestRax, Register::RAX, Register::None, 1)
            }
            (Register::RAX, i) if gpr64(i) => (Before::GuestRax, Register::RAX, i, m.scale()),
            (Register::RSP, Register::RAX) if m.scale() == 1 => {
                (Before::GuestRax, Register::RSP, Register::RAX, 1)
            }
            (b, Register::RAX) if gpr64(b) && m.scale() == 1 => {
                (Before::GuestRax, Register::RAX, b, 1)
            }
            // An absolute address (a non-PIE global, or `fs:[d]`).
            (Register::None, Register::None) => (Before::Nothing, Register::RAX, Register::None, 1),
            _ => return Ok(None),
        };
        if fs {
            // The thread's `fs` base (a thread-local operand): add rax, fs:[0]
            self.buf.extend_from_slice(&[0x64, 0x48, 0x03, 0x04, 0x25]);
            self.d32(0);
        }
        match before {
            Before::Nothing => {}
            // lea rax, [b + rax]
            Before::TwoRegisters(b) => self.lea_rax(b, Register::RAX, 1, 0, ip)?,
            Before::GuestRax => {
                // add rax, gs:[STUB_RAX]
                self.buf.extend_from_slice(&[0x65, 0x48, 0x03, 0x04, 0x25]);
                self.d32(c::scratch_off(c::S_STUB_RAX) as u32);
            }
        }
        Ok(Some(
            match super::rewrite::lea_rax_bytes(base, index, scale, d) {
                Some(lea) => ShadowAt::Operand(lea),
                None => {
                    self.lea_rax(base, index, scale, d, ip)?;
                    ShadowAt::Rax
                }
            },
        ))
    }

    /// One instruction on the operand's shadow `at`: `[66] [REX] opcode ModRM (SIB disp)
    /// imm`, the ModRM's reg field `reg`, REX.W when `w`. `ShadowAt::Rax` is `[rax]`;
    /// `ShadowAt::Operand` takes the `lea`'s memory operand (its REX.X and REX.B, ModRM
    /// mode and r/m, SIB, displacement: the `lea`'s own reg field is `rax`, 0).
    fn on_shadow(&mut self, at: &ShadowAt, p66: bool, w: bool, opcode: &[u8], reg: u8, imm: &[u8]) {
        const AT_RAX: [u8; 3] = [0x48, 0x8D, 0x00];
        let lea = match at {
            ShadowAt::Rax => &AT_RAX[..],
            ShadowAt::Operand(lea) => lea.bytes(),
        };
        if p66 {
            self.buf.push(0x66);
        }
        let rex = 0x40 | if w { 0x08 } else { 0 } | (lea[0] & 0x03);
        if rex != 0x40 {
            self.buf.push(rex);
        }
        self.buf.extend_from_slice(opcode);
        self.buf.push(lea[2] | reg << 3);
        self.buf.extend_from_slice(&lea[3..]);
        self.buf.extend_from_slice(imm);
    }

    /// With `rax` the primary entry of the span of `[rsp + off]`: `rax` = the address of
    /// its shadow. `lea rax, [rsp + rax + off]`
    fn lea_rsp_plus_rax(&mut self, off: i32, ip: u64) -> Result<(), TranslateError> {
        self.lea_rax(Register::RSP, Register::RAX, 1, off as i64, ip)
    }

    /// `test dword [reg+stale], 1 << n` (`reg` 0 or 1: `rax` or `rcx` holding `gs:[vbits]`):
    /// ZF clear when vector register `n`'s shadow is stale (`OFF_VECTORS_STALE`).
    fn test_vector_stale(&mut self, reg: u8, n: u8) {
        self.buf.extend_from_slice(&[0xF7, 0x80 | reg]);
        self.d32(OFF_VECTORS_STALE as u32);
        self.d32(1u32 << n);
    }

    /// `lea rax, [rsp + off]`.
    fn lea_rsp(&mut self, off: i32, ip: u64) -> Result<(), TranslateError> {
        self.lea_rax(Register::RSP, Register::None, 1, off as i64, ip)
    }

    /// `j<cc> slow` (rel32, opcode `0F cc`), recorded in `slow` for patching.
    /// At the start of a slow call: `mov qword gs:[span], 0` for each slot of
    /// `gs:[vbits_span]` in `slots` (a bit each; `SlowCall::clears_span`).
    pub(super) fn clear_span_slots(&mut self, slots: u8) {
        for slot in (0..SPAN_SLOTS as u8).filter(|s| slots & (1 << s) != 0) {
            self.buf.extend_from_slice(&[0x65, 0x48, 0xC7, 0x04, 0x25]);
            self.d32(span_slot_off(slot));
            self.d32(0);
        }
    }

    fn jcc_slow(&mut self, cc: u8, slow: &mut SlowCall) -> Result<(), TranslateError> {
        self.buf.extend_from_slice(&[0x0F, cc]);
        slow.add_jump(self.buf.len())?;
        self.d32(0);
        Ok(())
    }
}

/// Where an operand's shadow is, for the access to it (`Emitter::shadow_address`).
enum ShadowAt {
    /// In `rax`.
    Rax,
    /// At `rax` (the span's primary entry) plus the operand's registers and displacement:
    /// the memory operand of this `lea rax, [...]`, not emitted.
    Operand(super::rewrite::LeaBytes),
}

/// How a memory operand's V-bit lookup (`Emitter::memory_shadow`) finds its span's
/// primary entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(super) enum SpanShare {
    /// From its own address: span check, index, lookup.
    #[default]
    Own,
    /// From `[base + lo, base + hi)`, which holds its own bytes and those of the operands
    /// that follow it: one span check for all, and the entry's address kept in slot
    /// `slot` of `gs:[vbits_span]` (0 there when this instruction went slow first).
    Lead { slot: u8, lo: i32, hi: i32 },
    /// From slot `slot` (slow when 0), filled by an earlier operand of the block with the
    /// same base register, not written since, whose range holds this operand's bytes.
    Follow { slot: u8 },
}

/// Slots of `gs:[vbits_span]`: sharings of a block in flight at once.
const SPAN_SLOTS: usize = 2;

/// The widest range one sharing covers: nearby fields of one structure or frame. (Wider,
/// and the one check would more often find the range crossing a span where each operand
/// alone does not; then all of them go slow.)
const SPAN_SHARE_RANGE: i64 = 64;

/// The 64-bit general register of encoding number `n`.
fn gpr64(n: u8) -> Register {
    const GPRS: [Register; 16] = [
        Register::RAX,
        Register::RCX,
        Register::RDX,
        Register::RBX,
        Register::RSP,
        Register::RBP,
        Register::RSI,
        Register::RDI,
        Register::R8,
        Register::R9,
        Register::R10,
        Register::R11,
        Register::R12,
        Register::R13,
        Register::R14,
        Register::R15,
    ];
    GPRS[n as usize & 15]
}

fn span_slot_off(slot: u8) -> u32 {
    (c::OFF_VBITS_SPAN + 8 * slot as usize) as u32
}

/// Which memory operands of a block share their span lookup ([`SpanShare`]), into
/// `shares` (one entry per instruction, by operand of its fast form; `form(i)`: instruction
/// `i`'s fast form when its definedness part is one, `breaks(i)`: a client request).
/// Operands addressed as `[base + disp]` (a general register other than `rax`, whose guest
/// value the inline code keeps elsewhere) are grouped by base register, from the first to
/// the last before an instruction that writes any part of it (or a client request), while
/// all of them fit in [`SPAN_SHARE_RANGE`] bytes; a group of two or more shares, when one
/// of [`SPAN_SLOTS`] slots is free from its first instruction to its last. The block runs
/// straight through (an exit ends it); a signal handler that comes back into its middle
/// clears the slots. No heap allocation: see `translate::ALLOC_NOTE`.
pub(super) fn span_shares(
    insns: &[&iced_x86::Instruction],
    form: impl Fn(usize) -> Option<FastForm>,
    breaks: impl Fn(usize) -> bool,
    shares: &mut [[SpanShare; 2]],
) {
    #[derive(Clone, Copy)]
    struct Group {
        base: Register,
        lo: i64,
        hi: i64,
        /// Its first member (instruction, operand), which leads, and its last instruction.
        first: (usize, usize),
        last: usize,
        members: u32,
        open: bool,
    }
    const MAX_GROUPS: usize = 32;
    let none = Group {
        base: Register::None,
        lo: 0,
        hi: 0,
        first: (0, 0),
        last: 0,
        members: 0,
        open: false,
    };
    let mut groups = [none; MAX_GROUPS];
    let mut ngroups = 0;
    // The group of each operand (`u8::MAX`: none).
    let mut member_of = [[u8::MAX; 2]; super::MAX_INSNS];
    for (i, ins) in insns.iter().enumerate().take(super::MAX_INSNS) {
        if let Some(form) = form(i).filter(|f| stack_at_once(f).is_none()) {
            for (k, m) in form.mem.iter().enumerate() {
                let Some((base, lo, hi)) = m.as_ref().and_then(shareable) else {
                    continue;
                };
                let open = groups[..ngroups]
                    .iter()
                    .position(|g| g.open && g.base == base);
                if let Some(g) = open.map(|j| &mut groups[j]) {
                    if g.hi.max(hi) - g.lo.min(lo) <= SPAN_SHARE_RANGE {
                        g.lo = g.lo.min(lo);
                        g.hi = g.hi.max(hi);
                        g.last = i;
                        g.members += 1;
                        member_of[i][k] = open.unwrap_or(0) as u8;
                        continue;
                    }
                    g.open = false;
                }
                if ngroups == MAX_GROUPS {
                    continue;
                }
                groups[ngroups] = Group {
                    base,
                    lo,
                    hi,
                    first: (i, k),
                    last: i,
                    members: 1,
                    open: true,
                };
                member_of[i][k] = ngroups as u8;
                ngroups += 1;
            }
        }
        if !groups[..ngroups].iter().any(|g| g.open) {
            continue;
        }
        if breaks(i) {
            groups[..ngroups].iter_mut().for_each(|g| g.open = false);
            continue;
        }
        // The general registers the instruction writes, any part of them.
        let written = u32::from(gprs_written(ins));
        for g in groups[..ngroups].iter_mut().filter(|g| g.open) {
            if written & (1 << (g.base as u32 - Register::RAX as u32)) != 0 {
                g.open = false;
            }
        }
    }
    // Each slot's last instruction in use: a group takes a slot free before its first
    // instruction (whose inline part fills it, or whose slow call clears it first thing).
    // Groups were made in the
    // order of their first instructions.
    let mut busy_until: [Option<usize>; SPAN_SLOTS] = [None; SPAN_SLOTS];
    let mut slot_of = [u8::MAX; MAX_GROUPS];
    for (j, g) in groups[..ngroups].iter().enumerate() {
        if g.members < 2 {
            continue;
        }
        let Some(slot) = (0..SPAN_SLOTS).find(|&s| busy_until[s].is_none_or(|end| end < g.first.0))
        else {
            continue;
        };
        busy_until[slot] = Some(g.last);
        slot_of[j] = slot as u8;
    }
    for (i, row) in shares
        .iter_mut()
        .enumerate()
        .take(insns.len().min(super::MAX_INSNS))
    {
        for (k, share) in row.iter_mut().enumerate() {
            let j = member_of[i][k] as usize;
            *share = match groups.get(j) {
                Some(g) if j < ngroups && slot_of[j] != u8::MAX => {
                    let slot = slot_of[j];
                    if g.first == (i, k) {
                        SpanShare::Lead {
                            slot,
                            lo: g.lo as i32,
                            hi: g.hi as i32,
                        }
                    } else {
                        SpanShare::Follow { slot }
                    }
                }
                _ => SpanShare::Own,
            };
        }
    }
}

/// An operand that may share its span lookup: `[base + disp]`, the base a 64-bit general
/// register but `rax`, no index, no `fs`/`gs`; its base and byte range from it.
fn shareable(m: &iced_x86::UsedMemory) -> Option<(Register, i64, i64)> {
    let base = m.base();
    let d = m.displacement() as i64;
    let size = m.memory_size().size() as i64;
    (base.is_gpr64()
        && base != Register::RAX
        && m.index() == Register::None
        && matches!(
            m.segment(),
            Register::None | Register::DS | Register::SS | Register::ES | Register::CS
        )
        && (-(1 << 30)..(1 << 30)).contains(&d)
        && (1..=SPAN_SHARE_RANGE).contains(&size))
    .then_some((base, d, d + size))
}

/// The out-of-line half of a store copy (`Emitter::store_copy`): the register's shadow is
/// not all zero, so it is copied into the operand's; placed by `finish_slow_calls`.
pub(super) struct StoreCopyCold {
    /// Position of the rel32 of the inline `jne`.
    jump: usize,
    /// Where the inline path continues.
    resume: usize,
    /// The `lea rax, [...]` that makes `rax` the operand's shadow from the span's entry;
    /// `None`: `rax` is it already.
    lea: Option<super::rewrite::LeaBytes>,
    /// The register's shadow (`gs:` offset) and the bytes stored.
    off: u32,
    size: u8,
    /// The pc map's state at the inline `jne` (the copy's code is the same guest state).
    guest: u64,
    fix: u16,
}

/// A `stack_at_once` whose range may straddle two spans: its out-of-line thunk
/// ([`Emitter::stack_split_thunk`]), placed by `finish_slow_calls`.
pub(super) struct StackSplit {
    /// Position of the rel32 of the inline `jc`.
    jump: usize,
    /// Where the inline path continues, after the marking.
    resume: usize,
    /// The routine's parameters ([`split_params`]).
    params: u32,
    /// The instruction's slow call (index into `Emitter::slow`).
    pub slow: usize,
    ip: u64,
}

/// What [`Emitter::stack_at_once`] does: the stack bytes a form leaves undefined and its
/// operand on the stack, if any: `(displacement from rsp, size, read)`.
#[derive(Clone, Copy)]
struct StackAtOnce {
    undefined: (i32, i32),
    operand: Option<(i32, u8, bool)>,
}

/// The [`StackAtOnce`] of `form`: a form that leaves stack bytes undefined (`push`, `call`,
/// `ret`, `sub rsp`), without origins (whose tags need the span's tag chunk too), with no
/// memory operand but one of 1 to 8 bytes at `[rsp + d]`, read or written (not a load copy,
/// whose shadow goes to a register).
/// The instructions of a block (bit `i`: instruction `i`) whose fast form's store of the
/// thread's last `rsp` (`ThreadCtx::vbits_last_rsp`, after a `push`, `pop`, `call`, `ret`,
/// `sub`/`add rsp` or `rsp_from` move) is dead: a later instruction of the block stores it
/// again on its fast path, and nothing in between reads it or leaves the block. Prologues
/// and epilogues (`push rbp; push rbx; sub rsp, n`, `add rsp, n; pop rbx; pop rbp; ret`)
/// then store it once.
///
/// Only a slow step, the catch-up after the runtime's own code or a signal, and a `rep`
/// re-entry read it. In between, every instruction falls through and none is a client
/// request or a `rep`; a slow step there (a fast form's slow call, side exit or not, or
/// a clean call) reads it only when `vbits_last_writes_rsp` is set, which it is not
/// wherever a fast path runs, and then stores the right `rsp` itself; the runtime's code
/// is entered by a transfer, which ends the block; a signal handler's catch-up takes the
/// interrupted `rsp` from its frame, and its `rt_sigreturn` sets the last `rsp` to the
/// handler's (as before this, until the block's next `rsp` move). `has_rec(i)`: instruction
/// `i` has a definedness record (no record, no inline part and no step).
pub(super) fn last_rsp_dead<'a>(
    insns: impl Iterator<Item = &'a iced_x86::Instruction>,
    has_rec: impl Fn(usize) -> bool,
    client_request: impl Fn(usize) -> bool,
) -> u64 {
    let mut moves = 0u64;
    let mut barriers = 0u64;
    let mut n = 0;
    for (i, ins) in insns.enumerate().take(64) {
        n = i + 1;
        // A move of `rsp` with a record stores the last `rsp` on its fast path (a form with
        // `rsp_delta` or `rsp_from`) or steps (no fast form: `definedness::fast_form` has
        // none for any other write of `rsp`), which stores it too; but for `add`/`sub rsp, 0`
        // (`rsp_delta` 0), which does neither. (No `fast_form` here: its cost in
        // translation was twice what the stores left out saved on a short sqlite3 run.)
        let moves_by_zero = matches!(
            ins.mnemonic(),
            iced_x86::Mnemonic::Add | iced_x86::Mnemonic::Sub
        ) && ins.op_count() == 2
            && ins.op1_kind() != iced_x86::OpKind::Register
            && ins.op1_kind() != iced_x86::OpKind::Memory
            && ins.immediate(1) == 0;
        if has_rec(i) && crate::definedness::writes_rsp(ins) && !moves_by_zero {
            moves |= 1 << i;
        } else if ins.flow_control() != iced_x86::FlowControl::Next
            || crate::definedness::is_rep(ins)
            || client_request(i)
        {
            barriers |= 1 << i;
        }
    }
    let mut dead = 0u64;
    // Whether a later move stores the last rsp with no barrier before it.
    let mut stored_later = false;
    for i in (0..n).rev() {
        if moves & (1 << i) != 0 {
            if stored_later {
                dead |= 1 << i;
            }
            stored_later = true;
        } else if barriers & (1 << i) != 0 {
            stored_later = false;
        }
    }
    dead
}

/// Whether the copy of guest instruction `ins` leaves every bit of `rax` as it was, so that
/// the guest `rax` a borrow or a return left in the stub is still the guest's after it
/// (`Emitter::stub_has_rax`). Decided from the decoded instruction alone, at no cost per
/// translation (iced's register usage was +1.5% of a short run's instructions when asked
/// for every instruction, h20): a list of common instructions that write at most their
/// first operand (and the flags, memory, `rsp` for `push`/`pop`), that operand not a part
/// of `rax`; `cmp`, `test`, `bt` write no register. Anything else (implicit writers such
/// as `mul`, `cpuid`, `cmpxchg`, `lods`, `xchg`; control transfers; `gs:` operands, whose
/// rewrite borrows) is taken as writing it.
pub(super) fn leaves_rax(ins: &iced_x86::Instruction) -> bool {
    use iced_x86::{FlowControl, Mnemonic as M, OpKind};
    if ins.flow_control() != FlowControl::Next
        || ((0..ins.op_count()).any(|i| ins.op_kind(i) == OpKind::Memory)
            && ins.memory_segment() == Register::GS)
    {
        return false;
    }
    let first_is_rax = ins.op_count() > 0
        && ins.op0_kind() == OpKind::Register
        && ins.op0_register().full_register() == Register::RAX;
    match ins.mnemonic() {
        M::Cmp | M::Test | M::Bt | M::Push => true,
        M::Imul => ins.op_count() >= 2 && !first_is_rax,
        M::Mov
        | M::Movzx
        | M::Movsx
        | M::Movsxd
        | M::Lea
        | M::Pop
        | M::Add
        | M::Sub
        | M::And
        | M::Or
        | M::Xor
        | M::Adc
        | M::Sbb
        | M::Inc
        | M::Dec
        | M::Neg
        | M::Not
        | M::Shl
        | M::Shr
        | M::Sar
        | M::Rol
        | M::Ror
        | M::Shld
        | M::Shrd
        | M::Bts
        | M::Btr
        | M::Btc
        | M::Bswap
        | M::Bsf
        | M::Bsr
        | M::Tzcnt
        | M::Lzcnt
        | M::Popcnt
        | M::Andn
        | M::Shlx
        | M::Shrx
        | M::Sarx
        | M::Rorx
        | M::Nop
        | M::Seta
        | M::Setae
        | M::Setb
        | M::Setbe
        | M::Sete
        | M::Setg
        | M::Setge
        | M::Setl
        | M::Setle
        | M::Setne
        | M::Setno
        | M::Setnp
        | M::Setns
        | M::Seto
        | M::Setp
        | M::Sets
        | M::Cmova
        | M::Cmovae
        | M::Cmovb
        | M::Cmovbe
        | M::Cmove
        | M::Cmovg
        | M::Cmovge
        | M::Cmovl
        | M::Cmovle
        | M::Cmovne
        | M::Cmovno
        | M::Cmovnp
        | M::Cmovns
        | M::Cmovo
        | M::Cmovp
        | M::Cmovs
        | M::Movd
        | M::Movq
        | M::Movdqa
        | M::Movdqu
        | M::Movaps
        | M::Movups
        | M::Movss
        | M::Movsd
        | M::Pxor
        | M::Por
        | M::Pand
        | M::Pcmpeqb
        | M::Pminub
        | M::Pmovmskb
        | M::Vmovdqu
        | M::Vmovdqa
        | M::Vmovdqu8
        | M::Vmovdqu64
        | M::Vpxor
        | M::Vpor
        | M::Vpcmpeqb
        | M::Vpminub
        | M::Vpmovmskb => !first_is_rax,
        _ => false,
    }
}

/// Whether a borrow of `rax` may stay over the copy of `ins` (`Emitter::carry_borrow`):
/// the instruction neither reads nor writes any part of `rax`, explicitly or implicitly
/// (`mul`, `cmpxchg`, `cpuid`, string instructions...), and is copied byte for byte (no
/// `gs:` operand, whose rewrite borrows, and no `rip`-relative one, whose far rewrite may
/// take `rax` as its free register).
pub(super) fn borrow_may_carry_over(ins: &iced_x86::Instruction) -> bool {
    use iced_x86::{Code, OpKind};
    if matches!(
        ins.code(),
        Code::Rdgsbase_r64 | Code::Rdgsbase_r32 | Code::Wrgsbase_r64 | Code::Wrgsbase_r32
    ) || ins.is_ip_rel_memory_operand()
        || ((0..ins.op_count()).any(|i| ins.op_kind(i) == OpKind::Memory)
            && ins.memory_segment() == Register::GS)
    {
        return false;
    }
    crate::probe::with_factory(|f| {
        let info = f.info_options(ins, iced_x86::InstructionInfoOptions::NO_MEMORY_USAGE);
        !info
            .used_registers()
            .iter()
            .any(|r| r.register().full_register() == Register::RAX)
    })
}

/// Whether a borrow of `rax` and the live flags may be carried past the copy of `ins` with
/// only `rax` given back around it (`Emitter::carry_borrow`): a plain move between general
/// registers and memory (`mov`, `movzx`, `movsx`, `movsxd`, `lea`) that touches no flag and
/// is copied byte for byte (no `gs:` or `rip`-relative operand). Those are most of the
/// copies that use `rax` between two checked instructions with live flags (on xz, ~40% of
/// the flags' restores and saves left after [`borrow_may_carry_over`]'s carry).
pub(super) fn flags_carry_past(ins: &iced_x86::Instruction) -> bool {
    use iced_x86::{Mnemonic, OpKind};
    matches!(
        ins.mnemonic(),
        Mnemonic::Mov | Mnemonic::Movzx | Mnemonic::Movsx | Mnemonic::Movsxd | Mnemonic::Lea
    ) && ins.rflags_read() == 0
        && ins.rflags_modified() == 0
        && !ins.is_ip_rel_memory_operand()
        && (0..ins.op_count()).all(|i| match ins.op_kind(i) {
            OpKind::Register => ins.op_register(i).is_gpr(),
            OpKind::Memory => ins.memory_segment() != Register::GS,
            _ => true,
        })
}

/// Whether a borrow of `rax` kept up to the copy of `ins` may end there without giving
/// `rax` back (`Emitter::carry_borrow`): the instruction writes all of `rax` (its first
/// operand, 64-bit or 32-bit, which zero-extends) and reads no part of it, explicitly,
/// implicitly or in an address, and is copied byte for byte and falls through (as
/// [`borrow_may_carry_over`]: no `gs:` or `rip`-relative operand, no control transfer).
/// A fault in the copy happens before its write, so the guest `rax` is the one in the
/// stub, where the copy's mapping says it is.
pub(super) fn overwrites_rax(ins: &iced_x86::Instruction) -> bool {
    use iced_x86::{Code, FlowControl, OpAccess, OpKind};
    // First what the decoded instruction says at no cost (its first operand `rax` or
    // `eax`), so that iced's register usage is asked for those alone: asked for every
    // instruction, it cost a short sqlite3 run more translation work (+1.5% of its
    // instructions) than the borrows it ends saved.
    if ins.op0_kind() != OpKind::Register
        || !matches!(ins.op0_register(), Register::RAX | Register::EAX)
        || ins.flow_control() != FlowControl::Next
        || matches!(
            ins.code(),
            Code::Rdgsbase_r64 | Code::Rdgsbase_r32 | Code::Wrgsbase_r64 | Code::Wrgsbase_r32
        )
        || ins.is_ip_rel_memory_operand()
        || ((0..ins.op_count()).any(|i| ins.op_kind(i) == OpKind::Memory)
            && ins.memory_segment() == Register::GS)
    {
        return false;
    }
    crate::probe::with_factory(|f| {
        let info = f.info_options(ins, iced_x86::InstructionInfoOptions::NO_MEMORY_USAGE);
        let mut written = false;
        for u in info.used_registers() {
            if u.register().full_register() != Register::RAX {
                continue;
            }
            match (u.register(), u.access()) {
                (Register::RAX | Register::EAX, OpAccess::Write) => written = true,
                _ => return false,
            }
        }
        written
    })
}

fn stack_at_once(form: &FastForm) -> Option<StackAtOnce> {
    let undefined = form.undefined?;
    if form.origin.is_some() || form.load.is_some() || form.store.is_some() {
        return None;
    }
    let mut operand = None;
    for m in form.mem.iter().flatten() {
        let d = m.displacement() as i64;
        let size = m.memory_size().size();
        if operand.is_some()
            || m.base() != Register::RSP
            || m.index() != Register::None
            || !matches!(
                m.segment(),
                Register::None | Register::DS | Register::SS | Register::ES | Register::CS
            )
            || !(-4096..4096).contains(&d)
            || !matches!(size, 1 | 2 | 4 | 8)
        {
            return None;
        }
        let read = match m.access() {
            iced_x86::OpAccess::Write => false,
            iced_x86::OpAccess::Read => true,
            _ => return None,
        };
        operand = Some((d as i32, size as u8, read));
    }
    Some(StackAtOnce { undefined, operand })
}

/// Whether the inline checks of `form` leave written register `w`'s shadow bytes zero
/// already: every byte the write covers is checked as read (`add rax, rbx`, the `rsp` of
/// `push`), and no load copy writes it. Its zeroing is then left out.
/// Which of an instruction's inline checks its block already proved ([`Proofs`]): the
/// general registers (bit n: register n in encoding order) and the flags.
///
/// Also the zeroing of written shadows that are proven zero already (`writes`, the
/// general registers; `flags_write`, the flags' shadow): an instruction writing a register
/// a proof covers (`add eax, eax` after `cmovb eax, edi`) finds its shadow zero on its
/// fast path, so the store would change nothing.
#[derive(Clone, Copy, Default)]
pub(super) struct Skip {
    pub regs: u16,
    pub flags: bool,
    pub writes: u16,
    pub flags_write: bool,
}

/// Block-level proofs of definedness: the shadow bytes of the general registers and the
/// flags' shadow that an earlier instruction of the block checked or wrote zero on its
/// fast path, not written since by anything that could make them undefined. A later
/// check of proven bytes is left out ([`Skip`]).
///
/// A proof holds only where every fast path it relies on was taken: the interpreter
/// leaves an undefined register undefined after reporting it (as Memcheck leaves the
/// guest state's shadow), so after instruction k went slow a left-out check at m > k
/// would miss the report (and let undefined bits pass as defined). So the slow call of
/// each instruction from a proof's first to the one before its last use does not return
/// into the block: it leaves through a side exit to its own pc ([`Proofs::exits`];
/// `Emitter::exit_thunk`), marked as stepped (`ThreadCtx::vbits_stepped_pc`), and the
/// block there (an ordinary one, which proves everything again) runs the rest of the
/// instruction. Slow steps are rare (well under 1% of the steps on the bench workloads
/// that have many proofs), and each exit costs one more (empty) slow call.
///
/// What kills a proof: an instruction that writes any part of the register (iced-x86's
/// used registers), unless its fast form zeroes those bytes (then it proves them again,
/// relying on its own fast path); a load copy into it; anything without a fast form (a
/// clean call to the interpreter, which may change any shadow by its catch-up); a client
/// request; an instruction with no definedness record. The first stepped instruction of a
/// block proves nothing (its slow call returns into the block: a side exit there would come
/// back to the same step for ever), so each side exit's block gets past it. A signal
/// handler that returns into the block's middle finds the registers' shadows as they were
/// (`rt_sigreturn` restores them, as Memcheck does from its signal frame), and a side
/// exit's mark is kept over a handler that interrupts it (`definedness::Interrupted`).
pub(super) struct Proofs {
    /// Per general register: the shadow bytes proven zero (bit i: byte i).
    proven: [u8; 16],
    /// Per register: the first instruction (index in the block) whose fast path its proof
    /// relies on.
    since: [u8; 16],
    flags: bool,
    flags_since: u8,
    /// The instructions whose slow call must leave the block (bit i: instruction i).
    pub exits: u64,
}

impl Proofs {
    pub(super) fn new() -> Proofs {
        Proofs {
            proven: [0; 16],
            since: [0; 16],
            flags: false,
            flags_since: 0,
            exits: 0,
        }
    }

    /// Nothing is proven any more (an instruction without a fast path).
    pub(super) fn forget(&mut self) {
        self.proven = [0; 16];
        self.flags = false;
    }

    /// The checks of instruction `i` (fast form `form`) the block's proofs leave out; each
    /// left out makes the slow calls of the instructions it relies on leave the block.
    pub(super) fn skip(&mut self, i: usize, form: &FastForm) -> Skip {
        let mut skip = Skip::default();
        for n in (0..16).filter(|n| form.reads & (1 << n) != 0) {
            let need = form.read_bytes[n];
            if need != 0 && self.proven[n] & need == need {
                skip.regs |= 1 << n;
                self.rely(self.since[n], i);
            }
        }
        if form.flags && !form.flags_overwritten && self.flags {
            skip.flags = true;
            self.rely(self.flags_since, i);
        }
        // A zeroing store of bytes proven zero: the proof must hold when this instruction
        // runs, so the instructions it relies on leave the block when they go slow. (This
        // one's own slow step writes the shadow itself.) Not `rsp`, whose shadow the stack
        // forms keep, nor a load copy's destination, which takes the loaded shadow.
        for w in form.writes.iter().flatten() {
            let (n, bytes) = written_bytes(*w);
            if n == 4 || checked_zero(form, *w) || form.load.is_some_and(|l| l.n == n) {
                continue;
            }
            if self.proven[n as usize] & bytes == bytes {
                skip.writes |= 1 << n;
                self.rely(self.since[n as usize], i);
            }
        }
        if form.flags_overwritten && self.flags {
            skip.flags_write = true;
            self.rely(self.flags_since, i);
        }
        skip
    }

    /// Instructions `from..to` must leave the block when they go slow.
    fn rely(&mut self, from: u8, to: usize) {
        let below = |k: usize| if k >= 64 { u64::MAX } else { (1u64 << k) - 1 };
        self.exits |= below(to) & !below(from as usize);
    }

    fn prove(&mut self, n: usize, bytes: u8, i: usize) {
        if self.proven[n] == 0 {
            self.since[n] = i as u8;
        }
        self.proven[n] |= bytes;
    }

    /// After instruction `i` with fast form `form` took its fast path: what it checked is
    /// proven; what it writes (`written`: the general registers it writes any part of) is
    /// not, but what its fast form zeroes is.
    pub(super) fn after(
        &mut self,
        i: usize,
        form: &FastForm,
        written: u16,
        flags_zero_dead: bool,
        skip: Skip,
    ) {
        for n in (0..16).filter(|n| form.reads & (1 << n) != 0) {
            // The bytes the inline compare covers (`definedness_fast`).
            let bytes = match form.read_bytes[n] {
                0 => 0,
                b @ (0x01 | 0x02 | 0x03) => b,
                0x04..=0x0f => 0x0f,
                _ => 0xff,
            };
            self.prove(n, bytes, i);
        }
        if form.flags && !form.flags_overwritten && !self.flags {
            self.flags = true;
            self.flags_since = i as u8;
        }
        // A register whose zeroing was left out (`Skip::writes`) keeps its proof and what
        // it relies on: its written bytes were proven zero and stay so on this fast path,
        // the others are untouched. (Only registers the fast form writes are in it, and
        // only through `writes`, as `Proofs::skip` chose them.)
        for n in (0..16).filter(|n| written & !skip.writes & (1 << n) != 0) {
            self.proven[n] = 0;
        }
        for w in form.writes.iter().flatten() {
            let (n, bytes) = written_bytes(*w);
            if form.load.is_some_and(|l| l.n == n) || skip.writes & (1 << n) != 0 {
                continue; // the loaded bytes' shadow
            }
            // A whole register written zero relies on this fast path alone.
            if bytes == 0xff {
                self.proven[n as usize] = 0;
            }
            self.prove(n as usize, bytes, i);
        }
        if form.flags_overwritten && !skip.flags_write {
            // Left undefined-or-stale where the zeroing is dead (`flags_zero_dead`).
            self.flags = !flags_zero_dead;
            self.flags_since = i as u8;
        }
    }
}

/// The general registers `ins` writes any part of (bit n: register n in encoding order).
pub(super) fn gprs_written(ins: &iced_x86::Instruction) -> u16 {
    crate::probe::with_factory(|f| {
        let info = f.info_options(ins, iced_x86::InstructionInfoOptions::NO_MEMORY_USAGE);
        info.used_registers()
            .iter()
            .filter(|r| {
                !matches!(
                    r.access(),
                    iced_x86::OpAccess::Read
                        | iced_x86::OpAccess::CondRead
                        | iced_x86::OpAccess::None
                        | iced_x86::OpAccess::NoMemAccess
                )
            })
            .fold(0u16, |w, r| {
                let full = r.register().full_register();
                if full.is_gpr64() {
                    w | 1 << (full as u32 - Register::RAX as u32)
                } else {
                    w
                }
            })
    })
}

/// The register a write covers and its shadow bytes (bit i: byte i).
fn written_bytes(w: Written) -> (u8, u8) {
    match w {
        Written::Qword(n) => (n, 0xff),
        Written::Word(n) => (n, 0x03),
        Written::Byte(n) => (n, 0x01),
        Written::HighByte(n) => (n, 0x02),
    }
}

fn checked_zero(form: &FastForm, w: Written) -> bool {
    let (n, bytes) = written_bytes(w);
    form.reads & (1 << n) != 0
        && form.read_bytes[n as usize] & bytes == bytes
        && !form.load.is_some_and(|l| l.n == n)
}

/// Offset in the thread context of the first shadow byte a register write covers.
fn written_shadow_off(w: Written) -> u32 {
    let (n, at) = match w {
        Written::Qword(n) | Written::Word(n) | Written::Byte(n) => (n, 0),
        Written::HighByte(n) => (n, 1),
    };
    (c::OFF_VBITS_GPR + 8 * n as usize + at) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic};

    /// An out-of-line routine at `at`, decoded, and the indices of its two exits: it
    /// leaves by exactly two `jmp gs:[probe_ret]`, the first after `cmp` (done, ZF set),
    /// the second after `test` (slow, ZF clear).
    fn two_exits(code: &[u8], at: u64) -> (alloc::vec::Vec<iced_x86::Instruction>, [usize; 2]) {
        let mut dec = Decoder::with_ip(64, code, at, DecoderOptions::NONE);
        let insns: alloc::vec::Vec<_> = dec.iter().collect();
        let exits: alloc::vec::Vec<usize> = (0..insns.len())
            .filter(|&i| insns[i].flow_control() == FlowControl::IndirectBranch)
            .collect();
        assert_eq!(exits.len(), 2);
        for &i in &exits {
            assert_eq!(
                insns[i].memory_displacement64(),
                c::scratch_off(c::S_PROBE_RET) as u64
            );
            assert_eq!(insns[i].segment_prefix(), Register::GS);
        }
        assert_eq!(insns[exits[0] - 1].mnemonic(), Mnemonic::Cmp);
        assert_eq!(insns[exits[1] - 1].mnemonic(), Mnemonic::Test);
        (insns, [exits[0], exits[1]])
    }

    /// The catch-up routine's every branch stays inside it, and it leaves by exactly two
    /// `jmp gs:[probe_ret]`: after `cmp eax, eax` (done, ZF set) and after `test rsp, rsp`
    /// (slow, ZF clear), the latter the target of every conditional branch that leaves
    /// the work undone.
    #[test]
    fn catch_up_routine_leaves_by_its_two_exits() {
        let base = 0x7000_0000_0000u64;
        let code = catch_up_routine(base).unwrap();
        let (insns, exits) = two_exits(&code, base);
        let fail = insns[exits[1] - 1].ip();
        let mut to_fail = 0;
        for ins in &insns[..exits[1]] {
            if ins.flow_control() == FlowControl::ConditionalBranch {
                let t = ins.near_branch_target();
                assert!(
                    (base..base + code.len() as u64).contains(&t),
                    "{:?}",
                    ins.code()
                );
                to_fail += (t == fail) as usize;
            }
        }
        // The state missing, not the runtime's return address alone, outside one span,
        // above user space.
        assert_eq!(to_fail, 4);
        // The padding after the second exit is never reached.
        assert!(insns[exits[1] + 1..]
            .iter()
            .all(|i| i.mnemonic() == Mnemonic::Int3));
    }

    /// The stack-split routine lies at `CATCH_UP_ROOM` of the arena's routines, keeps every
    /// branch inside itself and leaves by exactly two `jmp gs:[probe_ret]`: done (ZF set by
    /// `cmp eax, eax`) and slow (ZF clear by `test rsp, rsp`), each with the program's
    /// `rcx` back (it is saved after the alignment check, whose jump skips its restore).
    #[test]
    fn stack_split_routine_leaves_by_its_two_exits_with_rcx_back() {
        let base = 0x7000_0000_0000u64;
        let all = definedness_routines(base).unwrap();
        let code = stack_split_routine();
        assert_eq!(&all[CATCH_UP_ROOM..], &code[..]);
        let at = base + CATCH_UP_ROOM as u64;
        let (insns, exits) = two_exits(&code, at);
        let restores_rcx = |i: &iced_x86::Instruction| {
            i.mnemonic() == Mnemonic::Mov
                && i.op0_register() == Register::RCX
                && i.memory_displacement64() == c::OFF_VBITS_SAVED_RCX as u64
        };
        assert!(restores_rcx(&insns[exits[0] - 2]));
        assert!(restores_rcx(&insns[exits[1] - 2]));
        let saves_rcx = insns
            .iter()
            .position(|i| i.mnemonic() == Mnemonic::Mov && i.op1_register() == Register::RCX)
            .unwrap();
        let fail = insns[exits[1] - 2].ip();
        let fail_rcx_kept = insns[exits[1] - 1].ip();
        for (n, ins) in insns[..exits[1]].iter().enumerate() {
            if matches!(
                ins.flow_control(),
                FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
            ) {
                let t = ins.near_branch_target();
                assert!(
                    (at..at + code.len() as u64).contains(&t),
                    "{:?}",
                    ins.code()
                );
                // Before rcx is saved only the alignment check leaves, past the restore.
                if n < saves_rcx {
                    assert_eq!(t, fail_rcx_kept);
                } else {
                    assert_ne!(t, fail_rcx_kept);
                }
            }
        }
        // The operand's and both ends' span bounds and chunks, the return address.
        let to_fail = insns
            .iter()
            .filter(|i| {
                i.flow_control() == FlowControl::ConditionalBranch && i.near_branch_target() == fail
            })
            .count();
        assert_eq!(to_fail, 6);
    }

    /// A fast form's stack marking takes the parameters the routine reads: the offset,
    /// the length and which operand (none for another operand: the slow path stays).
    #[test]
    fn split_parameters_encode_the_stack_plans() {
        let plan = |undefined, operand| StackAtOnce { undefined, operand };
        // call: [rsp-136, rsp-8) undefined, the return address written at rsp-8
        assert_eq!(
            split_params(plan((-136, 128), Some((-8, 8, false)))),
            Some(0xff78 | 128 << 16 | 1 << 28)
        );
        // ret: [rsp-120, rsp+8), the return address read at rsp
        assert_eq!(
            split_params(plan((-120, 128), Some((0, 8, true)))),
            Some(0xff88 | 128 << 16 | 2 << 28)
        );
        // sub rsp, 2048
        assert_eq!(
            split_params(plan((-2176, 2048), None)),
            Some((-2176i16) as u16 as u32 | 2048 << 16)
        );
        assert_eq!(split_params(plan((-136, 8), Some((-8, 4, false)))), None);
        assert_eq!(split_params(plan((-132, 8), None)), None);
    }

    /// A block entry jumps to the arena's routine when it is within reach, and carries
    /// the catch-up itself when there is none.
    #[test]
    fn block_entry_calls_the_routine_in_reach() {
        let base = 0x7000_0000_0000u64;
        let mut slow = SlowCall::new(0x1000, 0, false, false);
        let mut e = Emitter::new(0x1000, base + 0x1000, false);
        set_catch_up_routine(0);
        e.catch_up_inline(&mut slow).unwrap();
        let inline_len = e.buf.len();
        let mut slow = SlowCall::new(0x1000, 0, false, false);
        let mut e = Emitter::new(0x1000, base + 0x1000, false);
        set_catch_up_routine(base);
        e.catch_up_inline(&mut slow).unwrap();
        set_catch_up_routine(0);
        assert!(
            e.buf.len() < 64 && inline_len > 200,
            "{} {inline_len}",
            e.buf.len()
        );
        let dec = Decoder::with_ip(64, &e.buf, base + 0x1000, DecoderOptions::NONE);
        let jumps: alloc::vec::Vec<u64> = dec
            .into_iter()
            .filter(|i| i.mnemonic() == Mnemonic::Jmp)
            .map(|i| i.near_branch_target())
            .collect();
        assert_eq!(jumps, [base]);
        // (Here, not in a test of its own: both set the arenas' routine, a global.)
        block_entry_passes_on_one_compare_of_the_entry_word();
    }

    /// A block's entry tests the word of the three entry bytes (`vbits_need_step`,
    /// `vbits_own_code`, `vbits_signal`) with one compare and, when it is zero, jumps past
    /// everything else of the entry, with or without the catch-up routine in reach; when it
    /// is not, only the runtime's own code alone goes on to the catch-up, anything else to
    /// the slow call.
    fn block_entry_passes_on_one_compare_of_the_entry_word() {
        let base = 0x7000_0000_0000u64;
        for routine in [0, base] {
            let mut slow = SlowCall::new(0x1000, 0, false, false);
            let mut e = Emitter::new(0x1000, base + 0x1000, false);
            set_catch_up_routine(routine);
            e.catch_up_inline(&mut slow).unwrap();
            set_catch_up_routine(0);
            let insns: alloc::vec::Vec<Instruction> =
                Decoder::with_ip(64, &e.buf, base + 0x1000, DecoderOptions::NONE)
                    .into_iter()
                    .collect();
            let gs_qword_cmp = |i: &Instruction, imm: u64| {
                i.mnemonic() == Mnemonic::Cmp
                    && i.segment_prefix() == Register::GS
                    && i.memory_base() == Register::None
                    && i.memory_displacement64() == c::OFF_VBITS_ENTRY as u64
                    && i.memory_size() == iced_x86::MemorySize::UInt64
                    && i.immediate(1) == imm
            };
            assert!(
                gs_qword_cmp(&insns[0], 0),
                "{routine:x}: {:?}",
                insns[0].code()
            );
            assert_eq!(insns[1].mnemonic(), Mnemonic::Je, "{routine:x}");
            let end = base + 0x1000 + e.buf.len() as u64;
            assert_eq!(insns[1].near_branch_target(), end, "{routine:x}");
            let own_code_alone = 1u64 << (8 * (c::OFF_VBITS_OWN_CODE - c::OFF_VBITS_ENTRY));
            assert!(
                gs_qword_cmp(&insns[2], own_code_alone),
                "{:?}",
                insns[2].code()
            );
            assert_eq!(insns[3].mnemonic(), Mnemonic::Jne);
            if routine != 0 {
                // That jne and the one after the routine's return: nothing else goes slow.
                assert_eq!(slow.njumps, 2);
            }
        }
    }
}
