//! The frame text of `Symbolizer::describe` against what Valgrind 3.19 prints for the same
//! addresses: a small leaking program runs under memcheck, then each of its stack frames
//! that lies in the program or in libc is described offline and compared line for line
//! (inlined expansions included).

mod common;

use std::path::Path;
use std::process::Command;

use oxgrind_formats::frame::Frame;
use oxgrind_symbols::{Module, Symbolizer};

const LEAK_C: &str = r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static inline __attribute__((always_inline)) char *make(int n) {
    char *p = malloc(n);
    p[0] = 1;
    return p;
}
__attribute__((noinline)) char *leaf(int n) {
    char *p = make(n + 1);
    return p;
}
__attribute__((noinline)) char *mid(int n) {
    return strdup(leaf(n) ? "abc" : "x");
}
__attribute__((constructor)) static void early(void) {
    leaf(20);
}
int main(void) {
    printf("puts=%p\n", dlsym(RTLD_DEFAULT, "puts"));
    char *a = leaf(10);
    char *b = mid(5);
    return a == b;
}
"#;

fn valgrind_available() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `(address, text after "0xADDR: ")` of every stack line of the log, in order.
fn frames(log: &str) -> Vec<(u64, String)> {
    log.lines()
        .filter_map(|l| {
            let rest = l.split_once("== ")?.1.trim_start();
            let rest = rest
                .strip_prefix("at ")
                .or_else(|| rest.strip_prefix("by "))?;
            let (addr, text) = rest.split_once(": ")?;
            Some((
                u64::from_str_radix(addr.strip_prefix("0x")?, 16).ok()?,
                text.to_string(),
            ))
        })
        .collect()
}

#[test]
fn describe_matches_valgrind_memcheck_frames() {
    compare_with_valgrind(false, false);
}

/// `--fullpath-after=` (empty): Valgrind prints the whole DWARF directory before the file.
#[test]
fn directories_match_valgrind_fullpath_after() {
    compare_with_valgrind(false, true);
}

#[test]
fn describe_matches_valgrind_with_show_below_main() {
    compare_with_valgrind(true, false);
}

fn compare_with_valgrind(show_below_main: bool, fullpath: bool) {
    if !valgrind_available() {
        eprintln!("skipped: valgrind not installed");
        return;
    }
    let dir = common::scratch(match (show_below_main, fullpath) {
        (true, _) => "vg-sbm",
        (false, true) => "vg-full",
        (false, false) => "vg",
    });
    let exe = common::compile(
        &dir,
        "gcc",
        "leak",
        "c",
        LEAK_C,
        &["-O2", "-g", "-no-pie"],
        "leak",
    );
    let log = dir.join("vg.log");
    let out = Command::new("valgrind")
        .args(["--tool=memcheck", "--leak-check=full", "--num-callers=30"])
        .arg(format!(
            "--show-below-main={}",
            if show_below_main { "yes" } else { "no" }
        ))
        .args(fullpath.then_some("--fullpath-after="))
        .arg(format!("--log-file={}", log.display()))
        .arg(&exe)
        .output()
        .expect("run valgrind");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = std::fs::read_to_string(&log).expect("valgrind log");

    // libc's load address under Valgrind, from the program's own report of `puts`.
    let puts_rt = stdout
        .lines()
        .find_map(|l| l.strip_prefix("puts=0x"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .expect("program printed puts");
    let libc = Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6");
    let nm = Command::new("nm")
        .arg("-D")
        .arg(libc)
        .output()
        .expect("nm -D libc");
    let puts_link = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .find_map(|l| {
            let mut it = l.split_whitespace();
            let (a, _, n) = (it.next()?, it.next()?, it.next()?);
            (n == "puts" || n.starts_with("puts@")).then(|| u64::from_str_radix(a, 16).ok())?
        })
        .expect("puts in libc");
    let mut sym = Symbolizer::new(vec![
        Module {
            path: exe.clone(),
            bias: 0,
            ranges: vec![],
        },
        Module {
            path: libc.to_path_buf(),
            bias: puts_rt - puts_link,
            ranges: vec![],
        },
    ]);
    sym.show_below_main = show_below_main;
    let compared = compare_log(
        &log,
        &mut sym,
        if fullpath { &full_text } else { &plain_text },
    );
    // make+leaf inlined, mid, main, strdup and the start-up code in libc.
    assert!(
        compared >= 12,
        "too few frames compared ({compared}):\n{log}"
    );
    assert!(fullpath || (log.contains("make (leak.c:7)") && log.contains("strdup (strdup.c:")));
    assert!(!fullpath || log.contains("strdup (string/./string/strdup.c:"));
    assert_eq!(log.contains("(below main)"), !show_below_main);
}

const LEAK_RS: &str = r#"mod inner {
    pub struct Thing<T>(pub T);
    impl<T: Clone> Thing<T> {
        #[inline(never)]
        pub fn make(&self) -> &'static mut Vec<T> {
            Box::leak(Box::new(vec![self.0.clone(); 3]))
        }
    }
}
fn main() {
    println!("main={:p}", main as fn());
    let t = inner::Thing(5u32);
    let v = t.make();
    println!("{}", v.len());
}
"#;

/// Rust names (legacy mangling without the hash, std's v0 names), rustc's relative file
/// paths and DW_AT_name-named inlined frames, as Valgrind prints them for a Rust program.
#[test]
fn describe_matches_valgrind_for_a_rust_program() {
    if !valgrind_available() {
        eprintln!("skipped: valgrind not installed");
        return;
    }
    let dir = common::scratch("vg-rs");
    let src = dir.join("leak.rs");
    std::fs::write(&src, LEAK_RS).expect("write leak.rs");
    let exe = dir.join("leak");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let st = Command::new(rustc)
        .args(["-g", "-C", "opt-level=0", "--edition", "2021", "-o"])
        .arg(&exe)
        .arg(&src)
        .current_dir(&dir)
        .status()
        .expect("rustc");
    assert!(st.success());
    let log = dir.join("vg.log");
    let out = Command::new("valgrind")
        .args([
            "--tool=memcheck",
            "--leak-check=full",
            "--show-leak-kinds=all",
            "--num-callers=40",
        ])
        .arg(format!("--log-file={}", log.display()))
        .arg(&exe)
        .output()
        .expect("run valgrind");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = std::fs::read_to_string(&log).expect("valgrind log");
    let main_rt = stdout
        .lines()
        .find_map(|l| l.strip_prefix("main=0x"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .expect("program printed main");
    let nm = Command::new("nm").arg(&exe).output().expect("nm");
    let main_link = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .find_map(|l| {
            let mut it = l.split_whitespace();
            let (a, _, n) = (it.next()?, it.next()?, it.next()?);
            (n.starts_with("_ZN4leak4main")).then(|| u64::from_str_radix(a, 16).ok())?
        })
        .expect("leak::main in nm");
    let mut sym = Symbolizer::new(vec![Module {
        path: exe.clone(),
        bias: main_rt - main_link,
        ranges: vec![],
    }]);
    let known: Vec<(u64, u64)> = sym.modules().flat_map(|m| m.ranges.clone()).collect();
    let vg = frames(&log);
    let (mut compared, mut i) = (0, 0);
    while i < vg.len() {
        let addr = vg[i].0;
        let run = vg[i..].iter().take_while(|f| f.0 == addr).count();
        if known.iter().any(|&(s, e)| s <= addr && addr < e) {
            let ours: Vec<String> = sym
                .describe(addr)
                .iter()
                .map(|f| f.to_string().split_once(": ").unwrap().1.to_string())
                .collect();
            let theirs: Vec<String> = vg[i..i + run].iter().map(|f| f.1.clone()).collect();
            assert_eq!(ours, theirs, "at 0x{addr:X}\n{log}");
            compared += run;
        }
        i += run;
    }
    assert!(
        log.contains("leak::inner::Thing<T>::make (leak.rs:6)"),
        "{log}"
    );
    assert!(
        compared >= 10,
        "too few frames compared ({compared}):\n{log}"
    );
}

/// Compares every frame of `log` that lies in one of `sym`'s objects; returns how many.
fn compare_log(log: &str, sym: &mut Symbolizer, render: &dyn Fn(&Frame) -> String) -> usize {
    let known: Vec<(u64, u64)> = sym.modules().flat_map(|m| m.ranges.clone()).collect();
    let vg = frames(log);
    let (mut compared, mut i) = (0, 0);
    while i < vg.len() {
        let addr = vg[i].0;
        let run = vg[i..].iter().take_while(|f| f.0 == addr).count();
        if known.iter().any(|&(s, e)| s <= addr && addr < e) {
            let ours: Vec<String> = sym.describe(addr).iter().map(render).collect();
            let theirs: Vec<String> = vg[i..i + run].iter().map(|f| f.1.clone()).collect();
            assert_eq!(ours, theirs, "at 0x{addr:X}\n{log}");
            compared += run;
        }
        i += run;
    }
    compared
}

/// Valgrind's default frame text, after `0xADDR: `.
fn plain_text(f: &Frame) -> String {
    f.to_string().split_once(": ").unwrap().1.to_string()
}

/// The frame text with `--fullpath-after=`: `DIR/FILE:LINE`, a leading `./` removed.
fn full_text(f: &Frame) -> String {
    match (&f.dir, &f.file) {
        (Some(dir), Some(file)) if f.line > 0 => {
            let path = format!("{dir}/{file}");
            let path = path.strip_prefix("./").unwrap_or(&path);
            format!(
                "{} ({path}:{})",
                f.function.as_deref().unwrap_or("???"),
                f.line
            )
        }
        _ => plain_text(f),
    }
}

/// Link-time address of the first symbol `nm [args] path` lists with a name accepted by `pick`.
fn nm_addr(args: &[&str], path: &Path, pick: impl Fn(&str) -> bool) -> u64 {
    let nm = Command::new("nm")
        .args(args)
        .arg(path)
        .output()
        .expect("nm");
    String::from_utf8_lossy(&nm.stdout)
        .lines()
        .find_map(|l| {
            let mut it = l.split_whitespace();
            let (a, _, n) = (it.next()?, it.next()?, it.next()?);
            pick(n).then(|| u64::from_str_radix(a, 16).ok())?
        })
        .unwrap_or_else(|| panic!("symbol not found by nm in {}", path.display()))
}

const LEAK_CC: &str = r#"#include <dlfcn.h>
#include <cstdio>
#include <map>
#include <string>
#include <vector>
namespace {
struct Node { std::string name; std::vector<int> v; };
__attribute__((noinline)) Node *anon_make(const char *s) { return new Node{s, {1, 2, 3}}; }
}
namespace app {
template <class K, class V> struct Registry {
    std::map<K, V> *m = new std::map<K, V>;
    __attribute__((noinline)) void put(const K &k, const V &v) { (*m)[k] = v; }
};
}
int main() {
    std::printf("cxa=%p\n", dlsym(RTLD_DEFAULT, "__cxa_begin_catch"));
    auto lambda = [](int n) { return new std::vector<long>(n); };
    auto *r = new app::Registry<std::string, int>;
    r->put(std::string(40, 'k'), 1);
    anon_make("a fairly long string that does not fit in the SSO buffer");
    lambda(7);
    return 0;
}
"#;

/// C++ names (templates, `[abi:cxx11]`, anonymous namespaces, lambdas, operators) and
/// libstdc++'s inlined frames, as Valgrind prints them.
#[test]
fn describe_matches_valgrind_for_a_cpp_program() {
    if !valgrind_available() {
        eprintln!("skipped: valgrind not installed");
        return;
    }
    let dir = common::scratch("vg-cc");
    let exe = common::compile(
        &dir,
        "g++",
        "leak",
        "cc",
        LEAK_CC,
        &["-O1", "-g", "-no-pie"],
        "leak",
    );
    let log = dir.join("vg.log");
    let out = Command::new("valgrind")
        .args([
            "--tool=memcheck",
            "--leak-check=full",
            "--show-leak-kinds=all",
            "--num-callers=40",
        ])
        .arg(format!("--log-file={}", log.display()))
        .arg(&exe)
        .output()
        .expect("run valgrind");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = std::fs::read_to_string(&log).expect("valgrind log");
    let cxa_rt = stdout
        .lines()
        .find_map(|l| l.strip_prefix("cxa=0x"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .expect("program printed __cxa_begin_catch");
    let libstdcxx = Path::new("/usr/lib/x86_64-linux-gnu/libstdc++.so.6");
    let cxa_link = nm_addr(&["-D"], libstdcxx, |n| {
        n == "__cxa_begin_catch" || n.starts_with("__cxa_begin_catch@")
    });
    let mut sym = Symbolizer::new(vec![
        Module {
            path: exe.clone(),
            bias: 0,
            ranges: vec![],
        },
        Module {
            path: libstdcxx.to_path_buf(),
            bias: cxa_rt - cxa_link,
            ranges: vec![],
        },
    ]);
    let compared = compare_log(&log, &mut sym, &plain_text);
    assert!(log.contains("anon_make"), "{log}");
    assert!(
        compared >= 10,
        "too few frames compared ({compared}):\n{log}"
    );
}
