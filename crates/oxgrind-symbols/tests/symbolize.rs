//! Symbolication of real objects built at test time: inline expansion, C++ demangling,
//! symbol-table fallbacks, separate debug files, explicit module lists.

mod common;

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use oxgrind_symbols::{capture, Module, Symbolizer};

static LAST: Mutex<Vec<u64>> = Mutex::new(Vec::new());

extern "C" fn record(x: c_int) -> c_int {
    let mut buf = [0u64; 32];
    let n = capture(&mut buf, (0, 0));
    *LAST.lock().unwrap() = buf[..n].to_vec();
    x
}

type CbFn = unsafe extern "C" fn(c_int, extern "C" fn(c_int) -> c_int) -> c_int;

/// Builds `source` into a shared library, calls `entry(x, record)` and returns the return
/// addresses captured above `record`.
fn call_and_capture(
    tag: &str,
    compiler: &str,
    ext: &str,
    source: &str,
    flags: &[&str],
    entry: &str,
) -> (PathBuf, Vec<u64>) {
    let dir = common::scratch(tag);
    let mut all = vec!["-fPIC", "-shared"];
    all.extend_from_slice(flags);
    let so = common::compile(
        &dir,
        compiler,
        tag,
        ext,
        source,
        &all,
        &format!("lib{tag}.so"),
    );
    let ras = capture_through(&so, entry);
    (so, ras)
}

/// Loads the shared library `so` (never unloaded), calls its `entry(x, record)` and returns
/// the return addresses captured above `record`. One test at a time: `record` leaves its
/// capture in the one `LAST`.
fn capture_through(so: &Path, entry: &str) -> Vec<u64> {
    static SERIAL: Mutex<()> = Mutex::new(());
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lib = common::Lib::open(so);
    // As the runtime's dlopen hook does: without it, a capture within the unwinder's
    // refresh interval of another test's (tests run in parallel) does not know the new
    // object yet and walks it by frame pointers only, which -O2 code has not.
    oxgrind_symbols::invalidate();
    // SAFETY: every test source defines `entry` with the CbFn signature.
    let f = unsafe { std::mem::transmute::<*mut std::ffi::c_void, CbFn>(lib.sym(entry)) };
    // SAFETY: record matches the callback type.
    unsafe { f(1, record) };
    let ras = LAST.lock().unwrap().clone();
    ras[1..].to_vec()
}

const INLINE_C: &str = r#"typedef int (*cb_t)(int);
volatile int sink;
static inline __attribute__((always_inline)) int helper(cb_t cb, int x) {
    int r = cb(x * 3);
    sink += r;
    return r;
}
__attribute__((noinline)) int outer(int x, cb_t cb) {
    int r = helper(cb, x + 1);
    sink += 2;
    return r;
}
"#;

#[test]
fn inlined_calls_expand_innermost_first_with_call_site_lines() {
    let (so, ras) = call_and_capture("inl", "gcc", "c", INLINE_C, &["-O2", "-g"], "outer");
    let mut sym = Symbolizer::from_self();
    let ip = ras[0] - 1;
    let frames = sym.describe(ip);
    let text: Vec<String> = frames.iter().map(|f| f.to_string()).collect();
    assert_eq!(
        text,
        vec![
            format!("0x{ip:X}: helper (inl.c:4)"),
            format!("0x{ip:X}: outer (inl.c:9)")
        ]
    );
    assert!(frames.iter().all(|f| f.object.as_deref() == so.to_str()));
    assert_eq!(frames[0].dir.as_deref(), so.parent().and_then(Path::to_str));
}

const CPP: &str = r#"#include <vector>
typedef int (*cb_t)(int);
namespace ns {
template <class T> struct Holder {
    __attribute__((noinline)) static int hold(std::vector<T>& v, cb_t cb) {
        int r = cb((int)v.size());
        v.push_back(T());
        return r;
    }
};
}
extern "C" int cpp_entry(int x, cb_t cb) {
    std::vector<int> v(x);
    return ns::Holder<int>::hold(v, cb) + 1;
}
"#;

#[test]
fn cpp_names_are_demangled_like_cxxfilt_no_verbose_and_mangled_kept() {
    let (so, ras) = call_and_capture("cpp", "g++", "cc", CPP, &["-O0", "-g"], "cpp_entry");
    let nm = Command::new("nm").arg(&so).output().expect("nm");
    let nm = String::from_utf8_lossy(&nm.stdout);
    let mangled = nm
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .find(|n| n.contains("Holder") && n.contains("hold"))
        .expect("mangled hold symbol")
        .to_string();
    let filt = Command::new("c++filt")
        .arg(&mangled)
        .output()
        .expect("c++filt");
    let want = String::from_utf8_lossy(&filt.stdout).trim().to_string();

    let mut sym = Symbolizer::from_self();
    let frames = sym.describe(ras[0] - 1);
    let f = frames.last().unwrap();
    assert_eq!(f.function.as_deref(), Some(want.as_str()));
    assert_eq!(f.mangled.as_deref(), Some(mangled.as_str()));
    assert_eq!(f.file.as_deref(), Some("cpp.cc"));
    assert_eq!(f.line, 6);
    let entry = sym.describe(ras[1] - 1);
    assert_eq!(entry.last().unwrap().function.as_deref(), Some("cpp_entry"));
    assert_eq!(entry.last().unwrap().mangled, None);
}

const PLAIN_C: &str = r#"typedef int (*cb_t)(int);
volatile int sink;
__attribute__((noinline)) static int hidden(int x, cb_t cb) { int r = cb(x); sink += r; return r; }
__attribute__((noinline)) int exported(int x, cb_t cb) { int r = hidden(x, cb); sink += r; return r; }
"#;

#[test]
fn without_dwarf_the_symbol_table_names_the_function_and_object() {
    let (so, ras) = call_and_capture("nodw", "gcc", "c", PLAIN_C, &["-O2"], "exported");
    let mut sym = Symbolizer::from_self();
    let obj = so.to_str().unwrap();
    let ip = ras[0] - 1;
    assert_eq!(
        sym.describe(ip)[0].to_string(),
        format!("0x{ip:X}: hidden (in {obj})")
    );
    let ip1 = ras[1] - 1;
    assert_eq!(
        sym.describe(ip1)[0].to_string(),
        format!("0x{ip1:X}: exported (in {obj})")
    );
}

#[test]
fn stripped_objects_fall_back_to_dynsym_then_question_marks() {
    let dir = common::scratch("strip");
    let so = common::compile(
        &dir,
        "gcc",
        "strip",
        "c",
        PLAIN_C,
        &["-O2", "-fPIC", "-shared", "-s"],
        "libstrip.so",
    );
    let ras = capture_through(&so, "exported");
    let mut sym = Symbolizer::from_self();
    let obj = so.to_str().unwrap();
    let ip = ras[0] - 1;
    assert_eq!(
        sym.describe(ip)[0].to_string(),
        format!("0x{ip:X}: ??? (in {obj})")
    );
    let ip1 = ras[1] - 1;
    assert_eq!(
        sym.describe(ip1)[0].to_string(),
        format!("0x{ip1:X}: exported (in {obj})")
    );
}

#[test]
fn unknown_addresses_are_question_marks() {
    let mut sym = Symbolizer::new(Vec::new());
    assert_eq!(sym.describe(0x1234)[0].to_string(), "0x1234: ???");
}

const EXE_C: &str = r#"#include <stdio.h>
int helper(int x) { return x * 2; }
int main(void) {
    int r = helper(3);
    printf("%d\n", r);
    return 0;
}
"#;

#[test]
fn explicit_module_list_symbolizes_offline() {
    let dir = common::scratch("exe");
    let exe = common::compile(
        &dir,
        "gcc",
        "prog",
        "c",
        EXE_C,
        &["-O0", "-g", "-no-pie"],
        "prog",
    );
    let nm = Command::new("nm").arg(&exe).output().expect("nm");
    let nm = String::from_utf8_lossy(&nm.stdout);
    let addr_of = |name: &str| {
        nm.lines()
            .find_map(|l| {
                let mut it = l.split_whitespace();
                let (a, _, n) = (it.next()?, it.next()?, it.next()?);
                (n == name).then(|| u64::from_str_radix(a, 16).ok())?
            })
            .expect("symbol in nm")
    };
    let mut sym = Symbolizer::new(vec![Module {
        path: exe.clone(),
        bias: 0,
        ranges: vec![],
    }]);
    let helper = addr_of("helper");
    assert_eq!(
        sym.describe(helper)[0].to_string(),
        format!("0x{helper:X}: helper (prog.c:2)")
    );
    // Same object loaded elsewhere (a PIE at a bias) shifts every address.
    let mut shifted = Symbolizer::new(vec![Module {
        path: exe.clone(),
        bias: 0x1000_0000,
        ranges: vec![],
    }]);
    let f = &shifted.describe(helper + 0x1000_0000)[0];
    assert_eq!((f.function.as_deref(), f.line), (Some("helper"), 2));
    assert_eq!(
        sym.raw_function_name(addr_of("main") + 1).as_deref(),
        Some("main")
    );
}

#[test]
fn libc_is_described_from_its_build_id_debug_file() {
    extern "C" {
        fn strdup(s: *const std::ffi::c_char) -> *mut std::ffi::c_char;
    }
    let libc = Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6");
    let out = Command::new("readelf")
        .arg("-n")
        .arg(libc)
        .output()
        .expect("readelf");
    let notes = String::from_utf8_lossy(&out.stdout);
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("libc build id")
        .to_string();
    let debug = PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &id[..2],
        &id[2..]
    ));
    if !debug.is_file() {
        eprintln!("skipped: no libc6-dbg ({} missing)", debug.display());
        return;
    }
    let mut sym = Symbolizer::from_self();
    let ip = strdup as unsafe extern "C" fn(*const std::ffi::c_char) -> *mut std::ffi::c_char
        as usize as u64;
    let f = sym.describe(ip).pop().unwrap();
    assert_eq!(f.function.as_deref(), Some("strdup"));
    assert_eq!(f.file.as_deref(), Some("strdup.c"));
    assert!(f.line > 0);
    assert_eq!(f.object.as_deref(), Some(libc.to_str().unwrap()));
}

/// The inflated copies of libc's compressed debug sections are written to the cache on the
/// first load, mapped on the next, and name frames exactly as inflating does.
#[test]
fn inflated_debug_sections_are_cached_and_read_back() {
    extern "C" {
        fn strdup(s: *const std::ffi::c_char) -> *mut std::ffi::c_char;
    }
    let ip = strdup as unsafe extern "C" fn(*const std::ffi::c_char) -> *mut std::ffi::c_char
        as usize as u64;
    let plain = Symbolizer::from_self().describe(ip);
    if plain.last().and_then(|f| f.file.as_deref()) != Some("strdup.c") {
        eprintln!("skipped: no libc6-dbg");
        return;
    }
    let dir = std::env::temp_dir().join(format!("oxgrind-section-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut first = Symbolizer::from_self();
    first.set_section_cache(&dir);
    assert_eq!(first.describe(ip), plain);
    let cached: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("cache directory made")
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|e| e.unwrap().path())
        .collect();
    let names: Vec<String> = cached
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(names.contains(&"debug_info".to_string()), "{names:?}");
    assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
    // A truncated copy is not used: the section is inflated (and stored) again.
    let info = cached.iter().find(|p| p.ends_with("debug_info")).unwrap();
    let len = std::fs::metadata(info).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(info)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let mut second = Symbolizer::from_self();
    second.set_section_cache(&dir);
    assert_eq!(second.describe(ip), plain);
    assert_eq!(std::fs::metadata(info).unwrap().len(), len);
    let mut third = Symbolizer::from_self();
    third.set_section_cache(&dir);
    assert_eq!(third.describe(ip), plain);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn demangling_matches_libiberty_on_libstdcxx_symbols() {
    use std::io::Write;
    let lib = Path::new("/usr/lib/x86_64-linux-gnu/libstdc++.so.6");
    let nm = Command::new("nm")
        .arg("-D")
        .arg(lib)
        .output()
        .expect("nm -D libstdc++");
    let names: Vec<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|n| n.starts_with("_Z"))
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .collect();
    assert!(names.len() > 1000, "too few C++ symbols: {}", names.len());
    let mut child = Command::new("c++filt")
        .arg("-i")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("c++filt");
    // Feed stdin from another thread: c++filt answers line by line, and a full stdout pipe
    // would otherwise block both sides.
    let mut stdin = child.stdin.take().unwrap();
    let input = names.join("\n");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("c++filt output");
    writer
        .join()
        .expect("writer thread")
        .expect("write to c++filt");
    let want: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(want.len(), names.len());
    let bad: Vec<String> = names
        .iter()
        .zip(&want)
        .filter(|(n, w)| oxgrind_symbols::demangle(n) != w.as_str())
        .map(|(n, w)| {
            format!(
                "{n}: ours {:?}, c++filt {w:?}",
                oxgrind_symbols::demangle(n)
            )
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{} of {} differ, e.g. {:?}",
        bad.len(),
        names.len(),
        &bad[..bad.len().min(3)]
    );
}

#[inline(never)]
fn described_after_many_others(x: u64) -> u64 {
    x.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17)
}

/// The symbolizer keeps a bounded number of descriptions (it empties its memo when full):
/// an address described again after more than that many others is described as the first
/// time.
#[test]
fn an_address_described_after_many_others_is_described_the_same() {
    let mut sym = Symbolizer::from_self();
    let ip = described_after_many_others as usize as u64;
    assert_eq!(
        described_after_many_others(1),
        0x9E37_79B9_7F4A_7C15u64.rotate_left(17)
    );
    let first = sym.describe(ip);
    assert!(
        first.iter().any(|f| f
            .function
            .as_deref()
            .is_some_and(|n| n.contains("described_after_many_others"))),
        "{first:?}"
    );
    // More distinct addresses than the memo holds (1 << 16), in this test's own code.
    for k in 1..=70_000u64 {
        sym.describe(ip.wrapping_sub(k * 16));
    }
    assert_eq!(sym.describe(ip), first);
}
