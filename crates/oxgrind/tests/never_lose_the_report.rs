//! However the program ends, the massif file is written, and the program's exit status is
//! what it would be without oxgrind.

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn endings() -> std::path::PathBuf {
    build("endings.c", &["-g", "-O2"])
}

/// Runs `endings MODE` under massif in a fresh directory; returns the status and the
/// massif files written there.
fn run_mode(
    mode: &[&str],
) -> (
    std::process::ExitStatus,
    Vec<(String, String)>,
    tempfile::TempDir,
) {
    let (o, files, dir) = run_mode_in("B", mode);
    (o.status, files, dir)
}

/// [`run_mode`] with Massif's `--time-unit`, returning the whole output.
fn run_mode_in(
    time_unit: &str,
    mode: &[&str],
) -> (
    std::process::Output,
    Vec<(String, String)>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let o = run(Command::new(oxgrind())
        .args([
            "--tool=massif",
            &format!("--time-unit={time_unit}"),
            "--massif-out-file=massif.out.%p",
        ])
        .arg(endings())
        .args(mode)
        .current_dir(dir.path()));
    let files = massif_files(dir.path());
    (o, files, dir)
}

fn massif_files(dir: &std::path::Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("massif.out."))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read_to_string(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

/// The report holds the 64 KiB the program allocated before ending.
fn assert_measured(files: &[(String, String)]) {
    assert_eq!(
        files.len(),
        1,
        "expected one massif file, got {:?}",
        files.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    let text = &files[0].1;
    let max = text
        .lines()
        .filter_map(|l| l.strip_prefix("mem_heap_B="))
        .map(|v| v.parse::<u64>().unwrap())
        .max()
        .unwrap();
    assert!(max >= 64 * 1024, "peak {max} < 64 KiB:\n{text}");
}

#[test]
fn normal_exit_keeps_status_and_writes_the_file() {
    let (status, files, _d) = run_mode(&["exit"]);
    assert_eq!(status.code(), Some(3));
    assert_measured(&files);
}

#[test]
fn underscore_exit_writes_the_file() {
    let (status, files, _d) = run_mode(&["_exit"]);
    assert_eq!(status.code(), Some(4));
    assert_measured(&files);
}

/// A program that makes the exit_group system call itself runs none of glibc's exit code:
/// the engine sees the call (Massif's default time unit, Memcheck), and the report is
/// written there, as Valgrind writes it.
#[test]
fn an_exit_group_system_call_of_the_programs_own_writes_the_report() {
    let (o, files, _d) = run_mode_in("i", &["exit_group"]);
    assert_eq!(o.status.code(), Some(5), "{o:?}");
    assert_measured(&files);
    let o = run(Command::new(oxgrind())
        .args(["--leak-check=full", "--error-exitcode=9"])
        .arg(endings())
        .arg("exit_group"));
    let err = String::from_utf8_lossy(&o.stderr);
    // glibc's stdout buffer is freed by its clean-up hooks, which run here too (Valgrind's
    // 65 allocs, 1 frees).
    assert!(
        err.contains("in use at exit: 65,536 bytes in 64 blocks")
            && err.contains("total heap usage: 65 allocs, 1 frees"),
        "{err}"
    );
    assert_eq!(
        o.status.code(),
        Some(5),
        "no error: the program's status\n{err}"
    );
}

#[test]
fn abort_writes_the_file_and_dies_by_sigabrt() {
    let (status, files, _d) = run_mode(&["abort"]);
    assert_eq!(status.signal(), Some(6), "status {status:?}");
    assert_measured(&files);
}

#[test]
fn segfault_writes_the_file_and_dies_by_sigsegv() {
    let (status, files, _d) = run_mode(&["segv"]);
    assert_eq!(status.signal(), Some(11), "status {status:?}");
    assert_measured(&files);
}

/// A stack that runs out ends with the report, in both time units: the kernel can only
/// deliver that SIGSEGV on an alternate stack (the engine gives each thread one; without
/// the engine, the runtime gives the main thread one, and each thread it starts one as it
/// starts: `hookstack`). A thread's overflow too, in both.
#[test]
fn a_stack_overflow_writes_the_file_and_dies_by_sigsegv() {
    for (unit, mode) in [
        ("i", "stack-overflow"),
        ("B", "stack-overflow"),
        ("i", "thread-stack-overflow"),
        ("B", "thread-stack-overflow"),
    ] {
        let (o, files, _d) = run_mode_in(unit, &[mode]);
        assert_eq!(o.status.signal(), Some(11), "{unit} {mode}: {o:?}");
        assert_measured(&files);
    }
}

/// A heap so smashed that glibc's allocator aborts or faults in it, in every time unit: at
/// `i` glibc's allocator runs natively out of the engine's code cache, where the signal
/// reaches the engine, not the program (issue 11's "never loses the report"). The process
/// still dies by the signal it dies by natively, the file is written, and the report's
/// stack goes from glibc's frames to the program's.
#[test]
fn a_heap_glibc_aborts_or_faults_on_writes_the_file_in_every_time_unit() {
    for unit in ["i", "B"] {
        for (mode, sig) in [("heap-abort", 6), ("heap-segv", 11)] {
            let native = run(Command::new(endings()).arg(mode));
            assert_eq!(native.status.signal(), Some(sig), "{mode} natively");
            let (o, files, _dir) = run_mode_in(unit, &[mode]);
            let err = stderr(&o);
            assert_eq!(o.status.signal(), Some(sig), "{mode} at {unit}:\n{err}");
            assert!(!err.contains("internal error"), "{mode} at {unit}:\n{err}");
            assert_measured(&files);
            if sig == 11 {
                // Valgrind's core prints a kernel-raised fault's stack: glibc's malloc,
                // (our hook's `malloc` at B), then main: none of the engine's frames.
                let stack: Vec<&str> = err
                    .lines()
                    .skip_while(|l| !l.contains("Process terminating"))
                    .take_while(|l| {
                        l.contains(" at ") || l.contains(" by ") || l.contains("Process")
                    })
                    .collect();
                assert!(
                    stack.iter().any(|l| l.contains(": main (endings.c:")),
                    "{mode} at {unit}: {stack:#?}"
                );
                assert!(
                    !stack
                        .iter()
                        .any(|l| l.contains("oxgrind_engine") || l.contains("???")),
                    "{mode} at {unit}: {stack:#?}"
                );
            }
        }
    }
}

/// The server case: a long-running program stopped with Ctrl+C or SIGTERM.
fn stop_server_with(sig: i32) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = with_default_interrupts(&mut Command::new(oxgrind()))
        .args([
            "--tool=massif",
            "--time-unit=B",
            "--massif-out-file=massif.out.%p",
        ])
        .arg(endings())
        .arg("wait-signal")
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { kill(child.id() as i32, sig) }, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "program did not end after signal {sig}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.signal(), Some(sig), "status {status:?}");
    assert_measured(&massif_files(dir.path()));
}

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

#[test]
fn ctrl_c_on_a_server_writes_the_file() {
    stop_server_with(2);
}

#[test]
fn sigterm_on_a_server_writes_the_file() {
    stop_server_with(15);
}

#[test]
fn forked_child_writes_its_own_file() {
    let (status, files, _d) = run_mode(&["fork"]);
    assert_eq!(status.code(), Some(0));
    assert_eq!(
        files.len(),
        2,
        "parent and child files: {:?}",
        files.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    // The child allocated 5,000 more bytes than the parent's 64 KiB.
    let peaks: Vec<u64> = files
        .iter()
        .map(|(_, t)| {
            t.lines()
                .filter_map(|l| l.strip_prefix("mem_heap_B="))
                .map(|v| v.parse::<u64>().unwrap())
                .max()
                .unwrap()
        })
        .collect();
    assert!(peaks.iter().any(|&p| p >= 64 * 1024 + 5000), "{peaks:?}");
}

/// Both images of an exec share the pid, so `%p` names collide (as under Valgrind): with
/// `--trace-children=no` the file is the old image's report, written before the exec; with
/// `yes` the new image measures itself and writes over it.
#[test]
fn exec_writes_the_report_of_the_old_image_and_traces_the_new_one_when_asked() {
    let prog = endings();
    let known = build("known_peak.c", &["-g", "-O2"]);
    for (trace, new_image_measured) in [
        ("--trace-children=no", false),
        ("--trace-children=yes", true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let o = run(Command::new(oxgrind())
            .args([
                "--tool=massif",
                "--time-unit=B",
                "--massif-out-file=massif.out.%p",
                trace,
            ])
            .arg(&prog)
            .arg("exec")
            .arg(&known)
            .current_dir(dir.path()));
        assert_eq!(stdout(&o), "done\n", "{}", stderr(&o));
        assert!(o.status.success());
        let files = massif_files(dir.path());
        assert_eq!(files.len(), 1, "{trace}");
        let text = &files[0].1;
        if new_image_measured {
            assert_eq!(massif_peak(text), Some(14_000), "{trace}: {text}");
            assert!(
                text.contains("cmd: ") && text.contains("known_peak"),
                "{trace}"
            );
        } else {
            assert!(
                text.contains("cmd: ") && text.contains("endings"),
                "{trace}: {text}"
            );
            assert_measured(&files);
        }
    }
}

/// A vfork child shares the parent's memory and runs no fork handlers: its exec (or failed
/// exec and _exit) must neither write a report nor mark the parent's as written.
#[test]
fn vfork_children_do_not_take_the_parents_report() {
    let prog = build("vfork_exec.c", &["-g", "-O1"]);
    let dir = tempfile::tempdir().unwrap();
    let o = run(Command::new(oxgrind())
        .args([
            "--tool=massif",
            "--time-unit=B",
            "--massif-out-file=massif.out.%p",
        ])
        .arg(&prog)
        .current_dir(dir.path()));
    assert_eq!(stdout(&o), "children done: 42\n", "{}", stderr(&o));
    let files = massif_files(dir.path());
    assert_eq!(
        files.len(),
        1,
        "{:?}",
        files.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    let last = files[0]
        .1
        .lines()
        .filter_map(|l| l.strip_prefix("mem_heap_B="))
        .last();
    assert_eq!(
        last,
        Some("12288"),
        "the parent's last allocation is missing:\n{}",
        files[0].1
    );
}

/// A daemon closes every descriptor it finds, ours among them: the report still arrives
/// (oxgrind's descriptors refuse close, close_range and closefrom, as Valgrind's do).
#[test]
fn closing_every_descriptor_does_not_silence_the_report() {
    let prog = build("close_all.c", &["-g", "-O1"]);
    let o = run(Command::new(oxgrind())
        .args(["--leak-check=full"])
        .arg(&prog));
    let err = stderr(&o);
    assert!(
        err.contains("77 bytes in 1 blocks are definitely lost"),
        "{err}"
    );
    assert!(
        err.contains("ERROR SUMMARY: 1 errors from 1 contexts"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let o = run(Command::new(oxgrind())
        .args([
            "--xml=yes",
            "--xml-file=out.xml",
            "--log-file=log.txt",
            "--leak-check=full",
        ])
        .arg(&prog)
        .current_dir(dir.path()));
    assert!(o.status.success());
    let xml = std::fs::read_to_string(dir.path().join("out.xml")).unwrap();
    assert!(
        xml.contains("<kind>Leak_DefinitelyLost</kind>")
            && xml.trim_end().ends_with("</valgrindoutput>"),
        "{xml}"
    );
}

/// A panic inside the runtime (injected at exit with OXGRIND_TEST_PANIC=exit) says it is
/// oxgrind's and where, writes the report all the same, and exits 1 as Valgrind's "the
/// 'impossible' happened" does: never a bare abort.
#[test]
fn a_panic_inside_the_runtime_still_writes_the_report_and_says_where() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(Command::new(oxgrind())
        .args([
            "--tool=massif",
            "--time-unit=B",
            "--massif-out-file=massif.out.%p",
        ])
        .arg(endings())
        .arg("exit")
        .env("OXGRIND_TEST_PANIC", "exit")
        .current_dir(dir.path()));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{:?}\n{err}", o.status);
    let line = err
        .lines()
        .find(|l| l.starts_with("oxgrind: internal error"))
        .unwrap_or_else(|| panic!("no internal-error line:\n{err}"));
    assert!(
        line.contains("exit.rs:") && line.contains("injected by OXGRIND_TEST_PANIC=exit"),
        "{line}"
    );
    assert_measured(&massif_files(dir.path()));
}

/// A program that lowers its address-space limit and fills it with small blocks: our own
/// data (Massif's per-block state) outgrows the private heap's reserve, and its new mappings
/// must not come out of the program's limit, or the program fails its allocations sooner
/// than natively and ours fail at last, ending without the report (the case of a 512 MiB
/// limit; here the reserve is made small, 64 MiB, to outgrow it at 32 MiB). The program
/// runs to its own end, allocating at least as much as natively (more by up to the 64 MiB
/// of headroom the limits keep for mappings oxgrind cannot count), and the file is written.
#[test]
fn filling_a_lowered_address_space_limit_keeps_the_report() {
    let prog = build("fill_limit.c", &["-g", "-O1"]);
    let blocks = |out: &str| -> u64 {
        out.trim()
            .strip_prefix("malloc failed after ")
            .and_then(|r| r.strip_suffix(" blocks"))
            .unwrap_or_else(|| panic!("unexpected output {out:?}"))
            .parse()
            .unwrap()
    };
    let native = run(Command::new(&prog).arg("32"));
    assert!(native.status.success());
    let native_blocks = blocks(&stdout(&native));
    let dir = tempfile::tempdir().unwrap();
    let o = run(Command::new(oxgrind())
        .args([
            "--tool=massif",
            "--time-unit=B",
            "--massif-out-file=massif.out",
        ])
        .arg(&prog)
        .arg("32")
        .env("OXGRIND_TEST_RESERVE_MIB", "64")
        .current_dir(dir.path()));
    assert!(o.status.success(), "status {:?}: {}", o.status, stderr(&o));
    let ours = blocks(&stdout(&o));
    assert!(
        ours >= native_blocks,
        "the program made {ours} blocks under oxgrind, {native_blocks} natively"
    );
    let text = std::fs::read_to_string(dir.path().join("massif.out")).unwrap();
    // Nothing is freed, so no peak snapshot: the last snapshots hold every block.
    let most = text
        .lines()
        .filter_map(|l| l.strip_prefix("mem_heap_B=")?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    assert!(
        most >= ours * 16 * 9 / 10,
        "at most {most} heap bytes in a snapshot, the program held {ours} blocks of 16"
    );
}

/// A program started under an address-space limit (`ulimit -v`, so oxgrind's reserve comes
/// out of it too) fills it with small blocks: oxgrind refuses the program's allocations
/// while there is still room for its report (the program sees malloc fail, as it would a
/// little later natively) and every tool's report is written. Before: Memcheck and Massif
/// ended with "out of memory for its own data, even its reserve" and no report (Valgrind
/// 3.19 too: "Valgrind cannot continue").
#[test]
fn filling_an_address_space_limit_set_before_the_start_keeps_the_report() {
    let prog = build("fill_limit.c", &["-g", "-O1"]);
    for tool in ["memcheck", "massif", "dhat"] {
        let dir = tempfile::tempdir().unwrap();
        let o = run(Command::new("sh")
            .arg("-c")
            .arg(r#"ulimit -v 800000 && exec "$@""#)
            .arg("sh")
            .arg(oxgrind())
            .arg(format!("--tool={tool}"))
            .args(
                ["--massif-out-file=out", "--dhat-out-file=out"]
                    .iter()
                    .filter(|a| a.starts_with(&format!("--{tool}"))),
            )
            .arg(&prog)
            .arg("0")
            .current_dir(dir.path()));
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{tool}: {err}");
        assert!(
            stdout(&o).starts_with("malloc failed after "),
            "{tool}: {}",
            stdout(&o)
        );
        assert!(!err.contains("out of memory"), "{tool}: {err}");
        match tool {
            "memcheck" => assert!(err.contains("definitely lost: "), "{err}"),
            _ => {
                let text = std::fs::read_to_string(dir.path().join("out")).unwrap();
                assert!(text.len() > 100, "{tool}: {text}");
            }
        }
    }
}

/// An output file that cannot be written (its directory does not exist) is reported in
/// Valgrind's words, even with `-q`, and the program's exit status is kept (Valgrind 3.19:
/// 0 for /bin/true, whatever the tool).
#[test]
fn an_unwritable_output_file_is_reported_as_valgrind_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing/x.out");
    let path = path.display();
    for (tool, said) in [
        (
            "massif",
            format!("Error: can not open xtree output file `{path}'"),
        ),
        (
            "dhat",
            format!("error: can't open DHAT output file '{path}'"),
        ),
        (
            "cachegrind",
            format!("error: can't open cache simulation output file '{path}'"),
        ),
    ] {
        let o = run(Command::new(oxgrind())
            .args(["-q", &format!("--tool={tool}")])
            .arg(format!("--{tool}-out-file={path}"))
            .arg("/bin/true"));
        assert_eq!(o.status.code(), Some(0), "{tool}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.lines()
                .any(|l| l.starts_with("==") && l.ends_with(&said)),
            "{tool} does not say {said:?}:\n{err}"
        );
    }
}
