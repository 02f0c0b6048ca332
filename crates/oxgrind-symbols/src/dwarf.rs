//! Code address → inlined call chain and source lines, parsing only the compilation units
//! that hold the addresses actually asked for.
//!
//! A report names a few hundred addresses at most, spread over a handful of units, while a
//! distribution's libc has about two thousand units. Parsing every unit's abbreviations and
//! line-program header up front (what `addr2line::Context` does when it is built) cost
//! ~110 ms and ~35 MiB for Debian 12's glibc debug file, paid by every run that printed one
//! libc frame, hello world included. Here:
//!
//! * the unit index (address ranges → unit) comes from `.debug_aranges`, without reading
//!   `.debug_info`; only without that table is every unit opened to read its ranges from
//!   the unit DIE (then closed again: its abbreviations are dropped);
//! * a unit is parsed (abbreviations, functions, then its line table and a function's
//!   inlined calls only when an address inside them is asked) on first use and kept;
//! * names behind `DW_AT_abstract_origin` / `DW_AT_specification` in another unit open
//!   that unit only for the lookup.
//!
//! The answers are addr2line's (same frames, innermost first, same locations, same
//! rendered paths, same preference of linkage names), which the report writers in
//! [`crate::symbolize`] then turn into Valgrind's text. Where `.debug_aranges` and the unit
//! DIE disagree, the table is believed (addr2line prefers the DIE's `DW_AT_ranges`); they
//! agree for what GCC, Clang and rustc write.

use std::cmp::Ordering;
use std::collections::HashMap;

use super::symbolize::Reader;

type Offset = <Reader as gimli::Reader>::Offset;

/// One frame of a lookup, innermost first (addr2line's `Frame`).
pub(crate) struct LookupFrame {
    /// The DIE of the function or inlined call (`None`: a location without a function).
    pub die: Option<gimli::UnitOffset>,
    /// Linkage name, else name, through origin links (addr2line's `raw_name`).
    pub name: Option<String>,
    /// Rendered path of the source file (compilation dir + dir entry + file entry).
    pub file: Option<String>,
    pub line: Option<u32>,
}

struct UnitRange {
    begin: u64,
    end: u64,
    unit: usize,
}

/// A sequence of the line table: rows sorted by address, `[start, end)`.
struct Sequence {
    start: u64,
    end: u64,
    rows: Box<[(u64, u64, u32)]>, // (address, file index, line)
}

struct Lines {
    files: Vec<Option<String>>,
    sequences: Vec<Sequence>,
}

struct Inlined {
    die: gimli::UnitOffset,
    name: Option<String>,
    call_file: Option<u64>,
    call_line: u32,
}

/// A subprogram's inlined calls: `(begin, end, depth, index into calls)` sorted by depth
/// then begin.
struct InlinedTree {
    name: Option<String>,
    calls: Vec<Inlined>,
    ranges: Vec<(u64, u64, usize, usize)>,
}

struct Function {
    die: gimli::UnitOffset,
    tree: Option<InlinedTree>,
}

/// A parsed unit: the gimli unit, its subprograms by address, lines and inlined calls
/// on demand.
pub(crate) struct ParsedUnit {
    pub unit: gimli::Unit<Reader>,
    functions: Vec<Function>,
    /// `(begin, end, index into functions)` sorted by begin.
    addresses: Vec<(u64, u64, usize)>,
    lines: Option<Lines>,
}

/// Lazily indexed and parsed DWARF of one object.
pub(crate) struct LazyDwarf {
    pub dwarf: gimli::Dwarf<Reader>,
    /// Offsets in `.debug_info` of the indexed units, ascending.
    offsets: Vec<gimli::DebugInfoOffset>,
    ranges: Vec<UnitRange>,
    /// `max_end[i]`: the largest `end` of `ranges[..=i]` (bounds the backward scan).
    max_end: Vec<u64>,
    parsed: HashMap<usize, Box<ParsedUnit>>,
}

/// `DW_AT_low_pc` / `DW_AT_high_pc` / `DW_AT_ranges` of one DIE.
#[derive(Default)]
struct RangeAttrs {
    low_pc: Option<u64>,
    high_pc: Option<u64>,
    size: Option<u64>,
    ranges_offset: Option<gimli::RangeListsOffset<Offset>>,
}

impl RangeAttrs {
    /// Takes the attribute if it is one of the range attributes; `Ok(false)` otherwise.
    fn take(
        &mut self,
        unit: gimli::UnitRef<'_, Reader>,
        attr: &gimli::Attribute<Reader>,
    ) -> gimli::Result<bool> {
        match attr.name() {
            gimli::DW_AT_low_pc => match attr.value() {
                gimli::AttributeValue::Addr(v) => self.low_pc = Some(v),
                gimli::AttributeValue::DebugAddrIndex(i) => self.low_pc = Some(unit.address(i)?),
                _ => {}
            },
            gimli::DW_AT_high_pc => match attr.value() {
                gimli::AttributeValue::Addr(v) => self.high_pc = Some(v),
                gimli::AttributeValue::DebugAddrIndex(i) => self.high_pc = Some(unit.address(i)?),
                gimli::AttributeValue::Udata(v) => self.size = Some(v),
                _ => {}
            },
            gimli::DW_AT_ranges => self.ranges_offset = unit.attr_ranges_offset(attr.value())?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Calls `f` for each non-empty range; whether there was one.
    fn each(
        &self,
        unit: gimli::UnitRef<'_, Reader>,
        mut f: impl FnMut(u64, u64),
    ) -> gimli::Result<bool> {
        let mut any = false;
        let mut add = |b: u64, e: u64| {
            if b < e {
                f(b, e);
                any = true;
            }
        };
        if let Some(o) = self.ranges_offset {
            let mut list = unit.ranges(o)?;
            while let Some(r) = list.next()? {
                add(r.begin, r.end);
            }
        } else if let (Some(b), Some(e)) = (self.low_pc, self.high_pc) {
            add(b, e);
        } else if let (Some(b), Some(s)) = (self.low_pc, self.size) {
            add(b, b.wrapping_add(s));
        }
        Ok(any)
    }
}

impl LazyDwarf {
    /// Indexes the units by address: `.debug_aranges` first, the unit DIE (or its line
    /// table) for units the table leaves out.
    pub fn new(dwarf: gimli::Dwarf<Reader>) -> gimli::Result<LazyDwarf> {
        // `(unit, begin, end)` from the table.
        let mut table = Vec::new();
        let mut aranges = dwarf.debug_aranges.headers();
        while let Some(h) = aranges.next()? {
            let mut entries = h.entries();
            while let Some(e) = entries.next().transpose() {
                let Ok(e) = e else { continue };
                if e.length() != 0 {
                    let r = e.range();
                    table.push((h.debug_info_offset(), r.begin, r.end));
                }
            }
        }
        let mut ranges = Vec::new();
        let offsets = if !table.is_empty() {
            // Trusted as complete, as GCC and LLVM write it (for every unit with code when
            // they write it at all): walking every unit header instead would read all of
            // `.debug_info` (4.5 MiB of our own runtime's pages) for the few units asked.
            let mut offsets: Vec<_> = table.iter().map(|t| t.0).collect();
            offsets.sort_unstable();
            offsets.dedup();
            for (o, begin, end) in table {
                let unit = offsets.binary_search(&o).expect("collected above");
                ranges.push(UnitRange { begin, end, unit });
            }
            offsets
        } else {
            Self::index_units(&dwarf, &mut ranges)?
        };
        ranges.sort_by_key(|r| (r.begin, r.unit));
        let mut max_end = Vec::with_capacity(ranges.len());
        let mut m = 0;
        for r in &ranges {
            m = m.max(r.end);
            max_end.push(m);
        }
        Ok(LazyDwarf {
            dwarf,
            offsets,
            ranges,
            max_end,
            parsed: HashMap::new(),
        })
    }

    /// Without `.debug_aranges`: every unit header, each compilation unit opened to read
    /// its ranges from its DIE (or its line table), then closed again. Returns the units'
    /// offsets.
    fn index_units(
        dwarf: &gimli::Dwarf<Reader>,
        ranges: &mut Vec<UnitRange>,
    ) -> gimli::Result<Vec<gimli::DebugInfoOffset>> {
        let mut offsets = Vec::new();
        let mut headers = dwarf.units();
        while let Some(header) = headers.next()? {
            let Some(offset) = header.offset().as_debug_info_offset() else {
                continue;
            };
            let is_code = match header.type_() {
                gimli::UnitType::Type { .. } | gimli::UnitType::SplitType { .. } => continue,
                gimli::UnitType::Partial => false,
                _ => true,
            };
            let unit = offsets.len();
            offsets.push(offset);
            if !is_code {
                continue;
            }
            // Its abbreviations go when it is dropped, at the end of this iteration.
            let Ok(u) = dwarf.unit(header) else { continue };
            let uref = gimli::UnitRef::new(dwarf, &u);
            let mut found = false;
            let mut entries = uref.entries_raw(None)?;
            if let Some(abbrev) = entries.read_abbreviation()? {
                let mut attrs = RangeAttrs::default();
                for spec in abbrev.attributes() {
                    let attr = entries.read_attribute(*spec)?;
                    attrs.take(uref, &attr)?;
                }
                found = attrs.each(uref, |begin, end| {
                    ranges.push(UnitRange { begin, end, unit })
                })?;
            }
            if !found {
                // No declared ranges: the line table's sequences.
                if let Ok(lines) = parse_lines(uref) {
                    for s in &lines.sequences {
                        ranges.push(UnitRange {
                            begin: s.start,
                            end: s.end,
                            unit,
                        });
                    }
                }
            }
        }
        Ok(offsets)
    }

    /// The units whose ranges hold `probe`, in address-table order.
    fn units_at(&self, probe: u64) -> Vec<usize> {
        let mut out = Vec::new();
        let mut i = self.ranges.partition_point(|r| r.begin <= probe);
        while i > 0 && self.max_end[i - 1] > probe {
            i -= 1;
            let r = &self.ranges[i];
            if probe < r.end && !out.contains(&r.unit) {
                out.push(r.unit);
            }
        }
        out.reverse();
        out
    }

    fn parse_unit(&mut self, index: usize) -> Option<&mut ParsedUnit> {
        if !self.parsed.contains_key(&index) {
            let offset = *self.offsets.get(index)?;
            let header = self.dwarf.debug_info.header_from_offset(offset).ok()?;
            let unit = self.dwarf.unit(header).ok()?;
            let (functions, addresses) =
                parse_functions(gimli::UnitRef::new(&self.dwarf, &unit)).ok()?;
            self.parsed.insert(
                index,
                Box::new(ParsedUnit {
                    unit,
                    functions,
                    addresses,
                    lines: None,
                }),
            );
        }
        self.parsed.get_mut(&index).map(|b| &mut **b)
    }

    /// addr2line's `find_frames`: the inlined calls at `probe` innermost first, then the
    /// function holding it; or only a location; or nothing. Also the unit answering, for
    /// the caller's own name and file lookups.
    pub fn frames(&mut self, probe: u64) -> Option<(usize, Vec<LookupFrame>)> {
        for index in self.units_at(probe) {
            if let Some(frames) = self.frames_in(index, probe) {
                return Some((index, frames));
            }
        }
        None
    }

    /// The unit parsed by an earlier [`LazyDwarf::frames`].
    pub fn unit(&self, index: usize) -> Option<gimli::UnitRef<'_, Reader>> {
        let p = self.parsed.get(&index)?;
        Some(gimli::UnitRef::new(&self.dwarf, &p.unit))
    }

    fn frames_in(&mut self, index: usize, probe: u64) -> Option<Vec<LookupFrame>> {
        self.parse_unit(index)?;
        let LazyDwarf {
            dwarf,
            offsets,
            parsed,
            ..
        } = self;
        let p: &mut ParsedUnit = parsed.get_mut(&index)?;
        let uref = gimli::UnitRef::new(dwarf, &p.unit);
        if p.lines.is_none() {
            p.lines = Some(parse_lines(uref).unwrap_or(Lines {
                files: Vec::new(),
                sequences: Vec::new(),
            }));
        }
        let lines = p.lines.as_ref().expect("set above");
        let location = find_location(lines, probe);
        let func = p
            .addresses
            .binary_search_by(|&(b, e, _)| {
                if probe < b {
                    Ordering::Greater
                } else if probe >= e {
                    Ordering::Less
                } else {
                    Ordering::Equal
                }
            })
            .ok()
            .map(|i| p.addresses[i].2);
        let Some(fi) = func else {
            return location.map(|(file, line)| {
                vec![LookupFrame {
                    die: None,
                    name: None,
                    file,
                    line,
                }]
            });
        };
        let f = &mut p.functions[fi];
        if f.tree.is_none() {
            f.tree = Some(parse_inlined(uref, f.die, offsets).ok()?);
        }
        let tree = f.tree.as_ref().expect("set above");
        // The chain of inlined calls holding probe, outermost first.
        let mut chain: Vec<&Inlined> = Vec::new();
        let mut rest = &tree.ranges[..];
        loop {
            let depth = chain.len();
            let found = rest.binary_search_by(|&(b, e, d, _)| {
                d.cmp(&depth).then(if b > probe {
                    Ordering::Greater
                } else if e <= probe {
                    Ordering::Less
                } else {
                    Ordering::Equal
                })
            });
            match found {
                Ok(i) => {
                    chain.push(&tree.calls[rest[i].3]);
                    rest = &rest[i + 1..];
                }
                Err(_) => break,
            }
        }
        let mut out = Vec::with_capacity(chain.len() + 1);
        let (mut file, mut line) = match location {
            Some((f, l)) => (f, l),
            None => (None, None),
        };
        for call in chain.iter().rev() {
            out.push(LookupFrame {
                die: Some(call.die),
                name: call.name.clone(),
                file: file.take(),
                line: line.take(),
            });
            line = (call.call_line != 0).then_some(call.call_line);
            file = call
                .call_file
                .and_then(|i| lines.files.get(i as usize).cloned().flatten());
        }
        out.push(LookupFrame {
            die: Some(f.die),
            name: tree.name.clone(),
            file,
            line,
        });
        Some(out)
    }
}

fn find_location(lines: &Lines, probe: u64) -> Option<(Option<String>, Option<u32>)> {
    let s = lines
        .sequences
        .binary_search_by(|s| {
            if probe < s.start {
                Ordering::Greater
            } else if probe >= s.end {
                Ordering::Less
            } else {
                Ordering::Equal
            }
        })
        .ok()?;
    let rows = &lines.sequences[s].rows;
    let i = match rows.binary_search_by(|r| r.0.cmp(&probe)) {
        Ok(i) => i,
        Err(0) => return None,
        Err(i) => i - 1,
    };
    let (_, file, line) = rows[i];
    let file = lines.files.get(file as usize).cloned().flatten();
    Some((file, (line != 0).then_some(line)))
}

fn parse_lines(unit: gimli::UnitRef<'_, Reader>) -> gimli::Result<Lines> {
    let Some(program) = unit.line_program.clone() else {
        return Ok(Lines {
            files: Vec::new(),
            sequences: Vec::new(),
        });
    };
    let mut sequences = Vec::new();
    let mut current: Vec<(u64, u64, u32)> = Vec::new();
    let mut rows = program.rows();
    while let Some((_, row)) = rows.next_row()? {
        if row.end_sequence() {
            if let Some(start) = current.first().map(|r| r.0) {
                sequences.push(Sequence {
                    start,
                    end: row.address(),
                    rows: std::mem::take(&mut current).into_boxed_slice(),
                });
            }
            continue;
        }
        let address = row.address();
        let file = row.file_index();
        let line = row.line().map(|l| l.get()).unwrap_or(0) as u32;
        if let Some(last) = current.last_mut() {
            if last.0 == address {
                *last = (address, file, line);
                continue;
            }
        }
        current.push((address, file, line));
    }
    sequences.sort_by_key(|s| s.start);
    let header = rows.header();
    let mut files = vec![header.file(0).and_then(|f| render_file(unit, f, header))];
    if files[0].is_none() {
        // DWARF 4 and older have no file 0.
        files[0] = Some(String::new());
    }
    let mut i = 1;
    while let Some(f) = header.file(i) {
        files.push(render_file(unit, f, header));
        i += 1;
    }
    Ok(Lines { files, sequences })
}

/// addr2line's rendering of a line-table file: compilation dir, then the directory entry
/// (not for index 0), then the file entry; an absolute part replaces what precedes it.
fn render_file(
    unit: gimli::UnitRef<'_, Reader>,
    file: &gimli::FileEntry<Reader, Offset>,
    header: &gimli::LineProgramHeader<Reader, Offset>,
) -> Option<String> {
    let text = |v| {
        unit.attr_string(v).ok().and_then(|r| {
            gimli::Reader::to_string_lossy(&r)
                .ok()
                .map(|c| c.into_owned())
        })
    };
    let mut path = match &unit.comp_dir {
        Some(d) => gimli::Reader::to_string_lossy(d).ok()?.into_owned(),
        None => String::new(),
    };
    if file.directory_index() != 0 {
        if let Some(d) = file.directory(header) {
            super::symbolize::push_path(&mut path, &text(d)?);
        }
    }
    super::symbolize::push_path(&mut path, &text(file.path_name())?);
    Some(path)
}

type FunctionTable = (Vec<Function>, Vec<(u64, u64, usize)>);

/// The unit's subprograms with code, by address.
fn parse_functions(unit: gimli::UnitRef<'_, Reader>) -> gimli::Result<FunctionTable> {
    let mut functions = Vec::new();
    let mut addresses = Vec::new();
    let mut entries = unit.entries_raw(None)?;
    while !entries.is_empty() {
        let die = entries.next_offset();
        let Some(abbrev) = entries.read_abbreviation()? else {
            continue;
        };
        if abbrev.tag() != gimli::DW_TAG_subprogram {
            entries.skip_attributes(abbrev.attributes())?;
            continue;
        }
        let mut attrs = RangeAttrs::default();
        for spec in abbrev.attributes() {
            let attr = entries.read_attribute(*spec)?;
            attrs.take(unit, &attr)?;
        }
        let index = functions.len();
        if attrs.each(unit, |b, e| addresses.push((b, e, index)))? {
            functions.push(Function { die, tree: None });
        }
    }
    addresses.sort_by_key(|a| a.0);
    Ok((functions, addresses))
}

/// A subprogram's name and its inlined calls (nested subprograms are skipped).
fn parse_inlined(
    unit: gimli::UnitRef<'_, Reader>,
    die: gimli::UnitOffset,
    offsets: &[gimli::DebugInfoOffset],
) -> gimli::Result<InlinedTree> {
    let mut entries = unit.entries_raw(Some(die))?;
    let depth = entries.next_depth();
    let abbrev = entries
        .read_abbreviation()?
        .ok_or(gimli::Error::NoEntryAtGivenOffset)?;
    let mut names = NameAttrs::default();
    for spec in abbrev.attributes() {
        let attr = entries.read_attribute(*spec)?;
        names.take(unit, &attr);
    }
    let name = names.resolve(unit, offsets, 16);
    let mut tree = InlinedTree {
        name,
        calls: Vec::new(),
        ranges: Vec::new(),
    };
    // Each open inlined call's depth in the DIE tree, innermost last.
    let mut open: Vec<isize> = Vec::new();
    loop {
        let d = entries.next_depth();
        if d <= depth || entries.is_empty() {
            break;
        }
        let offset = entries.next_offset();
        let Some(abbrev) = entries.read_abbreviation()? else {
            continue;
        };
        while open.last().is_some_and(|&o| d <= o) {
            open.pop();
        }
        match abbrev.tag() {
            gimli::DW_TAG_subprogram => {
                // A nested function: skip its whole subtree.
                entries.skip_attributes(abbrev.attributes())?;
                while entries.next_depth() > d && !entries.is_empty() {
                    if let Some(a) = entries.read_abbreviation()? {
                        entries.skip_attributes(a.attributes())?;
                    }
                }
            }
            gimli::DW_TAG_inlined_subroutine => {
                let mut ranges = RangeAttrs::default();
                let mut names = NameAttrs::default();
                let mut call_file = None;
                let mut call_line = 0;
                for spec in abbrev.attributes() {
                    let attr = entries.read_attribute(*spec)?;
                    if ranges.take(unit, &attr)? {
                        continue;
                    }
                    match attr.name() {
                        gimli::DW_AT_call_file => {
                            if let gimli::AttributeValue::FileIndex(fi) = attr.value() {
                                if fi > 0 || unit.header.version() >= 5 {
                                    call_file = Some(fi);
                                }
                            }
                        }
                        gimli::DW_AT_call_line => {
                            call_line = attr.udata_value().unwrap_or(0) as u32;
                        }
                        _ => names.take(unit, &attr),
                    }
                }
                let call = tree.calls.len();
                tree.calls.push(Inlined {
                    die: offset,
                    name: names.resolve(unit, offsets, 16),
                    call_file,
                    call_line,
                });
                let level = open.len();
                ranges.each(unit, |b, e| tree.ranges.push((b, e, level, call)))?;
                open.push(d);
            }
            _ => entries.skip_attributes(abbrev.attributes())?,
        }
    }
    tree.ranges.sort_by_key(|r| (r.2, r.0));
    Ok(tree)
}

/// The naming attributes of a DIE, resolved as addr2line's `name_attr`/`name_entry`:
/// the linkage name, else the name, else the origin's (up to a depth limit).
#[derive(Default)]
struct NameAttrs {
    linkage: Option<String>,
    name: Option<String>,
    origin: Option<gimli::AttributeValue<Reader>>,
}

impl NameAttrs {
    fn take(&mut self, unit: gimli::UnitRef<'_, Reader>, attr: &gimli::Attribute<Reader>) {
        let text = |v| {
            unit.attr_string(v).ok().and_then(|r| {
                gimli::Reader::to_string_lossy(&r)
                    .ok()
                    .map(|c| c.into_owned())
            })
        };
        match attr.name() {
            gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                if let Some(s) = text(attr.value()) {
                    self.linkage = Some(s);
                }
            }
            gimli::DW_AT_name => {
                if self.name.is_none() {
                    self.name = text(attr.value());
                }
            }
            gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => {
                if self.origin.is_none() {
                    self.origin = Some(attr.value());
                }
            }
            _ => {}
        }
    }

    fn resolve(
        self,
        unit: gimli::UnitRef<'_, Reader>,
        offsets: &[gimli::DebugInfoOffset],
        limit: u32,
    ) -> Option<String> {
        if self.linkage.is_some() {
            return self.linkage;
        }
        if self.name.is_some() {
            return self.name;
        }
        name_at(unit, self.origin?, offsets, limit)
    }
}

/// The name of the DIE an origin attribute points to (opening another unit if needed).
fn name_at(
    unit: gimli::UnitRef<'_, Reader>,
    value: gimli::AttributeValue<Reader>,
    offsets: &[gimli::DebugInfoOffset],
    limit: u32,
) -> Option<String> {
    if limit == 0 {
        return None;
    }
    match value {
        gimli::AttributeValue::UnitRef(o) => name_of_entry(unit, o, offsets, limit),
        gimli::AttributeValue::DebugInfoRef(o) => {
            let own = unit.header.offset().as_debug_info_offset();
            if let Some(uo) = own.and_then(|_| o.to_unit_offset(&unit.header)) {
                return name_of_entry(unit, uo, offsets, limit);
            }
            let dwarf = unit.dwarf;
            // The indexed unit just below `o`, else (a unit without code, such as a dwz
            // partial unit) a walk over the headers.
            let known = offsets
                .partition_point(|u| u.0 <= o.0)
                .checked_sub(1)
                .and_then(|i| dwarf.debug_info.header_from_offset(offsets[i]).ok())
                .filter(|h| o.to_unit_offset(h).is_some());
            let header = match known {
                Some(h) => h,
                None => {
                    let mut headers = dwarf.units();
                    loop {
                        let h = headers.next().ok()??;
                        if o.to_unit_offset(&h).is_some() {
                            break h;
                        }
                    }
                }
            };
            let other = dwarf.unit(header).ok()?;
            let uo = o.to_unit_offset(&other.header)?;
            // The other unit lives only for this lookup.
            name_of_entry(gimli::UnitRef::new(dwarf, &other), uo, offsets, limit)
        }
        gimli::AttributeValue::DebugInfoRefSup(o) => {
            let sup = unit.dwarf.sup()?;
            let mut headers = sup.units();
            while let Ok(Some(h)) = headers.next() {
                if let Some(uo) = o.to_unit_offset(&h) {
                    let other = sup.unit(h).ok()?;
                    return name_of_entry(gimli::UnitRef::new(sup, &other), uo, &[], limit);
                }
            }
            None
        }
        _ => None,
    }
}

fn name_of_entry(
    unit: gimli::UnitRef<'_, Reader>,
    offset: gimli::UnitOffset,
    offsets: &[gimli::DebugInfoOffset],
    limit: u32,
) -> Option<String> {
    let mut entries = unit.entries_raw(Some(offset)).ok()?;
    let abbrev = entries.read_abbreviation().ok()??;
    let mut names = NameAttrs::default();
    for spec in abbrev.attributes() {
        let attr = entries.read_attribute(*spec).ok()?;
        names.take(unit, &attr);
    }
    if names.linkage.is_some() {
        return names.linkage;
    }
    if names.name.is_some() {
        return names.name;
    }
    name_at(unit, names.origin?, offsets, limit - 1)
}
