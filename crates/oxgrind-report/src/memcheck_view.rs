//! The data of the Memcheck view: errors grouped by kind with their stacks (and the source
//! lines around each frame when the source file can be read where the report is made), and
//! the leak records by category.
//!
//! Source is read here, not by the page: a page opened from file:// cannot read other files,
//! and the report must stay one self-contained file. Only a few lines around each frame are
//! embedded, from files below [`MAX_SOURCE_BYTES`].

use crate::json::JsonOut;
use oxgrind_formats::frame::Frame;
use oxgrind_formats::memcheck_xml_reader::{Aux, MemcheckXml, XmlError};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Source files larger than this are not read (a generated file is not worth the page size).
const MAX_SOURCE_BYTES: u64 = 4 << 20;
/// Lines shown before and after a frame's line.
const CONTEXT_LINES: u32 = 2;

/// Leak kinds in the order of Valgrind's LEAK SUMMARY.
pub const LEAK_KINDS: [(&str, &str); 4] = [
    ("Leak_DefinitelyLost", "definitely lost"),
    ("Leak_IndirectlyLost", "indirectly lost"),
    ("Leak_PossiblyLost", "possibly lost"),
    ("Leak_StillReachable", "still reachable"),
];

/// One line of Valgrind's LEAK SUMMARY.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeakTotal {
    pub bytes: u64,
    /// `None` when the file does not say (indirect blocks with no record of their own).
    pub blocks: Option<u64>,
    /// Loss records of this kind in the file.
    pub records: u64,
}

/// `(direct, indirect)` bytes of a leak record: `80 (16 direct, 64 indirect) bytes in ...`
/// says both; a record without the parenthesis is all direct.
pub fn direct_indirect(e: &XmlError) -> (u64, u64) {
    let total = e.leak.map_or(0, |l| l.bytes);
    let parsed = (|| {
        let inner = e.what.split_once(" (")?.1.split_once(") bytes")?.0;
        let (d, i) = inner.split_once(" direct, ")?;
        let i = i.strip_suffix(" indirect")?;
        let num = |t: &str| t.replace(',', "").parse::<u64>().ok();
        Some((num(d)?, num(i)?))
    })();
    parsed.unwrap_or((total, 0))
}

/// Valgrind's LEAK SUMMARY (definitely, indirectly, possibly lost, still reachable) from the
/// loss records: a record's bytes include the indirect blocks hanging off it, which the
/// summary counts as indirectly lost, so each record contributes its direct part; indirectly
/// lost comes from its own records when the file has them (`--show-leak-kinds=all`), else
/// from the other records' indirect parts (then its block count is unknown).
pub fn leak_summary(doc: &MemcheckXml) -> [LeakTotal; 4] {
    let mut t = [LeakTotal::default(); 4];
    let mut indirect_parts = 0u64;
    for e in doc.errors.iter().filter(|e| e.is_leak()) {
        let Some(i) = LEAK_KINDS.iter().position(|(k, _)| *k == e.kind) else {
            continue;
        };
        let (direct, indirect) = direct_indirect(e);
        indirect_parts += indirect;
        t[i].bytes += direct;
        t[i].blocks = Some(t[i].blocks.unwrap_or(0) + e.leak.map_or(0, |l| l.blocks));
        t[i].records += 1;
    }
    for total in &mut t {
        if total.records == 0 {
            total.blocks = Some(0);
        }
    }
    if t[1].records == 0 && indirect_parts > 0 {
        t[1].bytes = indirect_parts;
        t[1].blocks = None;
    }
    t
}

/// Bytes leaked as Valgrind's summary counts them: definitely plus indirectly lost (the
/// figure `--max-leaked` and `oxgrind diff` use).
pub fn leaked_bytes(doc: &MemcheckXml) -> u64 {
    let t = leak_summary(doc);
    t[0].bytes + t[1].bytes
}

/// Source files read so far (by path), `None` when unreadable.
#[derive(Default)]
pub struct Sources {
    files: HashMap<PathBuf, Option<Vec<String>>>,
}

impl Sources {
    fn lines(&mut self, path: &Path) -> Option<&Vec<String>> {
        self.files
            .entry(path.to_path_buf())
            .or_insert_with(|| {
                let meta = std::fs::metadata(path).ok()?;
                if !meta.is_file() || meta.len() > MAX_SOURCE_BYTES {
                    return None;
                }
                let text = std::fs::read(path).ok()?;
                Some(
                    String::from_utf8_lossy(&text)
                        .lines()
                        .map(str::to_string)
                        .collect(),
                )
            })
            .as_ref()
    }

    /// (first line number, lines) around `frame`'s line, when its file can be read.
    fn around(&mut self, frame: &Frame, base: &[PathBuf]) -> Option<(u32, Vec<String>)> {
        let file = frame.file.as_deref()?;
        if frame.line == 0 {
            return None;
        }
        let mut candidates = Vec::new();
        if let Some(dir) = frame.dir.as_deref() {
            candidates.push(Path::new(dir).join(file));
        }
        candidates.extend(base.iter().map(|d| d.join(file)));
        candidates.push(PathBuf::from(file));
        for c in candidates {
            if let Some(lines) = self.lines(&c) {
                let line = frame.line as usize;
                if line > lines.len() {
                    continue;
                }
                let first = line.saturating_sub(CONTEXT_LINES as usize).max(1);
                let last = (line + CONTEXT_LINES as usize).min(lines.len());
                return Some((first as u32, lines[first - 1..last].to_vec()));
            }
        }
        None
    }
}

pub fn write_frame(j: &mut JsonOut, f: &Frame, sources: &mut Sources, base: &[PathBuf]) {
    j.obj().field_str("ip", &format!("0x{:X}", f.ip));
    j.key("fn").opt_str(f.function.as_deref());
    j.key("obj").opt_str(f.object.as_deref());
    j.key("dir").opt_str(f.dir.as_deref());
    j.key("file").opt_str(f.file.as_deref());
    j.field_u64("line", f.line as u64);
    j.field_str("text", &frame_text(f));
    if let Some((first, lines)) = sources.around(f, base) {
        j.key("src")
            .obj()
            .field_u64("first", first as u64)
            .key("lines")
            .arr();
        for l in &lines {
            j.str(l);
        }
        j.end_arr().end_obj();
    }
    j.end_obj();
}

/// The frame as Valgrind prints it, without the address: `main (mc_errors.c:24)`.
pub fn frame_text(f: &Frame) -> String {
    let text = f.to_string();
    crate::sites::without_address(&text).to_string()
}

/// How many times each error occurred (`<errorcounts>`; leaks and unlisted errors count 1).
pub fn counts(doc: &MemcheckXml) -> HashMap<u64, u64> {
    doc.error_counts.iter().map(|&(c, u)| (u, c)).collect()
}

fn write_error(j: &mut JsonOut, e: &XmlError, count: u64, sources: &mut Sources, base: &[PathBuf]) {
    j.obj()
        .field_str("kind", &e.kind)
        .field_str("what", &e.what)
        .field_u64("unique", e.unique)
        .field_u64("tid", e.tid)
        .field_u64("count", count);
    if let Some(l) = e.leak {
        j.key("leak")
            .obj()
            .field_u64("bytes", l.bytes)
            .field_u64("blocks", l.blocks)
            .end_obj();
    }
    j.key("stack").arr();
    for f in &e.stack {
        write_frame(j, f, sources, base);
    }
    j.end_arr();
    j.key("aux").arr();
    for a in &e.aux {
        match a {
            Aux::What(t) => {
                j.obj().field_str("what", t).end_obj();
            }
            Aux::Stack(s) => {
                j.obj().key("stack").arr();
                for f in s {
                    write_frame(j, f, sources, base);
                }
                j.end_arr().end_obj();
            }
        }
    }
    j.end_arr().end_obj();
}

/// `base`: directories where source files are looked up after the frame's own directory
/// (`--source-dir`s, then the XML file's directory).
pub fn write(j: &mut JsonOut, doc: &MemcheckXml, base: &[PathBuf]) {
    let counts = counts(doc);
    let mut sources = Sources::default();
    j.field_str("tool", &doc.tool)
        .key("pid")
        .i64(doc.pid)
        .field_str("cmd", &doc.argv.join(" "));
    j.key("errors").arr();
    for e in &doc.errors {
        let n = counts.get(&e.unique).copied().unwrap_or(1);
        write_error(j, e, n, &mut sources, base);
    }
    j.end_arr();
    j.key("leak_summary").arr();
    for (i, total) in leak_summary(doc).iter().enumerate() {
        let (kind, name) = LEAK_KINDS[i];
        j.obj()
            .field_str("kind", kind)
            .field_str("name", name)
            .field_u64("bytes", total.bytes);
        j.key("blocks");
        match total.blocks {
            Some(b) => j.u64(b),
            None => j.null(),
        };
        j.field_u64("records", total.records).end_obj();
    }
    j.end_arr();
    j.key("fatal_signal");
    match &doc.fatal_signal {
        Some(s) => {
            j.obj()
                .field_str("signame", &s.signame)
                .key("signo")
                .i64(s.signo as i64)
                .key("event")
                .opt_str(s.event.as_deref())
                .key("stack")
                .arr();
            for f in &s.stack {
                write_frame(j, f, &mut sources, base);
            }
            j.end_arr().end_obj();
        }
        None => {
            j.null();
        }
    }
}
