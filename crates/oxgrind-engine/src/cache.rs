//! The code cache: arenas of executable memory, the guest→host block map, and linking.
//!
//! Arenas are placed within ±1 GiB of the guest code they hold (hint just below the
//! module) so that copied RIP-relative operands keep a rel32 displacement; a block whose
//! operand is still out of range takes the translator's far path. Blocks are never freed or
//! moved in phase 1 (no invalidation yet), so a host address handed out stays valid.
//!
//! Linking: every exit stub of a new block whose target is already translated is patched at
//! once; the others wait in `pending`, keyed by guest target, and are patched when that
//! target is translated. Syscall blocks are never linked to: the dispatcher must see each
//! system call. `links` remembers the patched stubs so that [`CodeCache::invalidate`] can
//! undo them when the program unmaps code.

use alloc::collections::BTreeMap;
use core::hash::{BuildHasherDefault, Hasher};

/// Guest pcs are well-spread integers: one multiply is enough of a hash.
#[derive(Default)]
pub(crate) struct PcHasher(u64);

impl Hasher for PcHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub(crate) type PcMap<V> = hashbrown::HashMap<u64, V, BuildHasherDefault<PcHasher>>;
use alloc::vec::Vec;

use oxgrind_sys::syscall::{check, syscall6};

use crate::translate::{self, BlockKind, Options, TranslateError};

const ARENA_SIZE: u64 = 32 << 20;
/// A block needs at most this much room (64 instructions, far fix-ups and stubs).
const MAX_BLOCK: u64 = 16 << 10;
const NEAR: u64 = 1 << 30;

struct Arena {
    start: u64,
    end: u64,
    bump: u64,
    /// Definedness's catch-up routine for the arena's blocks (0: none, see
    /// `translate::catch_up_routine`).
    catch_up: u64,
    /// The shared halves of its blocks' slow calls (0: none, see
    /// `translate::slow_call_tails`).
    slow_tails: u64,
    /// The shared out-of-line parts of its blocks' recent-lines checks (0: none, see
    /// `translate::recent_line_routines`).
    recent_routines: u64,
}

#[derive(Clone, Copy)]
pub struct BlockRec {
    pub host: u64,
    pub kind: BlockKind,
    /// False for the native jump to code that cannot run (unmapped or not executable):
    /// it is made afresh at every arrival, never linked to nor put in the IBL, so that the
    /// program mapping or `mprotect`ing the page later is seen whatever system call did it.
    pub cached: bool,
}

/// Statistics for `OXGRIND_ENGINE_STATS`.
#[derive(Default, Clone, Copy)]
pub struct Stats {
    pub blocks: u64,
    pub bytes: u64,
    pub dispatches: u64,
    pub arenas: u64,
    pub invalidated: u64,
    /// Blocks translated with an entry check (from writable pages).
    pub checked: u64,
    /// Entry checks that failed: blocks dropped because their guest bytes changed.
    pub stale: u64,
}

/// `Config::on_translated` as a plain address (0: none), read at each translation.
static ON_TRANSLATED: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

pub(crate) fn set_on_translated(hook: Option<fn(u64, u64, u64)>) {
    ON_TRANSLATED.store(
        hook.map_or(0, |f| f as usize),
        core::sync::atomic::Ordering::Relaxed,
    );
}

pub struct CodeCache {
    arenas: Vec<Arena>,
    blocks: PcMap<BlockRec>,
    /// The same guest pcs, ordered, with the guest length of each block: for finding the
    /// blocks that overlap an unmapped range.
    ordered: BTreeMap<u64, u64>,
    pending: PcMap<Vec<u64>>,
    /// Linked stubs by guest target, to unlink them when the target is invalidated.
    links: PcMap<Vec<u64>>,
    /// Every translation ever made, by host start: what a host pc means in guest terms
    /// (signal contexts). Kept after invalidation: a thread may still be running the code.
    by_host: BTreeMap<u64, HostBlock>,
    /// The host-to-guest maps of all those translations, one after another (see
    /// [`HostBlock`]).
    maps: Vec<PackedMapEntry>,
    /// Map entries that do not fit a [`PackedMapEntry`] (guest pc, fix-ups), by host pc.
    far_entries: BTreeMap<u64, (u64, u16)>,
    /// Guest pcs whose "translation" is a native jump (their page was unmapped then).
    native: PcMap<()>,
    opts: Options,
    /// Which pages the program can write (blocks from those get entry checks).
    pub pages: crate::pages::Pages,
    /// Testing knob: place arenas far from all guest code to exercise the far paths.
    far: bool,
    pub stats: Stats,
    #[cfg(feature = "debug-dispatch")]
    pub hot: PcMap<u64>,
}

/// Why the code cache could not produce a block.
#[derive(Clone, Copy, Debug)]
pub enum CacheError {
    Translate(TranslateError),
    NoMemory,
}

fn mmap_rwx(hint: u64, fixed_noreplace: bool) -> Option<u64> {
    const PROT_RWX: usize = 7;
    const MAP_PRIVATE_ANON: usize = 0x22;
    const MAP_FIXED_NOREPLACE: usize = 0x100000;
    let flags = MAP_PRIVATE_ANON
        | if fixed_noreplace {
            MAP_FIXED_NOREPLACE
        } else {
            0
        };
    // SAFETY: an anonymous mapping; with MAP_FIXED_NOREPLACE the kernel refuses to replace
    // existing mappings, without it the hint is only a hint.
    let r = unsafe {
        syscall6(
            9,
            hint as usize,
            ARENA_SIZE as usize,
            PROT_RWX,
            flags,
            usize::MAX,
            0,
        )
    };
    let p = check(r).ok()? as u64;
    if fixed_noreplace && p != hint {
        // Old kernels treat the flag as a hint only.
        // SAFETY: we just made this mapping and nobody uses it.
        unsafe { oxgrind_sys::raw::munmap(p as *mut u8, ARENA_SIZE as usize) };
        return None;
    }
    Some(p)
}

impl CodeCache {
    pub fn new(opts: Options, far: bool) -> Self {
        CodeCache {
            arenas: Vec::new(),
            blocks: PcMap::default(),
            ordered: BTreeMap::new(),
            pending: PcMap::default(),
            links: PcMap::default(),
            by_host: BTreeMap::new(),
            // Room for the maps of a few thousand blocks from the start: a large block of
            // the heap, whose pages are touched only as the maps fill it.
            maps: Vec::with_capacity(MAPS_INITIAL),
            far_entries: BTreeMap::new(),
            native: PcMap::default(),
            opts,
            pages: crate::pages::Pages::default(),
            far,
            stats: Stats::default(),
            #[cfg(feature = "debug-dispatch")]
            hot: PcMap::default(),
        }
    }

    /// A fresh, empty cache with the same settings (the child of a `fork` whose parent had
    /// another thread inside the cache: that thread's half-done update cannot be trusted).
    pub fn fresh(&self) -> Self {
        CodeCache::new(self.opts, self.far)
    }

    pub fn lookup(&self, pc: u64) -> Option<BlockRec> {
        self.blocks.get(&pc).copied()
    }

    fn arena_for(&mut self, pc: u64) -> Result<usize, CacheError> {
        let near = |a: &Arena| a.start.abs_diff(pc) < NEAR && a.end.abs_diff(pc) < NEAR;
        if let Some(i) = self
            .arenas
            .iter()
            .position(|a| a.end - a.bump >= MAX_BLOCK && (self.far || near(a)))
        {
            return Ok(i);
        }
        let start = if self.far {
            // 32 TiB: far from both the executable (0x55..) and the libraries (0x7f..).
            (0x2000_0000_0000u64..0x2100_0000_0000)
                .step_by(ARENA_SIZE as usize)
                .find_map(|h| mmap_rwx(h, true))
        } else {
            // Below the module first (nothing grows down into there but other mappings),
            // then above it, leaving 512 MiB for a non-PIE executable's brk heap. All hints
            // stay within NEAR of pc.
            let base = pc & !((64u64 << 20) - 1);
            (1..=14u64)
                .filter_map(|k| base.checked_sub(k * (64 << 20)))
                .chain((8..=14u64).map(|k| base + k * (64 << 20)))
                .find_map(|h| mmap_rwx(h, true))
        };
        // No room near pc: share any arena (far RIP-relative operands take the slow path),
        // or map one wherever the kernel likes.
        let start = match start {
            Some(s) => Some(s),
            None => {
                if let Some(i) = self.arenas.iter().position(|a| a.end - a.bump >= MAX_BLOCK) {
                    return Ok(i);
                }
                mmap_rwx(0, false)
            }
        };
        let start = start.ok_or(CacheError::NoMemory)?;
        self.arenas.push(Arena {
            start,
            end: start + ARENA_SIZE,
            bump: start,
            catch_up: 0,
            slow_tails: 0,
            recent_routines: 0,
        });
        self.stats.arenas += 1;
        let ai = self.arenas.len() - 1;
        self.place_catch_up_routine(ai);
        self.place_recent_routines(ai);
        Ok(ai)
    }

    /// Puts definedness's catch-up routine at the start of new arena `ai`, for its blocks
    /// to share (a few hundred bytes each otherwise). A routine that cannot be made leaves
    /// them doing the work inline.
    fn place_catch_up_routine(&mut self, ai: usize) {
        if !(self.opts.instrument && crate::definedness::enabled()) {
            return;
        }
        let base = self.arenas[ai].bump;
        let Ok(code) = translate::definedness_routines(base) else {
            return;
        };
        // SAFETY: the arena is new, RWX, owned by the cache, and far larger than the
        // routine.
        unsafe { core::ptr::copy_nonoverlapping(code.as_ptr(), base as *mut u8, code.len()) };
        let len = code.len() as u64;
        self.arenas[ai].bump = base + len;
        self.arenas[ai].catch_up = base;
        // Engine code: no guest pc (`guest_at` is `None`), inside the cache.
        let unmapped = translate::PcMapEntry {
            host_off: 0,
            fix: 0,
            guest: translate::UNMAPPED,
        };
        self.insert_host_block(base, len, translate::UNMAPPED, &[unmapped]);
        // The slow calls' shared tails after it, likewise engine code.
        let base = self.arenas[ai].bump;
        let code = translate::slow_call_tails(base);
        // SAFETY: as above; the routine and the tails take a few hundred bytes.
        unsafe { core::ptr::copy_nonoverlapping(code.as_ptr(), base as *mut u8, code.len()) };
        let len = code.len() as u64;
        self.arenas[ai].bump = base + len;
        self.arenas[ai].slow_tails = base;
        self.insert_host_block(base, len, translate::UNMAPPED, &[unmapped]);
    }

    /// Puts the recent-lines checks' shared routines in new arena `ai` (Cachegrind's data
    /// table of two ways), for its blocks to call: 500 to 600 bytes per check otherwise.
    fn place_recent_routines(&mut self, ai: usize) {
        if !(self.opts.instrument && translate::recent_routines_wanted()) {
            return;
        }
        let base = self.arenas[ai].bump;
        let code = translate::recent_line_routines(base);
        if code.is_empty() {
            return;
        }
        // SAFETY: the arena is new, RWX, owned by the cache, and far larger than the
        // routines (a few KiB).
        unsafe { core::ptr::copy_nonoverlapping(code.as_ptr(), base as *mut u8, code.len()) };
        let len = code.len() as u64;
        self.arenas[ai].bump = base + len;
        self.arenas[ai].recent_routines = base;
        // Engine code: no guest pc, inside the cache.
        let unmapped = translate::PcMapEntry {
            host_off: 0,
            fix: 0,
            guest: translate::UNMAPPED,
        };
        self.insert_host_block(base, len, translate::UNMAPPED, &[unmapped]);
    }

    /// The block for `pc`, translating it if needed.
    pub fn get_or_translate(&mut self, pc: u64) -> Result<BlockRec, CacheError> {
        if let Some(b) = self.lookup(pc) {
            return Ok(b);
        }
        self.translate_new(pc, &mut |_| {})
    }

    /// Translates, ahead of time, the code reachable by direct transfers (and the
    /// fall-through after each block, where a call returns) from `entry`, up to `limit`
    /// blocks. Used for the embedder's allocator: it runs translated and calls out (mmap)
    /// while holding its locks, and a translation made then, which allocates, would
    /// deadlock on the same lock (see `translate::ALLOC_NOTE`). Errors are ignored: what
    /// cannot be translated now is translated when it runs.
    pub fn prewarm(&mut self, entry: u64, limit: usize) {
        // Breadth first: the blocks of the entry function itself come before those of
        // far-away callees (panic and formatting paths), which a depth-first walk reached
        // first and spent the budget on.
        let mut work: alloc::collections::VecDeque<u64> = alloc::collections::VecDeque::new();
        work.push_back(entry);
        let mut done = 0;
        while let Some(pc) = work.pop_front() {
            if done >= limit {
                break;
            }
            if self.lookup(pc).is_some() {
                continue;
            }
            let mut targets = Vec::new();
            if self.translate_new(pc, &mut |t| targets.push(t)).is_err() {
                continue;
            }
            done += 1;
            if let Some(&len) = self.ordered.get(&pc) {
                work.push_back(pc + len);
            }
            work.extend(targets);
        }
    }

    /// Translates the block at `pc` (not in the cache); `target` sees each exit's target.
    fn translate_new(
        &mut self,
        pc: u64,
        target: &mut dyn FnMut(u64),
    ) -> Result<BlockRec, CacheError> {
        let ai = self.arena_for(pc)?;
        let base = self.arenas[ai].bump;
        translate::set_catch_up_routine(self.arenas[ai].catch_up);
        translate::set_slow_tails(self.arenas[ai].slow_tails);
        translate::set_recent_routines(self.arenas[ai].recent_routines);
        // Code from a page the program can write is checked at each entry; a block that only
        // runs into such a page (its last instructions) is translated again with the check.
        let mut opts = self.opts;
        opts.check = self.pages.mutable(pc);
        // Data the program jumps to faults natively (the engine would happily run it).
        let mut t = if self.pages.executable(pc) {
            translate::translate(pc, base, opts).map_err(CacheError::Translate)?
        } else {
            opts.check = false;
            translate::native_jump(pc)
        };
        let last = pc + t.guest_len.max(1) - 1;
        if !opts.check && t.insns > 0 && last >> 12 != pc >> 12 && self.pages.mutable(last) {
            opts.check = true;
            t = translate::translate(pc, base, opts).map_err(CacheError::Translate)?;
        }
        // Probes can make a long block's translation too large (a recent-lines check of
        // two ways without its shared routines is several hundred bytes per memory
        // operand): fewer instructions then.
        while t.bytes.len() as u64 > MAX_BLOCK && t.insns > 1 {
            t = translate::translate_at_most(pc, base, opts, t.insns / 2)
                .map_err(CacheError::Translate)?;
        }
        if opts.check {
            self.stats.checked += 1;
        }
        let len = t.bytes.len() as u64;
        if len > MAX_BLOCK {
            return Err(CacheError::NoMemory);
        }
        // SAFETY: [base, base+len) lies in the arena's unused tail (MAX_BLOCK room checked
        // by arena_for); the arena is RWX and owned by the cache.
        unsafe { core::ptr::copy_nonoverlapping(t.bytes.as_ptr(), base as *mut u8, t.bytes.len()) };
        self.arenas[ai].bump = base + len;
        self.stats.blocks += 1;
        self.stats.bytes += len;
        let rec = BlockRec {
            host: base,
            kind: t.kind,
            // Only a native jump (no guest instruction, no exit) is left out of the cache;
            // a redirection (no guest instruction, one exit to the replacement) is kept, or
            // every call of a replaced function would be translated again.
            cached: t.insns > 0 || !t.stubs.is_empty(),
        };
        if !rec.cached {
            self.native.insert(pc, ());
            self.insert_host_block(base, len, pc, &[]);
            return Ok(rec);
        }
        self.blocks.insert(pc, rec);
        self.ordered.insert(pc, t.guest_len);
        let hook = ON_TRANSLATED.load(core::sync::atomic::Ordering::Relaxed);
        if hook != 0 {
            // SAFETY: only `set_on_translated` stores here, and only a `fn(u64, u64, u64)`.
            let hook: fn(u64, u64, u64) = unsafe { core::mem::transmute(hook) };
            hook(pc, base, len);
        }
        self.insert_host_block(base, len, pc, &t.pcmap);
        for s in &t.stubs {
            target(s.target);
            let stub = base + s.offset as u64;
            match self.blocks.get(&s.target) {
                Some(b) if b.kind == BlockKind::Normal => {
                    let host = b.host;
                    // SAFETY: stub is an exit stub just written; host a translated block.
                    unsafe { translate::link_stub(stub, host) };
                    self.links.entry(s.target).or_default().push(stub);
                }
                Some(_) => {}
                None => self.pending.entry(s.target).or_default().push(stub),
            }
        }
        if t.kind == BlockKind::Normal {
            if let Some(waiting) = self.pending.remove(&pc) {
                for &stub in &waiting {
                    // SAFETY: as above; stubs in `pending` are unlinked exit stubs.
                    unsafe { translate::link_stub(stub, base) };
                }
                self.links.entry(pc).or_default().extend(waiting);
            }
        } else {
            self.pending.remove(&pc);
        }
        Ok(rec)
    }

    /// Forgets the translations of guest code in `[start, end)` (the program is unmapping
    /// it or making it non-executable): later executions at those addresses translate the
    /// new contents. Direct links into the dropped blocks are reverted to exit stubs and
    /// every thread's IBL entries for them are cleared. The host code itself stays mapped
    /// (another thread may still be running it) and is simply abandoned.
    ///
    /// Limits (phase 1): IBL entries of other threads are cleared without synchronising
    /// with those threads (one may still take a stale entry once, for code that is gone).
    pub fn invalidate(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        self.drop_blocks(start, end);
    }

    /// The block at `pc` failed its entry check: drop it (and whatever overlaps it) so that
    /// the next lookup translates the current bytes.
    pub fn drop_stale(&mut self, pc: u64) {
        if let Some(&len) = self.ordered.get(&pc) {
            self.stats.stale += 1;
            self.drop_blocks(pc, pc + len.max(1));
        }
    }

    fn drop_blocks(&mut self, start: u64, end: u64) {
        let from = start.saturating_sub(translate::MAX_GUEST_SPAN);
        let pcs: Vec<u64> = self
            .ordered
            .range(from..end)
            .filter(|(pc, len)| **pc + (**len).max(1) > start)
            .map(|(pc, _)| *pc)
            .collect();
        if pcs.is_empty() {
            return;
        }
        for pc in &pcs {
            self.blocks.remove(pc);
            self.ordered.remove(pc);
            if let Some(stubs) = self.links.remove(pc) {
                for &stub in &stubs {
                    // SAFETY: every address in `links` is an exit stub we linked.
                    unsafe { translate::unlink_stub(stub) };
                }
                self.pending.entry(*pc).or_default().extend(stubs);
            }
        }
        self.stats.invalidated += pcs.len() as u64;
        let lo = pcs.iter().copied().min().unwrap_or(start);
        crate::context::purge_ibl(lo, end);
    }
}

/// Guest meaning of one translation's host bytes: its map is
/// `maps[map_start..map_start + map_len]`.
///
/// One shared array rather than a vector per block: the translator's map of a block has a
/// few dozen entries, and a vector of its own per block, rounded up to the heap's size
/// class, was the largest single item of the engine's memory (30 MiB of 512-byte vectors
/// for python3's 60,000 blocks).
struct HostBlock {
    len: u32,
    map_start: u32,
    map_len: u32,
    /// The guest pc the block was translated from: map entries are relative to it.
    guest: u64,
}

/// A [`translate::PcMapEntry`] in 32 bits: the host offset (15 bits: a block is at most
/// [`MAX_BLOCK`]), the fix-ups (7: the two flags and the far-saved register), and the guest
/// pc as bytes after the block's (10) or one of two codes. Four bytes rather than eight:
/// under Memcheck with definedness python3's 44,000 blocks have 1.2 million entries (9.3
/// MiB at eight bytes). An entry that does not fit (a guest pc before the block's start or
/// more than 1021 bytes after it, a fix-up with other bits) is [`Self::FAR`] and kept whole
/// in `CodeCache::far_entries`.
#[derive(Clone, Copy)]
struct PackedMapEntry(u32);

impl PackedMapEntry {
    const HOST_BITS: u32 = 15;
    const FIX_BITS: u32 = 7;
    const DELTA_BITS: u32 = 32 - Self::HOST_BITS - Self::FIX_BITS;
    /// `translate::UNMAPPED`: host code with no guest equivalent.
    const UNMAPPED: u32 = (1 << Self::DELTA_BITS) - 1;
    /// The entry is in `CodeCache::far_entries`.
    const FAR: u32 = (1 << Self::DELTA_BITS) - 2;

    /// The fix-up bits the two low bits of a packed entry stand for, by value: the
    /// combinations the engine makes.
    const FIX_CODES: [u16; 4] = [
        0,
        translate::FIX_RAX_IN_STUB,
        translate::FIX_RCX_PLUS_ONE,
        translate::FIX_RAX_IN_STUB | translate::FIX_FLAGS_IN_SLOT,
    ];

    /// `fix` in [`Self::FIX_BITS`]: its fix-up bits coded in bits 0-1 ([`Self::FIX_CODES`]),
    /// the far register's number plus one (`translate::FIX_FAR_SHIFT`) above them; `None`
    /// for another combination.
    fn pack_fix(fix: u16) -> Option<u32> {
        let flags = fix & ((1 << translate::FIX_FAR_SHIFT) - 1);
        let far = fix >> translate::FIX_FAR_SHIFT;
        let code = Self::FIX_CODES.iter().position(|&f| f == flags)?;
        (far < 1 << (Self::FIX_BITS - 2)).then_some(code as u32 | (far as u32) << 2)
    }

    fn new(host_off: u16, fix: u32, delta: u32) -> Self {
        PackedMapEntry(
            host_off as u32 | fix << Self::HOST_BITS | delta << (Self::HOST_BITS + Self::FIX_BITS),
        )
    }

    fn host_off(self) -> u64 {
        (self.0 & ((1 << Self::HOST_BITS) - 1)) as u64
    }

    fn fix(self) -> u16 {
        let bits = (self.0 >> Self::HOST_BITS) & ((1 << Self::FIX_BITS) - 1);
        Self::FIX_CODES[(bits & 3) as usize] | ((bits >> 2) as u16) << translate::FIX_FAR_SHIFT
    }

    fn delta(self) -> u32 {
        self.0 >> (Self::HOST_BITS + Self::FIX_BITS)
    }
}

const _: () = assert!(MAX_BLOCK < 1 << PackedMapEntry::HOST_BITS);

/// Entries the shared map array is given room for at first (64 KiB).
const MAPS_INITIAL: usize = 16 << 10;

impl CodeCache {
    /// Records the translation at host `base` (`len` bytes) of the guest block at `guest`,
    /// with the translator's host-to-guest map.
    fn insert_host_block(
        &mut self,
        base: u64,
        len: u64,
        guest: u64,
        map: &[translate::PcMapEntry],
    ) {
        let map_start = self.maps.len() as u32;
        for e in map {
            let delta = if e.guest == translate::UNMAPPED {
                Some(PackedMapEntry::UNMAPPED)
            } else {
                let d = e.guest.wrapping_sub(guest);
                (d < PackedMapEntry::FAR as u64).then_some(d as u32)
            };
            let packed = match (delta, PackedMapEntry::pack_fix(e.fix)) {
                (Some(d), Some(fix)) => PackedMapEntry::new(e.host_off, fix, d),
                _ => {
                    self.far_entries
                        .insert(base + e.host_off as u64, (e.guest, e.fix));
                    PackedMapEntry::new(e.host_off, 0, PackedMapEntry::FAR)
                }
            };
            self.maps.push(packed);
        }
        self.by_host.insert(
            base,
            HostBlock {
                len: len as u32,
                map_start,
                map_len: map.len() as u32,
                guest,
            },
        );
    }
}

/// What a host pc inside the code cache stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestAt {
    /// The guest instruction about to execute (or faulting).
    pub pc: u64,
    /// Register fix-ups (`translate::FIX_*`).
    pub fix: u16,
    /// The host pc is the first byte of that stretch: nothing of it has run yet.
    pub boundary: bool,
}

impl CodeCache {
    /// The guest state at host pc `host`: `None` if `host` is not translated guest code
    /// (engine code, a stub, the IBL, or outside the cache).
    pub fn guest_at(&self, host: u64) -> Option<GuestAt> {
        let (&start, hb) = self.by_host.range(..=host).next_back()?;
        if host >= start + hb.len as u64 {
            return None;
        }
        let off = host - start;
        let map = &self.maps[hb.map_start as usize..][..hb.map_len as usize];
        let i = map.partition_point(|e| e.host_off() <= off);
        let e = *map.get(i.checked_sub(1)?)?;
        let (pc, fix) = match e.delta() {
            PackedMapEntry::UNMAPPED => return None,
            PackedMapEntry::FAR => *self.far_entries.get(&(start + e.host_off()))?,
            d => (hb.guest.wrapping_add(d as u64), e.fix()),
        };
        if pc == translate::UNMAPPED {
            return None;
        }
        Some(GuestAt {
            pc,
            fix,
            boundary: e.host_off() == off,
        })
    }

    /// Whether `host` lies in a translation (guest code copies, stubs, inline lookups).
    pub fn in_cache(&self, host: u64) -> bool {
        self.by_host
            .range(..=host)
            .next_back()
            .is_some_and(|(&start, hb)| host < start + hb.len as u64)
    }

    /// Whether `pc` was reached by a native jump to code that was not mapped when it was
    /// translated (a fault there has a guest pc already).
    pub fn is_native_jump(&self, pc: u64) -> bool {
        self.native.contains_key(&pc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_map_entries_give_back_what_was_packed() {
        let fixes = [
            0,
            translate::FIX_RAX_IN_STUB,
            translate::FIX_RCX_PLUS_ONE,
            translate::FIX_RAX_IN_STUB | (17 << translate::FIX_FAR_SHIFT),
            16 << translate::FIX_FAR_SHIFT,
            translate::FIX_RAX_IN_STUB | translate::FIX_FLAGS_IN_SLOT,
        ];
        for host_off in [0u16, 1, 4095, MAX_BLOCK as u16] {
            for fix in fixes {
                for delta in [0, 1, 959, PackedMapEntry::FAR - 1, PackedMapEntry::UNMAPPED] {
                    let packed = PackedMapEntry::pack_fix(fix).expect("a fix-up the engine makes");
                    let e = PackedMapEntry::new(host_off, packed, delta);
                    assert_eq!(
                        (e.host_off(), e.fix(), e.delta()),
                        (host_off as u64, fix, delta)
                    );
                }
            }
        }
        // Other bits do not fit: such an entry is kept whole beside the array.
        assert_eq!(PackedMapEntry::pack_fix(8), None);
        assert_eq!(
            PackedMapEntry::pack_fix(translate::FIX_RAX_IN_STUB | translate::FIX_RCX_PLUS_ONE),
            None
        );
        assert_eq!(
            PackedMapEntry::pack_fix(32 << translate::FIX_FAR_SHIFT),
            None
        );
    }

    #[test]
    fn unmapping_the_middle_of_a_block_drops_the_block_and_its_links() {
        // Two blocks: A = nop x8; jmp B (B right after), B = ret.
        let mut code = alloc::vec![0x90u8; 8];
        code.extend_from_slice(&[0xEB, 0x00, 0xC3]);
        code.resize(64, 0xCC);
        // Guest code must be in executable memory (data the program jumps to faults).
        let a = mmap_rwx(0, false).expect("executable test memory");
        // SAFETY: a fresh mapping of ARENA_SIZE bytes.
        unsafe { core::ptr::copy_nonoverlapping(code.as_ptr(), a as *mut u8, code.len()) };
        let b = a + 10;
        let mut cache = CodeCache::new(
            Options {
                count: false,
                check: false,
                instrument: false,
                syscall_returns: false,
            },
            false,
        );
        cache.get_or_translate(a).unwrap();
        cache.get_or_translate(b).unwrap();
        assert_eq!(
            cache.links.get(&b).map(Vec::len),
            Some(1),
            "A's exit to B is linked"
        );
        // Unmapping bytes 4..5 of A removes A (it starts before the range) but not B.
        cache.invalidate(a + 4, a + 5);
        assert!(cache.lookup(a).is_none());
        assert!(cache.lookup(b).is_some());
        // Unmapping B unlinks A's stub and queues it for B's next translation.
        cache.invalidate(b, b + 1);
        assert!(cache.lookup(b).is_none());
        assert!(cache.links.get(&b).is_none());
        assert_eq!(cache.pending.get(&b).map(Vec::len), Some(1));
    }
}
