//! The false-positive traps of optimised code (`shared/reference/definedness.md` section 4),
//! as instruction sequences with the values a real run would have: each must end without
//! a report where Memcheck has none, and report where it does.
//!
//! The interpreter computes shadows only; each step below also applies the instruction's
//! effect on the values (the closure), as the hardware would between two slow-path calls.

mod common;

use common::*;
use iced_x86::code_asm::*;
use iced_x86::Instruction;
use oxgrind_vbits::{Check, FlagShadows, Interpreter, Outcome, ShadowRegisters, ValueUse};

/// A little machine for sequences: guest values, register shadows, memory shadows.
struct Machine {
    guest: TestGuest,
    regs: ShadowRegisters,
    mem: MapShadow,
    interp: Interpreter,
    reports: Vec<(String, Check)>,
}

impl Machine {
    fn new() -> Self {
        Machine {
            guest: TestGuest::default(),
            regs: ShadowRegisters::default(),
            mem: MapShadow::default(),
            interp: Interpreter::new(),
            reports: Vec::new(),
        }
    }

    /// Steps `insn`, then applies `effect` to the values.
    fn step(&mut self, insn: Instruction, effect: impl FnOnce(&mut TestGuest)) -> Outcome {
        let out = self
            .interp
            .step(&insn, &self.guest, &mut self.regs, &mut self.mem);
        for c in out.checks.iter() {
            self.reports.push((format(&insn), c));
        }
        effect(&mut self.guest);
        out
    }
}

const S: u64 = 0x10_0000; // a string in memory
const BLOCK: u64 = 0x20_0000; // a heap block

#[test]
fn word_at_a_time_strlen_reads_past_the_nul_without_a_report() {
    // "ab\0" followed by five undefined bytes (past the end of a heap block, loaded as
    // undefined by partial-loads-ok).
    let mut m = Machine::new();
    m.guest
        .poke(S, &[b'a', b'b', 0, 0x55, 0x66, 0x77, 0x88, 0x99]);
    m.mem.set(S, &[0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff]);
    m.guest.gpr[RDI] = S;
    let word = u64::from_le_bytes([b'a', b'b', 0, 0x55, 0x66, 0x77, 0x88, 0x99]);
    m.step(asm(|a| a.mov(rax, qword_ptr(rdi))), |g| g.gpr[RAX] = word);
    m.step(asm(|a| a.mov(rcx, 0xfefe_fefe_fefe_feffu64)), |g| {
        g.gpr[RCX] = 0xfefe_fefe_fefe_feff
    });
    m.step(asm(|a| a.add(rcx, rax)), |g| {
        g.gpr[RCX] = g.gpr[RCX].wrapping_add(g.gpr[RAX])
    });
    m.step(asm(|a| a.not(rax)), |g| g.gpr[RAX] = !g.gpr[RAX]);
    m.step(asm(|a| a.and(rcx, rax)), |g| g.gpr[RCX] &= g.gpr[RAX]);
    m.step(asm(|a| a.mov(rdx, 0x8080_8080_8080_8080u64)), |g| {
        g.gpr[RDX] = 0x8080_8080_8080_8080
    });
    m.step(asm(|a| a.and(rcx, rdx)), |g| g.gpr[RCX] &= g.gpr[RDX]);
    assert_eq!(
        m.regs.gpr[RCX] & 0xff_ffff,
        0,
        "the bytes up to the NUL are defined"
    );
    m.step(asm(|a| a.je(0x1000u64)), |_| {});
    // The NUL's byte then goes through bsf to find the length.
    m.step(asm(|a| a.bsf(rcx, rcx)), |_| {});
    m.step(asm(|a| a.shr(rcx, 3)), |_| {});
    m.step(asm(|a| a.add(rax, rcx)), |_| {});
    assert_eq!(m.regs.gpr[RCX], 0, "bsf sees a defined lowest set bit");
    assert!(m.reports.is_empty(), "{:?}", m.reports);
}

#[test]
fn word_at_a_time_strlen_reports_when_the_string_itself_is_undefined() {
    let mut m = Machine::new();
    m.guest
        .poke(S, &[b'a', 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77]);
    m.mem.set(S, &[0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
    m.guest.gpr[RDI] = S;
    let word = u64::from_le_bytes([b'a', 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77]);
    m.step(asm(|a| a.mov(rax, qword_ptr(rdi))), |g| g.gpr[RAX] = word);
    m.step(asm(|a| a.mov(rcx, 0xfefe_fefe_fefe_feffu64)), |g| {
        g.gpr[RCX] = 0xfefe_fefe_fefe_feff
    });
    m.step(asm(|a| a.add(rcx, rax)), |g| {
        g.gpr[RCX] = g.gpr[RCX].wrapping_add(g.gpr[RAX])
    });
    m.step(asm(|a| a.not(rax)), |g| g.gpr[RAX] = !g.gpr[RAX]);
    m.step(asm(|a| a.and(rcx, rax)), |g| g.gpr[RCX] &= g.gpr[RAX]);
    m.step(asm(|a| a.mov(rdx, 0x8080_8080_8080_8080u64)), |g| {
        g.gpr[RDX] = 0x8080_8080_8080_8080
    });
    m.step(asm(|a| a.and(rcx, rdx)), |g| g.gpr[RCX] &= g.gpr[RDX]);
    m.step(asm(|a| a.je(0x1000u64)), |_| {});
    assert_eq!(
        m.reports.len(),
        1,
        "no NUL among the defined bytes: the branch depends on garbage"
    );
}

#[test]
fn sbb_of_a_register_with_itself_depends_on_cf_only() {
    let mut m = Machine::new();
    m.regs.gpr[RCX] = u64::MAX; // ecx undefined before
    m.guest.gpr[RAX] = 5;
    m.guest.gpr[RBX] = 7;
    m.step(asm(|a| a.cmp(rax, rbx)), |g| g.rflags |= 1);
    m.step(asm(|a| a.sbb(ecx, ecx)), |g| g.gpr[RCX] = 0xffff_ffff);
    m.step(asm(|a| a.and(ecx, edx)), |_| {});
    assert_eq!(m.regs.gpr[RCX], 0);
    // With an undefined compare, the mask is undefined, but still no report by itself.
    let mut m = Machine::new();
    m.regs.gpr[RAX] = 0xff;
    m.step(asm(|a| a.cmp(rax, rbx)), |_| {});
    m.step(asm(|a| a.sbb(ecx, ecx)), |_| {});
    assert_eq!(m.regs.gpr[RCX], 0xffff_ffff);
    assert!(m.reports.is_empty());
}

#[test]
fn constant_idioms_are_defined() {
    let mut m = Machine::new();
    m.regs.gpr = [u64::MAX; 16];
    m.step(asm(|a| a.xor(eax, eax)), |_| {});
    m.step(asm(|a| a.sub(rbx, rbx)), |_| {});
    assert_eq!(m.regs.gpr[RAX], 0);
    assert_eq!(m.regs.gpr[RBX], 0);
    m.step(asm(|a| a.je(0x1000u64)), |_| {});
    assert!(m.reports.is_empty());
}

#[test]
fn bitfield_set_in_a_fresh_struct_then_tested() {
    // movzx eax, byte [s]; and eax, 0xf7; or eax, 8; mov [s], al; ... test byte [s], 8; jnz
    let mut m = Machine::new();
    m.mem.set(BLOCK, &[0xff]); // fresh malloc'd byte
    m.guest.gpr[RDI] = BLOCK;
    m.step(asm(|a| a.movzx(eax, byte_ptr(rdi))), |_| {});
    m.step(asm(|a| a.and(eax, 0xf7)), |_| {});
    m.step(asm(|a| a.or(eax, 8)), |g| g.gpr[RAX] = 8);
    m.step(asm(|a| a.mov(byte_ptr(rdi), al)), |g| g.poke(BLOCK, &[8]));
    assert_eq!(m.mem.get(BLOCK, 1), vec![0xf7]);
    m.step(asm(|a| a.test(byte_ptr(rdi), 8)), |_| {});
    m.step(asm(|a| a.jne(0x1000u64)), |_| {});
    assert!(m.reports.is_empty(), "{:?}", m.reports);
    // Testing a neighbouring, never-set bit does report.
    m.step(asm(|a| a.test(byte_ptr(rdi), 4)), |_| {});
    m.step(asm(|a| a.jne(0x1000u64)), |_| {});
    assert_eq!(m.reports.len(), 1);
}

#[test]
fn bitfield_insert_with_lea_keeps_the_inserted_bit_defined() {
    // LLVM: eax = old & ~8 (bit 3 a defined 0, the rest undefined); lea ecx, [rax + rdx*8]
    // with rdx a defined 0/1; then test ecx, 8; jnz.
    let mut m = Machine::new();
    m.regs.gpr[RAX] = !0x8u64 & 0xffff_ffff;
    m.guest.gpr[RAX] = 0x1234_5670;
    m.guest.gpr[RDX] = 1;
    m.step(asm(|a| a.lea(ecx, dword_ptr(rax + rdx * 8))), |g| {
        g.gpr[RCX] = 0x1234_5678
    });
    assert_eq!(
        m.regs.gpr[RCX] & 8,
        0,
        "the carry into bit 3 comes from defined zeros of rdx*8"
    );
    m.step(asm(|a| a.test(ecx, 8)), |_| {});
    m.step(asm(|a| a.jne(0x1000u64)), |_| {});
    assert!(m.reports.is_empty(), "{:?}", m.reports);
}

#[test]
fn cmov_and_setcc_on_undefined_flags_propagate_and_report_later() {
    let mut m = Machine::new();
    m.guest.gpr[RBP] = 0x7fff_0000;
    m.mem.set(0x7fff_0000 - 8, &[0xff; 8]);
    m.step(asm(|a| a.cmp(qword_ptr(rbp - 8), 0)), |_| {});
    m.step(asm(|a| a.cmovne(rax, rdx)), |_| {});
    m.step(asm(|a| a.setne(cl)), |_| {});
    assert!(m.reports.is_empty(), "Memcheck is silent at cmov and setcc");
    assert_eq!(m.regs.gpr[RAX], u64::MAX);
    assert_eq!(m.regs.gpr[RCX], 1, "setcc: only bit 0 undefined");
    m.step(asm(|a| a.test(cl, cl)), |_| {});
    m.step(asm(|a| a.jne(0x1000u64)), |_| {});
    assert_eq!(m.reports.len(), 1);
    assert_eq!(m.reports[0].1, Check::Condition);
}

#[test]
fn a_32_bit_write_defines_the_upper_half() {
    let mut m = Machine::new();
    m.regs.gpr[RAX] = u64::MAX;
    m.step(asm(|a| a.mov(eax, dword_ptr(rdi))), |_| {});
    assert_eq!(m.regs.gpr[RAX], 0);
    m.regs.gpr[RAX] = u64::MAX;
    m.step(asm(|a| a.mov(al, 1)), |_| {});
    assert_eq!(m.regs.gpr[RAX], !0xff, "8-bit writes merge");
}

#[test]
fn memcmp_of_words_differing_in_a_defined_byte_is_decided() {
    // Only the low byte of each word is defined, and the two differ there.
    let mut m = Machine::new();
    m.guest.gpr[RAX] = 0x41;
    m.guest.gpr[RDX] = 0x42;
    m.regs.gpr[RAX] = !0xff;
    m.regs.gpr[RDX] = !0xff;
    m.step(asm(|a| a.cmp(rax, rdx)), |_| {});
    m.step(asm(|a| a.jne(0x1000u64)), |_| {});
    assert!(m.reports.is_empty());
}

#[test]
fn undefined_addresses_and_targets_are_value_errors() {
    let mut m = Machine::new();
    m.regs.gpr[RBX] = 0x100;
    let out = m.step(asm(|a| a.mov(rax, qword_ptr(rbx + 8))), |_| {});
    assert_eq!(
        out.checks.iter().collect::<Vec<_>>(),
        vec![Check::Value {
            size: 8,
            reason: ValueUse::Address
        }]
    );
    let out = m.step(asm(|a| a.lea(rax, qword_ptr(rbx + 8))), |_| {});
    assert!(out.checks.is_empty(), "lea accesses nothing");
    let out = m.step(asm(|a| a.jmp(rbx)), |_| {});
    assert_eq!(
        out.checks.iter().collect::<Vec<_>>(),
        vec![Check::Value {
            size: 8,
            reason: ValueUse::JumpTarget
        }]
    );
    m.guest.gpr[RSP] = 0x7000;
    m.mem.set(0x7000, &[0, 0, 0, 0, 0, 0, 0, 0x80]);
    let out = m.step(asm(|a| a.ret()), |_| {});
    assert_eq!(
        out.checks.iter().collect::<Vec<_>>(),
        vec![Check::Value {
            size: 8,
            reason: ValueUse::JumpTarget
        }]
    );
    m.regs.gpr[RCX] = 1;
    let out = m.step(asm(|a| a.jrcxz(0x1000u64)), |_| {});
    assert_eq!(
        out.checks.iter().collect::<Vec<_>>(),
        vec![Check::Condition]
    );
    // A defined 1 elsewhere in rcx decides jrcxz.
    m.guest.gpr[RCX] = 0x10;
    let out = m.step(asm(|a| a.jrcxz(0x1000u64)), |_| {});
    assert!(out.checks.is_empty());
}

/// `bt reg, reg` with an undefined offset: VEX stores the register below the stack pointer
/// and loads the byte at `+ (offset & 63) >> 3`, so Memcheck reports the address ("Use of
/// uninitialised value of size 8", Valgrind 3.19 on `mc_undef_mixed.c` at -O2), then the
/// branch on CF. Undefined bits the mask drops, or only the low three, are no address.
#[test]
fn bt_with_an_undefined_register_offset_is_an_address_error() {
    let mut m = Machine::new();
    m.guest.gpr[RDX] = 0x0123_4567_89ab_cdef;
    m.regs.gpr[RAX] = 0xffff_ffff;
    let out = m.step(asm(|a| a.bt(rdx, rax)), |_| {});
    assert_eq!(
        out.checks.iter().collect::<Vec<_>>(),
        vec![Check::Value {
            size: 8,
            reason: ValueUse::Address
        }]
    );
    assert!(m.regs.flags.any(FlagShadows::CF));
    m.regs.gpr[RAX] = 0x7 | 0xffff_ff00;
    let out = m.step(asm(|a| a.bt(rdx, rax)), |_| {});
    assert!(
        out.checks.is_empty(),
        "only the bit within the byte is undefined"
    );
    m.regs.gpr[RAX] = 0xffff_ffff;
    let out = m.step(asm(|a| a.bt(rdx, 5)), |_| {});
    assert!(out.checks.is_empty(), "an immediate offset");
}

#[test]
fn call_pushes_a_defined_return_address_and_push_pop_carry_shadows() {
    let mut m = Machine::new();
    m.guest.gpr[RSP] = 0x8000;
    m.mem.set(0x8000 - 8, &[0xff; 8]);
    m.step(asm(|a| a.call(0x1234u64)), |_| {});
    assert_eq!(m.mem.get(0x8000 - 8, 8), vec![0; 8]);
    m.regs.gpr[RDX] = 0xff00;
    m.step(asm(|a| a.push(rdx)), |g| g.gpr[RSP] -= 8);
    m.step(asm(|a| a.pop(rsi)), |g| g.gpr[RSP] += 8);
    assert_eq!(m.regs.gpr[RSI], 0xff00);
}

/// "hello\0" then ten bytes past the end of the block (undefined, partial-loads-ok).
fn hello_block(m: &mut Machine, len: usize) {
    let mut bytes = vec![0x5au8; len];
    bytes[..6].copy_from_slice(b"hello\0");
    m.guest.poke(S, &bytes);
    let mut shadow = vec![0xffu8; len];
    shadow[..6].fill(0);
    m.mem.set(S, &shadow);
    m.guest.gpr[RDI] = S;
}

#[test]
fn sse2_strlen_pcmpeqb_pmovmskb_bsf_has_no_report() {
    let mut m = Machine::new();
    hello_block(&mut m, 16);
    m.regs.vector[0] = [0xff; 64]; // xmm0 undefined before the zero idiom
    m.step(asm(|a| a.pxor(xmm0, xmm0)), |g| g.vector[0] = [0; 64]);
    m.step(asm(|a| a.movdqa(xmm1, xmmword_ptr(rdi))), |g| {
        let mut v = [0u8; 64];
        v[..16].copy_from_slice(
            &(0..16)
                .map(|i| *g.memory.get(&(S + i)).unwrap())
                .collect::<Vec<_>>(),
        );
        g.vector[1] = v;
    });
    m.step(asm(|a| a.pcmpeqb(xmm1, xmm0)), |g| {
        for i in 0..16 {
            g.vector[1][i] = if g.vector[1][i] == 0 { 0xff } else { 0 };
        }
    });
    m.step(asm(|a| a.pmovmskb(eax, xmm1)), |g| g.gpr[RAX] = 1 << 5);
    assert_eq!(
        m.regs.gpr[RAX], 0xffc0,
        "lanes 6..15 undefined, 0..5 defined"
    );
    m.step(asm(|a| a.test(eax, eax)), |_| {});
    m.step(asm(|a| a.je(0x1000u64)), |_| {});
    m.step(asm(|a| a.bsf(eax, eax)), |g| g.gpr[RAX] = 5);
    assert_eq!(m.regs.gpr[RAX], 0);
    m.step(asm(|a| a.add(rax, rdi)), |_| {});
    m.step(asm(|a| a.movzx(ecx, byte_ptr(rax))), |_| {});
    assert!(m.reports.is_empty(), "{:?}", m.reports);
}

#[test]
fn sse2_strlen_with_misaligned_start_shifts_the_mask_by_a_defined_count() {
    // The aligned load starts 3 bytes before the string: shr eax, cl drops those lanes.
    let mut m = Machine::new();
    m.regs.gpr[RAX] = 0xffc0; // pmovmskb result as above
    m.guest.gpr[RAX] = 1 << 5;
    m.guest.gpr[RCX] = 3;
    m.step(asm(|a| a.shr(eax, cl)), |g| g.gpr[RAX] >>= 3);
    m.step(asm(|a| a.test(eax, eax)), |_| {});
    m.step(asm(|a| a.jne(0x1000u64)), |_| {});
    m.step(asm(|a| a.tzcnt(eax, eax)), |_| {});
    assert_eq!(m.regs.gpr[RAX], 0);
    assert!(m.reports.is_empty(), "{:?}", m.reports);
}

#[test]
fn avx2_strlen_vpcmpeqb_vpmovmskb_tzcnt_has_no_report() {
    let mut m = Machine::new();
    hello_block(&mut m, 32);
    m.regs.vector[0] = [0xff; 64];
    m.step(asm(|a| a.vpxor(ymm0, ymm0, ymm0)), |g| {
        g.vector[0] = [0; 64]
    });
    m.step(asm(|a| a.vpcmpeqb(ymm1, ymm0, ymmword_ptr(rdi))), |g| {
        for i in 0..32 {
            g.vector[1][i] = if *g.memory.get(&(S + i as u64)).unwrap() == 0 {
                0xff
            } else {
                0
            };
        }
    });
    assert_eq!(
        &m.regs.vector[0][32..],
        &[0u8; 32][..],
        "VEX zeroes the upper shadow"
    );
    m.step(asm(|a| a.vpmovmskb(eax, ymm1)), |g| g.gpr[RAX] = 1 << 5);
    assert_eq!(m.regs.gpr[RAX], 0xffff_ffc0);
    m.step(asm(|a| a.test(eax, eax)), |_| {});
    m.step(asm(|a| a.jne(0x1000u64)), |_| {});
    m.step(asm(|a| a.tzcnt(eax, eax)), |g| g.gpr[RAX] = 5);
    assert_eq!(m.regs.gpr[RAX], 0);
    assert!(m.reports.is_empty(), "{:?}", m.reports);
}

#[test]
fn evex_strlen_vpcmpb_kortest_kmov_tzcnt_has_no_report() {
    let mut m = Machine::new();
    hello_block(&mut m, 64);
    m.regs.vector[16] = [0xff; 64];
    m.step(asm(|a| a.vpxorq(zmm16, zmm16, zmm16)), |g| {
        g.vector[16] = [0; 64]
    });
    m.step(asm(|a| a.vpcmpb(k1, zmm16, zmmword_ptr(rdi), 0)), |g| {
        g.opmask[1] = 1 << 5
    });
    assert_eq!(m.regs.opmask[1], !0x3f);
    m.step(asm(|a| a.kortestq(k1, k1)), |_| {});
    m.step(asm(|a| a.je(0x1000u64)), |_| {});
    m.step(asm(|a| a.kmovq(rax, k1)), |g| g.gpr[RAX] = 1 << 5);
    m.step(asm(|a| a.tzcnt(rax, rax)), |_| {});
    assert_eq!(m.regs.gpr[RAX], 0);
    assert!(m.reports.is_empty(), "{:?}", m.reports);
}

#[test]
fn sse2_strlen_on_an_undefined_string_reports_at_the_branch() {
    let mut m = Machine::new();
    m.guest.poke(S, &[0x41; 16]);
    m.mem.set(S, &[0xff; 16]);
    m.guest.gpr[RDI] = S;
    m.step(asm(|a| a.pxor(xmm0, xmm0)), |_| {});
    m.step(asm(|a| a.pcmpeqb(xmm0, xmmword_ptr(rdi))), |_| {});
    m.step(asm(|a| a.pmovmskb(eax, xmm0)), |_| {});
    m.step(asm(|a| a.test(eax, eax)), |_| {});
    m.step(asm(|a| a.je(0x1000u64)), |_| {});
    assert_eq!(m.reports.len(), 1);
}

#[test]
fn copies_of_undefined_bytes_are_silent_and_keep_the_shadow() {
    // movdqu struct copy with padding, then rep movsb, then rep stosb.
    let mut m = Machine::new();
    let pattern: Vec<u8> = (0..32).map(|i| if i % 5 == 0 { 0xff } else { 0 }).collect();
    m.mem.set(S, &pattern);
    m.guest.gpr[RSI] = S;
    m.guest.gpr[RDI] = BLOCK;
    m.step(asm(|a| a.movdqu(xmm3, xmmword_ptr(rsi))), |_| {});
    m.step(asm(|a| a.movdqu(xmmword_ptr(rdi), xmm3)), |_| {});
    assert_eq!(m.mem.get(BLOCK, 16), pattern[..16].to_vec());
    m.guest.gpr[RCX] = 32;
    m.step(asm(|a| a.rep().movsb()), |_| {});
    assert_eq!(m.mem.get(BLOCK, 32), pattern);
    m.regs.gpr[RAX] = 0x0f;
    m.guest.gpr[RCX] = 4;
    m.step(asm(|a| a.rep().stosd()), |_| {});
    assert_eq!(
        m.mem.get(BLOCK, 17),
        [[0x0f, 0, 0, 0].repeat(4), vec![pattern[16]]].concat()
    );
    assert!(m.reports.is_empty(), "{:?}", m.reports);
    // An undefined count is a conditional jump in Memcheck's eyes.
    m.regs.gpr[RCX] = 1;
    let out = m.step(asm(|a| a.rep().movsb()), |_| {});
    assert_eq!(
        out.checks.iter().collect::<Vec<_>>(),
        vec![Check::Condition]
    );
}

#[test]
fn repe_cmpsb_reports_when_it_reaches_undefined_bytes() {
    let mut m = Machine::new();
    m.guest.poke(S, b"abcX");
    m.guest.poke(BLOCK, b"abcY");
    m.mem.set(S + 3, &[0xff]);
    m.guest.gpr[RSI] = S;
    m.guest.gpr[RDI] = BLOCK;
    m.guest.gpr[RCX] = 4;
    let out = m.step(asm(|a| a.repe().cmpsb()), |_| {});
    assert_eq!(
        out.checks.iter().collect::<Vec<_>>(),
        vec![Check::Condition]
    );
    // Stopping at a defined difference before the undefined byte: silent.
    m.guest.poke(BLOCK, b"abZY");
    let out = m.step(asm(|a| a.repe().cmpsb()), |_| {});
    assert!(out.checks.is_empty());
}

#[test]
fn scalar_fp_with_a_stale_first_source_is_defined_in_lane_zero() {
    // gcc: vcvtsi2sd xmm0, xmm0, eax / vsqrtsd xmm0, xmm0, xmm1 with xmm0 never written:
    // lane 0 comes from the last operand only.
    let mut m = Machine::new();
    m.regs.vector[0] = [0xff; 64];
    m.step(asm(|a| a.vcvtsi2sd(xmm0, xmm0, eax)), |_| {});
    assert_eq!(&m.regs.vector[0][..8], &[0; 8]);
    assert_eq!(
        &m.regs.vector[0][8..16],
        &[0xff; 8],
        "upper lane from the stale source"
    );
    assert_eq!(
        &m.regs.vector[0][16..],
        &[0; 48][..],
        "VEX zeroes above 128 bits"
    );
    m.regs.vector[2] = [0xff; 64];
    m.step(asm(|a| a.vsqrtsd(xmm2, xmm2, xmm0)), |_| {});
    assert_eq!(&m.regs.vector[2][..8], &[0; 8]);
    m.step(asm(|a| a.vucomisd(xmm2, xmm0)), |_| {});
    m.step(asm(|a| a.jp(0x1000u64)), |_| {});
    assert!(m.reports.is_empty(), "{:?}", m.reports);
}

#[test]
fn bt_on_a_bit_string_in_memory_tests_the_addressed_byte() {
    // A bitmap: byte 5 defined, the rest undefined; bt [rdi], rax with rax = 43 tests
    // bit 3 of byte 5.
    let mut m = Machine::new();
    m.mem.set(BLOCK, &[0xff; 16]);
    m.mem.set(BLOCK + 5, &[0]);
    m.guest.gpr[RDI] = BLOCK;
    m.guest.gpr[RAX] = 43;
    m.step(asm(|a| a.bt(qword_ptr(rdi), rax)), |_| {});
    m.step(asm(|a| a.jb(0x1000u64)), |_| {});
    assert!(m.reports.is_empty(), "{:?}", m.reports);
    m.step(asm(|a| a.bts(qword_ptr(rdi), rax)), |_| {});
    assert_eq!(m.mem.get(BLOCK + 5, 1), vec![0]);
    m.guest.gpr[RAX] = 44 + 8;
    m.step(asm(|a| a.btr(qword_ptr(rdi), rax)), |_| {});
    assert_eq!(
        m.mem.get(BLOCK + 6, 1),
        vec![0xef],
        "btr defines the bit it clears"
    );
    m.step(asm(|a| a.bt(qword_ptr(rdi), rax)), |_| {});
    m.step(asm(|a| a.jb(0x1000u64)), |_| {});
    assert!(m.reports.is_empty());
    m.guest.gpr[RAX] = 0;
    m.step(asm(|a| a.bt(qword_ptr(rdi), rax)), |_| {});
    m.step(asm(|a| a.jb(0x1000u64)), |_| {});
    assert_eq!(m.reports.len(), 1, "bit 0 of byte 0 is undefined");
    // An undefined offset above the low three bits is an address error.
    m.regs.gpr[RAX] = 0x100;
    let out = m.step(asm(|a| a.bt(qword_ptr(rdi), rax)), |_| {});
    assert_eq!(
        out.checks.iter().collect::<Vec<_>>(),
        vec![Check::Value {
            size: 8,
            reason: ValueUse::Address
        }]
    );
}

#[test]
fn lazy_binding_trampoline_restores_argument_register_shadows() {
    // _dl_runtime_resolve_xsavec: xsavec [rsp+0x40]; the resolver runs and leaves its own
    // shadows in xmm0 and k1; xrstor [rsp+0x40] brings back the caller's.
    let mut m = Machine::new();
    m.guest.gpr[RSP] = 0x7000_0000;
    m.guest.gpr[RAX] = 0xee;
    m.guest.gpr[RDX] = 0;
    m.mem.set(0x7000_0040, &[0xff; 2048]); // fresh stack
    m.regs.vector[0][..32].fill(0); // a defined double argument
    m.regs.vector[0][32..].fill(0);
    m.regs.vector[1] = [0xff; 64]; // an undefined one
    m.regs.vector[17] = [0x0f; 64];
    m.regs.opmask[1] = 0x3;
    let before = m.regs.clone();
    m.step(asm(|a| a.xsavec(ptr(rsp + 0x40))), |_| {});
    assert_eq!(
        m.mem.get(0x7000_0040 + 160, 16),
        vec![0; 16],
        "xmm0's shadow in the legacy area"
    );
    assert_eq!(m.mem.get(0x7000_0040 + 176, 16), vec![0xff; 16], "xmm1's");
    m.regs.vector = [[0x55; 64]; 32];
    m.regs.opmask = [0; 8];
    m.step(asm(|a| a.xrstor(ptr(rsp + 0x40))), |_| {});
    assert_eq!(m.regs.vector, before.vector);
    assert_eq!(m.regs.opmask, before.opmask);
    // fxrstor without a record reads the xmm shadows back from the legacy area.
    m.mem.set(0x7000_0040 + 160, &[0x81; 16]);
    m.step(asm(|a| a.fxrstor(ptr(rsp + 0x40))), |_| {});
    assert_eq!(&m.regs.vector[0][..16], &[0x81; 16]);
    assert!(m.reports.is_empty());
}

#[test]
fn cmpxchg16b_compares_exactly_and_moves_shadows_by_the_real_outcome() {
    let mut m = Machine::new();
    m.guest.gpr[RDI] = BLOCK;
    m.guest
        .poke(BLOCK, &[1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    m.mem.set(BLOCK + 8, &[0, 0xff, 0, 0, 0, 0, 0, 0]); // high half partly undefined
    m.guest.gpr[RAX] = 5; // differs from 1 in defined bits: ZF decided
    m.regs.gpr[RBX] = u64::MAX;
    m.step(asm(|a| a.lock().cmpxchg16b(xmmword_ptr(rdi))), |_| {});
    m.step(asm(|a| a.jne(0x1000u64)), |_| {});
    assert!(m.reports.is_empty());
    assert_eq!(
        m.regs.gpr[RDX], 0xff00,
        "failure loads the memory's shadow into rdx:rax"
    );
    m.guest.gpr[RAX] = 1;
    m.guest.gpr[RDX] = 2;
    m.step(asm(|a| a.lock().cmpxchg16b(xmmword_ptr(rdi))), |_| {});
    assert_eq!(
        m.mem.get(BLOCK, 8),
        vec![0xff; 8],
        "success stores rcx:rbx's shadow"
    );
    m.step(asm(|a| a.jne(0x1000u64)), |_| {});
    assert_eq!(
        m.reports.len(),
        1,
        "equal so far, but the undefined byte could differ"
    );
}
