//! A model of the allocator that serves the program under Valgrind (its "client arena",
//! `coregrind/m_mallocfree.c`), kept only to know how many usable bytes Valgrind's
//! allocator would have handed out for each block.
//!
//! Massif counts a block's *slop* (usable size minus the size asked for) as extra heap, and
//! with `--time-unit=B` it is part of the clock. Valgrind's allocator is a first-fit search
//! over 112 size-class free lists that hands out a whole free block when the rest would be
//! too small to be a block of its own (under 32 bytes), so a 24-byte request can get 32,
//! 48 or 64 usable bytes depending on what was freed before. `round_up(size, 16)` is right
//! only while nothing has been freed; on C++ programs the heap peak drifted by about half a
//! percent. This module replays every allocation and free of the program against the same
//! algorithm, with the same constants Massif's arena uses (8-byte redzones, 16-byte
//! alignment, 4 MiB superblocks, 32 bytes of block overhead), so the usable sizes are
//! Valgrind's for any single-threaded program.
//!
//! Addresses here are *simulated*: superblocks are placed first fit from a fixed base, as
//! Valgrind's address-space manager places the client heap; only their order matters (the
//! free-list "swizzle" prefers lower addresses). Nothing is allocated for real; a block costs
//! one table entry while it exists.
//!
//! Deliberately not modelled: Valgrind serialises threads, so a multi-threaded program's
//! allocation order (and hence its usable sizes) can differ from ours anyway.

use std::collections::BTreeMap;

const N_LISTS: usize = 112;
/// VG_MIN_MALLOC_SZB on amd64.
pub(crate) const MIN_MALLOC: u64 = 16;
/// Bytes before a payload: the size word and an 8-byte redzone (Massif asks for none; the
/// arena keeps at least a pointer's worth for the free-list link).
const OVERHEAD_LO: u64 = 16;
/// Bytes after a payload: the redzone and the second size word.
const OVERHEAD_HI: u64 = 16;
const OVERHEAD: u64 = OVERHEAD_LO + OVERHEAD_HI;
/// The smallest block that can stand alone (a zero-byte payload).
const MIN_USEFUL: u64 = OVERHEAD;
/// sizeof(Superblock): two words, padded to 16 bytes, then the payload.
const SB_HEADER: u64 = 32;
/// The client arena's superblock size; bigger requests get a superblock of their own that
/// is never split and is unmapped when its block is freed.
const MIN_SBLOCK: u64 = 4 << 20;
const MIN_UNSPLITTABLE: u64 = MIN_SBLOCK + 1;
const PAGE: u64 = 4096;
/// Where the simulated superblocks start (any page-aligned address does).
const BASE: u64 = 0x1000_0000;
const NIL: u32 = u32::MAX;

/// A block of the replayed arena, as handed to the caller (a slot in the arena's table).
pub(crate) type BlockId = u32;

/// What the free-list operations read of a block: its place in its free list and its
/// simulated address (the list search and `unlink`'s swizzle walk these, so they sit
/// together, four to a cache line, apart from the rest of the block).
///
/// Valgrind keeps a block's size in its header and trailer and finds neighbours by address;
/// here each block knows its neighbours in the superblock ([`Shape`]) and, while free, in its
/// free list (`prev`, `next`), so no operation needs a lookup by address.
#[derive(Copy, Clone, Debug)]
struct Link {
    /// Simulated address of the block (its payload is 16 bytes further).
    addr: u64,
    prev: u32,
    next: u32,
}

/// The rest of a block.
#[derive(Copy, Clone, Debug)]
struct Shape {
    bsz: u64,
    sb: u32,
    before: u32,
    after: u32,
    free: bool,
    /// While free: the list it is linked in (`list_no` of its payload size), kept so that
    /// unlinking it needs no size-class computation.
    lno: u8,
}

#[derive(Copy, Clone, Debug)]
struct Superblock {
    /// Address of the first payload byte (the first block starts there).
    start: u64,
    n_payload: u64,
    unsplittable: bool,
    /// Its first block: never merged into a predecessor, so the same slot for the
    /// superblock's whole life.
    first: u32,
}

/// The client arena of one Valgrind process, as far as block sizes go.
///
/// Block ids index `links` and `shapes` (always the same length): every id stored in a
/// link, a shape, a list head or a superblock, and every id handed out, was returned by
/// [`Arena::new_block`], and the tables never shrink, so an id other than [`NIL`] is always
/// in bounds. The hot paths rely on that to read without bounds checks ([`Arena::l`]).
pub(crate) struct Arena {
    links: Vec<Link>,
    shapes: Vec<Shape>,
    spare_blocks: Vec<u32>,
    sbs: Vec<Superblock>,
    spare_sbs: Vec<u32>,
    freelist: [u32; N_LISTS],
    /// Bit `l` set exactly when `freelist[l]` is not empty, so a search skips the empty
    /// lists in one step (Valgrind visits them one by one; the result is the same).
    nonempty: u128,
    deferred: Option<u32>,
    min_unsplittable: u64,
    /// Simulated mappings: start → length.
    mapped: BTreeMap<u64, u64>,
}

impl Default for Arena {
    fn default() -> Self {
        Arena {
            links: Vec::new(),
            shapes: Vec::new(),
            spare_blocks: Vec::new(),
            sbs: Vec::new(),
            spare_sbs: Vec::new(),
            freelist: [NIL; N_LISTS],
            nonempty: 0,
            deferred: None,
            min_unsplittable: MIN_UNSPLITTABLE,
            mapped: BTreeMap::new(),
        }
    }
}

/// Lower bounds (in 16-byte units) of lists 65..=111; list 64 starts at 64.
const BOUNDS: [u64; 47] = [
    67, 70, 74, 77, 81, 85, 90, 94, 99, 104, 109, 114, 120, 126, 133, 139, 153, 169, 185, 204, 224,
    247, 272, 299, 329, 362, 398, 438, 482, 530, 583, 641, 770, 924, 1109, 1331, 1597, 1916, 2300,
    2760, 3312, 3974, 4769, 5723, 6868, 8241, 9890,
];

/// Valgrind's size classes: 16-byte steps up to 1008 bytes, then geometric.
fn list_no(psz: u64) -> usize {
    let n = psz / MIN_MALLOC;
    if n < 64 {
        return n as usize;
    }
    64 + BOUNDS.partition_point(|&b| n >= b)
}

fn align_req(n: u64) -> u64 {
    n.saturating_add(MIN_MALLOC - 1) & !(MIN_MALLOC - 1)
}

impl Arena {
    /// Usable bytes of a block.
    #[inline]
    pub(crate) fn usable(&self, id: BlockId) -> u64 {
        self.s(id).bsz - OVERHEAD
    }

    /// Starts loading what freeing block `id` reads first: its link and shape (a hint; an
    /// id that is no longer a block only loads the wrong line, one out of range nothing).
    #[inline]
    pub(crate) fn prefetch_block(&self, id: BlockId) {
        if let (Some(l), Some(s)) = (self.links.get(id as usize), self.shapes.get(id as usize)) {
            oxgrind_tool::hint::prefetch_read(l);
            oxgrind_tool::hint::prefetch_read(s);
        }
    }

    /// Starts loading what a free of block `id` reads next: the shapes and links of its
    /// neighbours in its superblock, which it merges with when they are free. Reads `id`'s
    /// shape, so best after [`Arena::prefetch_block`] had time to load it.
    #[inline]
    pub(crate) fn prefetch_neighbours(&self, id: BlockId) {
        if let Some(s) = self.shapes.get(id as usize) {
            for n in [s.before, s.after] {
                if n != NIL {
                    self.prefetch_block(n);
                }
            }
        }
    }

    /// Starts loading the block a `malloc` of `size` bytes would look at first: the head of
    /// the first free list not empty from its size class on (a hint: the lists may change
    /// before that allocation is replayed).
    #[inline]
    pub(crate) fn prefetch_fit(&self, size: u64) {
        let lno = list_no(align_req(size));
        let rest = self.nonempty.checked_shr(lno as u32).unwrap_or(0);
        if rest != 0 {
            self.prefetch_block(self.freelist[lno + rest.trailing_zeros() as usize]);
        }
    }

    /// Simulated payload address of a block.
    #[cfg(test)]
    fn payload(&self, id: BlockId) -> u64 {
        self.l(id).addr + OVERHEAD_LO
    }

    /// `VG_(cli_malloc)(align, size)`.
    pub(crate) fn alloc(&mut self, align: u64, size: u64) -> BlockId {
        if align <= MIN_MALLOC {
            self.malloc(size)
        } else {
            self.memalign(align, size)
        }
    }

    #[inline]
    fn l(&self, id: u32) -> &Link {
        debug_assert!((id as usize) < self.links.len());
        // SAFETY: `id` is a block id, in bounds (see the invariant on `Arena`).
        unsafe { self.links.get_unchecked(id as usize) }
    }

    #[inline]
    fn lm(&mut self, id: u32) -> &mut Link {
        debug_assert!((id as usize) < self.links.len());
        // SAFETY: as in `l`.
        unsafe { self.links.get_unchecked_mut(id as usize) }
    }

    #[inline]
    fn s(&self, id: u32) -> &Shape {
        debug_assert!((id as usize) < self.shapes.len());
        // SAFETY: as in `l` (`shapes` has the length of `links`).
        unsafe { self.shapes.get_unchecked(id as usize) }
    }

    #[inline]
    fn sm(&mut self, id: u32) -> &mut Shape {
        debug_assert!((id as usize) < self.shapes.len());
        // SAFETY: as in `s`.
        unsafe { self.shapes.get_unchecked_mut(id as usize) }
    }

    fn new_block(&mut self, addr: u64, shape: Shape) -> u32 {
        let link = Link {
            addr,
            prev: NIL,
            next: NIL,
        };
        match self.spare_blocks.pop() {
            Some(id) => {
                *self.lm(id) = link;
                *self.sm(id) = shape;
                id
            }
            None => {
                self.links.push(link);
                self.shapes.push(shape);
                (self.links.len() - 1) as u32
            }
        }
    }

    /// `VG_(arena_malloc)`.
    fn malloc(&mut self, req: u64) -> BlockId {
        let req_p = align_req(req);
        let req_b = req_p + OVERHEAD;
        let mut found = None;
        let mut lno = list_no(req_p);
        'lists: while lno < N_LISTS {
            // The next list that is not empty (Valgrind skips the empty ones one by one).
            let rest = self.nonempty >> lno;
            if rest == 0 {
                break;
            }
            lno += rest.trailing_zeros() as usize;
            let mut b = self.freelist[lno];
            let mut searched = 0;
            loop {
                searched += 1;
                if searched >= 100 && lno < N_LISTS - 1 {
                    // Valgrind moves the list's start one step along and tries the next list.
                    self.freelist[lno] = self.l(self.freelist[lno]).next;
                    break;
                }
                if self.s(b).bsz >= req_b {
                    found = Some((b, lno));
                    break 'lists;
                }
                b = self.l(b).next;
                if b == self.freelist[lno] {
                    break;
                }
            }
            lno += 1;
        }
        let mut new_sb_unsplittable = false;
        let (b, lno) = match found {
            Some(f) => f,
            None => {
                let (b, unsplittable) = self.new_superblock(req_b);
                new_sb_unsplittable = unsplittable;
                (b, self.s(b).lno as usize)
            }
        };
        let bsz = self.s(b).bsz;
        let frag = bsz - req_b;
        self.unlink(b, lno);
        self.sm(b).free = false;
        if frag >= MIN_USEFUL && !new_sb_unsplittable {
            self.sm(b).bsz = req_b;
            let rest = self.split_after(b, frag);
            self.mk_free(rest);
        }
        b
    }

    /// Carves a new block of `bsz` bytes off the end of `b` (whose size the caller has
    /// already reduced by as much); returns it, not on any free list.
    fn split_after(&mut self, b: u32, bsz: u64) -> u32 {
        let addr = self.l(b).addr + self.s(b).bsz;
        let shape = *self.s(b);
        let id = self.new_block(
            addr,
            Shape {
                bsz,
                sb: shape.sb,
                before: b,
                after: shape.after,
                free: false,
                lno: 0,
            },
        );
        if shape.after != NIL {
            self.sm(shape.after).before = id;
        }
        self.sm(b).after = id;
        id
    }

    /// `VG_(arena_memalign)`: a bigger block, split so that the payload is aligned; the part
    /// before it goes back to the free lists, the aligned block keeps the rest.
    fn memalign(&mut self, align: u64, req: u64) -> BlockId {
        let req_p = align_req(req);
        let base_req = req_p + MIN_USEFUL + align;
        let saved = self.min_unsplittable;
        self.min_unsplittable = u64::MAX;
        let base = self.malloc(base_req);
        self.min_unsplittable = saved;
        let base_b = self.l(base).addr;
        let align_p = (base_b + 2 * OVERHEAD_LO + OVERHEAD_HI).next_multiple_of(align);
        let frag = align_p - OVERHEAD_LO - base_b;
        let rest = self.s(base).bsz - frag;
        self.sm(base).bsz = frag;
        let aligned = self.split_after(base, rest);
        self.mk_free(base);
        aligned
    }

    /// `VG_(arena_free)`.
    pub(crate) fn free(&mut self, id: BlockId) {
        let sb = self.s(id).sb;
        if self.sbs[sb as usize].unsplittable {
            self.spare_blocks.push(id);
            self.reclaim(sb);
            return;
        }
        self.mk_free(id);
        self.merge_with_free_neighbours(id);
    }

    fn merge_with_free_neighbours(&mut self, mut b: u32) {
        let after = self.s(b).after;
        if after != NIL && self.s(after).free {
            self.absorb_next(b);
        }
        let before = self.s(b).before;
        if before != NIL && self.s(before).free {
            self.absorb_next(before);
            b = before;
        }
        let blk = *self.s(b);
        if blk.before == NIL && blk.after == NIL {
            self.deferred_reclaim(Some(blk.sb));
        }
    }

    /// Merges the free block after free block `b` into it (both leave their lists; the
    /// result is linked as a new free block).
    fn absorb_next(&mut self, b: u32) {
        let other = self.s(b).after;
        self.unlink(b, self.s(b).lno as usize);
        self.unlink(other, self.s(other).lno as usize);
        let o = *self.s(other);
        let blk = self.sm(b);
        blk.bsz += o.bsz;
        blk.after = o.after;
        if o.after != NIL {
            self.sm(o.after).before = b;
        }
        self.spare_blocks.push(other);
        self.mk_free(b);
    }

    /// A fully free superblock is unmapped only when another one becomes fully free or a
    /// new one is needed (Valgrind's deferred reclaim).
    fn deferred_reclaim(&mut self, sb: Option<u32>) {
        if sb.is_none() && self.deferred.is_none() {
            return;
        }
        if let Some(def) = self.deferred.filter(|&d| Some(d) != sb) {
            // Still fully free: its first block is free and is its only block.
            let first = self.first_block(def);
            let blk = *self.s(first);
            if blk.free && blk.after == NIL {
                self.unlink(first, blk.lno as usize);
                self.spare_blocks.push(first);
                self.reclaim(def);
                self.deferred = None;
            }
        }
        self.deferred = sb;
    }

    fn first_block(&self, sb: u32) -> u32 {
        self.sbs[sb as usize].first
    }

    /// Returns the superblock's one free block and whether it is unsplittable.
    fn new_superblock(&mut self, req_b: u64) -> (u32, bool) {
        self.deferred_reclaim(None);
        let csz = (req_b + SB_HEADER).max(MIN_SBLOCK).next_multiple_of(PAGE);
        let unsplittable = csz >= self.min_unsplittable;
        let at = self.map(csz);
        let s = Superblock {
            start: at + SB_HEADER,
            n_payload: csz - SB_HEADER,
            unsplittable,
            first: NIL,
        };
        let sb = match self.spare_sbs.pop() {
            Some(i) => {
                self.sbs[i as usize] = s;
                i
            }
            None => {
                self.sbs.push(s);
                (self.sbs.len() - 1) as u32
            }
        };
        let b = self.new_block(
            s.start,
            Shape {
                bsz: s.n_payload,
                sb,
                before: NIL,
                after: NIL,
                free: false,
                lno: 0,
            },
        );
        self.sbs[sb as usize].first = b;
        self.mk_free(b);
        (b, unsplittable)
    }

    fn reclaim(&mut self, sb: u32) {
        let s = self.sbs[sb as usize];
        self.mapped.remove(&(s.start - SB_HEADER));
        self.spare_sbs.push(sb);
    }

    /// First fit from [`BASE`] in the simulated address space.
    fn map(&mut self, len: u64) -> u64 {
        let mut at = BASE;
        for (&s, &l) in &self.mapped {
            if s >= at + len {
                break;
            }
            at = at.max(s + l);
        }
        self.mapped.insert(at, len);
        at
    }

    /// `mkFreeBlock`: marks `b` free and links it in before its list's head.
    fn mk_free(&mut self, b: u32) {
        let lno = list_no(self.s(b).bsz - OVERHEAD);
        let shape = self.sm(b);
        shape.free = true;
        shape.lno = lno as u8;
        let head = self.freelist[lno];
        if head == NIL {
            let blk = self.lm(b);
            blk.prev = b;
            blk.next = b;
            self.freelist[lno] = b;
            self.nonempty |= 1 << lno;
        } else {
            let prev = self.l(head).prev;
            self.lm(prev).next = b;
            self.lm(head).prev = b;
            let blk = self.lm(b);
            blk.next = head;
            blk.prev = prev;
        }
    }

    /// `unlinkBlock`, including its "swizzle" of the list head towards lower addresses.
    fn unlink(&mut self, b: u32, lno: usize) {
        let blk = *self.l(b);
        if blk.prev == b {
            self.freelist[lno] = NIL;
            self.nonempty &= !(1 << lno);
        } else {
            self.freelist[lno] = blk.prev;
            self.lm(blk.prev).next = blk.next;
            self.lm(blk.next).prev = blk.prev;
            self.swizzle(lno);
        }
        let blk = self.lm(b);
        blk.prev = NIL;
        blk.next = NIL;
    }

    /// Valgrind's `swizzle`: the lowest-addressed of the head and its five neighbours on
    /// either side becomes the head.
    fn swizzle(&mut self, lno: usize) {
        let head = self.freelist[lno];
        let mut best = head;
        let mut best_addr = self.l(head).addr;
        let (mut pn, mut pp) = (head, head);
        for _ in 0..5 {
            let n = *self.l(pn);
            let p = *self.l(pp);
            pn = n.next;
            pp = p.prev;
            let (an, ap) = (self.l(pn).addr, self.l(pp).addr);
            if an < best_addr {
                best = pn;
                best_addr = an;
            }
            if ap < best_addr {
                best = pp;
                best_addr = ap;
            }
        }
        self.freelist[lno] = best;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_are_valgrinds() {
        assert_eq!(list_no(0), 0);
        assert_eq!(list_no(16 * 63), 63);
        assert_eq!(list_no(16 * 64), 64);
        assert_eq!(list_no(16 * 66), 64);
        assert_eq!(list_no(16 * 67), 65);
        assert_eq!(list_no(16 * 9889), 110);
        assert_eq!(list_no(16 * 9890), 111);
        assert_eq!(list_no(1 << 40), 111);
    }

    #[test]
    fn fresh_blocks_are_rounded_to_16() {
        let mut a = Arena::default();
        for n in [0, 1, 15, 16, 17, 100, 1000] {
            let p = a.alloc(16, n);
            assert_eq!(a.usable(p), align_req(n), "{n}");
        }
    }

    #[test]
    fn a_free_block_too_small_to_split_is_handed_out_whole() {
        let mut a = Arena::default();
        let p = a.alloc(16, 40); // 48 usable
        let _guard = a.alloc(16, 8); // keeps p from merging with the free rest
        a.free(p);
        // 24 bytes -> 32-byte payload; the remaining 16 bytes cannot form a block.
        let p_addr = a.payload(p);
        let q = a.alloc(16, 24);
        assert_eq!(a.payload(q), p_addr);
        assert_eq!(a.usable(q), 48);
    }

    #[test]
    fn freed_neighbours_merge_and_are_split_again() {
        let mut a = Arena::default();
        let x = a.alloc(16, 100);
        let x_addr = a.payload(x);
        let y = a.alloc(16, 100);
        let _z = a.alloc(16, 100);
        a.free(x);
        a.free(y);
        // x and y merged into one free block of 2 * (112 + 32) bytes.
        let big = a.alloc(16, 200);
        assert_eq!(a.payload(big), x_addr);
        assert_eq!(a.usable(big), 208);
    }

    #[test]
    fn memalign_returns_aligned_payloads_and_frees_cleanly() {
        let mut a = Arena::default();
        let p = a.alloc(4096, 100);
        assert_eq!(a.payload(p) % 4096, 0);
        assert!(a.usable(p) >= 112);
        a.free(p);
        let q = a.alloc(16, 100);
        assert_eq!(a.usable(q), 112);
    }

    #[test]
    fn big_blocks_get_their_own_superblock() {
        let mut a = Arena::default();
        let p = a.alloc(16, 8 << 20);
        assert!(a.usable(p) >= 8 << 20);
        a.free(p);
        assert!(a.mapped.is_empty());
    }
}
