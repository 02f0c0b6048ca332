//! System-call parameters, differentially: each case of `tests/corpus/mc_syscall_params.c`
//! passes one system call a heap buffer that is too short (or freed), and the report,
//! "Syscall param NAME points to unaddressable byte(s)", its stack, the address's
//! description, the counts, must be Valgrind's. Also the XML kind (`SyscallParam`) and a
//! `Memcheck:Param` suppression.

mod common;
use common::*;
use std::process::Command;

/// Every case the program knows, with the parameter Valgrind names in it.
const CASES: &[(&str, &str)] = &[
    ("write", "write(buf)"),
    ("read", "read(buf)"),
    ("pread", "pread64(buf)"),
    ("pwrite", "pwrite64(buf)"),
    ("writev", "writev(vector[...])"),
    ("writev_array", "writev(vector)"),
    ("readv", "readv(vector[...])"),
    ("send", "socketcall.sendto(msg)"),
    ("sendto", "socketcall.sendto(to.sa_data)"),
    ("recv", "socketcall.recvfrom(buf)"),
    ("sendmsg", "sendmsg(msg.msg_iov[0])"),
    ("recvmsg", "recvmsg(msg.msg_iov[0])"),
    ("open", "openat(filename)"),
    ("stat", "fstatat(buf)"),
    ("stat_name", "fstatat(file_name)"),
    ("fstat", "fstatat(buf)"),
    ("lstat", "fstatat(buf)"),
    ("statx", "statx(buf)"),
    ("statx_name", "statx(filename)"),
    ("getdents64", "getdents64(dirp)"),
    ("poll", "poll(ufds.revents)"),
    ("ppoll", "ppoll(ufds.revents)"),
    ("select", "pselect6(readfds)"),
    ("pselect", "pselect6(readfds)"),
    ("epoll_wait", "epoll_wait(events)"),
    ("epoll_ctl", "epoll_ctl(event)"),
    ("futex", "futex(futex)"),
    ("clock_gettime", "clock_gettime(tp)"),
    ("nanosleep", "clock_nanosleep(rqtp)"),
    ("clock_nanosleep", "clock_nanosleep(rqtp)"),
    ("gettimeofday", "gettimeofday(tz)"),
    ("tcgets", "ioctl(TCGETS)"),
    ("fionread", "ioctl(FIONREAD)"),
    ("tiocgwinsz", "ioctl(TIOCGWINSZ)"),
    ("getrandom", "getrandom(cpu)"),
    ("uname", "uname(buf)"),
    ("sigaction", "rt_sigaction(act->sa_mask)"),
    ("sigprocmask", "rt_sigprocmask(set)"),
    ("pipe2", "pipe2(filedes)"),
    ("socketpair", "socketcall.socketpair(sv)"),
    ("getsockname", "socketcall.getsockname(namelen_in)"),
    ("getpeername", "socketcall.getpeername(name)"),
    ("connect", "socketcall.connect(serv_addr.sa_data)"),
    ("bind", "socketcall.bind(my_addr.sa_data)"),
    ("accept4", "socketcall.accept(addr)"),
];

fn program() -> std::path::PathBuf {
    build("mc_syscall_params.c", &["-g", "-O0", "-w"])
}

#[test]
fn every_syscall_param_case_matches_valgrind() {
    if !have_valgrind() {
        return;
    }
    let prog = program();
    let mut failures = Vec::new();
    for (case, param) in CASES {
        // The leak check is not what is compared here (which stale copy of a pointer a
        // register keeps differs between the two engines).
        let opts = ["--leak-check=no"];
        let ours = run(Command::new(oxgrind()).args(opts).arg(&prog).arg(case));
        let theirs = run(Command::new("valgrind").args(opts).arg(&prog).arg(case));
        assert_eq!(
            ours.status.code(),
            theirs.status.code(),
            "{case}: exit status"
        );
        let (ours, theirs) = (
            normalize_report(&stderr(&ours)),
            normalize_report(&stderr(&theirs)),
        );
        let headline = format!("Syscall param {param} points to unaddressable byte(s)");
        assert!(
            theirs.contains(&headline),
            "{case}: Valgrind says\n{theirs}"
        );
        if ours != theirs {
            failures.push(format!("--- {case}: ours\n{ours}\n--- valgrind\n{theirs}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn good_buffers_give_no_syscall_error() {
    let out = run(Command::new(oxgrind()).arg(program()).arg("ok"));
    let err = stderr(&out);
    assert!(
        err.contains("ERROR SUMMARY: 0 errors from 0 contexts"),
        "{err}"
    );
}

#[test]
fn syscall_param_errors_in_xml_are_syscallparam() {
    if !have_valgrind() {
        return;
    }
    let prog = program();
    let dir = std::env::temp_dir().join(format!("oxg-sp-xml-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ox, vg) = (dir.join("ox.xml"), dir.join("vg.xml"));
    let xml_of = |tool: &std::path::Path, file: &std::path::Path| {
        run(Command::new(tool)
            .arg("--xml=yes")
            .arg(format!("--xml-file={}", file.display()))
            .arg(&prog)
            .arg("writev"));
        let text = std::fs::read_to_string(file).unwrap();
        // The error's kind, what and auxwhat lines, addresses masked.
        text.lines()
            .filter(|l| l.contains("<kind>") || l.contains("<what>") || l.contains("<auxwhat>"))
            .map(|l| normalize_report(l.trim()))
            .collect::<Vec<_>>()
    };
    let ours = xml_of(&oxgrind(), &ox);
    let theirs = xml_of(std::path::Path::new("valgrind"), &vg);
    assert!(
        ours.iter().any(|l| l == "<kind>SyscallParam</kind>"),
        "{ours:?}"
    );
    assert_eq!(ours, theirs);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_param_suppression_hides_the_error() {
    let prog = program();
    let dir = std::env::temp_dir().join(format!("oxg-sp-supp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let supp = dir.join("param.supp");
    std::fs::write(
        &supp,
        "{\n   short-write\n   Memcheck:Param\n   write(buf)\n   ...\n   fun:main\n}\n",
    )
    .unwrap();
    let out = run(Command::new(oxgrind())
        .arg(format!("--suppressions={}", supp.display()))
        .arg(&prog)
        .arg("write"));
    let err = stderr(&out);
    assert!(
        err.contains("ERROR SUMMARY: 0 errors from 0 contexts (suppressed: 1 from 1)"),
        "{err}"
    );
    // And --gen-suppressions writes that kind with its extra line.
    let out = run(Command::new(oxgrind())
        .arg("--gen-suppressions=all")
        .arg(&prog)
        .arg("write"));
    let err = stderr(&out);
    assert!(
        err.contains("   Memcheck:Param\n   write(buf)\n   fun:write\n"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
