//! Massif's `--pages-as-heap=yes` (issue 11): robust under the translation engine (the
//! default `--time-unit=i`) and natively (`ms`, `B`: the seccomp trap), with the program's own
//! page-level sites counted as Valgrind counts them.

mod common;
use common::*;
use std::process::Command;

fn run_pages(
    prog: &std::path::Path,
    opts: &[&str],
    dir: &std::path::Path,
) -> (std::process::Output, String) {
    let o = run(Command::new(oxgrind())
        .args([
            "--tool=massif",
            "--pages-as-heap=yes",
            "--massif-out-file=massif.out",
        ])
        .args(opts)
        .arg(prog)
        .current_dir(dir));
    let text = std::fs::read_to_string(dir.join("massif.out")).unwrap_or_default();
    (o, text)
}

/// Every program used to die with SIGSEGV under `--pages-as-heap=yes --time-unit=i` (the
/// seccomp trap fired inside the code cache): now each runs as natively, with its file.
#[test]
fn pages_as_heap_runs_every_program_under_the_engine() {
    let rust = build("rust_prog.rs", &["-O"]);
    let programs: Vec<Vec<String>> = vec![
        vec!["/bin/true".into()],
        vec![rust.display().to_string()],
        vec![
            "/usr/bin/python3".into(),
            "-c".into(),
            "import json; print(len(json.dumps(list(range(1000)))))".into(),
        ],
    ];
    for argv in &programs {
        let native = run(Command::new(&argv[0]).args(&argv[1..]));
        for opts in [&[][..], &["--time-unit=i"], &["--time-unit=ms"]] {
            // Threads make the Rust program's timing vary: three runs each.
            for _ in 0..3 {
                let dir = tempfile::tempdir().unwrap();
                let o = run(Command::new(oxgrind())
                    .args([
                        "-q",
                        "--tool=massif",
                        "--pages-as-heap=yes",
                        "--massif-out-file=massif.out",
                    ])
                    .args(opts)
                    .args(argv)
                    .current_dir(dir.path()));
                assert_eq!(
                    o.status.code(),
                    native.status.code(),
                    "{argv:?} {opts:?}: {}",
                    stderr(&o)
                );
                assert_eq!(stdout(&o), stdout(&native), "{argv:?} {opts:?}");
                let text = std::fs::read_to_string(dir.path().join("massif.out")).unwrap();
                let peak = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("mem_heap_B="))
                    .map(|v| v.parse::<u64>().unwrap())
                    .max()
                    .unwrap();
                // At least the executable, libc and the stack are mapped.
                assert!(peak > 1 << 20, "{argv:?} {opts:?}: peak {peak}");
                if opts.is_empty() {
                    assert!(text.contains("time_unit: i\n"), "the default unit is i");
                }
            }
        }
    }
}

/// The bytes of the first tree line of `text`'s peak snapshot that contains `site`.
fn site_bytes(text: &str, site: &str) -> Option<u64> {
    let tree = massif_peak_tree(text)?;
    let line = tree.lines().find(|l| l.contains(site))?;
    let n = line.trim_start().split_once(": ")?.1;
    n.split_whitespace().next()?.parse().ok()
}

/// The pages the program maps itself (an mremap'd mapping, glibc's mmap for a 10 MiB malloc,
/// sbrk) are Valgrind's to the byte, under the engine and natively. The start-up pages
/// differ as docs/differences-from-valgrind.md explains (Valgrind counts each library ld.so
/// maps about twice; our own library is left out).
#[test]
fn pages_the_program_maps_equal_valgrinds() {
    if !have_valgrind() {
        return;
    }
    let prog = build("pages.c", &["-g", "-O1"]);
    let vdir = tempfile::tempdir().unwrap();
    let v = run(Command::new("valgrind")
        .args([
            "-q",
            "--tool=massif",
            "--pages-as-heap=yes",
            "--massif-out-file=massif.out",
        ])
        .arg(&prog)
        .current_dir(vdir.path()));
    assert!(v.status.success(), "{}", stderr(&v));
    let theirs = std::fs::read_to_string(vdir.path().join("massif.out")).unwrap();
    for opts in [&[][..], &["--time-unit=ms"], &["--time-unit=B"]] {
        let dir = tempfile::tempdir().unwrap();
        let (o, ours) = run_pages(&prog, opts, dir.path());
        assert!(o.status.success(), "{opts:?}: {}", stderr(&o));
        for site in ["main (pages.c:23)", "malloc (malloc.c", "main (pages.c:24)"] {
            let (a, b) = (site_bytes(&ours, site), site_bytes(&theirs, site));
            assert!(a.is_some(), "{opts:?}: {site} not in our peak tree");
            assert_eq!(a, b, "{opts:?}: bytes at {site}");
        }
        let (a, b) = (massif_peak(&ours).unwrap(), massif_peak(&theirs).unwrap());
        // Ours is below by what Valgrind counts twice at start-up (libc's segments, mapped
        // over the reservation ld.so makes for it: 1.7 MiB) and its own preload library;
        // above by glibc's initial heap, which our start-up already shows.
        assert!(
            b > a && b - a < 2 << 20,
            "{opts:?}: peak {a} vs Valgrind's {b}"
        );
    }
}
