//! Memcheck's `--xml=yes` output, protocol 4, byte for byte as Valgrind 3.19 writes it
//! (formats.md §5), including its quirks (the newline inside `<what>` of FishyValue and
//! length-less Overlap errors, the top-level copy of each `<suppression>`).
//!
//! The document is written in pieces as the run goes: [`header`] at start-up, [`error`]
//! per shown error, [`status`] at the end, then the leak errors, [`errorcounts`],
//! [`suppcounts`] and [`footer`]. Escaping is Valgrind's `%pS`: only `&`, `<`, `>`.

use crate::frame::Frame;
use crate::memcheck_text::Aux;
use crate::suppressions::{GenFrame, GeneratedSupp};
use alloc::string::String;
use core::fmt::Write;

/// Escapes `&`, `<`, `>` as Valgrind's `%pS` does (quotes and non-ASCII stay raw).
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            _ => out.push(c),
        }
    }
    out
}

/// What goes between `<preamble>` and the first `<status>`.
#[derive(Clone, Debug, Default)]
pub struct Header<'a> {
    pub pid: i32,
    pub ppid: i32,
    /// `Command:` words: the program and its arguments.
    pub command: &'a [String],
    /// `<vargv><exe>`: the launcher's path.
    pub launcher: &'a str,
    /// Options given to oxgrind, each an `<arg>`.
    pub tool_args: &'a [String],
    /// `%q{VAR}` expansions of `--xml-file`: (VAR, value).
    pub file_qualifiers: &'a [(String, String)],
    /// `--xml-user-comment`, written unescaped on purpose (Valgrind does so).
    pub user_comment: Option<&'a str>,
}

/// From `<?xml` to the blank line after `</args>`.
pub fn header(out: &mut String, h: &Header<'_>) {
    out.push_str("<?xml version=\"1.0\"?>\n\n<valgrindoutput>\n\n<protocolversion>4</protocolversion>\n<protocoltool>memcheck</protocoltool>\n\n<preamble>\n");
    out.push_str("  <line>Memcheck, a memory error detector</line>\n");
    out.push_str(
        "  <line>Copyright (C) 2002-2022, and GNU GPL'd, by Julian Seward et al.</line>\n",
    );
    out.push_str(
        "  <line>Using Valgrind-3.19.0 and LibVEX; rerun with -h for copyright info</line>\n",
    );
    out.push_str("  <line>Command: ");
    for (i, a) in h.command.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&escape(a));
    }
    out.push_str("</line>\n</preamble>\n\n");
    let _ = writeln!(
        out,
        "<pid>{}</pid>\n<ppid>{}</ppid>\n<tool>memcheck</tool>",
        h.pid, h.ppid
    );
    for (var, value) in h.file_qualifiers {
        let _ = writeln!(
            out,
            "<logfilequalifier> <var>{}</var> <value>{}</value> </logfilequalifier>",
            escape(var),
            escape(value)
        );
    }
    if let Some(c) = h.user_comment {
        let _ = writeln!(out, "<usercomment>{c}</usercomment>");
    }
    out.push_str("\n<args>\n  <vargv>\n");
    let _ = writeln!(out, "    <exe>{}</exe>", escape(h.launcher));
    for a in h.tool_args {
        let _ = writeln!(out, "    <arg>{}</arg>", escape(a));
    }
    out.push_str("  </vargv>\n  <argv>\n");
    let mut cmd = h.command.iter();
    let _ = writeln!(
        out,
        "    <exe>{}</exe>",
        escape(cmd.next().map(String::as_str).unwrap_or(""))
    );
    for a in cmd {
        let _ = writeln!(out, "    <arg>{}</arg>", escape(a));
    }
    out.push_str("  </argv>\n</args>\n\n");
}

/// `DD:HH:MM:SS.mmm ` (trailing space included), as `<time>` and `--time-stamp` print it.
pub fn elapsed(ms: u64) -> String {
    let (d, rem) = (ms / 86_400_000, ms % 86_400_000);
    let (h, rem) = (rem / 3_600_000, rem % 3_600_000);
    let (m, rem) = (rem / 60_000, rem % 60_000);
    let (s, milli) = (rem / 1000, rem % 1000);
    alloc::format!("{d:02}:{h:02}:{m:02}:{s:02}.{milli:03} ")
}

/// `<status>` with `RUNNING` or `FINISHED`, and the blank line after it.
pub fn status(out: &mut String, state: &str, elapsed_ms: u64) {
    let _ = write!(
        out,
        "<status>\n  <state>{state}</state>\n  <time>{}</time>\n</status>\n\n",
        elapsed(elapsed_ms)
    );
}

fn frame(out: &mut String, f: &Frame) {
    let _ = write!(out, "    <frame>\n      <ip>0x{:X}</ip>\n", f.ip);
    if let Some(o) = &f.object {
        let _ = writeln!(out, "      <obj>{}</obj>", escape(o));
    }
    if let Some(n) = &f.function {
        let _ = writeln!(out, "      <fn>{}</fn>", escape(n));
    }
    if let (Some(file), true) = (&f.file, f.line > 0) {
        if let Some(d) = &f.dir {
            let _ = writeln!(out, "      <dir>{}</dir>", escape(d));
        }
        let _ = writeln!(
            out,
            "      <file>{}</file>\n      <line>{}</line>",
            escape(file),
            f.line
        );
    }
    out.push_str("    </frame>\n");
}

/// `<stack>` with one `<frame>` per frame.
pub fn stack(out: &mut String, frames: &[Frame]) {
    out.push_str("  <stack>\n");
    for f in frames {
        frame(out, f);
    }
    out.push_str("  </stack>\n");
}

/// How Valgrind 3.19 closes `<what>` for the few errors whose message ends in a newline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WhatQuirk {
    /// `<what>text</what>`.
    #[default]
    None,
    /// `<what>text\n</what>` with the next tag on the same line (FishyValue).
    NewlineThenTag,
    /// `<what>text\n</what>` then a newline (Overlap without a length).
    NewlineThenNewline,
}

/// The headline of an error.
#[derive(Clone, Debug)]
pub enum What<'a> {
    /// `<what>text</what>`, or one of 3.19's two malformed variants (see [`WhatQuirk`]).
    Plain {
        text: &'a str,
        newline_quirk: WhatQuirk,
    },
    /// Leak records: `<xwhat>` with `<text>`, `<leakedbytes>`, `<leakedblocks>`.
    Leak {
        text: &'a str,
        bytes: u64,
        blocks: u64,
    },
}

/// One `<error>` element.
#[derive(Clone, Debug)]
pub struct Error<'a> {
    pub unique: u64,
    pub tid: i32,
    pub thread_name: Option<&'a str>,
    /// `InvalidFree`, `Leak_DefinitelyLost`, ...
    pub kind: &'a str,
    pub what: What<'a>,
    pub stack: &'a [Frame],
    pub aux: &'a [Aux],
    /// With `--gen-suppressions=all`: written inside the error and, as 3.19 does, once more
    /// after it.
    pub suppression: Option<&'a GeneratedSupp>,
}

/// The `<suppression>` element of `--gen-suppressions=all`.
pub fn suppression(out: &mut String, s: &GeneratedSupp) {
    out.push_str("  <suppression>\n    <sname>insert_a_suppression_name_here</sname>\n");
    let _ = writeln!(out, "    <skind>{}</skind>", escape(&s.kind));
    if let Some(x) = &s.extra {
        let _ = writeln!(out, "    <skaux>{}</skaux>", escape(x));
    }
    for f in &s.frames {
        match f {
            GenFrame::Fun(n) => {
                let _ = writeln!(out, "    <sframe> <fun>{}</fun> </sframe>", escape(n));
            }
            GenFrame::Obj(o) => {
                let _ = writeln!(out, "    <sframe> <obj>{}</obj> </sframe>", escape(o));
            }
            GenFrame::Unknown => out.push_str("    <sframe> <obj>*</obj> </sframe>\n"),
        }
    }
    out.push_str("    <rawtext>\n<![CDATA[\n");
    out.push_str(&s.text());
    out.push_str("]]>\n    </rawtext>\n  </suppression>\n");
}

/// An `<error>` element, its blank line, and the duplicate suppression of 3.19.
pub fn error(out: &mut String, e: &Error<'_>) {
    let _ = write!(
        out,
        "<error>\n  <unique>0x{:x}</unique>\n  <tid>{}</tid>\n",
        e.unique, e.tid
    );
    if let Some(n) = e.thread_name {
        let _ = writeln!(out, "  <threadname>{}</threadname>", escape(n));
    }
    let _ = writeln!(out, "  <kind>{}</kind>", e.kind);
    match &e.what {
        What::Plain {
            text,
            newline_quirk: WhatQuirk::None,
        } => {
            let _ = writeln!(out, "  <what>{}</what>", escape(text));
        }
        What::Plain {
            text,
            newline_quirk: WhatQuirk::NewlineThenTag,
        } => {
            let _ = write!(out, "  <what>{}\n</what>", escape(text));
        }
        What::Plain {
            text,
            newline_quirk: WhatQuirk::NewlineThenNewline,
        } => {
            let _ = writeln!(out, "  <what>{}\n</what>", escape(text));
        }
        What::Leak {
            text,
            bytes,
            blocks,
        } => {
            let _ = write!(
                out,
                "  <xwhat>\n    <text>{}</text>\n    <leakedbytes>{bytes}</leakedbytes>\n    <leakedblocks>{blocks}</leakedblocks>\n  </xwhat>\n",
                escape(text)
            );
        }
    }
    stack(out, e.stack);
    for a in e.aux {
        match a {
            Aux::Text(t) => {
                let _ = writeln!(out, "  <auxwhat>{}</auxwhat>", escape(t));
            }
            Aux::Stack(s) => stack(out, s),
        }
    }
    if let Some(s) = e.suppression {
        suppression(out, s);
    }
    out.push_str("</error>\n\n");
    if let Some(s) = e.suppression {
        suppression(out, s);
    }
}

/// `<errorcounts>`: (count, unique) per shown, unsuppressed, non-leak context.
pub fn errorcounts(out: &mut String, pairs: &[(u64, u64)]) {
    out.push_str("<errorcounts>\n");
    for (count, unique) in pairs {
        let _ = write!(
            out,
            "  <pair>\n    <count>{count}</count>\n    <unique>0x{unique:x}</unique>\n  </pair>\n"
        );
    }
    out.push_str("</errorcounts>\n\n");
}

/// `<suppcounts>`: (count, name) per used suppression.
pub fn suppcounts(out: &mut String, pairs: &[(u64, &str)]) {
    out.push_str("<suppcounts>\n");
    for (count, name) in pairs {
        let _ = write!(
            out,
            "  <pair>\n    <count>{count}</count>\n    <name>{}</name>\n  </pair>\n",
            escape(name)
        );
    }
    out.push_str("</suppcounts>\n\n");
}

/// `<fatal_signal>`: the signal the program died by, with the event, address and stack.
pub fn fatal_signal(out: &mut String, tid: i32, sig: i32, code: i32, addr: u64, frames: &[Frame]) {
    use core::fmt::Write;
    out.push_str("<fatal_signal>\n");
    let _ = writeln!(out, "  <tid>{tid}</tid>");
    let _ = writeln!(out, "  <signo>{sig}</signo>");
    let _ = writeln!(
        out,
        "  <signame>{}</signame>",
        crate::memcheck_text::signal_name(sig)
    );
    let _ = writeln!(out, "  <sicode>{code}</sicode>");
    if let Some((event, with_addr)) = crate::memcheck_text::fault_event(sig, code) {
        let _ = writeln!(out, "  <event>{}</event>", escape(event));
        if with_addr {
            let _ = writeln!(out, "  <siaddr>{addr:#x}</siaddr>");
        }
    }
    stack(out, frames);
    out.push_str("</fatal_signal>\n\n");
}

pub fn footer(out: &mut String) {
    out.push_str("</valgrindoutput>\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memcheck_text::{address_in_block, BLOCK_WAS_ALLOCD_AT};
    use alloc::string::ToString;
    use alloc::vec;
    use alloc::vec::Vec;

    fn pre(ip: u64, func: &str) -> Frame {
        Frame {
            ip,
            function: Some(func.into()),
            object: Some("/usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so".into()),
            ..Default::default()
        }
    }
    fn prog(ip: u64, func: &str, line: u32) -> Frame {
        Frame {
            ip,
            function: Some(func.into()),
            object: Some("/src/fmt/mc_errors".into()),
            dir: Some("/src/fmt".into()),
            file: Some("mc_errors.c".into()),
            line,
            ..Default::default()
        }
    }

    /// Cuts one `<error>` ... `</error>\n` out of a reference file, by its unique.
    fn reference_error(doc: &str, unique: &str) -> String {
        let start = doc
            .find(&alloc::format!("<error>\n  <unique>{unique}</unique>"))
            .unwrap();
        let end = doc[start..].find("</error>\n").unwrap() + start + "</error>\n".len();
        doc[start..end].to_string()
    }

    const WITH_SUPP: &str =
        include_str!("../../../tools/memcheck/tests/data/mc_errors.with-supp.xml");
    const GEN_SUPP: &str =
        include_str!("../../../tools/memcheck/tests/data/mc_errors.gen-suppressions-all.xml");

    #[test]
    fn double_free_error_matches_reference_xml() {
        let aux = vec![
            Aux::Text(address_in_block(0x4a40040, 0, 40, true)),
            Aux::Stack(vec![pre(0x484417B, "free"), prog(0x109260, "main", 28)]),
            Aux::Text(BLOCK_WAS_ALLOCD_AT.into()),
            Aux::Stack(vec![pre(0x48417B4, "malloc"), prog(0x109238, "main", 23)]),
        ];
        let stack = [pre(0x484417B, "free"), prog(0x109276, "main", 31)];
        let mut out = String::new();
        error(
            &mut out,
            &Error {
                unique: 3,
                tid: 1,
                thread_name: None,
                kind: "InvalidFree",
                what: What::Plain {
                    text: crate::memcheck_text::INVALID_FREE,
                    newline_quirk: WhatQuirk::None,
                },
                stack: &stack,
                aux: &aux,
                suppression: None,
            },
        );
        assert_eq!(out, reference_error(WITH_SUPP, "0x3") + "\n");
    }

    #[test]
    fn leak_error_matches_reference_xml() {
        let stack = [
            pre(0x48417B4, "malloc"),
            prog(0x1091F1, "leak_possible", 16),
            prog(0x10938D, "main", 57),
        ];
        let text = crate::memcheck_text::loss_record_what(
            64,
            0,
            1,
            crate::suppressions::LeakKind::Possible,
            4,
            6,
        );
        let mut out = String::new();
        error(
            &mut out,
            &Error {
                unique: 0xc,
                tid: 1,
                thread_name: None,
                kind: "Leak_PossiblyLost",
                what: What::Leak {
                    text: &text,
                    bytes: 64,
                    blocks: 1,
                },
                stack: &stack,
                aux: &[],
                suppression: None,
            },
        );
        assert_eq!(out, reference_error(WITH_SUPP, "0xc") + "\n");
    }

    #[test]
    fn fishy_value_with_suppression_reproduces_both_quirks() {
        let stack = [pre(0x48417B4, "malloc"), prog(0x10936E, "main", 52)];
        let supp = GeneratedSupp {
            kind: "Memcheck:FishyValue".into(),
            extra: Some("malloc(size)".into()),
            frames: vec![GenFrame::Fun("malloc".into()), GenFrame::Fun("main".into())],
        };
        let what = crate::memcheck_text::fishy_value("malloc", "size", (-5i64) as u64);
        let mut out = String::new();
        error(
            &mut out,
            &Error {
                unique: 7,
                tid: 1,
                thread_name: None,
                kind: "FishyValue",
                what: What::Plain {
                    text: &what,
                    newline_quirk: WhatQuirk::NewlineThenTag,
                },
                stack: &stack,
                aux: &[],
                suppression: Some(&supp),
            },
        );
        let start = GEN_SUPP.find("<error>\n  <unique>0x7</unique>").unwrap();
        let end = GEN_SUPP[start..].find("<error>\n  <unique>0x8").unwrap() + start;
        assert_eq!(out, &GEN_SUPP[start..end]);
    }

    #[test]
    fn header_status_and_counts_match_reference_skeleton() {
        let cmd = vec!["./mc_errors".to_string()];
        let args: Vec<String> = [
            "--leak-check=full",
            "--suppressions=test.supp",
            "--xml=yes",
            "--xml-file=mc_errors.supp.xml",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut out = String::new();
        header(
            &mut out,
            &Header {
                pid: 18285,
                ppid: 18279,
                command: &cmd,
                launcher: "/usr/bin/valgrind.bin",
                tool_args: &args,
                ..Default::default()
            },
        );
        status(&mut out, "RUNNING", 41);
        assert!(WITH_SUPP.starts_with(&out), "{out}");
        let mut tail = String::new();
        errorcounts(&mut tail, &[(1, 8), (1, 5), (1, 4), (1, 3)]);
        suppcounts(
            &mut tail,
            &[
                (3, "leak-indirect-wild"),
                (1, "fishy"),
                (1, "param-write"),
                (3, "addr4-in-main"),
            ],
        );
        footer(&mut tail);
        assert!(WITH_SUPP.ends_with(&tail));
        let mut fin = String::new();
        status(&mut fin, "FINISHED", 788);
        assert!(WITH_SUPP.contains(&alloc::format!("</error>\n\n\n{fin}")));
    }

    #[test]
    fn header_with_file_qualifier_and_unescaped_user_comment_matches_reference() {
        const CRASH: &str = include_str!(
            "../../../tools/memcheck/tests/data/mc_crash.fatal_signal.track-fds.logfilequalifier.xml"
        );
        let cmd = vec!["./mc_crash".to_string()];
        let args: Vec<String> = [
            "--xml=yes",
            "--xml-file=mc_crash.%p.%q{MYVAR}.xml",
            "--xml-user-comment=<ci>run 1</ci>",
            "--track-fds=yes",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let quals = vec![("MYVAR".to_string(), "hello".to_string())];
        let mut out = String::new();
        header(
            &mut out,
            &Header {
                pid: 17362,
                ppid: 17346,
                command: &cmd,
                launcher: "/usr/bin/valgrind.bin",
                tool_args: &args,
                file_qualifiers: &quals,
                user_comment: Some("<ci>run 1</ci>"),
            },
        );
        status(&mut out, "RUNNING", 46);
        assert!(CRASH.starts_with(&out), "{out}");
    }

    #[test]
    fn escaping_is_valgrinds_percent_ps() {
        assert_eq!(escape("a<b>&\"c'"), "a&lt;b&gt;&amp;\"c'");
        assert_eq!(elapsed(1115), "00:00:00:01.115 ");
        assert_eq!(elapsed(90_061_001), "01:01:01:01.001 ");
    }
}
