//! The runtime as the tools see it: `oxgrind_tool::Host`.
//!
//! Symbolisation is lazy and cached (first use at report time, or when Massif classifies a
//! new stack); output files are created with raw system calls on descriptors the program
//! never sees.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};

use oxgrind_options::{template, LogDest};
use oxgrind_sys::lock::SpinLock;
use oxgrind_sys::raw;
use oxgrind_tool::{Addr, DataAddr, Frame, Host, LiveBlock, OptionError, RootRange, StackId};

use crate::state::{self, BLOCKS, STACKS};

pub struct RuntimeHost;

/// The tool's shadow map (`Needs::shadow`), reserved once at set-up.
static SHADOW: oxgrind_sys::lock::SpinLock<Option<oxgrind_tool::instrument::ShadowMap>> =
    oxgrind_sys::lock::SpinLock::new(None);

pub fn set_shadow(map: Option<oxgrind_tool::instrument::ShadowMap>) {
    *SHADOW.lock() = map;
}

pub static HOST: RuntimeHost = RuntimeHost;

/// The log file descriptor and the pid it was opened for (a forked child reopens).
static LOG_FD: SpinLock<(i32, i32)> = SpinLock::new((-1, 0));
static NAME_SEQ: AtomicU32 = AtomicU32::new(0);
static LOG_FAILED: AtomicI32 = AtomicI32::new(0);

pub fn after_fork_child() {
    // SAFETY: single-threaded child right after fork.
    unsafe {
        LOG_FD.force_unlock();
        BANNER.force_unlock();
        XML_FD.force_unlock();
        SYMBOLIZER.force_unlock();
    }
    keep_proc_files();
    create_log_file_now(false);
}

/// Keeps the `/proc/self` files oxgrind reads during the run open among our descriptors
/// (`oxgrind_sys::procself`: a read then takes no descriptor the program could need). Called
/// at set-up and in a forked child, whose inherited ones name the parent. A file whose
/// descriptor cannot move above the floor (a limit lowered under it) is opened per read.
pub fn keep_proc_files() {
    oxgrind_sys::procself::keep_open(
        &mut |fd| {
            let high = raw::dup_high(fd, FD_FLOOR).ok();
            let _ = raw::close(fd);
            high.inspect(|&high| crate::fds::register(high))
        },
        &mut |fd| crate::fds::unregister(fd),
    );
}

fn getenv(name: &str) -> Option<String> {
    state::env_var(name).map(|v| String::from_utf8_lossy(v).into_owned())
}

/// Keeps our descriptors away from the ones the program uses (it may close or dup2 over low
/// numbers), as Valgrind does.
const FD_FLOOR: i32 = 900;

fn create_file(path: &str) -> Result<i32, i32> {
    let mut c = path.as_bytes().to_vec();
    c.push(0);
    // Until the descriptor is moved up, it holds one of the program's slots.
    let _lent = oxgrind_sys::lent_fd::Lent::take();
    let fd = raw::open(
        &c,
        raw::O_WRONLY | raw::O_CREAT | raw::O_TRUNC | raw::O_CLOEXEC,
        0o600,
    )?;
    match raw::dup_high(fd, FD_FLOOR) {
        Ok(high) => {
            let _ = raw::close(fd);
            Ok(high)
        }
        Err(_) => Ok(fd),
    }
    .inspect(|&fd| crate::fds::register(fd))
}

/// The XML output: descriptor and the pid it was opened for, as for the log.
static XML_FD: SpinLock<(i32, i32)> = SpinLock::new((-1, 0));
static XML_FD_COPY: AtomicI32 = AtomicI32::new(-1);

fn xml_fd() -> Option<i32> {
    let rt = state::runtime()?;
    match rt.core.xml.as_ref()? {
        LogDest::Fd(fd) => Some(match XML_FD_COPY.load(Ordering::Acquire) {
            copy if copy >= 0 => copy,
            _ => *fd,
        }),
        LogDest::File(t) => {
            let pid = raw::getpid();
            let mut g = XML_FD.lock();
            if g.1 == pid && g.0 >= 0 {
                return Some(g.0);
            }
            let fd = HOST
                .expand_output_path(t)
                .ok()
                .and_then(|path| create_file(&path).ok())?;
            *g = (fd, pid);
            Some(fd)
        }
    }
}

/// Our copy of the `--log-fd` descriptor, made at start-up: programs close their standard
/// streams at exit (coreutils' `close_stdout` closes stderr), and the report comes after.
static LOG_FD_COPY: AtomicI32 = AtomicI32::new(-1);

/// Duplicates the `--log-fd` and `--xml-fd` descriptors out of the program's way (called at
/// set-up). A descriptor that cannot be duplicated (it is not open) is replaced by stderr,
/// with Valgrind's warning, rather than losing the report.
pub fn keep_log_fd() {
    let Some(rt) = state::runtime() else { return };
    if let LogDest::Fd(fd) = rt.core.log {
        LOG_FD_COPY.store(keep_fd(fd, "log"), Ordering::Release);
    }
    create_log_file_now(true);
    if let Some(LogDest::Fd(fd)) = rt.core.xml {
        XML_FD_COPY.store(keep_fd(fd, "XML"), Ordering::Release);
    }
}

fn keep_fd(fd: i32, what: &str) -> i32 {
    let copy = match raw::dup_high(fd, FD_FLOOR) {
        Ok(copy) => copy,
        Err(_) => {
            let line = format!(
                "=={}== oxgrind: failed to move {what} file descriptor into safe range, using stderr\n",
                raw::getpid()
            );
            oxgrind_sys::fd::write_all(2, line.as_bytes());
            match raw::dup_high(2, FD_FLOOR) {
                Ok(copy) => copy,
                Err(_) => return 2, // stderr is closed too: nothing better to write to
            }
        }
    };
    crate::fds::register(copy);
    copy
}

/// Creates the `--log-file` now rather than at the first line logged, as Valgrind creates
/// it when each process starts, and when a forked child starts if the name holds `%p`
/// (`at_start`: this image's start; otherwise a fork): with `-q`, a process with nothing to
/// report still leaves its empty file, which scripts look for (tmux's forked server left
/// none). A child silenced by `--child-silent-after-fork` gets none, as with Valgrind.
fn create_log_file_now(at_start: bool) {
    let Some(rt) = state::runtime() else { return };
    if let LogDest::File(t) = &rt.core.log {
        if at_start || (t.contains("%p") && !SILENT.load(Ordering::Acquire)) {
            let _ = log_fd();
        }
    }
}

fn log_fd() -> i32 {
    let Some(rt) = state::runtime() else { return 2 };
    match &rt.core.log {
        LogDest::Fd(fd) => match LOG_FD_COPY.load(Ordering::Acquire) {
            copy if copy >= 0 => copy,
            _ => *fd,
        },
        LogDest::File(t) => {
            let pid = raw::getpid();
            let mut g = LOG_FD.lock();
            if g.1 == pid && g.0 >= 0 {
                return g.0;
            }
            let fd = HOST
                .expand_output_path(t)
                .ok()
                .and_then(|path| create_file(&path).ok())
                .unwrap_or_else(|| {
                    if LOG_FAILED.swap(1, Ordering::Relaxed) == 0 {
                        oxgrind_sys::fd::write_all(
                            2,
                            b"oxgrind: cannot create the --log-file; logging to stderr\n",
                        );
                    }
                    2
                });
            *g = (fd, pid);
            if fd != 2 {
                banner_for_forked_child(fd, pid);
            }
            fd
        }
    }
}

/// The tool's start-up banner as this image logged it, and the pid it was logged for: a
/// forked child that opens a log file of its own (`--log-file=...%p`) starts it with the
/// same banner, for its own pid and naming its parent, as Valgrind's does.
static BANNER: SpinLock<Option<(i32, String)>> = SpinLock::new(None);

/// The core's part of the banner, whichever tool printed it: when logging to a file, the
/// line after `Command:` is `Parent PID:` (Valgrind's core prints it for every tool). The
/// first text logged that holds `Command: ` is the banner (each tool logs it in one piece
/// at start-up); it is remembered for forked children.
fn complete_banner(text: &str) -> Option<String> {
    if BANNER.lock().is_some() || !text.contains("Command: ") {
        return None;
    }
    let pid = raw::getpid();
    let to_file = state::runtime().is_some_and(|rt| matches!(rt.core.log, LogDest::File(_)));
    let mut out = String::with_capacity(text.len() + 32);
    for line in text.split_inclusive('\n') {
        out.push_str(line);
        if to_file && line.contains("Command: ") && !text.contains("Parent PID: ") {
            out.push_str(&format!("=={pid}== Parent PID: {}\n", raw::getppid()));
        }
    }
    *BANNER.lock() = Some((pid, out.clone()));
    Some(out)
}

/// Writes the banner, rewritten for this process, at the top of a log file a forked child
/// has just opened.
fn banner_for_forked_child(fd: i32, pid: i32) {
    let Some((parent, text)) = BANNER.lock().clone() else {
        return;
    };
    if parent == pid {
        return;
    }
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let line = line.replace(&format!("=={parent}=="), &format!("=={pid}=="));
        match line.find("Parent PID: ") {
            Some(at) => out.push_str(&format!("{}Parent PID: {parent}\n", &line[..at])),
            None => out.push_str(&line),
        }
    }
    oxgrind_sys::fd::write_all(fd, out.as_bytes());
}

static SYMBOLIZER: SpinLock<Option<oxgrind_symbols::Symbolizer>> = SpinLock::new(None);

/// The symboliser of this process's objects, keeping inflated debug sections in the user's
/// cache directory (`Runtime::section_cache`; `Symbolizer::set_section_cache`).
fn new_symbolizer() -> oxgrind_symbols::Symbolizer {
    let mut sym = oxgrind_symbols::Symbolizer::from_self();
    if let Some(dir) = state::runtime().and_then(|rt| rt.section_cache.as_deref()) {
        sym.set_section_cache(dir);
    }
    // Our own frames (the allocator entry points every heap stack starts with) are named
    // from the symbol table, as Valgrind names its preloaded replacements (`malloc (in
    // .../vgpreload_dhat-amd64-linux.so)`): indexing this library's debug information
    // and line tables for them was a third of a short program's report under DHAT.
    sym.set_symbols_only(std::path::Path::new(&crate::stacks::self_path()));
    sym
}

/// Set just before the translation engine starts (`start_engine`). While it is clear no
/// code runs translated, so [`native`] calls its closure directly: a heap event of a tool
/// that runs the program natively (Massif with `--time-unit=B` or `ms`) skips the hand-off.
static ENGINE_STARTED: AtomicBool = AtomicBool::new(false);

/// See [`ENGINE_STARTED`].
pub fn engine_starting() {
    ENGINE_STARTED.store(true, Ordering::Release);
}

/// Runs `f` natively (`oxgrind_engine::run_native`) and returns its result: the runtime's
/// own long work (symbolising, a heap event's stack capture and tool call) is many times
/// slower as translated code.
#[inline]
pub fn native<R>(f: impl FnOnce() -> R) -> R {
    if !ENGINE_STARTED.load(Ordering::Relaxed) {
        return f();
    }
    native_from_cache(f)
}

/// [`native`] where the engine is known to have started: always through
/// `oxgrind_engine::run_native`.
#[inline(never)]
pub fn native_from_cache<R>(f: impl FnOnce() -> R) -> R {
    let mut f = Some(f);
    let mut out = None;
    oxgrind_engine::run_native(&mut || {
        if let Some(f) = f.take() {
            out = Some(f());
        }
    });
    match out {
        Some(r) => r,
        // `run_native` returns only after calling the closure once.
        None => unreachable!("run_native returned without running its closure"),
    }
}

/// Before the process first forks: the objects the forking call and the stacks recorded so
/// far run through are loaded into the symboliser (symbol tables, debug information), once, so that forked
/// children, which write reports of their own, inherit them instead of each loading them
/// again (DHAT, 20 children that print: 265 ms of CPU, most of it that). Valgrind reads
/// debug information as objects are mapped, so its children inherit it too.
pub fn load_symbols_before_fork() {
    static DONE: AtomicBool = AtomicBool::new(false);
    let Some(rt) = state::runtime() else { return };
    if rt.needs.stack_depth == 0 || DONE.swap(true, Ordering::AcqRel) {
        return;
    }
    // The forking call's own stack (this library, libc, the program: what a child's first
    // allocation runs through), then the first stacks recorded; a bound keeps a fork of a
    // program with millions of stacks cheap.
    let mut here = [0u64; 64];
    let depth = oxgrind_symbols::capture(&mut here, (0, 0));
    let n = STACKS.count().min(1 << 14);
    with_symbolizer(|sym| {
        let recorded = (0..n).flat_map(|i| STACKS.frames(StackId(i)).iter().copied());
        sym.load_objects_of(here[..depth].iter().copied().chain(recorded))
    });
}

/// Runs `f` on the symboliser, natively (symbolising inflates and parses debug sections:
/// most of a short program's time under DHAT or Massif went there, at exit, translated).
fn with_symbolizer<R>(f: impl FnOnce(&mut oxgrind_symbols::Symbolizer) -> R) -> R {
    native(|| {
        let mut g = SYMBOLIZER.lock();
        f(g.get_or_insert_with(new_symbolizer))
    })
}

/// `--child-silent-after-fork=yes`: a forked child says nothing (until it execs, when a new
/// image starts with this flag clear).
static SILENT: AtomicBool = AtomicBool::new(false);

pub fn silence_if_asked_after_fork() {
    if state::runtime().is_some_and(|rt| rt.core.child_silent_after_fork) {
        SILENT.store(true, Ordering::Release);
    }
}

/// Applies the core options that shape how frames are printed, for every tool alike:
/// `--demangle=no` (linkage names), `--read-inline-info=no` (the outermost function only),
/// `--fullpath-after=` (directories, minus a prefix up to the given string).
fn present(mut frames: Vec<Frame>, core: &oxgrind_options::CoreOptions) -> Vec<Frame> {
    if !core.read_inline_info && frames.len() > 1 {
        frames.drain(..frames.len() - 1);
    }
    for f in &mut frames {
        if !core.demangle {
            if let Some(m) = f.mangled.take() {
                f.function = Some(m);
            }
        }
        if !core.fullpath_after.is_empty() {
            if let (Some(dir), Some(file)) = (&f.dir, &f.file) {
                let full = format!("{dir}/{file}");
                // The first --fullpath-after string found in the path wins; an empty one
                // matches at the start (the whole path is kept).
                let cut = core
                    .fullpath_after
                    .iter()
                    .find_map(|s| full.find(s.as_str()).map(|i| i + s.len()));
                if let Some(cut) = cut {
                    let shown = full[cut..].trim_start_matches("./").to_string();
                    f.file = Some(shown);
                }
            }
        }
    }
    frames
}

/// `--time-stamp=yes`: `==12345== ` becomes `==00:00:00:01.234 12345== ` (days, hours,
/// minutes, seconds and milliseconds since start), on every line.
fn time_stamped(text: &str, elapsed_ms: u64) -> String {
    let stamp = format!(
        "{:02}:{:02}:{:02}:{:02}.{:03} ",
        elapsed_ms / 86_400_000,
        elapsed_ms / 3_600_000 % 24,
        elapsed_ms / 60_000 % 60,
        elapsed_ms / 1000 % 60,
        elapsed_ms % 1000
    );
    let mut out = String::with_capacity(text.len() + 32);
    for line in text.split_inclusive('\n') {
        if line.starts_with("==") || line.starts_with("--") || line.starts_with("**") {
            out.push_str(&line[..2]);
            out.push_str(&stamp);
            out.push_str(&line[2..]);
        } else {
            out.push_str(line);
        }
    }
    out
}

impl RuntimeHost {
    /// Which frame of the current stack owns `addr`, numbered as in the error's stack (frame
    /// 0 is our replacement function, 1 the program's caller, ...), with the frame's
    /// function and the line it starts at, as Memcheck's "in frame #1, created by f (a.c:3)".
    /// Which frame of the thread's stack holds `addr`: walked from `guest` (the program's
    /// registers, when the tool runs on the engine's stack), else from here.
    fn stack_frame_of(
        &self,
        addr: Addr,
        stack_top: u64,
        guest: Option<oxgrind_symbols::Regs>,
    ) -> Option<(usize, Frame)> {
        const N: usize = 128;
        let (mut ras, mut cfas) = ([0u64; N], [0u64; N]);
        let own = crate::stacks::self_text();
        // Registers that stop in our own code: an allocator hook run natively as a whole
        // (`hooks::events_run_natively`), whose frames are left out as they are below.
        let in_own = guest.is_some_and(|r| own.0 <= r.pc && r.pc < own.1);
        let n = match guest {
            Some(r) if in_own => {
                oxgrind_symbols::capture_with_cfas_from(r, &mut ras, &mut cfas, own)
            }
            Some(r) => oxgrind_symbols::capture_with_cfas_from(r, &mut ras, &mut cfas, (0, 0)),
            None => oxgrind_symbols::capture_with_cfas(&mut ras, &mut cfas, own),
        };
        // Registers elsewhere, lent while an allocator hook reports the program's misuse of
        // its call: the hook ran natively from its entry point (`hooks::set_events_native`),
        // and they are its caller's as the call returns, whose frame is #1 in the error's
        // stack (frame #0 being our replacement function, as Valgrind's is).
        let first = usize::from(
            guest.is_some() && !in_own && crate::guard::this_thread().is_reporting_misuse(),
        );
        // The function the registers stop in (frame #0, or #1 as above) owns [sp, cfas[0]).
        if let Some(r) = guest.filter(|_| !in_own) {
            let end = if n > 0 { cfas[0] } else { stack_top };
            if r.sp <= addr && addr < end {
                let frame = with_symbolizer(|sym| {
                    let start = sym.function_start(r.pc)?;
                    sym.describe(start).pop()
                })?;
                return Some((first, frame));
            }
        }
        // The function ras[k] returns into owns [cfas[k], cfas[k + 1]).
        let k = (0..n).find(|&k| {
            let end = if k + 1 < n { cfas[k + 1] } else { stack_top };
            cfas[k] <= addr && addr < end
        })?;
        let frame = with_symbolizer(|sym| {
            let start = sym.function_start(ras[k].wrapping_sub(1))?;
            sym.describe(start).pop()
        })?;
        Some((k + 1 + first, frame))
    }
}

impl RuntimeHost {
    /// Whether `addr` is a block glibc's allocator holds for the program now: one of the
    /// blocks of the event the tool is handling on this thread (no lookup), or a live block
    /// of the table.
    fn holds_chunk(&self, addr: Addr) -> bool {
        crate::guard::this_thread().is_event_block(addr)
            || matches!(BLOCKS.get(addr), Some(b) if !b.internal)
    }
}

impl Host for RuntimeHost {
    fn stack(&self, id: StackId) -> Vec<Addr> {
        STACKS.frames(id).to_vec()
    }

    fn describe(&self, ip: Addr) -> Vec<Frame> {
        let frames = with_symbolizer(|sym| sym.describe(ip));
        match state::runtime() {
            Some(rt) => present(frames, &rt.core),
            None => frames,
        }
    }

    fn elapsed_ms(&self) -> u64 {
        let start = state::runtime().map_or(0, |rt| rt.start_ns);
        (crate::libc_api::monotonic_ns().saturating_sub(start)) / 1_000_000
    }

    fn pid(&self) -> i32 {
        raw::getpid()
    }

    fn command_line(&self) -> &[String] {
        state::runtime().map_or(&[], |rt| rt.command.as_slice())
    }

    fn expand_output_path(&self, t: &str) -> Result<String, OptionError> {
        let cwd = state::runtime().map_or("/", |rt| rt.cwd.as_str());
        let seq = NAME_SEQ.fetch_add(1, Ordering::Relaxed) + 1;
        template::expand(t, raw::getpid(), seq, &getenv, cwd)
    }

    fn track_fds_xml(&self) -> Option<String> {
        crate::trackfds::take_xml()
    }

    fn read_self_file(&self, file: oxgrind_tool::SelfFile) -> Option<String> {
        use oxgrind_sys::procself::{read_string, SelfFile};
        read_string(match file {
            oxgrind_tool::SelfFile::Maps => SelfFile::Maps,
            oxgrind_tool::SelfFile::Stat => SelfFile::Stat,
            oxgrind_tool::SelfFile::Limits => SelfFile::Limits,
        })
    }

    fn write_file(&self, path: &str, bytes: &[u8]) -> Result<(), i32> {
        let fd = create_file(path)?;
        let mut rest = bytes;
        while !rest.is_empty() {
            match raw::write(fd, rest) {
                Ok(n) => rest = &rest[n..],
                Err(4) => continue,
                Err(e) => {
                    crate::fds::unregister(fd);
                    let _ = raw::close(fd);
                    return Err(e);
                }
            }
        }
        crate::fds::unregister(fd);
        let _ = raw::close(fd);
        Ok(())
    }

    fn log(&self, text: &str) {
        if SILENT.load(Ordering::Acquire) {
            return;
        }
        let banner = complete_banner(text);
        let text = banner.as_deref().unwrap_or(text);
        if state::runtime().is_some_and(|rt| rt.core.time_stamp) {
            let stamped = time_stamped(text, self.elapsed_ms());
            oxgrind_sys::fd::write_all(log_fd(), stamped.as_bytes());
            return;
        }
        oxgrind_sys::fd::write_all(log_fd(), text.as_bytes());
    }

    fn banner(&self, name: &str, copyright: &str) -> String {
        let mut out = String::new();
        let to_file = state::runtime().is_some_and(|rt| matches!(rt.core.log, LogDest::File(_)));
        oxgrind_formats::memcheck_text::tool_banner(
            &mut out,
            self.pid(),
            name,
            copyright,
            self.command_line(),
            to_file.then(raw::getppid),
        );
        out
    }

    fn describe_data(&self, addr: Addr) -> Option<DataAddr> {
        // Under the engine a tool runs on the engine's stack: the program's stack is the
        // one the guest registers of the call in flight point into.
        let guest = oxgrind_engine::guest_regs_in_tool_call().map(|r| oxgrind_symbols::Regs {
            pc: r.rip,
            sp: r.gpr[4],
            bp: r.gpr[5],
        });
        let bounds = match guest {
            Some(r) => oxgrind_symbols::stack_bounds_at(r.sp),
            None => oxgrind_symbols::current_stack_bounds(),
        };
        if let Some((lo, hi)) = bounds {
            if (lo..hi).contains(&addr) {
                return Some(DataAddr::Stack {
                    frame: self.stack_frame_of(addr, hi, guest),
                });
            }
        }
        with_symbolizer(|sym| sym.data_symbol(addr))
            .map(|(name, offset)| DataAddr::Symbol { name, offset })
    }

    fn fatal_signal(&self) -> Option<oxgrind_tool::FatalSignal> {
        *crate::exit::FATAL_SIGNAL.lock()
    }

    fn xml(&self, text: &str) {
        match xml_fd() {
            Some(fd) => oxgrind_sys::fd::write_all(fd, text.as_bytes()),
            None => {
                if LOG_FAILED.swap(1, Ordering::Relaxed) == 0 {
                    oxgrind_sys::fd::write_all(2, b"oxgrind: cannot create the --xml-file\n");
                }
            }
        }
    }

    fn exit_now(&self, status: i32) {
        raw::exit_group(status)
    }

    fn noaccess_mapping(&self, addr: u64) -> Option<bool> {
        crate::mapstate::state(addr)
    }

    fn live_blocks(&self) -> Vec<LiveBlock> {
        BLOCKS.live_blocks()
    }

    fn with_roots(&self, f: &mut dyn FnMut(&[RootRange])) {
        crate::roots::with_roots(f)
    }

    fn with_roots_from(&self, sp: Addr, f: &mut dyn FnMut(&[RootRange])) {
        crate::roots::with_roots_from(sp, f)
    }

    fn read_words(&self, start: Addr, len: u64, f: &mut dyn FnMut(Addr, u64)) {
        crate::roots::read_words(start, len, f)
    }

    fn stack_at(&self, regs: &oxgrind_tool::instrument::GuestRegs, depth: usize) -> StackId {
        crate::stacks::capture_regs(&STACKS, regs.rip, regs.rsp(), regs.rbp(), depth)
    }

    fn instructions(&self) -> u64 {
        oxgrind_engine::instructions_executed()
    }

    fn counter(&self, id: oxgrind_tool::instrument::CounterId) -> u64 {
        oxgrind_engine::counter_total(id)
    }

    fn counter_seen(&self, id: oxgrind_tool::instrument::CounterId) -> u64 {
        oxgrind_engine::counter_total_seen(id)
    }

    fn indexed_counter_totals(&self, totals: &mut [u64]) {
        oxgrind_engine::indexed_counter_totals(totals)
    }

    fn shadow(&self) -> Option<oxgrind_tool::instrument::ShadowMap> {
        // SAFETY: written once during single-threaded set-up, before any reader.
        unsafe { *SHADOW.get_unchecked() }
    }

    fn flush_trace(&self) {
        oxgrind_engine::flush_trace()
    }

    fn forget_hot_range(&self, lo: Addr, hi: Addr) {
        oxgrind_engine::forget_hot_range(lo, hi)
    }

    fn run_native(&self, f: &mut dyn FnMut()) {
        oxgrind_engine::run_native(f)
    }

    fn tid(&self) -> i32 {
        raw::gettid()
    }

    fn first_undefined(&self, addr: Addr, len: u64) -> Option<Addr> {
        oxgrind_engine::definedness::first_undefined(addr, len)
    }

    fn read_memory(&self, addr: Addr, buf: &mut [u8]) -> usize {
        raw::read_own_memory(addr, buf)
    }

    fn usable_size(&self, addr: Addr) -> u64 {
        if !self.holds_chunk(addr) {
            return 0;
        }
        // SAFETY: a live block of glibc's (`holds_chunk`): the program's, or the one whose
        // event is being handled on this thread.
        unsafe { crate::hooks::glibc_usable_size(addr as *mut core::ffi::c_void) }
    }

    fn block_extent(&self, addr: Addr) -> Option<oxgrind_tool::BlockExtent> {
        if !self.holds_chunk(addr) {
            return None;
        }
        // SAFETY: `addr` is a chunk of glibc's allocator that it has not been given back.
        Some(unsafe { crate::hooks::glibc_extent(addr) })
    }

    fn release_freed(&self, addr: Addr, before: &mut dyn FnMut(Option<oxgrind_tool::BlockExtent>)) {
        crate::hooks::release_kept(addr, before)
    }

    fn with_thread_state(&self, f: &mut dyn FnMut(&mut [u8])) -> bool {
        oxgrind_engine::with_thread_state(f)
    }

    fn each_thread_state(&self, f: &mut dyn FnMut(&[u8])) {
        oxgrind_engine::each_thread_state(f)
    }

    fn set_definedness(&self, addr: Addr, len: u64, defined: bool) {
        oxgrind_engine::definedness::set(addr, len, defined)
    }

    fn prefetch_definedness(&self, addr: Addr, len: u64) {
        oxgrind_engine::definedness::prefetch_for_write(addr, len)
    }

    fn copy_definedness(&self, src: Addr, dst: Addr, len: u64) {
        oxgrind_engine::definedness::copy(src, dst, len)
    }

    fn set_undefined_from(&self, addr: Addr, len: u64, origin: oxgrind_tool::Origin) {
        oxgrind_engine::definedness::set_undefined_from(addr, len, origin)
    }

    fn origin_of_memory(&self, addr: Addr) -> Option<oxgrind_tool::Origin> {
        oxgrind_engine::definedness::origin_of_memory(addr)
    }

    fn undefined_origin(&self) -> Option<oxgrind_tool::Origin> {
        oxgrind_engine::definedness::undefined_origin()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(func: &str, mangled: Option<&str>) -> Frame {
        Frame {
            ip: 0x10,
            function: Some(func.into()),
            mangled: mangled.map(String::from),
            file: Some("a.c".into()),
            dir: Some("/src/proj/./lib".into()),
            line: 3,
            object: None,
        }
    }

    #[test]
    fn frame_options_apply_to_every_tool() {
        let mut core = oxgrind_options::CoreOptions::default();
        let inl = vec![frame("inner", None), frame("outer", Some("_Z5outerv"))];
        assert_eq!(present(inl.clone(), &core).len(), 2);
        core.read_inline_info = false;
        core.demangle = false;
        let f = present(inl, &core);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].function.as_deref(), Some("_Z5outerv"));
        core.fullpath_after = vec!["proj/".into()];
        let f = present(vec![frame("f", None)], &core);
        assert_eq!(f[0].file.as_deref(), Some("lib/a.c"));
        core.fullpath_after = vec![String::new()];
        let f = present(vec![frame("f", None)], &core);
        assert_eq!(f[0].file.as_deref(), Some("/src/proj/./lib/a.c"));
    }

    #[test]
    fn time_stamps_go_inside_the_prefix() {
        assert_eq!(
            time_stamped("==7== hi\n==7== \n", 3_723_004),
            "==00:01:02:03.004 7== hi\n==00:01:02:03.004 7== \n"
        );
    }
}
