//! The interpreter runs inside the program (the engine's slow path): no instruction and no
//! machine state may make it panic. Random byte strings are decoded and stepped with random
//! values and shadows (tests build with overflow checks, so arithmetic slips panic here).

mod common;

use common::*;
use iced_x86::{Decoder, DecoderOptions};
use oxgrind_vbits::{FlagShadows, Interpreter, ShadowRegisters};

#[test]
fn random_instructions_and_states_never_panic() {
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    let mut interp = Interpreter::new();
    let mut stepped = 0;
    for _ in 0..400_000 {
        let mut bytes = [0u8; 15];
        for b in &mut bytes {
            *b = rng.next() as u8;
        }
        // Bias towards the 0f, 0f 38, 0f 3a, VEX and EVEX maps.
        match rng.below(5) {
            0 => bytes[0] = 0x0f,
            1 => bytes[0] = 0xc5,
            2 => bytes[0] = 0xc4,
            3 => bytes[0] = 0x62,
            _ => {}
        }
        let mut decoder = Decoder::with_ip(64, &bytes, 0x40_0000, DecoderOptions::NONE);
        let insn = decoder.decode();
        if insn.is_invalid() {
            continue;
        }
        let mut guest = TestGuest::default();
        for g in guest.gpr.iter_mut() {
            // Small counts keep rep instructions short; sometimes a huge value anyway for
            // non-count registers.
            *g = if rng.below(4) == 0 {
                rng.next()
            } else {
                rng.next() & 0xfff
            };
        }
        guest.gpr[RCX] &= 0xff;
        guest.rflags = rng.next() & 0xcd5 | 0x202;
        for v in guest.vector.iter_mut().take(4) {
            v.fill(rng.next() as u8);
        }
        guest.opmask = [rng.next(); 8];
        let mut regs = ShadowRegisters::default();
        for g in regs.gpr.iter_mut() {
            *g = rng.shadow(64);
        }
        regs.flags = FlagShadows(rng.next() as u8 & FlagShadows::ALL);
        for v in regs.vector.iter_mut().take(4) {
            v.fill(rng.next() as u8 & rng.next() as u8);
        }
        regs.opmask = [rng.shadow(64); 8];
        let mut mem = MapShadow::default();
        interp.step(&insn, &guest, &mut regs, &mut mem);
        stepped += 1;
    }
    assert!(
        stepped > 100_000,
        "the generator must mostly produce valid instructions ({stepped})"
    );
}
