//! The fuzz targets' checks (`fuzz/src/checks.rs`) on stable, in every test run: each reader
//! users feed (massif.out for ms_print, DHAT JSON, suppression files, the command line) gets
//! the committed corpus (`fuzz/corpus/<target>/`) and a few thousand deterministic mutations
//! of it, and must return a value or a one-line error naming the file and line, never panic.
//! The real fuzzing (coverage-guided, for as long as you like) is `cargo +nightly fuzz run
//! <target>` in `fuzz/` (see `fuzz/README.md`); a crash it finds goes into the corpus and so
//! into this test.

#[path = "../../../fuzz/src/checks.rs"]
mod checks;

use std::path::Path;

/// xorshift64*: deterministic, so a failure here reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bytes that matter to these grammars, for insertions.
const INTERESTING: &[&[u8]] = &[
    b"\n",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"=",
    b"\"",
    b"-1",
    b"0",
    b"99999999999999999999999",
    b"n1: ",
    b"snapshot=",
    b"mem_heap_B=",
    b"#-----------\n",
    b"heap_tree=detailed\n",
    b"...",
    b"fun:",
    b"obj:",
    b"Memcheck:",
    b"--",
    b"%q{",
    b"%p",
    b"\xff",
    b"\0",
    b" ",
    b"\t",
];

fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(6) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 => v.truncate(at),
            2 => {
                let ins = INTERESTING[rng.below(INTERESTING.len())];
                v.splice(at..at, ins.iter().copied());
            }
            3 if !v.is_empty() => {
                let end = (at + rng.below(64)).min(v.len());
                v.drain(at.min(end)..end);
            }
            4 if !v.is_empty() => {
                // Duplicate a slice elsewhere (repeats lines, nests brackets).
                let s = rng.below(v.len());
                let e = (s + rng.below(80)).min(v.len());
                let piece: Vec<u8> = v[s..e].to_vec();
                v.splice(at..at, piece);
            }
            _ => {
                let i = rng.below(v.len() + 1);
                v.insert(i.min(v.len()), rng.next() as u8);
            }
        }
    }
    v
}

fn exercise(target: &str, check: fn(&[u8]), mutations: usize) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut corpus: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| std::fs::read(e.path()).unwrap())
        .collect();
    corpus.sort();
    assert!(!corpus.is_empty(), "no corpus in {}", dir.display());
    for input in &corpus {
        check(input);
    }
    // OXGRIND_FUZZ_MUTATIONS=N for a longer run on stable.
    let mutations = std::env::var("OXGRIND_FUZZ_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(mutations);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ target.len() as u64);
    for i in 0..mutations {
        let base = &corpus[i % corpus.len()];
        let input = mutate(&mut rng, base);
        if let Err(panic) = std::panic::catch_unwind(|| check(&input)) {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!(
                "{target}: mutation {i} fails: {msg}\ninput ({} bytes): {:?}",
                input.len(),
                String::from_utf8_lossy(&input)
            );
        }
    }
}

#[test]
fn massif_out_reader_never_panics() {
    exercise("massif_out", checks::massif_out, 3000);
}

#[test]
fn dhat_json_reader_never_panics() {
    exercise("dhat_json", checks::dhat_json, 3000);
}

#[test]
fn suppression_reader_never_panics() {
    exercise("suppressions", checks::suppressions, 3000);
}

#[test]
fn options_parser_never_panics() {
    exercise("options", checks::options, 3000);
}
