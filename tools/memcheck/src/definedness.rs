//! Memcheck's uninitialised-value errors (`--undef-value-errors=yes`): the engine tracks
//! V bits (`Needs::definedness`) and calls [`Memcheck::undefined_event`] where Memcheck
//! checks a value; here the heap's V bits are set as Memcheck's allocator sets them
//! (malloc'd undefined, calloc'd defined, realloc copies), and the errors are reported in
//! Valgrind's words, kinds and suppression classes (`Cond`, `Value8`, `Param`). With
//! `--track-origins=yes` the engine also keeps where undefined bits came from
//! (`Needs::origins`): the heap's blocks and client requests are marked with their stacks,
//! and each error ends with Memcheck's "Uninitialised value was created by ..." lines.

use oxgrind_formats::frame::Frame;
use oxgrind_formats::memcheck_text::Aux;
use oxgrind_formats::memcheck_xml::WhatQuirk;
use oxgrind_tool::instrument::GuestRegs;
use oxgrind_tool::{Addr, Alloc, AllocFn, Free, Host, Origin, Undefined};

use crate::errors::KeyKind;
use crate::Memcheck;

impl Memcheck {
    /// A new block's V bits: undefined, except `calloc`'s (zeroed). `realloc`'s are set in
    /// [`Memcheck::definedness_realloc`].
    pub(crate) fn definedness_alloc(&self, host: &dyn Host, ev: &Alloc) {
        if !self.opts.undef_value_errors {
            return;
        }
        match ev.func {
            AllocFn::Realloc | AllocFn::ReallocArray => {}
            AllocFn::Calloc => host.set_definedness(ev.addr, ev.size, true),
            _ => self.make_undefined(host, ev.addr, ev.size, Origin::Heap(ev.stack)),
        }
    }

    /// Marks memory undefined, with its origin when origins are tracked.
    pub(crate) fn make_undefined(&self, host: &dyn Host, addr: Addr, len: u64, origin: Origin) {
        if self.opts.track_origins {
            host.set_undefined_from(addr, len, origin);
        } else {
            host.set_definedness(addr, len, false);
        }
    }

    /// `realloc`: the kept bytes keep their V bits (moved with the block), the new tail is
    /// undefined; a moved block's old bytes are freed ([`Memcheck::definedness_free`]).
    pub(crate) fn definedness_realloc(&self, host: &dyn Host, old: &Free, new: &Alloc) {
        if !self.opts.undef_value_errors {
            return;
        }
        let kept = old.size.min(new.size);
        if old.addr != new.addr {
            host.copy_definedness(old.addr, new.addr, kept);
            // Both blocks are live chunks of glibc's here: they do not overlap.
            host.set_definedness(old.addr, old.size, true);
        }
        self.make_undefined(
            host,
            new.addr + kept,
            new.size - kept,
            Origin::Heap(new.stack),
        );
    }

    /// A freed block's V bits: defined. Reading freed memory is an invalid read, whose
    /// value Memcheck takes as defined (`get_vbits8` of unaddressable bytes), so that one
    /// error does not cascade. And it keeps every byte glibc's allocator manages defined:
    /// glibc runs natively in a heap event (`hooks::events_run_natively`), so its writes of
    /// its own bookkeeping into free chunks (tcache and bin links, the headers of split
    /// chunks) leave the V bits as they were; where its code runs translated (a thread's
    /// tcache emptied at its exit, `malloc_trim`, `mallinfo2`), it reads them back, and
    /// the V bits the program's values left there would be false "uninitialised" errors.
    /// A block is marked at its free, not when it leaves the freed-block queue: its V bits
    /// are never read as the program's again either way, and its shadow is still warm.
    pub(crate) fn definedness_free(&self, host: &dyn Host, addr: Addr, size: u64) {
        if self.opts.undef_value_errors {
            host.set_definedness(addr, size, true);
        }
    }

    /// `VALGRIND_MAKE_MEM_DEFINED` / `_UNDEFINED` / `_DEFINED_IF_ADDRESSABLE`.
    pub(crate) fn definedness_client(
        &self,
        host: &dyn Host,
        regs: &GuestRegs,
        addr: u64,
        len: u64,
        defined: bool,
    ) {
        if !self.opts.undef_value_errors {
            return;
        }
        if defined {
            host.set_definedness(addr, len, true);
        } else if self.opts.track_origins {
            // Valgrind's stack of the request starts after its `xchg rbx, rbx` (3 bytes).
            let after = GuestRegs {
                rip: regs.rip + 3,
                ..*regs
            };
            let stack = self.client_stack(host, &after);
            host.set_undefined_from(addr, len, Origin::ClientRequest(stack));
        } else {
            host.set_definedness(addr, len, false);
        }
    }

    /// Memcheck's origin lines: "Uninitialised value was created by ..." and the stack
    /// that made the value undefined.
    pub(crate) fn origin_aux(&self, host: &dyn Host, origin: Origin) -> [Aux; 2] {
        let (how, frames) = match origin {
            Origin::Heap(stack) => ("a heap allocation", self.resolve(host, stack).shown),
            Origin::ClientRequest(stack) => (
                "a client request",
                self.resolve_stack(host, stack, false).shown,
            ),
            // One frame: the function whose frame (or entry) made the stack.
            Origin::Stack { pc } => {
                let mut group = host.describe(pc);
                group.truncate(1);
                if group.is_empty() {
                    group.push(Frame {
                        ip: pc,
                        ..Default::default()
                    });
                }
                ("a stack allocation", group)
            }
        };
        [
            Aux::Text(format!("Uninitialised value was created by {how}")),
            Aux::Stack(frames),
        ]
    }

    /// The program is about to use undefined bits (`Tool::on_undefined`).
    pub(crate) fn undefined_event(&self, host: &dyn Host, regs: &GuestRegs, what: &Undefined) {
        if !self.opts.undef_value_errors {
            return;
        }
        self.ensure_started(host);
        let (kind, xml_kind, text) = match *what {
            Undefined::Condition => (
                KeyKind::Cond,
                "UninitCondition",
                "Conditional jump or move depends on uninitialised value(s)".to_string(),
            ),
            Undefined::Value { size } => (
                KeyKind::Value { size: size as u32 },
                "UninitValue",
                format!("Use of uninitialised value of size {size}"),
            ),
            Undefined::SyscallArg { param } => (
                KeyKind::Param { param },
                "SyscallParam",
                format!("Syscall param {param} contains uninitialised byte(s)"),
            ),
            Undefined::SyscallBuffer { param, .. } => (
                KeyKind::Param { param },
                "SyscallParam",
                format!("Syscall param {param} points to uninitialised byte(s)"),
            ),
        };
        let (tid, thread) = self.calling_thread(host);
        let stack = host.stack_at(regs, self.opts.core.num_callers);
        let addr = match *what {
            Undefined::SyscallBuffer { addr, .. } => Some(addr),
            _ => None,
        };
        let origin = if self.opts.track_origins {
            match addr {
                Some(a) => host.origin_of_memory(a),
                None => host.undefined_origin(),
            }
        } else {
            None
        };
        self.report_at(
            host,
            kind,
            stack,
            false,
            tid,
            xml_kind,
            &|| text.clone(),
            WhatQuirk::None,
            &|freed| {
                let mut aux = match addr {
                    Some(a) => self.describe_addr(host, freed, a, thread),
                    None => Vec::new(),
                };
                if let Some(o) = origin {
                    aux.extend(self.origin_aux(host, o));
                }
                aux
            },
        );
    }
}
