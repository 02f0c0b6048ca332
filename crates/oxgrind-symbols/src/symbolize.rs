//! Naming code addresses as Valgrind does (`describe_IP`, formats.md §0.1), at report time.
//!
//! A [`Symbolizer`] knows the loaded objects (from `/proc/<pid>/maps`, or an explicit list of
//! path + load bias) and turns one address into [`Frame`]s:
//!
//! * inlined calls expanded from DWARF, innermost first, all with the same `ip`; each frame's
//!   file:line is where that function's code is (innermost) or where it calls the next one;
//! * the outermost function's name comes from the ELF symbol table, as Valgrind takes it
//!   (so GCC clones print as `f.constprop.0`), the inlined ones from DWARF;
//! * names are demangled as Valgrind prints them: C++ like `c++filt`, Rust without the
//!   trailing hash; the linkage name is kept in [`Frame::mangled`] for suppressions;
//! * functions under `main` are named `(below main)` unless [`Symbolizer::show_below_main`];
//! * without DWARF, the nearest ELF symbol (`malloc (in /usr/lib/x86_64-linux-gnu/libc.so.6)`);
//!   without anything, `???`.
//!
//! Debug information is also looked for in separate files: by build-id under
//! `/usr/lib/debug/.build-id/`, by `.gnu_debuglink`, and their dwz supplementary file
//! (`.gnu_debugaltlink`). Every object is loaded once, when first needed, and every address
//! is described once.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};
use oxgrind_formats::frame::Frame;
use oxgrind_sys::mapfile::MappedFile;

use crate::below_main::{fn_name_kind, FnNameKind, BELOW_MAIN};
use crate::dwarf::LazyDwarf;
use crate::maps;

pub(crate) type Reader = gimli::EndianReader<gimli::RunTimeEndian, Bytes>;

/// Bytes of one DWARF section: a window on the mapped file when stored plainly (no copy of
/// debug information that can run to gigabytes), or the decompressed copy of a compressed
/// section.
#[derive(Clone, Debug)]
pub(crate) enum Bytes {
    Mapped(Arc<MappedFile>, usize, usize),
    Owned(Arc<[u8]>),
    /// A decompressed section, kept in the vector it was inflated into (copying it into an
    /// `Arc<[u8]>` would briefly hold it twice: for glibc's debug info, 5.5 MiB more peak).
    Inflated(Arc<Vec<u8>>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m, start, len) => &m[*start..*start + *len],
            Bytes::Owned(v) => v,
            Bytes::Inflated(v) => v,
        }
    }
}

// SAFETY: every variant derefs into heap or mapped memory owned through an Arc (a vector's
// buffer is never reallocated: nothing mutates it), which does not move when the Bytes value
// (or a clone of it) moves; clones share the same memory.
unsafe impl gimli::StableDeref for Bytes {}
// SAFETY: as above.
unsafe impl gimli::CloneStableDeref for Bytes {}

/// Where an object is loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// Path of the ELF file, as printed in `(in PATH)`.
    pub path: PathBuf,
    /// Load bias: run-time address minus link-time address (0 for a non-PIE executable).
    pub bias: u64,
    /// Run-time address ranges `[start, end)` covered by the object. Empty: computed from its
    /// `PT_LOAD` segments and `bias` when the symbolizer is built.
    pub ranges: Vec<(u64, u64)>,
}

/// Why an object could not be used. Symbolication goes on without it (`???`).
#[derive(Debug)]
pub enum SymbolizeError {
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    Elf {
        path: PathBuf,
        error: object::Error,
    },
    Dwarf {
        path: PathBuf,
        error: gimli::Error,
    },
}

impl std::fmt::Display for SymbolizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SymbolizeError::Io { path, error } => write!(f, "{}: {error}", path.display()),
            SymbolizeError::Elf { path, error } => {
                write!(f, "{}: bad ELF: {error}", path.display())
            }
            SymbolizeError::Dwarf { path, error } => {
                write!(f, "{}: bad DWARF: {error}", path.display())
            }
        }
    }
}

impl std::error::Error for SymbolizeError {}

/// One ELF symbol, in link-time addresses.
#[derive(Clone, Debug)]
struct Sym {
    addr: u64,
    size: u64,
    name: String,
}

/// What is loaded for one object.
struct Loaded {
    dwarf: Option<LazyDwarf>,
    /// Function symbols sorted by address, one name per address (Valgrind's preference).
    syms: Vec<Sym>,
    /// Data (object) symbols with a size, sorted by address, for "inside data symbol".
    data: Vec<Sym>,
    /// Each unit's file table ([`unit_files`]) by unit index, built at its first frame:
    /// glibc's units name hundreds of files, and rebuilding the table for every address
    /// described was most of the symbolising of a short program's allocation stacks.
    unit_files: HashMap<usize, Vec<UnitFile>>,
}

struct Entry {
    module: Module,
    loaded: Option<Loaded>,
    /// Describe from the symbol table only (see [`Symbolizer::set_symbols_only`]).
    symbols_only: bool,
}

/// Descriptions [`Symbolizer::describe`] keeps at most (about 250 bytes each), for the
/// addresses asked again (the frames of stacks reported many times). Emptied when full: a
/// report that describes every instruction once (Cachegrind's, at exit: 400,000 on a
/// python3 run) kept them all, 90 MB of RSS for nothing.
const DESCRIBE_CACHE_MAX: usize = 1 << 16;

/// Turns code addresses into Valgrind frame descriptions. See the module docs.
pub struct Symbolizer {
    entries: Vec<Entry>,
    /// `(start, end, entry)` sorted by start.
    ranges: Vec<(u64, u64, usize)>,
    cache: HashMap<u64, Vec<Frame>>,
    /// Extra roots for separate debug files (default `/usr/lib/debug`).
    debug_dirs: Vec<PathBuf>,
    /// Where inflated copies of compressed debug sections are kept between runs
    /// ([`Symbolizer::set_section_cache`]).
    section_cache: Option<PathBuf>,
    /// `--show-below-main=yes`: keep real names of functions under `main`.
    pub show_below_main: bool,
    /// Problems met while loading objects, for the caller to log if it wants.
    pub errors: Vec<SymbolizeError>,
}

/// The whole file at `path`, mapped read-only; mapped all the same when the program holds
/// every descriptor its limit allows (`MappedFile::open`), so that a report written while
/// it runs names its frames.
fn mmap(path: &Path) -> Result<Arc<MappedFile>, SymbolizeError> {
    use std::os::unix::ffi::OsStrExt;
    let mut name = path.as_os_str().as_bytes().to_vec();
    name.push(0);
    if name[..name.len() - 1].contains(&0) {
        return Err(SymbolizeError::Io {
            path: path.into(),
            error: std::io::Error::from_raw_os_error(22), // EINVAL
        });
    }
    // The descriptor holds one of the program's slots until it is closed, inside `open`.
    let _lent = oxgrind_sys::lent_fd::Lent::take();
    MappedFile::open(&name)
        .map(Arc::new)
        .map_err(|errno| SymbolizeError::Io {
            path: path.into(),
            error: std::io::Error::from_raw_os_error(errno),
        })
}

/// `[start, end)` run-time ranges of the object's `PT_LOAD` segments.
fn load_ranges(path: &Path, bias: u64) -> Result<Vec<(u64, u64)>, SymbolizeError> {
    let data = mmap(path)?;
    let file = object::File::parse(&data[..]).map_err(|error| SymbolizeError::Elf {
        path: path.into(),
        error,
    })?;
    Ok(file
        .segments()
        .filter(|s| s.size() > 0)
        .map(|s| {
            (
                s.address().wrapping_add(bias),
                s.address().wrapping_add(bias).wrapping_add(s.size()),
            )
        })
        .collect())
}

impl Symbolizer {
    /// A symbolizer for an explicit list of objects.
    pub fn new(modules: Vec<Module>) -> Symbolizer {
        let mut s = Symbolizer {
            entries: Vec::new(),
            ranges: Vec::new(),
            cache: HashMap::new(),
            debug_dirs: vec![PathBuf::from("/usr/lib/debug")],
            section_cache: None,
            show_below_main: false,
            errors: Vec::new(),
        };
        for mut module in modules {
            if module.ranges.is_empty() {
                match load_ranges(&module.path, module.bias) {
                    Ok(r) => module.ranges = r,
                    Err(e) => {
                        s.errors.push(e);
                        continue;
                    }
                }
            }
            let idx = s.entries.len();
            for &(a, b) in &module.ranges {
                s.ranges.push((a, b, idx));
            }
            s.entries.push(Entry {
                module,
                loaded: None,
                symbols_only: false,
            });
        }
        s.ranges.sort_unstable();
        s
    }

    /// A symbolizer for the objects mapped in this process now.
    pub fn from_self() -> Symbolizer {
        Symbolizer::from_maps(&maps::read_self_maps().unwrap_or_default())
    }

    /// A symbolizer for the objects listed in the text of a `/proc/<pid>/maps` file.
    pub fn from_maps(text: &[u8]) -> Symbolizer {
        Symbolizer::new(modules_from_maps(text))
    }

    /// Also look for separate debug files under `dir` (like `/usr/lib/debug`), before the
    /// default one.
    pub fn add_debug_dir(&mut self, dir: impl Into<PathBuf>) {
        self.debug_dirs.insert(0, dir.into());
    }

    /// Keep inflated copies of compressed debug sections under `dir`, one file per section
    /// under the object's build id, and map them instead of inflating again. Distributions
    /// ship compressed debug files (Debian 12's glibc: 4 MiB that inflate to 10 MiB, about
    /// 15 ms of every run that names a libc frame). A copy is written whole under a
    /// temporary name, then renamed, so a reader never sees half of one; one of the wrong
    /// length is ignored. Objects without a build id are not cached.
    pub fn set_section_cache(&mut self, dir: impl Into<PathBuf>) {
        self.section_cache = Some(dir.into());
    }

    /// Describes addresses in the object at `path` from its symbol table only, without
    /// file:line, as Valgrind shows its own preloaded replacements
    /// (`malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)`): for the
    /// runtime's interposed entry points. Its debug information is then never read.
    /// Returns whether such an object is known.
    pub fn set_symbols_only(&mut self, path: &Path) -> bool {
        let mut found = false;
        for e in self.entries.iter_mut().filter(|e| e.module.path == path) {
            e.symbols_only = true;
            found = true;
        }
        self.cache.clear();
        found
    }

    /// Loads now (symbol tables, debug information) every object one of `ips` lies in, so
    /// that a process forked later finds them loaded.
    pub fn load_objects_of(&mut self, ips: impl Iterator<Item = u64>) {
        let mut last = usize::MAX;
        for ip in ips {
            if let Some(idx) = self.entry_of(ip) {
                if idx != last && self.entries[idx].loaded.is_none() {
                    self.loaded(idx);
                }
                last = idx;
            }
        }
    }

    /// The objects this symbolizer knows.
    pub fn modules(&self) -> impl Iterator<Item = &Module> {
        self.entries.iter().map(|e| &e.module)
    }

    fn entry_of(&self, ip: u64) -> Option<usize> {
        let i = self.ranges.partition_point(|r| r.0 <= ip).checked_sub(1)?;
        let r = self.ranges[i];
        (ip < r.1).then_some(r.2)
    }

    fn loaded(&mut self, idx: usize) -> &mut Loaded {
        if self.entries[idx].loaded.is_none() {
            let path = self.entries[idx].module.path.clone();
            let cache = self.section_cache.as_deref();
            let symbols_only = self.entries[idx].symbols_only;
            let loaded = match load(&path, &self.debug_dirs, cache, symbols_only) {
                Ok(l) => l,
                Err(e) => {
                    self.errors.push(e);
                    Loaded {
                        dwarf: None,
                        syms: Vec::new(),
                        data: Vec::new(),
                        unit_files: HashMap::new(),
                    }
                }
            };
            self.entries[idx].loaded = Some(loaded);
        }
        self.entries[idx]
            .loaded
            .as_mut()
            .expect("loaded just above")
    }

    /// Describes the code address `ip` (for a caller's frame, pass return address − 1, as
    /// Valgrind does): inlined frames first, then the function containing `ip`. Never empty.
    pub fn describe(&mut self, ip: u64) -> Vec<Frame> {
        if let Some(f) = self.cache.get(&ip) {
            return f.clone();
        }
        let frames = self.describe_uncached(ip);
        if self.cache.len() >= DESCRIBE_CACHE_MAX {
            self.cache.clear();
        }
        self.cache.insert(ip, frames.clone());
        frames
    }

    /// The raw (mangled) symbol-table name of the function containing `ip`, as Valgrind's
    /// `get_fnname_raw` gives it (suppression matching, below-main detection).
    pub fn raw_function_name(&mut self, ip: u64) -> Option<String> {
        let idx = self.entry_of(ip)?;
        let bias = self.entries[idx].module.bias;
        let loaded = self.loaded(idx);
        sym_at(&loaded.syms, ip.wrapping_sub(bias)).map(|s| s.name.clone())
    }

    /// The entry address of the function containing `ip` (from the symbol table).
    pub fn function_start(&mut self, ip: u64) -> Option<u64> {
        let idx = self.entry_of(ip)?;
        let bias = self.entries[idx].module.bias;
        let loaded = self.loaded(idx);
        sym_at(&loaded.syms, ip.wrapping_sub(bias)).map(|s| s.addr.wrapping_add(bias))
    }

    /// The data symbol containing `addr` and the offset into it, as Memcheck's
    /// `Address 0x... is 4 bytes inside data symbol "table"` names it (demangled).
    pub fn data_symbol(&mut self, addr: u64) -> Option<(String, u64)> {
        let idx = self.entry_of(addr)?;
        let bias = self.entries[idx].module.bias;
        let loaded = self.loaded(idx);
        let svma = addr.wrapping_sub(bias);
        let i = loaded
            .data
            .partition_point(|s| s.addr <= svma)
            .checked_sub(1)?;
        let s = &loaded.data[i];
        (svma < s.addr.saturating_add(s.size))
            .then(|| (demangle(&s.name).into_owned(), svma - s.addr))
    }

    /// Whether `ip` is in `main`, in a function Valgrind counts as below main, or elsewhere.
    pub fn fn_name_kind(&mut self, ip: u64) -> FnNameKind {
        match self.raw_function_name(ip) {
            Some(name) => fn_name_kind(&name),
            None => FnNameKind::Normal,
        }
    }

    fn describe_uncached(&mut self, ip: u64) -> Vec<Frame> {
        let Some(idx) = self.entry_of(ip) else {
            return vec![Frame {
                ip,
                ..Frame::default()
            }];
        };
        let object = Some(self.entries[idx].module.path.to_string_lossy().into_owned());
        let bias = self.entries[idx].module.bias;
        let show_below_main = self.show_below_main;
        let symbols_only = self.entries[idx].symbols_only;
        let loaded = self.loaded(idx);
        let svma = ip.wrapping_sub(bias);
        let sym = sym_at(&loaded.syms, svma).map(|s| s.name.clone());

        let mut out: Vec<Frame> = Vec::new();
        let Loaded {
            dwarf,
            unit_files: files_of,
            ..
        } = loaded;
        if let Some(dw) = dwarf.as_mut().filter(|_| !symbols_only) {
            if let Some((unit_index, found)) = dw.frames(svma) {
                let unit = dw.unit(unit_index);
                let files = files_of
                    .entry(unit_index)
                    .or_insert_with(|| unit.map(unit_files).unwrap_or_default());
                let last = found.len().saturating_sub(1);
                for (i, fr) in found.into_iter().enumerate() {
                    let (file, dir, line) = split_location(files, fr.file.as_deref(), fr.line);
                    // Valgrind names inlined calls by the DIE's DW_AT_name (unqualified in C++,
                    // with generic arguments in Rust), not by the linkage name.
                    let inlined_name = if i < last {
                        unit.zip(fr.die).and_then(|(u, d)| die_name(u, d, 0))
                    } else {
                        None
                    };
                    let (function, mangled) = match inlined_name {
                        Some(n) => (Some(n), None),
                        None => fr.name.as_deref().map(split_name).unwrap_or((None, None)),
                    };
                    out.push(Frame {
                        ip,
                        function,
                        mangled,
                        file,
                        dir,
                        line,
                        object: object.clone(),
                    });
                }
            }
        }
        if out.is_empty() {
            out.push(Frame {
                ip,
                object: object.clone(),
                ..Frame::default()
            });
        }
        // The outermost (non-inlined) function is named from the symbol table, as Valgrind
        // does; DWARF's name stays only when there is no symbol.
        let outer = out.last_mut().expect("pushed above");
        if let Some(sym) = sym {
            let (function, mangled) = split_name(&sym);
            outer.function = function;
            outer.mangled = mangled;
        }
        if !show_below_main {
            let raw = outer.mangled.as_deref().or(outer.function.as_deref());
            if raw.is_some_and(|n| fn_name_kind(n) == FnNameKind::BelowMain) {
                outer.function = Some(BELOW_MAIN.to_string());
            }
        }
        out
    }
}

/// Valgrind's function name for `raw` and the mangled name when different.
fn split_name(raw: &str) -> (Option<String>, Option<String>) {
    let demangled = demangle(raw);
    if demangled == raw {
        (Some(raw.to_string()), None)
    } else {
        (Some(demangled.into_owned()), Some(raw.to_string()))
    }
}

/// Demangles as Valgrind 3.19 prints: Itanium C++ names with libiberty's text (like
/// `c++filt -i`, see [`crate::cxxabi`]), Rust names without their hash (nor the
/// `.llvm.<number>` suffix LLVM gives a local symbol it promotes); anything else
/// unchanged.
pub fn demangle(raw: &str) -> Cow<'_, str> {
    let legacy_rust = |name: &str| {
        let name = name.split(".llvm.").next().unwrap_or(name);
        name.starts_with("_ZN") && name.contains("17h") && name.ends_with('E')
    };
    if raw.starts_with("_R") || legacy_rust(raw) {
        if let Ok(d) = rustc_demangle::try_demangle(raw) {
            let s = format!("{d:#}");
            // A C++ name can look like a legacy Rust one; only trust a hash-bearing result.
            if raw.starts_with("_R") || s != format!("{d}") {
                return Cow::Owned(s);
            }
        }
    }
    if raw.starts_with("_Z") {
        if let Some(s) = crate::cxxabi::cxa_demangle(raw) {
            return Cow::Owned(s);
        }
        if let Ok(sym) = cpp_demangle::Symbol::new(raw.as_bytes()) {
            if let Ok(s) = sym.demangle() {
                return Cow::Owned(s);
            }
        }
    }
    Cow::Borrowed(raw)
}

/// One file of a unit's line table: the path [`crate::dwarf`] renders for it (as addr2line does), the file entry as
/// written, and the directory Valgrind prints with `--fullpath-after`.
struct UnitFile {
    joined: String,
    name: String,
    dir: Option<String>,
}

/// `(file, directory, line)` from a DWARF location whose path addr2line joined from the
/// compilation directory, the line table's directory entry and its file entry. Valgrind
/// prints the file entry as written (`leak.c`, or `library/alloc/src/raw_vec/mod.rs` for
/// rustc's std paths), so the joined path is mapped back through the unit's file table;
/// paths not found there print their last component.
fn split_location(
    files: &[UnitFile],
    file: Option<&str>,
    line: Option<u32>,
) -> (Option<String>, Option<String>, u32) {
    let line = line.unwrap_or(0);
    let Some(path) = file else {
        return (None, None, line);
    };
    if let Some(f) = files.iter().find(|f| f.joined == path) {
        return (Some(f.name.clone()), f.dir.clone(), line);
    }
    let name = path.rsplit('/').next().unwrap_or(path).to_string();
    let dir = path
        .strip_suffix(name.as_str())
        .map(|d| d.trim_end_matches('/').to_string())
        .filter(|d| !d.is_empty());
    (Some(name), dir, line)
}

pub(crate) fn push_path(path: &mut String, p: &str) {
    if p.starts_with('/') {
        *path = p.to_string();
    } else {
        if !path.is_empty() && !path.ends_with('/') {
            path.push('/');
        }
        path.push_str(p);
    }
}

/// Every file of a unit's line table (see [`UnitFile`]). addr2line treats directory 0 as
/// the compilation directory; Valgrind joins DWARF 5's explicit entry 0 to it like any other
/// relative entry (glibc's `./string` + `./string`), and so must the printed directory.
fn unit_files(unit: gimli::UnitRef<'_, Reader>) -> Vec<UnitFile> {
    let Some(program) = &unit.line_program else {
        return Vec::new();
    };
    let header = program.header();
    let text = |v| {
        unit.attr_string(v).ok().and_then(|r| {
            gimli::Reader::to_string_lossy(&r)
                .ok()
                .map(|c| c.into_owned())
        })
    };
    let comp_dir = unit
        .comp_dir
        .as_ref()
        .and_then(|d| gimli::Reader::to_string_lossy(d).ok())
        .map(|c| c.into_owned());
    let mut out = Vec::new();
    for file in header.file_names() {
        let Some(name) = text(file.path_name()) else {
            continue;
        };
        let entry = if file.directory_index() != 0 || header.version() >= 5 {
            file.directory(header).and_then(text)
        } else {
            None
        };
        let mut joined = comp_dir.clone().unwrap_or_default();
        if file.directory_index() != 0 {
            if let Some(d) = &entry {
                push_path(&mut joined, d);
            }
        }
        push_path(&mut joined, &name);
        let mut dir = comp_dir.clone().unwrap_or_default();
        if let Some(d) = &entry {
            push_path(&mut dir, d);
        }
        let dir = (!dir.is_empty()).then_some(dir);
        out.push(UnitFile { joined, name, dir });
    }
    out
}

/// `DW_AT_name` of a DIE, through `DW_AT_abstract_origin` / `DW_AT_specification` links
/// (also into other units and the dwz supplementary file).
fn die_name(
    unit: gimli::UnitRef<'_, Reader>,
    offset: gimli::UnitOffset,
    depth: u32,
) -> Option<String> {
    if depth > 8 {
        return None;
    }
    let entry = unit.entry(offset).ok()?;
    if let Ok(Some(v)) = entry.attr_value(gimli::DW_AT_name) {
        let r = unit.attr_string(v).ok()?;
        return gimli::Reader::to_string_lossy(&r)
            .ok()
            .map(|c| c.into_owned());
    }
    for at in [gimli::DW_AT_abstract_origin, gimli::DW_AT_specification] {
        match entry.attr_value(at) {
            Ok(Some(gimli::AttributeValue::UnitRef(o))) => return die_name(unit, o, depth + 1),
            Ok(Some(gimli::AttributeValue::DebugInfoRef(o))) => {
                return die_name_in(unit.dwarf, o, depth + 1)
            }
            Ok(Some(gimli::AttributeValue::DebugInfoRefSup(o))) => {
                return die_name_in(unit.dwarf.sup()?, o, depth + 1);
            }
            _ => {}
        }
    }
    None
}

/// `die_name` for a section offset: finds the unit holding it (rare: LTO, dwz).
fn die_name_in(
    dwarf: &gimli::Dwarf<Reader>,
    offset: gimli::DebugInfoOffset,
    depth: u32,
) -> Option<String> {
    let mut headers = dwarf.units();
    while let Ok(Some(header)) = headers.next() {
        if let Some(o) = offset.to_unit_offset(&header) {
            let unit = dwarf.unit(header).ok()?;
            return die_name(gimli::UnitRef::new(dwarf, &unit), o, depth);
        }
    }
    None
}

/// The function symbol containing `svma`.
fn sym_at(syms: &[Sym], svma: u64) -> Option<&Sym> {
    let i = syms.partition_point(|s| s.addr <= svma).checked_sub(1)?;
    let s = &syms[i];
    if svma < s.addr.saturating_add(s.size.max(1)) {
        Some(s)
    } else {
        None
    }
}

/// Of two names for one address, whether Valgrind would rather print `a` than `b`
/// (storage.c `preferName`): the shorter name, its length counted up to any `@version`
/// (`cfree@GLIBC_2.2.5` is five long and loses to `free`); at equal lengths a versioned name
/// (`memcpy@@GLIBC_2.14` over `memcpy`: the assembler writes `.symver` names into `.symtab`);
/// then the alphabetically first (`__libc_start_main@@GLIBC_2.34` before
/// `__libc_start_main@GLIBC_2.2.5`). Binding (global, weak, local) plays no part.
fn prefer(a: &str, b: &str) -> bool {
    let unversioned = |s: &str| s.find('@').unwrap_or(s.len());
    let (la, lb) = (unversioned(a), unversioned(b));
    if la != lb {
        return la < lb;
    }
    let (va, vb) = (la < a.len(), lb < b.len());
    if va != vb {
        return va;
    }
    a < b
}

fn collect_data_syms(file: &object::File<'_>, out: &mut Vec<Sym>) {
    for s in file.symbols().chain(file.dynamic_symbols()) {
        if !matches!(s.kind(), SymbolKind::Data | SymbolKind::Tls)
            || s.is_undefined()
            || s.size() == 0
        {
            continue;
        }
        if let Ok(name) = s.name() {
            if !name.is_empty() {
                out.push(Sym {
                    addr: s.address(),
                    size: s.size(),
                    name: name.to_string(),
                });
            }
        }
    }
}

fn collect_syms(file: &object::File<'_>, out: &mut Vec<Sym>) {
    let symtab = file.symbols().chain(file.dynamic_symbols());
    for s in symtab {
        if !matches!(s.kind(), SymbolKind::Text) || s.is_undefined() || s.address() == 0 {
            continue;
        }
        let Ok(name) = s.name() else { continue };
        if name.is_empty() {
            continue;
        }
        // Versioned dynamic names come without the version from `object`.
        out.push(Sym {
            addr: s.address(),
            size: s.size(),
            name: name.to_string(),
        });
    }
}

fn finish_syms(mut all: Vec<Sym>) -> Vec<Sym> {
    // Unstable: `prefer` picks the same name from a group in any order (it ties only on
    // equal names), and a stable sort's scratch copy of libc's 11,000 symbols cost more
    // than the sort.
    all.sort_unstable_by_key(|a| a.addr);
    let mut out: Vec<Sym> = Vec::with_capacity(all.len());
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        let mut best = i;
        while j < all.len() && all[j].addr == all[i].addr {
            if prefer(&all[j].name, &all[best].name) {
                best = j;
            }
            j += 1;
        }
        // Aliases may disagree on size; a zero size says nothing.
        let size = all[i..j].iter().map(|s| s.size).max().unwrap_or(0);
        // Moved out, not cloned: tens of thousands of names for libc and the runtime.
        out.push(Sym {
            addr: all[best].addr,
            size,
            name: std::mem::take(&mut all[best].name),
        });
        i = j;
    }
    out
}

/// Candidate separate debug files for `file` at `path`, most specific first.
fn debug_candidates(file: &object::File<'_>, path: &Path, debug_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut c = Vec::new();
    if let Ok(Some(id)) = file.build_id() {
        if id.len() >= 2 {
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            for d in debug_dirs {
                c.push(
                    d.join(".build-id")
                        .join(&hex[..2])
                        .join(format!("{}.debug", &hex[2..])),
                );
            }
        }
    }
    if let Ok(Some((name, _crc))) = file.gnu_debuglink() {
        let name = String::from_utf8_lossy(name).into_owned();
        let dir = path.parent().unwrap_or(Path::new("/"));
        c.push(dir.join(&name));
        c.push(dir.join(".debug").join(&name));
        for d in debug_dirs {
            c.push(d.join(dir.strip_prefix("/").unwrap_or(dir)).join(&name));
        }
    }
    c.retain(|p| p != path);
    c
}

fn has_dwarf(file: &object::File<'_>) -> bool {
    file.section_by_name(".debug_info")
        .is_some_and(|s| s.size() > 0)
}

/// The directory of `file`'s cached sections under `cache` (its build id in hex).
fn section_cache_dir(cache: Option<&Path>, file: &object::File<'_>) -> Option<PathBuf> {
    let id = file.build_id().ok()??;
    if id.is_empty() {
        return None;
    }
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    Some(cache?.join(hex))
}

/// The cached inflated copy of section `name` (`len` bytes), if there is a whole one.
fn cached_section(dir: &Path, name: &str, len: u64) -> Option<Bytes> {
    let m = mmap(&dir.join(name.trim_start_matches('.'))).ok()?;
    (m.len() as u64 == len).then(|| {
        let n = m.len();
        Bytes::Mapped(m, 0, n)
    })
}

/// Keeps an inflated copy of section `name` for the next runs; any failure leaves none.
fn store_section(dir: &Path, name: &str, bytes: &[u8]) {
    use std::io::Write;
    let name = name.trim_start_matches('.');
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    let _lent = oxgrind_sys::lent_fd::Lent::take();
    let written = std::fs::create_dir_all(dir).is_ok()
        && File::create(&tmp)
            .and_then(|mut f| f.write_all(bytes))
            .is_ok()
        && std::fs::rename(&tmp, dir.join(name)).is_ok();
    if !written {
        let _ = std::fs::remove_file(&tmp);
    }
}

fn dwarf_of(
    data: &Arc<MappedFile>,
    file: &object::File<'_>,
    path: &Path,
    cache: Option<&Path>,
) -> Result<gimli::Dwarf<Reader>, SymbolizeError> {
    let cache_dir = section_cache_dir(cache, file);
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let load = |id: gimli::SectionId| -> Result<Reader, gimli::Error> {
        let empty = || Bytes::Owned(Arc::from(&[][..]));
        // Location lists say where variables live, which symbolization never asks: in a
        // distribution's compressed debug file (glibc's) they would be inflated into our
        // memory for nothing (1.4 MiB for Debian 12's libc, counted twice while copied).
        if matches!(
            id,
            gimli::SectionId::DebugLoc | gimli::SectionId::DebugLocLists
        ) {
            return Ok(gimli::EndianReader::new(empty(), endian));
        }
        let bytes = match file.section_by_name(id.name()) {
            Some(sec) => match sec.compressed_file_range() {
                Ok(r)
                    if r.format == object::CompressionFormat::None
                        && r.offset
                            .checked_add(r.compressed_size)
                            .is_some_and(|e| e <= data.len() as u64) =>
                {
                    Bytes::Mapped(data.clone(), r.offset as usize, r.compressed_size as usize)
                }
                Ok(r) => match cache_dir
                    .as_deref()
                    .and_then(|d| cached_section(d, id.name(), r.uncompressed_size))
                {
                    Some(b) => b,
                    None => match sec.uncompressed_data() {
                        Ok(Cow::Owned(v)) => {
                            if let Some(d) = &cache_dir {
                                store_section(d, id.name(), &v);
                            }
                            // The compressed bytes are not read again: their pages leave our
                            // resident set now rather than add to its peak while the next
                            // sections inflate (4 MiB for Debian 12's glibc debug file).
                            data.dont_need(r.offset as usize, r.compressed_size as usize);
                            Bytes::Inflated(Arc::new(v))
                        }
                        Ok(Cow::Borrowed(d)) => Bytes::Owned(Arc::from(d)),
                        Err(_) => empty(),
                    },
                },
                Err(_) => empty(),
            },
            None => empty(),
        };
        Ok(gimli::EndianReader::new(bytes, endian))
    };
    gimli::Dwarf::load(load).map_err(|error| SymbolizeError::Dwarf {
        path: path.into(),
        error,
    })
}

/// The dwz supplementary file named by `.gnu_debugaltlink`, if it exists.
fn altlink_path(file: &object::File<'_>, path: &Path, debug_dirs: &[PathBuf]) -> Option<PathBuf> {
    let (name, build_id) = file.gnu_debugaltlink().ok()??;
    let name = PathBuf::from(String::from_utf8_lossy(name).into_owned());
    let mut cands = Vec::new();
    if name.is_absolute() {
        cands.push(name.clone());
    } else if let Some(dir) = path.parent() {
        cands.push(dir.join(&name));
    }
    if build_id.len() >= 2 {
        let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
        for d in debug_dirs {
            cands.push(
                d.join(".build-id")
                    .join(&hex[..2])
                    .join(format!("{}.debug", &hex[2..])),
            );
        }
    }
    cands.into_iter().find(|p| p.is_file())
}

/// What the symboliser keeps of the object at `path`: its symbols and, unless it is
/// described from its symbol table only (`symbols_only`), its debug information.
fn load(
    path: &Path,
    debug_dirs: &[PathBuf],
    cache: Option<&Path>,
    symbols_only: bool,
) -> Result<Loaded, SymbolizeError> {
    let data = mmap(path)?;
    let file = object::File::parse(&data[..]).map_err(|error| SymbolizeError::Elf {
        path: path.into(),
        error,
    })?;
    let mut syms = Vec::new();
    collect_syms(&file, &mut syms);
    let mut data_syms = Vec::new();
    collect_data_syms(&file, &mut data_syms);

    let mut dwarf = None;
    let debug = debug_candidates(&file, path, debug_dirs)
        .into_iter()
        .find(|p| p.is_file());
    let debug_map = debug
        .as_ref()
        .and_then(|p| mmap(p).ok().map(|m| (p.clone(), m)));
    let debug_file = debug_map
        .as_ref()
        .and_then(|(p, m)| object::File::parse(&m[..]).ok().map(|f| (p, f)));
    let mut sources: Vec<(&Path, &Arc<MappedFile>, &object::File<'_>)> = Vec::new();
    if let (Some((p, f)), Some((_, m))) = (&debug_file, &debug_map) {
        collect_syms(f, &mut syms);
        collect_data_syms(f, &mut data_syms);
        sources.push((p.as_path(), m, f));
    }
    sources.push((path, &data, &file));
    if symbols_only {
        sources.clear();
    }
    for (p, m, f) in sources {
        if !has_dwarf(f) {
            continue;
        }
        let mut d = dwarf_of(m, f, p, cache)?;
        if let Some(alt) = altlink_path(f, p, debug_dirs) {
            if let Ok(m) = mmap(&alt) {
                if let Ok(af) = object::File::parse(&m[..]) {
                    if let Ok(sup) = dwarf_of(&m, &af, &alt, cache) {
                        d.set_sup(sup);
                    }
                }
            }
        }
        let lazy = LazyDwarf::new(d).map_err(|error| SymbolizeError::Dwarf {
            path: p.into(),
            error,
        })?;
        dwarf = Some(lazy);
        break;
    }
    Ok(Loaded {
        dwarf,
        syms: finish_syms(syms),
        data: finish_syms(data_syms),
        unit_files: HashMap::new(),
    })
}

/// A function entry of an object, for function redirection (see [`function_symbols`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionSymbol {
    pub name: String,
    /// Link-time address (add the module's load bias).
    pub addr: u64,
    /// Bytes, as the symbol table gives them (0: unknown).
    pub size: u64,
    /// An IFUNC: `addr` is the resolver that picks the implementation, not a function to
    /// replace.
    pub ifunc: bool,
}

/// Every defined function symbol of the object at `path`, from its own symbol tables and
/// from its separate debug file (`/usr/lib/debug`, by build id), where distributions keep
/// the local names (glibc's `__strlen_avx2`). Empty when the file cannot be read.
pub fn function_symbols(path: &Path) -> Vec<FunctionSymbol> {
    use object::ObjectSymbol;
    let Ok(data) = mmap(path) else {
        return Vec::new();
    };
    let Ok(file) = object::File::parse(&data[..]) else {
        return Vec::new();
    };
    let debug_dirs = [PathBuf::from("/usr/lib/debug")];
    let debug = debug_candidates(&file, path, &debug_dirs)
        .into_iter()
        .find(|p| p.is_file())
        .and_then(|p| mmap(&p).ok());
    let debug_file = debug
        .as_ref()
        .and_then(|m| object::File::parse(&m[..]).ok());
    let mut out = Vec::new();
    for f in std::iter::once(&file).chain(debug_file.as_ref()) {
        for s in f.symbols().chain(f.dynamic_symbols()) {
            if !matches!(s.kind(), SymbolKind::Text) || s.is_undefined() || s.address() == 0 {
                continue;
            }
            let Ok(name) = s.name() else { continue };
            // STT_GNU_IFUNC (10) in the low bits of st_info.
            let ifunc = matches!(s.flags(), object::SymbolFlags::Elf { st_info, .. } if st_info & 0xf == 10);
            out.push(FunctionSymbol {
                name: name.to_string(),
                addr: s.address(),
                size: s.size(),
                ifunc,
            });
        }
    }
    out.sort_by(|a, b| (a.addr, &a.name).cmp(&(b.addr, &b.name)));
    out.dedup();
    out
}

/// Objects in the text of a `/proc/<pid>/maps` file ([`maps::loaded_objects`]), with their
/// load bias (from the object's offset-0 mapping and its program headers).
pub fn modules_from_maps(text: &[u8]) -> Vec<Module> {
    let maps = maps::parse_maps(text);
    let mut out = Vec::new();
    for object in maps::loaded_objects(&maps) {
        if object.base.path.first() != Some(&b'/') {
            continue;
        }
        let path = PathBuf::from(String::from_utf8_lossy(&object.base.path).into_owned());
        let first = object.base;
        let Ok(data) = mmap(&path) else { continue };
        let Ok(file) = object::File::parse(&data[..]) else {
            continue;
        };
        // The segment whose file range holds the mapping's offset gives the bias.
        let Some(bias) = file.segments().find_map(|s| {
            let (off, size) = s.file_range();
            let page_off = off & !0xfff;
            (page_off <= first.offset && first.offset < off + size.max(1)).then(|| {
                first
                    .start
                    .wrapping_sub(first.offset - page_off)
                    .wrapping_sub(s.address() & !0xfff)
            })
        }) else {
            continue;
        };
        out.push(Module {
            path,
            bias,
            ranges: object.mappings.iter().map(|m| (m.start, m.end)).collect(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_like_valgrind() {
        assert_eq!(demangle("_Z3fooi"), "foo(int)");
        assert_eq!(
            demangle("_ZNSt6vectorIiSaIiEE9push_backERKi"),
            "std::vector<int, std::allocator<int> >::push_back(int const&)"
        );
        assert_eq!(
            demangle("_ZN5alloc5alloc5alloc17h0123456789abcdefE"),
            "alloc::alloc::alloc"
        );
        assert_eq!(
            demangle("_ZN3std2rt10lang_start28_$u7b$$u7b$closure$u7d$$u7d$17hb1f3c8dc38f5e1f7E.llvm.11442580186506834492"),
            "std::rt::lang_start::{{closure}}"
        );
        assert_eq!(demangle("malloc"), "malloc");
        assert_eq!(demangle("_Znwm"), "operator new(unsigned long)");
    }

    #[test]
    fn symbol_preference_is_valgrinds() {
        // Alias groups of glibc 2.36's libc.so.6 (its debug file's .symtab plus .dynsym,
        // which `object` gives without versions) and the name Valgrind 3.19 prints for each
        // (cachegrind.out files, stack traces).
        let pick = |names: &[&str]| {
            let syms = finish_syms(
                names
                    .iter()
                    .map(|n| Sym {
                        addr: 0x100,
                        size: 0x10,
                        name: n.to_string(),
                    })
                    .collect(),
            );
            assert_eq!(syms.len(), 1);
            syms[0].name.clone()
        };
        let free = [
            "__GI___libc_free",
            "__free",
            "__libc_free",
            "cfree@GLIBC_2.2.5",
            "free",
        ];
        assert_eq!(pick(&free), "free");
        let lock = [
            "__GI___pthread_mutex_lock",
            "___pthread_mutex_lock",
            "__pthread_mutex_lock@GLIBC_2.2.5",
            "pthread_mutex_lock@@GLIBC_2.2.5",
            "pthread_mutex_lock",
        ];
        assert_eq!(pick(&lock), "pthread_mutex_lock@@GLIBC_2.2.5");
        let start = [
            "__libc_start_main_impl",
            "__libc_start_main@GLIBC_2.2.5",
            "__libc_start_main@@GLIBC_2.34",
            "__libc_start_main_alias_1",
            "__libc_start_main",
        ];
        assert_eq!(pick(&start), "__libc_start_main@@GLIBC_2.34");
        let memcpy = [
            "__GI_memcpy",
            "__new_memcpy",
            "memcpy",
            "memcpy@@GLIBC_2.14",
        ];
        assert_eq!(pick(&memcpy), "memcpy@@GLIBC_2.14");
        // Any order gives the same name.
        let mut reversed = free;
        reversed.reverse();
        assert_eq!(pick(&reversed), "free");
    }

    #[test]
    fn symbol_lookup_respects_sizes() {
        let syms = vec![Sym {
            addr: 0x100,
            size: 0x10,
            name: "f".into(),
        }];
        assert_eq!(sym_at(&syms, 0x10f).map(|s| s.name.as_str()), Some("f"));
        assert!(sym_at(&syms, 0x110).is_none());
        assert!(sym_at(&syms, 0xff).is_none());
    }
}
