//! The fatal-signal block of the report ("Process terminating with default action of signal
//! N"), in text and XML, with the resource limits Valgrind's wording depends on.

use oxgrind_formats::memcheck_text as text;
use oxgrind_formats::memcheck_xml as xml;
use oxgrind_tool::{Exit, Host};

use crate::errors::Output;
use crate::report::thread_number;
use crate::{Memcheck, State};

impl Memcheck {
    /// Writes the fatal-signal block when the program is dying of a signal (nothing for
    /// other ends): to `out` in text mode, to the XML stream in XML mode.
    pub(crate) fn fatal_signal_block(
        &self,
        host: &dyn Host,
        st: &mut State,
        out: &mut Output,
        exit: Exit,
    ) {
        let pid = host.pid();
        // "Process terminating with default action of signal N", as Valgrind prints it.
        let fatal = match exit {
            Exit::Signal(_) => host.fatal_signal(),
            _ => None,
        };
        if let Some(f) = fatal {
            let frames = self.resolve_stack(host, f.stack, false).shown;
            if self.opts.core.xml {
                self.start_xml(st, host);
                let tid = thread_number(&mut st.threads, f.tid, pid);
                xml::fatal_signal(&mut st.xml, tid, f.sig, f.code, f.addr, &frames);
            } else if self.opts.core.verbosity > 0 || (could_core(f.sig) && f.code > 0) {
                // With -q Valgrind still prints it for a fault the kernel raised (a wild
                // pointer's SIGSEGV), not for a signal sent (abort(), kill).
                let limits = ProcessLimits::read();
                let core = could_core(f.sig) && limits.core > 0;
                text::fatal_signal(
                    &mut out.text,
                    pid,
                    f.sig,
                    f.code,
                    f.addr,
                    &frames,
                    core,
                    limits.main_stack,
                    f.stack_overflow,
                );
            }
        }
    }
}

/// Signals whose default action dumps core.
fn could_core(sig: i32) -> bool {
    matches!(sig, 3 | 4 | 5 | 6 | 7 | 8 | 11 | 24 | 25 | 31)
}

/// The resource limits the fatal-signal block mentions, from /proc/self/limits.
struct ProcessLimits {
    /// Soft limit on core files (0: no core is written).
    core: u64,
    /// The main thread's stack size as Valgrind states it: the soft stack limit, kept
    /// between 1 MiB and 16 MiB.
    main_stack: u64,
}

impl ProcessLimits {
    pub(crate) fn read() -> ProcessLimits {
        let text = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let soft = |name: &str| {
            text.lines().find(|l| l.starts_with(name)).and_then(|l| {
                let v = l[name.len()..].split_whitespace().next()?;
                Some(if v == "unlimited" {
                    u64::MAX
                } else {
                    v.parse().ok()?
                })
            })
        };
        ProcessLimits {
            core: soft("Max core file size").unwrap_or(0),
            main_stack: soft("Max stack size")
                .unwrap_or(8 << 20)
                .clamp(1 << 20, 16 << 20),
        }
    }
}
