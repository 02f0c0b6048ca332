//! How much real code the interpreter models exactly: decodes the executable sections of
//! ELF files and counts instructions with a specific rule versus the generic pessimistic one.
//!
//!     cargo run --release -p oxgrind-vbits --example coverage -- /usr/bin/python3 \
//!         /lib/x86_64-linux-gnu/libc.so.6 /usr/bin/sqlite3
//!
//! Each instruction is also stepped once with random shadows, so the run doubles as a check
//! that no instruction of real code makes the interpreter panic.

use std::collections::HashMap;

use iced_x86::{Decoder, DecoderOptions, Mnemonic};
use oxgrind_vbits::{Guest, Interpreter, Rule, Segment, ShadowMemory, ShadowRegisters};

struct ZeroGuest(u64);

impl Guest for ZeroGuest {
    fn gpr(&self, index: usize) -> u64 {
        // Small values keep `rep` counts short.
        (self.0 >> index) & 0xff
    }
    fn rflags(&self) -> u64 {
        0x202
    }
    fn vector(&self, index: usize) -> [u8; 64] {
        [self.0.rotate_left(index as u32) as u8; 64]
    }
    fn opmask(&self, index: usize) -> u64 {
        self.0.rotate_left(index as u32)
    }
    fn segment_base(&self, _segment: Segment) -> u64 {
        0
    }
    fn read_memory(&self, _address: u64, out: &mut [u8]) -> bool {
        out.fill(0x5a);
        true
    }
}

struct NullShadow(u8);

impl ShadowMemory for NullShadow {
    fn load(&mut self, _address: u64, out: &mut [u8]) {
        out.fill(self.0);
    }
    fn store(&mut self, _address: u64, _shadow: &[u8]) {}
}

/// The executable sections (`SHF_EXECINSTR`) of a 64-bit little-endian ELF file: (address,
/// bytes).
fn executable_sections(data: &[u8]) -> Vec<(u64, &[u8])> {
    let u16_at = |o: usize| u16::from_le_bytes([data[o], data[o + 1]]) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(data[o..o + 8].try_into().unwrap());
    if data.len() < 64 || &data[..4] != b"\x7fELF" || data[4] != 2 {
        return Vec::new();
    }
    let shoff = u64_at(0x28) as usize;
    let shentsize = u16_at(0x3a);
    let shnum = u16_at(0x3c);
    let mut out = Vec::new();
    for i in 0..shnum {
        let h = shoff + i * shentsize;
        if h + 64 > data.len() {
            break;
        }
        let sh_type = u32::from_le_bytes(data[h + 4..h + 8].try_into().unwrap());
        let flags = u64_at(h + 8);
        let (addr, offset, size) = (
            u64_at(h + 16),
            u64_at(h + 24) as usize,
            u64_at(h + 32) as usize,
        );
        if sh_type == 1 && flags & 4 != 0 && offset + size <= data.len() {
            out.push((addr, &data[offset..offset + size]));
        }
    }
    out
}

fn main() {
    let mut interp = Interpreter::new();
    for path in std::env::args().skip(1) {
        let data = match std::fs::read(&path) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("{path}: {e}");
                continue;
            }
        };
        let (mut specific, mut pessimistic, mut invalid) = (0u64, 0u64, 0u64);
        let mut by_mnemonic: HashMap<Mnemonic, u64> = HashMap::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut step_time = std::time::Duration::ZERO;
        for (addr, bytes) in executable_sections(&data) {
            let mut decoder = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
            while decoder.can_decode() {
                let insn = decoder.decode();
                if insn.is_invalid() {
                    invalid += 1;
                    continue;
                }
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let guest = ZeroGuest(seed);
                let mut regs = ShadowRegisters::default();
                for (i, g) in regs.gpr.iter_mut().enumerate() {
                    *g = seed.rotate_left(i as u32 * 7) & seed.rotate_left(i as u32 * 3);
                }
                regs.gpr[4] = 0;
                let mut mem = NullShadow((seed >> 11) as u8);
                let started = std::time::Instant::now();
                let outcome = interp.step(&insn, &guest, &mut regs, &mut mem);
                step_time += started.elapsed();
                match outcome.rule {
                    Rule::Specific => specific += 1,
                    Rule::Pessimistic => {
                        pessimistic += 1;
                        *by_mnemonic.entry(insn.mnemonic()).or_default() += 1;
                    }
                }
            }
        }
        let total = specific + pessimistic;
        println!(
            "{path}: {total} instructions, {specific} specific ({:.2}%), {pessimistic} pessimistic ({:.2}%), {invalid} undecodable",
            100.0 * specific as f64 / total.max(1) as f64,
            100.0 * pessimistic as f64 / total.max(1) as f64
        );
        println!(
            "  {:.0} ns per step on average (random shadows; timing includes the clock read)",
            step_time.as_nanos() as f64 / total.max(1) as f64
        );
        let mut top: Vec<_> = by_mnemonic.into_iter().collect();
        top.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        let list: Vec<String> = top
            .iter()
            .take(15)
            .map(|(m, n)| format!("{m:?} {n}"))
            .collect();
        println!("  most frequent pessimistic: {}", list.join(", "));
    }
}
