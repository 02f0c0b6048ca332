//! Memcheck's address descriptions (`describe_addr`): what an address an error mentions
//! is (inside or near a live or recently freed heap block, on a thread's stack, inside a
//! data symbol, or nothing known), as the lines under an error's stack say it.

use oxgrind_formats::memcheck_text::{self as text, Aux};
use oxgrind_tool::{Addr, DataAddr, Host, LiveBlock};

use crate::freed::{FreedBlock, FreedQueue, REDZONE};
use crate::options::KeepStacks;
use crate::Memcheck;

impl Memcheck {
    /// Memcheck's `describe_addr` for heap addresses: a recently freed block first, then a
    /// live one (each with its redzones), else "not stack'd, malloc'd or (recently) free'd".
    /// `thread`: the erring thread's number, for "on thread N's stack".
    pub(crate) fn describe_addr(
        &self,
        host: &dyn Host,
        freed: &FreedQueue,
        addr: Addr,
        thread: i32,
    ) -> Vec<Aux> {
        // Memory pools are searched first, as Memcheck does: a chunk is "client-defined".
        let chunk = self.pools.lock().chunk_near(addr);
        if let Some(c) = chunk {
            let what =
                text::address_in_block(addr, addr.wrapping_sub(c.addr) as i64, c.size, false);
            let what = match what.strip_suffix("alloc'd") {
                Some(head) => format!("{head}client-defined"),
                None => what,
            };
            return vec![
                Aux::Text(what),
                Aux::Stack(self.resolve(host, c.stack).shown),
            ];
        }
        let near = |start: Addr, size: u64| {
            addr >= start.saturating_sub(REDZONE) && addr < start + size + REDZONE
        };
        let live: Option<LiveBlock> = self
            .program_blocks(host)
            .into_iter()
            .find(|b| near(b.addr, b.size));
        let bracketing = freed.bracketing(addr);
        // A freed entry whose memory was handed out again (a custom allocator's block freed
        // inside its live pool, or memory glibc reused) is described as Memcheck describes
        // it: the live block, "recently re-allocated".
        let reallocated = bracketing.is_some_and(|f| host_reused(&live, &f));
        let f = bracketing.filter(|_| !reallocated);
        let keep = self.opts.keep_stacks;
        if let Some(f) = f {
            let mut aux = vec![Aux::Text(text::address_in_block(
                addr,
                addr.wrapping_sub(f.addr) as i64,
                f.size,
                true,
            ))];
            let free_st = matches!(
                keep,
                KeepStacks::Free | KeepStacks::AllocAndFree | KeepStacks::AllocThenFree
            );
            let alloc_st = matches!(keep, KeepStacks::Alloc | KeepStacks::AllocAndFree);
            if free_st {
                aux.push(Aux::Stack(self.resolve(host, f.free_stack).shown));
                if alloc_st {
                    aux.push(Aux::Text(text::BLOCK_WAS_ALLOCD_AT.into()));
                    aux.push(Aux::Stack(self.resolve(host, f.alloc_stack).shown));
                }
            } else if alloc_st {
                aux.push(Aux::Stack(self.resolve(host, f.alloc_stack).shown));
            }
            return aux;
        }
        if let Some(b) = live {
            let mut what =
                text::address_in_block(addr, addr.wrapping_sub(b.addr) as i64, b.size, false);
            if reallocated {
                what = what.replacen(
                    " a block of size ",
                    " a recently re-allocated block of size ",
                    1,
                );
            }
            let mut aux = vec![Aux::Text(what)];
            if !matches!(
                keep,
                KeepStacks::None | KeepStacks::Free | KeepStacks::AllocThenFree
            ) {
                aux.push(Aux::Stack(self.resolve(host, b.stack).shown));
            }
            return aux;
        }
        match host.describe_data(addr) {
            Some(DataAddr::Stack { frame }) => {
                let mut aux = vec![Aux::Text(text::address_on_stack(addr, thread))];
                if let Some((k, f)) = frame {
                    aux.push(Aux::Text(text::in_frame(k, &f)));
                }
                aux
            }
            Some(DataAddr::Symbol { name, offset }) => {
                vec![Aux::Text(text::address_in_data_symbol(addr, offset, &name))]
            }
            None => vec![Aux::Text(
                crate::outside_heap::describe_segment(host, addr)
                    .unwrap_or_else(|| text::address_unknown(addr)),
            )],
        }
    }
}

fn host_reused(live: &Option<LiveBlock>, f: &FreedBlock) -> bool {
    match live {
        Some(b) => b.addr < f.addr + f.size.max(1) && f.addr < b.addr + b.size.max(1),
        None => false,
    }
}
