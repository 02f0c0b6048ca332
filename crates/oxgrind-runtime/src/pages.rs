//! Page-level events for `--pages-as-heap=yes`: every `mmap`, `munmap`, `mremap` and `brk`
//! the program makes, glibc's own included.
//!
//! Interposing the libc wrappers would miss most of them: glibc's malloc grows its heap with
//! internal calls to `mmap` and `brk` that never go through the PLT. Two ways to see them
//! all, one per way the program runs:
//!
//! * **Under the translation engine** (`--time-unit=i`, the default, or any tool that
//!   translates), the engine performs these four system calls itself and calls
//!   [`on_engine_syscall`] with the arguments, the result and the guest registers
//!   (`oxgrind_engine::Config::on_memory_syscall`). Calls made from our own library (the
//!   private heap) or while the runtime works (a libc call of ours) are left out.
//! * **Natively** (`--time-unit=ms` or `B`), as a sandbox would, a seccomp filter traps exactly
//!   these four system calls when they are issued from anywhere but our own library. The
//!   SIGSYS handler performs the call itself (from our code, so the filter lets it through),
//!   puts the result where the program expects it, and reports the pages. A seccomp trap
//!   cannot work under the engine: the program's system calls execute from the code cache,
//!   not from where the filter expects them, and the handler's own call would be trapped
//!   again (that is how every program used to crash with `--time-unit=i`).
//!
//! Either way the event is captured with the stack at the system call and queued: a call
//! made inside glibc's malloc holds its arena lock, and naming a new stack (which Massif
//! does) may allocate. Queued events reach the tool in order at the next safe point: the
//! next allocator call on any thread, or the final report.
//!
//! Mappings that exist when we start watching (the executable, ld.so, the libraries it
//! mapped, the initial stack; under the engine, everything mapped before it takes over) are
//! reported once, on the empty stack `[0]`, which Massif prints as `0x0: ???`, as Valgrind
//! does for what it maps before the program starts. Our own library is left out, its
//! zero-filled data (the anonymous mapping right after its last segment) included.
//!
//! Costs and side effects of the native way, all confined to this mode: a filter runs on
//! every system call; the process gets `no_new_privs` (required to install a filter without
//! privileges), so set-user-ID programs it executes do not gain privileges; SIGSYS belongs to
//! oxgrind.

use core::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use oxgrind_sys::syscall::{syscall1, syscall3, syscall6};
use oxgrind_tool::{Mapping, StackId};

use crate::guard::{self, Entered};
use crate::host::HOST;
use crate::state::{self, STACKS};

const SYS_MMAP: usize = 9;
const SYS_MUNMAP: usize = 11;
const SYS_BRK: usize = 12;
const SYS_MREMAP: usize = 25;
const SYS_PRCTL: usize = 157;
const SYS_SECCOMP: usize = 317;
const SIGSYS: c_int = 31;
const PAGE: u64 = 4096;

/// Whether SIGSYS is ours (then the program's `sigaction` cannot take it).
pub static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The program break as last seen.
static BRK: AtomicU64 = AtomicU64::new(0);

/// A page event captured in the handler, waiting for a safe point.
struct Pending {
    map: bool,
    ev: Mapping,
}

static QUEUE: oxgrind_sys::lock::SpinLock<Vec<Pending>> =
    oxgrind_sys::lock::SpinLock::new(Vec::new());
/// Whether QUEUE may be non-empty (checked on every allocator call: one relaxed load).
static QUEUED: AtomicBool = AtomicBool::new(false);

/// Hands queued page events to the tool, in order. Called at safe points, on a thread that
/// is inside oxgrind (re-entrancy flag set) and holds no lock of ours.
#[inline]
pub fn deliver_queued() {
    if !QUEUED.load(Ordering::Acquire) {
        return;
    }
    deliver_slow();
}

#[cold]
fn deliver_slow() {
    let Some(rt) = state::runtime() else { return };
    loop {
        let batch = {
            let mut q = QUEUE.lock();
            QUEUED.store(false, Ordering::Release);
            core::mem::take(&mut *q)
        };
        if batch.is_empty() {
            return;
        }
        for p in &batch {
            if p.map {
                rt.tool.on_map(&HOST, &p.ev);
            } else {
                rt.tool.on_unmap(&HOST, &p.ev);
            }
        }
    }
}

fn round_up(n: u64) -> u64 {
    n.div_ceil(PAGE) * PAGE
}

#[repr(C)]
struct SockFilter {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

#[repr(C)]
struct SockFprog {
    len: u16,
    filter: *const SockFilter,
}

const fn stmt(code: u16, k: u32) -> SockFilter {
    SockFilter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}
const fn jump(code: u16, k: u32, jt: u8, jf: u8) -> SockFilter {
    SockFilter { code, jt, jf, k }
}

const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const RET_K: u16 = 0x06;
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_TRAP: u32 = 0x0003_0000;
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;

/// Starts watching page events at set-up. Under the engine nothing happens yet: the start-up
/// mappings are taken when the engine takes over ([`before_engine`]) and the engine reports
/// the rest. Natively: reports the mappings that exist now, installs the SIGSYS handler and
/// the filter. Returns an error text when the kernel refuses (then page events are simply
/// absent).
pub fn install() -> Result<(), &'static str> {
    let Some(rt) = state::runtime() else {
        return Ok(());
    };
    if crate::wants_engine(&rt.needs) {
        return Ok(());
    }
    start_watching();
    install_filter()
}

/// Under the engine: the mappings that exist just before it takes over, and the break.
pub fn before_engine() {
    if state::runtime().is_some() {
        start_watching();
    }
}

/// The engine could not start: the program runs natively, so the filter it is.
pub fn engine_failed() {
    if state::runtime().is_some() {
        if let Err(why) = install_filter() {
            oxgrind_sys::fd::write_all(2, format!("oxgrind: {why}\n").as_bytes());
        }
    }
}

fn start_watching() {
    report_startup_mappings();
    // SAFETY: brk(0) only queries the current break.
    BRK.store(unsafe { syscall1(SYS_BRK, 0) } as u64, Ordering::Release);
}

/// A guest memory system call the engine has just performed (`Config::on_memory_syscall`).
pub fn on_engine_syscall(call: &oxgrind_engine::MemorySyscall) {
    if (-4095..0).contains(&call.result) {
        return;
    }
    let (lo, hi) = crate::stacks::self_text();
    let pc = call.regs.rip;
    if lo <= pc && pc < hi {
        return; // our own raw system call (the private heap): not the program's
    }
    let a = call.args.map(|x| x as usize);
    let r = &call.regs;
    report(
        call.nr as usize,
        a,
        call.result as u64,
        r.rip,
        r.rsp(),
        r.rbp(),
    );
}

fn install_filter() -> Result<(), &'static str> {
    let (lo, hi) = crate::stacks::self_text();
    if lo == 0 || (lo >> 32) != ((hi - 1) >> 32) {
        return Err("cannot locate oxgrind's own code for the system-call filter");
    }
    crate::exit::set_handler_nodefer(SIGSYS, on_sigsys as *const () as usize);
    ACTIVE.store(true, Ordering::Release);

    let filter = [
        stmt(LD_W_ABS, 4),                    // 0: arch
        jump(JEQ_K, AUDIT_ARCH_X86_64, 0, 5), // 1: other ABI -> allow
        stmt(LD_W_ABS, 0),                    // 2: nr
        jump(JEQ_K, SYS_MMAP as u32, 4, 0),   // 3
        jump(JEQ_K, SYS_MUNMAP as u32, 3, 0), // 4
        jump(JEQ_K, SYS_MREMAP as u32, 2, 0), // 5
        jump(JEQ_K, SYS_BRK as u32, 1, 0),    // 6
        stmt(RET_K, RET_ALLOW),               // 7
        stmt(LD_W_ABS, 12),                   // 8: instruction pointer, high
        jump(JEQ_K, (lo >> 32) as u32, 0, 4), // 9: not our region -> trap
        stmt(LD_W_ABS, 8),                    // 10: instruction pointer, low
        jump(JGE_K, lo as u32, 0, 2),         // 11: below our code -> trap
        jump(JGE_K, hi as u32, 1, 0),         // 12: above our code -> trap
        stmt(RET_K, RET_ALLOW),               // 13: our own call
        stmt(RET_K, RET_TRAP),                // 14
    ];
    let prog = SockFprog {
        len: filter.len() as u16,
        filter: filter.as_ptr(),
    };
    const PR_SET_NO_NEW_PRIVS: usize = 38;
    const SECCOMP_SET_MODE_FILTER: usize = 1;
    const SECCOMP_FILTER_FLAG_TSYNC: usize = 1;
    // SAFETY: prctl with integer arguments; seccomp reads `prog` and the filter array,
    // both alive for the call.
    let ok = unsafe {
        syscall6(SYS_PRCTL, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, 0) == 0
            && syscall3(
                SYS_SECCOMP,
                SECCOMP_SET_MODE_FILTER,
                SECCOMP_FILTER_FLAG_TSYNC,
                &prog as *const _ as usize,
            ) >= 0
    };
    if ok {
        Ok(())
    } else {
        ACTIVE.store(false, Ordering::Release);
        Err("the kernel refused the system-call filter that --pages-as-heap=yes needs")
    }
}

fn report_startup_mappings() {
    let Some(rt) = state::runtime() else { return };
    let startup = STACKS.intern(&[0]);
    let self_path = crate::stacks::self_path();
    let mut ours: Vec<(u64, u64)> = Vec::with_capacity(16384);
    oxgrind_sys::heap::for_each_region(|s, l| {
        if ours.len() < ours.capacity() {
            ours.push((s as u64, (s + l) as u64));
        }
    });
    let tid = guard::tid();
    // End of our library's last mapping: the anonymous mapping that starts there is its
    // zero-filled data (.bss), ours too.
    let mut self_end = 0;
    for m in crate::roots::read_maps() {
        if m.path == self_path {
            self_end = m.end;
            continue;
        }
        if m.path.is_empty() && m.start == self_end {
            continue;
        }
        if matches!(m.path.as_str(), "[vsyscall]" | "[vvar]" | "[vvar_vclock]") {
            continue;
        }
        if ours.iter().any(|&(s, e)| s < m.end && m.start < e) {
            continue;
        }
        let ev = Mapping {
            addr: m.start,
            len: m.end - m.start,
            stack: startup,
            tid,
        };
        rt.tool.on_map(&HOST, &ev);
    }
}

extern "C" fn on_sigsys(_sig: c_int, info: *mut c_void, ctx: *mut c_void) {
    // SAFETY: the kernel passes a siginfo_t (si_syscall at offset 24) and a ucontext_t whose
    // general registers start at offset 40, both valid for the handler's duration.
    unsafe {
        let nr = *((info as *const u8).add(24) as *const c_int) as usize;
        let gregs = (ctx as *mut u8).add(40) as *mut u64;
        let a = [
            *gregs.add(8),
            *gregs.add(9),
            *gregs.add(12),
            *gregs.add(2),
            *gregs.add(0),
            *gregs.add(1),
        ];
        let a = a.map(|x| x as usize);
        let ret = syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
        *gregs.add(13) = ret as u64; // RAX
        if (-4095..0).contains(&ret) {
            return;
        }
        report(
            nr,
            a,
            ret as u64,
            *gregs.add(16),
            *gregs.add(15),
            *gregs.add(10),
        );
    }
}

/// Queues the page event of a successful system call made at `pc` (stack pointer `sp`,
/// frame pointer `bp`): the stack is its own address first, then the callers.
fn report(nr: usize, a: [usize; 6], ret: u64, pc: u64, sp: u64, bp: u64) {
    if guard::inside() {
        return; // oxgrind's own mapping (through a libc call), not the program's
    }
    let Some(rt) = state::runtime() else { return };
    let Some(_inside) = Entered::try_enter() else {
        return;
    };
    let stack: StackId = crate::stacks::capture_regs(&STACKS, pc, sp, bp, rt.needs.stack_depth);
    let tid = guard::tid();
    let ev = |addr: u64, len: u64| Mapping {
        addr,
        len: round_up(len),
        stack,
        tid,
    };
    let mut out: [Option<Pending>; 2] = [None, None];
    match nr {
        SYS_MMAP => {
            out[0] = Some(Pending {
                map: true,
                ev: ev(ret, a[1] as u64),
            })
        }
        SYS_MUNMAP => {
            out[0] = Some(Pending {
                map: false,
                ev: ev(a[0] as u64, a[1] as u64),
            })
        }
        SYS_MREMAP => {
            out[0] = Some(Pending {
                map: false,
                ev: ev(a[0] as u64, a[1] as u64),
            });
            out[1] = Some(Pending {
                map: true,
                ev: ev(ret, a[2] as u64),
            });
        }
        SYS_BRK => {
            let old = BRK.swap(ret, Ordering::AcqRel);
            let (old_end, new_end) = (round_up(old), round_up(ret));
            if new_end > old_end {
                out[0] = Some(Pending {
                    map: true,
                    ev: ev(old_end, new_end - old_end),
                });
            } else if new_end < old_end {
                out[0] = Some(Pending {
                    map: false,
                    ev: ev(new_end, old_end - new_end),
                });
            }
        }
        _ => {}
    }
    let mut q = QUEUE.lock();
    q.extend(out.into_iter().flatten());
    QUEUED.store(true, Ordering::Release);
}
