//! The simulated machine: I1, D1 and LL caches and the two branch predictors, with Valgrind
//! 3.19's model (`cachegrind/cg_sim.c`, `cg_branchpred.c`), and the per-instruction costs
//! they produce.
//!
//! [`Simulator`] consumes one event stream in program order: an instruction fetch
//! ([`Simulator::instr`]), its data accesses ([`Simulator::data`]), conditional and indirect
//! branch outcomes ([`Simulator::cond_branch`], [`Simulator::ind_branch`]). Where the
//! events come from (clean-call probes today, the per-thread trace buffer later) is the
//! adapter's business (`crate::adapter`); this module knows nothing of the engine.
//!
//! The caches, as Valgrind's: set-associative, bit-selection set index, the block number as
//! tag, each set an MRU-ordered array (LRU replacement), write-allocate with writes treated
//! as reads, LL looked up only on an L1 miss. An access that straddles two lines looks up
//! both and is one miss if either misses. Every tag starts at 0, as Valgrind's arrays are
//! zeroed.
//!
//! LL lookups are deferred: an L1 miss is queued ([`LlQueue`]) and the queue is run through
//! LL, in the same order, when it fills and whenever the simulator's counts are read
//! ([`Simulator::flush`]). L1 outcomes never depend on LL, so the order of lookups each cache
//! sees, and every count, is the same as looking LL up at once; what the queue buys is that
//! LL's tag array (tens of MiB for the large last-level caches CPUID reports, far beyond the
//! host's caches) can be prefetched a few misses ahead instead of stalling on every miss.

use oxgrind_formats::cachegrind::CacheConfig;

/// One set-associative cache.
///
/// Each set's most recently used tag is kept apart from its other tags, in an array of
/// its own: most lookups that reach the simulator hit it (nearly all of LL's: an L1 miss is
/// usually a line LL just gave), and those read one word of a dense array (8 bytes a set:
/// 2 MiB for a 256 Ki-set LL, within the host's L2) instead of the first line of a set
/// that spans several host lines (30 tags of a 503 MB LL: 63 MB of tags in all).
///
/// The other tags of a set are padded to a multiple of four words, so that a lookup past the most recently used tag can compare and move them four at a time
/// ([`Cache::reorder_avx2`]): where the line is in the set varies from one lookup to the
/// next (the records that reach the simulator are mostly of a set's third line and of
/// misses), and a loop that stops where it finds the line mispredicts its exit at most
/// of them. The padding is never written (zero, as the tags start), so the arrays stay
/// untouched pages until the program's lines reach their sets.
pub struct Cache {
    assoc: usize,
    sets_min_1: u64,
    line_bits: u32,
    /// Each set's most recently used tag.
    mru: Vec<u64>,
    /// Each set's other `assoc - 1` tags, most recently used first, then padding up to
    /// `stride` words (ignored).
    rest: Vec<u64>,
    /// Words of `rest` per set: `assoc - 1` rounded up to a multiple of 4.
    stride: usize,
    /// Lookups past the most recently used tag take [`Cache::reorder_avx2`]: the host has
    /// AVX2, and the sets have other tags, at most 64 (one bit each in a word).
    avx2: bool,
    /// Lookups past the most recently used tag take [`Cache::reorder_avx512`] instead: the
    /// host has AVX-512F (the OS saving its state) and BMI1, and each set's other tags are
    /// one 64-byte group (`stride` 8: 6- to 9-way caches, the host's own 8-way L1s among
    /// them). Implies `avx2`.
    avx512: bool,
    /// With `avx512`: the lanes of a set's group that hold tags (not padding), and the
    /// last of them (the least recently used tag's, which a miss evicts), as bit masks.
    real_lanes: u32,
    last_lane: u32,
}

/// Whether the host can run [`Cache::reorder_avx512`]: AVX-512F with the OS saving the
/// opmask and ZMM state (`is_x86_feature_detected` checks XCR0 for it), and BMI1.
#[cfg(target_arch = "x86_64")]
fn host_has_avx512() -> bool {
    std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("bmi1")
}

/// The words of `others` (a set's other tags) equal to `tag`, as bits (bit `i`:
/// `others[i]`; the first 64 only).
fn matches_scalar(others: &[u64], tag: u64) -> u64 {
    others
        .iter()
        .take(64)
        .enumerate()
        .fold(0, |m, (i, &t)| m | u64::from(t == tag) << i)
}

/// [`matches_scalar`], four words at a time (a set's `stride` words: at most 64, a
/// multiple of 4 where AVX2 is used).
///
/// # Safety
/// The host must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn matches_avx2(others: &[u64], tag: u64) -> u64 {
    use core::arch::x86_64::*;
    let t = _mm256_set1_epi64x(tag as i64);
    let mut m = 0u64;
    for (g, four) in others.chunks_exact(4).enumerate() {
        // SAFETY: `four` is 4 words (an unaligned load).
        let v = unsafe { _mm256_loadu_si256(four.as_ptr() as *const __m256i) };
        let eq = _mm256_castsi256_pd(_mm256_cmpeq_epi64(v, t));
        m |= (_mm256_movemask_pd(eq) as u64) << (4 * g);
    }
    m
}

impl Cache {
    /// `config` must have been validated (`crate::config::check`).
    pub fn new(config: &CacheConfig) -> Cache {
        #[cfg(target_arch = "x86_64")]
        let (avx2, avx512) = (std::is_x86_feature_detected!("avx2"), host_has_avx512());
        #[cfg(not(target_arch = "x86_64"))]
        let (avx2, avx512) = (false, false);
        Cache::with_features(config, avx2, avx512)
    }

    /// As [`Cache::new`], with AVX2 and AVX-512 used or not (each only if the host has it).
    fn with_features(config: &CacheConfig, avx2: bool, avx512: bool) -> Cache {
        let sets = (config.size / config.line / config.assoc) as usize;
        let others = config.assoc as usize - 1;
        let stride = others.div_ceil(4) * 4;
        let avx2 = avx2 && others > 0 && stride <= 64;
        // The masks matter only with `avx512`, where `others` is 5 to 8 (6- to 9-way).
        let lanes = others.min(8);
        Cache {
            avx512: avx2 && avx512 && stride == 8,
            real_lanes: (1u32 << lanes) - 1,
            last_lane: (1u32 << lanes) >> 1,
            assoc: config.assoc as usize,
            sets_min_1: sets as u64 - 1,
            line_bits: config.line.trailing_zeros(),
            mru: vec![0; sets],
            rest: vec![0; sets * stride],
            stride,
            avx2,
        }
    }

    pub fn line_bits(&self) -> u32 {
        self.line_bits
    }

    /// Asks the host to bring the most recently used tag of the set `addr` maps to into
    /// its caches (the one a lookup reads first, and usually the only one): a hint, it
    /// changes no state.
    #[inline(always)]
    fn prefetch(&self, addr: u64) {
        let set = ((addr >> self.line_bits) & self.sets_min_1) as usize;
        oxgrind_tool::hint::prefetch_read(&self.mru[set]);
    }

    /// When the line at `addr` is not (now) its set's most recently used, asks the host to
    /// bring the set's other tags into its caches too, as a lookup of it will read them
    /// (unless the lookups before it change the set meanwhile): a hint, it changes no state.
    #[inline(always)]
    fn prefetch_rest(&self, addr: u64) {
        if self.stride == 0 {
            // Direct-mapped (the LL CPUID gives on AMD hosts: 256 MiB, 4 Mi sets): no other
            // tags, and the test below would be a load of the most recently used tag, most
            // likely a host cache miss (its prefetch, issued further ahead, is under way),
            // for nothing: the flush stalled on it (18% of its samples on python3).
            return;
        }
        let block = addr >> self.line_bits;
        let set = (block & self.sets_min_1) as usize;
        if self.mru[set] == block {
            return;
        }
        let ways = &self.rest[set * self.stride..(set + 1) * self.stride];
        // One hint per host line the tags span (64-byte lines).
        let mut at = 0;
        while at < ways.len() {
            oxgrind_tool::hint::prefetch_read(&ways[at]);
            at += 8;
        }
    }

    /// Looks `block` up in its set, making it the most recently used; true on a miss (the
    /// least recently used tag is evicted). The common case, the set's most recently used
    /// line again (which changes nothing), is inline; the rest is not.
    #[inline(always)]
    fn set_ref_is_miss(&mut self, block: u64) -> bool {
        let set = (block & self.sets_min_1) as usize;
        // `set` is at most `sets_min_1`, below the length of `mru`.
        if self.mru[set] == block {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        if self.avx512 {
            // SAFETY: `avx512` is only set when the host has AVX-512F and BMI1 and `stride`
            // is 8 (`Cache::with_features`).
            return unsafe { self.reorder_avx512(set, block) };
        }
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: `avx2` is only set when the host has AVX2 (`Cache::new`); `GROUPS`,
            // when not 0, is `stride / 4`.
            return unsafe {
                match self.stride {
                    8 => self.reorder_avx2::<2>(set, block),
                    12 => self.reorder_avx2::<3>(set, block),
                    16 => self.reorder_avx2::<4>(set, block),
                    _ => self.reorder_avx2::<0>(set, block),
                }
            };
        }
        self.reorder(set, block)
    }

    /// The rest of a lookup: `block` is not the most recently used line of `set`: makes
    /// it so, moving the tags before it (or, on a miss, all of them: the least recently
    /// used one leaves) one place down.
    #[inline(never)]
    fn reorder(&mut self, set: usize, block: u64) -> bool {
        let mut carry = core::mem::replace(&mut self.mru[set], block);
        let ways = &mut self.rest[set * self.stride..][..self.assoc - 1];
        // One pass: shift each tag down until `block` is found (a hit) or the last way is
        // overwritten (a miss).
        for t in ways.iter_mut() {
            let was = core::mem::replace(t, carry);
            if was == block {
                return false;
            }
            carry = was;
        }
        true
    }

    /// [`Cache::reorder`] without a branch on where `block` is: its place among the
    /// set's other tags (the last one's on a miss) comes from comparing them all, four at a
    /// time; then every group of four is rewritten, each tag up to that place replaced by
    /// the one before it (the first by the old most recently used tag).
    ///
    /// `GROUPS`: the groups of four tags a set has (`stride / 4`, 0: read it), fixed for
    /// the usual L1 geometries (8-, 12- and 16-way) so that the loops over them are unrolled.
    ///
    /// # Safety
    /// The host must have AVX2, and the sets must have other tags, at most 64 words of them
    /// with the padding; `GROUPS` is 0 or `stride / 4`.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn reorder_avx2<const GROUPS: usize>(&mut self, set: usize, block: u64) -> bool {
        use core::arch::x86_64::*;
        let carry = core::mem::replace(&mut self.mru[set], block);
        let groups = if GROUPS == 0 { self.stride / 4 } else { GROUPS };
        let ways = &mut self.rest[set * self.stride..(set + 1) * self.stride];
        let at = ways.as_mut_ptr() as *mut __m256i;
        let wanted = _mm256_set1_epi64x(block as i64);
        let mut found: u64 = 0;
        for g in 0..groups {
            // SAFETY: group `g` is the set's words 4g..4g+4, within `ways` (stride = 4 *
            // groups); unaligned loads and stores are allowed anywhere in it.
            let tags = unsafe { _mm256_loadu_si256(at.add(g)) };
            let same = _mm256_castsi256_pd(_mm256_cmpeq_epi64(tags, wanted));
            found |= (_mm256_movemask_pd(same) as u64) << (4 * g);
        }
        // The first match among the real tags (the padding's bits cleared: it may equal
        // `block`); without one the last real tag is the one that leaves. The padding stays
        // as it is below: its lanes come after `place`.
        let others = self.assoc - 1;
        found &= u64::MAX >> (64 - others);
        let place = (found | 1 << (others - 1)).trailing_zeros();
        let place = _mm256_set1_epi64x(i64::from(place));
        // Lane 3 of the group before the first: the old most recently used tag.
        let mut before = _mm256_set1_epi64x(carry as i64);
        let mut index = _mm256_setr_epi64x(0, 1, 2, 3);
        for g in 0..groups {
            // SAFETY: as above.
            let tags = unsafe { _mm256_loadu_si256(at.add(g)) };
            // [before[3], tags[0], tags[1], tags[2]]: each tag's predecessor.
            let halves = _mm256_permute2x128_si256::<0x21>(before, tags);
            let shifted = _mm256_alignr_epi8::<8>(tags, halves);
            let keep = _mm256_cmpgt_epi64(index, place);
            // SAFETY: as above.
            unsafe { _mm256_storeu_si256(at.add(g), _mm256_blendv_epi8(shifted, tags, keep)) };
            before = tags;
            index = _mm256_add_epi64(index, _mm256_set1_epi64x(4));
        }
        found == 0
    }

    /// [`Cache::reorder_avx2`] for sets whose other tags are one 64-byte group, in one
    /// AVX-512 register: the same result and the same state (padding lanes included, which
    /// neither writes), by a shorter dependency chain (the lookup is latency-bound: the
    /// records that reach it are mostly of lines past the most recently used one). The
    /// tags are compared into an opmask; the lanes that change, those up to the first
    /// match among the real tags (or up to the last real tag: a miss), are `blsmsk` of
    /// that mask with the last real lane's bit added; they receive their predecessor
    /// (lane 0 the old most recently used tag) by one `valignq` and a masked store.
    ///
    /// Inline assembly, not intrinsics: the workspace's Rust (1.80) has neither the
    /// AVX-512 intrinsics nor `#[target_feature(enable = "avx512f")]` stable, nor the
    /// `zmm_reg`/`kreg` operand classes without that feature. The registers are named in
    /// the text instead: `zmm16`-`zmm19` and `k1`, `k2`, which code compiled without
    /// AVX-512F never allocates (its register classes end at `xmm15`/`ymm15` and have no
    /// opmasks), so nothing the compiler keeps is in them; built with AVX-512F enabled
    /// they are declared clobbered. The program's values in them are not ours to keep:
    /// every way into the tool from the program's code saves and restores the XSAVE
    /// state with the opmask and all ZMM components (the engine's `ENGINE_XSTATE`, 0xFF:
    /// libc's string functions use these registers too), and native callers are Rust
    /// code, for which the ABI makes every vector and opmask register caller-saved.
    ///
    /// # Safety
    /// The host must have AVX-512F with the OS saving its state, and BMI1
    /// ([`host_has_avx512`]); `stride` must be 8.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn reorder_avx512(&mut self, set: usize, block: u64) -> bool {
        let carry = core::mem::replace(&mut self.mru[set], block);
        let ways = &mut self.rest[set * 8..set * 8 + 8];
        let at = ways.as_mut_ptr();
        let found: u32;
        macro_rules! lookup {
            ($($clobbers:tt)*) => {
                // SAFETY: `at` addresses the set's 8 words (`ways`), read and written whole
                // (unaligned, masked for the store); the caller vouches for the
                // instructions; the registers are discussed above.
                unsafe {
                    core::arch::asm!(
                        "vpbroadcastq zmm16, {block}",
                        "vmovdqu64 zmm17, [{at}]",
                        "vpcmpeqq k1, zmm17, zmm16",
                        "kmovw {found:e}, k1",
                        "and {found:e}, {real:e}",
                        "mov {place:e}, {found:e}",
                        "or {place:e}, {last:e}",
                        "blsmsk {place:e}, {place:e}",
                        "kmovw k2, {place:e}",
                        "vpbroadcastq zmm18, {carry}",
                        "valignq zmm19, zmm17, zmm18, 7",
                        "vmovdqu64 [{at}]{{k2}}, zmm19",
                        at = in(reg) at,
                        block = in(reg) block,
                        carry = in(reg) carry,
                        real = in(reg) self.real_lanes,
                        last = in(reg) self.last_lane,
                        found = out(reg) found,
                        place = out(reg) _,
                        $($clobbers)*
                        options(nostack),
                    )
                }
            };
        }
        #[cfg(not(target_feature = "avx512f"))]
        lookup!();
        #[cfg(target_feature = "avx512f")]
        lookup!(out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
            out("k1") _, out("k2") _,);
        found == 0
    }

    /// The replay of a lookup of `block` that a thread's code-lines table, which names its
    /// set's first `ways` lines in recency order, did not find, putting it first and
    /// letting `evicted`, its last, go (`TraceRecord::code_miss`). The set keeps those
    /// first `ways` places as a set, in no particular order (the table's hits, which only
    /// reorder them, never reach the simulator), and the others in LRU order: `block`
    /// takes `evicted`'s place, and `evicted`, now the most recently used line beyond the
    /// table's, goes first among the others, where `block` leaves them (a hit) or the
    /// least recently used line leaves the set (a miss). This is the LRU lookup exactly
    /// while the set's first places hold the table's lines: from the start, where the
    /// table's first records (no line leaving: `evicted` is `u64::MAX`) take the plain LRU
    /// lookup as the set's first places fill. When `evicted` is not among them (a table
    /// emptied by a hold or a fork, another thread's table: the tables are per thread) the
    /// lookup is the plain one too, which holds the set's lines but not, for the places
    /// that were the table's, their order: a later miss may then let another line go than
    /// Valgrind's (as a swap bit lost with an emptied table did). True on a miss.
    /// Inline: its caller, a code-miss record's replay, is in the AVX2-compiled consume
    /// loop, where [`matches_avx2`] inlines too.
    #[inline(always)]
    fn replace(&mut self, block: u64, evicted: u64, ways: usize) -> bool {
        let set = (block & self.sets_min_1) as usize;
        if evicted == u64::MAX || ways == 0 {
            return self.set_ref_is_miss(block);
        }
        // Where `evicted` is among the first places varies from record to record: a
        // search that stopped at it mispredicted its exit at most of them (a quarter of
        // this function's samples on sqlite3). Every place is compared, and the first
        // match wins, as the search's did.
        let firsts = match ways - 1 {
            n @ 0..64 => (1u64 << n) - 1,
            _ => u64::MAX,
        };
        let others = &self.rest[set * self.stride..][..self.stride];
        #[cfg(target_arch = "x86_64")]
        let matches = if self.avx2 {
            // SAFETY: `avx2` is only set when the host has AVX2 (`Cache::new`).
            unsafe { matches_avx2(others, evicted) }
        } else {
            matches_scalar(&others[..ways - 1], evicted)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let matches = matches_scalar(&others[..ways - 1], evicted);
        let matches = matches & firsts;
        let at = if self.mru[set] == evicted {
            0
        } else if matches != 0 {
            matches.trailing_zeros() as usize + 1
        } else {
            return self.set_ref_is_miss(block);
        };
        let rest = &mut self.rest[set * self.stride..][..self.assoc - 1];
        // `block` among the places from `ways` on (none of the first: the table did not
        // name it), or the last place on a miss.
        let found = rest[ways - 1..].iter().position(|&t| t == block);
        let end = found.map_or(self.assoc - 1, |i| i + ways);
        // Places ways..end - 1 move down one (the one at `end` is `block` or leaves), and
        // `evicted` goes to place `ways`.
        if ways < self.assoc {
            for p in (ways + 1..=end).rev() {
                rest[p - 1] = rest[p - 2];
            }
            rest[ways - 1] = evicted;
        }
        if at == 0 {
            self.mru[set] = block;
        } else {
            rest[at - 1] = block;
        }
        found.is_none()
    }

    /// Swaps the two most recently used lines of the set of line `block` (a thread's
    /// recent-lines table skipped accesses that did so: `TraceRecord::swaps`).
    /// Inline: with AVX2 it is one call, to [`Cache::swap_first_two_avx2`].
    #[inline(always)]
    fn swap_first_two(&mut self, block: u64) {
        let set = (block & self.sets_min_1) as usize;
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: `avx2` is only set when the host has AVX2 (`Cache::new`).
            unsafe { self.swap_first_two_avx2(set) };
            return;
        }
        if self.assoc > 1 {
            core::mem::swap(&mut self.mru[set], &mut self.rest[set * self.stride]);
        }
    }

    /// [`Cache::swap_first_two`] where lookups take [`Cache::reorder_avx2`]: the set's
    /// first group of other tags is read and written whole, as that lookup reads it (a
    /// store of one word of it, still in the host's store buffer, cannot be forwarded to
    /// the group's load: the lookup that follows a swap in the same set would wait for it).
    ///
    /// # Safety
    /// As [`Cache::reorder_avx2`].
    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    #[target_feature(enable = "avx2")]
    unsafe fn swap_first_two_avx2(&mut self, set: usize) {
        use core::arch::x86_64::*;
        let ways = &mut self.rest[set * self.stride..(set + 1) * self.stride];
        let at = ways.as_mut_ptr() as *mut __m256i;
        // SAFETY: the set has at least one group of four words (`stride` >= 4).
        let first = unsafe { _mm256_loadu_si256(at) };
        let mru = _mm256_set1_epi64x(self.mru[set] as i64);
        self.mru[set] = _mm256_extract_epi64::<0>(first) as u64;
        // SAFETY: as above.
        unsafe { _mm256_storeu_si256(at, _mm256_blend_epi32::<0b11>(first, mru)) };
    }

    /// One access of `size` bytes at `addr`: true if it misses. An access straddling two
    /// lines looks both up (both update the state) and misses if either does.
    #[inline(always)]
    pub fn ref_is_miss(&mut self, addr: u64, size: u64) -> bool {
        let b1 = addr >> self.line_bits;
        let b2 = addr.wrapping_add(size.max(1) - 1) >> self.line_bits;
        if b1 == b2 {
            self.set_ref_is_miss(b1)
        } else {
            // Sizes are clamped to the smallest line size, so at most two lines.
            let m1 = self.set_ref_is_miss(b1);
            let m2 = self.set_ref_is_miss(b2);
            m1 || m2
        }
    }
}

/// Which cache a queued L1 miss missed: the L1 miss column it charges (I1mr, D1mr,
/// D1mw) and, where LL misses too, the LL column one after it (ILmr, DLmr, DLmw).
#[derive(Clone, Copy)]
enum Source {
    Instr = I1MR as isize,
    Read = D1MR as isize,
    Write = D1MW as isize,
}
const _: () = assert!(ILMR == I1MR + 1 && DLMR == D1MR + 1 && DLMW == D1MW + 1);

/// An L1 miss waiting for its LL lookup.
#[derive(Clone, Copy)]
struct LlRef {
    addr: u64,
    size: u32,
    id: u32,
    column: Source,
}

/// L1 misses queued for LL, in program order (see the module's comment). Their L1 misses
/// are charged with their LL lookups, not when they happen: an instruction's costs (a
/// slot of 104 bytes among hundreds of thousands in a large program) are then written
/// only for misses, a few at a time with the slots prefetched ahead, instead of at every
/// lookup that reaches the simulator (most of them hits), each a likely host cache miss.
struct LlQueue {
    /// [`LL_QUEUE`] entries, the first `len` queued.
    refs: Box<[LlRef]>,
    len: usize,
}

/// Misses queued before LL is looked up: enough that the prefetches run well ahead, few
/// enough that the queue stays in the host's L1.
const LL_QUEUE: usize = 256;
/// How many misses ahead the most recently used tag of the LL set is prefetched.
const LL_PREFETCH_AHEAD: usize = 16;
/// How many misses ahead the other tags of the LL set are prefetched, when the most
/// recently used one (by then in the host's caches) is another line's.
const LL_PREFETCH_REST_AHEAD: usize = 8;
/// How many misses ahead the costs of the missing instruction are prefetched.
const COSTS_PREFETCH_AHEAD: usize = 8;

/// Valgrind's conditional-branch predictor: 2^14 two-bit saturating counters indexed by 7
/// bits of global taken history and the low 7 bits of the branch address (x86 uses them
/// as they are).
pub struct CondPredictor {
    history: u64,
    counters: Vec<u8>,
}

const HIST_BITS: u32 = 7;
const IADDR_BITS: u32 = 7;

impl CondPredictor {
    pub fn new() -> Self {
        CondPredictor {
            history: 0,
            counters: vec![0; 1 << (HIST_BITS + IADDR_BITS)],
        }
    }

    /// Records the outcome of the branch at `pc`; true if it was mispredicted.
    pub fn predict(&mut self, pc: u64, taken: bool) -> bool {
        let hist = self.history & ((1 << HIST_BITS) - 1);
        let idx = ((hist << IADDR_BITS) | (pc & ((1 << IADDR_BITS) - 1))) as usize;
        let c = &mut self.counters[idx];
        let predicted = *c >= 2;
        self.history = (self.history << 1) | u64::from(taken);
        if taken {
            *c = (*c + 1).min(3);
        } else {
            *c = c.saturating_sub(1);
        }
        predicted != taken
    }
}

impl Default for CondPredictor {
    fn default() -> Self {
        Self::new()
    }
}

/// Valgrind's indirect-branch predictor: 512 entries indexed by the low 9 address bits,
/// each the last target seen there.
pub struct IndPredictor {
    targets: Vec<u64>,
}

impl IndPredictor {
    pub fn new() -> Self {
        IndPredictor {
            targets: vec![0; 512],
        }
    }

    pub fn predict(&mut self, pc: u64, target: u64) -> bool {
        let slot = &mut self.targets[(pc & 511) as usize];
        let miss = *slot != target;
        *slot = target;
        miss
    }
}

impl Default for IndPredictor {
    fn default() -> Self {
        Self::new()
    }
}

/// The cache simulation's event counts of one instruction (Ir, then the I1, D1 and LL
/// columns), in cachegrind.out's column order. The branch columns, which follow them in
/// the file, are kept in rows of their own ([`BranchCosts`]), made only with
/// `--branch-sim=yes`: without it a row is 72 bytes, not 104 (python3's run charges
/// several hundred thousand of them, and each miss the simulator charges touches one).
pub type Costs = [u64; 9];
/// The branch simulation's counts of one instruction: Bc, Bcm, Bi, Bim (the file's columns
/// [`BC`] to [`BIM`], at `column - BC` here).
pub type BranchCosts = [u64; 4];
/// Columns of the file, both row kinds together.
pub const COLUMNS: usize = 13;

/// Where the file's branch column `column` ([`BC`] to [`BIM`]) is in a [`BranchCosts`] row.
#[inline(always)]
const fn in_branch_row(column: usize) -> usize {
    column - BC
}

/// Every column of instruction `id`'s costs, in the file's order, from the simulator's two
/// tables ([`Simulator::costs`], [`Simulator::branch_costs`]; the branch columns 0 without
/// the branch simulation).
pub fn row(costs: &[Costs], branch_costs: &[BranchCosts], id: usize) -> [u64; COLUMNS] {
    let mut all = [0; COLUMNS];
    if let Some(c) = costs.get(id) {
        all[..c.len()].copy_from_slice(c);
    }
    if let Some(b) = branch_costs.get(id) {
        all[BC..].copy_from_slice(b);
    }
    all
}
pub const IR: usize = 0;
pub const I1MR: usize = 1;
pub const ILMR: usize = 2;
pub const DR: usize = 3;
pub const D1MR: usize = 4;
pub const DLMR: usize = 5;
pub const DW: usize = 6;
pub const D1MW: usize = 7;
pub const DLMW: usize = 8;
pub const BC: usize = 9;
pub const BCM: usize = 10;
pub const BI: usize = 11;
pub const BIM: usize = 12;

/// The whole simulated machine and the costs it charged, per instruction id.
pub struct Simulator {
    i1: Cache,
    d1: Cache,
    ll: Cache,
    cond: CondPredictor,
    ind: IndPredictor,
    cache_sim: bool,
    branch_sim: bool,
    /// Accesses larger than this are clamped to it (Valgrind: the smallest line size).
    max_access: u64,
    /// Costs by instruction id (see `crate::adapter::Instr`); the L1 and LL misses are complete
    /// only after [`Simulator::flush`].
    pub costs: Vec<Costs>,
    /// Branch costs by instruction id, as long as `costs` with the branch simulation, empty
    /// without it.
    pub branch_costs: Vec<BranchCosts>,
    /// How many times each block (the adapter's numbering) ran: its instructions' Ir.
    block_runs: Vec<u64>,
    /// L1 misses not yet looked up in LL.
    ll_queue: LlQueue,
    /// See [`Simulator::set_code_table_ways`].
    code_ways: usize,
}

impl Simulator {
    pub fn new(
        i1: &CacheConfig,
        d1: &CacheConfig,
        ll: &CacheConfig,
        cache_sim: bool,
        branch_sim: bool,
    ) -> Self {
        Simulator {
            i1: Cache::new(i1),
            d1: Cache::new(d1),
            ll: Cache::new(ll),
            cond: CondPredictor::new(),
            ind: IndPredictor::new(),
            cache_sim,
            branch_sim,
            max_access: i1.line.min(d1.line).min(ll.line),
            costs: Vec::new(),
            branch_costs: Vec::new(),
            block_runs: Vec::new(),
            ll_queue: LlQueue {
                refs: vec![
                    LlRef {
                        addr: 0,
                        size: 0,
                        id: 0,
                        column: Source::Read,
                    };
                    LL_QUEUE
                ]
                .into_boxed_slice(),
                len: 0,
            },
            code_ways: 0,
        }
    }

    /// An L1 miss of `size` bytes at `addr` by instruction `id`: its LL lookup, which
    /// charges `column` on a miss, joins the queue.
    #[inline(always)]
    fn queue_ll(&mut self, id: u32, addr: u64, size: u64, column: Source) {
        self.queue_ll_if(true, id, addr, size, column);
    }

    /// [`Simulator::queue_ll`] if `miss`, without a branch on it (whether a data access
    /// misses D1 is not predictable): the entry is written either way, and counted only on
    /// a miss.
    #[inline(always)]
    fn queue_ll_if(&mut self, miss: bool, id: u32, addr: u64, size: u64, column: Source) {
        let q = &mut self.ll_queue;
        // `len` stays below `LL_QUEUE`, the length of `refs`: the queue is run when full.
        q.refs[q.len] = LlRef {
            addr,
            size: size as u32,
            id,
            column,
        };
        q.len += usize::from(miss);
        if q.len >= LL_QUEUE {
            self.flush();
        }
    }

    /// Charges every queued L1 miss and looks it up in LL, in order, charging the LL
    /// misses. Must run before [`Simulator::costs`] is read.
    #[inline(never)]
    pub fn flush(&mut self) {
        let queue = core::mem::take(&mut self.ll_queue.refs);
        let refs = &queue[..self.ll_queue.len];
        for r in refs.iter().take(LL_PREFETCH_AHEAD) {
            self.ll.prefetch(r.addr);
        }
        for r in refs.iter().take(LL_PREFETCH_REST_AHEAD) {
            self.ll.prefetch_rest(r.addr);
        }
        for r in refs.iter().take(COSTS_PREFETCH_AHEAD) {
            self.prefetch_costs(r);
        }
        for i in 0..refs.len() {
            if let Some(ahead) = refs.get(i + LL_PREFETCH_AHEAD) {
                self.ll.prefetch(ahead.addr);
            }
            if let Some(ahead) = refs.get(i + LL_PREFETCH_REST_AHEAD) {
                self.ll.prefetch_rest(ahead.addr);
            }
            if let Some(ahead) = refs.get(i + COSTS_PREFETCH_AHEAD) {
                self.prefetch_costs(ahead);
            }
            let r = refs[i];
            let ll_miss = self.ll.ref_is_miss(r.addr, r.size as u64);
            let c = self.slot(r.id);
            c[r.column as usize] += 1;
            c[r.column as usize + 1] += u64::from(ll_miss);
        }
        self.ll_queue.len = 0;
        self.ll_queue.refs = queue;
    }

    /// Asks the host to bring the costs a queued miss charges into its caches: a hint.
    #[inline(always)]
    fn prefetch_costs(&self, r: &LlRef) {
        if let Some(c) = self.costs.get(r.id as usize) {
            oxgrind_tool::hint::prefetch_read(&c[r.column as usize]);
        }
    }

    #[inline(always)]
    fn slot(&mut self, id: u32) -> &mut Costs {
        let id = id as usize;
        if id >= self.costs.len() {
            self.grow(id);
        }
        &mut self.costs[id]
    }

    /// Makes the costs of indices up to `id` exist. Only those are written (zeroed): the
    /// vector's own growth keeps the resizing amortised, and the capacity beyond them is
    /// never touched, so never resident. (Rounding the length up to a power of two wrote
    /// up to twice the rows needed: at python3's exit, where every translated instruction
    /// is charged its runs, 85 MB of RSS came in at once.)
    #[inline(never)]
    fn grow(&mut self, id: usize) {
        self.costs.resize(id + 1, [0; 9]);
        if self.branch_sim {
            self.branch_costs.resize(id + 1, [0; 4]);
        }
    }

    /// The branch costs of instruction `id` (with the branch simulation: they exist
    /// exactly where its costs do).
    #[inline(always)]
    fn branch_slot(&mut self, id: u32) -> &mut BranchCosts {
        let id = id as usize;
        if id >= self.branch_costs.len() {
            self.grow(id);
        }
        &mut self.branch_costs[id]
    }

    /// Block `b` is entered: each of its instructions executes once (charged as Ir by
    /// [`Simulator::charge_runs`] at the end, not one by one).
    /// `max_id`: the largest cost index of its instructions, whose costs are made to exist
    /// now, so that the block's events find them without a check of their own.
    /// `count`: the run is counted here (not inline).
    #[inline(always)]
    pub fn block_entered(&mut self, b: u32, max_id: u32, count: bool) {
        let b = b as usize;
        if count {
            if b >= self.block_runs.len() {
                self.block_runs.resize(b + 1, 0);
            }
            self.block_runs[b] += 1;
        }
        if max_id as usize >= self.costs.len() {
            self.grow(max_id as usize);
        }
    }

    /// Charges each instruction of block `b` (its id, and its Dr and Dw per run where
    /// they are fixed) for every run of it (those seen here, plus `inline_runs` counted
    /// elsewhere): Ir, and Dr and Dw with the cache simulation.
    pub fn charge_runs(
        &mut self,
        b: u32,
        inline_runs: u64,
        instrs: impl Iterator<Item = (u32, (u8, u8))>,
    ) {
        let runs = self.block_runs.get(b as usize).copied().unwrap_or(0) + inline_runs;
        if runs == 0 {
            return;
        }
        let cache_sim = self.cache_sim;
        for (id, (reads, writes)) in instrs {
            let c = self.slot(id);
            c[IR] += runs;
            if cache_sim {
                c[DR] += runs * u64::from(reads);
                c[DW] += runs * u64::from(writes);
            }
        }
    }

    /// Charges instruction `id`, a `rep` string instruction, the Dr and Dw of `iterations`
    /// iterations of `(reads, writes)` each (its Ir is charged per entry, as block runs).
    pub fn charge_iterations(&mut self, id: u32, iterations: u64, (reads, writes): (u8, u8)) {
        if !self.cache_sim || iterations == 0 {
            return;
        }
        let c = self.slot(id);
        c[DR] += iterations * u64::from(reads);
        c[DW] += iterations * u64::from(writes);
    }

    /// Whether branches are simulated (their outcomes are worth working out).
    #[inline(always)]
    pub fn branch_sim(&self) -> bool {
        self.branch_sim
    }

    /// The I1 lookup of instruction `id`'s fetch (`len` bytes at `pc`), without its Ir.
    #[inline(always)]
    pub fn fetch(&mut self, id: u32, pc: u64, len: u64) {
        if self.cache_sim && self.i1.ref_is_miss(pc, len) {
            self.queue_ll(id, pc, len, Source::Instr);
        }
    }

    /// Whether the caches' lookups use AVX2 (so the host has it).
    #[inline(always)]
    pub fn lookups_use_avx2(&self) -> bool {
        self.i1.avx2 && self.d1.avx2
    }

    /// Whether the cache simulation is on.
    #[inline(always)]
    pub fn cache_sim(&self) -> bool {
        self.cache_sim
    }

    /// log2 of I1's line size.
    #[inline(always)]
    pub fn i1_line_bits(&self) -> u32 {
        self.i1.line_bits
    }

    /// Looks I1 line `line` up (making it the most recently used of its set): true on a
    /// miss, which the caller charges with [`Simulator::i1_miss`].
    #[inline(always)]
    pub fn i1_line_is_miss(&mut self, line: u64) -> bool {
        self.i1.set_ref_is_miss(line)
    }

    /// Charges instruction `id`'s fetch (`len` bytes at `pc`) an I1 miss, and queues its
    /// LL lookup.
    pub fn i1_miss(&mut self, id: u32, pc: u64, len: u64) {
        self.queue_ll(id, pc, len, Source::Instr);
    }

    /// Instruction `id` (`len` bytes at `pc`) is fetched and executed once.
    #[inline]
    pub fn instr(&mut self, id: u32, pc: u64, len: u64) {
        self.slot(id)[IR] += 1;
        self.fetch(id, pc, len);
    }

    /// A data access by instruction `id`: `write` for a store, false for a load or a
    /// read-modify-write (which Valgrind counts as one read).
    #[inline(always)]
    pub fn data(&mut self, id: u32, addr: u64, size: u64, write: bool) {
        if !self.cache_sim {
            return;
        }
        let size = size.min(self.max_access);
        let m1 = self.d1.ref_is_miss(addr, size);
        let (a, d) = if write {
            (DW, Source::Write)
        } else {
            (DR, Source::Read)
        };
        self.slot(id)[a] += 1;
        self.queue_ll_if(m1, id, addr, size, d);
    }

    /// Before a data access of `size` bytes at `addr`: `swaps` (`TraceRecord::swaps`)
    /// says which of its lines' sets had their two most recently used lines change places
    /// since the thread's last record there (bit 0: the first line's, bit 1: the last's).
    #[inline(always)]
    pub fn d1_swaps(&mut self, addr: u64, size: u64, swaps: u8) {
        if swaps == 0 || !self.cache_sim {
            return;
        }
        let size = size.min(self.max_access);
        let b1 = addr >> self.d1.line_bits;
        let b2 = addr.wrapping_add(size.max(1) - 1) >> self.d1.line_bits;
        if swaps & 1 != 0 {
            self.d1.swap_first_two(b1);
        }
        if swaps & 2 != 0 && b2 != b1 {
            self.d1.swap_first_two(b2);
        }
    }

    /// How many ways of each I1 set the threads' code-lines tables name
    /// (`Needs::recent_code_lines_ways`, 0: none): [`Simulator::i1_replace`] keeps that
    /// many first ways of a set as a set, in no particular order.
    pub fn set_code_table_ways(&mut self, ways: u8) {
        self.code_ways = usize::from(ways).min(self.i1.assoc);
    }

    /// A code-miss record (`TraceRecord::code_miss`): I1 line `line` was not among the
    /// thread's code-lines table's ways for its set, and `evicted` left them for it. True
    /// on a miss, which the caller charges with [`Simulator::i1_miss`]. See
    /// [`Cache::replace`].
    #[inline]
    pub fn i1_replace(&mut self, line: u64, evicted: u64) -> bool {
        self.i1.replace(line, evicted, self.code_ways)
    }

    /// The D1 lookup of a data access whose Dr or Dw is charged elsewhere
    /// ([`Simulator::charge_runs`]): only its misses are counted here (when its LL lookup
    /// is made: the instruction's costs are not touched now).
    #[inline(always)]
    pub fn d1_lookup(&mut self, id: u32, addr: u64, size: u64, write: bool) {
        if !self.cache_sim {
            return;
        }
        let size = size.min(self.max_access);
        let miss = self.d1.ref_is_miss(addr, size);
        let d = if write { Source::Write } else { Source::Read };
        // Without a branch on the miss (see `queue_ll_if`).
        self.queue_ll_if(miss, id, addr, size, d);
    }

    /// A conditional branch of instruction `id` at `pc` went `taken` or not.
    #[inline]
    pub fn cond_branch(&mut self, id: u32, pc: u64, taken: bool) {
        if !self.branch_sim {
            return;
        }
        let miss = self.cond.predict(pc, taken);
        let c = self.branch_slot(id);
        c[in_branch_row(BC)] += 1;
        c[in_branch_row(BCM)] += u64::from(miss);
    }

    /// An indirect jump or call of instruction `id` at `pc` went to `target`.
    #[inline]
    pub fn ind_branch(&mut self, id: u32, pc: u64, target: u64) {
        if !self.branch_sim {
            return;
        }
        let miss = self.ind.predict(pc, target);
        let c = self.branch_slot(id);
        c[in_branch_row(BI)] += 1;
        c[in_branch_row(BIM)] += u64::from(miss);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The obviously correct model: each set a list, most recently used first.
    struct NaiveLru {
        sets: Vec<Vec<u64>>,
        assoc: usize,
        line: u64,
    }

    impl NaiveLru {
        fn new(c: &CacheConfig) -> Self {
            let sets = (c.size / c.line / c.assoc) as usize;
            NaiveLru {
                sets: vec![vec![0; c.assoc as usize]; sets],
                assoc: c.assoc as usize,
                line: c.line,
            }
        }
        fn touch(&mut self, block: u64) -> bool {
            let n = self.sets.len() as u64;
            let set = &mut self.sets[(block % n) as usize];
            let hit = set.iter().position(|&t| t == block);
            if let Some(i) = hit {
                set.remove(i);
            } else {
                set.truncate(self.assoc - 1);
            }
            set.insert(0, block);
            hit.is_none()
        }
        fn access(&mut self, addr: u64, size: u64) -> bool {
            let first = addr / self.line;
            let last = (addr + size - 1) / self.line;
            let mut miss = false;
            for b in first..=last {
                miss |= self.touch(b);
            }
            miss
        }
    }

    /// The lookups a test runs: scalar, AVX2, AVX-512 (each as far as the host has it).
    fn lookup_kinds() -> [(bool, bool); 3] {
        #[cfg(target_arch = "x86_64")]
        let (avx2, avx512) = (std::is_x86_feature_detected!("avx2"), host_has_avx512());
        #[cfg(not(target_arch = "x86_64"))]
        let (avx2, avx512) = (false, false);
        [(false, false), (avx2, false), (avx2, avx512)]
    }

    /// The code-lines contract (`TraceRecord::code_miss`): a thread's table keeps each
    /// set's `ways` most recently used lines in order and reports only the lines it does
    /// not name, with the one that leaves; [`Cache::replace`] on those alone must give
    /// every miss and the set's lines beyond the table's places in order, as a naive LRU
    /// that sees every lookup (the table's first records, with no line leaving, take the
    /// plain lookup).
    #[test]
    fn code_miss_records_alone_replay_an_lru_cache_exactly() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for assoc in [2u64, 3, 4, 8, 16] {
            for ways in 2..=assoc.min(8) as usize {
                for (avx2, avx512) in lookup_kinds() {
                    let cfg = CacheConfig {
                        size: 4 * assoc * 64,
                        assoc,
                        line: 64,
                    };
                    let mut naive = NaiveLru::new(&cfg);
                    let mut cache = Cache::with_features(&cfg, avx2, avx512);
                    let mut tables = vec![vec![u64::MAX; ways]; 4];
                    let (mut misses, mut replayed) = (0u32, 0u32);
                    for _ in 0..60_000u32 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        // Lines of 4 sets, a few more per set than the ways, mostly recent.
                        let line = 1 + x % (4 * (assoc + 3));
                        misses += u32::from(naive.touch(line));
                        let t = &mut tables[(line % 4) as usize];
                        if let Some(w) = t.iter().position(|&l| l == line) {
                            t.remove(w);
                            t.insert(0, line);
                        } else {
                            let evicted = t.pop().unwrap();
                            t.insert(0, line);
                            replayed += u32::from(cache.replace(line, evicted, ways));
                        }
                    }
                    assert_eq!(
                        misses, replayed,
                        "assoc {assoc} ways {ways} {avx2} {avx512}"
                    );
                    for (set, lines) in naive.sets.iter().enumerate() {
                        let mut ours = vec![cache.mru[set]];
                        ours.extend_from_slice(
                            &cache.rest[set * cache.stride..][..assoc as usize - 1],
                        );
                        let (mut a, mut b) = (lines[..ways].to_vec(), ours[..ways].to_vec());
                        a.sort_unstable();
                        b.sort_unstable();
                        assert_eq!(a, b, "set {set}: the table's places");
                        assert_eq!(
                            lines[ways..],
                            ours[ways..],
                            "set {set}: the others in order"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn cache_matches_a_naive_lru_on_a_pseudo_random_stream() {
        for (cfg, (avx2, avx512)) in [
            CacheConfig {
                size: 1024,
                assoc: 4,
                line: 64,
            },
            CacheConfig {
                size: 3 * 16 * 64,
                assoc: 3,
                line: 64,
            },
            CacheConfig {
                size: 12 * 8 * 64,
                assoc: 12,
                line: 64,
            },
            CacheConfig {
                size: 30 * 4 * 64,
                assoc: 30,
                line: 64,
            },
            CacheConfig {
                size: 128 * 64,
                assoc: 128,
                line: 64,
            },
            CacheConfig {
                size: 2048,
                assoc: 1,
                line: 32,
            },
            CacheConfig {
                size: 4096,
                assoc: 64,
                line: 64,
            },
            CacheConfig {
                size: 8 * 16 * 64,
                assoc: 8,
                line: 64,
            },
            CacheConfig {
                size: 6 * 8 * 64,
                assoc: 6,
                line: 64,
            },
            CacheConfig {
                size: 9 * 4 * 64,
                assoc: 9,
                line: 64,
            },
        ]
        .into_iter()
        .flat_map(|cfg| lookup_kinds().map(|k| (cfg, k)))
        {
            let mut fast = Cache::with_features(&cfg, avx2, avx512);
            let mut slow = NaiveLru::new(&cfg);
            let mut x: u64 = 0x2545F4914F6CDD1D;
            let mut misses = 0;
            for _ in 0..200_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let addr = (x >> 20) % 16384;
                let size = [1, 2, 4, 8, 16, 32][(x % 6) as usize].min(cfg.line);
                let m = fast.ref_is_miss(addr, size);
                assert_eq!(
                    m,
                    slow.access(addr, size),
                    "{cfg:?} avx2 {avx2} avx512 {avx512} addr {addr:#x} size {size}"
                );
                misses += u64::from(m);
            }
            assert!(misses > 1000, "the stream must exercise evictions");
        }
    }

    /// Swaps of the two most recently used lines, between lookups, as a list would do them,
    /// with and without AVX2 (whose lookups and swaps move groups of four tags).
    #[test]
    fn swaps_of_the_first_two_lines_match_a_naive_lru() {
        for assoc in [2, 5, 8, 12] {
            let cfg = CacheConfig {
                size: assoc * 4 * 64,
                assoc,
                line: 64,
            };
            for (avx2, avx512) in lookup_kinds() {
                let mut fast = Cache::with_features(&cfg, avx2, avx512);
                let mut slow = NaiveLru::new(&cfg);
                let mut x: u64 = 0x9E3779B97F4A7C15;
                let mut swaps = 0;
                for _ in 0..100_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let block = (x >> 20) % (assoc * 4 * 3);
                    if x % 4 == 0 {
                        fast.swap_first_two(block);
                        slow.sets[(block % 4) as usize].swap(0, 1);
                        swaps += 1;
                    } else {
                        assert_eq!(
                            fast.ref_is_miss(block * 64, 8),
                            slow.access(block * 64, 8),
                            "assoc {assoc} avx2 {avx2} avx512 {avx512} block {block}"
                        );
                    }
                }
                assert!(swaps > 10_000);
            }
        }
    }

    /// The AVX-512 lookup against the AVX2 one: the same stream of lookups (straddling
    /// accesses included) and swaps, every outcome and the final state of every set equal,
    /// for each geometry it takes (6- to 9-way) and a few set counts.
    #[test]
    fn avx512_lookups_equal_the_avx2_ones() {
        #[cfg(target_arch = "x86_64")]
        let usable = std::is_x86_feature_detected!("avx2") && host_has_avx512();
        #[cfg(not(target_arch = "x86_64"))]
        let usable = false;
        if !usable {
            println!("skipped: this host lacks AVX-512F (OS-enabled), BMI1 or AVX2");
            return;
        }
        for assoc in 6..=9u64 {
            for sets in [1u64, 4, 64] {
                let cfg = CacheConfig {
                    size: assoc * sets * 64,
                    assoc,
                    line: 64,
                };
                let mut wide = Cache::with_features(&cfg, true, true);
                let mut narrow = Cache::with_features(&cfg, true, false);
                assert!(wide.avx512 && !narrow.avx512);
                let mut x: u64 = 0x2545F4914F6CDD1D ^ assoc ^ (sets << 8);
                let (mut misses, mut hits) = (0, 0);
                for _ in 0..200_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Lines from a range a few times the cache, so that lookups hit at
                    // every depth of a set and miss.
                    let addr = (x >> 20) % (64 * assoc * sets * 3);
                    if x & 7 == 0 {
                        wide.swap_first_two(addr >> 6);
                        narrow.swap_first_two(addr >> 6);
                        continue;
                    }
                    let size = [1, 2, 4, 8, 16, 32, 64][(x % 7) as usize];
                    let m = wide.ref_is_miss(addr, size);
                    assert_eq!(
                        m,
                        narrow.ref_is_miss(addr, size),
                        "assoc {assoc} sets {sets} addr {addr:#x} size {size}"
                    );
                    misses += u64::from(m);
                    hits += u64::from(!m);
                }
                assert!(misses > 1000 && hits > 1000, "{misses} misses, {hits} hits");
                assert_eq!(wide.mru, narrow.mru, "assoc {assoc} sets {sets}");
                assert_eq!(wide.rest, narrow.rest, "assoc {assoc} sets {sets}");
            }
        }
    }

    #[test]
    fn queued_ll_lookups_count_as_immediate_ones() {
        let small = |size, assoc| CacheConfig {
            size,
            assoc,
            line: 64,
        };
        let (i1c, d1c, llc) = (small(1024, 2), small(2048, 4), small(8192, 4));
        let mut sim = Simulator::new(&i1c, &d1c, &llc, true, false);
        // The reference: LL looked up at the moment of each L1 miss.
        let (mut i1, mut d1, mut ll) = (Cache::new(&i1c), Cache::new(&d1c), Cache::new(&llc));
        let mut want = vec![[0u64; 9]; 4];
        let mut x: u64 = 0x9E3779B97F4A7C15;
        for n in 0..100_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = (x % 4) as u32;
            let addr = (x >> 24) % 65536;
            let size = [1, 4, 8, 16][(x >> 8) as usize % 4];
            let c = &mut want[id as usize];
            match n % 3 {
                0 => {
                    sim.fetch(id, addr, size);
                    if i1.ref_is_miss(addr, size) {
                        c[I1MR] += 1;
                        c[ILMR] += u64::from(ll.ref_is_miss(addr, size));
                    }
                }
                k => {
                    let write = k == 2;
                    sim.data(id, addr, size, write);
                    let (a, b, d) = if write {
                        (DW, D1MW, DLMW)
                    } else {
                        (DR, D1MR, DLMR)
                    };
                    c[a] += 1;
                    if d1.ref_is_miss(addr, size) {
                        c[b] += 1;
                        c[d] += u64::from(ll.ref_is_miss(addr, size));
                    }
                }
            }
        }
        sim.flush();
        assert_eq!(sim.costs[..4], want[..]);
        assert!(want.iter().map(|c| c[DLMR] + c[ILMR]).sum::<u64>() > 1000);
    }

    #[test]
    fn straddling_access_is_one_miss_and_loads_both_lines() {
        let cfg = CacheConfig {
            size: 4096,
            assoc: 2,
            line: 64,
        };
        let mut c = Cache::new(&cfg);
        assert!(c.ref_is_miss(60, 8), "both lines cold");
        assert!(!c.ref_is_miss(0, 8));
        assert!(!c.ref_is_miss(64, 8));
    }

    #[test]
    fn two_bit_counters_learn_an_always_taken_branch() {
        let mut p = CondPredictor::new();
        // History 0 at first; counters start strongly not-taken.
        let misses: Vec<bool> = (0..10).map(|_| p.predict(0x401000, true)).collect();
        // Each new history value indexes a fresh counter until the history saturates
        // at all ones (7 branches), then two more to reach the taken threshold.
        assert_eq!(misses.iter().filter(|m| **m).count(), 9);
        assert!(!p.predict(0x401000, true));
    }

    #[test]
    fn indirect_predictor_remembers_the_last_target() {
        let mut p = IndPredictor::new();
        assert!(p.predict(0x10, 0x500));
        assert!(!p.predict(0x10, 0x500));
        assert!(p.predict(0x10 + 512, 0x600), "aliases with 0x10");
        assert!(p.predict(0x10, 0x500));
    }
}
