//! The allocator's events as Memcheck sees them: counting for HEAP SUMMARY, the shadow of
//! each block kept in step with the heap, the freed-block queue fed, mismatched frees found,
//! and the misuse the runtime detected (invalid free, fishy sizes, bad alignment, overlap)
//! turned into errors.
//!
//! Only the program's allocations reach here: what oxgrind's own work allocates through
//! glibc (`__cxa_demangle` in a report, `dlsym`), the tool's probe slow paths included, runs
//! inside the runtime (`guard::Entered`), where the hooks pass it to glibc untracked.

use std::sync::atomic::Ordering;

use oxgrind_formats::memcheck_text::{self as text, Aux};
use oxgrind_formats::memcheck_xml::WhatQuirk;
use oxgrind_tool::{Addr, Alloc, AllocFn, Free, Host, LiveBlock, Misuse, MisuseEvent};

use crate::errors::KeyKind;
use crate::freed::{FreedBlock, Giving, Pushed};
use crate::options::KeepStacks;
use crate::report::thread_number;
use crate::shadow::{self, shadow_base};
use crate::Memcheck;
use crate::State;

fn alloc_fn_name(f: AllocFn) -> &'static str {
    match f {
        AllocFn::Malloc => "malloc",
        AllocFn::Calloc => "calloc",
        AllocFn::Realloc => "realloc",
        AllocFn::ReallocArray => "reallocarray",
        AllocFn::Memalign => "memalign",
        AllocFn::PosixMemalign => "posix_memalign",
        AllocFn::AlignedAlloc => "aligned_alloc",
        AllocFn::Valloc => "valloc",
        AllocFn::Pvalloc => "pvalloc",
        // Memcheck names the C++ allocators by their GCC builtins in FishyValue errors.
        AllocFn::New => "__builtin_new",
        AllocFn::NewArray => "__builtin_vec_new",
        AllocFn::Free => "free",
        AllocFn::Delete => "__builtin_delete",
        AllocFn::DeleteArray => "__builtin_vec_delete",
    }
}

impl Memcheck {
    pub(crate) fn alloc_event(&self, host: &dyn Host, ev: &Alloc) {
        self.ensure_started(host);
        // Counted before the shadows are written: the counters' locked adds wait for every
        // store before them, and the shadows' lines of a block just out of the freed-block
        // queue are cold (a third of this function's time when counted after).
        self.totals.alloc(ev.size);
        self.definedness_alloc(host, ev);
        if self.probing.load(Ordering::Relaxed) {
            let (end, next_header) =
                shadow::chunk_end(host.block_extent(ev.addr), ev.addr, ev.size);
            let base = shadow_base();
            shadow::mark_alloc(base, ev.addr, ev.size, end);
            if next_header {
                shadow::mark_next_header(base, end);
            }
        }
    }

    /// A free; what it gives back to glibc, for the end of the event
    /// ([`Memcheck::give_back`]).
    pub(crate) fn free_event(&self, host: &dyn Host, ev: &Free) -> Giving {
        self.free_block(host, ev, true)
    }

    /// [`Memcheck::free_event`] but for the block's V bits (`realloc` moves them first).
    pub(crate) fn free_event_keeping_vbits(&self, host: &dyn Host, ev: &Free) -> Giving {
        self.free_block(host, ev, false)
    }

    /// A free of the program's block: counted, checked, queued, its shadow marked (its V
    /// bits made defined when `vbits_defined`).
    ///
    /// Locked instructions first (the counter, the thread's batch), the stores to the
    /// block's shadow after them: those lines are cold (the block's memory was last marked
    /// when allocated, often megabytes of frees ago), and a locked instruction waits until
    /// every store before it is done. A full batch moves into the queues last.
    fn free_block(&self, host: &dyn Host, ev: &Free, vbits_defined: bool) -> Giving {
        self.ensure_started(host);
        self.totals.free();
        if self.opts.show_mismatched_frees && ev.alloc_func.family() != ev.func.family() {
            let (addr, size, alloc_stack) = (ev.addr, ev.size, ev.alloc_stack);
            let keep_alloc = !matches!(
                self.opts.keep_stacks,
                KeepStacks::None | KeepStacks::Free | KeepStacks::AllocThenFree
            );
            self.report(
                host,
                KeyKind::MismatchedFree,
                ev.stack,
                ev.tid,
                "MismatchedFree",
                &|| text::MISMATCHED_FREE.to_string(),
                WhatQuirk::None,
                &|_| {
                    let mut aux = vec![Aux::Text(text::address_in_block(addr, 0, size, false))];
                    if keep_alloc {
                        aux.push(Aux::Stack(self.resolve(host, alloc_stack).shown));
                    }
                    aux
                },
            );
        }
        let block = FreedBlock {
            addr: ev.addr,
            size: ev.size,
            alloc_stack: ev.alloc_stack,
            free_stack: ev.stack,
        };
        let mut giving = Giving::default();
        let mut pushed = self.batches.push(&block, &mut giving);
        while pushed == Pushed::NoRoom {
            giving.behind |= self.batches.absorb(&mut self.lock().freed, &mut giving);
            pushed = self.batches.push(&block, &mut giving);
        }
        // Marked until the block leaves the queue and goes back to glibc
        // ([`Memcheck::give_back`]); one larger than the whole queue leaves at once,
        // unmarked.
        if self.probing.load(Ordering::Relaxed) && ev.size <= self.opts.freelist_vol {
            shadow::mark_freed(shadow_base(), ev.addr, ev.size);
        }
        if vbits_defined {
            self.definedness_free(host, ev.addr, ev.size);
        }
        if pushed == Pushed::Full {
            giving.behind |= self.batches.absorb(&mut self.lock().freed, &mut giving);
        }
        giving
    }

    /// The end of a free's handling (after `realloc` copied the old block's V bits): the
    /// blocks [`Memcheck::free_event`] took from the thread's ring go back to glibc.
    pub(crate) fn give_back(&self, host: &dyn Host, giving: Giving) {
        for &(a, s) in giving.blocks() {
            self.release_block(host, a, s);
        }
        if giving.behind {
            self.catch_up_freed(host);
        }
    }

    /// More blocks left the queue than the thread's ring holds (large frees after many
    /// small ones): they all go back now, oldest first, a ring at a time, so that the
    /// memory held stays near `--freelist-vol` (bench sqlite3: 4 KiB pages freed behind
    /// 70,000 small blocks held 80 MB for a 2 MB budget when they left two per free).
    #[cold]
    fn catch_up_freed(&self, host: &dyn Host) {
        loop {
            self.batches
                .give_all(&mut |a, s| self.release_block(host, a, s));
            if !self.batches.refill(&mut self.lock().freed) {
                break;
            }
        }
    }

    /// A freed block leaves us: its whole extent, redzones and slack included, is ordinary
    /// memory again, made so before glibc's allocator gets it back (another thread may be
    /// given it at once).
    ///
    /// Its V bits (defined since its free, a whole queue ago) start loading first: the next
    /// `malloc` of its chunk, often a few frees later from glibc's per-thread cache, marks
    /// them undefined, and those stores missed to memory (perf on bench alloc put 18% of
    /// the samples on the `malloc`'s V-bit fill and the A-bit stores queued behind it).
    fn release_block(&self, host: &dyn Host, addr: Addr, size: u64) {
        if self.opts.undef_value_errors {
            host.prefetch_definedness(addr, size);
        }
        let probing = self.probing.load(Ordering::Relaxed);
        host.release_freed(addr, &mut |extent| {
            // Whether or not this block was marked (one freed before the probes started):
            // clearing a block glibc is about to own is always right.
            if probing {
                let (end, _) = shadow::chunk_end(extent, addr, size);
                shadow::clear_block(shadow_base(), addr, size, end);
            }
        });
    }

    /// Moves every thread's pending frees into the queue: before describing an address.
    pub(crate) fn absorb_all_freed(&self, st: &mut State) {
        self.batches.drain(|batch| absorb_freed(st, batch));
    }

    pub(crate) fn misuse_event(&self, host: &dyn Host, ev: &MisuseEvent) {
        self.ensure_started(host);
        match ev.kind {
            Misuse::InvalidFree { addr, func, size } => {
                let thread = {
                    let mut st = self.lock();
                    thread_number(&mut st.threads, ev.tid, host.pid())
                };
                // Memcheck counts the call before validating the pointer: an invalid free
                // is one of the "frees" of HEAP SUMMARY, an invalid realloc also an alloc
                // of the size it asked for.
                self.totals.free();
                if matches!(func, AllocFn::Realloc | AllocFn::ReallocArray) {
                    self.totals.alloc(size);
                }
                self.report(
                    host,
                    KeyKind::InvalidFree,
                    ev.stack,
                    ev.tid,
                    "InvalidFree",
                    &|| text::INVALID_FREE.to_string(),
                    WhatQuirk::None,
                    &|freed| self.describe_addr(host, freed, addr, thread),
                )
            }
            Misuse::FishyValue { func, arg, value } => {
                let function = alloc_fn_name(func);
                self.report(
                    host,
                    KeyKind::FishyValue {
                        function,
                        argument: arg,
                    },
                    ev.stack,
                    ev.tid,
                    "FishyValue",
                    &|| text::fishy_value(function, arg, value),
                    WhatQuirk::NewlineThenTag,
                    &|_| Vec::new(),
                )
            }
            Misuse::UndefinedArgument { origin, .. } => {
                if !self.opts.undef_value_errors {
                    return;
                }
                let origin = origin.filter(|_| self.opts.track_origins);
                self.report(
                    host,
                    KeyKind::Cond,
                    ev.stack,
                    ev.tid,
                    "UninitCondition",
                    &|| "Conditional jump or move depends on uninitialised value(s)".to_string(),
                    WhatQuirk::None,
                    &|_| match origin {
                        Some(o) => self.origin_aux(host, o).to_vec(),
                        None => Vec::new(),
                    },
                )
            }
            Misuse::BadAlignment { func, align } => {
                let why = match func {
                    AllocFn::PosixMemalign => {
                        " (should be non-zero, a power of 2 and a multiple of sizeof(void*))"
                    }
                    _ => " (should be power of 2)",
                };
                self.report(
                    host,
                    KeyKind::BadAlign,
                    ev.stack,
                    ev.tid,
                    "InvalidAlignment",
                    &|| text::invalid_alignment(align, why),
                    WhatQuirk::None,
                    &|_| Vec::new(),
                )
            }
            Misuse::Overlap {
                func,
                dst,
                src,
                len,
            } => self.report(
                host,
                KeyKind::Overlap { function: func },
                ev.stack,
                ev.tid,
                "Overlap",
                &|| text::overlap(func, dst, src, len),
                if len.is_none() {
                    WhatQuirk::NewlineThenNewline
                } else {
                    WhatQuirk::None
                },
                &|_| Vec::new(),
            ),
        }
    }

    /// The program's live blocks: the runtime's list (which holds only the program's: what
    /// oxgrind allocates through the hooks, inside the runtime, glibc serves untracked), with
    /// the blocks of the program's own allocators (client requests).
    pub(crate) fn program_blocks(&self, host: &dyn Host) -> Vec<LiveBlock> {
        let mut live = host.live_blocks();
        live.extend(self.client_blocks.lock().iter().copied());
        live.extend(self.pools.lock().chunks().copied());
        live
    }
}

/// Frees leaving a thread's batch, oldest first, into the freed-block queue.
fn absorb_freed(st: &mut State, batch: &[FreedBlock]) {
    for b in batch {
        st.freed.push(b);
    }
}
