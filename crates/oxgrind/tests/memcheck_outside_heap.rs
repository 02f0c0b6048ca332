//! Memcheck's invalid accesses outside the heap, differentially against Valgrind 3.19:
//! below the stack pointer (past the red zone), through a wild pointer to unmapped memory
//! (reported before the SIGSEGV, counted, then Valgrind's fatal-signal block), to memory
//! munmapped, inside a program that handles the fault, and the non-errors (the red zone,
//! a write to a read-only mapping, a global array's overrun, which Valgrind does not see
//! without --read-var-info), and how addresses outside heap and stack are described (a data
//! symbol, an anonymous or file mapping, the brk data segment).

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

fn both(prog: &Path, args: &[&str], opts: &[&str]) -> Option<(String, String)> {
    reports_beside_valgrind(prog, opts, args)
}

#[test]
fn accesses_below_the_stack_pointer_match_valgrind() {
    let prog = build("access_below_sp.c", &["-g", "-O0"]);
    for opts in [&[][..], &["-q"], &["--error-exitcode=3"]] {
        let Some((ours, theirs)) = both(&prog, &[], opts) else {
            return;
        };
        eprintln!("options {opts:?}");
        if opts.is_empty() {
            // 5 reads in a loop, a write, a vector store's two pieces, a straddling store;
            // the red zone is not an error, nor (as in Valgrind) the second thread's read
            // (on a fresh stack, where its pointer has not been deeper).
            assert!(
                ours.contains("ERROR SUMMARY: 9 errors from 4 contexts"),
                "{ours}"
            );
            for line in [
                "Address 0xADDR is on thread 1's stack",
                "256 bytes below stack pointer",
                "200 bytes below stack pointer",
                "160 bytes below stack pointer",
                "132 bytes below stack pointer",
            ] {
                assert!(ours.contains(line), "no {line:?} in\n{ours}");
            }
        }
        assert_same_report(&without_dtv_slot(&ours, &theirs), &theirs);
    }
}

#[test]
fn accesses_below_a_threads_stack_pointer_match_valgrind() {
    let prog = build("access_below_sp_threads.c", &["-g", "-O0"]);
    for opts in [&[][..], &["-q", "--error-exitcode=3"]] {
        let Some((ours, theirs)) = both(&prog, &[], opts) else {
            return;
        };
        eprintln!("options {opts:?}");
        if opts.is_empty() {
            // After a deep call: 3 reads in a loop, a write, a vector store's two pieces.
            // Not errors: far deeper than the thread has been, the red zone, and all of
            // it on a fresh thread's stack.
            assert!(
                ours.contains("ERROR SUMMARY: 6 errors from 3 contexts"),
                "{ours}"
            );
            for line in [
                "Address 0xADDR is on thread 2's stack",
                "256 bytes below stack pointer",
                "200 bytes below stack pointer",
                "160 bytes below stack pointer",
            ] {
                assert!(ours.contains(line), "no {line:?} in\n{ours}");
            }
            assert!(!ours.contains("thread 3's stack"), "{ours}");
        }
        assert_same_report(&without_dtv_slot(&ours, &theirs), &theirs);
    }
    // glibc's AVX2 code paths move the stack pointer differently: the same errors.
    let avx2 = run(Command::new(oxgrind())
        .env(
            "GLIBC_TUNABLES",
            "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW",
        )
        .arg(&prog));
    let report = stderr(&avx2);
    assert!(
        report.contains("ERROR SUMMARY: 6 errors from 3 contexts"),
        "{report}"
    );
}

#[test]
fn accesses_to_a_dead_frame_through_a_pointer_match_valgrind() {
    // A returned local's address, pointers kept in a global and in a struct: reads and a
    // write through registers other than rsp, on the main thread and another, at -O0 (rbp
    // frames) and -O2; on both of glibc's code paths.
    for flags in [&["-g", "-O0"][..], &["-g", "-O2"]] {
        let prog = build("access_dead_frame.c", flags);
        for env in [None, Some("glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW")] {
            if !have_valgrind() {
                return;
            }
            let mut ours = Command::new(oxgrind());
            let mut theirs = Command::new("valgrind");
            for c in [&mut ours, &mut theirs] {
                if let Some(t) = env {
                    c.env("GLIBC_TUNABLES", t);
                }
                c.arg(&prog);
            }
            let (o, t) = (run(&mut ours), run(&mut theirs));
            assert_eq!(stdout(&o), stdout(&t), "program output differs");
            let (ours, theirs) = (normalize_report(&stderr(&o)), normalize_report(&stderr(&t)));
            eprintln!("{flags:?} {env:?}");
            // 3 rounds on thread 1, 2 on thread 2, each a read, a write and a read; the
            // red zone and the live frame are no errors.
            assert!(
                ours.contains("ERROR SUMMARY: 15 errors from 6 contexts"),
                "{ours}"
            );
            for line in [
                "Address 0xADDR is on thread 1's stack",
                "Address 0xADDR is on thread 2's stack",
                "304 bytes below stack pointer",
                "216 bytes below stack pointer",
            ] {
                assert!(ours.contains(line), "no {line:?} in\n{ours}");
            }
            assert_same_report(&without_dtv_slot(&ours, &theirs), &theirs);
        }
    }
}

#[test]
fn below_a_threads_stack_pointer_after_malloc_no_error_valgrind_has_not() {
    // Our allocator hooks run on the program's stack (Valgrind's on its own): what they
    // leave there must not count as the thread having been that deep. Each depth we
    // report, Valgrind reports too.
    let prog = build("access_below_sp_after_malloc.c", &["-g", "-O0"]);
    for env in [None, Some("glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW")] {
        let mut ours = Command::new(oxgrind());
        let mut theirs = Command::new("valgrind");
        if !have_valgrind() {
            return;
        }
        for c in [&mut ours, &mut theirs] {
            if let Some(t) = env {
                c.env("GLIBC_TUNABLES", t);
            }
            c.arg(&prog);
        }
        let (ours, theirs) = (stderr(&run(&mut ours)), stderr(&run(&mut theirs)));
        let depths = |r: &str| -> Vec<String> {
            r.lines()
                .filter(|l| l.contains("bytes below stack pointer"))
                .map(|l| l.split("==").last().unwrap_or(l).trim().to_string())
                .collect()
        };
        let (o, t) = (depths(&ours), depths(&theirs));
        assert!(
            !t.is_empty(),
            "Valgrind reports none: the case tests nothing\n{theirs}"
        );
        for d in &o {
            assert!(
                t.contains(d),
                "{env:?}: {d:?} not in Valgrind's {t:?}\n{ours}"
            );
        }
    }
}

#[test]
fn a_wild_write_is_reported_before_the_sigsegv_as_valgrind_does() {
    let prog = build("access_wild.c", &["-g", "-O0"]);
    for opts in [&[][..], &["-q"], &["--error-exitcode=3"], &["-s"]] {
        let Some((ours, theirs)) = both(&prog, &["write"], opts) else {
            return;
        };
        eprintln!("options {opts:?}");
        let error = ours.find("Invalid write of size 4").expect(&ours);
        let fatal = ours
            .find("Process terminating with default action of signal 11 (SIGSEGV)")
            .expect(&ours);
        assert!(error < fatal, "{ours}");
        assert!(ours.contains("Address 0xADDR is not stack'd, malloc'd or (recently) free'd"));
        assert!(ours.contains("Access not within mapped region at address 0xADDR"));
        assert_same_report(&ours, &theirs);
    }
}

#[test]
fn unmapped_handled_and_read_only_accesses_match_valgrind() {
    let prog = build("access_wild.c", &["-g", "-O0"]);
    for (mode, summary) in [
        // A read of munmapped memory: reported, then the program dies of it.
        ("munmap", "ERROR SUMMARY: 1 errors from 1 contexts"),
        // Three faults the program handles (siglongjmp): each reported, and it goes on.
        ("handled", "ERROR SUMMARY: 3 errors from 1 contexts"),
        // A read of a PROT_NONE mapping, handled: unaddressable ("--- anonymous segment").
        ("prot_none", "ERROR SUMMARY: 1 errors from 1 contexts"),
        // A write to a read-only mapping: no Memcheck error, "Bad permissions".
        ("readonly", "ERROR SUMMARY: 0 errors from 0 contexts"),
    ] {
        let Some((ours, theirs)) = both(&prog, &[mode], &[]) else {
            return;
        };
        eprintln!("mode {mode}");
        assert!(ours.contains(summary), "{mode}: {ours}");
        assert_same_report(&ours, &theirs);
    }
}

#[test]
fn a_global_arrays_overrun_is_no_error_in_either() {
    let src = "int arr[10];\nint main(int argc, char **argv) {\n  volatile int *p = arr;\n  \
               p[10 + argc] = 3;\n  return p[12 + argc] - 3 + (argv[0][0] != 0) - 1;\n}\n";
    let dir = tempfile::tempdir().unwrap();
    let (c, prog) = (dir.path().join("glob.c"), dir.path().join("glob"));
    std::fs::write(&c, src).unwrap();
    let ok = Command::new("gcc")
        .args(["-g", "-O0", "-o"])
        .arg(&prog)
        .arg(&c)
        .status()
        .unwrap();
    assert!(ok.success());
    let Some((ours, theirs)) = both(&prog, &[], &[]) else {
        return;
    };
    assert!(ours.contains("ERROR SUMMARY: 0 errors"), "{ours}");
    assert_same_report(&ours, &theirs);
}

#[test]
fn addresses_in_mappings_are_described_as_valgrind_describes_them() {
    let prog = build("access_segments.c", &["-g", "-O0"]);
    let Some((ours, theirs)) = both(&prog, &[], &["-q"]) else {
        return;
    };
    for line in [
        "Address 0xADDR is 4 bytes inside data symbol \"arr\"",
        "Address 0xADDR is in a rw- anonymous segment",
        "Address 0xADDR is in a r-- mapped file /etc/passwd segment",
        "Address 0xADDR is in the brk data segment 0xADDR-0xADDR",
        "Address 0xADDR is 3 bytes inside data symbol \"sbuf\"",
    ] {
        assert!(ours.contains(line), "no {line:?} in\n{ours}");
    }
    assert_same_report(&ours, &theirs);
}

#[test]
fn a_stack_overflow_is_no_invalid_access() {
    // Rust's main thread runs into the kernel's guard gap below its stack (a fault where
    // nothing is mapped, next to the stack pointer): Valgrind reports its "Stack overflow"
    // and no invalid access; neither do we.
    let src = "fn rec(n: u64, v: &mut [u8; 1024]) -> u64 {\n    let mut w = [0u8; 1024];\n    \
               w[0] = v[(n % 1024) as usize];\n    if n == 0 { 0 } else { rec(n - 1, &mut w) + w[3] as u64 }\n}\n\
               fn main() { let mut v = [0u8; 1024]; println!(\"{}\", rec(u64::MAX, &mut v)); }\n";
    let dir = tempfile::tempdir().unwrap();
    let (rs, prog) = (dir.path().join("overflow.rs"), dir.path().join("overflow"));
    std::fs::write(&rs, src).unwrap();
    let ok = Command::new("rustc")
        .args(["-O", "-o"])
        .arg(&prog)
        .arg(&rs)
        .status()
        .unwrap();
    assert!(ok.success());
    let o = run(Command::new(oxgrind()).arg(&prog));
    let report = stderr(&o);
    assert!(report.contains("has overflowed its stack"), "{report}");
    // (The report itself is lost: the abort that follows is handled on the overflowed
    // stack; see docs/differences-from-valgrind.md.)
    assert!(!report.contains("Invalid"), "{report}");
}

#[test]
fn correct_programs_that_switch_stacks_have_no_errors_in_either() {
    // Alternate signal stacks, handlers on the main stack, makecontext/swapcontext on a
    // heap stack, alloca, vfork, threads: on both of glibc's code paths.
    let prog = build("mc_stack_switches.c", &["-g", "-O0"]);
    // -q: Valgrind's own "client switching stacks?" warnings are not Memcheck's report;
    // the exit status says whether errors were counted.
    let Some((ours, theirs)) = both(&prog, &[], &["-q", "--error-exitcode=3"]) else {
        return;
    };
    assert!(ours.trim().is_empty(), "{ours}");
    assert_same_report(&ours, &theirs);
    let avx2 = run(Command::new(oxgrind())
        .env(
            "GLIBC_TUNABLES",
            "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW",
        )
        .arg(&prog));
    let report = stderr(&avx2);
    assert!(report.contains("ERROR SUMMARY: 0 errors"), "{report}");
}

/// Faults in `PROT_NONE` memory by how it lost its permissions (`access_prot_none.c`):
/// Valgrind holds memory `mmap` made `PROT_NONE` unaddressable, and memory `mprotect` made
/// `PROT_NONE` after it was mapped with some permission addressable (the runtime follows
/// the program's `mmap`, `mprotect`, `munmap`, `mremap`: `mapstate.rs`). Same errors,
/// output, fatal-signal blocks and exit status as Valgrind, which is given
/// `--vex-iropt-register-updates=allregs-at-mem-access` so that a handler's return resumes
/// the faulting read (without it Valgrind faults again for ever).
#[test]
fn prot_none_memory_is_unaddressable_only_where_mmap_made_it_so_as_in_valgrind() {
    if !have_valgrind() {
        return;
    }
    let prog = build("access_prot_none.c", &["-g", "-O0", "-pthread"]);
    for (mode, errors, fatal) in [
        // mprotect PROT_NONE, a handler re-enables it: no error.
        ("mprotect", 0, None),
        // mmap PROT_NONE: one invalid read, then the read again after the handler.
        ("mmap", 1, None),
        ("mmap-rw", 0, None),
        // mmap PROT_NONE, mprotect PROT_READ, mprotect PROT_NONE: addressable.
        ("mmap-rw-none", 0, None),
        ("mprotect-rw", 0, None),
        // Moved and grown by mremap: the carried page addressable, the grown one not.
        ("mremap", 1, None),
        // A page of a big heap block (glibc's allocator mapped it, unseen) made PROT_NONE.
        ("heap-page", 0, None),
        (
            "munmap",
            1,
            Some("Access not within mapped region at address"),
        ),
        (
            "mprotect-dies",
            0,
            Some("Bad permissions for mapped region at address"),
        ),
        (
            "mmap-dies",
            1,
            Some("Bad permissions for mapped region at address"),
        ),
        // The guard page below a thread's stack.
        ("thread-guard", 1, None),
    ] {
        for opts in [&[][..], &["--error-exitcode=3"]] {
            let ours = run(Command::new(oxgrind()).args(opts).arg(&prog).arg(mode));
            let theirs = run(Command::new("valgrind")
                .arg("--vex-iropt-register-updates=allregs-at-mem-access")
                .args(opts)
                .arg(&prog)
                .arg(mode));
            assert_eq!(stdout(&ours), stdout(&theirs), "{mode} {opts:?}");
            assert_eq!(
                ours.status.code(),
                theirs.status.code(),
                "{mode} {opts:?}: exit status"
            );
            let (ours, theirs) = (
                normalize_report(&stderr(&ours)),
                normalize_report(&stderr(&theirs)),
            );
            let summary = format!("ERROR SUMMARY: {errors} errors from {errors} contexts");
            assert!(ours.contains(&summary), "{mode}: no {summary:?} in\n{ours}");
            if let Some(line) = fatal {
                assert!(ours.contains(line), "{mode}: no {line:?} in\n{ours}");
            }
            // (A thread's DTV: one slot more for our runtime's TLS.)
            assert_same_report(&without_dtv_slot(&ours, &theirs), &theirs);
        }
    }
}
