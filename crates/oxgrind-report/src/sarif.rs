//! Memcheck's errors as SARIF 2.1.0 (`oxgrind report --format=sarif`), the format code-scanning
//! services and IDEs read, so Memcheck's findings show inline beside the code.
//!
//! One result per error context: `ruleId` is Valgrind's kind (`InvalidRead`,
//! `Leak_DefinitelyLost`...), the message its headline, the location the first frame with a
//! source line (the allocator's own frames have none), and every other frame as a related
//! location, the auxiliary stacks (where the block was allocated or freed) after them with
//! Valgrind's aux text on their first frame. The whole stacks are also in `stacks`, which
//! viewers that understand SARIF call stacks show as such. `occurrenceCount` is Valgrind's
//! count for the context; `partialFingerprints` keys the context by kind and stack (without
//! addresses), so a service sees the same error across runs and rebuilds.
//!
//! Source paths under the source root (the current directory unless `--source-root` says
//! otherwise) are written relative to it with `uriBaseId` `SRCROOT`, as code-scanning services
//! want them; others as absolute `file://` URIs.

use crate::input::{Data, Input};
use crate::json::JsonOut;
use crate::memcheck_view::counts;
use crate::sites::stack_key;
use oxgrind_formats::frame::Frame;
use oxgrind_formats::memcheck_xml_reader::{Aux, MemcheckXml, XmlError};
use std::path::{Path, PathBuf};

/// Where SARIF URIs are made relative to.
#[derive(Clone, Debug)]
pub struct SarifOptions {
    pub source_root: PathBuf,
}

impl Default for SarifOptions {
    fn default() -> Self {
        SarifOptions {
            source_root: std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
        }
    }
}

/// One-line descriptions of Memcheck's kinds (formats.md §5.2), for SARIF rules.
fn describe(kind: &str) -> &'static str {
    match kind {
        "InvalidRead" => "Read of memory the program may not access",
        "InvalidWrite" => "Write to memory the program may not access",
        "InvalidFree" => "free/delete of memory that is not a live heap block",
        "MismatchedFree" => "Block freed with a function that does not match its allocation",
        "InvalidJump" => "Jump to an address that holds no code",
        "Overlap" => "Overlapping source and destination in a copy",
        "InvalidMemPool" => "Invalid memory-pool operation",
        "UninitCondition" => "Conditional jump or move depends on uninitialised values",
        "UninitValue" => "Use of an uninitialised value",
        "SyscallParam" => "System call parameter is uninitialised or unaddressable",
        "ClientCheck" => "Client check request failed",
        "FishyValue" => "Argument has a fishy (possibly negative) value",
        "CoreMemError" => "Memory error found by the core",
        "ReallocSizeZero" => "realloc() with size 0",
        "Leak_DefinitelyLost" => "Memory leak: block definitely lost",
        "Leak_IndirectlyLost" => "Memory leak: block lost through a lost block",
        "Leak_PossiblyLost" => "Memory leak: block possibly lost (only interior pointers)",
        "Leak_StillReachable" => "Block still reachable at exit",
        _ => "Memcheck error",
    }
}

fn level(kind: &str) -> &'static str {
    match kind {
        "Leak_PossiblyLost" => "warning",
        "Leak_StillReachable" => "note",
        _ => "error",
    }
}

/// FNV-1a, 64 bits: a stable fingerprint without a dependency.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

struct Writer<'a> {
    j: JsonOut,
    options: &'a SarifOptions,
}

impl Writer<'_> {
    /// `{"uri": ..., "uriBaseId"?: ...}` for a frame's source file, if it has one.
    fn artifact(&mut self, f: &Frame) -> bool {
        let Some(file) = f.file.as_deref() else {
            return false;
        };
        let full = match f.dir.as_deref() {
            Some(d) => Path::new(d).join(file),
            None => PathBuf::from(file),
        };
        self.j.key("artifactLocation").obj();
        match full.strip_prefix(&self.options.source_root) {
            Ok(rel) if full.is_absolute() => {
                self.j
                    .field_str("uri", &uri_path(rel))
                    .field_str("uriBaseId", "SRCROOT");
            }
            _ if full.is_absolute() => {
                self.j
                    .field_str("uri", &format!("file://{}", uri_path(&full)));
            }
            // A bare file name (no DWARF directory): relative to the source root.
            _ => {
                self.j
                    .field_str("uri", &uri_path(&full))
                    .field_str("uriBaseId", "SRCROOT");
            }
        }
        self.j.end_obj();
        true
    }

    /// A SARIF location object for a frame (`id` for related locations).
    fn location(&mut self, f: &Frame, id: Option<u64>, message: Option<&str>) {
        self.j.obj();
        if let Some(id) = id {
            self.j.field_u64("id", id);
        }
        if let Some(m) = message {
            self.j.key("message").obj().field_str("text", m).end_obj();
        }
        if f.file.is_some() && f.line > 0 {
            self.j.key("physicalLocation").obj();
            self.artifact(f);
            self.j
                .key("region")
                .obj()
                .field_u64("startLine", f.line as u64)
                .end_obj();
            self.j.end_obj();
        }
        let name = f.function.as_deref().unwrap_or("???");
        self.j
            .key("logicalLocations")
            .arr()
            .obj()
            .field_str("name", name)
            .field_str("kind", "function");
        if let Some(obj) = f.object.as_deref() {
            self.j
                .key("properties")
                .obj()
                .field_str("object", obj)
                .end_obj();
        }
        self.j.end_obj().end_arr();
        self.j
            .key("properties")
            .obj()
            .field_str("address", &format!("0x{:X}", f.ip))
            .end_obj();
        self.j.end_obj();
    }

    fn stack(&mut self, frames: &[Frame], message: &str) {
        self.j
            .obj()
            .key("message")
            .obj()
            .field_str("text", message)
            .end_obj();
        self.j.key("frames").arr();
        for f in frames {
            self.j.obj().key("location");
            self.location(f, None, Some(&crate::memcheck_view::frame_text(f)));
            self.j.end_obj();
        }
        self.j.end_arr().end_obj();
    }

    fn result(&mut self, e: &XmlError, rule_index: usize, count: u64) {
        let j = &mut self.j;
        j.obj()
            .field_str("ruleId", &e.kind)
            .field_u64("ruleIndex", rule_index as u64)
            .field_str("level", level(&e.kind));
        j.key("message").obj().field_str("text", &e.what).end_obj();
        j.field_u64("occurrenceCount", count.max(1));
        // The primary location: the first frame with a source line, else the first frame.
        let primary = e
            .stack
            .iter()
            .position(|f| f.file.is_some() && f.line > 0)
            .unwrap_or(0);
        j.key("locations").arr();
        if let Some(f) = e.stack.get(primary) {
            self.location(f, None, None);
        }
        self.j.end_arr();
        // Every other frame, then the aux stacks, each first frame with its aux text.
        self.j.key("relatedLocations").arr();
        let mut id = 1u64;
        for (i, f) in e.stack.iter().enumerate() {
            if i != primary {
                let what = if i < primary {
                    "called from here (allocator)"
                } else {
                    "called from"
                };
                let text = format!("{what}: {}", crate::memcheck_view::frame_text(f));
                self.location(f, Some(id), Some(&text));
                id += 1;
            }
        }
        let mut pending: Option<&str> = None;
        for a in &e.aux {
            match a {
                Aux::What(t) => pending = Some(t),
                Aux::Stack(s) => {
                    for (i, f) in s.iter().enumerate() {
                        let text = match (i, pending) {
                            (0, Some(t)) => format!("{t}: {}", crate::memcheck_view::frame_text(f)),
                            _ => format!("by {}", crate::memcheck_view::frame_text(f)),
                        };
                        self.location(f, Some(id), Some(&text));
                        id += 1;
                    }
                    pending = None;
                }
            }
        }
        self.j.end_arr();
        self.j.key("stacks").arr();
        self.stack(&e.stack, &e.what);
        let mut pending = "";
        for a in &e.aux {
            match a {
                Aux::What(t) => pending = t,
                Aux::Stack(s) => self.stack(
                    s,
                    if pending.is_empty() {
                        "auxiliary stack"
                    } else {
                        pending
                    },
                ),
            }
        }
        self.j.end_arr();
        let texts: Vec<String> = e.stack.iter().map(|f| f.to_string()).collect();
        let key = format!("{}:{}", e.kind, stack_key(texts.iter().map(String::as_str)));
        self.j
            .key("partialFingerprints")
            .obj()
            .field_str("oxgrindStack/v1", &format!("{:016x}", fnv(&key)))
            .end_obj();
        if let Some(l) = e.leak {
            self.j
                .key("properties")
                .obj()
                .field_u64("leakedBytes", l.bytes)
                .field_u64("leakedBlocks", l.blocks)
                .end_obj();
        }
        self.j.end_obj();
    }
}

/// Percent-encodes what a URI path may not hold raw.
fn uri_path(p: &Path) -> String {
    let mut out = String::new();
    for b in p.to_string_lossy().bytes() {
        match b {
            b'A'..=b'Z'
            | b'a'..=b'z'
            | b'0'..=b'9'
            | b'/'
            | b'-'
            | b'_'
            | b'.'
            | b'~'
            | b'+'
            | b'@' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The SARIF log for Memcheck documents (one run per document).
pub fn sarif(docs: &[(&Path, &MemcheckXml)], options: &SarifOptions) -> String {
    let mut w = Writer {
        j: JsonOut::new(),
        options,
    };
    w.j.obj()
        .field_str("$schema", "https://json.schemastore.org/sarif-2.1.0.json")
        .field_str("version", "2.1.0")
        .key("runs")
        .arr();
    for (path, doc) in docs {
        let mut rules: Vec<&str> = Vec::new();
        for e in &doc.errors {
            if !rules.contains(&e.kind.as_str()) {
                rules.push(&e.kind);
            }
        }
        w.j.obj().key("tool").obj().key("driver").obj();
        w.j.field_str("name", "Memcheck")
            .field_str("fullName", "Memcheck (read by oxgrind report)")
            .field_str(
                "informationUri",
                "https://valgrind.org/docs/manual/mc-manual.html",
            );
        if let Some(v) = doc.preamble.iter().find_map(|l| {
            l.split("Valgrind-")
                .nth(1)
                .map(|r| r.split(' ').next().unwrap_or(""))
        }) {
            w.j.field_str("version", v);
        }
        w.j.key("rules").arr();
        for r in &rules {
            w.j.obj()
                .field_str("id", r)
                .field_str("name", r)
                .key("shortDescription")
                .obj()
                .field_str("text", describe(r))
                .end_obj()
                .field_str(
                    "helpUri",
                    "https://valgrind.org/docs/manual/mc-manual.html#mc-manual.errormsgs",
                )
                .key("defaultConfiguration")
                .obj()
                .field_str("level", level(r))
                .end_obj()
                .end_obj();
        }
        w.j.end_arr().end_obj().end_obj();
        let root = uri_path(&options.source_root);
        let root = if root.ends_with('/') {
            root
        } else {
            format!("{root}/")
        };
        w.j.key("originalUriBaseIds")
            .obj()
            .key("SRCROOT")
            .obj()
            .field_str("uri", &format!("file://{root}"))
            .end_obj()
            .end_obj();
        w.j.key("invocations").arr().obj();
        w.j.field_str("commandLine", &doc.argv.join(" "));
        w.j.key("executionSuccessful")
            .bool(doc.fatal_signal.is_none());
        w.j.key("properties")
            .obj()
            .key("pid")
            .i64(doc.pid)
            .field_str("xmlFile", &path.display().to_string())
            .end_obj();
        w.j.end_obj().end_arr();
        let counts = counts(doc);
        w.j.key("results").arr();
        for e in &doc.errors {
            let idx = rules.iter().position(|r| *r == e.kind).unwrap_or(0);
            w.result(e, idx, counts.get(&e.unique).copied().unwrap_or(1));
        }
        w.j.end_arr().end_obj();
    }
    w.j.end_arr().end_obj();
    let mut s = w.j.finish();
    s.push('\n');
    s
}

/// SARIF for the Memcheck files among `inputs`; an error if there are none.
pub fn from_inputs(inputs: &[Input], options: &SarifOptions) -> Result<String, String> {
    let mut docs = Vec::new();
    for i in inputs {
        match &i.data {
            Data::Memcheck(d) => docs.push((i.path.as_path(), d)),
            other => {
                return Err(format!(
                    "{}: SARIF is for Memcheck's errors; this is a {} file",
                    i.path.display(),
                    other.kind()
                ))
            }
        }
    }
    Ok(sarif(&docs, options))
}
