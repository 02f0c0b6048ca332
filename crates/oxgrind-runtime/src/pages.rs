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
//! does for what it maps before the program starts. Our own library is left out, with its
//! zero-filled data (the anonymous mapping right after its last segment) and the libraries
//! only it needs (libgcc_s, for a C program), which Valgrind's preload does not bring.
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
    let maps = crate::roots::read_maps();
    let only_ours = libraries_only_we_need(&maps, &self_path);
    // End of the last mapping of a library that is ours (the runtime, or a library only it
    // needs): the anonymous mapping that starts there is its zero-filled data, ours too.
    let mut ours_end = 0;
    for m in &maps {
        let file = m.path.rsplit('/').next().unwrap_or("");
        if m.path == self_path || (m.path.starts_with('/') && only_ours.iter().any(|n| n == file)) {
            ours_end = m.end;
            continue;
        }
        if m.path.is_empty() && m.start == ours_end {
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

/// The libraries our runtime needs that nothing else loaded needs (libgcc_s for a C
/// program): loaded only because of us, so not the program's pages. Names as in
/// `DT_NEEDED` (the file names of Debian's libraries).
fn libraries_only_we_need(maps: &[crate::roots::Mapping], self_path: &str) -> Vec<String> {
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for m in maps {
        // The first (lowest) mapping of each file holds its ELF header.
        if !m.path.starts_with('/') || seen.contains(&m.path.as_str()) {
            continue;
        }
        seen.push(&m.path);
        let needed = elf_needed(m.start, maps);
        if m.path == self_path {
            ours = needed;
        } else {
            theirs.extend(needed);
        }
    }
    ours.retain(|n| !theirs.contains(n));
    ours
}

/// The `DT_NEEDED` names of the ELF object mapped at `base`, read from its loaded image
/// (not through `dl_iterate_phdr`, which takes the loader's lock: set-up can run inside an
/// allocation the loader makes). Every read is checked against the readable mappings.
fn elf_needed(base: u64, maps: &[crate::roots::Mapping]) -> Vec<String> {
    let readable = |a: u64, n: u64| {
        maps.iter()
            .any(|m| m.readable && m.start <= a && a.saturating_add(n) <= m.end)
    };
    let read = |a: u64, n: u64| -> Option<u64> {
        // SAFETY: [a, a + n) lies in a readable mapping (checked); unaligned reads of plain
        // integers.
        readable(a, n).then(|| unsafe {
            match n {
                1 => core::ptr::read(a as *const u8) as u64,
                2 => core::ptr::read_unaligned(a as *const u16) as u64,
                4 => core::ptr::read_unaligned(a as *const u32) as u64,
                _ => core::ptr::read_unaligned(a as *const u64),
            }
        })
    };
    let mut out = Vec::new();
    if read(base, 4) != Some(0x464c_457f) {
        return out; // not "\x7fELF"
    }
    let (Some(phoff), Some(phnum)) = (read(base + 0x20, 8), read(base + 0x38, 2)) else {
        return out;
    };
    const PT_LOAD: u64 = 1;
    const PT_DYNAMIC: u64 = 2;
    let phdr = |i: u64, field: u64, n: u64| read(base + phoff + i * 56 + field, n);
    let mut bias = None;
    let mut dynamic = None;
    for i in 0..phnum.min(64) {
        match phdr(i, 0, 4) {
            Some(PT_LOAD) if bias.is_none() => {
                bias = phdr(i, 16, 8).map(|v| base.wrapping_sub(v & !(PAGE - 1)))
            }
            Some(PT_DYNAMIC) => dynamic = phdr(i, 16, 8).zip(phdr(i, 40, 8)),
            _ => {}
        }
    }
    let (Some(bias), Some((dyn_vaddr, dyn_size))) = (bias, dynamic) else {
        return out;
    };
    let dyn_at = bias.wrapping_add(dyn_vaddr);
    let mut strtab = None;
    let mut offsets = Vec::new();
    for i in 0..(dyn_size / 16).min(512) {
        let (Some(tag), Some(val)) = (read(dyn_at + i * 16, 8), read(dyn_at + i * 16 + 8, 8))
        else {
            break;
        };
        match tag {
            0 => break,
            1 => offsets.push(val),
            // ld.so relocates the pointer in place; an unrelocated one is below the bias.
            5 => {
                strtab = Some(if val < bias {
                    val.wrapping_add(bias)
                } else {
                    val
                })
            }
            _ => {}
        }
    }
    let Some(strtab) = strtab else { return out };
    for off in offsets {
        let mut name = Vec::new();
        let mut a = strtab.wrapping_add(off);
        while name.len() < 256 {
            match read(a, 1) {
                Some(0) | None => break,
                Some(b) => name.push(b as u8),
            }
            a += 1;
        }
        out.push(String::from_utf8_lossy(&name).into_owned());
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needed_libraries_are_read_from_the_loaded_images() {
        let maps = crate::roots::read_maps();
        let first = |suffix: &str| {
            maps.iter()
                .find(|m| m.path.ends_with(suffix))
                .unwrap_or_else(|| panic!("{suffix} not mapped"))
                .start
        };
        assert!(elf_needed(first("/libc.so.6"), &maps)
            .iter()
            .any(|n| n == "ld-linux-x86-64.so.2"));
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let exe_needed = elf_needed(first(&exe.to_string_lossy()), &maps);
        assert!(
            exe_needed.iter().any(|n| n == "libc.so.6"),
            "{exe_needed:?}"
        );
        // Not an ELF header: nothing, and no fault.
        let stack = maps.iter().find(|m| m.path == "[stack]").unwrap();
        assert!(elf_needed(stack.start, &maps).is_empty());
    }
}
