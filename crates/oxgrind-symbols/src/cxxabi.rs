//! C++ demangling with the exact text Valgrind prints.
//!
//! Valgrind demangles with its bundled copy of libiberty's `cp-demangle.c`
//! (`DMGL_ANSI | DMGL_PARAMS`, no `DMGL_VERBOSE`: `std::string`, not
//! `std::basic_string<char, ...>`). The pure-Rust `cpp_demangle` differs from it on about 7%
//! of libstdc++'s own symbols (substitution spelling, and a few outright losses of
//! parameters), so names are demangled by the same libiberty code as shipped in libstdc++
//! (`__cxa_demangle`, which applies `DMGL_PARAMS` and no `DMGL_VERBOSE` too). It is looked
//! up in the process first and otherwise loaded with `dlopen("libstdc++.so.6")`, once, on the
//! first C++ name; without libstdc++ the caller falls back to `cpp_demangle`.
//!
//! Report time only: `dlopen`/`dlsym` take the loader's lock and `__cxa_demangle` calls
//! `malloc`, so never from an allocation hook or a signal handler that may have interrupted
//! the loader. Call [`prepare`] beforehand when the report may be written from such a place.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

type CxaDemangle =
    unsafe extern "C" fn(*const c_char, *mut c_char, *mut usize, *mut c_int) -> *mut c_char;

extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn free(p: *mut c_void);
}

const RTLD_LAZY: c_int = 1;
const RTLD_LOCAL: c_int = 0;

static CXA: OnceLock<Option<CxaDemangle>> = OnceLock::new();

fn resolve() -> Option<CxaDemangle> {
    let name = c"__cxa_demangle";
    // SAFETY: RTLD_DEFAULT (null) and a NUL-terminated name are valid dlsym arguments.
    let mut p = unsafe { dlsym(std::ptr::null_mut(), name.as_ptr()) };
    if p.is_null() {
        // SAFETY: a NUL-terminated library name; the handle is kept for the process life.
        let h = unsafe { dlopen(c"libstdc++.so.6".as_ptr(), RTLD_LAZY | RTLD_LOCAL) };
        if !h.is_null() {
            // SAFETY: h is a live handle from dlopen.
            p = unsafe { dlsym(h, name.as_ptr()) };
        }
    }
    // SAFETY: `__cxa_demangle` has this signature in the Itanium C++ ABI.
    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, CxaDemangle>(p) })
}

/// Looks up the demangler now (see the module docs for when this matters). Returns whether
/// libiberty's demangler is available.
pub fn prepare() -> bool {
    CXA.get_or_init(resolve).is_some()
}

/// libiberty's demangling of an Itanium name (`_Z...`), or `None` when it is not one or no
/// libstdc++ is available.
pub fn cxa_demangle(mangled: &str) -> Option<String> {
    // __cxa_demangle also accepts bare type encodings ("i" -> "int"): only offer symbols.
    if !mangled.starts_with("_Z") {
        return None;
    }
    let f = (*CXA.get_or_init(resolve))?;
    let c = CString::new(mangled).ok()?;
    let mut status: c_int = 0;
    // SAFETY: c is NUL-terminated; a null output buffer asks __cxa_demangle to malloc one.
    let out = unsafe {
        f(
            c.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut status,
        )
    };
    if out.is_null() {
        return None;
    }
    // SAFETY: on success out is a NUL-terminated string that __cxa_demangle malloc'ed.
    let s = unsafe { CStr::from_ptr(out) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: out came from malloc inside __cxa_demangle and is freed once.
    unsafe { free(out.cast()) };
    (status == 0).then_some(s)
}
