//! `oxgrind diff OLD NEW`: two files of one kind compared site by site, largest change first.
//!
//! One measure per kind, the one people budget: Massif's peak (sites: the heap tree's root
//! children at each file's peak snapshot), DHAT's total bytes allocated (sites: program points,
//! by their whole stack), Memcheck's leaked bytes (sites: definitely-lost records, by kind and
//! stack, each with the indirect bytes hanging off it). Sites are keyed without code addresses
//! ([`crate::sites`]), so a rebuilt program still lines up with its previous run.
//!
//! [`Diff::fail_if_grown`] is the CI budget: the total grew by more than a percentage.

use crate::input::{Data, Input};
use crate::json::JsonOut;
use crate::massif_view;
use crate::sites::{stack_key, without_address};
use crate::size;
use oxgrind_formats::number::commify;
use std::collections::HashMap;
use std::fmt::Write;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteChange {
    pub site: String,
    pub old: u64,
    pub new: u64,
}

impl SiteChange {
    pub fn delta(&self) -> i128 {
        self.new as i128 - self.old as i128
    }
}

#[derive(Clone, Debug)]
pub struct Diff {
    pub kind: &'static str,
    pub old_path: String,
    pub new_path: String,
    /// What is compared, e.g. `peak bytes`.
    pub measure: &'static str,
    /// How the total is made, for the header line.
    pub total_means: &'static str,
    /// Whether the measure is bytes (else a count, e.g. Cachegrind's instructions).
    pub bytes: bool,
    pub old_total: u64,
    pub new_total: u64,
    /// Other totals worth a line: (name, old, new).
    pub also: Vec<(&'static str, u64, u64)>,
    /// Every site in either file, largest absolute change first.
    pub rows: Vec<SiteChange>,
}

/// Why two files cannot be compared.
#[derive(Debug)]
pub struct KindMismatch {
    pub old: &'static str,
    pub new: &'static str,
}

impl std::fmt::Display for KindMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot compare a {} file with a {} file (diff needs two files of one kind)",
            self.old, self.new
        )
    }
}

impl std::error::Error for KindMismatch {}

/// Per-site values of one file, and its totals.
struct Side {
    sites: Vec<(String, u64)>,
    total: u64,
    also: Vec<(&'static str, u64)>,
}

fn massif_side(f: &oxgrind_formats::massif::MassifFile) -> Side {
    let peak = massif_view::peak_index(f).map(|i| &f.snapshots[i]);
    Side {
        sites: peak
            .and_then(|s| s.tree.as_ref())
            .map(massif_view::sites_of)
            .unwrap_or_default(),
        total: peak.map_or(0, massif_view::total),
        also: vec![
            ("useful heap at the peak", peak.map_or(0, |s| s.mem_heap_b)),
            (
                "extra heap at the peak",
                peak.map_or(0, |s| s.mem_heap_extra_b),
            ),
        ],
    }
}

fn dhat_side(f: &oxgrind_formats::dhat::DhatFile) -> Side {
    let frame = |i: &u32| {
        f.ftbl
            .get(*i as usize)
            .map_or("???", |s| without_address(s))
    };
    let mut by: HashMap<String, u64> = HashMap::new();
    for pp in &f.pps {
        let key = stack_key(pp.fs.iter().map(frame));
        *by.entry(key).or_default() += pp.tb;
    }
    let t = crate::dhat_view::totals(f);
    Side {
        sites: by.into_iter().collect(),
        total: t[0],
        also: vec![("blocks allocated", t[1]), ("bytes live at t-gmax", t[5])],
    }
}

fn memcheck_side(doc: &oxgrind_formats::memcheck_xml_reader::MemcheckXml) -> Side {
    let mut by: HashMap<String, u64> = HashMap::new();
    for e in doc
        .errors
        .iter()
        .filter(|e| e.kind == "Leak_DefinitelyLost")
    {
        let texts: Vec<String> = e.stack.iter().map(|f| f.to_string()).collect();
        let stack = stack_key(texts.iter().map(String::as_str));
        *by.entry(stack).or_default() += e.leak.map_or(0, |l| l.bytes);
    }
    let counts = crate::memcheck_view::counts(doc);
    let errors: u64 = doc
        .errors
        .iter()
        .filter(|e| !e.is_leak())
        .map(|e| counts.get(&e.unique).copied().unwrap_or(1))
        .sum();
    let summary = crate::leak_summary(doc);
    Side {
        sites: by.into_iter().collect(),
        total: crate::leaked_bytes(doc),
        also: vec![
            ("errors", errors),
            ("possibly lost bytes", summary[2].bytes),
        ],
    }
}

fn cachegrind_side(f: &oxgrind_formats::cachegrind::CachegrindFile) -> Side {
    let first = |c: &[u64]| c.first().copied().unwrap_or(0);
    Side {
        sites: crate::cachegrind_view::by_function(f)
            .into_iter()
            .map(|(file, func, counts)| (format!("{func} ({file})"), first(&counts)))
            .collect(),
        total: first(&f.summary),
        also: Vec::new(),
    }
}

/// Compares two inputs of the same kind.
pub fn diff(old: &Input, new: &Input) -> Result<Diff, KindMismatch> {
    let (kind, measure, total_means, a, b) = match (&old.data, &new.data) {
        (Data::Massif(a), Data::Massif(b)) => (
            "massif",
            "peak bytes",
            "heap + extra heap + stacks at the peak snapshot; sites: heap at the peak",
            massif_side(a),
            massif_side(b),
        ),
        (Data::Dhat(a), Data::Dhat(b)) => (
            "dhat",
            "total bytes",
            "bytes allocated over the whole run, per program point",
            dhat_side(a),
            dhat_side(b),
        ),
        (Data::Memcheck(a), Data::Memcheck(b)) => (
            "memcheck",
            "leaked bytes",
            "definitely + indirectly lost; sites: definitely-lost records with their indirect bytes",
            memcheck_side(a),
            memcheck_side(b),
        ),
        (Data::Cachegrind(a), Data::Cachegrind(b)) => (
            "cachegrind",
            "instructions",
            "the first event (Ir unless --show changed it); sites: functions",
            cachegrind_side(a),
            cachegrind_side(b),
        ),
        _ => {
            return Err(KindMismatch {
                old: old.data.kind(),
                new: new.data.kind(),
            })
        }
    };
    let mut rows: HashMap<String, SiteChange> = HashMap::new();
    for (site, v) in a.sites {
        rows.entry(site.clone())
            .or_insert(SiteChange {
                site,
                old: 0,
                new: 0,
            })
            .old += v;
    }
    for (site, v) in b.sites {
        rows.entry(site.clone())
            .or_insert(SiteChange {
                site,
                old: 0,
                new: 0,
            })
            .new += v;
    }
    let mut rows: Vec<SiteChange> = rows.into_values().collect();
    rows.sort_by(|x, y| {
        y.delta()
            .abs()
            .cmp(&x.delta().abs())
            .then_with(|| y.new.cmp(&x.new))
            .then_with(|| x.site.cmp(&y.site))
    });
    Ok(Diff {
        bytes: kind != "cachegrind",
        kind,
        old_path: old.path.display().to_string(),
        new_path: new.path.display().to_string(),
        measure,
        total_means,
        old_total: a.total,
        new_total: b.total,
        also: a
            .also
            .iter()
            .zip(&b.also)
            .map(|((n, o), (_, v))| (*n, *o, *v))
            .collect(),
        rows,
    })
}

/// `+12.50%`, or `new` when the old total was 0.
fn percent(old: u64, new: u64) -> String {
    if old == 0 {
        return if new == 0 {
            "+0.00%".into()
        } else {
            "new".into()
        };
    }
    format!("{:+.2}%", (new as f64 - old as f64) * 100.0 / old as f64)
}

impl Diff {
    /// `15,012,345 B (14.3 MiB)` for bytes, `15,012,345` for counts.
    fn amount(&self, v: u64) -> String {
        if self.bytes {
            size::both(v)
        } else {
            commify(v)
        }
    }

    fn change(&self, d: i128) -> String {
        if self.bytes {
            size::signed(d)
        } else {
            format!(
                "{}{}",
                if d < 0 { "-" } else { "+" },
                commify(d.unsigned_abs())
            )
        }
    }

    pub fn delta(&self) -> i128 {
        self.new_total as i128 - self.old_total as i128
    }

    /// The site that grew most, if any grew.
    pub fn top_growth(&self) -> Option<&SiteChange> {
        self.rows
            .iter()
            .filter(|r| r.delta() > 0)
            .max_by_key(|r| r.delta())
    }

    /// `Some(line)` when the total grew by more than `pct` percent (any growth from zero
    /// breaks every budget): the one line CI shows.
    pub fn fail_if_grown(&self, pct: f64) -> Option<String> {
        let grown = if self.old_total == 0 {
            self.new_total > 0
        } else {
            (self.new_total as f64 - self.old_total as f64) * 100.0 / self.old_total as f64 > pct
        };
        if !grown {
            return None;
        }
        let top = match self.top_growth() {
            Some(r) => format!("; top site: {} ({})", r.site, self.change(r.delta())),
            None => String::new(),
        };
        Some(format!(
            "budget broken: {} grew {} ({} -> {}), over the {pct}% allowed by --fail-if-grown{top}",
            self.measure,
            percent(self.old_total, self.new_total),
            self.amount(self.old_total),
            self.amount(self.new_total),
        ))
    }

    /// The text report: totals, then every changed site, largest change first.
    pub fn text(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "oxgrind diff: {} {} ({})",
            self.kind, self.measure, self.total_means
        );
        let _ = writeln!(
            o,
            "  old: {}  {}",
            self.amount(self.old_total),
            self.old_path
        );
        let _ = writeln!(
            o,
            "  new: {}  {}",
            self.amount(self.new_total),
            self.new_path
        );
        let _ = writeln!(
            o,
            "  change: {} ({})",
            self.change(self.delta()),
            percent(self.old_total, self.new_total)
        );
        for (name, a, b) in &self.also {
            let _ = writeln!(o, "  {name}: {} -> {}", commify(*a), commify(*b));
        }
        let changed: Vec<&SiteChange> = self.rows.iter().filter(|r| r.delta() != 0).collect();
        let _ = writeln!(
            o,
            "\n{} of {} sites changed{}",
            changed.len(),
            self.rows.len(),
            if changed.is_empty() {
                "."
            } else {
                ", largest change first:"
            }
        );
        if !changed.is_empty() {
            let _ = writeln!(o, "{:>28} {:>16} {:>16}  site", "change", "old", "new");
        }
        for r in changed {
            let _ = writeln!(
                o,
                "{:>28} {:>16} {:>16}  {}",
                self.change(r.delta()),
                commify(r.old),
                commify(r.new),
                r.site
            );
        }
        o
    }

    /// The diff's JSON (`--format=json`, and the page's data under `"diff"`).
    pub fn json(&self) -> String {
        let mut j = JsonOut::new();
        j.obj()
            .field_u64("oxgrind_report", crate::JSON_VERSION)
            .key("diff")
            .obj();
        self.write(&mut j);
        j.end_obj().end_obj();
        let mut s = j.finish();
        s.push('\n');
        s
    }

    fn write(&self, j: &mut JsonOut) {
        j.field_str("of", self.kind)
            .field_str("old_path", &self.old_path)
            .field_str("new_path", &self.new_path)
            .field_str("measure", self.measure)
            .field_str("total_means", self.total_means)
            .key("bytes")
            .bool(self.bytes)
            .field_u64("old_total", self.old_total)
            .field_u64("new_total", self.new_total);
        j.key("also").arr();
        for (n, a, b) in &self.also {
            j.arr().str(n).u64(*a).u64(*b).end_arr();
        }
        j.end_arr();
        // [site, old, new], largest absolute change first.
        j.key("sites").arr();
        for r in &self.rows {
            j.arr().str(&r.site).u64(r.old).u64(r.new).end_arr();
        }
        j.end_arr();
    }

    /// The page.
    pub fn html(&self) -> String {
        crate::page::html(
            &format!("{} -> {}", self.old_path, self.new_path),
            &self.json(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxgrind_formats::massif::{self, SnapshotKind};
    use std::path::Path;

    fn example(kind: &str, name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/reference/examples")
            .join(kind)
            .join(name)
    }

    /// massif.out.default with `extra` more bytes at the peak in the site `site`.
    fn grown_massif(site: &str, extra: u64) -> Input {
        let path = example("massif", "massif.out.default");
        let mut f = massif::parse(&std::fs::read(&path).unwrap()).unwrap();
        let peak = f
            .snapshots
            .iter_mut()
            .find(|s| s.kind == SnapshotKind::Peak)
            .unwrap();
        peak.mem_heap_b += extra;
        let tree = peak.tree.as_mut().unwrap();
        tree.bytes += extra;
        let node = tree
            .children
            .iter_mut()
            .find(|c| without_address(&c.label) == site)
            .unwrap();
        node.bytes += extra;
        let text = massif::write(&f);
        crate::input::parse(Path::new("new.massif"), text.as_bytes()).unwrap()
    }

    #[test]
    fn massif_diff_puts_the_grown_site_first_and_breaks_the_budget() {
        let old = crate::load(&example("massif", "massif.out.default")).unwrap();
        let new = grown_massif("mid_alloc (ms_prog.c:7)", 100_000);
        let d = diff(&old, &new).unwrap();
        assert_eq!(d.old_total, 910_800);
        assert_eq!(d.new_total, 1_010_800);
        assert_eq!(
            d.rows[0],
            SiteChange {
                site: "mid_alloc (ms_prog.c:7)".into(),
                old: 16_600,
                new: 116_600
            }
        );
        assert!(d.rows[1..].iter().all(|r| r.delta() == 0));
        // +10.98%: within 11%, over 10%.
        assert_eq!(d.fail_if_grown(11.0), None);
        let line = d.fail_if_grown(10.0).unwrap();
        assert_eq!(
            line,
            "budget broken: peak bytes grew +10.98% (910,800 B (889.5 KiB) -> 1,010,800 B (987.1 KiB)), \
             over the 10% allowed by --fail-if-grown; top site: mid_alloc (ms_prog.c:7) (+100,000 B (+97.7 KiB))"
        );
        let text = d.text();
        assert!(
            text.contains("1 of 4 sites changed, largest change first:"),
            "{text}"
        );
        assert!(
            text.contains(
                "+100,000 B (+97.7 KiB)           16,600          116,600  mid_alloc (ms_prog.c:7)"
            ),
            "{text}"
        );
        // Shrinking never breaks a budget.
        let back = diff(&new, &old).unwrap();
        assert_eq!(back.fail_if_grown(0.0), None);
        assert_eq!(back.top_growth(), None);
    }

    #[test]
    fn memcheck_diff_compares_leaks_by_stack_and_counts_errors() {
        let old = crate::load(&example("memcheck", "mc_errors.plain.xml")).unwrap();
        let new = crate::load(&example("memcheck", "mc_errors.with-supp.xml")).unwrap();
        let d = diff(&old, &new).unwrap();
        assert_eq!((d.old_total, d.new_total), (180, 100));
        assert_eq!(
            d.rows[0].site,
            "leak_indirect (mc_errors.c:10) <- main (mc_errors.c:56)"
        );
        assert_eq!((d.rows[0].old, d.rows[0].new), (80, 0));
        assert_eq!(d.also[0], ("errors", 9, 4));
        // A leak appearing from nothing breaks any budget.
        let grew = diff(&new, &old).unwrap();
        assert!(grew.fail_if_grown(50.0).is_some());
        assert!(grew.fail_if_grown(81.0).is_none());
    }

    #[test]
    fn cachegrind_diff_counts_instructions_per_function() {
        let old = crate::load(&example("cachegrind", "cachegrind.out.static-nobranch")).unwrap();
        let new = crate::load(&example("cachegrind", "cachegrind.out.static")).unwrap();
        let d = diff(&old, &new).unwrap();
        assert!(!d.bytes);
        assert_eq!(d.measure, "instructions");
        assert!(
            d.rows.iter().any(|r| r.site == "sum (/src/fmt/cg_prog.c)"),
            "{:?}",
            d.rows
        );
        assert!(!d.text().contains(" B"), "{}", d.text());
    }

    #[test]
    fn files_of_different_kinds_are_refused() {
        let a = crate::load(&example("memcheck", "mc_errors.plain.xml")).unwrap();
        let b = crate::load(&example("dhat", "dhat.out.heap")).unwrap();
        let e = diff(&a, &b).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot compare a memcheck file with a dhat file (diff needs two files of one kind)"
        );
    }

    #[test]
    fn diff_json_lists_every_site() {
        let old = crate::load(&example("dhat", "dhat.out.heap")).unwrap();
        let new = crate::load(&example("dhat", "dhat.out.heap2")).unwrap();
        let d = diff(&old, &new).unwrap();
        assert_eq!(d.old_total, 10_052);
        let j = d.json();
        assert!(
            j.starts_with("{\"oxgrind_report\":1,\"diff\":{\"of\":\"dhat\""),
            "{j}"
        );
        assert_eq!(j.matches(" \\u003c- ").count() > 0, true);
    }
}
