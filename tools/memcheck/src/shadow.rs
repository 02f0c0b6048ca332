//! Addressability (Memcheck's A bits) of the heap, one shadow byte per 8-byte granule.
//!
//! Why a flat shadow: every probed access must be checked, and the common answer ("all
//! addressable") has to cost one load and one compare, soon inline in the translated code
//! (the engine's filter reads this layout: shadow of address `a` at `base + (a >> 3)`).
//! The shadow is one `MAP_NORESERVE` reservation of 2^44 bytes made once, covering the
//! whole 47-bit user address space; pages never written read as zero.
//!
//! Encoding (ASan's): 0 = all 8 bytes addressable, the default everywhere (stack, globals,
//! mmap); 1..=7 = only the first k bytes are (the tail of a block whose size is not a
//! multiple of 8); [`LEFT_REDZONE`], [`RIGHT_REDZONE`], [`FREED`] = none is, and why.
//! Only heap blocks are ever marked: the left redzone is the 16 bytes before a block
//! (glibc's chunk header), the right one the 16 bytes the runtime adds after it
//! (`Needs::redzone`), rounded up to a granule; a freed block's bytes stay [`FREED`] while
//! it waits in the freed-block queue, and the whole extent goes back to 0 when the block
//! leaves the runtime's queue (`Tool::on_release`, just before glibc gets it back).
//!
//! Writers are the allocator events (blocks are 16-byte aligned, so two live blocks never
//! share a granule); readers are the probes. Bytes are accessed as `AtomicU8` with relaxed
//! ordering: a racing reader sees the old or the new state of a granule, never a torn one.

use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use oxgrind_tool::instrument::ShadowMap;
use oxgrind_tool::{BlockExtent, Host};

/// Bytes of the reservation: one shadow byte per 8 bytes of a 2^47-byte address space.
pub const SHADOW_SPAN: u64 = ShadowMap::LEN;
const PAGE: u64 = 4096;
/// Addresses at or above this have no shadow (kernel half, vsyscall page): never heap.
pub const ADDRESS_LIMIT: u64 = 1 << 47;
/// The 16 bytes before a block (glibc's chunk header).
pub const LEFT_REDZONE: u8 = 0xFA;
/// The bytes after a block, up to its 16-byte redzone's end.
pub const RIGHT_REDZONE: u8 = 0xFB;
/// A freed block still held in the freed-block queue.
pub const FREED: u8 = 0xFD;
/// Redzone bytes on each side of a block (Valgrind's default `--redzone-size`).
pub const REDZONE: u64 = 16;

static BASE: AtomicU64 = AtomicU64::new(0);
/// The map the host gave (`Needs::shadow`), kept for its page discarding; set once, before
/// BASE is published. Read on every marking, so a once-set cell (an acquire load) rather
/// than a lock (it was one lock for the whole process on every allocation and free).
static MAP: std::sync::OnceLock<ShadowMap> = std::sync::OnceLock::new();

/// Publishes `map`, or the one published first if another thread got there before.
fn publish(map: ShadowMap) {
    let first = *MAP.get_or_init(|| map);
    BASE.store(first.base(), Ordering::Release);
}

/// The published map (BASE, the caller's `base`, is non-zero only after [`publish`]).
#[inline]
fn map_at(base: u64) -> Option<ShadowMap> {
    MAP.get().copied().filter(|m| m.base() == base)
}

/// Takes the shadow map the core reserved for us (`Needs::shadow`), on the first event;
/// returns its base, 0 if there is none (the tool then checks no access, rather than fail
/// the program).
pub fn adopt(host: &dyn Host) -> u64 {
    let b = BASE.load(Ordering::Acquire);
    if b != 0 {
        return b;
    }
    let Some(map) = host.shadow() else {
        return 0;
    };
    publish(map);
    shadow_base()
}

/// The start of the shadow map, 0 before [`adopt`] found one.
#[inline]
pub fn shadow_base() -> u64 {
    BASE.load(Ordering::Acquire)
}

/// The base if the map exists already (probes never make it).
#[inline]
pub fn base_if_ready() -> u64 {
    BASE.load(Ordering::Relaxed)
}

#[inline]
fn cell(base: u64, addr: u64) -> &'static AtomicU8 {
    // SAFETY: callers keep `addr` below ADDRESS_LIMIT, so `base + (addr >> 3)` lies inside
    // the 2^44-byte reservation, which is never unmapped; AtomicU8 has u8's layout.
    unsafe { &*((base + (addr >> 3)) as *const AtomicU8) }
}

/// The eight shadow bytes of the 64 bytes at `addr` (64-aligned), as one word.
#[inline]
fn shadow_word(base: u64, addr: u64) -> u64 {
    // SAFETY: as in `cell`: `addr` is below ADDRESS_LIMIT, so the 8 bytes at
    // `base + (addr >> 3)` (8-aligned, since `addr` is 64-aligned and `base` page-aligned)
    // lie inside the reservation; a relaxed atomic load of them only ever sees some mix of
    // the bytes other threads store, which the callers re-check byte by byte.
    unsafe { &*((base + (addr >> 3)) as *const core::sync::atomic::AtomicU64) }
        .load(Ordering::Relaxed)
}

/// The shadow byte of `addr`'s granule.
#[inline]
pub fn get(base: u64, addr: u64) -> u8 {
    cell(base, addr).load(Ordering::Relaxed)
}

/// Whether every byte of `[addr, addr + size)` is addressable as far as the shadow knows:
/// every granule it touches is 0. The fast path of every probe.
#[inline]
pub fn all_addressable(base: u64, addr: u64, size: u32) -> bool {
    if size == 0 || addr >= ADDRESS_LIMIT || addr.saturating_add(size as u64) > ADDRESS_LIMIT {
        return true;
    }
    let first = addr >> 3;
    let last = (addr + size as u64 - 1) >> 3;
    (first..=last).all(|g| get(base, g << 3) == 0)
}

/// Whether byte `addr` is addressable.
#[inline]
pub fn byte_addressable(base: u64, addr: u64) -> bool {
    if addr >= ADDRESS_LIMIT {
        return true;
    }
    match get(base, addr) {
        0 => true,
        k @ 1..=7 => (addr & 7) < k as u64,
        _ => false,
    }
}

/// Whether some byte of `[lo, hi)` is addressable.
pub fn any_addressable(base: u64, lo: u64, hi: u64) -> bool {
    let mut a = lo;
    while a < hi {
        if get(base, a) == 0 || a >= ADDRESS_LIMIT {
            return true;
        }
        if byte_addressable(base, a) {
            return true;
        }
        a += 1;
    }
    false
}

/// What the unaddressable bytes of an access are.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Bytes not addressable.
    pub bad: u32,
    /// Of those, bytes outside a left redzone (a chunk header).
    pub bad_outside_header: u32,
}

/// Byte-exact check of `[addr, addr + size)` (the slow path).
pub fn verdict(base: u64, addr: u64, size: u32) -> Verdict {
    let mut v = Verdict::default();
    for a in addr..addr.saturating_add(size as u64) {
        if !byte_addressable(base, a) {
            v.bad += 1;
            if get(base, a) != LEFT_REDZONE {
                v.bad_outside_header += 1;
            }
        }
    }
    v
}

/// Sets the shadow of the granules `[lo, hi)` (addresses, multiples of 8) to `v`.
fn set(base: u64, lo: u64, hi: u64, v: u8) {
    if base == 0 || lo >= hi || hi > ADDRESS_LIMIT {
        return;
    }
    if let Some(map) = map_at(base) {
        map.set_granules(lo, hi, v);
    }
}

/// End of a block's right redzone, rounded up to a granule.
#[inline]
fn redzone_end(p: u64, size: u64) -> u64 {
    p.saturating_add(size)
        .saturating_add(REDZONE)
        .next_multiple_of(8)
}

/// Where the memory the allocator gave for a block at `p` of `size` bytes ends, from the
/// host's [`BlockExtent`]: the end of its chunk, where the next chunk's header starts.
/// Everything from the block's end to there is slack no one may touch, as in Valgrind,
/// where all the bytes between two blocks are unaddressable. Falls back to the redzone's
/// end when the host cannot say or the extent is implausible (marking more than two pages
/// of slack per block would cost more than it finds). The second value says whether a next
/// chunk's header follows (not for a chunk with a mapping of its own).
pub fn chunk_end(extent: Option<BlockExtent>, p: u64, size: u64) -> (u64, bool) {
    let rz_end = redzone_end(p, size);
    match extent {
        Some(e) if p >= REDZONE && p & 7 == 0 && e.end >= rz_end && e.end - rz_end <= 2 * PAGE => {
            (e.end, e.header_follows)
        }
        _ => (rz_end, false),
    }
}

/// The header of the chunk after a block (16 bytes at its chunk's end): glibc's, never
/// the program's, whether that chunk is a block of ours (whose left redzone it is) or free.
pub fn mark_next_header(base: u64, end: u64) {
    if base == 0 || end & 7 != 0 || end + REDZONE > ADDRESS_LIMIT {
        return;
    }
    set(base, end, end + REDZONE, LEFT_REDZONE);
}

/// A new block at `p` (16-byte aligned) of `size` bytes: its bytes become addressable, its
/// redzones and the slack up to `end` (see [`chunk_end`]) not.
pub fn mark_alloc(base: u64, p: u64, size: u64, end: u64) {
    if base == 0 || p < REDZONE || end.max(redzone_end(p, size)) > ADDRESS_LIMIT {
        return;
    }
    let end = end.max(redzone_end(p, size));
    if end - (p - REDZONE) <= 8 * SMALL_EXTENT_SHADOW as u64 {
        mark_small_alloc(base, p, size, end);
        return;
    }
    set(base, p - REDZONE, p, LEFT_REDZONE);
    let whole = p + (size & !7);
    set(base, p, whole, 0);
    let mut rz = whole;
    if size & 7 != 0 {
        cell(base, whole).store((size & 7) as u8, Ordering::Relaxed);
        rz += 8;
    }
    set(base, rz, end, RIGHT_REDZONE);
}

/// Shadow bytes of the extents [`mark_small_alloc`] writes: 512 bytes of memory.
const SMALL_EXTENT_SHADOW: usize = 64;

/// [`mark_alloc`] of an extent of at most [`SMALL_EXTENT_SHADOW`] shadow bytes (`end -
/// (p - REDZONE)` at most 512, `end` a multiple of 8), in one pass: the bytes are composed
/// in a buffer, then stored a word at a time where the shadow is word-aligned. Four
/// passes of `set_granules` (left redzone, block, tail, right redzone), each with its
/// byte loops to word alignment and back, were 250 of the 4,700 instructions Memcheck
/// added per malloc/free pair of bench `alloc` (hookcost).
fn mark_small_alloc(base: u64, p: u64, size: u64, end: u64) {
    let Some(map) = map_at(base) else { return };
    let lo = p - REDZONE;
    let n = ((end - lo) >> 3) as usize;
    let mut buf = [RIGHT_REDZONE; SMALL_EXTENT_SHADOW];
    let left = (REDZONE >> 3) as usize;
    buf[..left].fill(LEFT_REDZONE);
    let whole = (size >> 3) as usize;
    buf[left..left + whole].fill(0);
    if size & 7 != 0 {
        buf[left + whole] = (size & 7) as u8;
    }
    map.store_granules(lo, &buf[..n]);
}

/// A block given back: its bytes become unaddressable while it waits in the queue.
pub fn mark_freed(base: u64, p: u64, size: u64) {
    if base == 0 || redzone_end(p, size) > ADDRESS_LIMIT {
        return;
    }
    set(base, p, p + size.next_multiple_of(8), FREED);
}

/// A block leaving the freed-block queue (glibc gets it back): its whole extent, redzones
/// and slack included (`end` as given to [`mark_alloc`]), is ordinary memory again.
pub fn clear_block(base: u64, p: u64, size: u64, end: u64) {
    let end = end.max(redzone_end(p, size));
    if base == 0 || p < REDZONE || end > ADDRESS_LIMIT {
        return;
    }
    set(base, p - REDZONE, end, 0);
}

/// Bytes a client request made unaddressable (`VALGRIND_MAKE_MEM_NOACCESS`).
pub const CLIENT_NOACCESS: u8 = 0xF7;

/// `VALGRIND_MAKE_MEM_NOACCESS(addr, len)`: every byte of `[addr, addr + len)` becomes
/// unaddressable, as far as the encoding can say it: whole granules, and a granule's tail
/// (its first bytes staying addressable). A range that leaves a granule's tail addressable
/// but not its head cannot be written, and is left as it was: a missed error, never a false
/// one.
pub fn make_noaccess(base: u64, addr: u64, len: u64) {
    let end = addr.saturating_add(len).min(ADDRESS_LIMIT);
    if base == 0 || addr >= end {
        return;
    }
    let mut g = addr & !7;
    while g < end {
        let (lo, hi) = (addr.max(g), end.min(g + 8));
        if lo == g && hi == g + 8 {
            set(base, g, g + 8, CLIENT_NOACCESS);
        } else if hi == g + 8 {
            let keep = (lo - g) as u8;
            let cur = get(base, g);
            let k = match cur {
                0 => keep,
                1..=7 => cur.min(keep),
                _ => cur,
            };
            cell(base, g).store(k, Ordering::Relaxed);
        }
        g += 8;
    }
}

/// `VALGRIND_MAKE_MEM_DEFINED` / `_UNDEFINED(addr, len)`: every byte of the range becomes
/// addressable (we track no definedness); bytes after it in its last granule keep their
/// state.
pub fn make_accessible(base: u64, addr: u64, len: u64) {
    let end = addr.saturating_add(len).min(ADDRESS_LIMIT);
    if base == 0 || addr >= end {
        return;
    }
    let mut g = addr & !7;
    while g < end {
        let hi = end.min(g + 8);
        let cur = get(base, g);
        // A granule the range covers to its end becomes whole; one it covers part of keeps
        // its addressable first bytes and gains up to the range's end. Either may grant a
        // few bytes before the range that were not addressable: a missed error at worst.
        let k = if hi == g + 8 || cur == 0 {
            0
        } else {
            let first = if cur <= 7 { cur } else { 0 };
            first.max((hi - g) as u8)
        };
        cell(base, g).store(k, Ordering::Relaxed);
        g += 8;
    }
}

/// The first byte of `[addr, addr + len)` that is not addressable.
pub fn first_unaddressable(base: u64, addr: u64, len: u64) -> Option<u64> {
    let end = addr.saturating_add(len).min(ADDRESS_LIMIT);
    let mut a = addr;
    while a < end {
        // A system call's buffer may be megabytes long: 64 bytes whose eight shadow bytes
        // are all zero are skipped with one load.
        if a & 63 == 0 && end - a >= 64 && shadow_word(base, a) == 0 {
            a += 64;
            continue;
        }
        if get(base, a) == 0 {
            a = (a & !7) + 8;
            continue;
        }
        if !byte_addressable(base, a) {
            return Some(a);
        }
        a += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A map for the tests' addresses (all below 2^31): 256 MiB of zeroed memory stands
    /// in for the core's reservation.
    fn base() -> u64 {
        static MEM: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let mem = *MEM.get_or_init(|| {
            let v: Vec<u8> = vec![0; 1 << 28];
            Box::leak(v.into_boxed_slice()).as_mut_ptr() as usize
        });
        fn zero(start: u64, len: u64) {
            // SAFETY: ShadowMap passes whole pages of the map, all inside MEM's 256 MiB for
            // the tests' addresses.
            unsafe { core::ptr::write_bytes(start as *mut u8, 0, len as usize) };
        }
        if shadow_base() == 0 {
            // SAFETY: the tests only touch addresses below 2^31, whose shadow lies in the
            // leaked, never freed 256 MiB at `mem`; `zero` only zeroes pages of it.
            let map = unsafe { ShadowMap::new(mem as u64, zero) };
            publish(map);
        }
        shadow_base()
    }

    // Each test uses its own address range: they run in parallel on one shadow.

    #[test]
    fn a_block_is_addressable_and_its_redzones_are_not() {
        let b = base();
        let p = 0x5000_0000;
        mark_alloc(b, p, 13, 0);
        assert!(all_addressable(b, p, 8));
        // The fast path only looks at whole granules: the tail granule needs the slow one.
        assert!(!all_addressable(b, p, 13));
        assert_eq!(verdict(b, p, 13).bad, 0);
        assert_eq!(verdict(b, p, 14).bad, 1);
        assert!(byte_addressable(b, p + 12));
        assert!(!byte_addressable(b, p + 13));
        assert!(!byte_addressable(b, p + 28));
        assert!(
            byte_addressable(b, p + 32),
            "past the redzone is not the block's business"
        );
        assert!(any_addressable(b, p + 13, p + 40));
        assert!(!any_addressable(b, p + 13, p + 32));
        assert!(!byte_addressable(b, p - 1));
        assert!(!byte_addressable(b, p - 16));
        assert!(byte_addressable(b, p - 17));
        assert_eq!(
            verdict(b, p - 4, 8),
            Verdict {
                bad: 4,
                bad_outside_header: 0
            }
        );
        assert_eq!(
            verdict(b, p + 8, 8),
            Verdict {
                bad: 3,
                bad_outside_header: 3
            }
        );
    }

    #[test]
    fn every_small_block_is_marked_granule_by_granule_as_its_extent_says() {
        // Against the rule, granule by granule: left redzone, whole granules, the tail's
        // count, right redzone to the extent's end; the granules around stay untouched.
        let b = base();
        let region = 0x7200_0000u64;
        for size in 0..=300u64 {
            for slack in [0u64, 8, 24, 200] {
                // The block's shadow starts at each place a 16-aligned block's can in a
                // shadow word (p - 16 at 0, 16, 32 or 48 bytes past a multiple of 64).
                let p = region + 64 + size * 1024 + (slack & 16) + 32 * (size & 1);
                let end = redzone_end(p, size) + slack;
                set(b, p - 64, end + 64, 0x11);
                mark_alloc(b, p, size, end);
                for g in ((p - 64)..(end + 64)).step_by(8) {
                    let want = if g < p - REDZONE || g >= end {
                        0x11
                    } else if g < p {
                        LEFT_REDZONE
                    } else if g + 8 <= p + size {
                        0
                    } else if g < p + size {
                        (p + size - g) as u8
                    } else {
                        RIGHT_REDZONE
                    };
                    assert_eq!(
                        get(b, g),
                        want,
                        "size {size} slack {slack} at {}",
                        g as i64 - p as i64
                    );
                }
                set(b, p - 64, end + 64, 0);
            }
        }
    }

    #[test]
    fn freed_then_cleared_block_goes_back_to_ordinary_memory() {
        let b = base();
        let p = 0x6000_0000;
        mark_alloc(b, p, 40, p + 64);
        mark_freed(b, p, 40);
        assert!(!byte_addressable(b, p));
        assert_eq!(get(b, p + 8), FREED);
        assert!(!byte_addressable(b, p + 40 + 16 + 7));
        clear_block(b, p, 40, p + 64);
        assert!(all_addressable(b, p - 16, 40 + 40));
    }

    #[test]
    fn huge_blocks_are_marked_and_cleared_whole() {
        let b = base();
        let p = 0x7000_0000;
        let size = 1 << 20;
        mark_alloc(b, p, size, 0);
        mark_freed(b, p, size);
        assert_eq!(get(b, p + size / 2), FREED);
        clear_block(b, p, size, 0);
        assert!(all_addressable(b, p - 16, size as u32 + 32));
    }

    #[test]
    fn addresses_without_shadow_are_never_errors() {
        let b = base();
        assert!(all_addressable(b, 0xffff_ffff_ff60_0000, 8));
        assert!(byte_addressable(b, u64::MAX));
    }

    #[test]
    fn client_requests_change_addressability_as_a_naive_byte_map_says_or_miss_it() {
        // Against a byte map: after any sequence of requests, no byte the map says is
        // addressable is unaddressable in the shadow (no false alarm), and granules the
        // requests cover whole agree exactly.
        let b = base();
        let region = 0x7100_0000u64;
        let mut naive = [true; 96];
        let ops: &[(bool, u64, u64)] = &[
            (false, 0, 96),
            (false, 8, 16),
            (true, 10, 3),
            (false, 30, 5),
            (true, 27, 2),
            (false, 41, 7),
            (true, 60, 12),
            (false, 62, 3),
            (true, 16, 8),
            (false, 80, 16),
        ];
        for &(grant, at, len) in ops {
            if grant {
                make_accessible(b, region + at, len);
            } else {
                make_noaccess(b, region + at, len);
            }
            for i in at..at + len {
                naive[i as usize] = grant;
            }
            for (i, &ok) in naive.iter().enumerate() {
                let shadow_ok = byte_addressable(b, region + i as u64);
                assert!(
                    shadow_ok || !ok,
                    "byte {i} after {grant} {at}+{len}: false alarm"
                );
            }
        }
        for i in 72..96 {
            assert!(!byte_addressable(b, region + i), "byte {i}");
        }
        for i in 16..24 {
            assert!(byte_addressable(b, region + i), "byte {i}");
        }
        make_noaccess(b, region, 8);
        assert_eq!(first_unaddressable(b, region, 96), Some(region));
        make_accessible(b, region, 96);
        assert_eq!(first_unaddressable(b, region, 96), None);
        make_noaccess(b, region + 44, 4);
        assert_eq!(first_unaddressable(b, region + 40, 8), Some(region + 44));
        make_accessible(b, region, 96);
    }

    #[test]
    fn long_ranges_find_the_same_first_unaddressable_byte_as_a_byte_by_byte_scan() {
        let b = base();
        let region = 0x7100_0000u64;
        let naive = |lo: u64, len: u64| (lo..lo + len).find(|&a| !byte_addressable(b, a));
        for bad in [0u64, 5, 63, 64, 130, 1000, 4095] {
            make_noaccess(b, region + bad, 3);
            for (lo, len) in [(0u64, 4096u64), (1, 4000), (60, 200), (64, 64), (100, 3)] {
                let (lo, len) = (region + lo, len);
                assert_eq!(
                    first_unaddressable(b, lo, len),
                    naive(lo, len),
                    "{bad} {lo:#x}+{len}"
                );
            }
            make_accessible(b, region, 4200);
        }
    }
}
