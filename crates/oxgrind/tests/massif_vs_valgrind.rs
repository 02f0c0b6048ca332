//! Massif, differentially: the same program under Valgrind's massif and ours must give the
//! same file (frame addresses aside) with `--time-unit=B`, which depends only on the
//! allocation sequence. Also: the peak is the one known by construction, and Valgrind's own
//! ms_print reads every file we write.

mod common;
use common::*;
use std::process::Command;

fn massif_both(prog: &std::path::Path, opts: &[&str], args: &[&str]) -> Option<(String, String)> {
    if !have_valgrind() {
        return None;
    }
    // One relative name, two working directories: the name appears on the desc: line.
    let (ours_dir, theirs_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ours = ours_dir.path().join("massif.out");
    let theirs = theirs_dir.path().join("massif.out");
    let o = run(Command::new(oxgrind())
        .arg("--tool=massif")
        .args(opts)
        .arg("--massif-out-file=massif.out")
        .arg(prog)
        .args(args)
        .current_dir(ours_dir.path()));
    assert!(o.status.success(), "oxgrind failed: {}", stderr(&o));
    let v = run(Command::new("valgrind")
        .args(["-q", "--tool=massif"])
        .args(opts)
        .arg("--massif-out-file=massif.out")
        .arg(prog)
        .args(args)
        .current_dir(theirs_dir.path()));
    assert!(v.status.success(), "valgrind failed: {}", stderr(&v));
    let ours = std::fs::read_to_string(&ours).unwrap();
    let theirs = std::fs::read_to_string(&theirs).unwrap();
    Some((ours, theirs))
}

fn assert_same_massif(ours: &str, theirs: &str) {
    let (o, t) = (normalize_massif(ours), normalize_massif(theirs));
    if o != t {
        let diff: Vec<String> = o
            .lines()
            .zip(t.lines())
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .take(10)
            .map(|(i, (a, b))| format!("line {}: ours `{a}` valgrind `{b}`", i + 1))
            .collect();
        panic!(
            "massif files differ ({} vs {} lines):\n{}",
            o.lines().count(),
            t.lines().count(),
            diff.join("\n")
        );
    }
}

#[test]
fn peak_is_the_known_peak_and_equals_valgrinds() {
    let prog = build("known_peak.c", &["-g", "-O2"]);
    let Some((ours, theirs)) = massif_both(&prog, &["--time-unit=B"], &[]) else {
        return;
    };
    assert_eq!(massif_peak(&ours), Some(14_000));
    assert_eq!(massif_peak(&theirs), Some(14_000));
    assert_same_massif(&ours, &theirs);
}

#[test]
fn reference_program_gives_valgrinds_file_with_default_options() {
    let prog = build(
        "../../../shared/reference/examples/src/ms_prog.c",
        &["-g", "-O0"],
    );
    let Some((ours, theirs)) = massif_both(&prog, &["--time-unit=B"], &[]) else {
        return;
    };
    assert_same_massif(&ours, &theirs);
}

#[test]
fn tree_options_give_valgrinds_file() {
    let prog = build(
        "../../../shared/reference/examples/src/ms_prog.c",
        &["-g", "-O2"],
    );
    for opts in [
        &["--time-unit=B", "--depth=1"][..],
        &["--time-unit=B", "--threshold=10.0"],
        &["--time-unit=B", "--threshold=0"],
        &["--time-unit=B", "--max-snapshots=10"],
        &[
            "--time-unit=B",
            "--detailed-freq=1",
            "--peak-inaccuracy=0.0",
        ],
        &["--time-unit=B", "--heap-admin=0"],
        &["--time-unit=B", "--alloc-fn=big_alloc"],
        &["--time-unit=B", "--ignore-fn=tiny_alloc"],
    ] {
        let Some((ours, theirs)) = massif_both(&prog, opts, &[]) else {
            return;
        };
        eprintln!("options {opts:?}");
        assert_same_massif(&ours, &theirs);
    }
}

/// C++ containers free and reallocate in every pattern; Valgrind's allocator then hands
/// out whole free blocks bigger than asked (its usable size, hence the slop Massif counts,
/// depends on what was freed before). Massif replays that allocator: the file is Valgrind's.
#[test]
fn cxx_program_gives_valgrinds_file() {
    let prog = build("containers.cpp", &["-g", "-O2"]);
    let Some((ours, theirs)) = massif_both(&prog, &["--time-unit=B"], &[]) else {
        return;
    };
    assert!(massif_peak(&ours).unwrap() > 400_000);
    assert_same_massif(&ours, &theirs);
}

/// Issue 11: realloc accounting diverged at the first realloc. Valgrind keeps a block in
/// place when the new size fits in its usable size (the slop absorbs the difference) and
/// otherwise allocates anew, then frees; blocks refilled after interleaved frees get the
/// usable sizes of the free blocks they land in.
#[test]
fn realloc_heavy_program_gives_valgrinds_file() {
    let prog = build("realloc_churn.c", &["-g", "-O1"]);
    // --alignment=64 sends every block through Valgrind's memalign path (a bigger block,
    // split), replayed as well.
    for opts in [
        &["--time-unit=B"][..],
        &["--time-unit=B", "--detailed-freq=1"],
        &["--time-unit=B", "--alignment=64"],
    ] {
        let Some((ours, theirs)) = massif_both(&prog, opts, &[]) else {
            return;
        };
        assert_same_massif(&ours, &theirs);
    }
}

/// Valgrind's wrappers pass the alignment the program asked for (raised to 16 and to a
/// power of two) to its allocator, which splits a bigger block: the slop Massif counts
/// depends on that alignment, not on how aligned glibc's block happens to be. `--alignment`
/// applies only to the functions that take none.
#[test]
fn aligned_allocations_give_valgrinds_file() {
    let c = build("aligned.c", &["-g", "-O1"]);
    let cpp = build("aligned_new.cpp", &["-g", "-O1"]);
    for (prog, opts) in [
        (&c, &["--time-unit=B"][..]),
        (&c, &["--time-unit=B", "--alignment=64"]),
        (&cpp, &["--time-unit=B"]),
    ] {
        let Some((ours, theirs)) = massif_both(prog, opts, &[]) else {
            return;
        };
        assert_same_massif(&ours, &theirs);
    }
}

#[test]
fn valgrinds_ms_print_reads_our_files_and_ours_prints_the_same() {
    let prog = build(
        "../../../shared/reference/examples/src/ms_prog.c",
        &["-g", "-O2"],
    );
    let dir = tempfile::tempdir().unwrap();
    for (i, opts) in [
        &["--time-unit=B"][..],
        &["--time-unit=ms"],
        &["--detailed-freq=2", "--threshold=5"],
    ]
    .iter()
    .enumerate()
    {
        let out = dir.path().join(format!("m{i}.out"));
        let o = run(Command::new(oxgrind())
            .arg("--tool=massif")
            .args(*opts)
            .arg(format!("--massif-out-file={}", out.display()))
            .arg(&prog));
        assert!(o.status.success(), "{}", stderr(&o));
        let theirs = run(Command::new("ms_print").arg(&out));
        if theirs.status.code().is_none()
            || !Command::new("ms_print").arg("--version").output().is_ok()
        {
            eprintln!("note: /usr/bin/ms_print not installed");
            return;
        }
        assert!(
            theirs.status.success(),
            "ms_print rejected our file: {}",
            stderr(&theirs)
        );
        let ours = run(Command::new(oxgrind()).arg("ms_print").arg(&out));
        assert!(
            ours.status.success(),
            "oxgrind ms_print failed: {}",
            stderr(&ours)
        );
        assert_eq!(
            stdout(&ours),
            stdout(&theirs),
            "renderers differ for {opts:?}"
        );
    }
}

/// --pages-as-heap=yes sees every page the program maps, glibc's internal mappings for a
/// large malloc included, with the stack of the system call.
#[test]
fn pages_as_heap_sees_mmap_mremap_brk_and_mallocs_own_mappings() {
    let prog = build("pages.c", &["-g", "-O1"]);
    let dir = tempfile::tempdir().unwrap();
    let o = run(Command::new(oxgrind())
        .args([
            "--tool=massif",
            "--pages-as-heap=yes",
            "--massif-out-file=massif.out",
        ])
        .arg(&prog)
        .current_dir(dir.path()));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "pages done\n");
    let text = std::fs::read_to_string(dir.path().join("massif.out")).unwrap();
    assert!(text.contains("(page allocation syscalls) mmap/mremap/brk, --alloc-fns, etc."));
    let peak = massif_peak(&text).expect("a peak snapshot");
    // 80 MiB remapped + 10 MiB malloc + 1 MiB sbrk, on top of the start-up mappings.
    assert!(peak >= (91 << 20), "peak {peak}");
    let tree = massif_peak_tree(&text).unwrap();
    for site in ["mremap", "malloc_10m"] {
        assert!(
            tree.contains(site),
            "{site} missing from the peak tree:\n{tree}"
        );
    }
    // The mappings that existed before we started, on the empty stack (not normalised).
    assert!(text.contains(" 0x0: ???\n"), "no start-up mappings");
    assert!(
        text.contains("sbrk") || text.contains("brk ("),
        "no brk stack in the file"
    );
    if have_valgrind() {
        let p = run(Command::new("ms_print").arg(dir.path().join("massif.out")));
        assert!(
            p.status.success(),
            "ms_print rejects the file: {}",
            stderr(&p)
        );
    }
}

/// What Massif and Nulgrind print on stderr is Valgrind's, pid aside (and nothing with -q).
#[test]
fn banners_are_valgrinds() {
    if !have_valgrind() {
        return;
    }
    let strip_pid = |s: String| {
        s.lines()
            .map(
                |l| match l.strip_prefix("==").and_then(|r| r.split_once("==")) {
                    Some((_, rest)) => format!("==PID=={rest}"),
                    None => l.to_string(),
                },
            )
            .collect::<Vec<_>>()
            .join("\n")
    };
    for tool in ["--tool=massif", "--tool=none"] {
        for quiet in [&[][..], &["-q"]] {
            let mut args = vec![tool, "--massif-out-file=/dev/null"];
            args.extend_from_slice(quiet);
            if tool == "--tool=none" {
                args.retain(|a| !a.starts_with("--massif"));
            }
            let ours = run(Command::new(oxgrind()).args(&args).arg("/bin/true"));
            let theirs = run(Command::new("valgrind").args(&args).arg("/bin/true"));
            assert_eq!(
                strip_pid(stderr(&ours)),
                strip_pid(stderr(&theirs)),
                "{args:?}"
            );
        }
    }
}

#[test]
fn one_call_site_reached_through_two_callers_keeps_both_stacks() {
    // Every malloc comes from the same return address and stack pointer; only a word
    // further up the stack (the caller's return address) differs. A stack reused for an
    // unchanged walk must still tell the two apart (runtime stacks.rs, CachedWalk).
    let prog = build("same_site_two_callers.c", &["-g", "-O2"]);
    let Some((ours, theirs)) = massif_both(&prog, &["--time-unit=B", "--detailed-freq=1"], &[])
    else {
        return;
    };
    let tree = massif_peak_tree(&ours).expect("a peak snapshot");
    assert!(
        tree.contains("via_a") && tree.contains("via_b"),
        "both callers in the peak tree:\n{tree}"
    );
    assert_same_massif(&ours, &theirs);
}
