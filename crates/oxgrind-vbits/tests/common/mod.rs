//! Test machinery: a guest made of plain fields, a `HashMap` shadow memory, a small PRNG and
//! an assembler shortcut.
#![allow(dead_code)]

use std::collections::HashMap;

use iced_x86::code_asm::CodeAssembler;
use iced_x86::Instruction;
use oxgrind_vbits::{Guest, Interpreter, Outcome, Segment, ShadowMemory, ShadowRegisters};

/// Register numbers in encoding order.
pub const RAX: usize = 0;
pub const RCX: usize = 1;
pub const RDX: usize = 2;
pub const RBX: usize = 3;
pub const RSP: usize = 4;
pub const RBP: usize = 5;
pub const RSI: usize = 6;
pub const RDI: usize = 7;

#[derive(Clone)]
pub struct TestGuest {
    pub gpr: [u64; 16],
    pub rflags: u64,
    pub vector: [[u8; 64]; 32],
    pub opmask: [u64; 8],
    pub memory: HashMap<u64, u8>,
}

impl Default for TestGuest {
    fn default() -> Self {
        TestGuest {
            gpr: [0; 16],
            rflags: 0x202,
            vector: [[0; 64]; 32],
            opmask: [0; 8],
            memory: HashMap::new(),
        }
    }
}

impl TestGuest {
    pub fn poke(&mut self, addr: u64, bytes: &[u8]) {
        for (i, b) in bytes.iter().enumerate() {
            self.memory.insert(addr.wrapping_add(i as u64), *b);
        }
    }
}

impl Guest for TestGuest {
    fn gpr(&self, index: usize) -> u64 {
        self.gpr[index]
    }
    fn rflags(&self) -> u64 {
        self.rflags
    }
    fn vector(&self, index: usize) -> [u8; 64] {
        self.vector[index]
    }
    fn opmask(&self, index: usize) -> u64 {
        self.opmask[index]
    }
    fn segment_base(&self, _segment: Segment) -> u64 {
        0
    }
    fn read_memory(&self, address: u64, out: &mut [u8]) -> bool {
        for (i, b) in out.iter_mut().enumerate() {
            *b = *self
                .memory
                .get(&(address.wrapping_add(i as u64)))
                .unwrap_or(&0);
        }
        true
    }
}

/// Shadow memory as a map; absent bytes are defined.
#[derive(Default, Clone)]
pub struct MapShadow(pub HashMap<u64, u8>);

impl MapShadow {
    pub fn set(&mut self, addr: u64, shadow: &[u8]) {
        self.store(addr, shadow);
    }
    pub fn get(&self, addr: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| *self.0.get(&(addr.wrapping_add(i as u64))).unwrap_or(&0))
            .collect()
    }
}

impl ShadowMemory for MapShadow {
    fn load(&mut self, address: u64, out: &mut [u8]) {
        for (i, b) in out.iter_mut().enumerate() {
            *b = *self.0.get(&(address.wrapping_add(i as u64))).unwrap_or(&0);
        }
    }
    fn store(&mut self, address: u64, shadow: &[u8]) {
        for (i, b) in shadow.iter().enumerate() {
            self.0.insert(address.wrapping_add(i as u64), *b);
        }
    }
}

/// xorshift64*: deterministic, so a failure reproduces.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// A value with a bias towards edge cases (0, all ones, small numbers, single bits).
    pub fn value(&mut self, width: u32) -> u64 {
        let m = if width >= 64 {
            u64::MAX
        } else {
            (1u64 << width) - 1
        };
        let v = match self.below(8) {
            0 => 0,
            1 => u64::MAX,
            2 => self.below(4),
            3 => 1u64 << self.below(width as u64),
            4 => (1u64 << self.below(width as u64)).wrapping_sub(1),
            _ => self.next(),
        };
        v & m
    }
    /// A shadow: all defined, all undefined, or sparse/dense random undefined bits.
    pub fn shadow(&mut self, width: u32) -> u64 {
        let m = if width >= 64 {
            u64::MAX
        } else {
            (1u64 << width) - 1
        };
        let s = match self.below(8) {
            0 | 1 => 0,
            2 => u64::MAX,
            3 => 1u64 << self.below(width as u64),
            4 => (self.next() & self.next() & self.next()) & (self.next() | self.next()),
            5 => self.next() & self.next() & self.next() & self.next(),
            6 => ((1u64 << self.below(width as u64)).wrapping_sub(1)) ^ u64::MAX, // high bits
            _ => self.next() & self.next(),
        };
        s & m
    }
}

/// Assembles one instruction with iced's code assembler.
pub fn asm(f: impl FnOnce(&mut CodeAssembler) -> Result<(), iced_x86::IcedError>) -> Instruction {
    let mut a = CodeAssembler::new(64).unwrap();
    f(&mut a).unwrap();
    a.instructions()[0]
}

/// Assembles a sequence.
pub fn asm_seq(
    f: impl FnOnce(&mut CodeAssembler) -> Result<(), iced_x86::IcedError>,
) -> Vec<Instruction> {
    let mut a = CodeAssembler::new(64).unwrap();
    f(&mut a).unwrap();
    a.instructions().to_vec()
}

/// Runs a sequence through the interpreter, collecting every outcome.
pub fn run(
    insns: &[Instruction],
    guest: &TestGuest,
    regs: &mut ShadowRegisters,
    mem: &mut MapShadow,
) -> Vec<Outcome> {
    let mut interp = Interpreter::new();
    insns
        .iter()
        .map(|i| interp.step(i, guest, regs, mem))
        .collect()
}

pub fn format(insn: &Instruction) -> String {
    use iced_x86::{Formatter, IntelFormatter};
    let mut out = String::new();
    IntelFormatter::new().format(insn, &mut out);
    out
}
