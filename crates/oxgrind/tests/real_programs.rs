//! Real programs under massif: stdout, stderr and exit status equal native, and the file
//! they produce is one Valgrind's ms_print accepts.

mod common;
use common::*;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn native(prog: &Path, args: &[&str], stdin: Option<&str>, dir: &Path) -> Output {
    let mut c = Command::new(prog);
    c.args(args).current_dir(dir);
    feed(c, stdin)
}

fn under_massif(prog: &Path, args: &[&str], stdin: Option<&str>, dir: &Path) -> Output {
    let mut c = Command::new(oxgrind());
    c.args(["-q", "--tool=massif", "--massif-out-file=massif.out.%p"])
        .arg(prog)
        .args(args)
        .current_dir(dir);
    feed(c, stdin)
}

fn feed(mut c: Command, stdin: Option<&str>) -> Output {
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    let text = stdin.unwrap_or("").to_string();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let _ = input.write_all(text.as_bytes());
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

/// Runs `prog args` natively and under massif in identical directories and compares.
fn same_as_native(prog: &Path, args: &[&str], stdin: Option<&str>) {
    let (dn, dm) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let n = native(prog, args, stdin, dn.path());
    let m = under_massif(prog, args, stdin, dm.path());
    let what = format!("{} {}", prog.display(), args.join(" "));
    assert_eq!(stdout(&m), stdout(&n), "stdout differs for {what}");
    assert_eq!(
        without_tids(&stderr(&m)),
        without_tids(&stderr(&n)),
        "stderr differs for {what}"
    );
    assert_eq!(
        m.status.code(),
        n.status.code(),
        "status differs for {what}"
    );
    let files: Vec<_> = std::fs::read_dir(dm.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("massif.out."))
        .collect();
    assert_eq!(files.len(), 1, "expected one massif file for {what}");
    if Command::new("ms_print").arg("--version").output().is_ok() {
        let p = run(Command::new("ms_print").arg(files[0].path()));
        assert!(
            p.status.success(),
            "ms_print rejects the file of {what}: {}",
            stderr(&p)
        );
        let ours = run(Command::new(oxgrind()).arg("ms_print").arg(files[0].path()));
        assert_eq!(stdout(&ours), stdout(&p), "our ms_print differs for {what}");
    }
}

/// Rust's panic message names the thread id (`thread 'main' (28894) panicked`), which
/// differs between any two runs.
fn without_tids(s: &str) -> String {
    s.lines()
        .map(|l| {
            match (
                l.starts_with("thread '"),
                l.find("' ("),
                l.find(") panicked"),
            ) {
                (true, Some(a), Some(b)) if a < b => format!("{}'{}", &l[..a], &l[b + 1..]),
                _ => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn system(prog: &str) -> Option<std::path::PathBuf> {
    let p = Path::new(prog);
    if p.exists() {
        Some(p.to_path_buf())
    } else {
        assert!(
            std::env::var_os("CI").is_none(),
            "{prog} is required in CI (scripts/setup.sh installs it)"
        );
        eprintln!("note: {prog} not installed; skipped");
        None
    }
}

#[test]
fn python3_running_a_script() {
    let Some(py) = system("/usr/bin/python3") else {
        return;
    };
    let script = "import json, collections\n\
                  d = collections.Counter(str(i % 97) for i in range(200000))\n\
                  print(json.dumps(sorted(d.items())[:5]))\n\
                  import sys; sys.exit(7)\n";
    same_as_native(&py, &["-c", script], None);
}

#[test]
fn sqlite3_running_a_workload() {
    let Some(sqlite) = system("/usr/bin/sqlite3") else {
        return;
    };
    let mut sql = String::from("create table t(a integer primary key, b text);\nbegin;\n");
    for i in 0..5000 {
        sql.push_str(&format!(
            "insert into t(b) values('row {i} {}');\n",
            "x".repeat(i % 50)
        ));
    }
    sql.push_str("commit;\nselect count(*), sum(length(b)) from t;\nselect b from t where a % 1000 = 0 order by a;\n");
    same_as_native(&sqlite, &[":memory:"], Some(&sql));
}

#[test]
fn coreutils_and_perl() {
    let Some(sort) = system("/usr/bin/sort") else {
        return;
    };
    let input: String = (0..20000)
        .map(|i| format!("{}\n", (i * 7919) % 10007))
        .collect();
    same_as_native(&sort, &["-n"], Some(&input));
    if let Some(ls) = system("/bin/ls") {
        same_as_native(&ls, &["-la", "/usr/lib"], None);
    }
    if let Some(perl) = system("/usr/bin/perl") {
        same_as_native(
            &perl,
            &[
                "-e",
                "my %h; $h{$_ % 101} .= 'x' for 1..50000; print scalar(keys %h), \"\\n\"; exit 2",
            ],
            None,
        );
    }
    if let Some(git) = system("/usr/bin/git") {
        same_as_native(&git, &["--version"], None);
    }
}

#[test]
fn multithreaded_c_program() {
    same_as_native(&build("threads.c", &["-g", "-O2"]), &[], None);
}

#[test]
fn cxx_program_with_exceptions() {
    same_as_native(&build("containers.cpp", &["-g", "-O2"]), &[], None);
}

#[test]
fn rust_program_with_threads_and_a_caught_panic() {
    let prog = build("rust_prog.rs", &["-O"]);
    same_as_native(&prog, &[], None);
}

/// A thread on a 16 KiB stack (PTHREAD_STACK_MIN) runs as natively under Massif in every
/// time unit, under the engine alone and under Memcheck: what the runtime keeps in static
/// TLS comes out of every thread's stack (it once took 8 KiB of the 16 and the thread died
/// in the dynamic linker; 38 KiB, and pthread_create failed), and without the engine
/// (`--time-unit=B`, `ms`) the hooks run on a stack of ours (`hookstack`: on the thread's
/// own, Massif's first sight of the stack, about 24 KiB deep, killed it with SIGSEGV).
#[test]
fn a_thread_on_the_smallest_stack_runs_as_natively() {
    let prog = build("small_thread_stack.c", &["-g", "-O2"]);
    same_as_native(&prog, &[], None);
    same_as_native_under_the_engine(&prog, &[], None);
    let n = native(&prog, &[], None, Path::new("."));
    let under = |args: &[&str]| {
        let d = tempfile::tempdir().unwrap();
        let o = run(Command::new(oxgrind())
            .arg("-q")
            .args(args)
            .arg(&prog)
            .current_dir(d.path()));
        assert_eq!(stdout(&o), stdout(&n), "{args:?}: {o:?}");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {o:?}");
    };
    under(&["--tool=memcheck"]);
    under(&["--tool=massif", "--time-unit=B"]);
    under(&["--tool=massif", "--time-unit=ms"]);
}

/// A signal handler that allocates, arriving at any instant of allocating threads
/// (`signal_handler_allocates.c`: a SIGALRM every 250 us over four threads' malloc/free
/// loops) finishes with the output of a run without the timer. Without the engine
/// (`--time-unit=B`, `ms`) the handler's malloc can interrupt the runtime while it holds the
/// shard lock of the same thread's blocks: waiting for it hung the program (3 runs of 3).
/// Not checked under the engine: there the program hangs in glibc's arena lock, --tool=none
/// included (the handler interrupts translated glibc code holding it, in a window far wider
/// than natively, where about one run in a hundred also fails: a handler's malloc is not
/// async-signal-safe).
#[test]
fn a_signal_handler_that_allocates_runs_as_natively() {
    let prog = build("signal_handler_allocates.c", &["-g", "-O2", "-pthread"]);
    let deadline = std::time::Duration::from_secs(120);
    let n = native(&prog, &["no-timer"], None, Path::new("."));
    assert_eq!(n.status.code(), Some(0), "natively: {n:?}");
    for args in [
        &["--tool=massif", "--time-unit=B"][..],
        &["--tool=massif", "--time-unit=ms"],
    ] {
        let d = tempfile::tempdir().unwrap();
        let o = run_with_deadline(
            Command::new(oxgrind())
                .arg("-q")
                .args(args)
                .arg(&prog)
                .current_dir(d.path()),
            deadline,
        );
        assert_eq!(stdout(&o), stdout(&n), "{args:?}: {o:?}");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {o:?}");
    }
}

/// `--tool=none`: the program runs from the translation engine's code cache, uninstrumented,
/// and must behave exactly as natively.
fn same_as_native_under_the_engine(prog: &Path, args: &[&str], stdin: Option<&str>) {
    let (dn, de) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let n = native(prog, args, stdin, dn.path());
    let mut c = Command::new(oxgrind());
    c.args(["-q", "--tool=none"])
        .arg(prog)
        .args(args)
        .current_dir(de.path());
    let e = feed(c, stdin);
    let what = format!("--tool=none {} {}", prog.display(), args.join(" "));
    assert_eq!(stdout(&e), stdout(&n), "stdout differs for {what}");
    assert_eq!(
        without_tids(&stderr(&e)),
        without_tids(&stderr(&n)),
        "stderr differs for {what}"
    );
    assert_eq!(
        e.status.code(),
        n.status.code(),
        "status differs for {what}"
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        e.status.signal(),
        n.status.signal(),
        "signal differs for {what}"
    );
}

#[test]
fn real_programs_run_unchanged_under_the_translation_engine() {
    if let Some(py) = system("/usr/bin/python3") {
        same_as_native_under_the_engine(
            &py,
            &[
                "-c",
                "import json; print(json.dumps([i*i for i in range(1000)])[-40:])",
            ],
            None,
        );
    }
    if let Some(sort) = system("/usr/bin/sort") {
        let input: String = (0..20000)
            .map(|i| format!("{}\n", (i * 7919) % 10007))
            .collect();
        same_as_native_under_the_engine(&sort, &["-n"], Some(&input));
    }
    if let Some(sqlite) = system("/usr/bin/sqlite3") {
        same_as_native_under_the_engine(
            &sqlite,
            &[":memory:"],
            Some("create table t(a);insert into t values(1),(2);select sum(a) from t;\n"),
        );
    }
    if let Some(perl) = system("/usr/bin/perl") {
        same_as_native_under_the_engine(
            &perl,
            &[
                "-e",
                "print join(',', map { $_ * 2 } 1..10), \"\\n\"; exit 5",
            ],
            None,
        );
    }
    if let Some(git) = system("/usr/bin/git") {
        same_as_native_under_the_engine(&git, &["--version"], None);
    }
    same_as_native_under_the_engine(&build("threads.c", &["-g", "-O2"]), &[], None);
    same_as_native_under_the_engine(&build("containers.cpp", &["-g", "-O2"]), &[], None);
    same_as_native_under_the_engine(&build("rust_prog.rs", &["-O"]), &[], None);
    let endings = build("endings.c", &["-g", "-O2"]);
    for mode in ["exit", "_exit", "abort", "fork"] {
        same_as_native_under_the_engine(&endings, &[mode], None);
    }
    // A crash: what the program prints, its status and signal as natively, and on stderr
    // the core's "Process terminating" block, which Valgrind prints even with -q for a
    // core-dumping signal the kernel raised.
    let (dn, de) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let n = native(&endings, &["segv"], None, dn.path());
    let e = feed(
        {
            let mut c = Command::new(oxgrind());
            c.args(["-q", "--tool=none"])
                .arg(&endings)
                .arg("segv")
                .current_dir(de.path());
            c
        },
        None,
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(stdout(&e), stdout(&n));
    assert_eq!(e.status.signal(), n.status.signal());
    if have_valgrind() {
        let v = run(Command::new("valgrind")
            .args(["-q", "--tool=none"])
            .arg(&endings)
            .arg("segv")
            .current_dir(de.path()));
        assert_eq!(
            normalize_report(&stderr(&e)),
            normalize_report(&stderr(&v)),
            "stderr of a crash under --tool=none -q differs from Valgrind's"
        );
    } else {
        assert!(stderr(&e).contains("Process terminating with default action of signal 11"));
    }
}

/// The program gets its environment in the order it was given, without our variables:
/// `env` prints the same lines as natively. (The environment is set by `env -i`, not by
/// `Command`, which would sort it and hide a launcher that sorts.)
#[test]
fn the_environment_reaches_the_program_in_its_order() {
    let Some(env) = system("/usr/bin/env") else {
        return;
    };
    let given = ["ZETA=1", "ALPHA=2", "MIDDLE=3"];
    let run = |under: &[&str], tool_args: &[&str]| {
        let out = Command::new(&env)
            .arg("-i")
            .args(given)
            .args(under)
            .args(tool_args)
            .arg(&env)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let native = run(&[], &[]);
    assert_eq!(native, "ZETA=1\nALPHA=2\nMIDDLE=3\n");
    let ox = oxgrind();
    let ox = ox.to_str().unwrap();
    for tool in [
        &["--tool=none"][..],
        &["--tool=massif", "--massif-out-file=/dev/null"],
        &["--tool=dhat", "--dhat-out-file=/dev/null"],
    ] {
        assert_eq!(run(&[ox, "-q"], tool), native, "{tool:?}");
    }
}

/// A vfork or posix_spawn child shares our memory and puts handlers back to the default
/// before it execs (gdb's inferiors, posix_spawn's SETSIGDEF): the parent's own handler
/// still runs afterwards, as natively (gdb hung waiting for a SIGCHLD its handler never got).
#[test]
fn a_vfork_childs_signal_dispositions_stay_its_own() {
    let prog = build("vfork_child_dispositions.c", &["-O2"]);
    same_as_native_under_the_engine(&prog, &[], None);
    same_as_native(&prog, &[], None);
}
