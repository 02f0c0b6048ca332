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
//! A live block the program holds sits in the slot its number names (module `numbers`),
//! with what Massif knows of it ([`Record`]), so a free goes from the number the runtime
//! kept with the block straight to its place here. Free blocks, which have no number, sit
//! in slots of the arena's own; an allocation moves the block it chose into its number's
//! slot, a free moves it back out and empties the number's slot. Which slot holds a block
//! changes nothing in the replay: only addresses and list order do.
//!
//! Deliberately not modelled: Valgrind serialises threads, so a multi-threaded program's
//! allocation order (and hence its usable sizes) can differ from ours anyway.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::numbers::{Numbers, SEG_BITS};
use crate::EcId;

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

/// A block of the replayed arena, as handed to the caller (a slot in the arena's table:
/// the block's number, or one of the arena's own slots for a block without one).
pub(crate) type BlockId = u32;

/// What Massif knows of a live block besides its place (Valgrind's `HP_Chunk`), kept in
/// the block's slot.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    /// The EC of the stack that allocated it.
    pub ec: EcId,
    /// Allocated under an ignored stack, or reallocated from such a block (Valgrind keeps it
    /// ignored wherever it moves).
    pub ignored: bool,
}

impl Record {
    const IGNORED_BIT: u32 = 1 << 31;
    /// EC ids below it are kept as they are (2^31 contexts would not fit in memory);
    /// [`crate::IGNORED`] becomes it.
    const EC_MASK: u32 = !Self::IGNORED_BIT;

    /// In one word: the EC's low 31 bits and `ignored` (an ignored EC is always ignored).
    #[inline]
    fn pack(self) -> u32 {
        debug_assert!(self.ec < Self::EC_MASK || self.ec == crate::IGNORED);
        (self.ec & Self::EC_MASK) | if self.ignored { Self::IGNORED_BIT } else { 0 }
    }

    #[inline]
    fn unpack(w: u32) -> Record {
        let ec = w & Self::EC_MASK;
        Record {
            ec: if ec == Self::EC_MASK {
                crate::IGNORED
            } else {
                ec
            },
            ignored: w & Self::IGNORED_BIT != 0,
        }
    }
}

/// What a slot holds.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Holds {
    /// No block: a number not applied yet or given back, an arena slot kept for reuse.
    Nothing,
    /// A free block, linked in its free list.
    Free,
    /// An allocated block: in its number's slot with its record, or without a number in one
    /// of the arena's (then never freed: Massif cannot name it again).
    Allocated,
}

/// A free block's place in its free list, read and written only by the list operations
/// (sixteen bytes, four to a cache line: an allocated block's, in the slot of its number,
/// is never touched).
///
/// Valgrind keeps a block's size in its header and trailer and finds neighbours by address;
/// here each block knows its neighbours in the superblock ([`Shape`]) and, while free, in its
/// free list (`prev`, `next`), so no operation needs a lookup by address.
#[derive(Copy, Clone, Debug)]
struct Link {
    prev: u32,
    next: u32,
    /// While linked, the block's address ([`Shape::addr`], which changes only while the
    /// block is in no list): the "swizzle" of every unlink compares the addresses of the
    /// head's ten list neighbours, and read from their shapes that was ten lines more to
    /// load, in a table four times the size, after the ten links it walks.
    addr: u64,
}

/// A superblock's index: at most 65,536 live at once, each at least 4 MiB, so 256 GiB of
/// Valgrind's heap or more (past that Massif stops with a message, `new_superblock`), to
/// keep [`Shape`] in 32 bytes.
type SbId = u16;

/// The rest of a block: 32 bytes in a half line of their own, so that applying a free
/// reads the block in one line and applying an allocation writes its number's slot in one.
#[derive(Copy, Clone, Debug)]
#[repr(C, align(32))]
struct Shape {
    bsz: u64,
    /// Simulated address of the block (its payload is 16 bytes further).
    addr: u64,
    /// Its neighbours in its superblock ([`NIL`]: none; no block before: the superblock's
    /// first).
    before: u32,
    after: u32,
    /// While allocated under a number: its record ([`Record::pack`]).
    rec: u32,
    sb: SbId,
    holds: Holds,
    /// While free: the list it is linked in (`list_no` of its payload size), kept so that
    /// unlinking it needs no size-class computation.
    lno: u8,
}

const _: () = assert!(std::mem::size_of::<Shape>() == 32);

const EMPTY_LINK: Link = Link {
    prev: NIL,
    next: NIL,
    addr: 0,
};

const EMPTY_SHAPE: Shape = Shape {
    bsz: 0,
    addr: 0,
    before: NIL,
    after: NIL,
    rec: 0,
    sb: 0,
    holds: Holds::Nothing,
    lno: 0,
};

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
/// link, a shape, a list head or a superblock, and every id handed out, was made a block's
/// slot after [`Arena::own_slot`] or [`Arena::claim`] grew the tables to hold it, and the
/// tables never shrink, so an id other than [`NIL`] is always in bounds. The hot paths rely
/// on that to read without bounds checks ([`Arena::l`]); a number from an event is checked
/// ([`Arena::record`]) before it is used as a block.
pub(crate) struct Arena {
    links: Vec<Link>,
    shapes: Vec<Shape>,
    /// The arena's own slots that hold no block, for reuse.
    spare_blocks: Vec<u32>,
    /// The arena's next own slot never used, and the end of its segment.
    fresh: u32,
    fresh_end: u32,
    /// Where numbers, and the arena's own slots, come from.
    numbers: Arc<Numbers>,
    sbs: Vec<Superblock>,
    spare_sbs: Vec<SbId>,
    freelist: [u32; N_LISTS],
    /// Bit `l` set exactly when `freelist[l]` is not empty, so a search skips the empty
    /// lists in one step (Valgrind visits them one by one; the result is the same).
    nonempty: u128,
    deferred: Option<SbId>,
    min_unsplittable: u64,
    /// Simulated mappings: start → length.
    mapped: BTreeMap<u64, u64>,
}

impl Arena {
    pub(crate) fn new(numbers: Arc<Numbers>) -> Self {
        Arena {
            links: Vec::new(),
            shapes: Vec::new(),
            spare_blocks: Vec::new(),
            // Segment 0 is the arena's (no number is 0).
            fresh: 0,
            fresh_end: 1 << SEG_BITS,
            numbers,
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

    /// Starts loading what freeing block `id` reads first, or allocating into number
    /// `id`'s slot writes: its shape (a hint; an id that is no longer a block only loads
    /// the wrong line, one out of range nothing useful).
    #[inline]
    pub(crate) fn prefetch_block(&self, id: BlockId) {
        // An address only, never read: past the table it names memory that may not be
        // mapped, which a prefetch ignores.
        let shape = self.shapes.as_ptr().wrapping_add(id as usize);
        oxgrind_tool::hint::prefetch_read_at(shape as u64);
    }

    /// [`Arena::prefetch_block`] and the block's link, for a block in a free list.
    #[inline]
    fn prefetch_listed(&self, id: u32) {
        self.prefetch_block(id);
        let link = self.links.as_ptr().wrapping_add(id as usize);
        oxgrind_tool::hint::prefetch_read_at(link as u64);
    }

    /// The record of the block numbered `n`, if its allocation is applied and its free is
    /// not (0, or a number not applied yet or given back: `None`).
    #[inline]
    pub(crate) fn record(&self, n: u32) -> Option<Record> {
        match self.shapes.get(n as usize) {
            Some(s) if n != 0 && s.holds == Holds::Allocated => Some(Record::unpack(s.rec)),
            _ => None,
        }
    }

    /// Whether number `n` names a block whose allocation is applied and free is not.
    #[inline]
    pub(crate) fn is_live(&self, n: u32) -> bool {
        self.record(n).is_some()
    }

    /// Starts loading what a free of block `id` reads next: the shapes and links of its
    /// neighbours in its superblock, which it merges with when they are free. Reads `id`'s
    /// shape, so best after [`Arena::prefetch_block`] had time to load it.
    #[inline]
    pub(crate) fn prefetch_neighbours(&self, id: BlockId) {
        if let Some(s) = self.shapes.get(id as usize) {
            for n in [s.before, s.after] {
                if n != NIL {
                    self.prefetch_listed(n);
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
            self.prefetch_listed(self.freelist[lno + rest.trailing_zeros() as usize]);
        }
    }

    /// Simulated payload address of a block.
    #[cfg(test)]
    fn payload(&self, id: BlockId) -> u64 {
        self.s(id).addr + OVERHEAD_LO
    }

    /// `VG_(cli_malloc)(align, size)` for the block numbered `n`, whose record is `rec`:
    /// returns its slot, `n` (0: a block without a number, which keeps one of the arena's
    /// slots and is never freed).
    pub(crate) fn alloc(&mut self, align: u64, size: u64, n: u32, rec: Record) -> BlockId {
        let b = if align <= MIN_MALLOC {
            self.malloc(size, n)
        } else {
            let b = self.memalign(align, size);
            if n == 0 {
                return b;
            }
            self.claim(n);
            self.move_block(b, n);
            self.spare_blocks.push(b);
            n
        };
        if n != 0 {
            self.sm(n).rec = rec.pack();
        }
        b
    }

    /// `VG_(cli_free)` of the block numbered `n` (allocated: see [`Arena::record`]); its
    /// slot then holds nothing, and the number can name another block.
    ///
    /// Valgrind's `VG_(arena_free)`: the block is linked in its free list, then merged with
    /// a free neighbour after it, then with one before it, each merge unlinking both and
    /// linking the result. The result never stays in the number's slot: it takes the slot
    /// of the free neighbour it merges with (the lists see the same blocks at the same
    /// addresses in the same order), or, when it merges with neither, a slot of the arena's.
    pub(crate) fn free(&mut self, n: BlockId) {
        let sh = *self.s(n);
        debug_assert_eq!(sh.holds, Holds::Allocated);
        if self.sbs[sh.sb as usize].unsplittable {
            self.sm(n).holds = Holds::Nothing;
            self.reclaim(sh.sb);
            return;
        }
        let merges_after = sh.after != NIL && self.s(sh.after).holds == Holds::Free;
        let merges_before = sh.before != NIL && self.s(sh.before).holds == Holds::Free;
        if !merges_after && !merges_before {
            let b = self.own_slot();
            self.move_block(n, b);
            self.sm(n).holds = Holds::Nothing;
            self.mk_free(b);
            if sh.before == NIL && sh.after == NIL {
                self.deferred_reclaim(Some(sh.sb));
            }
            return;
        }
        self.mk_free(n);
        let mut b = n;
        if merges_after {
            b = self.absorb_into_next(n);
            self.sm(n).holds = Holds::Nothing;
        }
        if merges_before {
            let gone = self.absorb_next(sh.before);
            if gone == n {
                self.sm(n).holds = Holds::Nothing;
            } else {
                self.spare_blocks.push(gone);
            }
            b = sh.before;
        }
        let blk = *self.s(b);
        if blk.before == NIL && blk.after == NIL {
            self.deferred_reclaim(Some(blk.sb));
        }
    }

    /// A realloc that keeps the block where it is: the block numbered `old` is numbered
    /// `new` from now on (0: no number, see [`Arena::alloc`]) with record `rec`; returns
    /// its slot.
    pub(crate) fn renumber(&mut self, old: BlockId, new: u32, rec: Record) -> BlockId {
        debug_assert_eq!(self.s(old).holds, Holds::Allocated);
        let to = if new == old {
            old
        } else {
            let to = if new == 0 {
                self.own_slot()
            } else {
                self.claim(new);
                new
            };
            self.move_block(old, to);
            self.sm(old).holds = Holds::Nothing;
            to
        };
        self.sm(to).rec = rec.pack();
        to
    }

    /// A slot of the arena's own for a block (what it holds is overwritten by the caller).
    #[inline]
    fn own_slot(&mut self) -> u32 {
        if let Some(id) = self.spare_blocks.pop() {
            return id;
        }
        self.fresh_own_slot()
    }

    #[cold]
    #[inline(never)]
    fn fresh_own_slot(&mut self) -> u32 {
        if self.fresh == self.fresh_end {
            self.fresh = self.numbers.arena_segment();
            self.fresh_end = self.fresh + (1 << SEG_BITS);
        }
        let id = self.fresh;
        self.fresh += 1;
        if id as usize >= self.links.len() {
            self.grow(id);
        }
        id
    }

    /// Makes number `n`'s slot ready for a block: in the tables, and holding nothing.
    #[inline]
    fn claim(&mut self, n: u32) {
        match self.shapes.get(n as usize) {
            Some(s) if s.holds == Holds::Nothing => {}
            _ => self.make_room(n),
        }
    }

    #[cold]
    #[inline(never)]
    fn make_room(&mut self, n: u32) {
        if n as usize >= self.links.len() {
            self.grow(n);
        }
        if self.s(n).holds != Holds::Nothing {
            // A number applied twice without a free between: a history the runtime never
            // gives. The block already there keeps a slot of the arena's, without a number.
            debug_assert_eq!(self.s(n).holds, Holds::Allocated);
            let spare = self.own_slot();
            self.move_block(n, spare);
            self.sm(n).holds = Holds::Nothing;
        }
    }

    /// Makes the tables hold slot `id`.
    fn grow(&mut self, id: u32) {
        let len = (id as usize + 1).next_power_of_two().max(1 << SEG_BITS);
        self.links.resize(len, EMPTY_LINK);
        self.shapes.resize(len, EMPTY_SHAPE);
    }

    /// Moves the allocated block in slot `from` (in no free list, so its list links are
    /// not read) to slot `to` (in the tables), record and all; tells its neighbours and
    /// its superblock. What `from` holds is the caller's to change.
    #[inline]
    fn move_block(&mut self, from: u32, to: u32) {
        let shape = *self.s(from);
        debug_assert_eq!(shape.holds, Holds::Allocated);
        *self.sm(to) = shape;
        if shape.before == NIL {
            self.sbs[shape.sb as usize].first = to;
        } else {
            self.sm(shape.before).after = to;
        }
        if shape.after != NIL {
            self.sm(shape.after).before = to;
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

    /// A slot of the arena's own for a new block.
    fn new_block(&mut self, shape: Shape) -> u32 {
        let id = self.own_slot();
        *self.lm(id) = EMPTY_LINK;
        *self.sm(id) = shape;
        id
    }

    /// `VG_(arena_malloc)`, for the block numbered `n` (0: none; the block then keeps a
    /// slot of the arena's). The record in `n`'s slot is the caller's to write.
    fn malloc(&mut self, req: u64, n: u32) -> BlockId {
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
        self.sm(b).holds = Holds::Allocated;
        let split = frag >= MIN_USEFUL && !new_sb_unsplittable;
        if n == 0 {
            if split {
                self.sm(b).bsz = req_b;
                let rest = self.split_after(b, frag);
                self.mk_free(rest);
            }
            return b;
        }
        self.claim(n);
        if split {
            // The block handed out goes to `n`'s slot, the rest stays in `b`'s (as
            // `split_after` would have carved it, without a slot of its own to find).
            let sh = *self.s(b);
            *self.sm(n) = Shape {
                bsz: req_b,
                after: b,
                ..sh
            };
            if sh.before == NIL {
                self.sbs[sh.sb as usize].first = n;
            } else {
                self.sm(sh.before).after = n;
            }
            let rest = self.sm(b);
            rest.addr = sh.addr + req_b;
            rest.bsz = frag;
            rest.before = n;
            self.mk_free(b);
        } else {
            self.move_block(b, n);
            self.spare_blocks.push(b);
        }
        n
    }

    /// Carves a new block of `bsz` bytes off the end of `b` (whose size the caller has
    /// already reduced by as much); returns it, not on any free list.
    fn split_after(&mut self, b: u32, bsz: u64) -> u32 {
        let shape = *self.s(b);
        let id = self.new_block(Shape {
            bsz,
            addr: shape.addr + shape.bsz,
            before: b,
            holds: Holds::Allocated,
            ..shape
        });
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
        let base = self.malloc(base_req, 0);
        self.min_unsplittable = saved;
        let base_b = self.s(base).addr;
        let align_p = (base_b + 2 * OVERHEAD_LO + OVERHEAD_HI).next_multiple_of(align);
        let frag = align_p - OVERHEAD_LO - base_b;
        let rest = self.s(base).bsz - frag;
        self.sm(base).bsz = frag;
        let aligned = self.split_after(base, rest);
        self.mk_free(base);
        aligned
    }

    /// `VG_(arena_free)` as Valgrind writes it, of a block in a slot of the arena's own, in
    /// a superblock that can be split: what [`Arena::free`] must do, slots aside (the tests
    /// replay histories both ways).
    #[cfg(test)]
    fn arena_free(&mut self, id: u32) {
        self.mk_free(id);
        self.merge_with_free_neighbours(id);
    }

    #[cfg(test)]
    fn merge_with_free_neighbours(&mut self, mut b: u32) {
        let after = self.s(b).after;
        if after != NIL && self.s(after).holds == Holds::Free {
            let gone = self.absorb_next(b);
            self.spare_blocks.push(gone);
        }
        let before = self.s(b).before;
        if before != NIL && self.s(before).holds == Holds::Free {
            let gone = self.absorb_next(before);
            self.spare_blocks.push(gone);
            b = before;
        }
        let blk = *self.s(b);
        if blk.before == NIL && blk.after == NIL {
            self.deferred_reclaim(Some(blk.sb));
        }
    }

    /// Merges the free block after free block `b` into it (both leave their lists; the
    /// result is linked as a new free block). Returns the slot the block after held, which
    /// the caller gives back.
    fn absorb_next(&mut self, b: u32) -> u32 {
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
        self.mk_free(b);
        other
    }

    /// [`Arena::absorb_next`] of free block `b` with the result in the slot of the block
    /// after it (the same lists, the same block: only its slot differs), which it returns;
    /// `b`'s slot is the caller's to give back.
    fn absorb_into_next(&mut self, b: u32) -> u32 {
        let other = self.s(b).after;
        self.unlink(b, self.s(b).lno as usize);
        self.unlink(other, self.s(other).lno as usize);
        let blk = *self.s(b);
        let o = self.sm(other);
        o.addr = blk.addr;
        o.bsz += blk.bsz;
        o.before = blk.before;
        if blk.before == NIL {
            self.sbs[blk.sb as usize].first = other;
        } else {
            self.sm(blk.before).after = other;
        }
        self.mk_free(other);
        other
    }

    /// A fully free superblock is unmapped only when another one becomes fully free or a
    /// new one is needed (Valgrind's deferred reclaim).
    fn deferred_reclaim(&mut self, sb: Option<SbId>) {
        if sb.is_none() && self.deferred.is_none() {
            return;
        }
        if let Some(def) = self.deferred.filter(|&d| Some(d) != sb) {
            // Still fully free: its first block is free and is its only block.
            let first = self.first_block(def);
            let blk = *self.s(first);
            if blk.holds == Holds::Free && blk.after == NIL {
                self.unlink(first, blk.lno as usize);
                self.spare_blocks.push(first);
                self.reclaim(def);
                self.deferred = None;
            }
        }
        self.deferred = sb;
    }

    fn first_block(&self, sb: SbId) -> u32 {
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
                let sb = SbId::try_from(self.sbs.len())
                    .expect("massif: more superblocks live at once than Valgrind could map");
                self.sbs.push(s);
                sb
            }
        };
        let b = self.new_block(Shape {
            bsz: s.n_payload,
            addr: s.start,
            sb,
            holds: Holds::Allocated,
            ..EMPTY_SHAPE
        });
        self.sbs[sb as usize].first = b;
        self.mk_free(b);
        (b, unsplittable)
    }

    fn reclaim(&mut self, sb: SbId) {
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
        shape.holds = Holds::Free;
        shape.lno = lno as u8;
        let addr = shape.addr;
        let head = self.freelist[lno];
        if head == NIL {
            *self.lm(b) = Link {
                prev: b,
                next: b,
                addr,
            };
            self.freelist[lno] = b;
            self.nonempty |= 1 << lno;
        } else {
            let prev = self.l(head).prev;
            self.lm(prev).next = b;
            self.lm(head).prev = b;
            *self.lm(b) = Link {
                prev,
                next: head,
                addr,
            };
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
            debug_assert_eq!(an, self.s(pn).addr);
            debug_assert_eq!(ap, self.s(pp).addr);
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

    /// An arena and numbers for its blocks, as the program's allocations would have them.
    struct Numbered {
        a: Arena,
        next: u32,
    }

    const REC: Record = Record {
        ec: 7,
        ignored: false,
    };

    impl Numbered {
        fn new() -> Self {
            let numbers = Arc::new(Numbers::new());
            // A segment of its own stands for a space's numbers.
            let next = numbers.arena_segment();
            Numbered {
                a: Arena::new(numbers),
                next,
            }
        }

        fn alloc(&mut self, align: u64, size: u64) -> BlockId {
            self.next += 1;
            let b = self.a.alloc(align, size, self.next, REC);
            assert_eq!(b, self.next, "the block is in its number's slot");
            b
        }
    }

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
        let mut a = Numbered::new();
        for n in [0, 1, 15, 16, 17, 100, 1000] {
            let p = a.alloc(16, n);
            assert_eq!(a.a.usable(p), align_req(n), "{n}");
        }
    }

    #[test]
    fn a_free_block_too_small_to_split_is_handed_out_whole() {
        let mut a = Numbered::new();
        let p = a.alloc(16, 40); // 48 usable
        let _guard = a.alloc(16, 8); // keeps p from merging with the free rest
        let p_addr = a.a.payload(p);
        a.a.free(p);
        // 24 bytes -> 32-byte payload; the remaining 16 bytes cannot form a block.
        let q = a.alloc(16, 24);
        assert_eq!(a.a.payload(q), p_addr);
        assert_eq!(a.a.usable(q), 48);
    }

    #[test]
    fn freed_neighbours_merge_and_are_split_again() {
        let mut a = Numbered::new();
        let x = a.alloc(16, 100);
        let x_addr = a.a.payload(x);
        let y = a.alloc(16, 100);
        let _z = a.alloc(16, 100);
        a.a.free(x);
        a.a.free(y);
        // x and y merged into one free block of 2 * (112 + 32) bytes.
        let big = a.alloc(16, 200);
        assert_eq!(a.a.payload(big), x_addr);
        assert_eq!(a.a.usable(big), 208);
    }

    #[test]
    fn memalign_returns_aligned_payloads_and_frees_cleanly() {
        let mut a = Numbered::new();
        let p = a.alloc(4096, 100);
        assert_eq!(a.a.payload(p) % 4096, 0);
        assert!(a.a.usable(p) >= 112);
        a.a.free(p);
        let q = a.alloc(16, 100);
        assert_eq!(a.a.usable(q), 112);
    }

    #[test]
    fn big_blocks_get_their_own_superblock() {
        let mut a = Numbered::new();
        let p = a.alloc(16, 8 << 20);
        assert!(a.a.usable(p) >= 8 << 20);
        a.a.free(p);
        assert!(a.a.mapped.is_empty());
        assert_eq!(a.a.record(p), None);
    }

    #[test]
    fn a_numbers_slot_holds_its_record_until_the_free() {
        let mut a = Numbered::new();
        let p = a.alloc(16, 10);
        assert_eq!(a.a.record(p), Some(REC));
        assert!(!a.a.is_live(p + 1), "not applied yet");
        assert!(!a.a.is_live(u32::MAX - 1), "out of the tables");
        assert!(!a.a.is_live(0));
        let other = Record {
            ec: 9,
            ignored: true,
        };
        let q = a.a.renumber(p, p + 100, other);
        assert_eq!(q, p + 100);
        assert_eq!(a.a.record(p), None);
        assert_eq!(a.a.record(q), Some(other));
        a.a.free(q);
        assert_eq!(a.a.record(q), None);
    }

    /// Which slot holds a block changes nothing: a random history of allocations, frees and
    /// in-place reallocs gives the same usable sizes and addresses as the same history where
    /// blocks keep the arena's slots (numbered 0, freed through `arena_free`).
    #[test]
    fn numbered_slots_replay_what_unnumbered_ones_do() {
        let mut a = Numbered::new();
        let mut plain = Arena::new(Arc::new(Numbers::new()));
        let mut live: Vec<(BlockId, u32)> = Vec::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let r = seed;
            if live.len() < 300 && (r % 3 != 0 || live.is_empty()) {
                let size = match r % 50 {
                    0 => 5 << 20,
                    1..=5 => (r >> 8) % 20_000,
                    _ => (r >> 8) % 300,
                };
                let align = if r % 97 == 0 { 256 } else { 16 };
                let n = a.alloc(align, size);
                let m = plain.alloc(align, size, 0, REC);
                assert_eq!(a.a.payload(n), plain.payload(m), "step {i}");
                assert_eq!(a.a.usable(n), plain.usable(m), "step {i}");
                live.push((n, m));
            } else {
                let (n, m) = live.swap_remove((r >> 8) as usize % live.len());
                if r % 5 == 0 {
                    a.next += 1;
                    let n2 = a.a.renumber(n, a.next, REC);
                    assert_eq!(a.a.usable(n2), plain.usable(m));
                    live.push((n2, m));
                    continue;
                }
                a.a.free(n);
                let sb = plain.s(m).sb;
                if plain.sbs[sb as usize].unsplittable {
                    *plain.sm(m) = EMPTY_SHAPE;
                    plain.spare_blocks.push(m);
                    plain.reclaim(sb);
                } else {
                    plain.arena_free(m);
                }
            }
        }
    }
}
