//! Client requests the core answers for every tool, as Valgrind's core does
//! (`coregrind/m_scheduler/scheduler.c`, `do_client_request`): `VALGRIND_PRINTF` and
//! `VALGRIND_PRINTF_BACKTRACE` (the message on the log, `**PID** ` before each line), and
//! `VALGRIND_STACK_REGISTER` / `_DEREGISTER` / `_CHANGE` (the program's own stacks, for
//! coroutine libraries; ids from 1). `RUNNING_ON_VALGRIND` is the engine's (it is answered
//! even without a tool); the tool answers its own requests after these
//! (`oxgrind_engine::Config::core_requests`).
//!
//! Runs in a clean call, inside the runtime (`guard::Entered`): glibc's `vsnprintf`, which
//! formats the program's message from its `va_list`, may allocate, and its blocks then are
//! not the program's.

use oxgrind_sys::lock::SpinLock;
use oxgrind_tool::instrument::GuestRegs;
use oxgrind_tool::Host;

use crate::host::HOST;
use crate::state;

const PRINTF: u64 = 0x1401;
const PRINTF_BACKTRACE: u64 = 0x1402;
const PRINTF_VALIST_BY_REF: u64 = 0x1403;
const PRINTF_BACKTRACE_VALIST_BY_REF: u64 = 0x1404;
const STACK_REGISTER: u64 = 0x1501;
const STACK_DEREGISTER: u64 = 0x1502;
const STACK_CHANGE: u64 = 0x1503;

/// A stack the program registered: id, start, end.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ClientStack {
    pub id: u64,
    pub start: u64,
    pub end: u64,
}

/// The registered stacks and the next id.
static STACKS: SpinLock<(Vec<ClientStack>, u64)> = SpinLock::new((Vec::new(), 1));

/// Answers a core request; `None` leaves it to the tool (`oxgrind_engine::Config::core_requests`).
pub fn answer(args: &[u64; 6], regs: &GuestRegs) -> Option<u64> {
    if !matches!(args[0], PRINTF..=PRINTF_BACKTRACE_VALIST_BY_REF | STACK_REGISTER..=STACK_CHANGE) {
        return None;
    }
    // What we do here (glibc's vsnprintf, symbolising) is ours, not the program's. A request
    // made from inside the runtime (never: our code makes none) would find the flag set.
    let Some(_inside) = crate::guard::Entered::try_enter() else {
        return None;
    };
    match args[0] {
        // On x86-64 a `va_list` is an array: the old request passes it by reference too.
        PRINTF | PRINTF_VALIST_BY_REF => Some(printf(args[1], args[2], None)),
        PRINTF_BACKTRACE | PRINTF_BACKTRACE_VALIST_BY_REF => {
            Some(printf(args[1], args[2], Some(regs)))
        }
        STACK_REGISTER => {
            let mut s = STACKS.lock();
            let id = s.1;
            s.1 += 1;
            let (start, end) = (args[1].min(args[2]), args[1].max(args[2]));
            s.0.push(ClientStack { id, start, end });
            Some(id)
        }
        STACK_DEREGISTER => {
            STACKS.lock().0.retain(|s| s.id != args[1]);
            Some(0)
        }
        STACK_CHANGE => {
            if let Some(s) = STACKS.lock().0.iter_mut().find(|s| s.id == args[1]) {
                s.start = args[2].min(args[3]);
                s.end = args[2].max(args[3]);
            }
            Some(0)
        }
        _ => None,
    }
}

/// The stacks the program registered (for describing addresses).
pub fn client_stacks() -> Vec<ClientStack> {
    STACKS.lock().0.clone()
}

extern "C" {
    fn vsnprintf(buf: *mut u8, n: usize, fmt: *const u8, ap: *mut u64) -> i32;
}

/// Formats the program's message (`fmt`, and the `va_list` at `ap`), writes it to the log
/// with `**PID** ` before each line, then the stack at `regs` if asked; returns the length
/// of the message, as Valgrind.
fn printf(fmt: u64, ap: u64, backtrace: Option<&GuestRegs>) -> u64 {
    if fmt == 0 || ap == 0 {
        return 0;
    }
    // The va_list itself (gp_offset, fp_offset, overflow_arg_area, reg_save_area): copied,
    // as va_copy does, so a message longer than the first buffer can be formatted again.
    let mut va = [0u8; 24];
    if oxgrind_sys::raw::read_own_memory(ap, &mut va) != va.len() {
        return 0;
    }
    let mut cap = 1024usize;
    let text = loop {
        let mut copy = [0u64; 3];
        for (w, b) in copy.iter_mut().zip(va.chunks_exact(8)) {
            *w = u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        }
        let mut buf = vec![0u8; cap];
        // SAFETY: `buf` has `cap` bytes; `fmt` and the copied va_list are the program's own
        // arguments to a printf-like request, which it must make valid (a bad format is the
        // program's fault as natively); glibc reads the arguments the va_list points at.
        let n = unsafe { vsnprintf(buf.as_mut_ptr(), cap, fmt as *const u8, copy.as_mut_ptr()) };
        if n < 0 {
            return 0;
        }
        let n = n as usize;
        if n < cap || cap >= 1 << 20 {
            buf.truncate(n.min(cap - 1));
            break String::from_utf8_lossy(&buf).into_owned();
        }
        cap = n + 1;
    };
    let Some(rt) = state::runtime() else {
        return text.len() as u64;
    };
    if rt.core.xml.is_some() {
        // Valgrind writes a <clientmsg> into the XML; not done yet.
        return text.len() as u64;
    }
    let pid = HOST.pid();
    let mut out = String::new();
    for line in text.split_inclusive('\n') {
        out.push_str(&format!("**{pid}** {line}"));
    }
    if !text.ends_with('\n') && !text.is_empty() {
        out.push('\n');
    }
    if let Some(regs) = backtrace {
        let id = HOST.stack_at(regs, rt.core.view.num_callers);
        let mut frames = Vec::new();
        'stack: for ip in HOST.stack(id) {
            let mut group = HOST.describe(ip);
            if group.is_empty() {
                group.push(oxgrind_tool::Frame {
                    ip,
                    ..Default::default()
                });
            }
            for f in group {
                let main = f.function.as_deref() == Some("main");
                frames.push(f);
                if main && !rt.core.view.show_below_main {
                    break 'stack;
                }
            }
        }
        oxgrind_formats::memcheck_text::stack(&mut out, pid, &frames);
    }
    HOST.log(&out);
    text.len() as u64
}
