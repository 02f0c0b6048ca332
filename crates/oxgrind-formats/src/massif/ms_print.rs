//! `ms_print`: a massif.out file rendered exactly as Valgrind 3.19's `/usr/bin/ms_print` prints
//! it (formats.md §2), byte for byte, quirks included.
//!
//! Users diff ms_print outputs and scripts scrape them, so "close" is not good enough: the
//! tests compare this renderer with the real Perl script on Valgrind's files and on
//! synthetic ones. To get there the renderer reads the file the way ms_print does
//! ([`render_bytes`]): line by line, `#` to end of line is a comment, values are kept as the
//! raw text Perl would print (`time=5  ` prints with its trailing spaces), and arithmetic
//! follows Perl's integer/double rules (see `perl.rs`), which shows on huge byte counts.
//! [`render`] prints a model: it is ms_print run on what [`super::write`] writes for it.
//!
//! Where Perl would print a warning and carry on with a made-up value (a `time=` that is not a
//! number), this renderer reports an error instead: such a file is corrupt. Where Perl dies
//! after having printed part of its output, [`RenderError::partial_output`] holds that part.
//! The one place we are knowingly more lenient: Perl runs out of memory when a snapshot's
//! time is astronomically beyond the last one (it grows the graph array to that column); we
//! simply do not draw invisible columns.
//!
//! The command line (`[options] massif-out-file`) is parsed by [`parse_args`], so the launcher
//! only reads the file and prints.

use super::perl::{self, is_space, numify, PerlNum};
use super::MassifFile;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

/// The version ms_print reports (`--version`).
pub const VERSION: &str = "3.19.0";

/// ms_print's options.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// `--threshold`: tree nodes below this percentage of the snapshot total are folded into
    /// an "in N+ places" line. 0 prints every node. Default 1.0.
    pub threshold: f64,
    /// `--x`: graph width in columns, 4..=1000. Default 72.
    pub x: usize,
    /// `--y`: graph height in rows, 4..=1000. Default 20.
    pub y: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            threshold: 1.0,
            x: 72,
            y: 20,
        }
    }
}

/// Why ms_print would have died, where, and what it had printed by then.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderError {
    /// 1-based line of the input file, when the problem is on a line.
    pub line: Option<usize>,
    pub kind: RenderErrorKind,
    /// What ms_print prints to stdout before dying (the header, when the problem is only
    /// found while drawing the graph); empty for errors found while reading.
    pub partial_output: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum RenderErrorKind {
    /// No `cmd:` line after the `desc:` lines.
    MissingCmd,
    /// No `time_unit:` line after `cmd:`.
    MissingTimeUnit,
    /// Expected `field=...`; `found` is the line, or `None` at end of file.
    ExpectedField {
        field: &'static str,
        found: Option<String>,
    },
    /// A `time=`/`mem_*=` value that is not a number.
    NotANumber { field: &'static str, value: String },
    /// `heap_tree=` value that is neither `empty` nor contains `detailed`/`peak`.
    BadHeapTree { value: String },
    /// A line that is not `nK: BYTES LABEL` where a tree node must be.
    ExpectedTreeNode { found: Option<String> },
    /// A tree node bigger than its snapshot's total (ms_print dies on this).
    NodeLargerThanTotal,
    /// The file has no snapshot.
    NoSnapshots,
    /// The last snapshot's time is negative.
    NegativeEndTime,
    /// `time_unit:` is not `i`, `ms` or `B`.
    BadTimeUnit { unit: String },
    /// A snapshot lands on a graph column Perl cannot index (a negative time far before 0).
    GraphColumnOutOfRange { column: i128 },
    /// Options outside ms_print's ranges (x or y not in 4..=1000, threshold not in 0..=100).
    BadOptions,
}

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line {
            write!(f, "line {line}: ")?;
        }
        let found = |f: &mut fmt::Formatter<'_>, found: &Option<String>| match found {
            Some(l) => write!(f, ", found `{l}`"),
            None => f.write_str(", found end of file"),
        };
        match &self.kind {
            RenderErrorKind::MissingCmd => f.write_str("expected a `cmd:` line"),
            RenderErrorKind::MissingTimeUnit => f.write_str("expected a `time_unit:` line"),
            RenderErrorKind::ExpectedField { field, found: fd } => {
                write!(f, "expected a `{field}=` line")?;
                found(f, fd)
            }
            RenderErrorKind::NotANumber { field, value } => {
                write!(f, "expected a number after `{field}=`, found `{value}`")
            }
            RenderErrorKind::BadHeapTree { value } => {
                write!(
                    f,
                    "expected `empty`, `detailed` or `peak` after `heap_tree=`, found `{value}`"
                )
            }
            RenderErrorKind::ExpectedTreeNode { found: fd } => {
                f.write_str("expected a tree node line `nK: BYTES LABEL`")?;
                found(f, fd)
            }
            RenderErrorKind::NodeLargerThanTotal => {
                f.write_str("tree node has more bytes than its snapshot's total")
            }
            RenderErrorKind::NoSnapshots => f.write_str("no snapshots in the file"),
            RenderErrorKind::NegativeEndTime => f.write_str("the last snapshot's time is negative"),
            RenderErrorKind::BadTimeUnit { unit } => {
                write!(f, "bad time_unit `{unit}` (expected i, ms or B)")
            }
            RenderErrorKind::GraphColumnOutOfRange { column } => {
                write!(
                    f,
                    "a snapshot time maps to graph column {column}, which ms_print cannot draw"
                )
            }
            RenderErrorKind::BadOptions => {
                f.write_str("options out of range (--x and --y: 4..1000, --threshold: 0..100)")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for RenderError {}

/// ms_print's output for the file [`super::write`] produces from `file`.
///
/// `arguments` are what the user gave ms_print, printed on the `ms_print arguments:` line
/// (ms_print prints its own command line there, file name included).
pub fn render<S: AsRef<str>>(
    file: &MassifFile,
    options: &Options,
    arguments: &[S],
) -> Result<String, RenderError> {
    let text = super::write(file);
    let out = render_bytes(text.as_bytes(), options, arguments)?;
    // Everything came from `String`s and only whole lines or ASCII-delimited parts are
    // dropped, so this is UTF-8; be lenient anyway rather than panic.
    Ok(String::from_utf8(out)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

/// ms_print's output for a massif.out file given as bytes (the `oxgrind ms_print` path).
pub fn render_bytes<S: AsRef<str>>(
    input: &[u8],
    options: &Options,
    arguments: &[S],
) -> Result<Vec<u8>, RenderError> {
    let valid = |v: usize| (4..=1000).contains(&v);
    if !valid(options.x) || !valid(options.y) || !(0.0..=100.0).contains(&options.threshold) {
        return Err(RenderError {
            line: None,
            kind: RenderErrorKind::BadOptions,
            partial_output: Vec::new(),
        });
    }
    let mut args = String::new();
    for a in arguments {
        args.push(' ');
        args.push_str(a.as_ref());
    }
    let input = read_input(input, options)?;
    let mut out = Vec::with_capacity(input.snapshot_text.len() + 4096);
    print_header(&mut out, &input, &args);
    match draw_graph(&mut out, &input, options) {
        Ok(()) => {}
        Err(kind) => {
            return Err(RenderError {
                line: None,
                kind,
                partial_output: out,
            })
        }
    }
    out.extend_from_slice(&input.snapshot_text);
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Reading, as ms_print's read_input_file does.

const FANCY: &[u8] =
    b"--------------------------------------------------------------------------------\n";

/// A line as ms_print's `get_line` returns it: the text before any `#` (without the `\n`),
/// and whether the line ended with `\n` (which ms_print keeps).
#[derive(Copy, Clone)]
struct RawLine<'a> {
    number: usize,
    code: &'a [u8],
    newline: bool,
}

struct Reader<'a> {
    rest: &'a [u8],
    number: usize,
}

impl<'a> Reader<'a> {
    fn get_line(&mut self) -> Option<RawLine<'a>> {
        while !self.rest.is_empty() {
            let (raw, newline, rest) = match self.rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&self.rest[..i], true, &self.rest[i + 1..]),
                None => (self.rest, false, &[][..]),
            };
            self.rest = rest;
            self.number += 1;
            let code = match raw.iter().position(|&b| b == b'#') {
                Some(i) => &raw[..i],
                None => raw,
            };
            if !code.iter().all(|&b| is_space(b)) {
                return Some(RawLine {
                    number: self.number,
                    code,
                    newline,
                });
            }
        }
        None
    }
}

fn lossy(b: &[u8]) -> String {
    const MAX: usize = 120;
    let s = String::from_utf8_lossy(&b[..b.len().min(MAX)]).into_owned();
    if b.len() > MAX {
        s + "..."
    } else {
        s
    }
}

/// What the graph needs from one snapshot.
struct SnapInfo {
    time: PerlNum,
    /// heap + extra + stacks, added as Perl adds them.
    total: PerlNum,
    /// `heap_tree=` is not `empty`.
    detailed: bool,
}

struct Input<'a> {
    desc: Vec<u8>,
    cmd: &'a [u8],
    time_unit: &'a [u8],
    snaps: Vec<SnapInfo>,
    /// Raw `snapshot=` value of the last `heap_tree=peak` snapshot.
    peak_num: Option<&'a [u8]>,
    /// The tables and trees, printed after the graph (ms_print's tmp file).
    snapshot_text: Vec<u8>,
}

fn strip_leading_space(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if !is_space(*first) {
            break;
        }
        s = rest;
    }
    s
}

fn err(line: usize, kind: RenderErrorKind) -> RenderError {
    RenderError {
        line: Some(line),
        kind,
        partial_output: Vec::new(),
    }
}

/// `printf("%Ns", s)`: right-aligned, never truncated.
fn pad_left(out: &mut Vec<u8>, s: &[u8], width: usize) {
    out.resize(out.len() + width.saturating_sub(s.len()), b' ');
    out.extend_from_slice(s);
}

fn table_row(out: &mut Vec<u8>, cols: [&[u8]; 6]) {
    const WIDTHS: [usize; 6] = [3, 14, 16, 16, 13, 12];
    for (i, (c, w)) in cols.iter().zip(WIDTHS).enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        pad_left(out, c, w);
    }
    out.push(b'\n');
}

fn read_input<'a>(data: &'a [u8], options: &Options) -> Result<Input<'a>, RenderError> {
    let mut r = Reader {
        rest: data,
        number: 0,
    };

    let mut desc = Vec::new();
    let mut line = r.get_line();
    while let Some(l) = line {
        let Some(rest) = l.code.strip_prefix(b"desc:") else {
            break;
        };
        desc.extend_from_slice(rest);
        if l.newline {
            desc.push(b'\n');
        }
        line = r.get_line();
    }
    // `/^cmd:\s*(.*)$/`: leading blanks (even the newline) go, the rest of the line stays.
    let cmd = match line.and_then(|l| l.code.strip_prefix(b"cmd:")) {
        Some(rest) => strip_leading_space(rest),
        None => return Err(err(r.number, RenderErrorKind::MissingCmd)),
    };
    let time_unit = match r
        .get_line()
        .and_then(|l| l.code.strip_prefix(b"time_unit:"))
    {
        Some(rest) => strip_leading_space(rest),
        None => return Err(err(r.number, RenderErrorKind::MissingTimeUnit)),
    };

    let mut text = Vec::new();
    let mut time_col = b"time(".to_vec();
    time_col.extend_from_slice(time_unit);
    time_col.push(b')');
    let mut header = FANCY.to_vec();
    table_row(
        &mut header,
        [
            b"n",
            &time_col,
            b"total(B)",
            b"useful-heap(B)",
            b"extra-heap(B)",
            b"stacks(B)",
        ],
    );
    header.extend_from_slice(FANCY);
    text.extend_from_slice(&header);

    let threshold = PerlNum::Num(options.threshold);
    let mut snaps = Vec::new();
    let mut peak_num = None;
    let mut line = r.get_line();
    while let Some(l) = line {
        let num = equals_field(r.number, Some(l), "snapshot")?;
        let time_raw = next_field(&mut r, "time")?;
        let heap_raw = next_field(&mut r, "mem_heap_B")?;
        let extra_raw = next_field(&mut r, "mem_heap_extra_B")?;
        let stacks_raw = next_field(&mut r, "mem_stacks_B")?;
        let time = number("time", time_raw)?;
        let heap = number("mem_heap_B", heap_raw)?;
        let extra = number("mem_heap_extra_B", extra_raw)?;
        let stacks = number("mem_stacks_B", stacks_raw)?;
        let total = heap.add(extra).add(stacks);
        let (tree, _) = next_field(&mut r, "heap_tree")?;

        let total_text = perl::commify(total.to_perl_string().as_bytes());
        table_row(
            &mut text,
            [
                num,
                &perl::commify(time_raw.0),
                &total_text,
                &perl::commify(heap_raw.0),
                &perl::commify(extra_raw.0),
                &perl::commify(stacks_raw.0),
            ],
        );
        let detailed = tree != b"empty";
        snaps.push(SnapInfo {
            time,
            total,
            detailed,
        });

        if !detailed {
            line = r.get_line();
        } else if contains(tree, b"detailed") || contains(tree, b"peak") {
            // ms_print matches `"(detailed|peak)"` unanchored, but only exactly "peak" is the
            // peak.
            if tree == b"peak" {
                peak_num = Some(num);
            }
            read_tree(&mut r, &mut text, total, threshold)?;
            line = r.get_line();
            if line.is_some() {
                text.extend_from_slice(&header);
            }
        } else {
            return Err(err(
                r.number,
                RenderErrorKind::BadHeapTree { value: lossy(tree) },
            ));
        }
    }
    Ok(Input {
        desc,
        cmd,
        time_unit,
        snaps,
        peak_num,
        snapshot_text: text,
    })
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// `equals_num_line`: the raw value of a `field=value` line (everything up to the newline).
fn equals_field<'a>(
    eof_line: usize,
    line: Option<RawLine<'a>>,
    field: &'static str,
) -> Result<&'a [u8], RenderError> {
    let Some(l) = line else {
        return Err(err(
            eof_line,
            RenderErrorKind::ExpectedField { field, found: None },
        ));
    };
    match l
        .code
        .strip_prefix(field.as_bytes())
        .and_then(|v| v.strip_prefix(b"="))
    {
        Some(v) => Ok(v),
        None => Err(err(
            l.number,
            RenderErrorKind::ExpectedField {
                field,
                found: Some(lossy(l.code)),
            },
        )),
    }
}

fn next_field<'a>(
    r: &mut Reader<'a>,
    field: &'static str,
) -> Result<(&'a [u8], usize), RenderError> {
    let line = r.get_line();
    Ok((equals_field(r.number, line, field)?, r.number))
}

/// The value of a numeric field; `(raw, line)` as [`next_field`] returns it.
fn number(field: &'static str, (raw, line): (&[u8], usize)) -> Result<PerlNum, RenderError> {
    match numify(raw) {
        (v, true) => Ok(v),
        (_, false) => Err(err(
            line,
            RenderErrorKind::NotANumber {
                field,
                value: lossy(raw),
            },
        )),
    }
}

/// One parsed `\s*n(\d+):\s*(\d+)(.*)` line.
struct Node<'a> {
    n_children: PerlNum,
    bytes_raw: &'a [u8],
    details: &'a [u8],
}

fn parse_node(code: &[u8]) -> Option<Node<'_>> {
    let s = strip_leading_space(code);
    let s = s.strip_prefix(b"n")?;
    let d = s.iter().take_while(|b| b.is_ascii_digit()).count();
    if d == 0 {
        return None;
    }
    let (count, s) = s.split_at(d);
    let s = strip_leading_space(s.strip_prefix(b":")?);
    let d2 = s.iter().take_while(|b| b.is_ascii_digit()).count();
    if d2 == 0 {
        return None;
    }
    let (bytes_raw, details) = s.split_at(d2);
    Some(Node {
        n_children: numify(count).0,
        bytes_raw,
        details,
    })
}

/// One pending call of ms_print's recursive `read_heap_tree`.
struct Frame {
    significant: bool,
    bytes: PerlNum,
    n_children: PerlNum,
    /// Children read so far.
    read: u64,
    n_insig: u64,
    insig_bytes: PerlNum,
    /// Length of this node's own prefix; the shared prefix buffer beyond it is the child
    /// midfix.
    base_len: usize,
}

/// ms_print's `read_heap_tree`, with an explicit stack instead of recursion (a deep tree in a
/// hostile file must not overflow ours).
fn read_tree(
    r: &mut Reader<'_>,
    out: &mut Vec<u8>,
    total: PerlNum,
    threshold: PerlNum,
) -> Result<(), RenderError> {
    let hundred = PerlNum::Int(100);
    let zero = PerlNum::Int(0);
    let mut prefix: Vec<u8> = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();

    // Reads one node line; prints it if significant; pushes its frame.
    let enter = |r: &mut Reader<'_>,
                 out: &mut Vec<u8>,
                 prefix: &mut Vec<u8>,
                 stack: &mut Vec<Frame>,
                 is_top: bool,
                 midfix: &[u8],
                 arrow: &[u8]|
     -> Result<(), RenderError> {
        let line = r.get_line();
        let node = match line {
            Some(l) => parse_node(l.code).ok_or_else(|| {
                err(
                    l.number,
                    RenderErrorKind::ExpectedTreeNode {
                        found: Some(lossy(l.code)),
                    },
                )
            })?,
            None => {
                return Err(err(
                    r.number,
                    RenderErrorKind::ExpectedTreeNode { found: None },
                ))
            }
        };
        let bytes = numify(node.bytes_raw).0;
        let perc = safe_div_0(hundred.mul(bytes), total);
        if !bytes.cmp(total).is_some_and(|o| o.is_le()) {
            return Err(err(r.number, RenderErrorKind::NodeLargerThanTotal));
        }
        let significant = is_top
            || threshold.eq(zero)
            || (!total.eq(zero)
                && bytes
                    .mul(hundred)
                    .div(total)
                    .is_some_and(|p| p.ge(threshold)));
        if significant {
            out.extend_from_slice(prefix);
            out.extend_from_slice(arrow);
            out.extend_from_slice(perl::fmt_f(perc, 5, 2, true).as_bytes());
            out.extend_from_slice(b"% (");
            out.extend_from_slice(&perl::commify(node.bytes_raw));
            out.extend_from_slice(b"B)");
            out.extend_from_slice(node.details);
            out.push(b'\n');
        }
        let base_len = prefix.len();
        prefix.extend_from_slice(midfix);
        stack.push(Frame {
            significant,
            bytes,
            n_children: node.n_children,
            read: 0,
            n_insig: 0,
            insig_bytes: zero,
            base_len,
        });
        Ok(())
    };

    enter(r, out, &mut prefix, &mut stack, true, b"", b"")?;
    while let Some(top) = stack.last_mut() {
        let i = PerlNum::Int(i128::from(top.read));
        if i.lt(top.n_children) {
            let last = i.add(PerlNum::Int(1)).eq(top.n_children);
            top.read += 1;
            let midfix: &[u8] = if last { b"  " } else { b"| " };
            enter(r, out, &mut prefix, &mut stack, false, midfix, b"->")?;
            continue;
        }
        let Some(done) = stack.pop() else { break };
        let result = if done.significant {
            if done.n_insig > 0 {
                let perc = safe_div_0(hundred.mul(done.insig_bytes), total);
                out.extend_from_slice(&prefix);
                out.extend_from_slice(b"->");
                out.extend_from_slice(perl::fmt_f(perc, 5, 2, true).as_bytes());
                out.extend_from_slice(b"% (");
                out.extend_from_slice(&perl::commify(done.insig_bytes.to_perl_string().as_bytes()));
                out.extend_from_slice(b"B) in ");
                out.extend_from_slice(done.n_insig.to_string().as_bytes());
                out.extend_from_slice(b"+ places, all below ms_print's threshold (");
                out.extend_from_slice(perl::fmt_f(threshold, 5, 2, true).as_bytes());
                out.extend_from_slice(b"%)\n");
                out.extend_from_slice(&prefix);
                out.push(b'\n');
            }
            if done.n_children.eq(zero) {
                out.extend_from_slice(&prefix);
                out.push(b'\n');
            }
            (0, zero)
        } else {
            (1, done.bytes)
        };
        prefix.truncate(done.base_len);
        if let Some(parent) = stack.last_mut() {
            parent.n_insig += result.0;
            parent.insig_bytes = parent.insig_bytes.add(result.1);
        }
    }
    Ok(())
}

/// `$y ? $x / $y : 0`.
fn safe_div_0(x: PerlNum, y: PerlNum) -> PerlNum {
    if y.is_true() {
        x.div(y).unwrap_or(PerlNum::Int(0))
    } else {
        PerlNum::Int(0)
    }
}

// ---------------------------------------------------------------------------------------------
// Printing.

fn print_header(out: &mut Vec<u8>, input: &Input<'_>, args: &str) {
    out.extend_from_slice(FANCY);
    out.extend_from_slice(b"Command:            ");
    out.extend_from_slice(input.cmd);
    out.extend_from_slice(b"\nMassif arguments:  ");
    out.extend_from_slice(&input.desc);
    out.extend_from_slice(b"ms_print arguments:");
    out.extend_from_slice(args.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(FANCY);
    out.extend_from_slice(b"\n\n");
}

/// The graph array, with Perl's array semantics for the column index: negative indices count
/// from the end of the (possibly autovivified, longer) array, and columns past `x` exist but
/// are never printed, so only their count is tracked.
struct Graph {
    cols: Vec<Vec<u8>>,
    /// `scalar(@graph)`.
    len: i128,
}

impl Graph {
    /// The visible column an index refers to (None: an invisible one past the x axis end),
    /// growing the array as Perl's autovivification does.
    fn column(&mut self, index: i128) -> Result<Option<usize>, RenderErrorKind> {
        let visible = self.cols.len() as i128;
        let j = if index >= 0 {
            if index >= self.len {
                self.len = index + 1;
            }
            index
        } else if index + self.len >= 0 {
            index + self.len
        } else {
            return Err(RenderErrorKind::GraphColumnOutOfRange { column: index });
        };
        Ok(if j < visible { Some(j as usize) } else { None })
    }
}

fn draw_graph(
    out: &mut Vec<u8>,
    input: &Input<'_>,
    options: &Options,
) -> Result<(), RenderErrorKind> {
    use PerlNum::Int;
    let (gx, gy) = (options.x, options.y);
    let n = input.snaps.len();
    let Some(last) = input.snaps.last() else {
        return Err(RenderErrorKind::NoSnapshots);
    };
    let mut end_time = last.time;
    if !end_time.ge(Int(0)) {
        return Err(RenderErrorKind::NegativeEndTime);
    }

    let mut graph = Graph {
        cols: Vec::with_capacity(gx + 1),
        len: gx as i128 + 1,
    };
    for x in 0..=gx {
        let mut col = alloc::vec![b' '; gy + 1];
        if x == 0 {
            col.fill(b'|');
            col[0] = b'+';
            col[gy] = b'^';
        } else {
            col[0] = if x == gx { b'>' } else { b'-' };
        }
        graph.cols.push(col);
    }

    const PEAK: u8 = b'#';
    const DETAILED: u8 = b'@';
    const NORMAL: u8 = b':';

    let mut peak = Int(0);
    for s in &input.snaps {
        if s.total.gt(peak) {
            peak = s.total;
        }
    }
    if peak.eq(Int(0)) {
        peak = Int(1);
    }
    if end_time.eq(Int(0)) {
        end_time = Int(1);
    }
    let k = peak.div(Int(gy as i128)).unwrap_or(Int(0));
    let peak_num = input.peak_num.map(|raw| numify(raw).0).unwrap_or(Int(-1));

    let mut x = Int(0);
    let mut prev_y_max = 0usize;
    let mut prev_char = NORMAL;
    for (i, s) in input.snaps.iter().enumerate() {
        let prev_x = x;
        let frac = s.time.div(end_time).unwrap_or(Int(0)).mul(Int(gx as i128));
        x = frac.int().add(Int(1));
        if s.time.eq(end_time) {
            // The last snapshot would land one past the arrow; ms_print pulls it back.
            if !x.eq(Int(gx as i128 + 1)) {
                return Err(RenderErrorKind::GraphColumnOutOfRange {
                    column: x.to_index(),
                });
            }
            x = Int(gx as i128);
        }

        if prev_y_max > 0 {
            let (from, to) = (prev_x.to_index().saturating_add(1), x.to_index());
            let mut x2 = from;
            while x2 < to {
                if x2 >= graph.cols.len() as i128 {
                    // Only invisible columns remain: account for the array growth and stop.
                    graph.column(to - 1)?;
                    break;
                }
                if let Some(c) = graph.column(x2)? {
                    graph.cols[c][prev_y_max] = prev_char;
                }
                x2 += 1;
            }
        }

        let ch = if PerlNum::Int(i as i128).eq(peak_num) {
            PEAK
        } else if s.detailed {
            DETAILED
        } else {
            NORMAL
        };
        let mut y_max = 0;
        let xi = x.to_index();
        for y in 1..=gy {
            if s.total.ge(Int(y as i128).mul(k)) {
                if let Some(c) = graph.column(xi)? {
                    let cur = graph.cols[c][y];
                    let draw = ch == PEAK
                        || (ch == DETAILED && cur != PEAK)
                        || (ch == NORMAL && cur != PEAK && cur != DETAILED);
                    if draw {
                        graph.cols[c][y] = ch;
                    }
                }
                y_max = y;
            }
        }
        prev_y_max = y_max;
        prev_char = ch;
    }

    let (y_label, y_unit) = bytes_label(peak);
    let (x_label, x_unit) = match input.time_unit {
        b"i" => instructions_label(end_time),
        b"ms" => time_label(end_time),
        b"B" => bytes_label(end_time),
        other => return Err(RenderErrorKind::BadTimeUnit { unit: lossy(other) }),
    };

    out.extend_from_slice(alloc::format!("    {y_unit:>2}\n").as_bytes());
    for y in (0..=gy).rev() {
        if y == gy {
            out.extend_from_slice(y_label.as_bytes());
        } else if y == 0 {
            out.extend_from_slice(b"   0 ");
        } else {
            out.extend_from_slice(b"     ");
        }
        for col in &graph.cols {
            out.push(col[y]);
        }
        if y == 0 {
            out.extend_from_slice(x_unit.as_bytes());
        }
        out.push(b'\n');
    }
    out.extend_from_slice(b"     0");
    out.resize(out.len() + gx.saturating_sub(5), b' ');
    out.extend_from_slice(alloc::format!("{x_label:>5}\n").as_bytes());

    out.extend_from_slice(
        alloc::format!("\nNumber of snapshots: {n}\n Detailed snapshots: [").as_bytes(),
    );
    let mut first = true;
    for (i, s) in input.snaps.iter().enumerate() {
        if s.detailed {
            if !first {
                out.extend_from_slice(b", ");
            }
            first = false;
            out.extend_from_slice(i.to_string().as_bytes());
            if PerlNum::Int(i as i128).eq(peak_num) {
                out.extend_from_slice(b" (peak)");
            }
        }
    }
    out.extend_from_slice(b"]\n\n");
    Ok(())
}

/// `max_label_2`: `%5d` below 1000 (unscaled), else the scaled value in 5 characters.
fn max_label(raw: PerlNum, scaled: PerlNum) -> String {
    use PerlNum::Int;
    if raw.lt(Int(1000)) {
        perl::fmt_d(raw, 5)
    } else if scaled.lt(Int(10)) {
        perl::fmt_f(scaled, 5, 3, false)
    } else if scaled.lt(Int(100)) {
        perl::fmt_f(scaled, 5, 2, false)
    } else {
        perl::fmt_f(scaled, 5, 1, false)
    }
}

/// Scales `value` through `steps` (unit, scale when at least this, divisor), as ms_print's
/// `B_max_label`, `i_max_label` and `t_max_label` do, each step applying to the result of the
/// previous one.
fn scaled_label(
    value: PerlNum,
    first_unit: &'static str,
    steps: &[(&'static str, i128, i128)],
) -> (String, &'static str) {
    let mut scaled = value;
    let mut unit = first_unit;
    for &(u, at_least, divisor) in steps {
        if scaled.ge(PerlNum::Int(at_least)) {
            unit = u;
            scaled = scaled.div(PerlNum::Int(divisor)).unwrap_or(scaled);
        }
    }
    (max_label(value, scaled), unit)
}

const BINARY_STEPS: [i128; 2] = [1000, 1024];

fn bytes_label(v: PerlNum) -> (String, &'static str) {
    let [a, d] = BINARY_STEPS;
    scaled_label(
        v,
        "B",
        &[
            ("KB", a, d),
            ("MB", a, d),
            ("GB", a, d),
            ("TB", a, d),
            ("PB", a, d),
            ("EB", a, d),
            ("ZB", a, d),
            ("YB", a, d),
        ],
    )
}

fn instructions_label(v: PerlNum) -> (String, &'static str) {
    let [a, d] = BINARY_STEPS;
    scaled_label(
        v,
        "i",
        &[
            ("ki", a, d),
            ("Mi", a, d),
            ("Gi", a, d),
            ("Ti", a, d),
            ("Pi", a, d),
            ("Ei", a, d),
            ("Zi", a, d),
            ("Yi", a, d),
        ],
    )
}

fn time_label(v: PerlNum) -> (String, &'static str) {
    scaled_label(v, "ms", &[("s", 1000, 1000), ("h", 3600, 3600)])
}

// ---------------------------------------------------------------------------------------------
// Command line.

/// What an ms_print command line asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Invocation {
    /// Render `file`; `arguments` are all the arguments, for the `ms_print arguments:` line.
    Render {
        options: Options,
        file: String,
        arguments: Vec<String>,
    },
    /// `-h`/`--help`: print `usage`.
    Help { usage: String },
    /// `--version`: print `ms_print-3.19.0`.
    Version,
}

/// A bad ms_print command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError {
    pub kind: UsageErrorKind,
    /// The usage text ms_print prints in that case ([`usage`]).
    pub usage: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UsageErrorKind {
    /// An option ms_print does not know, or a malformed value (`--x=abc`).
    UnknownOption(String),
    /// A known option with a value out of range (`--x=2`, `--threshold=101`).
    OutOfRange(String),
    /// No massif-out-file argument.
    MissingFile,
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            UsageErrorKind::UnknownOption(o) => write!(f, "unknown option or bad value `{o}`"),
            UsageErrorKind::OutOfRange(o) => write!(
                f,
                "value out of range in `{o}` (--threshold: 0..100, --x and --y: 4..1000)"
            ),
            UsageErrorKind::MissingFile => f.write_str("no massif-out-file given"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for UsageError {}

/// ms_print's usage text. The default threshold in it is always `[1]`: ms_print builds the
/// text once, before reading its options.
pub fn usage() -> String {
    let threshold = "1";
    alloc::format!(
        "usage: ms_print [options] massif-out-file\n\
\n\
\x20 options for the user, with defaults in [ ], are:\n\
\x20   -h --help             show this message\n\
\x20   --version             show version\n\
\x20   --threshold=<m.n>     significance threshold, in percent [{threshold}]\n\
\x20   --x=<4..1000>         graph width, in columns [72]\n\
\x20   --y=<4..1000>         graph height, in rows [20]\n\
\n\
\x20 ms_print is Copyright (C) 2007-2017 Nicholas Nethercote.\n\
\x20 and licensed under the GNU General Public License, version 2.\n\
\x20 Bug reports, feedback, admiration, abuse, etc, to: njn@valgrind.org.\n\
{:48}\n",
        ""
    )
}

/// Parses ms_print's arguments (without the program name) as ms_print does: options are
/// handled left to right and the first problem wins; `--version` wins if it comes first; the
/// first non-option argument is the file, later ones are ignored.
pub fn parse_args<S: AsRef<str>>(args: &[S]) -> Result<Invocation, UsageError> {
    let mut options = Options::default();
    let mut file = None;
    let fail = |kind| {
        Err(UsageError {
            kind,
            usage: usage(),
        })
    };
    for arg in args {
        let arg = arg.as_ref();
        if !arg.starts_with('-') {
            if file.is_none() {
                file = Some(arg.to_string());
            }
            continue;
        }
        if arg == "--version" {
            return Ok(Invocation::Version);
        } else if let Some(v) = arg.strip_prefix("--threshold=") {
            let v = v.strip_suffix('%').unwrap_or(v);
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
                return fail(UsageErrorKind::UnknownOption(arg.to_string()));
            }
            let t = numify(v.as_bytes()).0.to_f64();
            if !(0.0..=100.0).contains(&t) {
                return fail(UsageErrorKind::OutOfRange(arg.to_string()));
            }
            options.threshold = t;
        } else if let Some((name, v)) = arg.strip_prefix("--").and_then(|a| a.split_once('=')) {
            if (name != "x" && name != "y")
                || v.is_empty()
                || !v.bytes().all(|b| b.is_ascii_digit())
            {
                return fail(UsageErrorKind::UnknownOption(arg.to_string()));
            }
            let n = numify(v.as_bytes()).0;
            let in_range = n.ge(PerlNum::Int(4)) && PerlNum::Int(1000).ge(n);
            if !in_range {
                return fail(UsageErrorKind::OutOfRange(arg.to_string()));
            }
            let n = n.to_index() as usize;
            if name == "x" {
                options.x = n;
            } else {
                options.y = n;
            }
        } else if arg == "-h" || arg == "--help" {
            return Ok(Invocation::Help { usage: usage() });
        } else {
            return fail(UsageErrorKind::UnknownOption(arg.to_string()));
        }
    }
    match file {
        Some(file) => Ok(Invocation::Render {
            options,
            file,
            arguments: args.iter().map(|a| a.as_ref().to_string()).collect(),
        }),
        None => fail(UsageErrorKind::MissingFile),
    }
}
