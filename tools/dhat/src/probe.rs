//! Which instructions DHAT probes, and how it reads a client request.
//!
//! Every probe is a clean call into the tool (a few hundred cycles), so DHAT asks for one
//! only before instructions that may touch a heap block: an explicit memory operand or a
//! string instruction's `rsi`/`rdi` operand. It leaves out what cannot be heap, as
//! Valgrind's DHAT leaves out accesses near the stack pointer (its `addMemEvent` guard):
//!
//! * operands based on `rsp` and the implicit stack accesses of `push`, `pop`, `call`,
//!   `ret`, `enter`, `leave` (the stack is not heap);
//! * `rip`-relative and absolute operands (globals, constants, the GOT);
//! * `fs`/`gs` operands (thread-local storage, the stack protector's canary);
//! * instructions with a memory operand that do not access it: `lea`, multi-byte `nop`,
//!   prefetches and cache-line flushes (Valgrind's IR has no load or store for them).
//!
//! `rbp`-based operands are kept: in code built without frame pointers `rbp` is an
//! ordinary register and may point into a block. That costs a probe per local-variable
//! access in `-O0` code; correctness first.
//!
//! The same functions must give the same answer for the same instructions, whenever the
//! engine translates a block again: they look at nothing else.

use oxgrind_tool::instrument::iced_x86::{Mnemonic, OpKind, Register};
use oxgrind_tool::instrument::{GuestRegs, Instruction};

pub use oxgrind_tool::instrument::may_touch_heap;

/// Valgrind's client-request preamble on amd64 (`valgrind.h`): `rol rdi` by 3, 13, 61
/// and 51 (a no-op overall), then `xchg rbx, rbx`, with `rax` pointing at the request's
/// six words. True when `block[i]` is that `xchg`, preceded by the four rotations.
pub fn is_client_request(block: &[Instruction], i: usize) -> bool {
    let ins = &block[i];
    if ins.mnemonic() != Mnemonic::Xchg
        || ins.op_count() != 2
        || ins.op_kind(0) != OpKind::Register
        || ins.op_kind(1) != OpKind::Register
        || ins.op0_register() != Register::RBX
        || ins.op1_register() != Register::RBX
        || i < 4
    {
        return false;
    }
    [3u8, 13, 61, 51].iter().enumerate().all(|(k, &n)| {
        let r = &block[i - 4 + k];
        r.mnemonic() == Mnemonic::Rol
            && r.op_count() == 2
            && r.op_kind(0) == OpKind::Register
            && r.op0_register() == Register::RDI
            && r.op_kind(1) == OpKind::Immediate8
            && r.immediate8() == n
    })
}

/// `VG_USERREQ__DHAT_AD_HOC_EVENT`: `VG_USERREQ_TOOL_BASE('D', 'H')`.
pub const AD_HOC_EVENT: u64 = ((b'D' as u64) << 24) | ((b'H' as u64) << 16);

/// The units of a `DHAT_AD_HOC_EVENT(n)` request at a client-request `xchg`, or `None`
/// for any other request (Valgrind's DHAT leaves those to other tools; so do we).
pub fn adhoc_units(regs: &GuestRegs) -> Option<u64> {
    let args = regs.gpr[0]; // rax
    if args == 0 || args % 8 != 0 {
        return None;
    }
    // SAFETY: at the preamble's `xchg`, `rax` holds the address of the request's argument
    // array, which `VALGRIND_DO_CLIENT_REQUEST` builds in the caller's frame just before
    // (readable, 8-aligned, checked non-null above); we run on that thread with it stopped.
    let (req, arg1) = unsafe {
        let p = args as *const u64;
        (
            core::ptr::read_volatile(p),
            core::ptr::read_volatile(p.add(1)),
        )
    };
    (req == AD_HOC_EVENT).then_some(arg1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxgrind_tool::instrument::iced_x86::{Decoder, DecoderOptions};

    fn decode(bytes: &[u8]) -> Vec<Instruction> {
        let mut d = Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE);
        let mut v = Vec::new();
        while d.can_decode() {
            v.push(d.decode());
        }
        v
    }

    fn one(bytes: &[u8]) -> bool {
        let v = decode(bytes);
        assert_eq!(v.len(), 1, "{bytes:x?}");
        may_touch_heap(&v[0])
    }

    #[test]
    fn heap_candidates_are_probed() {
        assert!(one(&[0x48, 0x8b, 0x07]), "mov rax, [rdi]");
        assert!(one(&[0x89, 0x45, 0xfc]), "mov [rbp-4], eax");
        assert!(one(&[0x48, 0x01, 0x06]), "add [rsi], rax");
        assert!(one(&[0xf3, 0xa4]), "rep movsb");
        assert!(one(&[0xaa]), "stosb");
        assert!(one(&[0xff, 0x50, 0x08]), "call [rax+8]");
        assert!(one(&[0xff, 0x33]), "push [rbx]");
        assert!(
            one(&[0xc5, 0xfe, 0x6f, 0x04, 0x0e]),
            "vmovdqu ymm0, [rsi+rcx]"
        );
    }

    #[test]
    fn stack_globals_tls_and_non_accesses_are_not() {
        assert!(!one(&[0x48, 0x8b, 0x04, 0x24]), "mov rax, [rsp]");
        assert!(!one(&[0x89, 0x44, 0x24, 0x08]), "mov [rsp+8], eax");
        assert!(!one(&[0x50]), "push rax");
        assert!(!one(&[0xc3]), "ret");
        assert!(!one(&[0xe8, 0, 0, 0, 0]), "call rel32");
        assert!(
            !one(&[0x48, 0x8b, 0x05, 0x10, 0, 0, 0]),
            "mov rax, [rip+0x10]"
        );
        assert!(
            !one(&[0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0]),
            "mov rax, fs:[0x28]"
        );
        assert!(!one(&[0x48, 0x8d, 0x04, 0x07]), "lea rax, [rdi+rax]");
        assert!(!one(&[0x0f, 0x1f, 0x44, 0, 0]), "nop dword [rax+rax]");
        assert!(!one(&[0x0f, 0x18, 0x0f]), "prefetcht0 [rdi]");
        assert!(!one(&[0x48, 0x89, 0xc7]), "mov rdi, rax");
    }

    #[test]
    fn client_request_preamble_is_recognised_only_whole() {
        let preamble = [
            0x48, 0xc1, 0xc7, 0x03, // rol rdi, 3
            0x48, 0xc1, 0xc7, 0x0d, // rol rdi, 13
            0x48, 0xc1, 0xc7, 0x3d, // rol rdi, 61
            0x48, 0xc1, 0xc7, 0x33, // rol rdi, 51
            0x48, 0x87, 0xdb, // xchg rbx, rbx
        ];
        let v = decode(&preamble);
        assert_eq!(v.len(), 5);
        assert!(is_client_request(&v, 4));
        assert!(!is_client_request(&v, 3));
        let mut broken = preamble;
        broken[7] = 0x0e;
        assert!(!is_client_request(&decode(&broken), 4));
        assert!(!is_client_request(&decode(&preamble[16..]), 0));
    }

    #[test]
    fn adhoc_request_is_read_from_the_argument_array() {
        let args: [u64; 6] = [AD_HOC_EVENT, 42, 0, 0, 0, 0];
        let mut regs = GuestRegs {
            gpr: [0; 16],
            rip: 0,
            rflags: 0,
        };
        regs.gpr[0] = args.as_ptr() as u64;
        assert_eq!(adhoc_units(&regs), Some(42));
        let other: [u64; 6] = [0x1001, 42, 0, 0, 0, 0];
        regs.gpr[0] = other.as_ptr() as u64;
        assert_eq!(adhoc_units(&regs), None);
        regs.gpr[0] = 0;
        assert_eq!(adhoc_units(&regs), None);
    }
}
