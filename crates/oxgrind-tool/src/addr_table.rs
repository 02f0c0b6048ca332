//! A table keyed by block address, for the per-event paths (as Valgrind's tools share
//! `pub_tool_hashtable.h`): every allocation inserts an entry and every free removes one,
//! in the runtime's live-block table and in tools' own block tables.
//!
//! A general-purpose hash map cost 100-180 instructions per malloc/free pair there, much of
//! it rehashing the tombstones that constant insert/remove churn leaves behind. This is the
//! simplest table that fits the job: open addressing with linear probing, an entry's home
//! slot a multiplicative hash of its address's 4 KiB page (the product's high bits) plus the
//! address's 16-byte granule in the page, at most half full (a miss probes about two
//! entries), and removal by shifting the following entries back (Knuth's algorithm R), which
//! leaves no tombstones. The last address of the address space marks an
//! empty entry: no block starts there, and the table ignores it.

use alloc::vec::Vec;

use crate::Addr;

/// The key of an empty entry.
const EMPTY: Addr = Addr::MAX;

/// [`AddrTable::home`] in a table of `1 << (64 - shift)` entries (see there).
#[inline(always)]
fn home_in(shift: u32, addr: Addr) -> usize {
    let page = ((addr >> 12).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize;
    (page + ((addr >> 4) & 0xff) as usize) & ((usize::MAX) >> shift)
}

#[derive(Copy, Clone)]
struct Entry<V> {
    addr: Addr,
    value: V,
}

pub struct AddrTable<V> {
    /// A power of two entries (none until the first insert).
    entries: Vec<Entry<V>>,
    len: usize,
    /// `64 - log2(entries.len())`.
    shift: u32,
}

impl<V: Copy + Default> Default for AddrTable<V> {
    fn default() -> Self {
        AddrTable::new()
    }
}

impl<V: Copy + Default> AddrTable<V> {
    pub const fn new() -> Self {
        AddrTable {
            entries: Vec::new(),
            len: 0,
            shift: 64,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The blocks of one page have their homes side by side, a page's 256 granules spread
    /// over 8 KiB of entries at a place the page's hash chooses: an allocator hands out
    /// neighbouring addresses close in time (a run of blocks carved in turn, a freed block
    /// reused), so consecutive events meet lines of the table already in the cache, where a
    /// hash of the whole address gave each its own line (bench `containers`, whose tables
    /// outgrow the cache, about 4% less CPU time under Massif, `alloc` and `threads` 6-9%;
    /// hookcost: instructions unchanged).
    #[inline]
    fn home(&self, addr: Addr) -> usize {
        home_in(self.shift, addr)
    }

    /// The table's entries and size in one word, for [`AddrTable::prefetch_home`] by a
    /// thread that does not hold the table (0 while it has no entries). It changes only
    /// when the table grows.
    #[inline]
    pub fn layout(&self) -> u64 {
        if self.entries.is_empty() {
            return 0;
        }
        // User-space addresses have 47 bits; `shift` is at most 63.
        ((self.entries.as_ptr() as u64) << 7) | self.shift as u64
    }

    /// The address of `addr`'s home entry in a table laid out as `layout` (not 0) says.
    #[inline(always)]
    fn home_address(layout: u64, addr: Addr) -> u64 {
        let shift = (layout & 0x7f) as u32;
        (layout >> 7).wrapping_add((home_in(shift, addr) * core::mem::size_of::<Entry<V>>()) as u64)
    }

    /// Starts loading the entry where `addr` is looked for first, in a table whose
    /// [`AddrTable::layout`] was `layout` when last seen: a hint that reads nothing. A
    /// stale layout (the table grew since, its old entries freed) only loads a line that
    /// is not needed; a prefetch never faults, whatever the address.
    #[inline(always)]
    pub fn prefetch_home(layout: u64, addr: Addr) {
        if layout == 0 {
            return;
        }
        crate::hint::prefetch_read_at(Self::home_address(layout, addr));
    }

    /// The index of `addr`'s entry, if it has one.
    /// Entry `i`, where `i` is a slot index: a [`AddrTable::home`] or one masked by
    /// `entries.len() - 1`, with the table not empty (its length is then a power of two, so
    /// `i` is in bounds). The probe loops run on every insert, lookup and removal; their
    /// bounds checks were a tenth of their instructions.
    #[inline(always)]
    fn at(&self, i: usize) -> &Entry<V> {
        debug_assert!(i < self.entries.len());
        // SAFETY: `i` is a slot index (above), so `i < entries.len()`.
        unsafe { self.entries.get_unchecked(i) }
    }

    /// [`AddrTable::at`], writable.
    #[inline(always)]
    fn at_mut(&mut self, i: usize) -> &mut Entry<V> {
        debug_assert!(i < self.entries.len());
        // SAFETY: as in `at`.
        unsafe { self.entries.get_unchecked_mut(i) }
    }

    #[inline]
    fn find(&self, addr: Addr) -> Option<usize> {
        if self.len == 0 || addr == EMPTY {
            return None;
        }
        let mask = self.entries.len() - 1;
        let mut i = self.home(addr);
        loop {
            match self.at(i).addr {
                a if a == addr => return Some(i),
                EMPTY => return None,
                _ => i = (i + 1) & mask,
            }
        }
    }

    #[inline]
    pub fn get(&self, addr: Addr) -> Option<V> {
        self.find(addr).map(|i| self.at(i).value)
    }

    #[inline]
    pub fn contains(&self, addr: Addr) -> bool {
        self.find(addr).is_some()
    }

    /// Adds or replaces the entry of `addr`; returns the replaced value.
    #[inline]
    pub fn insert(&mut self, addr: Addr, value: V) -> Option<V> {
        if addr == EMPTY {
            return None;
        }
        if (self.len + 1) * 2 > self.entries.len() {
            self.grow();
        }
        let mask = self.entries.len() - 1;
        let mut i = self.home(addr);
        loop {
            let e = self.at_mut(i);
            if e.addr == EMPTY {
                *e = Entry { addr, value };
                self.len += 1;
                return None;
            }
            if e.addr == addr {
                return Some(core::mem::replace(&mut e.value, value));
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes and returns the entry of `addr`.
    #[inline]
    pub fn remove(&mut self, addr: Addr) -> Option<V> {
        let mut hole = self.find(addr)?;
        let value = self.at(hole).value;
        let mask = self.entries.len() - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let a = self.at(j).addr;
            if a == EMPTY {
                break;
            }
            // The entry at j moves back into the hole unless its home lies cyclically in
            // (hole, j]: it would then no longer be reachable from its home.
            let h = self.home(a);
            let stays = if hole <= j {
                hole < h && h <= j
            } else {
                hole < h || h <= j
            };
            if !stays {
                *self.at_mut(hole) = *self.at(j);
                hole = j;
            }
        }
        self.at_mut(hole).addr = EMPTY;
        self.len -= 1;
        Some(value)
    }

    #[cold]
    fn grow(&mut self) {
        let n = (self.entries.len() * 2).max(64);
        let vacant = Entry {
            addr: EMPTY,
            value: V::default(),
        };
        let old = core::mem::replace(&mut self.entries, alloc::vec![vacant; n]);
        self.shift = 64 - n.trailing_zeros();
        let mask = n - 1;
        for e in old.into_iter().filter(|e| e.addr != EMPTY) {
            let mut i = self.home(e.addr);
            while self.entries[i].addr != EMPTY {
                i = (i + 1) & mask;
            }
            self.entries[i] = e;
        }
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (Addr, &V)> {
        self.entries
            .iter()
            .filter(|e| e.addr != EMPTY)
            .map(|e| (e.addr, &e.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entry a prefetch loads is the one a lookup of the address reads first, in tables
    /// of several sizes.
    #[test]
    fn layout_gives_the_home_entry_of_an_address() {
        let mut t = AddrTable::<u64>::new();
        assert_eq!(t.layout(), 0);
        for (n, addr) in [0x5555_0000_1230u64, 0x7f00_dead_bee0, 0x10]
            .into_iter()
            .enumerate()
        {
            t = AddrTable::new();
            // Grow to a few sizes first (the shift is part of the layout).
            for k in 0..(n as u64 * 40) {
                t.insert(0x9000_0000 + k * 0x10_0000, k);
            }
            t.insert(addr, 7);
            let layout = t.layout();
            assert_ne!(layout, 0);
            assert_eq!(
                AddrTable::<u64>::home_address(layout, addr),
                t.entries.as_ptr() as u64
                    + (t.home(addr) * core::mem::size_of::<Entry<u64>>()) as u64
            );
        }
    }
}
