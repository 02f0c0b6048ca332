//! The shadow state the interpreter reads and writes, and what it asks of its caller.
//!
//! Register shadows live in [`ShadowRegisters`], owned by the caller (the engine keeps one per
//! thread in its context page). Memory shadows and the machine's real values are reached
//! through two traits, so the engine can back them with its shadow map and its saved guest
//! context, and tests with a `HashMap` and a struct.

use crate::algebra::lanes::Vec512;

/// One V bit per flag the arithmetic flags (1 = undefined). `DF` is not shadowed: only
/// `cld`/`std`/`popf` write it, and programs never leave it undefined.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlagShadows(pub u8);

impl FlagShadows {
    pub const CF: u8 = 1 << 0;
    pub const PF: u8 = 1 << 1;
    pub const AF: u8 = 1 << 2;
    pub const ZF: u8 = 1 << 3;
    pub const SF: u8 = 1 << 4;
    pub const OF: u8 = 1 << 5;
    pub const ALL: u8 = 0x3f;
    /// Where each shadowed flag sits in RFLAGS, in the order of the bits above.
    pub const RFLAGS_BITS: [u32; 6] = [0, 2, 4, 6, 7, 11];

    pub const DEFINED: FlagShadows = FlagShadows(0);

    /// The bits above of the flags named in iced-x86's `RflagsBits` mask `iced` (an
    /// instruction's flags read, modified, set or cleared).
    pub fn bits_of_iced(iced: u32) -> u8 {
        use iced_x86::RflagsBits;
        const PAIRS: [(u32, u8); 6] = [
            (RflagsBits::CF, FlagShadows::CF),
            (RflagsBits::PF, FlagShadows::PF),
            (RflagsBits::AF, FlagShadows::AF),
            (RflagsBits::ZF, FlagShadows::ZF),
            (RflagsBits::SF, FlagShadows::SF),
            (RflagsBits::OF, FlagShadows::OF),
        ];
        PAIRS
            .iter()
            .filter(|(i, _)| iced & i != 0)
            .fold(0, |acc, (_, o)| acc | o)
    }

    /// Is any flag of `which` undefined?
    #[inline]
    pub const fn any(self, which: u8) -> bool {
        self.0 & which != 0
    }

    /// The flags spread to their RFLAGS positions (for `pushf`, `lahf`).
    pub fn to_rflags(self) -> u64 {
        let mut out = 0u64;
        for (i, bit) in Self::RFLAGS_BITS.iter().enumerate() {
            if self.0 & (1 << i) != 0 {
                out |= 1u64 << bit;
            }
        }
        out
    }

    /// The flags gathered from RFLAGS positions (for `popf`, `sahf`).
    pub fn from_rflags(shadow: u64) -> FlagShadows {
        let mut out = 0u8;
        for (i, bit) in Self::RFLAGS_BITS.iter().enumerate() {
            if shadow & (1u64 << bit) != 0 {
                out |= 1 << i;
            }
        }
        FlagShadows(out)
    }
}

/// The V bits of one thread's registers. All zero means all defined, which is what a thread
/// starts with (Memcheck treats the initial register state as defined).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShadowRegisters {
    /// `rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, r8..r15`, in encoding order.
    pub gpr: [u64; 16],
    pub flags: FlagShadows,
    /// `zmm0..zmm31`; the xmm and ymm registers are their low 16 and 32 bytes.
    pub vector: [Vec512; 32],
    /// `k0..k7`.
    pub opmask: [u64; 8],
    /// The x87 register stack in stack order: `x87[0]` is ST(0). Each holds the V bits of
    /// the register as a 64-bit double (VEX's representation).
    pub x87: [u64; 8],
    /// Whether the x87 condition bits C0..C3 are undefined (after a compare of undefined
    /// operands).
    pub x87_status: bool,
}

impl Default for ShadowRegisters {
    fn default() -> Self {
        ShadowRegisters {
            gpr: [0; 16],
            flags: FlagShadows::DEFINED,
            vector: [[0; 64]; 32],
            opmask: [0; 8],
            x87: [0; 8],
            x87_status: false,
        }
    }
}

/// Segment registers whose base may be nonzero in 64-bit mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segment {
    Fs,
    Gs,
}

/// The machine's real values before the instruction runs (the slow path is called before
/// the instruction executes).
pub trait Guest {
    /// A general register by encoding number (`rax` = 0 ... `r15` = 15).
    fn gpr(&self, index: usize) -> u64;
    /// RFLAGS.
    fn rflags(&self) -> u64;
    /// `zmm<index>` (the low 16 bytes are `xmm<index>`).
    fn vector(&self, index: usize) -> Vec512;
    /// `k<index>`.
    fn opmask(&self, index: usize) -> u64;
    fn segment_base(&self, segment: Segment) -> u64;
    /// Copies guest memory at `address` into `out`; false if it cannot be read (then the
    /// instruction will fault natively and its shadow effects do not matter).
    fn read_memory(&self, address: u64, out: &mut [u8]) -> bool;
}

/// V bits of guest memory, one shadow byte per byte (bit i of the shadow byte is the V bit
/// of bit i of the byte). What a load of unaddressable bytes yields (Memcheck's
/// partial-loads-ok makes them undefined) is the implementation's choice.
pub trait ShadowMemory {
    fn load(&mut self, address: u64, out: &mut [u8]);
    fn store(&mut self, address: u64, shadow: &[u8]);

    /// Copies `len` shadow bytes from `src` to `dst` as `rep movsb` copies bytes: ascending
    /// one at a time, so overlapping copies repeat a pattern as the hardware does.
    fn copy(&mut self, dst: u64, src: u64, len: u64) {
        let mut buf = [0u8; 256];
        let mut done = 0u64;
        let overlapping_forward = dst > src && dst.wrapping_sub(src) < len;
        let chunk = if overlapping_forward {
            dst.wrapping_sub(src).min(256)
        } else {
            256
        };
        while done < len {
            let n = (len - done).min(chunk) as usize;
            let n = n.max(1).min(buf.len());
            self.load(src.wrapping_add(done), &mut buf[..n]);
            self.store(dst.wrapping_add(done), &buf[..n]);
            done += n as u64;
        }
    }
}
