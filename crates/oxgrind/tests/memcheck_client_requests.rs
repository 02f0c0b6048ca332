//! Memcheck's client requests (`valgrind/memcheck.h`, no-ops natively), as Valgrind answers
//! them: memory made unaddressable is checked, a check request reports and returns the first
//! bad byte, and a custom allocator's blocks (`VALGRIND_MALLOCLIKE_BLOCK` /
//! `FREELIKE_BLOCK`) are counted, described, checked and leak-checked as heap blocks. The
//! whole report equals Valgrind's (issue 10: MAKE_MEM_NOACCESS then an access gave Valgrind
//! two errors and us none).

mod common;
use common::*;
use std::process::Command;

#[test]
fn client_requests_are_answered_and_reported_as_valgrind_does() {
    if !have_valgrind() {
        return;
    }
    let prog = build("mc_client_requests.c", &["-g", "-O0"]);
    for opts in [&["--leak-check=full"][..], &["-q"]] {
        let ours = run(Command::new(oxgrind()).args(opts).arg(&prog));
        let theirs = run(Command::new("valgrind").args(opts).arg(&prog));
        // The program prints what the requests returned (the first bad address was the
        // expected one, the clean check returned 0, and the error count).
        assert_eq!(stdout(&ours), stdout(&theirs), "{}", stderr(&ours));
        eprintln!("options {opts:?}");
        assert_same_report(
            &normalize_report(&stderr(&ours)),
            &normalize_report(&stderr(&theirs)),
        );
    }
}

/// `VALGRIND_DO_LEAK_CHECK` and its ADDED / CHANGED / QUICK forms in the middle of the run,
/// and `VALGRIND_COUNT_LEAKS` / `COUNT_LEAK_BLOCKS` after each: the loss records with their
/// `(+N)` / `(-N)` changes, the LEAK SUMMARY with its changes, the numbers the program
/// prints, and the exit report (whose "loss record N of M" counts the records earlier
/// searches kept) equal Valgrind's, whatever `--leak-check` says.
#[test]
fn leak_check_requests_report_and_count_as_valgrind_does() {
    if !have_valgrind() {
        return;
    }
    let prog = build("mc_leak_requests.c", &["-g", "-O0"]);
    for opts in [
        &[][..],
        &["--leak-check=full"],
        &["--leak-check=no"],
        &["--show-leak-kinds=all", "--errors-for-leak-kinds=all"],
        &["-q"],
    ] {
        let ours = run(Command::new(oxgrind()).args(opts).arg(&prog));
        let theirs = run(Command::new("valgrind").args(opts).arg(&prog));
        eprintln!("options {opts:?}");
        assert!(
            stdout(&theirs).contains("first bytes: leaked 96 dubious 40 reachable 4396"),
            "{}",
            stdout(&theirs)
        );
        assert_eq!(stdout(&ours), stdout(&theirs), "{}", stderr(&ours));
        assert_same_report(
            &normalize_report(&stderr(&ours)),
            &normalize_report(&stderr(&theirs)),
        );
    }
}

/// Under `--xml=yes` each search's loss records are `<error>`s written when the program
/// asks (before the FINISHED status), with the changes in their text; every loss record,
/// printed or not, takes a `<unique>` number, as in Valgrind.
#[test]
fn leak_check_requests_in_xml_as_valgrind_writes_them() {
    if !have_valgrind() {
        return;
    }
    let prog = build("mc_leak_requests.c", &["-g", "-O0"]);
    let dir = tempfile::tempdir().unwrap();
    let mut outputs = Vec::new();
    for tool in [oxgrind(), "valgrind".into()] {
        let file = dir.path().join("out.xml");
        let o = run(Command::new(tool)
            .arg("--xml=yes")
            .arg(format!("--xml-file={}", file.display()))
            .arg(&prog));
        assert!(o.status.success(), "{}", stderr(&o));
        let xml = std::fs::read_to_string(&file).unwrap();
        // The leak records and where the run's status falls among them.
        let kept: Vec<String> = xml
            .lines()
            .filter(|l| {
                [
                    "<unique>", "<tid>", "<kind>", "<text>", "<leaked", "<state>",
                ]
                .iter()
                .any(|t| l.trim_start().starts_with(t))
            })
            .map(str::to_string)
            .collect();
        outputs.push(kept.join("\n"));
    }
    assert!(
        outputs[1].contains("48 (+48) bytes in 3 (+3) blocks are definitely lost"),
        "{}",
        outputs[1]
    );
    assert_eq!(outputs[0], outputs[1]);
}

/// Leak searches asked for while other threads allocate and free without pause finish
/// (the search takes none of our locks while it waits for the other threads to stop) and
/// count what Valgrind counts.
#[test]
fn leak_check_requests_while_threads_allocate() {
    if !have_valgrind() {
        return;
    }
    let prog = build("mc_leak_requests_threads.c", &["-g", "-O1", "-pthread"]);
    // A deadlocked run was seen to outlive SIGTERM: KILL it.
    let ours = run(Command::new("timeout")
        .args(["-s", "KILL", "300"])
        .arg(oxgrind())
        .arg("-q")
        .arg(&prog));
    let theirs = run(Command::new("valgrind").arg("-q").arg(&prog));
    assert!(ours.status.success(), "{}", stderr(&ours));
    assert_eq!(stdout(&theirs), "leaked blocks 50\n");
    assert_eq!(stdout(&ours), stdout(&theirs), "{}", stderr(&ours));
}
