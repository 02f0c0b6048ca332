//! Bad input gets one clear line on stderr and a non-zero exit, never a panic trace.

mod common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

fn one_line_error(args: &[&str], expect: &str) {
    one_line_error_with_status(args, expect, 1)
}

/// As Valgrind (and a shell): 127 for a program that is not there, 126 for one that cannot
/// be executed, 1 for every other refusal.
fn one_line_error_with_status(args: &[&str], expect: &str, status: i32) {
    let o = run(Command::new(oxgrind()).args(args));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(status), "args {args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "args {args:?}: not one line: {err}");
    assert!(err.starts_with("oxgrind: "), "{err}");
    assert!(
        err.contains(expect),
        "args {args:?}: `{err}` lacks `{expect}`"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn unknown_option() {
    one_line_error(
        &["--tool=massif", "--no-such-option=1", "/bin/true"],
        "Unknown option: --no-such-option=1",
    );
}

#[test]
fn bad_option_value() {
    one_line_error(&["--tool=massif", "--depth=0", "/bin/true"], "--depth");
    one_line_error(
        &["--tool=massif", "--threshold=abc", "/bin/true"],
        "--threshold",
    );
    one_line_error(
        &["--tool=massif", "--num-callers=9999", "/bin/true"],
        "--num-callers",
    );
}

#[test]
fn unknown_tool() {
    one_line_error(&["--tool=frobgrind", "/bin/true"], "frobgrind");
}

#[test]
fn missing_program() {
    one_line_error(&["--tool=massif"], "no program specified");
    one_line_error_with_status(
        &["--tool=massif", "./does-not-exist"],
        "oxgrind: ./does-not-exist: No such file or directory",
        127,
    );
    one_line_error_with_status(
        &["--tool=massif", "no-such-command-xyz"],
        "oxgrind: no-such-command-xyz: command not found",
        127,
    );
}

#[test]
fn not_executable_directory_and_static_binary() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.txt");
    std::fs::write(&plain, "hello").unwrap();
    one_line_error_with_status(
        &["--tool=massif", plain.to_str().unwrap()],
        &format!("{}: Permission denied", plain.display()),
        126,
    );
    one_line_error_with_status(
        &["--tool=massif", dir.path().to_str().unwrap()],
        &format!("{}: is a directory", dir.path().display()),
        126,
    );
    let junk = dir.path().join("junk");
    std::fs::write(&junk, "not an elf").unwrap();
    std::fs::set_permissions(&junk, std::fs::Permissions::from_mode(0o755)).unwrap();
    one_line_error(&["--tool=massif", junk.to_str().unwrap()], "not an ELF");
    let src = dir.path().join("s.c");
    std::fs::write(&src, "int main(void){return 0;}").unwrap();
    let stat = dir.path().join("static-prog");
    let ok = Command::new("gcc")
        .arg("-static")
        .arg("-o")
        .arg(&stat)
        .arg(&src)
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        one_line_error(
            &["--tool=massif", stat.to_str().unwrap()],
            "statically linked",
        );
    } else {
        eprintln!("note: no static libc to build a static test binary; static check skipped");
    }
}

#[test]
fn corrupt_massif_file_for_ms_print() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("massif.out.bad");
    std::fs::write(
        &f,
        "desc: x\ncmd: y\ntime_unit: B\n#-----------\nsnapshot=0\n#-----------\ntime=zz\n",
    )
    .unwrap();
    one_line_error(&["ms_print", f.to_str().unwrap()], "line");
    one_line_error(&["ms_print", "/no/such/massif.out"], "massif.out");
}

#[test]
fn help_and_version_succeed() {
    let o = run(Command::new(oxgrind()).arg("--help"));
    assert!(o.status.success());
    assert!(stdout(&o).contains("usage: oxgrind [options] prog-and-args"));
    let o = run(Command::new(oxgrind()).arg("--version"));
    assert!(o.status.success());
    assert!(stdout(&o).starts_with("oxgrind-"));
}

#[test]
fn program_killed_by_a_signal_makes_oxgrind_die_the_same_way() {
    use std::os::unix::process::ExitStatusExt;
    let o = run(Command::new(oxgrind()).args([
        "--tool=massif",
        "--massif-out-file=/dev/null",
        "/bin/sh",
        "-c",
        "kill -TERM $$",
    ]));
    assert_eq!(o.status.signal(), Some(15), "{:?}", o.status);
}

#[test]
fn tool_help_lists_the_tools_options() {
    let o = run(Command::new(oxgrind()).args(["--tool=massif", "--help"]));
    assert!(o.status.success());
    assert!(
        stdout(&o).contains("user options for Massif:") && stdout(&o).contains("--peak-inaccuracy")
    );
    let o = run(Command::new(oxgrind()).arg("--help"));
    assert!(
        stdout(&o).contains("user options for Memcheck:"),
        "memcheck is the default tool"
    );
}

#[test]
fn valgrind_opts_and_valgrindrc_come_before_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".valgrindrc"),
        "--massif-out-file=from-rc.out\n",
    )
    .unwrap();
    let o = run(Command::new(oxgrind())
        .env(
            "VALGRIND_OPTS",
            "--tool=massif --massif-out-file=from-env.out",
        )
        .env("HOME", dir.path())
        .arg("/bin/true")
        .current_dir(dir.path()));
    assert!(o.status.success(), "{}", stderr(&o));
    // ./.valgrindrc is read after $VALGRIND_OPTS, so its file name wins.
    assert!(dir.path().join("from-rc.out").exists());
    let o = run(Command::new(oxgrind())
        .env(
            "VALGRIND_OPTS",
            "--tool=massif --massif-out-file=from-env.out",
        )
        .args(["--massif-out-file=from-cli.out", "/bin/true"])
        .current_dir(dir.path()));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        dir.path().join("from-cli.out").exists(),
        "the command line wins"
    );
}

/// Valgrind creates its log and XML files before the program starts and refuses to go on
/// when it cannot: "valgrind: Cannot create log file '/no/such/dir/x.log': No such file or
/// directory", exit 1.
#[test]
fn log_and_xml_file_in_a_missing_directory_are_refused_before_the_program_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let script = format!("touch {}", marker.display());
    let log = dir.path().join("missing/x.log");
    one_line_error(
        &[
            &format!("--log-file={}", log.display()),
            "/bin/sh",
            "-c",
            &script,
        ],
        &format!(
            "oxgrind: Cannot create log file '{}': No such file or directory",
            log.display()
        ),
    );
    let xml = dir.path().join("missing/x.xml");
    one_line_error(
        &[
            "--xml=yes",
            &format!("--xml-file={}", xml.display()),
            "/bin/sh",
            "-c",
            &script,
        ],
        &format!(
            "oxgrind: Cannot create XML file '{}': No such file or directory",
            xml.display()
        ),
    );
    assert!(
        !marker.exists(),
        "the program ran although its output could not be written"
    );
}

/// `--log-fd=9` with descriptor 9 closed: Valgrind warns ("failed to move log file descriptor
/// into safe range, using stderr") and logs to stderr; the report is not lost.
#[test]
fn closed_log_fd_falls_back_to_stderr_with_valgrinds_warning() {
    let o = run(Command::new(oxgrind()).args(["--log-fd=9", "/bin/true"]));
    assert!(o.status.success(), "{:?}", o.status);
    let err = stderr(&o);
    let first = err.lines().next().unwrap_or("");
    assert!(
        first.starts_with("==")
            && first.ends_with(
                "== oxgrind: failed to move log file descriptor into safe range, using stderr"
            ),
        "{err}"
    );
    assert!(
        err.contains("ERROR SUMMARY: 0 errors from 0 contexts"),
        "report lost: {err}"
    );
}
