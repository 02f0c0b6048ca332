//! Blocks of one instruction that need a shape of their own: a `syscall` (reached only
//! through the dispatcher, so the engine sees every system call) and one iteration of a
//! `rep` string instruction under counting or probes (a self-loop, as VEX translates it).

use iced_x86::{Instruction, Mnemonic};

use super::*;
use crate::probe::Client;
use oxgrind_tool::instrument::{Plan, Probe};

pub(super) fn syscall_block(e: &mut Emitter, ins: &Instruction, opts: Options) -> Translation {
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
    // Right after the call, before any engine code has run, the guest state is whole: that
    // of the next instruction, the result in `rax`. A signal that ends the call (EINTR) or
    // arrives as it returns is delivered here, at once, as the kernel delivers it natively:
    // with the mask in force during the call. pselect, ppoll, epoll_pwait and sigsuspend
    // unblock a signal for the call only; deferred to the dispatcher, the signal would be
    // raised again under the program's usual mask, which blocks it: pending, never handled,
    // and ending the next such wait at once (gpg-agent spun so for ever). A call that comes
    // back to the dispatcher (below) is heard there once the handler has returned.
    e.mark(ins.next_ip(), 0);
    // The call comes back to the dispatcher at its own pc (a syscall block is never linked
    // to), which hears its result (`dispatch::syscall_returned`): every call when the
    // embedder wants the descriptor calls' results (`Options::syscall_returns`), else one
    // that failed with EMFILE, which the dispatcher performs again if oxgrind held one of
    // the program's descriptor slots meanwhile. Running the call here rather than in the
    // dispatcher keeps it the signal machinery's: a signal interrupts it and the guest's
    // handler runs, the call restarting or failing with EINTR as SA_RESTART says.
    if !opts.syscall_returns {
        // The EMFILE test leaves the guest flags alone: `lea rcx, [rax + 24]; jrcxz`, rcx
        // being the register `syscall` clobbers.
        e.buf
            .extend_from_slice(&[0x48, 0x8D, 0x48, 0x18, 0xE3, 0x00]);
        let over = e.buf.len();
        e.stub_jump(ins.next_ip());
        // Over the fall-through's jump, alignment padding included (`align_rel32`).
        e.buf[over - 1] = (e.buf.len() - over) as u8;
    }
    // mov qword gs:[S_CALL_RETURNED], 1 (no flags): what tells the dispatcher, entered at
    // this pc, that the call has been made rather than is to be made.
    e.buf.extend_from_slice(&[0x65, 0x48, 0xC7, 0x04, 0x25]);
    e.d32(c::scratch_off(c::S_CALL_RETURNED) as u32);
    e.d32(1);
    let back = e.new_stub(ins.ip());
    e.stub_jump_existing(back);
    e.finish();
    // The way back is engine code, no guest instruction boundary: an asynchronous signal
    // that arrives there is stepped on into the dispatcher, which hears the result first and
    // then delivers the signal at the instruction after the call.
    let stub = e.stubs[back].offset;
    for m in e.pcmap.iter_mut() {
        if (stub..stub + STUB_FAR_SLOT).contains(&(m.host_off as usize)) {
            m.guest = UNMAPPED;
            m.fix = 0;
        }
    }
    one_instruction(e, ins, BlockKind::Syscall)
}

/// One iteration of a `rep` string instruction, looping on itself through its own exit stub,
/// as VEX translates it: every entry (including the final one with `rcx == 0`) counts one.
pub(super) fn rep_block(
    e: &mut Emitter,
    ins: &Instruction,
    pc: u64,
    opts: Options,
    tool: Option<Client>,
) -> Result<Translation, TranslateError> {
    let mut plan = Plan::new(1);
    if let Some(t) = tool {
        plan_for(t, pc, core::iter::once(ins), &mut plan);
    }
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
    let every_entry = |p: &Probe| {
        matches!(
            p,
            Probe::Count { .. }
                | Probe::CountIndexed { .. }
                | Probe::TraceBlock { .. }
                | Probe::TraceBlockNewLines { .. }
        )
    };
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
        return Ok(whole_instruction(e, ins, pc, raw));
    }
    if tool.is_none() && opts.count && unconditional_rep(ins) {
        // Only counted: the instruction runs natively, whole, and counts what its
        // iterations would, one per iteration and one for the final entry with `rcx == 0`
        // (`rcx + 1`). As a loop, one element per block entry, a 4 KiB `rep stosb` of
        // glibc's memset took thousands of entries (4% of sqlite3's time under Massif).
        // A signal taken in the middle resumes at the instruction, which counts what is
        // left once more: the count differs from Valgrind's only then.
        e.count_rep(c::count_lane_off(pc));
        return Ok(whole_instruction(e, ins, pc, raw));
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
    if tool.is_some() && crate::definedness::enabled() {
        if let Some(rec) = crate::probe::definedness_record(ins) {
            if crate::definedness::is_rep(ins) {
                let iteration = crate::definedness::rep_iteration_form(ins);
                e.definedness_rep(pc, rec, true, iteration.as_ref())?;
            } else {
                e.clean_call(pc, rec);
            }
        }
    }
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
    Ok(one_instruction(e, ins, BlockKind::Normal))
}

/// A `rep` string instruction whose iterations are exactly `rcx` (no `repe`/`repne`
/// condition): stores, moves and loads.
fn unconditional_rep(ins: &Instruction) -> bool {
    ins.has_rep_prefix()
        && matches!(
            ins.mnemonic(),
            Mnemonic::Stosb
                | Mnemonic::Stosw
                | Mnemonic::Stosd
                | Mnemonic::Stosq
                | Mnemonic::Movsb
                | Mnemonic::Movsw
                | Mnemonic::Movsd
                | Mnemonic::Movsq
                | Mnemonic::Lodsb
                | Mnemonic::Lodsw
                | Mnemonic::Lodsd
                | Mnemonic::Lodsq
        )
}

/// The rest of a `rep` block that runs the instruction `raw` at `pc` whole, as it is (its
/// prologue emitted), and goes on to the next one.
fn whole_instruction(e: &mut Emitter, ins: &Instruction, pc: u64, raw: &[u8]) -> Translation {
    e.mark(pc, 0);
    e.buf.extend_from_slice(raw);
    e.unmark();
    e.stub_jump(ins.next_ip());
    e.finish();
    one_instruction(e, ins, BlockKind::Normal)
}

/// The translation of the one guest instruction `ins` that `e` has emitted.
fn one_instruction(e: &mut Emitter, ins: &Instruction, kind: BlockKind) -> Translation {
    Translation {
        bytes: core::mem::take(&mut e.buf),
        stubs: core::mem::take(&mut e.stubs),
        kind,
        insns: 1,
        guest_len: ins.len() as u64,
        pcmap: core::mem::take(&mut e.pcmap),
    }
}
