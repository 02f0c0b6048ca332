//! Reads a Memcheck XML report (protocols 4, 5 and 6, formats.md §5) into a plain model, for
//! viewers (`oxgrind report`, `oxgrind diff`, SARIF): the writer's counterpart in
//! [`super::memcheck_xml`].
//!
//! The reader is tolerant as §5.6 asks: unknown elements are skipped, stray top-level
//! `<stack>` and `<suppression>` elements (3.19's `--track-fds` and `--gen-suppressions`
//! quirks) are ignored, and the FishyValue `<what>` with a newline inside is trimmed. What it
//! does not accept is XML that is not well formed: that is an error with its line number.
//!
//! XML is parsed by a small private tokenizer (elements, text, the five entities and numeric
//! character references, CDATA, comments, processing instructions); nesting is handled with an
//! explicit stack and limited to [`MAX_DEPTH`] levels (Valgrind's documents have 6), so a
//! hostile file cannot overflow ours, neither while parsing nor when the tree is dropped.

use crate::frame::Frame;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

/// A whole Memcheck XML document.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemcheckXml {
    pub protocol_version: u32,
    /// `<protocoltool>`: `memcheck` (helgrind and drd documents read too, kinds aside).
    pub tool: String,
    pub pid: i64,
    pub ppid: i64,
    /// `<argv>`: the program (`<exe>`) then its arguments.
    pub argv: Vec<String>,
    /// `<preamble>` lines.
    pub preamble: Vec<String>,
    /// Every `<error>`, in document order (leaks after the FINISHED status).
    pub errors: Vec<XmlError>,
    /// `<errorcounts>`: (count, unique).
    pub error_counts: Vec<(u64, u64)>,
    /// `<suppcounts>`: (count, suppression name).
    pub supp_counts: Vec<(u64, String)>,
    pub fatal_signal: Option<FatalSignal>,
}

/// One `<error>`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XmlError {
    pub unique: u64,
    pub tid: u64,
    /// `InvalidRead`, `Leak_DefinitelyLost`, ...
    pub kind: String,
    /// The headline: `<what>`, or `<xwhat><text>` for leaks.
    pub what: String,
    /// `<leakedbytes>` and `<leakedblocks>` (leak kinds only).
    pub leak: Option<Leak>,
    /// The primary stack, innermost frame first.
    pub stack: Vec<Frame>,
    /// What follows the primary stack, in order: address descriptions and their stacks.
    pub aux: Vec<Aux>,
}

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Leak {
    pub bytes: u64,
    pub blocks: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Aux {
    /// `<auxwhat>` text, or the `<text>` of an `<xauxwhat>`.
    What(String),
    Stack(Vec<Frame>),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FatalSignal {
    pub tid: u64,
    pub signo: i32,
    pub signame: String,
    pub event: Option<String>,
    pub stack: Vec<Frame>,
}

impl XmlError {
    /// Whether this is a leak record (`Leak_*`).
    pub fn is_leak(&self) -> bool {
        self.kind.starts_with("Leak_")
    }
}

/// Why a document could not be read, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line of the problem.
    pub line: usize,
    pub kind: ParseErrorKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseErrorKind {
    NotUtf8,
    /// Malformed XML: what the tokenizer expected there.
    Syntax(&'static str),
    /// `</b>` closing `<a>`.
    Mismatched {
        open: String,
        close: String,
    },
    /// The root element is not `<valgrindoutput>`.
    NotValgrindOutput(String),
    /// Elements nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// A numeric element that does not hold a number.
    BadNumber {
        element: &'static str,
        value: String,
    },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: ", self.line)?;
        match &self.kind {
            ParseErrorKind::NotUtf8 => f.write_str("not valid UTF-8"),
            ParseErrorKind::Syntax(what) => write!(f, "malformed XML: expected {what}"),
            ParseErrorKind::Mismatched { open, close } => {
                write!(f, "malformed XML: </{close}> closes <{open}>")
            }
            ParseErrorKind::NotValgrindOutput(root) => {
                write!(f, "root element is <{root}>, not <valgrindoutput>")
            }
            ParseErrorKind::TooDeep => {
                write!(f, "elements nested deeper than {MAX_DEPTH} levels")
            }
            ParseErrorKind::BadNumber { element, value } => {
                write!(f, "<{element}> holds `{value}`, not a number")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ParseError {}

/// Deepest element nesting accepted.
pub const MAX_DEPTH: usize = 64;

/// An element of the document tree: name, the line it starts on, children.
#[derive(Debug, Default)]
struct Element {
    name: String,
    line: usize,
    children: Vec<Node>,
}

#[derive(Debug)]
enum Node {
    Element(Element),
    Text(String),
}

impl Element {
    fn elements(&self) -> impl Iterator<Item = &Element> {
        self.children.iter().filter_map(|n| match n {
            Node::Element(e) => Some(e),
            Node::Text(_) => None,
        })
    }

    fn child(&self, name: &str) -> Option<&Element> {
        self.elements().find(|e| e.name == name)
    }

    /// All text inside, concatenated (entities already decoded).
    fn text(&self) -> String {
        let mut s = String::new();
        for n in &self.children {
            match n {
                Node::Text(t) => s.push_str(t),
                Node::Element(e) => s.push_str(&e.text()),
            }
        }
        s
    }

    fn child_text(&self, name: &str) -> Option<String> {
        self.child(name).map(|e| e.text().trim().to_string())
    }

    fn number(&self, name: &'static str) -> Result<Option<u64>, ParseError> {
        let Some(e) = self.child(name) else {
            return Ok(None);
        };
        let t = e.text();
        let t = t.trim();
        let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => t.parse::<u64>().ok(),
        };
        parsed.map(Some).ok_or_else(|| ParseError {
            line: e.line,
            kind: ParseErrorKind::BadNumber {
                element: name,
                value: t.chars().take(40).collect(),
            },
        })
    }

    fn signed(&self, name: &'static str) -> Result<i64, ParseError> {
        let Some(e) = self.child(name) else {
            return Ok(0);
        };
        let t = e.text();
        t.trim().parse::<i64>().map_err(|_| ParseError {
            line: e.line,
            kind: ParseErrorKind::BadNumber {
                element: name,
                value: t.trim().chars().take(40).collect(),
            },
        })
    }
}

/// Reads a Memcheck XML document.
pub fn parse(bytes: &[u8]) -> Result<MemcheckXml, ParseError> {
    let text = core::str::from_utf8(bytes).map_err(|e| ParseError {
        line: 1 + bytes[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count(),
        kind: ParseErrorKind::NotUtf8,
    })?;
    let root = tree(text)?;
    if root.name != "valgrindoutput" {
        return Err(ParseError {
            line: root.line,
            kind: ParseErrorKind::NotValgrindOutput(root.name.clone()),
        });
    }
    let mut doc = MemcheckXml {
        protocol_version: root.number("protocolversion")?.unwrap_or(0) as u32,
        tool: root.child_text("protocoltool").unwrap_or_default(),
        pid: root.signed("pid")?,
        ppid: root.signed("ppid")?,
        ..MemcheckXml::default()
    };
    if let Some(pre) = root.child("preamble") {
        doc.preamble = pre.elements().map(|l| l.text()).collect();
    }
    if let Some(argv) = root.child("args").and_then(|a| a.child("argv")) {
        doc.argv = argv
            .elements()
            .filter(|e| e.name == "exe" || e.name == "arg")
            .map(|e| e.text())
            .collect();
    }
    for e in root.elements() {
        match e.name.as_str() {
            "error" => doc.errors.push(error(e)?),
            "errorcounts" => {
                for p in e.elements().filter(|p| p.name == "pair") {
                    doc.error_counts.push((
                        p.number("count")?.unwrap_or(0),
                        p.number("unique")?.unwrap_or(0),
                    ));
                }
            }
            "suppcounts" => {
                for p in e.elements().filter(|p| p.name == "pair") {
                    doc.supp_counts.push((
                        p.number("count")?.unwrap_or(0),
                        p.child_text("name").unwrap_or_default(),
                    ));
                }
            }
            "fatal_signal" => {
                doc.fatal_signal = Some(FatalSignal {
                    tid: e.number("tid")?.unwrap_or(0),
                    signo: e.signed("signo")? as i32,
                    signame: e.child_text("signame").unwrap_or_default(),
                    event: e.child_text("event"),
                    stack: e.child("stack").map(stack).unwrap_or_default(),
                })
            }
            _ => {}
        }
    }
    Ok(doc)
}

fn error(e: &Element) -> Result<XmlError, ParseError> {
    let mut err = XmlError {
        unique: e.number("unique")?.unwrap_or(0),
        tid: e.number("tid")?.unwrap_or(0),
        kind: e.child_text("kind").unwrap_or_default(),
        ..XmlError::default()
    };
    let mut primary = true;
    for c in e.elements() {
        match c.name.as_str() {
            // The FishyValue quirk puts a newline inside <what>.
            "what" => err.what = c.text().trim().to_string(),
            "xwhat" => {
                err.what = c.child_text("text").unwrap_or_default();
                let bytes = c.number("leakedbytes")?;
                let blocks = c.number("leakedblocks")?;
                if bytes.is_some() || blocks.is_some() {
                    err.leak = Some(Leak {
                        bytes: bytes.unwrap_or(0),
                        blocks: blocks.unwrap_or(0),
                    });
                }
            }
            "stack" if primary => {
                err.stack = stack(c);
                primary = false;
            }
            "stack" => err.aux.push(Aux::Stack(stack(c))),
            "auxwhat" => err.aux.push(Aux::What(c.text().trim().to_string())),
            "xauxwhat" => err
                .aux
                .push(Aux::What(c.child_text("text").unwrap_or_default())),
            _ => {}
        }
    }
    Ok(err)
}

fn stack(e: &Element) -> Vec<Frame> {
    e.elements()
        .filter(|f| f.name == "frame")
        .map(|f| Frame {
            ip: f
                .child_text("ip")
                .and_then(|t| {
                    let t = t.trim_start_matches("0x").trim_start_matches("0X");
                    u64::from_str_radix(t, 16).ok()
                })
                .unwrap_or(0),
            function: f.child_text("fn"),
            mangled: None,
            file: f.child_text("file"),
            dir: f.child_text("dir"),
            line: f
                .child_text("line")
                .and_then(|l| l.parse().ok())
                .unwrap_or(0),
            object: f.child_text("obj"),
        })
        .collect()
}

/// Parses the document into its root element.
fn tree(text: &str) -> Result<Element, ParseError> {
    let b = text.as_bytes();
    let mut pos = 0usize;
    let mut line = 1usize;
    // Open elements; index 0 is a synthetic document node.
    let mut stack: Vec<Element> = alloc::vec![Element::default()];
    let err = |line: usize, what: &'static str| ParseError {
        line,
        kind: ParseErrorKind::Syntax(what),
    };
    let advance = |from: usize, to: usize, line: &mut usize| {
        *line += b[from..to].iter().filter(|&&c| c == b'\n').count();
        to
    };
    while pos < b.len() {
        if b[pos] != b'<' {
            let end = b[pos..]
                .iter()
                .position(|&c| c == b'<')
                .map_or(b.len(), |i| pos + i);
            let raw = &text[pos..end];
            let start_line = line;
            pos = advance(pos, end, &mut line);
            if stack.len() > 1 {
                let decoded = decode(raw).ok_or_else(|| err(start_line, "a known entity"))?;
                if let Some(top) = stack.last_mut() {
                    top.children.push(Node::Text(decoded));
                }
            } else if !raw.trim().is_empty() {
                return Err(err(start_line, "markup outside the root element"));
            }
            continue;
        }
        let rest = &text[pos..];
        let (skip_to, what) = if rest.starts_with("<?") {
            (rest.find("?>").map(|i| i + 2), "`?>`")
        } else if rest.starts_with("<!--") {
            (rest.find("-->").map(|i| i + 3), "`-->`")
        } else if rest.starts_with("<![CDATA[") {
            let end = rest.find("]]>");
            if let (Some(end), Some(top)) = (end, stack.last_mut()) {
                top.children.push(Node::Text(rest[9..end].to_string()));
            }
            (end.map(|i| i + 3), "`]]>`")
        } else if rest.starts_with("<!") {
            (rest.find('>').map(|i| i + 1), "`>`")
        } else {
            (None, "")
        };
        if !what.is_empty() {
            let Some(n) = skip_to else {
                return Err(err(line, what));
            };
            pos = advance(pos, pos + n, &mut line);
            continue;
        }
        let Some(close) = rest.find('>') else {
            return Err(err(line, "`>` ending a tag"));
        };
        let tag = &rest[1..close];
        let tag_line = line;
        pos = advance(pos, pos + close + 1, &mut line);
        if let Some(name) = tag.strip_prefix('/') {
            let name = name.trim();
            if stack.len() < 2 {
                return Err(err(tag_line, "an opening tag before a closing one"));
            }
            let done = stack.pop().unwrap_or_default();
            if done.name != name {
                return Err(ParseError {
                    line: tag_line,
                    kind: ParseErrorKind::Mismatched {
                        open: done.name,
                        close: name.to_string(),
                    },
                });
            }
            if let Some(parent) = stack.last_mut() {
                parent.children.push(Node::Element(done));
            }
            continue;
        }
        let self_closing = tag.ends_with('/');
        let tag = tag.trim_end_matches('/');
        let name_end = tag
            .find(|c: char| c.is_ascii_whitespace())
            .unwrap_or(tag.len());
        let name = &tag[..name_end];
        if name.is_empty() {
            return Err(err(tag_line, "an element name after `<`"));
        }
        let el = Element {
            name: name.to_string(),
            line: tag_line,
            children: Vec::new(),
        };
        if self_closing {
            if let Some(top) = stack.last_mut() {
                top.children.push(Node::Element(el));
            }
        } else {
            if stack.len() > MAX_DEPTH {
                return Err(ParseError {
                    line: tag_line,
                    kind: ParseErrorKind::TooDeep,
                });
            }
            stack.push(el);
        }
    }
    if stack.len() > 1 {
        return Err(err(line, "closing tags for every open element"));
    }
    let doc = stack.pop().unwrap_or_default();
    doc.children
        .into_iter()
        .find_map(|n| match n {
            Node::Element(e) => Some(e),
            Node::Text(_) => None,
        })
        .ok_or_else(|| err(line, "a root element"))
}

/// Text with entity and character references replaced; `None` for an unknown entity.
fn decode(raw: &str) -> Option<String> {
    if !raw.contains('&') {
        return Some(raw.to_string());
    }
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        rest = &rest[i + 1..];
        let end = rest.find(';')?;
        let name = &rest[..end];
        let c = match name {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = if let Some(h) = name.strip_prefix("#x").or(name.strip_prefix("#X")) {
                    u32::from_str_radix(h, 16).ok()?
                } else {
                    name.strip_prefix('#')?.parse::<u32>().ok()?
                };
                char::from_u32(code)?
            }
        };
        out.push(c);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(name: &str) -> Vec<u8> {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/reference/examples/memcheck/"
        );
        std::fs::read(alloc::format!("{dir}{name}")).expect("reference example")
    }

    #[test]
    fn reads_every_error_of_a_real_report() {
        let doc = parse(&example("mc_errors.plain.xml")).unwrap();
        assert_eq!(doc.protocol_version, 4);
        assert_eq!(doc.tool, "memcheck");
        assert_eq!(doc.pid, 18281);
        assert_eq!(doc.argv, ["./mc_errors"]);
        let kinds: Vec<&str> = doc.errors.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "InvalidWrite",
                "InvalidRead",
                "InvalidRead",
                "InvalidFree",
                "UninitCondition",
                "UninitValue",
                "SyscallParam",
                "FishyValue",
                "InvalidFree",
                "Leak_PossiblyLost",
                "Leak_DefinitelyLost",
                "Leak_DefinitelyLost"
            ]
        );
        let first = &doc.errors[0];
        assert_eq!(first.what, "Invalid write of size 4");
        assert_eq!(first.stack[0].function.as_deref(), Some("main"));
        assert_eq!(first.stack[0].line, 24);
        assert_eq!(first.stack[0].dir.as_deref(), Some("/src/fmt"));
        assert_eq!(first.stack[0].ip, 0x109245);
        assert_eq!(
            first.aux[0],
            Aux::What("Address 0x4a40068 is 0 bytes after a block of size 40 alloc'd".into())
        );
        assert!(matches!(&first.aux[1], Aux::Stack(s) if s.len() == 2));
        // The FishyValue quirk: newline inside <what>.
        assert!(doc.errors[7].what.ends_with("value: -5"));
        let leak = &doc.errors[10];
        assert_eq!(
            leak.leak,
            Some(Leak {
                bytes: 80,
                blocks: 1
            })
        );
        assert!(leak.what.starts_with("80 (16 direct, 64 indirect) bytes"));
        assert_eq!(leak.stack[1].function.as_deref(), Some("leak_indirect"));
        assert_eq!(doc.error_counts.len(), 9);
        assert_eq!(doc.error_counts[0], (1, 8));
    }

    #[test]
    fn ignores_top_level_suppressions_and_reads_supp_counts() {
        let doc = parse(&example("mc_errors.gen-suppressions-all.xml")).unwrap();
        assert!(doc.errors.iter().all(|e| !e.kind.is_empty()));
        let doc = parse(&example("mc_errors.with-supp.xml")).unwrap();
        assert!(!doc.supp_counts.is_empty());
    }

    #[test]
    fn reads_a_fatal_signal() {
        let doc = parse(&example(
            "mc_crash.fatal_signal.track-fds.logfilequalifier.xml",
        ))
        .unwrap();
        let sig = doc.fatal_signal.expect("fatal signal");
        assert_eq!(sig.signame, "SIGSEGV");
        assert!(!sig.stack.is_empty());
    }

    #[test]
    fn entities_are_decoded() {
        let doc = parse(
            b"<valgrindoutput><error><kind>X</kind><what>a &lt;b&gt; &amp; &#65;&#x42;</what></error></valgrindoutput>",
        )
        .unwrap();
        assert_eq!(doc.errors[0].what, "a <b> & AB");
    }

    #[test]
    fn malformed_documents_are_errors_with_lines() {
        let e = parse(b"<valgrindoutput>\n<error>\n</kind>").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.to_string().contains("</kind> closes <error>"), "{e}");
        let e = parse(b"<valgrindoutput>\n<error>").unwrap_err();
        assert!(matches!(e.kind, ParseErrorKind::Syntax(_)));
        let e = parse(b"<html></html>").unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::NotValgrindOutput("html".into()));
        let e = parse(b"<valgrindoutput><pid>x1</pid></valgrindoutput>").unwrap_err();
        assert!(matches!(
            e.kind,
            ParseErrorKind::BadNumber { element: "pid", .. }
        ));
        assert!(parse(b"<valgrindoutput><what>&bogus;</what></valgrindoutput>").is_err());
        let deep = "<a>".repeat(100_000);
        let e = parse(format!("<valgrindoutput>{deep}").as_bytes()).unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::TooDeep);
    }
}
