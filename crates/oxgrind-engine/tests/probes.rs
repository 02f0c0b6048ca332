//! The tool-facing probes (`oxgrind_engine::probe`) report exactly what the program does.
//!
//! The `preload` example's test tool (`OXGRIND_ENGINE_PROBE`) puts a counter bump, a pc
//! call and an access call before every instruction of one assembly function and tallies
//! the accesses that land in one buffer. The function makes a known set of accesses of
//! every kind the interface promises: plain loads and stores, a read-modify-write, a
//! 32-byte vector load, each iteration of `rep stosb` and `rep movsq`, a masked AVX2
//! gather (6 of 8 lanes enabled), and implicit stack accesses (`push`, `pop`, `call`,
//! `ret`) with the stack pointer moved into the buffer.

mod common;

use common::{compile, preload};
use std::process::Command;

/// Address and size of symbol `name` in `bin` (`nm -S`).
fn symbol(bin: &std::path::Path, name: &str) -> (u64, u64) {
    let out = Command::new("nm")
        .arg("-S")
        .arg(bin)
        .output()
        .expect("run nm");
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 4 && f[3] == name {
            let addr = u64::from_str_radix(f[0], 16).unwrap();
            let size = u64::from_str_radix(f[1], 16).unwrap();
            return (addr, size);
        }
    }
    panic!("no symbol {name} in {}", bin.display());
}

fn tally(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

fn has_avx2() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains(" avx2"))
}

fn has_avx512() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| {
        [" avx512f", " avx512bw", " avx512vl"]
            .iter()
            .all(|f| c.contains(f))
    })
}

/// Runs the probe test program `program` (`probe_work` or `probe_masked`) with the test
/// tool; returns its report line.
fn probe_report(program: &str, filter: &str) -> String {
    let source = match program {
        "probe_work" => include_str!("probe_work.c.txt"),
        _ => include_str!("probe_masked.c.txt"),
    };
    probe_report_of(program, source, filter, false)
}

/// Runs program `source` (its function `work`, its buffer `buf`) with the test tool:
/// `filter` as `OXGRIND_ENGINE_PROBE_FILTER`, trace probes if `trace`.
fn probe_report_of(stem: &str, source: &str, filter: &str, trace: bool) -> String {
    // One binary per mode: the tests run in parallel in one directory.
    let name = format!("{stem}_{filter}_{}", trace as u8);
    let bin = compile(&name, "c", source, &["-no-pie", "-pthread"]);
    let (code, code_len) = symbol(&bin, "work");
    let (data, data_len) = symbol(&bin, "buf");
    let spec = format!(
        "{code:x}:{:x}:{data:x}:{:x}",
        code + code_len,
        data + data_len
    );
    let out = Command::new(&bin)
        .env("LD_PRELOAD", preload())
        .env("OXGRIND_ENGINE_PROBE", &spec)
        .env("OXGRIND_ENGINE_PROBE_FILTER", filter)
        .env("OXGRIND_ENGINE_PROBE_TRACE", if trace { "1" } else { "0" })
        .output()
        .expect("run the probe test program");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n", "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    stderr
        .lines()
        .find(|l| l.starts_with("oxgrind-engine: probes:"))
        .unwrap_or_else(|| panic!("no probe report: {stderr}"))
        .to_string()
}

fn assert_every_access_seen(line: &str) {
    // 177 instructions, counting each entry of a rep instruction (100 + 1 and 8 + 1).
    assert_eq!(tally(line, "insns"), 177, "{line}");
    // pc calls run before instructions that execute: not the final rep entries.
    assert_eq!(tally(line, "pcs"), 175, "{line}");
    assert_eq!(tally(line, "pc_mismatch"), 0, "{line}");
    // reads: 8 movsq + mov + vmovdqu + 6 gather lanes + pop + ret
    assert_eq!(tally(line, "reads"), 18, "{line}");
    assert_eq!(
        tally(line, "rbytes"),
        8 * 8 + 8 + 32 + 6 * 4 + 8 + 8,
        "{line}"
    );
    // writes: 10 movl + 100 stosb + 8 movsq + push + call
    assert_eq!(tally(line, "writes"), 120, "{line}");
    assert_eq!(tally(line, "wbytes"), 40 + 100 + 64 + 8 + 8, "{line}");
    assert_eq!(tally(line, "modifies"), 1, "{line}");
    assert_eq!(tally(line, "mbytes"), 4, "{line}");
    // Only the gather's lanes are conditional.
    assert_eq!(tally(line, "conditional"), 6, "{line}");
}

#[test]
fn probes_see_every_access_of_every_kind_and_count_each_instruction_once() {
    if !has_avx2() {
        eprintln!("skipped: the test function uses an AVX2 gather");
        return;
    }
    let line = probe_report("probe_work", "0");
    assert_every_access_seen(&line);
    // One call per instruction that accesses memory.
    assert_eq!(tally(&line, "calls"), 131, "{line}");
}

#[test]
fn filtered_probes_call_exactly_for_the_accesses_that_touch_marked_granules() {
    if !has_avx2() {
        eprintln!("skipped: the test function uses an AVX2 gather");
        return;
    }
    // Every granule of the buffer is marked in the shadow map, nothing else: the same
    // accesses are seen, and the five instructions that touch only memory outside the
    // buffer (two vector loads of the gather's operands, push rbx, pop rbx, the final
    // ret) make no call.
    let line = probe_report("probe_work", "1");
    assert_every_access_seen(&line);
    assert_eq!(tally(&line, "calls"), 126, "{line}");
}

/// Masked vector instructions access only the elements their mask enables (EVEX `{k}`
/// masks, `vmaskmov`/`vpmaskmov`/`maskmovdqu` sign masks, AVX-512 gathers, scatters and
/// compress stores): see `probe_masked.c.txt` for each case and its expected accesses.
fn assert_masked_accesses_seen(line: &str) {
    // reads: 2 runs of the byte-masked load + masked compare + 2 vmaskmovps lanes + 8
    // gather lanes + the broadcast element
    assert_eq!(tally(line, "reads"), 14, "{line}");
    assert_eq!(tally(line, "rbytes"), 3 + 4 + 8 + 8 * 4 + 4, "{line}");
    // writes: masked byte store + 2 runs of the dword store + 2 vpmaskmovd runs + 3
    // scatter lanes + compress + unmasked store + 2 maskmovdqu runs (the zero mask: none)
    assert_eq!(tally(line, "writes"), 12, "{line}");
    assert_eq!(
        tally(line, "wbytes"),
        5 + 32 + 16 + 3 * 4 + 3 * 4 + 64 + 4,
        "{line}"
    );
    assert_eq!(tally(line, "modifies"), 0, "{line}");
    // Every masked access is conditional; the unmasked store and the broadcast are not.
    assert_eq!(tally(line, "conditional"), 24, "{line}");
}

#[test]
fn masked_vector_accesses_touch_only_the_enabled_elements() {
    if !has_avx512() {
        eprintln!("skipped: the test function uses AVX-512 (F, BW, VL)");
        return;
    }
    assert_masked_accesses_seen(&probe_report("probe_masked", "0"));
}

#[test]
fn filtered_probes_of_masked_accesses_report_the_enabled_elements() {
    if !has_avx512() {
        eprintln!("skipped: the test function uses AVX-512 (F, BW, VL)");
        return;
    }
    // The inline filter checks the whole operand; the call it makes then reports only
    // the enabled elements, as unfiltered.
    assert_masked_accesses_seen(&probe_report("probe_masked", "1"));
}

#[test]
fn trace_records_of_masked_accesses_are_the_enabled_elements_filtered_or_not() {
    if !has_avx512() {
        eprintln!("skipped: the test function uses AVX-512 (F, BW, VL)");
        return;
    }
    // Filtered, a mask that enables a run from the first element (the 5-byte store, the
    // compare, the zero mask) is read inline, any other takes the clean call: the records
    // are the same as unfiltered, and the same as the access calls see.
    let src = include_str!("probe_masked.c.txt");
    // (Trace probes take the sign-masked AVX accesses, `vmaskmovps`, `vpmaskmovd` and
    // `maskmovdqu`, whole: one record each of 16, 32 and 16 bytes, where the access calls
    // see the 2 runs of each.)
    for filter in ["0", "1"] {
        let line = probe_report_of("probe_masked", src, filter, true);
        assert_eq!(tally(&line, "treads"), 14 - 1, "{line}");
        assert_eq!(tally(&line, "twrites"), 12 - 2, "{line}");
        assert_eq!(tally(&line, "tmodifies"), 0, "{line}");
        let bytes = (3 + 4 + 16 + 8 * 4 + 4) + (5 + 32 + 32 + 3 * 4 + 3 * 4 + 64 + 16);
        assert_eq!(tally(&line, "tbytes"), bytes, "{line}");
    }
}

/// The trace records of the probe test function: the same accesses as the access calls
/// see, one block record per block entry.
fn assert_every_access_traced(line: &str) {
    assert_eq!(tally(line, "insns"), 177, "{line}");
    assert_eq!(tally(line, "treads"), 18, "{line}");
    assert_eq!(tally(line, "twrites"), 120, "{line}");
    assert_eq!(tally(line, "tmodifies"), 1, "{line}");
    let bytes = (8 * 8 + 8 + 32 + 6 * 4 + 8 + 8) + (40 + 100 + 64 + 8 + 8) + 4;
    assert_eq!(tally(line, "tbytes"), bytes, "{line}");
    // Blocks entered: the entry block, the loop body 9 more times, the block before
    // `rep stosb`, its 101 entries, the block before `rep movsq`, its 9 entries, the block
    // up to `call`, `ret`, `jmp`, and the last block.
    assert_eq!(
        tally(line, "tblocks"),
        1 + 9 + 1 + 101 + 1 + 9 + 1 + 1 + 1 + 1,
        "{line}"
    );
    assert_eq!(tally(line, "tstray"), 0, "{line}");
    // No access calls: trace probes are inline (the gather's lanes come from a clean call
    // that appends them).
    assert_eq!(tally(line, "calls"), 0, "{line}");
}

#[test]
fn trace_records_every_access_and_every_block_entry_in_order() {
    if !has_avx2() {
        eprintln!("skipped: the test function uses an AVX2 gather");
        return;
    }
    let src = include_str!("probe_work.c.txt");
    assert_every_access_traced(&probe_report_of("probe_work", src, "0", true));
}

#[test]
fn filtered_trace_records_the_accesses_to_marked_granules() {
    if !has_avx2() {
        eprintln!("skipped: the test function uses an AVX2 gather");
        return;
    }
    // Every granule of the buffer is marked: the records in it are the same as unfiltered.
    let src = include_str!("probe_work.c.txt");
    assert_every_access_traced(&probe_report_of("probe_work", src, "1", true));
}

#[test]
fn per_thread_counters_and_trace_buffers_are_exact_with_threads() {
    // 4 threads, each 100,000 iterations of a 6-instruction loop with one 8-byte store:
    // 6n + 2 instructions, n + 1 block entries and n stores per thread; every buffer is
    // drained many times (4,096 records each).
    let src = include_str!("probe_threads.c.txt");
    let n: u64 = 100_000;
    let line = probe_report_of("probe_threads", src, "0", false);
    assert_eq!(tally(&line, "insns"), 4 * (6 * n + 2), "{line}");
    assert_eq!(tally(&line, "writes"), 4 * n, "{line}");
    for filter in ["0", "1"] {
        let line = probe_report_of("probe_threads", src, filter, true);
        assert_eq!(tally(&line, "insns"), 4 * (6 * n + 2), "{line}");
        assert_eq!(tally(&line, "tblocks"), 4 * (n + 1), "{line}");
        assert_eq!(tally(&line, "twrites"), 4 * n, "{line}");
        assert_eq!(tally(&line, "tbytes"), 4 * n * 8, "{line}");
        assert_eq!(tally(&line, "treads"), 0, "{line}");
        assert_eq!(tally(&line, "tstray"), 0, "{line}");
        assert!(tally(&line, "tdrains") >= 4 * (n + n) / 4096, "{line}");
        // Each worker thread tallied its own drains in its own state (`Needs::thread_state`,
        // zeroed per thread): 4 states with records, summing to every block record. (The
        // exiting thread drains nothing of its own: main runs no probed code.)
        assert_eq!(tally(&line, "tstates"), 4, "{line}");
        assert_eq!(tally(&line, "tstatesum"), 4 * (n + 1), "{line}");
    }
}

#[test]
fn records_of_the_tools_and_embedders_own_work_are_dropped_never_written_past_the_buffer() {
    // The program's own stores: three runs of 1,000 iterations (n + 1 block entries each).
    // In between, 100,000 iterations run by the tool from inside `on_trace` while a flush
    // delivers (translated: the tool was called from the program's thread), and 5,000
    // under the embedder's hold: neither is the program's. Before the fix the first
    // overflowed the 64 KiB buffer into the memory after it (a drain found the buffer being
    // delivered and left it full), and the second reached the tool as the program's.
    let src = include_str!("probe_reenter.c.txt");
    let line = probe_report_of("probe_reenter", src, "0", true);
    let n: u64 = 3 * 1000;
    assert_eq!(tally(&line, "twrites"), n, "{line}");
    assert_eq!(tally(&line, "tblocks"), n + 3, "{line}");
    assert_eq!(tally(&line, "tbytes"), 8 * n, "{line}");
    assert_eq!(tally(&line, "tstray"), 0, "{line}");
}
