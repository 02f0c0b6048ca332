//! The soundness oracle: every bit the interpreter calls defined must be the same for every
//! completion of the undefined input bits, on this very CPU.
//!
//! Each case is one instruction on two general registers (and the flags). For random values
//! and random V bits, the interpreter computes the output shadows (destination register and
//! the six arithmetic flags); then the instruction runs natively (inline assembly) once per
//! completion of the undefined input bits (all of them when there are at most 14, else 4096
//! random ones), and each output bit called defined must never change. Flags the architecture
//! leaves undefined are checked too: if the hardware's value for them moves with an undefined
//! input, calling them defined would be wrong on this machine.
#![cfg(target_arch = "x86_64")]

mod common;

use std::arch::asm;

use common::*;
use iced_x86::code_asm::*;
use iced_x86::Instruction;
use oxgrind_vbits::{FlagShadows, Interpreter, ShadowRegisters};

/// The six arithmetic flags' positions in RFLAGS, in `FlagShadows` bit order.
const FLAG_BITS: [u32; 6] = FlagShadows::RFLAGS_BITS;
const ARITH_FLAGS: u64 = 0x8d5;

type Native = fn(u64, u64, u64) -> (u64, u64);

/// Runs `$t` with `{a}` (in/out) and `{b}` (in) in general registers and the given flags.
macro_rules! native {
    ($t:literal) => {{
        fn run(a: u64, b: u64, flags: u64) -> (u64, u64) {
            let mut x = a;
            let f: u64;
            // SAFETY: the template only computes on the registers given to it; the flags
            // loaded are arithmetic flags plus IF and the reserved bit 1, as in user mode.
            unsafe {
                asm!("/* {a} {b} */", "push {fi}", "popfq", $t, "pushfq", "pop {fo}",
                     a = inout(reg) x, b = in(reg) b, fi = in(reg) (flags & ARITH_FLAGS) | 0x202,
                     fo = lateout(reg) f);
            }
            (x, f)
        }
        run as Native
    }};
}

/// As `native!`, with `b` in `rcx` (shift counts in `cl`).
macro_rules! native_cl {
    ($t:literal) => {{
        fn run(a: u64, b: u64, flags: u64) -> (u64, u64) {
            let mut x = a;
            let f: u64;
            // SAFETY: as in `native!`.
            unsafe {
                asm!("/* {a} */", "push {fi}", "popfq", $t, "pushfq", "pop {fo}",
                     a = inout(reg) x, in("rcx") b, fi = in(reg) (flags & ARITH_FLAGS) | 0x202,
                     fo = lateout(reg) f);
            }
            (x, f)
        }
        run as Native
    }};
}

/// As `native!`, with `a` in `rax` and `rdx` clobbered (one-operand multiply).
macro_rules! native_rax {
    ($t:literal) => {{
        fn run(a: u64, b: u64, flags: u64) -> (u64, u64) {
            let mut x = a;
            let f: u64;
            // SAFETY: as in `native!`; rdx is declared clobbered.
            unsafe {
                asm!("/* {b} */", "push {fi}", "popfq", $t, "pushfq", "pop {fo}",
                     inout("rax") x, b = in(reg) b, out("rdx") _, fi = in(reg) (flags & ARITH_FLAGS) | 0x202,
                     fo = lateout(reg) f);
            }
            (x, f)
        }
        run as Native
    }};
}

/// As `native!`, with `{m}` the address of a memory operand holding `a` (read back after).
macro_rules! native_mem {
    ($t:literal) => {{
        fn run(a: u64, b: u64, flags: u64) -> (u64, u64) {
            let mut cell = a;
            let f: u64;
            // SAFETY: `{m}` points at `cell`, a live local; the template accesses at most its
            // 8 bytes.
            unsafe {
                asm!("/* {m} {b} */", "push {fi}", "popfq", $t, "pushfq", "pop {fo}",
                     m = in(reg) &mut cell as *mut u64, b = in(reg) b,
                     fi = in(reg) (flags & ARITH_FLAGS) | 0x202, fo = lateout(reg) f);
            }
            (cell, f)
        }
        run as Native
    }};
}

/// Where memory-operand cases keep their operand in the interpreter's guest.
const CELL: u64 = 0x6000;

struct Case {
    insn: Instruction,
    native: Native,
    /// Width of the operands in bits (the destination is `rax`'s low `width` bits).
    width: u32,
    /// Width of the source operand in `rbx`/`rcx` (8 for shift counts).
    src_width: u32,
    /// The destination is the memory operand `[rdi]` (= CELL) rather than `rax`.
    in_memory: bool,
}

fn case(insn: Instruction, native: Native, width: u32) -> Case {
    Case {
        insn,
        native,
        width,
        src_width: width,
        in_memory: false,
    }
}

fn mask(w: u32) -> u64 {
    if w >= 64 {
        u64::MAX
    } else {
        (1u64 << w) - 1
    }
}

/// Positions of set bits.
fn bits(x: u64) -> Vec<u32> {
    (0..64).filter(|i| x >> i & 1 != 0).collect()
}

fn check_case(c: &Case, samples: usize, seed: u64) {
    let mut rng = Rng(seed);
    let mut interp = Interpreter::new();
    for _ in 0..samples {
        let w = c.width;
        let a = rng.next();
        let b = rng.next();
        let (va, vb) = (rng.shadow(w), rng.shadow(c.src_width));
        let flags = rng.next() & ARITH_FLAGS;
        let vflags = (rng.next() & rng.next()) as u8 & FlagShadows::ALL;
        let vflags = if rng.below(3) == 0 { 0 } else { vflags };

        let mut guest = TestGuest::default();
        guest.gpr[RAX] = a;
        guest.gpr[RBX] = b;
        guest.gpr[RCX] = b;
        guest.rflags = flags | 0x202;
        let mut regs = ShadowRegisters::default();
        regs.gpr[RAX] = va;
        regs.gpr[RBX] = vb;
        regs.gpr[RCX] = vb;
        regs.flags = FlagShadows(vflags);
        let mut mem = MapShadow::default();
        if c.in_memory {
            guest.gpr[RDI] = CELL;
            guest.poke(CELL, &a.to_le_bytes());
            mem.set(CELL, &va.to_le_bytes());
        }
        let outcome = interp.step(&c.insn, &guest, &mut regs, &mut mem);
        let out_v = if c.in_memory {
            u64::from_le_bytes(mem.get(CELL, 8).try_into().unwrap()) & mask(w)
        } else {
            regs.gpr[RAX] & mask(w)
        };
        let out_f = regs.flags.0;

        // The undefined input positions: a's (0..64), b's (64..128), flags (128..134).
        let mut positions: Vec<u32> = bits(va & mask(w));
        positions.extend(bits(vb & mask(c.src_width)).iter().map(|p| p + 64));
        positions.extend((0..6).filter(|i| vflags >> i & 1 != 0).map(|i| 128 + i));
        let exhaustive = positions.len() <= 14;
        let count = if exhaustive {
            1u64 << positions.len()
        } else {
            4096
        };

        let mut first: Option<(u64, u64)> = None;
        for k in 0..count {
            let pick = if exhaustive { k } else { rng.next() };
            let (mut x, mut y, mut f) = (a, b, flags);
            for (j, p) in positions.iter().enumerate() {
                let bit = pick >> (j % 64) & 1;
                match *p {
                    p if p < 64 => x = (x & !(1 << p)) | bit << p,
                    p if p < 128 => y = (y & !(1 << (p - 64))) | bit << (p - 64),
                    p => {
                        let fb = FLAG_BITS[(p - 128) as usize];
                        f = (f & !(1 << fb)) | bit << fb;
                    }
                }
            }
            let (r, rf) = (c.native)(x, y, f);
            let r = r & mask(w);
            match first {
                None => first = Some((r, rf)),
                Some((r0, f0)) => {
                    let changed = (r ^ r0) & !out_v;
                    let mut fchanged = 0u8;
                    for (i, fb) in FLAG_BITS.iter().enumerate() {
                        if out_f >> i & 1 == 0 && (rf ^ f0) >> fb & 1 != 0 {
                            fchanged |= 1 << i;
                        }
                    }
                    assert!(
                        changed == 0 && fchanged == 0,
                        "unsound: `{}` a={a:#x} va={va:#x} b={b:#x} vb={vb:#x} flags={flags:#x} vflags={vflags:#x}: \
                         result shadow {out_v:#x} but bits {changed:#x} change; flag shadow {out_f:#x} but flags {fchanged:#x} change \
                         (outcome {outcome:?})",
                        format(&c.insn)
                    );
                }
            }
        }
    }
}

fn cases() -> Vec<Case> {
    vec![
        case(asm(|a| a.add(al, bl)), native!("add {a:l}, {b:l}"), 8),
        case(asm(|a| a.adc(al, bl)), native!("adc {a:l}, {b:l}"), 8),
        case(asm(|a| a.sub(al, bl)), native!("sub {a:l}, {b:l}"), 8),
        case(asm(|a| a.sbb(al, bl)), native!("sbb {a:l}, {b:l}"), 8),
        case(asm(|a| a.cmp(al, bl)), native!("cmp {a:l}, {b:l}"), 8),
        case(asm(|a| a.and(al, bl)), native!("and {a:l}, {b:l}"), 8),
        case(asm(|a| a.or(al, bl)), native!("or {a:l}, {b:l}"), 8),
        case(asm(|a| a.xor(al, bl)), native!("xor {a:l}, {b:l}"), 8),
        case(asm(|a| a.test(al, bl)), native!("test {a:l}, {b:l}"), 8),
        case(asm(|a| a.xor(al, al)), native!("xor {a:l}, {a:l}"), 8),
        case(asm(|a| a.sub(al, al)), native!("sub {a:l}, {a:l}"), 8),
        case(asm(|a| a.sbb(al, al)), native!("sbb {a:l}, {a:l}"), 8),
        case(asm(|a| a.cmp(al, al)), native!("cmp {a:l}, {a:l}"), 8),
        case(asm(|a| a.inc(al)), native!("inc {a:l}"), 8),
        case(asm(|a| a.dec(al)), native!("dec {a:l}"), 8),
        case(asm(|a| a.neg(al)), native!("neg {a:l}"), 8),
        case(asm(|a| a.not(al)), native!("not {a:l}"), 8),
        case(asm(|a| a.add(ax, bx)), native!("add {a:x}, {b:x}"), 16),
        case(asm(|a| a.sub(ax, bx)), native!("sub {a:x}, {b:x}"), 16),
        case(asm(|a| a.cmp(ax, bx)), native!("cmp {a:x}, {b:x}"), 16),
        case(asm(|a| a.add(rax, rbx)), native!("add {a}, {b}"), 64),
        case(asm(|a| a.sub(rax, rbx)), native!("sub {a}, {b}"), 64),
        case(asm(|a| a.cmp(rax, rbx)), native!("cmp {a}, {b}"), 64),
        case(asm(|a| a.and(rax, rbx)), native!("and {a}, {b}"), 64),
        case(asm(|a| a.or(rax, rbx)), native!("or {a}, {b}"), 64),
        case(asm(|a| a.test(rax, rbx)), native!("test {a}, {b}"), 64),
        case(asm(|a| a.adc(eax, ebx)), native!("adc {a:e}, {b:e}"), 32),
        case(asm(|a| a.sbb(eax, ebx)), native!("sbb {a:e}, {b:e}"), 32),
        case(asm(|a| a.imul_2(ax, bx)), native!("imul {a:x}, {b:x}"), 16),
        case(asm(|a| a.imul_2(rax, rbx)), native!("imul {a}, {b}"), 64),
        case(asm(|a| a.bsf(ax, bx)), native!("bsf {a:x}, {b:x}"), 16),
        case(asm(|a| a.bsr(ax, bx)), native!("bsr {a:x}, {b:x}"), 16),
        case(asm(|a| a.tzcnt(ax, bx)), native!("tzcnt {a:x}, {b:x}"), 16),
        case(asm(|a| a.lzcnt(ax, bx)), native!("lzcnt {a:x}, {b:x}"), 16),
        case(
            asm(|a| a.popcnt(ax, bx)),
            native!("popcnt {a:x}, {b:x}"),
            16,
        ),
        case(asm(|a| a.tzcnt(rax, rbx)), native!("tzcnt {a}, {b}"), 64),
        case(asm(|a| a.bt(ax, bx)), native!("bt {a:x}, {b:x}"), 16),
        case(asm(|a| a.bts(ax, bx)), native!("bts {a:x}, {b:x}"), 16),
        case(asm(|a| a.btr(ax, bx)), native!("btr {a:x}, {b:x}"), 16),
        case(asm(|a| a.btc(ax, bx)), native!("btc {a:x}, {b:x}"), 16),
        case(asm(|a| a.movzx(ax, bl)), native!("movzx {a:x}, {b:l}"), 16),
        case(asm(|a| a.movsx(ax, bl)), native!("movsx {a:x}, {b:l}"), 16),
        case(asm(|a| a.xadd(ax, bx)), native!("xadd {a:x}, {b:x}"), 16),
        case(
            asm(|a| a.lea(eax, dword_ptr(rax + rbx * 8 + 3))),
            native!("lea {a:e}, [{a} + {b}*8 + 3]"),
            32,
        ),
        case(
            asm(|a| a.lea(rax, qword_ptr(rax + rbx))),
            native!("lea {a}, [{a} + {b}]"),
            64,
        ),
        case(
            asm(|a| a.andn(eax, eax, ebx)),
            native!("andn {a:e}, {a:e}, {b:e}"),
            32,
        ),
        case(asm(|a| a.blsr(eax, ebx)), native!("blsr {a:e}, {b:e}"), 32),
        case(asm(|a| a.blsi(eax, ebx)), native!("blsi {a:e}, {b:e}"), 32),
        case(
            asm(|a| a.blsmsk(eax, ebx)),
            native!("blsmsk {a:e}, {b:e}"),
            32,
        ),
        case(asm(|a| a.bswap(eax)), native!("bswap {a:e}"), 32),
        case(
            asm(|a| a.bextr(eax, ebx, ecx)),
            native!("bextr {a:e}, {b:e}, {b:e}"),
            32,
        ),
        case(
            asm(|a| a.bzhi(eax, ebx, ecx)),
            native!("bzhi {a:e}, {b:e}, {b:e}"),
            32,
        ),
        case(asm(|a| a.cmova(ax, bx)), native!("cmova {a:x}, {b:x}"), 16),
        case(asm(|a| a.cmovl(ax, bx)), native!("cmovl {a:x}, {b:x}"), 16),
        case(asm(|a| a.cmove(ax, bx)), native!("cmove {a:x}, {b:x}"), 16),
        case(asm(|a| a.cmovp(ax, bx)), native!("cmovp {a:x}, {b:x}"), 16),
        case(asm(|a| a.setle(al)), native!("setle {a:l}"), 8),
        case(asm(|a| a.setb(al)), native!("setb {a:l}"), 8),
        case(asm(|a| a.seto(al)), native!("seto {a:l}"), 8),
        case(asm(|a| a.setns(al)), native!("setns {a:l}"), 8),
        case(asm(|a| a.setnp(al)), native!("setnp {a:l}"), 8),
        case(
            asm(|a| a.shld(ax, bx, 5)),
            native!("shld {a:x}, {b:x}, 5"),
            16,
        ),
        case(
            asm(|a| a.shrd(eax, ebx, 7)),
            native!("shrd {a:e}, {b:e}, 7"),
            32,
        ),
        case(asm(|a| a.shl(eax, 1)), native!("shl {a:e}, 1"), 32),
        case(asm(|a| a.sar(ax, 3)), native!("sar {a:x}, 3"), 16),
        case(asm(|a| a.ror(rax, 13)), native!("ror {a}, 13"), 64),
        case(
            asm(|a| a.imul_3(ax, bx, 0x1234)),
            native!("imul {a:x}, {b:x}, 0x1234"),
            16,
        ),
        case(
            asm(|a| a.shlx(eax, eax, ebx)),
            native!("shlx {a:e}, {a:e}, {b:e}"),
            32,
        ),
        case(
            asm(|a| a.sarx(eax, eax, ebx)),
            native!("sarx {a:e}, {a:e}, {b:e}"),
            32,
        ),
        case(
            asm(|a| a.shrx(rax, rax, rbx)),
            native!("shrx {a}, {a}, {b}"),
            64,
        ),
        case(
            asm(|a| a.rorx(eax, ebx, 7)),
            native!("rorx {a:e}, {b:e}, 7"),
            32,
        ),
        case(asm(|a| a.adcx(eax, ebx)), native!("adcx {a:e}, {b:e}"), 32),
        case(asm(|a| a.adox(eax, ebx)), native!("adox {a:e}, {b:e}"), 32),
        case(asm(|a| a.cbw()), native_rax!("cbw"), 16),
        case(asm(|a| a.cwde()), native_rax!("cwde"), 32),
        case(asm(|a| a.cdqe()), native_rax!("cdqe"), 64),
        case(asm(|a| a.sahf()), native_rax!("sahf"), 16),
        case(asm(|a| a.lahf()), native_rax!("lahf"), 16),
        case(asm(|a| a.xchg(ax, bx)), native!("xchg {a:x}, {b:x}"), 16),
        case(asm(|a| a.clc()), native!("clc"), 8),
        case(asm(|a| a.cmc()), native!("cmc"), 8),
    ]
}

fn shift_cases() -> Vec<Case> {
    let mut v = vec![
        case(asm(|a| a.shl(al, cl)), native_cl!("shl {a:l}, cl"), 8),
        case(asm(|a| a.shr(al, cl)), native_cl!("shr {a:l}, cl"), 8),
        case(asm(|a| a.sar(al, cl)), native_cl!("sar {a:l}, cl"), 8),
        case(asm(|a| a.rol(al, cl)), native_cl!("rol {a:l}, cl"), 8),
        case(asm(|a| a.ror(al, cl)), native_cl!("ror {a:l}, cl"), 8),
        case(asm(|a| a.rcl(al, cl)), native_cl!("rcl {a:l}, cl"), 8),
        case(asm(|a| a.rcr(al, cl)), native_cl!("rcr {a:l}, cl"), 8),
        case(asm(|a| a.shl(ax, cl)), native_cl!("shl {a:x}, cl"), 16),
        case(asm(|a| a.sar(ax, cl)), native_cl!("sar {a:x}, cl"), 16),
        case(asm(|a| a.rcl(ax, cl)), native_cl!("rcl {a:x}, cl"), 16),
        case(asm(|a| a.shl(rax, cl)), native_cl!("shl {a}, cl"), 64),
        case(asm(|a| a.shr(rax, cl)), native_cl!("shr {a}, cl"), 64),
        case(asm(|a| a.sar(rax, cl)), native_cl!("sar {a}, cl"), 64),
        case(asm(|a| a.rol(rax, cl)), native_cl!("rol {a}, cl"), 64),
    ];
    for c in &mut v {
        c.src_width = 8;
    }
    v
}

#[test]
fn one_operand_multiply_is_sound() {
    let mut cases = [
        case(asm(|a| a.mul(bl)), native_rax!("mul {b:l}"), 16),
        case(asm(|a| a.imul(bl)), native_rax!("imul {b:l}"), 16),
        case(asm(|a| a.mul(bx)), native_rax!("mul {b:x}"), 16),
        case(asm(|a| a.mul(rbx)), native_rax!("mul {b}"), 64),
    ];
    cases[0].src_width = 8;
    cases[1].src_width = 8;
    for (i, c) in cases.iter().enumerate() {
        check_case(c, 600, 0x77 + i as u64);
    }
}

#[test]
fn memory_destinations_and_sources_are_sound() {
    let mut cases = vec![
        case(
            asm(|a| a.add(word_ptr(rdi), bx)),
            native_mem!("add word ptr [{m}], {b:x}"),
            16,
        ),
        case(
            asm(|a| a.sub(byte_ptr(rdi), bl)),
            native_mem!("sub byte ptr [{m}], {b:l}"),
            8,
        ),
        case(
            asm(|a| a.and(dword_ptr(rdi), ebx)),
            native_mem!("and dword ptr [{m}], {b:e}"),
            32,
        ),
        case(
            asm(|a| a.or(qword_ptr(rdi), rbx)),
            native_mem!("or qword ptr [{m}], {b}"),
            64,
        ),
        case(
            asm(|a| a.cmp(word_ptr(rdi), bx)),
            native_mem!("cmp word ptr [{m}], {b:x}"),
            16,
        ),
        case(
            asm(|a| a.test(byte_ptr(rdi), 0x24)),
            native_mem!("test byte ptr [{m}], 0x24"),
            8,
        ),
        case(
            asm(|a| a.cmp(dword_ptr(rdi), -3)),
            native_mem!("cmp dword ptr [{m}], -3"),
            32,
        ),
        case(
            asm(|a| a.inc(word_ptr(rdi))),
            native_mem!("inc word ptr [{m}]"),
            16,
        ),
        case(
            asm(|a| a.neg(byte_ptr(rdi))),
            native_mem!("neg byte ptr [{m}]"),
            8,
        ),
        case(
            asm(|a| a.shl(word_ptr(rdi), 3)),
            native_mem!("shl word ptr [{m}], 3"),
            16,
        ),
        case(
            asm(|a| a.rol(byte_ptr(rdi), 1)),
            native_mem!("rol byte ptr [{m}], 1"),
            8,
        ),
        case(
            asm(|a| a.bts(word_ptr(rdi), 11)),
            native_mem!("bts word ptr [{m}], 11"),
            16,
        ),
        case(
            asm(|a| a.xadd(word_ptr(rdi), bx)),
            native_mem!("xadd word ptr [{m}], {b:x}"),
            16,
        ),
        case(
            asm(|a| a.adc(byte_ptr(rdi), bl)),
            native_mem!("adc byte ptr [{m}], {b:l}"),
            8,
        ),
        case(
            asm(|a| a.mov(word_ptr(rdi), bx)),
            native_mem!("mov word ptr [{m}], {b:x}"),
            16,
        ),
    ];
    for c in &mut cases {
        c.in_memory = true;
    }
    for (i, c) in cases.iter().enumerate() {
        check_case(c, 500, 0x3131 + i as u64);
    }
}

#[test]
fn every_bit_called_defined_is_invariant_over_completions() {
    for (i, c) in cases().iter().enumerate() {
        check_case(c, 600, 0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1));
    }
}

#[test]
fn shifts_and_rotates_are_sound_for_every_count() {
    for (i, c) in shift_cases().iter().enumerate() {
        check_case(c, 600, 0x1234_5678_9abc_def1 ^ (i as u64 + 1));
    }
}

#[test]
#[should_panic(expected = "unsound")]
fn the_oracle_catches_an_unsound_rule() {
    // The oracle must be able to fail: checking `and`'s rule (defined zeros decide) against
    // an `add`, where they do not, has to find a bit that changes.
    let c = case(asm(|a| a.and(al, bl)), native!("add {a:l}, {b:l}"), 8);
    check_case(&c, 200, 7);
}
