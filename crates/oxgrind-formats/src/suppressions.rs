//! Valgrind suppression files: the parser, the matcher and `--gen-suppressions` text
//! (formats.md §6).
//!
//! A suppression names an error kind (`Memcheck:Free`, `Memcheck:Leak`, ...) and a pattern
//! over the error's stack (`fun:`, `obj:`, `src:` lines with `*`/`?` globs, and `...` for any
//! number of frames). The parser reads exactly what Valgrind 3.19 reads, entries for other
//! tools are skipped, and a malformed file is an error that names the file and line, as
//! Valgrind's `FATAL: in suppressions file "F" near line N:` does.
//!
//! The matcher works on [`SuppFrame`]s (names already resolved) so it knows nothing of
//! symbolication; which error kind an error has is the tool's business ([`ErrorClass`]).

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

/// A set of leak kinds (`--show-leak-kinds`, `match-leak-kinds:`), as Valgrind's
/// `parse_enum_set` reads it: a comma list of `definite`, `indirect`, `possible`,
/// `reachable`, or `all` / `none`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct LeakKinds(pub u8);

/// One leak kind, in Memcheck's `Reachedness` order (the order loss records sort by).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LeakKind {
    Reachable = 0,
    Possible = 1,
    Indirect = 2,
    Definite = 3,
}

impl LeakKind {
    /// The word used in `match-leak-kinds:` and `--show-leak-kinds`.
    pub fn keyword(self) -> &'static str {
        match self {
            LeakKind::Reachable => "reachable",
            LeakKind::Possible => "possible",
            LeakKind::Indirect => "indirect",
            LeakKind::Definite => "definite",
        }
    }
}

impl LeakKinds {
    pub const NONE: LeakKinds = LeakKinds(0);
    pub const ALL: LeakKinds = LeakKinds(0b1111);
    /// Memcheck's default for `--show-leak-kinds` and `--errors-for-leak-kinds`.
    pub const DEFAULT: LeakKinds =
        LeakKinds((1 << LeakKind::Definite as u8) | (1 << LeakKind::Possible as u8));

    pub fn contains(self, k: LeakKind) -> bool {
        self.0 & (1 << k as u8) != 0
    }

    pub fn with(self, k: LeakKind) -> LeakKinds {
        LeakKinds(self.0 | (1 << k as u8))
    }

    /// Parses `definite,possible`, `all` or `none`; `None` on anything else (Valgrind
    /// rejects unknown words, repeated `all`/`none` mixed with names, and empty items).
    pub fn parse(text: &str) -> Option<LeakKinds> {
        match text {
            "all" => return Some(LeakKinds::ALL),
            "none" => return Some(LeakKinds::NONE),
            _ => {}
        }
        let mut set = LeakKinds::NONE;
        for word in text.split(',') {
            let k = match word {
                "definite" => LeakKind::Definite,
                "indirect" => LeakKind::Indirect,
                "possible" => LeakKind::Possible,
                "reachable" => LeakKind::Reachable,
                _ => return None,
            };
            set = set.with(k);
        }
        Some(set)
    }
}

/// The Memcheck suppression kinds of formats.md §6.2, with their extra line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SuppKind {
    /// `Addr1` .. `Addr32`: invalid read/write of that size.
    Addr(u32),
    /// `Value1` .. `Value32`: use of an uninitialised value of that size.
    Value(u32),
    /// `Cond` / `Value0`.
    Cond,
    /// `Param` and its required syscall parameter text.
    Param(String),
    /// `Free`: invalid and mismatched frees.
    Free,
    Overlap,
    /// `Leak` with its `match-leak-kinds:` (all kinds when absent).
    Leak(LeakKinds),
    Jump,
    User,
    CoreMem,
    Mempool,
    /// `FishyValue` with the `function(argument)` line.
    FishyValue {
        function: String,
        argument: String,
    },
    /// Kinds of Valgrind 3.21+ (`ReallocZero`, `BadAlign`, `BadSize`, `SizeMismatch`,
    /// `AlignMismatch`): recognised so newer files load.
    Newer(&'static str),
}

impl SuppKind {
    /// Recognises the part after `Memcheck:`; `None` is "unknown tool suppression type".
    /// Extra-line kinds come back with empty extras, filled by the parser.
    fn from_name(name: &str) -> Option<SuppKind> {
        let sized = |rest: &str| -> Option<u32> {
            match rest {
                "1" | "2" | "4" | "8" | "16" | "32" => rest.parse().ok(),
                _ => None,
            }
        };
        Some(match name {
            "Cond" | "Value0" => SuppKind::Cond,
            "Param" => SuppKind::Param(String::new()),
            "Free" => SuppKind::Free,
            "Overlap" => SuppKind::Overlap,
            "Leak" => SuppKind::Leak(LeakKinds::ALL),
            "Jump" => SuppKind::Jump,
            "User" => SuppKind::User,
            "CoreMem" => SuppKind::CoreMem,
            "Mempool" => SuppKind::Mempool,
            "FishyValue" => SuppKind::FishyValue {
                function: String::new(),
                argument: String::new(),
            },
            "ReallocZero" => SuppKind::Newer("ReallocZero"),
            "BadAlign" => SuppKind::Newer("BadAlign"),
            "BadSize" => SuppKind::Newer("BadSize"),
            "SizeMismatch" => SuppKind::Newer("SizeMismatch"),
            "AlignMismatch" => SuppKind::Newer("AlignMismatch"),
            _ => {
                if let Some(rest) = name.strip_prefix("Addr") {
                    SuppKind::Addr(sized(rest)?)
                } else if let Some(rest) = name.strip_prefix("Value") {
                    SuppKind::Value(sized(rest)?)
                } else {
                    return None;
                }
            }
        })
    }
}

/// One location line of a suppression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// `fun:PATTERN`, against the mangled function name (`???` when unknown).
    Fun(String),
    /// `obj:PATTERN`, against the object path.
    Obj(String),
    /// `src:PATTERN[:LINE]`, against the source file name (no directory).
    Src { file: String, line: Option<u32> },
    /// `...`: any number of frames, including none.
    Ellipsis,
}

/// One parsed suppression entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suppression {
    /// The name line (what `-s` and `<suppcounts>` print).
    pub name: String,
    /// The file as the user named it (`-s` prints `used_suppression: ... FILE:LINE`).
    pub file: String,
    /// Line number of the name line.
    pub line: u32,
    pub kind: SuppKind,
    pub locations: Vec<Location>,
}

/// A malformed suppression file. Displays as Valgrind's fatal message minus the prefix:
/// `in suppressions file "F" near line N:\n   reason`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuppParseError {
    pub file: String,
    pub line: u32,
    pub reason: &'static str,
}

impl fmt::Display for SuppParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "in suppressions file \"{}\" near line {}:\n   {}",
            self.file, self.line, self.reason
        )
    }
}

impl SuppParseError {
    /// The lines Valgrind prints (each to be prefixed `==PID== `) before exiting with 1.
    pub fn fatal_lines(&self) -> [String; 3] {
        [
            format!(
                "FATAL: in suppressions file \"{}\" near line {}:",
                self.file, self.line
            ),
            format!("   {}", self.reason),
            "exiting now.".to_string(),
        ]
    }
}

/// Non-blank, non-comment lines with their 1-based numbers, trimmed as Valgrind's
/// `get_nbnc_line` trims them.
struct Lines<'a> {
    inner: core::iter::Enumerate<core::str::Lines<'a>>,
    last: u32,
}

impl<'a> Lines<'a> {
    fn next_line(&mut self) -> Option<&'a str> {
        for (i, raw) in self.inner.by_ref() {
            self.last = i as u32 + 1;
            let t = raw.trim();
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            return Some(t);
        }
        None
    }
}

fn tool_name_present(tool: &str, names: &str) -> bool {
    names.split(',').any(|n| n == tool)
}

/// Parses a suppression file. `file` is the name to report (as the user gave it);
/// `tool` is Valgrind's tool name (`Memcheck`); entries for other tools are skipped.
/// `num_callers` truncates location lists as `--num-callers` does.
pub fn parse(
    file: &str,
    text: &str,
    tool: &str,
    num_callers: usize,
) -> Result<Vec<Suppression>, SuppParseError> {
    let mut lines = Lines {
        inner: text.lines().enumerate(),
        last: 0,
    };
    let mut out = Vec::new();
    let bomb = |lines: &Lines<'_>, reason: &'static str| SuppParseError {
        file: file.to_string(),
        line: lines.last,
        reason,
    };
    while let Some(open) = lines.next_line() {
        if open != "{" {
            return Err(bomb(&lines, "expected '{' or end-of-file"));
        }
        let name = match lines.next_line() {
            None | Some("}") => return Err(bomb(&lines, "unexpected '}'")),
            Some(n) => n,
        };
        let name_line = lines.last;
        let Some(kind_line) = lines.next_line() else {
            return Err(bomb(
                &lines,
                "unexpected end-of-file (expecting tool:suppr)",
            ));
        };
        let Some((tools, kind_name)) = kind_line.split_once(':') else {
            return Err(bomb(&lines, "malformed 'tool1,tool2,...:supp' line"));
        };
        if !tool_name_present(tool, tools) {
            loop {
                match lines.next_line() {
                    None => {
                        return Err(bomb(
                            &lines,
                            "unexpected end-of-file (when skipping suppression)",
                        ))
                    }
                    Some("}") => break,
                    Some(_) => {}
                }
            }
            continue;
        }
        let Some(mut kind) = SuppKind::from_name(kind_name) else {
            return Err(bomb(&lines, "unknown tool suppression type"));
        };
        // The extra line: required for Param and FishyValue, optional for Leak. As in
        // Valgrind's `VG_(get_line)`, a line starting `fun:`/`obj:` or equal to `...` is not
        // an extra line; for Leak it is handed to the location loop.
        let is_location = |l: &str| l.starts_with("fun:") || l.starts_with("obj:") || l == "...";
        let mut pending: Option<&str> = None;
        match &mut kind {
            SuppKind::Param(p) => match lines.next_line() {
                Some(l) if !is_location(l) => *p = l.to_string(),
                _ => return Err(bomb(&lines, "bad or missing extra suppression info")),
            },
            SuppKind::FishyValue { function, argument } => {
                let parsed = lines.next_line().filter(|l| !is_location(l)).and_then(|l| {
                    let (f, rest) = l.split_once('(')?;
                    let a = rest.strip_suffix(')')?;
                    Some((f, a))
                });
                match parsed {
                    Some((f, a)) => {
                        *function = f.to_string();
                        *argument = a.to_string();
                    }
                    None => return Err(bomb(&lines, "bad or missing extra suppression info")),
                }
            }
            SuppKind::Leak(kinds) => match lines.next_line() {
                None => {
                    return Err(bomb(
                        &lines,
                        "unexpected end-of-file (when reading stack trace)",
                    ))
                }
                Some(l) if is_location(l) => pending = Some(l),
                Some(l) => match l
                    .strip_prefix("match-leak-kinds:")
                    .map(|r| LeakKinds::parse(r.trim_start()))
                {
                    Some(Some(k)) => *kinds = k,
                    _ => return Err(bomb(&lines, "bad or missing extra suppression info")),
                },
            },
            _ => {}
        }
        let mut locations = Vec::new();
        let mut closed = false;
        loop {
            let l = match pending.take().or_else(|| lines.next_line()) {
                None => {
                    return Err(bomb(
                        &lines,
                        "unexpected end-of-file (when reading stack trace)",
                    ))
                }
                Some(l) => l,
            };
            if l == "}" {
                if locations.is_empty() {
                    return Err(bomb(&lines, "missing stack trace"));
                }
                closed = true;
                break;
            }
            if locations.len() >= 500 {
                return Err(bomb(&lines, "too many callers in stack trace"));
            }
            if !locations.is_empty() && locations.len() >= num_callers {
                break;
            }
            locations.push(parse_location(l).ok_or_else(|| {
                bomb(
                    &lines,
                    "location should be \"...\", or should start with \"fun:\", \"obj:\", or \"src:\"",
                )
            })?);
        }
        if !closed {
            // More locations than --num-callers: skip to the closing brace.
            loop {
                match lines.next_line() {
                    None | Some("}") => break,
                    Some(_) => {}
                }
            }
        }
        if locations.iter().all(|l| *l == Location::Ellipsis) {
            if !closed {
                // Only `...` survived the --num-callers cut: the entry would match every
                // stack. Valgrind refuses the file here; we drop the entry, so a small
                // --num-callers never makes a valid file (ours included) unusable.
                continue;
            }
            return Err(bomb(
                &lines,
                "suppression must contain at least one location line which is not \"...\"",
            ));
        }
        out.push(Suppression {
            name: name.to_string(),
            file: file.to_string(),
            line: name_line,
            kind,
            locations,
        });
    }
    Ok(out)
}

fn parse_location(l: &str) -> Option<Location> {
    if l == "..." {
        return Some(Location::Ellipsis);
    }
    if let Some(p) = l.strip_prefix("fun:") {
        return Some(Location::Fun(p.to_string()));
    }
    if let Some(p) = l.strip_prefix("obj:") {
        return Some(Location::Obj(p.to_string()));
    }
    if let Some(p) = l.strip_prefix("src:") {
        // `src:file.c:52`: everything after the first `:` is the line (0: any line).
        return Some(match p.split_once(':') {
            Some((file, line)) => {
                let digits: &str = &line[..line.bytes().take_while(u8::is_ascii_digit).count()];
                let n = digits.parse::<u32>().unwrap_or(0);
                Location::Src {
                    file: file.to_string(),
                    line: (n != 0).then_some(n),
                }
            }
            None => Location::Src {
                file: p.to_string(),
                line: None,
            },
        });
    }
    None
}

/// Valgrind's glob: `*` any run (also empty), `?` one character, everything else literal,
/// the whole name must match.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p = pattern.as_bytes();
    let n = name.as_bytes();
    // Iterative matcher with one backtrack point for the last `*` (linear for typical names).
    let (mut pi, mut ni) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == n[ni]) && p[pi] != b'*' {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

/// What the matcher knows of one frame (after inline expansion).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SuppFrame {
    /// Mangled function name; `None` when unknown (matches as `???`).
    pub fun: Option<String>,
    /// Object path; `None` when unknown (matches as `???`).
    pub obj: Option<String>,
    pub file: Option<String>,
    pub line: u32,
}

fn location_matches(loc: &Location, f: &SuppFrame) -> bool {
    match loc {
        Location::Fun(p) => glob_match(p, f.fun.as_deref().unwrap_or("???")),
        Location::Obj(p) => glob_match(p, f.obj.as_deref().unwrap_or("???")),
        Location::Src { file, line } => match &f.file {
            Some(name) => glob_match(file, name) && line.map_or(true, |l| l == f.line),
            None => false,
        },
        Location::Ellipsis => true,
    }
}

/// Whether `locs` matches a prefix of `frames` (innermost first), `...` standing for any
/// number of frames.
pub fn stack_matches(locs: &[Location], frames: &[SuppFrame]) -> bool {
    match locs.split_first() {
        None => true,
        Some((Location::Ellipsis, rest)) => {
            (0..=frames.len()).any(|skip| stack_matches(rest, &frames[skip..]))
        }
        Some((loc, rest)) => match frames.split_first() {
            Some((f, more)) => location_matches(loc, f) && stack_matches(rest, more),
            None => false,
        },
    }
}

/// The kind-related facts of an error that a suppression's kind line is compared with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorClass<'a> {
    Addr(u32),
    Value(u32),
    Cond,
    Param(&'a str),
    /// Invalid free and mismatched free.
    Free,
    Overlap,
    Leak(LeakKind),
    Jump,
    User,
    CoreMem,
    Mempool,
    FishyValue {
        function: &'a str,
        argument: &'a str,
    },
    Newer(&'static str),
}

impl Suppression {
    /// Whether this entry suppresses an error of class `class` with stack `frames`.
    pub fn matches(&self, class: &ErrorClass<'_>, frames: &[SuppFrame]) -> bool {
        let kind_ok = match (&self.kind, class) {
            (SuppKind::Addr(a), ErrorClass::Addr(b)) => a == b,
            (SuppKind::Value(a), ErrorClass::Value(b)) => a == b,
            (SuppKind::Cond, ErrorClass::Cond) => true,
            (SuppKind::Param(a), ErrorClass::Param(b)) => a == b,
            (SuppKind::Free, ErrorClass::Free) => true,
            (SuppKind::Overlap, ErrorClass::Overlap) => true,
            (SuppKind::Leak(kinds), ErrorClass::Leak(k)) => kinds.contains(*k),
            (SuppKind::Jump, ErrorClass::Jump) => true,
            (SuppKind::User, ErrorClass::User) => true,
            (SuppKind::CoreMem, ErrorClass::CoreMem) => true,
            (SuppKind::Mempool, ErrorClass::Mempool) => true,
            (
                SuppKind::FishyValue { function, argument },
                ErrorClass::FishyValue {
                    function: f,
                    argument: a,
                },
            ) => function == f && argument == a,
            (SuppKind::Newer(a), ErrorClass::Newer(b)) => a == b,
            _ => false,
        };
        kind_ok && stack_matches(&self.locations, frames)
    }
}

impl ErrorClass<'_> {
    /// The suppression kind name (`Addr4`, `Free`, `Leak`, ...) `--gen-suppressions` prints.
    pub fn supp_kind_name(&self) -> String {
        match self {
            ErrorClass::Addr(n) => format!("Addr{n}"),
            ErrorClass::Value(n) => format!("Value{n}"),
            ErrorClass::Cond => "Cond".into(),
            ErrorClass::Param(_) => "Param".into(),
            ErrorClass::Free => "Free".into(),
            ErrorClass::Overlap => "Overlap".into(),
            ErrorClass::Leak(_) => "Leak".into(),
            ErrorClass::Jump => "Jump".into(),
            ErrorClass::User => "User".into(),
            ErrorClass::CoreMem => "CoreMem".into(),
            ErrorClass::Mempool => "Mempool".into(),
            ErrorClass::FishyValue { .. } => "FishyValue".into(),
            ErrorClass::Newer(n) => (*n).into(),
        }
    }

    /// The extra line `--gen-suppressions` prints after the kind, if any.
    pub fn supp_extra(&self) -> Option<String> {
        match self {
            ErrorClass::Param(p) => Some((*p).into()),
            ErrorClass::Leak(k) => Some(format!("match-leak-kinds: {}", k.keyword())),
            ErrorClass::FishyValue { function, argument } => {
                Some(format!("{function}({argument})"))
            }
            _ => None,
        }
    }
}

/// One location line of a generated suppression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GenFrame {
    Fun(String),
    Obj(String),
    /// Nothing known: `obj:*`.
    Unknown,
}

impl GenFrame {
    /// `fun:` when the (mangled) name is known, else `obj:`, else `obj:*`.
    pub fn from_frame(f: &SuppFrame) -> GenFrame {
        match (&f.fun, &f.obj) {
            (Some(n), _) => GenFrame::Fun(n.clone()),
            (None, Some(o)) => GenFrame::Obj(o.clone()),
            (None, None) => GenFrame::Unknown,
        }
    }
}

/// A suppression as `--gen-suppressions` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratedSupp {
    /// `Memcheck:Leak`.
    pub kind: String,
    pub extra: Option<String>,
    pub frames: Vec<GenFrame>,
}

impl GeneratedSupp {
    /// The text form (no log prefixes), ending with `}\n`.
    pub fn text(&self) -> String {
        let mut s = String::from("{\n   <insert_a_suppression_name_here>\n");
        s.push_str("   ");
        s.push_str(&self.kind);
        s.push('\n');
        if let Some(x) = &self.extra {
            s.push_str("   ");
            s.push_str(x);
            s.push('\n');
        }
        for f in &self.frames {
            match f {
                GenFrame::Fun(n) => {
                    s.push_str("   fun:");
                    s.push_str(n);
                }
                GenFrame::Obj(o) => {
                    s.push_str("   obj:");
                    s.push_str(o);
                }
                GenFrame::Unknown => s.push_str("   obj:*"),
            }
            s.push('\n');
        }
        s.push_str("}\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_SUPP: &str = "# comment line\n{\n   addr4-in-main\n   Memcheck:Addr4\n   fun:main\n}\n{\n   leak-indirect-wild\n   Memcheck:Leak\n   match-leak-kinds: definite,indirect\n   fun:*alloc\n   fun:leak_ind*\n   ...\n}\n{\n   param-write\n   Memcheck:Param\n   write(buf)\n   ...\n   fun:main\n}\n{\n   fishy\n   Memcheck:FishyValue\n   malloc(size)\n   fun:malloc\n   src:mc_errors.c:52\n}\n{\n   other-tool-ignored\n   Helgrind:Race\n   fun:foo\n}\n";

    fn fr(fun: &str) -> SuppFrame {
        SuppFrame {
            fun: Some(fun.into()),
            obj: Some("/bin/prog".into()),
            file: None,
            line: 0,
        }
    }

    #[test]
    fn reference_test_supp_parses_with_name_lines_and_skips_other_tools() {
        let s = parse("test.supp", TEST_SUPP, "Memcheck", 12).unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!((s[0].name.as_str(), s[0].line), ("addr4-in-main", 3));
        assert_eq!((s[1].name.as_str(), s[1].line), ("leak-indirect-wild", 8));
        assert_eq!(
            s[1].kind,
            SuppKind::Leak(
                LeakKinds(0)
                    .with(LeakKind::Definite)
                    .with(LeakKind::Indirect)
            )
        );
        assert_eq!(s[2].kind, SuppKind::Param("write(buf)".into()));
        assert_eq!(s[3].line, 23);
        assert_eq!(
            s[3].locations[1],
            Location::Src {
                file: "mc_errors.c".into(),
                line: Some(52)
            }
        );
    }

    #[test]
    fn leak_suppression_without_match_leak_kinds_keeps_first_location() {
        let s = parse(
            "a.supp",
            "{\n n\n Memcheck:Leak\n fun:malloc\n}\n",
            "Memcheck",
            12,
        )
        .unwrap();
        assert_eq!(s[0].kind, SuppKind::Leak(LeakKinds::ALL));
        assert_eq!(s[0].locations, [Location::Fun("malloc".into())]);
    }

    #[test]
    fn malformed_files_report_file_line_and_reason() {
        let cases: &[(&str, u32, &str)] = &[
            ("x\n", 1, "expected '{' or end-of-file"),
            ("{\n}\n", 2, "unexpected '}'"),
            (
                "{\nname\nMemcheck:Bogus\nfun:f\n}\n",
                3,
                "unknown tool suppression type",
            ),
            ("{\nname\nMemcheck:Free\n}\n", 4, "missing stack trace"),
            (
                "{\nname\nMemcheck:Free\nfoo:bar\n}\n",
                4,
                "location should be \"...\", or should start with \"fun:\", \"obj:\", or \"src:\"",
            ),
            (
                "{\nname\nMemcheck:Free\n...\n}\n",
                5,
                "suppression must contain at least one location line which is not \"...\"",
            ),
            (
                "{\nname\nMemcheckFree\n",
                3,
                "malformed 'tool1,tool2,...:supp' line",
            ),
            (
                "{\nname\nMemcheck:Param\nfun:write\n}\n",
                4,
                "bad or missing extra suppression info",
            ),
            (
                "{\nname\nMemcheck:Leak\nwhatever\nfun:f\n}\n",
                4,
                "bad or missing extra suppression info",
            ),
            (
                "\n\n{\nname\nMemcheck:Leak\nmatch-leak-kinds: sometimes\nfun:f\n}\n",
                6,
                "bad or missing extra suppression info",
            ),
            (
                "{\nname\nMemcheck:Free\nfun:f\n",
                4,
                "unexpected end-of-file (when reading stack trace)",
            ),
        ];
        for (text, line, reason) in cases {
            let e = parse("bad.supp", text, "Memcheck", 12).unwrap_err();
            assert_eq!((e.line, e.reason), (*line, *reason), "{text:?}");
            assert_eq!(e.file, "bad.supp");
        }
        let e = parse("bad.supp", "x\n", "Memcheck", 12).unwrap_err();
        assert_eq!(
            e.fatal_lines()[0],
            "FATAL: in suppressions file \"bad.supp\" near line 1:"
        );
        assert_eq!(e.fatal_lines()[1], "   expected '{' or end-of-file");
    }

    #[test]
    fn locations_beyond_num_callers_are_dropped() {
        let s = parse(
            "a",
            "{\nn\nMemcheck:Free\nfun:a\nfun:b\nfun:c\n}\n{\nm\nMemcheck:Free\nfun:x\n}\n",
            "Memcheck",
            2,
        )
        .unwrap();
        assert_eq!(s[0].locations.len(), 2);
        assert_eq!(s[1].name, "m");
    }

    #[test]
    fn glob_matches_star_and_question_mark_over_whole_name() {
        assert!(glob_match("*alloc", "malloc"));
        assert!(glob_match("*alloc", "alloc"));
        assert!(!glob_match("*alloc", "malloc2"));
        assert!(glob_match("_Z?w*", "_Znwm"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxbyy"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("?", ""));
        assert!(glob_match("main", "main"));
        assert!(!glob_match("Main", "main"));
    }

    #[test]
    fn ellipsis_matches_zero_or_more_frames_and_pattern_is_a_prefix() {
        let stack = [
            fr("malloc"),
            fr("leak_indirect"),
            fr("main"),
            fr("__libc_start_call_main"),
        ];
        let p = |v: &[&str]| -> Vec<Location> {
            v.iter().map(|l| parse_location(l).unwrap()).collect()
        };
        assert!(stack_matches(
            &p(&["fun:malloc", "...", "fun:main"]),
            &stack
        ));
        assert!(stack_matches(&p(&["...", "fun:malloc"]), &stack));
        assert!(stack_matches(
            &p(&["fun:malloc", "fun:leak_indirect", "..."]),
            &stack
        ));
        assert!(stack_matches(&p(&["fun:malloc"]), &stack));
        assert!(!stack_matches(&p(&["fun:leak_indirect"]), &stack));
        assert!(!stack_matches(&p(&["...", "fun:nothere"]), &stack));
        assert!(stack_matches(
            &p(&["...", "fun:__libc_start_call_main", "..."]),
            &stack
        ));
        assert!(!stack_matches(
            &p(&[
                "fun:malloc",
                "fun:leak_indirect",
                "fun:main",
                "fun:*",
                "fun:x"
            ]),
            &stack
        ));
        assert!(stack_matches(&p(&["obj:/bin/*"]), &stack));
        let unknown = [SuppFrame::default()];
        assert!(stack_matches(&p(&["fun:???"]), &unknown));
        assert!(stack_matches(&p(&["obj:*"]), &unknown));
    }

    #[test]
    fn kinds_and_extras_must_agree_for_a_match() {
        let s = parse("test.supp", TEST_SUPP, "Memcheck", 12).unwrap();
        let main = [fr("main")];
        assert!(s[0].matches(&ErrorClass::Addr(4), &main));
        assert!(!s[0].matches(&ErrorClass::Addr(8), &main));
        let leak = [fr("malloc"), fr("leak_indirect"), fr("main")];
        assert!(s[1].matches(&ErrorClass::Leak(LeakKind::Indirect), &leak));
        assert!(s[1].matches(&ErrorClass::Leak(LeakKind::Definite), &leak));
        assert!(!s[1].matches(&ErrorClass::Leak(LeakKind::Possible), &leak));
        assert!(s[2].matches(&ErrorClass::Param("write(buf)"), &[fr("write"), fr("main")]));
        assert!(!s[2].matches(&ErrorClass::Param("read(buf)"), &[fr("write"), fr("main")]));
        let fishy_stack = [
            fr("malloc"),
            SuppFrame {
                fun: Some("main".into()),
                obj: None,
                file: Some("mc_errors.c".into()),
                line: 52,
            },
        ];
        assert!(s[3].matches(
            &ErrorClass::FishyValue {
                function: "malloc",
                argument: "size"
            },
            &fishy_stack
        ));
        assert!(!s[3].matches(
            &ErrorClass::FishyValue {
                function: "calloc",
                argument: "size"
            },
            &fishy_stack
        ));
        let other_line = [
            fr("malloc"),
            SuppFrame {
                line: 53,
                ..fishy_stack[1].clone()
            },
        ];
        assert!(!s[3].matches(
            &ErrorClass::FishyValue {
                function: "malloc",
                argument: "size"
            },
            &other_line
        ));
    }

    #[test]
    fn generated_suppression_text_is_valgrinds() {
        let g = GeneratedSupp {
            kind: "Memcheck:Leak".into(),
            extra: ErrorClass::Leak(LeakKind::Definite).supp_extra(),
            frames: vec![
                GenFrame::Fun("malloc".into()),
                GenFrame::Obj("/lib/x.so".into()),
                GenFrame::Unknown,
            ],
        };
        assert_eq!(
            g.text(),
            "{\n   <insert_a_suppression_name_here>\n   Memcheck:Leak\n   match-leak-kinds: definite\n   fun:malloc\n   obj:/lib/x.so\n   obj:*\n}\n"
        );
        // And what we generate parses back and matches.
        let s = parse("gen", &g.text(), "Memcheck", 12).unwrap();
        assert_eq!(s[0].name, "<insert_a_suppression_name_here>");
    }

    #[test]
    fn leak_kinds_parse_like_valgrind() {
        assert_eq!(LeakKinds::parse("all"), Some(LeakKinds::ALL));
        assert_eq!(LeakKinds::parse("none"), Some(LeakKinds::NONE));
        assert_eq!(
            LeakKinds::parse("definite,possible"),
            Some(LeakKinds::DEFAULT)
        );
        assert_eq!(LeakKinds::parse("definite,bogus"), None);
        assert_eq!(LeakKinds::parse(""), None);
    }
}

#[cfg(test)]
mod short_stack_tests {
    use super::*;

    fn frame(fun: &str, obj: &str) -> SuppFrame {
        SuppFrame {
            fun: Some(fun.into()),
            obj: Some(obj.into()),
            file: None,
            line: 0,
        }
    }

    /// Regression: with --num-callers=2 a program's own still-reachable block was swallowed
    /// by the default libstdc++ emergency-pool suppression.
    #[test]
    fn a_pattern_longer_than_the_stack_does_not_match() {
        let locs = vec![
            Location::Fun("malloc".into()),
            Location::Ellipsis,
            Location::Obj("*libstdc++.so*".into()),
            Location::Ellipsis,
            Location::Fun("call_init*".into()),
        ];
        let stack = [
            frame("malloc", "/x/liboxgrind_runtime.so"),
            frame("keep_reachable", "/tmp/t/mch"),
        ];
        assert!(!stack_matches(&locs, &stack));
    }
}
