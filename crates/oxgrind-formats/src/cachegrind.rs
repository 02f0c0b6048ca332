//! `cachegrind.out.<pid>`: the data model, the writer and the reader (formats.md §7), plus the
//! summary Cachegrind prints on stderr at exit (§7.4).
//!
//! The model is what the file says: three `desc:` lines, the command, the event names, one
//! cost line per (file, function, line) in file order, and the totals. Simulating caches and
//! attributing costs is Cachegrind's job (`tools/cachegrind`); rendering the file for a person
//! is cg_annotate's (the launcher's viewers, which have their own reader with the Perl
//! script's quirks).
//!
//! * [`write`] / [`write_into`]: the bytes Cachegrind 3.19 writes.
//! * [`parse`]: a file as Cachegrind writes it (and as cg_annotate reads it: blank and `#`
//!   lines skipped, `fl=`/`fn=` in any order) into the model, or a [`ParseError`] with the
//!   line number.
//! * [`CacheConfig`]: one cache's geometry and its `desc:` text.
//! * [`summary_text`]: the `I   refs:` ... `Mispred rate:` block.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt::{self, Write};

use crate::number::commify;

/// The events of a file with cache simulation and without branch simulation (Valgrind
/// 3.19's default). Cachegrind writes this `events:` line with a trailing space.
pub const CACHE_EVENTS: [&str; 9] = [
    "Ir", "I1mr", "ILmr", "Dr", "D1mr", "DLmr", "Dw", "D1mw", "DLmw",
];
/// The branch-simulation events, appended after the cache events (or after `Ir` alone).
pub const BRANCH_EVENTS: [&str; 4] = ["Bc", "Bcm", "Bi", "Bim"];

/// The event names Cachegrind records for a configuration, in file order.
pub fn event_names(cache_sim: bool, branch_sim: bool) -> Vec<String> {
    let mut v: Vec<String> = if cache_sim {
        CACHE_EVENTS.iter().map(|s| s.to_string()).collect()
    } else {
        alloc::vec!["Ir".to_string()]
    };
    if branch_sim {
        v.extend(BRANCH_EVENTS.iter().map(|s| s.to_string()));
    }
    v
}

/// One simulated cache: total size, associativity and line size, all in bytes or ways.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    pub size: u64,
    pub assoc: u64,
    pub line: u64,
}

impl CacheConfig {
    /// The description Cachegrind puts after `I1 cache:` and friends.
    pub fn describe(&self) -> String {
        if self.assoc == 1 {
            format!("{} B, {} B, direct-mapped", self.size, self.line)
        } else {
            format!(
                "{} B, {} B, {}-way associative",
                self.size, self.line, self.assoc
            )
        }
    }

    /// The three `desc:` texts of a file (`I1 cache:         32768 B, ...`).
    pub fn desc_lines(i1: &CacheConfig, d1: &CacheConfig, ll: &CacheConfig) -> Vec<String> {
        alloc::vec![
            format!("I1 cache:         {}", i1.describe()),
            format!("D1 cache:         {}", d1.describe()),
            format!("LL cache:         {}", ll.describe()),
        ]
    }
}

/// A whole cachegrind.out file.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CachegrindFile {
    /// The `desc:` lines' text after `desc: `.
    pub desc: Vec<String>,
    /// `cmd:` text: the program and its arguments joined by spaces.
    pub cmd: String,
    /// Event names, in column order.
    pub events: Vec<String>,
    /// Cost lines in file order (Cachegrind's order: see [`sort_records`]).
    pub records: Vec<Record>,
    /// `summary:` totals, one per event.
    pub summary: Vec<u64>,
}

/// The costs of one source line of one function.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Record {
    /// `fl=` name: `<dir>/<file>` when the directory is known, `???` when nothing is.
    pub file: String,
    /// `fn=` name: demangled, `???` when unknown.
    pub func: String,
    /// Source line, 0 when unknown.
    pub line: u32,
    /// One count per event.
    pub counts: Vec<u64>,
}

/// Puts records in the order Cachegrind writes them: by file name, then function name (both
/// byte-wise, as `strcmp`), then line number.
pub fn sort_records(records: &mut [Record]) {
    records.sort_by(|a, b| {
        a.file
            .as_bytes()
            .cmp(b.file.as_bytes())
            .then_with(|| a.func.as_bytes().cmp(b.func.as_bytes()))
            .then(a.line.cmp(&b.line))
    });
}

/// `file` as Cachegrind 3.19 writes it.
pub fn write(file: &CachegrindFile) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = write_into(file, &mut out);
    out
}

/// [`write`] into any `core::fmt::Write` sink.
///
/// `fl=` is written whenever the file changes, `fn=` whenever the function changes or a
/// `fl=` was just written. The `events:` line of the cache-only event set ends with a space,
/// as Cachegrind's literal string does; the other sets do not.
pub fn write_into<W: Write + ?Sized>(file: &CachegrindFile, out: &mut W) -> fmt::Result {
    for d in &file.desc {
        writeln!(out, "desc: {d}")?;
    }
    // An argument with a newline would end the line early; fold it as the massif writer does.
    writeln!(out, "cmd: {}", file.cmd.replace(['\n', '\r'], " "))?;
    out.write_str("events: ")?;
    out.write_str(&file.events.join(" "))?;
    if file
        .events
        .iter()
        .map(String::as_str)
        .eq(CACHE_EVENTS.iter().copied())
    {
        out.write_char(' ')?;
    }
    out.write_char('\n')?;
    let mut cur_file: Option<&str> = None;
    let mut cur_fn: Option<&str> = None;
    for r in &file.records {
        let new_file = cur_file != Some(r.file.as_str());
        if new_file {
            writeln!(out, "fl={}", r.file)?;
            cur_file = Some(&r.file);
        }
        if new_file || cur_fn != Some(r.func.as_str()) {
            writeln!(out, "fn={}", r.func)?;
            cur_fn = Some(&r.func);
        }
        write!(out, "{}", r.line)?;
        for c in &r.counts {
            write!(out, " {c}")?;
        }
        out.write_char('\n')?;
    }
    out.write_str("summary:")?;
    for c in &file.summary {
        write!(out, " {c}")?;
    }
    out.write_char('\n')
}

/// Why a cachegrind.out file could not be read, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number (the line after the last one for end of file).
    pub line: usize,
    pub kind: ParseErrorKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseErrorKind {
    NotUtf8,
    MissingCmd,
    MissingEvents,
    /// A cost line before any `fl=`/`fn=`.
    CostOutsideFunction,
    /// More counts than events on a cost or summary line.
    TooManyCounts,
    /// A summary with a different number of counts than events.
    SummaryMismatch,
    BadNumber(String),
    /// A line that is none of the above.
    Malformed(String),
    MissingSummary,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: ", self.line)?;
        match &self.kind {
            ParseErrorKind::NotUtf8 => f.write_str("not valid UTF-8"),
            ParseErrorKind::MissingCmd => f.write_str("missing command line (`cmd:`)"),
            ParseErrorKind::MissingEvents => f.write_str("missing events line (`events:`)"),
            ParseErrorKind::CostOutsideFunction => f.write_str("cost line before any `fn=`"),
            ParseErrorKind::TooManyCounts => f.write_str("too many event counts"),
            ParseErrorKind::SummaryMismatch => {
                f.write_str("summary event and total event mismatch")
            }
            ParseErrorKind::BadNumber(s) => write!(f, "`{s}` is not a count"),
            ParseErrorKind::Malformed(s) => write!(f, "malformed line `{s}`"),
            ParseErrorKind::MissingSummary => f.write_str("missing final summary line"),
        }
    }
}

fn err(line: usize, kind: ParseErrorKind) -> ParseError {
    ParseError { line, kind }
}

/// Reads a file as Cachegrind writes it. Cost lines with fewer counts than events are
/// padded with zeros; `.` (no value, which cg_annotate accepts) reads as 0.
pub fn parse(bytes: &[u8]) -> Result<CachegrindFile, ParseError> {
    let text = core::str::from_utf8(bytes).map_err(|e| {
        let line = bytes[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1;
        err(line, ParseErrorKind::NotUtf8)
    })?;
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l)).peekable();
    let mut model = CachegrindFile::default();
    while let Some(&(_, l)) = lines.peek() {
        match l.strip_prefix("desc:") {
            Some(rest) => {
                model.desc.push(rest.trim_start().to_string());
                lines.next();
            }
            None => break,
        }
    }
    let (n, l) = lines.next().unwrap_or((1, ""));
    model.cmd = l
        .strip_prefix("cmd:")
        .ok_or(err(n, ParseErrorKind::MissingCmd))?
        .trim_start()
        .to_string();
    let (n, l) = lines.next().unwrap_or((n + 1, ""));
    model.events = l
        .strip_prefix("events:")
        .ok_or(err(n, ParseErrorKind::MissingEvents))?
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let nev = model.events.len();
    let mut file: Option<String> = None;
    let mut func: Option<String> = None;
    let mut summary = None;
    let mut last = n;
    for (n, l) in lines {
        last = n;
        if l.trim().is_empty() || l.starts_with('#') {
            continue;
        }
        if let Some(f) = l.strip_prefix("fl=") {
            file = Some(f.to_string());
            func = None;
        } else if let Some(f) = l.strip_prefix("fn=") {
            func = Some(f.to_string());
        } else if let Some(rest) = l.strip_prefix("summary:") {
            let counts = counts(rest, nev, n)?;
            if counts.len() != nev {
                return Err(err(n, ParseErrorKind::SummaryMismatch));
            }
            summary = Some(counts);
        } else if l.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
            let (num, rest) = l.split_once(char::is_whitespace).unwrap_or((l, ""));
            let line: u32 = num
                .parse()
                .map_err(|_| err(n, ParseErrorKind::BadNumber(num.to_string())))?;
            let (Some(fl), Some(fnn)) = (&file, &func) else {
                return Err(err(n, ParseErrorKind::CostOutsideFunction));
            };
            let mut c = counts(rest, nev, n)?;
            c.resize(nev, 0);
            model.records.push(Record {
                file: fl.clone(),
                func: fnn.clone(),
                line,
                counts: c,
            });
        } else {
            return Err(err(
                n,
                ParseErrorKind::Malformed(l.chars().take(60).collect()),
            ));
        }
    }
    model.summary = summary.ok_or(err(last + 1, ParseErrorKind::MissingSummary))?;
    Ok(model)
}

fn counts(text: &str, nev: usize, n: usize) -> Result<Vec<u64>, ParseError> {
    let v = text
        .split_whitespace()
        .map(|t| {
            if t == "." {
                Ok(0)
            } else {
                t.parse::<u64>()
                    .map_err(|_| err(n, ParseErrorKind::BadNumber(t.to_string())))
            }
        })
        .collect::<Result<Vec<u64>, _>>()?;
    if v.len() > nev {
        return Err(err(n, ParseErrorKind::TooManyCounts));
    }
    Ok(v)
}

/// Program totals, as Cachegrind sums them for its exit summary.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub ir: u64,
    pub i1mr: u64,
    pub ilmr: u64,
    pub dr: u64,
    pub d1mr: u64,
    pub dlmr: u64,
    pub dw: u64,
    pub d1mw: u64,
    pub dlmw: u64,
    pub bc: u64,
    pub bcm: u64,
    pub bi: u64,
    pub bim: u64,
}

/// Width of `n` with thousands separators.
fn commified_width(n: u64) -> usize {
    commify(n).len()
}

/// The summary Cachegrind 3.19 prints at exit (`cg_fini`), one string per line without the
/// `==pid== ` prefix and without the newline. Includes Valgrind's quirks: a zero count of
/// conditional or indirect branches is printed as 1 (it replaces zero denominators before
/// printing), and the rate lines divide by 1 instead of 0.
pub fn summary_text(t: &Totals, cache_sim: bool, branch_sim: bool) -> Vec<String> {
    let mut out = Vec::new();
    let l1 = commified_width(t.ir);
    let l2 = commified_width(t.dr.max(t.bc));
    let l3 = commified_width(t.dw.max(t.bi));
    let one = |label: &str, n: u64| format!("{label} {:>l1$}", commify(n));
    let three = |label: &str, a: u64, b: u64, c: u64, kinds: (&str, &str)| {
        format!(
            "{label} {:>l1$}  ({:>l2$} {} + {:>l3$} {})",
            commify(a),
            commify(b),
            kinds.0,
            commify(c),
            kinds.1
        )
    };
    let pct = |n: u64, d: u64| n as f64 * 100.0 / d.max(1) as f64;
    out.push(one("I   refs:     ", t.ir));
    if cache_sim {
        out.push(one("I1  misses:   ", t.i1mr));
        out.push(one("LLi misses:   ", t.ilmr));
        out.push(format!("I1  miss rate: {:>l1$.2}%", pct(t.i1mr, t.ir)));
        out.push(format!("LLi miss rate: {:>l1$.2}%", pct(t.ilmr, t.ir)));
        out.push(String::new());
        let rw = ("rd  ", "wr");
        let (da, dm1, dml) = (t.dr + t.dw, t.d1mr + t.d1mw, t.dlmr + t.dlmw);
        out.push(three("D   refs:     ", da, t.dr, t.dw, rw));
        out.push(three("D1  misses:   ", dm1, t.d1mr, t.d1mw, rw));
        out.push(three("LLd misses:   ", dml, t.dlmr, t.dlmw, rw));
        let rate = |label: &str, a: f64, b: f64, c: f64| {
            format!("{label} {a:>l1$.1}% ({b:>l2$.1}%     + {c:>l3$.1}%  )")
        };
        out.push(rate(
            "D1  miss rate:",
            pct(dm1, da),
            pct(t.d1mr, t.dr),
            pct(t.d1mw, t.dw),
        ));
        out.push(rate(
            "LLd miss rate:",
            pct(dml, da),
            pct(t.dlmr, t.dr),
            pct(t.dlmw, t.dw),
        ));
        out.push(String::new());
        let (llr, llrr, llrw) = (t.d1mr + t.d1mw + t.i1mr, t.d1mr + t.i1mr, t.d1mw);
        out.push(three("LL refs:      ", llr, llrr, llrw, rw));
        let (llm, llmr, llmw) = (t.dlmr + t.dlmw + t.ilmr, t.dlmr + t.ilmr, t.dlmw);
        out.push(three("LL misses:    ", llm, llmr, llmw, rw));
        // Valgrind divides by Ir + D here with D already raised to 1 if it was 0.
        let d_total = da.max(1);
        let dr_total = t.dr.max(1);
        out.push(rate(
            "LL miss rate: ",
            llm as f64 * 100.0 / (t.ir.max(1) + d_total) as f64,
            llmr as f64 * 100.0 / (t.ir.max(1) + dr_total) as f64,
            pct(llmw, t.dw),
        ));
    }
    if branch_sim {
        let bc = t.bc.max(1);
        let bi = t.bi.max(1);
        out.push(String::new());
        let ci = ("cond", "ind)");
        let b = bc + bi;
        let m = t.bcm + t.bim;
        out.push(format!(
            "Branches:      {:>l1$}  ({:>l2$} {} + {:>l3$} {}",
            commify(b),
            commify(bc),
            ci.0,
            commify(bi),
            ci.1
        ));
        out.push(format!(
            "Mispredicts:   {:>l1$}  ({:>l2$} {} + {:>l3$} {}",
            commify(m),
            commify(t.bcm),
            ci.0,
            commify(t.bim),
            ci.1
        ));
        out.push(format!(
            "Mispred rate:  {:>l1$.1}% ({:>l2$.1}%     + {:>l3$.1}%   )",
            m as f64 * 100.0 / b as f64,
            t.bcm as f64 * 100.0 / bc as f64,
            t.bim as f64 * 100.0 / bi as f64
        ));
    }
    out
}
