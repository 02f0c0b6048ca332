//! churn: a Rust program's heap traffic, on two threads.
//!
//! Why: Rust programs allocate through the global allocator (glibc malloc here), with
//! `Vec` growth, `String` formatting and `HashMap` rehashing, from heavily inlined
//! generic code. Each thread keeps a bounded map of strings to vectors and replaces
//! entries as it goes.
//!
//! Usage: churn ITERATIONS_PER_THREAD
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::thread;

// SipHash with fixed keys instead of std's per-process random keys: eviction below takes
// "the first 1000 keys", and the printed checksum must be the same in every run.
type FixedMap<K, V> = HashMap<K, V, BuildHasherDefault<DefaultHasher>>;

fn work(seed: u64, iters: u64) -> u64 {
    let mut s = seed;
    let mut map: FixedMap<String, Vec<u64>> = FixedMap::default();
    let mut checksum = 0u64;
    for i in 0..iters {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let key = format!("key-{}", s % 4096);
        let entry = map.entry(key).or_default();
        entry.push(i);
        if entry.len() > 16 {
            checksum = checksum.wrapping_add(entry.iter().sum::<u64>());
            entry.clear();
            entry.shrink_to_fit();
        }
        if i % 64 == 0 {
            let mut line = String::new();
            for v in 0..8 {
                line.push_str(&format!("{},", s.wrapping_mul(v)));
            }
            checksum = checksum.wrapping_add(line.len() as u64);
        }
        if map.len() > 3000 {
            let drop: Vec<String> = map.keys().take(1000).cloned().collect();
            for k in drop {
                map.remove(&k);
            }
        }
    }
    checksum.wrapping_add(map.len() as u64)
}

fn main() {
    let iters: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let handles: Vec<_> = (0..2u64)
        .map(|t| thread::spawn(move || work(0x9e37_79b9_7f4a_7c15 ^ (t + 1), iters)))
        .collect();
    let mut total = 0u64;
    for h in handles {
        total = total.wrapping_add(h.join().expect("worker thread panicked"));
    }
    println!("churn threads=2 iterations={iters} checksum={total}");
}
