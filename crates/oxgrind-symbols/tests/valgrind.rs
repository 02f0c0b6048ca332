//! The frame text of `Symbolizer::describe` against what Valgrind 3.19 prints for the same
//! addresses: a small leaking program runs under memcheck, then each of its stack frames
//! that lies in the program or in libc is described offline and compared line for line
//! (inlined expansions included).

mod common;

use std::path::Path;
use std::process::Command;

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
    compare_with_valgrind(false);
}

#[test]
fn describe_matches_valgrind_with_show_below_main() {
    compare_with_valgrind(true);
}

fn compare_with_valgrind(show_below_main: bool) {
    if !valgrind_available() {
        eprintln!("skipped: valgrind not installed");
        return;
    }
    let dir = common::scratch(if show_below_main { "vg-sbm" } else { "vg" });
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
    let known: Vec<(u64, u64)> = sym.modules().flat_map(|m| m.ranges.clone()).collect();

    let vg = frames(&log);
    let mut compared = 0;
    let mut i = 0;
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
    // make+leaf inlined, mid, main, strdup and the start-up code in libc.
    assert!(
        compared >= 12,
        "too few frames compared ({compared}):\n{log}"
    );
    assert!(log.contains("make (leak.c:7)") && log.contains("strdup (strdup.c:"));
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
