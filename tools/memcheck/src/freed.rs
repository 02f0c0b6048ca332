//! The freed-block queue: what Memcheck remembers of recently freed blocks, so that a later
//! double free, free of an interior pointer or realloc of a freed pointer can say
//! `Address 0x... is 0 bytes inside a block of size 10 free'd` with both stacks.
//!
//! Valgrind keeps freed blocks unavailable for reuse until `--freelist-vol` bytes have
//! been freed after them; blocks of at least `--freelist-big-blocks` bytes leave first. The
//! runtime keeps the memory itself (`Needs::freelist_vol`); this queue mirrors its policy
//! with the stacks, and is only searched when an error is being described.

use std::collections::VecDeque;

use oxgrind_tool::{Addr, StackId};

/// One freed block.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct FreedBlock {
    pub addr: Addr,
    pub size: u64,
    pub alloc_stack: StackId,
    pub free_stack: StackId,
}

/// Bounded FIFO of freed blocks, by volume.
#[derive(Debug)]
pub struct FreedQueue {
    limit: u64,
    big: u64,
    volume: u64,
    /// Small blocks, oldest first.
    small: VecDeque<FreedBlock>,
    /// Blocks of `big` bytes or more, oldest first; released before the small ones.
    large: VecDeque<FreedBlock>,
}

/// Memcheck's redzone: an address this close to a block is described relative to it.
pub const REDZONE: u64 = 16;

impl FreedQueue {
    pub fn new(limit: u64, big: u64) -> FreedQueue {
        FreedQueue {
            limit,
            big,
            volume: 0,
            small: VecDeque::new(),
            large: VecDeque::new(),
        }
    }

    pub fn push(&mut self, b: FreedBlock) {
        if b.size >= self.big {
            self.large.push_back(b);
        } else {
            self.small.push_back(b);
        }
        self.volume += b.size;
        while self.volume > self.limit {
            let Some(old) = self.large.pop_front().or_else(|| self.small.pop_front()) else {
                break;
            };
            self.volume -= old.size;
        }
    }

    /// A remembered block whose extent (plus redzones) contains `addr`, as Memcheck's
    /// `get_freed_block_bracketting` finds it: big blocks first, oldest first.
    pub fn bracketing(&self, addr: Addr) -> Option<&FreedBlock> {
        self.large.iter().chain(self.small.iter()).find(|b| {
            addr >= b.addr.saturating_sub(REDZONE)
                && addr < b.addr.saturating_add(b.size).saturating_add(REDZONE)
        })
    }

    pub fn len(&self) -> usize {
        self.small.len() + self.large.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fb(addr: u64, size: u64) -> FreedBlock {
        FreedBlock {
            addr,
            size,
            alloc_stack: StackId(1),
            free_stack: StackId(2),
        }
    }

    #[test]
    fn freed_block_is_found_from_inside_and_its_redzones() {
        let mut q = FreedQueue::new(1000, 100);
        q.push(fb(0x1000, 10));
        assert_eq!(q.bracketing(0x1000).map(|b| b.addr), Some(0x1000));
        assert_eq!(q.bracketing(0x1009).map(|b| b.addr), Some(0x1000));
        assert_eq!(q.bracketing(0x1000 - 16).map(|b| b.addr), Some(0x1000));
        assert_eq!(q.bracketing(0x1000 + 10 + 15).map(|b| b.addr), Some(0x1000));
        assert!(q.bracketing(0x1000 + 10 + 16).is_none());
    }

    #[test]
    fn oldest_blocks_leave_when_volume_exceeds_the_limit_big_ones_first() {
        let mut q = FreedQueue::new(100, 50);
        q.push(fb(0x1000, 40));
        q.push(fb(0x2000, 60)); // big
        assert_eq!(q.len(), 2);
        q.push(fb(0x3000, 10)); // 110 > 100: the big block goes first
        assert!(q.bracketing(0x2000).is_none());
        assert!(q.bracketing(0x1000).is_some());
        q.push(fb(0x4000, 55)); // big again: 105 -> it leaves itself
        assert!(q.bracketing(0x4000).is_none());
        q.push(fb(0x5000, 45)); // 95 ok
        q.push(fb(0x6000, 10)); // 105 -> the oldest small one leaves
        assert!(q.bracketing(0x1000).is_none());
        assert_eq!(q.len(), 3);
    }
}
