//! The runtime's configuration and its one tool, set up once per process image.
//!
//! Set-up happens on the first call into the runtime: our constructor, or an allocator call
//! made earlier by another library's constructor. It reads the environment the launcher
//! prepared and decides between two lives:
//!
//! * **active**: this image is being measured; hooks record and report to the tool;
//! * **inert**: this image is not ours to measure (launched without `oxgrind`, or a child
//!   exec'd with `--trace-children=no` that inherited the environment through a copied
//!   `envp`); hooks pass straight to glibc.
//!
//! With `--trace-children=no`, an active image also takes itself out of its children's way:
//! it removes its path from `LD_PRELOAD` and marks the `OXGRIND` variable taken, both by editing
//! the environment strings in place (no allocation, and every later `exec` that passes
//! `environ` carries the change).

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};

use oxgrind_options::{self as opts, Action, CoreOptions};
use oxgrind_tool::{Needs, Tool};

use crate::blocks::BlockTable;
use crate::guard::Entered;
use crate::libc_api;
use crate::stacks::StackTable;

pub struct Runtime {
    pub core: CoreOptions,
    pub tool: Box<dyn Tool>,
    pub needs: Needs,
    /// The program and its arguments as the user typed them.
    pub command: Vec<String>,
    /// Working directory at launch, for relative output names.
    pub cwd: String,
    pub start_ns: u64,
    /// Where the symboliser keeps inflated debug sections between runs
    /// (`$XDG_CACHE_HOME/oxgrind/debug-sections`, else `$HOME/.cache/...`): read at start,
    /// since glibc's `__libc_freeres` clears the environment before the report.
    pub section_cache: Option<String>,
}

/// See [`Runtime::section_cache`].
fn section_cache_dir() -> Option<String> {
    let var = |name: &str| {
        env_var(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .filter(|v| v.starts_with('/'))
    };
    let base = var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| format!("{h}/.cache")))?;
    Some(format!("{base}/oxgrind/debug-sections"))
}

const UNINIT: u8 = 0;
const INITIALIZING: u8 = 1;
const ACTIVE: u8 = 2;
const INERT: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// Allocator calls go straight to glibc: the image is inert, or its tool wants no heap
/// events (`--tool=none`).
static PASSTHROUGH: AtomicBool = AtomicBool::new(false);

/// Whether allocator hooks should do nothing but call glibc.
#[inline]
pub fn passthrough() -> bool {
    PASSTHROUGH.load(Ordering::Relaxed)
}
static RUNTIME: AtomicPtr<Runtime> = AtomicPtr::new(core::ptr::null_mut());

pub static BLOCKS: BlockTable = BlockTable::new();
pub static STACKS: StackTable = StackTable::new();

/// The runtime, if this image is being measured.
#[inline]
pub fn runtime() -> Option<&'static Runtime> {
    if STATE.load(Ordering::Acquire) != ACTIVE {
        return None;
    }
    let p = RUNTIME.load(Ordering::Acquire);
    // SAFETY: RUNTIME is set to a leaked Box before STATE becomes ACTIVE and never freed.
    Some(unsafe { &*p })
}

/// Whether set-up has run (either way).
#[inline]
pub fn settled() -> bool {
    matches!(STATE.load(Ordering::Acquire), ACTIVE | INERT)
}

/// Runs set-up once; later calls return at once. Calls made while set-up runs (from libc
/// functions set-up itself calls) find the state not yet active and pass through.
pub fn ensure_init() {
    if STATE.load(Ordering::Acquire) != UNINIT {
        return;
    }
    if STATE
        .compare_exchange(UNINIT, INITIALIZING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let Some(_inside) = Entered::try_enter() else {
        STATE.store(INERT, Ordering::Release);
        return;
    };
    crate::limits::lift_for_setup();
    match set_up() {
        Some(rt) => {
            let rt = Box::leak(Box::new(rt));
            PASSTHROUGH.store(rt.needs.ignores_heap, Ordering::Relaxed);
            RUNTIME.store(rt, Ordering::Release);
            STATE.store(ACTIVE, Ordering::Release);
            crate::host::keep_log_fd();
            crate::host::keep_proc_files();
            crate::exit::install();
            if rt.needs.page_events {
                if let Err(why) = crate::pages::install() {
                    oxgrind_sys::fd::write_all(2, format!("oxgrind: {why}\n").as_bytes());
                }
            }
            rt.tool.on_start(&crate::host::HOST);
            crate::hooks::enable_heap_path(rt);
        }
        None => {
            crate::limits::settle_after_setup();
            PASSTHROUGH.store(true, Ordering::Relaxed);
            STATE.store(INERT, Ordering::Release)
        }
    }
}

/// One environment variable, read from `environ` without libc's `getenv`.
pub fn env_var(name: &str) -> Option<&'static mut [u8]> {
    // SAFETY: environ is a NULL-terminated array of NUL-terminated strings maintained by libc;
    // at set-up no other thread exists yet, and later readers only read.
    unsafe {
        let mut p = libc_api::environ;
        if p.is_null() {
            return None;
        }
        while !(*p).is_null() {
            let s = CStr::from_ptr(*p);
            let bytes = s.to_bytes();
            if bytes.len() > name.len()
                && bytes.starts_with(name.as_bytes())
                && bytes[name.len()] == b'='
            {
                let start = (*p).add(name.len() + 1) as *mut u8;
                return Some(core::slice::from_raw_parts_mut(
                    start,
                    bytes.len() - name.len() - 1,
                ));
            }
            p = p.add(1);
        }
    }
    None
}

fn set_up() -> Option<Runtime> {
    let value = env_var(opts::ENV_NAME)?;
    let handoff = opts::Handoff::decode(&String::from_utf8_lossy(value))?;
    let first_image = match handoff.state.as_str() {
        opts::STATE_FRESH => true,
        opts::STATE_CHILD => false,
        _ => return None,
    };
    let options = handoff.options;
    let cwd = handoff.cwd;
    // The command as the user typed it belongs to the first image only; children exec'd
    // under --trace-children=yes describe themselves from /proc/self/cmdline.
    let command = if first_image && !handoff.command.is_empty() {
        handoff.command
    } else {
        own_cmdline()
    };
    let parsed = match opts::parse(&options) {
        Ok(Action::Run(p)) => p,
        Ok(_) => return None,
        Err(e) => {
            oxgrind_sys::fd::write_all(2, format!("oxgrind: {}\n", e.0).as_bytes());
            return None;
        }
    };
    // --trace-children-skip: an exec'd image whose executable matches runs natively, and so
    // do the images it execs in turn (as under Valgrind, which is not there to follow them).
    if !first_image && skipped(&parsed.core.trace_children_skip, &command) {
        value[..opts::STATE_TAKEN.len()].copy_from_slice(opts::STATE_TAKEN.as_bytes());
        remove_self_from_ld_preload();
        return None;
    }
    // Tell the images this one execs what they are (the state is the value's first bytes).
    let next = if parsed.core.trace_children {
        opts::STATE_CHILD
    } else {
        opts::STATE_TAKEN
    };
    value[..next.len()].copy_from_slice(next.as_bytes());
    if !parsed.core.trace_children {
        remove_self_from_ld_preload();
        // Leave the program the environment it would have without us: perl, for one, copies
        // every variable, and the leak report would count ours. (unsetenv only shifts the
        // environ array; it allocates nothing.)
        // SAFETY: NUL-terminated names; no other thread exists during set-up.
        unsafe {
            libc_api::unsetenv(c"OXGRIND".as_ptr());
            if env_var("LD_PRELOAD").is_some_and(|v| v.is_empty() || v[0] == 0) {
                libc_api::unsetenv(c"LD_PRELOAD".as_ptr());
            }
        }
    }
    crate::stacks::find_self_text();
    let needs = parsed.tool.needs();
    crate::budget::configure(&parsed.core.budgets);
    if let Some(spec) = needs.shadow {
        // Before the first allocator event the tool sees: it marks blocks in the map.
        let map = oxgrind_engine::shadow::reserve(spec);
        if map.is_none() {
            // Said, as the definedness shadow's failure is: the tool then checks nothing.
            oxgrind_sys::fd::write_all(
                2,
                b"oxgrind: no memory for the addressability shadow; accesses are not checked\n",
            );
        }
        crate::host::set_shadow(map);
    }
    Some(Runtime {
        core: parsed.core,
        tool: parsed.tool,
        needs,
        command,
        cwd,
        start_ns: crate::libc_api::monotonic_ns(),
        section_cache: section_cache_dir(),
    })
}

/// Whether this image's executable (its path, or argv[0] as exec'd) matches one of the
/// `--trace-children-skip` patterns (`*` and `?` wildcards, matched against the whole name).
fn skipped(patterns: &[String], command: &[String]) -> bool {
    if patterns.is_empty() {
        return false;
    }
    let exe = std::fs::read_link("/proc/self/exe")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let argv0 = command.first().cloned().unwrap_or_default();
    patterns.iter().any(|p| {
        oxgrind_formats::suppressions::glob_match(p, &exe)
            || oxgrind_formats::suppressions::glob_match(p, &argv0)
    })
}

fn own_cmdline() -> Vec<String> {
    let mut text = Vec::new();
    if let Ok(fd) = oxgrind_sys::raw::open(b"/proc/self/cmdline\0", oxgrind_sys::raw::O_RDONLY, 0) {
        let mut buf = [0u8; 4096];
        while let Ok(n) = oxgrind_sys::raw::read(fd, &mut buf) {
            if n == 0 {
                break;
            }
            text.extend_from_slice(&buf[..n]);
        }
        let _ = oxgrind_sys::raw::close(fd);
    }
    text.split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Edits `LD_PRELOAD` in place to drop every entry naming our library.
fn remove_self_from_ld_preload() {
    let Some(value) = env_var("LD_PRELOAD") else {
        return;
    };
    let text = String::from_utf8_lossy(value).into_owned();
    let kept: Vec<&str> = text
        .split([':', ' '])
        .filter(|e| !e.is_empty() && !e.ends_with("liboxgrind_runtime.so"))
        .collect();
    let new = kept.join(":");
    let n = new.len();
    value[..n].copy_from_slice(new.as_bytes());
    // The string shrinks: NUL-terminate early (the bytes after stay unused).
    if n < value.len() {
        value[n] = 0;
    }
}
