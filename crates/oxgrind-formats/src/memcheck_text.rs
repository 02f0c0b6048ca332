//! Memcheck's text report, line for line as Valgrind 3.19 prints it (formats.md §4).
//!
//! Every line of the log channel carries a prefix (`==PID== ` for user messages, `--PID-- `
//! for debug ones); a blank line keeps the prefix and its trailing space. This module only
//! renders: which errors exist, how they are merged and counted, and what the leak checker
//! found are the tool's business. The same [`ErrorBlock`] feeds the XML writer
//! ([`crate::memcheck_xml`]), so text and XML cannot disagree on a headline.

use crate::frame::Frame;
use crate::number::commify;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;

/// One line of an error after the headline and its stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Aux {
    /// Printed after one space (`==PID==  Address 0x... is 0 bytes inside ...`).
    Text(String),
    /// A stack belonging to the previous text line (alloc or free stack).
    Stack(Vec<Frame>),
}

/// An error as the user reads it: headline, primary stack, descriptions.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ErrorBlock {
    pub what: String,
    pub stack: Vec<Frame>,
    pub aux: Vec<Aux>,
}

/// Appends `==PID== text\n`.
pub fn line(out: &mut String, pid: i32, text: &str) {
    let _ = writeln!(out, "=={pid}== {text}");
}

/// Appends `--PID-- text\n` (debug channel: `-v`, used suppressions).
pub fn debug_line(out: &mut String, pid: i32, text: &str) {
    let _ = writeln!(out, "--{pid}-- {text}");
}

/// `   at 0x...: fn (file:line)` then `   by ...` lines.
pub fn stack(out: &mut String, pid: i32, frames: &[Frame]) {
    for (i, f) in frames.iter().enumerate() {
        let kw = if i == 0 { "at" } else { "by" };
        let _ = writeln!(out, "=={pid}==    {kw} {f}");
    }
}

/// The whole block: headline, stack, aux lines, and the closing blank line.
pub fn error_block(out: &mut String, pid: i32, e: &ErrorBlock) {
    line(out, pid, &e.what);
    stack(out, pid, &e.stack);
    for a in &e.aux {
        match a {
            Aux::Text(t) => {
                let _ = writeln!(out, "=={pid}==  {t}");
            }
            Aux::Stack(s) => stack(out, pid, s),
        }
    }
    line(out, pid, "");
}

/// `Thread N:` / `Thread N name:` shown before an error of another thread than the last one.
pub fn thread_header(out: &mut String, pid: i32, tid: i32, name: Option<&str>) {
    match name {
        Some(n) => line(out, pid, &format!("Thread {tid} {n}:")),
        None => line(out, pid, &format!("Thread {tid}:")),
    }
}

/// The start-up banner. `parent_pid` is shown when logging to a file (`Parent PID:`).
pub fn preamble(out: &mut String, pid: i32, command: &[String], parent_pid: Option<i32>) {
    tool_banner(
        out,
        pid,
        "Memcheck, a memory error detector",
        "Copyright (C) 2002-2022, and GNU GPL'd, by Julian Seward et al.",
        command,
        parent_pid,
    );
}

/// Every tool's start-up banner: its name line, its copyright line, the core's line, the
/// command, the parent pid when logging to a file, and an empty line.
pub fn tool_banner(
    out: &mut String,
    pid: i32,
    name: &str,
    copyright: &str,
    command: &[String],
    parent_pid: Option<i32>,
) {
    line(out, pid, name);
    line(out, pid, copyright);
    line(
        out,
        pid,
        "Using Valgrind-3.19.0 and LibVEX; rerun with -h for copyright info",
    );
    line(out, pid, &format!("Command: {}", command.join(" ")));
    if let Some(pp) = parent_pid {
        line(out, pid, &format!("Parent PID: {pp}"));
    }
    line(out, pid, "");
}

// ---- fatal signals -----------------------------------------------------------------------

/// `SIGSEGV`, ... (Linux x86-64 numbering).
pub fn signal_name(sig: i32) -> &'static str {
    const NAMES: [&str; 32] = [
        "",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    NAMES
        .get(sig as usize)
        .copied()
        .filter(|n| !n.is_empty())
        .unwrap_or("SIG???")
}

/// What the kernel says went wrong (Valgrind's words for `si_code`), and whether an address
/// goes with it. `None` for a signal that was sent rather than raised by a fault.
pub fn fault_event(sig: i32, code: i32) -> Option<(&'static str, bool)> {
    if code <= 0 {
        return None;
    }
    let e = match (sig, code) {
        (11, 1) => ("Access not within mapped region", true),
        (11, 2) => ("Bad permissions for mapped region", true),
        (11, 0x80) => ("General Protection Fault", false),
        (4, 1) => ("Illegal opcode", true),
        (4, 2) => ("Illegal operand", true),
        (4, 3) => ("Illegal addressing mode", true),
        (4, 4) => ("Illegal trap", true),
        (4, 5) => ("Privileged opcode", true),
        (4, 6) => ("Privileged register", true),
        (4, 7) => ("Coprocessor error", true),
        (4, 8) => ("Internal stack error", true),
        (8, 1) => ("Integer divide by zero", true),
        (8, 2) => ("Integer overflow", true),
        (8, 3) => ("FP divide by zero", true),
        (8, 4) => ("FP overflow", true),
        (8, 5) => ("FP underflow", true),
        (8, 6) => ("FP inexact", true),
        (8, 7) => ("FP invalid operation", true),
        (8, 8) => ("FP subscript out of range", true),
        (7, 1) => ("Invalid address alignment", true),
        (7, 2) => ("Non-existent physical address", true),
        (7, 3) => ("Hardware error", true),
        _ => return None,
    };
    Some(e)
}

/// The line Valgrind's core prints when the main thread's stack runs out, at the fault,
/// whether the program catches the SIGSEGV or dies of it (then [`fatal_signal`] says it
/// again under the fault's line): `base` is the page it could not grow to.
pub fn stack_overflow(out: &mut String, pid: i32, base: u64) {
    line(out, pid, &stack_overflow_text(base));
}

fn stack_overflow_text(base: u64) -> String {
    format!("Stack overflow in thread #1: can't grow stack to {base:#x}")
}

/// The block Memcheck prints when the program dies by a signal (formats.md §4.8).
/// `main_stack_size`: shown with the stack-overflow hint for a SIGSEGV on unmapped memory.
/// `stack_overflow`: the page the main thread's stack could not grow to, when it ran out:
/// Valgrind says so under the fault's line (and at the fault, [`stack_overflow`]).
#[allow(clippy::too_many_arguments)]
pub fn fatal_signal(
    out: &mut String,
    pid: i32,
    sig: i32,
    code: i32,
    addr: u64,
    frames: &[Frame],
    dumping_core: bool,
    main_stack_size: u64,
    stack_overflow: Option<u64>,
) {
    let overflow = stack_overflow.map(stack_overflow_text);
    line(out, pid, "");
    let core = if dumping_core { ": dumping core" } else { "" };
    line(
        out,
        pid,
        &format!(
            "Process terminating with default action of signal {sig} ({}){core}",
            signal_name(sig)
        ),
    );
    if let Some((event, with_addr)) = fault_event(sig, code) {
        if with_addr {
            line(
                out,
                pid,
                &format!(" {event} at address {addr:#X}").replace("0X", "0x"),
            );
        } else {
            line(out, pid, &format!(" {event}"));
        }
    }
    if let Some(l) = &overflow {
        line(out, pid, l);
    }
    stack(out, pid, frames);
    if sig == 11 && code == 1 {
        for l in [
            " If you believe this happened as a result of a stack",
            " overflow in your program's main thread (unlikely but",
            " possible), you can try to increase the size of the",
            " main thread stack using the --main-stacksize= flag.",
        ] {
            line(out, pid, l);
        }
        line(
            out,
            pid,
            &format!(" The main thread stack size used in this run was {main_stack_size}."),
        );
    }
}

// ---- headlines ---------------------------------------------------------------------------

pub const INVALID_FREE: &str = "Invalid free() / delete / delete[] / realloc()";
pub const MISMATCHED_FREE: &str = "Mismatched free() / delete / delete []";

/// `Argument 'size' of function malloc has a fishy (possibly negative) value: -5`.
pub fn fishy_value(function: &str, argument: &str, value: u64) -> String {
    format!(
        "Argument '{argument}' of function {function} has a fishy (possibly negative) value: {}",
        value as i64
    )
}

/// `Source and destination overlap in strncpy(0x1fff0005dd, 0x1fff0005da, 10)`.
pub fn overlap(function: &str, dst: u64, src: u64, len: Option<u64>) -> String {
    match len {
        Some(n) => format!("Source and destination overlap in {function}({dst:#x}, {src:#x}, {n})"),
        None => format!("Source and destination overlap in {function}({dst:#x}, {src:#x})"),
    }
}

/// Valgrind 3.22's `Invalid alignment value: 3 (should be power of 2)`; 3.19 has no such
/// error, so this is the newer text.
pub fn invalid_alignment(align: u64, why: &str) -> String {
    format!("Invalid alignment value: {align}{why}")
}

/// `Invalid read of size 4` / `Invalid write of size 8`.
pub fn invalid_access(write: bool, size: u32) -> String {
    let dir = if write { "write" } else { "read" };
    format!("Invalid {dir} of size {size}")
}

/// `Address 0x4a40068 is 0 bytes after a block of size 40 alloc'd` and friends: `offset`
/// is `addr - block start` (negative: before the block).
pub fn address_in_block(addr: u64, offset: i64, size: u64, freed: bool) -> String {
    let state = if freed { "free'd" } else { "alloc'd" };
    let (n, rel) = if offset < 0 {
        (offset.unsigned_abs(), "before")
    } else if offset as u64 >= size {
        (offset as u64 - size, "after")
    } else {
        (offset as u64, "inside")
    };
    format!(
        "Address {addr:#x} is {} bytes {rel} a block of size {} {state}",
        commify(n),
        commify(size)
    )
}

/// `Address 0x... is not stack'd, malloc'd or (recently) free'd`.
pub fn address_unknown(addr: u64) -> String {
    format!("Address {addr:#x} is not stack'd, malloc'd or (recently) free'd")
}

/// `Address 0x1fff0005c0 is on thread 1's stack`.
pub fn address_on_stack(addr: u64, tid: i32) -> String {
    format!("Address {addr:#x} is on thread {tid}'s stack")
}

/// `256 bytes below stack pointer`: the line after "is on thread N's stack" for an address
/// below `rsp` (Valgrind prints the number without separators).
pub fn below_stack_pointer(bytes: u64) -> String {
    format!("{bytes} bytes below stack pointer")
}

/// `Address 0x4852064 is in a rw- anonymous segment`, `... is in a r-- mapped file
/// /etc/passwd segment`: an address in a mapping no heap block or symbol covers. `perms`:
/// `rwx` with `-` for each missing; `kind`: `anonymous`, `mapped file`, `shared memory`;
/// `file`: the mapped file's name.
pub fn address_in_segment(addr: u64, perms: &str, kind: &str, file: Option<&str>) -> String {
    match file {
        Some(f) => format!("Address {addr:#x} is in a {perms} {kind} {f} segment"),
        None => format!("Address {addr:#x} is in a {perms} {kind} segment"),
    }
}

/// `Address 0x4035008 is in the brk data segment 0x4035000-0x4035fff` (`[base, limit)`),
/// or, past the limit in its last page, `is N bytes after the brk data segment limit 0x...`.
pub fn address_in_brk(addr: u64, base: u64, limit: u64) -> String {
    if addr < limit {
        format!(
            "Address {addr:#x} is in the brk data segment {base:#x}-{:#x}",
            limit - 1
        )
    } else {
        format!(
            "Address {addr:#x} is {} bytes after the brk data segment limit {limit:#x}",
            addr - limit
        )
    }
}

/// `in frame #1, created by bad_frees (mc_heap.c:35)`: the function owning the frame, and
/// the line where it starts.
pub fn in_frame(k: usize, frame: &Frame) -> String {
    let func = frame.function.as_deref().unwrap_or("???");
    match (&frame.file, frame.line) {
        (Some(file), line) if line > 0 => {
            format!("in frame #{k}, created by {func} ({file}:{line})")
        }
        _ => format!("in frame #{k}, created by {func}"),
    }
}

/// `Address 0x10c060 is 0 bytes inside data symbol "global_array"`.
pub fn address_in_data_symbol(addr: u64, offset: u64, name: &str) -> String {
    format!(
        "Address {addr:#x} is {} bytes inside data symbol \"{name}\"",
        crate::number::commify(offset)
    )
}

pub const BLOCK_WAS_ALLOCD_AT: &str = "Block was alloc'd at";

// ---- leaks -------------------------------------------------------------------------------

/// Loss-record kind words, indexed like [`crate::suppressions::LeakKind`].
pub fn leak_kind_words(kind: crate::suppressions::LeakKind) -> &'static str {
    use crate::suppressions::LeakKind::*;
    match kind {
        Definite => "definitely lost",
        Indirect => "indirectly lost",
        Possible => "possibly lost",
        Reachable => "still reachable",
    }
}

/// `80 (16 direct, 64 indirect) bytes in 1 blocks are definitely lost in loss record 5 of 6`.
pub fn loss_record_what(
    direct: u64,
    indirect: u64,
    blocks: u64,
    kind: crate::suppressions::LeakKind,
    n: usize,
    total: usize,
) -> String {
    loss_record_what_since(direct, indirect, blocks, None, kind, n, total)
}

/// The same head line for a delta leak search (`VALGRIND_DO_ADDED_LEAK_CHECK`,
/// `..._CHANGED_...`): each number followed by its change since the previous search,
/// `before` = that search's (direct, indirect, blocks) for this record (zeros for a new
/// one): `48 (+16) bytes in 3 (+1) blocks are ...`. `None` prints no changes.
pub fn loss_record_what_since(
    direct: u64,
    indirect: u64,
    blocks: u64,
    before: Option<(u64, u64, u64)>,
    kind: crate::suppressions::LeakKind,
    n: usize,
    total: usize,
) -> String {
    let d = |now: u64, old: u64| before.map(|_| delta(now, old)).unwrap_or_default();
    let (b_direct, b_indirect, b_blocks) = before.unwrap_or_default();
    let bytes = if indirect > 0 {
        format!(
            "{}{} ({}{} direct, {}{} indirect)",
            commify(direct + indirect),
            d(direct + indirect, b_direct + b_indirect),
            commify(direct),
            d(direct, b_direct),
            commify(indirect),
            d(indirect, b_indirect),
        )
    } else {
        format!("{}{}", commify(direct), d(direct, b_direct))
    };
    format!(
        "{bytes} bytes in {}{} blocks are {} in loss record {} of {}",
        commify(blocks),
        d(blocks, b_blocks),
        leak_kind_words(kind),
        commify(n),
        commify(total)
    )
}

/// How a number moved since the previous leak search, as a delta search prints it after
/// the number: ` (+1,024)`, ` (-40)`, ` (+0)`.
pub fn delta(now: u64, before: u64) -> String {
    if now >= before {
        format!(" (+{})", commify(now - before))
    } else {
        format!(" (-{})", commify(before - now))
    }
}

/// `HEAP SUMMARY:` and its two lines, then a blank line.
pub fn heap_summary(
    out: &mut String,
    pid: i32,
    in_use_bytes: u64,
    in_use_blocks: u64,
    allocs: u64,
    frees: u64,
    allocated: u64,
) {
    line(out, pid, "HEAP SUMMARY:");
    line(
        out,
        pid,
        &format!(
            "    in use at exit: {} bytes in {} blocks",
            commify(in_use_bytes),
            commify(in_use_blocks)
        ),
    );
    line(
        out,
        pid,
        &format!(
            "  total heap usage: {} allocs, {} frees, {} bytes allocated",
            commify(allocs),
            commify(frees),
            commify(allocated)
        ),
    );
    line(out, pid, "");
}

/// Bytes and blocks of one LEAK SUMMARY line.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Amount {
    pub bytes: u64,
    pub blocks: u64,
}

/// The numbers of the LEAK SUMMARY (direct bytes only, as Memcheck counts them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeakSummary {
    pub definite: Amount,
    pub indirect: Amount,
    pub possible: Amount,
    pub reachable: Amount,
    /// `of which reachable via heuristic:` lines, by heuristic name, only those with blocks.
    pub heuristics: Vec<(&'static str, Amount)>,
    pub suppressed: Amount,
}

/// Which hint lines follow the LEAK SUMMARY.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LeakMode {
    Summary,
    Full { reachable_shown: bool },
}

pub fn leak_summary(out: &mut String, pid: i32, s: &LeakSummary, mode: LeakMode) {
    leak_summary_since(out, pid, s, None, mode)
}

/// The LEAK SUMMARY of a delta leak search: each number followed by its change since
/// `before` (the previous search's summary); a heuristic line of `s` missing from `before`
/// changed from zero. `None` prints no changes (the ordinary summary).
pub fn leak_summary_since(
    out: &mut String,
    pid: i32,
    s: &LeakSummary,
    before: Option<&LeakSummary>,
    mode: LeakMode,
) {
    let amt = |a: Amount, old: Option<Amount>| {
        let d = |now: u64, then: Option<u64>| then.map(|t| delta(now, t)).unwrap_or_default();
        format!(
            "{}{} bytes in {}{} blocks",
            commify(a.bytes),
            d(a.bytes, old.map(|o| o.bytes)),
            commify(a.blocks),
            d(a.blocks, old.map(|o| o.blocks))
        )
    };
    let old = |pick: fn(&LeakSummary) -> Amount| before.map(pick);
    line(out, pid, "LEAK SUMMARY:");
    line(
        out,
        pid,
        &format!(
            "   definitely lost: {}",
            amt(s.definite, old(|b| b.definite))
        ),
    );
    line(
        out,
        pid,
        &format!(
            "   indirectly lost: {}",
            amt(s.indirect, old(|b| b.indirect))
        ),
    );
    line(
        out,
        pid,
        &format!(
            "     possibly lost: {}",
            amt(s.possible, old(|b| b.possible))
        ),
    );
    line(
        out,
        pid,
        &format!(
            "   still reachable: {}",
            amt(s.reachable, old(|b| b.reachable))
        ),
    );
    if !s.heuristics.is_empty() {
        line(
            out,
            pid,
            "                      of which reachable via heuristic:",
        );
        for (name, a) in &s.heuristics {
            let then = before.map(|b| {
                b.heuristics
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, a)| *a)
                    .unwrap_or_default()
            });
            line(
                out,
                pid,
                &format!("                        {name:<19}: {}", amt(*a, then)),
            );
        }
    }
    line(
        out,
        pid,
        &format!(
            "        suppressed: {}",
            amt(s.suppressed, old(|b| b.suppressed))
        ),
    );
    let any = s.definite.blocks + s.indirect.blocks + s.possible.blocks + s.reachable.blocks > 0;
    match mode {
        LeakMode::Summary if any => line(
            out,
            pid,
            "Rerun with --leak-check=full to see details of leaked memory",
        ),
        LeakMode::Full {
            reachable_shown: false,
        } if s.reachable.blocks > 0 => {
            line(
                out,
                pid,
                "Reachable blocks (those to which a pointer was found) are not shown.",
            );
            line(
                out,
                pid,
                "To see them, rerun with: --leak-check=full --show-leak-kinds=all",
            );
        }
        _ => {}
    }
    line(out, pid, "");
}

/// `ERROR SUMMARY: 12 errors from 12 contexts (suppressed: 0 from 0)` (no thousands
/// separators here).
pub fn error_summary(errors: u64, contexts: u64, supp_errors: u64, supp_contexts: u64) -> String {
    format!("ERROR SUMMARY: {errors} errors from {contexts} contexts (suppressed: {supp_errors} from {supp_contexts})")
}

/// `used_suppression:      3 leak-indirect-wild test.supp:8 suppressed: 144 bytes in 3 blocks`.
pub fn used_suppression(
    count: u64,
    name: &str,
    file: &str,
    line_no: u32,
    leak: Option<Amount>,
) -> String {
    let mut s = format!("used_suppression: {count:>6} {name} {file}:{line_no}");
    if let Some(a) = leak {
        let _ = write!(
            s,
            " suppressed: {} bytes in {} blocks",
            commify(a.bytes),
            commify(a.blocks)
        );
    }
    s
}

/// Error-limit notices (formats.md §4.7).
pub const MORE_THAN_100: [&str; 2] = [
    "More than 100 errors detected.  Subsequent errors",
    "will still be recorded, but in less detail than before.",
];
pub const GIVING_UP_TAIL: [&str; 4] = [
    "Final error counts will be inaccurate.  Go fix your program!",
    "Rerun with --error-limit=no to disable this cutoff.  Note",
    "that errors may occur in your program without prior warning from",
    "Valgrind, because errors are no longer being displayed.",
];
pub const MORE_THAN_1000: &str =
    "More than 1000 different errors detected.  I'm not reporting any more.";
pub const MORE_THAN_10M: &str =
    "More than 10000000 total errors detected.  I'm not reporting any more.";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suppressions::LeakKind;
    use alloc::string::ToString;
    use alloc::vec;

    fn f(ip: u64, func: &str, file: &str, line: u32) -> Frame {
        Frame {
            ip,
            function: Some(func.into()),
            file: Some(file.into()),
            line,
            ..Default::default()
        }
    }
    fn pre(ip: u64, func: &str) -> Frame {
        Frame {
            ip,
            function: Some(func.into()),
            object: Some("/usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so".into()),
            ..Default::default()
        }
    }

    #[test]
    fn double_free_block_matches_reference_text() {
        let e = ErrorBlock {
            what: INVALID_FREE.into(),
            stack: vec![
                pre(0x484417B, "free"),
                f(0x109276, "main", "mc_errors.c", 31),
            ],
            aux: vec![
                Aux::Text(address_in_block(0x4a40040, 0, 40, true)),
                Aux::Stack(vec![
                    pre(0x484417B, "free"),
                    f(0x109260, "main", "mc_errors.c", 28),
                ]),
                Aux::Text(BLOCK_WAS_ALLOCD_AT.into()),
                Aux::Stack(vec![
                    pre(0x48417B4, "malloc"),
                    f(0x109238, "main", "mc_errors.c", 23),
                ]),
            ],
        };
        let mut out = String::new();
        error_block(&mut out, 19191, &e);
        let expected = "==19191== Invalid free() / delete / delete[] / realloc()
==19191==    at 0x484417B: free (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==19191==    by 0x109276: main (mc_errors.c:31)
==19191==  Address 0x4a40040 is 0 bytes inside a block of size 40 free'd
==19191==    at 0x484417B: free (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==19191==    by 0x109260: main (mc_errors.c:28)
==19191==  Block was alloc'd at
==19191==    at 0x48417B4: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==19191==    by 0x109238: main (mc_errors.c:23)
==19191== \n";
        assert_eq!(out, expected);
    }

    #[test]
    fn address_descriptions_say_before_inside_after_with_commas() {
        assert_eq!(
            address_in_block(0x4a40068, 40, 40, false),
            "Address 0x4a40068 is 0 bytes after a block of size 40 alloc'd"
        );
        assert_eq!(
            address_in_block(0x10, 4, 40, false),
            "Address 0x10 is 4 bytes inside a block of size 40 alloc'd"
        );
        assert_eq!(
            address_in_block(0x10, -8, 40, true),
            "Address 0x10 is 8 bytes before a block of size 40 free'd"
        );
        assert_eq!(
            address_in_block(0x10, 1024, 2048, false),
            "Address 0x10 is 1,024 bytes inside a block of size 2,048 alloc'd"
        );
        assert_eq!(
            address_unknown(0x1fff001000),
            "Address 0x1fff001000 is not stack'd, malloc'd or (recently) free'd"
        );
    }

    #[test]
    fn headlines_match_valgrind() {
        assert_eq!(
            fishy_value("malloc", "size", (-5i64) as u64),
            "Argument 'size' of function malloc has a fishy (possibly negative) value: -5"
        );
        assert_eq!(
            overlap("strncpy", 0x1fff0005dd, 0x1fff0005da, Some(10)),
            "Source and destination overlap in strncpy(0x1fff0005dd, 0x1fff0005da, 10)"
        );
        assert_eq!(
            overlap("strcpy", 0x10, 0x11, None),
            "Source and destination overlap in strcpy(0x10, 0x11)"
        );
    }

    #[test]
    fn invalid_access_headlines_match_valgrind() {
        assert_eq!(invalid_access(false, 4), "Invalid read of size 4");
        assert_eq!(invalid_access(true, 16), "Invalid write of size 16");
    }

    #[test]
    fn loss_record_headlines_match_reference() {
        assert_eq!(
            loss_record_what(16, 64, 1, LeakKind::Definite, 5, 6),
            "80 (16 direct, 64 indirect) bytes in 1 blocks are definitely lost in loss record 5 of 6"
        );
        assert_eq!(
            loss_record_what(24, 0, 1, LeakKind::Indirect, 1, 6),
            "24 bytes in 1 blocks are indirectly lost in loss record 1 of 6"
        );
        assert_eq!(
            loss_record_what(72704, 0, 1, LeakKind::Reachable, 1, 1),
            "72,704 bytes in 1 blocks are still reachable in loss record 1 of 1"
        );
    }

    #[test]
    fn delta_searches_print_each_numbers_change() {
        assert_eq!(
            loss_record_what_since(48, 0, 3, Some((0, 0, 0)), LeakKind::Definite, 4, 10),
            "48 (+48) bytes in 3 (+3) blocks are definitely lost in loss record 4 of 10"
        );
        assert_eq!(
            loss_record_what_since(0, 0, 0, Some((40, 0, 1)), LeakKind::Possible, 2, 10),
            "0 (-40) bytes in 0 (-1) blocks are possibly lost in loss record 2 of 10"
        );
        assert_eq!(
            loss_record_what_since(2048, 1024, 2, Some((1024, 0, 1)), LeakKind::Definite, 1, 1),
            "3,072 (+2,048) (2,048 (+1,024) direct, 1,024 (+1,024) indirect) bytes in 2 (+1) blocks are definitely lost in loss record 1 of 1"
        );
        let now = LeakSummary {
            definite: Amount {
                bytes: 176,
                blocks: 7,
            },
            reachable: Amount {
                bytes: 4496,
                blocks: 3,
            },
            heuristics: vec![("length64", Amount::default())],
            ..Default::default()
        };
        let before = LeakSummary {
            definite: Amount {
                bytes: 176,
                blocks: 7,
            },
            reachable: Amount {
                bytes: 4696,
                blocks: 4,
            },
            heuristics: vec![(
                "length64",
                Amount {
                    bytes: 31,
                    blocks: 1,
                },
            )],
            ..Default::default()
        };
        let mut out = String::new();
        leak_summary_since(&mut out, 7, &now, Some(&before), LeakMode::Summary);
        assert_eq!(
            out,
            "==7== LEAK SUMMARY:\n\
             ==7==    definitely lost: 176 (+0) bytes in 7 (+0) blocks\n\
             ==7==    indirectly lost: 0 (+0) bytes in 0 (+0) blocks\n\
             ==7==      possibly lost: 0 (+0) bytes in 0 (+0) blocks\n\
             ==7==    still reachable: 4,496 (-200) bytes in 3 (-1) blocks\n\
             ==7==                       of which reachable via heuristic:\n\
             ==7==                         length64           : 0 (-31) bytes in 0 (-1) blocks\n\
             ==7==         suppressed: 0 (+0) bytes in 0 (+0) blocks\n\
             ==7== Rerun with --leak-check=full to see details of leaked memory\n\
             ==7== \n"
        );
    }

    #[test]
    fn summaries_match_reference_files() {
        let mut out = String::new();
        heap_summary(&mut out, 19242, 0, 0, 5, 5, 72761);
        assert_eq!(
            out,
            "==19242== HEAP SUMMARY:\n==19242==     in use at exit: 0 bytes in 0 blocks\n==19242==   total heap usage: 5 allocs, 5 frees, 72,761 bytes allocated\n==19242== \n"
        );
        let s = LeakSummary {
            definite: Amount {
                bytes: 100,
                blocks: 1,
            },
            indirect: Amount::default(),
            possible: Amount {
                bytes: 64,
                blocks: 1,
            },
            reachable: Amount {
                bytes: 33,
                blocks: 1,
            },
            heuristics: vec![],
            suppressed: Amount {
                bytes: 80,
                blocks: 3,
            },
        };
        let mut out = String::new();
        leak_summary(
            &mut out,
            6362,
            &s,
            LeakMode::Full {
                reachable_shown: false,
            },
        );
        assert_eq!(
            out,
            "==6362== LEAK SUMMARY:
==6362==    definitely lost: 100 bytes in 1 blocks
==6362==    indirectly lost: 0 bytes in 0 blocks
==6362==      possibly lost: 64 bytes in 1 blocks
==6362==    still reachable: 33 bytes in 1 blocks
==6362==         suppressed: 80 bytes in 3 blocks
==6362== Reachable blocks (those to which a pointer was found) are not shown.
==6362== To see them, rerun with: --leak-check=full --show-leak-kinds=all
==6362== \n"
        );
        let mut out = String::new();
        leak_summary(
            &mut out,
            1,
            &LeakSummary {
                heuristics: vec![(
                    "stdstring",
                    Amount {
                        bytes: 56,
                        blocks: 2,
                    },
                )],
                ..s
            },
            LeakMode::Summary,
        );
        assert!(out.contains("==1==                       of which reachable via heuristic:\n==1==                         stdstring          : 56 bytes in 2 blocks\n"));
        assert!(
            out.contains("==1== Rerun with --leak-check=full to see details of leaked memory\n")
        );
        assert_eq!(
            error_summary(12, 12, 0, 0),
            "ERROR SUMMARY: 12 errors from 12 contexts (suppressed: 0 from 0)"
        );
        assert_eq!(
            used_suppression(
                3,
                "leak-indirect-wild",
                "test.supp",
                8,
                Some(Amount { bytes: 144, blocks: 3 })
            ),
            "used_suppression:      3 leak-indirect-wild test.supp:8 suppressed: 144 bytes in 3 blocks"
        );
        assert_eq!(
            used_suppression(1, "fishy", "test.supp", 23, None),
            "used_suppression:      1 fishy test.supp:23"
        );
    }

    #[test]
    fn preamble_matches_reference() {
        let mut out = String::new();
        preamble(&mut out, 6324, &["./mc_errors".to_string()], Some(6322));
        assert_eq!(
            out,
            "==6324== Memcheck, a memory error detector
==6324== Copyright (C) 2002-2022, and GNU GPL'd, by Julian Seward et al.
==6324== Using Valgrind-3.19.0 and LibVEX; rerun with -h for copyright info
==6324== Command: ./mc_errors
==6324== Parent PID: 6322
==6324== \n"
        );
    }
}
