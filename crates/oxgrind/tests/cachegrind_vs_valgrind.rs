//! Cachegrind, differentially: the same program under Valgrind's Cachegrind and ours, with
//! the same explicit caches, compared function by function on the program's own code.
//!
//! What must be equal, and what may differ (docs/differences-from-valgrind.md, Cachegrind):
//! * Ir, Dr, Dw, Bc and Bi of every function of the test program: equal. These depend only
//!   on the code executed, which is the same binary (`-no-pie`, so at the same addresses).
//! * Misses (I1mr, ILmr, D1mr, DLmr, D1mw, DLmw) and mispredicts (Bcm, Bim): within 2% or 4,
//!   whichever is larger. Valgrind also simulates the dynamic loader and libc's start-up,
//!   which we do not see (the engine takes over in our runtime's constructor), and its
//!   stack sits elsewhere: the few lines and predictor counters they leave behind differ.
//! * Everything outside the program's own functions (ld.so, libc's start-up, glibc's
//!   string functions, which Valgrind runs in their AVX2 variants): not compared.
//!
//! Then the viewers: Valgrind's cg_annotate reads our file without a warning, and our
//! cg_annotate prints what it prints, on our file and on Valgrind's.

#[path = "cg_normalise.rs"]
mod cg_normalise;
mod common;

use common::*;
use oxgrind_formats::cachegrind::{self, CachegrindFile, Totals};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const CACHES: [&str; 3] = ["--I1=32768,8,64", "--D1=32768,8,64", "--LL=8388608,16,64"];

/// glibc's AVX2 code paths, the ones it picks under Valgrind (which hides AVX-512).
const AVX2_ONLY: (&str, &str) = (
    "GLIBC_TUNABLES",
    "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW",
);

struct Run {
    file: CachegrindFile,
    path: PathBuf,
    log: String,
}

fn cachegrind(tool: &str, prog: &Path, prog_args: &[&str], opts: &[&str], dir: &Path) -> Run {
    let name = format!(
        "{}.out",
        Path::new(tool).file_name().unwrap().to_string_lossy()
    );
    let path = dir.join(&name);
    let out = run(Command::new(tool)
        .arg("--tool=cachegrind")
        .args(opts)
        .arg(format!("--cachegrind-out-file={}", path.display()))
        .arg(prog)
        .args(prog_args)
        .env(AVX2_ONLY.0, AVX2_ONLY.1)
        .current_dir(dir));
    let log = stderr(&out);
    let text = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{tool}: {} not written ({e}): {log}", path.display()));
    let file = cachegrind::parse(&text).unwrap_or_else(|e| panic!("{tool}'s file: {e}"));
    Run { file, path, log }
}

/// Per-function sums over the records of `source` (the test program's own file).
fn functions(file: &CachegrindFile, source: &str) -> BTreeMap<String, Vec<u64>> {
    let mut m: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in file.records.iter().filter(|r| r.file.ends_with(source)) {
        let v = m
            .entry(r.func.clone())
            .or_insert_with(|| vec![0; r.counts.len()]);
        for (a, b) in v.iter_mut().zip(&r.counts) {
            *a += b;
        }
    }
    m
}

fn exact_event(e: &str) -> bool {
    matches!(e, "Ir" | "Dr" | "Dw" | "Bc" | "Bi")
}

/// Compares the program's functions; returns a table of the differences for messages.
fn compare_functions(ours: &CachegrindFile, theirs: &CachegrindFile, source: &str) {
    assert_eq!(ours.events, theirs.events);
    let (o, t) = (functions(ours, source), functions(theirs, source));
    assert!(!t.is_empty(), "Valgrind's file has no function of {source}");
    assert_eq!(
        o.keys().collect::<Vec<_>>(),
        t.keys().collect::<Vec<_>>(),
        "the program's functions"
    );
    let mut bad = vec![];
    for (func, tv) in &t {
        let ov = &o[func];
        for (k, e) in theirs.events.iter().enumerate() {
            let (a, b) = (ov[k], tv[k]);
            let ok = if exact_event(e) {
                a == b
            } else {
                a.abs_diff(b) <= (b * 2 / 100).max(4)
            };
            if !ok {
                bad.push(format!("{func} {e}: ours {a}, Valgrind's {b}"));
            }
        }
    }
    assert!(bad.is_empty(), "differences:\n{}", bad.join("\n"));
}

fn totals(f: &CachegrindFile) -> Totals {
    let get = |e: &str| {
        f.events
            .iter()
            .position(|x| x == e)
            .map_or(0, |i| f.summary[i])
    };
    Totals {
        ir: get("Ir"),
        i1mr: get("I1mr"),
        ilmr: get("ILmr"),
        dr: get("Dr"),
        d1mr: get("D1mr"),
        dlmr: get("DLmr"),
        dw: get("Dw"),
        d1mw: get("D1mw"),
        dlmw: get("DLmw"),
        bc: get("Bc"),
        bcm: get("Bcm"),
        bi: get("Bi"),
        bim: get("Bim"),
    }
}

/// The exit summary's lines (without the `==pid== ` prefix), from `I   refs:` on.
fn summary_lines(log: &str) -> Vec<String> {
    log.lines()
        .skip_while(|l| !l.contains("== I   refs:"))
        .filter_map(|l| l.split_once("== ").map(|x| x.1.to_string()))
        .collect()
}

/// The label of each summary line (`D1  misses:`), for comparing layouts across runs.
fn labels(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|l| l.split("  ").next().unwrap_or("").to_string())
        .collect()
}

fn annotate(tool: &[&str], file: &Path) -> (String, String, bool) {
    let out = run(Command::new(tool[0]).args(&tool[1..]).arg(file));
    (stdout(&out), stderr(&out), out.status.success())
}

#[test]
fn kernels_count_as_valgrinds_cachegrind_counts() {
    if !have_valgrind() {
        return;
    }
    let prog = build("cg_kernels.c", &["-g", "-O0", "-no-pie"]);
    let dir = tempfile::tempdir().unwrap();
    let mut opts = CACHES.to_vec();
    opts.push("--branch-sim=yes");
    let ox = oxgrind();
    let ours = cachegrind(ox.to_str().unwrap(), &prog, &[], &opts, dir.path());
    let theirs = cachegrind("valgrind", &prog, &[], &opts, dir.path());
    assert_eq!(ours.file.desc, theirs.file.desc, "cache descriptions");
    assert_eq!(ours.file.cmd, theirs.file.cmd);
    compare_functions(&ours.file, &theirs.file, "tests/corpus/cg_kernels.c");

    // The summary on stderr: Valgrind's layout, the file's totals.
    let lines = summary_lines(&ours.log);
    assert_eq!(
        lines,
        cachegrind::summary_text(&totals(&ours.file), true, true),
        "{}",
        ours.log
    );
    assert_eq!(labels(&lines), labels(&summary_lines(&theirs.log)));
    let sum_of_records: u64 = ours.file.records.iter().map(|r| r.counts[0]).sum();
    assert_eq!(sum_of_records, ours.file.summary[0]);

    // Valgrind's cg_annotate reads our file, and ours prints what it prints on both files.
    let ox_annotate = [ox.to_str().unwrap(), "cg_annotate"];
    for (file, whose) in [(&ours.path, "ours"), (&theirs.path, "Valgrind's")] {
        let (p_out, p_err, p_ok) = annotate(&["/usr/bin/cg_annotate"], file);
        assert!(p_ok && p_err.is_empty(), "cg_annotate on {whose}: {p_err}");
        let (o_out, o_err, o_ok) = annotate(&ox_annotate, file);
        assert!(o_ok, "oxgrind cg_annotate on {whose}: {o_err}");
        assert_eq!(
            cg_normalise::normalise(&o_out, false),
            cg_normalise::normalise(&p_out, false),
            "cg_annotate output on {whose} file"
        );
        assert!(p_out.contains("cg_kernels.c:stream"), "{p_out}");
    }
}

/// The default configuration, without the branch simulation: the records of cache hits
/// that change nothing are left out (data accesses to, and blocks whose code is all on,
/// lines their set used last), and block runs are counted inline.
#[test]
fn kernels_count_as_valgrinds_cachegrind_counts_with_records_left_out() {
    if !have_valgrind() {
        return;
    }
    let prog = build("cg_kernels.c", &["-g", "-O0", "-no-pie"]);
    let dir = tempfile::tempdir().unwrap();
    let ours = cachegrind(oxgrind().to_str().unwrap(), &prog, &[], &CACHES, dir.path());
    let theirs = cachegrind("valgrind", &prog, &[], &CACHES, dir.path());
    compare_functions(&ours.file, &theirs.file, "tests/corpus/cg_kernels.c");
    // Ir is charged from inline counts now: the summary still adds up to the lines.
    let sum_of_records: u64 = ours.file.records.iter().map(|r| r.counts[0]).sum();
    assert_eq!(sum_of_records, ours.file.summary[0]);
}

#[test]
fn without_cache_simulation_only_instructions_and_branches_are_counted() {
    if !have_valgrind() {
        return;
    }
    let prog = build("cg_kernels.c", &["-g", "-O0", "-no-pie"]);
    let dir = tempfile::tempdir().unwrap();
    let opts = ["--cache-sim=no", "--branch-sim=yes"];
    let ox = oxgrind();
    let ours = cachegrind(ox.to_str().unwrap(), &prog, &["short"], &opts, dir.path());
    let theirs = cachegrind("valgrind", &prog, &["short"], &opts, dir.path());
    assert_eq!(ours.file.events, ["Ir", "Bc", "Bcm", "Bi", "Bim"]);
    let text = std::fs::read_to_string(&ours.path).unwrap();
    assert!(text.contains("\nevents: Ir Bc Bcm Bi Bim\n"), "{text}");
    compare_functions(&ours.file, &theirs.file, "tests/corpus/cg_kernels.c");
    let lines = summary_lines(&ours.log);
    assert_eq!(
        labels(&lines),
        labels(&summary_lines(&theirs.log)),
        "{}",
        ours.log
    );
    assert!(lines[0].starts_with("I   refs:"));
    assert!(!ours.log.contains("I1  misses"));
}

/// Neither simulation: only instructions, counted inline per block run (no trace record).
#[test]
fn without_either_simulation_instructions_are_counted_as_valgrind_counts_them() {
    if !have_valgrind() {
        return;
    }
    let prog = build("cg_kernels.c", &["-g", "-O0", "-no-pie"]);
    let dir = tempfile::tempdir().unwrap();
    let opts = ["--cache-sim=no"];
    let ours = cachegrind(
        oxgrind().to_str().unwrap(),
        &prog,
        &["short"],
        &opts,
        dir.path(),
    );
    let theirs = cachegrind("valgrind", &prog, &["short"], &opts, dir.path());
    assert_eq!(ours.file.events, ["Ir"]);
    compare_functions(&ours.file, &theirs.file, "tests/corpus/cg_kernels.c");
    let lines = summary_lines(&ours.log);
    assert_eq!(labels(&lines), labels(&summary_lines(&theirs.log)));
}

#[test]
fn threads_share_one_simulated_machine_and_count_their_own_work() {
    if !have_valgrind() {
        return;
    }
    let prog = build("cg_threads.c", &["-g", "-O0", "-no-pie"]);
    let dir = tempfile::tempdir().unwrap();
    let ox = oxgrind();
    let ours = cachegrind(ox.to_str().unwrap(), &prog, &[], &CACHES, dir.path());
    let theirs = cachegrind("valgrind", &prog, &[], &CACHES, dir.path());
    let (o, t) = (
        functions(&ours.file, "tests/corpus/cg_threads.c"),
        functions(&theirs.file, "tests/corpus/cg_threads.c"),
    );
    for func in ["work", "alone", "thread_main"] {
        for e in ["Ir", "Dr", "Dw"] {
            let k = ours.file.events.iter().position(|x| x == e).unwrap();
            assert_eq!(o[func][k], t[func][k], "{func} {e}");
        }
    }
}

/// A fault in an instruction copied with `rax` and the live flags still borrowed by the
/// instrumentation (`cg_fault_flags.c`) shows the program's registers and flags to its
/// handler, and the program goes on with them, as natively.
#[test]
fn a_fault_where_the_flags_are_borrowed_shows_the_programs_flags_to_its_handler() {
    let prog = build("cg_fault_flags.c", &["-g", "-O0"]);
    let native = run(&mut Command::new(&prog));
    assert!(
        stdout(&native).contains("flags in handler 91 "),
        "{}",
        stdout(&native)
    );
    let dir = tempfile::tempdir().unwrap();
    let ours = run(Command::new(oxgrind())
        .args(["--tool=cachegrind", "--cachegrind-out-file=cg.out"])
        .arg(&prog)
        .current_dir(dir.path()));
    assert_eq!(stdout(&ours), stdout(&native), "{}", stderr(&ours));
    assert!(dir.path().join("cg.out").exists(), "{}", stderr(&ours));
}

#[test]
fn default_output_file_is_named_after_the_pid() {
    let prog = build("cg_kernels.c", &["-g", "-O0", "-no-pie"]);
    let dir = tempfile::tempdir().unwrap();
    let out = run(Command::new(oxgrind())
        .args(["--tool=cachegrind", "--cache-sim=no"])
        .arg(&prog)
        .arg("short")
        .current_dir(dir.path()));
    let log = stderr(&out);
    let pid: String = log
        .trim_start_matches("==")
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    assert!(!pid.is_empty(), "{log}");
    let file = dir.path().join(format!("cachegrind.out.{pid}"));
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert!(text.contains("\nevents: Ir\n"), "{text}");
    assert!(
        log.contains("Cachegrind, a cache and branch-prediction profiler"),
        "{log}"
    );
}

#[test]
fn bad_cache_geometry_is_refused_before_the_program_runs() {
    let out =
        run(Command::new(oxgrind()).args(["--tool=cachegrind", "--D1=32768,3,64", "/bin/true"]));
    assert!(!out.status.success());
    let log = stderr(&out);
    assert!(
        log.contains("Cache set count is not a power of two."),
        "{log}"
    );
    let out = run(Command::new(oxgrind()).args(["--tool=cachegrind", "--LL=8192,2", "/bin/true"]));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Bad argument '8192,2'"),
        "{}",
        stderr(&out)
    );
}

/// The configuration warnings (`--pid--` lines) are Valgrind's whether or not the caches are
/// given: Valgrind 3.19 detects the host's caches, and warns about what it found (a third
/// level used as LL, an LL set count it adjusts), before it replaces them with `--I1/--D1/--LL`.
#[test]
fn cache_warnings_are_valgrinds_with_and_without_given_caches() {
    if !have_valgrind() {
        return;
    }
    let prog = build("cg_kernels.c", &["-g", "-O0", "-no-pie"]);
    let dir = tempfile::tempdir().unwrap();
    let warnings = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.starts_with("--"))
            .map(|l| l.split_once("-- ").map_or(l, |(_, w)| w).to_string())
            .collect()
    };
    let ox = oxgrind();
    for opts in [&[][..], &["--LL=8388608,16,64"][..], &CACHES[..]] {
        let ours = cachegrind(ox.to_str().unwrap(), &prog, &["short"], opts, dir.path());
        let theirs = cachegrind("valgrind", &prog, &["short"], opts, dir.path());
        assert_eq!(
            warnings(&ours.log),
            warnings(&theirs.log),
            "{opts:?}\nours:\n{}\nValgrind's:\n{}",
            ours.log,
            theirs.log
        );
    }
}

/// A real program, the interpreter's own functions: perl sorting hash keys. Valgrind's
/// Cachegrind runs here with `--vex-guest-chase=no`: by default it also counts instructions
/// that taken branches skip in some of perl's loops (`Perl_sv_cmp_flags` 6 more per call;
/// docs/differences-from-valgrind.md), which Callgrind and the CPU do not count. The ops
/// (`Perl_pp_*`) and the sort's comparison run only for the script, so they must be equal
/// to the instruction; perl's start-up (the environment, its hashes) is not compared.
#[test]
fn perl_ops_count_as_valgrinds_cachegrind_counts_them() {
    if !have_valgrind() {
        return;
    }
    let perl = Path::new("/usr/bin/perl");
    if !perl.exists() {
        eprintln!("skipped: no /usr/bin/perl");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("sort.pl");
    std::fs::write(
        &script,
        "my %h; for my $i (1..5000) { $h{\"k$i\"} = $i * 2 }\n\
         my $s = 0; for my $k (sort keys %h) { $s += $h{$k} } print \"$s\\n\";\n",
    )
    .unwrap();
    let script = script.to_str().unwrap();
    let run_perl = |tool: &str, opts: &[&str]| {
        let name = Path::new(tool).file_name().unwrap().to_string_lossy();
        let path = dir.path().join(format!("{name}.out"));
        let out = run(Command::new(tool)
            .arg("--tool=cachegrind")
            .arg("--cache-sim=no")
            .args(opts)
            .arg(format!("--cachegrind-out-file={}", path.display()))
            .arg(perl)
            .arg(script)
            .env(AVX2_ONLY.0, AVX2_ONLY.1)
            .env("PERL_HASH_SEED", "0")
            .env("PERL_PERTURB_KEYS", "0"));
        assert_eq!(stdout(&out), "25005000\n", "{tool}: {}", stderr(&out));
        let text = std::fs::read(&path).unwrap();
        cachegrind::parse(&text).unwrap_or_else(|e| panic!("{tool}'s file: {e}"))
    };
    let ours = run_perl(oxgrind().to_str().unwrap(), &[]);
    let theirs = run_perl("valgrind", &["--vex-guest-chase=no"]);
    let script_code = |f: &CachegrindFile| {
        let mut m: BTreeMap<String, u64> = BTreeMap::new();
        for r in &f.records {
            if r.func.starts_with("Perl_pp_") || r.func == "Perl_sv_cmp_flags" {
                *m.entry(r.func.clone()).or_default() += r.counts[0];
            }
        }
        m
    };
    let (o, t) = (script_code(&ours), script_code(&theirs));
    assert!(t.contains_key("Perl_pp_sort") && t.len() > 10, "{t:?}");
    assert_eq!(o, t);
}
