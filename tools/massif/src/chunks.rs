//! Massif's live blocks by address (Valgrind's `HP_Chunk` table): for each, its block in the
//! replayed allocator (module `arena`) and its execution context.
//!
//! Every allocation inserts one entry and every free removes one, so this table is on the
//! path of each event: the contract's address table (`oxgrind_tool::addr_table`; a
//! general-purpose hash map cost about 180 instructions per malloc/free pair here).

use oxgrind_tool::addr_table::AddrTable;
#[cfg(test)]
use oxgrind_tool::Addr;

/// A live block as Valgrind's allocator would hold it.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Chunk {
    /// The block in the replayed arena (its usable size gives the block's slop).
    pub sim: crate::arena::BlockId,
    /// The EC of the stack that allocated it (the one its free names): kept here so that a
    /// free needs no lookup from stack to EC.
    pub ec: crate::EcId,
}

/// Massif's live blocks, by address.
pub(crate) type Chunks = AddrTable<Chunk>;

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
