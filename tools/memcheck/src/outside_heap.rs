//! Invalid accesses outside the heap: below the stack pointer, and to memory nothing is
//! mapped at (a wild pointer), reported as Memcheck reports them.
//!
//! Neither costs the program anything while it behaves, which is why neither uses the
//! shadow map. The shadow would have to be written at every stack-pointer change (as
//! Valgrind marks the memory below `rsp` on each) and over every unmapped range of the
//! address space. Instead:
//!
//! * **Below the stack pointer**: an explicit `[rsp + d]` operand is placed relative to
//!   `rsp` at translation (`Insn::sp_offset`). Only an operand with `d < -128`, past
//!   amd64's red zone, gets a probe. An operand through any other register (a pointer into
//!   a frame whose function has returned) is compared with `rsp` inline, next to the heap's
//!   shadow check (`Plan::accesses_filtered_or_below_sp`): only one that starts within
//!   [`DEAD_FRAME_DEPTH`] below the red zone calls. Either way, on the main thread's stack
//!   it always reports ("Address ... is on thread 1's stack", "N bytes below stack
//!   pointer"), where Valgrind too holds all memory below `rsp` unaddressable. On another
//!   thread's stack Valgrind holds only what the thread's pointer has been below and come
//!   back up from unaddressable: the probe reports above the deepest point the thread's
//!   stack shows it has been (`thread_stack_floor`). Memory that is not the stack `rsp`
//!   is on (another thread's, below), and any stack that is neither the main thread's nor a
//!   glibc thread's (a coroutine's, an alternate signal stack) are left alone.
//! * **Unmapped memory**: such an access faults, and the engine tells the tool before the
//!   signal is delivered (`Tool::on_memory_fault`): with `SEGV_MAPERR` it is reported as
//!   Valgrind reports it before its "Process terminating with default action of signal 11"
//!   block ("Address 0x12345678 is not stack'd, malloc'd or (recently) free'd"). So is an
//!   access to a `PROT_NONE` mapping (`SEGV_ACCERR` there) when `mmap` made it so, which
//!   Valgrind's A bits hold unaddressable; not one `mprotect` made `PROT_NONE` after it was
//!   mapped with some permission, which Valgrind takes no access away from (the runtime
//!   follows the program's `mmap`, `mprotect`, `munmap` and `mremap` with Valgrind's rules:
//!   `Host::noaccess_mapping`). A mapping that allows some access (a write to read-only
//!   memory) is addressable in Valgrind's eyes: no Memcheck error, and the fatal-signal
//!   block says "Bad permissions".

use oxgrind_formats::memcheck_text::{self as text, Aux};
use oxgrind_formats::memcheck_xml::WhatQuirk;
use oxgrind_tool::instrument::{Access, AccessKind, GuestRegs, Insn, Plan};
use oxgrind_tool::{Addr, Host, MemoryFault, SelfFile, StackId};

use crate::errors::KeyKind;
use crate::freed::FreedQueue;
use crate::Memcheck;

pub(crate) use oxgrind_tool::instrument::RED_ZONE;

/// How far below the stack pointer an access through a pointer (not `rsp`) is checked: a
/// frame whose function has returned lies a frame or a few below the pointer, and beyond
/// the window nothing costs a call (another thread's stack lies below this one's).
pub(crate) const DEAD_FRAME_DEPTH: u32 = 1 << 20;

/// `Plan::accesses_filtered` data: the instruction also has a below-the-stack-pointer
/// probe, which checks its accesses below the stack pointer.
pub(crate) const BELOW_SP_COVERED: u64 = 1 << 41;

/// `Plan::accesses` data of a below-the-stack-pointer probe: this bit, and in the low 32
/// bits how far below `rsp` the instruction's lowest such operand starts.
pub(crate) const BELOW_SP_PROBE: u64 = 1 << 40;

/// The stack the calling thread's pointer was last found on, as the below-the-stack-pointer
/// checks see it; kept per thread so that `/proc/self/maps` is read again only when the
/// pointer is somewhere else (or an access lies below what is known).
#[derive(Clone, Copy)]
enum KnownStack {
    None,
    /// The main thread's stack mapping (`[stack]`): all of it below `rsp - 128` is
    /// unaddressable, as Valgrind holds it.
    Main {
        lo: u64,
        hi: u64,
    },
    /// A glibc thread stack and its floor (`thread_stack_floor`; `u64::MAX`: none found).
    Thread {
        lo: u64,
        hi: u64,
        floor: u64,
    },
    /// A mapping that is no stack the checks know (a coroutine's on the heap, an
    /// alternate signal stack, the main thread on a thread-like mapping): left alone.
    Other {
        lo: u64,
        hi: u64,
    },
}

impl KnownStack {
    fn holds(&self, sp: u64) -> bool {
        match *self {
            KnownStack::None => false,
            KnownStack::Main { lo, hi }
            | KnownStack::Thread { lo, hi, .. }
            | KnownStack::Other { lo, hi } => lo <= sp && sp < hi,
        }
    }
}

thread_local! {
    static KNOWN_STACK: core::cell::Cell<KnownStack> =
        const { core::cell::Cell::new(KnownStack::None) };
}

/// The lowest address of the stack the calling thread's pointer `sp` is on that is
/// unaddressable below `sp - 128`, for an access as low as `want`: the main thread's stack
/// mapping's start; on a glibc thread stack, the floor the thread's stack shows
/// (`thread_stack_floor`). `None` when `sp` is on neither.
fn unaddressable_from(host: &dyn Host, main_thread: bool, sp: u64, want: u64) -> Option<u64> {
    let mut known = KNOWN_STACK.with(|c| c.get());
    let fresh = !known.holds(sp);
    if fresh {
        known = classify_stack(host, main_thread, sp);
    }
    let from = match known {
        KnownStack::None | KnownStack::Other { .. } => None,
        KnownStack::Main { lo, .. } if want < lo && !fresh => {
            // The stack may have grown since it was read.
            known = classify_stack(host, main_thread, sp);
            match known {
                KnownStack::Main { lo, .. } => Some(lo),
                _ => None,
            }
        }
        KnownStack::Main { lo, .. } => Some(lo),
        KnownStack::Thread { lo, floor, .. } if want < lo => Some(floor),
        KnownStack::Thread { floor, .. } if floor <= want => Some(floor),
        KnownStack::Thread { lo, hi, .. } => {
            let floor = thread_stack_floor(host, lo, sp);
            known = KnownStack::Thread { lo, hi, floor };
            Some(floor)
        }
    };
    KNOWN_STACK.with(|c| c.set(known));
    from
}

/// What the mapping holding `sp` is to the checks, from `/proc/self/maps`: the main
/// thread's `[stack]`, a glibc thread stack on another thread, or another mapping.
fn classify_stack(host: &dyn Host, main_thread: bool, sp: u64) -> KnownStack {
    let Some(maps) = host.read_self_file(SelfFile::Maps) else {
        return KnownStack::None;
    };
    match stack_mapping_at(&maps, sp) {
        Some(StackMapping::Main { lo, hi }) if main_thread => KnownStack::Main { lo, hi },
        Some(StackMapping::Thread { lo, hi }) if !main_thread => KnownStack::Thread {
            lo,
            hi,
            floor: thread_stack_floor(host, lo, sp),
        },
        Some(StackMapping::Main { lo, hi } | StackMapping::Thread { lo, hi })
        | Some(StackMapping::Other { lo, hi }) => KnownStack::Other { lo, hi },
        None => KnownStack::None,
    }
}

/// A mapping that holds a stack pointer, by what it is.
pub(crate) enum StackMapping {
    /// The main thread's stack (`[stack]`).
    Main { lo: u64, hi: u64 },
    /// A glibc thread stack: anonymous, read-write, right above its `---` guard page.
    Thread { lo: u64, hi: u64 },
    /// Anything else (a coroutine's stack on the heap, an alternate signal stack).
    Other { lo: u64, hi: u64 },
}

/// The mapping holding `sp` in `maps` (the text of `/proc/self/maps`).
pub(crate) fn stack_mapping_at(maps: &str, sp: u64) -> Option<StackMapping> {
    let mut below: Option<(u64, &str)> = None; // the previous mapping's end, permissions
    for m in maps.lines().map_while(map_line) {
        if m.lo <= sp && sp < m.hi {
            let (lo, hi) = (m.lo, m.hi);
            let guarded = below.is_some_and(|(end, p)| end == m.lo && p == "---");
            return Some(if m.path == "[stack]" {
                StackMapping::Main { lo, hi }
            } else if m.perms == "rw-" && m.path.is_empty() && guarded {
                StackMapping::Thread { lo, hi }
            } else {
                StackMapping::Other { lo, hi }
            });
        }
        below = Some((m.hi, m.perms));
    }
    None
}

/// Whether `sp` lies in the calling thread's alternate signal stack (a handler running
/// there: another stack, whatever memory holds it).
fn on_signal_stack(sp: u64) -> bool {
    #[repr(C)]
    struct StackT {
        sp: u64,
        flags: i32,
        size: u64,
    }
    let mut ss = StackT {
        sp: 0,
        flags: 0,
        size: 0,
    };
    let ret: i64;
    // SAFETY: sigaltstack(NULL, &ss) only writes the thread's alternate stack into `ss`
    // (a `stack_t`, as laid out here); the system call clobbers rcx and r11, declared.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") 131i64 => ret,
            in("rdi") 0u64,
            in("rsi") &mut ss as *mut StackT,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        )
    };
    const SS_DISABLE: i32 = 2;
    ret == 0 && ss.flags & SS_DISABLE == 0 && ss.sp <= sp && sp < ss.sp.saturating_add(ss.size)
}

/// How deep, at most, the calling thread's stack pointer (`sp`, on the glibc thread stack
/// starting at `lo`) has been: Valgrind holds a thread's stack unaddressable from 128 bytes
/// below the lowest point its pointer has reached up to 128 below where it is, and
/// addressable below that. Without marking at every stack-pointer change (see the module's
/// doc), the lowest word of the stack that holds anything but what it was made with stands
/// in for that point: glibc maps a new stack zeroed, and the program writes its stack only
/// within the red zone below its pointer, so the pointer has been at most 128 bytes above
/// that word (a reused stack holds its earlier thread's words, where Valgrind too holds the
/// memory unaddressable). Bytes from there up to the pointer are then unaddressable. A
/// frame the thread made but never wrote at its bottom is not seen (a missed error). Nor
/// are the words left by code whose depth is not the program's under Valgrind: oxgrind's
/// own code on the program's stack, and the dynamic linker's lazy binding, whose
/// trampoline saves the vector registers there with `xsave`, an area as large as the real
/// CPU's state (with AVX-512 about 2.7 KiB, where Valgrind's emulated CPU has less): the
/// floor is put above them (`above_own_frames`), which also misses what lies below.
/// `u64::MAX` when none is found. (Kept per thread, `KnownStack::Thread`: the stack is read
/// again only when an access lies below the floor last found.)
fn thread_stack_floor(host: &dyn Host, lo: u64, sp: u64) -> u64 {
    match scan_floor(lo, sp) {
        Some(floor) => floor.max(above_own_frames(host, floor, sp)),
        None => u64::MAX,
    }
}

/// Where the thread's stack in `[floor, sp)` stops holding what code whose depth is not
/// the program's under Valgrind left there: just above the highest word that is an
/// address in oxgrind's code (return addresses of the runtime's own code on the program's
/// stack: its string replacements' calls, an allocator hook when it runs translated), or
/// [`RESOLVER_FRAME`] above the highest that is an address in the dynamic linker's (the
/// lazy-binding trampoline's call of its fixup, made below the vector state it saved).
/// Below that, the words do not tell how deep the program went under Valgrind; above it
/// they are the program's. `floor` when there is none. (The allocator hooks run natively,
/// on the engine's stack, since their entry points hand the call off at once: with them
/// out of the way, a thread's first calls' lazy binding was what went deepest, 2 KiB
/// below where Valgrind's did on the AVX2 code path.)
fn above_own_frames(host: &dyn Host, floor: u64, sp: u64) -> u64 {
    let [ours, linker] = not_the_programs_text(host);
    let top = sp & !7;
    let mut above = floor;
    let mut word = top.wrapping_sub(8);
    while word >= floor && word != 0 {
        // SAFETY: `word` is 8-aligned in `[floor, sp)`, inside the calling thread's own
        // stack mapping (`floor` is a word `scan_floor` read there), which stays mapped
        // while the thread uses it; pages in between are mapped read-write (a page never
        // touched reads as zero).
        let v = unsafe { core::ptr::read_volatile(word as *const u64) };
        if ours.0 <= v && v < ours.1 {
            above = above.max(word + 8);
        } else if linker.0 <= v && v < linker.1 {
            above = above.max((word + 8 + RESOLVER_FRAME).min(top));
        }
        if above >= top {
            break;
        }
        word -= 8;
    }
    above
}

/// How far above its call of `_dl_fixup` (whose return address it leaves) the dynamic
/// linker's lazy-binding trampoline's frame may reach: the vector state `xsave` stores
/// (2,696 bytes with AVX-512's), 64-byte aligned, and the registers it pushes.
const RESOLVER_FRAME: u64 = 3 << 10;

/// The executable mappings of oxgrind's runtime (which the tool is part of) and of the
/// dynamic linker, from `/proc/self/maps` once ((0, 0) for one not found).
fn not_the_programs_text(host: &dyn Host) -> [(u64, u64); 2] {
    static TEXT: oxgrind_tool::sync::SpinLock<Option<[(u64, u64); 2]>> =
        oxgrind_tool::sync::SpinLock::new(None);
    if let Some(known) = *TEXT.lock() {
        return known;
    }
    let here = not_the_programs_text as *const () as u64;
    let maps = host.read_self_file(SelfFile::Maps).unwrap_or_default();
    let mut texts = [(0, 0); 2];
    for m in maps.lines().filter_map(map_line) {
        if m.lo <= here && here < m.hi {
            texts[0] = (m.lo, m.hi);
        } else if m.perms == "r-x"
            && m.path
                .rsplit('/')
                .next()
                .is_some_and(|f| f.starts_with("ld-linux"))
        {
            texts[1] = (m.lo, m.hi);
        }
    }
    *TEXT.lock() = Some(texts);
    texts
}

/// One line of `/proc/self/maps`.
struct MapLine<'a> {
    lo: u64,
    hi: u64,
    /// `rw-`, `---`, ...
    perms: &'a str,
    /// Empty for anonymous memory.
    path: &'a str,
}

fn map_line(line: &str) -> Option<MapLine<'_>> {
    // start-end, permissions, offset, device, inode, then the path (which may hold spaces).
    let mut fields = line.splitn(6, char::is_whitespace);
    let (lo, hi) = fields.next()?.split_once('-')?;
    let perms = fields.next()?.get(..3)?;
    Some(MapLine {
        lo: u64::from_str_radix(lo, 16).ok()?,
        hi: u64::from_str_radix(hi, 16).ok()?,
        perms,
        path: fields.nth(3).map_or("", str::trim),
    })
}

/// The lowest word of the stack mapping starting at `lo` below `sp` that is no longer as
/// the stack was made (see `thread_stack_floor`). Pages the kernel has never given the
/// thread (`mincore`) are not read.
fn scan_floor(lo: u64, sp: u64) -> Option<u64> {
    const PAGE: u64 = 4096;
    let top = sp & !(PAGE - 1); // the page sp is in has been touched: scanned last
    let pages = ((top - lo) / PAGE + 1) as usize;
    let mut resident = vec![0u8; pages];
    let ret: i64;
    // SAFETY: mincore(2) on [lo, top + PAGE), a range inside one mapping, writes one byte
    // per page into `resident`, which holds that many; it clobbers rcx and r11, declared.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") 27i64 => ret,
            in("rdi") lo,
            in("rsi") pages as u64 * PAGE,
            in("rdx") resident.as_mut_ptr(),
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        )
    };
    if ret != 0 {
        return None;
    }
    // What the stack held before the thread wrote it: zero (pages never touched read as
    // zero), or a stack painted whole with a pattern (to measure its use), whose lowest
    // word shows it.
    let fill = match resident[0] & 1 {
        0 => 0,
        // SAFETY: `lo` is the first word of the calling thread's stack mapping (which it
        // is using, so it stays mapped), in a page the kernel has provided.
        _ => unsafe { core::ptr::read_volatile(lo as *const u64) },
    };
    for (k, flags) in resident.iter().enumerate() {
        if flags & 1 == 0 {
            continue;
        }
        let page = lo + k as u64 * PAGE;
        let end = (page + PAGE).min(sp & !7);
        for word in (page..end).step_by(8) {
            // SAFETY: `word` is 8-aligned inside the calling thread's own stack mapping
            // (read-write, and in use by this thread, so it cannot be unmapped meanwhile),
            // in a page the kernel has already provided.
            if unsafe { core::ptr::read_volatile(word as *const u64) } != fill {
                return Some(word);
            }
        }
    }
    None
}

/// `si_code` of a `SIGSEGV` at an address nothing is mapped at.
const SEGV_MAPERR: i32 = 1;
/// `si_code` of a `SIGSEGV` where the mapping forbids the access.
const SEGV_ACCERR: i32 = 2;
const SIGSEGV: i32 = 11;

impl Memcheck {
    /// Probes for the operands of `ins` (instruction `i` of its block) that lie past the
    /// red zone below `rsp`: known at translation, so only those instructions pay. Whether
    /// one was planned: it then covers the instruction's other operands too, down to
    /// [`DEAD_FRAME_DEPTH`] (see [`Memcheck::instrument_block`]).
    pub(crate) fn plan_below_sp(&self, i: usize, ins: &Insn, plan: &mut Plan) -> bool {
        let lowest = (0..ins.mem().len())
            .filter_map(|op| ins.sp_offset(op))
            .filter(|&d| (d as i64) < -(RED_ZONE as i64))
            .min();
        let Some(d) = lowest else { return false };
        let mut depth = d.unsigned_abs() as u64;
        if ins.may_touch_heap() {
            depth = depth.max(DEAD_FRAME_DEPTH as u64);
        }
        plan.accesses(i, BELOW_SP_PROBE | depth)
    }

    /// A below-the-stack-pointer probe ran, or a filtered probe's slow path (which checks
    /// below the stack pointer too, `DEAD_FRAME_DEPTH` down): the accesses that start within
    /// `[rsp - depth, rsp - 128)` on the thread's own stack are errors, where Valgrind holds
    /// the memory unaddressable.
    pub(crate) fn below_sp_event(
        &self,
        host: &dyn Host,
        accesses: &[Access],
        regs: &GuestRegs,
        depth: u64,
    ) {
        let rsp = regs.rsp();
        let (deepest, hi) = (rsp.wrapping_sub(depth), rsp.wrapping_sub(RED_ZONE));
        let in_window = |a: &&Access| a.addr >= deepest && a.addr < hi;
        let Some(want) = accesses.iter().filter(in_window).map(|a| a.addr).min() else {
            return;
        };
        // Valgrind marks all of the main thread's stack below its pointer unaddressable
        // from the start. Another thread's stack is memory glibc mapped (addressable to
        // Valgrind) until the thread's pointer has been there and come back up: only the
        // part above the deepest point the thread has reached is unaddressable (see
        // `thread_stack_floor`). Any other stack (sigaltstack, a coroutine's on the heap)
        // is left alone: a missed error, never a false one. So are accesses through a
        // pointer to memory that is not this stack (another thread's, just below).
        let main_thread = host.tid() == host.pid();
        let Some(floor) = unaddressable_from(host, main_thread, rsp, want) else {
            return;
        };
        let lo = deepest.max(floor);
        if want >= hi || !accesses.iter().any(|a| a.addr >= lo && a.addr < hi) {
            return;
        }
        // A handler on an alternate signal stack kept inside this one (a local array) is
        // on another stack: what lies below it is the interrupted code's.
        if on_signal_stack(rsp) {
            return;
        }
        let unaddressable = |addr: u64, size: u32| -> u32 {
            (addr..addr.saturating_add(size as u64))
                .filter(|&b| b < hi && b >= lo)
                .count() as u32
        };
        for a in accesses {
            if a.addr >= lo && a.addr < hi {
                self.report_invalid(host, regs, a, &unaddressable, &|_, thread, addr| {
                    vec![
                        Aux::Text(text::address_on_stack(addr, thread)),
                        Aux::Text(text::below_stack_pointer(rsp.wrapping_sub(addr))),
                    ]
                });
            }
        }
    }

    /// The engine caught a fault of the program's access (see the module's doc).
    pub(crate) fn memory_fault_event(
        &self,
        host: &dyn Host,
        fault: &MemoryFault,
        accesses: &[Access],
        regs: &GuestRegs,
    ) {
        // Nothing mapped, or a mapping with no permission at all that `mmap` made so (a
        // thread stack's guard page), which Valgrind holds unaddressable. One `mprotect`
        // made `PROT_NONE` after it was mapped with some permission is addressable to it,
        // as is a mapping that allows some access but not this one. Where no call of the
        // program's was seen for it: anonymous memory, whose `PROT_NONE` mappings then are
        // glibc's (an arena's reserve), of which Valgrind has none, so nothing is mapped
        // there to it; not a file's, where the dynamic linker's `mprotect` made the holes
        // between a library's segments before the engine took over.
        let unaddressable = fault.code == SEGV_MAPERR
            || (fault.code == SEGV_ACCERR
                && mapping_at(host, fault.addr).is_some_and(|(perms, path)| {
                    perms == "---" && host.noaccess_mapping(fault.addr).unwrap_or(path.is_empty())
                }));
        if fault.sig != SIGSEGV || !unaddressable {
            return;
        }
        // A fault next to the stack pointer is the stack running out (its guard gap): the
        // fatal-signal block's business, no Memcheck error (Valgrind says "Stack overflow
        // in thread #1" there, and reports no invalid access).
        if oxgrind_tool::fault_is_stack_overflow(fault.addr, regs.rsp()) {
            // Valgrind's core could not grow the main thread's stack and says so now,
            // whether the program's handler catches the fault or it dies of it (its
            // fatal-signal block says it again), with -q too; in XML mode only the block.
            if fault.code == SEGV_MAPERR && host.tid() == host.pid() && !self.opts.core.xml {
                let mut line = String::new();
                let base = oxgrind_tool::stack_overflow_page(regs.rsp());
                oxgrind_formats::memcheck_text::stack_overflow(&mut line, host.pid(), base);
                host.log(&line);
            }
            return;
        }
        // The access the CPU stopped at: the one holding the faulting byte (reads come
        // before writes, as the CPU makes them); else, as the fault gives it, one byte.
        let holds = |a: &&Access| fault.addr >= a.addr && fault.addr - a.addr < a.size as u64;
        let a = accesses.iter().find(holds).copied().unwrap_or(Access {
            addr: fault.addr,
            size: 1,
            kind: AccessKind::Read,
            conditional: false,
        });
        // A read-modify-write faults on its read, and the program goes no further.
        let a = Access {
            kind: match a.kind {
                AccessKind::Modify => AccessKind::Read,
                k => k,
            },
            ..a
        };
        // The bytes from the fault on are unmapped; those before it are not (the access
        // would have faulted there first).
        let unmapped = |addr: u64, size: u32| -> u32 {
            (addr..addr.saturating_add(size as u64))
                .filter(|&b| b >= fault.addr)
                .count() as u32
        };
        self.report_invalid(host, regs, &a, &unmapped, &|freed, thread, addr| {
            self.describe_addr(host, freed, addr, thread)
        });
    }

    /// Reports access `a` with `bad(addr, size)` of its bytes unaddressable as Memcheck's
    /// `mc_LOADVn_slow` / `mc_STOREVn_slow` would: a read once unless
    /// `--partial-loads-ok=yes` excuses it, a write of a vector in 8-byte pieces, a 2-byte
    /// write counted twice (shown once); a read-modify-write as a read, then a write.
    /// `aux(freed blocks, thread, addr)`: the address description.
    pub(crate) fn report_invalid(
        &self,
        host: &dyn Host,
        regs: &GuestRegs,
        a: &Access,
        bad: &dyn Fn(u64, u32) -> u32,
        aux: &dyn Fn(&FreedQueue, i32, Addr) -> Vec<Aux>,
    ) {
        let (read, write) = match a.kind {
            AccessKind::Read => (true, false),
            AccessKind::Write => (false, true),
            AccessKind::Modify => (true, true),
        };
        let mut at: Option<(StackId, i32, i32)> = None;
        let mut report = |addr: Addr, size: u32, write: bool| {
            let (stack, tid, thread) = *at.get_or_insert_with(|| {
                let (tid, thread) = self.calling_thread(host);
                (host.stack_at(regs, self.opts.core.num_callers), tid, thread)
            });
            self.report_at(
                host,
                KeyKind::Addr { size },
                stack,
                false,
                tid,
                if write { "InvalidWrite" } else { "InvalidRead" },
                &|| text::invalid_access(write, size),
                WhatQuirk::None,
                &|freed| aux(freed, thread, addr),
            );
        };
        if read {
            // --partial-loads-ok=yes: a naturally aligned load of a word or a vector with
            // at least one addressable byte is fine (Memcheck gives the other bytes
            // undefined values instead, which we do not track).
            let size = a.size as u64;
            let partial_ok = self.opts.partial_loads_ok
                && matches!(size, 8 | 16 | 32)
                && a.addr % size == 0
                && bad(a.addr, a.size) < a.size;
            if !partial_ok {
                report(a.addr, a.size, false);
            }
        }
        if write {
            if a.size > 8 {
                // Memcheck stores vectors in 8-byte pieces: each piece with an
                // unaddressable byte is an invalid write of size 8 at that piece.
                for off in (0..a.size).step_by(8) {
                    let (piece, n) = (a.addr + off as u64, 8.min(a.size - off));
                    if bad(piece, n) > 0 {
                        report(piece, n, true);
                    }
                }
            } else {
                report(a.addr, a.size, true);
                if a.size == 2 {
                    // Memcheck 3.19 counts a bad 2-byte store twice (shown once).
                    report(a.addr, a.size, true);
                }
            }
        }
    }
}

/// What mapping `addr` lies in, in Valgrind's words, when it is no heap block, stack or data
/// symbol: the brk data segment (from `/proc/self/stat`'s `start_brk` and `brk`), an
/// anonymous or file mapping (from `/proc/self/maps`). `None` for unmapped memory and the
/// kernel's own mappings (`[vdso]`, `[vvar]`, `[stack]`: a stack is described as one
/// before this is asked). Read on the error path only.
pub(crate) fn describe_segment(host: &dyn Host, addr: u64) -> Option<String> {
    if let Some((base, limit)) = brk_range(host) {
        // Valgrind's brk segment ends at the break, and its last page beyond it is still
        // the segment's ("bytes after the limit").
        if addr >= base && addr < limit.next_multiple_of(4096).max(base) {
            return Some(text::address_in_brk(addr, base, limit));
        }
    }
    let (perms, path) = mapping_at(host, addr)?;
    match path.as_str() {
        "" => Some(text::address_in_segment(addr, &perms, "anonymous", None)),
        p if p.starts_with("/SYSV") => Some(text::address_in_segment(
            addr,
            &perms,
            "shared memory",
            None,
        )),
        p if p.starts_with('/') => {
            let p = p.strip_suffix(" (deleted)").unwrap_or(p);
            Some(text::address_in_segment(
                addr,
                &perms,
                "mapped file",
                Some(p),
            ))
        }
        _ => None,
    }
}

/// The mapping `addr` lies in, from `/proc/self/maps`: its permissions (`rw-`, `---`) and
/// its path (empty for anonymous memory).
fn mapping_at(host: &dyn Host, addr: u64) -> Option<(String, String)> {
    let maps = host.read_self_file(SelfFile::Maps)?;
    let m = maps
        .lines()
        .map_while(map_line)
        .find(|m| m.lo <= addr && addr < m.hi)?;
    Some((m.perms.to_string(), m.path.to_string()))
}

/// The program's break: `[start_brk, brk)`, the start from field 47 of `/proc/self/stat`,
/// the break from the `brk` system call asked for nothing (which changes nothing).
fn brk_range(host: &dyn Host) -> Option<(u64, u64)> {
    let stat = host.read_self_file(SelfFile::Stat)?;
    // The command name (field 2) may hold spaces and parentheses: count after its end.
    let rest = &stat[stat.rfind(')')? + 2..];
    let base: u64 = rest.split_whitespace().nth(47 - 3)?.parse().ok()?;
    let limit: u64;
    // SAFETY: brk(0) cannot move the break (0 is below it) and only returns it; the
    // system call clobbers rcx and r11, declared, and touches no memory of ours.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") 12u64 => limit,
            in("rdi") 0u64,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        )
    };
    (base != 0 && limit >= base).then_some((base, limit))
}
