//! `fxsave`/`xsave*` and `fxrstor`/`xrstor*`: the vector register shadows saved with the
//! registers and restored with them.
//!
//! glibc's lazy-binding trampoline (`_dl_runtime_resolve_xsavec`) saves the vector registers,
//! runs the resolver (which uses them), and restores them before jumping to the function:
//! the argument registers must come back with their own shadows, not the resolver's
//! (definedness.md trap 7). Memcheck describes the save area's layout to VEX; here:
//!
//! * The shadows of xmm0..15 go to the legacy region (offset 160 + 16·i) and the upper
//!   halves of ymm0..15 to the AVX component (offset 576, its place in both the standard and
//!   the compacted format), as the instruction stores the values; a restore with no record
//!   (below) reads them back from there.
//! * AVX-512 state sits at offsets that depend on the compacted format's component bitmap,
//!   so the whole shadow file is also kept aside, keyed by the save area's address, and a
//!   restore from that address takes it back. Entries are few (one per nested trampoline).
//!   A program that edits a save area between the two (none we know of) would get the
//!   saved shadows back.

use alloc::boxed::Box;
use alloc::vec::Vec;

use iced_x86::Mnemonic;

use crate::algebra::lanes::Vec512;
use crate::ctx::Ctx;
use crate::state::{Guest, ShadowMemory};

/// Components of the XSAVE feature bitmap this module knows.
const X87: u64 = 1 << 0;
const SSE: u64 = 1 << 1;
const AVX: u64 = 1 << 2;
const OPMASK: u64 = 1 << 5;
const ZMM_HI256: u64 = 1 << 6;
const HI16_ZMM: u64 = 1 << 7;

const LEGACY_XMM: u64 = 160;
const AVX_OFFSET: u64 = 576;
const MAX_RECORDS: usize = 16;

struct Record {
    address: u64,
    vector: Box<[Vec512; 32]>,
    opmask: [u64; 8],
    x87: [u64; 8],
    x87_status: bool,
}

/// The saved shadow files, most recent last.
#[derive(Default)]
pub(crate) struct SaveAreas {
    records: Vec<Record>,
}

enum Op {
    Save,
    Restore,
}

impl SaveAreas {
    /// Handles the save/restore instructions; false for anything else.
    pub(crate) fn rule<G: Guest, M: ShadowMemory>(&mut self, cx: &mut Ctx<G, M>) -> bool {
        use Mnemonic::*;
        let m = cx.insn.mnemonic();
        let (op, legacy) = match m {
            Fxsave | Fxsave64 => (Op::Save, true),
            Fxrstor | Fxrstor64 => (Op::Restore, true),
            Xsave | Xsave64 | Xsavec | Xsavec64 | Xsaveopt | Xsaveopt64 | Xsaves | Xsaves64 => {
                (Op::Save, false)
            }
            Xrstor | Xrstor64 | Xrstors | Xrstors64 => (Op::Restore, false),
            _ => return false,
        };
        // The requested-feature bitmap is edx:eax; fxsave/fxrstor handle x87 and SSE.
        let rfbm = if legacy {
            0b11
        } else {
            (cx.guest.gpr(2) << 32) | (cx.guest.gpr(0) & 0xffff_ffff)
        };
        let address = cx.address();
        match op {
            Op::Save => self.save(cx, address, rfbm, legacy),
            Op::Restore => self.restore(cx, address, rfbm, legacy),
        }
        true
    }

    fn save<G: Guest, M: ShadowMemory>(
        &mut self,
        cx: &mut Ctx<G, M>,
        address: u64,
        rfbm: u64,
        legacy: bool,
    ) {
        if rfbm & SSE != 0 {
            for i in 0..16 {
                let slot = address.wrapping_add(LEGACY_XMM + 16 * i as u64);
                cx.mem.store(slot, &cx.regs.vector[i][..16]);
            }
        }
        if !legacy && rfbm & AVX != 0 {
            for i in 0..16 {
                let slot = address.wrapping_add(AVX_OFFSET + 16 * i as u64);
                cx.mem.store(slot, &cx.regs.vector[i][16..32]);
            }
        }
        self.records.retain(|r| r.address != address);
        if self.records.len() >= MAX_RECORDS {
            self.records.remove(0);
        }
        self.records.push(Record {
            address,
            vector: Box::new(cx.regs.vector),
            opmask: cx.regs.opmask,
            x87: cx.regs.x87,
            x87_status: cx.regs.x87_status,
        });
    }

    fn restore<G: Guest, M: ShadowMemory>(
        &mut self,
        cx: &mut Ctx<G, M>,
        address: u64,
        rfbm: u64,
        legacy: bool,
    ) {
        let found = self.records.iter().position(|r| r.address == address);
        if let Some(at) = found {
            let r = self.records.remove(at);
            for i in 0..32 {
                let v = &mut cx.regs.vector[i];
                if i < 16 && rfbm & SSE != 0 {
                    v[..16].copy_from_slice(&r.vector[i][..16]);
                }
                if i < 16 && !legacy && rfbm & AVX != 0 {
                    v[16..32].copy_from_slice(&r.vector[i][16..32]);
                }
                if i < 16 && !legacy && rfbm & ZMM_HI256 != 0 {
                    v[32..].copy_from_slice(&r.vector[i][32..]);
                }
                if i >= 16 && !legacy && rfbm & HI16_ZMM != 0 {
                    *v = r.vector[i];
                }
            }
            if !legacy && rfbm & OPMASK != 0 {
                cx.regs.opmask = r.opmask;
            }
            if rfbm & X87 != 0 {
                cx.regs.x87 = r.x87;
                cx.regs.x87_status = r.x87_status;
            }
            return;
        }
        // No record: the layout-fixed parts come back from memory.
        let mut buf = [0u8; 16];
        for i in 0..16 {
            if rfbm & SSE != 0 {
                cx.mem
                    .load(address.wrapping_add(LEGACY_XMM + 16 * i as u64), &mut buf);
                cx.regs.vector[i][..16].copy_from_slice(&buf);
            }
            if !legacy && rfbm & AVX != 0 {
                cx.mem
                    .load(address.wrapping_add(AVX_OFFSET + 16 * i as u64), &mut buf);
                cx.regs.vector[i][16..32].copy_from_slice(&buf);
            }
        }
    }
}
