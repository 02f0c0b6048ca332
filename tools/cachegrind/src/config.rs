//! Which caches to simulate: `--I1/--D1/--LL` (`--L2`) as the user gave them, or the host's
//! caches as Valgrind 3.19 reads them from CPUID (`coregrind/m_cache.c`,
//! `cachegrind/cg_arch.c`), with its adjustments.
//!
//! Detection: Intel through CPUID leaf 2 descriptor `0xff` (then leaf 4, the deterministic
//! cache parameters every current Intel CPU reports), AMD through leaves `0x80000005/6`.
//! I1 and D1 are the level-1 instruction and data caches, LL the unified cache of the
//! highest level (`warning: L3 cache found, using its data for the LL simulation.`). When
//! detection fails, Valgrind's amd64 defaults: 64 KiB 2-way I1 and D1, 256 KiB 8-way LL, 64 B
//! lines. An LL whose set count is not a power of two gets fewer sets and more ways, as
//! Valgrind's `maybe_tweak_LLc` does, with its two warnings.
//!
//! Not decoded: Intel's older leaf-2 descriptor table (CPUs from before leaf 4): those fall
//! back to the defaults here, where Valgrind would read the table.

use oxgrind_formats::cachegrind::CacheConfig;

/// Why a cache geometry is refused, in Valgrind's words.
pub fn check(c: &CacheConfig) -> Result<(), &'static str> {
    if c.line == 0 || c.assoc == 0 || c.size % (c.line * c.assoc) != 0 {
        return Err("Cache set count is not a power of two.");
    }
    let sets = c.size / c.line / c.assoc;
    if !sets.is_power_of_two() {
        return Err("Cache set count is not a power of two.");
    }
    if !c.line.is_power_of_two() {
        return Err("Cache line size is not a power of two.");
    }
    if c.line < 16 {
        return Err("Cache line size is too small.");
    }
    if c.size <= c.line {
        return Err("Cache size <= line size.");
    }
    if c.assoc > c.size / c.line {
        return Err("Cache associativity > (size / line size).");
    }
    Ok(())
}

/// Parses the value of `--I1=`, `--D1=` or `--LL=`: `size,assoc,line_size`.
pub fn parse(opt: &str, value: &str) -> Result<CacheConfig, String> {
    let bad = || format!("Bad option: {opt}: Bad argument '{value}'");
    let parts: Vec<&str> = value.split(',').collect();
    if parts.len() != 3 {
        return Err(bad());
    }
    let mut n = [0u64; 3];
    for (i, p) in parts.iter().enumerate() {
        let v: i64 = p.parse().map_err(|_| bad())?;
        if v < 0 || v > i32::MAX as i64 {
            return Err(format!(
                "Bad option: {opt}: One of the cache parameters was too large and overflowed."
            ));
        }
        n[i] = v as u64;
    }
    let c = CacheConfig {
        size: n[0],
        assoc: n[1],
        line: n[2],
    };
    check(&c).map_err(|why| format!("{why} Bad option: {opt}: Bad argument '{value}'"))?;
    Ok(c)
}

/// The caches to simulate and the warnings Valgrind prints about them (`--pid--` lines).
pub struct Chosen {
    pub i1: CacheConfig,
    pub d1: CacheConfig,
    pub ll: CacheConfig,
    pub warnings: Vec<String>,
}

#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum Kind {
    Data,
    Insn,
    Unified,
}

#[derive(Copy, Clone, Debug)]
struct HwCache {
    kind: Kind,
    level: u32,
    size: u64,
    assoc: u64,
    line: u64,
}

fn cpuid(leaf: u32, sub: u32) -> [u32; 4] {
    // CPUID is available on every x86-64 CPU; it reads identification registers only.
    let r = core::arch::x86_64::__cpuid_count(leaf, sub);
    [r.eax, r.ebx, r.ecx, r.edx]
}

/// The host's caches as VEX's `hwcache_info` lists them, or `None` when Valgrind would not
/// know them.
fn host_caches() -> Option<(Vec<HwCache>, u32)> {
    let [max_leaf, b, c, d] = cpuid(0, 0);
    let mut vendor = [0u8; 12];
    vendor[0..4].copy_from_slice(&b.to_le_bytes());
    vendor[4..8].copy_from_slice(&d.to_le_bytes());
    vendor[8..12].copy_from_slice(&c.to_le_bytes());
    if max_leaf == 0 {
        return None;
    }
    let mut caches = vec![];
    match &vendor {
        b"GenuineIntel" => {
            if max_leaf < 2 {
                return None;
            }
            let regs = cpuid(2, 0);
            let mut bytes = [0u8; 16];
            for (i, r) in regs.iter().enumerate() {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&r.to_le_bytes());
            }
            if bytes[0] != 1 {
                return None;
            }
            bytes[0] = 0;
            if bytes.contains(&0xff) {
                for sub in 0.. {
                    let [a, b, c, _] = cpuid(4, sub);
                    let ty = a & 0x1f;
                    if ty == 0 {
                        break;
                    }
                    let assoc = ((b >> 22) & 0x3ff) as u64 + 1;
                    let parts = ((b >> 12) & 0x3ff) as u64 + 1;
                    let line = (b & 0x7ff) as u64 + 1;
                    let sets = c as u64 + 1;
                    // Valgrind computes the size in KiB (truncating), then multiplies back.
                    let size = assoc * parts * line * sets / 1024 * 1024;
                    let level = (a >> 5) & 7;
                    let kind = match ty {
                        1 => Kind::Data,
                        2 => Kind::Insn,
                        3 => Kind::Unified,
                        _ => continue,
                    };
                    if (1..=3).contains(&level) {
                        caches.push(HwCache {
                            kind,
                            level,
                            size,
                            assoc,
                            line,
                        });
                    }
                }
            }
        }
        b"AuthenticAMD" => {
            let [ext, ..] = cpuid(0x8000_0000, 0);
            if ext < 0x8000_0006 {
                return None;
            }
            let [_, _, d1, i1] = cpuid(0x8000_0005, 0);
            let [_, _, l2, l3] = cpuid(0x8000_0006, 0);
            let l1 = |r: u32, kind| HwCache {
                kind,
                level: 1,
                size: ((r >> 24) & 0xff) as u64 * 1024,
                assoc: ((r >> 16) & 0xff) as u64,
                line: (r & 0xff) as u64,
            };
            let assoc = |bits: u32| match bits & 0xf {
                1 => 1,
                2 => 2,
                4 => 4,
                6 => 8,
                8 => 16,
                0xa => 32,
                0xb => 48,
                0xc => 64,
                0xd => 96,
                0xe => 128,
                _ => 1,
            };
            caches.push(l1(d1, Kind::Data));
            caches.push(l1(i1, Kind::Insn));
            caches.push(HwCache {
                kind: Kind::Unified,
                level: 2,
                size: ((l2 >> 16) & 0xffff) as u64 * 1024,
                assoc: assoc(l2 >> 12),
                line: (l2 & 0xff) as u64,
            });
            if (l3 >> 18) & 0x3fff > 0 {
                caches.push(HwCache {
                    kind: Kind::Unified,
                    level: 3,
                    size: ((l3 >> 18) & 0x3fff) as u64 * 512 * 1024,
                    assoc: assoc(l3 >> 12),
                    line: (l3 & 0xff) as u64,
                });
            }
        }
        _ => return None,
    }
    let levels = caches.iter().map(|c| c.level).max().unwrap_or(0);
    // Valgrind's sanity rules: one cache of a kind per level, no unified cache beside split
    // ones, no level missing below one that exists.
    for level in 1..=levels {
        let at: Vec<&HwCache> = caches.iter().filter(|c| c.level == level).collect();
        let n = |k| at.iter().filter(|c| c.kind == k).count();
        let (i, d, u) = (n(Kind::Insn), n(Kind::Data), n(Kind::Unified));
        if at.is_empty() || i > 1 || d > 1 || u > 1 || (u > 0 && (i > 0 || d > 0)) {
            return None;
        }
    }
    Some((caches, levels))
}

/// Valgrind's `maybe_tweak_LLc`: a set count that is not a power of two is rounded down to
/// one, the associativity raised in proportion, the size recomputed.
fn tweak_ll(ll: &mut CacheConfig, warnings: &mut Vec<String>) {
    if ll.size == 0 || ll.assoc == 0 || ll.line == 0 {
        return;
    }
    let sets = ll.size / (ll.assoc * ll.line);
    if sets == 0 {
        return;
    }
    let (new_assoc, new_size) = if sets.is_power_of_two() {
        (ll.assoc, ll.line * ll.assoc * sets)
    } else {
        let new_sets = 1u64 << (63 - sets.leading_zeros());
        let factor = sets as f64 / new_sets as f64;
        let assoc = (0.5 + factor * ll.assoc as f64) as u64;
        (assoc, ll.line * assoc * new_sets)
    };
    if new_size == ll.size && new_assoc == ll.assoc {
        return;
    }
    let c = oxgrind_formats::number::commify;
    warnings.push(format!(
        "warning: specified LL cache: line_size {}  assoc {}  total_size {}",
        ll.line,
        ll.assoc,
        c(ll.size)
    ));
    warnings.push(format!(
        "warning: simulated LL cache: line_size {}  assoc {}  total_size {}",
        ll.line,
        new_assoc,
        c(new_size)
    ));
    ll.size = new_size;
    ll.assoc = new_assoc;
}

/// The configuration to simulate: each cache from the command line if given, else from the
/// host (or Valgrind's defaults). An auto-detected cache the simulator cannot handle and
/// the user did not replace is an error, as Valgrind's assertion is.
pub fn choose(
    i1: Option<CacheConfig>,
    d1: Option<CacheConfig>,
    ll: Option<CacheConfig>,
) -> Result<Chosen, String> {
    let mut warnings = vec![];
    let default = |size, assoc| CacheConfig {
        size,
        assoc,
        line: 64,
    };
    let (mut ai1, mut ad1, mut all) = (default(65536, 2), default(65536, 2), default(262144, 8));
    if let Some((caches, levels)) = host_caches() {
        let find = |k, l| caches.iter().find(|c| c.kind == k && c.level == l).copied();
        let (hi, hd, hl) = (
            find(Kind::Insn, 1),
            find(Kind::Data, 1),
            find(Kind::Unified, levels),
        );
        if hl.is_none() {
            warnings.push("warning: L2 cache not installed, ignore LL results.".into());
        }
        if hl.is_some() && levels > 2 {
            warnings.push(format!(
                "warning: L{levels} cache found, using its data for the LL simulation."
            ));
        }
        if let (Some(i), Some(d), Some(l)) = (hi, hd, hl) {
            let cfg = |c: HwCache| CacheConfig {
                size: c.size,
                assoc: c.assoc,
                line: c.line,
            };
            (ai1, ad1, all) = (cfg(i), cfg(d), cfg(l));
        }
    }
    tweak_ll(&mut all, &mut warnings);
    for (name, auto, given) in [("I1", &ai1, &i1), ("D1", &ad1, &d1), ("LL", &all, &ll)] {
        if let Err(why) = check(auto) {
            if given.is_none() {
                return Err(format!(
                    "Auto-detected {name} cache configuration not supported: {why} \
                     ({} B, {}-way, {} B lines); use --{name}=...",
                    auto.size, auto.assoc, auto.line
                ));
            }
        }
    }
    Ok(Chosen {
        i1: i1.unwrap_or(ai1),
        d1: d1.unwrap_or(ad1),
        ll: ll.unwrap_or(all),
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_take_valgrinds_spelling_and_checks() {
        let c = parse("--I1", "32768,8,64").unwrap();
        assert_eq!((c.size, c.assoc, c.line), (32768, 8, 64));
        assert!(parse("--D1", "32768,8").is_err());
        assert!(parse("--D1", "32768,3,64")
            .unwrap_err()
            .contains("set count"));
        assert!(parse("--LL", "4096,1,8").unwrap_err().contains("too small"));
        assert!(parse("--LL", "64,1,64")
            .unwrap_err()
            .contains("size <= line"));
        assert!(parse("--LL", "99999999999,1,64")
            .unwrap_err()
            .contains("overflowed"));
    }

    #[test]
    fn ll_with_odd_set_count_gets_more_ways() {
        // A 12 MiB, 16-way LL has 12288 sets: 8192 sets, 24 ways, same size.
        let mut ll = CacheConfig {
            size: 12 << 20,
            assoc: 16,
            line: 64,
        };
        let mut w = vec![];
        tweak_ll(&mut ll, &mut w);
        assert_eq!((ll.size, ll.assoc), (12 << 20, 24));
        assert_eq!(
            w,
            [
                "warning: specified LL cache: line_size 64  assoc 16  total_size 12,582,912",
                "warning: simulated LL cache: line_size 64  assoc 24  total_size 12,582,912"
            ]
        );
        let mut ok = CacheConfig {
            size: 8 << 20,
            assoc: 16,
            line: 64,
        };
        let mut w = vec![];
        tweak_ll(&mut ok, &mut w);
        assert!(w.is_empty());
    }

    #[test]
    fn command_line_wins_over_detection() {
        let g = CacheConfig {
            size: 16384,
            assoc: 4,
            line: 32,
        };
        let c = choose(Some(g), Some(g), Some(g)).unwrap();
        assert_eq!((c.i1, c.d1, c.ll), (g, g, g));
    }
}
