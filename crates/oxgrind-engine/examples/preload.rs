//! A minimal preload library that runs the whole program under the engine: the test
//! harness for `oxgrind-engine` (the real embedder is `oxgrind-runtime`).
//!
//! `LD_PRELOAD=libpreload.so prog args` runs `prog` from the code cache. Environment:
//! * `OXGRIND_ENGINE_OFF=1`: do not start the engine (native run, same library loaded);
//! * `OXGRIND_ENGINE_COUNT=1`: count guest instructions, print the total at exit;
//! * `OXGRIND_ENGINE_STATS=1`: print translation statistics at exit;
//! * `OXGRIND_ENGINE_FAR=1`: place the code cache far from all code (tests the far paths).
//!
//! The constructor reads the environment from `/proc/self/environ`-free sources: the
//! `envp` the dynamic loader passes to `.init_array` functions.

use oxgrind_sys::heap::PrivateHeap;

#[global_allocator]
static HEAP: PrivateHeap = PrivateHeap::new();

fn env_flag(envp: *const *const u8, name: &[u8]) -> bool {
    let mut p = envp;
    if p.is_null() {
        return false;
    }
    // SAFETY: envp is the NULL-terminated environment array the loader passes to
    // constructors; each entry is a NUL-terminated string.
    unsafe {
        while !(*p).is_null() {
            let s = *p;
            let mut i = 0;
            while i < name.len() && *s.add(i) == name[i] {
                i += 1;
            }
            if i == name.len() && *s.add(i) == b'=' {
                return *s.add(i + 1) == b'1';
            }
            p = p.add(1);
        }
    }
    false
}

extern "C" fn init(_argc: i32, _argv: *const *const u8, envp: *const *const u8) {
    if env_flag(envp, b"OXGRIND_ENGINE_OFF") {
        return;
    }
    let count = env_flag(envp, b"OXGRIND_ENGINE_COUNT");
    let config = oxgrind_engine::Config {
        count_instructions: count,
        report_at_exit: count,
        stats: env_flag(envp, b"OXGRIND_ENGINE_STATS"),
        far_code_cache: env_flag(envp, b"OXGRIND_ENGINE_FAR"),
        ..Default::default()
    };
    // SAFETY: called once from the library's constructor on the main thread, before the
    // program has created threads; the global allocator is the private heap.
    if let Err(e) = unsafe { oxgrind_engine::start_from_constructor(config) } {
        let mut w = oxgrind_sys::fd::FdWriter::new(2);
        let _ = core::fmt::Write::write_fmt(
            &mut w,
            format_args!("oxgrind-engine: not started: {e:?}\n"),
        );
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn(i32, *const *const u8, *const *const u8) = init;
