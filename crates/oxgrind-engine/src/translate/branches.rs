//! Control transfers: exit stubs (patched into direct jumps once their target is translated:
//! linking), calls that push the guest return address, and `ret`/indirect jumps through the
//! inline indirect-branch lookup.

use alloc::vec::Vec;

use iced_x86::{Code, FlowControl, Instruction, OpKind, Register};

use super::*;
use crate::context as c;

impl Emitter {
    pub(super) fn new_stub(&mut self, target: u64) -> usize {
        self.stubs.push(Stub {
            offset: usize::MAX,
            target,
        });
        self.stubs.len() - 1
    }

    /// `jmp rel32` to a (new) exit stub for `target`.
    pub(super) fn stub_jump(&mut self, target: u64) {
        let s = self.new_stub(target);
        self.stub_jump_existing(s);
    }

    pub(super) fn stub_jump_existing(&mut self, s: usize) {
        self.align_rel32(1);
        self.buf.push(0xE9);
        let fix = self.buf.len();
        self.d32(0);
        self.fixups.push((fix, s));
    }

    /// Pads with `nop`s so that the rel32 of a jump whose opcode takes `opcode_len` bytes,
    /// emitted next, lies 4-byte aligned: linking may then aim it at the stub's target
    /// directly, in one atomic store (see [`link_stub`]).
    pub(super) fn align_rel32(&mut self, opcode_len: usize) {
        const NOPS: [&[u8]; 4] = [&[], &[0x90], &[0x66, 0x90], &[0x0F, 0x1F, 0x00]];
        let pad = (4 - (self.here() as usize + opcode_len) % 4) % 4;
        self.buf.extend_from_slice(NOPS[pad]);
    }

    /// Lays out the stubs after the code and resolves the jumps to them.
    pub(super) fn finish(&mut self) {
        self.unmark();
        // Out-of-line code follows: no inline borrow takes the slot's state from here.
        self.stub_has_rax = false;
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
            let stub = self.stubs[s].offset;
            let rel = stub as i64 - (fix as i64 + 4);
            self.buf[fix..fix + 4].copy_from_slice(&(rel as i32).to_le_bytes());
            // The stub's first jump whose rel32 one aligned store can change is linked
            // straight to the target with the stub (`link_stub`): a taken branch then
            // makes one jump, not two.
            let at = stub + STUB_BODY_JUMP;
            if (self.base as usize + fix) % 4 == 0 && self.buf[at..at + 4] == [0; 4] {
                let back = fix as i64 - stub as i64;
                self.buf[at..at + 4].copy_from_slice(&(back as i32).to_le_bytes());
            }
        }
        if !self.trace_cold.is_empty() {
            self.finish_trace_cold();
        }
        if !self.recent_cold.is_empty() || !self.block_cold.is_empty() {
            self.finish_recent_cold();
        }
        if !self.slow.is_empty() || !self.store_copies.is_empty() {
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

    /// Pushes the guest return address `ra` without touching flags or memory below `rsp`.
    pub(super) fn push_return(&mut self, ra: u64, ip: u64, fix: u16) {
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
    /// the miss path are shared (`oxg_ibl2`). Protocol: rax = guest target, guest rax in
    /// STUB_RAX, guest rcx in IBL_RCX from here on. No flag is touched and nothing is
    /// stored on the stack: the slot is the target's low 16 bits (`movzx`), its key the
    /// negated guest pc, so the sum of key and target is 0 exactly on a hit (`jrcxz`). The
    /// lookup with a multiplicative hash and a `cmp` saved and restored the flags around
    /// it (`lahf`/`seto`/`sahf`) and was twice as many instructions.
    pub(super) fn inline_ibl(&mut self) {
        self.store_gs(1, c::scratch_off(c::S_IBL_RCX)); // mov gs:[ibl_rcx], rcx
        ibl_probe(&mut self.buf, c::IBL_KEYS_OFF);
        // jrcxz hit; jmp gs:[ibl2]; hit:
        self.buf.extend_from_slice(&[0xE3, 8]);
        self.jmp_gs(c::OFF_IBL2);
        ibl_hit(&mut self.buf, c::IBL_HOSTS_OFF);
        self.load_gs(1, c::scratch_off(c::S_IBL_RCX));
        self.load_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.jmp_gs(c::scratch_off(c::S_HOST_TARGET));
    }

    /// An embedder's entry point's `jmp` to `asm::oxg_native_entry` (`crate::native_entry`):
    /// the native call that block makes, and the `ret` after it at `done`, emitted here,
    /// in the entry point's own block. Each entry point (the runtime's `malloc`, `free`,
    /// ...) then returns to the program through an indirect jump of its own, which the
    /// branch predictor learns per entry point; through the one shared block, every
    /// return of every allocator call took the same jump, whose target changed at nearly
    /// every call. The instructions counted are those of the shared path: none for the
    /// gate, one for the `ret` (`hooks::wrapper_cost` in the runtime relies on it).
    fn native_entry_here(&mut self, entry: u64, rec: u64, done: u64) {
        self.mark(entry, 0);
        let gate = crate::asm::oxg_native_entry_gate as *const () as u64;
        self.native_gate_call(entry, rec, done, gate);
        self.mark(done, 0);
        if self.count {
            self.count_prologue(1, false);
        }
        self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.mark(done, FIX_RAX_IN_STUB);
        self.buf.push(0x58); // pop rax
        self.unmark();
        self.inline_ibl();
    }

    /// A replaced function's native try (`crate::native_try`), at the start of the block
    /// that redirects a call to replacement `to`: `f` runs natively on the engine stack
    /// with the call's arguments; when it did the work (rdx nonzero), its result goes to
    /// the guest's `rax`, defined, and the block returns to the caller as the
    /// replacement's `ret` would; when it declined, the argument registers come back and
    /// the block goes on to `to` (the jump the caller emits next). As
    /// `native_gate_call`: `in_engine` defers signals meanwhile, a signal that arrived is
    /// delivered by a dispatcher entry at where the guest continues, and right after a
    /// `fork` or during a `clone` the dispatcher goes first (the try is skipped). The
    /// callee-saved registers are saved too, for a fault inside the try
    /// (`asm::oxg_native_try_fault`); the caller-saved ones are the callee's to change at
    /// a call, and a declined try's are the replacement's from its entry, as the ABI has
    /// them (the argument registers restored).
    pub(super) fn native_try_here(&mut self, to: u64, f: u64) {
        /// rdi, rsi, rdx, rcx, r8, r9: the arguments, restored when the try declines.
        const ARGS: [u8; 6] = [7, 6, 2, 1, 8, 9];
        /// rbx, rbp, r12-r15: restored by the fault's landing.
        const CALLEE_SAVED: [u8; 6] = [3, 5, 12, 13, 14, 15];
        let (_, done) = crate::asm::run_native_pcs();
        // mov qword ptr gs:[in_engine], 1
        self.buf.extend_from_slice(&[0x65, 0x48, 0xC7, 0x04, 0x25]);
        self.d32(c::OFF_IN_ENGINE as u32);
        self.d32(1);
        let mut to_skip = [0usize; 2];
        for (i, off) in [c::OFF_FORKED, c::OFF_PENDING_CHILD]
            .into_iter()
            .enumerate()
        {
            self.cmp_gs_zero_qword(off);
            self.buf.extend_from_slice(&[0x0F, 0x85]); // jne skip
            to_skip[i] = self.buf.len();
            self.d32(0);
        }
        self.store_gs(4, c::greg_off(c::RSP));
        for r in ARGS.into_iter().chain(CALLEE_SAVED) {
            self.store_gs(r, c::greg_off(r as usize));
        }
        // mov qword ptr gs:[native_try], 1
        self.buf.extend_from_slice(&[0x65, 0x48, 0xC7, 0x04, 0x25]);
        self.d32(c::OFF_NATIVE_TRY as u32);
        self.d32(1);
        self.load_gs(4, c::OFF_ESTACK);
        self.mov_imm64(0, f);
        self.buf.extend_from_slice(&[0xFF, 0xD0]); // call rax
        self.load_gs(4, c::greg_off(c::RSP));
        for off in [c::OFF_NATIVE_TRY, c::OFF_IN_ENGINE] {
            // mov qword ptr gs:[off], 0
            self.buf.extend_from_slice(&[0x65, 0x48, 0xC7, 0x04, 0x25]);
            self.d32(off as u32);
            self.d32(0);
        }
        self.cmp_gs_zero_qword(c::OFF_PENDING_SIGNALS);
        self.buf.extend_from_slice(&[0x0F, 0x85]); // jne pending
        let to_pending = self.buf.len();
        self.d32(0);
        self.buf.extend_from_slice(&[0x48, 0x85, 0xD2]); // test rdx, rdx
        self.buf.extend_from_slice(&[0x0F, 0x84]); // jz declined
        let to_declined = self.buf.len();
        self.d32(0);
        // Done: the result is the guest's rax, defined (the try does the work only when
        // the arguments it was given are), and the `ret` at `done` returns to the caller.
        self.vbits_rax_defined();
        self.mark(done, 0);
        self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.mark(done, FIX_RAX_IN_STUB);
        self.buf.push(0x58); // pop rax
        self.unmark();
        self.inline_ibl();
        // A signal arrived during the try: the dispatcher delivers it where the guest
        // continues, at `done` (the `ret`) or, declined, at `to`.
        self.aim_rel32_here(to_pending);
        self.buf.extend_from_slice(&[0x48, 0x85, 0xD2]); // test rdx, rdx
        self.buf.extend_from_slice(&[0x0F, 0x84]); // jz pending_declined
        let to_pending_declined = self.buf.len();
        self.d32(0);
        self.vbits_rax_defined();
        self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.mov_imm64(0, done);
        self.jmp_gs(c::OFF_DISPATCH);
        self.aim_rel32_here(to_pending_declined);
        for r in ARGS {
            self.load_gs(r, c::greg_off(r as usize));
        }
        // Skipped (a fork or clone pending): the dispatcher continues at `to`.
        for at in to_skip {
            self.aim_rel32_here(at);
        }
        self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.mov_imm64(0, to);
        self.jmp_gs(c::OFF_DISPATCH);
        // Declined: the arguments back, then the caller's jump to `to`.
        self.aim_rel32_here(to_declined);
        for r in ARGS {
            self.load_gs(r, c::greg_off(r as usize));
        }
        self.mark(to, 0);
    }

    /// mov qword ptr gs:[vbits_gpr + rax], 0: the guest's rax defined (a no-op without
    /// definedness: nothing reads the slot then).
    fn vbits_rax_defined(&mut self) {
        self.buf.extend_from_slice(&[0x65, 0x48, 0xC7, 0x04, 0x25]);
        self.d32(c::OFF_VBITS_GPR as u32);
        self.d32(0);
    }

    /// Aims the rel32 at `at` (the last 4 bytes of a forward jump) here.
    fn aim_rel32_here(&mut self, at: usize) {
        let rel = (self.buf.len() - (at + 4)) as u32;
        self.buf[at..at + 4].copy_from_slice(&rel.to_le_bytes());
    }

    /// cmp qword ptr gs:[off], 0
    fn cmp_gs_zero_qword(&mut self, off: usize) {
        self.buf.extend_from_slice(&[0x65, 0x48, 0x83, 0x3C, 0x25]);
        self.d32(off as u32);
        self.buf.push(0);
    }

    /// `mov rax, <operand 0 of ins>` for an indirect jump or call.
    pub(super) fn load_target(&mut self, ins: &Instruction) -> Result<(), TranslateError> {
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

    /// Emits the replacement for the control transfer that ends the block.
    pub(super) fn transfer(&mut self, d: &Decoded) -> Result<(), TranslateError> {
        let ins = &d.ins;
        let next = ins.next_ip();
        let ip = ins.ip();
        self.mark(ip, 0);
        match ins.flow_control() {
            FlowControl::UnconditionalBranch => {
                let target = ins.near_branch_target();
                if let Some((rec, done)) = native_entry_at(target) {
                    self.native_entry_here(target, rec, done);
                    return Ok(());
                }
                self.stub_jump(target);
            }
            FlowControl::ConditionalBranch => {
                let target = ins.near_branch_target();
                if ins.is_jcc_short_or_near() {
                    let cc = ins.condition_code() as u8 - 1;
                    self.align_rel32(2);
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

/// `movzx ecx, ax; mov rcx, gs:[keys + rcx*8]; lea rcx, [rcx + rax]`: rcx is 0 when the
/// slot of guest target `rax` in the key array at context offset `keys` holds it. The
/// first probe reads `IBL_KEYS_OFF`, the second (`oxg_ibl2`) the next slot.
pub(super) fn ibl_probe(buf: &mut Vec<u8>, keys: usize) {
    buf.extend_from_slice(&[0x0F, 0xB7, 0xC8]); // movzx ecx, ax
    buf.extend_from_slice(&[0x65, 0x48, 0x8B, 0x0C, 0xCD]); // mov rcx, gs:[rcx*8 + keys]
    buf.extend_from_slice(&(keys as u32).to_le_bytes());
    buf.extend_from_slice(&[0x48, 0x8D, 0x0C, 0x01]); // lea rcx, [rcx + rax]
}

/// `movzx ecx, ax; mov rcx, gs:[hosts + rcx*8]; mov gs:[HOST_TARGET], rcx`: the host pc of
/// the slot [`ibl_probe`] found.
pub(super) fn ibl_hit(buf: &mut Vec<u8>, hosts: usize) {
    buf.extend_from_slice(&[0x0F, 0xB7, 0xC8]); // movzx ecx, ax
    buf.extend_from_slice(&[0x65, 0x48, 0x8B, 0x0C, 0xCD]); // mov rcx, gs:[rcx*8 + hosts]
    buf.extend_from_slice(&(hosts as u32).to_le_bytes());
    // mov gs:[HOST_TARGET], rcx
    buf.extend_from_slice(&[0x65, 0x48, 0x89, 0x0C, 0x25]);
    buf.extend_from_slice(&(c::scratch_off(c::S_HOST_TARGET) as u32).to_le_bytes());
}

/// Where an exit stub keeps, as an `i32` relative to its start, the rel32 of a jump of its
/// block that goes to it (4-byte aligned; 0: none), which linking aims at the target too.
/// Never executed: it lies after the stub's last instruction.
pub const STUB_BODY_JUMP: usize = 28;

/// An exit stub: `mov gs:[STUB_RAX], rax; mov rax, target; jmp gs:[DISPATCH]`, padded to
/// [`STUB_FAR_SLOT`] (the padding holds [`STUB_BODY_JUMP`]), then an 8-byte slot for a far
/// link. Linking rewrites its first 8 bytes in one aligned store (stubs are 8-byte
/// aligned).
pub(super) fn emit_stub(buf: &mut Vec<u8>, target: u64) {
    let start = buf.len();
    buf.extend_from_slice(&[0x65, 0x48, 0x89, 0x04, 0x25]);
    buf.extend_from_slice(&(c::scratch_off(c::S_STUB_RAX) as u32).to_le_bytes());
    buf.extend_from_slice(&[0x48, 0xB8]);
    buf.extend_from_slice(&target.to_le_bytes());
    buf.extend_from_slice(&[0x65, 0xFF, 0x24, 0x25]);
    buf.extend_from_slice(&(c::OFF_DISPATCH as u32).to_le_bytes());
    while buf.len() - start < STUB_BODY_JUMP {
        buf.push(0xCC);
    }
    buf.extend_from_slice(&[0; 4]);
    debug_assert_eq!(buf.len() - start, STUB_FAR_SLOT);
    buf.extend_from_slice(&0u64.to_le_bytes());
    debug_assert_eq!(buf.len() - start, STUB_SIZE);
}

/// Reverts a linked stub to its unlinked form (enter the dispatcher).
///
/// # Safety
/// `stub` must be an exit stub in a writable code-cache arena.
pub unsafe fn unlink_stub(stub: u64) {
    // SAFETY: the caller guarantees a stub; its body jump (if any) lies in the same block.
    unsafe { aim_body_jump(stub, stub) };
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
        aim_body_jump(stub, to);
    }
}

/// Aims the jump of the stub's block that goes to the stub ([`STUB_BODY_JUMP`]) at `to`
/// (the stub itself when unlinking), when it has one and `to` is within its reach.
///
/// # Safety
/// `stub` must be an exit stub in a writable code-cache arena.
unsafe fn aim_body_jump(stub: u64, to: u64) {
    // SAFETY: the caller guarantees a stub, STUB_SIZE bytes; the word is 4-byte aligned.
    let back = unsafe { core::ptr::read_volatile((stub + STUB_BODY_JUMP as u64) as *const i32) };
    if back == 0 {
        return;
    }
    let at = stub.wrapping_add(back as i64 as u64);
    let rel = to as i64 - (at as i64 + 4);
    if rel == rel as i32 as i64 {
        // SAFETY: `at` is the 4-byte aligned rel32 of a jump in the same translation (the
        // translator recorded it); one aligned store, so a thread running the jump sees
        // the old target (the stub, which leads to the same place) or the new one.
        unsafe { core::ptr::write_volatile(at as *mut i32, rel as i32) };
    }
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
