//! Function replacement: glibc's and the dynamic loader's string and memory functions run as
//! our checked versions (`replace.c`) under the translation engine, as Valgrind's Memcheck
//! replaces them (`vg_replace_strmem.c`).
//!
//! Why by address, under the engine, and not by symbol interposition alone: glibc calls its
//! own `strlen` & co. internally, through IFUNC-resolved slots that our preloaded library
//! cannot interpose, and the dynamic loader has its own copies; Valgrind, which runs from
//! the first instruction, catches the IFUNC resolution instead. We start later, when every
//! slot already points at one variant (`__strlen_evex`, `__memmove_avx_unaligned_erms`), so
//! we redirect every variant: [`prepare`] reads the symbol tables of libc and ld.so (with
//! their separate debug files, where the variants' names are) once, before the engine
//! starts, into a sorted table; [`redirect`] is a binary search, asked by the engine at each
//! block start it translates.
//!
//! The replacements live in their own section, which, unlike the rest of our library, the
//! tool instruments ([`contains`]): their accesses are the program's, so an overrun in
//! `strlen` is reported inside `strlen`, with the access Valgrind's replacement makes.
//! The string functions are replaced for tools that check them (`Needs::check_overlaps`:
//! Memcheck). The same table sends the program's own `operator new`/`delete` and `malloc`
//! family definitions to ours, as Valgrind replaces them ([`own_allocator_replacements`]),
//! for every tool that sees the heap under the engine (Memcheck, DHAT, Massif: rustc's
//! jemalloc `malloc` is its executable's own); what those allocators made before we
//! started goes back to them ([`early_original`]).

use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

mod native;

use oxgrind_tool::AllocFn;

extern "C" {
    fn oxgrind_replace_strlen();
    fn oxgrind_replace_strnlen();
    fn oxgrind_replace_index();
    fn oxgrind_replace_strchrnul();
    fn oxgrind_replace_rindex();
    fn oxgrind_replace_memchr();
    fn oxgrind_replace_rawmemchr();
    fn oxgrind_replace_memrchr();
    fn oxgrind_replace_strcmp();
    fn oxgrind_replace_strncmp();
    fn oxgrind_replace_bcmp();
    fn oxgrind_replace_strstr();
    fn oxgrind_replace_strspn();
    fn oxgrind_replace_strcspn();
    fn oxgrind_replace_strpbrk();
    fn oxgrind_replace_memmove();
    fn oxgrind_replace_memmove_chk();
    fn oxgrind_replace_mempcpy();
    fn oxgrind_replace_mempcpy_chk();
    fn oxgrind_replace_memset();
    fn oxgrind_replace_memset_chk();
    fn oxgrind_replace_strcpy();
    fn oxgrind_replace_stpcpy();
    fn oxgrind_replace_strncpy();
    fn oxgrind_replace_stpncpy();
    fn oxgrind_replace_strcat();
    fn oxgrind_replace_strncat();
    fn oxgrind_replace_wcslen();
    fn oxgrind_replace_wcsnlen();
    fn oxgrind_replace_wcscmp();
    fn oxgrind_replace_wcscpy();
    fn oxgrind_replace_wcschr();
    fn oxgrind_replace_wcsrchr();
    fn oxgrind_replace_wmemchr();
    static __start_oxgrind_replace: u8;
    static __stop_oxgrind_replace: u8;
}

/// glibc's function names (without leading underscores and variant suffixes) and what
/// replaces them. `memcpy` is `memmove`: glibc's share their code, so one address may be
/// either (Valgrind 3.19 does not report memcpy overlaps on amd64 either).
const REPLACEMENTS: &[(&str, unsafe extern "C" fn())] = &[
    ("strlen", oxgrind_replace_strlen),
    ("strnlen", oxgrind_replace_strnlen),
    ("strchr", oxgrind_replace_index),
    ("index", oxgrind_replace_index),
    ("strchrnul", oxgrind_replace_strchrnul),
    ("strrchr", oxgrind_replace_rindex),
    ("rindex", oxgrind_replace_rindex),
    ("memchr", oxgrind_replace_memchr),
    ("rawmemchr", oxgrind_replace_rawmemchr),
    ("memrchr", oxgrind_replace_memrchr),
    ("strcmp", oxgrind_replace_strcmp),
    ("strncmp", oxgrind_replace_strncmp),
    ("memcmp", oxgrind_replace_bcmp),
    ("bcmp", oxgrind_replace_bcmp),
    ("memcmpeq", oxgrind_replace_bcmp),
    ("strstr", oxgrind_replace_strstr),
    ("strspn", oxgrind_replace_strspn),
    ("strcspn", oxgrind_replace_strcspn),
    ("strpbrk", oxgrind_replace_strpbrk),
    ("memmove", oxgrind_replace_memmove),
    ("memcpy", oxgrind_replace_memmove),
    ("memmove_chk", oxgrind_replace_memmove_chk),
    ("memcpy_chk", oxgrind_replace_memmove_chk),
    ("mempcpy", oxgrind_replace_mempcpy),
    ("mempcpy_chk", oxgrind_replace_mempcpy_chk),
    ("memset", oxgrind_replace_memset),
    ("memset_chk", oxgrind_replace_memset_chk),
    ("strcpy", oxgrind_replace_strcpy),
    ("stpcpy", oxgrind_replace_stpcpy),
    ("strncpy", oxgrind_replace_strncpy),
    ("stpncpy", oxgrind_replace_stpncpy),
    ("strcat", oxgrind_replace_strcat),
    ("strncat", oxgrind_replace_strncat),
    ("wcslen", oxgrind_replace_wcslen),
    ("wcsnlen", oxgrind_replace_wcsnlen),
    ("wcscmp", oxgrind_replace_wcscmp),
    ("wcscpy", oxgrind_replace_wcscpy),
    ("wcschr", oxgrind_replace_wcschr),
    ("wcsrchr", oxgrind_replace_wcsrchr),
    ("wmemchr", oxgrind_replace_wmemchr),
];

/// The words glibc's variant names are made of (`__memmove_avx512_unaligned_erms`,
/// `__strchr_sse2_no_bsf`, `__strcspn_generic`). A name with any other word after the
/// function's (`__strcspn_c1`, `__mempcpy_small`: other signatures; `__memrchr_ifunc`: a
/// resolver) is not the function.
const VARIANT_WORDS: &[&str] = &[
    "sse2",
    "ssse3",
    "sse4",
    "sse42",
    "1",
    "2",
    "avx",
    "avx2",
    "avx512",
    "evex",
    "evex512",
    "rtm",
    "erms",
    "unaligned",
    "movbe",
    "no",
    "bsf",
    "vzeroupper",
    "generic",
];

/// The replacement for the function named `name` (a symbol of libc or ld.so), if any.
fn replacement_for(name: &str) -> Option<u64> {
    let name = name.split('@').next().unwrap_or(name);
    let bare = name.trim_start_matches('_');
    let bare = bare.strip_prefix("GI_").unwrap_or(bare);
    // Longest function name first: `memmove_chk` before `memmove`.
    let mut best: Option<(usize, u64)> = None;
    for &(base, f) in REPLACEMENTS {
        let Some(rest) = bare.strip_prefix(base) else {
            continue;
        };
        let variant = rest.is_empty()
            || rest
                .strip_prefix('_')
                .is_some_and(|r| r.split('_').all(|w| VARIANT_WORDS.contains(&w)));
        if variant && best.is_none_or(|(len, _)| base.len() > len) {
            best = Some((base.len(), f as *const () as usize as u64));
        }
    }
    best.map(|(_, f)| f)
}

/// C++'s replaceable allocation functions, by mangled name (each of which we define).
pub(crate) const CXX_ALLOCATION_FUNCTIONS: [&str; 20] = [
    "_Znwm",
    "_Znam",
    "_ZnwmRKSt9nothrow_t",
    "_ZnamRKSt9nothrow_t",
    "_ZnwmSt11align_val_t",
    "_ZnamSt11align_val_t",
    "_ZnwmSt11align_val_tRKSt9nothrow_t",
    "_ZnamSt11align_val_tRKSt9nothrow_t",
    "_ZdlPv",
    "_ZdaPv",
    "_ZdlPvm",
    "_ZdaPvm",
    "_ZdlPvSt11align_val_t",
    "_ZdaPvSt11align_val_t",
    "_ZdlPvmSt11align_val_t",
    "_ZdaPvmSt11align_val_t",
    "_ZdlPvRKSt9nothrow_t",
    "_ZdaPvRKSt9nothrow_t",
    "_ZdlPvSt11align_val_tRKSt9nothrow_t",
    "_ZdaPvSt11align_val_tRKSt9nothrow_t",
];

/// Our definitions of the allocation functions Valgrind replaces in every object but the
/// dynamic loader (its `somalloc` synonym, `m_redir.c`): C++'s operators
/// ([`CXX_ALLOCATION_FUNCTIONS`]) and the malloc family, by name. A program (or a library)
/// may define its own `operator new`/`delete`, or its own `malloc` (rustc links jemalloc
/// into its executable); Valgrind replaces those too, so that every block is seen and its
/// release checked against its allocation. Calls from the main executable to its own
/// definition cannot be interposed (it comes first in the lookup scope), hence the
/// redirection.
fn own_allocator_replacements() -> Vec<(&'static str, u64)> {
    // Our definitions, looked up in our own object: `_Znwm as *const ()` would be the
    // program's when it defines one (exported symbols are preemptible), and redirect its
    // function to itself.
    const USABLE_SIZE: &[u8] = b"malloc_usable_size\0";
    let c_names = crate::instrument::C_ALLOCATION_FUNCTIONS
        .iter()
        .copied()
        .chain(core::iter::once(USABLE_SIZE))
        .filter_map(|n| core::str::from_utf8(&n[..n.len() - 1]).ok());
    CXX_ALLOCATION_FUNCTIONS
        .iter()
        .copied()
        .chain(c_names)
        .filter_map(|n| {
            let name = format!("{n}\0");
            let a = crate::hooks::own_address(name.as_bytes(), 0)?;
            (a != 0).then_some((n, a))
        })
        .collect()
}

/// The functions of an object's own allocator that can be given a block that allocator
/// made before the engine started ([`early_original`]).
const RELEASING: [&str; 5] = ["free", "realloc", "malloc_usable_size", "_ZdlPv", "_ZdaPv"];

/// What an object's own allocator (one defining its own `free`) may have made before the
/// engine started: the writable memory mapped then (glibc's `[heap]` and the stack
/// excepted: blocks there are glibc's or not blocks), and the own definitions of
/// [`RELEASING`] (0 when two objects define the same name: the block's owner is unknown).
struct Early {
    mappings: Vec<(u64, u64)>,
    originals: [u64; RELEASING.len()],
}

static EARLY: AtomicPtr<Early> = AtomicPtr::new(core::ptr::null_mut());

/// The original function named `name` (one of [`RELEASING`]) of the object whose own
/// allocator may have made block `addr` before the engine started, if there is exactly
/// one such object, some object has its own `free`, and `addr` was in memory mapped then.
/// Other libraries' constructors run before ours when the loader's order could not be
/// changed (`init_order.c`; normally ours runs first): rustc's libLLVM then fills its
/// option maps with its own `operator new` (rustc's jemalloc `malloc`) unseen, and deletes
/// them at exit through the `operator delete` we redirect to ours. Such a pointer, which
/// we never saw, is that allocator's block: it goes back to it, natively, unreported.
pub fn early_original(addr: u64, name: &str) -> Option<u64> {
    let e = EARLY.load(Ordering::Acquire);
    if e.is_null() {
        return None;
    }
    // SAFETY: built once in `prepare`, leaked, never changed.
    let e = unsafe { &*e };
    let original = |name: &str| {
        let i = RELEASING.iter().position(|n| *n == name)?;
        Some(e.originals[i]).filter(|&f| f != 0)
    };
    // An object with its own `free` but not its own `operator delete`: the C++ runtime's
    // `delete` gave its blocks back to that `free`.
    let f = original(name)
        .or_else(|| name.starts_with("_Zd").then(|| original("free")).flatten())
        .unwrap_or(0);
    let early = e.mappings.iter().any(|&(lo, hi)| lo <= addr && addr < hi);
    (f != 0 && early).then_some(f)
}

/// The redirection table: (guest address, replacement), sorted by address.
static TABLE: AtomicPtr<Vec<(u64, u64)>> = AtomicPtr::new(core::ptr::null_mut());
/// Whether [`TABLE`] holds glibc's and the loader's string functions (see [`active`]).
static STRINGS: AtomicBool = AtomicBool::new(false);

/// Whether `path` is an object whose functions we replace.
fn replaced_object(path: &std::path::Path) -> bool {
    let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
    file.starts_with("libc.so") || file.starts_with("ld-linux")
}

/// Whether `path` is the C++ runtime (libstdc++, libc++), whose `operator delete` calls
/// `free`.
fn cxx_runtime(path: &std::path::Path) -> bool {
    let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
    file.starts_with("libstdc++.so") || file.starts_with("libc++.so")
}

/// Whether `path` is glibc's `libc_malloc_debug`, whose `malloc` & co. wrap glibc's (as
/// ours do) and are not replaced.
fn glibc_malloc_debug(path: &std::path::Path) -> bool {
    let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
    file.starts_with("libc_malloc_debug")
}

/// Builds the redirection table from the objects loaded now: the objects' own allocation
/// functions, and with `strings` glibc's and the loader's string functions. Call once,
/// before the engine starts (it reads files and allocates: never at translation time, when
/// this thread may hold a lock the symbol reader takes).
pub fn prepare(strings: bool) {
    if !TABLE.load(Ordering::Acquire).is_null() {
        return;
    }
    let Some(maps) = oxgrind_symbols::maps::read_self_maps() else {
        return;
    };
    let mut table = Vec::new();
    let ours = crate::stacks::self_path();
    let operators = own_allocator_replacements();
    let mut originals = [0u64; RELEASING.len()];
    // The objects' own `operator new`s: (start, end, family, our replacement).
    let mut news: Vec<(u64, u64, AllocFn, u64)> = Vec::new();
    for m in oxgrind_symbols::modules_from_maps(&maps) {
        if !replaced_object(&m.path) {
            // Elsewhere (the program, libstdc++, its other libraries) only its own
            // `operator new` and `delete`, never our library's.
            if m.path.to_str() == Some(ours.as_str()) || glibc_malloc_debug(&m.path) {
                continue;
            }
            for s in oxgrind_symbols::symbolize::function_symbols(&m.path) {
                let name = s.name.split('@').next().unwrap_or(&s.name);
                if let Some(&(_, to)) = operators.iter().find(|(n, _)| *n == name) {
                    let addr = s.addr.wrapping_add(m.bias);
                    table.push((addr, to));
                    // The C++ runtime's `operator delete` is `free`, whichever it reaches.
                    let runtime = cxx_runtime(&m.path);
                    if let Some(i) = RELEASING.iter().position(|n| *n == name && !runtime) {
                        // A second object's definition: whose block it is is unknown.
                        originals[i] = if originals[i] == 0 || originals[i] == addr {
                            addr
                        } else {
                            u64::MAX
                        };
                    }
                    if let Some(family) = new_family(name).filter(|_| s.size > 0) {
                        news.push((addr, addr + s.size, family, to));
                    }
                }
            }
            continue;
        }
        if !strings {
            continue;
        }
        for s in oxgrind_symbols::symbolize::function_symbols(&m.path) {
            if s.ifunc {
                continue;
            }
            if let Some(to) = replacement_for(&s.name) {
                table.push((s.addr.wrapping_add(m.bias), to));
            }
        }
    }
    table.sort_unstable();
    table.dedup_by_key(|e| e.0);
    STRINGS.store(strings, Ordering::Release);
    TABLE.store(Box::into_raw(Box::new(table)), Ordering::Release);
    // Only with an own `free`: an own `operator delete` alone gives its blocks to the
    // `free` the program reaches, ours (whose `malloc` saw their allocation), so a pointer
    // we never saw is the program's bug there.
    if !matches!(originals[0], 0 | u64::MAX) {
        let mappings = oxgrind_symbols::maps::parse_maps(&maps)
            .into_iter()
            .filter(|m| m.writable && m.path != b"[heap]" && !m.path.starts_with(b"[stack"))
            .map(|m| (m.start, m.end))
            .collect();
        let originals = originals.map(|f| if f == u64::MAX { 0 } else { f });
        EARLY.store(
            Box::into_raw(Box::new(Early {
                mappings,
                originals,
            })),
            Ordering::Release,
        );
    }
    if !news.is_empty() {
        reattribute_early_blocks(&news);
    }
}

/// Whether `name` (one of [`CXX_ALLOCATION_FUNCTIONS`]) allocates, and for which family.
fn new_family(name: &str) -> Option<AllocFn> {
    if name.starts_with("_Znw") {
        Some(AllocFn::New)
    } else if name.starts_with("_Zna") {
        Some(AllocFn::NewArray)
    } else {
        None
    }
}

/// The blocks the program got before the engine started through its own `operator new`
/// (whose call to `malloc` reached ours: the `new` itself is redirected only from now on)
/// become what Valgrind, which replaces that `new` from the first instruction, made them:
/// blocks of the `new` family, allocated at our `operator new` by the caller of the
/// program's. Otherwise their `delete`, redirected to ours, is a false "Mismatched free".
/// Other libraries' constructors run before ours (nothing depends on a preloaded library):
/// gdb's `operator new` serves libsource-highlight's static constructors that way.
///
/// `news`: the program's own `operator new`s, (start, end, family, our replacement). A
/// `new[]` that tail-calls the program's `new` (gdb's does) leaves no frame of its own:
/// its blocks become `new` blocks, and their `delete[]` a mismatch Valgrind would not
/// report (docs/differences-from-valgrind.md).
fn reattribute_early_blocks(news: &[(u64, u64, AllocFn, u64)]) {
    let (own_lo, own_hi) = crate::stacks::self_text();
    let table = &crate::state::STACKS;
    for block in crate::state::BLOCKS.live_blocks() {
        if block.func.family() != oxgrind_tool::Family::Malloc {
            continue;
        }
        let frames = table.frames(block.stack);
        // Frame 0 is our `malloc`; the first frame outside our library is its caller.
        let Some(i) = frames.iter().position(|&pc| !(own_lo <= pc && pc < own_hi)) else {
            continue;
        };
        let caller = frames[i];
        let Some(&(_, _, family, ours)) = news
            .iter()
            .find(|&&(lo, hi, _, _)| lo < caller && caller <= hi)
        else {
            continue;
        };
        let mut shown = Vec::with_capacity(frames.len() - i);
        shown.push(ours);
        shown.extend_from_slice(&frames[i + 1..]);
        crate::state::BLOCKS.reattribute(block.addr, family, table.intern(&shown));
    }
}

/// The replacement of the function starting at `pc`, if it is one we replace.
pub fn redirect(pc: u64) -> Option<u64> {
    let t = TABLE.load(Ordering::Acquire);
    if t.is_null() {
        return None;
    }
    // SAFETY: the table is leaked once built and never freed or changed.
    let t = unsafe { &*t };
    t.binary_search_by_key(&pc, |e| e.0).ok().map(|i| t[i].1)
}

/// The native try of replacement `to` (`oxgrind_engine::native_try`), if it has one: the
/// replaced `memmove`/`memcpy`, `memcmp`/`bcmp`, `strlen`, `strchrnul`, `index` (`strchr`)
/// and `strncpy`, the short calls that are most of the replacements' time (bench
/// `containers`, `churn`, `sqlite3`, `python3`).
pub fn native_try(to: u64) -> Option<u64> {
    let tries: [(unsafe extern "C" fn(), oxgrind_engine::native_try::TryFn); 6] = [
        (oxgrind_replace_memmove, native::try_memmove),
        (oxgrind_replace_bcmp, native::try_memcmp),
        (oxgrind_replace_strlen, native::try_strlen),
        (oxgrind_replace_strchrnul, native::try_strchrnul),
        (oxgrind_replace_index, native::try_index),
        (oxgrind_replace_strncpy, native::try_strncpy),
    ];
    tries
        .iter()
        .find(|(f, _)| *f as *const () as usize as u64 == to)
        .map(|(_, t)| *t as *const () as usize as u64)
}

/// Whether the engine replaces glibc's string functions.
pub fn active() -> bool {
    STRINGS.load(Ordering::Acquire)
}

/// Whether `pc` is in the replacements' section (instrumented like the program's code).
pub fn contains(pc: u64) -> bool {
    // SAFETY: the linker defines both symbols around the section; only their addresses are
    // taken.
    let (lo, hi) = unsafe {
        (
            &__start_oxgrind_replace as *const u8 as u64,
            &__stop_oxgrind_replace as *const u8 as u64,
        )
    };
    lo <= pc && pc < hi
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_variants_map_to_their_function_and_other_names_do_not() {
        let r = |n| replacement_for(n);
        let strlen = oxgrind_replace_strlen as *const () as usize as u64;
        let memmove = oxgrind_replace_memmove as *const () as usize as u64;
        let chk = oxgrind_replace_memmove_chk as *const () as usize as u64;
        assert_eq!(r("__strlen_avx2"), Some(strlen));
        assert_eq!(r("__strlen_evex512"), Some(strlen));
        assert_eq!(r("strlen"), Some(strlen));
        assert_eq!(r("__memmove_avx512_unaligned_erms"), Some(memmove));
        assert_eq!(r("__memcpy_avx_unaligned_erms_rtm"), Some(memmove));
        assert_eq!(r("__memcpy_chk_avx512_no_vzeroupper"), Some(chk));
        assert_eq!(
            r("__strchr_sse2_no_bsf"),
            Some(oxgrind_replace_index as *const () as usize as u64)
        );
        assert_eq!(r("__strcspn_c1"), None);
        assert_eq!(r("__mempcpy_small"), None);
        assert_eq!(r("__memrchr_ifunc"), None);
        assert_eq!(r("__strcasecmp_avx2"), None);
        assert_eq!(r("__wmemset_avx2_unaligned"), None);
        assert_eq!(r("strlen_helper"), None);
        assert_eq!(r("__strncat_chk"), None);
    }
}
