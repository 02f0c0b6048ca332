//! Shared helpers for the launcher's integration tests: build corpus programs, run them
//! natively, under oxgrind and under Valgrind, and normalise what legitimately differs.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The launcher under test, with a check that the runtime library beside it is built and
/// newer than every source it is made of: `cargo test` builds the launcher but not the
/// preloaded library, and a stale one makes tests fail for reasons that are not there.
pub fn oxgrind() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_oxgrind"));
    static CHECKED: std::sync::Once = std::sync::Once::new();
    CHECKED.call_once(|| assert_runtime_fresh(&exe, "cargo build --workspace"));
    exe
}

/// The release build's launcher (what scripts/setup.sh installs), when scripts/test.sh
/// built it (`OXGRIND_TEST_RELEASE` set: then it must be there and fresh); `None` under a
/// plain `cargo test`, which builds only the debug one.
pub fn release_oxgrind() -> Option<PathBuf> {
    let debug = PathBuf::from(env!("CARGO_BIN_EXE_oxgrind"));
    let exe = debug.parent()?.parent()?.join("release/oxgrind");
    if std::env::var_os("OXGRIND_TEST_RELEASE").is_none() && !exe.exists() {
        eprintln!("no release build (scripts/test.sh makes one): skipped");
        return None;
    }
    assert!(
        exe.exists(),
        "{} is missing: scripts/test.sh builds it",
        exe.display()
    );
    static CHECKED: std::sync::Once = std::sync::Once::new();
    CHECKED.call_once(|| {
        assert_runtime_fresh(&exe, "cargo build --release -p oxgrind -p oxgrind-runtime")
    });
    Some(exe)
}

/// Panics unless the runtime library beside the launcher `exe` was built after the newest
/// source linked into it; `how` says how to rebuild.
fn assert_runtime_fresh(exe: &Path, how: &str) {
    let runtime = exe.parent().unwrap().join("liboxgrind_runtime.so");
    let built = std::fs::metadata(&runtime)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: build it first (`{how}`, as scripts/test.sh does)",
                runtime.display()
            )
        });
    let root = repo_root();
    // The crates linked into the library: a change in any of them makes cargo relink it.
    let linked = [
        "crates/oxgrind-runtime/src",
        "crates/oxgrind-engine/src",
        "crates/oxgrind-symbols/src",
        "crates/oxgrind-formats/src",
        "crates/oxgrind-options/src",
        "crates/oxgrind-tool/src",
        "crates/oxgrind-sys/src",
        "tools",
    ];
    let newest = linked
        .iter()
        .flat_map(|d| walk(&root.join(d)))
        .filter(|p| p.components().all(|c| c.as_os_str() != "tests"))
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "rs" || e == "c" || e == "supp")
        })
        .filter_map(|p| {
            std::fs::metadata(&p)
                .and_then(|m| m.modified())
                .ok()
                .map(|t| (t, p))
        })
        .max();
    if let Some((t, p)) = newest {
        assert!(
            t <= built,
            "{} is older than {}: rebuild it (`{how}`, as scripts/test.sh does)",
            runtime.display(),
            p.display()
        );
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

pub fn corpus_source(name: &str) -> PathBuf {
    repo_root().join("tests/corpus").join(name)
}

/// Compiles `tests/corpus/<name>` (C, C++ or Rust, by extension) with `flags` once per test
/// process and returns the executable.
pub fn build(name: &str, flags: &[&str]) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let key = format!("{name} {}", flags.join(" "));
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some(p) = built.get(&key) {
        return p.clone();
    }
    let src = corpus_source(name);
    let stem = src.file_stem().unwrap().to_string_lossy().into_owned();
    let tag: String = flags
        .join("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("corpus-{stem}-{tag}"));
    let ext = src.extension().unwrap().to_string_lossy().into_owned();
    let mut cmd = match ext.as_str() {
        "c" => {
            let mut c = Command::new("gcc");
            c.arg("-pthread");
            c
        }
        "cpp" => Command::new("g++"),
        "rs" => {
            let mut c = Command::new("rustc");
            c.args(["--edition=2021", "-C", "debuginfo=1"]);
            c
        }
        other => panic!("unknown corpus language: {other}"),
    };
    cmd.args(flags).arg("-o").arg(&out).arg(&src);
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run the compiler for {name}: {e}"));
    assert!(status.success(), "compiling {name} failed");
    built.insert(key, out.clone());
    out
}

/// Runs `prog args` with `opts` under the launcher `oxgrind` and under Valgrind; asserts
/// that the program printed the same and ended the same (a death by signal included), and
/// returns both reports (stderr) as they are.
pub fn run_beside_valgrind(
    oxgrind: &Path,
    prog: &Path,
    opts: &[&str],
    args: &[&str],
) -> (String, String) {
    let ours = run(Command::new(oxgrind).args(opts).arg(prog).args(args));
    let theirs = run(Command::new("valgrind").args(opts).arg(prog).args(args));
    assert_eq!(
        stdout(&ours),
        stdout(&theirs),
        "program output differs ({opts:?} {args:?})"
    );
    assert_eq!(
        ours.status.code(),
        theirs.status.code(),
        "exit status differs ({opts:?} {args:?})"
    );
    (stderr(&ours), stderr(&theirs))
}

/// [`run_beside_valgrind`] with the launcher under test, the reports normalised
/// ([`normalize_report`]); `None` without Valgrind.
pub fn reports_beside_valgrind(
    prog: &Path,
    opts: &[&str],
    args: &[&str],
) -> Option<(String, String)> {
    if !have_valgrind() {
        return None;
    }
    let (ours, theirs) = run_beside_valgrind(&oxgrind(), prog, opts, args);
    Some((normalize_report(&ours), normalize_report(&theirs)))
}

pub fn have_valgrind() -> bool {
    let ok = Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "valgrind is required in CI (scripts/setup.sh installs it)"
        );
        eprintln!("note: valgrind not installed; differential check skipped");
    }
    ok
}

/// Starts `cmd` with SIGINT and SIGQUIT at their default action, whatever the suite
/// inherited: a shell starts a background job (`cmd &` without job control, as CI runners
/// and `nohup` do) with both ignored, and a test that interrupts its program needs them.
pub fn with_default_interrupts(cmd: &mut Command) -> &mut Command {
    extern "C" {
        fn signal(sig: i32, handler: usize) -> usize;
    }
    // SAFETY: signal(2) is async-signal-safe, as pre_exec requires between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, || {
            signal(2, 0);
            signal(3, 0);
            Ok(())
        })
    }
}

/// Runs `cmd` (SIGINT and SIGQUIT at their default, [`with_default_interrupts`]) with its
/// output captured; a run still going after `deadline` is killed, with its whole process
/// group, and "[killed after ...: hung]" is added to its stderr: a hung case must fail, not
/// hang the suite.
pub fn run_with_deadline(cmd: &mut Command, deadline: std::time::Duration) -> Output {
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    with_default_interrupts(cmd);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // Its own process group, so that a hang kills the forked children too: a child that
    // hangs holds the output pipes open, and reading them would wait for ever.
    let mut child = std::os::unix::process::CommandExt::process_group(cmd, 0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    // Read both pipes on their own threads so a chatty program cannot block on a full pipe.
    let mut out_pipe = child.stdout.take().unwrap();
    let mut err_pipe = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut out_pipe, &mut v).ok();
        v
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut err_pipe, &mut v).ok();
        v
    });
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > deadline {
            // SAFETY: kill(2) of the process group made above (its id is the child's).
            unsafe { kill(-(child.id() as i32), 9) };
            let s = child.wait().unwrap();
            let mut stderr = err.join().unwrap();
            stderr.extend_from_slice(format!("\n[killed after {deadline:?}: hung]\n").as_bytes());
            return Output {
                status: s,
                stdout: out.join().unwrap(),
                stderr,
            };
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Frame addresses differ between Valgrind and native runs (different load addresses);
/// everything else in a massif file must not.
pub fn normalize_massif(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut l = line.to_string();
        if let Some(i) = l.find("0x") {
            if let Some(colon) = l[i..].find(": ") {
                let hex = &l[i + 2..i + colon];
                if !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit()) {
                    l.replace_range(i..i + colon, "0xADDR");
                }
            }
        }
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// The `mem_heap_B` of the snapshot marked `heap_tree=peak`, if any.
pub fn massif_peak(text: &str) -> Option<u64> {
    let lines: Vec<&str> = text.lines().collect();
    let i = lines.iter().position(|l| *l == "heap_tree=peak")?;
    lines[..i]
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("mem_heap_B="))
        .map(|v| v.parse().unwrap())
}

/// The normalised tree of the peak snapshot (its lines from `heap_tree=peak` to the next
/// separator).
pub fn massif_peak_tree(text: &str) -> Option<String> {
    let norm = normalize_massif(text);
    let start = norm.find("heap_tree=peak\n")?;
    let rest = &norm[start..];
    let end = rest.find("#-----------").unwrap_or(rest.len());
    Some(rest[..end].to_string())
}

/// Things that legitimately differ between any two runs, or name the tool itself.
pub fn normalize_report(report: &str) -> String {
    report
        .lines()
        .map(|l| {
            let mut l = l.to_string();
            // ==12345== prefix
            if l.starts_with("==") {
                if let Some(end) = l[2..].find("==") {
                    l.replace_range(..end + 4, "==PID==");
                }
            }
            let mut out = mask_addresses(&l);
            for preload in ["/usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so"] {
                out = out.replace(preload, "PRELOAD");
            }
            if let Some(i) = out.find("(in /") {
                if out[i..].contains("liboxgrind_runtime.so)") {
                    out.replace_range(i.., "(in PRELOAD)");
                }
            }
            // Valgrind has no clone3, so glibc falls back to clone under it.
            out.replace("clone3 (clone3.S:81)", "clone (clone.S:100)")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `line` with every hexadecimal number (`0x...`) replaced by `0xADDR`.
pub fn mask_addresses(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(i) = rest.find("0x") {
        out.push_str(&rest[..i]);
        let tail = &rest[i + 2..];
        let n = tail.chars().take_while(|c| c.is_ascii_hexdigit()).count();
        out.push_str("0xADDR");
        rest = &tail[n..];
    }
    out.push_str(rest);
    out
}

/// An XML report with what differs between any two runs removed: pids, times, unique ids,
/// addresses, and the elements naming files and objects (our replacement functions live in
/// another object than Valgrind's).
pub fn xml_normalized(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let drop = [
        "<pid>", "<ppid>", "<time>", "<unique>", "<obj>", "<exe>", "<arg>", "<line>", "<dir>",
    ];
    text.lines()
        .filter(|l| !drop.iter().any(|d| l.trim_start().starts_with(d)))
        .map(mask_addresses)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Panics with the first differing lines when two normalised reports differ.
pub fn assert_same_report(ours: &str, theirs: &str) {
    if ours != theirs {
        let diff: Vec<String> = ours
            .lines()
            .zip(theirs.lines())
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .take(12)
            .map(|(i, (a, b))| format!("line {}:\n  ours     {a}\n  valgrind {b}", i + 1))
            .collect();
        panic!(
            "reports differ ({} vs {} lines):\n{}\n--- ours ---\n{ours}",
            ours.lines().count(),
            theirs.lines().count(),
            diff.join("\n")
        );
    }
}

/// Our runtime library has a TLS segment (Valgrind's preload none): glibc gives each
/// thread's DTV one 16-byte slot more. The allocated total is made Valgrind's.
pub fn without_dtv_slot(ours: &str, theirs: &str) -> String {
    let usage = |r: &str| {
        r.lines()
            .find(|l| l.contains("total heap usage:"))
            .map(str::to_string)
    };
    match (usage(ours), usage(theirs)) {
        (Some(o), Some(t)) => ours.replace(&o, &t),
        _ => ours.to_string(),
    }
}
