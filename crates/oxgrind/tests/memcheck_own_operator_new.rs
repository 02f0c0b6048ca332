//! A program's own `operator new` / `delete` and `malloc` family are replaced as Valgrind
//! replaces them (issue 10, item 7): its definitions never run, and the report is Valgrind
//! 3.19's (Memcheck's; Massif's and DHAT's heap).

mod common;
use common::*;
use std::process::Command;

#[test]
fn a_programs_own_operator_new_is_replaced_as_valgrind_does() {
    let prog = build("mc_own_new.cpp", &["-g", "-O0"]);
    let native = run(&mut Command::new(&prog));
    assert_eq!(stdout(&native), "calls 3\n");
    let opts = ["--leak-check=full"];
    let ours = run(Command::new(oxgrind()).args(opts).arg(&prog));
    assert_eq!(stdout(&ours), "calls 0\n");
    if !have_valgrind() {
        return;
    }
    let theirs = run(Command::new("valgrind").args(opts).arg(&prog));
    assert_eq!(stdout(&theirs), "calls 0\n");
    assert_same_report(
        &normalize_report(&stderr(&ours)),
        &normalize_report(&stderr(&theirs)),
    );
}

/// A library's static constructor allocates through the program's own `operator new` and
/// `new[]` before our constructor runs (ld.so runs a preloaded library's after those of the
/// libraries nothing makes it a dependency of), so those calls reach our `malloc`; the
/// library's destructor deletes them at exit, through the redirected `delete`. Valgrind,
/// replacing the program's `new` from the first instruction, reports nothing: neither may
/// we (before, each such block was a "Mismatched free() / delete / delete []": gdb's
/// libsource-highlight gave 88).
#[test]
fn blocks_a_librarys_constructor_got_from_the_programs_own_new_are_new_blocks() {
    let prog = build_with_library(
        "g++",
        ("mc_early_new_lib.cpp", "-O2", "mc_early_new"),
        ("mc_early_new_main.cpp", "-O0"),
    );
    let opts = ["--leak-check=full"];
    let ours = run(Command::new(oxgrind()).args(opts).arg(&prog));
    assert_eq!(stdout(&ours), "sum 210\n");
    assert!(
        stderr(&ours).contains("ERROR SUMMARY: 0 errors from 0 contexts"),
        "{}",
        stderr(&ours)
    );
    if !have_valgrind() {
        return;
    }
    let theirs = run(Command::new("valgrind").args(opts).arg(&prog));
    assert_eq!(stdout(&theirs), "sum 210\n");
    assert_same_report(
        &normalize_report(&stderr(&ours)),
        &normalize_report(&stderr(&theirs)),
    );
}

/// A program with its own `malloc`, `calloc`, `realloc` and `free` (rustc links jemalloc
/// into its executable) has them replaced, as Valgrind's `somalloc` synonym replaces every
/// object's: from main on they never run ("calls 0"), the overrun and the leak are
/// Valgrind's report. A library's constructor allocates through them: our constructor runs
/// before that library's (`init_order.c`), so the engine sees those 5 blocks, and their
/// destructor's `realloc`s and `free`s, as Valgrind, which starts before the loader, does:
/// the same "total heap usage" (before session 15: 5 allocs, 4 frees, 4,193 bytes, the
/// early blocks unseen and handed back to the program's allocator at their free).
#[test]
fn a_programs_own_malloc_is_replaced_and_a_librarys_constructor_blocks_are_seen() {
    let prog = build_with_library(
        "gcc",
        ("mc_early_malloc_lib.c", "-O0", "mc_early_malloc"),
        ("mc_own_malloc.c", "-O0"),
    );
    let native = run(&mut Command::new(&prog));
    assert_eq!(stdout(&native), "sum 10 calls 6\n");
    let opts = ["--leak-check=full"];
    let ours = run(Command::new(oxgrind()).args(opts).arg(&prog));
    assert_eq!(stdout(&ours), "sum 10 calls 0\n");
    let report = stderr(&ours);
    assert!(
        report.contains("ERROR SUMMARY: 2 errors from 2 contexts"),
        "{report}"
    );
    assert!(
        report.contains("total heap usage: 10 allocs, 9 frees, 4,349 bytes allocated"),
        "{report}"
    );
    if !have_valgrind() {
        return;
    }
    let theirs = run(Command::new("valgrind").args(opts).arg(&prog));
    assert_eq!(stdout(&theirs), "sum 10 calls 0\n");
    assert!(
        stderr(&theirs).contains("total heap usage: 10 allocs, 9 frees, 4,349 bytes allocated"),
        "{}",
        stderr(&theirs)
    );
    assert_same_report(
        &normalize_report(&report),
        &normalize_report(&stderr(&theirs)),
    );
}

/// Massif and DHAT replace the program's own `malloc` family too, as Valgrind's do (its
/// `somalloc` synonym is in every tool's malloc replacement): "calls 0", and the same heap
/// as Valgrind sees. Before, neither saw a block of such a program (`rustc --version`:
/// DHAT "Total: 0 bytes in 0 blocks", Massif's peak 0; Valgrind's 762 blocks, 492,667 B).
#[test]
fn massif_and_dhat_replace_a_programs_own_malloc_as_valgrind_does() {
    let prog = build_with_library(
        "gcc",
        ("mc_early_malloc_lib.c", "-O0", "mc_early_malloc"),
        ("mc_own_malloc.c", "-O0"),
    );
    let dir = tempfile::tempdir().unwrap();
    let label = |tool: &str| {
        if tool == "valgrind" {
            "valgrind"
        } else {
            "ours"
        }
    };
    // DHAT's totals: the lines from "Total:" to "At t-end:".
    let dhat = |tool: &str| {
        let file = dir.path().join(format!("dhat.{}.json", label(tool)));
        let out = run(Command::new(tool)
            .arg("--tool=dhat")
            .arg(format!("--dhat-out-file={}", file.display()))
            .arg(&prog));
        assert_eq!(stdout(&out), "sum 10 calls 0\n", "{tool}: {}", stderr(&out));
        let totals: Vec<String> = stderr(&out)
            .lines()
            .filter_map(|l| l.split_once("== ").map(|(_, r)| r.to_string()))
            .filter(|l| l.starts_with("Total:") || l.starts_with("At t-"))
            .collect();
        assert_eq!(totals.len(), 3, "{tool}: {}", stderr(&out));
        totals
    };
    // Massif's peak: the largest heap total of any snapshot.
    let massif_peak = |tool: &str| {
        let file = dir.path().join(format!("massif.{}.out", label(tool)));
        let out = run(Command::new(tool)
            .arg("--tool=massif")
            .arg(format!("--massif-out-file={}", file.display()))
            .arg(&prog));
        assert_eq!(stdout(&out), "sum 10 calls 0\n", "{tool}: {}", stderr(&out));
        std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("mem_heap_B="))
            .map(|n| n.parse::<u64>().unwrap())
            .max()
            .unwrap()
    };
    let ours = oxgrind();
    let ours = ours.to_str().unwrap();
    let (dhat_ours, peak_ours) = (dhat(ours), massif_peak(ours));
    assert!(dhat_ours[0].contains(" in 10 blocks"), "{dhat_ours:?}");
    assert!(peak_ours > 0);
    if !have_valgrind() {
        return;
    }
    assert_eq!(dhat_ours, dhat("valgrind"));
    assert_eq!(peak_ours, massif_peak("valgrind"));
}

/// Builds a shared library (`lib`: corpus source, optimisation, name `lib<name>.so`) and a
/// program (`main`: corpus source, optimisation) linked with it (found through its rpath),
/// with `compiler`, in a directory of their own; returns the program.
fn build_with_library(
    compiler: &str,
    lib: (&str, &str, &str),
    main: (&str, &str),
) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(lib.2);
    std::fs::create_dir_all(&dir).unwrap();
    let compile = |args: &[&std::ffi::OsStr]| {
        let status = Command::new(compiler).args(args).status().expect(compiler);
        assert!(status.success(), "{compiler} {args:?}");
    };
    let so = dir.join(format!("lib{}.so", lib.2));
    let src = corpus_source(lib.0);
    compile(&[
        "-g".as_ref(),
        lib.1.as_ref(),
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        "-o".as_ref(),
        so.as_os_str(),
        src.as_os_str(),
    ]);
    let prog = dir.join(main.0.split('.').next().unwrap());
    let src = corpus_source(main.0);
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let libdir = format!("-L{}", dir.display());
    let link = format!("-l{}", lib.2);
    compile(&[
        "-g".as_ref(),
        main.1.as_ref(),
        "-o".as_ref(),
        prog.as_os_str(),
        src.as_os_str(),
        libdir.as_ref(),
        link.as_ref(),
        rpath.as_ref(),
    ]);
    prog
}

/// rustc: its executable's jemalloc is the program's malloc, and libLLVM (its own
/// `operator new`/`delete`) allocates in static constructors, which ld.so runs before a
/// preloaded library's unless we move ours first (`init_order.c`). Valgrind, which starts
/// before ld.so, reports 4 mismatched `delete[]`s made in those constructors and counts
/// 762 allocations; so must we (before: no error, 339 allocations). The bytes are not
/// compared: two blocks are larger with us (docs/differences-from-valgrind.md).
#[test]
fn rustc_version_counts_the_allocations_of_libllvms_constructors_as_valgrind_does() {
    let Some(rustc) = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| std::path::Path::new(stdout(&o).trim()).join("bin/rustc"))
        .filter(|p| p.exists())
    else {
        return;
    };
    if !have_valgrind() {
        return;
    }
    // The error summary and the mismatches must agree exactly. The allocation count within
    // 2%: rustc allocates a few blocks more or fewer with the environment, which Debian's
    // valgrind wrapper changes (LD_LIBRARY_PATH, GLIBCXX_FORCE_NEW: 757 against our 762
    // in CI, 762 each elsewhere); before our constructor ran first we counted 339.
    let errors = |report: &str| {
        report
            .lines()
            .filter_map(|l| {
                let l = l.split_once("== ").map_or(l, |(_, rest)| rest).trim();
                l.starts_with("ERROR SUMMARY:").then(|| l.to_string())
            })
            .chain(report.matches("Mismatched free()").map(str::to_string))
            .collect::<Vec<_>>()
    };
    let allocs = |report: &str| -> f64 {
        let usage = report
            .lines()
            .find_map(|l| {
                l.split_once("total heap usage: ")
                    .map(|(_, u)| u.to_string())
            })
            .unwrap_or_else(|| panic!("no heap summary:\n{report}"));
        usage
            .split(' ')
            .next()
            .unwrap()
            .replace(',', "")
            .parse()
            .unwrap()
    };
    let ours = run(Command::new(oxgrind()).arg(&rustc).arg("--version"));
    let theirs = run(Command::new("valgrind").arg(&rustc).arg("--version"));
    assert_eq!(stdout(&ours), stdout(&theirs));
    let (ours, theirs) = (stderr(&ours), stderr(&theirs));
    assert_eq!(
        errors(&ours),
        errors(&theirs),
        "ours:\n{ours}\nValgrind's:\n{theirs}"
    );
    assert!(errors(&ours).len() > 1, "{ours}");
    let (a, b) = (allocs(&ours), allocs(&theirs));
    assert!(
        (a - b).abs() <= 0.02 * b,
        "{a} allocations against Valgrind's {b}:\n{ours}\nValgrind's:\n{theirs}"
    );
}
