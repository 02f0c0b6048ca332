//! `OXGRIND_PERF_MAP=1`: a perf map (`/tmp/perf-<pid>.map`) naming each code-cache block.
//!
//! Under a translating tool every instruction of the program runs from the code cache, which
//! `perf report` shows as anonymous addresses: the time spent in the program's own code, in
//! glibc's allocator, in inline instrumentation, could not be told apart. perf reads
//! `/tmp/perf-<pid>.map` (`START SIZE NAME`, hexadecimal) when it reports, so the blocks are
//! recorded as they are translated and written at exit, each named by the guest function it
//! came from and its first instruction's address. Naming at translation would run the
//! symboliser under the code cache's lock (and it may `dlopen`, whose `free` reaches the
//! tool). An engine-development aid, off unless asked for.
//!
//! The engine's census of dispatcher entries (`OXGRIND_CENSUS=<prefix>`, another
//! development aid) is written at the same moment, for the same reasons.

use oxgrind_sys::lock::SpinLock;
use oxgrind_sys::raw;

/// Guest pc, host address, host length of each block translated so far.
static BLOCKS: SpinLock<Vec<(u64, u64, u64)>> = SpinLock::new(Vec::new());

/// `OXGRIND_PERF_MAP=code`: the blocks' host code is written too (`/tmp/perf-<pid>.code`:
/// per block its host address and length, little-endian `u64`s, then its bytes), so that
/// samples can be placed on the inline instructions of a block (engine development).
static WITH_CODE: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Blocks recorded at most: the table never grows, because growing copies with libc's
/// `memcpy`, which runs from the code cache and may need a translation, whose hook would
/// wait for this table's lock.
const MAX_BLOCKS: usize = 1 << 20;

/// The engine's `Config::on_translated` when the variable asks for a map.
pub fn hook() -> Option<fn(u64, u64, u64)> {
    match crate::state::env_var("OXGRIND_PERF_MAP").map(|v| &*v) {
        Some(b"1") => {}
        Some(b"code") => WITH_CODE.store(true, core::sync::atomic::Ordering::Relaxed),
        _ => return None,
    }
    BLOCKS.lock().reserve_exact(MAX_BLOCKS);
    Some(on_translated)
}

fn on_translated(guest_pc: u64, host: u64, len: u64) {
    let mut blocks = BLOCKS.lock();
    if blocks.len() < blocks.capacity() {
        blocks.push((guest_pc, host, len));
    }
}

/// Writes the map (at exit, before the tool's report: blocks translated later are missing).
/// Natively: the exit path runs from the code cache, and translated code holding the table's
/// lock would wait for itself at the next translation.
pub fn write() {
    oxgrind_engine::run_native(&mut write_natively);
    oxgrind_engine::run_native(&mut write_census);
}

fn write_natively() {
    use oxgrind_tool::Host;
    let blocks = core::mem::take(&mut *BLOCKS.lock());
    if blocks.is_empty() {
        return;
    }
    let mut text = String::new();
    if WITH_CODE.load(core::sync::atomic::Ordering::Relaxed) {
        let mut code = Vec::new();
        for &(_, host, len) in &blocks {
            code.extend_from_slice(&host.to_le_bytes());
            code.extend_from_slice(&len.to_le_bytes());
            // SAFETY: translations are never freed (the code cache only grows while the
            // process runs), so `len` bytes at `host` are mapped and readable.
            code.extend_from_slice(unsafe {
                core::slice::from_raw_parts(host as *const u8, len as usize)
            });
        }
        let path = format!("/tmp/perf-{}.code", raw::getpid());
        let _ = oxgrind_tool::Host::write_file(&crate::host::HOST, &path, &code);
    }
    for (guest, host, len) in blocks {
        let name = crate::host::HOST
            .describe(guest)
            .pop()
            .and_then(|f| f.function)
            .unwrap_or_default();
        text.push_str(&format!("{host:x} {len:x} [oxg] {name}@0x{guest:x}\n"));
    }
    let path = format!("/tmp/perf-{}.map", raw::getpid());
    let _ = oxgrind_tool::Host::write_file(&crate::host::HOST, &path, text.as_bytes());
}

/// Where the census goes (`OXGRIND_CENSUS`, read at start: the program may change its
/// environment), `None` when off.
static CENSUS_PREFIX: SpinLock<Option<String>> = SpinLock::new(None);

/// Turns the engine's census on when `OXGRIND_CENSUS` asks for it (before the engine starts).
pub fn start_census() {
    if let Some(v) = crate::state::env_var("OXGRIND_CENSUS").filter(|v| !v.is_empty()) {
        *CENSUS_PREFIX.lock() = Some(String::from_utf8_lossy(v).into_owned());
        oxgrind_engine::census::enable();
    }
}

/// Writes the engine's census of dispatcher entries to `<prefix>.<pid>`, natively for the
/// same reason as the map.
fn write_census() {
    let Some(prefix) = CENSUS_PREFIX.lock().clone() else {
        return;
    };
    let Some(text) = oxgrind_engine::census::report() else {
        return;
    };
    // Sites are named by the function (and object) their pc lies in.
    use oxgrind_tool::Host;
    let mut named = String::with_capacity(text.len() * 2);
    for line in text.lines() {
        named.push_str(line);
        let pc = line
            .split_whitespace()
            .nth(1)
            .and_then(|w| w.strip_prefix("0x"))
            .and_then(|h| u64::from_str_radix(h, 16).ok());
        if let Some(frame) = pc.and_then(|pc| crate::host::HOST.describe(pc).pop()) {
            named.push_str(&format!(
                "  {} {}:{} ({})",
                frame.function.unwrap_or_default(),
                frame.file.unwrap_or_default(),
                frame.line,
                frame.object.unwrap_or_default()
            ));
        }
        named.push('\n');
    }
    let text = named;
    let path = format!("{prefix}.{}", raw::getpid());
    let _ = oxgrind_tool::Host::write_file(&crate::host::HOST, &path, text.as_bytes());
}
