//! Client requests (`valgrind.h` and `memcheck.h`'s magic sequences, no-ops natively): the
//! program tells Memcheck which of its memory is addressable (custom allocators, pools,
//! buffers it wants guarded) and asks it to check a range.
//!
//! Handled: `VALGRIND_MAKE_MEM_NOACCESS`, `_UNDEFINED`, `_DEFINED`, `_DEFINED_IF_ADDRESSABLE`
//! (the last three make memory addressable, and with `--undef-value-errors=yes` set its V bits);
//! `VALGRIND_CHECK_MEM_IS_ADDRESSABLE` / `_IS_DEFINED` (an unaddressable byte is reported as
//! Valgrind reports it, "Unaddressable byte(s) found during client check request", and its
//! address returned; with `--undef-value-errors=yes` an undefined byte before it too,
//! "Uninitialised byte(s) found during client check request"); `VALGRIND_COUNT_ERRORS`; and a custom allocator's
//! `VALGRIND_MALLOCLIKE_BLOCK` / `FREELIKE_BLOCK` / `RESIZEINPLACE_BLOCK`: its blocks are
//! counted in HEAP SUMMARY, described, checked (redzones, use after free, invalid free) and
//! leak-checked as heap blocks (one inside a `malloc`ed block hides that block from the
//! leak search, as in Valgrind). Results are Valgrind's (`-1` for `MAKE_MEM_*`). The mempool family is
//! `mempool.rs`. `VALGRIND_DO_LEAK_CHECK` and its `ADDED`, `CHANGED` and `QUICK` forms run
//! a leak search now (`leak_report.rs`); `VALGRIND_COUNT_LEAKS` / `COUNT_LEAK_BLOCKS` write
//! the last search's totals into the program's variables. Not yet: `CREATE_BLOCK`,
//! `GET_VBITS`/`SET_VBITS`: the program gets the native default (0), as for any request a tool does
//! not answer. `RUNNING_ON_VALGRIND`, `PRINTF` and the `STACK_*` requests are the core's
//! (the engine and the runtime's `requests.rs`), for every tool.

use oxgrind_formats::memcheck_xml::WhatQuirk;
use oxgrind_tool::instrument::GuestRegs;
use oxgrind_tool::{Addr, AllocFn, Host, LiveBlock, Origin, StackId};

use crate::errors::{KeyKind, Output};
use crate::freed::FreedBlock;
use crate::leak_report::{Delta, LeakParams};
use crate::shadow;
use crate::Memcheck;

/// `VG_USERREQ_TOOL_BASE('M', 'C')`: Memcheck's own requests.
const MC_BASE: u64 = (b'M' as u64) << 24 | (b'C' as u64) << 16;
const MAKE_MEM_NOACCESS: u64 = MC_BASE;
const MAKE_MEM_UNDEFINED: u64 = MC_BASE + 1;
const MAKE_MEM_DEFINED: u64 = MC_BASE + 2;
const CHECK_MEM_IS_ADDRESSABLE: u64 = MC_BASE + 4;
const CHECK_MEM_IS_DEFINED: u64 = MC_BASE + 5;
const DO_LEAK_CHECK: u64 = MC_BASE + 6;
const COUNT_LEAKS: u64 = MC_BASE + 7;
const MAKE_MEM_DEFINED_IF_ADDRESSABLE: u64 = MC_BASE + 11;
const COUNT_LEAK_BLOCKS: u64 = MC_BASE + 12;
/// A core request every tool answers: errors counted so far.
const COUNT_ERRORS: u64 = 0x1201;
/// Core requests for custom allocators (`valgrind.h`).
const MALLOCLIKE_BLOCK: u64 = 0x1301;
const FREELIKE_BLOCK: u64 = 0x1302;
const RESIZEINPLACE_BLOCK: u64 = 0x130b;

/// What `VALGRIND_MAKE_MEM_*` return.
const DONE: u64 = u64::MAX;

/// Valgrind's words for an unaddressable byte found by a check request.
const UNADDRESSABLE_IN_CHECK: &str = "Unaddressable byte(s) found during client check request";
/// ... and for an undefined byte found by `VALGRIND_CHECK_MEM_IS_DEFINED`.
const UNDEFINED_IN_CHECK: &str = "Uninitialised byte(s) found during client check request";

impl Memcheck {
    /// Answers client request `args` (code, then its arguments) made by the program at
    /// `regs`; `None` for a request Memcheck does not answer.
    pub(crate) fn client_request_event(
        &self,
        host: &dyn Host,
        args: &[u64; 6],
        regs: &GuestRegs,
    ) -> Option<u64> {
        let (addr, len) = (args[1], args[2]);
        self.ensure_started(host);
        let base = shadow::adopt(host);
        match args[0] {
            MAKE_MEM_NOACCESS => {
                self.make_noaccess(host, base, addr, len);
                Some(DONE)
            }
            MAKE_MEM_UNDEFINED | MAKE_MEM_DEFINED => {
                shadow::make_accessible(base, addr, len);
                self.definedness_client(host, regs, addr, len, args[0] == MAKE_MEM_DEFINED);
                Some(DONE)
            }
            // Defined-ness only: addressability does not change.
            MAKE_MEM_DEFINED_IF_ADDRESSABLE => {
                self.definedness_client(host, regs, addr, len, true);
                Some(DONE)
            }
            CHECK_MEM_IS_ADDRESSABLE | CHECK_MEM_IS_DEFINED => {
                if base == 0 {
                    return Some(0);
                }
                let unaddressable = shadow::first_unaddressable(base, addr, len);
                // Memcheck walks the range once: the first bad byte, unaddressable or
                // undefined, decides the one error and the address returned.
                let undefined = if args[0] == CHECK_MEM_IS_DEFINED && self.opts.undef_value_errors {
                    host.first_undefined(addr, unaddressable.map_or(len, |u| u - addr))
                } else {
                    None
                };
                match (undefined, unaddressable) {
                    (Some(bad), _) => {
                        self.report_check_request(host, bad, false, regs);
                        Some(bad)
                    }
                    (None, Some(bad)) => {
                        self.report_check_request(host, bad, true, regs);
                        Some(bad)
                    }
                    (None, None) => Some(0),
                }
            }
            COUNT_ERRORS => Some(self.lock().errors.errs_found as u64),
            DO_LEAK_CHECK => {
                self.leak_check_request(host, args[1], args[2], regs.rsp());
                Some(0)
            }
            COUNT_LEAKS | COUNT_LEAK_BLOCKS => {
                self.count_leaks(host, args[0] == COUNT_LEAK_BLOCKS, &args[1..5]);
                Some(0)
            }
            MALLOCLIKE_BLOCK => {
                self.malloclike(host, base, args, regs);
                Some(0)
            }
            FREELIKE_BLOCK => {
                self.freelike(host, base, addr, args[2], regs);
                Some(0)
            }
            RESIZEINPLACE_BLOCK => {
                self.resize_in_place(host, base, addr, args[2], args[3], args[4]);
                Some(0)
            }
            _ => self.mempool_request(host, base, args, regs),
        }
    }

    /// `VALGRIND_DO_LEAK_CHECK` (`mode` 0, `delta` 0), `_ADDED_` (delta 1), `_CHANGED_`
    /// (delta 2), `_QUICK_` (mode 1): a leak search now, reported as `--leak-check=full`
    /// (or `=summary` for the quick one) whatever `--leak-check` says, as Memcheck does.
    fn leak_check_request(&self, host: &dyn Host, mode: u64, delta: u64, sp: Addr) {
        let pid = host.pid();
        let mut warnings = String::new();
        let full = match mode {
            0 => true,
            1 => false,
            _ => {
                oxgrind_formats::memcheck_text::line(
                    &mut warnings,
                    pid,
                    "Warning: unknown memcheck leak search mode",
                );
                true
            }
        };
        let delta = match delta {
            0 => Delta::Any,
            1 => Delta::Increased,
            2 => Delta::Changed,
            _ => {
                oxgrind_formats::memcheck_text::line(
                    &mut warnings,
                    pid,
                    "Warning: unknown memcheck leak search deltamode",
                );
                Delta::Any
            }
        };
        let (_, tid) = self.calling_thread(host);
        // Searched before the state lock is taken (see `search_heap`), with the blocks live
        // once the other threads are stopped.
        let found = self.search_heap(host, &mut || host.live_blocks(), Some(sp));
        let mut st = self.lock();
        if st.finished {
            return;
        }
        st.errors.rep.pid = pid;
        let mut out = Output {
            text: warnings,
            ..Output::default()
        };
        self.report_leaks(
            host,
            &mut st,
            &mut out,
            found,
            LeakParams { full, delta, tid },
        );
        self.emit(&mut st, out, host);
    }

    /// `VALGRIND_COUNT_LEAKS(leaked, dubious, reachable, suppressed)` (bytes) and
    /// `VALGRIND_COUNT_LEAK_BLOCKS` (blocks): the last leak search's totals, zero before
    /// any, written to the four variables whose addresses are `dest`. "Leaked" is definitely
    /// plus indirectly lost, as in Memcheck.
    fn count_leaks(&self, host: &dyn Host, blocks: bool, dest: &[u64]) {
        let s = self.lock().last_leak.summary.clone();
        let pick =
            |a: oxgrind_formats::memcheck_text::Amount| if blocks { a.blocks } else { a.bytes };
        let values = [
            pick(s.definite) + pick(s.indirect),
            pick(s.possible),
            pick(s.reachable),
            pick(s.suppressed),
        ];
        for (&addr, value) in dest.iter().zip(values) {
            write_program_word(host.pid(), addr, value);
        }
    }

    /// `VALGRIND_MALLOCLIKE_BLOCK(addr, size, redzone, zeroed)`: the request's `args`.
    fn malloclike(&self, host: &dyn Host, base: u64, args: &[u64; 6], regs: &GuestRegs) {
        let (addr, size, rz, zeroed) = (args[1], args[2], args[3], args[4] != 0);
        let stack = self.client_stack(host, regs);
        self.totals.alloc(size);
        self.client_blocks.lock().push(LiveBlock {
            addr,
            size,
            func: AllocFn::Malloc,
            stack,
        });
        shadow::make_accessible(base, addr, size);
        self.custom_block_definedness(host, addr, size, zeroed, stack);
        if rz > 0 {
            self.make_noaccess(host, base, addr.saturating_sub(rz), rz);
            self.make_noaccess(host, base, addr + size, rz);
        }
    }

    /// Makes `[addr, addr + len)` unaddressable, as Memcheck's `make_mem_noaccess`. Its
    /// no-access state holds no V bits, and a load of a no-access byte gives a defined
    /// value (`get_vbits8`): one invalid read, no uninitialised-value error after it. Here
    /// V bits are kept apart from the A map, so they are set defined with it (the
    /// interpreter's loads and the inline load copies read them as they are). Whatever
    /// makes the bytes addressable again sets their V bits (`MAKE_MEM_UNDEFINED` /
    /// `_DEFINED`, a custom block, a pool's chunk).
    pub(crate) fn make_noaccess(&self, host: &dyn Host, base: u64, addr: Addr, len: u64) {
        shadow::make_noaccess(base, addr, len);
        if self.opts.undef_value_errors {
            host.set_definedness(addr, len, true);
        }
    }

    /// A custom block's V bits (`MALLOCLIKE_BLOCK`, a pool's `MEMPOOL_ALLOC`), as
    /// Memcheck's `MC_(new_block)`: defined when the allocator says its memory is zeroed,
    /// else undefined, created by the request's stack.
    pub(crate) fn custom_block_definedness(
        &self,
        host: &dyn Host,
        addr: Addr,
        size: u64,
        zeroed: bool,
        stack: StackId,
    ) {
        if !self.opts.undef_value_errors {
            return;
        }
        if zeroed {
            host.set_definedness(addr, size, true);
        } else {
            self.make_undefined(host, addr, size, Origin::Heap(stack));
        }
    }

    /// `VALGRIND_FREELIKE_BLOCK(addr, redzone)`: the block's memory becomes unaddressable
    /// and is remembered as freed; an address that is no custom block is an invalid free.
    fn freelike(&self, host: &dyn Host, base: u64, addr: Addr, rz: u64, regs: &GuestRegs) {
        let stack = self.client_stack(host, regs);
        self.totals.free();
        let block = {
            let mut blocks = self.client_blocks.lock();
            let i = blocks.iter().position(|b| b.addr == addr);
            i.map(|i| blocks.swap_remove(i))
        };
        let Some(b) = block else {
            self.report_invalid_free(host, addr, stack);
            return;
        };
        self.make_noaccess(host, base, addr.saturating_sub(rz), b.size + 2 * rz);
        self.lock().freed.push_unkept(&FreedBlock {
            addr,
            size: b.size,
            alloc_stack: b.stack,
            free_stack: stack,
        });
    }

    /// The stack of a client request that makes or frees a block, remembered as such.
    pub(crate) fn client_stack(&self, host: &dyn Host, regs: &GuestRegs) -> StackId {
        let stack = host.stack_at(regs, self.opts.core.num_callers);
        let mut known = self.client_stacks.lock();
        if !known.contains(&stack) {
            known.push(stack);
        }
        stack
    }

    /// `VALGRIND_RESIZEINPLACE_BLOCK(addr, old size, new size, redzone)`.
    fn resize_in_place(&self, host: &dyn Host, base: u64, addr: Addr, old: u64, new: u64, rz: u64) {
        let mut blocks = self.client_blocks.lock();
        let Some(b) = blocks.iter_mut().find(|b| b.addr == addr && b.size == old) else {
            return;
        };
        b.size = new;
        let stack = b.stack;
        drop(blocks);
        if new < old {
            self.make_noaccess(host, base, addr + new, old - new + rz);
        } else {
            shadow::make_accessible(base, addr + old, new - old);
            self.custom_block_definedness(host, addr + old, new - old, false, stack);
            self.make_noaccess(host, base, addr + new, rz);
        }
    }

    /// "Unaddressable byte(s) found during client check request" at the request's stack.
    fn report_check_request(&self, host: &dyn Host, bad: Addr, addr_err: bool, regs: &GuestRegs) {
        let (tid, thread) = self.calling_thread(host);
        // Valgrind's stack of the request starts after its `xchg rbx, rbx` (3 bytes): at
        // -O2 the next instruction may be on the next line.
        let after = GuestRegs {
            rip: regs.rip + 3,
            ..*regs
        };
        let stack = host.stack_at(&after, self.opts.core.num_callers);
        let origin = if !addr_err && self.opts.track_origins {
            host.origin_of_memory(bad)
        } else {
            None
        };
        self.report_at(
            host,
            KeyKind::User { addr_err },
            stack,
            false,
            tid,
            "ClientCheck",
            &|| {
                if addr_err {
                    UNADDRESSABLE_IN_CHECK
                } else {
                    UNDEFINED_IN_CHECK
                }
                .to_string()
            },
            WhatQuirk::None,
            &|freed| {
                let mut aux = self.describe_addr(host, freed, bad, thread);
                if let Some(o) = origin {
                    aux.extend(self.origin_aux(host, o));
                }
                aux
            },
        );
    }
}

/// Stores `value` at the program's address `addr` without ever faulting: the kernel writes
/// it (`process_vm_writev` on ourselves, as the leak scan reads with `process_vm_readv`) and
/// refuses an address that is not mapped writable. Returns whether it was written.
fn write_program_word(pid: i32, addr: Addr, value: u64) -> bool {
    const SYS_PROCESS_VM_WRITEV: u64 = 311;
    let bytes = value.to_ne_bytes();
    let local = [bytes.as_ptr() as u64, 8u64];
    let remote = [addr, 8u64];
    let ret: i64;
    // SAFETY: the kernel only reads our 8-byte `bytes` through `local` and writes the
    // remote range itself, failing with EFAULT instead of faulting; the system call
    // clobbers rcx and r11, declared, and no other register or memory of ours.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") SYS_PROCESS_VM_WRITEV as i64 => ret,
            in("rdi") pid as i64,
            in("rsi") local.as_ptr(),
            in("rdx") 1u64,
            in("r10") remote.as_ptr(),
            in("r8") 1u64,
            in("r9") 0u64,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        )
    };
    ret == 8
}
