//! Per-thread logs of heap events, so that no allocation takes a lock or runs a locked
//! instruction.
//!
//! Massif's state is one serial history: Valgrind's allocator replayed (module `arena`), the
//! heap totals, the clock of `--time-unit=B` (bytes allocated and freed so far) and the
//! snapshots taken along it. Valgrind builds it from one thread at a time, since it runs one
//! thread at a time. Here threads run in parallel, so each event is first appended to a log
//! of the thread's own, and the logs are applied to the state in batches, under the state
//! lock, by whichever thread's log holds [`FLUSH`] slots while the lock is free (or by
//! `fini`, or by an event that must see the state up to date).
//!
//! A log has one writer, the thread that owns it, and one reader, whoever holds the state
//! lock: a single-producer queue. The owner writes an event into its current chunk (one
//! 32-byte [`Slot`], a realloc two) and publishes it by one release store of its count of
//! slots (a plain store on x86); the reader reads the count with an acquire load and the
//! events below it in place. When a chunk is full the owner links a fresh one (the reader's
//! last used chunk, handed back, or a new one), so a log never makes its owner wait: a log
//! whose thread cannot get the state lock grows, and the next thread to find the lock free
//! applies everything. Only a log holding [`LIMIT`] slots unapplied (its thread ran on while
//! the lock holder was preempted for long) makes its owner wait for the lock, asleep in the
//! kernel until the holder is done (`sync::Released`).
//!
//! A log is owned by a thread id: thread `t` takes the free log at `t % SLOTS`, or the next
//! free one, with one compare-and-swap when it first logs an event, and then finds it at
//! every event with one plain load. Thread ids are unique among live threads, so no two live
//! threads write one log; a new thread given a dead thread's id continues its log. A thread
//! that finds no free log (more than [`SLOTS`] threads have logged events) applies its
//! events one at a time under the state lock.
//!
//! The order of application is a serialisation of the threads' histories, as Valgrind's
//! scheduler makes one:
//!
//! * each thread's events keep their order (one log holds them in the order they were
//!   appended);
//! * events of different threads on one block keep theirs: a free or realloc is applied only
//!   once the block's allocation is (the slot its number names in the replayed arena says
//!   so, module `numbers`). The allocation's event was published before the allocating call
//!   returned, so before any thread could free the block: when no log's next event can be
//!   applied, the counts are read again;
//! * an allocation never waits: blocks are told apart by their numbers, not by address, so
//!   one that reuses the address of a block another thread freed may be applied before that
//!   free (both are then live at that point of the serialisation, as if the free came a
//!   little later);
//! * otherwise events of different threads interleave by batch, as threads under Valgrind
//!   interleave by time slice.
//!
//! So the snapshots are consistent: each is the state after a prefix of that serialisation,
//! every block in it allocated and not yet freed in it, its totals the sums of its blocks.
//! Times never go backwards (`Massif::now` keeps them monotonic: an event's reading of the
//! `ms` or `i` clock is taken when it happens, before it waits in a log). A single-threaded
//! program's events are applied in their own order, so its output is the one a lock per event
//! gave, Valgrind's.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, Ordering};

use oxgrind_tool::{Alloc, Free, StackId};

use crate::Clock;

/// Logs: threads are spread over them by thread id.
pub(crate) const SLOTS: usize = 64;
/// Slots (module [`Slot`]: an event each, a realloc two) a log holds before its thread
/// applies the logs, if the state lock is free. Large batches keep the state (the replayed
/// arena, the block table) in one core's cache for longer: each hand-over of the lock moves
/// them to the other core. 4096 rather than 128 cut Massif's CPU time on `churn` and
/// `threads` by about 8% (paired runs).
pub(crate) const FLUSH: u64 = 4096;
/// Slots a log holds unapplied at most: its thread then waits for the state lock. A slot is
/// 32 bytes, so 512 KiB per thread at worst.
pub(crate) const LIMIT: u64 = 16384;
/// Slots per chunk of a log (16 KiB).
const CHUNK: usize = 512;
/// How far ahead of the slot being written its owner asks for the log's line for writing
/// (`Logs::push`): 8 slots of 32 bytes, four lines, several events of the program's ahead.
const AHEAD_WRITE: usize = 8;
/// Chunks a log keeps for reuse: as many as it can hold ([`LIMIT`] slots) and some slack,
/// so that its thread allocates chunks only while its log grows past its largest size so far.
const SPARES: usize = LIMIT as usize / CHUNK + 8;

/// A log's owner when none: free for the taking.
const NO_OWNER: i32 = 0;
/// A log's owner in a forked child when it belonged to a thread of the parent: its events
/// are still applied, but nobody writes to it again.
const RETIRED: i32 = -1;

/// The block an allocation or realloc gives the program, as Massif needs it.
#[derive(Copy, Clone, Debug)]
pub(crate) struct NewBlock {
    /// Its number (module `numbers`; 0: none).
    pub word: u32,
    pub size: u64,
    /// The alignment Valgrind's allocator is asked for (`Massif::alignment_of`).
    pub align: u64,
    pub stack: StackId,
}

/// The block a free or realloc gives back, as Massif needs it.
#[derive(Copy, Clone, Debug)]
pub(crate) struct OldBlock {
    /// Its number (module `numbers`; 0: a block Massif never numbered).
    pub word: u32,
    pub size: u64,
    /// The runtime's slop, for a block Massif never saw allocated.
    pub slop: u64,
    /// The stack of the call that allocated it.
    pub stack: StackId,
}

/// What an [`Event`] is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Alloc,
    Free,
    Realloc,
}

/// A heap event as applying it sees it: its slots, in place in the log ([`Logs::front`]),
/// read where used (copied out, the event was moved through the stack twice).
#[derive(Copy, Clone, Debug)]
pub(crate) struct Event<'a> {
    head: &'a Slot,
    /// A [`SlotKind::Old`] after a [`SlotKind::FreeWide`] or [`SlotKind::Realloc`] head;
    /// otherwise [`Slot::PAD`], not read.
    tail: &'a Slot,
}

impl<'a> Event<'a> {
    #[inline]
    pub(crate) fn kind(&self) -> Kind {
        match self.head.kind {
            SlotKind::Alloc => Kind::Alloc,
            SlotKind::Realloc => Kind::Realloc,
            _ => Kind::Free,
        }
    }

    #[inline]
    pub(crate) fn clock(&self) -> Clock {
        (self.head.clock != Slot::NO_CLOCK).then_some(self.head.clock)
    }

    /// The block allocated (an allocation or realloc).
    #[inline]
    pub(crate) fn new_block(&self) -> NewBlock {
        let h = self.head;
        NewBlock {
            word: h.word,
            size: h.size,
            align: 1 << h.align_log2,
            stack: StackId(h.stack),
        }
    }

    /// The block given back (a free or realloc).
    #[inline]
    pub(crate) fn old_block(&self) -> OldBlock {
        let h = self.head;
        if h.kind == SlotKind::Free {
            return OldBlock {
                word: h.word,
                size: h.size,
                slop: h.slop as u64,
                stack: StackId(h.stack),
            };
        }
        let o = self.tail;
        debug_assert_eq!(o.kind, SlotKind::Old);
        OldBlock {
            word: o.word,
            size: o.size,
            slop: o.clock as u64,
            stack: StackId(o.stack),
        }
    }

    /// The number of the block whose allocation must be applied first (0: none).
    #[inline]
    pub(crate) fn needs_live(&self) -> u32 {
        match self.head.kind {
            SlotKind::Alloc => 0,
            SlotKind::Free => self.head.word,
            _ => self.tail.word,
        }
    }

    /// An event applied at once, without a log (a thread that has none).
    pub(crate) fn unlogged(slots: &'a [Slot]) -> Event<'a> {
        Slot::decode(&slots[0], || &slots[1]).0
    }
}

/// What a [`Slot`] holds.
/// In this order: the look ahead and decoding compare with [`SlotKind::Alloc`] and
/// [`SlotKind::FreeWide`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
enum SlotKind {
    /// A free: the old block, its slop in `slop`.
    Free,
    /// The block a [`SlotKind::FreeWide`] or [`SlotKind::Realloc`] gives back, its slop in
    /// `clock`.
    Old,
    /// An allocation: the new block.
    Alloc,
    /// A free whose slop does not fit in `slop`: the clock only (no number); an
    /// [`SlotKind::Old`] slot follows.
    FreeWide,
    /// A realloc: the new block; an [`SlotKind::Old`] slot follows.
    Realloc,
    /// Nothing (no number): the last slot of a chunk a two-slot event did not fit in.
    Pad,
}

/// One 32-byte slot of a log. An allocation or a free is one slot, a realloc two (the new
/// block, then the old one): half a cache line where an event was one line, so the
/// allocating thread writes, and the thread applying the logs reads (often on the other
/// core), half as many lines, and a batch of [`FLUSH`] slots is 128 KiB where it was
/// 256 KiB. Only what applying reads is kept: the alignment asked of Valgrind's allocator
/// as a power of two, a free's slop in 32 bits (a wider one takes a second slot).
#[derive(Copy, Clone, Debug)]
#[repr(C, align(32))]
pub(crate) struct Slot {
    /// The clock reading ([`Slot::NO_CLOCK`]: none); an [`SlotKind::Old`] slot's slop.
    clock: i64,
    size: u64,
    word: u32,
    stack: u32,
    /// A [`SlotKind::Free`]'s slop.
    slop: u32,
    kind: SlotKind,
    /// `log2` of [`NewBlock::align`].
    align_log2: u8,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 32);

impl Slot {
    const NO_CLOCK: i64 = i64::MIN;
    const PAD: Slot = Slot {
        clock: 0,
        size: 0,
        word: 0,
        stack: 0,
        slop: 0,
        kind: SlotKind::Pad,
        align_log2: 0,
    };

    #[inline(always)]
    fn new_block(kind: SlotKind, new: &Alloc, word: u32, align: u64, clock: Clock) -> Slot {
        debug_assert!(align.is_power_of_two());
        Slot {
            clock: clock.unwrap_or(Self::NO_CLOCK),
            size: new.size,
            word,
            stack: new.stack.0,
            slop: 0,
            kind,
            align_log2: align.trailing_zeros() as u8,
        }
    }

    #[inline(always)]
    fn old_block(old: &Free) -> Slot {
        Slot {
            clock: old.slop as i64,
            size: old.size,
            word: old.tool_word,
            stack: old.alloc_stack.0,
            slop: 0,
            kind: SlotKind::Old,
            align_log2: 0,
        }
    }

    /// How many slots an allocation takes.
    pub(crate) const ALLOC_SLOTS: usize = 1;
    /// How many slots a realloc takes.
    pub(crate) const REALLOC_SLOTS: usize = 2;

    /// How many slots a free of `old` takes.
    #[inline(always)]
    pub(crate) fn free_slots(old: &Free) -> usize {
        if old.slop <= u32::MAX as u64 {
            1
        } else {
            2
        }
    }

    /// An allocation of the block numbered `word`; `align`: the alignment (a power of two)
    /// Valgrind's allocator is asked for. Writes [`Slot::ALLOC_SLOTS`] slots.
    #[inline(always)]
    pub(crate) fn alloc(
        to: &mut [MaybeUninit<Slot>],
        new: &Alloc,
        word: u32,
        align: u64,
        clock: Clock,
    ) {
        to[0].write(Slot::new_block(SlotKind::Alloc, new, word, align, clock));
    }

    /// A free: writes [`Slot::free_slots`] slots.
    #[inline(always)]
    pub(crate) fn free(to: &mut [MaybeUninit<Slot>], old: &Free, clock: Clock) {
        let clock = clock.unwrap_or(Self::NO_CLOCK);
        match u32::try_from(old.slop) {
            Ok(slop) => {
                to[0].write(Slot {
                    clock,
                    size: old.size,
                    word: old.tool_word,
                    stack: old.alloc_stack.0,
                    slop,
                    kind: SlotKind::Free,
                    align_log2: 0,
                });
            }
            Err(_) => {
                to[0].write(Slot {
                    clock,
                    kind: SlotKind::FreeWide,
                    ..Slot::PAD
                });
                to[1].write(Slot::old_block(old));
            }
        }
    }

    /// A realloc, the new block numbered `word` (`align`: as for [`Slot::alloc`]): writes
    /// [`Slot::REALLOC_SLOTS`] slots.
    #[inline(always)]
    pub(crate) fn realloc(
        to: &mut [MaybeUninit<Slot>],
        old: &Free,
        new: &Alloc,
        word: u32,
        align: u64,
        clock: Clock,
    ) {
        to[0].write(Slot::new_block(SlotKind::Realloc, new, word, align, clock));
        to[1].write(Slot::old_block(old));
    }

    /// The event whose first slot is `h` (`second`: its second slot, read only when it has
    /// one), and how many slots it took (a [`SlotKind::Pad`] is not expected:
    /// [`Logs::front`] steps over those).
    #[inline(always)]
    fn decode<'a>(h: &'a Slot, second: impl FnOnce() -> &'a Slot) -> (Event<'a>, usize) {
        debug_assert!(h.kind != SlotKind::Old && h.kind != SlotKind::Pad);
        if h.kind >= SlotKind::FreeWide {
            return (
                Event {
                    head: h,
                    tail: second(),
                },
                2,
            );
        }
        (
            Event {
                head: h,
                tail: &Slot::PAD,
            },
            1,
        )
    }

    /// For a look ahead (`Massif::prefetch_ahead`), at any slot: the number of the block
    /// it names (allocated or given back; 0: none). A realloc's two slots each name their
    /// own block.
    #[inline(always)]
    pub(crate) fn hint_word(&self) -> u32 {
        self.word
    }

    /// For a look ahead: whether the slot gives back the block [`Slot::hint_word`] names
    /// (else, when it names one, it allocates it, of [`Slot::hint_size`] bytes).
    #[inline(always)]
    pub(crate) fn hint_gives_back(&self) -> bool {
        self.kind < SlotKind::Alloc
    }

    #[inline(always)]
    pub(crate) fn hint_size(&self) -> u64 {
        self.size
    }
}

/// A piece of a log: events in the order they were appended, then the next piece.
struct Chunk {
    slots: [MaybeUninit<Slot>; CHUNK],
    /// Set by the owner (release) before it publishes the first event stored there.
    next: AtomicPtr<Chunk>,
}

impl Chunk {
    const LAYOUT: Layout = Layout::new::<Chunk>();

    /// A chunk with no events and no successor, from the tool's own allocator.
    fn new() -> *mut Chunk {
        // SAFETY: the layout has a non-zero size.
        let c = unsafe { alloc(Self::LAYOUT) } as *mut Chunk;
        if c.is_null() {
            handle_alloc_error(Self::LAYOUT);
        }
        // SAFETY: `c` is a fresh allocation for a `Chunk`; the slots may stay uninitialised
        // (`MaybeUninit`), `next` is initialised here before any read.
        unsafe { std::ptr::addr_of_mut!((*c).next).write(AtomicPtr::new(null_mut())) };
        c
    }

    /// # Safety
    /// `c` came from [`Chunk::new`] and nothing refers to it any more.
    unsafe fn delete(c: *mut Chunk) {
        // SAFETY: forwarded to the caller; slots need no drop (`Slot` is `Copy`).
        unsafe { dealloc(c as *mut u8, Self::LAYOUT) }
    }
}

/// What only a log's owner touches.
struct Writer {
    /// The chunk being filled (null until the log is first taken).
    chunk: *mut Chunk,
    /// Slots of `chunk` written.
    used: usize,
    /// Slots written so far (the published count, as the owner knows it).
    count: u64,
    /// The applied count as last read: the owner rereads it only when the difference
    /// says its log may be due.
    applied_seen: u64,
}

/// Written by the log's owner at every event.
#[repr(align(64))]
struct OwnerLine {
    /// The thread that writes this log ([`NO_OWNER`], [`RETIRED`], or a thread id).
    owner: AtomicI32,
    /// Slots published (release store by the owner).
    published: AtomicU64,
    /// The log's first chunk, where the reader starts (set before the first publication).
    first: AtomicPtr<Chunk>,
    writer: UnsafeCell<Writer>,
}

/// Written by the reader, once per batch or chunk.
#[repr(align(64))]
struct ReaderLine {
    /// Slots applied (release store by the state lock's holder).
    applied: AtomicU64,
    /// Chunks the reader is done with, handed back for the owner's next ones (null: none).
    /// A chunk goes back to the thread that allocated it rather than to the allocator from
    /// the reading thread: the runtime's private heap keeps a free list per thread, so
    /// chunks freed by the reader were never reused by the owner, and on four threads
    /// Massif's peak RSS went from 20 to 80 MiB.
    spares: [AtomicPtr<Chunk>; SPARES],
}

impl ReaderLine {
    /// A chunk handed back, for the log's owner (one atomic swap per chunk of 512 slots).
    fn take_spare(&self) -> Option<*mut Chunk> {
        self.spares
            .iter()
            .filter(|s| !s.load(Ordering::Relaxed).is_null())
            .map(|s| s.swap(null_mut(), Ordering::Acquire))
            .find(|c| !c.is_null())
    }

    /// Hands `c` back to the log's owner; `false` when every place is taken (the caller
    /// frees it).
    fn give_spare(&self, c: *mut Chunk) -> bool {
        self.spares.iter().any(|s| {
            s.load(Ordering::Relaxed).is_null()
                && s.compare_exchange(null_mut(), c, Ordering::Release, Ordering::Relaxed)
                    .is_ok()
        })
    }
}

/// One log: the owner's and the reader's fields in cache lines of their own.
struct Log {
    own: OwnerLine,
    read: ReaderLine,
}

pub(crate) struct Logs {
    logs: [Log; SLOTS],
    /// Bit `i` set: log `i` was ever taken, so applying the logs visits only those.
    taken: AtomicU64,
}

// SAFETY: a `Writer` is touched only by the thread owning its slot (see `Logs::push`); the
// rest is atomics. Chunks are handed between threads with release/acquire pairs.
unsafe impl Sync for Logs {}
// SAFETY: as above; the raw pointers are to chunks owned by the logs.
unsafe impl Send for Logs {}

/// Where the reader is in one log (kept under the state lock).
#[derive(Copy, Clone)]
pub(crate) struct Cursor {
    /// The chunk holding the next event to apply (null before the first).
    chunk: *mut Chunk,
    /// Slots of `chunk` already applied.
    used: usize,
    /// Slots of the log applied.
    applied: u64,
    /// Slots of the event [`Logs::front`] last returned.
    span: usize,
}

impl Default for Cursor {
    fn default() -> Self {
        Cursor {
            chunk: null_mut(),
            used: 0,
            applied: 0,
            span: 0,
        }
    }
}

// SAFETY: a cursor is only used by the holder of the state lock it lives under.
unsafe impl Send for Cursor {}

impl Cursor {
    /// Slots of the event [`Logs::front`] last returned for this cursor.
    #[inline]
    pub(crate) fn span(&self) -> usize {
        self.span
    }
}

impl Logs {
    pub(crate) const fn new() -> Self {
        Logs {
            logs: [const {
                Log {
                    own: OwnerLine {
                        owner: AtomicI32::new(NO_OWNER),
                        published: AtomicU64::new(0),
                        first: AtomicPtr::new(null_mut()),
                        writer: UnsafeCell::new(Writer {
                            chunk: null_mut(),
                            used: 0,
                            count: 0,
                            applied_seen: 0,
                        }),
                    },
                    read: ReaderLine {
                        applied: AtomicU64::new(0),
                        spares: [const { AtomicPtr::new(null_mut()) }; SPARES],
                    },
                }
            }; SLOTS],
            taken: AtomicU64::new(0),
        }
    }

    /// The log of thread `tid`, taking a free one on its first event; `None` when every log
    /// is taken.
    #[inline]
    pub(crate) fn log_of(&self, tid: i32) -> Option<usize> {
        let home = tid as u32 as usize % SLOTS;
        if tid > 0 && self.logs[home].own.owner.load(Ordering::Relaxed) == tid {
            return Some(home);
        }
        self.take_log(tid, home)
    }

    #[cold]
    fn take_log(&self, tid: i32, home: usize) -> Option<usize> {
        if tid <= 0 {
            return None;
        }
        for k in 0..SLOTS {
            let i = (home + k) % SLOTS;
            let own = &self.logs[i].own;
            if own.owner.load(Ordering::Relaxed) == tid {
                return Some(i);
            }
            if own.owner.load(Ordering::Relaxed) == NO_OWNER
                && own
                    .owner
                    .compare_exchange(NO_OWNER, tid, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                // SAFETY: this thread now owns the log; nobody else touches its writer.
                let w = unsafe { &mut *own.writer.get() };
                if w.chunk.is_null() {
                    w.chunk = Chunk::new();
                    w.used = 0;
                    own.first.store(w.chunk, Ordering::Release);
                }
                self.taken.fetch_or(1 << i, Ordering::Release);
                return Some(i);
            }
        }
        None
    }

    /// Appends an event of `n` slots ([`Slot::ALLOC_SLOTS`], [`Slot::free_slots`],
    /// [`Slot::REALLOC_SLOTS`]) to the log of thread `tid` (the calling thread, never inside
    /// another call of this on the same thread: the runtime does not re-enter a tool's
    /// handler on a thread). Returns how many slots that log may hold unapplied (at least
    /// the true number when that is [`FLUSH`] or more) and what `make` returned, or `None`
    /// when the thread has no log. `make` is also given the log's index, which names the
    /// thread's space of numbers (module `numbers`), so that an allocation finds its log
    /// once for both.
    ///
    /// The event is written by `make` straight into the log's `n` slots: built on the stack
    /// with stores of its fields and then copied in 16-byte loads, each load waited for the
    /// stores it spans (a store-forwarding stall: about 3% of Massif's time on `alloc`). An
    /// event's slots lie in one chunk: a two-slot event that does not fit in what is left
    /// of one leaves a [`SlotKind::Pad`] there, published with it.
    #[inline(always)]
    pub(crate) fn push<T>(
        &self,
        tid: i32,
        n: usize,
        make: impl Fn(&mut [MaybeUninit<Slot>], usize) -> T,
    ) -> Option<(u64, T)> {
        debug_assert!((1..=2).contains(&n));
        let i = self.log_of(tid)?;
        let slot = &self.logs[i];
        // SAFETY: the log is owned by `tid`, the calling thread: thread ids are unique among
        // live threads, and the thread is not inside another `push` (above). So this is the
        // only reference to the writer.
        let w = unsafe { &mut *slot.own.writer.get() };
        if w.used + n > CHUNK {
            Self::next_chunk(slot, w);
        }
        // SAFETY: `w.chunk` is this log's current chunk and `used + n <= CHUNK`; those `n`
        // slots are not yet published, so the reader does not read them, and the reference
        // made covers them only (the reader may be reading the slots before).
        let to = unsafe {
            let first = std::ptr::addr_of_mut!((*w.chunk).slots) as *mut MaybeUninit<Slot>;
            std::slice::from_raw_parts_mut(first.add(w.used), n)
        };
        // The line a few events ahead, asked for now for writing: the chunk was handed back
        // by the reader (`ReaderLine::spares`), so its lines sit in the cache of the core
        // that applied the logs, and each event's stores into a new line waited for it to
        // be taken from there (about 2% of `threads`' CPU time on two cores). An address
        // only (past the chunk's end it names memory the prefetch ignores).
        oxgrind_tool::hint::prefetch_write_at(to.as_ptr().wrapping_add(AHEAD_WRITE) as u64);
        let made = make(to, i);
        w.used += n;
        w.count += n as u64;
        slot.own.published.store(w.count, Ordering::Release);
        let mut k = w.count - w.applied_seen;
        if k >= FLUSH {
            w.applied_seen = slot.read.applied.load(Ordering::Acquire);
            k = w.count - w.applied_seen;
        }
        Some((k, made))
    }

    /// The current chunk of `slot`'s writer `w` has no room for the next event: what is
    /// left of it padded, a fresh chunk (a spare when the reader handed one back) linked.
    #[cold]
    #[inline(never)]
    fn next_chunk(slot: &Log, w: &mut Writer) {
        while w.used < CHUNK {
            // SAFETY: as in `push`: the current chunk's unpublished slot, the writer's alone;
            // published with the event that follows (the reader never sees a pad last).
            unsafe { (*w.chunk).slots[w.used].write(Slot::PAD) };
            w.used += 1;
            w.count += 1;
        }
        let next = match slot.read.take_spare() {
            None => Chunk::new(),
            Some(c) => {
                // SAFETY: the reader handed it back and never looks at it again.
                unsafe { (*c).next.store(null_mut(), Ordering::Relaxed) };
                c
            }
        };
        // SAFETY: `w.chunk` is the log's last chunk, alive while the reader has not gone
        // past it (it cannot: its `next` is set only now).
        unsafe { (*w.chunk).next.store(next, Ordering::Release) };
        w.chunk = next;
        w.used = 0;
    }

    /// Logs ever taken (bit `i`: log `i`).
    #[inline]
    pub(crate) fn taken(&self) -> u64 {
        self.taken.load(Ordering::Acquire)
    }

    /// Slots published in log `i` and not yet applied past `cur`.
    #[inline]
    pub(crate) fn available(&self, i: usize, cur: &Cursor) -> u64 {
        self.logs[i].own.published.load(Ordering::Acquire) - cur.applied
    }

    /// The next event of log `i` after `cur`, and the slots it takes of those available
    /// (with a pad stepped over). [`Logs::advance`] then moves past it.
    ///
    /// # Safety
    /// Called by the holder of the state lock, under which every cursor of these logs
    /// lives, with `cur` the cursor of log `i`, and only when [`Logs::available`] said at
    /// least one slot is there. The event is in place in the log: read it before the next
    /// call of this for log `i` (which may hand its chunk back to the owner).
    #[inline(always)]
    pub(crate) unsafe fn front(&self, i: usize, cur: &mut Cursor) -> (Event<'_>, u64) {
        let mut skipped = 0;
        // SAFETY (the reads): a slot at `cur.used` of the cursor's chunk is published (the
        // caller checked that one is available), so written before the release store of
        // the count this thread's acquire load read.
        if cur.chunk.is_null()
            || cur.used == CHUNK
            || unsafe { (*cur.chunk).slots[cur.used].assume_init_ref() }.kind == SlotKind::Pad
        {
            // SAFETY: forwarded. (The cursor by value, so that it can stay in registers.)
            (*cur, skipped) = unsafe { self.next_chunk_read(i, *cur) };
        }
        // SAFETY: the event's slots are published (the caller checked its first; the owner
        // publishes an event's slots together) and lie in this chunk (`push`), written
        // before the release store of the count this thread's acquire load read; only
        // they are referred to (the owner may be writing the slots after them).
        let (ev, span) = unsafe {
            let first = std::ptr::addr_of!((*cur.chunk).slots) as *const Slot;
            let at = first.add(cur.used);
            Slot::decode(&*at, || &*at.add(1))
        };
        cur.span = span;
        (ev, skipped + span as u64)
    }

    /// [`Logs::front`] at the start of log `i`, at the end of a chunk or at its pads: the
    /// cursor moved to the next chunk (the one done with handed back to the owner).
    /// Returns the pads stepped over.
    ///
    /// # Safety
    /// As for [`Logs::front`].
    #[cold]
    #[inline(never)]
    unsafe fn next_chunk_read(&self, i: usize, mut cur: Cursor) -> (Cursor, u64) {
        let log = &self.logs[i];
        if cur.chunk.is_null() {
            cur.chunk = log.own.first.load(Ordering::Acquire);
            cur.used = 0;
            return (cur, 0);
        }
        // The pads fill the chunk to its end; the event they precede is published with
        // them.
        let skipped = (CHUNK - cur.used) as u64;
        cur.applied += skipped;
        // SAFETY: the slot after this chunk's last is published, so the owner linked the
        // next chunk before (release, paired here).
        let next = unsafe { (*cur.chunk).next.load(Ordering::Acquire) };
        let done = std::mem::replace(&mut cur.chunk, next);
        cur.used = 0;
        // The owner writes only to its current chunk, `next` or later: `done` is free.
        if !log.read.give_spare(done) {
            // SAFETY: `done` is referred to by nobody else (above), and was not kept.
            unsafe { Chunk::delete(done) };
        }
        (cur, skipped)
    }

    /// The slot `ahead` places after the first of the event [`Logs::front`] last returned
    /// for `cur`, if it lies in the same chunk: a look ahead that changes nothing, so that
    /// applying can start loading what later events will read (`Massif::prefetch_ahead`).
    ///
    /// # Safety
    /// As for [`Logs::front`], called after it with the same cursor, with at least
    /// `ahead + 1` slots available from the first of the event it returned.
    #[inline]
    pub(crate) unsafe fn peek(cur: &Cursor, ahead: usize) -> Option<&Slot> {
        let at = cur.used + ahead;
        if cur.chunk.is_null() || at >= CHUNK {
            return None;
        }
        // SAFETY: the slot is published (the caller's count), so written before the release
        // store this thread acquired; the chunk stays alive while the cursor is in it.
        Some(unsafe { (*cur.chunk).slots[at].assume_init_ref() })
    }

    /// Starts loading the slot `ahead` places after the first of the event [`Logs::front`]
    /// last returned for `cur`, if it lies in the same chunk, without reading it: another
    /// thread wrote it, so its line is in that thread's core's cache until asked for.
    ///
    /// # Safety
    /// As for [`Logs::peek`].
    #[inline]
    pub(crate) unsafe fn prefetch(cur: &Cursor, ahead: usize) {
        let at = cur.used + ahead;
        if !cur.chunk.is_null() && at < CHUNK {
            // SAFETY: the chunk stays alive while the cursor is in it (as in `peek`); only
            // the address is taken.
            oxgrind_tool::hint::prefetch_read(unsafe { &(*cur.chunk).slots[at] });
        }
    }

    /// Moves `cur` past the event [`Logs::front`] returned.
    #[inline]
    pub(crate) fn advance(cur: &mut Cursor) {
        cur.used += cur.span;
        cur.applied += cur.span as u64;
    }

    /// Tells log `i`'s owner how far its events are applied.
    #[inline]
    pub(crate) fn mark_applied(&self, i: usize, cur: &Cursor) {
        self.logs[i]
            .read
            .applied
            .store(cur.applied, Ordering::Release);
    }

    /// In a forked child, no thread of the parent exists: their logs are applied as they
    /// are, and written by nobody again (a child thread could be given one of their ids
    /// once they end in the parent, and would continue a log left in the middle of an
    /// append).
    pub(crate) fn retire_after_fork(&self) {
        for s in &self.logs {
            let o = s.own.owner.load(Ordering::Relaxed);
            if o != NO_OWNER {
                s.own.owner.store(RETIRED, Ordering::Relaxed);
            }
        }
    }
}
