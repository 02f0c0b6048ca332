//! Reporting: the preamble, the XML stream, and the path every error takes (its stack
//! resolved as Valgrind shows it, merged with earlier ones, suppressed or printed, counted)
//! into the error manager ([`crate::errors`]).
//!
//! Errors are rendered (stacks symbolized) under the state lock, and only for a new context.

use std::sync::atomic::Ordering;

use oxgrind_formats::frame::Frame;
use oxgrind_formats::memcheck_text::{Aux, ErrorBlock};
use oxgrind_formats::memcheck_xml::{self as xml, WhatQuirk};
use oxgrind_formats::suppressions::{GenFrame, GeneratedSupp, SuppFrame};
use oxgrind_tool::{Host, StackId};

use crate::errors::{ErrorKey, KeyKind, Output, Reporting, Shown};
use crate::freed::FreedQueue;
use crate::options::Options;
use crate::{Memcheck, State};

/// `Vg_FnNameBelowMain`: functions that call `main`, shown as `(below main)`.
fn is_below_main(name: &str) -> bool {
    name == "__libc_start_main"
        || name == "__libc_start_call_main"
        || name.starts_with("__libc_start_main.")
        || name == "generic_start_main"
        || name.starts_with("generic_start_main.")
        || name == "_start"
}

/// A stack resolved for printing, matching and `--gen-suppressions`.
/// How the runtime names its replacements of the program's string functions
/// (`replace.c`): the rest of the name is the function replaced.
const REPLACEMENT_PREFIX: &str = "oxgrind_replace_";

pub(crate) struct Resolved {
    pub(crate) shown: Vec<Frame>,
    pub(crate) supp: Vec<SuppFrame>,
    pub(crate) gen: Vec<GenFrame>,
}

impl Memcheck {
    /// The start-up banner as text (`==PID== Memcheck, a memory error detector` ...), empty
    /// with `-q` or `--xml=yes`.
    pub fn preamble_text(&self, host: &dyn Host) -> String {
        let mut out = String::new();
        if self.opts.core.verbosity > 0 && !self.opts.core.xml {
            out.push_str(&host.banner(
                "Memcheck, a memory error detector",
                "Copyright (C) 2002-2022, and GNU GPL'd, by Julian Seward et al.",
            ));
            // Valgrind's check of the two freed-queue options, in its words.
            let (vol, big) = (self.opts.freelist_vol, self.opts.freelist_big_blocks);
            if big >= vol {
                let pid = host.pid();
                out.push_str(&format!(
                    "=={pid}== Warning: --freelist-big-blocks value {big} has no effect\n\
                     =={pid}== as it is >= to --freelist-vol value {vol}\n"
                ));
            }
        }
        out
    }

    /// Call once, after `post_options` and before the program's `main`: writes the
    /// preamble to the log (text mode) or starts the XML document. If the runtime does not
    /// call it, the first event does (an atomic load per event).
    pub fn start(&self, host: &dyn Host) {
        crate::shadow::adopt(host);
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let t = self.preamble_text(host);
        if !t.is_empty() {
            host.log(&t);
        }
        if self.opts.core.xml {
            let mut st = self.lock();
            self.start_xml(&mut st, host);
            self.flush_xml(&mut st, host);
        }
    }

    #[inline]
    pub(crate) fn ensure_started(&self, host: &dyn Host) {
        if !self.started.load(Ordering::Relaxed) {
            self.start(host);
        }
    }

    pub(crate) fn start_xml(&self, st: &mut State, host: &dyn Host) {
        if st.xml_started {
            return;
        }
        st.xml_started = true;
        let quals = self
            .opts
            .core
            .xml_file
            .as_deref()
            .map(file_qualifiers)
            .unwrap_or_default();
        // `<vargv><exe>` is the launcher; inside the program only its environment can say
        // where it is (`OXGRIND_LAUNCHER`, set by the launcher), else its name.
        let launcher = std::env::var("OXGRIND_LAUNCHER").unwrap_or_else(|_| "oxgrind".to_string());
        let ppid = std::os::unix::process::parent_id() as i32;
        xml::header(
            &mut st.xml,
            &xml::Header {
                pid: host.pid(),
                ppid,
                command: host.command_line(),
                launcher: &launcher,
                tool_args: &self.opts.core.args,
                file_qualifiers: &quals,
                user_comment: self.opts.core.xml_user_comment.as_deref(),
            },
        );
        xml::status(&mut st.xml, "RUNNING", host.elapsed_ms());
    }

    /// Hands the XML produced so far to the runtime, which appends it to `--xml-file` or
    /// `--xml-fd` (streamed as Valgrind does: a crash still leaves every error seen so far).
    pub(crate) fn flush_xml(&self, st: &mut State, host: &dyn Host) {
        if !st.xml.is_empty() {
            host.xml(&st.xml);
            st.xml.clear();
        }
    }

    /// Sends what the error manager produced to the log and, in XML mode, to the XML output.
    pub(crate) fn emit(&self, st: &mut State, out: Output, host: &dyn Host) {
        if !out.text.is_empty() {
            host.log(&out.text);
        }
        if !out.xml.is_empty() {
            self.start_xml(st, host);
            st.xml.push_str(&out.xml);
            self.flush_xml(st, host);
        }
    }

    /// A block's allocation or free stack: frame 0 is our allocator, except for a custom
    /// allocator's blocks (client requests), whose frame 0 is the program's own code.
    pub(crate) fn resolve(&self, host: &dyn Host, id: StackId) -> Resolved {
        let custom = self.client_stacks.lock().contains(&id);
        self.resolve_stack(host, id, !custom)
    }

    /// `frame0_is_ours`: frame 0 is our replacement of an allocation or string function
    /// (printed as `malloc (in OBJ)`, as Valgrind prints its preload's); false for the stack
    /// of a fault, whose frame 0 is the program's own instruction.
    pub(crate) fn resolve_stack(
        &self,
        host: &dyn Host,
        id: StackId,
        frame0_is_ours: bool,
    ) -> Resolved {
        let mut r = Resolved {
            shown: Vec::new(),
            supp: Vec::new(),
            gen: Vec::new(),
        };
        let mut cut = false;
        for (depth, ip) in host
            .stack(id)
            .into_iter()
            .take(self.opts.core.num_callers)
            .enumerate()
        {
            let mut group = host.describe(ip);
            if group.is_empty() {
                group.push(Frame {
                    ip,
                    ..Default::default()
                });
            }
            // The runtime's replacement of a string function (`oxgrind_replace_strlen`),
            // which the program's access was made in: shown as the function it replaces.
            let replaced = group
                .last()
                .and_then(|f| f.function.as_deref())
                .and_then(|n| n.strip_prefix(REPLACEMENT_PREFIX))
                .map(str::to_string);
            if (depth == 0 && frame0_is_ours) || replaced.is_some() {
                // Frame 0 is always our replacement of the function the program called
                // (`malloc`, `free`, `strcpy`, ...). Valgrind's replacements live in a
                // preload library without line tables, so they print as `malloc (in OBJ)`;
                // ours print the same way whatever debug info the runtime carries.
                group.retain(|f| f.function.is_some() || f.object.is_some());
                if let Some(outer) = group.pop() {
                    group = vec![Frame {
                        file: None,
                        dir: None,
                        line: 0,
                        function: replaced.or(outer.function.clone()),
                        mangled: None,
                        ..outer
                    }];
                } else {
                    group.push(Frame {
                        ip,
                        ..Default::default()
                    });
                }
            }
            let mut reaches_main = false;
            for f in group {
                let sf = SuppFrame {
                    fun: f.mangled.clone().or_else(|| f.function.clone()),
                    obj: f.object.clone(),
                    file: f.file.clone(),
                    line: f.line,
                };
                r.supp.push(sf.clone());
                if cut {
                    continue;
                }
                let mut shown = f;
                if !self.opts.core.show_below_main {
                    if let Some(name) = shown.function.as_deref() {
                        if name == "main" {
                            reaches_main = true;
                        } else if is_below_main(name) {
                            reaches_main = true;
                            shown.function = Some("(below main)".into());
                        }
                    }
                }
                r.gen.push(GenFrame::from_frame(&sf));
                r.shown.push(shown);
            }
            if reaches_main {
                cut = true;
            }
        }
        r
    }

    /// Records one runtime-detected error on the calling thread.
    // The closures keep rendering lazy (only a new context is rendered); bundling them in a
    // struct would add a type for one caller.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn report(
        &self,
        host: &dyn Host,
        kind: KeyKind,
        stack: StackId,
        tid: i32,
        xml_kind: &'static str,
        what: &dyn Fn() -> String,
        quirk: WhatQuirk,
        aux: &dyn Fn(&FreedQueue) -> Vec<Aux>,
    ) {
        self.report_at(host, kind, stack, true, tid, xml_kind, what, quirk, aux)
    }

    /// [`Memcheck::report`] for a stack whose frame 0 is `frame0_is_ours` (our replacement
    /// function) or the program's own instruction (an invalid access).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn report_at(
        &self,
        host: &dyn Host,
        kind: KeyKind,
        stack: StackId,
        frame0_is_ours: bool,
        tid: i32,
        xml_kind: &'static str,
        what: &dyn Fn() -> String,
        quirk: WhatQuirk,
        aux: &dyn Fn(&FreedQueue) -> Vec<Aux>,
    ) {
        let ips: Vec<u64> = host
            .stack(stack)
            .into_iter()
            .take(self.opts.core.num_callers)
            .collect();
        let mut st = self.lock();
        self.absorb_all_freed(&mut st);
        st.errors.rep.pid = host.pid();
        let tid = thread_number(&mut st.threads, tid, host.pid());
        let mut out = Output::default();
        let State { errors, freed, .. } = &mut *st;
        let found_before = errors.errs_found;
        let class_kind = kind.clone();
        errors.record(&mut out, ErrorKey { kind, ips }, &mut || {
            // The address first: symbolising the stack may map views of object files,
            // which can land where the address lies (the hole a `munmap` just left).
            let aux = aux(freed);
            let r = self.resolve_stack(host, stack, frame0_is_ours);
            let class_name = class_kind.class().supp_kind_name();
            let extra = match &class_kind {
                KeyKind::FishyValue { function, argument } => {
                    Some(format!("{function}({argument})"))
                }
                KeyKind::Param { param } | KeyKind::ParamUnaddressable { param } => {
                    Some(param.to_string())
                }
                _ => None,
            };
            Shown {
                tid,
                xml_kind,
                block: ErrorBlock {
                    what: what(),
                    stack: r.shown,
                    aux,
                },
                what_newline_quirk: quirk,
                supp_frames: r.supp,
                generated: GeneratedSupp {
                    kind: format!("Memcheck:{class_name}"),
                    extra,
                    frames: r.gen,
                },
            }
        });
        let first_real_error = st.errors.errs_found > found_before;
        self.emit(&mut st, out, host);
        if self.opts.core.exit_on_first_error && first_real_error {
            let pid = host.pid();
            host.log(&format!(
                "=={pid}== \n=={pid}== Exit program on first error (--exit-on-first-error=yes)\n"
            ));
            host.exit_now(self.opts.core.error_exitcode);
        }
    }
}

/// Valgrind numbers threads 1, 2, ... (the main thread is 1); the runtime reports kernel
/// thread ids. The main thread's id is the pid; others are numbered as they first appear
/// in an error (Valgrind numbers them at creation, which the tool does not see).
impl Memcheck {
    /// The calling thread's OS id and its number in reports ("thread 1's stack").
    pub(crate) fn calling_thread(&self, host: &dyn Host) -> (i32, i32) {
        let tid = host.tid();
        let mut st = self.lock();
        (tid, thread_number(&mut st.threads, tid, host.pid()))
    }
}

pub(crate) fn thread_number(seen: &mut Vec<i32>, os_tid: i32, pid: i32) -> i32 {
    if os_tid == pid || os_tid == 1 {
        return 1;
    }
    match seen.iter().position(|&t| t == os_tid) {
        Some(i) => i as i32 + 2,
        None => {
            seen.push(os_tid);
            seen.len() as i32 + 1
        }
    }
}

/// `%q{VAR}` parts of a file-name template with their values (XML `<logfilequalifier>`).
fn file_qualifiers(template: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(i) = rest.find("%q{") {
        let after = &rest[i + 3..];
        let Some(end) = after.find('}') else { break };
        let var = &after[..end];
        out.push((var.to_string(), std::env::var(var).unwrap_or_default()));
        rest = &after[end + 1..];
    }
    out
}

pub(crate) fn reporting(opts: &Options, pid: i32) -> Reporting {
    Reporting {
        pid,
        verbosity: opts.core.verbosity,
        xml: opts.core.xml,
        error_limit: opts.core.error_limit,
        gen_suppressions: opts.core.gen_suppressions,
        show_error_list: opts.core.show_error_list,
        error_markers: opts.core.error_markers.clone(),
        track_origins: opts.track_origins,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(crate) fn threads_are_numbered_like_valgrind_main_first() {
        let mut seen = Vec::new();
        assert_eq!(thread_number(&mut seen, 4242, 4242), 1);
        assert_eq!(thread_number(&mut seen, 4250, 4242), 2);
        assert_eq!(thread_number(&mut seen, 4247, 4242), 3);
        assert_eq!(thread_number(&mut seen, 4250, 4242), 2);
        assert_eq!(thread_number(&mut seen, 1, 4242), 1);
    }

    #[test]
    pub(crate) fn below_main_names_are_valgrinds() {
        assert!(is_below_main("__libc_start_call_main"));
        assert!(is_below_main("__libc_start_main.constprop.0"));
        assert!(!is_below_main("main"));
        assert!(!is_below_main("start_thread"));
    }
}
