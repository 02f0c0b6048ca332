//! Decoded instructions as tools see them: iced-x86's `Instruction` turned into the
//! contract's decoder-free `Insn` (memory operands with size, kind and addressing class;
//! control flow; whether `rsp` is written). Tools never depend on the decoder, so its
//! version, and the choice of decoder, stay the engine's business.

use iced_x86::{
    FlowControl, Instruction, InstructionInfoFactory, InstructionInfoOptions, Mnemonic, OpAccess,
    OpKind, Register, UsedMemory,
};
use oxgrind_tool::instrument::{
    AccessKind, Addressing, Cond, Flow, Insn, MemOp, RepString, SpChange,
};

/// Describes `ins`; `factory` is the translator's (it keeps its buffers between calls).
pub(crate) fn describe(ins: &Instruction, factory: &mut InstructionInfoFactory) -> Insn {
    let flow = match ins.flow_control() {
        FlowControl::Next => Flow::Next,
        FlowControl::UnconditionalBranch => Flow::Jump,
        FlowControl::IndirectBranch => Flow::IndirectJump,
        FlowControl::ConditionalBranch => Flow::CondJump,
        FlowControl::Return => Flow::Return,
        FlowControl::Call => Flow::Call,
        FlowControl::IndirectCall => Flow::IndirectCall,
        _ => Flow::Exception,
    };
    let mut out = Insn::new(ins.ip(), ins.len() as u8, flow);
    if matches!(flow, Flow::Jump | Flow::CondJump | Flow::Call) {
        out.target = Some(ins.near_branch_target());
    }
    if ins.is_string_instruction() && (ins.has_rep_prefix() || ins.has_repne_prefix()) {
        let m = ins.mnemonic();
        let cmps = matches!(
            m,
            Mnemonic::Cmpsb | Mnemonic::Cmpsw | Mnemonic::Cmpsd | Mnemonic::Cmpsq
        );
        let scan = matches!(
            m,
            Mnemonic::Scasb | Mnemonic::Scasw | Mnemonic::Scasd | Mnemonic::Scasq
        );
        out.rep = Some(RepString {
            compare: cmps || scan,
            scan,
            repne: ins.has_repne_prefix(),
            elem: ins.memory_size().size() as u8,
        });
    }
    if flow == Flow::CondJump {
        out.cond = cond(ins);
    }
    if matches!(flow, Flow::IndirectJump | Flow::IndirectCall) && ins.op0_kind() == OpKind::Register
    {
        out.indirect_reg = gpr_index(ins.op0_register());
    }
    let has_mem = (0..ins.op_count()).any(|i| ins.op_kind(i) == OpKind::Memory);
    out.locked = (ins.has_lock_prefix() || (ins.mnemonic() == Mnemonic::Xchg && has_mem))
        && !matches!(
            ins.mnemonic(),
            Mnemonic::Cmpxchg | Mnemonic::Cmpxchg8b | Mnemonic::Cmpxchg16b
        );
    // The registers an instruction uses are about half of iced's work, and are wanted
    // here only to see `rsp` written: asked for only when it may be (describing every
    // instruction for the tool was ~4% of a short program's start-up under DHAT).
    let info = if may_write_sp(ins) {
        factory.info(ins)
    } else {
        factory.info_options(ins, InstructionInfoOptions::NO_REGISTER_USAGE)
    };
    let writes_sp = info.used_registers().iter().any(|u| {
        matches!(u.register(), Register::RSP | Register::ESP | Register::SP)
            && matches!(
                u.access(),
                OpAccess::Write
                    | OpAccess::ReadWrite
                    | OpAccess::CondWrite
                    | OpAccess::ReadCondWrite
            )
    });
    if writes_sp {
        out.sp = sp_change(ins);
    }
    if accesses_no_memory(ins) {
        return out;
    }
    // Reads before writes, as the CPU does them.
    for pass in 0..2 {
        for m in info.used_memory() {
            let Some((kind, conditional)) = kind_of(m.access()) else {
                continue;
            };
            if (pass == 1) != (kind == AccessKind::Write) {
                continue;
            }
            let size = if out.rep_string() {
                ins.memory_size().size() // one element per iteration
            } else {
                m.memory_size().size()
            };
            if size == 0 {
                continue;
            }
            let op = out.mem().len();
            out = out.with_mem(MemOp {
                size: size as u32,
                kind,
                conditional: conditional || out.rep_string(),
                addressing: addressing(m),
            });
            if let Some(disp) = sp_offset(m) {
                out = out.with_sp_offset(op, disp);
            }
        }
    }
    out
}

/// The condition of conditional jump `ins`.
fn cond(ins: &Instruction) -> Option<Cond> {
    use iced_x86::ConditionCode as C;
    Some(match ins.mnemonic() {
        Mnemonic::Loop => Cond::Loop,
        Mnemonic::Loope => Cond::Loope,
        Mnemonic::Loopne => Cond::Loopne,
        Mnemonic::Jrcxz => Cond::Jrcxz,
        Mnemonic::Jecxz => Cond::Jecxz,
        _ => match ins.condition_code() {
            C::o => Cond::O,
            C::no => Cond::No,
            C::b => Cond::B,
            C::ae => Cond::Ae,
            C::e => Cond::E,
            C::ne => Cond::Ne,
            C::be => Cond::Be,
            C::a => Cond::A,
            C::s => Cond::S,
            C::ns => Cond::Ns,
            C::p => Cond::P,
            C::np => Cond::Np,
            C::l => Cond::L,
            C::ge => Cond::Ge,
            C::le => Cond::Le,
            C::g => Cond::G,
            C::None => return None,
        },
    })
}

/// The index in `GuestRegs::gpr` of a 64-bit general register.
fn gpr_index(r: Register) -> Option<u8> {
    r.is_gpr64().then(|| r.number() as u8)
}

/// What `ins`, which writes `rsp`, does to it.
fn sp_change(ins: &Instruction) -> SpChange {
    let explicit = ins.op_count() > 0
        && ins.op0_kind() == OpKind::Register
        && ins.op0_register() == Register::RSP;
    if explicit {
        let imm = ins.op_count() == 2
            && matches!(
                ins.op1_kind(),
                OpKind::Immediate8to64
                    | OpKind::Immediate32to64
                    | OpKind::Immediate8
                    | OpKind::Immediate32
            );
        return match ins.mnemonic() {
            Mnemonic::Sub if imm => {
                SpChange::Delta((ins.immediate(1) as i64).wrapping_neg() as i32)
            }
            Mnemonic::Add if imm => SpChange::Delta(ins.immediate(1) as i64 as i32),
            _ => SpChange::Unknown,
        };
    }
    if ins.mnemonic() == Mnemonic::Leave {
        return SpChange::Leave;
    }
    match ins.stack_pointer_increment() {
        0 => SpChange::Unknown,
        d => SpChange::Delta(d),
    }
}

fn kind_of(a: OpAccess) -> Option<(AccessKind, bool)> {
    Some(match a {
        OpAccess::Read => (AccessKind::Read, false),
        OpAccess::CondRead => (AccessKind::Read, true),
        OpAccess::Write => (AccessKind::Write, false),
        OpAccess::CondWrite => (AccessKind::Write, true),
        OpAccess::ReadWrite => (AccessKind::Modify, false),
        OpAccess::ReadCondWrite => (AccessKind::Modify, true),
        _ => return None,
    })
}

/// What an operand's address can point at, from how it is formed.
pub(crate) fn addressing(m: &UsedMemory) -> Addressing {
    if matches!(m.segment(), Register::FS | Register::GS) {
        return Addressing::ThreadLocal;
    }
    if m.vsib_size() != 0 || m.index().is_vector_register() {
        return Addressing::Vector;
    }
    let base = m.base();
    if matches!(base, Register::RIP | Register::EIP)
        || (base == Register::None && m.index() == Register::None)
    {
        return Addressing::Static;
    }
    if matches!(base, Register::RSP | Register::ESP) {
        return Addressing::Stack;
    }
    // Anything else, string operands (`[rsi]`, `[rdi]`) included.
    Addressing::General
}

/// `Some(d)` for a `[rsp + d]` operand (no index, no segment override): where it lies
/// relative to the stack pointer (see `Insn::sp_offset`).
fn sp_offset(m: &UsedMemory) -> Option<i32> {
    let plain = matches!(m.segment(), Register::SS | Register::DS | Register::None);
    if !plain || m.base() != Register::RSP || m.index() != Register::None || m.vsib_size() != 0 {
        return None;
    }
    i32::try_from(m.displacement() as i64).ok()
}

/// Instructions whose memory operand is not accessed: `lea`, multi-byte `nop`, prefetches
/// and cache-line flushes (Valgrind's IR has no load or store for them either).
/// Whether `ins` may write `rsp` (a superset of iced's register usage saying so, which
/// `may_write_sp_covers_every_stack_pointer_write` checks on real code): it moves the stack
/// (`push`, `pop`, `call`, `ret`, `enter`, `leave`, `pushf`...), leaves the straight line,
/// or names `rsp`, `esp`, `sp` or `spl` as a register operand.
fn may_write_sp(ins: &Instruction) -> bool {
    ins.stack_pointer_increment() != 0
        || !matches!(ins.flow_control(), FlowControl::Next)
        || matches!(ins.mnemonic(), Mnemonic::Enter | Mnemonic::Leave)
        || (0..ins.op_count()).any(|i| {
            ins.op_kind(i) == OpKind::Register
                && ins.op_register(i).full_register() == Register::RSP
        })
}

fn accesses_no_memory(ins: &Instruction) -> bool {
    matches!(
        ins.mnemonic(),
        Mnemonic::Lea
            | Mnemonic::Nop
            | Mnemonic::Prefetch
            | Mnemonic::Prefetchw
            | Mnemonic::Prefetchwt1
            | Mnemonic::Prefetchnta
            | Mnemonic::Prefetcht0
            | Mnemonic::Prefetcht1
            | Mnemonic::Prefetcht2
            | Mnemonic::Clflush
            | Mnemonic::Clflushopt
            | Mnemonic::Clwb
            | Mnemonic::Clzero
    )
}

/// Valgrind's client-request preamble on amd64 (`valgrind.h`): `rol rdi` by 3, 13, 61 and
/// 51 (a no-op overall), then `xchg rbx, rbx`. True when `block[i]` is that `xchg`,
/// preceded in the same block by the four rotations.
pub(crate) fn is_client_request(block: &[Instruction], i: usize) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    fn one(bytes: &[u8]) -> Insn {
        let ins = Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE).decode();
        describe(&ins, &mut InstructionInfoFactory::new())
    }

    /// Every instruction iced finds writing `rsp` in libc, the dynamic loader and python3
    /// (decoded from every byte offset of their files' first MiBs: code, data and
    /// misaligned garbage alike) is one `may_write_sp` admits.
    #[test]
    fn may_write_sp_covers_every_stack_pointer_write() {
        let mut factory = InstructionInfoFactory::new();
        let mut checked = 0u64;
        let mut writers = 0u64;
        for path in [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib64/ld-linux-x86-64.so.2",
            "/usr/bin/python3",
        ] {
            let Ok(bytes) = std::fs::read(path) else {
                continue;
            };
            let bytes = &bytes[..bytes.len().min(1 << 20)];
            for start in 0..bytes.len().min(1 << 20) {
                let end = (start + 15).min(bytes.len());
                let ins =
                    Decoder::with_ip(64, &bytes[start..end], 0x1000, DecoderOptions::NONE).decode();
                if ins.is_invalid() {
                    continue;
                }
                checked += 1;
                let writes = factory.info(&ins).used_registers().iter().any(|u| {
                    u.register().full_register() == Register::RSP
                        && matches!(
                            u.access(),
                            OpAccess::Write
                                | OpAccess::ReadWrite
                                | OpAccess::CondWrite
                                | OpAccess::ReadCondWrite
                        )
                });
                if writes {
                    writers += 1;
                    assert!(may_write_sp(&ins), "{:?} at {path}+{start:#x}", ins.code());
                }
            }
        }
        assert!(checked == 0 || writers > 1000, "{checked} {writers}");
    }

    #[test]
    fn operands_are_classified_by_how_their_address_is_formed() {
        // mov rax, [rbx+8]
        let m = one(&[0x48, 0x8B, 0x43, 0x08]);
        assert_eq!(m.mem().len(), 1);
        assert_eq!(m.mem()[0].addressing, Addressing::General);
        assert_eq!(m.mem()[0].kind, AccessKind::Read);
        assert_eq!(m.mem()[0].size, 8);
        assert!(m.may_touch_heap());
        // mov [rsp+8], rax
        let s = one(&[0x48, 0x89, 0x44, 0x24, 0x08]);
        assert_eq!(s.mem()[0].addressing, Addressing::Stack);
        assert!(!s.may_touch_heap());
        // mov rax, [rip+0x10]
        let g = one(&[0x48, 0x8B, 0x05, 0x10, 0, 0, 0]);
        assert_eq!(g.mem()[0].addressing, Addressing::Static);
        // mov rax, fs:[0x28]
        let t = one(&[0x64, 0x48, 0x8B, 0x04, 0x25, 0x28, 0, 0, 0]);
        assert_eq!(t.mem()[0].addressing, Addressing::ThreadLocal);
        // lea rax, [rbx+8]: no access
        assert!(one(&[0x48, 0x8D, 0x43, 0x08]).mem().is_empty());
        // add [rbx], eax: one modify
        let a = one(&[0x01, 0x03]);
        assert_eq!(a.mem()[0].kind, AccessKind::Modify);
    }

    #[test]
    fn stack_writers_and_control_flow_are_described() {
        // push [rbx]: a general read, then a stack write; rsp written
        let p = one(&[0xFF, 0x33]);
        assert_eq!(p.sp, SpChange::Delta(-8));
        assert_eq!(p.mem().len(), 2);
        assert_eq!(p.mem()[0].kind, AccessKind::Read);
        assert_eq!(p.mem()[1].addressing, Addressing::Stack);
        // ret
        let r = one(&[0xC3]);
        assert_eq!(r.flow, Flow::Return);
        assert_eq!(r.sp, SpChange::Delta(8));
        // sub rsp, 0x48; leave; and rsp, -16; mov rax, [rbx]
        assert_eq!(one(&[0x48, 0x83, 0xEC, 0x48]).sp, SpChange::Delta(-0x48));
        assert_eq!(one(&[0xC9]).sp, SpChange::Leave);
        assert_eq!(one(&[0x48, 0x83, 0xE4, 0xF0]).sp, SpChange::Unknown);
        assert_eq!(one(&[0x48, 0x8B, 0x03]).sp, SpChange::None);
        // jne +5
        let j = one(&[0x75, 0x05]);
        assert_eq!(j.flow, Flow::CondJump);
        assert_eq!(j.target, Some(0x1007));
        // rep movsb: one byte per iteration, each way
        let m = one(&[0xF3, 0xA4]);
        assert!(matches!(m.rep, Some(RepString { compare: false, .. })));
        assert_eq!(m.mem().len(), 2);
        assert!(m
            .mem()
            .iter()
            .all(|o| o.size == 1 && o.addressing == Addressing::General));
    }

    #[test]
    fn stack_pointer_offsets_are_known_for_plain_rsp_operands() {
        // mov rax, [rsp - 0x100]
        let below = one(&[0x48, 0x8b, 0x84, 0x24, 0x00, 0xff, 0xff, 0xff]);
        assert_eq!(below.sp_offset(0), Some(-256));
        // mov dword [rsp + 8], 1
        let above = one(&[0xc7, 0x44, 0x24, 0x08, 0x01, 0x00, 0x00, 0x00]);
        assert_eq!(above.sp_offset(0), Some(8));
        // mov rax, [rsp + rcx*8 - 0x100]: an index, not known
        let indexed = one(&[0x48, 0x8b, 0x84, 0xcc, 0x00, 0xff, 0xff, 0xff]);
        assert_eq!(indexed.sp_offset(0), None);
        // mov rax, [rbp - 0x100]
        let rbp = one(&[0x48, 0x8b, 0x85, 0x00, 0xff, 0xff, 0xff]);
        assert_eq!(rbp.sp_offset(0), None);
        // push rax: implicit, never below the red zone
        let push = one(&[0x50]);
        assert!(push.sp_offset(0).map_or(true, |d| d >= -128));
    }

    #[test]
    fn branches_and_locked_rmw_are_described_as_valgrind_counts_them() {
        assert_eq!(one(&[0x74, 0x05]).cond, Some(Cond::E));
        assert_eq!(one(&[0xe2, 0xfe]).cond, Some(Cond::Loop));
        assert_eq!(one(&[0xff, 0xe0]).indirect_reg, Some(0), "jmp rax");
        assert_eq!(one(&[0x41, 0xff, 0xd3]).indirect_reg, Some(11), "call r11");
        let via_mem = one(&[0xff, 0x25, 0, 0, 0, 0]);
        assert_eq!(
            (via_mem.flow, via_mem.indirect_reg),
            (Flow::IndirectJump, None)
        );
        assert_eq!(
            one(&[0xf2, 0xae]).rep,
            Some(RepString {
                compare: true,
                scan: true,
                repne: true,
                elem: 1
            })
        );
        assert!(one(&[0xf0, 0x48, 0x01, 0x07]).locked, "lock add [rdi], rax");
        assert!(one(&[0x48, 0x87, 0x07]).locked, "xchg [rdi], rax");
        assert!(!one(&[0xf0, 0x48, 0x0f, 0xb1, 0x0f]).locked, "lock cmpxchg");
        assert!(!one(&[0x48, 0x01, 0x07]).locked, "add [rdi], rax");
    }

    fn heap(bytes: &[u8]) -> bool {
        one(bytes).may_touch_heap()
    }

    #[test]
    fn heap_candidates_are_probed() {
        assert!(heap(&[0x48, 0x8b, 0x07]), "mov rax, [rdi]");
        assert!(heap(&[0x89, 0x45, 0xfc]), "mov [rbp-4], eax");
        assert!(heap(&[0x48, 0x01, 0x06]), "add [rsi], rax");
        assert!(heap(&[0xf3, 0xa4]), "rep movsb");
        assert!(heap(&[0xaa]), "stosb");
        assert!(heap(&[0xff, 0x50, 0x08]), "call [rax+8]");
        assert!(heap(&[0xff, 0x33]), "push [rbx]");
        assert!(
            heap(&[0xc5, 0xfe, 0x6f, 0x04, 0x0e]),
            "vmovdqu ymm0, [rsi+rcx]"
        );
    }

    #[test]
    fn stack_globals_tls_and_non_accesses_are_not_heap_candidates() {
        assert!(!heap(&[0x48, 0x8b, 0x04, 0x24]), "mov rax, [rsp]");
        assert!(!heap(&[0x89, 0x44, 0x24, 0x08]), "mov [rsp+8], eax");
        assert!(!heap(&[0x50]), "push rax");
        assert!(!heap(&[0xc3]), "ret");
        assert!(!heap(&[0xe8, 0, 0, 0, 0]), "call rel32");
        assert!(
            !heap(&[0x48, 0x8b, 0x05, 0x10, 0, 0, 0]),
            "mov rax, [rip+0x10]"
        );
        assert!(
            !heap(&[0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0]),
            "mov rax, fs:[0x28]"
        );
        assert!(!heap(&[0x48, 0x8d, 0x04, 0x07]), "lea rax, [rdi+rax]");
        assert!(!heap(&[0x0f, 0x1f, 0x44, 0, 0]), "nop dword [rax+rax]");
        assert!(!heap(&[0x0f, 0x18, 0x0f]), "prefetcht0 [rdi]");
        assert!(!heap(&[0x48, 0x89, 0xc7]), "mov rdi, rax");
    }

    #[test]
    fn client_request_preamble_is_recognised_only_whole() {
        let decode = |bytes: &[u8]| {
            let mut d = Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE);
            let mut v = alloc::vec::Vec::new();
            while d.can_decode() {
                v.push(d.decode());
            }
            v
        };
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
}
