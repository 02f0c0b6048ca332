//! The runtime's private heap: oxgrind's own data never lives in the program's heap.
//!
//! Using the program's `malloc` from inside our `malloc` hook would recurse, would perturb the
//! very heap being measured, and would deadlock in a signal handler that interrupted `malloc`.
//! This is a deliberately simple allocator: power-of-two size classes from 16 bytes to
//! 64 KiB; anything larger is its own mapping. Memory of small classes is recycled, never
//! returned to the kernel: oxgrind's metadata grows with the program and is gone at exit
//! anyway.
//!
//! **Arenas.** The tools allocate on the program's threads, at every heap event (DHAT a
//! histogram per block, hash tables growing), so a free list per class for the whole
//! process was a process-wide lock per allocation: on four allocating threads its lines went
//! from core to core at every event, and objects of different threads shared cache lines.
//! So each class has one free list and one bump region per arena ([`ARENAS`]), each behind
//! its own lock; a thread keeps to its own arena ([`arena_of`]: threads get arenas in turn),
//! and takes another only when its own is busy (a nested allocation, or two threads sharing
//! one). A freed object joins the free list of the freeing thread's arena; a thread whose
//! list and bump region are empty takes another arena's whole list before it cuts a new
//! slab (so memory one thread frees for another is reused: `PrivateHeap::steal`). Bump
//! regions are 64 KiB slabs cut from 1 MiB `mmap` chunks under one more lock, taken once per slab. A
//! class-`c` object is carved at a multiple of `c` inside a slab aligned to 64 KiB, so any
//! alignment up to the class size holds without headers.
//!
//! **The reserve.** A program may lower its own limits (`setrlimit(RLIMIT_AS)`,
//! `RLIMIT_DATA`) and then use every byte they leave, so a mapping we ask for later can
//! fail. [`take_reserve`] maps one region at start-up, before the program runs; chunks come
//! from it first (its address space is already counted, so our growth does not eat the
//! program's budget), then from new mappings. Its last [`EMERGENCY`] bytes are kept for when
//! a new mapping fails. The hook set with [`set_exhausted_hook`] hears of it twice: when the
//! first block is served from there ([`Exhaustion::Entered`]: the runtime then refuses the
//! program's own allocations, as its limit would, until [`try_recover`] finds room again),
//! and when half of it is gone ([`Exhaustion::HalfGone`]: the runtime writes the report and
//! ends the process with one clear line). Only when all of it is gone does the heap give up,
//! with one line and exit status 1, never the standard library's "memory allocation failed"
//! abort.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr;
use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use crate::raw;

const MIN_SHIFT: usize = 4; // 16 bytes
const MAX_SHIFT: usize = 16; // 64 KiB
const CLASSES: usize = MAX_SHIFT - MIN_SHIFT + 1;
const CHUNK: usize = 1 << 20;
const CHUNK_ALIGN: usize = 1 << MAX_SHIFT;
/// What an arena's class takes from the shared chunk at a time: one object of the largest
/// class, and aligned as it needs.
const SLAB: usize = 1 << MAX_SHIFT;
const PAGE: usize = 4096;
/// Arenas of the small classes (see the module doc).
pub const ARENAS: usize = 16;

struct Class {
    free: *mut FreeNode,
    bump: usize,
    end: usize,
}

struct FreeNode {
    next: *mut FreeNode,
}

// SAFETY: the raw pointers refer to memory owned by the heap and are only followed while the
// class lock is held.
unsafe impl Send for Class {}

/// The allocator. `const`-constructible so it can be a `#[global_allocator]` static.
///
/// Each class lock records its holder (see [`thread_identity`]): under the translation
/// engine this heap's own code runs translated, and a thread holding a class lock can land
/// in the engine (an untranslated block, a system call) whose translator allocates from the
/// same class. Spinning there would wait for ever on itself; instead such a nested
/// allocation gets a mapping of its own.
pub struct PrivateHeap {
    arenas: [Arena; ARENAS],
    /// Where slabs are cut from: the current chunk, `bump..end`.
    chunk: OwnedLock<(usize, usize)>,
    /// The locks [`hold_for_fork`] took: per arena, a mask of classes.
    held: [AtomicU32; ARENAS],
    held_chunk: core::sync::atomic::AtomicBool,
}

/// One arena's classes, on cache lines of their own (128 bytes: the spatial prefetcher
/// pulls lines in pairs).
#[repr(align(128))]
struct Arena([OwnedLock<Class>; CLASSES]);

/// Identities of threads that have an arena (see [`arena_of`]): the thread's identity with
/// its arena in the top byte (user-space addresses leave it zero); 0 is an empty slot.
static ARENA_OF: [AtomicUsize; ARENA_IDS] = [const { AtomicUsize::new(0) }; ARENA_IDS];
const ARENA_IDS: usize = 1024;
/// Slots [`arena_of`] looks at before it falls back to a hash of the identity.
const ARENA_PROBES: usize = 16;
/// The next arena to give out.
static NEXT_ARENA: AtomicUsize = AtomicUsize::new(0);

/// The arena of thread `me` (a [`thread_identity`]): given in turn at its first allocation
/// and remembered by identity, so that the first [`ARENAS`] threads never share one
/// (a hash of the identity alone made two of four threads share one about a third of the
/// time). One load of a line that is only written when a thread first allocates. When the
/// table is full (thousands of threads came and went), a hash of the identity.
#[inline]
fn arena_of(me: usize) -> usize {
    const SHIFT: u32 = 56;
    let h = me.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    for k in 0..ARENA_PROBES {
        let slot = &ARENA_OF[(h + k) % ARENA_IDS];
        let mut w = slot.load(Ordering::Acquire);
        if w == 0 {
            let a = NEXT_ARENA.fetch_add(1, Ordering::Relaxed) % ARENAS;
            match slot.compare_exchange(0, me | a << SHIFT, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return a,
                Err(now) => w = now,
            }
        }
        if w & ((1 << SHIFT) - 1) == me {
            return w >> SHIFT;
        }
    }
    h % ARENAS
}

/// Identifies the calling thread cheaply: the x86-64 TLS ABI keeps the thread pointer at
/// `fs:0` (the same value whether the thread runs natively, translated, or in the engine).
#[inline]
fn thread_identity() -> usize {
    let v: usize;
    // SAFETY: every thread of a process with glibc TLS has a thread control block at fs:0
    // whose first word points to itself; the load has no other effect.
    unsafe {
        core::arch::asm!("mov {}, fs:[0]", out(reg) v, options(nostack, readonly, preserves_flags));
    }
    v
}

/// A spin lock whose word is its holder's [`thread_identity`] (0: free), so that "this
/// thread holds it already" is known atomically with taking it: under the translation
/// engine a holder can be anywhere in its critical section (an untranslated block right
/// after the compare-exchange) when the engine, on the same thread, asks for it again.
struct OwnedLock<T> {
    owner: AtomicUsize,
    value: core::cell::UnsafeCell<T>,
}

// SAFETY: access to `value` is serialised by `owner` (acquire on lock, release on unlock).
unsafe impl<T: Send> Sync for OwnedLock<T> {}

struct OwnedGuard<'a, T> {
    lock: &'a OwnedLock<T>,
}

impl<T> OwnedLock<T> {
    const fn new(value: T) -> Self {
        OwnedLock {
            owner: AtomicUsize::new(0),
            value: core::cell::UnsafeCell::new(value),
        }
    }

    /// Takes the lock for thread `me`; `None` when `me` holds it already.
    fn lock(&self, me: usize) -> Option<OwnedGuard<'_, T>> {
        let mut spins = 0u32;
        loop {
            match self
                .owner
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Some(OwnedGuard { lock: self }),
                Err(cur) if cur == me => return None,
                Err(_) => {
                    spins += 1;
                    if spins % 64 == 0 {
                        raw::sched_yield();
                    } else {
                        core::hint::spin_loop();
                    }
                }
            }
        }
    }

    /// # Safety
    /// Only to release what a `forget`ten guard held (fork handling).
    unsafe fn force_unlock(&self) {
        self.owner.store(0, Ordering::Release);
    }
}

impl<T> core::ops::Deref for OwnedGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves this thread holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> core::ops::DerefMut for OwnedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves this thread holds the lock, exclusively.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for OwnedGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.owner.store(0, Ordering::Release);
    }
}

impl PrivateHeap {
    pub const fn new() -> Self {
        #[allow(clippy::declare_interior_mutable_const)]
        const EMPTY: OwnedLock<Class> = OwnedLock::new(Class {
            free: ptr::null_mut(),
            bump: 0,
            end: 0,
        });
        #[allow(clippy::declare_interior_mutable_const)]
        const ARENA: Arena = Arena([EMPTY; CLASSES]);
        PrivateHeap {
            arenas: [ARENA; ARENAS],
            chunk: OwnedLock::new((0, 0)),
            held: [const { AtomicU32::new(0) }; ARENAS],
            held_chunk: core::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Locks class `ci` for thread `me` in its own arena, else in the first other one that
    /// is free at once; when every arena is busy, waits for its own. `None` when `me` holds
    /// its own arena's already and no other was free (a nested call).
    #[inline]
    fn lock_class(&self, ci: usize, me: usize) -> Option<OwnedGuard<'_, Class>> {
        let home = arena_of(me);
        for k in 0..ARENAS {
            let lock = &self.arenas[(home + k) % ARENAS].0[ci];
            if lock
                .owner
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Some(OwnedGuard { lock });
            }
        }
        self.arenas[home].0[ci].lock(me)
    }

    /// Takes the whole free list of class `ci` from another arena than `mine` whose lock
    /// is free at once (null: none had one). Asked only when the calling thread's own list
    /// and bump region are empty, before a new slab is cut: a freed object joins the
    /// freeing thread's arena, so where one thread allocates and another frees (a tool's
    /// per-block data on a producer-consumer program, Massif's log chunks) the freeing
    /// thread's list would otherwise grow for ever while the allocating one cuts new slabs.
    fn steal(&self, ci: usize, me: usize, mine: &OwnedLock<Class>) -> *mut FreeNode {
        for arena in &self.arenas {
            let lock = &arena.0[ci];
            if ptr::eq(lock, mine)
                || lock
                    .owner
                    .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            let mut other = OwnedGuard { lock };
            let list = core::mem::replace(&mut other.free, ptr::null_mut());
            if !list.is_null() {
                return list;
            }
        }
        ptr::null_mut()
    }

    fn class_of(layout: &Layout) -> Option<usize> {
        let need = layout.size().max(layout.align()).max(1 << MIN_SHIFT);
        let shift = usize::BITS as usize - (need - 1).leading_zeros() as usize;
        (shift <= MAX_SHIFT).then(|| shift - MIN_SHIFT)
    }

    /// A fresh slab of [`SLAB`] bytes, aligned to it, for an arena's class (no class lock
    /// is held: the chunk's `mmap` may run the engine, which may allocate).
    fn slab(&self, me: usize) -> *mut u8 {
        let Some(mut c) = self.chunk.lock(me) else {
            // Nested inside this thread's own cutting of a slab: a mapping of its own.
            return obtain(SLAB, SLAB);
        };
        if c.0 + SLAB > c.1 {
            drop(c);
            let chunk = obtain(CHUNK, CHUNK_ALIGN) as usize;
            let Some(again) = self.chunk.lock(me) else {
                return chunk as *mut u8; // nested after all: the chunk serves this slab
            };
            c = again;
            // Another thread may have installed a chunk meanwhile; the rest of the current
            // one is given up (a rare, bounded waste) and ours is cut from now on.
            *c = (chunk, chunk + CHUNK);
        }
        let p = c.0;
        c.0 += SLAB;
        p as *mut u8
    }

    /// Takes, all or nothing, every lock this heap has that another thread holds (see
    /// [`hold_for_fork`]), noting which ones it took; `false` when one was busy (nothing is
    /// kept then).
    fn try_hold_all(&self, me: usize) -> bool {
        let take = |lock: &AtomicUsize| -> Option<bool> {
            match lock.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => Some(true),
                Err(cur) if cur == me => Some(false), // this thread's own outer frame holds it
                Err(_) => None,
            }
        };
        for (a, arena) in self.arenas.iter().enumerate() {
            let mut taken = 0u32;
            for (i, c) in arena.0.iter().enumerate() {
                match take(&c.owner) {
                    Some(true) => taken |= 1 << i,
                    Some(false) => {}
                    None => {
                        self.held[a].store(taken, Ordering::Relaxed);
                        self.release_held();
                        return false;
                    }
                }
            }
            self.held[a].store(taken, Ordering::Relaxed);
        }
        match take(&self.chunk.owner) {
            Some(took) => self.held_chunk.store(took, Ordering::Relaxed),
            None => {
                self.release_held();
                return false;
            }
        }
        true
    }

    /// Gives back what [`PrivateHeap::try_hold_all`] took.
    fn release_held(&self) {
        for (arena, held) in self.arenas.iter().zip(&self.held) {
            let mask = held.swap(0, Ordering::Relaxed);
            for (i, c) in arena.0.iter().enumerate() {
                if mask & (1 << i) != 0 {
                    // SAFETY: bit i says this thread took this class in `try_hold_all`.
                    unsafe { c.force_unlock() };
                }
            }
        }
        if self.held_chunk.swap(false, Ordering::Relaxed) {
            // SAFETY: this thread took the chunk lock in `try_hold_all`.
            unsafe { self.chunk.force_unlock() };
        }
    }
}

impl Default for PrivateHeap {
    fn default() -> Self {
        Self::new()
    }
}

/// Every mapping the heap holds, so the leak checker can leave oxgrind's own memory out of
/// the program's root set (it is full of pointers to the program's blocks).
static REGIONS: OwnedLock<[(usize, usize); MAX_REGIONS]> = OwnedLock::new([(0, 0); MAX_REGIONS]);
const MAX_REGIONS: usize = 16384;

/// Runs `f` on the region table, unless this thread holds it already (a nested call from
/// the engine, see [`PrivateHeap`]): the table is then left as it is.
fn with_regions(f: impl FnOnce(&mut [(usize, usize); MAX_REGIONS])) {
    if let Some(mut r) = REGIONS.lock(thread_identity()) {
        f(&mut r);
    }
}

/// Records a mapping oxgrind made outside this heap (the engine's thread contexts hold
/// copies of the program's registers) so that the leak checker leaves it out of the
/// program's roots, like the heap's own.
pub fn note_private_mapping(start: usize, len: usize) {
    note_region(start, len);
}

fn note_region(start: usize, len: usize) {
    with_regions(|r| {
        if let Some(slot) = r.iter_mut().find(|s| s.1 == 0) {
            *slot = (start, len);
        }
    });
}

fn forget_region(start: usize) {
    with_regions(|r| {
        if let Some(slot) = r.iter_mut().find(|s| s.0 == start && s.1 != 0) {
            *slot = (0, 0);
        }
    });
}

/// Calls `f(start, len)` for every mapping the private heap holds. `f` must not allocate
/// (the heap may need this lock to map a new chunk).
pub fn for_each_region(mut f: impl FnMut(usize, usize)) {
    let Some(r) = REGIONS.lock(thread_identity()) else {
        return;
    };
    for &(s, l) in r.iter().filter(|s| s.1 != 0) {
        f(s, l);
    }
}

/// # Safety
/// Only in a single-threaded child right after `fork`.
pub unsafe fn force_unlock_regions() {
    // SAFETY: forwarded.
    unsafe { REGIONS.force_unlock() }
}

// ---------------------------------------------------------------------------------------
// Fork.
//
// A forked child has one thread, the one that forked. A lock of this heap another thread of
// the parent held at that instant stays held for ever in the child, and the first
// allocation of its class there spins for ever (the Rust program under Memcheck that forks
// while its threads allocate). So the forking thread takes every lock first, and both
// processes release them after the system call: the child inherits a consistent heap.

/// The heap [`hold_for_fork`] takes: the embedder's `#[global_allocator]`.
static FORK_HEAP: core::sync::atomic::AtomicPtr<PrivateHeap> =
    core::sync::atomic::AtomicPtr::new(ptr::null_mut());
/// Whether [`hold_for_fork`] took the region table (the heap notes its own locks).
static FORK_HELD_REGIONS: core::sync::atomic::AtomicBool =
    core::sync::atomic::AtomicBool::new(false);

/// Names the heap fork handling must hold: call once, with the `#[global_allocator]`.
pub fn serve_forks(heap: &'static PrivateHeap) {
    FORK_HEAP.store(
        heap as *const PrivateHeap as *mut PrivateHeap,
        Ordering::Release,
    );
}

/// Takes every lock of the heap (its classes and its region table) for a `fork` about to
/// be made by this thread; [`release_after_fork`] gives them back, in the parent and in the
/// child. All or nothing, retried with a yield in between: a thread holding a class lock
/// may need another class (the engine translating inside its critical section), so
/// waiting while holding could deadlock.
pub fn hold_for_fork() {
    let heap = FORK_HEAP.load(Ordering::Acquire);
    let me = thread_identity();
    // SAFETY: FORK_HEAP is null or the 'static heap given to `serve_forks`.
    let heap = unsafe { heap.as_ref() };
    loop {
        if heap.is_none_or(|h| h.try_hold_all(me)) {
            match REGIONS
                .owner
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => {
                    FORK_HELD_REGIONS.store(true, Ordering::Relaxed);
                    return;
                }
                Err(cur) if cur == me => {
                    FORK_HELD_REGIONS.store(false, Ordering::Relaxed);
                    return;
                }
                Err(_) => {
                    if let Some(h) = heap {
                        h.release_held();
                    }
                }
            }
        }
        raw::sched_yield();
    }
}

/// Gives back what [`hold_for_fork`] took.
///
/// # Safety
/// Only right after the `fork` that [`hold_for_fork`] prepared, on the thread that called it
/// (in the parent, or in the child, which is that thread's copy), once per process.
pub unsafe fn release_after_fork() {
    let heap = FORK_HEAP.load(Ordering::Acquire);
    // SAFETY: as in hold_for_fork.
    if let Some(h) = unsafe { heap.as_ref() } {
        h.release_held();
    }
    if FORK_HELD_REGIONS.swap(false, Ordering::Relaxed) {
        // SAFETY: this thread took the region table in hold_for_fork.
        unsafe { REGIONS.force_unlock() };
    }
}

/// Bytes of the reserve kept for after a mapping failed: the report is written from them.
pub const EMERGENCY: usize = 32 << 20;

/// The reserve: `[start, end)`, carved from `next` upwards (lock-free: a fetch-add).
static RESERVE_START: AtomicUsize = AtomicUsize::new(0);
static RESERVE_END: AtomicUsize = AtomicUsize::new(0);
static RESERVE_NEXT: AtomicUsize = AtomicUsize::new(0);
/// Told when memory first comes from the emergency part, and when half of it is gone (see
/// the module doc).
static EXHAUSTED_HOOK: AtomicUsize = AtomicUsize::new(0);
/// Memory is short: serving from the emergency part, or a new mapping left no room for the
/// report ([`room_to_report`]); cleared by [`try_recover`].
static EXHAUSTED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
static HALF_GONE: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// What the exhausted hook is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exhaustion {
    /// A new mapping failed: the first block came from the emergency part.
    Entered,
    /// Half of the emergency part is gone.
    HalfGone,
}

/// Maps the reserve: `bytes` of address space (not memory: the pages are untouched until
/// used), halved until the mapping succeeds (a limit set before we started may not allow
/// all of it). Returns the size taken. Call once, at start-up.
pub fn take_reserve(mut bytes: usize) -> usize {
    if RESERVE_START.load(Ordering::Acquire) != 0 {
        return RESERVE_END.load(Ordering::Relaxed) - RESERVE_START.load(Ordering::Relaxed);
    }
    while bytes >= 2 * EMERGENCY {
        if let Some(p) = raw::mmap_anon(bytes + CHUNK_ALIGN) {
            let start = (p as usize + CHUNK_ALIGN - 1) & !(CHUNK_ALIGN - 1);
            note_region(p as usize, bytes + CHUNK_ALIGN);
            RESERVE_NEXT.store(start, Ordering::Relaxed);
            RESERVE_END.store(start + bytes, Ordering::Relaxed);
            RESERVE_START.store(start, Ordering::Release);
            return bytes;
        }
        bytes /= 2;
    }
    0
}

/// The reserve's extent, `(start, len)` (`(0, 0)` before [`take_reserve`]).
pub fn reserve_extent() -> (usize, usize) {
    let s = RESERVE_START.load(Ordering::Acquire);
    (s, RESERVE_END.load(Ordering::Relaxed).saturating_sub(s))
}

/// Whether the heap is drawing on its emergency bytes (a new mapping failed, and none has
/// succeeded since).
#[inline]
pub fn exhausted() -> bool {
    EXHAUSTED.load(Ordering::Relaxed)
}

/// Bytes of heap mapped outside the reserve (given back large blocks included: an upper
/// bound is enough here).
static HELD_OUTSIDE: AtomicUsize = AtomicUsize::new(0);

/// Whether the address space still has room for the report: twice what the heap holds
/// (the report's tables grow with the data that tracks the program's blocks: Memcheck's
/// leak search needs about 90 bytes a block where the block table holds 30 to 60), at
/// least the emergency part. Probed by mapping and
/// unmapping it, as each new chunk is mapped: a full address space is found while the
/// program can still be refused allocations, not when the report needs memory at exit.
fn room_to_report() -> bool {
    let used = RESERVE_NEXT
        .load(Ordering::Relaxed)
        .saturating_sub(RESERVE_START.load(Ordering::Relaxed));
    let want = round_pages((2 * (HELD_OUTSIDE.load(Ordering::Relaxed) + used)).max(EMERGENCY));
    // Address space only (no commit charge, so a machine with strict overcommit does not
    // refuse it for want of memory nobody will touch).
    let p = announce(want, 0, &mut || {
        raw::mmap_inaccessible(want).unwrap_or(ptr::null_mut())
    });
    if p.is_null() {
        return false;
    }
    unmap_announced(p, want);
    true
}

/// Whether the address space still has room for the report (see [`room_to_report`]);
/// when not, the heap counts as [`exhausted`]. For a caller that sees memory taken by
/// others (the program's allocations) between this heap's own mappings.
pub fn keep_room_to_report() -> bool {
    if exhausted() {
        return false;
    }
    if room_to_report() {
        return true;
    }
    if !EXHAUSTED.swap(true, Ordering::AcqRel) {
        tell_exhausted(Exhaustion::Entered);
    }
    false
}

/// While [`exhausted`]: whether there is room again (the program gave memory back),
/// probed as [`room_to_report`] does. Clears [`exhausted`] when there is.
pub fn try_recover() -> bool {
    if !exhausted() {
        return true;
    }
    if room_to_report() {
        EXHAUSTED.store(false, Ordering::Release);
        return true;
    }
    false
}

/// Sets the function called (on the allocating thread, outside every heap lock) at each
/// [`Exhaustion`] step.
pub fn set_exhausted_hook(hook: fn(Exhaustion)) {
    EXHAUSTED_HOOK.store(hook as usize, Ordering::Release);
}

fn tell_exhausted(step: Exhaustion) {
    let hook = EXHAUSTED_HOOK.load(Ordering::Acquire);
    if hook != 0 {
        // SAFETY: only `set_exhausted_hook` stores here, from a `fn(Exhaustion)`.
        let hook: fn(Exhaustion) = unsafe { core::mem::transmute::<usize, fn(Exhaustion)>(hook) };
        hook(step);
    }
}

// ---------------------------------------------------------------------------------------
// Limits.
//
// A program's lowered RLIMIT_AS/RLIMIT_DATA are virtual (the runtime's `limits`): the kernel
// holds the program's limit plus the room that was ours when it was set. What this heap maps
// later must not come out of the program's share, or the program fails its own allocations
// sooner than natively and ours fail at last (a program filling a 512 MiB limit with small
// blocks under Massif ended with "out of memory for its own data" and no report). So each
// mapping of ours outside the reserve is announced to a hook, which moves the kernel's
// limit up by its size, and each unmapping moves it down.

/// What a mapping hook is given: the bytes the mapping keeps, the bytes it holds besides for
/// the time of the call (the alignment slack it trims), and the mapping to make; it returns
/// the mapping's result.
pub type MapHook = fn(usize, usize, &mut dyn FnMut() -> *mut u8) -> *mut u8;

static MAP_HOOK: AtomicUsize = AtomicUsize::new(0);
static UNMAP_HOOK: AtomicUsize = AtomicUsize::new(0);

/// Sets the functions told about each new mapping of ours outside the reserve (`map`, which
/// makes it) and each one given back (`unmap`, after). They must not allocate.
pub fn set_mapping_hooks(map: MapHook, unmap: fn(usize)) {
    MAP_HOOK.store(map as usize, Ordering::Release);
    UNMAP_HOOK.store(unmap as usize, Ordering::Release);
}

/// A new mapping of `len` bytes aligned to `align`, through the mapping hook when set.
fn map_announced(len: usize, align: usize) -> *mut u8 {
    announce(len, align.max(PAGE), &mut || map_aligned(len, align))
}

/// Makes a mapping of `len` bytes (holding `slack` more during the call) with `make`,
/// through the mapping hook when set.
fn announce(len: usize, slack: usize, make: &mut dyn FnMut() -> *mut u8) -> *mut u8 {
    let hook = MAP_HOOK.load(Ordering::Acquire);
    if hook == 0 {
        return make();
    }
    // SAFETY: only `set_mapping_hooks` stores here, from a `MapHook`.
    let hook: MapHook = unsafe { core::mem::transmute::<usize, MapHook>(hook) };
    hook(len, slack, make)
}

/// Unmaps a mapping of ours and tells the unmapping hook.
fn unmap_announced(p: *mut u8, len: usize) {
    // SAFETY: the caller gives back a whole mapping of ours, `len` bytes from `p`.
    unsafe { raw::munmap(p, len) };
    let hook = UNMAP_HOOK.load(Ordering::Acquire);
    if hook != 0 {
        // SAFETY: only `set_mapping_hooks` stores here, from a `fn(usize)`.
        let hook: fn(usize) = unsafe { core::mem::transmute::<usize, fn(usize)>(hook) };
        hook(len);
    }
}

/// Carves `len` bytes aligned to `align` from the reserve, leaving its last `keep` bytes;
/// `None` when they do not fit.
fn carve(len: usize, align: usize, keep: usize) -> Option<*mut u8> {
    let end = RESERVE_END.load(Ordering::Acquire);
    if end == 0 {
        return None;
    }
    let limit = end - keep;
    let mut cur = RESERVE_NEXT.load(Ordering::Relaxed);
    loop {
        let start = (cur + align - 1) & !(align - 1);
        let next = start.checked_add(len)?;
        if next > limit {
            return None;
        }
        match RESERVE_NEXT.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return Some(start as *mut u8),
            Err(now) => cur = now,
        }
    }
}

/// Bytes of the reserve not carved yet.
fn reserve_left() -> usize {
    RESERVE_END
        .load(Ordering::Acquire)
        .saturating_sub(RESERVE_NEXT.load(Ordering::Relaxed))
}

fn in_reserve(p: usize) -> bool {
    let s = RESERVE_START.load(Ordering::Acquire);
    s != 0 && p >= s && p < RESERVE_END.load(Ordering::Relaxed)
}

/// Memory for the heap: the reserve's ordinary part, else a new mapping, else the reserve's
/// emergency part (telling the runtime once), else the end of the process.
fn obtain(len: usize, align: usize) -> *mut u8 {
    let align = align.max(PAGE);
    if let Some(p) = carve(len, align, EMERGENCY) {
        return p;
    }
    let p = map_announced(len, align);
    if !p.is_null() {
        HELD_OUTSIDE.fetch_add(len, Ordering::Relaxed);
        if !EXHAUSTED.load(Ordering::Relaxed) && !room_to_report() {
            EXHAUSTED.store(true, Ordering::Release);
            tell_exhausted(Exhaustion::Entered);
        }
        return p;
    }
    if let Some(p) = carve(len, align, 0) {
        if !EXHAUSTED.swap(true, Ordering::AcqRel) {
            tell_exhausted(Exhaustion::Entered);
        }
        if reserve_left() < EMERGENCY / 2 && !HALF_GONE.swap(true, Ordering::AcqRel) {
            tell_exhausted(Exhaustion::HalfGone);
        }
        return p;
    }
    crate::fd::write_all(
        2,
        b"oxgrind: out of memory for its own data, even its reserve (the program's memory limits leave none); ending the process\n",
    );
    raw::exit_group(1)
}

fn map_aligned(len: usize, align: usize) -> *mut u8 {
    let align = align.max(PAGE);
    let total = len + align - PAGE;
    let Some(p) = raw::mmap_anon(total) else {
        return ptr::null_mut();
    };
    let start = p as usize;
    let aligned = (start + align - 1) & !(align - 1);
    // SAFETY: both trimmed ranges lie inside the mapping just made and are unused.
    unsafe {
        if aligned > start {
            raw::munmap(p, aligned - start);
        }
        let tail = start + total - (aligned + len);
        if tail > 0 {
            raw::munmap((aligned + len) as *mut u8, tail);
        }
    }
    note_region(aligned, len);
    aligned as *mut u8
}

fn round_pages(n: usize) -> usize {
    (n + PAGE - 1) & !(PAGE - 1)
}

// SAFETY: alloc returns memory of at least layout.size() bytes aligned to layout.align() that
// no other allocation overlaps (fresh bump space, a node popped under the class lock, or a
// new mapping); dealloc returns blocks to the class they came from.
unsafe impl GlobalAlloc for PrivateHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(ci) = Self::class_of(&layout) else {
            return obtain(round_pages(layout.size()), layout.align());
        };
        let size = 1usize << (ci + MIN_SHIFT);
        let me = thread_identity();
        let Some(mut c) = self.lock_class(ci, me) else {
            // Nested inside this thread's own use of the class: a mapping of its own, which
            // joins the class's free list when freed.
            return obtain(round_pages(size), size);
        };
        if !c.free.is_null() {
            let node = c.free;
            // SAFETY: nodes on the free list are blocks of this class we handed out before.
            c.free = unsafe { (*node).next };
            return node as *mut u8;
        }
        if c.bump + size > c.end {
            let stolen = self.steal(ci, me, c.lock);
            if !stolen.is_null() {
                // SAFETY: as above: nodes of another arena's free list of this class.
                c.free = unsafe { (*stolen).next };
                return stolen as *mut u8;
            }
            // Never hold a class lock across the mmap: under the translation engine that
            // system call passes through the dispatcher, which may have to translate code
            // that allocates from this very class.
            drop(c);
            let slab = self.slab(me) as usize;
            let Some(again) = self.lock_class(ci, me) else {
                return slab as *mut u8; // nested after all: the slab serves this one block
            };
            c = again;
            // This arena (or the one taken instead, when this thread's was busy) may have
            // a region already; the rest of it is given up (a rare, bounded waste).
            c.bump = slab;
            c.end = slab + SLAB;
        }
        let p = c.bump;
        c.bump += size;
        p as *mut u8
    }

    /// A large block is always new pages (carved from the reserve, which never hands
    /// out the same address twice, or a new mapping): zero already. Writing the zeros
    /// (the default) made every page of a large zeroed table resident at once, touched or
    /// not (Cachegrind's LL tags: 63 MiB, most never looked up).
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if Self::class_of(&layout).is_none() {
            return obtain(round_pages(layout.size()), layout.align());
        }
        // SAFETY: forwarded to the caller's contract.
        let p = unsafe { self.alloc(layout) };
        if !p.is_null() {
            // SAFETY: `alloc` returned `layout.size()` writable bytes at p.
            unsafe { ptr::write_bytes(p, 0, layout.size()) };
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        match Self::class_of(&layout) {
            None if in_reserve(p as usize) => {
                // Carved from the reserve: its address space stays the reserve's (unmapping
                // it would hand the program room it did not have) and is not reused, but
                // its pages go back to the kernel. A growing table (a `Vec` doubling, a hash
                // map rehashing) frees its previous copy each time: kept resident, those
                // copies were as large as the live table again.
                // SAFETY: the block is page-aligned, whole pages of the reserve (an
                // anonymous private mapping of ours), and the caller gave it up.
                unsafe { raw::discard(p, round_pages(layout.size())) };
            }
            None => {
                forget_region(p as usize);
                // Large blocks are whole mappings of round_pages(size) bytes.
                unmap_announced(p, round_pages(layout.size()));
                HELD_OUTSIDE.fetch_sub(round_pages(layout.size()), Ordering::Relaxed);
            }
            Some(ci) => {
                // Nested inside this thread's own use of the class: the block is leaked.
                let Some(mut c) = self.lock_class(ci, thread_identity()) else {
                    return;
                };
                let node = p as *mut FreeNode;
                // SAFETY: p is a block of this class being returned; we own it now.
                unsafe { (*node).next = c.free };
                c.free = node;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Objects one thread allocates and another frees are reused: the allocating thread
    /// takes the freeing one's list before it cuts a new slab, so the heap does not grow
    /// with the number of rounds.
    #[test]
    fn objects_freed_by_another_thread_are_reused() {
        extern crate std;
        use std::vec::Vec;
        static HEAP: PrivateHeap = PrivateHeap::new();
        let layout = Layout::from_size_align(48, 8).unwrap();
        let mut seen = std::collections::HashSet::new();
        for _round in 0..20 {
            // SAFETY: blocks of `layout` from HEAP, freed once below with the same layout.
            let blocks: Vec<usize> = (0..5000)
                .map(|_| unsafe { HEAP.alloc(layout) } as usize)
                .collect();
            seen.extend(blocks.iter().copied());
            std::thread::spawn(move || {
                for p in blocks {
                    // SAFETY: allocated above with `layout`, freed once.
                    unsafe { HEAP.dealloc(p as *mut u8, layout) };
                }
            })
            .join()
            .unwrap();
        }
        // Without reuse: 100,000 different addresses; with it, the first round's and a
        // slab's worth more.
        assert!(
            seen.len() < 5000 + 2 * SLAB / 64,
            "{} addresses",
            seen.len()
        );
    }

    /// With the address space capped (as a program's `setrlimit(RLIMIT_AS)` would), the heap
    /// serves from its reserve, then from the emergency part, telling its hook once: never a
    /// null (the standard library's abort). Run in a forked child: the limit and the reserve
    /// are process-wide.
    #[test]
    fn reserve_outlives_an_address_space_limit_and_reports_its_emergency() {
        use crate::syscall::{syscall1, syscall4};
        const SYS_FORK: usize = 57;
        const SYS_WAIT4: usize = 61;
        const SYS_PRLIMIT64: usize = 302;
        // SAFETY: fork; the child only makes system calls and uses this heap, then exits.
        let pid = unsafe { syscall1(SYS_FORK, 0) };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            set_exhausted_hook(|step| {
                if step == Exhaustion::Entered {
                    raw::exit_group(42)
                }
            });
            if take_reserve(EMERGENCY * 3) == 0 {
                raw::exit_group(3);
            }
            // No new mapping from now on: the current size is the limit.
            let limit = [0u64, 0u64];
            // SAFETY: prlimit64 on ourselves with a valid struct rlimit.
            unsafe { syscall4(SYS_PRLIMIT64, 0, 9, limit.as_ptr() as usize, 0) };
            let heap = PrivateHeap::new();
            let layout = Layout::from_size_align(60 << 10, 8).unwrap();
            for _ in 0..4096 {
                // SAFETY: non-zero size; the blocks are never freed.
                let p = unsafe { heap.alloc(layout) };
                if p.is_null() {
                    raw::exit_group(4);
                }
                // SAFETY: p points to layout.size() writable bytes.
                unsafe { core::ptr::write_bytes(p, 1, layout.size()) };
            }
            raw::exit_group(5); // 240 MiB served without the emergency part: not capped?
        }
        let mut status = 0i32;
        // SAFETY: wait4 for our child with a valid status pointer.
        unsafe {
            syscall4(
                SYS_WAIT4,
                pid as usize,
                &mut status as *mut i32 as usize,
                0,
                0,
            )
        };
        assert_eq!((status >> 8) & 0xff, 42, "child status {status:#x}");
    }

    #[test]
    fn blocks_are_aligned_distinct_and_recycled() {
        let heap = PrivateHeap::new();
        let mut seen = [0usize; 64];
        for (i, slot) in seen.iter_mut().enumerate() {
            let layout = Layout::from_size_align(1 + i * 37, 1 << (i % 7)).unwrap();
            // SAFETY: non-zero size layout.
            let p = unsafe { heap.alloc(layout) };
            assert!(!p.is_null());
            assert_eq!(p as usize % layout.align(), 0);
            // SAFETY: p points to at least layout.size() writable bytes.
            unsafe { core::ptr::write_bytes(p, 0xAB, layout.size()) };
            *slot = p as usize;
        }
        let mut sorted = seen;
        sorted.sort_unstable();
        assert!(sorted.windows(2).all(|w| w[0] != w[1]));
        let layout = Layout::from_size_align(100, 8).unwrap();
        // SAFETY: alloc/dealloc pair with the same layout.
        unsafe {
            let a = heap.alloc(layout);
            heap.dealloc(a, layout);
            assert_eq!(heap.alloc(layout), a, "freed block is reused first");
            let big = Layout::from_size_align(1 << 20, 8).unwrap();
            let b = heap.alloc(big);
            core::ptr::write_bytes(b, 1, 1 << 20);
            heap.dealloc(b, big);
        }
    }

    /// Zeroed blocks read zero, small (a recycled block is cleared) and large (new pages,
    /// not written), even where a block written and freed was before.
    #[test]
    fn zeroed_blocks_are_zero_after_dirty_ones_are_freed() {
        let heap = PrivateHeap::new();
        for size in [100usize, 3 << 20] {
            let layout = Layout::from_size_align(size, 8).unwrap();
            // SAFETY: alloc/dealloc pairs with the same layout; each block has `size` bytes.
            unsafe {
                let dirty = heap.alloc(layout);
                core::ptr::write_bytes(dirty, 0xCD, size);
                heap.dealloc(dirty, layout);
                let z = heap.alloc_zeroed(layout);
                assert!(!z.is_null());
                let bytes = core::slice::from_raw_parts(z, size);
                assert!(bytes.iter().all(|&b| b == 0), "size {size}");
                heap.dealloc(z, layout);
            }
        }
    }
}
