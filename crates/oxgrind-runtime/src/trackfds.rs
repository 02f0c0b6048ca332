//! `--track-fds=yes|all`: the file descriptors the program leaves open at exit, each with
//! the stack that opened it, as Valgrind's core prints them for every tool, before the
//! tool's own summary.
//!
//! The descriptor a call creates is only known once the call has returned, and calls made
//! inside libc (`fopen`, `opendir`, `socket` from `getaddrinfo`) never go through the PLT,
//! so interposing the libc wrappers would miss them. The translation engine sees each of
//! the program's descriptor system calls come back and tells us its result with the
//! guest's registers (`oxgrind_engine::Config::on_fd_syscall`): the opening stack is
//! captured there. `--track-fds` therefore runs the program under the engine whatever the tool.
//!
//! What is open at exit is read from `/proc/self/fd`, the kernel's own answer, so a
//! descriptor we did not see created (inherited, or closed on exec) is never missed: it is
//! printed as `<inherited from parent>`, as Valgrind prints those it found open at start.
//! The order is Valgrind's: most recently opened first (its list is prepended to), the
//! inherited ones after, highest first; a descriptor reused by `dup2` keeps its place.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use oxgrind_sys::lock::SpinLock;
use oxgrind_tool::StackId;

use crate::guard::{self, Entered};
use crate::state::{self, STACKS};

/// Whether `--track-fds` is on (set once, before the engine starts).
static ON: AtomicBool = AtomicBool::new(false);
/// Orders the records: a later opening has a larger number. Inherited descriptors are 0.
static SEQ: AtomicU64 = AtomicU64::new(1);

/// Where a live descriptor came from.
#[derive(Clone, Copy)]
struct Record {
    fd: i32,
    seq: u64,
    stack: StackId,
}

/// The program's descriptors opened since we started watching, by the stacks that opened
/// them. Touched only on descriptor system calls and at exit.
static OPENED: SpinLock<Vec<Record>> = SpinLock::new(Vec::new());

/// Turns tracking on: called from our constructor before the engine takes over.
pub fn enable() {
    ON.store(true, Ordering::Release);
}

pub fn enabled() -> bool {
    ON.load(Ordering::Acquire)
}

/// A descriptor system call of the program's that has just come back (the engine tells).
pub fn on_engine_syscall(call: &oxgrind_engine::MemorySyscall) {
    if (-4095..0).contains(&call.result) || guard::inside() {
        return; // failed, or ours through a libc call
    }
    let (lo, hi) = crate::stacks::self_text();
    let pc = call.regs.rip;
    // Our own raw system calls are not the program's, except those of the wrappers that
    // keep our descriptors out of its reach (fds.rs: close, close_range, dup2, dup3), which
    // make the program's call for it.
    if lo <= pc && pc < hi && !matches!(call.nr, 3 | 33 | 292 | 436) {
        return;
    }
    let a = call.args;
    let r = call.result;
    match call.nr {
        // close
        3 => closed(a[0] as i32, a[0] as i32),
        // close_range without CLOSE_RANGE_CLOEXEC (which only marks them)
        436 if a[2] & 4 == 0 => closed(
            a[0].min(i32::MAX as u64) as i32,
            a[1].min(i32::MAX as u64) as i32,
        ),
        436 => {}
        // pipe, pipe2, socketpair: two descriptors written to the array argument
        22 | 293 | 53 => {
            let at = if call.nr == 53 { a[3] } else { a[0] };
            let mut b = [0u8; 8];
            if oxgrind_sys::raw::read_own_memory(at, &mut b) == 8 {
                let first = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                let second = i32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                opened(&[first, second], call);
            }
        }
        // fcntl: only F_DUPFD and F_DUPFD_CLOEXEC create one
        72 if a[1] == 0 || a[1] == 1030 => opened(&[r as i32], call),
        72 => {}
        // open, dup, dup2 (even onto itself: Valgrind then records the new stack), socket, accept, creat, openat, accept4, dup3, openat2
        _ => opened(&[r as i32], call),
    }
}

fn closed(first: i32, last: i32) {
    OPENED.lock().retain(|rec| rec.fd < first || rec.fd > last);
}

fn opened(fds: &[i32], call: &oxgrind_engine::MemorySyscall) {
    let Some(rt) = state::runtime() else { return };
    let Some(_inside) = Entered::try_enter() else {
        return;
    };
    let regs = &call.regs;
    // Valgrind's first frame is the instruction after the `syscall` (2 bytes).
    let stack = crate::stacks::capture_regs(
        &STACKS,
        regs.rip + 2,
        regs.rsp(),
        regs.rbp(),
        rt.core.view.num_callers,
    );
    // A call made through our wrappers (fds.rs's dup2) shows the program's frames only.
    let (lo, hi) = crate::stacks::self_text();
    let frames = STACKS.frames(stack);
    let stack = if frames.iter().any(|&ip| lo <= ip && ip < hi) {
        let kept: Vec<u64> = frames
            .iter()
            .copied()
            .filter(|&ip| ip < lo || ip >= hi)
            .collect();
        STACKS.intern(&kept)
    } else {
        stack
    };
    let mut list = OPENED.lock();
    for &fd in fds {
        if let Some(rec) = list.iter_mut().find(|rec| rec.fd == fd) {
            // Replaced in place by dup2/dup3 onto it: Valgrind keeps the entry's position.
            rec.stack = stack;
        } else {
            let seq = SEQ.fetch_add(1, Ordering::AcqRel);
            list.push(Record { fd, seq, stack });
        }
    }
}

/// "FILE DESCRIPTORS: N open (M std) at exit." and a block per descriptor, from the log.
pub fn report() {
    use oxgrind_tool::Host;
    if !enabled() {
        return;
    }
    let Some(rt) = state::runtime() else { return };
    let all = rt.core.track_fds == oxgrind_options::TrackFds::All;
    let mut fds: Vec<i32> = match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect(),
        Err(_) => return,
    };
    // The directory's own descriptor is closed now: readlink fails on it.
    let engine_fd = oxgrind_engine::own_fd();
    let mut open: Vec<(i32, String)> = Vec::new();
    for fd in fds.drain(..) {
        if crate::fds::is_ours(fd as i64) || Some(fd) == engine_fd {
            continue;
        }
        let Ok(target) = std::fs::read_link(format!("/proc/self/fd/{fd}")) else {
            continue;
        };
        open.push((fd, target.to_string_lossy().into_owned()));
    }
    let records = OPENED.lock().clone();
    let std_count = open.iter().filter(|(fd, _)| *fd <= 2).count();
    // (seq, fd, stack); inherited ones have seq 0.
    let mut order: Vec<(u64, i32, Option<StackId>, &str)> = open
        .iter()
        .map(|(fd, target)| {
            let rec = records.iter().find(|r| r.fd == *fd);
            (
                rec.map_or(0, |r| r.seq),
                *fd,
                rec.map(|r| r.stack),
                target.as_str(),
            )
        })
        .collect();
    order.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    let pid = crate::host::HOST.pid();
    let mut text = String::new();
    use oxgrind_formats::memcheck_text as t;
    // Under --xml=yes, Valgrind 3.19 writes the list to the log without the stacks, with
    // no blank line before and one more after, and the stacks into the XML (`take_xml`).
    let xml_on = rt.core.view.xml;
    let mut xml = String::new();
    if !xml_on {
        t::line(&mut text, pid, "");
    }
    t::line(
        &mut text,
        pid,
        &format!(
            "FILE DESCRIPTORS: {} open ({} std) at exit.",
            open.len(),
            std_count
        ),
    );
    for (_, fd, stack, target) in order {
        if fd <= 2 && !all {
            continue;
        }
        t::line(&mut text, pid, &headline(fd, target));
        match stack {
            Some(stack) if xml_on => {
                oxgrind_formats::memcheck_xml::stack(&mut xml, &crate::exit::core_frames(stack))
            }
            Some(stack) => t::stack(&mut text, pid, &crate::exit::core_frames(stack)),
            None => t::line(&mut text, pid, "   <inherited from parent>"),
        }
        t::line(&mut text, pid, "");
    }
    if xml_on {
        t::line(&mut text, pid, "");
        *XML.lock() = Some(xml);
    }
    crate::host::HOST.log(&text);
}

/// Under `--xml=yes`, the stacks `report` wrote for the tool's XML stream.
static XML: SpinLock<Option<String>> = SpinLock::new(None);

/// The `<stack>` elements of the last `report` under `--xml=yes`
/// (`Host::track_fds_xml`), once.
pub fn take_xml() -> Option<String> {
    XML.lock().take()
}

/// "Open file descriptor N: PATH", or the socket's form ("Open AF_INET socket N: local <->
/// peer", "Open AF_UNIX socket N: path").
fn headline(fd: i32, target: &str) -> String {
    if target.starts_with("socket:") {
        if let Some(s) = socket_headline(fd) {
            return s;
        }
    }
    if target.starts_with('/') {
        // The name it was opened with, as Valgrind keeps it, even if since unlinked.
        let target = target.strip_suffix(" (deleted)").unwrap_or(target);
        format!("Open file descriptor {fd}: {target}")
    } else {
        format!("Open file descriptor {fd}:")
    }
}

const SYS_GETSOCKNAME: usize = 51;
const SYS_GETPEERNAME: usize = 52;

/// The socket's address as getsockname/getpeername give it (`None` when the call fails).
fn sock_addr(nr: usize, fd: i32) -> Option<([u8; 128], usize)> {
    let mut buf = [0u8; 128];
    let mut len: u32 = buf.len() as u32;
    // SAFETY: the kernel writes at most `len` bytes to `buf` and the length to `len`, both
    // ours and live for the call.
    let r = unsafe {
        oxgrind_sys::syscall::syscall3(
            nr,
            fd as usize,
            buf.as_mut_ptr() as usize,
            &mut len as *mut u32 as usize,
        )
    };
    (r >= 0).then_some((buf, (len as usize).min(128)))
}

/// Valgrind's `inet2name`: `a.b.c.d:port`, or `<unbound>` for 0.0.0.0:0.
fn inet_name(a: &[u8; 128]) -> String {
    let port = u16::from_be_bytes([a[2], a[3]]);
    let ip = [a[4], a[5], a[6], a[7]];
    if port == 0 && ip == [0; 4] {
        "<unbound>".into()
    } else {
        format!("{}.{}.{}.{}:{port}", ip[0], ip[1], ip[2], ip[3])
    }
}

fn socket_headline(fd: i32) -> Option<String> {
    let (local, len) = sock_addr(SYS_GETSOCKNAME, fd)?;
    let family = u16::from_ne_bytes([local[0], local[1]]);
    Some(match family {
        2 => {
            let peer = match sock_addr(SYS_GETPEERNAME, fd) {
                Some((p, _)) => inet_name(&p),
                None => "unbound".into(),
            };
            format!("Open AF_INET socket {fd}: {} <-> {peer}", inet_name(&local))
        }
        1 => {
            let path = &local[2..len.max(2)];
            let end = path.iter().position(|&b| b == 0).unwrap_or(path.len());
            let name = if end == 0 {
                "<unknown>".to_string()
            } else {
                String::from_utf8_lossy(&path[..end]).into_owned()
            };
            format!("Open AF_UNIX socket {fd}: {name}")
        }
        f => format!("Open pf-{f} socket {fd}:"),
    })
}
