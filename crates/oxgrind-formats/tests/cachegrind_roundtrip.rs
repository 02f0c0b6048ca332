//! cachegrind.out reader and writer: Valgrind's own files come back byte for byte, the exit
//! summary is laid out as Cachegrind prints it, and bad files say where and why.

use oxgrind_formats::cachegrind::{self, CacheConfig, ParseErrorKind, Totals};
use std::path::{Path, PathBuf};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference/examples/cachegrind")
}

fn example_files() -> Vec<PathBuf> {
    let dir = examples();
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("cachegrind.out.")
        })
        .collect();
    v.sort();
    assert!(v.len() >= 4, "examples missing in {}", dir.display());
    v
}

#[test]
fn parse_then_write_reproduces_every_valgrind_example_byte_for_byte() {
    for f in example_files() {
        let bytes = std::fs::read(&f).unwrap();
        let model = cachegrind::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let written = cachegrind::write(&model);
        assert!(
            written.as_bytes() == bytes.as_slice(),
            "{}: round trip differs",
            f.display()
        );
    }
}

#[test]
fn parsed_example_has_expected_shape() {
    let bytes = std::fs::read(examples().join("cachegrind.out.static")).unwrap();
    let m = cachegrind::parse(&bytes).unwrap();
    assert_eq!(m.cmd, "./cg_prog");
    assert_eq!(m.events, cachegrind::event_names(true, true));
    assert_eq!(
        m.desc[2],
        "LL cache:         268435456 B, 64 B, direct-mapped"
    );
    let sum = m.records.iter().find(|r| r.func == "sum").unwrap();
    assert_eq!((sum.file.as_str(), sum.line), ("/src/fmt/cg_prog.c", 2));
    assert_eq!(sum.counts[0], 409720);
    assert_eq!(m.summary[0], 500089);
    // The summary is the sum of the records.
    for e in 0..m.events.len() {
        let total: u64 = m.records.iter().map(|r| r.counts[e]).sum();
        assert_eq!(total, m.summary[e], "event {}", m.events[e]);
    }
}

#[test]
fn sorted_records_are_in_cachegrinds_order() {
    let bytes = std::fs::read(examples().join("cachegrind.out.nosim")).unwrap();
    let m = cachegrind::parse(&bytes).unwrap();
    let mut sorted = m.records.clone();
    cachegrind::sort_records(&mut sorted);
    assert_eq!(sorted, m.records);
}

#[test]
fn cache_descriptions_match_valgrinds() {
    let c = CacheConfig {
        size: 32768,
        assoc: 8,
        line: 64,
    };
    let ll = CacheConfig {
        size: 268435456,
        assoc: 1,
        line: 64,
    };
    let d = CacheConfig::desc_lines(&c, &c, &ll);
    let bytes = std::fs::read_to_string(examples().join("cachegrind.out.static")).unwrap();
    let first3: Vec<String> = bytes
        .lines()
        .take(3)
        .map(|l| l.strip_prefix("desc: ").unwrap().to_string())
        .collect();
    assert_eq!(d, first3);
}

#[test]
fn exit_summary_is_laid_out_as_cachegrind_prints_it() {
    // The totals of examples/cachegrind/cg_prog.stderr.
    let t = Totals {
        ir: 500089,
        i1mr: 429,
        ilmr: 429,
        dr: 272871,
        d1mr: 155,
        dlmr: 155,
        dw: 5605,
        d1mw: 378,
        dlmw: 378,
        bc: 54593,
        bcm: 1225,
        bi: 59,
        bim: 37,
    };
    let stderr = std::fs::read_to_string(examples().join("cg_prog.stderr")).unwrap();
    let expected: Vec<&str> = stderr
        .lines()
        .skip_while(|l| !l.contains("I   refs:"))
        .map(|l| l.split_once("== ").map(|x| x.1).unwrap_or(""))
        .collect();
    let got = cachegrind::summary_text(&t, true, true);
    assert_eq!(got, expected);
}

#[test]
fn missing_summary_and_bad_counts_are_reported_with_the_line() {
    let e = cachegrind::parse(b"desc: x\ncmd: p\nevents: Ir\nfl=a\nfn=b\n1 2\n").unwrap_err();
    assert_eq!(e.kind, ParseErrorKind::MissingSummary);
    let e = cachegrind::parse(b"cmd: p\nevents: Ir\nfl=a\nfn=b\n1 2 3\nsummary: 2\n").unwrap_err();
    assert_eq!((e.line, e.kind), (5, ParseErrorKind::TooManyCounts));
    let e = cachegrind::parse(b"cmd: p\nevents: Ir Dr\nsummary: 2\n").unwrap_err();
    assert_eq!((e.line, e.kind), (3, ParseErrorKind::SummaryMismatch));
    let e = cachegrind::parse(b"events: Ir\n").unwrap_err();
    assert_eq!((e.line, e.kind), (1, ParseErrorKind::MissingCmd));
}
