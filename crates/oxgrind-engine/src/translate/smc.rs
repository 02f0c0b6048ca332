//! The entry check of blocks translated from pages the program can write (self-modifying
//! code and JITs; see `pages`): a copy of the guest bytes compared at every entry, and a
//! way out to the dispatcher (`oxg_smc_dispatch`) when they changed.

use alloc::vec::Vec;

use super::*;
use crate::context as c;

impl Emitter {
    /// Guest bytes `[ip, ip+len)` from the snapshot.
    pub(super) fn guest_bytes(&self, ip: u64, len: usize) -> &[u8] {
        let from = (ip - self.guest_pc) as usize;
        &self.guest[from..from + len]
    }

    /// Entry check: compares the guest bytes `[pc, pc+len)` with the copy the block was
    /// translated from (placed after the stubs by `finish_check`), one aligned 8-byte word
    /// at a time: `mov rax, [moffs64]; xor rax, [rip+copy]` (plus `test [rip+mask], rax`
    /// for the two edge words, which hold bytes outside the block). Only `rax` and, unless
    /// dead, the arithmetic flags are used; both are restored on either path. The loads are
    /// aligned so that a guest running with `EFLAGS.AC` set (HotSpot does while probing the
    /// CPU) takes no alignment fault here, and they never leave the pages of the block.
    pub(super) fn smc_check(&mut self, pc: u64, len: usize, flags_dead: bool) {
        self.store_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.unmark();
        if !flags_dead {
            self.buf.extend_from_slice(&[0x9F, 0x0F, 0x90, 0xC0]); // lahf; seto al
            self.store_gs(0, c::scratch_off(c::S_IBL_FLAGS));
        }
        let first = pc & !7;
        let end = (pc + len as u64 + 7) & !7;
        let nwords = ((end - first) / 8) as usize;
        let from = (pc - self.guest_pc) as usize;
        // Copy words (bytes outside the block zero), then one mask word per edge word.
        let mut data = alloc::vec![0u8; nwords * 8];
        let lead = (pc - first) as usize;
        data[lead..lead + len].copy_from_slice(&self.guest[from..from + len]);
        let mut chk = Check {
            pc,
            flags_dead,
            data_refs: Vec::new(),
            mismatch_refs: Vec::new(),
            data: Vec::new(),
        };
        let mut masks: Vec<u8> = Vec::new();
        for i in 0..nwords {
            let lo = (i * 8).max(lead);
            let hi = (i * 8 + 8).min(lead + len);
            // mov rax, [moffs64]
            self.buf.extend_from_slice(&[0x48, 0xA1]);
            self.buf
                .extend_from_slice(&(first + 8 * i as u64).to_le_bytes());
            // xor rax, [rip+copy]
            self.buf.extend_from_slice(&[0x48, 0x33, 0x05]);
            chk.data_refs.push((self.buf.len(), i * 8));
            self.d32(0);
            if lo != i * 8 || hi != i * 8 + 8 {
                let mut m = [0u8; 8];
                for b in &mut m[lo - i * 8..hi - i * 8] {
                    *b = 0xFF;
                }
                // test [rip+mask], rax
                self.buf.extend_from_slice(&[0x48, 0x85, 0x05]);
                chk.data_refs
                    .push((self.buf.len(), nwords * 8 + masks.len()));
                self.d32(0);
                masks.extend_from_slice(&m);
            }
            self.buf.extend_from_slice(&[0x0F, 0x85]); // jnz mismatch
            chk.mismatch_refs.push(self.buf.len());
            self.d32(0);
        }
        data.extend_from_slice(&masks);
        chk.data = data;
        if !flags_dead {
            self.restore_check_flags();
        }
        self.load_gs(0, c::scratch_off(c::S_STUB_RAX));
        self.check = Some(chk);
    }

    /// `mov rax, gs:[ibl_flags]; add al, 0x7f; sahf`
    pub(super) fn restore_check_flags(&mut self) {
        self.load_gs(0, c::scratch_off(c::S_IBL_FLAGS));
        self.buf.extend_from_slice(&[0x04, 0x7F, 0x9E]);
    }

    /// The mismatch exit (guest flags back, guest rax in `STUB_RAX` as for a stub, guest pc
    /// in `rax`, on to `oxg_smc_dispatch`) and the copy and masks of the guest words.
    pub(super) fn finish_check(&mut self, chk: Check) {
        let mismatch = self.buf.len();
        for &at in &chk.mismatch_refs {
            let rel = mismatch as i64 - (at as i64 + 4);
            self.buf[at..at + 4].copy_from_slice(&(rel as i32).to_le_bytes());
        }
        if !chk.flags_dead {
            self.restore_check_flags();
        }
        self.mov_imm64(0, chk.pc);
        self.jmp_gs(c::OFF_SMC_DISPATCH);
        while self.buf.len() % 8 != 0 {
            self.buf.push(0xCC);
        }
        let data = self.buf.len();
        self.buf.extend_from_slice(&chk.data);
        for &(at, off) in &chk.data_refs {
            let rel = (data + off) as i64 - (at as i64 + 4);
            self.buf[at..at + 4].copy_from_slice(&(rel as i32).to_le_bytes());
        }
    }
}

/// The pieces of an entry check that `finish` places after the stubs.
pub(super) struct Check {
    pc: u64,
    flags_dead: bool,
    /// Copy words, then mask words (8-byte aligned once placed).
    data: Vec<u8>,
    /// (position of a rel32 `cmp` displacement, offset into the guest copy).
    data_refs: Vec<(usize, usize)>,
    /// Positions of the rel32 of each `jne mismatch`.
    mismatch_refs: Vec<usize>,
}
