//! Definedness's inline fast path (Dr. Memory's design, `docs/definedness.md`): before an
//! instruction with a fast form (`definedness::fast_form`), a few compares in the code
//! cache stand in for the clean call into the interpreter when every input is defined,
//! which is nearly always. The inline part borrows `rax` (and saves the flags where live,
//! as the filtered probes do) and checks, each with a `jne` to the out-of-line slow call:
//!
//! * the thread has its definedness state (`ctx.vbits`), and no slow step is due: the
//!   runtime's own code ran (`vbits_own_code`), a signal handler starts (`vbits_signal`),
//!   or the last step asked for one (`need_step`: after a move of `rsp`, a `call`, `ret`,
//!   `rep`, a system call);
//! * the shadow of each general register read is zero, and the flags' shadow if the
//!   instruction reads or writes a flag;
//! * each memory operand's first and last bytes lie in 64 KiB spans without shadow chunk
//!   (all defined; an address above the user space goes slow).
//!
//! Then it zeroes the shadow bytes of the registers written, gives back `rax` and the
//! flags, and the instruction runs. The slow call runs the interpreter exactly as without
//! the fast path and returns after the inline part.

use super::{Emitter, SlowCall, TranslateError};
use crate::context as c;
use crate::definedness::{FastForm, Written, OFF_NEED_STEP, OFF_SHADOW_FLAGS, OFF_SHADOW_GPR};

impl Emitter {
    /// The fast path of `form` before the instruction at `ip`, falling back to the clean
    /// call with definedness step record `rec`.
    pub(super) fn definedness_fast(
        &mut self,
        ip: u64,
        rec: u64,
        form: &FastForm,
        flags_live: bool,
    ) -> Result<(), TranslateError> {
        self.borrow_rax(ip, flags_live);
        let mut slow = SlowCall {
            jumps: [0; super::MAX_SLOW_JUMPS],
            njumps: 0,
            rec,
            flags_live,
            back: 0,
            ip,
        };
        // cmp qword gs:[own_code], 0; jne slow (and the signal flag)
        for off in [c::OFF_VBITS_OWN_CODE, c::OFF_VBITS_SIGNAL] {
            self.buf.extend_from_slice(&[0x65, 0x48, 0x83, 0x3C, 0x25]);
            self.d32(off as u32);
            self.buf.push(0x00);
            self.jcc_slow(0x85, &mut slow)?;
        }
        // mov rax, gs:[vbits]; test rax, rax; jz slow
        self.load_gs(0, c::OFF_VBITS);
        self.buf.extend_from_slice(&[0x48, 0x85, 0xC0]);
        self.jcc_slow(0x84, &mut slow)?;
        // cmp qword [rax+off], 0; jne slow: the pending step, then each register read.
        let gprs = (0..16u32)
            .filter(|n| form.reads & (1 << n) != 0)
            .map(|n| OFF_SHADOW_GPR + 8 * n as usize);
        for off in core::iter::once(OFF_NEED_STEP).chain(gprs) {
            self.buf.extend_from_slice(&[0x48, 0x83, 0xB8]);
            self.d32(off as u32);
            self.buf.push(0x00);
            self.jcc_slow(0x85, &mut slow)?;
        }
        if form.flags {
            // cmp byte [rax+flags], 0; jne slow
            self.buf.extend_from_slice(&[0x80, 0xB8]);
            self.d32(OFF_SHADOW_FLAGS as u32);
            self.buf.push(0x00);
            self.jcc_slow(0x85, &mut slow)?;
        }
        for m in form.mem.iter().flatten() {
            let size = m.memory_size().size() as u64;
            for off in [0, size.saturating_sub(1)] {
                self.effective_address(m, off, ip)?;
                self.buf.extend_from_slice(&[0x48, 0xC1, 0xE8, 0x10]); // shr rax, 16
                self.buf.extend_from_slice(&[0x48, 0x3D]); // cmp rax, 0x7fffffff
                self.d32(0x7fff_ffff);
                self.jcc_slow(0x87, &mut slow)?; // ja slow
                self.buf.extend_from_slice(&[0x48, 0xC1, 0xE0, 0x03]); // shl rax, 3
                self.buf.extend_from_slice(&[0x65, 0x48, 0x03, 0x04, 0x25]); // add rax, gs:[primary]
                self.d32(c::OFF_VBITS_PRIMARY as u32);
                self.buf.extend_from_slice(&[0x48, 0x83, 0x38, 0x00]); // cmp qword [rax], 0
                self.jcc_slow(0x85, &mut slow)?;
            }
        }
        if form.writes.iter().any(Option::is_some) {
            self.load_gs(0, c::OFF_VBITS);
            for w in form.writes.iter().flatten() {
                let (n, at) = match *w {
                    Written::Qword(n) | Written::Word(n) | Written::Byte(n) => (n, 0),
                    Written::HighByte(n) => (n, 1),
                };
                let off = (OFF_SHADOW_GPR + 8 * n as usize + at) as u32;
                match w {
                    Written::Qword(_) => {
                        // mov qword [rax+off], 0
                        self.buf.extend_from_slice(&[0x48, 0xC7, 0x80]);
                        self.d32(off);
                        self.d32(0);
                    }
                    Written::Word(_) => {
                        // mov word [rax+off], 0
                        self.buf.extend_from_slice(&[0x66, 0xC7, 0x80]);
                        self.d32(off);
                        self.buf.extend_from_slice(&[0, 0]);
                    }
                    Written::Byte(_) | Written::HighByte(_) => {
                        // mov byte [rax+off], 0
                        self.buf.extend_from_slice(&[0xC6, 0x80]);
                        self.d32(off);
                        self.buf.push(0);
                    }
                }
            }
        }
        self.return_rax(flags_live);
        slow.back = self.buf.len();
        self.mark(ip, 0);
        self.slow.push(slow);
        Ok(())
    }

    /// `j<cc> slow` (rel32, opcode `0F cc`), recorded in `slow` for patching.
    fn jcc_slow(&mut self, cc: u8, slow: &mut SlowCall) -> Result<(), TranslateError> {
        if slow.njumps == slow.jumps.len() {
            return Err(TranslateError::Encode { pc: slow.ip });
        }
        self.buf.extend_from_slice(&[0x0F, cc]);
        slow.jumps[slow.njumps] = self.buf.len();
        slow.njumps += 1;
        self.d32(0);
        Ok(())
    }
}
