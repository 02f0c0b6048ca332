//! Shared helpers: compiling small C/C++ objects at test time and loading them.
#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::process::Command;

extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *const c_char;
    /// glibc's `backtrace` (libgcc's unwinder): the oracle the captures are compared with.
    pub fn backtrace(buffer: *mut *mut c_void, size: c_int) -> c_int;
}

const RTLD_NOW: c_int = 2;

/// A fresh directory for this test process's build products.
/// Directories of earlier test processes that have exited are removed on the way.
pub fn scratch(tag: &str) -> PathBuf {
    let root = std::env::temp_dir().join("oxgrind-symbols-tests");
    if let Ok(entries) = std::fs::read_dir(&root) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name.split('-').next().unwrap_or("");
            if !pid.is_empty() && !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let dir = root.join(format!("{}-{}", std::process::id(), tag));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Compiles `source` with `compiler` (`gcc`/`g++`) and `flags` into `dir/out`.
pub fn compile(
    dir: &Path,
    compiler: &str,
    name: &str,
    ext: &str,
    source: &str,
    flags: &[&str],
    out: &str,
) -> PathBuf {
    let src = dir.join(format!("{name}.{ext}"));
    std::fs::write(&src, source).expect("write source");
    let out = dir.join(out);
    let status = Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(
        status.success(),
        "{compiler} {flags:?} {} failed",
        src.display()
    );
    out
}

pub struct Lib(*mut c_void);

impl Lib {
    pub fn open(path: &Path) -> Lib {
        let p = CString::new(path.to_str().expect("utf-8 path")).expect("no NUL");
        // SAFETY: p is a valid C string; the library is ours, built for this test.
        let h = unsafe { dlopen(p.as_ptr(), RTLD_NOW) };
        if h.is_null() {
            // SAFETY: dlerror returns a C string after a failed dlopen.
            let msg = unsafe { std::ffi::CStr::from_ptr(dlerror()) };
            panic!("dlopen {}: {msg:?}", path.display());
        }
        Lib(h)
    }

    pub fn sym(&self, name: &str) -> *mut c_void {
        let n = CString::new(name).expect("no NUL");
        // SAFETY: the handle is open and n a valid C string.
        let p = unsafe { dlsym(self.0, n.as_ptr()) };
        assert!(!p.is_null(), "symbol {name} missing");
        p
    }
}

/// glibc `backtrace()` as return addresses.
#[inline(never)]
pub fn glibc_backtrace() -> Vec<u64> {
    let mut buf = [std::ptr::null_mut::<c_void>(); 256];
    // SAFETY: buf holds 256 pointers.
    let n = unsafe { backtrace(buf.as_mut_ptr(), 256) };
    buf[..n.max(0) as usize].iter().map(|&p| p as u64).collect()
}
