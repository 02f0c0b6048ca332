//! Memcheck's error manager (`coregrind/m_errormgr.c`): merging repeated errors into
//! contexts, suppressions, counting, the error limit, and the end-of-run listings.
//!
//! An error is first compared with the known contexts by kind and the first 4 frames of its
//! stack (2 once 100 contexts were shown), using raw addresses only, so a repeated error
//! costs no symbolication. Only a new context is rendered ([`Shown`]), matched against the
//! suppressions and printed. Leak records do not merge; they go through
//! [`ErrorManager::leak`] (Valgrind's `unique_error`). Counters and list orders follow
//! Valgrind, including its move-to-front lists, because `-s`, `<errorcounts>` and
//! `<suppcounts>` print in that order.

use oxgrind_formats::memcheck_text::{self as text, Amount, ErrorBlock};
use oxgrind_formats::memcheck_xml::{self as xml, WhatQuirk};
use oxgrind_formats::suppressions::{ErrorClass, GeneratedSupp, LeakKind, SuppFrame, Suppression};

use crate::options::GenSupp;

/// What identifies an error context besides its stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyKind {
    InvalidFree,
    MismatchedFree,
    FishyValue {
        function: &'static str,
        argument: &'static str,
    },
    Overlap {
        function: &'static str,
    },
    BadAlign,
    /// Invalid read or write of `size` bytes. As in Memcheck's `eq_Error`, only the size
    /// tells two of them apart: a read and a write of the same size at the same place are
    /// one context (the first one seen is what is printed).
    Addr {
        size: u32,
    },
    /// A client check request (`VALGRIND_CHECK_MEM_IS_ADDRESSABLE` / `_IS_DEFINED`) found an
    /// unaddressable byte (`addr_err`) or an undefined one: two contexts, as Memcheck's
    /// `isAddrErr` makes them, of one suppression kind.
    User {
        addr_err: bool,
    },
    /// Conditional jump or move depends on uninitialised value(s).
    Cond,
    /// Use of uninitialised value of size `size`.
    Value {
        size: u32,
    },
    /// Syscall param `param` contains/points to uninitialised byte(s).
    Param {
        param: &'static str,
    },
    /// Syscall param `param` points to unaddressable byte(s): another context than an
    /// uninitialised one of the same name (Memcheck's `isAddrErr`), the same suppression
    /// kind (`Param`).
    ParamUnaddressable {
        param: &'static str,
    },
    /// Illegal memory pool address (a mempool request naming no pool).
    IllegalMempool,
}

impl KeyKind {
    /// Memcheck's `eq_Error` on the kind part: FishyValue also compares function and
    /// argument; Overlap does not compare the function (the stacks tell them apart).
    fn same_context(&self, other: &KeyKind) -> bool {
        match (self, other) {
            (KeyKind::Overlap { .. }, KeyKind::Overlap { .. }) => true,
            _ => self == other,
        }
    }

    pub fn class(&self) -> ErrorClass<'static> {
        match self {
            KeyKind::InvalidFree | KeyKind::MismatchedFree => ErrorClass::Free,
            KeyKind::FishyValue { function, argument } => {
                ErrorClass::FishyValue { function, argument }
            }
            KeyKind::Overlap { .. } => ErrorClass::Overlap,
            KeyKind::BadAlign => ErrorClass::Newer("BadAlign"),
            KeyKind::Addr { size } => ErrorClass::Addr(*size),
            KeyKind::User { .. } => ErrorClass::User,
            KeyKind::IllegalMempool => ErrorClass::Mempool,
            KeyKind::Cond => ErrorClass::Cond,
            KeyKind::Value { size } => ErrorClass::Value(*size),
            KeyKind::Param { param } | KeyKind::ParamUnaddressable { param } => {
                ErrorClass::Param(param)
            }
        }
    }
}

/// An error occurrence, as cheap to build as possible.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorKey {
    pub kind: KeyKind,
    /// The raw stack (return addresses), at most `--num-callers` long.
    pub ips: Vec<u64>,
}

/// `VG_(eq_ExeContext)`: the first `n` frames, where a shorter stack differs from a longer.
fn same_stack(a: &[u64], b: &[u64], n: usize) -> bool {
    a.iter().take(n).eq(b.iter().take(n))
}

/// A rendered error: what is printed, and what suppressions see.
#[derive(Clone, Debug)]
pub struct Shown {
    pub tid: i32,
    /// XML `<kind>`.
    pub xml_kind: &'static str,
    pub block: ErrorBlock,
    /// 3.19 writes `<what>` of FishyValue and length-less Overlap with a trailing newline.
    pub what_newline_quirk: WhatQuirk,
    /// Every frame of the stack (inline-expanded), for suppression matching.
    pub supp_frames: Vec<SuppFrame>,
    /// `--gen-suppressions` text of this error.
    pub generated: GeneratedSupp,
}

/// A loaded suppression and its use counts.
#[derive(Clone, Debug)]
pub struct LoadedSupp {
    /// Load order, a stable identity while the list is reordered.
    pub id: usize,
    pub supp: Suppression,
    pub count: u64,
    /// Bytes (direct + indirect) and blocks of the loss records it suppressed.
    pub leak: Amount,
}

struct Context {
    key: ErrorKey,
    count: u64,
    unique: u64,
    /// [`LoadedSupp::id`] of the suppression that matched when the context was created.
    supp_id: Option<usize>,
    shown: Option<Shown>,
}

/// How errors are reported (a subset of the options).
#[derive(Clone, Debug)]
pub struct Reporting {
    pub pid: i32,
    pub verbosity: u32,
    pub xml: bool,
    pub error_limit: bool,
    pub gen_suppressions: GenSupp,
    pub show_error_list: bool,
    pub error_markers: Option<(String, String)>,
    /// `--track-origins=yes`: no hint to use it at the end.
    pub track_origins: bool,
}

/// Where reports go: the text log channel and the XML document.
#[derive(Default, Debug)]
pub struct Output {
    pub text: String,
    pub xml: String,
}

const SLOWLY_AFTER: u64 = 100;
const STOP_AFTER_SHOWN: u64 = 1000;
const STOP_AFTER_FOUND: u64 = 10_000_000;

pub struct ErrorManager {
    pub rep: Reporting,
    /// Front = first consulted; a suppression that matches moves to the front.
    supps: Vec<LoadedSupp>,
    /// Front = most recently seen.
    contexts: Vec<Context>,
    pub errs_found: u64,
    pub err_contexts: u64,
    pub errs_suppressed: u64,
    pub supp_contexts: u64,
    pub errs_shown: u64,
    unique: u64,
    last_tid: i32,
    slowdown_said: bool,
    stop_said: bool,
    /// An uninitialised-value error was seen (the `--track-origins=yes` hint at the end).
    pub any_value_errors: bool,
}

impl ErrorManager {
    pub fn new(rep: Reporting) -> ErrorManager {
        ErrorManager {
            rep,
            supps: Vec::new(),
            contexts: Vec::new(),
            errs_found: 0,
            err_contexts: 0,
            errs_suppressed: 0,
            supp_contexts: 0,
            errs_shown: 0,
            unique: 0,
            last_tid: 1,
            slowdown_said: false,
            stop_said: false,
            any_value_errors: false,
        }
    }

    /// Adds the entries of one file, in file order; as in Valgrind each goes to the front.
    pub fn add_suppressions(&mut self, entries: Vec<Suppression>) {
        for s in entries {
            let id = self.supps.len();
            self.supps.insert(
                0,
                LoadedSupp {
                    id,
                    supp: s,
                    count: 0,
                    leak: Amount::default(),
                },
            );
        }
    }

    pub fn suppressions(&self) -> &[LoadedSupp] {
        &self.supps
    }

    /// Index of the first matching suppression, moved to the front.
    fn suppress(&mut self, class: &ErrorClass<'_>, frames: &[SuppFrame]) -> Option<usize> {
        let i = self
            .supps
            .iter()
            .position(|s| s.supp.matches(class, frames))?;
        let s = self.supps.remove(i);
        self.supps.insert(0, s);
        Some(0)
    }

    /// `VG_(maybe_record_error)`. `render` is called only for a new context.
    pub fn record(&mut self, out: &mut Output, key: ErrorKey, render: &mut dyn FnMut() -> Shown) {
        if matches!(
            key.kind,
            KeyKind::Cond
                | KeyKind::Value { .. }
                | KeyKind::Param { .. }
                | KeyKind::User { addr_err: false }
        ) {
            // Memcheck's `any_value_errors`, suppressed ones included.
            self.any_value_errors = true;
        }
        let pid = self.rep.pid;
        if self.rep.error_limit
            && !self.rep.xml
            && (self.errs_shown >= STOP_AFTER_SHOWN || self.errs_found >= STOP_AFTER_FOUND)
        {
            if !self.stop_said {
                text::line(&mut out.text, pid, "");
                if self.errs_shown >= STOP_AFTER_SHOWN {
                    text::line(&mut out.text, pid, text::MORE_THAN_1000);
                } else {
                    text::line(&mut out.text, pid, text::MORE_THAN_10M);
                }
                for l in text::GIVING_UP_TAIL {
                    text::line(&mut out.text, pid, l);
                }
                text::line(&mut out.text, pid, "");
                self.stop_said = true;
            }
            return;
        }
        let mut frames = 4;
        if self.errs_shown >= SLOWLY_AFTER && !self.rep.xml {
            frames = 2;
            if !self.slowdown_said {
                text::line(&mut out.text, pid, "");
                for l in text::MORE_THAN_100 {
                    text::line(&mut out.text, pid, l);
                }
                self.slowdown_said = true;
            }
        }
        let unique = self.unique;
        self.unique += 1;
        if let Some(i) = self.contexts.iter().position(|c| {
            c.key.kind.same_context(&key.kind) && same_stack(&c.key.ips, &key.ips, frames)
        }) {
            let mut c = self.contexts.remove(i);
            c.count += 1;
            if let Some(id) = c.supp_id {
                self.errs_suppressed += 1;
                if let Some(su) = self.supps.iter_mut().find(|s| s.id == id) {
                    su.count += 1;
                }
            } else {
                self.errs_found += 1;
            }
            self.contexts.insert(0, c);
            return;
        }
        let shown = render();
        let class = key.kind.class();
        let suppressed = self.suppress(&class, &shown.supp_frames);
        let supp_id = match suppressed {
            Some(s) => {
                self.supp_contexts += 1;
                self.errs_suppressed += 1;
                self.supps[s].count += 1;
                Some(self.supps[s].id)
            }
            None => {
                self.err_contexts += 1;
                self.errs_found += 1;
                self.errs_shown += 1;
                self.pp_error(out, &shown, unique, None);
                None
            }
        };
        // A suppressed context keeps no rendering: nothing will print it.
        let shown = supp_id.is_none().then_some(shown);
        self.contexts.insert(
            0,
            Context {
                key,
                count: 1,
                unique,
                supp_id,
                shown,
            },
        );
    }

    /// `VG_(unique_error)` for one loss record: suppressed or printed/counted as asked.
    /// Returns whether a suppression matched.
    pub fn leak(
        &mut self,
        out: &mut Output,
        kind: LeakKind,
        shown: &Shown,
        leak_xml: (u64, u64),
        print: bool,
        count: bool,
    ) -> bool {
        let unique = self.unique;
        self.unique += 1;
        match self.suppress(&ErrorClass::Leak(kind), &shown.supp_frames) {
            Some(s) => {
                if count {
                    self.errs_suppressed += 1;
                    self.supp_contexts += 1;
                }
                let su = &mut self.supps[s];
                su.count += 1;
                su.leak.bytes += leak_xml.0;
                su.leak.blocks += leak_xml.1;
                true
            }
            None => {
                if count {
                    self.errs_found += 1;
                    self.err_contexts += 1;
                }
                if print {
                    self.errs_shown += 1;
                    self.pp_error(out, shown, unique, Some(leak_xml));
                }
                false
            }
        }
    }

    /// `pp_Error` plus the suppression printing of `do_actions_on_error`.
    fn pp_error(&mut self, out: &mut Output, e: &Shown, unique: u64, leak: Option<(u64, u64)>) {
        let pid = self.rep.pid;
        let gen = self.rep.gen_suppressions != GenSupp::No;
        if self.rep.xml {
            let what = match leak {
                Some((bytes, blocks)) => xml::What::Leak {
                    text: &e.block.what,
                    bytes,
                    blocks,
                },
                None => xml::What::Plain {
                    text: &e.block.what,
                    newline_quirk: e.what_newline_quirk,
                },
            };
            xml::error(
                &mut out.xml,
                &xml::Error {
                    unique,
                    tid: e.tid,
                    thread_name: None,
                    kind: e.xml_kind,
                    what,
                    stack: &e.block.stack,
                    aux: &e.block.aux,
                    suppression: gen.then_some(&e.generated),
                },
            );
            return;
        }
        if let Some((b, _)) = &self.rep.error_markers {
            text::line(&mut out.text, pid, b);
        }
        if e.tid > 0 && e.tid != self.last_tid {
            text::thread_header(&mut out.text, pid, e.tid, None);
            self.last_tid = e.tid;
        }
        text::error_block(&mut out.text, pid, &e.block);
        if let Some((_, end)) = &self.rep.error_markers {
            text::line(&mut out.text, pid, end);
        }
        if gen {
            out.text.push_str(&e.generated.text());
        }
    }

    /// Whether any error was counted (for `--error-exitcode`).
    pub fn any_errors(&self) -> bool {
        self.errs_found > 0
    }

    /// End of run, after the leak report: `For lists ...`, ERROR SUMMARY and the `-s`
    /// listing in text mode; `<errorcounts>` and `<suppcounts>` in XML mode.
    pub fn finish(&mut self, out: &mut Output) {
        let pid = self.rep.pid;
        if self.rep.xml {
            let pairs: Vec<(u64, u64)> = self
                .contexts
                .iter()
                .filter(|c| c.supp_id.is_none() && c.count > 0)
                .map(|c| (c.count, c.unique))
                .collect();
            xml::errorcounts(&mut out.xml, &pairs);
            let used: Vec<(u64, &str)> = self
                .supps
                .iter()
                .filter(|s| s.count > 0)
                .map(|s| (s.count, s.supp.name.as_str()))
                .collect();
            // Valgrind 3.19 leaves <suppcounts> out under -q, and one empty line in its place.
            if self.rep.verbosity > 0 {
                xml::suppcounts(&mut out.xml, &used);
            } else {
                out.xml.push('\n');
            }
            return;
        }
        if self.any_value_errors && !self.rep.track_origins && self.rep.verbosity >= 1 {
            text::line(
                &mut out.text,
                pid,
                "Use --track-origins=yes to see where uninitialised values come from",
            );
        }
        if self.rep.verbosity == 1 && !self.rep.show_error_list {
            text::line(
                &mut out.text,
                pid,
                "For lists of detected and suppressed errors, rerun with: -s",
            );
        }
        if self.rep.verbosity == 0 && !self.rep.show_error_list {
            return;
        }
        let summary = text::error_summary(
            self.errs_found,
            self.err_contexts,
            self.errs_suppressed,
            self.supp_contexts,
        );
        text::line(&mut out.text, pid, &summary);
        if !self.rep.show_error_list {
            return;
        }
        // Contexts in increasing count; among equals the most recently seen first.
        let mut order: Vec<usize> = (0..self.contexts.len())
            .filter(|&i| self.contexts[i].supp_id.is_none())
            .collect();
        order.sort_by_key(|&i| self.contexts[i].count); // stable: keeps list order among equals
        let mut any_error = false;
        for (n, &i) in order.iter().enumerate() {
            any_error = true;
            text::line(&mut out.text, pid, "");
            let head = format!(
                "{} errors in context {} of {}:",
                self.contexts[i].count,
                n + 1,
                self.err_contexts
            );
            text::line(&mut out.text, pid, &head);
            if let Some(shown) = self.contexts[i].shown.take() {
                let unique = self.contexts[i].unique;
                self.pp_error(out, &shown, unique, None);
                self.contexts[i].shown = Some(shown);
            }
        }
        let mut any_supp = false;
        for s in self.supps.iter().filter(|s| s.count > 0) {
            if !any_supp {
                text::debug_line(&mut out.text, pid, "");
            }
            any_supp = true;
            let leak = (s.leak.blocks > 0).then_some(s.leak);
            text::debug_line(
                &mut out.text,
                pid,
                &text::used_suppression(s.count, &s.supp.name, &s.supp.file, s.supp.line, leak),
            );
        }
        if any_supp {
            text::line(&mut out.text, pid, "");
        }
        if any_supp || any_error {
            text::line(&mut out.text, pid, &summary);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxgrind_formats::suppressions::{parse, GenFrame};

    fn rep() -> Reporting {
        Reporting {
            pid: 7,
            verbosity: 1,
            xml: false,
            error_limit: true,
            gen_suppressions: GenSupp::No,
            show_error_list: false,
            error_markers: None,
            track_origins: false,
        }
    }

    fn shown(what: &str, fun: &str) -> Shown {
        Shown {
            tid: 1,
            xml_kind: "InvalidFree",
            block: ErrorBlock {
                what: what.into(),
                stack: vec![],
                aux: vec![],
            },
            what_newline_quirk: WhatQuirk::None,
            supp_frames: vec![
                SuppFrame {
                    fun: Some("free".into()),
                    ..Default::default()
                },
                SuppFrame {
                    fun: Some(fun.into()),
                    ..Default::default()
                },
            ],
            generated: GeneratedSupp {
                kind: "Memcheck:Free".into(),
                extra: None,
                frames: vec![GenFrame::Fun("free".into())],
            },
        }
    }

    fn key(ips: &[u64]) -> ErrorKey {
        ErrorKey {
            kind: KeyKind::InvalidFree,
            ips: ips.to_vec(),
        }
    }

    #[test]
    fn repeated_error_with_same_first_four_frames_is_counted_not_printed() {
        let mut m = ErrorManager::new(rep());
        let mut out = Output::default();
        let mut renders = 0;
        for ips in [&[1u64, 2, 3, 4, 5][..], &[1, 2, 3, 4, 6], &[1, 2, 3, 9]] {
            m.record(&mut out, key(ips), &mut || {
                renders += 1;
                shown("Invalid free() / delete / delete[] / realloc()", "main")
            });
        }
        assert_eq!(renders, 2);
        assert_eq!((m.errs_found, m.err_contexts), (3, 2));
        assert_eq!(out.text.matches("Invalid free()").count(), 2);
    }

    #[test]
    fn fishy_values_differ_by_function_and_argument_overlaps_do_not() {
        let mut m = ErrorManager::new(rep());
        let mut out = Output::default();
        let fishy = |function, argument| ErrorKey {
            kind: KeyKind::FishyValue { function, argument },
            ips: vec![1, 2],
        };
        m.record(&mut out, fishy("calloc", "nmemb"), &mut || {
            shown("a", "main")
        });
        m.record(&mut out, fishy("calloc", "size"), &mut || {
            shown("b", "main")
        });
        m.record(&mut out, fishy("calloc", "size"), &mut || {
            shown("b", "main")
        });
        assert_eq!((m.err_contexts, m.errs_found), (2, 3));
        let overlap = |function| ErrorKey {
            kind: KeyKind::Overlap { function },
            ips: vec![7, 8],
        };
        m.record(&mut out, overlap("strcpy"), &mut || shown("c", "main"));
        m.record(&mut out, overlap("stpcpy"), &mut || shown("d", "main"));
        assert_eq!((m.err_contexts, m.errs_found), (3, 5));
    }

    #[test]
    fn different_kinds_on_the_same_stack_are_different_contexts() {
        let mut m = ErrorManager::new(rep());
        let mut out = Output::default();
        m.record(&mut out, key(&[1, 2]), &mut || shown("a", "main"));
        m.record(
            &mut out,
            ErrorKey {
                kind: KeyKind::MismatchedFree,
                ips: vec![1, 2],
            },
            &mut || shown("b", "main"),
        );
        assert_eq!(m.err_contexts, 2);
    }

    #[test]
    fn invalid_read_and_write_of_one_size_at_one_place_are_one_context() {
        let mut m = ErrorManager::new(rep());
        let mut out = Output::default();
        let addr = |size| ErrorKey {
            kind: KeyKind::Addr { size },
            ips: vec![1, 2],
        };
        m.record(&mut out, addr(4), &mut || {
            shown("Invalid read of size 4", "main")
        });
        m.record(&mut out, addr(4), &mut || {
            shown("Invalid write of size 4", "main")
        });
        m.record(&mut out, addr(8), &mut || {
            shown("Invalid read of size 8", "main")
        });
        assert_eq!((m.err_contexts, m.errs_found), (2, 3));
        assert!(!out.text.contains("Invalid write"));
        assert_eq!(KeyKind::Addr { size: 4 }.class().supp_kind_name(), "Addr4");
    }

    #[test]
    fn suppressed_errors_are_counted_apart_and_listed_with_s() {
        let mut r = rep();
        r.show_error_list = true;
        let mut m = ErrorManager::new(r);
        m.add_suppressions(
            parse(
                "t.supp",
                "{\n  free-in-f\n  Memcheck:Free\n  fun:free\n  fun:f\n}\n",
                "Memcheck",
                12,
            )
            .unwrap(),
        );
        let mut out = Output::default();
        m.record(&mut out, key(&[1, 2]), &mut || shown("in f", "f"));
        m.record(&mut out, key(&[1, 2]), &mut || shown("in f", "f"));
        m.record(&mut out, key(&[1, 3]), &mut || shown("in g", "g"));
        assert_eq!(
            (
                m.errs_found,
                m.err_contexts,
                m.errs_suppressed,
                m.supp_contexts
            ),
            (1, 1, 2, 1)
        );
        assert!(!out.text.contains("in f"));
        out.text.clear();
        m.finish(&mut out);
        assert_eq!(
            out.text,
            "==7== ERROR SUMMARY: 1 errors from 1 contexts (suppressed: 2 from 1)
==7== 
==7== 1 errors in context 1 of 1:
==7== in g
==7== 
--7-- 
--7-- used_suppression:      2 free-in-f t.supp:2
==7== 
==7== ERROR SUMMARY: 1 errors from 1 contexts (suppressed: 2 from 1)
"
        );
    }

    #[test]
    fn listing_orders_by_count_then_most_recent_first() {
        let mut r = rep();
        r.show_error_list = true;
        let mut m = ErrorManager::new(r);
        let mut out = Output::default();
        m.record(&mut out, key(&[1]), &mut || shown("A", "main"));
        m.record(&mut out, key(&[2]), &mut || shown("B", "main"));
        m.record(&mut out, key(&[1]), &mut || shown("A", "main"));
        m.record(&mut out, key(&[3]), &mut || shown("C", "main"));
        out.text.clear();
        m.finish(&mut out);
        let heads: Vec<&str> = out
            .text
            .lines()
            .filter(|l| {
                l.contains("errors in context")
                    || l.ends_with(" A")
                    || l.ends_with(" B")
                    || l.ends_with(" C")
            })
            .collect();
        assert_eq!(
            heads,
            [
                "==7== 1 errors in context 1 of 3:",
                "==7== C",
                "==7== 1 errors in context 2 of 3:",
                "==7== B",
                "==7== 2 errors in context 3 of 3:",
                "==7== A"
            ]
        );
    }

    #[test]
    fn thread_header_appears_when_the_thread_changes() {
        let mut m = ErrorManager::new(rep());
        let mut out = Output::default();
        m.record(&mut out, key(&[1]), &mut || Shown {
            tid: 2,
            ..shown("X", "main")
        });
        m.record(&mut out, key(&[2]), &mut || Shown {
            tid: 2,
            ..shown("Y", "main")
        });
        m.record(&mut out, key(&[3]), &mut || shown("Z", "main"));
        assert_eq!(
            out.text,
            "==7== Thread 2:\n==7== X\n==7== \n==7== Y\n==7== \n==7== Thread 1:\n==7== Z\n==7== \n"
        );
    }

    #[test]
    fn error_limit_slows_down_after_100_and_stops_after_1000_shown() {
        let mut m = ErrorManager::new(rep());
        let mut out = Output::default();
        for i in 0..1005u64 {
            // Distinct in frame 0 and 1 so low resolution does not merge them.
            m.record(&mut out, key(&[i, i]), &mut || shown("E", "main"));
        }
        assert_eq!(m.errs_shown, 1000);
        assert_eq!(
            out.text
                .matches("More than 100 errors detected.  Subsequent errors")
                .count(),
            1
        );
        assert_eq!(
            out.text
                .matches("More than 1000 different errors detected.")
                .count(),
            1
        );
        let mut m2 = ErrorManager::new(Reporting {
            error_limit: false,
            ..rep()
        });
        for i in 0..1005u64 {
            m2.record(&mut out, key(&[i, i]), &mut || shown("E", "main"));
        }
        assert_eq!(m2.errs_shown, 1005);
    }

    #[test]
    fn after_100_contexts_only_two_frames_distinguish_errors() {
        let mut m = ErrorManager::new(rep());
        let mut out = Output::default();
        for i in 0..100u64 {
            m.record(&mut out, key(&[i, i]), &mut || shown("E", "main"));
        }
        m.record(&mut out, key(&[500, 500, 1]), &mut || shown("E", "main"));
        m.record(&mut out, key(&[500, 500, 2]), &mut || shown("E", "main"));
        assert_eq!(m.err_contexts, 101);
        assert_eq!(m.errs_found, 102);
    }

    #[test]
    fn leak_records_count_only_when_asked_and_feed_leak_suppression_totals() {
        let mut m = ErrorManager::new(rep());
        m.add_suppressions(
            parse(
                "t.supp",
                "{\n  l\n  Memcheck:Leak\n  match-leak-kinds: indirect\n  fun:malloc\n}\n",
                "Memcheck",
                12,
            )
            .unwrap(),
        );
        let mut out = Output::default();
        let mut s = shown(
            "24 bytes in 1 blocks are indirectly lost in loss record 1 of 2",
            "main",
        );
        s.supp_frames[0].fun = Some("malloc".into());
        assert!(m.leak(&mut out, LeakKind::Indirect, &s, (24, 1), false, false));
        assert!(!m.leak(&mut out, LeakKind::Definite, &s, (100, 1), true, true));
        assert_eq!(
            (
                m.errs_found,
                m.err_contexts,
                m.errs_suppressed,
                m.supp_contexts
            ),
            (1, 1, 0, 0)
        );
        assert_eq!(
            m.suppressions()[0].leak,
            Amount {
                bytes: 24,
                blocks: 1
            }
        );
        assert!(out.text.contains("indirectly lost"));
        assert_eq!(m.unique, 2);
    }
}
