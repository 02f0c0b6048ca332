//! Per-thread logs of heap events, so that no allocation takes a lock or runs a locked
//! instruction.
//!
//! Massif's state is one serial history: Valgrind's allocator replayed (module `arena`), the
//! heap totals, the clock of `--time-unit=B` (bytes allocated and freed so far) and the
//! snapshots taken along it. Valgrind builds it from one thread at a time, since it runs one
//! thread at a time. Here threads run in parallel, so each event is first appended to a log
//! of the thread's own, and the logs are applied to the state in batches, under the state
//! lock, by whichever thread's log holds [`FLUSH`] events while the lock is free (or by
//! `fini`, or by an event that must see the state up to date).
//!
//! A log has one writer, the thread that owns it, and one reader, whoever holds the state
//! lock: a single-producer queue. The owner writes an event into its current chunk and
//! publishes it by one release store of its count (a plain store on x86); the reader reads
//! the count with an acquire load and the events below it in place. When a chunk is full the
//! owner links a fresh one (the reader's last used chunk, handed back, or a new one), so a
//! log never makes its owner wait: a log whose thread cannot get the state lock grows, and
//! the next thread to find the lock free applies everything. Only a log holding [`LIMIT`]
//! events unapplied (its thread ran on while the lock holder was preempted for long) makes
//! its owner wait for the lock, asleep in the kernel until the holder is done (`sync::Released`).
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
/// Events a log holds before its thread applies the logs, if the state lock is free. Large
/// batches keep the state (the replayed arena, the block table) in one core's cache for
/// longer: each hand-over of the lock moves them to the other core. 4096 rather than 128
/// cut Massif's CPU time on `churn` and `threads` by about 8% (paired runs).
pub(crate) const FLUSH: u64 = 4096;
/// Events a log holds unapplied at most: its thread then waits for the state lock. An event
/// is 64 bytes, so 1 MiB per thread at worst.
pub(crate) const LIMIT: u64 = 16384;
/// Events per chunk of a log.
const CHUNK: usize = 256;
/// Chunks a log keeps for reuse: as many as it can hold ([`LIMIT`] events) and some slack,
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

/// A heap event as a thread recorded it, with its clock reading: only what applying it
/// reads, in one cache line (the runtime's `Alloc` and `Free` together are twice that, and
/// every event is written by one thread and read by another).
#[derive(Copy, Clone, Debug)]
#[repr(C, align(64))]
pub(crate) struct Event {
    new_size: u64,
    old_size: u64,
    /// The clock reading, or [`Event::NO_CLOCK`].
    clock: i64,
    /// Not beside `old_size`: `Free`'s `size` and `slop` are, and the two were copied in one
    /// 16-byte load of what the runtime had just stored in two 8-byte halves (a failed
    /// store-to-load forward: half of `on_free`'s time on the heap path, bench `alloc`).
    old_slop: u64,
    new_word: u32,
    old_word: u32,
    new_stack: u32,
    old_stack: u32,
    /// `log2` of [`NewBlock::align`].
    new_align_log2: u8,
    kind: Kind,
}

impl Event {
    const NO_CLOCK: i64 = i64::MIN;

    fn clock_word(clock: Clock) -> i64 {
        clock.unwrap_or(Self::NO_CLOCK)
    }

    #[inline(always)]
    fn set_new(&mut self, new: &Alloc, align: u64) {
        debug_assert!(align.is_power_of_two());
        self.new_word = new.tool_word;
        self.new_size = new.size;
        self.new_stack = new.stack.0;
        self.new_align_log2 = align.trailing_zeros() as u8;
    }

    #[inline(always)]
    fn set_old(&mut self, old: &Free) {
        self.old_word = old.tool_word;
        self.old_size = old.size;
        self.old_slop = old.slop;
        self.old_stack = old.alloc_stack.0;
    }

    #[inline(always)]
    fn empty(kind: Kind, clock: Clock) -> Self {
        Event {
            new_word: 0,
            new_size: 0,
            old_word: 0,
            old_size: 0,
            old_slop: 0,
            clock: Self::clock_word(clock),
            new_stack: 0,
            old_stack: 0,
            new_align_log2: 0,
            kind,
        }
    }

    /// An allocation; `align`: the alignment (a power of two) Valgrind's allocator is
    /// asked for.
    #[inline(always)]
    pub(crate) fn alloc(new: &Alloc, align: u64, clock: Clock) -> Self {
        let mut e = Self::empty(Kind::Alloc, clock);
        e.set_new(new, align);
        e
    }

    #[inline(always)]
    pub(crate) fn free(old: &Free, clock: Clock) -> Self {
        let mut e = Self::empty(Kind::Free, clock);
        e.set_old(old);
        e
    }

    /// A realloc (`align`: as for [`Event::alloc`]).
    #[inline(always)]
    pub(crate) fn realloc(old: &Free, new: &Alloc, align: u64, clock: Clock) -> Self {
        let mut e = Self::empty(Kind::Realloc, clock);
        e.set_old(old);
        e.set_new(new, align);
        e
    }

    #[inline]
    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    #[inline]
    pub(crate) fn clock(&self) -> Clock {
        (self.clock != Self::NO_CLOCK).then_some(self.clock)
    }

    /// The block allocated (an allocation or realloc).
    #[inline]
    pub(crate) fn new_block(&self) -> NewBlock {
        NewBlock {
            word: self.new_word,
            size: self.new_size,
            align: 1 << self.new_align_log2,
            stack: StackId(self.new_stack),
        }
    }

    /// The block given back (a free or realloc).
    #[inline]
    pub(crate) fn old_block(&self) -> OldBlock {
        OldBlock {
            word: self.old_word,
            size: self.old_size,
            slop: self.old_slop,
            stack: StackId(self.old_stack),
        }
    }

    /// The number of the block allocated (0: none, or not an allocation).
    #[inline]
    pub(crate) fn new_word(&self) -> u32 {
        match self.kind {
            Kind::Free => 0,
            Kind::Alloc | Kind::Realloc => self.new_word,
        }
    }

    /// The number of the block whose allocation must be applied first (0: none).
    #[inline]
    pub(crate) fn needs_live(&self) -> u32 {
        match self.kind {
            Kind::Alloc => 0,
            Kind::Free | Kind::Realloc => self.old_word,
        }
    }
}

/// A piece of a log: events in the order they were appended, then the next piece.
struct Chunk {
    events: [MaybeUninit<Event>; CHUNK],
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
        // SAFETY: `c` is a fresh allocation for a `Chunk`; the events may stay uninitialised
        // (`MaybeUninit`), `next` is initialised here before any read.
        unsafe { std::ptr::addr_of_mut!((*c).next).write(AtomicPtr::new(null_mut())) };
        c
    }

    /// # Safety
    /// `c` came from [`Chunk::new`] and nothing refers to it any more.
    unsafe fn delete(c: *mut Chunk) {
        // SAFETY: forwarded to the caller; events need no drop (`Event` is `Copy`).
        unsafe { dealloc(c as *mut u8, Self::LAYOUT) }
    }
}

/// What only a log's owner touches.
struct Writer {
    /// The chunk being filled (null until the log is first taken).
    chunk: *mut Chunk,
    /// Events in `chunk`.
    used: usize,
    /// Events appended so far (the published count, as the owner knows it).
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
    /// Events published (release store by the owner).
    published: AtomicU64,
    /// The log's first chunk, where the reader starts (set before the first publication).
    first: AtomicPtr<Chunk>,
    writer: UnsafeCell<Writer>,
}

/// Written by the reader, once per batch or chunk.
#[repr(align(64))]
struct ReaderLine {
    /// Events applied (release store by the state lock's holder).
    applied: AtomicU64,
    /// Chunks the reader is done with, handed back for the owner's next ones (null: none).
    /// A chunk goes back to the thread that allocated it rather than to the allocator from
    /// the reading thread: the runtime's private heap keeps a free list per thread, so
    /// chunks freed by the reader were never reused by the owner, and on four threads
    /// Massif's peak RSS went from 20 to 80 MiB.
    spares: [AtomicPtr<Chunk>; SPARES],
}

impl ReaderLine {
    /// A chunk handed back, for the log's owner (one atomic swap per chunk of 256 events).
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
struct Slot {
    own: OwnerLine,
    read: ReaderLine,
}

pub(crate) struct Logs {
    slots: [Slot; SLOTS],
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
    /// Events of `chunk` already applied.
    used: usize,
    /// Events of the log applied.
    applied: u64,
}

impl Default for Cursor {
    fn default() -> Self {
        Cursor {
            chunk: null_mut(),
            used: 0,
            applied: 0,
        }
    }
}

// SAFETY: a cursor is only used by the holder of the state lock it lives under.
unsafe impl Send for Cursor {}

impl Logs {
    pub(crate) const fn new() -> Self {
        Logs {
            slots: [const {
                Slot {
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
        if tid > 0 && self.slots[home].own.owner.load(Ordering::Relaxed) == tid {
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
            let own = &self.slots[i].own;
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

    /// Appends `ev` to the log of thread `tid` (the calling thread, never inside another
    /// call of this on the same thread: the runtime does not re-enter a tool's handler on a
    /// thread). Returns how many events that log may hold unapplied (at least the true
    /// number when that is [`FLUSH`] or more), or `None` when the thread has no log.
    ///
    /// The event is made by `make` and written straight into the log: built on the stack
    /// with stores of its fields and then copied in 16-byte loads, each load waited for
    /// the stores it spans (a store-forwarding stall: about 3% of Massif's time on `alloc`).
    #[inline(always)]
    pub(crate) fn push(&self, tid: i32, make: impl Fn() -> Event) -> Option<u64> {
        let slot = &self.slots[self.log_of(tid)?];
        // SAFETY: the log is owned by `tid`, the calling thread: thread ids are unique among
        // live threads, and the thread is not inside another `push` (above). So this is the
        // only reference to the writer.
        let w = unsafe { &mut *slot.own.writer.get() };
        if w.used == CHUNK {
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
        // SAFETY: `w.chunk` is this log's current chunk, `used < CHUNK`, and the slot is not
        // yet published, so the reader does not read it.
        unsafe { (*w.chunk).events[w.used].write(make()) };
        w.used += 1;
        w.count += 1;
        slot.own.published.store(w.count, Ordering::Release);
        let mut n = w.count - w.applied_seen;
        if n >= FLUSH {
            w.applied_seen = slot.read.applied.load(Ordering::Acquire);
            n = w.count - w.applied_seen;
        }
        Some(n)
    }

    /// Logs ever taken (bit `i`: log `i`).
    #[inline]
    pub(crate) fn taken(&self) -> u64 {
        self.taken.load(Ordering::Acquire)
    }

    /// Events published in log `i` and not yet applied past `cur`.
    #[inline]
    pub(crate) fn available(&self, i: usize, cur: &Cursor) -> u64 {
        self.slots[i].own.published.load(Ordering::Acquire) - cur.applied
    }

    /// The next event of log `i` after `cur`.
    ///
    /// # Safety
    /// Called by the holder of the state lock, under which every cursor of these logs
    /// lives, with `cur` the cursor of log `i`, and only when [`Logs::available`] said at
    /// least one event is there.
    #[inline]
    pub(crate) unsafe fn front(&self, i: usize, cur: &mut Cursor) -> Event {
        let slot = &self.slots[i];
        if cur.chunk.is_null() {
            cur.chunk = slot.own.first.load(Ordering::Acquire);
            cur.used = 0;
        } else if cur.used == CHUNK {
            // SAFETY: the event after this chunk's last is published, so the owner linked
            // the next chunk before (release, paired here).
            let next = unsafe { (*cur.chunk).next.load(Ordering::Acquire) };
            let done = std::mem::replace(&mut cur.chunk, next);
            cur.used = 0;
            // The owner writes only to its current chunk, `next` or later: `done` is free.
            if !slot.read.give_spare(done) {
                // SAFETY: `done` is referred to by nobody else (above), and was not kept.
                unsafe { Chunk::delete(done) };
            }
        }
        // SAFETY: the event is published (the caller checked), so written before the release
        // store of the count this thread's acquire load read.
        unsafe { (*cur.chunk).events[cur.used].assume_init_read() }
    }

    /// The event `ahead` places after the one [`Logs::front`] last returned for `cur`, if
    /// it lies in the same chunk: a look ahead that changes nothing, so that applying can
    /// start loading what later events will read (`Massif::prefetch_ahead`).
    ///
    /// # Safety
    /// As for [`Logs::front`], called after it with the same cursor, with at least `ahead + 1`
    /// events available from the one it returned.
    #[inline]
    pub(crate) unsafe fn peek(cur: &Cursor, ahead: usize) -> Option<&Event> {
        let at = cur.used + ahead;
        if cur.chunk.is_null() || at >= CHUNK {
            return None;
        }
        // SAFETY: the event is published (the caller's count), so written before the release
        // store this thread acquired; the chunk stays alive while the cursor is in it.
        Some(unsafe { (*cur.chunk).events[at].assume_init_ref() })
    }

    /// Starts loading the event `ahead` places after the one [`Logs::front`] last returned
    /// for `cur`, if it lies in the same chunk, without reading it: another thread wrote it,
    /// so its line is in that thread's core's cache until asked for.
    ///
    /// # Safety
    /// As for [`Logs::peek`].
    #[inline]
    pub(crate) unsafe fn prefetch(cur: &Cursor, ahead: usize) {
        let at = cur.used + ahead;
        if !cur.chunk.is_null() && at < CHUNK {
            // SAFETY: the chunk stays alive while the cursor is in it (as in `peek`); only
            // the address is taken.
            oxgrind_tool::hint::prefetch_read(unsafe { &(*cur.chunk).events[at] });
        }
    }

    /// Moves `cur` past the event [`Logs::front`] returned.
    #[inline]
    pub(crate) fn advance(cur: &mut Cursor) {
        cur.used += 1;
        cur.applied += 1;
    }

    /// Tells log `i`'s owner how far its events are applied.
    #[inline]
    pub(crate) fn mark_applied(&self, i: usize, cur: &Cursor) {
        self.slots[i]
            .read
            .applied
            .store(cur.applied, Ordering::Release);
    }

    /// In a forked child, no thread of the parent exists: their logs are applied as they
    /// are, and written by nobody again (a child thread could be given one of their ids
    /// once they end in the parent, and would continue a log left in the middle of an
    /// append).
    pub(crate) fn retire_after_fork(&self) {
        for s in &self.slots {
            let o = s.own.owner.load(Ordering::Relaxed);
            if o != NO_OWNER {
                s.own.owner.store(RETIRED, Ordering::Relaxed);
            }
        }
    }
}
