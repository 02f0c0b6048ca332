//! Memcheck's uninitialised-value errors (`--undef-value-errors=yes`), differentially:
//! each case of the corpus program `mc_undef.c` under Valgrind's memcheck and ours must
//! give the same report (normalised as in `memcheck_vs_valgrind.rs`): a branch on an
//! uninitialised local, printf of an uninitialised int, write() of uninitialised stack and
//! heap bytes, an address computed from an uninitialised value, malloc'd memory read
//! before it is written (with calloc and realloc keeping what is defined), the setcc of an
//! undefined compare printed, `VALGRIND_CHECK_MEM_IS_DEFINED` on heap and stack bytes,
//! undefined sizes given to malloc, calloc and realloc, floating point on an undefined
//! double (SSE arithmetic, a conversion and compares reported; `xorps` of a register with
//! itself and a packed add's other lane not), an undefined value kept in a callee-saved
//! register across allocator calls, partly undefined memory copied through a vector
//! register right after malloc, x87 arithmetic on an undefined double, and a clean run; then the same kinds as C++
//! and Rust programs make them (`mc_undef_cxx.cpp`, `mc_undef_rust.rs`).
//! Definedness is on by default, as in Valgrind; `--undef-value-errors=no` turns it off.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

const CASES: &[(&str, &str)] = &[
    ("branch", "1 errors from 1 contexts"),
    ("printf", "4 errors from 4 contexts"),
    ("printf-compare", "4 errors from 4 contexts"),
    ("check-requests", "2 errors from 2 contexts"),
    ("alloc-sizes", "3 errors from 3 contexts"),
    ("write-stack", "1 errors from 1 contexts"),
    ("write-heap", "1 errors from 1 contexts"),
    ("heap", "2 errors from 2 contexts"),
    ("index", "1 errors from 1 contexts"),
    ("float", "2 errors from 2 contexts"),
    ("across-calls", "1 errors from 1 contexts"),
    ("large-blocks", "2 errors from 2 contexts"),
    ("vector-copy", "4 errors from 2 contexts"),
    ("x87", "1 errors from 1 contexts"),
    ("deref", "0 errors from 0 contexts"),
    ("clean", "0 errors from 0 contexts"),
];

fn program(opt: &str) -> std::path::PathBuf {
    build("mc_undef.c", &["-g", opt, "-w", "-fno-inline"])
}

/// The cases also compared at -O2 (the others' code differs too little to matter).
const CASES_O2: &[(&str, &str)] = &[
    ("printf-compare", "4 errors from 4 contexts"),
    ("check-requests", "2 errors from 2 contexts"),
    ("alloc-sizes", "3 errors from 3 contexts"),
    ("across-calls", "1 errors from 1 contexts"),
];

#[test]
fn uninitialised_values_are_reported_as_valgrind_reports_them() {
    same_as_valgrind(&program("-O0"), CASES, "C -O0");
    same_as_valgrind(&program("-O2"), CASES_O2, "C -O2");
}

/// The mixed program (`mc_undef_mixed.c`: partly initialised structs and bitfields through
/// arithmetic, shifts, compares, string functions, copies; a branch on a tainted sum, an
/// undefined shift count, `bt` with an undefined offset, an undefined index) at -O0 and
/// -O2: the same reports as Valgrind's.
#[test]
fn a_mixed_program_is_reported_as_valgrind_reports_it() {
    for (opt, summary) in [
        ("-O0", "5 errors from 5 contexts"),
        ("-O2", "4 errors from 4 contexts"),
    ] {
        let prog = build("mc_undef_mixed.c", &["-g", opt, "-w", "-fno-inline"]);
        let ours = run(Command::new(oxgrind())
            .arg("--undef-value-errors=yes")
            .arg(&prog));
        let report = stderr(&ours);
        assert!(
            report.contains(&format!("ERROR SUMMARY: {summary}")),
            "{opt}:\n{report}"
        );
        if !have_valgrind() {
            continue;
        }
        let theirs = run(Command::new("valgrind").arg(&prog));
        assert_eq!(
            stdout(&ours),
            stdout(&theirs),
            "{opt}: program output differs"
        );
        assert_same_report(
            &normalize_report(&report),
            &normalize_report(&stderr(&theirs)),
        );
    }
}

/// `source`, built at -O0 and -O2, reports `errors` errors (in as many contexts), and the
/// same report as Valgrind's.
fn reported_as_valgrind_at_o0_and_o2(source: &str, errors: usize) {
    for opt in ["-O0", "-O2"] {
        let prog = build(source, &["-g", opt, "-w"]);
        let ours = run(Command::new(oxgrind()).arg(&prog));
        let report = stderr(&ours);
        assert!(
            report.contains(&format!(
                "ERROR SUMMARY: {errors} errors from {errors} contexts"
            )),
            "{source} {opt}:\n{report}"
        );
        if !have_valgrind() {
            continue;
        }
        let theirs = run(Command::new("valgrind").arg(&prog));
        assert_same_report(
            &normalize_report(&report),
            &normalize_report(&stderr(&theirs)),
        );
    }
}

/// A compare's zeroing of the flags' shadow is left out when a later compare of the same
/// block overwrites them (`translate`: `flags_zero_dead`): an undefined compare before a
/// flag-free move still reaches the branch, a defined compare after it still clears it.
#[test]
fn flags_overwritten_twice_in_a_block_are_reported_as_valgrind_reports_them() {
    reported_as_valgrind_at_o0_and_o2("mc_undef_flags.c", 2);
}

/// Operands with one base register share a span lookup (`translate::definedness`,
/// `span_shares`): an undefined field read by a later operand of the sharing, a store of an
/// undefined value by the first one into memory without V bits (its slow step makes the
/// chunk the later ones must see), and a base register written in between are each
/// reported, as by Valgrind.
#[test]
fn operands_sharing_a_span_lookup_are_reported_as_valgrind_reports_them() {
    reported_as_valgrind_at_o0_and_o2("mc_span_share.c", 3);
}

/// An operand addressed through `rax` right after the inline part stored the guest `rax`
/// computes its address without reloading it (`translate`: `Emitter::rax_guest_at`): an
/// undefined field read through a pointer just loaded into `rax`, a read one past a block
/// through it, and one while the flags of a compare are live (their save takes `rax`, so
/// the address needs the reload) are each reported, as by Valgrind.
#[test]
fn operands_through_a_rax_just_stored_are_reported_as_valgrind_reports_them() {
    reported_as_valgrind_at_o0_and_o2("mc_rax_base.c", 3);
}

/// A register stored into memory with V bits copies its shadow there, out of line when it
/// is not all defined (`translate::definedness`, `Emitter::store_copy`): undefined values
/// stored through rcx, rax, two registers, as bytes and words are each reported at the
/// branch on their read, and the defined ones stored by the same instructions are not, as
/// by Valgrind.
#[test]
fn stores_of_undefined_registers_are_reported_as_valgrind_reports_them() {
    reported_as_valgrind_at_o0_and_o2("mc_store_copy.c", 5);
}

/// A block leaves out the checks of registers an earlier instruction of it proved defined
/// (`translate::definedness::Proofs`), and leaves through a side exit when an instruction
/// such a proof relies on goes slow: an undefined index used twice, a proven register next
/// to an undefined one, and a proven register overwritten by a load of undefined bytes are
/// each reported, as by Valgrind. (Without the side exits none of the 5 is.)
#[test]
fn registers_proven_defined_in_a_block_are_reported_as_valgrind_reports_them() {
    reported_as_valgrind_at_o0_and_o2("mc_reg_proofs.c", 5);
}

/// Reads of freed memory give defined values, as Memcheck's loads of no-access bytes do:
/// never-written, written, undefined-written and after-the-free-written bytes of freed
/// blocks, a block `realloc` moved away, loaded into general and vector registers and
/// compared in memory, and a `write` of a freed buffer are each one invalid access and no
/// uninitialised-value error, as by Valgrind. (Before the store rule of
/// `Memcheck::written_unaddressable_stay_defined`, the undefined value stored into a freed
/// block was reported again at the branch on its read.)
#[test]
fn reads_of_freed_memory_are_defined_as_valgrind_takes_them() {
    reported_as_valgrind_at_o0_and_o2("mc_freed_reads.c", 8);
}

/// Memory made unaddressable by a client request (`MAKE_MEM_NOACCESS`, a pool's freed
/// chunk, a freed custom block) loads as defined, and a custom block (`MALLOCLIKE_BLOCK`,
/// `MEMPOOL_ALLOC`) is undefined when allocated unless zeroed, whatever the memory's V bits
/// were, as Memcheck's no-access state and `MC_(new_block)` make them. (Before,
/// `MAKE_MEM_NOACCESS` of undefined bytes gave two uninitialised-value errors Valgrind does
/// not report, and the custom blocks in defined memory none of Valgrind's two.)
#[test]
fn noaccess_and_custom_block_requests_set_v_bits_as_valgrind() {
    reported_as_valgrind_at_o0_and_o2("mc_noaccess_vbits.c", 6);
}

#[test]
fn definedness_is_on_by_default_and_off_with_no() {
    let prog = program("-O0");
    let default = stderr(&run(Command::new(oxgrind()).arg(&prog).arg("branch")));
    assert!(
        default.contains("ERROR SUMMARY: 1 errors from 1 contexts"),
        "{default}"
    );
    for (case, _) in CASES {
        let report = stderr(&run(Command::new(oxgrind())
            .arg("--undef-value-errors=no")
            .arg(&prog)
            .arg(case)));
        assert!(
            report.contains("ERROR SUMMARY: 0 errors from 0 contexts"),
            "case {case}:\n{report}"
        );
    }
}

/// Started under an address-space limit Valgrind runs within (2 GB, `ulimit -v 2000000`),
/// definedness and addressability are tracked as without it: the shadows' reservations
/// (large in address space, small in memory) are made outside the program's limit, which
/// the program still sees as it was set. Before, they failed: "no memory for the
/// definedness shadow" and no addressability checks at all. A soft limit always (what an
/// unprivileged process can go past); a hard one too when we may raise hard limits.
#[test]
fn an_address_space_limit_set_before_the_start_keeps_definedness() {
    let prog = program("-O0");
    let capable = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let caps = s.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(caps.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << 24) != 0); // CAP_SYS_RESOURCE
    let mut limits = vec!["-S"];
    if capable {
        limits.push("");
    }
    for which in limits {
        let under_limit = |args: &[&std::ffi::OsStr]| {
            run(Command::new("sh")
                .arg("-c")
                .arg(format!(r#"ulimit {which} -v 2000000 && exec "$@""#))
                .arg("sh")
                .arg(oxgrind())
                .args(args))
        };
        let o = under_limit(&[prog.as_os_str(), "branch".as_ref()]);
        let err = stderr(&o);
        assert!(!err.contains("no memory for"), "ulimit {which}: {err}");
        assert!(
            err.contains("Conditional jump or move depends on uninitialised value(s)")
                && err.contains("ERROR SUMMARY: 1 errors from 1 contexts"),
            "ulimit {which}: {err}"
        );
        // The program's view of its limit is the one it started with.
        let o = under_limit(&[
            "--undef-value-errors=no".as_ref(),
            "/bin/sh".as_ref(),
            "-c".as_ref(),
            format!("ulimit {which} -v").as_ref(),
        ]);
        assert_eq!(
            stdout(&o).trim(),
            "2000000",
            "ulimit {which}: {}",
            stderr(&o)
        );
    }
}

/// Each case of `prog` under ours (default options) and Valgrind: the same output, the
/// same report, and our summary line as `summary` says.
fn same_as_valgrind(prog: &std::path::Path, cases: &[(&str, &str)], what: &str) {
    for (case, summary) in cases {
        let ours = run(Command::new(oxgrind()).arg(prog).arg(case));
        let report = stderr(&ours);
        assert!(
            report.contains(&format!("ERROR SUMMARY: {summary}")),
            "{what} case {case}:\n{report}"
        );
        if !have_valgrind() {
            continue;
        }
        let theirs = run(Command::new("valgrind").arg(prog).arg(case));
        assert_eq!(
            stdout(&ours),
            stdout(&theirs),
            "{what} case {case}: program output differs"
        );
        eprintln!("{what} case {case}");
        let (ours, theirs) = (
            normalize_report(&report),
            normalize_report(&stderr(&theirs)),
        );
        assert_same_report(&without_dtv_slot(&ours, &theirs), &theirs);
    }
}

/// C++: a member its constructor forgot, an element of `new[]` never written, a value
/// carried through a thrown exception (reported at -O0; at -O2 gcc passes a defined
/// register instead, and neither tool reports), an uninitialised int printed through
/// iostreams (four errors inside libstdc++'s number formatting), and a clean run.
#[test]
fn cxx_uninitialised_values_are_reported_as_valgrind_reports_them() {
    for (opt, exception) in [
        ("-O0", "1 errors from 1 contexts"),
        ("-O2", "0 errors from 0 contexts"),
    ] {
        let prog = build("mc_undef_cxx.cpp", &["-g", opt]);
        let cases = [
            ("member", "1 errors from 1 contexts"),
            ("new-array", "1 errors from 1 contexts"),
            ("exception", exception),
            ("iostream", "4 errors from 4 contexts"),
            ("clean", "0 errors from 0 contexts"),
        ];
        same_as_valgrind(&prog, &cases, &format!("C++ {opt}"));
    }
}

/// Rust: a `Vec` grown with `set_len` over unwritten memory, a raw allocation read before it
/// is written, uninitialised bytes written to stdout (`Syscall param write(buf)`), an
/// undefined value sent to another thread and branched on there, and a clean run.
#[test]
fn rust_uninitialised_values_are_reported_as_valgrind_reports_them() {
    let prog = build("mc_undef_rust.rs", &["-O"]);
    let cases = [
        ("set-len", "1 errors from 1 contexts"),
        ("raw-alloc", "1 errors from 1 contexts"),
        ("write", "1 errors from 1 contexts"),
        ("thread", "1 errors from 1 contexts"),
        ("clean", "0 errors from 0 contexts"),
    ];
    same_as_valgrind(&prog, &cases, "Rust");
}

/// The inline fast path (`crates/oxgrind-engine/src/translate/definedness.rs`) must change
/// nothing: every case of `mc_undef.c` and the mixed program `mc_undef_mixed.c` (partly
/// initialised structs and bitfields through arithmetic, shifts, compares, string
/// functions and copies), at -O0 and -O2, give byte-identical reports with it and with
/// every instruction through the interpreter (`OXGRIND_DEFINEDNESS_SLOW_ONLY=1`). The two
/// runs get environments of the same size, so that stack addresses agree too.
#[test]
fn the_inline_fast_path_reports_exactly_what_the_interpreter_reports() {
    let mut runs: Vec<(std::path::PathBuf, Option<&str>)> = Vec::new();
    for opt in ["-O0", "-O2"] {
        for (case, _) in CASES {
            runs.push((program(opt), Some(case)));
        }
        runs.push((
            build("mc_undef_mixed.c", &["-g", opt, "-w", "-fno-inline"]),
            None,
        ));
    }
    let mut reported = 0;
    for (prog, case) in &runs {
        let report = |slow_only: &str| {
            let mut cmd = Command::new("setarch");
            cmd.arg("-R")
                .arg(oxgrind())
                .arg("--undef-value-errors=yes")
                .arg(prog)
                .env("OXGRIND_DEFINEDNESS_SLOW_ONLY", slow_only);
            if let Some(case) = case {
                cmd.arg(case);
            }
            let out = run(&mut cmd);
            // Only the pid differs between the two runs.
            let text = stderr(&out);
            text.lines()
                .map(|l| match l.strip_prefix("==") {
                    Some(rest) => rest.split_once("==").map_or(l, |(_, r)| r),
                    None => l,
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        let fast = report("0");
        let slow = report("1");
        assert_eq!(
            fast,
            slow,
            "{} {case:?}: fast path and interpreter differ",
            prog.display()
        );
        if !fast.contains("ERROR SUMMARY: 0 errors") {
            reported += 1;
        }
    }
    // The comparison is not vacuous: most of the runs report errors.
    assert!(reported >= 8, "only {reported} runs reported errors");
}

/// A fault in an instruction that does not use `rax`, right after a heap load whose inline
/// checks may keep `rax` borrowed over its copy (the engine's `Emitter::carry_borrow`):
/// the handler sees the program's `rax` in its context and the program has it back after,
/// with the same report as Valgrind's (the invalid read of address 8). Valgrind shows the
/// handler exact registers only with `--vex-iropt-register-updates=allregs-at-mem-access`
/// (by default `rax` is stale there: it prints 0), so it runs with that.
#[test]
fn a_fault_after_an_inline_checked_load_shows_the_programs_rax_to_its_handler() {
    let prog = build("mc_fault_rax.c", &["-g", "-O0"]);
    let expected = "first 5 second 6 rax in handler 1234567887654321 after 1234567887654321; \
                    load into rax: handler 1122334455667788 after 1122334455667788\n";
    prints_and_reports_as_valgrind_with_exact_registers(
        &prog,
        expected,
        "2 errors from 2 contexts",
    );
}

/// Runs `prog` under oxgrind and, where installed, under Valgrind with exact registers at
/// memory accesses (`--vex-iropt-register-updates=allregs-at-mem-access`; by default a
/// handler sees stale registers under Valgrind): both print `expected`, ours ends with the
/// error summary `summary`, and the two reports are the same.
fn prints_and_reports_as_valgrind_with_exact_registers(prog: &Path, expected: &str, summary: &str) {
    let ours = run(Command::new(oxgrind()).arg(prog));
    assert_eq!(stdout(&ours), expected, "{}", stderr(&ours));
    assert!(
        stderr(&ours).contains(&format!("ERROR SUMMARY: {summary}")),
        "{}",
        stderr(&ours)
    );
    if !have_valgrind() {
        return;
    }
    let theirs = run(Command::new("valgrind")
        .arg("--vex-iropt-register-updates=allregs-at-mem-access")
        .arg(prog));
    assert_eq!(stdout(&theirs), expected);
    assert_same_report(
        &normalize_report(&stderr(&ours)),
        &normalize_report(&stderr(&theirs)),
    );
}

/// A handler that changes `rax` in its frame and returns to the faulting instruction, which
/// reads `rax` between two inline-checked loads (`mc_handler_rax.c`): the engine resumes the
/// block in place, where the second load's borrow leaves out its store because the stub
/// slot held the guest `rax` already (`Emitter::stub_has_rax`); the slot restored at the
/// handler's return must hold the handler's `rax` (without that, the program goes on with
/// 1, the `rax` from before the signal). The program prints 2 natively.
#[test]
fn a_handler_that_changes_rax_and_resumes_in_place_leaves_the_program_its_rax() {
    let prog = build("mc_handler_rax.c", &["-g", "-O0"]);
    let native = run(&mut Command::new(&prog));
    let expected = "second 6 rax after the handler 2\n";
    assert_eq!(stdout(&native), expected);
    let ours = run(Command::new(oxgrind()).arg(&prog));
    assert_eq!(stdout(&ours), expected, "{}", stderr(&ours));
}

/// A shift or rotate by a count that masks to 0 leaves every flag as it was
/// (`engine_shift_by_zero_flags.c`: a `cmp`, a checked load, `shl r, cl` with `cl` = 0 or
/// 64, then `setb`/`setz`; and a `rol r, cl` first in a block): the translator must not
/// take it as overwriting the flags, or an inline check or counter update before it
/// clobbers the flags the program reads after it (`probe::flags_surely_written`). Same
/// output as natively under every tool that instruments.
#[test]
fn a_shift_by_zero_keeps_the_flags_before_it_under_every_tool() {
    let prog = build("engine_shift_by_zero_flags.c", &["-g", "-O2"]);
    let native = run(&mut Command::new(&prog));
    assert!(
        stdout(&native).contains("load: 1-2 below 1 zero 0 v 5 loaded 1\n"),
        "{}",
        stdout(&native)
    );
    for tool in [
        &["--tool=memcheck"][..],
        &["--tool=cachegrind", "--cachegrind-out-file=/dev/null"],
        &["--tool=dhat", "--dhat-out-file=/dev/null"],
        &["--tool=massif", "--massif-out-file=/dev/null"],
    ] {
        let ours = run(Command::new(oxgrind()).args(tool).arg(&prog));
        assert_eq!(
            stdout(&ours),
            stdout(&native),
            "{tool:?}: {}",
            stderr(&ours)
        );
    }
}

/// A fault in an instruction copied while Memcheck's inline checks keep `rax` and the live
/// flags borrowed over a run of checked loads (`cg_fault_flags.c`: a `cmp`, four loads, the
/// second of address 8, then `setb`/`sets`/`setz`; the engine saves the flags once before
/// the first load's checks and gives them back after the last: `Emitter::carry_flags`)
/// shows the program's `rax` and flags to its handler, and the program goes on with them,
/// as natively; the report is Valgrind's (with its exact registers at memory accesses).
#[test]
fn a_fault_where_the_checks_keep_the_flags_shows_the_programs_flags_to_its_handler() {
    let prog = build("cg_fault_flags.c", &["-g", "-O0"]);
    let native = run(&mut Command::new(&prog));
    assert!(
        stdout(&native).contains("flags in handler 91 "),
        "{}",
        stdout(&native)
    );
    prints_and_reports_as_valgrind_with_exact_registers(
        &prog,
        &stdout(&native),
        "1 errors from 1 contexts",
    );
}

/// The same with moves that use `rax` between the checked accesses (`mc_fault_flags_rax.c`:
/// a store of `rax`, a `lea` and a register move reading it, a load into it, and a fault
/// in `mov rdi, [rax]`), over which the borrow of `rax` and the flags is carried with only
/// `rax` given back around each copy (`definedness::flags_carry_past`).
#[test]
fn a_fault_in_a_move_of_rax_where_the_checks_keep_the_flags_shows_the_programs_registers() {
    let prog = build("mc_fault_flags_rax.c", &["-g", "-O0"]);
    let native = run(&mut Command::new(&prog));
    assert_eq!(
        stdout(&native),
        "first 5 stored 8 loaded 7 moved 9 rax in handler 8 flags in handler 91 \
         cf 1 sf 1 zf 0 of 0\n"
    );
    prints_and_reports_as_valgrind_with_exact_registers(
        &prog,
        &stdout(&native),
        "1 errors from 1 contexts",
    );
}

/// A signal handler's return restores the interrupted point's register shadows, and a
/// system call the handler interrupted (or that returned just before it) still has what
/// the kernel wrote marked defined (`mc_signal_shadows.c`: kill() to self with a handler
/// that leaves an undefined rax; wait3() and read() while SIGCHLD handlers run, as dash's
/// job control does). Clean, under Valgrind and under oxgrind, at -O0 and -O2, in the
/// parent and in every forked child.
#[test]
fn a_signal_handler_leaves_the_interrupted_points_definedness_alone() {
    for opt in ["-O0", "-O2"] {
        let prog = build("mc_signal_shadows.c", &["-g", opt]);
        let ours = run(Command::new(oxgrind()).arg(&prog));
        assert_eq!(stdout(&ours), "ok\n", "{opt}: {}", stderr(&ours));
        let report = stderr(&ours);
        let summaries: Vec<&str> = report
            .lines()
            .filter(|l| l.contains("ERROR SUMMARY:"))
            .collect();
        assert_eq!(summaries.len(), 7, "{opt}: parent and 6 children: {report}");
        for s in summaries {
            assert!(
                s.contains("ERROR SUMMARY: 0 errors from 0 contexts"),
                "{opt}: {report}"
            );
        }
        if have_valgrind() {
            let theirs = run(Command::new("valgrind").arg(&prog));
            assert_eq!(stdout(&theirs), "ok\n");
            assert!(!stderr(&theirs).contains("Conditional jump"));
        }
    }
}

/// `x + x` is `x << 1`, as VEX folds it (`mc_undef_doubling.c`: `lea (r,r,1)` and `add r,r`
/// of a word whose top bit is undefined give a defined sign; with bit 30 undefined, an
/// error): gcc's cc1 compiling a small file gave 552 errors from 197 contexts here against
/// Valgrind's 62 from 20 before this rule. The same report as Valgrind's at -O0 and -O2.
#[test]
fn doubling_a_value_shifts_its_v_bits_as_valgrind_does() {
    for opt in ["-O0", "-O2"] {
        let prog = build("mc_undef_doubling.c", &["-g", opt]);
        let ours = run(Command::new(oxgrind()).arg(&prog));
        assert_eq!(stdout(&ours), "lea: negative\nadd: negative\n", "{opt}");
        assert!(
            stderr(&ours).contains("ERROR SUMMARY: 2 errors from 2 contexts"),
            "{opt}: {}",
            stderr(&ours)
        );
        if have_valgrind() {
            let theirs = run(Command::new("valgrind").arg(&prog));
            assert_same_report(
                &normalize_report(&stderr(&ours)),
                &normalize_report(&stderr(&theirs)),
            );
        }
    }
}

/// Moves of `rsp` from another register (`leave`, `mov rsp, r64`, `lea rsp, [r64 + d]`:
/// fast forms with a run-time move, `FastForm::rsp_from`): going up they mark nothing,
/// going down the new stack is undefined, as Valgrind makes it (`mc_stack_epilogues.c`:
/// a slot of it, written defined by an earlier call, read after `lea rsp, [rbp-0x200]` and
/// after `mov rsp, rdx`; with the down move left inline neither is reported).
#[test]
fn moves_of_rsp_from_a_register_are_reported_as_valgrind_reports_them() {
    reported_as_valgrind_at_o0_and_o2("mc_stack_epilogues.c", 2);
}

/// Calls and returns whose new stack straddles two 64 KiB spans of the memory shadow
/// (`mc_stack_spans.c`: the call depth put at each 16-byte position over a span boundary,
/// as ASLR may put a hot one): the arena's stack-split routine marks both pieces of the
/// red zone (`translate::definedness`, `stack_split_routine`). A leaf reading both ends
/// of its red zone uninitialised is reported at every position, as by Valgrind and as by
/// the interpreter alone; and a hot loop of calls at those positions makes no slow steps
/// (the census, `OXGRIND_CENSUS`): with the straddling case in the interpreter it made
/// two to four per call there (600,000 at -O2 with 20,000 calls per position; 281 now).
#[test]
fn calls_straddling_two_shadow_spans_are_marked_inline_and_reported_as_valgrind_reports_them() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("stack-spans-census");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for opt in ["-O0", "-O2"] {
        let prog = build("mc_stack_spans.c", &["-g", opt, "-w"]);
        let report = |slow_only: &str| {
            let out = run(Command::new(oxgrind())
                .arg(&prog)
                .arg("errors")
                .env("OXGRIND_DEFINEDNESS_SLOW_ONLY", slow_only));
            stderr(&out)
        };
        let fast = report("0");
        assert!(
            fast.contains("ERROR SUMMARY: 52 errors from 2 contexts"),
            "{opt}:\n{fast}"
        );
        assert!(
            report("1").contains("ERROR SUMMARY: 52 errors from 2 contexts"),
            "{opt}: the interpreter alone"
        );
        if have_valgrind() {
            let theirs = run(Command::new("valgrind").arg(&prog).arg("errors"));
            assert_same_report(
                &normalize_report(&fast),
                &normalize_report(&stderr(&theirs)),
            );
        }
        if opt == "-O0" {
            // (At -O0 the loop's counters live in its frame, whose operands share one span
            // lookup: at the position where that frame straddles the boundary they go slow,
            // the span sharing's own limit, not the stack marking's.)
            continue;
        }
        let prefix = dir.join(format!("census{opt}"));
        let hot = run(Command::new(oxgrind())
            .arg(&prog)
            .args(["hot", "20000"])
            .env("OXGRIND_CENSUS", &prefix));
        assert!(
            stderr(&hot).contains("ERROR SUMMARY: 0 errors"),
            "{opt}:\n{}",
            stderr(&hot)
        );
        let name = prefix.file_name().unwrap().to_string_lossy().into_owned();
        let census = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&format!("{name}."))
            })
            .unwrap_or_else(|| panic!("{opt}: no census file in {}", dir.display()));
        let text = std::fs::read_to_string(&census).unwrap();
        let steps: u64 = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("census: definedness steps "))
            .and_then(|l| l.split(',').next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{opt}: no step count in {}", census.display()));
        // Start-up and the 26 positions' own steps: a few hundred.
        assert!(steps < 5_000, "{opt}: {steps} slow steps\n{text}");
    }
}

/// A forked child's V bits are its own and its parent's stay the parent's, though every
/// thread sees the shadow's primary table through a shared mapping (`definedness::views`:
/// the fork gives the child a copy). `mc_fork_shadow.c`: the child makes spans of a
/// mapping undefined and reads one (1 error), the parent, after the child, makes other
/// spans undefined, writes the child's bytes and reads its own (8 errors); with the table
/// shared, the parent's writes land in the chunks of its own spans and it reports none.
/// As Valgrind, at -O0 and -O2.
#[test]
fn a_forked_childs_shadow_is_its_own() {
    for opt in ["-O0", "-O2"] {
        let prog = build("mc_fork_shadow.c", &["-g", opt, "-w"]);
        let ours = run(Command::new(oxgrind()).arg(&prog));
        let report = stderr(&ours);
        assert_eq!(stdout(&ours), "child 0\n", "{opt}: {report}");
        let summaries: Vec<&str> = report
            .lines()
            .filter(|l| l.contains("ERROR SUMMARY:"))
            .collect();
        assert_eq!(summaries.len(), 2, "{opt}: {report}");
        assert!(
            summaries[0].contains("ERROR SUMMARY: 1 errors from 1 contexts"),
            "{opt} (child): {report}"
        );
        assert!(
            summaries[1].contains("ERROR SUMMARY: 8 errors from 8 contexts"),
            "{opt} (parent): {report}"
        );
        if have_valgrind() {
            let theirs = run(Command::new("valgrind").arg(&prog));
            assert_same_report(
                &normalize_report(&report),
                &normalize_report(&stderr(&theirs)),
            );
        }
    }
}

/// The stack rule marks new frames undefined through a borrowed `xmm7`: the program's
/// `ymm7` comes out of a large `sub rsp`, a call and a ret whole (the corpus program
/// prints "CLOBBERED" when the context's copy is not put back, or a VEX write cleared the
/// upper half).
#[test]
fn the_stack_rules_borrowed_vector_register_comes_back_whole() {
    for opt in ["-O0", "-O2"] {
        let prog = build("mc_keeps_vector_regs.c", &["-g", opt]);
        for origins in [false, true] {
            let mut cmd = Command::new(oxgrind());
            if origins {
                cmd.arg("--track-origins=yes");
            }
            let ours = run(cmd.arg(&prog));
            let report = stderr(&ours);
            assert!(
                stdout(&ours).starts_with("kept"),
                "{opt} origins={origins}: {}{report}",
                stdout(&ours)
            );
            assert!(
                report.contains("ERROR SUMMARY: 0 errors from 0 contexts"),
                "{opt} origins={origins}: {report}"
            );
        }
    }
}
