//! Memory pools (`valgrind.h`'s `VALGRIND_CREATE_MEMPOOL` family): a program's own
//! allocator tells Memcheck which pieces ("chunks") of its big blocks it hands out.
//!
//! As in Memcheck (`mc_malloc_wrappers.c`, `MC_(mempool_*)`): a chunk is counted in HEAP
//! SUMMARY, made addressable by `MEMPOOL_ALLOC`, checked and leak-checked like a heap block
//! and described as "a block of size N client-defined" (pools are searched before the heap);
//! `MEMPOOL_FREE` makes it and its redzones unaddressable and remembers it as freed (an
//! address that is no chunk of the pool is an invalid free); `MEMPOOL_TRIM` frees the chunks
//! outside a range and cuts the ones across its ends; `DESTROY_MEMPOOL` makes every chunk
//! unaddressable and forgets them; `MEMPOOL_CHANGE` and `MOVE_MEMPOOL` only rename.
//! A request naming no pool is "Illegal memory pool address".

use oxgrind_formats::memcheck_text as text;
use oxgrind_formats::memcheck_xml::WhatQuirk;
use oxgrind_tool::instrument::GuestRegs;
use oxgrind_tool::{Addr, AllocFn, Host, LiveBlock};

use crate::errors::KeyKind;
use crate::freed::FreedBlock;
use crate::shadow;
use crate::Memcheck;

const CREATE_MEMPOOL: u64 = 0x1303;
const DESTROY_MEMPOOL: u64 = 0x1304;
const MEMPOOL_ALLOC: u64 = 0x1305;
const MEMPOOL_FREE: u64 = 0x1306;
const MEMPOOL_TRIM: u64 = 0x1307;
const MOVE_MEMPOOL: u64 = 0x1308;
const MEMPOOL_CHANGE: u64 = 0x1309;
const MEMPOOL_EXISTS: u64 = 0x130a;

/// One pool: its anchor (the address the program names it by), the redzone its chunks have
/// on each side, and its live chunks.
#[derive(Clone, Debug)]
pub(crate) struct Pool {
    anchor: Addr,
    redzone: u64,
    /// `CREATE_MEMPOOL`'s `is_zeroed`: its chunks are defined when allocated.
    zeroed: bool,
    chunks: Vec<LiveBlock>,
}

/// Every pool of the program.
#[derive(Default)]
pub(crate) struct Pools {
    pools: Vec<Pool>,
}

impl Pools {
    fn find(&mut self, anchor: Addr) -> Option<&mut Pool> {
        self.pools.iter_mut().find(|p| p.anchor == anchor)
    }

    /// Every live chunk of every pool.
    pub(crate) fn chunks(&self) -> impl Iterator<Item = &LiveBlock> {
        self.pools.iter().flat_map(|p| p.chunks.iter())
    }

    /// The live chunk whose memory or redzones hold `addr`.
    pub(crate) fn chunk_near(&self, addr: Addr) -> Option<LiveBlock> {
        self.pools.iter().find_map(|p| {
            p.chunks
                .iter()
                .find(|c| {
                    addr >= c.addr.saturating_sub(p.redzone)
                        && addr < c.addr + c.size.max(1) + p.redzone
                })
                .copied()
        })
    }
}

impl Memcheck {
    /// The mempool requests; `None` for any other.
    pub(crate) fn mempool_request(
        &self,
        host: &dyn Host,
        base: u64,
        args: &[u64; 6],
        regs: &GuestRegs,
    ) -> Option<u64> {
        let anchor = args[1];
        match args[0] {
            CREATE_MEMPOOL => {
                let mut pools = self.pools.lock();
                if pools.find(anchor).is_none() {
                    pools.pools.push(Pool {
                        anchor,
                        redzone: args[2],
                        zeroed: args[3] != 0,
                        chunks: Vec::new(),
                    });
                }
            }
            DESTROY_MEMPOOL => {
                let pool = {
                    let mut pools = self.pools.lock();
                    let i = pools.pools.iter().position(|p| p.anchor == anchor);
                    i.map(|i| pools.pools.swap_remove(i))
                };
                match pool {
                    Some(p) => {
                        for c in &p.chunks {
                            let start = c.addr.saturating_sub(p.redzone);
                            self.make_noaccess(host, base, start, c.size + 2 * p.redzone);
                        }
                    }
                    None => self.illegal_mempool(host, anchor, regs),
                }
            }
            MEMPOOL_ALLOC => {
                let (addr, size) = (args[2], args[3]);
                let stack = self.client_stack(host, regs);
                let known = {
                    let mut pools = self.pools.lock();
                    match pools.find(anchor) {
                        Some(p) => {
                            p.chunks.push(LiveBlock {
                                addr,
                                size,
                                func: AllocFn::Malloc,
                                stack,
                            });
                            Some(p.zeroed)
                        }
                        None => None,
                    }
                };
                let Some(zeroed) = known else {
                    self.illegal_mempool(host, anchor, regs);
                    return Some(0);
                };
                self.totals.alloc(size);
                shadow::make_accessible(base, addr, size);
                self.custom_block_definedness(host, addr, size, zeroed, stack);
            }
            MEMPOOL_FREE => self.mempool_free(host, base, anchor, args[2], regs),
            MEMPOOL_TRIM => self.mempool_trim(host, base, anchor, args[2], args[3], regs),
            MOVE_MEMPOOL => {
                let mut pools = self.pools.lock();
                match pools.find(anchor) {
                    Some(p) => p.anchor = args[2],
                    None => {
                        drop(pools);
                        self.illegal_mempool(host, anchor, regs);
                    }
                }
            }
            MEMPOOL_CHANGE => {
                let (from, to, size) = (args[2], args[3], args[4]);
                let mut pools = self.pools.lock();
                match pools.find(anchor) {
                    Some(p) => {
                        if let Some(c) = p.chunks.iter_mut().find(|c| c.addr == from) {
                            c.addr = to;
                            c.size = size;
                        }
                    }
                    None => {
                        drop(pools);
                        self.illegal_mempool(host, anchor, regs);
                    }
                }
            }
            MEMPOOL_EXISTS => {
                return Some(self.pools.lock().find(anchor).is_some() as u64);
            }
            _ => return None,
        }
        Some(0)
    }

    /// `VALGRIND_MEMPOOL_FREE(pool, addr)`.
    fn mempool_free(&self, host: &dyn Host, base: u64, anchor: Addr, addr: Addr, regs: &GuestRegs) {
        let found = {
            let mut pools = self.pools.lock();
            match pools.find(anchor) {
                None => None,
                Some(p) => {
                    let i = p.chunks.iter().position(|c| c.addr == addr);
                    Some((i.map(|i| p.chunks.swap_remove(i)), p.redzone))
                }
            }
        };
        match found {
            None => self.illegal_mempool(host, anchor, regs),
            Some((None, _)) => {
                let stack = self.client_stack(host, regs);
                self.report_invalid_free(host, addr, stack);
            }
            Some((Some(c), rz)) => {
                // Memcheck counts no free for a chunk (nor for a destroyed pool's).
                let stack = self.client_stack(host, regs);
                self.retire_chunk(host, base, &c, rz, stack);
            }
        }
    }

    /// A chunk given back: unaddressable with its redzones, remembered as freed.
    fn retire_chunk(
        &self,
        host: &dyn Host,
        base: u64,
        c: &LiveBlock,
        rz: u64,
        free_stack: oxgrind_tool::StackId,
    ) {
        self.make_noaccess(host, base, c.addr.saturating_sub(rz), c.size + 2 * rz);
        self.lock().freed.push_unkept(&FreedBlock {
            addr: c.addr,
            size: c.size,
            alloc_stack: c.stack,
            free_stack,
        });
    }

    /// `VALGRIND_MEMPOOL_TRIM(pool, addr, size)`: chunks wholly outside the range are freed,
    /// chunks across its ends lose what is outside.
    fn mempool_trim(
        &self,
        host: &dyn Host,
        base: u64,
        anchor: Addr,
        lo: Addr,
        size: u64,
        regs: &GuestRegs,
    ) {
        let hi = lo.saturating_add(size);
        let (gone, rz) = {
            let mut pools = self.pools.lock();
            let Some(p) = pools.find(anchor) else {
                drop(pools);
                self.illegal_mempool(host, anchor, regs);
                return;
            };
            let mut gone = Vec::new();
            let mut kept = Vec::new();
            for c in p.chunks.drain(..) {
                let end = c.addr + c.size;
                if end <= lo || c.addr >= hi {
                    gone.push(c);
                    continue;
                }
                let mut c = c;
                if c.addr < lo {
                    self.make_noaccess(host, base, c.addr, lo - c.addr);
                    c.size -= lo - c.addr;
                    c.addr = lo;
                }
                if end > hi {
                    self.make_noaccess(host, base, hi, end - hi);
                    c.size -= end - hi;
                }
                kept.push(c);
            }
            p.chunks = kept;
            (gone, p.redzone)
        };
        if !gone.is_empty() {
            let stack = self.client_stack(host, regs);
            for c in &gone {
                self.retire_chunk(host, base, c, rz, stack);
            }
        }
    }

    /// "Illegal memory pool address": a request naming no pool.
    fn illegal_mempool(&self, host: &dyn Host, anchor: Addr, regs: &GuestRegs) {
        let (tid, thread) = self.calling_thread(host);
        let stack = host.stack_at(regs, self.opts.core.num_callers);
        self.report_at(
            host,
            KeyKind::IllegalMempool,
            stack,
            false,
            tid,
            "InvalidMemPool",
            &|| "Illegal memory pool address".to_string(),
            WhatQuirk::None,
            &|freed| self.describe_addr(host, freed, anchor, thread),
        );
    }

    /// "Invalid free() / delete / delete[] / realloc()" at a client request.
    pub(crate) fn report_invalid_free(
        &self,
        host: &dyn Host,
        addr: Addr,
        stack: oxgrind_tool::StackId,
    ) {
        let (tid, thread) = self.calling_thread(host);
        self.report_at(
            host,
            KeyKind::InvalidFree,
            stack,
            false,
            tid,
            "InvalidFree",
            &|| text::INVALID_FREE.to_string(),
            WhatQuirk::None,
            &|freed| self.describe_addr(host, freed, addr, thread),
        );
    }
}
