//! The leak search of Memcheck (`mc_leakcheck.c`), rewritten: which heap blocks are still
//! reachable, possibly lost, indirectly lost or definitely lost at exit, and the loss
//! records they group into.
//!
//! The algorithm, as Memcheck runs it:
//!
//! 1. Every word of the root set (stacks from SP, saved registers, writable data of loaded
//!    objects, TLS) that points into a block marks it: a pointer to its first byte makes it
//!    *reachable*, an interior pointer *possibly* reachable unless a heuristic
//!    (std::string, length64, new[] arrays, multiple inheritance) explains the interior
//!    pointer, which makes it reachable "via heuristic". Marked blocks are scanned in turn
//!    (a mark stack, not recursion); a block reached from a possibly-reached block can only
//!    be possibly reached.
//! 2. The blocks left unreached are then visited in address order. Each still-unreached
//!    block starts a *clique*: everything unreached that it points to (start or interior
//!    pointer) becomes *indirectly lost* and its size, plus the indirect size of any earlier
//!    clique leader absorbed, is charged to this leader. Leaders stay *definitely lost*.
//!
//! Memory is read only through [`Memory`] (the host's `read_words`), so the algorithm runs
//! on synthetic heaps in tests exactly as on the program's.

use alloc::vec;
use alloc::vec::Vec;
use oxgrind_formats::suppressions::LeakKind;
use oxgrind_tool::{Addr, StackId};

use crate::options::Heuristics;

/// What the leak search needs to read.
pub trait Memory {
    /// `f(address, value)` for each readable aligned word in `[start, start + len)`.
    fn read_words(&self, start: Addr, len: u64, f: &mut dyn FnMut(Addr, u64));
    /// Whether `addr` is the address of a C++ vtable (a `_ZTV` symbol), for the
    /// multiple-inheritance heuristic.
    fn is_vtable(&self, addr: Addr) -> bool;
}

/// One live block.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub addr: Addr,
    pub size: u64,
    pub stack: StackId,
}

/// Which heuristic made an interior-pointed block count as reachable; the order and names
/// are Memcheck's (`pp_heuristic`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Heuristic {
    StdString = 1,
    Length64 = 2,
    NewArray = 3,
    MultipleInheritance = 4,
}

impl Heuristic {
    pub fn name(self) -> &'static str {
        match self {
            Heuristic::StdString => "stdstring",
            Heuristic::Length64 => "length64",
            Heuristic::NewArray => "newarray",
            Heuristic::MultipleInheritance => "multipleinheritance",
        }
    }
}

/// Feeds every root word to the sink it is given.
pub type RootFeed<'f> = dyn FnMut(&mut dyn FnMut(u64)) + 'f;

/// The outcome for one block.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// `Definite` here is Memcheck's "Unreached" (a clique leader).
    pub kind: LeakKind,
    /// For definitely lost blocks: bytes of the blocks of its clique.
    pub indirect: u64,
    pub heuristic: Option<Heuristic>,
}

struct Search<'a> {
    blocks: &'a [Block],
    verdicts: Vec<Verdict>,
    /// Whether the block is already on the mark stack (`LC_Extra.pending`).
    pending: Vec<bool>,
    stack: Vec<usize>,
    mem: &'a dyn Memory,
    heuristics: Heuristics,
}

/// Index of the block containing `ptr` (a zero-sized block covers its own address).
pub fn find_block(blocks: &[Block], ptr: Addr) -> Option<usize> {
    let (mut lo, mut hi) = (0usize, blocks.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        let b = &blocks[mid];
        let end = b.addr.saturating_add(b.size.max(1));
        if ptr < b.addr {
            hi = mid;
        } else if ptr >= end {
            lo = mid + 1;
        } else {
            return Some(mid);
        }
    }
    None
}

impl Search<'_> {
    fn push(&mut self, i: usize) {
        if !self.pending[i] {
            self.pending[i] = true;
            self.stack.push(i);
        }
    }

    fn word_at(&self, addr: Addr) -> Option<u64> {
        let mut v = None;
        self.mem.read_words(addr, 8, &mut |a, w| {
            if a == addr {
                v = Some(w)
            }
        });
        v
    }

    /// Memcheck's `heuristic_reachedness`: why an interior pointer may still mean reachable.
    fn heuristic_for(&self, ptr: Addr, b: &Block) -> Option<Heuristic> {
        const W: u64 = 8;
        let h = self.heuristics;
        if h.has(Heuristics::STDSTRING) && ptr == b.addr + 3 * W {
            // libstdc++'s pre-C++11 string: length, capacity, refcount, then the chars.
            if let (Some(cap), Some(len)) = (self.word_at(b.addr + W), self.word_at(b.addr)) {
                if (3 * W).checked_add(cap).and_then(|x| x.checked_add(1)) == Some(b.size)
                    && len <= cap
                {
                    return Some(Heuristic::StdString);
                }
            }
        }
        if h.has(Heuristics::LENGTH64) && ptr == b.addr + W {
            if let Some(size) = self.word_at(b.addr) {
                if size > 0 && b.size.checked_sub(W) == Some(size) {
                    return Some(Heuristic::Length64);
                }
            }
        }
        if h.has(Heuristics::NEWARRAY) && ptr == b.addr + W {
            if let Some(n) = self.word_at(b.addr) {
                if n > 0 && b.size >= W && (b.size - W) % n == 0 {
                    return Some(Heuristic::NewArray);
                }
            }
        }
        if h.has(Heuristics::MULTIPLE_INHERITANCE) && ptr % W == 0 {
            if let (Some(inner), Some(first)) = (self.word_at(ptr), self.word_at(b.addr)) {
                let plausible = |a: u64| a % W == 0 && a >= 4096;
                if plausible(inner)
                    && plausible(first)
                    && self.mem.is_vtable(inner)
                    && self.mem.is_vtable(first)
                {
                    return Some(Heuristic::MultipleInheritance);
                }
            }
        }
        None
    }

    /// `lc_push_without_clique_if_a_chunk_ptr`.
    fn mark(&mut self, ptr: Addr, prior_definite: bool) {
        let Some(i) = find_block(self.blocks, ptr) else {
            return;
        };
        let b = self.blocks[i];
        let v = &mut self.verdicts[i];
        if v.kind == LeakKind::Reachable {
            if v.heuristic.is_some() && ptr == b.addr {
                self.verdicts[i].heuristic = None;
            }
            return;
        }
        let reachable_via_ptr = if ptr == b.addr {
            true
        } else if self.heuristics.0 != 0 {
            let h = self.heuristic_for(ptr, &b);
            self.verdicts[i].heuristic = h;
            h.is_some()
        } else {
            false
        };
        if reachable_via_ptr && prior_definite {
            self.verdicts[i].kind = LeakKind::Reachable;
            self.push(i);
        } else if self.verdicts[i].kind == LeakKind::Definite {
            self.verdicts[i].kind = LeakKind::Possible;
            self.push(i);
        }
    }

    /// `lc_push_with_clique_if_a_chunk_ptr`.
    fn gather(&mut self, ptr: Addr, leader: usize) {
        let Some(i) = find_block(self.blocks, ptr) else {
            return;
        };
        if self.verdicts[i].kind == LeakKind::Definite && i != leader {
            self.push(i);
            let absorbed = self.blocks[i].size + self.verdicts[i].indirect;
            self.verdicts[leader].indirect += absorbed;
            self.verdicts[i].kind = LeakKind::Indirect;
            self.verdicts[i].indirect = 0;
        }
    }

    /// Scans block `i` word by word, marking (`clique == None`) or gathering a clique.
    fn scan(&mut self, i: usize, clique: Option<usize>) {
        let b = self.blocks[i];
        let end = b.addr.saturating_add(b.size);
        let prior_definite = self.verdicts[i].kind != LeakKind::Possible;
        let mem = self.mem;
        mem.read_words(b.addr, b.size, &mut |a, w| {
            if a % 8 == 0 && a >= b.addr && a.saturating_add(8) <= end {
                match clique {
                    None => self.mark(w, prior_definite),
                    Some(leader) => self.gather(w, leader),
                }
            }
        });
    }

    fn process(&mut self, clique: Option<usize>) {
        while let Some(i) = self.stack.pop() {
            self.pending[i] = false;
            self.scan(i, clique);
        }
    }
}

/// A leak search prepared outside the stopped world: [`LeakSearch::new`] allocates
/// everything the search needs, so [`LeakSearch::run`] (called while the program's threads
/// are stopped, possibly holding allocator locks) allocates nothing itself.
pub struct LeakSearch<'a> {
    s: Search<'a>,
}

impl<'a> LeakSearch<'a> {
    pub fn new(blocks: &'a [Block], mem: &'a dyn Memory, heuristics: Heuristics) -> LeakSearch<'a> {
        debug_assert!(blocks.windows(2).all(|w| w[0].addr <= w[1].addr));
        LeakSearch {
            s: Search {
                blocks,
                verdicts: vec![
                    Verdict {
                        kind: LeakKind::Definite,
                        indirect: 0,
                        heuristic: None
                    };
                    blocks.len()
                ],
                pending: vec![false; blocks.len()],
                // A block is on the stack at most once at a time.
                stack: Vec::with_capacity(blocks.len()),
                mem,
                heuristics,
            },
        }
    }

    /// Both passes; `roots` is called with a sink for every root word value.
    pub fn run(&mut self, roots: &mut RootFeed<'_>) {
        let s = &mut self.s;
        roots(&mut |w| s.mark(w, true));
        s.process(None);
        for i in 0..s.blocks.len() {
            if s.verdicts[i].kind == LeakKind::Definite {
                s.push(i);
                s.process(Some(i));
            }
        }
    }

    pub fn into_verdicts(self) -> Vec<Verdict> {
        self.s.verdicts
    }
}

/// Classifies `blocks` (sorted by address, not overlapping) against the root `words`.
/// `roots` is called with a sink for every root word value.
pub fn classify(
    blocks: &[Block],
    roots: &mut RootFeed<'_>,
    mem: &dyn Memory,
    heuristics: Heuristics,
) -> Vec<Verdict> {
    let mut search = LeakSearch::new(blocks, mem, heuristics);
    search.run(roots);
    search.into_verdicts()
}

/// One loss record: blocks of one kind allocated at one place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LossRecord {
    pub kind: LeakKind,
    pub stack: StackId,
    /// Direct bytes.
    pub bytes: u64,
    /// Indirect bytes owned (definitely lost records only).
    pub indirect: u64,
    pub blocks: u64,
    /// The same three numbers at the previous leak search (zero for a record it did not
    /// have), for the changes a delta search prints.
    pub old_bytes: u64,
    pub old_indirect: u64,
    pub old_blocks: u64,
}

/// Groups blocks into loss records and sorts them as Memcheck numbers them: total size,
/// then kind (reachable < possible < indirect < definite), then block count, then
/// allocation stack (older stacks first). `same_place(a, b)` says whether two stacks are
/// one place under `--leak-resolution`.
pub fn loss_records(
    blocks: &[Block],
    verdicts: &[Verdict],
    same_place: &mut dyn FnMut(StackId, StackId) -> bool,
) -> Vec<LossRecord> {
    loss_records_after(Vec::new(), blocks, verdicts, same_place)
}

/// [`loss_records`] for a search that follows `previous` (the last search's records), as
/// Memcheck keeps its loss records from one search to the next: a previous record that
/// still had blocks stays, even if no block joins it now (it then has 0 blocks, and
/// counts in "loss record N of M"), with its numbers moved to `old_*`; one that had none
/// is dropped. Blocks join an existing record of their kind and place first.
pub fn loss_records_after(
    previous: Vec<LossRecord>,
    blocks: &[Block],
    verdicts: &[Verdict],
    same_place: &mut dyn FnMut(StackId, StackId) -> bool,
) -> Vec<LossRecord> {
    let mut records: Vec<LossRecord> = previous
        .into_iter()
        .filter(|r| r.blocks > 0)
        .map(|r| LossRecord {
            old_bytes: r.bytes,
            old_indirect: r.indirect,
            old_blocks: r.blocks,
            bytes: 0,
            indirect: 0,
            blocks: 0,
            ..r
        })
        .collect();
    // Index of records by (kind, stack) for the exact-stack case, the common one.
    let mut exact: alloc::collections::BTreeMap<(LeakKind, StackId), usize> = records
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.kind, r.stack), i))
        .collect();
    for (b, v) in blocks.iter().zip(verdicts) {
        let found = match exact.get(&(v.kind, b.stack)) {
            Some(&i) => Some(i),
            None => records
                .iter()
                .position(|r| r.kind == v.kind && same_place(r.stack, b.stack)),
        };
        let indirect = if v.kind == LeakKind::Definite {
            v.indirect
        } else {
            0
        };
        match found {
            Some(i) => {
                let r = &mut records[i];
                r.bytes += b.size;
                r.indirect += indirect;
                r.blocks += 1;
                exact.insert((v.kind, b.stack), i);
            }
            None => {
                exact.insert((v.kind, b.stack), records.len());
                records.push(LossRecord {
                    kind: v.kind,
                    stack: b.stack,
                    bytes: b.size,
                    indirect,
                    blocks: 1,
                    old_bytes: 0,
                    old_indirect: 0,
                    old_blocks: 0,
                });
            }
        }
    }
    records.sort_by(|a, b| {
        (a.bytes + a.indirect, a.kind, a.blocks, a.stack).cmp(&(
            b.bytes + b.indirect,
            b.kind,
            b.blocks,
            b.stack,
        ))
    });
    records
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeMap;

    /// A fake address space: word address → value; everything else unreadable.
    #[derive(Default)]
    struct Fake {
        words: BTreeMap<u64, u64>,
        vtables: Vec<u64>,
    }

    impl Fake {
        fn put(&mut self, addr: u64, v: u64) {
            self.words.insert(addr, v);
        }
    }

    impl Memory for Fake {
        fn read_words(&self, start: Addr, len: u64, f: &mut dyn FnMut(Addr, u64)) {
            for (&a, &v) in self.words.range(start..start + len) {
                f(a, v)
            }
        }
        fn is_vtable(&self, addr: Addr) -> bool {
            self.vtables.contains(&addr)
        }
    }

    fn blk(addr: u64, size: u64, stack: u32) -> Block {
        Block {
            addr,
            size,
            stack: StackId(stack),
        }
    }

    fn run(blocks: &[Block], mem: &Fake, roots: &[u64]) -> Vec<LeakKind> {
        run_full(blocks, mem, roots, Heuristics::ALL)
            .iter()
            .map(|v| v.kind)
            .collect()
    }

    fn run_full(blocks: &[Block], mem: &Fake, roots: &[u64], h: Heuristics) -> Vec<Verdict> {
        classify(
            blocks,
            &mut |sink| roots.iter().for_each(|&w| sink(w)),
            mem,
            h,
        )
    }

    use LeakKind::*;

    #[test]
    fn unreferenced_block_is_definitely_lost_and_root_pointer_keeps_it() {
        let blocks = [blk(0x1000, 16, 1), blk(0x2000, 16, 2)];
        let mem = Fake::default();
        assert_eq!(run(&blocks, &mem, &[0x2000]), [Definite, Reachable]);
    }

    #[test]
    fn chain_below_a_lost_block_is_indirectly_lost_and_charged_to_it() {
        // leak_indirect(): pp = malloc(16); pp[0] = malloc(40); pp[1] = malloc(24).
        let blocks = [blk(0x1000, 16, 1), blk(0x2000, 40, 2), blk(0x3000, 24, 3)];
        let mut mem = Fake::default();
        mem.put(0x1000, 0x2000);
        mem.put(0x1008, 0x3000);
        let v = run_full(&blocks, &mem, &[], Heuristics::ALL);
        assert_eq!(
            v.iter().map(|v| v.kind).collect::<Vec<_>>(),
            [Definite, Indirect, Indirect]
        );
        assert_eq!(v[0].indirect, 64);
    }

    #[test]
    fn interior_pointer_only_means_possibly_lost_and_taints_what_it_reaches() {
        let blocks = [blk(0x1000, 64, 1), blk(0x2000, 16, 2)];
        let mut mem = Fake::default();
        mem.put(0x1010, 0x2000); // the possibly-lost block points at the start of another
        assert_eq!(run(&blocks, &mem, &[0x100A]), [Possible, Possible]);
    }

    #[test]
    fn a_start_pointer_upgrades_a_possibly_reached_block() {
        let blocks = [blk(0x1000, 64, 1)];
        let mem = Fake::default();
        assert_eq!(run(&blocks, &mem, &[0x1004, 0x1000]), [Reachable]);
        assert_eq!(run(&blocks, &mem, &[0x1000, 0x1004]), [Reachable]);
    }

    #[test]
    fn lost_cycle_has_its_lowest_block_definitely_lost_and_the_rest_indirect() {
        let blocks = [blk(0x1000, 16, 1), blk(0x2000, 16, 2), blk(0x3000, 16, 3)];
        let mut mem = Fake::default();
        mem.put(0x1000, 0x2000);
        mem.put(0x2000, 0x3000);
        mem.put(0x3000, 0x1000);
        let v = run_full(&blocks, &mem, &[], Heuristics::ALL);
        assert_eq!(
            v.iter().map(|v| v.kind).collect::<Vec<_>>(),
            [Definite, Indirect, Indirect]
        );
        assert_eq!(v[0].indirect, 32);
    }

    #[test]
    fn an_earlier_clique_leader_reached_later_is_absorbed_with_its_indirect_bytes() {
        // 0x1000 -> 0x2000 (a clique of 2), and 0x3000 -> 0x1000: 0x3000 leads all.
        let blocks = [blk(0x1000, 16, 1), blk(0x2000, 8, 2), blk(0x3000, 32, 3)];
        let mut mem = Fake::default();
        mem.put(0x1000, 0x2000);
        mem.put(0x3000, 0x1000);
        let v = run_full(&blocks, &mem, &[], Heuristics::ALL);
        assert_eq!(
            v.iter().map(|v| v.kind).collect::<Vec<_>>(),
            [Indirect, Indirect, Definite]
        );
        assert_eq!(v[2].indirect, 24);
        assert_eq!(v[0].indirect, 0);
    }

    #[test]
    fn blocks_reachable_through_reachable_blocks_are_reachable() {
        let blocks = [blk(0x1000, 16, 1), blk(0x2000, 16, 2)];
        let mut mem = Fake::default();
        mem.put(0x1008, 0x2000);
        assert_eq!(run(&blocks, &mem, &[0x1000]), [Reachable, Reachable]);
    }

    #[test]
    fn length64_and_newarray_heuristics_make_interior_pointers_reachable() {
        // From misc.c under Valgrind: a 48-byte block with l[0] = 40 pointed at +8 is
        // "length64"; a 38-byte block with n[0] = 3 pointed at +8 is "newarray".
        let blocks = [blk(0x1000, 48, 1), blk(0x2000, 38, 2)];
        let mut mem = Fake::default();
        mem.put(0x1000, 40);
        mem.put(0x2000, 3);
        let v = run_full(&blocks, &mem, &[0x1008, 0x2008], Heuristics::ALL);
        assert_eq!(v[0].kind, Reachable);
        assert_eq!(v[0].heuristic, Some(Heuristic::Length64));
        assert_eq!(v[1].kind, Reachable);
        assert_eq!(v[1].heuristic, Some(Heuristic::NewArray));
        let v = run_full(&blocks, &mem, &[0x1008, 0x2008], Heuristics(0));
        assert_eq!((v[0].kind, v[1].kind), (Possible, Possible));
    }

    #[test]
    fn stdstring_heuristic_needs_capacity_matching_block_size() {
        // length 5, capacity 8, refcount, chars: block size 3*8 + 8 + 1 = 33.
        let blocks = [blk(0x1000, 33, 1)];
        let mut mem = Fake::default();
        mem.put(0x1000, 5);
        mem.put(0x1008, 8);
        let v = run_full(&blocks, &mem, &[0x1018], Heuristics(Heuristics::STDSTRING));
        assert_eq!(
            (v[0].kind, v[0].heuristic),
            (Reachable, Some(Heuristic::StdString))
        );
        mem.put(0x1008, 9);
        let v = run_full(&blocks, &mem, &[0x1018], Heuristics(Heuristics::STDSTRING));
        assert_eq!(v[0].kind, Possible);
    }

    #[test]
    fn multiple_inheritance_heuristic_needs_two_vtables() {
        let blocks = [blk(0x1000, 32, 1)];
        let mut mem = Fake::default();
        mem.put(0x1000, 0x40_0000);
        mem.put(0x1010, 0x40_0100);
        mem.vtables = vec![0x40_0000, 0x40_0100];
        let v = run_full(
            &blocks,
            &mem,
            &[0x1010],
            Heuristics(Heuristics::MULTIPLE_INHERITANCE),
        );
        assert_eq!(v[0].heuristic, Some(Heuristic::MultipleInheritance));
        mem.vtables.pop();
        let v = run_full(
            &blocks,
            &mem,
            &[0x1010],
            Heuristics(Heuristics::MULTIPLE_INHERITANCE),
        );
        assert_eq!(v[0].kind, Possible);
    }

    #[test]
    fn zero_sized_blocks_are_found_by_their_address() {
        let blocks = [blk(0x1000, 0, 1), blk(0x1001, 8, 2)];
        assert_eq!(find_block(&blocks, 0x1000), Some(0));
        assert_eq!(find_block(&blocks, 0x1001), Some(1));
        assert_eq!(find_block(&blocks, 0x1009), None);
        let mem = Fake::default();
        assert_eq!(run(&blocks, &mem, &[0x1000]), [Reachable, Definite]);
    }

    #[test]
    fn pointers_past_the_end_of_a_block_do_not_reach_it() {
        let blocks = [blk(0x1000, 10, 1)];
        let mem = Fake::default();
        assert_eq!(run(&blocks, &mem, &[0x100A]), [Definite]);
    }

    #[test]
    fn loss_records_group_by_kind_and_stack_and_sort_like_memcheck() {
        // The mc_errors.c heap: expected order (records 1..6) from the reference output.
        let blocks = [
            blk(0x100, 16, 3),  // pp (definite, owns 64)
            blk(0x200, 40, 4),  // pp[0] indirect
            blk(0x300, 24, 5),  // pp[1] indirect
            blk(0x400, 100, 2), // leak_definite
            blk(0x500, 64, 6),  // possible
            blk(0x600, 33, 7),  // reachable
        ];
        let v = |kind, indirect| Verdict {
            kind,
            indirect,
            heuristic: None,
        };
        let verdicts = [
            v(Definite, 64),
            v(Indirect, 0),
            v(Indirect, 0),
            v(Definite, 0),
            v(Possible, 0),
            v(Reachable, 0),
        ];
        let r = loss_records(&blocks, &verdicts, &mut |a, b| a == b);
        let got: Vec<(LeakKind, u64, u64)> =
            r.iter().map(|r| (r.kind, r.bytes, r.indirect)).collect();
        assert_eq!(
            got,
            [
                (Indirect, 24, 0),
                (Reachable, 33, 0),
                (Indirect, 40, 0),
                (Possible, 64, 0),
                (Definite, 16, 64),
                (Definite, 100, 0)
            ]
        );
    }

    #[test]
    fn equal_sizes_order_by_kind_then_blocks_then_older_stack() {
        let blocks = [
            blk(0x100, 16, 9),
            blk(0x200, 16, 4),
            blk(0x300, 16, 5),
            blk(0x400, 8, 6),
            blk(0x500, 8, 6),
        ];
        let v = |kind| Verdict {
            kind,
            indirect: 0,
            heuristic: None,
        };
        let verdicts = [
            v(Definite),
            v(Indirect),
            v(Indirect),
            v(Reachable),
            v(Reachable),
        ];
        let r = loss_records(&blocks, &verdicts, &mut |a, b| a == b);
        let got: Vec<(LeakKind, u32, u64)> =
            r.iter().map(|r| (r.kind, r.stack.0, r.blocks)).collect();
        // All four records total 16 bytes: reachable < indirect < definite, then stack age.
        assert_eq!(
            got,
            [
                (Reachable, 6, 2),
                (Indirect, 4, 1),
                (Indirect, 5, 1),
                (Definite, 9, 1)
            ]
        );
    }

    #[test]
    fn a_later_search_keeps_the_records_that_had_blocks_with_their_old_numbers() {
        let v = |kind| Verdict {
            kind,
            indirect: 0,
            heuristic: None,
        };
        let same = &mut |a: StackId, b: StackId| a == b;
        let first = loss_records(
            &[blk(0x100, 16, 1), blk(0x200, 40, 2)],
            &[v(Definite), v(Possible)],
            same,
        );
        // The possible block was freed; two more blocks leaked at stack 1, one at stack 3.
        let second = loss_records_after(
            first,
            &[blk(0x100, 16, 1), blk(0x300, 16, 1), blk(0x400, 8, 3)],
            &[v(Definite), v(Definite), v(Definite)],
            same,
        );
        let got: Vec<(u32, u64, u64, u64, u64)> = second
            .iter()
            .map(|r| (r.stack.0, r.bytes, r.blocks, r.old_bytes, r.old_blocks))
            .collect();
        // The emptied record stays (first: 0 bytes), the new one starts from zero.
        assert_eq!(got, [(2, 0, 0, 40, 1), (3, 8, 1, 0, 0), (1, 32, 2, 16, 1)]);
        // A third search drops the record that had no blocks.
        let third = loss_records_after(second, &[], &[], same);
        assert_eq!(third.len(), 2);
        assert!(third.iter().all(|r| r.blocks == 0 && r.old_blocks > 0));
    }

    #[test]
    fn low_resolution_merges_records_whose_stacks_share_a_prefix() {
        let blocks = [blk(0x100, 10, 1), blk(0x200, 20, 2), blk(0x300, 5, 3)];
        let v = Verdict {
            kind: Definite,
            indirect: 0,
            heuristic: None,
        };
        // Stacks 1 and 2 share their first frames; 3 does not.
        let r = loss_records(&blocks, &[v, v, v], &mut |a, b| (a.0 <= 2) == (b.0 <= 2));
        let got: Vec<(u32, u64, u64)> = r.iter().map(|r| (r.stack.0, r.bytes, r.blocks)).collect();
        assert_eq!(got, [(3, 5, 1), (1, 30, 2)]);
    }
}
