//! System-call parameters: before each of the program's system calls
//! ([`oxgrind_tool::Tool::before_syscall`]), the memory its pointer arguments name
//! ([`oxgrind_tool::syscalls`], shared with the definedness engine) is checked for
//! addressability and, for the memory the kernel reads with definedness on, definedness;
//! the first bad byte of each range decides its one error, as Memcheck's
//! `is_mem_defined` does: "Syscall param write(buf) points to unaddressable byte(s)" or
//! "... points to uninitialised byte(s)", the stack of the `syscall` instruction, and what
//! the address is.
//!
//! Only the shadow is consulted for the check; the program's memory is read (through
//! `Host::read_memory`, which never faults) only where the description lives in it (an
//! `iovec` array, a string's NUL). Buffers the kernel fills keep their addressability as it
//! is (the kernel makes no block addressable).

use std::sync::atomic::Ordering;

use oxgrind_formats::memcheck_xml::WhatQuirk;
use oxgrind_tool::instrument::GuestRegs;
use oxgrind_tool::sync::SpinLock;
use oxgrind_tool::syscalls::{self, Range};
use oxgrind_tool::Host;

use crate::errors::KeyKind;
use crate::shadow;
use crate::Memcheck;

/// Names with a variable part (`sendmsg(msg.msg_iov[3])`) made `'static` once each, since
/// error contexts keep `&'static str` names. Bounded: a few dozen heads times at most 1024
/// indexes or a few fields.
static NAMES: SpinLock<Vec<&'static str>> = SpinLock::new(Vec::new());

fn static_name(r: &Range) -> &'static str {
    if let Some(s) = r.name.as_static() {
        return s;
    }
    let text = r.name.to_string();
    let mut names = NAMES.lock();
    if let Some(s) = names.iter().find(|s| **s == text) {
        return s;
    }
    let s: &'static str = Box::leak(text.into_boxed_str());
    names.push(s);
    s
}

/// What is wrong with the first bad byte of a range.
enum Bad {
    Unaddressable,
    Uninitialised,
}

impl Memcheck {
    /// `Tool::before_syscall`: checks each range of system call `nr`.
    pub(crate) fn syscall_event(
        &self,
        host: &dyn Host,
        nr: u64,
        args: &[u64; 6],
        regs: &GuestRegs,
    ) {
        if syscalls::lookup(nr).is_none() || !self.probing.load(Ordering::Relaxed) {
            return;
        }
        let base = shadow::base_if_ready();
        if base == 0 {
            return;
        }
        // Memcheck's rule, one error per range: its first bad byte decides whether it is
        // unaddressable or (memory the kernel reads, with definedness on) uninitialised.
        let definedness = self.opts.undef_value_errors;
        let mut bad: Vec<(&'static str, u64, Bad)> = Vec::new();
        syscalls::for_each_range(
            nr,
            args,
            &mut |addr, buf| host.read_memory(addr, buf),
            &mut |r| {
                let unaddressable = shadow::first_unaddressable(base, r.addr, r.len);
                let undefined = match (definedness, r.dir) {
                    (true, syscalls::Dir::Read) => host.first_undefined(r.addr, r.len),
                    _ => None,
                };
                match (unaddressable, undefined) {
                    (Some(a), u) if u.map_or(true, |u| a <= u) => {
                        bad.push((static_name(r), a, Bad::Unaddressable))
                    }
                    (_, Some(u)) => bad.push((static_name(r), u, Bad::Uninitialised)),
                    _ => {}
                }
            },
        );
        if bad.is_empty() {
            return;
        }
        self.ensure_started(host);
        let (tid, thread) = self.calling_thread(host);
        // Valgrind's stack of a syscall error starts after the `syscall` instruction (the
        // guest pc has moved past it when its wrapper runs): a line or an inlined frame
        // apart from the instruction itself.
        let after = GuestRegs {
            rip: regs.rip + 2,
            ..*regs
        };
        let stack = host.stack_at(&after, self.opts.core.num_callers);
        for (param, addr, what) in bad {
            let (kind, text) = match what {
                Bad::Unaddressable => (KeyKind::ParamUnaddressable { param }, "unaddressable"),
                Bad::Uninitialised => (KeyKind::Param { param }, "uninitialised"),
            };
            self.report_at(
                host,
                kind,
                stack,
                false,
                tid,
                "SyscallParam",
                &|| format!("Syscall param {param} points to {text} byte(s)"),
                WhatQuirk::None,
                &|freed| {
                    let mut aux = self.describe_addr(host, freed, addr, thread);
                    if let (Bad::Uninitialised, true) = (&what, self.opts.track_origins) {
                        if let Some(o) = host.origin_of_memory(addr) {
                            aux.extend(self.origin_aux(host, o));
                        }
                    }
                    aux
                },
            );
        }
    }
}
