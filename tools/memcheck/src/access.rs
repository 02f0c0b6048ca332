//! Invalid reads and writes: which instructions get an access probe, and the probe's slow
//! path, which decides as Memcheck's `mc_LOADVn_slow` / `mc_STOREVn_slow` do whether an
//! access with unaddressable bytes is an error and reports it.
//!
//! The allocator events keep an addressability shadow ([`crate::shadow`]);
//! [`Memcheck::instrument_block`] asks the engine for a filtered probe on every instruction
//! that may address the heap, so the engine checks the shadow inline and calls
//! [`Memcheck::accesses_event`] only when a granule is marked.

use std::sync::atomic::Ordering;

use oxgrind_formats::frame::Frame;
use oxgrind_tool::instrument::{Access, AccessKind, GuestRegs, Insn, Plan};
use oxgrind_tool::{Addr, Host};

use crate::outside_heap::{BELOW_SP_COVERED, DEAD_FRAME_DEPTH};
use crate::shadow::{self, shadow_base};
use crate::Memcheck;

/// Where an access with unaddressable bytes was made from, which decides whether it is
/// reported (see [`Memcheck::check_access`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum PcClass {
    /// The program's code, or a library's: reported as Valgrind reports it.
    Program,
    /// A glibc string or memory function (`strlen`, `__memchr_avx2`, ...), or glibc code we
    /// have no name for: these read aligned chunks past the end of their data, which
    /// Valgrind avoids by replacing them. A read is reported only if no byte of it, nor any
    /// of the 128 bytes before it, is addressable; a write as usual; nothing for chunk
    /// headers.
    LibcString,
    /// glibc's allocator (`free` reading a chunk header, `malloc` writing into a chunk the
    /// runtime gave back): its business, never the program's error.
    LibcAllocator,
}

/// How far past the end of its data a glibc string function may read (four 32-byte
/// vectors: the unrolled AVX2 loops).
const STRING_OVERREAD: u64 = 128;
/// How far before the start of its data one may read: near the end of a page, glibc's
/// (and ld.so's) SSE2 `strlen` aligns the string's address down to 64 bytes and reads the
/// whole aligned block, so as not to cross into the next page.
const STRING_UNDERREAD: u64 = 64;

/// glibc's allocator, by source file: `malloc.c` holds `malloc`, `free`, `_int_free`,
/// `unlink_chunk`, `malloc_trim`, `mallinfo2`, the tcache and its thread-exit shutdown;
/// `arena.c` the arenas and the fork handlers; `hooks.c` and `morecore.c` the rest. The
/// dynamic loader's own allocator (used before libc's is) is `dl-minimal-malloc.c`.
const ALLOCATOR_FILES: &[&str] = &[
    "malloc.c",
    "arena.c",
    "hooks.c",
    "morecore.c",
    "dl-minimal-malloc.c",
];

/// [`PcClass`] of the code whose frames (innermost first, as `Host::describe` gives them:
/// several when inlined) are `frames`.
///
/// glibc's allocator is recognised by its source files when libc's debug information is
/// there (Debian's `libc6-dbg`): robust to inlining and to the compiler's clones
/// (`unlink_chunk.constprop.0`). Without it, by function name.
fn classify(frames: &[Frame]) -> PcClass {
    let Some(outer) = frames.last() else {
        return PcClass::Program;
    };
    let object = outer.object.as_deref().unwrap_or("");
    let file = object.rsplit('/').next().unwrap_or(object);
    // The dynamic loader has its own string functions (`strlen` in `_dl_new_object`
    // reads past a heap string during `dlopen`) and its own early allocator.
    let glibc =
        file.starts_with("libc.so") || file.starts_with("libc-") || file.starts_with("ld-linux");
    if !glibc {
        return PcClass::Program;
    }
    if frames.iter().any(|f| {
        f.file
            .as_deref()
            .is_some_and(|s| ALLOCATOR_FILES.contains(&s))
    }) {
        return PcClass::LibcAllocator;
    }
    let Some(name) = outer.function.as_deref() else {
        return PcClass::LibcString;
    };
    classify_name(name)
}

/// [`PcClass`] of a glibc function by its name alone.
fn classify_name(name: &str) -> PcClass {
    // `cfree@GLIBC_2.2.5`: a versioned alias; `unlink_chunk.constprop.0`, `.isra.0`,
    // `.part.0`, `.cold`: the compiler's clones.
    let name = name.split('@').next().unwrap_or(name);
    let name = name.split('.').next().unwrap_or(name);
    const ALLOCATOR: &[&str] = &[
        "malloc",
        "free",
        "cfree",
        "calloc",
        "realloc",
        "reallocarray",
        "memalign",
        "aligned_alloc",
        "posix_memalign",
        "valloc",
        "pvalloc",
        "malloc_usable_size",
        "malloc_trim",
        "malloc_consolidate",
        "mallinfo",
        "mallinfo2",
        "malloc_stats",
        "malloc_info",
        "mallopt",
        "sysmalloc",
        "systrim",
        "unlink_chunk",
        "munmap_chunk",
        "mremap_chunk",
        "tcache_init",
        "tcache_thread_shutdown",
        "arena_get2",
        "_mid_memalign",
        "malloc_arena_thread_freeres",
        "malloc_fork_lock_parent",
        "malloc_fork_unlock_parent",
        "malloc_fork_unlock_child",
        "minimal_malloc",
        "minimal_free",
        "minimal_calloc",
        "minimal_realloc",
    ];
    let bare = name.trim_start_matches('_');
    let bare = bare.strip_prefix("libc_").unwrap_or(bare);
    let bare = bare.strip_prefix("int_").unwrap_or(bare);
    if ALLOCATOR.contains(&bare) || name.starts_with("_int_") || name.contains("tcache") {
        return PcClass::LibcAllocator;
    }
    // IFUNC variants (`__strlen_avx2`, `__memmove_avx_unaligned_erms`) and the plain names.
    const STRING: &[&str] = &[
        "str",
        "mem",
        "stp",
        "wcs",
        "wmem",
        "rawmemchr",
        "bcmp",
        "bcopy",
        "bzero",
        "index",
        "rindex",
    ];
    if STRING.iter().any(|p| bare.starts_with(p)) {
        return PcClass::LibcString;
    }
    PcClass::Program
}

impl Memcheck {
    pub(crate) fn instrument_block(&self, _pc: Addr, block: &[Insn], plan: &mut Plan) {
        // Runs at translation with the thread stopped, maybe while this thread holds our
        // state lock (translating libc code our own reporting calls): no locks here.
        if shadow_base() == 0 {
            return;
        }
        // The engine checks the declared shadow map inline and calls only when a granule an
        // access touches is not all addressable (0 = addressable, as here).
        self.probing.store(true, Ordering::Relaxed);
        for (i, ins) in block.iter().enumerate() {
            // An explicit `[rsp + d]` past the red zone gets its own probe; an access
            // through another register is compared with `rsp` inline (a pointer into a
            // frame whose function has returned) next to the shadow check.
            let mut below_sp = Plan::new(block.len());
            let covered = self.plan_below_sp(i, ins, &mut below_sp);
            if ins.may_touch_heap() {
                if covered {
                    plan.accesses_filtered(i, BELOW_SP_COVERED);
                } else {
                    plan.accesses_filtered_or_below_sp(i, 0, DEAD_FRAME_DEPTH);
                }
            }
            for p in below_sp.probes() {
                plan.push_probe(*p);
            }
        }
    }

    pub(crate) fn accesses_event(
        &self,
        host: &dyn Host,
        accesses: &[Access],
        regs: &GuestRegs,
        data: u64,
    ) {
        let base = shadow::base_if_ready();
        if base == 0 {
            return;
        }
        for a in accesses {
            if !shadow::all_addressable(base, a.addr, a.size) {
                self.check_access(host, base, a, regs);
            }
        }
        if data & BELOW_SP_COVERED == 0 {
            self.below_sp_event(host, accesses, regs, DEAD_FRAME_DEPTH as u64);
        }
    }

    /// The slow path of a probe: some granule of the access is marked. Decides, as
    /// Memcheck's `mc_LOADVn_slow` / `mc_STOREVn_slow` do, whether this is an error, and
    /// reports it (a read-modify-write is checked as a read, then as a write).
    pub(crate) fn check_access(&self, host: &dyn Host, base: u64, a: &Access, regs: &GuestRegs) {
        let v = shadow::verdict(base, a.addr, a.size);
        if v.bad == 0 {
            return;
        }
        if a.kind != AccessKind::Read {
            self.written_unaddressable_stay_defined(host, base, a);
        }
        match self.pc_class(host, regs.rip) {
            PcClass::Program => {}
            PcClass::LibcAllocator => return,
            PcClass::LibcString => {
                // glibc's vector loops read up to a few vectors past the end of their data
                // (never across a page, so never a fault): a read with an addressable byte
                // in it or shortly before or after it is such an over-read, not the program's
                // error. Valgrind's replacements make no such reads.
                let read_only = a.kind == AccessKind::Read;
                if v.bad_outside_header == 0
                    || (read_only
                        && (v.bad < a.size
                            || shadow::any_addressable(
                                base,
                                a.addr.saturating_sub(STRING_OVERREAD),
                                a.addr,
                            )
                            || shadow::any_addressable(
                                base,
                                a.addr + a.size as u64,
                                a.addr + a.size as u64 + STRING_UNDERREAD,
                            )))
                {
                    return;
                }
            }
        }
        self.report_invalid(
            host,
            regs,
            a,
            &|addr, size| shadow::verdict(base, addr, size).bad,
            &|freed, thread, addr| self.describe_addr(host, freed, addr, thread),
        );
    }

    /// A write into unaddressable bytes leaves their V bits defined, whoever wrote and
    /// whether or not it is reported. In Valgrind such a store leaves the bytes no-access
    /// (`mc_STOREVn_slow`), and a later load of a no-access byte gives a defined value
    /// (`get_vbits8`), so reading back what was stored into freed memory is one invalid
    /// read and no uninitialised-value error. Here the instruction's V part (a store
    /// copy's register shadow, or the interpreter's result) has already written the bytes'
    /// V bits when this access probe runs, before the instruction itself: they are
    /// overwritten with defined ones, which is what a load of them must give (a freed
    /// block's bytes are defined from its free, `Memcheck::definedness_free`).
    fn written_unaddressable_stay_defined(&self, host: &dyn Host, base: u64, a: &Access) {
        if !self.opts.undef_value_errors {
            return;
        }
        let end = a.addr.saturating_add(a.size as u64);
        let mut at = a.addr;
        while at < end {
            if shadow::byte_addressable(base, at) {
                at += 1;
                continue;
            }
            let run = at;
            while at < end && !shadow::byte_addressable(base, at) {
                at += 1;
            }
            host.set_definedness(run, at - run, true);
        }
    }

    /// What the code at `pc` is, by its symbol (cached: asked only on the slow path).
    pub(crate) fn pc_class(&self, host: &dyn Host, pc: u64) -> PcClass {
        if let Some(c) = self
            .pc_classes
            .lock()
            .as_ref()
            .and_then(|m| m.get(&pc).copied())
        {
            return c;
        }
        // No lock held across the symbolizer.
        let c = classify(&host.describe(pc));
        self.pc_classes
            .lock()
            .get_or_insert_with(Default::default)
            .insert(pc, c);
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libc_code_is_classified_by_symbol_name() {
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        let at = |object: &str, function: Option<&str>, file: Option<&str>| {
            classify(&[Frame {
                function: function.map(str::to_string),
                file: file.map(str::to_string),
                object: Some(object.to_string()),
                ..Default::default()
            }])
        };
        let named = |function| at(libc, Some(function), None);
        assert_eq!(named("__strlen_avx2"), PcClass::LibcString);
        assert_eq!(named("__memmove_avx_unaligned_erms"), PcClass::LibcString);
        assert_eq!(at(libc, None, None), PcClass::LibcString);
        assert_eq!(named("_int_free"), PcClass::LibcAllocator);
        assert_eq!(named("__libc_malloc"), PcClass::LibcAllocator);
        assert_eq!(named("tcache_put"), PcClass::LibcAllocator);
        assert_eq!(named("cfree@GLIBC_2.2.5"), PcClass::LibcAllocator);
        // The compiler's clone, seen at thread exit (tcache_thread_shutdown -> _int_free).
        assert_eq!(named("unlink_chunk.constprop.0"), PcClass::LibcAllocator);
        assert_eq!(named("qsort_r"), PcClass::Program);
        assert_eq!(at("/tmp/prog", Some("strlen"), None), PcClass::Program);
        // By source file, whatever the function's name.
        assert_eq!(
            at(libc, Some("__malloc_fork_lock_parent"), Some("arena.c")),
            PcClass::LibcAllocator
        );
        assert_eq!(
            at(libc, Some("anything.part.0"), Some("malloc.c")),
            PcClass::LibcAllocator
        );
        // The dynamic loader's own strlen (dlopen's _dl_new_object).
        let ld = "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2";
        assert_eq!(
            at(ld, Some("strlen"), Some("strlen-sse2.S")),
            PcClass::LibcString
        );
        assert_eq!(at(ld, Some("_dl_new_object"), None), PcClass::Program);
    }
}
