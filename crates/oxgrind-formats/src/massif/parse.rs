//! The massif.out reader: accepts what ms_print accepts (formats.md §1.7), into the model.
//!
//! Like ms_print it skips blank lines and comment lines, reads any number of `desc:` lines,
//! and ignores indentation and extra spaces in tree lines. Unlike ms_print it keeps a `#`
//! inside free text (desc, cmd, labels), so that parse then write gives the file back byte
//! for byte even when a function or file name contains `#`; the renderer
//! ([`super::ms_print`]) applies ms_print's comment stripping itself. Numbers must be
//! integers: a file where they are not is reported, not guessed at.
//!
//! Trees are read with an explicit stack: a hostile file with a very deep tree must give a
//! model or an error, not a stack overflow.

use super::{MassifFile, Snapshot, SnapshotKind, TreeNode};
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

/// Why a massif.out file could not be read, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number in the file (the line after the last one for end of file).
    pub line: usize,
    pub kind: ParseErrorKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseErrorKind {
    /// The line is not UTF-8 (the model holds `String`s).
    NotUtf8,
    /// A line of the wrong kind: `expected` says what the grammar wanted there, `found` is
    /// the line (shortened) or `None` at end of file.
    Expected {
        expected: &'static str,
        found: Option<String>,
    },
    /// `field=value` where value is not an integer of the field's type.
    BadNumber { field: &'static str, value: String },
    /// `heap_tree=` with something other than `empty`, `detailed` or `peak`.
    BadHeapTree { value: String },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: ", self.line)?;
        match &self.kind {
            ParseErrorKind::NotUtf8 => f.write_str("not valid UTF-8"),
            ParseErrorKind::Expected {
                expected,
                found: Some(found),
            } => {
                write!(f, "expected {expected}, found `{found}`")
            }
            ParseErrorKind::Expected {
                expected,
                found: None,
            } => {
                write!(f, "expected {expected}, found end of file")
            }
            ParseErrorKind::BadNumber { field, value } => {
                write!(f, "expected an integer after `{field}=`, found `{value}`")
            }
            ParseErrorKind::BadHeapTree { value } => write!(
                f,
                "expected `empty`, `detailed` or `peak` after `heap_tree=`, found `{value}`"
            ),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ParseError {}

/// Reads a massif.out file (`&str`, `String`, `&[u8]`, `Vec<u8>`...).
pub fn parse<I: AsRef<[u8]> + ?Sized>(input: &I) -> Result<MassifFile, ParseError> {
    Parser {
        lines: Lines::new(input.as_ref()),
    }
    .file()
}

/// A significant line: its number, the full text (without `\n`) and the part before any `#`.
struct Line<'a> {
    number: usize,
    full: &'a str,
    code: &'a str,
}

struct Lines<'a> {
    rest: &'a [u8],
    number: usize,
}

impl<'a> Lines<'a> {
    fn new(data: &'a [u8]) -> Self {
        Lines {
            rest: data,
            number: 0,
        }
    }

    /// The next line that is not blank once a `#` comment is removed (ms_print's `get_line`).
    fn next(&mut self) -> Result<Option<Line<'a>>, ParseError> {
        while !self.rest.is_empty() {
            let (raw, rest) = match self.rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&self.rest[..i], &self.rest[i + 1..]),
                None => (self.rest, &[][..]),
            };
            self.rest = rest;
            self.number += 1;
            let full = core::str::from_utf8(raw).map_err(|_| ParseError {
                line: self.number,
                kind: ParseErrorKind::NotUtf8,
            })?;
            let code = full.split('#').next().unwrap_or("");
            if !code.bytes().all(super::perl::is_space) {
                return Ok(Some(Line {
                    number: self.number,
                    full,
                    code,
                }));
            }
        }
        Ok(None)
    }

    fn eof_line(&self) -> usize {
        self.number + 1
    }
}

struct Parser<'a> {
    lines: Lines<'a>,
}

fn shorten(s: &str) -> String {
    const MAX: usize = 80;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => {
            let mut t = s[..i].to_string();
            t.push_str("...");
            t
        }
        None => s.to_string(),
    }
}

fn trim_space(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_ascii() && super::perl::is_space(c as u8))
}

impl<'a> Parser<'a> {
    fn expected(&self, expected: &'static str, line: Option<&Line<'_>>) -> ParseError {
        match line {
            Some(l) => ParseError {
                line: l.number,
                kind: ParseErrorKind::Expected {
                    expected,
                    found: Some(shorten(l.full)),
                },
            },
            None => ParseError {
                line: self.lines.eof_line(),
                kind: ParseErrorKind::Expected {
                    expected,
                    found: None,
                },
            },
        }
    }

    fn file(mut self) -> Result<MassifFile, ParseError> {
        let mut file = MassifFile::default();
        let mut descs: Vec<&str> = Vec::new();
        let mut line = self.lines.next()?;
        while let Some(l) = &line {
            let Some(rest) = l.full.strip_prefix("desc:") else {
                break;
            };
            descs.push(rest.strip_prefix(' ').unwrap_or(rest));
            line = self.lines.next()?;
        }
        file.desc = descs.join("\n");

        let cmd = line.as_ref().and_then(|l| l.full.strip_prefix("cmd:"));
        let Some(cmd) = cmd else {
            return Err(self.expected("a `desc:` or `cmd:` line", line.as_ref()));
        };
        file.cmd = cmd
            .trim_start_matches(|c: char| c.is_ascii() && super::perl::is_space(c as u8))
            .to_string();

        let line = self.lines.next()?;
        let Some(unit) = line
            .as_ref()
            .and_then(|l| l.full.strip_prefix("time_unit:"))
        else {
            return Err(self.expected("a `time_unit:` line", line.as_ref()));
        };
        file.time_unit = unit
            .trim_start_matches(|c: char| c.is_ascii() && super::perl::is_space(c as u8))
            .to_string();

        let mut line = self.lines.next()?;
        while let Some(l) = line {
            self.field(Some(&l), "snapshot", "a `snapshot=` line")?
                .parse::<u64>()
                .map_err(|_| ParseError {
                    line: l.number,
                    kind: ParseErrorKind::BadNumber {
                        field: "snapshot",
                        value: shorten(l.code),
                    },
                })?;
            let time = self.number::<i64>("time", "a `time=` line")?;
            let mem_heap_b = self.number::<u64>("mem_heap_B", "a `mem_heap_B=` line")?;
            let mem_heap_extra_b =
                self.number::<u64>("mem_heap_extra_B", "a `mem_heap_extra_B=` line")?;
            let mem_stacks_b = self.number::<u64>("mem_stacks_B", "a `mem_stacks_B=` line")?;
            let tl = self.lines.next()?;
            let value = self.field(tl.as_ref(), "heap_tree", "a `heap_tree=` line")?;
            let kind = match value {
                "empty" => SnapshotKind::Empty,
                "detailed" => SnapshotKind::Detailed,
                "peak" => SnapshotKind::Peak,
                _ => {
                    return Err(ParseError {
                        // `field` succeeded, so the line exists.
                        line: tl.as_ref().map_or(0, |l| l.number),
                        kind: ParseErrorKind::BadHeapTree {
                            value: shorten(value),
                        },
                    });
                }
            };
            let tree = if kind == SnapshotKind::Empty {
                None
            } else {
                Some(self.tree()?)
            };
            file.snapshots.push(Snapshot {
                time,
                mem_heap_b,
                mem_heap_extra_b,
                mem_stacks_b,
                kind,
                tree,
            });
            line = self.lines.next()?;
        }
        Ok(file)
    }

    /// The trimmed value of a `key=value` line (comment removed).
    fn field(
        &self,
        line: Option<&Line<'a>>,
        key: &'static str,
        expected: &'static str,
    ) -> Result<&'a str, ParseError> {
        let value = line
            .and_then(|l| l.code.strip_prefix(key))
            .and_then(|rest| rest.strip_prefix('='));
        match value {
            Some(v) => Ok(trim_space(v)),
            None => Err(self.expected(expected, line)),
        }
    }

    fn number<T: core::str::FromStr>(
        &mut self,
        key: &'static str,
        expected: &'static str,
    ) -> Result<T, ParseError> {
        let line = self.lines.next()?;
        let value = self.field(line.as_ref(), key, expected)?;
        value.parse::<T>().map_err(|_| ParseError {
            line: line.as_ref().map_or(0, |l| l.number),
            kind: ParseErrorKind::BadNumber {
                field: key,
                value: shorten(value),
            },
        })
    }

    /// One tree node line: `\s*n<children>:\s*<bytes><label>`.
    fn node(&mut self) -> Result<(TreeNode, u64), ParseError> {
        const WHAT: &str = "a tree node line `nK: BYTES LABEL`";
        let line = self.lines.next()?;
        let Some(l) = line.as_ref() else {
            return Err(self.expected(WHAT, None));
        };
        let bad = || self.expected(WHAT, Some(l));
        let s = l
            .full
            .trim_start_matches(|c: char| c.is_ascii() && super::perl::is_space(c as u8));
        let s = s.strip_prefix('n').ok_or_else(bad)?;
        let digits = s.bytes().take_while(u8::is_ascii_digit).count();
        let (count, s) = s.split_at(digits);
        let s = s.strip_prefix(':').ok_or_else(bad)?;
        let s = s.trim_start_matches(|c: char| c.is_ascii() && super::perl::is_space(c as u8));
        let digits2 = s.bytes().take_while(u8::is_ascii_digit).count();
        let (bytes, label) = s.split_at(digits2);
        if digits == 0 || digits2 == 0 {
            return Err(bad());
        }
        let number = |field: &'static str, v: &str| {
            v.parse::<u64>().map_err(|_| ParseError {
                line: l.number,
                kind: ParseErrorKind::BadNumber {
                    field,
                    value: shorten(v),
                },
            })
        };
        let children = number("n", count)?;
        let bytes = number("bytes", bytes)?;
        let label = label.strip_prefix(' ').unwrap_or(label).to_string();
        Ok((
            TreeNode {
                bytes,
                label,
                children: Vec::new(),
            },
            children,
        ))
    }

    /// A whole tree, preorder; every node is followed by exactly its children.
    fn tree(&mut self) -> Result<TreeNode, ParseError> {
        // (node, children still to read)
        let mut stack: Vec<(TreeNode, u64)> = alloc::vec![self.node()?];
        loop {
            // The root is only popped on return, so the stack is never empty here.
            let Some(top) = stack.last_mut() else {
                return Ok(TreeNode::default());
            };
            if top.1 > 0 {
                top.1 -= 1;
                let child = self.node()?;
                stack.push(child);
                continue;
            }
            if stack.len() == 1 {
                return Ok(stack.pop().map(|(n, _)| n).unwrap_or_default());
            }
            if let Some((done, _)) = stack.pop() {
                if let Some(parent) = stack.last_mut() {
                    parent.0.children.push(done);
                }
            }
        }
    }
}
