//! `dhat.out.<pid>`: DHAT 3.19's JSON profile (`"dhatFileVersion":2`, formats.md §3), the
//! file `dh_view.html` loads.
//!
//! The model is what the file says: a header, the program points (PPs) with their counters,
//! and the frame table their `fs` arrays index. Turning live allocations into PPs and frame
//! strings is DHAT's job (`tools/dhat`), not this module's.
//!
//! * [`write`]: the model as DHAT 3.19 writes it, byte for byte: comma-first JSON, one field
//!   group per line, strings escaped as `json_escape` in `dh_main.c` does (`"`, `\`, and
//!   bytes below 0x20 as `\u00xx`; everything else raw).
//! * [`parse`]: a version-2 file (any JSON layout, not only DHAT's) into the model, or a
//!   [`ParseError`] saying where and what. Version 1 files (3.15, 3.16) are refused, as
//!   3.19's dh_view refuses them.
//! * [`FrameTable`]: the `ftbl` being built: unique strings in first-seen order, `[root]` at 0.
//!
//! The writer runs inside the profiled program, so nothing here needs `std`.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::{self, Write};

/// What DHAT measured: heap blocks (`--mode=heap`, the default), calls to the copy
/// functions (`--mode=copy`), or client-request events (`--mode=ad-hoc`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Heap,
    Copy,
    AdHoc,
}

impl Mode {
    /// `"mode"` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Heap => "heap",
            Mode::Copy => "copy",
            Mode::AdHoc => "ad-hoc",
        }
    }

    /// `"verb"` value: dh_view prints "<verb> at {".
    pub fn verb(self) -> &'static str {
        match self {
            Mode::Heap => "Allocated",
            Mode::Copy => "Copied",
            Mode::AdHoc => "Occurred",
        }
    }

    /// Whether block lifetimes and accesses are recorded (`bklt`, `bkacc`): heap mode only.
    pub fn has_blocks(self) -> bool {
        self == Mode::Heap
    }
}

/// A whole `dhat.out` file.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DhatFile {
    pub mode: Mode,
    /// The program and its arguments joined by single spaces, unescaped.
    pub cmd: String,
    pub pid: i64,
    /// Instructions executed by the end of the run (t-end).
    pub te: u64,
    /// Instructions executed at the global heap maximum (t-gmax); heap mode only.
    pub tg: u64,
    pub pps: Vec<Pp>,
    /// Frame strings; element 0 is `[root]`.
    pub ftbl: Vec<String>,
}

/// One program point. Outside heap mode only `tb`, `tbk` and `fs` are written.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Pp {
    /// Total bytes and blocks (copy: bytes copied and calls; ad-hoc: units and events).
    pub tb: u64,
    pub tbk: u64,
    /// Sum of block lifetimes, in instructions.
    pub tl: u64,
    /// Bytes and blocks at this PP's maximum (DHAT 3.19's definition: see `tools/dhat`).
    pub mb: u64,
    pub mbk: u64,
    /// At t-gmax.
    pub gb: u64,
    pub gbk: u64,
    /// At t-end.
    pub eb: u64,
    pub ebk: u64,
    /// Bytes read and written inside this PP's blocks.
    pub rb: u64,
    pub wb: u64,
    /// Per-offset access counts (0xFFFF means "at least 65535"), written run-length encoded;
    /// present only when every retired block of the PP had this one size.
    pub acc: Option<Vec<u16>>,
    /// Indices into [`DhatFile::ftbl`], innermost frame first.
    pub fs: Vec<u32>,
}

/// The frame table being built: each distinct string once, numbered in first-seen order,
/// `[root]` at index 0 (as `dh_fini` builds it).
#[derive(Clone, Debug)]
pub struct FrameTable {
    index: BTreeMap<String, u32>,
    strings: Vec<String>,
}

impl Default for FrameTable {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameTable {
    pub fn new() -> Self {
        let mut t = FrameTable {
            index: BTreeMap::new(),
            strings: Vec::new(),
        };
        t.intern("[root]");
        t
    }

    /// The index of `frame`, added at the end if new.
    pub fn intern(&mut self, frame: &str) -> u32 {
        if let Some(&i) = self.index.get(frame) {
            return i;
        }
        let i = self.strings.len() as u32;
        self.index.insert(String::from(frame), i);
        self.strings.push(String::from(frame));
        i
    }

    pub fn into_strings(self) -> Vec<String> {
        self.strings
    }
}

fn escape_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// Appends `acc` run-length encoded as `dh_main.c` does: a run of N > 1 equal values V is
/// `-N,V`, a single value is `V`.
fn write_acc(out: &mut String, acc: &[u16]) {
    let mut first = true;
    let mut i = 0;
    while i < acc.len() {
        let v = acc[i];
        let mut n = 1;
        while i + n < acc.len() && acc[i + n] == v {
            n += 1;
        }
        if !first {
            out.push(',');
        }
        first = false;
        if n > 1 {
            let _ = write!(out, "-{n},{v}");
        } else {
            let _ = write!(out, "{v}");
        }
        i += n;
    }
}

/// The file as DHAT 3.19 writes it.
pub fn write(f: &DhatFile) -> String {
    let mut out = String::new();
    write_into(&mut out, f);
    out
}

/// [`write`] appending to `out`.
pub fn write_into(out: &mut String, f: &DhatFile) {
    let heap = f.mode.has_blocks();
    out.push_str("{\"dhatFileVersion\":2\n");
    let _ = writeln!(
        out,
        ",\"mode\":\"{}\",\"verb\":\"{}\"",
        f.mode.as_str(),
        f.mode.verb()
    );
    let _ = writeln!(out, ",\"bklt\":{heap},\"bkacc\":{heap}");
    if f.mode == Mode::AdHoc {
        out.push_str(",\"bu\":\"unit\",\"bsu\":\"units\",\"bksu\":\"events\"\n");
    }
    out.push_str(",\"tu\":\"instrs\",\"Mtu\":\"Minstr\"\n");
    if heap {
        out.push_str(",\"tuth\":500\n");
    }
    out.push_str(",\"cmd\":\"");
    escape_into(out, &f.cmd);
    out.push_str("\"\n");
    let _ = writeln!(out, ",\"pid\":{}", f.pid);
    let _ = writeln!(out, ",\"te\":{}", f.te);
    if heap {
        let _ = writeln!(out, ",\"tg\":{}", f.tg);
    }
    out.push_str(",\"pps\":\n");
    for (i, pp) in f.pps.iter().enumerate() {
        let _ = writeln!(
            out,
            " {}{{\"tb\":{},\"tbk\":{}",
            if i == 0 { '[' } else { ',' },
            pp.tb,
            pp.tbk
        );
        if heap {
            let _ = writeln!(out, "  ,\"tl\":{}", pp.tl);
            let _ = writeln!(out, "  ,\"mb\":{},\"mbk\":{}", pp.mb, pp.mbk);
            let _ = writeln!(out, "  ,\"gb\":{},\"gbk\":{}", pp.gb, pp.gbk);
            let _ = writeln!(out, "  ,\"eb\":{},\"ebk\":{}", pp.eb, pp.ebk);
            let _ = writeln!(out, "  ,\"rb\":{},\"wb\":{}", pp.rb, pp.wb);
            if let Some(acc) = &pp.acc {
                out.push_str("  ,\"acc\":[");
                write_acc(out, acc);
                out.push_str("]\n");
            }
        }
        out.push_str("  ,\"fs\":");
        if pp.fs.is_empty() {
            // DHAT never writes an empty stack (every ExeContext has a frame); keep the
            // output valid JSON if a model has one.
            out.push('[');
        }
        for (j, n) in pp.fs.iter().enumerate() {
            let _ = write!(out, "{}{n}", if j == 0 { '[' } else { ',' });
        }
        out.push_str("]\n  }\n");
    }
    if f.pps.is_empty() {
        out.push_str(" [\n");
    }
    out.push_str(" ]\n");
    out.push_str(",\"ftbl\":\n");
    for (i, s) in f.ftbl.iter().enumerate() {
        out.push(' ');
        out.push(if i == 0 { '[' } else { ',' });
        out.push('"');
        escape_into(out, s);
        out.push_str("\"\n");
    }
    if f.ftbl.is_empty() {
        out.push_str(" [\n");
    }
    out.push_str(" ]\n}\n");
}

// ---- reader --------------------------------------------------------------------------------

/// Why a file could not be read, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line and column (in bytes) of the offending text.
    pub line: usize,
    pub column: usize,
    pub kind: ParseErrorKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseErrorKind {
    /// Not JSON: `expected` says what the grammar wanted.
    Syntax { expected: &'static str },
    /// Valid JSON, but a field DHAT's viewer requires is missing.
    Missing { field: &'static str },
    /// A field of the wrong type or out of range (a negative byte count, say).
    BadValue { field: &'static str },
    /// `dhatFileVersion` other than 2.
    Version(i64),
    /// A `mode` this model has no variant for.
    UnknownMode(String),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}: ", self.line, self.column)?;
        match &self.kind {
            ParseErrorKind::Syntax { expected } => write!(f, "expected {expected}"),
            ParseErrorKind::Missing { field } => write!(f, "missing field `{field}`"),
            ParseErrorKind::BadValue { field } => write!(f, "bad value for `{field}`"),
            ParseErrorKind::Version(v) => {
                write!(
                    f,
                    "data file has version number {v}, expected version number 2"
                )
            }
            ParseErrorKind::UnknownMode(m) => write!(f, "unknown mode `{}`", m.escape_debug()),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ParseError {}

/// A JSON value, kept with the byte offset where it starts (for error positions).
#[derive(Clone, Debug)]
enum Json {
    Null,
    Bool(bool),
    /// Integers only: DHAT writes no fractions, and a fraction is reported, not rounded.
    Int(i64),
    Str(String),
    Arr(Vec<(usize, Json)>),
    Obj(Vec<(String, usize, Json)>),
}

struct Reader<'a> {
    s: &'a [u8],
    pos: usize,
    depth: usize,
}

/// Nesting a hostile file may use before it is refused (the reader recurses).
const MAX_DEPTH: usize = 64;

impl<'a> Reader<'a> {
    fn err(&self, at: usize, kind: ParseErrorKind) -> ParseError {
        let at = at.min(self.s.len());
        let before = &self.s[..at];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        ParseError {
            line,
            column: at - line_start + 1,
            kind,
        }
    }

    fn syntax(&self, expected: &'static str) -> ParseError {
        self.err(self.pos, ParseErrorKind::Syntax { expected })
    }

    fn ws(&mut self) {
        while self.pos < self.s.len() && matches!(self.s[self.pos], b' ' | b'\t' | b'\n' | b'\r') {
            self.pos += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.ws();
        if self.s.get(self.pos) == Some(&b) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn literal(&mut self, word: &str) -> bool {
        if self.s[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> Result<(usize, Json), ParseError> {
        self.ws();
        let start = self.pos;
        let Some(&c) = self.s.get(self.pos) else {
            return Err(self.syntax("a value"));
        };
        let v = match c {
            b'{' | b'[' => {
                if self.depth >= MAX_DEPTH {
                    return Err(self.syntax("less nesting"));
                }
                self.depth += 1;
                self.pos += 1;
                let v = if c == b'{' {
                    self.object()?
                } else {
                    self.array()?
                };
                self.depth -= 1;
                v
            }
            b'"' => Json::Str(self.string()?),
            b't' if self.literal("true") => Json::Bool(true),
            b'f' if self.literal("false") => Json::Bool(false),
            b'n' if self.literal("null") => Json::Null,
            b'-' | b'0'..=b'9' => self.number()?,
            _ => return Err(self.syntax("a value")),
        };
        Ok((start, v))
    }

    fn object(&mut self) -> Result<Json, ParseError> {
        let mut fields = Vec::new();
        if self.eat(b'}') {
            return Ok(Json::Obj(fields));
        }
        loop {
            self.ws();
            if self.s.get(self.pos) != Some(&b'"') {
                return Err(self.syntax("a field name"));
            }
            let name = self.string()?;
            if !self.eat(b':') {
                return Err(self.syntax("`:`"));
            }
            let (at, v) = self.value()?;
            fields.push((name, at, v));
            if self.eat(b',') {
                continue;
            }
            if self.eat(b'}') {
                return Ok(Json::Obj(fields));
            }
            return Err(self.syntax("`,` or `}`"));
        }
    }

    fn array(&mut self) -> Result<Json, ParseError> {
        let mut items = Vec::new();
        if self.eat(b']') {
            return Ok(Json::Arr(items));
        }
        loop {
            items.push(self.value()?);
            if self.eat(b',') {
                continue;
            }
            if self.eat(b']') {
                return Ok(Json::Arr(items));
            }
            return Err(self.syntax("`,` or `]`"));
        }
    }

    fn hex4(&mut self) -> Result<u32, ParseError> {
        let digits = self
            .s
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| self.syntax("four hex digits"))?;
        let mut v = 0;
        for &d in digits {
            let x = (d as char)
                .to_digit(16)
                .ok_or_else(|| self.syntax("four hex digits"))?;
            v = v * 16 + x;
        }
        self.pos += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, ParseError> {
        self.pos += 1; // the opening quote
        let mut out: Vec<u8> = Vec::new();
        loop {
            let Some(&b) = self.s.get(self.pos) else {
                return Err(self.syntax("a closing `\"`"));
            };
            self.pos += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    let Some(&e) = self.s.get(self.pos) else {
                        return Err(self.syntax("an escape"));
                    };
                    self.pos += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            let cp = if (0xD800..0xDC00).contains(&hi) {
                                if !self.literal("\\u") {
                                    return Err(self.syntax("a low surrogate"));
                                }
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(self.syntax("a low surrogate"));
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            char::from_u32(cp).ok_or_else(|| self.syntax("a valid code point"))?
                        }
                        _ => {
                            self.pos -= 1;
                            return Err(self.syntax("a valid escape"));
                        }
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                _ => out.push(b),
            }
        }
        String::from_utf8(out).map_err(|_| self.syntax("UTF-8 text"))
    }

    fn number(&mut self) -> Result<Json, ParseError> {
        let start = self.pos;
        if self.s[self.pos] == b'-' {
            self.pos += 1;
        }
        let digits = self.pos;
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_digit() {
            self.pos += 1;
        }
        if self.pos == digits {
            return Err(self.syntax("a digit"));
        }
        if matches!(self.s.get(self.pos), Some(b'.' | b'e' | b'E')) {
            return Err(self.syntax("an integer"));
        }
        // Only ASCII digits and '-' were consumed.
        let text = core::str::from_utf8(&self.s[start..self.pos]).unwrap_or("");
        text.parse::<i64>().map(Json::Int).map_err(|_| {
            self.err(
                start,
                ParseErrorKind::Syntax {
                    expected: "a 64-bit integer",
                },
            )
        })
    }
}

struct Fields<'a> {
    r: &'a Reader<'a>,
    at: usize,
    fields: &'a [(String, usize, Json)],
}

impl<'a> Fields<'a> {
    fn get(&self, name: &'static str) -> Option<(usize, &'a Json)> {
        self.fields
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, at, v)| (*at, v))
    }

    fn need(&self, name: &'static str) -> Result<(usize, &'a Json), ParseError> {
        self.get(name)
            .ok_or_else(|| self.r.err(self.at, ParseErrorKind::Missing { field: name }))
    }

    fn bad(&self, at: usize, field: &'static str) -> ParseError {
        self.r.err(at, ParseErrorKind::BadValue { field })
    }

    fn uint(&self, name: &'static str) -> Result<u64, ParseError> {
        match self.need(name)? {
            (_, Json::Int(v)) if *v >= 0 => Ok(*v as u64),
            (at, _) => Err(self.bad(at, name)),
        }
    }

    fn int(&self, name: &'static str) -> Result<i64, ParseError> {
        match self.need(name)? {
            (_, Json::Int(v)) => Ok(*v),
            (at, _) => Err(self.bad(at, name)),
        }
    }

    fn str(&self, name: &'static str) -> Result<&'a str, ParseError> {
        match self.need(name)? {
            (_, Json::Str(s)) => Ok(s),
            (at, _) => Err(self.bad(at, name)),
        }
    }

    fn arr(&self, name: &'static str) -> Result<&'a [(usize, Json)], ParseError> {
        match self.need(name)? {
            (_, Json::Arr(a)) => Ok(a),
            (at, _) => Err(self.bad(at, name)),
        }
    }
}

fn parse_pp(r: &Reader<'_>, at: usize, v: &Json, heap: bool) -> Result<Pp, ParseError> {
    let Json::Obj(fields) = v else {
        return Err(r.err(at, ParseErrorKind::BadValue { field: "pps" }));
    };
    let f = Fields { r, at, fields };
    let mut pp = Pp {
        tb: f.uint("tb")?,
        tbk: f.uint("tbk")?,
        ..Pp::default()
    };
    for (at, n) in f.arr("fs")? {
        match n {
            Json::Int(i) if (0..=u32::MAX as i64).contains(i) => pp.fs.push(*i as u32),
            _ => return Err(f.bad(*at, "fs")),
        }
    }
    if heap {
        // dh_view does not require `tl`; a missing one reads as 0.
        pp.tl = if f.get("tl").is_some() {
            f.uint("tl")?
        } else {
            0
        };
        pp.mb = f.uint("mb")?;
        pp.mbk = f.uint("mbk")?;
        pp.gb = f.uint("gb")?;
        pp.gbk = f.uint("gbk")?;
        pp.eb = f.uint("eb")?;
        pp.ebk = f.uint("ebk")?;
        pp.rb = f.uint("rb")?;
        pp.wb = f.uint("wb")?;
        if f.get("acc").is_some() {
            let mut acc = Vec::new();
            let mut items = f.arr("acc")?.iter();
            while let Some((at, n)) = items.next() {
                let (reps, val_at, val) = match n {
                    Json::Int(i) if *i < 0 => match items.next() {
                        Some((vat, Json::Int(v))) => (i.unsigned_abs(), *vat, *v),
                        _ => return Err(f.bad(*at, "acc")),
                    },
                    Json::Int(v) => (1, *at, *v),
                    _ => return Err(f.bad(*at, "acc")),
                };
                if !(0..=0xFFFF).contains(&val) || reps > 1 << 24 {
                    return Err(f.bad(val_at, "acc"));
                }
                acc.extend(core::iter::repeat(val as u16).take(reps as usize));
            }
            pp.acc = Some(acc);
        }
    }
    Ok(pp)
}

/// Reads a version-2 DHAT file.
pub fn parse(bytes: &[u8]) -> Result<DhatFile, ParseError> {
    let mut r = Reader {
        s: bytes,
        pos: 0,
        depth: 0,
    };
    let (at, top) = r.value()?;
    r.ws();
    if r.pos != bytes.len() {
        return Err(r.syntax("end of file"));
    }
    let Json::Obj(fields) = &top else {
        return Err(r.err(
            at,
            ParseErrorKind::Syntax {
                expected: "an object",
            },
        ));
    };
    let f = Fields { r: &r, at, fields };
    let version = f.int("dhatFileVersion")?;
    if version != 2 {
        return Err(r.err(at, ParseErrorKind::Version(version)));
    }
    let mode = match f.str("mode")? {
        "heap" => Mode::Heap,
        "copy" => Mode::Copy,
        "ad-hoc" => Mode::AdHoc,
        other => return Err(r.err(at, ParseErrorKind::UnknownMode(String::from(other)))),
    };
    let heap = mode.has_blocks();
    // dh_view requires both flags; this model ties them to the mode, as DHAT writes them.
    for flag in ["bklt", "bkacc"] {
        match f.need(flag)? {
            (_, Json::Bool(b)) if *b == heap => {}
            (at, _) => return Err(f.bad(at, flag)),
        }
    }
    let mut file = DhatFile {
        mode,
        cmd: String::from(f.str("cmd")?),
        pid: f.int("pid")?,
        te: f.uint("te")?,
        tg: if heap { f.uint("tg")? } else { 0 },
        ..DhatFile::default()
    };
    for (at, v) in f.arr("pps")? {
        file.pps.push(parse_pp(&r, *at, v, heap)?);
    }
    for (at, v) in f.arr("ftbl")? {
        match v {
            Json::Str(s) => file.ftbl.push(s.clone()),
            _ => return Err(f.bad(*at, "ftbl")),
        }
    }
    Ok(file)
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;
    use std::path::{Path, PathBuf};

    fn examples() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference/examples/dhat")
    }

    #[test]
    fn parse_then_write_gives_every_valgrind_example_back_byte_for_byte() {
        let mut seen = 0;
        for name in [
            "dhat.out.heap",
            "dhat.out.heap2",
            "dhat.out.copy",
            "dhat.out.adhoc",
        ] {
            let path = examples().join(name);
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let model = parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            let written = write(&model);
            assert_eq!(written, String::from_utf8(bytes).unwrap(), "{name}");
            seen += 1;
        }
        assert_eq!(seen, 4);
    }

    #[test]
    fn heap_example_reads_as_dhat_wrote_it() {
        let bytes = std::fs::read(examples().join("dhat.out.heap2")).unwrap();
        let f = parse(&bytes).unwrap();
        assert_eq!(f.mode, Mode::Heap);
        assert_eq!(
            (f.cmd.as_str(), f.pid, f.te, f.tg),
            ("./dh_prog", 7606, 152386, 147679)
        );
        assert_eq!(f.pps.len(), 4);
        let p = &f.pps[0];
        assert_eq!(
            (p.tb, p.tbk, p.tl, p.mb, p.gb, p.rb, p.wb),
            (16, 1, 2535, 16, 0, 40, 16)
        );
        let mut acc = vec![5u16; 8];
        acc.extend([2u16; 8]);
        assert_eq!(p.acc.as_deref(), Some(&acc[..]));
        assert_eq!(f.pps[3].acc.as_deref(), Some(&[1u16, 0, 0, 0, 0, 0, 0][..]));
        assert_eq!(f.pps[1].acc, None);
        assert_eq!(f.ftbl[0], "[root]");
        assert_eq!(f.ftbl[2], "0x10945E: main (dh_prog.c:7)");
    }

    #[test]
    fn writer_lays_out_a_built_model_as_dhat_does() {
        let mut t = FrameTable::new();
        let a = t.intern("0x1: malloc (in /x.so)");
        let b = t.intern("0x2: main (a \"q\" \\ \t.c:3)");
        assert_eq!(t.intern("0x1: malloc (in /x.so)"), a);
        let f = DhatFile {
            mode: Mode::Heap,
            cmd: "./p \"x\"".to_string(),
            pid: 7,
            te: 100,
            tg: 50,
            pps: vec![Pp {
                tb: 3,
                tbk: 1,
                tl: 9,
                acc: Some(vec![0, 4, 4]),
                fs: vec![a, b],
                ..Pp::default()
            }],
            ftbl: t.into_strings(),
        };
        let expected = "{\"dhatFileVersion\":2\n\
,\"mode\":\"heap\",\"verb\":\"Allocated\"\n\
,\"bklt\":true,\"bkacc\":true\n\
,\"tu\":\"instrs\",\"Mtu\":\"Minstr\"\n\
,\"tuth\":500\n\
,\"cmd\":\"./p \\\"x\\\"\"\n\
,\"pid\":7\n\
,\"te\":100\n\
,\"tg\":50\n\
,\"pps\":\n \
[{\"tb\":3,\"tbk\":1\n  \
,\"tl\":9\n  \
,\"mb\":0,\"mbk\":0\n  \
,\"gb\":0,\"gbk\":0\n  \
,\"eb\":0,\"ebk\":0\n  \
,\"rb\":0,\"wb\":0\n  \
,\"acc\":[0,-2,4]\n  \
,\"fs\":[1,2]\n  \
}\n \
]\n\
,\"ftbl\":\n \
[\"[root]\"\n \
,\"0x1: malloc (in /x.so)\"\n \
,\"0x2: main (a \\\"q\\\" \\\\ \\u0009.c:3)\"\n \
]\n\
}\n";
        assert_eq!(write(&f), expected);
        assert_eq!(parse(expected.as_bytes()).unwrap(), f);
    }

    #[test]
    fn empty_profile_is_written_as_dhat_writes_it() {
        let f = DhatFile {
            mode: Mode::Copy,
            ftbl: FrameTable::new().into_strings(),
            ..DhatFile::default()
        };
        let text = write(&f);
        assert!(text.contains(",\"pps\":\n [\n ]\n"), "{text}");
        assert!(!text.contains("tg"));
        assert_eq!(parse(text.as_bytes()).unwrap(), f);
    }

    #[test]
    fn bad_files_say_where_and_why() {
        let e = parse(b"{\"dhatFileVersion\":1}").unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::Version(1));
        let e = parse(b"{\"dhatFileVersion\":2\n,\"mode\":\"heap\" x").unwrap_err();
        assert_eq!((e.line, e.column), (2, 16));
        let e = parse(
            b"{\"dhatFileVersion\":2,\"mode\":\"heap\",\"bklt\":true,\"bkacc\":true,\"cmd\":\"\",\"pid\":1}",
        )
            .unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::Missing { field: "te" });
        let deep = "[".repeat(10_000);
        assert!(parse(deep.as_bytes()).is_err());
        let text = write(&DhatFile {
            pps: vec![Pp {
                acc: Some(vec![1]),
                fs: vec![1],
                ..Pp::default()
            }],
            ..DhatFile::default()
        })
        .replace("\"acc\":[1]", "\"acc\":[70000]");
        let e = parse(text.as_bytes()).unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::BadValue { field: "acc" });
    }
}
