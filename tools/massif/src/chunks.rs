//! Massif's live blocks by address (Valgrind's `HP_Chunk` table): for each, its block in the
//! replayed allocator (module `arena`) and its execution context.
//!
//! Every allocation inserts one entry and every free removes one, so this table is on the
//! path of each event. A general-purpose hash map cost about 180 instructions per
//! malloc/free pair here, much of it rehashing the tombstones that constant insert/remove
//! churn leaves behind. This is the simplest table that fits the job: open addressing with
//! linear probing over 16-byte entries, a multiplicative hash of the address (blocks are
//! 16-byte aligned, so the high bits of the product are used), and removal by shifting the
//! following entries back (Knuth's algorithm R), which leaves no tombstones.

use oxgrind_tool::Addr;

/// A live block as Valgrind's allocator would hold it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Chunk {
    /// The block in the replayed arena (its usable size gives the block's slop).
    pub sim: crate::arena::BlockId,
    /// The EC of the stack that allocated it (the one its free names): kept here so that a
    /// free needs no lookup from stack to EC.
    pub ec: crate::EcId,
}

/// The key of an empty entry: no block starts at the last byte of the address space.
const EMPTY: Addr = Addr::MAX;

#[derive(Copy, Clone)]
struct Entry {
    addr: Addr,
    chunk: Chunk,
}

const VACANT: Entry = Entry {
    addr: EMPTY,
    chunk: Chunk { sim: 0, ec: 0 },
};

pub(crate) struct Chunks {
    /// A power of two entries, at most half of them used.
    entries: Vec<Entry>,
    len: usize,
    /// `64 - log2(entries.len())`: the hash's high bits index the table.
    shift: u32,
}

impl Default for Chunks {
    fn default() -> Self {
        Chunks::with_capacity_log2(10)
    }
}

impl Chunks {
    fn with_capacity_log2(bits: u32) -> Self {
        Chunks {
            entries: vec![VACANT; 1 << bits],
            len: 0,
            shift: 64 - bits,
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn mask(&self) -> usize {
        self.entries.len() - 1
    }

    #[inline]
    fn home(&self, addr: Addr) -> usize {
        (addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// The index of `addr`'s entry, or of the empty entry where it would go.
    #[inline]
    fn find(&self, addr: Addr) -> usize {
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            let k = self.entries[i].addr;
            if k == addr || k == EMPTY {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    pub(crate) fn contains(&self, addr: Addr) -> bool {
        addr != EMPTY && self.entries[self.find(addr)].addr == addr
    }

    /// Adds or replaces the entry of `addr`.
    #[inline]
    pub(crate) fn insert(&mut self, addr: Addr, chunk: Chunk) {
        if addr == EMPTY {
            // Not an address a block can have; never looked up either.
            return;
        }
        let i = self.find(addr);
        if self.entries[i].addr == addr {
            self.entries[i].chunk = chunk;
            return;
        }
        self.entries[i] = Entry { addr, chunk };
        self.len += 1;
        if self.len * 2 > self.entries.len() {
            self.grow();
        }
    }

    /// Removes and returns the entry of `addr`.
    #[inline]
    pub(crate) fn remove(&mut self, addr: Addr) -> Option<Chunk> {
        if addr == EMPTY {
            return None;
        }
        let mask = self.mask();
        let mut hole = self.find(addr);
        let found = self.entries[hole];
        if found.addr != addr {
            return None;
        }
        self.len -= 1;
        // Algorithm R: move back each following entry of the run whose home is not
        // cyclically within (hole, its position], so every entry stays reachable from its
        // home without crossing an empty one.
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let e = self.entries[j];
            if e.addr == EMPTY {
                break;
            }
            let home = self.home(e.addr);
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.entries[hole] = e;
                hole = j;
            }
        }
        self.entries[hole] = VACANT;
        Some(found.chunk)
    }

    #[cold]
    fn grow(&mut self) {
        let bits = 64 - self.shift + 1;
        let old = std::mem::replace(self, Chunks::with_capacity_log2(bits));
        for e in old.entries {
            if e.addr != EMPTY {
                let i = self.find(e.addr);
                self.entries[i] = e;
                self.len += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn behaves_as_a_map_under_churn() {
        let mut t = Chunks::default();
        let mut m: HashMap<Addr, Chunk> = HashMap::new();
        let mut s = 0x2545_f491_4f6c_dd1d_u64;
        for i in 0..200_000u32 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // Few distinct addresses, 16-byte aligned and clustered, so runs collide.
            let addr = 0x5555_0000_0000 + (s % 3000) * 16;
            let c = Chunk { sim: i, ec: i / 7 };
            if s >> 62 == 0 {
                assert_eq!(t.remove(addr), m.remove(&addr), "{i}");
            } else if s >> 61 == 2 {
                assert_eq!(t.contains(addr), m.contains_key(&addr), "{i}");
            } else {
                t.insert(addr, c);
                m.insert(addr, c);
            }
            assert_eq!(t.len(), m.len());
        }
        for (a, c) in m {
            assert_eq!(t.remove(a), Some(c));
        }
        assert_eq!(t.len(), 0);
    }
}
