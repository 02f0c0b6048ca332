//! Capturing and interning allocation stacks.
//!
//! A program makes millions of allocations from a few thousand distinct call stacks, so
//! each captured stack is interned once and named by a [`StackId`]. Tools keep ids, not
//! frames. Lookup of an id's frames is lock-free (an append-only table of chunks); interning
//! takes one shard lock chosen by the stack's hash.
//!
//! Frame 0 of every stack is the entry point of the allocation function the program called
//! (our `malloc`, our `operator new`, ...), so reports start `at 0x...: malloc (in ...)` as
//! Valgrind's do; later frames are return addresses minus one (inside the call instruction).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use oxgrind_sys::lock::SpinLock;
use oxgrind_tool::StackId;

use crate::blocks::AddrHasher;

const CHUNK_BITS: u32 = 12;
const CHUNK: usize = 1 << CHUNK_BITS;
const MAX_CHUNKS: usize = 1 << 14; // 67 million distinct stacks
const SHARDS: usize = 16;

type Frames = &'static [u64];

pub struct StackTable {
    chunks: [AtomicPtr<[AtomicPtr<u64>; CHUNK]>; MAX_CHUNKS],
    lens: [AtomicPtr<[AtomicU32; CHUNK]>; MAX_CHUNKS],
    next: AtomicU32,
    shards: [SpinLock<Option<HashMap<u64, Vec<(Frames, StackId)>, BuildHasherDefault<IdHasher>>>>;
        SHARDS],
    /// See [`StackTable::intern`].
    recent: [AtomicU64; RECENT],
    grow: SpinLock<()>,
}

/// Slots of the cache of recently interned stacks (see [`StackTable::intern`]).
const RECENT: usize = 1024;

/// The key is already a hash.
#[derive(Default)]
pub struct IdHasher(u64);
impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u64 keys")
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

fn hash_frames(frames: &[u64]) -> u64 {
    let mut h = AddrHasher::default();
    for &f in frames {
        h.write_u64(f);
    }
    h.write_u64(frames.len() as u64);
    h.finish()
}

impl StackTable {
    pub const fn new() -> Self {
        #[allow(clippy::declare_interior_mutable_const)]
        const NULL_CHUNK: AtomicPtr<[AtomicPtr<u64>; CHUNK]> =
            AtomicPtr::new(core::ptr::null_mut());
        #[allow(clippy::declare_interior_mutable_const)]
        const NULL_LENS: AtomicPtr<[AtomicU32; CHUNK]> = AtomicPtr::new(core::ptr::null_mut());
        #[allow(clippy::declare_interior_mutable_const)]
        const SHARD: SpinLock<
            Option<HashMap<u64, Vec<(Frames, StackId)>, BuildHasherDefault<IdHasher>>>,
        > = SpinLock::new(None);
        StackTable {
            chunks: [NULL_CHUNK; MAX_CHUNKS],
            lens: [NULL_LENS; MAX_CHUNKS],
            next: AtomicU32::new(0),
            shards: [SHARD; SHARDS],
            recent: [const { AtomicU64::new(0) }; RECENT],
            grow: SpinLock::new(()),
        }
    }

    /// The id of `frames`, interning them on first sight.
    ///
    /// A program allocates from a few thousand stacks again and again, so a small
    /// direct-mapped cache is looked at first, with no lock and no thread-local access
    /// (which costs a call into the dynamic loader from a shared library, and more under the
    /// translation engine). A slot is one atomic word, the hash's high half and the id, so
    /// racing writers leave one whole entry or the other; a hit is confirmed against the
    /// published frames of the id it names, which never change. Only a miss takes a shard
    /// lock.
    #[inline]
    pub fn intern(&self, frames: &[u64]) -> StackId {
        self.intern_hashed(frames, hash_frames(frames))
    }

    /// [`StackTable::intern`] of frames whose [`hash_frames`] is `h`.
    #[inline]
    fn intern_hashed(&self, frames: &[u64], h: u64) -> StackId {
        let slot = &self.recent[(h as usize) % RECENT];
        let tag = h & !0xffff_ffff;
        let word = slot.load(Ordering::Relaxed);
        // Ids are stored plus one: 0 is an empty slot.
        if word & !0xffff_ffff == tag && word as u32 != 0 {
            let id = StackId(word as u32 - 1);
            if self.frames(id) == frames {
                return id;
            }
        }
        let id = self.intern_locked(h, frames);
        slot.store(tag | id.0.wrapping_add(1) as u64, Ordering::Relaxed);
        id
    }

    fn intern_locked(&self, h: u64, frames: &[u64]) -> StackId {
        let mut shard = self.shards[(h as usize) % SHARDS].lock();
        let map = shard.get_or_insert_with(HashMap::default);
        let bucket = map.entry(h).or_default();
        if let Some(&(_, id)) = bucket.iter().find(|(f, _)| *f == frames) {
            return id;
        }
        let stored: Frames = Box::leak(frames.to_vec().into_boxed_slice());
        let id = self.publish(stored);
        bucket.push((stored, id));
        id
    }

    fn publish(&self, frames: Frames) -> StackId {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (ci, slot) = ((id >> CHUNK_BITS) as usize, id as usize & (CHUNK - 1));
        assert!(
            ci < MAX_CHUNKS,
            "oxgrind: more than 67 million distinct stacks"
        );
        if self.chunks[ci].load(Ordering::Acquire).is_null() {
            let _g = self.grow.lock();
            if self.chunks[ci].load(Ordering::Acquire).is_null() {
                let lens: Box<[AtomicU32; CHUNK]> =
                    Box::new(std::array::from_fn(|_| AtomicU32::new(0)));
                self.lens[ci].store(Box::into_raw(lens), Ordering::Release);
                let c: Box<[AtomicPtr<u64>; CHUNK]> = Box::new(std::array::from_fn(|_| {
                    AtomicPtr::new(core::ptr::null_mut())
                }));
                self.chunks[ci].store(Box::into_raw(c), Ordering::Release);
            }
        }
        // SAFETY: chunk pointers are published once (under `grow`) and never freed.
        unsafe {
            (*self.lens[ci].load(Ordering::Acquire))[slot]
                .store(frames.len() as u32, Ordering::Relaxed);
            (*self.chunks[ci].load(Ordering::Acquire))[slot]
                .store(frames.as_ptr() as *mut u64, Ordering::Release);
        }
        StackId(id)
    }

    /// How many stacks have ids (ids are dense from 0; a stack being interned may not be
    /// published yet: [`StackTable::frames`] is then empty).
    pub fn count(&self) -> u32 {
        self.next.load(Ordering::Acquire)
    }

    /// The frames of `id` (empty for an id not yet published).
    pub fn frames(&self, id: StackId) -> &'static [u64] {
        let (ci, slot) = ((id.0 >> CHUNK_BITS) as usize, id.0 as usize & (CHUNK - 1));
        if ci >= MAX_CHUNKS {
            return &[];
        }
        let chunk = self.chunks[ci].load(Ordering::Acquire);
        if chunk.is_null() {
            return &[];
        }
        // SAFETY: chunk and lens tables are never freed; a slot's pointer is stored with
        // Release after its length, and points to a leaked (immortal) slice of that length.
        unsafe {
            let p = (*chunk)[slot].load(Ordering::Acquire);
            if p.is_null() {
                return &[];
            }
            let len = (*self.lens[ci].load(Ordering::Acquire))[slot].load(Ordering::Relaxed);
            core::slice::from_raw_parts(p, len as usize)
        }
    }

    /// # Safety
    /// Only in a single-threaded child right after `fork`.
    pub unsafe fn force_unlock_all(&self) {
        for s in &self.shards {
            // SAFETY: forwarded.
            unsafe { s.force_unlock() };
        }
        // SAFETY: forwarded.
        unsafe { self.grow.force_unlock() };
    }
}

impl Default for StackTable {
    fn default() -> Self {
        Self::new()
    }
}

/// The runtime's own text range: unwinding skips frames inside it. Read on every capture,
/// written once at set-up, so two relaxed atomics rather than a lock.
static SELF_TEXT_START: AtomicU64 = AtomicU64::new(0);
static SELF_TEXT_END: AtomicU64 = AtomicU64::new(0);
static SELF_PATH: SpinLock<String> = SpinLock::new(String::new());

/// Finds the address range and path of our own library in /proc/self/maps.
pub fn find_self_text() {
    let here = find_self_text as *const () as usize as u64;
    let maps = crate::roots::read_maps();
    let Some(m) = maps.iter().find(|m| m.start <= here && here < m.end) else {
        return;
    };
    let path = m.path.clone();
    let (lo, hi) = maps
        .iter()
        .filter(|x| x.path == path)
        .fold((u64::MAX, 0), |(lo, hi), x| {
            (lo.min(x.start), hi.max(x.end))
        });
    SELF_TEXT_START.store(lo, Ordering::Relaxed);
    SELF_TEXT_END.store(hi, Ordering::Relaxed);
    *SELF_PATH.lock() = path;
}

/// The address range of our own library (all its mappings).
pub fn self_text() -> (u64, u64) {
    (
        SELF_TEXT_START.load(Ordering::Relaxed),
        SELF_TEXT_END.load(Ordering::Relaxed),
    )
}

/// Path of our own library, as the kernel names it.
pub fn self_path() -> String {
    SELF_PATH.lock().clone()
}

/// The program's registers where it called one of our entry points, read by the entry
/// point itself before any code of ours ran (`hooks::pass_caller`): `sp` is the stack
/// pointer at our entry (the return address is at `sp`), `bp` the caller's frame pointer.
/// `sp == 0`: not known.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub sp: u64,
    pub bp: u64,
}

impl Caller {
    pub const UNKNOWN: Caller = Caller { sp: 0, bp: 0 };
}

/// Captures the current call stack for an allocation made through `entry` (the address of
/// the interposed function the program called), up to `depth` frames, and interns it.
///
/// The walk starts, best first: at `caller`, the program's registers at the call (no frame
/// of ours is walked); at the program's registers where a translated hook called out of the
/// code cache; else here, dropping every frame inside the runtime.
#[inline]
pub fn capture(table: &StackTable, entry: u64, caller: Caller, depth: usize) -> StackId {
    const MAX: usize = 256;
    let depth = depth.clamp(1, MAX);
    // A call from the program's registers: first the thread's cache of recent walks.
    let mut recorder = None;
    if caller.sp != 0 {
        // SAFETY: `caller.sp` is the stack pointer at our entry point's first instruction,
        // on the calling thread's stack, which is live below this frame: its word is the
        // return address the call pushed.
        let ra = unsafe { core::ptr::read(caller.sp as *const u64) };
        let key = WalkKey {
            regs: oxgrind_symbols::Regs {
                pc: ra,
                sp: caller.sp.wrapping_add(8),
                bp: caller.bp,
            },
            entry,
            depth: depth as u64,
            generation: oxgrind_symbols::rules_generation(),
        };
        if let Some(id) = walk_cache_lookup(&key) {
            return id;
        }
        recorder = Some(Recorder::new(key));
    }
    // Not zeroed: clearing 2 KiB per allocation was a tenth of Massif's time. Only the
    // prefix the unwinder writes is read.
    let mut buf = [MaybeUninit::<u64>::uninit(); MAX];
    buf[0] = MaybeUninit::new(entry);
    let range = (
        SELF_TEXT_START.load(Ordering::Relaxed),
        SELF_TEXT_END.load(Ordering::Relaxed),
    );
    // SAFETY: MaybeUninit<u64> and u64 have the same layout; the unwinder only writes.
    let out = unsafe { &mut *(&mut buf[1..depth] as *mut [MaybeUninit<u64>] as *mut [u64]) };
    let n = if let Some(r) = &mut recorder {
        let regs = r.key.regs;
        oxgrind_symbols::capture_from_call_logged(regs, out, range, r)
    } else {
        // Run natively on the engine stack (`host::native`), the walk starts from the
        // program's registers where the hook called out of the code cache, not from here.
        match oxgrind_engine::guest_regs_in_tool_call() {
            Some(r) => {
                let regs = oxgrind_symbols::Regs {
                    pc: r.rip,
                    sp: r.gpr[4],
                    bp: r.gpr[5],
                };
                oxgrind_symbols::capture_from(regs, out, range)
            }
            None => oxgrind_symbols_capture(out, range),
        }
    };
    // Return addresses become addresses inside the call, hashed in the same pass.
    let mut h = AddrHasher::default();
    h.write_u64(entry);
    for ra in &mut out[..n] {
        *ra = ra.wrapping_sub(1);
        h.write_u64(*ra);
    }
    h.write_u64(1 + n as u64);
    // SAFETY: buf[0] and the n frames after it were written above.
    let frames = unsafe { &*(&buf[..1 + n] as *const [MaybeUninit<u64>] as *const [u64]) };
    debug_assert_eq!(h.finish(), hash_frames(frames));
    let id = table.intern_hashed(frames, h.finish());
    if let Some(r) = &recorder {
        r.keep(id);
    }
    id
}

// ---------------------------------------------------------------------------------------
// The per-thread cache of recent walks.

/// Reads a cached walk may hold (return addresses, and saved frame pointers that a rule
/// used): walks that read more are not cached.
const WALK_READS: usize = 20;
/// Sets of the cache, each of [`WALK_WAYS`] entries, chosen by call site and stack pointer.
///
/// Sized for a program's hot allocation contexts, not its call sites: one site is reached
/// at several depths and from several callers (sqlite3's: 4-way sets hold them, where
/// 2-way ones thrashed on some). With 12 two-way sets, which walks collided depended on
/// where ASLR put the stack and the libraries: sqlite3 3,000 rows under Memcheck hit 22.8 k
/// to 31.8 k of its 33.5 k lookups from one run to the next (a miss re-walks, ~1,200
/// instructions); with 32 four-way sets, 32.05 k to 32.11 k in every run.
const WALK_SETS: usize = 32;
const WALK_WAYS: usize = 4;

/// A walk made from a call into one of our entry points, and the stack it gave.
///
/// A program allocates again and again from the same call sites at the same depths (a
/// loop's `malloc`), and most of a capture's cost was walking those same frames again. A
/// walk is a function of its registers, the words it reads and the unwind rules
/// (`oxgrind_symbols::WalkLog`): so when a call comes from the same return address and stack
/// pointer (and frame pointer, if the walk used it), with the rules unchanged, and every
/// word the walk read still holds the value it read, the walk would give the same frames,
/// and its interned id is the answer. Checking is one load and compare per word read,
/// where walking costs a rule lookup, a hash and a table compare per frame. Exact: a word
/// that changed (a different caller at the same depth wrote its own return address there)
/// makes it a miss.
#[repr(C)]
struct CachedWalk {
    /// The return address at the call; 0: an empty entry (a call's is never 0).
    pc: u64,
    sp: u64,
    bp: u64,
    entry: u64,
    depth: u64,
    generation: u64,
    id: u32,
    reads: u8,
    bp_used: bool,
    /// In a set's first entry: the way the next walk kept in the set replaces (in turn).
    victim: u8,
    /// Each word read: its offset from `sp`, and the value read.
    offset: [i32; WALK_READS],
    value: [u64; WALK_READS],
}

/// A thread's cache: a cache line per way's start, as the sets are read one at a time.
#[repr(C, align(64))]
struct WalkCache([[CachedWalk; WALK_WAYS]; WALK_SETS]);

extern "C" {
    /// This thread's slot for the address of its [`WalkCache`] (null until its first
    /// capture), initial-exec (`shim.c`).
    fn oxg_walk_cache_slot() -> *mut *mut WalkCache;
}

/// Every walk cache made, with the thread it is lent to: the cache of a thread that is
/// gone is lent to the next thread that needs one, so a program that runs thread after
/// thread holds about as many caches as it has threads at once. Locked only at a thread's
/// first capture (and after a fork).
static WALK_CACHES: SpinLock<WalkCaches> = SpinLock::new(WalkCaches {
    lent: Vec::new(),
    next: 0,
});

struct WalkCaches {
    /// (thread id, cache address).
    lent: Vec<(i32, usize)>,
    /// Where the next search for a gone thread's cache starts.
    next: usize,
}

/// How many lent caches a thread's first capture looks at for one whose thread is gone:
/// bounded, so that a first capture stays cheap; the search goes on from there next time.
const WALK_CACHE_SEARCH: usize = 8;

/// The calling thread's walk cache, made (or taken over from a thread that is gone) at
/// its first capture.
#[inline]
fn this_thread_cache() -> *mut WalkCache {
    // SAFETY: the slot is this thread's, holding null or the cache lent to it.
    let slot = unsafe { oxg_walk_cache_slot() };
    // SAFETY: as above.
    let cache = unsafe { *slot };
    if !cache.is_null() {
        return cache;
    }
    let cache = lend_walk_cache();
    // SAFETY: as above; only this thread writes its slot.
    unsafe { *slot = cache };
    cache
}

#[cold]
fn lend_walk_cache() -> *mut WalkCache {
    let (pid, tid) = (oxgrind_sys::raw::getpid(), oxgrind_sys::raw::gettid());
    let mut caches = WALK_CACHES.lock();
    let n = caches.lent.len();
    for k in 0..n.min(WALK_CACHE_SEARCH) {
        let i = (caches.next + k) % n;
        let (owner, addr) = caches.lent[i];
        // `tgkill(.., 0)` fails with ESRCH only once the thread has left for good (a
        // recycled id reads as alive: that cache is only lent again later).
        if owner != tid && matches!(oxgrind_sys::raw::tgkill(pid, owner, 0), Err(3)) {
            caches.lent[i].0 = tid;
            caches.next = (i + 1) % n;
            let cache = addr as *mut WalkCache;
            // SAFETY: the cache's thread is gone, nobody else was lent it, and all-zero
            // bytes are a valid WalkCache (every entry empty).
            unsafe { core::ptr::write_bytes(cache, 0, 1) };
            return cache;
        }
    }
    if n > 0 {
        caches.next = (caches.next + WALK_CACHE_SEARCH) % n;
    }
    // SAFETY: all-zero bytes are a valid WalkCache (every entry empty).
    let cache = Box::into_raw(unsafe { Box::<WalkCache>::new_zeroed().assume_init() });
    caches.lent.push((tid, cache as usize));
    cache
}

/// In the child of a fork: the forking thread, the only one left, has a new thread id;
/// the other threads' caches are free to lend (their ids are no thread of this process).
///
/// # Safety
/// Single-threaded child right after fork.
pub unsafe fn walk_caches_after_fork_child() {
    // SAFETY: forwarded; a thread of the parent may have held the lock.
    unsafe { WALK_CACHES.force_unlock() };
    // SAFETY: this thread's slot, holding null or its cache.
    let mine = unsafe { *oxg_walk_cache_slot() } as usize;
    let tid = oxgrind_sys::raw::gettid();
    for entry in WALK_CACHES.lock().lent.iter_mut() {
        if entry.1 == mine {
            entry.0 = tid;
        }
    }
}

/// Where the calling thread keeps its walk cache's address, as `[start, end)`: not a root
/// of the program's heap (the cache itself is in the runtime's heap, which is none).
pub fn walk_cache_range() -> (u64, u64) {
    // SAFETY: only the address of this thread's slot is taken.
    let start = unsafe { oxg_walk_cache_slot() } as u64;
    (start, start + 8)
}

/// What a cached walk must match besides its reads.
#[derive(Clone, Copy)]
struct WalkKey {
    regs: oxgrind_symbols::Regs,
    entry: u64,
    depth: u64,
    generation: u64,
}

/// The calling thread's set of entries for a walk from `regs`.
///
/// # Safety
/// The reference must not outlive the calling code's use of it, nor overlap another one to
/// the same thread's cache: only [`capture`] takes it, which never runs nested on a thread
/// (its callers run inside an event, behind the hooks' re-entrancy flag, and signal handlers
/// capture through [`capture_at`]).
#[inline]
unsafe fn walk_set(regs: &oxgrind_symbols::Regs) -> &'static mut [CachedWalk; WALK_WAYS] {
    let h = (regs.pc ^ regs.sp.rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // The high half scaled to [0, WALK_SETS): no division.
    let i = (((h >> 32) * WALK_SETS as u64) >> 32) as usize;
    // SAFETY: the cache is lent to this thread alone; the caller's contract keeps the
    // reference unique.
    unsafe { &mut (*this_thread_cache()).0[i] }
}

/// The id of the stack a cached walk from `key` gave, if that walk would give it again.
/// Several ways of the set may hold a walk from the same registers (one call site reached
/// through two callers at the same depth); whichever's reads still hold is the answer.
#[inline]
fn walk_cache_lookup(key: &WalkKey) -> Option<StackId> {
    // SAFETY: see `walk_set`; dropped before this returns.
    let set = unsafe { walk_set(&key.regs) };
    set.iter()
        .find(|e| e.pc == key.regs.pc && walk_holds(e, key))
        .map(|e| StackId(e.id))
}

/// Whether cached walk `e`, made from the return address of `key`, would be made again.
#[inline]
fn walk_holds(e: &CachedWalk, key: &WalkKey) -> bool {
    if e.sp != key.regs.sp
        || e.entry != key.entry
        || e.depth != key.depth
        || e.generation != key.generation
        || (e.bp_used && e.bp != key.regs.bp)
    {
        return false;
    }
    let sp = key.regs.sp;
    let n = (e.reads as usize).min(WALK_READS);
    for i in 0..n {
        let addr = sp.wrapping_add(e.offset[i] as i64 as u64);
        // SAFETY: the walk read `addr` when this thread's stack pointer was `sp`, as now,
        // inside the stack mapping that holds `sp` (its reads are bounds-checked, and a
        // walk that crossed to another stack, through a signal frame, is not cached), and
        // a thread's stack stays mapped while the thread runs on it: the unwinder's own
        // per-thread bounds rest on the same (a stack pointer inside the bounds last seen
        // is on that stack). 8-aligned, as the walk read it.
        if unsafe { core::ptr::read(addr as *const u64) } != e.value[i] {
            return false;
        }
    }
    true
}

/// Records a walk's reads as it goes (`oxgrind_symbols::WalkLog`), into a buffer of its own;
/// [`Recorder::keep`] then stores the walk in the thread's cache if it can be reused.
struct Recorder {
    key: WalkKey,
    offset: [i32; WALK_READS],
    value: [MaybeUninit<u64>; WALK_READS],
    reads: usize,
    bp_used: bool,
    repeatable: bool,
}

impl Recorder {
    #[inline]
    fn new(key: WalkKey) -> Recorder {
        Recorder {
            key,
            offset: [0; WALK_READS],
            value: [MaybeUninit::uninit(); WALK_READS],
            reads: 0,
            bp_used: false,
            repeatable: true,
        }
    }

    /// Stores the walk (whose stack was interned as `id`) in the thread's cache, if a hit
    /// could be told from its reads, in place of the way of its set kept longest ago.
    #[inline]
    fn keep(&self, id: StackId) {
        let n = self.reads;
        if !self.repeatable || n > WALK_READS {
            return;
        }
        // SAFETY: see `walk_set`; dropped before this returns.
        let set = unsafe { walk_set(&self.key.regs) };
        let way = set[0].victim as usize % WALK_WAYS;
        set[0].victim = ((way + 1) % WALK_WAYS) as u8;
        let e = &mut set[way];
        e.offset[..n].copy_from_slice(&self.offset[..n]);
        for (v, r) in e.value[..n].iter_mut().zip(&self.value[..n]) {
            // SAFETY: the first `reads` values were written by `read`.
            *v = unsafe { r.assume_init() };
        }
        e.reads = n as u8;
        e.bp_used = self.bp_used;
        e.bp = self.key.regs.bp;
        e.sp = self.key.regs.sp;
        e.entry = self.key.entry;
        e.depth = self.key.depth;
        e.generation = self.key.generation;
        e.id = id.0;
        e.pc = self.key.regs.pc;
    }
}

impl oxgrind_symbols::WalkLog for Recorder {
    #[inline(always)]
    fn read(&mut self, addr: u64, value: u64) {
        let Ok(off) = i32::try_from(addr.wrapping_sub(self.key.regs.sp) as i64) else {
            self.repeatable = false;
            return;
        };
        if self.reads < WALK_READS {
            self.offset[self.reads] = off;
            self.value[self.reads] = MaybeUninit::new(value);
        }
        self.reads += 1;
    }

    #[inline(always)]
    fn initial_bp_used(&mut self) {
        self.bp_used = true;
    }

    #[inline(always)]
    fn unrepeatable(&mut self) {
        self.repeatable = false;
    }
}

/// The stack of an interrupted thread, from the general registers a signal handler finds in
/// its `ucontext` (`gregs`: the 23 saved registers): frame 0 is the interrupted instruction
/// itself, then return addresses minus one, as [`capture`] gives them.
pub fn capture_at(table: &StackTable, gregs: &[u64; 23], depth: usize) -> StackId {
    let (pc, sp, bp) = (gregs[16], gregs[15], gregs[10]);
    match oxgrind_engine::guest_regs_in_tool_call() {
        Some(guest) => capture_native_then_guest(table, (pc, sp, bp), guest, depth),
        None => capture_regs(table, pc, sp, bp, depth),
    }
}

/// The stack of a thread stopped in code we run natively under the engine (glibc's
/// allocator called from a hook, `host::native`): its native frames up to the first of
/// ours, then the program's frames from where the hook left the code cache. Walked on
/// from there, the native stack is the engine's own (its stack, then the code cache).
fn capture_native_then_guest(
    table: &StackTable,
    (pc, sp, bp): (u64, u64, u64),
    guest: oxgrind_tool::instrument::GuestRegs,
    depth: usize,
) -> StackId {
    const MAX: usize = 256;
    let mut buf = [0u64; MAX];
    let depth = depth.clamp(1, MAX);
    let own = (
        SELF_TEXT_START.load(Ordering::Relaxed),
        SELF_TEXT_END.load(Ordering::Relaxed),
    );
    let ours = |a: u64| own.0 <= a && a < own.1;
    let n = oxgrind_symbols::capture_from(
        oxgrind_symbols::Regs { pc, sp, bp },
        &mut buf[..depth],
        (0, 0),
    );
    for ra in buf.iter_mut().take(n).skip(1) {
        *ra = ra.wrapping_sub(1);
    }
    let native = buf[..n].iter().position(|&a| ours(a)).unwrap_or(n);
    let regs = oxgrind_symbols::Regs {
        pc: guest.rip,
        sp: guest.gpr[4],
        bp: guest.gpr[5],
    };
    let m = oxgrind_symbols::capture_from(regs, &mut buf[native..depth], own);
    for ra in &mut buf[native..native + m] {
        *ra = ra.wrapping_sub(1);
    }
    table.intern(&buf[..(native + m).max(1)])
}

/// The stack of a thread stopped at `pc` with stack pointer `sp` and frame pointer `bp`
/// (a signal context, or the guest state at an engine probe): frame 0 is `pc` itself.
pub fn capture_regs(table: &StackTable, pc: u64, sp: u64, bp: u64, depth: usize) -> StackId {
    const MAX: usize = 256;
    let mut buf = [MaybeUninit::<u64>::uninit(); MAX];
    let depth = depth.clamp(1, MAX);
    let regs = oxgrind_symbols::Regs { pc, sp, bp };
    // SAFETY: MaybeUninit<u64> and u64 have the same layout; the unwinder only writes.
    let out = unsafe { &mut *(&mut buf[..depth] as *mut [MaybeUninit<u64>] as *mut [u64]) };
    let n = oxgrind_symbols::capture_from(regs, out, (0, 0));
    for ra in out.iter_mut().take(n).skip(1) {
        *ra = ra.wrapping_sub(1);
    }
    table.intern(&out[..n.max(1)])
}

/// Return addresses above the runtime's own frames (see `oxgrind-symbols`).
#[inline]
fn oxgrind_symbols_capture(out: &mut [u64], skip: (u64, u64)) -> usize {
    oxgrind_symbols::capture(out, skip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_gives_one_id_per_distinct_stack() {
        let t = Box::new(StackTable::new());
        let a = t.intern(&[1, 2, 3]);
        let b = t.intern(&[1, 2, 4]);
        let c = t.intern(&[1, 2, 3]);
        assert_eq!(a, c);
        assert_ne!(a, b);
        assert_eq!(t.frames(b), &[1, 2, 4]);
        let ids: Vec<_> = (0..10_000u64).map(|i| t.intern(&[i, i + 1])).collect();
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(t.frames(*id), &[i as u64, i as u64 + 1]);
        }
    }
}

extern "C" {
    /// This thread's block for the unwinder's state: 32 bytes, zeroed when the thread
    /// starts, aligned to 16, initial-exec (`shim.c`).
    fn oxg_unwind_block_addr() -> *mut u8;
}

const _: () = assert!(oxgrind_symbols::THREAD_SLOTS_BYTES <= 32);

/// Gives the unwinder its per-thread state in our initial-exec block (see
/// `oxgrind_symbols::set_thread_slots`): a capture then makes no call into the loader.
pub fn give_unwinder_thread_slots() {
    oxgrind_symbols::set_thread_slots(oxg_unwind_block_addr);
}
