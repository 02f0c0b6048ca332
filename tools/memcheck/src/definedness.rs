//! Memcheck's uninitialised-value errors (`--undef-value-errors=yes`): the engine tracks
//! V bits (`Needs::definedness`) and calls [`Memcheck::undefined_event`] where Memcheck
//! checks a value; here the heap's V bits are set as Memcheck's allocator sets them
//! (malloc'd undefined, calloc'd defined, realloc copies), and the errors are reported in
//! Valgrind's words, kinds and suppression classes (`Cond`, `Value8`, `Param`).

use oxgrind_formats::memcheck_xml::WhatQuirk;
use oxgrind_tool::instrument::GuestRegs;
use oxgrind_tool::{Alloc, AllocFn, Free, Host, Undefined};

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
            _ => host.set_definedness(ev.addr, ev.size, false),
        }
    }

    /// `realloc`: the kept bytes keep their V bits (moved with the block), the new tail is
    /// undefined.
    pub(crate) fn definedness_realloc(&self, host: &dyn Host, old: &Free, new: &Alloc) {
        if !self.opts.undef_value_errors {
            return;
        }
        let kept = old.size.min(new.size);
        if old.addr != new.addr {
            host.copy_definedness(old.addr, new.addr, kept);
        }
        host.set_definedness(new.addr + kept, new.size - kept, false);
    }

    /// `VALGRIND_MAKE_MEM_DEFINED` / `_UNDEFINED` / `_DEFINED_IF_ADDRESSABLE`.
    pub(crate) fn definedness_client(&self, host: &dyn Host, addr: u64, len: u64, defined: bool) {
        if self.opts.undef_value_errors {
            host.set_definedness(addr, len, defined);
        }
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
        self.report_at(
            host,
            kind,
            stack,
            false,
            tid,
            xml_kind,
            &|| text.clone(),
            WhatQuirk::None,
            &|freed| match addr {
                Some(a) => self.describe_addr(host, freed, a, thread),
                None => Vec::new(),
            },
        );
    }
}
