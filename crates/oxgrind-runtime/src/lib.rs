//! liboxgrind_runtime.so: the part of oxgrind that lives inside the program.
//!
//! The launcher starts the program with this library in `LD_PRELOAD`. From then on:
//!
//! * [`hooks`] replaces the allocator entry points (`malloc` ... `operator delete[]`); each
//!   call is served by glibc's own allocator (`__libc_malloc`), recorded in the live-block
//!   table ([`blocks`]) with its interned call stack ([`stacks`]), and reported to the tool;
//! * [`state`] holds the configuration and the one tool of this process, set up on the first
//!   allocator call or by our constructor, whichever comes first;
//! * [`exit`] makes sure the tool's report is written however the process ends: normal exit
//!   (our destructor), `_exit`, a fatal signal, `execve`; and that `fork` leaves the child
//!   with consistent state;
//! * [`host`] is the `oxgrind_tool::Host` the tool talks to;
//! * [`roots`] stops the other threads and finds the leak checker's root set.
//!
//! Invariants every module keeps, because this code runs inside someone else's process at
//! arbitrary moments: Rust allocations use our private heap (the `#[global_allocator]`
//! below), never the program's; system calls go through `oxgrind_sys` and leave `errno`
//! alone; any runtime code runs with the thread's re-entrancy flag set ([`guard`]), so an
//! allocator call made *by* the runtime (through libc) is passed straight to glibc.
#![allow(clippy::missing_safety_doc)] // exported C entry points document C semantics

pub mod blocks;
pub mod budget;
pub mod exit;
pub mod exports;
pub mod fds;
pub mod guard;
pub mod hooks;
pub mod hookstack;
pub mod host;
pub mod init_order;
pub mod instrument;
pub mod libc_api;
pub mod limits;
pub mod mapstate;
pub mod pages;
pub mod perfmap;
pub mod replace;
pub mod requests;
pub mod roots;
pub mod stacks;
pub mod state;
pub mod strings;
pub mod trackfds;

#[global_allocator]
static HEAP: oxgrind_sys::heap::PrivateHeap = oxgrind_sys::heap::PrivateHeap::new();

/// Our constructor: runs before the program's own constructors and `main`, and, moved there
/// by [`init_order`], before every other library's but our own dependencies' (libc,
/// libgcc_s, the loader), so the engine sees their constructors' allocations. Initialising
/// here rather than lazily keeps the first `malloc` of the program cheap and installs the
/// exit and signal handling early.
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = on_load;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = on_unload;

extern "C" fn on_load() {
    state::ensure_init();
    // Not during set-up: when the program's first `malloc` comes before this constructor
    // (libstdc++'s emergency pool, when `init_order` could not put us first, or a
    // constructor of libc's), set-up runs from that call, and `dlopen`ing ourselves
    // there would run this constructor nested, before the runtime is active: the engine
    // would never start (the dynamic loader does not call a constructor twice).
    if state::runtime().is_some() {
        let _inside = guard::Entered::try_enter();
        hooks::open_self(&stacks::self_path());
    }
    if let Some(rt) = state::runtime() {
        // --track-fds learns each descriptor's opening stack from the engine (trackfds.rs).
        if rt.core.track_fds != oxgrind_options::TrackFds::No {
            trackfds::enable();
        }
        if rt.core.view.verbosity > 0 && init_order::others_initialised_first() {
            oxgrind_sys::fd::write_all(
                2,
                format!(
                    "oxgrind: other libraries' constructors ran before ours ({:?}): their allocations are not seen\n",
                    init_order::result()
                )
                .as_bytes(),
            );
        }
        if wants_engine(&rt.needs) || trackfds::enabled() {
            hooks::set_events_native(&rt.needs);
            guard::set_holds_trace(&rt.needs);
            start_engine(rt.needs);
        } else {
            exit::give_main_thread_an_alt_stack();
            hookstack::enable();
        }
    }
    // The shadows, the heap's reserve and the code cache are reserved now.
    limits::settle_after_setup();
}

/// The engine performed one of the program's `mmap`, `munmap`, `mremap`, `brk`, `mprotect`
/// (`oxgrind_engine::Config::on_memory_syscall`): how mappings got their permissions
/// (`mapstate`), and the pages of `--pages-as-heap` (`pages`, which has no use for
/// `mprotect`).
fn memory_syscall(call: &oxgrind_engine::MemorySyscall) {
    mapstate::on_engine_syscall(call);
    if !matches!(call.nr, 10 | 329) && state::runtime().is_some_and(|rt| rt.needs.page_events) {
        pages::on_engine_syscall(call);
    }
}

/// Whether the tool's needs make the program run under the translation engine.
pub fn wants_engine(n: &oxgrind_tool::Needs) -> bool {
    n.translation || n.count_instructions || n.instrument || n.client_requests || n.definedness
}

/// Hands the program to the translation engine: when this returns, the rest of our
/// constructor, the program's constructors, `main` and its exit all run from the code cache.
#[inline(never)]
fn start_engine(needs: oxgrind_tool::Needs) {
    host::engine_starting();
    let config = oxgrind_engine::Config {
        out_fd: 2,
        count_instructions: needs.count_instructions,
        client: if needs.instrument || needs.client_requests || needs.definedness {
            instrument::client()
        } else {
            None
        },
        on_memory_syscall: if needs.page_events || needs.mapping_access {
            Some(memory_syscall)
        } else {
            None
        },
        on_fd_syscall: if trackfds::enabled() {
            Some(trackfds::on_engine_syscall)
        } else {
            None
        },
        trace: needs.trace,
        recent_lines: needs.recent_lines,
        recent_lines_two_ways: needs.recent_lines_two_ways,
        hot_ranges: needs.hot_ranges && needs.shadow.is_some(),
        recent_code_lines: needs.recent_code_lines,
        recent_code_lines_ways: needs.recent_code_lines_ways,
        indexed_counters: needs.indexed_counters,
        thread_state: needs.thread_state,
        definedness: needs.definedness,
        origins: needs.origins,
        before_syscalls: needs.before_syscalls,
        core_requests: Some(requests::answer),
        on_exit: Some(exit::at_exit_group),
        on_fatal_in_native: Some(exit::fatal_signal_natively),
        on_translated: perfmap::hook(),
        // Used only without a client to ask (whose `redirect` covers the same).
        redirect: Some(instrument::redirect_without_client),
        ..Default::default()
    };
    // Testing knob: every instruction through definedness's interpreter, none through the
    // inline fast path (whose results must be the same).
    if state::env_var("OXGRIND_DEFINEDNESS_SLOW_ONLY").is_some_and(|v| v == b"1") {
        oxgrind_engine::definedness::set_fast_path(false);
    }
    // Engine development: count the dispatcher's entries by instruction form and site,
    // written at exit to `<value>.<pid>` (`oxgrind_engine::census`).
    perfmap::start_census();
    if needs.page_events {
        pages::before_engine();
    }
    if needs.mapping_access {
        mapstate::enable();
    }
    if !needs.ignores_heap {
        replace::prepare(needs.instrument && needs.check_overlaps);
    }
    if needs.instrument || needs.ignores_heap {
        instrument::prepare_allocator_bypass();
    }
    // SAFETY: called once, from our ELF constructor, on the main thread before any other
    // thread exists; our global allocator is the private heap and we link with -z now, as
    // start_from_constructor requires.
    let started = unsafe { oxgrind_engine::start_from_constructor(config) };
    if started.is_ok() {
        exit::report_at_exit_group();
    }
    if let Err(e) = started {
        oxgrind_sys::fd::write_all(
            2,
            format!("oxgrind: the translation engine could not start ({e:?}); the program runs natively\n").as_bytes(),
        );
        if needs.page_events {
            pages::engine_failed();
        }
    }
    // The definedness shadow's files (of undefined bytes, and its primary table) are ours,
    // like the log's descriptor.
    for fd in [
        oxgrind_engine::definedness::undefined_file_fd(),
        oxgrind_engine::definedness::primary_table_fd(),
    ]
    .into_iter()
    .flatten()
    {
        fds::register(fd);
    }
}

/// Runs from `_dl_fini`, after the program's `atexit` handlers and static destructors.
extern "C" fn on_unload() {
    exit::at_normal_exit();
}
