//! glibc's string and memory functions run as our checked versions under Memcheck (issue 10,
//! Valgrind's function replacement): an overrun inside `strlen`, `memset`, `strcpy`, ... is
//! reported inside the function, with the access size, count and address description
//! Valgrind's replacement gives, on both of glibc's code paths; and glibc's vector code no
//! longer reads past the end of strings on the program's behalf.

mod common;
use common::*;
use std::process::Command;

/// glibc's AVX2 code paths on a CPU with AVX-512.
const AVX2_PATHS: &str = "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW";

#[test]
fn errors_inside_replaced_string_functions_match_valgrind() {
    if !have_valgrind() {
        return;
    }
    let prog = build("mc_string_errors.c", &["-g", "-O0", "-fno-builtin"]);
    same_report_as_valgrind_on_both_glibc_paths(&prog);
}

/// The replaced `memcpy`/`memmove`, `memcmp`, `strlen`, `strchr`, `strchrnul` and `strncpy`
/// first try natively (`native_try`): V bits copied with the bytes (undefined ones
/// too, overlapping either way), defined bytes copied into undefined memory, comparisons and
/// searches decided before or after an undefined byte, `memset` (no try) with an undefined
/// fill value, overruns,
/// a freed block, and a copy from unmapped memory (the try faults and declines; the loop
/// reports the read, then the SIGSEGV): Valgrind's reports, on both of glibc's paths.
#[test]
fn native_tries_of_copies_and_compares_report_as_valgrind() {
    if !have_valgrind() {
        return;
    }
    let prog = build("mc_string_tries.c", &["-g", "-O0", "-fno-builtin"]);
    let theirs = same_report_as_valgrind_on_both_glibc_paths(&prog);
    assert!(theirs.contains("Conditional jump"), "{theirs}");
}

/// Runs `prog` under Valgrind and under oxgrind on both of glibc's paths (AVX-512 and AVX2),
/// asserts each of ours is Valgrind's report; returns Valgrind's (normalized).
fn same_report_as_valgrind_on_both_glibc_paths(prog: &std::path::Path) -> String {
    let theirs = normalize_report(&stderr(&run(Command::new("valgrind").arg(prog))));
    for tunables in [None, Some(AVX2_PATHS)] {
        let mut cmd = Command::new(oxgrind());
        cmd.arg(prog);
        if let Some(t) = tunables {
            cmd.env("GLIBC_TUNABLES", t);
        }
        let ours = normalize_report(&stderr(&run(&mut cmd)));
        eprintln!("GLIBC_TUNABLES={tunables:?}");
        assert_same_report(&ours, &theirs);
    }
    theirs
}
