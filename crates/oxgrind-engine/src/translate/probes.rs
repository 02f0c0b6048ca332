//! Emitting a tool's probes (`oxgrind_tool::instrument::Plan`) before guest instructions.
//!
//! Inline where the work is small and fixed: per-thread counters, trace appends, the
//! shadow-map filter. Everything else is a clean call through the dispatcher (see
//! `probe`). The guest state is exact at the start and at the end of every probe; in
//! between, the guest `rax` is in the `STUB_RAX` scratch slot (the pc map says so), the
//! flags, where live, in `PROBE_FLAGS`, and `rcx`, while a record is written, in
//! `PROBE_RCX`. Nothing a probe does can fault, and an asynchronous signal arriving inside
//! one is delivered at the next guest instruction boundary, so these borrowed registers are
//! never seen by the program.

use iced_x86::{Instruction, OpAccess, Register, UsedMemory};
use oxgrind_tool::instrument::{Addressing, Probe, TraceKind, RED_ZONE};

use super::{ea_encodable, AboveSp, Emitter, ExactA, SlowCall, TranslateError, FIX_RAX_IN_STUB};
use crate::context as c;

/// Which of an instruction's access records a trace probe leaves out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TraceFilter {
    None,
    /// Those of accesses to unmarked granules of the shadow map.
    Shadow,
    /// Those of accesses to a line the recent-lines table names.
    RecentLines,
}

/// The out-of-line part of a filtered trace probe whose tests are inline
/// (`Emitter::trace_check_inline`): the hot ranges' counts, placed by
/// `Emitter::finish_trace_cold`.
pub(super) struct TraceCold {
    ip: u64,
    size: u32,
    kind: TraceKind,
    /// Per hot range, the position of the rel32 of its inline `jb`.
    to_count: [Option<usize>; oxgrind_tool::instrument::HOT_RANGES],
    /// Where the probe ends (guest state exact).
    after: usize,
}

/// The out-of-line part of an instruction's recent-lines check (see
/// `Emitter::check_recent_two_ways`), placed by `Emitter::finish_recent_cold`.
pub(super) struct RecentCold {
    m: UsedMemory,
    geometry: (u32, u32),
    tag: u32,
    word: u32,
    ip: u64,
    flags_live: bool,
    /// Position of the rel32 of the inline `jne`/`ja` taken when the first line differs
    /// or the access straddles two lines.
    to_second: usize,
    /// The inline check borrowed `rcx` (`PROBE_RCX`): the out-of-line part gives it back.
    rcx_borrowed: bool,
    /// Where the inline check ends: the instruction, guest state exact but for what
    /// `keep` keeps.
    back: usize,
    /// What of the borrow is kept over the instruction (`Emitter::carry`): every path
    /// back gives back the rest, and the drain call's return borrows again.
    keep: Keep,
}

/// What an inline probe leaves borrowed for the next instruction's (see
/// [`Emitter::check_recent_two_ways`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    /// Nothing: `rax` and the flags given back.
    No,
    /// `rax` (the guest's in its slot); the flags given back.
    Rax,
    /// `rax` and the flags, in their slots.
    RaxAndFlags,
}

impl Keep {
    /// The guest-state fix-up of code where this is kept.
    fn fix(self) -> u16 {
        match self {
            Keep::No => 0,
            Keep::Rax => FIX_RAX_IN_STUB,
            Keep::RaxAndFlags => FIX_RAX_IN_STUB | super::FIX_FLAGS_IN_SLOT,
        }
    }
}

/// The out-of-line part of a block's code-lines check of several ways (see
/// `Emitter::trace_block_new_lines_ways`), placed by `Emitter::finish_recent_cold`.
pub(super) struct BlockCold {
    pc: u64,
    tag: u32,
    /// The first and last line of the block's code.
    lines: (u64, u64),
    slots: u32,
    flags_live: bool,
    /// Per line: the position of the rel32 of its inline `jne`, and where the inline
    /// compares go on after it.
    jumps: alloc::vec::Vec<(usize, usize)>,
}

/// The bytes of operand `m` the recent-lines table considers: at most one line's.
fn recent_clamp(m: &UsedMemory, (shift, _): (u32, u32)) -> u64 {
    (m.memory_size().size() as u64).clamp(1, 1 << shift)
}

impl Emitter {
    /// Emits one probe before guest instruction `ins`.
    pub(super) fn probe(
        &mut self,
        p: &Probe,
        ins: &Instruction,
        flags_live: bool,
    ) -> Result<(), TranslateError> {
        let ip = ins.ip();
        let rec = match *p {
            Probe::Count { counter, n, .. } => {
                self.counter_bump(ip, c::OFF_COUNTERS + 8 * counter.0 as usize, n, flags_live);
                return Ok(());
            }
            Probe::TraceBlock { tag } => {
                self.trace_block(ip, tag, flags_live);
                return Ok(());
            }
            Probe::TraceBlockNewLines { tag, len } => {
                self.trace_block_new_lines(ip, tag, len, flags_live, None, false);
                return Ok(());
            }
            Probe::CountIndexed { index, n, .. }
            | Probe::CountIndexedIterations { index, n, .. } => {
                if (index as usize) < c::indexed_counters() {
                    self.count_indexed(ip, index, n, flags_live);
                }
                return Ok(());
            }
            Probe::TraceAccesses { tag, filtered, .. } => {
                let filter = if filtered {
                    TraceFilter::Shadow
                } else {
                    TraceFilter::None
                };
                return self.trace_accesses(ins, tag, filter, flags_live);
            }
            Probe::TraceNewLines { tag, .. } => {
                return self.trace_accesses(ins, tag, TraceFilter::RecentLines, flags_live);
            }
            Probe::Accesses { data, .. } => crate::probe::access_record(ins, data),
            Probe::AccessesFiltered { data, .. } => {
                return self.filtered_probe(ins, data, 0, flags_live);
            }
            Probe::AccessesFilteredOrBelowSp { data, depth, .. } => {
                crate::native_try::note_below_sp(depth);
                return self.filtered_probe(ins, data, depth, flags_live);
            }
            Probe::Pc { data, .. } => crate::probe::pc_record(ins, data),
        };
        if let Some(rec) = rec {
            self.clean_call(ip, rec);
        }
        Ok(()) // (no record: no memory access to report, or no memory for the record)
    }

    /// A filtered access probe (`below_sp`: see `filtered_call`): inline when every operand
    /// can be addressed inline, else a clean call each time.
    fn filtered_probe(
        &mut self,
        ins: &Instruction,
        data: u64,
        below_sp: u32,
        flags_live: bool,
    ) -> Result<(), TranslateError> {
        let ip = ins.ip();
        let Some(rec) = crate::probe::access_record(ins, data) else {
            return Ok(()); // no memory access, or no memory for the record
        };
        match self.inline_filter_operands(rec) {
            Some((mem, n)) => self.filtered_call(ip, rec, &mem[..n], below_sp, flags_live)?,
            None => self.clean_call(ip, rec),
        }
        Ok(())
    }

    /// The operands of access record `rec` when the shadow map exists and every operand
    /// can be addressed inline.
    fn inline_filter_operands(
        &self,
        rec: u64,
    ) -> Option<([UsedMemory; crate::probe::MAX_MEM], usize)> {
        if crate::shadow::base() == 0 {
            return None;
        }
        let (mem, n) = crate::probe::inline_operands(rec)?;
        mem[..n].iter().all(ea_encodable).then_some((mem, n))
    }

    /// A clean call with probe record `rec`: `mov gs:[STUB_RAX], rax; lea rax, [rip+back];
    /// mov gs:[PROBE_RET], rax; mov rax, rec; jmp gs:[probe_entry]; back:`.
    pub(super) fn clean_call(&mut self, ip: u64, rec: u64) {
        self.settle();
        self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.mark(ip, FIX_RAX_IN_STUB);
        self.buf.extend_from_slice(&[0x48, 0x8D, 0x05]);
        let lea_disp = self.buf.len();
        self.d32(0);
        self.store_gs(0, c::scratch_off(c::S_PROBE_RET));
        self.mov_imm64(0, rec);
        self.jmp_gs(c::OFF_PROBE_ENTRY);
        let back = self.buf.len();
        let rel = (back - (lea_disp + 4)) as u32;
        self.buf[lea_disp..lea_disp + 4].copy_from_slice(&rel.to_le_bytes());
        self.mark(ip, 0);
        // The call may have changed the guest `rax` (a client request's answer).
        self.stub_has_rax = false;
    }

    /// The block at `asm::oxg_run_native` (`crate::run_native`, reached by a `call` from the
    /// embedder's translated code): the call is made natively, on the engine stack, without
    /// entering the dispatcher. At a function's entry the ABI leaves the flags, the
    /// caller-saved registers and every vector register to the callee and guarantees the
    /// direction flag clear, so the guest state needs no saving beyond `rsp` and the
    /// general registers lent to the embedder (`asm::oxg_native_gate`); the dispatcher's
    /// full entry (flags, XSAVE state) cost more than the call itself for a short one
    /// (an allocator hook's event). `in_engine` defers signals meanwhile, as in a clean
    /// call; one that arrived is delivered by a dispatcher entry at `done` (the `ret`
    /// after the call). Right after a `fork` or during a `clone` the dispatcher has work
    /// of its own first: then the call is the clean call `rec`.
    ///
    /// `gate`: the routine called natively, `asm::oxg_native_gate` (for `oxg_run_native`) or
    /// `asm::oxg_native_entry_gate` (for `oxg_native_entry`, whose result the routine leaves
    /// in rax: the guest's rax from there on, kept on every path below).
    pub(super) fn native_gate_call(&mut self, pc: u64, rec: u64, done: u64, gate: u64) {
        // mov qword ptr gs:[in_engine], 1
        self.buf.extend_from_slice(&[0x65, 0x48, 0xC7, 0x04, 0x25]);
        self.d32(c::OFF_IN_ENGINE as u32);
        self.d32(1);
        let mut to_slow = [0usize; 2];
        for (i, off) in [c::OFF_FORKED, c::OFF_PENDING_CHILD]
            .into_iter()
            .enumerate()
        {
            self.cmp_gs_zero(off);
            self.buf.extend_from_slice(&[0x0F, 0x85]); // jne slow
            to_slow[i] = self.buf.len();
            self.d32(0);
        }
        self.store_gs(4, c::greg_off(c::RSP));
        self.load_gs(4, c::OFF_ESTACK);
        self.mov_imm64(0, gate);
        self.buf.extend_from_slice(&[0xFF, 0xD0]); // call rax
        self.load_gs(4, c::greg_off(c::RSP));
        // mov qword ptr gs:[in_engine], 0
        self.buf.extend_from_slice(&[0x65, 0x48, 0xC7, 0x04, 0x25]);
        self.d32(c::OFF_IN_ENGINE as u32);
        self.d32(0);
        self.cmp_gs_zero(c::OFF_PENDING_SIGNALS);
        self.buf.extend_from_slice(&[0x0F, 0x84]); // je end
        let to_end = self.buf.len();
        self.d32(0);
        // A signal arrived: enter the dispatcher to continue at `done`; it raises the
        // signal on its way out.
        self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.mov_imm64(0, done);
        self.jmp_gs(c::OFF_DISPATCH);
        let slow = self.buf.len();
        for at in to_slow {
            let rel = (slow - (at + 4)) as u32;
            self.buf[at..at + 4].copy_from_slice(&rel.to_le_bytes());
        }
        // The vector registers are the caller's to lose, and the dispatcher leaves them
        // alone (mov qword gs:[vectors_dead], 1).
        self.buf.extend_from_slice(&[0x65, 0x48, 0xC7, 0x04, 0x25]);
        self.d32(c::OFF_VECTORS_DEAD as u32);
        self.d32(1);
        self.clean_call(pc, rec);
        let end = self.buf.len();
        let rel = (end - (to_end + 4)) as u32;
        self.buf[to_end..to_end + 4].copy_from_slice(&rel.to_le_bytes());
        // The routine's result is the guest `rax` from here on.
        self.stub_has_rax = false;
    }

    /// cmp qword ptr gs:[off], 0
    fn cmp_gs_zero(&mut self, off: usize) {
        self.buf.extend_from_slice(&[0x65, 0x48, 0x83, 0x3C, 0x25]);
        self.d32(off as u32);
        self.buf.push(0);
    }

    /// Adds `n` to the thread's counter at context offset `off`: one `add` when the flags
    /// are dead, else a flag-free load/`lea`/store through `rax`. No lock: the counter is
    /// this thread's own.
    fn counter_bump(&mut self, ip: u64, off: usize, n: u32, flags_live: bool) {
        if !flags_live {
            // add qword ptr gs:[off], n
            self.buf.extend_from_slice(&[0x65, 0x48, 0x81, 0x04, 0x25]);
            self.d32(off as u32);
            self.d32(n);
            return;
        }
        self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.mark(ip, FIX_RAX_IN_STUB);
        self.load_gs(0, off);
        self.buf.extend_from_slice(&[0x48, 0x8D, 0x80]); // lea rax, [rax+n]
        self.d32(n);
        self.store_gs(0, off);
        self.load_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.mark(ip, 0);
    }

    /// Adds `n` to the thread's indexed counter `index`, through `gs:[INDEXED_AT]` (its own
    /// counters, or the scratch array under a hold): `add qword [rax + index*8], n` where
    /// the flags are dead, else a flag-free load/`lea`/store through a borrowed `rcx`.
    fn count_indexed(&mut self, ip: u64, index: u32, n: u32, flags_live: bool) {
        self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.mark(ip, FIX_RAX_IN_STUB);
        self.load_gs(0, c::OFF_INDEXED_AT);
        let disp = index * 8;
        if !flags_live {
            self.buf.extend_from_slice(&[0x48, 0x81, 0x80]); // add qword [rax+disp32], n
            self.d32(disp);
            self.d32(n);
        } else {
            self.store_gs(1, c::OFF_PROBE_RCX);
            self.buf.extend_from_slice(&[0x48, 0x8B, 0x88]); // mov rcx, [rax+disp32]
            self.d32(disp);
            self.buf.extend_from_slice(&[0x48, 0x8D, 0x89]); // lea rcx, [rcx+n]
            self.d32(n);
            self.buf.extend_from_slice(&[0x48, 0x89, 0x88]); // mov [rax+disp32], rcx
            self.d32(disp);
            self.load_gs(1, c::OFF_PROBE_RCX);
        }
        self.load_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.mark(ip, 0);
    }

    /// Saves the guest `rax` (and the flags, where live) before inline probe work.
    /// Takes over a borrow the inline part before kept (`Emitter::keep_borrow`) when it
    /// saved the same flags, or saved flags that are dead here.
    pub(super) fn borrow_rax(&mut self, ip: u64, flags_live: bool) {
        if let Some((kept_flags, kept_ip)) = self.kept {
            if kept_ip == ip && (kept_flags == flags_live || kept_flags) {
                // The same borrow, or one that saved flags which are dead here (nothing
                // reads them before they are overwritten: their slot is left as it is).
                self.kept = None;
                return;
            }
            if !kept_flags && kept_ip == ip {
                // `rax` alone is kept (the guest's in its slot): only the flags to save.
                self.kept = None;
                self.save_probe_flags();
                return;
            }
            self.settle();
        }
        if self.stub_has_rax {
            // The slot holds the guest `rax` already (`Emitter::stub_has_rax`), and `rax`
            // itself still does: no borrow was in force.
            self.mark(ip, FIX_RAX_IN_STUB);
            self.rax_guest_at = self.buf.len();
            if flags_live {
                self.save_probe_flags();
            }
            return;
        }
        self.borrow_again(ip, flags_live);
    }

    /// `lahf; seto al; mov gs:[PROBE_FLAGS], rax` (the guest `rax` in its slot).
    fn save_probe_flags(&mut self) {
        self.buf.extend_from_slice(&[0x9F, 0x0F, 0x90, 0xC0]); // lahf; seto al
        self.store_gs(0, c::scratch_off(c::S_PROBE_FLAGS));
    }

    /// Gives back what [`Emitter::borrow_rax`] took but what `keep` keeps for the next
    /// instruction's probe (see [`Emitter::check_recent_two_ways`]).
    fn give_back(&mut self, flags_live: bool, keep: Keep) {
        match keep {
            Keep::No => self.return_rax(flags_live),
            Keep::Rax if flags_live => self.restore_probe_flags(),
            Keep::Rax | Keep::RaxAndFlags => {}
        }
    }

    /// The stores of a borrow, whatever was kept: `rax` (and the flags, when live) to their
    /// scratch slots, the guest state at `ip` from here on with `rax` in its slot.
    pub(super) fn borrow_again(&mut self, ip: u64, flags_live: bool) {
        self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.stub_has_rax = true;
        self.rax_guest_at = self.buf.len();
        self.mark(ip, FIX_RAX_IN_STUB);
        if flags_live {
            self.save_probe_flags();
        }
    }

    /// Gives back what [`Emitter::borrow_rax`] took.
    pub(super) fn return_rax(&mut self, flags_live: bool) {
        if flags_live {
            self.restore_probe_flags();
        }
        self.load_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.stub_has_rax = true;
        self.rax_guest_at = self.buf.len();
    }

    /// `mov rax, gs:[PROBE_FLAGS]; add al, 0x7f; sahf`: the flags `lahf; seto al` saved.
    pub(super) fn restore_probe_flags(&mut self) {
        self.load_gs(0, c::scratch_off(c::S_PROBE_FLAGS));
        self.buf.extend_from_slice(&[0x04, 0x7F, 0x9E]);
    }

    /// Appends a block record (`pc`, `tag`) to the thread's trace buffer.
    fn trace_block(&mut self, pc: u64, tag: u32, flags_live: bool) {
        self.borrow_rax(pc, flags_live);
        self.append_block(pc, tag, flags_live);
    }

    /// Most code lines a block's inline check compares; a longer block always appends.
    pub(super) const MAX_CHECKED_CODE_LINES: u64 = 4;

    /// A block record (`pc`, `tag`) unless the code-lines table names every line of the
    /// block's `len` bytes of code (see `recent_lines`); a record first makes the lines'
    /// slots name them. The lines are known now: each check is an immediate compare.
    ///
    /// ```text
    ///     (save rax, flags)
    ///     mov rax, line; cmp gs:[CODE_LINES + slot*8], rax; jne new      (each line)
    ///     (restore rax, flags); jmp done
    /// new:
    ///     mov rax, line; mov gs:[CODE_LINES + slot*8], rax               (each line)
    ///     append the record (restores rax, flags)
    /// done:
    /// ```
    /// `count`: an indexed counter `(index, n)` to add to first (a `CountIndexed` probe of the
    /// same instruction, sharing the borrow). `keep`: a recent-lines access check of the
    /// same instruction follows, which may take the borrow over (two-way table only; see
    /// [`Emitter::trace_block_new_lines_two_ways`]).
    pub(super) fn trace_block_new_lines(
        &mut self,
        pc: u64,
        tag: u32,
        len: u32,
        flags_live: bool,
        count: Option<(u32, u32)>,
        keep: bool,
    ) {
        use crate::recent_lines::Table;
        let count = count.filter(|&(index, _)| (index as usize) < c::indexed_counters());
        let Some((shift, slots)) = crate::recent_lines::geometry(Table::Code) else {
            if let Some((index, n)) = count {
                self.count_indexed(pc, index, n, flags_live);
            }
            return self.trace_block(pc, tag, flags_live);
        };
        let first = pc >> shift;
        let last = pc.wrapping_add(u64::from(len.max(1)) - 1) >> shift;
        if crate::recent_lines::code_ways() >= 2 {
            return self.trace_block_new_lines_ways(
                pc,
                tag,
                (first, last),
                slots,
                flags_live,
                count,
                keep,
            );
        }
        let slot_off =
            |line: u64| (Table::Code.offset() as u64 + 8 * (line & u64::from(slots - 1))) as u32;
        self.borrow_rax(pc, flags_live);
        if let Some((index, n)) = count {
            // add qword [gs:[INDEXED_AT] + index*8], n (the flags are saved where live)
            self.load_gs(0, c::OFF_INDEXED_AT);
            self.buf.extend_from_slice(&[0x48, 0x81, 0x80]);
            self.d32(index * 8);
            self.d32(n);
        }
        let checked = last.wrapping_sub(first) < Self::MAX_CHECKED_CODE_LINES;
        let mut new = [0usize; Self::MAX_CHECKED_CODE_LINES as usize];
        let mut done = None;
        if checked {
            for (k, line) in (first..=last).enumerate() {
                self.mov_imm64(0, line);
                // cmp gs:[disp32], rax
                self.buf.extend_from_slice(&[0x65, 0x48, 0x39, 0x04, 0x25]);
                self.d32(slot_off(line));
                self.buf.extend_from_slice(&[0x0F, 0x85]); // jne new
                new[k] = self.buf.len();
                self.d32(0);
            }
            self.return_rax(flags_live);
            self.buf.push(0xE9); // jmp done
            done = Some(self.buf.len());
            self.d32(0);
            for &j in &new[..(last - first + 1) as usize] {
                self.patch_rel32(j);
            }
        }
        // The slots of every line, in address order (a later line wins a shared slot).
        let mut line = first;
        loop {
            self.mov_imm64(0, line);
            self.store_gs(0, slot_off(line) as usize);
            if line == last {
                break;
            }
            line = line.wrapping_add(1);
        }
        self.append_block(pc, tag, flags_live);
        if let Some(j) = done {
            self.patch_rel32(j);
        }
    }

    /// [`Emitter::trace_block_new_lines`] for a code-lines table of `ways` lines per slot in
    /// most-recently-used order (`recent_lines::code_ways`; way `w` of slot `s` at word
    /// `w * slots + s`, way 0 where a one-way table keeps its line). Inline only the compare
    /// of each line with its slot's way 0 (a block entered again: most entries), falling
    /// through to the block; the rest out of line after the stubs
    /// ([`Emitter::finish_recent_cold`], [`Emitter::block_cold_ways`]): a line found at way
    /// `w` moves there from way 0 (the `w` lines before it one way down); a line not found
    /// appends a code-miss record naming the slot's last line (`TraceRecord::code_miss`),
    /// which leaves as the line is put at way 0. No block record: the tool counts the
    /// block's runs inline.
    ///
    /// ```text
    ///     (save rax, flags)
    ///     mov rax, line; cmp gs:[WAY0+slot*8], rax; jne <cold k>; next k:       (each line)
    ///     (restore rax, flags)
    /// back:
    /// ```
    ///
    /// With `keep` (the instruction's recent-lines access check follows), the inline
    /// compares end with `rax` and the flags still borrowed (`self.kept`), so that the
    /// access check's [`Emitter::borrow_rax`] takes them over. The out-of-line record gives
    /// them back in its drain check (a drain's call needs the guest state exact) and
    /// borrows them again.
    #[allow(clippy::too_many_arguments)]
    fn trace_block_new_lines_ways(
        &mut self,
        pc: u64,
        tag: u32,
        (first, last): (u64, u64),
        slots: u32,
        flags_live: bool,
        count: Option<(u32, u32)>,
        keep: bool,
    ) {
        use crate::recent_lines::Table;
        let mask = u64::from(slots - 1);
        let first_off = |line: u64| (Table::Code.offset() as u64 + 8 * (line & mask)) as u32;
        self.borrow_rax(pc, flags_live);
        if let Some((index, n)) = count {
            // add qword [gs:[INDEXED_AT] + index*8], n (the flags are saved where live)
            self.load_gs(0, c::OFF_INDEXED_AT);
            self.buf.extend_from_slice(&[0x48, 0x81, 0x80]);
            self.d32(index * 8);
            self.d32(n);
        }
        let mut jumps = alloc::vec::Vec::with_capacity((last - first + 1) as usize);
        for line in first..=last {
            self.mov_imm64(0, line);
            self.buf.extend_from_slice(&[0x65, 0x48, 0x39, 0x04, 0x25]); // cmp gs:[WAY0], rax
            self.d32(first_off(line));
            self.buf.extend_from_slice(&[0x0F, 0x85]); // jne <cold k>
            let j = self.buf.len();
            self.d32(0);
            jumps.push((j, self.buf.len()));
        }
        if keep {
            self.kept = Some((flags_live, pc));
        } else {
            self.return_rax(flags_live);
            self.mark(pc, 0);
        }
        self.block_cold.push(BlockCold {
            pc,
            tag,
            lines: (first, last),
            slots,
            flags_live,
            jumps,
        });
    }

    /// The out-of-line part of one [`Emitter::trace_block_new_lines_ways`], per line `k`
    /// (`rax` = the line, borrowed with the flags):
    ///
    /// ```text
    /// cold k:
    ///     cmp gs:[WAY w], rax; je h_w                                  (w = 1 .. ways-1)
    ///     save rcx; rcx = gs:[WAY ways-1]
    ///     record (rcx, tag, k | CODE_MISS << 24) at gs:[TRACE_PTR]; rcx back
    ///     move the trace pointer on; drain check (gives back rax, flags); borrow again
    /// h_{ways-1} .. h_1:
    ///     mov rax, gs:[WAY w-1]; mov gs:[WAY w], rax                   (falls through)
    ///     mov rax, line; mov gs:[WAY0], rax; jmp <next k>
    /// ```
    fn block_cold_ways(&mut self, d: &BlockCold) {
        use crate::recent_lines::Table;
        let ways = u64::from(crate::recent_lines::code_ways());
        let mask = u64::from(d.slots - 1);
        let slots = u64::from(d.slots);
        let way = |w: u64, line: u64| {
            (Table::Code.offset() as u64 + 8 * (w * slots + (line & mask))) as u32
        };
        let (first, last) = d.lines;
        for (k, line) in (first..=last).enumerate() {
            self.patch_rel32(d.jumps[k].0);
            let mut hits = [0usize; crate::recent_lines::MAX_CODE_WAYS as usize];
            for w in 1..ways {
                self.buf.extend_from_slice(&[0x65, 0x48, 0x39, 0x04, 0x25]); // cmp gs:[WAY w], rax
                self.d32(way(w, line));
                self.buf.extend_from_slice(&[0x0F, 0x84]); // je h_w
                hits[w as usize] = self.buf.len();
                self.d32(0);
            }
            // Not named: the record of the line that leaves (the last way's).
            self.store_gs(1, c::OFF_PROBE_RCX);
            self.load_gs(1, way(ways - 1, line) as usize);
            self.load_gs(0, c::OFF_TRACE_PTR);
            self.buf.extend_from_slice(&[0x48, 0x89, 0x08]); // mov [rax], rcx
            self.buf.extend_from_slice(&[0xC7, 0x40, 0x08]); // mov dword [rax+8], tag
            self.d32(d.tag);
            self.buf.extend_from_slice(&[0xC7, 0x40, 0x0C]); // mov dword [rax+12], k | MISS
            self.d32(k as u32 | u32::from(oxgrind_tool::instrument::CODE_MISS) << 24);
            self.load_gs(1, c::OFF_PROBE_RCX);
            self.finish_block_record(d.pc, d.flags_live);
            self.borrow_again(d.pc, d.flags_live);
            // Every way moves down one (the last one's line left), the line to way 0.
            for w in (1..ways).rev() {
                self.patch_rel32(hits[w as usize]);
                self.load_gs(0, way(w - 1, line) as usize);
                self.store_gs(0, way(w, line) as usize);
            }
            self.mov_imm64(0, line);
            self.store_gs(0, way(0, line) as usize);
            self.jmp_to(d.jumps[k].1);
        }
    }

    /// The body of [`Emitter::trace_block`], `rax` (and the flags) already borrowed.
    fn append_block(&mut self, pc: u64, tag: u32, flags_live: bool) {
        self.write_block_record(pc, tag);
        self.finish_block_record(pc, flags_live);
    }

    /// Writes a block record at the trace pointer, which it leaves in `rax`.
    fn write_block_record(&mut self, pc: u64, tag: u32) {
        self.load_gs(0, c::OFF_TRACE_PTR);
        // mov dword [rax], lo; mov dword [rax+4], hi; mov dword [rax+8], tag;
        // mov dword [rax+12], 0 (size 0, kind Block)
        self.buf.extend_from_slice(&[0xC7, 0x00]);
        self.d32(pc as u32);
        self.buf.extend_from_slice(&[0xC7, 0x40, 0x04]);
        self.d32((pc >> 32) as u32);
        self.buf.extend_from_slice(&[0xC7, 0x40, 0x08]);
        self.d32(tag);
        self.buf.extend_from_slice(&[0xC7, 0x40, 0x0C]);
        self.d32((TraceKind::Block as u32) << 16);
    }

    /// After [`Emitter::write_block_record`]: moves the trace pointer past the record and
    /// checks it against the drain mark (gives back `rax` and the flags).
    fn finish_block_record(&mut self, pc: u64, flags_live: bool) {
        self.buf.extend_from_slice(&[0x48, 0x8D, 0x40, 0x10]); // lea rax, [rax+16]
        self.store_gs(0, c::OFF_TRACE_PTR);
        self.drain_when_full(pc, flags_live);
    }

    /// Appends a record per memory access of `ins`, but for those `filter` skips. Operands
    /// the inline code cannot address (gathers, masked vector accesses, 32-bit addressing)
    /// go through a clean call that appends the same records from Rust (never skipping a
    /// recent line's), except that the recent-lines filter takes a masked access whole,
    /// inline (its contract: what a cache simulator wants is the lines, not the lanes).
    /// With a recent-lines table every record also updates it.
    fn trace_accesses(
        &mut self,
        ins: &Instruction,
        tag: u32,
        filter: TraceFilter,
        flags_live: bool,
    ) -> Result<(), TranslateError> {
        let ip = ins.ip();
        let filtered = filter == TraceFilter::Shadow;
        let recent = crate::recent_lines::geometry(crate::recent_lines::Table::Data);
        let Some(rec) = crate::probe::trace_record(ins, tag, filtered) else {
            return Ok(()); // no memory access
        };
        if filtered && recent.is_none() && crate::shadow::base() != 0 {
            let opmask = crate::probe::inline_opmask_operand(rec).filter(|o| ea_encodable(&o.0));
            if let Some(operand) = opmask {
                return self.trace_opmask_access(ip, rec, operand, tag, flags_live);
            }
        }
        let masked_lanes = ins.has_op_mask() && filter != TraceFilter::RecentLines;
        let inline = if masked_lanes || (filtered && crate::shadow::base() == 0) {
            None
        } else {
            crate::probe::inline_operands(rec).filter(|(mem, n)| mem[..*n].iter().all(ea_encodable))
        };
        let Some((mem, n)) = inline else {
            self.clean_call(ip, rec);
            return Ok(());
        };
        if filtered && recent.is_none() && tag == 0 && crate::trace_checks::ready() {
            let routines = mem[..n].iter().map(|m| {
                let size = m.memory_size().size() as u32;
                crate::trace_checks::index(size, crate::trace_checks::kind_of(m), flags_live)
            });
            let mut k = [0usize; crate::probe::MAX_MEM];
            if routines
                .zip(k.iter_mut())
                .all(|(r, slot)| r.map(|r| *slot = r).is_some())
            {
                self.settle();
                for (m, &k) in mem[..n].iter().zip(k.iter()) {
                    let size = m.memory_size().size() as u32;
                    let kind = crate::trace_checks::kind_of(m);
                    match crate::trace_checks::index_append(size, kind) {
                        Some(append) if !flags_live => {
                            self.trace_check_inline(m, append, kind, ip)?
                        }
                        _ => self.trace_check_call(m, k, ip)?,
                    }
                }
                return Ok(());
            }
        }
        self.borrow_rax(ip, flags_live);
        // A lone operand skipped leaves the probe at once: no record, no drain check.
        let mut skipped_out = None;
        // The rel32s of a lone filtered operand's paths that append nothing (not in the
        // shadow map, or counted in a hot range): aimed past the drain check, as the trace
        // pointer did not move.
        let mut appended_nothing: [Option<usize>; oxgrind_tool::instrument::HOT_RANGES + 1] =
            [None; oxgrind_tool::instrument::HOT_RANGES + 1];
        for m in &mem[..n] {
            let kind = match m.access() {
                OpAccess::Read | OpAccess::CondRead => TraceKind::Read,
                OpAccess::Write | OpAccess::CondWrite => TraceKind::Write,
                _ => TraceKind::Modify,
            };
            let size = (m.memory_size().size() as u32).min(u16::MAX as u32);
            let word = size | (kind as u32) << 16;
            if filtered {
                let counted = if crate::trace::hot_enabled() {
                    self.hot_range_counts(m, kind, ip)?
                } else {
                    [None; oxgrind_tool::instrument::HOT_RANGES]
                };
                let mut to_append = [0usize; 3];
                let nj = self.shadow_checks(m, ip, 0, &mut to_append, false)?;
                // jmp skip (rel32), patched below
                self.buf.push(0xE9);
                let skip = self.buf.len();
                self.d32(0);
                let append = self.buf.len();
                for &j in &to_append[..nj] {
                    let rel = append as i64 - (j as i64 + 4);
                    self.buf[j..j + 4].copy_from_slice(&(rel as i32).to_le_bytes());
                }
                if let Some(g) = recent {
                    self.note_recent_lines(m, g, ip)?;
                }
                self.effective_address(m, 0, ip)?;
                self.append_access(tag, word);
                if n == 1 {
                    appended_nothing[0] = Some(skip);
                    appended_nothing[1..].copy_from_slice(&counted);
                } else {
                    self.patch_rel32(skip);
                    for j in counted.into_iter().flatten() {
                        self.patch_rel32(j);
                    }
                }
            } else if let (Some(g), TraceFilter::RecentLines) = (recent, filter) {
                let routines = RECENT_ROUTINES.load(core::sync::atomic::Ordering::Relaxed);
                if n == 1 && crate::recent_lines::two_ways() && routines != 0 {
                    // The whole probe but its check is out of line (the arena's shared
                    // routine): no drain check here.
                    return self.check_recent_two_ways(m, g, tag, word, ip, flags_live);
                }
                let leave = (n == 1).then_some(flags_live);
                skipped_out = if crate::recent_lines::two_ways() {
                    self.append_unless_recent_two_ways(m, g, tag, word, ip, leave)?
                } else {
                    self.append_unless_recent(m, g, tag, word, ip, leave)?
                };
            } else {
                if let Some(g) = recent {
                    self.note_recent_lines(m, g, ip)?;
                }
                self.effective_address(m, 0, ip)?;
                self.append_access(tag, word);
            }
        }
        let give_back = self.drain_when_full(ip, flags_live);
        for j in appended_nothing.into_iter().flatten() {
            let rel = give_back as i64 - (j as i64 + 4);
            self.buf[j..j + 4].copy_from_slice(&(rel as i32).to_le_bytes());
        }
        if let Some(j) = skipped_out {
            self.patch_rel32(j);
        }
        Ok(())
    }

    /// The filtered trace probe of operand `m` as a call of shared routine `k`
    /// (`trace_checks`): `mov gs:[STUB_RAX], rax; lea rax, [m]; lea rsp, [rsp-128];
    /// call gs:[trace_checks + 8k]`, the return address beyond the guest's red zone. The
    /// routine gives back `rax`, `rsp` and the flags; a drain returns to the same place,
    /// where the guest state is exact.
    fn trace_check_call(
        &mut self,
        m: &UsedMemory,
        k: usize,
        ip: u64,
    ) -> Result<(), TranslateError> {
        self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.trace_routine_call(m, k, ip)?;
        self.mark(ip, 0);
        Ok(())
    }

    /// The call of `trace_checks` routine `k` with `rax` (already saved) holding operand
    /// `m`'s address: `lea rax, [m]; lea rsp, [rsp - 128]; call gs:[trace_checks + 8k]`.
    fn trace_routine_call(
        &mut self,
        m: &UsedMemory,
        k: usize,
        ip: u64,
    ) -> Result<(), TranslateError> {
        self.mark(ip, FIX_RAX_IN_STUB);
        self.effective_address(m, 0, ip)?;
        let skip = crate::trace_checks::RED_ZONE_SKIP;
        self.buf
            .extend_from_slice(&[0x48, 0x8D, 0x64, 0x24, skip.wrapping_neg()]);
        self.buf.extend_from_slice(&[0x65, 0xFF, 0x14, 0x25]);
        self.d32((c::OFF_TRACE_CHECKS + 8 * k) as u32);
        Ok(())
    }

    /// The filtered trace probe of operand `m` where the flags are dead, with its tests
    /// inline: the hot ranges (an access counted there makes no record) and the shadow byte
    /// of the first byte's granule (what decides a record, see `trace_checks::routine`);
    /// only an access to be recorded calls routine `k` (`trace_checks`, one that only
    /// appends). The cheap outcomes stay in the block: a call and its return per access
    /// (every access of a loop over a hot block) made `compute` under DHAT 1.6 times as
    /// slow as this.
    ///
    /// ```text
    ///     mov gs:[STUB_RAX], rax; lea rax, [m]
    ///     [per hot range: sub rax, gs:[step]; cmp rax, gs:[len]; jb <count r>
    ///      add rax, gs:[hot[last].lo]]                    (the address again)
    ///     shr rax, 3; add rax, gs:[shadow]; cmp byte [rax], 0; jne record
    ///     mov rax, gs:[STUB_RAX]; jmp after
    /// record:
    ///     lea rax, [m]; lea rsp, [rsp - 128]; call gs:[trace_checks + 8k]
    /// after:
    /// (out of line, after the stubs: `finish_trace_cold`)
    /// <count r>:
    ///     add gs:[hot[r].read_bytes / write_bytes], size; mov rax, gs:[STUB_RAX]; jmp after
    /// ```
    fn trace_check_inline(
        &mut self,
        m: &UsedMemory,
        k: usize,
        kind: TraceKind,
        ip: u64,
    ) -> Result<(), TranslateError> {
        const RANGE: usize = core::mem::size_of::<oxgrind_tool::instrument::HotRange>();
        const TEST: usize = core::mem::size_of::<crate::trace::HotTest>();
        const RANGES: usize = oxgrind_tool::instrument::HOT_RANGES;
        self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.mark(ip, FIX_RAX_IN_STUB);
        self.effective_address(m, 0, ip)?;
        let mut to_count = [None; RANGES];
        if crate::trace::hot_enabled() {
            for (r, j) in to_count.iter_mut().enumerate() {
                let test = c::OFF_HOT_TESTS + r * TEST;
                // sub rax, gs:[step]; cmp rax, gs:[len]; jb <count r>
                self.buf.extend_from_slice(&[0x65, 0x48, 0x2B, 0x04, 0x25]);
                self.d32(test as u32);
                self.buf.extend_from_slice(&[0x65, 0x48, 0x3B, 0x04, 0x25]);
                self.d32((test + 8) as u32);
                self.buf.extend_from_slice(&[0x0F, 0x82]);
                *j = Some(self.buf.len());
                self.d32(0);
            }
            // add rax, gs:[hot[last].lo] (`trace::sync_hot_tests`: the steps add up to it)
            self.buf.extend_from_slice(&[0x65, 0x48, 0x03, 0x04, 0x25]);
            self.d32((c::OFF_HOT + (RANGES - 1) * RANGE) as u32);
        }
        self.buf.extend_from_slice(&[0x48, 0xC1, 0xE8, 0x03]); // shr rax, 3
        self.buf.extend_from_slice(&[0x65, 0x48, 0x03, 0x04, 0x25]); // add rax, gs:[shadow]
        self.d32(c::OFF_SHADOW as u32);
        self.buf.extend_from_slice(&[0x80, 0x38, 0x00]); // cmp byte [rax], 0
        self.buf.extend_from_slice(&[0x75, 0x00]); // jne record (rel8)
        let to_record = self.buf.len() - 1;
        self.load_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.mark(ip, 0);
        self.buf.extend_from_slice(&[0xEB, 0x00]); // jmp after (rel8)
        let to_after = self.buf.len() - 1;
        self.buf[to_record] = (self.buf.len() - (to_record + 1)) as u8;
        self.trace_routine_call(m, k, ip)?;
        // The routine's return (or its drain's) is at the instruction, state exact.
        self.buf[to_after] = (self.buf.len() - (to_after + 1)) as u8;
        let after = self.buf.len();
        self.mark(ip, 0);
        if to_count.iter().any(Option::is_some) {
            self.trace_cold.push(TraceCold {
                ip,
                size: m.memory_size().size() as u32,
                kind,
                to_count,
                after,
            });
        }
        Ok(())
    }

    /// Places the out-of-line parts of [`Emitter::trace_check_inline`] (after the stubs):
    /// the hot ranges' counts.
    pub(super) fn finish_trace_cold(&mut self) {
        const RANGE: usize = core::mem::size_of::<oxgrind_tool::instrument::HotRange>();
        for t in core::mem::take(&mut self.trace_cold) {
            let counts: &[usize] = match t.kind {
                TraceKind::Read => &[16],
                TraceKind::Write => &[24],
                _ => &[16, 24],
            };
            for (r, j) in t.to_count.iter().enumerate() {
                let Some(j) = *j else { continue };
                let at = self.buf.len();
                self.push_map_at(at, t.ip, FIX_RAX_IN_STUB);
                self.patch_rel32(j);
                for &off in counts {
                    // add qword ptr gs:[hot[r] + off], size
                    self.buf.extend_from_slice(&[0x65, 0x48, 0x81, 0x04, 0x25]);
                    self.d32((c::OFF_HOT + r * RANGE + off) as u32);
                    self.d32(t.size);
                }
                self.load_gs(0, c::scratch_off(c::S_STUB_RAX));
                self.mark(t.ip, 0);
                self.jmp_to(t.after);
            }
        }
        self.unmark();
    }

    /// A shadow-filtered trace probe on an operand masked element by element by an opmask
    /// register (`probe::inline_opmask_operand`), inline for the common mask, a run of
    /// enabled elements from the first (glibc's AVX-512 string functions load and store
    /// their tails so): when a granule of the whole operand is marked, one record of the
    /// run's bytes, as the clean call would append; a mask of any other shape takes the
    /// clean call. (The filter looks at the whole operand: a run whose own granules are
    /// all unmarked may still be recorded, as an access outside every live block.)
    ///
    /// ```text
    ///     shadow checks of the whole operand -> marked;  jmp done
    /// marked:
    ///     save rcx; kmov rax, k; [and eax, (1 << elems) - 1]
    ///     lea rcx, [rax+1]; test rcx, rax; jnz other     (not a run from element 0)
    ///     popcnt rax, rax; jz none; shl rax, log2(elem); or eax, kind << 16
    ///     rcx = trace ptr; mov [rcx+12], eax; restore rcx
    ///     rax = address; append it and the tag; jmp done
    /// none:  restore rcx; jmp done
    /// other: restore rcx; jmp <clean call>
    /// done:  drain check, rax and flags back
    /// ```
    fn trace_opmask_access(
        &mut self,
        ip: u64,
        rec: u64,
        (m, elems, elem, mask): (UsedMemory, u8, u8, Register),
        tag: u32,
        flags_live: bool,
    ) -> Result<(), TranslateError> {
        let kind = match m.access() {
            OpAccess::Read | OpAccess::CondRead => TraceKind::Read,
            OpAccess::Write | OpAccess::CondWrite => TraceKind::Write,
            _ => TraceKind::Modify,
        };
        self.borrow_rax(ip, flags_live);
        let mut marked = [0usize; 3];
        let nj = self.shadow_checks(&m, ip, 0, &mut marked, false)?;
        self.buf.push(0xE9); // jmp done
        let mut to_done = [self.buf.len(), 0, 0];
        self.d32(0);
        for &j in &marked[..nj] {
            self.patch_rel32(j);
        }
        self.store_gs(1, c::OFF_PROBE_RCX);
        let k = mask.number() as u8 & 7;
        match elems {
            // kmovw eax, k (AVX-512F); kmovd eax, k and kmovq rax, k (AVX-512BW, which
            // byte and word elements, the only ones with more than 16, imply).
            0..=16 => self.buf.extend_from_slice(&[0xC5, 0xF8, 0x93, 0xC0 | k]),
            17..=32 => self.buf.extend_from_slice(&[0xC5, 0xFB, 0x93, 0xC0 | k]),
            _ => self
                .buf
                .extend_from_slice(&[0xC4, 0xE1, 0xFB, 0x93, 0xC0 | k]),
        }
        if elems < 16 {
            self.buf.push(0x25); // and eax, (1 << elems) - 1
            self.d32((1u32 << elems) - 1);
        }
        self.buf.extend_from_slice(&[0x48, 0x8D, 0x48, 0x01]); // lea rcx, [rax+1]
        self.buf.extend_from_slice(&[0x48, 0x85, 0xC1]); // test rcx, rax
        self.buf.extend_from_slice(&[0x0F, 0x85]); // jnz other
        let to_other = self.buf.len();
        self.d32(0);
        self.buf.extend_from_slice(&[0xF3, 0x48, 0x0F, 0xB8, 0xC0]); // popcnt rax, rax
        self.buf.extend_from_slice(&[0x0F, 0x84]); // jz none
        let to_none = self.buf.len();
        self.d32(0);
        if elem > 1 {
            // shl rax, log2(elem)
            self.buf
                .extend_from_slice(&[0x48, 0xC1, 0xE0, elem.trailing_zeros() as u8]);
        }
        self.buf.push(0x0D); // or eax, kind << 16
        self.d32((kind as u32) << 16);
        self.load_gs(1, c::OFF_TRACE_PTR);
        self.buf.extend_from_slice(&[0x89, 0x41, 0x0C]); // mov [rcx+12], eax
        self.load_gs(1, c::OFF_PROBE_RCX);
        self.effective_address(&m, 0, ip)?;
        self.store_gs(1, c::OFF_PROBE_RCX);
        self.load_gs(1, c::OFF_TRACE_PTR);
        self.buf.extend_from_slice(&[0x48, 0x89, 0x01]); // mov [rcx], rax
        self.buf.extend_from_slice(&[0xC7, 0x41, 0x08]); // mov dword [rcx+8], tag
        self.d32(tag);
        self.buf.extend_from_slice(&[0x48, 0x8D, 0x49, 0x10]); // lea rcx, [rcx+16]
        self.store_gs(1, c::OFF_TRACE_PTR);
        self.load_gs(1, c::OFF_PROBE_RCX);
        self.buf.push(0xE9); // jmp done
        to_done[1] = self.buf.len();
        self.d32(0);
        self.patch_rel32(to_none);
        self.load_gs(1, c::OFF_PROBE_RCX);
        self.buf.push(0xE9); // jmp done
        to_done[2] = self.buf.len();
        self.d32(0);
        self.patch_rel32(to_other);
        self.load_gs(1, c::OFF_PROBE_RCX);
        self.buf.push(0xE9); // jmp <clean call>, placed with the slow calls
        let to_call = self.buf.len();
        self.d32(0);
        for j in to_done {
            self.patch_rel32(j);
        }
        self.drain_when_full(ip, flags_live);
        let back = self.buf.len();
        self.slow
            .push(SlowCall::one_jump(ip, rec, flags_live, back, to_call));
        Ok(())
    }

    /// Makes the recent-lines slots of the lines operand `m` touches name them (see
    /// `recent_lines`; `g`: its geometry). Borrows `rcx`, giving it back before each
    /// address is formed (an operand may be based on it).
    fn note_recent_lines(
        &mut self,
        m: &UsedMemory,
        g: (u32, u32),
        ip: u64,
    ) -> Result<(), TranslateError> {
        let last = recent_clamp(m, g) - 1;
        let two = crate::recent_lines::two_ways();
        self.effective_address(m, 0, ip)?;
        self.store_gs(1, c::OFF_PROBE_RCX);
        if two {
            self.record_address_two_ways(g, 0);
        } else {
            self.store_recent_line(g);
        }
        if last > 0 {
            self.load_gs(1, c::OFF_PROBE_RCX);
            self.effective_address(m, last, ip)?;
            self.store_gs(1, c::OFF_PROBE_RCX);
            if two {
                self.record_address_two_ways(g, 1);
            } else {
                self.store_recent_line(g);
            }
        }
        self.load_gs(1, c::OFF_PROBE_RCX);
        Ok(())
    }

    /// Two-way table: `rax` holds an address a record being appended touches, `rcx` is
    /// borrowed: its line's slot is updated as a record's (see
    /// [`Emitter::record_line_two_ways`]). Clobbers `rax`.
    fn record_address_two_ways(&mut self, g: (u32, u32), bit: u8) {
        self.recent_key_and_slot(g);
        self.record_line_two_ways(bit);
    }

    /// `rax` holds an address, `rcx` is borrowed: `rax` = its line's key in the data table
    /// (`recent_lines::data_key`), `rcx` = its slot.
    ///
    /// ```text
    ///     shr rax, shift; mov ecx, eax; and ecx, slots-1; shl rax, shift; neg rax
    /// ```
    fn recent_key_and_slot(&mut self, (shift, slots): (u32, u32)) {
        self.buf.extend_from_slice(&[0x48, 0xC1, 0xE8, shift as u8]); // shr rax, shift
        self.recent_slot_of_rax(slots);
        self.buf.extend_from_slice(&[0x48, 0xC1, 0xE0, shift as u8]); // shl rax, shift
        self.buf.extend_from_slice(&[0x48, 0xF7, 0xD8]); // neg rax
    }

    /// The first-line test of the recent-lines checks that borrow `rcx`: the access's
    /// address into `rax` (the program's `rcx` saved), `rcx` = its slot, and the slot's key
    /// added to the address: the access's offset in the slot's first line, which is at
    /// most `line bytes - access bytes` exactly when that line is the access's and the
    /// access does not straddle into the next. Returns the rel32 of the `ja` taken
    /// otherwise (`rax` = the address plus the key, `rcx` the slot); on the path that
    /// falls through, `rcx` is still borrowed.
    ///
    /// ```text
    ///     rax = address; save rcx
    ///     mov rcx, rax; shr rcx, shift; and ecx, slots-1
    ///     add rax, gs:[FIRST + rcx*8]; cmp rax, line - bytes; ja <miss>
    /// ```
    fn recent_first_line_offset(
        &mut self,
        m: &UsedMemory,
        (shift, slots): (u32, u32),
        ip: u64,
    ) -> Result<usize, TranslateError> {
        let room = (1u64 << shift) - recent_clamp(m, (shift, slots));
        self.effective_address(m, 0, ip)?;
        self.store_gs(1, c::OFF_PROBE_RCX);
        self.buf.extend_from_slice(&[0x48, 0x89, 0xC1]); // mov rcx, rax
        self.buf.extend_from_slice(&[0x48, 0xC1, 0xE9, shift as u8]); // shr rcx, shift
        self.recent_slot_mask(slots);
        self.buf.extend_from_slice(&[0x65, 0x48, 0x03, 0x04, 0xCD]); // add rax, FIRST[rcx*8]
        self.d32(c::RECENT_LINES_OFF as u32);
        self.buf.extend_from_slice(&[0x48, 0x3D]); // cmp rax, room
        self.d32(room as u32);
        self.buf.extend_from_slice(&[0x0F, 0x87]); // ja <miss>
        let to_miss = self.buf.len();
        self.d32(0);
        Ok(to_miss)
    }

    /// Two-way table: `rax` holds a line a record being appended touches, `rcx` its slot.
    /// The slot's swap bit goes to bit `bit` of the record's swap byte (bit 0 starts it
    /// afresh) and is cleared; the line becomes the slot's first unless it is already, the
    /// first moving to second (which is also what an access to the second does: the two
    /// change places). Clobbers `rax`.
    ///
    /// ```text
    ///     cmp rax, gs:[FIRST + rcx*8]; je same
    ///     xor rax, gs:[FIRST + rcx*8]; xor gs:[FIRST + rcx*8], rax    (first = line)
    ///     xor rax, gs:[FIRST + rcx*8]; mov gs:[SECOND + rcx*8], rax   (second = old first)
    /// same:
    ///     movzx eax, byte gs:[SWAPS + rcx]; mov byte gs:[SWAPS + rcx], 0
    ///     mov gs:[RECORD_SWAPS], al    | shl al, bit; or gs:[RECORD_SWAPS], al
    /// ```
    fn record_line_two_ways(&mut self, bit: u8) {
        let first = c::RECENT_LINES_OFF as u32;
        self.buf.extend_from_slice(&[0x65, 0x48, 0x3B, 0x04, 0xCD]);
        self.d32(first);
        self.buf.extend_from_slice(&[0x0F, 0x84]); // je same
        let same = self.buf.len();
        self.d32(0);
        self.buf.extend_from_slice(&[0x65, 0x48, 0x33, 0x04, 0xCD]); // xor rax, gs:[..]
        self.d32(first);
        self.buf.extend_from_slice(&[0x65, 0x48, 0x31, 0x04, 0xCD]); // xor gs:[..], rax
        self.d32(first);
        self.buf.extend_from_slice(&[0x65, 0x48, 0x33, 0x04, 0xCD]); // xor rax, gs:[..]
        self.d32(first);
        self.buf.extend_from_slice(&[0x65, 0x48, 0x89, 0x04, 0xCD]); // mov gs:[SECOND..], rax
        self.d32(c::RECENT_SECOND_LINES_OFF as u32);
        self.patch_rel32(same);
        self.buf.extend_from_slice(&[0x65, 0x0F, 0xB6, 0x04, 0x0D]); // movzx eax, byte gs:[SWAPS+rcx]
        self.d32(c::RECENT_SWAPS_OFF as u32);
        self.buf.extend_from_slice(&[0x65, 0xC6, 0x04, 0x0D]); // mov byte gs:[SWAPS+rcx], 0
        self.d32(c::RECENT_SWAPS_OFF as u32);
        self.buf.push(0);
        if bit == 0 {
            self.buf.extend_from_slice(&[0x65, 0x88, 0x04, 0x25]); // mov gs:[RECORD_SWAPS], al
        } else {
            self.buf.extend_from_slice(&[0xC0, 0xE0, bit]); // shl al, bit
            self.buf.extend_from_slice(&[0x65, 0x08, 0x04, 0x25]); // or gs:[RECORD_SWAPS], al
        }
        self.d32(c::RECENT_RECORD_SWAPS_OFF as u32);
    }

    /// The miss path of [`Emitter::recent_first_line_offset`] in the inline checks: the
    /// address back into `rax` (`rcx` still borrowed), a jump to be patched for an access
    /// that straddles two lines (its offset returned; none for a 1-byte access), then
    /// `rax` = the line's key and `rcx` = its slot.
    fn recent_line_and_slot(
        &mut self,
        m: &UsedMemory,
        (shift, slots): (u32, u32),
    ) -> Option<usize> {
        let last = recent_clamp(m, (shift, slots)) - 1;
        self.buf.extend_from_slice(&[0x65, 0x48, 0x2B, 0x04, 0xCD]); // sub rax, FIRST[rcx*8]
        self.d32(c::RECENT_LINES_OFF as u32);
        let mut straddles = None;
        if last > 0 {
            self.buf.extend_from_slice(&[0x48, 0x8D, 0x88]); // lea rcx, [rax+last]
            self.d32(last as u32);
            self.buf.extend_from_slice(&[0x48, 0x31, 0xC1]); // xor rcx, rax
            self.buf.extend_from_slice(&[0x48, 0xC1, 0xE9, shift as u8]); // shr rcx, shift
            self.buf.extend_from_slice(&[0x0F, 0x85]); // jnz straddles
            straddles = Some(self.buf.len());
            self.d32(0);
        }
        self.recent_key_and_slot((shift, slots));
        straddles
    }

    /// The two-way check's second half (line in `rax`, slot in `rcx`): a hit in the slot's
    /// second line swaps the two with three `xor`s (and the slot's swap bit flips so the
    /// simulator can replay the order), then gives `rcx` back; a miss jumps to the
    /// returned rel32, to be patched to the record of a new line.
    fn second_line_hit(&mut self) -> usize {
        let first = c::RECENT_LINES_OFF as u32;
        let second = c::RECENT_SECOND_LINES_OFF as u32;
        self.buf.extend_from_slice(&[0x65, 0x48, 0x3B, 0x04, 0xCD]); // cmp rax, SECOND
        self.d32(second);
        self.buf.extend_from_slice(&[0x0F, 0x85]); // jne new
        let to_new = self.buf.len();
        self.d32(0);
        self.buf.extend_from_slice(&[0x65, 0x48, 0x33, 0x04, 0xCD]); // xor rax, FIRST
        self.d32(first);
        self.buf.extend_from_slice(&[0x65, 0x48, 0x31, 0x04, 0xCD]); // xor FIRST, rax
        self.d32(first);
        self.buf.extend_from_slice(&[0x65, 0x48, 0x31, 0x04, 0xCD]); // xor SECOND, rax
        self.d32(second);
        self.buf.extend_from_slice(&[0x65, 0x80, 0x34, 0x0D]); // xor byte gs:[SWAPS+rcx], 1
        self.d32(c::RECENT_SWAPS_OFF as u32);
        self.buf.push(1);
        self.load_gs(1, c::OFF_PROBE_RCX);
        to_new
    }

    /// [`Emitter::append_unless_recent`] for a table of two lines per slot: an access to
    /// the slot's second line is skipped too (the two change places, the swap bit flips);
    /// a record updates its lines' slots as [`Emitter::record_line_two_ways`] says.
    ///
    /// ```text
    ///     the first-line test ([`Emitter::recent_first_line_offset`]); ja miss
    ///     restore rcx; jmp done                          (the common case: skipped)
    /// miss:
    ///     sub rax, gs:[FIRST + rcx*8]                    (the address)
    ///     lea rcx, [rax+last]; xor rcx, rax; shr rcx, shift; jnz straddles   (last > 0)
    ///     rax = the line's key, rcx = its slot
    ///     cmp rax, gs:[SECOND + rcx*8]; jne new
    ///     swap first and second (three xors); xor byte gs:[SWAPS + rcx], 1
    ///     restore rcx; jmp done                          (skipped)
    /// new:
    ///     record the line (bit 0); jmp append
    /// straddles:
    ///     restore rcx; record both lines (bits 0 and 1)
    /// append:
    ///     restore rcx; rax = address; append
    /// done:
    /// ```
    fn append_unless_recent_two_ways(
        &mut self,
        m: &UsedMemory,
        (shift, slots): (u32, u32),
        tag: u32,
        word: u32,
        ip: u64,
        leave: Option<bool>,
    ) -> Result<Option<usize>, TranslateError> {
        let to_miss = self.recent_first_line_offset(m, (shift, slots), ip)?;
        self.load_gs(1, c::OFF_PROBE_RCX);
        if let Some(flags_live) = leave {
            self.return_rax(flags_live);
        }
        self.buf.push(0xE9); // jmp done (or out of the probe)
        let done_first = self.buf.len();
        self.d32(0);
        self.patch_rel32(to_miss);
        // Not the first line's, or straddling: the second line's, or a record.
        let straddles = self.recent_line_and_slot(m, (shift, slots));
        let to_new = self.second_line_hit();
        if let Some(flags_live) = leave {
            self.return_rax(flags_live);
        }
        self.buf.push(0xE9); // jmp done (or out of the probe)
        let done_second = self.buf.len();
        self.d32(0);
        self.patch_rel32(to_new);
        self.record_line_two_ways(0);
        let mut to_append = None;
        if let Some(j) = straddles {
            self.buf.push(0xE9); // jmp append
            to_append = Some(self.buf.len());
            self.d32(0);
            self.patch_rel32(j);
            self.load_gs(1, c::OFF_PROBE_RCX);
            self.note_recent_lines(m, (shift, slots), ip)?;
        }
        if let Some(j) = to_append {
            self.patch_rel32(j);
        }
        self.load_gs(1, c::OFF_PROBE_RCX);
        self.effective_address(m, 0, ip)?;
        self.append_access(tag, word);
        if leave.is_some() {
            // Both skipping paths leave the probe: the second jumps to the first's jump,
            // whose rel32 the caller points at the probe's end.
            let rel = (done_first as i64 - 1) - (done_second as i64 + 4);
            self.buf[done_second..done_second + 4].copy_from_slice(&(rel as i32).to_le_bytes());
            return Ok(Some(done_first));
        }
        self.patch_rel32(done_first);
        self.patch_rel32(done_second);
        Ok(None)
    }

    /// The recent-lines check of an instruction's only operand, for a table of two lines
    /// per slot: inline only what an access to its slot's first line runs (most accesses),
    /// which then falls through to the instruction; the rest, from the compare with the
    /// second line to the record and the drain check (what
    /// [`Emitter::append_unless_recent_two_ways`] emits), in the arena's shared routine
    /// ([`recent_line_routines`]), called from a few bytes after the block's stubs
    /// ([`Emitter::finish_recent_cold`]), coming back to the instruction. The inline
    /// part stays a few dozen bytes, straight, with no taken jump. Most operands take one
    /// of two shorter forms, which leave `rcx` alone: a constant address's
    /// ([`Emitter::check_recent_constant`]) and one in `rax` only
    /// ([`Emitter::check_recent_without_rcx`]); the general form:
    ///
    /// ```text
    ///     rax = address; save rcx
    ///     mov rcx, rax; shr rcx, shift; and ecx, slots-1
    ///     add rax, gs:[FIRST + rcx*8]; cmp rax, line - bytes; ja <cold>
    ///     restore rcx; (restore flags, rax)
    /// back:
    /// ```
    /// (The slot holds its line's key, `recent_lines::data_key`: the sum is the access's
    /// offset in that line, which one compare bounds for the line and the straddle both;
    /// see [`Emitter::recent_first_line_offset`].)
    fn check_recent_two_ways(
        &mut self,
        m: &UsedMemory,
        geometry: (u32, u32),
        tag: u32,
        word: u32,
        ip: u64,
        flags_live: bool,
    ) -> Result<(), TranslateError> {
        // The out-of-line part forms the address of the operand's last byte too: encoded
        // here first, where a failure can still refuse the translation.
        let start = self.buf.len();
        self.effective_address(m, recent_clamp(m, geometry) - 1, ip)?;
        self.buf.truncate(start);
        // Every form ends alike: rax back, and the out-of-line part queued with where its
        // jump is and how it finds the line.
        let short = match self.check_recent_constant(m, geometry) {
            Some(_) => Some((self.buf.len() - 4, false)),
            None => self
                .check_recent_without_rcx(m, geometry, ip)?
                .map(|to_second| (to_second, false)),
        };
        let (to_second, rcx_borrowed) = match short {
            Some(short) => short,
            None => {
                let to_cold = self.recent_first_line_offset(m, geometry, ip)?;
                self.load_gs(1, c::OFF_PROBE_RCX);
                (to_cold, true)
            }
        };
        // Where the instruction can carry the borrow of `rax` over to the next one's probe
        // (`Emitter::carry`), it is kept, and so are live flags where it touches none
        // (`Emitter::carry_flags`): the next probe saves and restores them once for both.
        let keep = match (self.carry.is_some(), flags_live && self.carry_flags) {
            (false, _) => Keep::No,
            (true, false) => Keep::Rax,
            (true, true) => Keep::RaxAndFlags,
        };
        self.give_back(flags_live, keep);
        let back = self.buf.len();
        if keep != Keep::No {
            self.kept = Some((keep == Keep::RaxAndFlags, ip));
        }
        self.mark(ip, keep.fix());
        self.recent_cold.push(RecentCold {
            m: *m,
            geometry,
            tag,
            word,
            ip,
            flags_live,
            to_second,
            rcx_borrowed,
            back,
            keep,
        });
        Ok(())
    }

    /// The inline part of [`Emitter::check_recent_two_ways`] in `rax` alone, for an
    /// operand addressed by general registers other than `rax` (no segment base): the slot
    /// comes from the address's bits in place, and one unsigned compare of the address's
    /// offset from the start of the slot's first line both checks that line and that the
    /// access does not straddle into the next. No `rcx` to save and give back, one branch.
    /// Returns the rel32 of the `ja` to the out-of-line part (entered with `rax`
    /// clobbered, `rcx` not borrowed), or `None`, with nothing emitted, for an operand it
    /// cannot take.
    ///
    /// ```text
    ///     lea rax, [m]; and eax, (slots-1) << shift; shr eax, shift-3   (slot * 8)
    ///     mov rax, gs:[FIRST + rax]              (the key: -first line's start)
    ///     lea rax, [base + rax + disp]; (lea rax, [rax + index*scale])   (address - start)
    ///     cmp rax, line - bytes; ja <cold>
    /// ```
    fn check_recent_without_rcx(
        &mut self,
        m: &UsedMemory,
        (shift, slots): (u32, u32),
        ip: u64,
    ) -> Result<Option<usize>, TranslateError> {
        let is_rax = |r: Register| r == Register::RAX;
        let mask = u64::from(slots - 1) << shift;
        // (A constant address, whose displacement is the whole address, is left to
        // `check_recent_constant` or, straddling, to the general check.)
        if is_rax(m.base())
            || is_rax(m.index())
            || (m.base() == Register::None && m.index() == Register::None)
            || matches!(m.segment(), Register::FS | Register::GS)
            || !(3..32).contains(&shift)
            || mask > i32::MAX as u64
        {
            return Ok(None);
        }
        let room = (1u64 << shift) - recent_clamp(m, (shift, slots));
        let disp = m.displacement() as i64;
        self.effective_address(m, 0, ip)?;
        self.buf.push(0x25); // and eax, mask
        self.d32(mask as u32);
        self.buf.extend_from_slice(&[0xC1, 0xE8, (shift - 3) as u8]); // shr eax, shift-3
        self.buf.extend_from_slice(&[0x65, 0x48, 0x8B, 0x80]); // mov rax, gs:[rax+FIRST]
        self.d32(c::RECENT_LINES_OFF as u32);
        match (m.base(), m.index()) {
            (Register::None, index) => {
                self.lea_rax(Register::RAX, index, m.scale(), disp, ip)?;
            }
            (base, Register::None) => self.lea_rax(base, Register::RAX, 1, disp, ip)?,
            (base, index) => {
                self.lea_rax(base, Register::RAX, 1, disp, ip)?;
                self.lea_rax(Register::RAX, index, m.scale(), 0, ip)?;
            }
        }
        self.buf.extend_from_slice(&[0x48, 0x3D]); // cmp rax, room
        self.d32(room as u32);
        self.buf.extend_from_slice(&[0x0F, 0x87]); // ja <cold>
        let to_cold = self.buf.len();
        self.d32(0);
        Ok(Some(to_cold))
    }

    /// The inline part of [`Emitter::check_recent_two_ways`] for an operand at a constant
    /// address (RIP-relative or absolute, no segment base) within one line: its line and
    /// slot are known now, so the check is one compare of an immediate, without `rcx`.
    /// Returns the slot, the code ending with the rel32 of the `jne` to the out-of-line
    /// part (which enters it with `rax` = the line's key, `rcx` not yet borrowed); `None`,
    /// with nothing emitted, for any other operand.
    ///
    /// ```text
    ///     mov rax, key; cmp rax, gs:[FIRST + slot*8]; jne <cold second>
    /// ```
    fn check_recent_constant(&mut self, m: &UsedMemory, (shift, slots): (u32, u32)) -> Option<u32> {
        let constant = m.base() == Register::None
            && m.index() == Register::None
            && !matches!(m.segment(), Register::FS | Register::GS);
        let addr = m.displacement();
        let line = addr >> shift;
        let last = addr.wrapping_add(recent_clamp(m, (shift, slots)) - 1) >> shift;
        if !constant || line != last {
            return None;
        }
        let slot = (line & u64::from(slots - 1)) as u32;
        self.mov_imm64(0, crate::recent_lines::data_key(line, shift));
        self.buf.extend_from_slice(&[0x65, 0x48, 0x3B, 0x04, 0x25]); // cmp rax, gs:[disp32]
        self.d32(c::RECENT_LINES_OFF as u32 + 8 * slot);
        self.buf.extend_from_slice(&[0x0F, 0x85]); // jne <cold second>
        self.d32(0);
        Some(slot)
    }

    /// Places the out-of-line parts of [`Emitter::check_recent_two_ways`] and of the
    /// block's code-lines check. A data check's is a call of the arena's shared routine
    /// (see [`recent_line_routines`]), entered from the inline `jne`/`jnz`/`ja` with the
    /// program's `rax` (and flags, when live) saved and `rcx` borrowed or not
    /// (`RecentCold::rcx_borrowed`); it gives back `rcx`, forms the address and calls;
    /// the routine comes back with what the check keeps borrowed, as the inline check
    /// ends, or, after a drain, with the guest state exact (a kept borrow is taken again
    /// by the thunk after the data):
    ///
    /// ```text
    ///     (mov rcx, gs:[PROBE_RCX]); rax = address; lea rsp, [rsp - 128]; call routine
    ///     jmp back; dd tag, size | kind << 16, room; dq drain record
    ///     (kept: mov gs:[STUB_RAX], rax; (save the flags); jmp back)
    /// ```
    pub(super) fn finish_recent_cold(&mut self) {
        for d in core::mem::take(&mut self.block_cold) {
            let at = self.buf.len();
            self.push_map_at(at, d.pc, FIX_RAX_IN_STUB);
            self.block_cold_ways(&d);
        }
        let routines = RECENT_ROUTINES.load(core::sync::atomic::Ordering::Relaxed);
        for d in core::mem::take(&mut self.recent_cold) {
            let at = self.buf.len();
            self.push_map_at(at, d.ip, FIX_RAX_IN_STUB);
            self.patch_rel32(d.to_second);
            if d.rcx_borrowed {
                self.load_gs(1, c::OFF_PROBE_RCX);
            }
            // Encoded once by `check_recent_two_ways`: no error here.
            let _ = self.effective_address(&d.m, 0, d.ip);
            self.buf.extend_from_slice(&[0x48, 0x8D, 0x64, 0x24, 0x80]); // lea rsp, [rsp-128]
            let variant = recent_routine_variant(d.keep, d.flags_live);
            let entry = routines + (variant * RECENT_ROUTINE_ROOM) as u64;
            let rel = (entry as i64).wrapping_sub(self.here() as i64 + 5);
            self.buf.push(0xE8); // call routine (same arena: within rel32)
            self.d32(rel as i32 as u32);
            // R: the routine's return, then the data it reads from here.
            let r = self.buf.len();
            self.jmp_to(d.back);
            let room = (1u64 << d.geometry.0) - recent_clamp(&d.m, d.geometry);
            let rec = crate::probe::trace_full_record_at(d.ip).unwrap_or(0);
            debug_assert_eq!(self.buf.len(), r + SITE_TAG as usize);
            self.d32(d.tag);
            self.d32(d.word);
            self.d32(room as u32);
            self.buf.extend_from_slice(&rec.to_le_bytes());
            if d.keep != Keep::No {
                // The drain's return (guest state exact): borrow again; jmp back.
                debug_assert_eq!(self.buf.len(), r + SITE_THUNK as usize);
                self.push_map_at(self.buf.len(), d.ip, 0);
                self.borrow_again(d.ip, d.flags_live);
                self.jmp_to(d.back);
            }
        }
        self.unmark();
    }

    /// `jmp` to offset `to` of the code (rel32).
    pub(super) fn jmp_to(&mut self, to: usize) {
        self.buf.push(0xE9);
        let rel = to as i64 - (self.buf.len() as i64 + 4);
        self.d32(rel as i32 as u32);
    }

    /// `rax` holds an address, `rcx` is borrowed: its line's key into its slot
    /// ([`Emitter::recent_key_and_slot`]; `mov gs:[RECENT_LINES + rcx*8], rax`).
    fn store_recent_line(&mut self, g: (u32, u32)) {
        self.recent_key_and_slot(g);
        self.buf.extend_from_slice(&[0x65, 0x48, 0x89, 0x04, 0xCD]);
        self.d32(c::RECENT_LINES_OFF as u32);
    }

    /// `rax` holds a line: `mov ecx, eax; and ecx, slots-1`.
    fn recent_slot_of_rax(&mut self, slots: u32) {
        self.buf.extend_from_slice(&[0x89, 0xC1]);
        self.recent_slot_mask(slots);
    }

    /// `and ecx, slots-1`.
    fn recent_slot_mask(&mut self, slots: u32) {
        self.buf.extend_from_slice(&[0x81, 0xE1]);
        self.d32(slots - 1);
    }

    /// Operand `m`'s record, unless its bytes (clamped to a line) lie in one line that its
    /// recent-lines slot names; when it is appended, its lines' slots name them. With
    /// `leave` (the instruction's only operand; whether the flags were saved), the skipping
    /// path also gives back `rax` and the flags and jumps out of the probe, past its drain
    /// check: the returned rel32 is to be pointed at the probe's end.
    ///
    /// ```text
    ///     the first-line test ([`Emitter::recent_first_line_offset`]); ja miss
    ///     restore rcx; jmp done                          (the common case: skipped)
    /// miss:
    ///     sub rax, gs:[RECENT + rcx*8]                   (the address)
    ///     lea rcx, [rax+last]; xor rcx, rax; shr rcx, shift; jnz straddles   (last > 0)
    ///     rax = the line's key, rcx = its slot; jmp new
    /// straddles:
    ///     rax = the line's key, rcx = its slot; mov gs:[RECENT + rcx*8], rax
    ///     sub rax, line bytes; inc ecx; and ecx, slots-1      (the next line's)
    /// new:
    ///     mov gs:[RECENT + rcx*8], rax
    ///     restore rcx; rax = address; append
    /// done:
    /// ```
    fn append_unless_recent(
        &mut self,
        m: &UsedMemory,
        (shift, slots): (u32, u32),
        tag: u32,
        word: u32,
        ip: u64,
        leave: Option<bool>,
    ) -> Result<Option<usize>, TranslateError> {
        let to_miss = self.recent_first_line_offset(m, (shift, slots), ip)?;
        self.load_gs(1, c::OFF_PROBE_RCX);
        if let Some(flags_live) = leave {
            self.return_rax(flags_live);
        }
        self.buf.push(0xE9); // jmp done (or out of the probe)
        let done = self.buf.len();
        self.d32(0);
        self.patch_rel32(to_miss);
        let straddles = self.recent_line_and_slot(m, (shift, slots));
        if let Some(j) = straddles {
            self.buf.push(0xE9); // jmp new
            let new = self.buf.len();
            self.d32(0);
            self.patch_rel32(j);
            // The access's address is in rax still (the straddle test kept it).
            self.recent_key_and_slot((shift, slots));
            self.buf.extend_from_slice(&[0x65, 0x48, 0x89, 0x04, 0xCD]);
            self.d32(c::RECENT_LINES_OFF as u32);
            self.buf.extend_from_slice(&[0x48, 0x2D]); // sub rax, line bytes: the next line
            self.d32(1u32 << shift);
            self.buf.extend_from_slice(&[0xFF, 0xC1]); // inc ecx
            self.recent_slot_mask(slots);
            self.patch_rel32(new);
        }
        self.buf.extend_from_slice(&[0x65, 0x48, 0x89, 0x04, 0xCD]); // mov gs:[..+rcx*8], rax
        self.d32(c::RECENT_LINES_OFF as u32);
        self.load_gs(1, c::OFF_PROBE_RCX);
        self.effective_address(m, 0, ip)?;
        self.append_access(tag, word);
        if leave.is_some() {
            return Ok(Some(done));
        }
        self.patch_rel32(done);
        Ok(None)
    }

    /// Points the rel32 at `at` to the current end of the code.
    fn patch_rel32(&mut self, at: usize) {
        let rel = (self.buf.len() - (at + 4)) as u32;
        self.buf[at..at + 4].copy_from_slice(&rel.to_le_bytes());
    }

    /// The thread's hot ranges (`Needs::hot_ranges`), tested before the shadow map: when
    /// the first byte of operand `m` lies in one, its size is added to that range's read
    /// or write bytes (both for a read-modify-write) and the record is skipped. Per range
    /// (`trace::HotTest`): `sub rax, gs:[step]; cmp rax, gs:[len]; jae next;
    /// add gs:[bytes], size; jmp <done>`: one branch per range missed, where testing both
    /// bounds took two. Returns the positions of the `jmp <done>` rel32s, for the caller
    /// to aim past the record. `rax` is left clobbered (the shadow checks compute the
    /// address again); the flags are the guest's no longer (`borrow_rax` saved them).
    fn hot_range_counts(
        &mut self,
        m: &UsedMemory,
        kind: TraceKind,
        ip: u64,
    ) -> Result<[Option<usize>; oxgrind_tool::instrument::HOT_RANGES], TranslateError> {
        const RANGE: usize = core::mem::size_of::<oxgrind_tool::instrument::HotRange>();
        let mut done = [None; oxgrind_tool::instrument::HOT_RANGES];
        self.effective_address(m, 0, ip)?;
        let size = m.memory_size().size() as u32;
        const TEST: usize = core::mem::size_of::<crate::trace::HotTest>();
        for (r, slot) in done.iter_mut().enumerate() {
            let base = c::OFF_HOT + r * RANGE;
            let test = c::OFF_HOT_TESTS + r * TEST;
            // sub rax, gs:[step]; cmp rax, gs:[len]; jae next (rel8)
            self.buf.extend_from_slice(&[0x65, 0x48, 0x2B, 0x04, 0x25]);
            self.d32(test as u32);
            self.buf.extend_from_slice(&[0x65, 0x48, 0x3B, 0x04, 0x25]);
            self.d32((test + 8) as u32);
            self.buf.extend_from_slice(&[0x73, 0]);
            let next = self.buf.len() - 1;
            let counts: &[usize] = match kind {
                TraceKind::Read => &[16],
                TraceKind::Write => &[24],
                _ => &[16, 24],
            };
            for &off in counts {
                // add qword ptr gs:[base+off], size
                self.buf.extend_from_slice(&[0x65, 0x48, 0x81, 0x04, 0x25]);
                self.d32((base + off) as u32);
                self.d32(size);
            }
            self.buf.push(0xE9);
            *slot = Some(self.buf.len());
            self.d32(0);
            self.buf[next] = (self.buf.len() - (next + 1)) as u8;
        }
        Ok(done)
    }

    /// `rax` holds an address: writes the record (address, `tag`, `size_kind`) at the
    /// thread's trace pointer and advances it, borrowing `rcx`.
    fn append_access(&mut self, tag: u32, size_kind: u32) {
        self.store_gs(1, c::OFF_PROBE_RCX);
        self.load_gs(1, c::OFF_TRACE_PTR);
        self.buf.extend_from_slice(&[0x48, 0x89, 0x01]); // mov [rcx], rax
        self.buf.extend_from_slice(&[0xC7, 0x41, 0x08]); // mov dword [rcx+8], tag
        self.d32(tag);
        self.buf.extend_from_slice(&[0xC7, 0x41, 0x0C]); // mov dword [rcx+12], size|kind
        self.d32(size_kind);
        if crate::recent_lines::two_ways() {
            // The swap bits gathered from the record's lines (`record_line_two_ways`):
            // mov al, gs:[RECORD_SWAPS]; mov [rcx+15], al (`rax` is not needed after).
            self.buf.extend_from_slice(&[0x65, 0x8A, 0x04, 0x25]);
            self.d32(c::RECENT_RECORD_SWAPS_OFF as u32);
            self.buf.extend_from_slice(&[0x88, 0x41, 0x0F]);
        }
        self.buf.extend_from_slice(&[0x48, 0x8D, 0x49, 0x10]); // lea rcx, [rcx+16]
        self.store_gs(1, c::OFF_TRACE_PTR);
        self.load_gs(1, c::OFF_PROBE_RCX);
    }

    /// Ends an inline trace probe: gives back `rax` and the flags, after a check of the
    /// trace pointer against the drain mark that leaves for an out-of-line drain call.
    /// Returns where `rax` and the flags are given back, past the check: where a path
    /// that appended nothing may jump to.
    fn drain_when_full(&mut self, ip: u64, flags_live: bool) -> usize {
        self.drain_when_full_keeping(ip, flags_live, Keep::No)
    }

    /// [`Emitter::drain_when_full`], giving back only what `keep` does not keep for the
    /// next instruction (the drain call then returns through a thunk that borrows again).
    fn drain_when_full_keeping(&mut self, ip: u64, flags_live: bool, keep: Keep) -> usize {
        self.load_gs(0, c::OFF_TRACE_PTR);
        // cmp rax, gs:[TRACE_END]; jae slow
        self.buf.extend_from_slice(&[0x65, 0x48, 0x3B, 0x04, 0x25]);
        self.d32(c::OFF_TRACE_END as u32);
        self.buf.extend_from_slice(&[0x0F, 0x83]);
        let jump = self.buf.len();
        self.d32(0);
        let give_back = self.buf.len();
        self.give_back(flags_live, keep);
        let back = self.buf.len();
        self.mark(ip, keep.fix());
        let rec = crate::probe::trace_full_record_at(ip).unwrap_or(0);
        if rec != 0 {
            if keep != Keep::No {
                self.reborrow.push(self.slow.len());
            }
            self.slow
                .push(SlowCall::one_jump(ip, rec, flags_live, back, jump));
        } else {
            // No memory for the record: never leave (the buffer is then drained by the
            // next probe that has one, or at thread exit; appends past the mark use the
            // slack, and the drain mark leaves room for one instruction's records only).
            self.buf[jump..jump + 4].copy_from_slice(&0u32.to_le_bytes());
        }
        give_back
    }

    /// For each check of operand `m` against the shadow map (first granules, last byte),
    /// emits `jne <to patch>`; returns how many, with the positions of their rel32s. With
    /// `below_sp` nonzero, the first check also tells whether the operand starts in
    /// `[rsp - below_sp, rsp - RED_ZONE)`, on the same address (`below_sp` a multiple of
    /// 8): `lea rax, [m + below_sp]; cmp rax, rsp; jae <above>`, then the shadow of
    /// `rax - below_sp`. Only an address at or above `rsp - below_sp` (the stack, and what
    /// lies above it) takes the out-of-line `<above>` (`AboveSp`: the compare with
    /// `rsp - 128`, into the slow call); the heap, below the stacks, pays one compare.
    /// A frame's local (`frame_local`), which mostly lies in the stack, has both compares
    /// inline (`sub rax, rsp; cmp rax, below_sp - 128; jb <slow>; add rax, rsp`).
    /// `slow_follows`: the caller pushes its `SlowCall` next (`filtered_call`), which a
    /// wide compare's exact half (`ExactA`) jumps to; a trace probe's checks jump to its
    /// inline record instead, so they never take the wide form (whose nonzero branch
    /// would leave for another probe's slow call, and the record would be lost).
    fn shadow_checks(
        &mut self,
        m: &UsedMemory,
        ip: u64,
        below_sp: u32,
        jumps: &mut [usize; 3],
        slow_follows: bool,
    ) -> Result<usize, TranslateError> {
        let size = m.memory_size().size() as u64;
        // Shadow bytes covering the first granules (up to 8), then the last byte's.
        let first_width: u8 = match size {
            0..=8 => 1,
            9..=16 => 2,
            17..=32 => 4,
            _ => 8,
        };
        let checks = [(0u64, first_width), (size.saturating_sub(1), 1)];
        // An operand of 2 to 56 bytes touches at most `(size + 14) / 8` granules from its
        // first: one compare of that many shadow bytes (rounded up to 2, 4 or 8) stands for
        // both, and only when it finds a nonzero byte, which may lie past the operand (the
        // next block's redzone after a block's last word), do the two exact compares run,
        // out of line (`ExactA`).
        let wide: Option<u8> = match size {
            _ if !slow_follows => None,
            // One byte: its granule's compare, and when not 0 the exact half (a byte in the
            // addressable part of a block's last granule).
            1 => Some(1),
            2..=8 => Some(2),
            9..=24 => Some(4),
            25..=56 => Some(8),
            _ => None,
        };
        let n = if size > 1 && wide.is_none() { 2 } else { 1 };
        // The depth goes into the `lea`'s displacement, which must stay a disp32.
        let below_sp = if below_sp > RED_ZONE as u32
            && below_sp % 8 == 0
            && i32::try_from(m.displacement() as i64 + below_sp as i64).is_ok()
        {
            below_sp
        } else {
            0
        };
        let mut nj = 0;
        for (k, (off, width)) in checks.iter().take(n).enumerate() {
            let mut shadow_disp = 0i32;
            if k == 0 && below_sp != 0 && frame_local(m) {
                // A frame's local mostly lies above `rsp`: both compares inline.
                self.effective_address(m, below_sp as u64, ip)?;
                self.buf.extend_from_slice(&[0x48, 0x29, 0xE0]); // sub rax, rsp
                self.buf.extend_from_slice(&[0x48, 0x3D]); // cmp rax, below_sp - 128
                self.d32(below_sp - RED_ZONE as u32);
                self.buf.extend_from_slice(&[0x0F, 0x82]); // jb <slow call>
                jumps[nj] = self.buf.len();
                nj += 1;
                self.d32(0);
                self.buf.extend_from_slice(&[0x48, 0x01, 0xE0]); // add rax, rsp
                shadow_disp = -((below_sp / 8) as i32);
            } else if k == 0 && below_sp != 0 {
                self.effective_address(m, below_sp as u64, ip)?;
                self.buf.extend_from_slice(&[0x48, 0x39, 0xE0]); // cmp rax, rsp
                self.buf.extend_from_slice(&[0x0F, 0x83]); // jae <above>
                let jump = self.buf.len();
                self.d32(0);
                self.above_sp.push(AboveSp {
                    jump,
                    resume: self.buf.len(),
                    depth: below_sp,
                    slow: self.slow.len(),
                    ip,
                });
                shadow_disp = -((below_sp / 8) as i32);
            } else {
                self.effective_address(m, *off, ip)?;
            }
            self.buf.extend_from_slice(&[0x48, 0xC1, 0xE8, 0x03]); // shr rax, 3
            self.buf.extend_from_slice(&[0x65, 0x48, 0x03, 0x04, 0x25]); // add rax, gs:[shadow]
            self.d32(c::OFF_SHADOW as u32);
            // cmp <width> [rax (+ shadow_disp)], 0
            let modrm = if shadow_disp == 0 { 0x38 } else { 0xB8 };
            let width = wide.unwrap_or(*width);
            match width {
                1 => self.buf.extend_from_slice(&[0x80, modrm]),
                2 => self.buf.extend_from_slice(&[0x66, 0x83, modrm]),
                4 => self.buf.extend_from_slice(&[0x83, modrm]),
                _ => self.buf.extend_from_slice(&[0x48, 0x83, modrm]),
            }
            if shadow_disp != 0 {
                self.d32(shadow_disp as u32);
            }
            self.buf.push(0x00);
            self.buf.extend_from_slice(&[0x0F, 0x85]); // jne
            if wide.is_some() {
                // jne <exact>
                let jump = self.buf.len();
                self.d32(0);
                self.exact_a.push(ExactA {
                    jump,
                    resume: self.buf.len(),
                    m: *m,
                    slow: self.slow.len(),
                    ip,
                });
                continue;
            }
            jumps[nj] = self.buf.len();
            nj += 1;
            self.d32(0);
        }
        Ok(nj)
    }

    /// A filtered access probe: the shadow checks of every operand, and an out-of-line
    /// clean call (`SlowCall`) when one finds a nonzero byte. With `below_sp` nonzero, also
    /// when an operand addressed through general registers (not `rsp`) starts in
    /// `[rsp - below_sp, rsp - RED_ZONE)` (see `shadow_checks`).
    fn filtered_call(
        &mut self,
        ip: u64,
        rec: u64,
        mem: &[UsedMemory],
        below_sp: u32,
        flags_live: bool,
    ) -> Result<(), TranslateError> {
        self.borrow_rax(ip, flags_live);
        let mut slow = SlowCall::new(ip, rec, flags_live, true);
        for m in mem {
            let mut j = [0usize; 3];
            let general = crate::describe::addressing(m) == Addressing::General;
            let n = self.shadow_checks(m, ip, if general { below_sp } else { 0 }, &mut j, true)?;
            for &p in &j[..n] {
                slow.add_jump(p)?;
            }
        }
        if (self.carry.is_some() && (!flags_live || self.carry_flags))
            || (flags_live && self.carry_past_rax.is_some())
            || self.drop_rax
        {
            // (Carried over the instruction's copy, live flags too where the copy touches
            // none (`Emitter::carry_flags`), or past it with only `rax` given back around
            // it (`Emitter::carry_past_rax`), or ended at it without giving `rax` back:
            // `Emitter::carry_borrow`.)
            self.keep_borrow(slow, flags_live);
            return Ok(());
        }
        self.return_rax(flags_live);
        slow.back = self.buf.len();
        self.mark(ip, 0);
        self.slow.push(slow);
        Ok(())
    }

    /// `rax` = the address of operand `m` (guest registers) plus `off`. The guest `rax` is
    /// in `STUB_RAX`; `rax` itself may hold anything.
    pub(super) fn effective_address(
        &mut self,
        m: &UsedMemory,
        off: u64,
        ip: u64,
    ) -> Result<(), TranslateError> {
        let disp = m.displacement().wrapping_add(off);
        if m.base() == Register::None && m.index() == Register::None {
            self.mov_imm64(0, disp);
        } else {
            if (m.base() == Register::RAX || m.index() == Register::RAX)
                && self.rax_guest_at != self.buf.len()
            {
                self.load_gs(0, c::scratch_off(c::S_STUB_RAX));
            }
            // `[rax]` alone is the guest `rax` just loaded: no `lea rax, [rax]`.
            let rax_alone = disp == 0
                && match (m.base(), m.index()) {
                    (Register::RAX, Register::None) => true,
                    (Register::None, Register::RAX) => m.scale() == 1,
                    _ => false,
                };
            if !rax_alone {
                self.lea_rax(m.base(), m.index(), m.scale(), disp as i64, ip)?;
            }
        }
        if m.segment() == Register::GS {
            self.buf.extend_from_slice(&[0x65, 0x48, 0x03, 0x04, 0x25]); // add rax, gs:[guest_gs]
            self.d32(c::OFF_GUEST_GS as u32);
        }
        if m.segment() == Register::FS {
            self.buf.extend_from_slice(&[0x64, 0x48, 0x03, 0x04, 0x25]); // add rax, fs:[0]
            self.d32(0);
        }
        Ok(())
    }

    /// Places the out-of-line clean calls of filtered probes and trace drains (after the
    /// stubs): each restores the flags where they were saved, then calls with the guest
    /// `rax` still in `STUB_RAX`, and returns to the end of its inline part.
    pub(super) fn finish_slow_calls(&mut self) {
        let slow = core::mem::take(&mut self.slow);
        let reborrow = core::mem::take(&mut self.reborrow);
        let unborrowed = core::mem::take(&mut self.unborrowed);
        let rcx_lent = core::mem::take(&mut self.rcx_lent);
        let mut placed = alloc::vec::Vec::with_capacity(slow.len());
        let tails = SLOW_TAILS.load(core::sync::atomic::Ordering::Relaxed);
        for (index, s) in slow.iter().enumerate() {
            // A kept borrow (`Emitter::keep_borrow`): the call returns to a thunk that
            // borrows again, then continues with `rax` (and the flags) borrowed.
            let kept = reborrow.contains(&index);
            let at = self.buf.len();
            placed.push(at);
            for &j in &s.jumps[..s.njumps] {
                let rel = at as i64 - (j as i64 + 4);
                self.buf[j..j + 4].copy_from_slice(&(rel as i32).to_le_bytes());
            }
            self.clear_span_slots(s.clears_span);
            let lent = rcx_lent.contains(&index);
            if tails != 0 && !(kept && s.skipped_in_own_work) {
                let variant = tail_variant(lent, s.flags_live, s.skipped_in_own_work);
                let entry = tails + (variant * SLOW_TAIL_ROOM) as u64;
                let store = if unborrowed.contains(&index) { 9 } else { 0 };
                let jmp_end = self.here() + store + 7 + 5;
                let rel = (entry as i64).wrapping_sub(jmp_end as i64);
                if rel == rel as i32 as i64 {
                    self.shared_slow_tail(s, kept, store != 0, rel as i32);
                    continue;
                }
            }
            if lent {
                // mov rcx, gs:[saved_rcx]
                self.load_gs(1, c::OFF_VBITS_SAVED_RCX);
            }
            if unborrowed.contains(&index) {
                // mov gs:[STUB_RAX], rax (the guest state is exact before)
                self.push_map_at(self.buf.len(), s.ip, 0);
                self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
            }
            self.push_map_at(self.buf.len(), s.ip, FIX_RAX_IN_STUB);
            if s.skipped_in_own_work && kept {
                // cmp qword gs:[own_work], 0; jne back (still borrowed)
                self.buf.extend_from_slice(&[0x65, 0x48, 0x83, 0x3C, 0x25]);
                self.d32(c::OFF_OWN_WORK as u32);
                self.buf.push(0);
                self.buf.extend_from_slice(&[0x0F, 0x85]);
                let rel = s.back as i64 - (self.buf.len() as i64 + 4);
                self.d32(rel as i32 as u32);
            } else if s.skipped_in_own_work {
                // cmp qword gs:[own_work], 0; je call; (flags back) mov rax, guest rax;
                // jmp back; call:
                self.buf.extend_from_slice(&[0x65, 0x48, 0x83, 0x3C, 0x25]);
                self.d32(c::OFF_OWN_WORK as u32);
                self.buf.push(0);
                self.buf.extend_from_slice(&[0x0F, 0x84]);
                let call = self.buf.len();
                self.d32(0);
                if s.flags_live {
                    self.restore_probe_flags();
                }
                self.load_gs(0, c::scratch_off(c::S_STUB_RAX));
                self.buf.push(0xE9);
                let rel = s.back as i64 - (self.buf.len() as i64 + 4);
                self.d32(rel as i32 as u32);
                let rel = (self.buf.len() - (call + 4)) as u32;
                self.buf[call..call + 4].copy_from_slice(&rel.to_le_bytes());
            }
            if s.flags_live {
                self.restore_probe_flags();
            }
            self.buf.extend_from_slice(&[0x48, 0x8D, 0x05]); // lea rax, [rip+back]
            let ret_disp = self.buf.len();
            let rel = s.back as i64 - (self.buf.len() as i64 + 4);
            self.d32(rel as i32 as u32);
            self.store_gs(0, c::scratch_off(c::S_PROBE_RET));
            self.mov_imm64(0, s.rec);
            self.jmp_gs(c::OFF_PROBE_ENTRY);
            if s.exit {
                // The call returns to the side exit (guest state exact).
                let thunk = self.buf.len();
                let rel = (thunk - (ret_disp + 4)) as u32;
                self.buf[ret_disp..ret_disp + 4].copy_from_slice(&rel.to_le_bytes());
                self.exit_thunk(s.ip);
            } else if kept {
                // thunk: (guest state exact) borrow rax and the flags again; jmp back
                let thunk = self.buf.len();
                let rel = (thunk - (ret_disp + 4)) as u32;
                self.buf[ret_disp..ret_disp + 4].copy_from_slice(&rel.to_le_bytes());
                self.push_map_at(thunk, s.ip, 0);
                self.borrow_again(s.ip, s.flags_live);
                self.buf.push(0xE9);
                let rel = s.back as i64 - (self.buf.len() as i64 + 4);
                self.d32(rel as i32 as u32);
            }
        }
        // The upper halves of the below-the-stack-pointer compares: `rax` = address +
        // depth; `sub rax, rsp; cmp rax, depth - 128; jb <slow call>; add rax, rsp;
        // jmp <resume>`.
        for a in core::mem::take(&mut self.above_sp) {
            let at = self.buf.len();
            let rel = at as i64 - (a.jump as i64 + 4);
            self.buf[a.jump..a.jump + 4].copy_from_slice(&(rel as i32).to_le_bytes());
            self.push_map_at(at, a.ip, FIX_RAX_IN_STUB);
            self.buf.extend_from_slice(&[0x48, 0x29, 0xE0]); // sub rax, rsp
            self.buf.extend_from_slice(&[0x48, 0x3D]); // cmp rax, depth - 128
            self.d32(a.depth - RED_ZONE as u32);
            self.buf.extend_from_slice(&[0x0F, 0x82]); // jb <slow call>
            let rel = placed[a.slow] as i64 - (self.buf.len() as i64 + 4);
            self.d32(rel as i32 as u32);
            self.buf.extend_from_slice(&[0x48, 0x01, 0xE0]); // add rax, rsp
            self.buf.push(0xE9); // jmp <resume>
            let rel = a.resume as i64 - (self.buf.len() as i64 + 4);
            self.d32(rel as i32 as u32);
        }
        // The thunks to definedness's stack-split routine.
        for x in core::mem::take(&mut self.stack_split) {
            self.stack_split_thunk(&x, placed[x.slow]);
        }
        // The exact halves of the wide addressability compares.
        for x in core::mem::take(&mut self.exact_a) {
            let at = self.buf.len();
            let rel = at as i64 - (x.jump as i64 + 4);
            self.buf[x.jump..x.jump + 4].copy_from_slice(&(rel as i32).to_le_bytes());
            self.push_map_at(at, x.ip, FIX_RAX_IN_STUB);
            let slow_at = placed[x.slow];
            if self.exact_a_checks(&x, slow_at).is_err() {
                // (The inline part encoded the same addresses, so this cannot happen; were
                // it to, the slow call's check is the exact one.)
                self.buf.truncate(at);
                self.jmp_to(slow_at);
                continue;
            }
            self.jmp_to(x.resume);
        }
        // The copies of store copies' registers that are not all defined.
        for x in core::mem::take(&mut self.store_copies) {
            self.store_copy_cold(&x);
        }
        self.unmark();
    }
}

/// Host address of the code-cache arena's shared slow-call tails (`slow_call_tails`) for
/// the block being translated; 0: none, each slow call is whole in its block. Set by the
/// code cache, under its lock, before each translation.
static SLOW_TAILS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// Bytes from one variant's shared tail to the next (`slow_call_tails`).
const SLOW_TAIL_ROOM: usize = 128;

/// Says which shared slow-call tails (0: none) the next translations may jump to.
pub(crate) fn set_slow_tails(at: u64) {
    SLOW_TAILS.store(at, core::sync::atomic::Ordering::Relaxed);
}

/// Which shared tail a slow call takes: what it gives back first (`rcx`, the flags) and
/// whether the embedder's own work skips it.
fn tail_variant(rcx_lent: bool, flags_live: bool, skipped_in_own_work: bool) -> usize {
    rcx_lent as usize | (flags_live as usize) << 1 | (skipped_in_own_work as usize) << 2
}

/// The shared halves of slow calls, one per [`tail_variant`], [`SLOW_TAIL_ROOM`] bytes
/// apart, for code placed at host address `base` (one copy per code-cache arena). A slow
/// call keeps in its block only what differs from one to the next (`shared_slow_tail`):
///
/// ```text
/// (unborrowed) mov gs:[STUB_RAX], rax
/// lea rax, [rip+rec]; jmp tail[variant]; rec: dq record; ret: (thunk or) jmp back
/// ```
///
/// and the tail does the rest of what `finish_slow_calls` emits for each call: gives
/// `rcx` back, sets the return to `ret` (just after the record), restores the flags,
/// skips the call in the embedder's own work (to `ret`, guest `rax` back), and enters the
/// probe with the record. Engine code with no guest pc, as a block's out-of-line part is.
pub(crate) fn slow_call_tails(base: u64) -> alloc::vec::Vec<u8> {
    let mut e = Emitter::new(0, base, false);
    e.unmark();
    for variant in 0..8 {
        let start = variant * SLOW_TAIL_ROOM;
        while e.buf.len() < start {
            e.buf.push(0xCC);
        }
        if variant & 1 != 0 {
            // mov rcx, gs:[saved_rcx]
            e.load_gs(1, c::OFF_VBITS_SAVED_RCX);
        }
        // lea rax, [rax+8]; mov gs:[probe_ret], rax: the return, past the record.
        e.buf.extend_from_slice(&[0x48, 0x8D, 0x40, 0x08]);
        e.store_gs(0, c::scratch_off(c::S_PROBE_RET));
        if variant & 4 != 0 {
            // cmp qword gs:[own_work], 0; je call; (flags back) mov rax, guest rax;
            // jmp gs:[probe_ret]; call:
            e.buf.extend_from_slice(&[0x65, 0x48, 0x83, 0x3C, 0x25]);
            e.d32(c::OFF_OWN_WORK as u32);
            e.buf.push(0);
            e.buf.extend_from_slice(&[0x74, 0x00]);
            let call = e.buf.len();
            if variant & 2 != 0 {
                e.restore_probe_flags();
            }
            e.load_gs(0, c::scratch_off(c::S_STUB_RAX));
            e.jmp_gs(c::scratch_off(c::S_PROBE_RET));
            e.buf[call - 1] = (e.buf.len() - call) as u8;
        }
        if variant & 2 != 0 {
            e.restore_probe_flags();
        }
        // mov rax, gs:[probe_ret]; mov rax, [rax-8]; jmp gs:[probe_entry]
        e.load_gs(0, c::scratch_off(c::S_PROBE_RET));
        e.buf.extend_from_slice(&[0x48, 0x8B, 0x40, 0xF8]);
        e.jmp_gs(c::OFF_PROBE_ENTRY);
        assert!(e.buf.len() <= start + SLOW_TAIL_ROOM);
    }
    while e.buf.len() % 16 != 0 {
        e.buf.push(0xCC);
    }
    e.buf
}

/// Host address of the code-cache arena's shared recent-lines routines
/// (`recent_line_routines`) for the block being translated; 0: none, each check's
/// out-of-line part is whole in its block. Set by the code cache, under its lock, before
/// each translation.
static RECENT_ROUTINES: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// Bytes from one variant of the recent-lines routine to the next.
const RECENT_ROUTINE_ROOM: usize = 704;

/// Variants of the recent-lines routine: per what the check keeps borrowed over its
/// instruction and whether the flags were saved ([`recent_routine_variant`]).
const RECENT_ROUTINE_VARIANTS: usize = 5;

/// Where a call site's data lies from the routine's return address, which is the site's
/// `jmp back` (5 bytes): the record's tag (u32), its `size | kind << 16` (u32), the room
/// (`line bytes - recent_clamp`, u32: the largest offset in a line of an access within
/// it), the drain's record (u64, 0: none).
const SITE_TAG: i8 = 5;
const SITE_WORD: i8 = 9;
const SITE_ROOM: i8 = 13;
const SITE_REC: i8 = 17;
/// Where a kept borrow's thunk starts (after the data): the drain returns there.
const SITE_THUNK: i8 = 25;

/// Each variant's (what is kept, whether the flags were saved): see
/// [`recent_routine_variant`].
const ROUTINE_VARIANTS: [(Keep, bool); RECENT_ROUTINE_VARIANTS] = [
    (Keep::No, false),
    (Keep::No, true),
    (Keep::Rax, false),
    (Keep::Rax, true),
    (Keep::RaxAndFlags, true),
];

/// Says which shared recent-lines routines (0: none) the next translations may call.
pub(crate) fn set_recent_routines(at: u64) {
    RECENT_ROUTINES.store(at, core::sync::atomic::Ordering::Relaxed);
}

/// Which variant of the recent-lines routine a check takes.
fn recent_routine_variant(keep: Keep, flags_live: bool) -> usize {
    match (keep, flags_live) {
        (Keep::No, false) => 0,
        (Keep::No, true) => 1,
        (Keep::Rax, false) => 2,
        (Keep::Rax, true) => 3,
        (Keep::RaxAndFlags, _) => 4,
    }
}

/// Whether translations get shared recent-lines routines: the data table has two ways.
pub(crate) fn recent_routines_wanted() -> bool {
    crate::recent_lines::two_ways()
}

/// The shared out-of-line part of the two-way recent-lines check
/// ([`Emitter::check_recent_two_ways`]), one per [`recent_routine_variant`],
/// [`RECENT_ROUTINE_ROOM`] bytes apart, for code placed at host address `base` (one copy
/// per code-cache arena, reached by a `call rel32`). Each check used to carry its own
/// copy (second way, new line, straddle, record, drain: 500 to 600 bytes); its block now
/// keeps only the call and the data that differs (`Emitter::finish_recent_cold`):
///
/// ```text
///     (restore rcx); rax = address; lea rsp, [rsp - 128]; call routine[variant]
/// R:  jmp back; dd tag, size | kind << 16, room; dq drain record
///     (kept: borrow again; jmp back)                      (the drain returns here)
/// ```
///
/// The return address lies beyond the guest's red zone, as `trace_checks`' calls' (see
/// there why a signal frame may land there at any instruction anyway). The routine saves
/// `rcx` and `rdx` below it, and reads the data through the return address. It tests the
/// second way first, as the inline check tests the first (most calls are second-way
/// hits: 60% on xz), with the site's room (`line bytes - access bytes`) from its data:
///
/// ```text
///     push rcx; push rdx
///     rcx = the address's slot; add rax, SECOND[slot]; edx = room; cmp rax, rdx; ja other
///     swap FIRST[slot] and SECOND[slot]; xor byte SWAPS[slot], 1     (skipped)
///     pop rdx; pop rcx; give back per variant; ret 128
/// other:
///     sub rax, SECOND[slot] (the address); push rax
///     and eax, line bytes - 1; cmp rax, rdx; ja straddle
///     sub rax, [rsp]                                   (the key: `recent_lines::data_key`)
///     SECOND[slot] = FIRST[slot]; FIRST[slot] = rax    (a new first)
/// new:
///     eax = SWAPS[slot] << 24; SWAPS[slot] = 0; jmp append
/// straddle:
///     both lines their slots' first: jmp done         (skipped)
///     each line (bit 0, bit 1): first unless it is, the first to second; its swap bit
///     gathered and cleared; eax = bits << 24
/// append:
///     record (address, tag, word | eax) at gs:[TRACE_PTR], advanced; beyond TRACE_END:
///     jmp full
/// done:
///     pop rax; pop rdx; pop rcx; give back per variant; ret 128
/// full:
///     (no drain record: jmp done); pop rax; pop rdx; pop rcx
///     PROBE_RET = R (or R + thunk, kept); the flags back; rax = record
///     lea rsp, [rsp + 136]; jmp gs:[probe_entry]
/// ```
///
/// What it does is what the per-check code did, step by step (the same table updates and
/// records); engine code with no guest pc, as a block's out-of-line part is.
pub(crate) fn recent_line_routines(base: u64) -> alloc::vec::Vec<u8> {
    match crate::recent_lines::geometry(crate::recent_lines::Table::Data) {
        Some(geometry) => recent_line_routines_for(base, geometry),
        None => alloc::vec::Vec::new(),
    }
}

/// [`recent_line_routines`] for a table of lines of `1 << shift` bytes in `slots` slots.
fn recent_line_routines_for(base: u64, (shift, slots): (u32, u32)) -> alloc::vec::Vec<u8> {
    let mut e = Emitter::new(0, base, false);
    e.unmark();
    let first = c::RECENT_LINES_OFF as u32;
    let second = c::RECENT_SECOND_LINES_OFF as u32;
    let swaps = c::RECENT_SWAPS_OFF as u32;
    for (variant, &(keep, flags_live)) in ROUTINE_VARIANTS.iter().enumerate() {
        let start = variant * RECENT_ROUTINE_ROOM;
        while e.buf.len() < start {
            e.buf.push(0xCC);
        }
        debug_assert_eq!(recent_routine_variant(keep, flags_live), variant);
        let b = &mut e.buf;
        // The second way first (most calls): the slot, and the address's offset in the
        // slot's second line, bounded by the site's room as the inline check bounds the
        // first's; `rax` is not saved on this path, which leaves it clobbered anyway.
        b.extend_from_slice(&[0x51, 0x52]); // push rcx; push rdx
        b.extend_from_slice(&[0x48, 0x89, 0xC1]); // mov rcx, rax
        b.extend_from_slice(&[0x48, 0xC1, 0xE9, shift as u8]); // shr rcx, shift
        e.recent_slot_mask(slots);
        let b = &mut e.buf;
        b.extend_from_slice(&[0x65, 0x48, 0x03, 0x04, 0xCD]); // add rax, SECOND[rcx*8]
        b.extend_from_slice(&second.to_le_bytes());
        b.extend_from_slice(&[0x48, 0x8B, 0x54, 0x24, 0x10]); // mov rdx, [rsp+16] (R)
        b.extend_from_slice(&[0x8B, 0x52, SITE_ROOM as u8]); // mov edx, [rdx+ROOM]
        b.extend_from_slice(&[0x48, 0x39, 0xD0]); // cmp rax, rdx
        b.extend_from_slice(&[0x0F, 0x87]); // ja other
        let to_other = b.len();
        e.d32(0);
        // The second way: the two lines change places, the swap bit flips (skipped).
        let b = &mut e.buf;
        b.extend_from_slice(&[0x65, 0x48, 0x8B, 0x04, 0xCD]); // mov rax, SECOND[rcx*8]
        b.extend_from_slice(&second.to_le_bytes());
        b.extend_from_slice(&[0x65, 0x48, 0x8B, 0x14, 0xCD]); // mov rdx, FIRST[rcx*8]
        b.extend_from_slice(&first.to_le_bytes());
        b.extend_from_slice(&[0x65, 0x48, 0x89, 0x04, 0xCD]); // mov FIRST[rcx*8], rax
        b.extend_from_slice(&first.to_le_bytes());
        b.extend_from_slice(&[0x65, 0x48, 0x89, 0x14, 0xCD]); // mov SECOND[rcx*8], rdx
        b.extend_from_slice(&second.to_le_bytes());
        b.extend_from_slice(&[0x65, 0x80, 0x34, 0x0D]); // xor byte SWAPS[rcx], 1
        b.extend_from_slice(&swaps.to_le_bytes());
        b.push(1);
        b.extend_from_slice(&[0x5A, 0x59]); // pop rdx; pop rcx
        e.give_back(flags_live, keep);
        e.buf.extend_from_slice(&[0xC2, 128, 0]); // ret 128
                                                  // other: the address back and saved, as the rest of the routine has it; an access
                                                  // whose offset in its line exceeds the room straddles.
        e.patch_rel32(to_other);
        let b = &mut e.buf;
        b.extend_from_slice(&[0x65, 0x48, 0x2B, 0x04, 0xCD]); // sub rax, SECOND[rcx*8]
        b.extend_from_slice(&second.to_le_bytes());
        b.push(0x50); // push rax
        b.push(0x25); // and eax, line - 1
        b.extend_from_slice(&((1u32 << shift) - 1).to_le_bytes());
        b.extend_from_slice(&[0x48, 0x39, 0xD0]); // cmp rax, rdx
        b.extend_from_slice(&[0x0F, 0x87]); // ja straddle
        let to_straddle = b.len();
        e.d32(0);
        // A new line (neither of the slot's, within one line): first, the first to second.
        // Its key is its offset in the line less the address.
        let b = &mut e.buf;
        b.extend_from_slice(&[0x48, 0x2B, 0x04, 0x24]); // sub rax, [rsp] (the line's key)
        b.extend_from_slice(&[0x65, 0x48, 0x8B, 0x14, 0xCD]); // mov rdx, FIRST[rcx*8]
        b.extend_from_slice(&first.to_le_bytes());
        b.extend_from_slice(&[0x65, 0x48, 0x89, 0x14, 0xCD]); // mov SECOND[rcx*8], rdx
        b.extend_from_slice(&second.to_le_bytes());
        b.extend_from_slice(&[0x65, 0x48, 0x89, 0x04, 0xCD]); // mov FIRST[rcx*8], rax
        b.extend_from_slice(&first.to_le_bytes());
        // new: the record's swap bit is the slot's, which is cleared.
        e.buf.extend_from_slice(&[0x65, 0x0F, 0xB6, 0x04, 0x0D]); // movzx eax, SWAPS[rcx]
        e.d32(swaps);
        e.buf.extend_from_slice(&[0x65, 0xC6, 0x04, 0x0D]); // mov byte SWAPS[rcx], 0
        e.d32(swaps);
        e.buf.push(0);
        e.buf.extend_from_slice(&[0xC1, 0xE0, 24]); // shl eax, 24
        e.buf.push(0xE9); // jmp append
        let new_append = e.buf.len();
        e.d32(0);
        // straddle: both lines their slots' first is skipped.
        e.patch_rel32(to_straddle);
        let mut to_record = [0usize; 2];
        e.buf.extend_from_slice(&[0x48, 0x8B, 0x04, 0x24]); // mov rax, [rsp] (address)
        e.buf.extend_from_slice(&[0x48, 0xC1, 0xE8, shift as u8]); // shr rax, shift
        for (k, j) in to_record.iter_mut().enumerate() {
            if k == 1 {
                e.buf.extend_from_slice(&[0x48, 0xFF, 0xC0]); // inc rax: the next line
            }
            e.recent_slot_of_rax(slots);
            // rdx = the line's key
            e.buf.extend_from_slice(&[0x48, 0x89, 0xC2]); // mov rdx, rax
            e.buf.extend_from_slice(&[0x48, 0xC1, 0xE2, shift as u8]); // shl rdx, shift
            e.buf.extend_from_slice(&[0x48, 0xF7, 0xDA]); // neg rdx
            e.buf.extend_from_slice(&[0x65, 0x48, 0x3B, 0x14, 0xCD]); // cmp rdx, FIRST
            e.d32(first);
            e.buf.extend_from_slice(&[0x0F, 0x85]); // jne record
            *j = e.buf.len();
            e.d32(0);
        }
        e.buf.push(0xE9); // jmp done
        let straddle_done = e.buf.len();
        e.d32(0);
        for j in to_record {
            e.patch_rel32(j);
        }
        // Each line in turn: first unless it is (the first moving to second), its slot's
        // swap bit gathered (line 0 in edx, line 1 then added) and cleared.
        for k in 0..2 {
            e.buf.extend_from_slice(&[0x48, 0x8B, 0x04, 0x24]); // mov rax, [rsp]
            if k == 1 {
                // (its last byte: line bytes - 1 - room on)
                e.buf.extend_from_slice(&[0x48, 0x8B, 0x4C, 0x24, 0x18]); // mov rcx, [rsp+24]
                e.buf.extend_from_slice(&[0x8B, 0x49, SITE_ROOM as u8]); // mov ecx, [rcx+ROOM]
                e.buf.extend_from_slice(&[0x48, 0x29, 0xC8]); // sub rax, rcx
                e.buf.extend_from_slice(&[0x48, 0x05]); // add rax, line bytes - 1
                e.d32((1u32 << shift) - 1);
            }
            e.recent_key_and_slot((shift, slots));
            e.buf.extend_from_slice(&[0x65, 0x48, 0x3B, 0x04, 0xCD]); // cmp rax, FIRST
            e.d32(first);
            e.buf.extend_from_slice(&[0x0F, 0x84]); // je same
            let same = e.buf.len();
            e.d32(0);
            e.buf.extend_from_slice(&[0x65, 0x48, 0x33, 0x04, 0xCD]); // xor rax, FIRST
            e.d32(first);
            e.buf.extend_from_slice(&[0x65, 0x48, 0x31, 0x04, 0xCD]); // xor FIRST, rax
            e.d32(first);
            e.buf.extend_from_slice(&[0x65, 0x48, 0x33, 0x04, 0xCD]); // xor rax, FIRST
            e.d32(first);
            e.buf.extend_from_slice(&[0x65, 0x48, 0x89, 0x04, 0xCD]); // mov SECOND, rax
            e.d32(second);
            e.patch_rel32(same);
            if k == 0 {
                e.buf.extend_from_slice(&[0x65, 0x0F, 0xB6, 0x14, 0x0D]); // movzx edx, SWAPS[rcx]
            } else {
                e.buf.extend_from_slice(&[0x65, 0x0F, 0xB6, 0x04, 0x0D]); // movzx eax, SWAPS[rcx]
            }
            e.d32(swaps);
            e.buf.extend_from_slice(&[0x65, 0xC6, 0x04, 0x0D]); // mov byte SWAPS[rcx], 0
            e.d32(swaps);
            e.buf.push(0);
        }
        e.buf.extend_from_slice(&[0x01, 0xC0]); // add eax, eax
        e.buf.extend_from_slice(&[0x09, 0xD0]); // or eax, edx
        e.buf.extend_from_slice(&[0xC1, 0xE0, 24]); // shl eax, 24
                                                    // append: eax = the swap bits << 24.
        e.patch_rel32(new_append);
        let b = &mut e.buf;
        b.extend_from_slice(&[0x48, 0x8B, 0x54, 0x24, 0x18]); // mov rdx, [rsp+24] (R)
        b.extend_from_slice(&[0x0B, 0x42, SITE_WORD as u8]); // or eax, [rdx+WORD]
        e.load_gs(1, c::OFF_TRACE_PTR);
        let b = &mut e.buf;
        b.extend_from_slice(&[0x89, 0x41, 0x0C]); // mov [rcx+12], eax
        b.extend_from_slice(&[0x8B, 0x42, SITE_TAG as u8]); // mov eax, [rdx+TAG]
        b.extend_from_slice(&[0x89, 0x41, 0x08]); // mov [rcx+8], eax
        b.extend_from_slice(&[0x48, 0x8B, 0x04, 0x24]); // mov rax, [rsp]
        b.extend_from_slice(&[0x48, 0x89, 0x01]); // mov [rcx], rax
        b.extend_from_slice(&[0x48, 0x8D, 0x49, 0x10]); // lea rcx, [rcx+16]
        e.store_gs(1, c::OFF_TRACE_PTR);
        e.buf.extend_from_slice(&[0x65, 0x48, 0x3B, 0x0C, 0x25]); // cmp rcx, gs:[TRACE_END]
        e.d32(c::OFF_TRACE_END as u32);
        e.buf.extend_from_slice(&[0x0F, 0x83]); // jae full
        let to_full = e.buf.len();
        e.d32(0);
        // done: what the variant gives back, and the return.
        e.patch_rel32(straddle_done);
        let done = e.buf.len();
        e.buf.extend_from_slice(&[0x58, 0x5A, 0x59]); // pop rax; pop rdx; pop rcx
        e.give_back(flags_live, keep);
        e.buf.extend_from_slice(&[0xC2, 128, 0]); // ret 128
                                                  // full: the drain's clean call, returning to R (guest state exact) or, where the
                                                  // borrow is kept, to the site's thunk that borrows again.
        e.patch_rel32(to_full);
        let b = &mut e.buf;
        b.extend_from_slice(&[0x48, 0x8B, 0x44, 0x24, 0x18]); // mov rax, [rsp+24]
        b.extend_from_slice(&[0x48, 0x83, 0x78, SITE_REC as u8, 0]); // cmp qword [rax+REC], 0
        b.extend_from_slice(&[0x0F, 0x84]); // je done (no record: never leave)
        let rel = done as i64 - (b.len() as i64 + 4);
        e.d32(rel as i32 as u32);
        e.buf.extend_from_slice(&[0x58, 0x5A, 0x59]); // pop rax; pop rdx; pop rcx
        e.buf.extend_from_slice(&[0x48, 0x8B, 0x04, 0x24]); // mov rax, [rsp] (R)
        if keep != Keep::No {
            e.buf
                .extend_from_slice(&[0x48, 0x8D, 0x40, SITE_THUNK as u8]); // lea rax, [rax+THUNK]
        }
        e.store_gs(0, c::scratch_off(c::S_PROBE_RET));
        if flags_live {
            e.restore_probe_flags();
        }
        e.buf.extend_from_slice(&[0x48, 0x8B, 0x04, 0x24]); // mov rax, [rsp] (R)
        e.buf.extend_from_slice(&[0x48, 0x8B, 0x40, SITE_REC as u8]); // mov rax, [rax+REC]
        e.buf.extend_from_slice(&[0x48, 0x8D, 0xA4, 0x24]); // lea rsp, [rsp+136]
        e.d32(128 + 8);
        e.jmp_gs(c::OFF_PROBE_ENTRY);
        assert!(e.buf.len() <= start + RECENT_ROUTINE_ROOM);
    }
    while e.buf.len() & 15 != 0 {
        e.buf.push(0xCC);
    }
    e.buf
}

impl Emitter {
    /// The in-block half of slow call `s` whose shared tail is `rel` from the end of its
    /// `jmp` (see [`slow_call_tails`]); `store`: it saves the guest `rax` first.
    fn shared_slow_tail(&mut self, s: &SlowCall, kept: bool, store: bool, rel: i32) {
        if store {
            // mov gs:[STUB_RAX], rax (the guest state is exact before)
            self.push_map_at(self.buf.len(), s.ip, 0);
            self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
        }
        self.push_map_at(self.buf.len(), s.ip, FIX_RAX_IN_STUB);
        // lea rax, [rip+rec]; jmp tail; rec: dq record
        self.buf.extend_from_slice(&[0x48, 0x8D, 0x05, 5, 0, 0, 0]);
        self.buf.push(0xE9);
        self.d32(rel as u32);
        self.buf.extend_from_slice(&s.rec.to_le_bytes());
        // ret: the call returns here, guest state exact.
        self.push_map_at(self.buf.len(), s.ip, 0);
        if s.exit {
            self.exit_thunk(s.ip);
            return;
        }
        if kept {
            // thunk: borrow rax and the flags again; jmp back
            self.borrow_again(s.ip, s.flags_live);
        }
        self.jmp_to(s.back);
    }

    /// The side exit of a definedness slow call at guest `ip` whose block relies on that
    /// instruction's fast path later (`definedness::Proofs`), entered with the guest state
    /// exact after the step: marks the step made and due again (the block at `ip` then
    /// goes slow at once, and `definedness::step` skips it), and enters the dispatcher for
    /// `ip` as an unlinked exit stub does. No stub: side exits are rare, and a stub per
    /// exit (with the cache's record of it, waiting for a block at its target that is
    /// seldom made) cost python3 8 MB of peak RSS.
    ///
    /// ```text
    ///     mov byte gs:[need_step], 1      (its byte alone: `ThreadCtx::vbits_need_step`)
    ///     mov gs:[STUB_RAX], rax; mov rax, ip; mov gs:[stepped_pc], rax
    ///     jmp gs:[dispatch]
    /// ```
    fn exit_thunk(&mut self, ip: u64) {
        self.push_map_at(self.buf.len(), ip, 0);
        self.buf.extend_from_slice(&[0x65, 0xC6, 0x04, 0x25]);
        self.d32(c::OFF_VBITS_NEED_STEP as u32);
        self.buf.push(1);
        self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.push_map_at(self.buf.len(), ip, FIX_RAX_IN_STUB);
        self.mov_imm64(0, ip);
        self.store_gs(0, c::OFF_VBITS_STEPPED_PC);
        self.jmp_gs(c::OFF_DISPATCH);
    }

    /// The compares of an [`ExactA`], each into the slow call at `slow_at`: whether every
    /// byte of the operand is addressable in ASan's encoding of the shadow (Memcheck's, the
    /// one tool with filtered calls; see [`oxgrind_tool::instrument::Plan::accesses_filtered`]):
    /// the granules before its last byte's are 0, and its last byte's is 0 or `k` in 1..=7
    /// with the byte among the granule's first `k`. The last granule of a block whose size
    /// is not a multiple of 8 is such a `k`: a string's or a small array's tail, read and
    /// written by every `memcmp`, `memcpy` and inlined `memset` of it, which went to the
    /// clean call each time (4.7 million calls on bench `churn`).
    fn exact_a_checks(&mut self, x: &ExactA, slow_at: usize) -> Result<(), TranslateError> {
        let size = x.m.memory_size().size() as u64;
        let last = size - 1;
        if size > 8 {
            // The granules before the last byte's are exactly those of `[a, a + size - 8)`.
            let before = size - 8;
            let width = match before {
                0..=8 => 1,
                9..=16 => 2,
                17..=32 => 4,
                _ => 8,
            };
            self.granules_zero(&x.m, 0, width, x.ip, slow_at)?;
            if before > 1 {
                self.granules_zero(&x.m, before - 1, 1, x.ip, slow_at)?;
            }
        } else if size > 1 {
            // The first byte's granule, unless it is the last byte's: `(a & 7) <= 8 - size`.
            self.effective_address(&x.m, 0, x.ip)?;
            self.buf.extend_from_slice(&[0x83, 0xE0, 0x07]); // and eax, 7
            self.buf.extend_from_slice(&[0x83, 0xF8, (8 - size) as u8]); // cmp eax, 8 - size
            self.buf.extend_from_slice(&[0x0F, 0x86]); // jbe <one granule>
            let one = self.buf.len();
            self.d32(0);
            self.granules_zero(&x.m, 0, 1, x.ip, slow_at)?;
            let rel = (self.buf.len() - (one + 4)) as u32;
            self.buf[one..one + 4].copy_from_slice(&rel.to_le_bytes());
        }
        // The last byte's granule: 0, or `k` in 1..=7 above the byte's place in it. `k`
        // waits in a scratch slot free here (`S_FAR_SAVE` holds a register only across an
        // instruction's own copy; no signal handler writes it) while `rax` makes the place.
        self.effective_address(&x.m, last, x.ip)?;
        self.buf.extend_from_slice(&[0x48, 0xC1, 0xE8, 0x03]); // shr rax, 3
        self.buf.extend_from_slice(&[0x65, 0x48, 0x03, 0x04, 0x25]); // add rax, gs:[shadow]
        self.d32(c::OFF_SHADOW as u32);
        self.buf.extend_from_slice(&[0x0F, 0xB6, 0x00]); // movzx eax, byte [rax]
        self.buf.extend_from_slice(&[0x85, 0xC0]); // test eax, eax
        self.buf.extend_from_slice(&[0x0F, 0x84]); // jz <addressable>
        let done = self.buf.len();
        self.d32(0);
        self.buf.extend_from_slice(&[0x83, 0xF8, 0x08]); // cmp eax, 8
        self.jae_to(slow_at);
        self.store_gs(0, c::scratch_off(c::S_FAR_SAVE));
        self.effective_address(&x.m, last, x.ip)?;
        self.buf.extend_from_slice(&[0x83, 0xE0, 0x07]); // and eax, 7
        self.buf.extend_from_slice(&[0x65, 0x3B, 0x04, 0x25]); // cmp eax, gs:[k]
        self.d32(c::scratch_off(c::S_FAR_SAVE) as u32);
        self.jae_to(slow_at);
        let rel = (self.buf.len() - (done + 4)) as u32;
        self.buf[done..done + 4].copy_from_slice(&rel.to_le_bytes());
        Ok(())
    }

    /// `jae <at>` (rel32).
    fn jae_to(&mut self, at: usize) {
        self.buf.extend_from_slice(&[0x0F, 0x83]);
        let rel = at as i64 - (self.buf.len() as i64 + 4);
        self.d32(rel as i32 as u32);
    }

    /// Compares the `width` shadow bytes from the granule of operand `m`'s byte `off` with
    /// 0, `jne` to the slow call at `slow_at`.
    fn granules_zero(
        &mut self,
        m: &UsedMemory,
        off: u64,
        width: u8,
        ip: u64,
        slow_at: usize,
    ) -> Result<(), TranslateError> {
        self.effective_address(m, off, ip)?;
        self.buf.extend_from_slice(&[0x48, 0xC1, 0xE8, 0x03]); // shr rax, 3
        self.buf.extend_from_slice(&[0x65, 0x48, 0x03, 0x04, 0x25]); // add rax, gs:[shadow]
        self.d32(c::OFF_SHADOW as u32);
        match width {
            1 => self.buf.extend_from_slice(&[0x80, 0x38]), // cmp byte [rax], 0
            2 => self.buf.extend_from_slice(&[0x66, 0x83, 0x38]), // cmp word [rax], 0
            4 => self.buf.extend_from_slice(&[0x83, 0x38]), // cmp dword [rax], 0
            _ => self.buf.extend_from_slice(&[0x48, 0x83, 0x38]), // cmp qword [rax], 0
        }
        self.buf.push(0x00);
        self.buf.extend_from_slice(&[0x0F, 0x85]); // jne <slow call>
        let rel = slow_at as i64 - (self.buf.len() as i64 + 4);
        self.d32(rel as i32 as u32);
        Ok(())
    }
}

/// Whether operand `m` has the form of a local of a frame with a frame pointer,
/// `[rbp - d]` (unoptimised code's every local): where its address mostly lies (in the
/// stack), for the layout of the below-the-stack-pointer compare; optimised code that uses
/// `rbp` as a general register mostly indexes it or adds to it.
fn frame_local(m: &UsedMemory) -> bool {
    m.base() == Register::RBP && m.index() == Register::None && (m.displacement() as i64) < 0
}

#[cfg(test)]
mod shared_tail_tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic, Register};

    /// Each variant of the recent-lines routine decodes whole within its room; every branch
    /// lands on one of its own instructions and no instruction is unreachable; its pushes
    /// and pops balance on every path; it leaves only by `ret 128` (every path that needs no
    /// drain) or by `jmp gs:[probe_entry]` (the drain); and it gives back what its variant
    /// says on each way out: the guest `rax` (`mov rax, gs:[STUB_RAX]`) unless the borrow
    /// is kept, the flags (`sahf`) where they were saved and are not kept, and on the
    /// drain's way the flags wherever they were saved.
    #[test]
    fn recent_line_routines_are_well_formed_and_give_back_what_they_keep_not() {
        let base = 0x7000_0000_0000u64;
        let code = recent_line_routines_for(base, (6, 64));
        assert!(code.len() <= RECENT_ROUTINE_VARIANTS * RECENT_ROUTINE_ROOM + 16);
        for (variant, &(keep, flags)) in ROUTINE_VARIANTS.iter().enumerate() {
            assert_eq!(recent_routine_variant(keep, flags), variant);
            let start = variant * RECENT_ROUTINE_ROOM;
            let end = (start + RECENT_ROUTINE_ROOM).min(code.len());
            let at = base + start as u64;
            let ins: alloc::vec::Vec<_> =
                Decoder::with_ip(64, &code[start..end], at, DecoderOptions::NONE)
                    .into_iter()
                    .take_while(|i| i.mnemonic() != Mnemonic::Int3)
                    .collect();
            assert!(ins.iter().all(|i| !i.is_invalid()), "variant {variant}");
            let pos = |ip: u64| ins.iter().position(|i| i.ip() == ip);
            let mut seen = alloc::vec![None; ins.len()];
            // (instruction, depth, rax given back, flags given back on this path)
            let mut todo = alloc::vec![(0usize, 0i32, false, 0u32)];
            let (mut rets, mut drains) = (0, 0);
            while let Some((mut k, mut depth, mut rax_back, mut sahf)) = todo.pop() {
                loop {
                    let i = &ins[k];
                    if seen[k] == Some(depth) && i.flow_control() != FlowControl::Next {
                        break;
                    }
                    assert!(
                        seen[k].is_none() || seen[k] == Some(depth),
                        "variant {variant}"
                    );
                    seen[k] = Some(depth);
                    match i.mnemonic() {
                        Mnemonic::Push => depth += 1,
                        Mnemonic::Pop => depth -= 1,
                        Mnemonic::Sahf => sahf += 1,
                        _ => {}
                    }
                    if i.mnemonic() == Mnemonic::Mov
                        && i.op0_register() == Register::RAX
                        && i.segment_prefix() == Register::GS
                        && i.memory_displacement64() as usize == c::scratch_off(c::S_STUB_RAX)
                    {
                        rax_back = true;
                    }
                    match i.flow_control() {
                        FlowControl::Return => {
                            assert_eq!(i.immediate16(), 128, "variant {variant}");
                            assert_eq!(depth, 0, "variant {variant}: ret with pushes left");
                            assert_eq!(rax_back, keep == Keep::No, "variant {variant}");
                            let want = flags && keep != Keep::RaxAndFlags;
                            assert_eq!(sahf, want as u32, "variant {variant}");
                            rets += 1;
                            break;
                        }
                        FlowControl::IndirectBranch => {
                            assert_eq!(i.segment_prefix(), Register::GS);
                            assert_eq!(i.memory_displacement64() as usize, c::OFF_PROBE_ENTRY);
                            assert_eq!(depth, 0, "variant {variant}: drain with pushes left");
                            assert_eq!(sahf, flags as u32, "variant {variant}");
                            assert_eq!(ins[k - 1].mnemonic(), Mnemonic::Lea);
                            assert_eq!(ins[k - 1].memory_displacement64(), 136);
                            drains += 1;
                            break;
                        }
                        FlowControl::UnconditionalBranch => {
                            k = pos(i.near_branch_target()).expect("a jump into the routine");
                        }
                        FlowControl::ConditionalBranch => {
                            let t = pos(i.near_branch_target()).expect("a branch into it");
                            todo.push((t, depth, rax_back, sahf));
                            k += 1;
                        }
                        _ => k += 1,
                    }
                    assert!(k < ins.len(), "variant {variant}: runs off the end");
                }
            }
            assert!(rets >= 1 && drains >= 1, "variant {variant}");
            assert!(
                seen.iter().all(|s| s.is_some()),
                "variant {variant}: dead code"
            );
        }
    }

    /// Each variant of the shared slow-call tails fits its room, gives back what it says
    /// it gives back, and leaves only by `jmp gs:[probe_entry]` (the call) or, when the
    /// embedder's own work skips it, `jmp gs:[probe_ret]` (the return past the record).
    #[test]
    fn shared_tails_leave_by_the_probe_entry_or_the_return() {
        let base = 0x7000_0000_0000u64;
        let code = slow_call_tails(base);
        assert!(code.len() <= 8 * SLOW_TAIL_ROOM + 16);
        for variant in 0..8usize {
            let start = variant * SLOW_TAIL_ROOM;
            let end = (start + SLOW_TAIL_ROOM).min(code.len());
            let at = base + start as u64;
            let dec = Decoder::with_ip(64, &code[start..end], at, DecoderOptions::NONE);
            let mut exits = alloc::vec::Vec::new();
            let mut gives_rcx = false;
            let mut restores_flags = 0;
            for ins in dec {
                if ins.flow_control() == FlowControl::IndirectBranch {
                    assert_eq!(ins.segment_prefix(), Register::GS);
                    exits.push(ins.memory_displacement64() as usize);
                    if exits.last() == Some(&c::OFF_PROBE_ENTRY) {
                        break;
                    }
                }
                if ins.op0_register() == Register::RCX {
                    gives_rcx = true;
                }
                if ins.mnemonic() == iced_x86::Mnemonic::Sahf {
                    restores_flags += 1;
                }
                if ins.flow_control() == FlowControl::ConditionalBranch {
                    let t = ins.near_branch_target();
                    assert!(t > ins.ip() && t < at + SLOW_TAIL_ROOM as u64);
                }
            }
            let own_work = variant & 4 != 0;
            let ret = c::scratch_off(c::S_PROBE_RET);
            if own_work {
                assert_eq!(exits, [ret, c::OFF_PROBE_ENTRY], "variant {variant}");
            } else {
                assert_eq!(exits, [c::OFF_PROBE_ENTRY], "variant {variant}");
            }
            assert_eq!(gives_rcx, variant & 1 != 0, "variant {variant}");
            let flags = if variant & 2 != 0 {
                1 + own_work as usize
            } else {
                0
            };
            assert_eq!(restores_flags, flags, "variant {variant}");
        }
    }
}
