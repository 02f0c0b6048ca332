//! Massif: how much heap the program uses over time, its peak, and which call stacks
//! allocated it, written as Valgrind 3.19's `massif.out.<pid>` (formats.md §1).
//!
//! [`Massif`] implements [`oxgrind_tool::Tool`]. The runtime replaces `malloc` & co and calls
//! [`Tool::on_alloc`], [`Tool::on_free`] and [`Tool::on_realloc`] on the allocating thread
//! (with `--pages-as-heap=yes`, [`Tool::on_map`] / [`Tool::on_unmap`] instead), then
//! [`Tool::fini`] once. Massif keeps:
//!
//! * per execution context (EC: the filtered allocation stack, see [`classify`]) the bytes
//!   currently live, plus the heap totals: useful bytes, extra bytes (`--heap-admin` per block
//!   plus the allocator's slop);
//! * the snapshot table, filled and culled as Valgrind does (module `schedule`);
//! * at `fini`, a heap tree for each detailed snapshot (module `tree`), handed to
//!   `oxgrind_formats::massif::write`.
//!
//! Cost on the program's allocator path: the event appended to its thread's log (module
//! [`log`]: no process-wide lock per event; the logs are applied in batches), then, when
//! applied, one table read from the [`StackId`] to its EC (stack ids are dense), the replay
//! of the allocation in Valgrind's allocator (module `arena`: a free-list search and a few
//! table updates, about 300 instructions per malloc/free pair), where the block, with its
//! record, sits in the slot named by the number the runtime keeps with it (module
//! `numbers`), a few additions, and a comparison with the time of the next snapshot. Classifying a stack never seen before (symbol lookups) happens outside
//! the lock.
//!
//! The runtime's block table gives each [`Free`] the stack of the call that last allocated or
//! reallocated the block, and the number Massif gave it ([`Tool::on_alloc`]'s result), which
//! names its slot in the replayed arena, with its record (module `numbers`, Valgrind's
//! `HP_Chunk`s): what only Valgrind's allocator knows, each block's place in it, hence its
//! slop. Module `arena` replays that allocator
//! on every event, so the usable sizes, hence the extra heap and `--time-unit=B` clock, are
//! Valgrind's, and realloc follows Valgrind's rule (in place while the new size fits in the
//! usable size). Ignored blocks (`--ignore-fn`) are marked in their records; pages with
//! `--pages-as-heap=yes` as ranges.
//!
//! What differs from Valgrind (see also `docs/differences-from-valgrind.md`):
//! * `--time-unit=i` reads [`Host::instructions`]: the translation engine counts the
//!   program's instructions (`Needs::count_instructions`, asked for only with `i`) and the
//!   runtime leaves its allocator hooks out, charging Valgrind's wrapper cost per call. Times
//!   are smaller than Valgrind's by the start-up it cannot see (the dynamic loader and libc's
//!   initialisation: 131,915 instructions for a C program linked with libc alone, ≈1.8
//!   million with libstdc++), otherwise equal to within a few instructions per call; see
//!   `docs/differences-from-valgrind.md`.
//! * `--stacks=yes` probes every instruction that moves the stack pointer (module `stacks`):
//!   the program runs under the engine, slowly; signal frames are the kernel's, not
//!   Valgrind's, and the dynamic loader's start-up runs before the engine sees it.
//! * The "startup" snapshot (Valgrind takes it when the first basic block is translated) is
//!   taken when the first heap event arrives, or at exit if none did, with time 0 and an empty
//!   heap: the same numbers Valgrind's has. Time 0 in `ms` is program start
//!   (`Host::elapsed_ms`), not the first snapshot.
//! * `--pages-as-heap=yes`: mappings are kept as address ranges, not one entry per page, so
//!   huge reservations cost nothing; a page mapped twice without an unmap in between is
//!   counted once (Valgrind would count it twice); frame 0 of a mapping's stack (the system
//!   call's site, or `0x0` for start-up mappings) is kept, as Valgrind keeps it.
//!
//! Given the same allocation sequence and slop, the output is byte for byte Valgrind's:
//! `tests/examples.rs` replays `ms_prog` under nine option sets and `ms_small` against
//! files Valgrind 3.19 wrote.

mod arena;
pub mod classify;
mod clock;
mod log;
mod numbers;
pub mod options;
mod pages;
mod schedule;
mod stacks;
mod sync;
mod tree;

use classify::Classifier;
use options::{Options, TimeUnit};
use oxgrind_formats::massif::{
    MassifFile, Snapshot, SnapshotKind, HEAP_ROOT_LABEL, PAGES_ROOT_LABEL,
};
use oxgrind_tool::{Addr, Alloc, Exit, Free, Host, Mapping, Needs, OptionError, StackId, Tool};
use schedule::{Kind, Scheduler, Totals};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use sync::{FxHashMap, SpinLock};

/// Page size for `--pages-as-heap=yes`.
const PAGE: u64 = 4096;

/// An EC id, or [`IGNORED`].
type EcId = u32;
const IGNORED: EcId = u32::MAX;

/// How many events ahead of the one being applied [`Massif::prefetch_ahead`] starts loading
/// a later event itself (written by its thread, maybe on the other core), a block's record,
/// its place in the replayed arena, and its neighbours there.
const AHEAD_EVENT: usize = 24;
const AHEAD_BLOCK: usize = 12;
const AHEAD_NEIGHBOURS: usize = 6;

/// Milliseconds or instructions read for this event, or `None` when time is counted in
/// bytes.
pub(crate) type Clock = Option<i64>;

/// Everything that changes while the program runs, behind one lock.
///
/// On cache lines of its own (128 bytes: the spatial prefetcher fetches lines in pairs),
/// apart from its lock's word and from the rest of [`Massif`]: whichever thread applies the
/// logs writes it at every event it applies, while the program's other threads read
/// [`Massif`]'s other fields at every event of theirs (the numbers, at every allocation) and
/// the lock's word at every event once their log is due (`Massif::flush_due`). Beside the
/// lock's word and the numbers, `live_blocks` made those reads miss, and the applying
/// thread's writes wait for the line, whenever the threads ran on two cores (`threads`).
#[repr(align(128))]
struct State {
    /// Stack (as interned by the runtime) → EC, filled once per new stack.
    by_stack: EcByStack,
    /// EC frames → id, so several raw stacks that filter to the same frames share an EC.
    ec_ids: FxHashMap<Box<[Addr]>, EcId>,
    ec_frames: Vec<Box<[Addr]>>,
    /// Live useful bytes per EC (indexed by id).
    ec_bytes: Vec<u64>,
    heap: u64,
    extra: u64,
    /// `--stacks=yes`: the bytes of stack all threads use (see [`stacks`]).
    stacks: u64,
    /// `--time-unit=B`: bytes allocated plus bytes freed so far.
    total_bytes_time: u64,
    /// Last time handed out, so snapshot times never go backwards across threads.
    last_time: i64,
    started: bool,
    sched: Scheduler,
    /// `--pages-as-heap=yes`: the mapped ranges and their ECs.
    pages: pages::Pages,
    /// Valgrind's allocator, replayed to know the usable size it would give each block.
    arena: arena::Arena,
    /// Blocks whose allocation is applied and whose free is not (each has a number, module
    /// [`numbers`], and its slot in `arena`).
    live_blocks: u64,
    /// Where applying stands in each thread's log (module [`log`]).
    cursors: Vec<log::Cursor>,
}

/// The EC of each stack id: the runtime numbers stacks densely from 0, so a table indexed
/// by id (a map for ids past [`EcByStack::DENSE`], which a runtime never hands out).
#[derive(Default)]
struct EcByStack {
    dense: Vec<EcId>,
    sparse: FxHashMap<u32, EcId>,
}

impl EcByStack {
    /// The runtime's own limit on distinct stacks.
    const DENSE: u32 = 1 << 26;
    /// A `dense` entry not filled yet.
    const UNKNOWN: EcId = IGNORED - 1;

    #[inline]
    fn get(&self, stack: StackId) -> Option<EcId> {
        if stack.0 < Self::DENSE {
            match self.dense.get(stack.0 as usize) {
                Some(&ec) if ec != Self::UNKNOWN => Some(ec),
                _ => None,
            }
        } else {
            self.sparse.get(&stack.0).copied()
        }
    }

    fn insert(&mut self, stack: StackId, ec: EcId) {
        let i = stack.0 as usize;
        if stack.0 < Self::DENSE {
            if i >= self.dense.len() {
                self.dense
                    .resize((i + 1).next_power_of_two(), Self::UNKNOWN);
            }
            self.dense[i] = ec;
        } else {
            self.sparse.insert(stack.0, ec);
        }
    }
}

/// The Massif tool. Create with [`Massif::new`], feed options, then hand to the runtime.
pub struct Massif {
    opts: Options,
    classifier: Classifier,
    state: SpinLock<State>,
    /// Heap events not yet applied to `state`, per thread (module [`log`]).
    logs: log::Logs,
    /// The numbers the runtime keeps with live blocks, each a block's slot in the replayed
    /// arena (`State::arena`), which holds what Massif knows of it.
    numbers: Arc<numbers::Numbers>,
    /// Where a thread whose log is full sleeps until the logs are applied.
    released: sync::Released,
    clock: clock::MsClock,
    finished: AtomicBool,
}

impl Default for Massif {
    fn default() -> Self {
        Self::new()
    }
}

impl Massif {
    pub fn new() -> Self {
        let opts = Options::default();
        let numbers = Arc::new(numbers::Numbers::new());
        Massif {
            classifier: Classifier::new(&[], &[], opts.depth, false),
            state: SpinLock::new(State::new(&opts, numbers.clone())),
            logs: log::Logs::new(),
            numbers,
            released: sync::Released::new(),
            opts,
            clock: clock::MsClock::new(),
            finished: AtomicBool::new(false),
        }
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// The EC of a heap or page stack: a hash lookup, or on first sight a classification
    /// done outside the lock.
    fn ec_of<'a>(
        &'a self,
        host: &dyn Host,
        st: sync::SpinGuard<'a, State>,
        stack: StackId,
        keep_first: bool,
    ) -> (sync::SpinGuard<'a, State>, EcId) {
        if let Some(ec) = st.by_stack.get(stack) {
            return (st, ec);
        }
        drop(st);
        let raw = host.stack(stack);
        // Frame 0 of a heap stack is our replacement allocator (Valgrind's
        // exclude_first_entry); page stacks keep it.
        let ips = if keep_first {
            &raw[..]
        } else {
            raw.get(1..).unwrap_or(&[])
        };
        let classified = self.classifier.classify(host, ips);
        let mut st = self.state.lock();
        let ec = match classified {
            None => IGNORED,
            Some(frames) => st.intern(frames),
        };
        st.by_stack.insert(stack, ec);
        (st, ec)
    }

    /// [`Massif::ec_of`] with the lock held throughout (applying the logs: a new stack is
    /// classified by the thread applying them, while other threads keep logging).
    fn ec_of_locked(&self, host: &dyn Host, st: &mut State, stack: StackId) -> EcId {
        if let Some(ec) = st.by_stack.get(stack) {
            return ec;
        }
        let raw = host.stack(stack);
        // Frame 0 of a heap stack is our replacement allocator (exclude_first_entry).
        let ec = match self.classifier.classify(host, raw.get(1..).unwrap_or(&[])) {
            None => IGNORED,
            Some(frames) => st.intern(frames),
        };
        st.by_stack.insert(stack, ec);
        ec
    }

    /// Logs a heap event of the calling thread (`tid`), written by `make` into `n` slots
    /// (module [`log`]), and applies the logs when its log is due. With `numbered` (an
    /// allocation or realloc) the new block gets a number from the thread's space, found
    /// with its log (module [`numbers`]), which `make` writes and this returns; otherwise
    /// `make` is given 0.
    #[inline(always)]
    fn log_event(
        &self,
        host: &dyn Host,
        tid: i32,
        n: usize,
        numbered: bool,
        make: impl Fn(&mut [MaybeUninit<log::Slot>], u32),
    ) -> u32 {
        let pushed = self.logs.push(tid, n, |to, i| {
            // SAFETY: the calling thread owns log `i` (thread ids are unique among live
            // threads), and the runtime does not re-enter a tool's handler on a thread.
            let word = if numbered {
                unsafe { self.numbers.take(i) }
            } else {
                0
            };
            make(to, word);
            word
        });
        let Some((k, word)) = pushed else {
            return self.apply_unlogged(host, n, numbered, &make);
        };
        if k >= log::FLUSH {
            self.flush_due(host, k);
        }
        word
    }

    /// An event of a thread with no log left ([`Massif::log_event`]'s arguments): numbered
    /// from the shared space and applied at once, under the state lock, after every event
    /// logged before.
    #[cold]
    #[inline(never)]
    fn apply_unlogged(
        &self,
        host: &dyn Host,
        n: usize,
        numbered: bool,
        make: &dyn Fn(&mut [MaybeUninit<log::Slot>], u32),
    ) -> u32 {
        let mut st = self.state_now(host);
        // SAFETY: the state lock's holder owns the shared space.
        let word = if numbered {
            unsafe { self.numbers.take(numbers::SHARED) }
        } else {
            0
        };
        let mut slots = [MaybeUninit::uninit(); 2];
        make(&mut slots[..n], word);
        // SAFETY: `make` wrote the event's `n` slots.
        let slots = unsafe { &*(&slots[..n] as *const _ as *const [log::Slot]) };
        self.apply(host, &mut st, &log::Event::unlogged(slots));
        word
    }

    /// A log holds `n` slots unapplied, [`log::FLUSH`] or more: apply the logs if the state
    /// lock is free, or wait for it past [`log::LIMIT`].
    #[inline(never)]
    fn flush_due(&self, host: &dyn Host, n: u64) {
        let st = if n >= log::LIMIT {
            Some(self.released.lock(&self.state))
        } else if self.state.is_locked() {
            // Another thread is applying the logs; ours waits for the next offer.
            None
        } else {
            self.state.try_lock()
        };
        if let Some(mut st) = st {
            self.apply_logs(host, &mut st);
            drop(st);
            self.released.notify();
        }
    }

    /// Applies every thread's published events to the state, in an order that keeps each
    /// thread's and each address's (module [`log`]).
    fn apply_logs(&self, host: &dyn Host, st: &mut State) {
        let taken = self.logs.taken();
        // Per log, the events to apply in this call: those published now (more are read
        // only when the ones here wait for a missing event).
        let mut end = [0u64; log::SLOTS];
        let mut busy = 0u64;
        let mut bits = taken;
        while bits != 0 {
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            end[i] = self.logs.available(i, &st.cursors[i]);
            if end[i] != 0 {
                busy |= 1 << i;
            }
        }
        if busy == 0 {
            return;
        }
        if busy.count_ones() == 1 {
            // One thread's events: its own order is the only one.
            let i = busy.trailing_zeros() as usize;
            let mut cur = st.cursors[i];
            let mut left = end[i];
            while left != 0 {
                // SAFETY: under the state lock, with log `i`'s cursor, `left` slots
                // available.
                let (ev, n) = unsafe { self.logs.front(i, &mut cur) };
                left -= n;
                // SAFETY: as above, right after `front`; `left` slots follow.
                unsafe { self.prefetch_ahead(st, &cur, left) };
                log::Logs::advance(&mut cur);
                self.apply(host, st, &ev);
            }
            st.cursors[i] = cur;
            self.logs.mark_applied(i, &cur);
            return;
        }
        loop {
            let mut progressed = false;
            let mut bits = busy;
            while bits != 0 {
                let i = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let mut cur = st.cursors[i];
                while end[i] != 0 {
                    // SAFETY: as above. (Reading the same event again after a `break`
                    // below steps over nothing: the pads before it were stepped over.)
                    let (ev, n) = unsafe { self.logs.front(i, &mut cur) };
                    let live = ev.needs_live();
                    if live != 0 && !st.arena.is_live(live) {
                        end[i] -= n - cur.span() as u64;
                        break;
                    }
                    end[i] -= n;
                    // SAFETY: as above, right after `front`; `end[i]` slots follow.
                    unsafe { self.prefetch_ahead(st, &cur, end[i]) };
                    log::Logs::advance(&mut cur);
                    self.apply(host, st, &ev);
                    progressed = true;
                }
                st.cursors[i] = cur;
                if end[i] == 0 {
                    busy &= !(1 << i);
                    self.logs.mark_applied(i, &cur);
                }
            }
            if busy == 0 {
                return;
            }
            if progressed {
                continue;
            }
            // Every log's next event waits for an event not read yet: read the counts again.
            let mut more = false;
            let mut bits = self.logs.taken();
            while bits != 0 {
                let i = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let now = self.logs.available(i, &st.cursors[i]);
                if now > end[i] {
                    end[i] = now;
                    busy |= 1 << i;
                    more = true;
                }
            }
            if !more {
                // Nothing anywhere supplies the missing event (a history the runtime should
                // never give): apply the oldest waiting event of the first log as it is,
                // as a lock per event would have.
                let i = busy.trailing_zeros() as usize;
                let mut cur = st.cursors[i];
                // SAFETY: as above (`busy` bit `i`: `end[i]` slots available).
                let (ev, n) = unsafe { self.logs.front(i, &mut cur) };
                log::Logs::advance(&mut cur);
                end[i] -= n;
                st.cursors[i] = cur;
                self.apply(host, st, &ev);
                if end[i] == 0 {
                    busy &= !(1 << i);
                    self.logs.mark_applied(i, &cur);
                }
                if busy == 0 {
                    return;
                }
            }
        }
    }

    /// Starts loading, while the event [`log::Logs::front`] just returned is applied, what
    /// later events of the same log will read first: the events themselves
    /// ([`AHEAD_EVENT`]), the slots in the replayed arena of the blocks they free or
    /// allocate, which their numbers name ([`AHEAD_BLOCK`] events ahead), then the freed
    /// block's neighbours, which the free merges with, or the free-list head an allocation
    /// will search ([`AHEAD_NEIGHBOURS`]). Each of those is a line last touched thousands of
    /// events before (numbers are reused first in, first out), in tables larger than the
    /// first-level cache: read one after the other, every event waited on several misses in
    /// turn. Hints only: what a later event really reads is decided when it is applied.
    ///
    /// # Safety
    /// Under the state lock (`st`), right after `front` with the same cursor `cur`, with
    /// `after` events of that log published after the one it returned.
    #[inline(always)]
    unsafe fn prefetch_ahead(&self, st: &State, cur: &log::Cursor, after: u64) {
        // SAFETY (the peeks): forwarded, each only when that many events follow.
        unsafe {
            if after >= AHEAD_EVENT as u64 {
                log::Logs::prefetch(cur, AHEAD_EVENT);
            }
            if after >= AHEAD_BLOCK as u64 {
                if let Some(e) = log::Logs::peek(cur, AHEAD_BLOCK) {
                    let n = e.hint_word();
                    if n != 0 {
                        st.arena.prefetch_block(n);
                    }
                }
            }
            if after >= AHEAD_NEIGHBOURS as u64 {
                if let Some(e) = log::Logs::peek(cur, AHEAD_NEIGHBOURS) {
                    match e.hint_word() {
                        0 => {}
                        old if e.hint_gives_back() => st.arena.prefetch_neighbours(old),
                        _ => st.arena.prefetch_fit(e.hint_size()),
                    }
                }
            }
        }
    }

    #[inline]
    fn apply(&self, host: &dyn Host, st: &mut State, ev: &log::Event) {
        self.start(st);
        let clock = ev.clock();
        match ev.kind() {
            log::Kind::Alloc => self.apply_alloc(host, st, &ev.new_block(), clock),
            log::Kind::Free => self.apply_free(host, st, &ev.old_block(), clock),
            log::Kind::Realloc => {
                self.apply_realloc(host, st, &ev.old_block(), &ev.new_block(), clock)
            }
        }
    }

    fn apply_alloc(&self, host: &dyn Host, st: &mut State, ev: &log::NewBlock, clock: Clock) {
        let ec = self.ec_of_locked(host, st, ev.stack);
        // Valgrind allocates the block before it looks at the stack: ignored blocks too.
        let rec = arena::Record {
            ec,
            ignored: ec == IGNORED,
        };
        let slop = st.arena_alloc(ev.align, ev.size, ev.word, rec);
        if ec == IGNORED {
            return;
        }
        let extra = self.opts.heap_admin + slop;
        st.ec_bytes[ec as usize] += ev.size;
        st.heap += ev.size;
        st.extra += extra;
        st.total_bytes_time += ev.size + extra;
        self.normal_attempt(clock, st);
    }

    fn apply_free(&self, host: &dyn Host, st: &mut State, ev: &log::OldBlock, clock: Clock) {
        let (slop, ec, ignored) = match st.arena.record(ev.word) {
            Some(r) => {
                let slop = st.arena.usable(ev.word).saturating_sub(ev.size);
                st.arena.free(ev.word);
                st.live_blocks -= 1;
                (slop, r.ec, r.ignored)
            }
            None => (ev.slop, self.ec_of_locked(host, st, ev.stack), false),
        };
        // SAFETY: under the state lock (`st`); the number came in a published event, and
        // its block's free is being applied.
        unsafe { self.numbers.release(ev.word) };
        if ignored || ec == IGNORED {
            return;
        }
        self.peak_attempt(clock, st);
        let extra = self.opts.heap_admin + slop;
        let b = &mut st.ec_bytes[ec as usize];
        *b = b.saturating_sub(ev.size);
        st.heap = st.heap.saturating_sub(ev.size);
        st.extra = st.extra.saturating_sub(extra);
        st.total_bytes_time += ev.size + extra;
        self.normal_attempt(clock, st);
    }

    fn apply_realloc(
        &self,
        host: &dyn Host,
        st: &mut State,
        old: &log::OldBlock,
        new: &log::NewBlock,
        clock: Clock,
    ) {
        let new_ec = self.ec_of_locked(host, st, new.stack);
        let old_rec = st.arena.record(old.word);
        let (old_ec, old_ignored) = match old_rec {
            Some(r) => (r.ec, r.ignored),
            None => (self.ec_of_locked(host, st, old.stack), false),
        };
        let ignored = old_ignored || old_ec == IGNORED;
        let new_rec = arena::Record {
            ec: new_ec,
            ignored: ignored || new_ec == IGNORED,
        };
        let (old_slop, new_slop) =
            st.arena_realloc(old, old_rec.is_some(), new, self.opts.alignment, new_rec);
        // SAFETY: as in `apply_free`.
        unsafe { self.numbers.release(old.word) };
        if ignored {
            // The original allocation was ignored: so is the block, wherever it moves, and
            // the heap totals do not change. Valgrind 3.19 still adds the new size to the
            // realloc site's context (its XTree is updated before the check) and never takes
            // it off again; kept for identical trees.
            if new_ec != IGNORED {
                st.ec_bytes[new_ec as usize] += new.size;
            }
            return;
        }
        if new.size < old.size {
            // Shrinking is a deallocation: peak check first.
            self.peak_attempt(clock, st);
        }
        if new_ec == IGNORED {
            // Valgrind 3.19 marks the block ignored from now on (its record says so) but
            // leaves its old bytes counted (they are never subtracted): kept as is for
            // identical numbers.
            return;
        }
        let o = &mut st.ec_bytes[old_ec as usize];
        *o = o.saturating_sub(old.size);
        st.ec_bytes[new_ec as usize] += new.size;
        let d_heap = new.size as i128 - old.size as i128;
        let d_extra = new_slop as i128 - old_slop as i128;
        st.heap = (st.heap as i128 + d_heap).max(0) as u64;
        st.extra = (st.extra as i128 + d_extra).max(0) as u64;
        st.total_bytes_time += (d_heap + d_extra).unsigned_abs() as u64;
        self.normal_attempt(clock, st);
    }

    /// The state lock, with every logged event applied: for events that are not logged
    /// (pages, stacks) and for reading the state.
    fn state_now(&self, host: &dyn Host) -> sync::SpinGuard<'_, State> {
        let mut st = self.state.lock();
        self.apply_logs(host, &mut st);
        st
    }

    /// The clock for `--time-unit=ms` and `i`, read once per event before taking the lock
    /// (a millisecond reading may be a system call; the lock should not wait on it), as
    /// Valgrind reads it before doing any work of its own. `None` with `--time-unit=B`,
    /// whose time is kept in the state.
    #[inline]
    fn read_clock(&self, host: &dyn Host) -> Clock {
        match self.opts.time_unit {
            TimeUnit::Bytes => None,
            TimeUnit::Ms => Some(self.clock.now_ms(host) as i64),
            // The engine's count over all threads; the runtime keeps its allocator hooks
            // (and so this handler) out of it.
            TimeUnit::Instructions => Some(host.instructions() as i64),
        }
    }

    /// The time of a snapshot taken now. Threads read the clock before queueing for the
    /// lock, so a later reading can arrive first: times are kept from going backwards, and
    /// the scheduler is told that its times are the order of application, not readings
    /// (`Scheduler::times_serialised`). One thread's readings never go backwards.
    #[inline]
    fn now(clock: Clock, st: &mut State) -> i64 {
        let t = clock.unwrap_or(st.total_bytes_time as i64);
        if t < st.last_time {
            st.sched.times_serialised();
            return st.last_time;
        }
        st.last_time = t;
        t
    }

    /// Valgrind's "startup" attempt, once, before the first event is applied.
    fn start(&self, st: &mut State) {
        if !st.started {
            st.started = true;
            if !self.opts.pages_as_heap {
                // Time 0 is program start, where Valgrind's startup snapshot is (its first
                // basic block), whatever the clock says at the first event.
                let State {
                    sched,
                    heap,
                    extra,
                    stacks,
                    ec_bytes,
                    ..
                } = st;
                let now = Totals {
                    heap: *heap,
                    extra: *extra,
                    stacks: *stacks,
                    per_context: ec_bytes,
                };
                sched.normal(0, now);
            }
        }
    }

    #[inline]
    fn normal_attempt(&self, clock: Clock, st: &mut State) {
        let t = Self::now(clock, st);
        if st.sched.too_early(t) {
            return;
        }
        let State {
            sched,
            heap,
            extra,
            stacks,
            ec_bytes,
            ..
        } = st;
        sched.normal(
            t,
            Totals {
                heap: *heap,
                extra: *extra,
                stacks: *stacks,
                per_context: ec_bytes,
            },
        );
    }

    #[inline]
    fn peak_attempt(&self, clock: Clock, st: &mut State) {
        if !st.sched.is_new_peak(st.heap + st.extra + st.stacks) {
            return;
        }
        let t = Self::now(clock, st);
        let State {
            sched,
            heap,
            extra,
            stacks,
            ec_bytes,
            ..
        } = st;
        sched.peak(
            t,
            Totals {
                heap: *heap,
                extra: *extra,
                stacks: *stacks,
                per_context: ec_bytes,
            },
        );
    }

    /// The alignment Valgrind's allocator is asked for: `--alignment` for the functions that
    /// take none; for the others the program's value raised as Valgrind's wrappers raise it
    /// (to at least 16, to a power of two), whatever `--alignment` says.
    fn alignment_of(&self, ev: &Alloc) -> u64 {
        use oxgrind_tool::AllocFn::*;
        match ev.func {
            Valloc | Pvalloc => PAGE,
            _ if ev.align != 0 => ev.align.next_power_of_two().max(arena::MIN_MALLOC),
            _ => self.opts.alignment,
        }
    }

    /// Valgrind's `new_mem_stack` (`d > 0`) or `die_mem_stack` (`d < 0`) of `|d|` bytes.
    fn stack_event(&self, clock: Clock, st: &mut State, d: i64) {
        let n = d.unsigned_abs();
        if d < 0 {
            self.peak_attempt(clock, st);
            st.stacks = st.stacks.saturating_sub(n);
        } else {
            st.stacks += n;
        }
        st.total_bytes_time += n;
        self.normal_attempt(clock, st);
    }

    fn heap_events(&self) -> bool {
        self.opts.heap && !self.opts.pages_as_heap
    }

    fn record_pages(&self, st: &mut State, start: Addr, end: Addr, ec: EcId) -> bool {
        let State {
            pages,
            ec_bytes,
            heap,
            total_bytes_time,
            ..
        } = st;
        let mut any = false;
        pages.record(start, end, ec, &mut |ec, bytes| {
            ec_bytes[ec as usize] += bytes;
            *heap += bytes;
            *total_bytes_time += bytes;
            any = true;
        });
        any
    }

    fn unrecord_pages(&self, st: &mut State, start: Addr, end: Addr) {
        let State {
            pages,
            ec_bytes,
            heap,
            total_bytes_time,
            ..
        } = st;
        pages.unrecord(start, end, &mut |ec, bytes| {
            let b = &mut ec_bytes[ec as usize];
            *b = b.saturating_sub(bytes);
            *heap = heap.saturating_sub(bytes);
            *total_bytes_time += bytes;
        });
    }

    /// The file as it would be written now (also used by `fini`). Builds the heap trees of
    /// the detailed snapshots; may call `Host::describe` for addresses not yet described.
    ///
    /// Returns `None` when the state stays locked for too long (a fatal signal interrupted
    /// a thread inside a Massif handler).
    pub fn massif_file(&self, host: &dyn Host) -> Option<MassifFile> {
        self.build_file(host, false)
    }

    /// `take`: move the snapshots out instead of copying them (at exit, when nothing will
    /// use them again).
    fn build_file(&self, host: &dyn Host, take: bool) -> Option<MassifFile> {
        let mut st = self.state.lock_bounded(1 << 24)?;
        self.apply_logs(host, &mut st);
        self.start(&mut st);
        if st.sched.snaps.is_empty() {
            // --pages-as-heap=yes without a single mapping event: still one snapshot, as
            // Valgrind's startup attempt would give (ms_print needs at least one).
            self.normal_attempt(self.read_clock(host), &mut st);
        }
        let snaps = if take {
            std::mem::take(&mut st.sched.snaps)
        } else {
            st.sched.snaps.clone()
        };
        let frames = st.ec_frames.clone();
        drop(st);

        // ECs in address-sequence order, once for all snapshots.
        let mut order: Vec<usize> = (0..frames.len()).collect();
        order.sort_by(|&a, &b| frames[a].cmp(&frames[b]));
        let root = if self.opts.pages_as_heap {
            PAGES_ROOT_LABEL
        } else {
            HEAP_ROOT_LABEL
        };
        let mut labels = |ip: Addr| self.classifier.labels(host, ip);

        let snapshots = snaps
            .iter()
            .map(|s| {
                // With --heap=no (stacks only) Valgrind keeps no tree: every snapshot, the
                // peak included, is written as empty.
                let detail = s.detail.as_ref().filter(|_| self.opts.heap);
                let tree_root = detail.map(|bytes| {
                    let ecs: Vec<tree::Ec<'_>> = order
                        .iter()
                        .filter(|&&i| i < bytes.len())
                        .map(|&i| tree::Ec {
                            frames: &frames[i],
                            bytes: bytes[i],
                        })
                        .collect();
                    tree::build(
                        &ecs,
                        s.extra,
                        s.stacks,
                        self.opts.threshold,
                        root,
                        &mut labels,
                    )
                });
                Snapshot {
                    time: s.time,
                    mem_heap_b: tree_root.as_ref().map_or(s.heap, |t| t.bytes),
                    mem_heap_extra_b: s.extra,
                    mem_stacks_b: s.stacks,
                    kind: match (s.kind, &tree_root) {
                        (Kind::Peak, Some(_)) => SnapshotKind::Peak,
                        (Kind::Normal, Some(_)) => SnapshotKind::Detailed,
                        (_, None) => SnapshotKind::Empty,
                    },
                    tree: tree_root,
                }
            })
            .collect();
        Some(MassifFile {
            desc: self.opts.desc(),
            cmd: host.command_line().join(" "),
            time_unit: self.opts.time_unit.as_str().to_string(),
            snapshots,
        })
    }
}

impl State {
    fn new(opts: &Options, numbers: Arc<numbers::Numbers>) -> Self {
        State {
            by_stack: EcByStack::default(),
            ec_ids: FxHashMap::default(),
            ec_frames: Vec::new(),
            ec_bytes: Vec::new(),
            heap: 0,
            extra: 0,
            stacks: 0,
            total_bytes_time: 0,
            last_time: 0,
            started: false,
            sched: Scheduler::new(opts.max_snapshots, opts.detailed_freq, opts.peak_inaccuracy)
                .with_interval_floor(match opts.time_unit {
                    // See `Scheduler::with_interval_floor`. With `i`, threads' events
                    // applied after a later reading of another thread's share its time
                    // (times never go backwards), as events within one ms do.
                    TimeUnit::Ms | TimeUnit::Instructions => 1,
                    TimeUnit::Bytes => 0,
                }),
            pages: pages::Pages::default(),
            arena: arena::Arena::new(numbers),
            live_blocks: 0,
            cursors: vec![log::Cursor::default(); log::SLOTS],
        }
    }

    fn intern(&mut self, frames: Vec<Addr>) -> EcId {
        let frames = frames.into_boxed_slice();
        if let Some(&id) = self.ec_ids.get(&frames) {
            return id;
        }
        let id = self.ec_frames.len() as EcId;
        self.ec_frames.push(frames.clone());
        self.ec_ids.insert(frames, id);
        self.ec_bytes.push(0);
        id
    }

    /// `VG_(cli_malloc)` for a new block numbered `word` (0: none) with record `rec`, in
    /// the replayed arena: returns its slop.
    fn arena_alloc(&mut self, align: u64, size: u64, word: u32, rec: arena::Record) -> u64 {
        let sim = self.arena.alloc(align, size, word, rec);
        if word != 0 {
            self.live_blocks += 1;
        }
        self.arena.usable(sim).saturating_sub(size)
    }

    /// Valgrind's `realloc_block` for `old` (`seen`: its allocation was applied): the
    /// block stays where it is when the new size fits in the old usable size (the slop grows
    /// by what the request shrank), else a new block is allocated and the old one freed.
    /// Either way the block is numbered `new.word` from now on, with record `rec`. Returns
    /// the old slop and the new one.
    fn arena_realloc(
        &mut self,
        old: &log::OldBlock,
        seen: bool,
        new: &log::NewBlock,
        align: u64,
        rec: arena::Record,
    ) -> (u64, u64) {
        if !seen {
            let slop = self.arena_alloc(align, new.size, new.word, rec);
            return (old.slop, slop);
        }
        let usable = self.arena.usable(old.word);
        let old_slop = usable.saturating_sub(old.size);
        self.live_blocks -= 1;
        if new.size <= usable {
            self.arena.renumber(old.word, new.word, rec);
            if new.word != 0 {
                self.live_blocks += 1;
            }
            return (old_slop, usable - new.size);
        }
        let slop = self.arena_alloc(align, new.size, new.word, rec);
        self.arena.free(old.word);
        (old_slop, slop)
    }
}

impl Tool for Massif {
    fn name(&self) -> &'static str {
        "massif"
    }

    fn on_start(&self, host: &dyn Host) {
        if self.opts.stacks {
            // Called on the main thread before the engine starts: count its stack from
            // where the process entered, as Valgrind does from the first instruction.
            if let Some(sp) = stacks::initial_stack_pointer() {
                stacks::set_baseline(sp);
            }
        }
        if self.opts.quiet {
            return;
        }
        let mut out = String::new();
        out.push_str(&host.banner(
            "Massif, a heap profiler",
            "Copyright (C) 2003-2017, and GNU GPL'd, by Nicholas Nethercote",
        ));
        host.log(&out);
    }

    fn help(&self) -> &'static str {
        "  user options for Massif:
    --heap=no|yes             profile heap blocks [yes]
    --heap-admin=<size>       average admin bytes per heap block;
                               ignored if --heap=no [8]
    --stacks=no|yes           profile stack(s) [no]
    --pages-as-heap=no|yes    profile memory at the page level [no]
    --depth=<number>          depth of contexts [30]
    --alloc-fn=<name>         specify <name> as an alloc function [empty]
    --ignore-fn=<name>        ignore heap allocations within <name> [empty]
    --threshold=<m.n>         significance threshold, as a percentage [1.0]
    --peak-inaccuracy=<m.n>   maximum peak inaccuracy, as a percentage [1.0]
    --time-unit=i|ms|B        time unit: instructions executed, milliseconds
                              or heap bytes alloc'd/dealloc'd [i]
    --detailed-freq=<N>       every Nth snapshot should be detailed [10]
    --max-snapshots=<N>       maximum number of snapshots recorded [100]
    --massif-out-file=<file>  output file name [massif.out.%p]
"
    }

    fn parse_option(&mut self, arg: &str) -> Result<bool, OptionError> {
        self.opts.parse(arg)
    }

    fn core_options(&mut self, core: &oxgrind_tool::CoreView) {
        self.opts.apply_core(core);
    }

    fn post_options(&mut self) -> Result<(), OptionError> {
        self.opts.check()?;
        let o = &self.opts;
        self.classifier = Classifier::new(&o.alloc_fns, &o.ignore_fns, o.depth, o.show_below_main);
        self.state = SpinLock::new(State::new(&self.opts, self.numbers.clone()));
        Ok(())
    }

    fn needs(&self) -> Needs {
        Needs {
            // Frame 0 (our allocator) + what Valgrind captures: --depth plus room for the
            // alloc-fns that will be filtered.
            stack_depth: 1 + self.opts.depth + options::OVERESTIMATE,
            page_events: self.opts.pages_as_heap,
            // Only `i` needs the translation engine; ms and B run the program natively.
            count_instructions: self.opts.time_unit == TimeUnit::Instructions,
            // --stacks=yes probes every instruction that moves the stack pointer.
            instrument: self.opts.stacks,
            // No free stacks, no freed-block queue, nothing else Memcheck-like.
            ..Needs::default()
        }
    }

    fn on_alloc(&self, host: &dyn Host, ev: &Alloc) -> u32 {
        if !self.heap_events() {
            return 0;
        }
        let clock = self.read_clock(host);
        self.classifier.warm(host, ev.stack);
        let align = self.alignment_of(ev);
        self.log_event(host, ev.tid, log::Slot::ALLOC_SLOTS, true, |to, word| {
            log::Slot::alloc(to, ev, word, align, clock)
        })
    }

    fn on_free(&self, host: &dyn Host, ev: &Free) {
        if !self.heap_events() {
            return;
        }
        let clock = self.read_clock(host);
        self.log_event(host, ev.tid, log::Slot::free_slots(ev), false, |to, _| {
            log::Slot::free(to, ev, clock)
        });
    }

    fn on_realloc(&self, host: &dyn Host, old: &Free, new: &Alloc) -> u32 {
        if !self.heap_events() {
            return 0;
        }
        let clock = self.read_clock(host);
        self.classifier.warm(host, new.stack);
        self.log_event(host, new.tid, log::Slot::REALLOC_SLOTS, true, |to, word| {
            log::Slot::realloc(to, old, new, word, self.opts.alignment, clock)
        })
    }

    fn on_map(&self, host: &dyn Host, ev: &Mapping) {
        if !self.opts.pages_as_heap || ev.len == 0 {
            return;
        }
        let clock = self.read_clock(host);
        let (mut st, ec) = self.ec_of(host, self.state_now(host), ev.stack, true);
        st.started = true;
        let first = ev.addr & !(PAGE - 1);
        let end = ev.addr.saturating_add(ev.len).saturating_add(PAGE - 1) & !(PAGE - 1);
        // Valgrind snapshots once, after the last page of the mapping.
        if ec != IGNORED && self.record_pages(&mut st, first, end, ec) {
            self.normal_attempt(clock, &mut st);
        }
    }

    fn on_unmap(&self, host: &dyn Host, ev: &Mapping) {
        if !self.opts.pages_as_heap || ev.len == 0 {
            return;
        }
        let clock = self.read_clock(host);
        let mut st = self.state_now(host);
        let first = ev.addr & !(PAGE - 1);
        let end = ev.addr.saturating_add(ev.len).saturating_add(PAGE - 1) & !(PAGE - 1);
        // Valgrind: peak check, first page, normal attempt, then the other pages quietly.
        if st.pages.contains(first) {
            self.peak_attempt(clock, &mut st);
            self.unrecord_pages(&mut st, first, first + PAGE);
            self.normal_attempt(clock, &mut st);
        }
        self.unrecord_pages(&mut st, first.saturating_add(PAGE).min(end), end);
    }

    fn instrument(
        &self,
        _pc: Addr,
        block: &[oxgrind_tool::instrument::Insn],
        plan: &mut oxgrind_tool::instrument::Plan,
    ) {
        if self.opts.stacks {
            stacks::instrument(block, plan);
        }
    }

    fn on_pc(&self, host: &dyn Host, regs: &oxgrind_tool::instrument::GuestRegs, data: u64) {
        if !self.opts.stacks {
            return;
        }
        let changes = stacks::at_probe(regs, data);
        if changes.iter().all(|&d| d == 0) {
            return;
        }
        let clock = self.read_clock(host);
        let mut st = self.state_now(host);
        self.start(&mut st);
        for d in changes {
            if d != 0 {
                self.stack_event(clock, &mut st, d);
            }
        }
    }

    fn on_fork_child(&self) {
        // The child keeps the parent's history (as under Valgrind) and writes its own file
        // (`%p` is expanded at exit). A parent thread that held a lock at fork time does not
        // exist in the child.
        // SAFETY: the child runs only the forking thread, which was inside fork(), not in a
        // Massif handler, so it holds no guard of these locks.
        unsafe {
            self.state.force_unlock();
            self.classifier.force_unlock();
        }
        self.logs.retire_after_fork();
    }

    fn fini(&self, host: &dyn Host, exit: Exit) {
        if !self.opts.quiet && !matches!(exit, Exit::Exec) {
            host.log(&format!("=={}== \n", host.pid()));
        }
        if self.finished.swap(true, Ordering::SeqCst) {
            return;
        }
        let Some(file) = self.build_file(host, true) else {
            host.log("massif: the heap state was busy when the program ended; no output written\n");
            return;
        };
        let text = oxgrind_formats::massif::write(&file);
        match host.expand_output_path(&self.opts.out_file) {
            Ok(path) => {
                if host.write_file(&path, text.as_bytes()).is_err() {
                    // Valgrind's words (its xtree writer opens Massif's file), shown with -q.
                    host.log(&format!(
                        "=={}== Error: can not open xtree output file `{path}'\n",
                        host.pid()
                    ));
                }
            }
            Err(e) => host.log(&format!("massif: --massif-out-file: {}\n", e.0)),
        }
    }
}

#[cfg(test)]
mod tests;
