//! A first-in first-out queue kept in fixed chunks, for the freed-block queues (the
//! runtime's, which holds freed memory back from glibc, and Memcheck's, which describes
//! it): hundreds of thousands of entries, one pushed per `free` and about one popped.
//!
//! A `VecDeque` there holds up to twice its entries' bytes (it doubles when full) and, to
//! grow, copies itself into a new buffer while the old one is still held: at the moment
//! of peak memory, three times. This one grows and shrinks a chunk of [`CHUNK`] entries
//! at a time, keeps one emptied chunk for the next, and never moves an entry.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::vec;

/// Entries in a chunk.
pub const CHUNK: usize = 4096;

pub struct ChunkedFifo<T> {
    chunks: VecDeque<Box<[T]>>,
    spare: Option<Box<[T]>>,
    /// The first entry's index in the first chunk.
    head: usize,
    len: usize,
    /// What a new chunk's slots hold before they are pushed into.
    fill: T,
}

impl<T: Copy> ChunkedFifo<T> {
    /// An empty queue; `fill` is written into a new chunk's slots (never read back).
    pub const fn new(fill: T) -> ChunkedFifo<T> {
        ChunkedFifo {
            chunks: VecDeque::new(),
            spare: None,
            head: 0,
            len: 0,
            fill,
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `i`th entry from the front (the oldest is 0).
    #[inline]
    pub fn get(&self, i: usize) -> &T {
        debug_assert!(
            i < self.len,
            "index {i} past the queue's {} entries",
            self.len
        );
        let k = self.head + i;
        &self.chunks[k / CHUNK][k % CHUNK]
    }

    #[inline]
    pub fn get_mut(&mut self, i: usize) -> &mut T {
        debug_assert!(
            i < self.len,
            "index {i} past the queue's {} entries",
            self.len
        );
        let k = self.head + i;
        &mut self.chunks[k / CHUNK][k % CHUNK]
    }

    #[inline]
    pub fn push_back(&mut self, v: T) {
        let k = self.head + self.len;
        if k == self.chunks.len() * CHUNK {
            let fill = self.fill;
            let c = self
                .spare
                .take()
                .unwrap_or_else(|| vec![fill; CHUNK].into_boxed_slice());
            self.chunks.push_back(c);
        }
        self.chunks[k / CHUNK][k % CHUNK] = v;
        self.len += 1;
    }

    #[inline]
    pub fn pop_front(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let v = self.chunks[0][self.head];
        self.head += 1;
        self.len -= 1;
        if self.head == CHUNK {
            // The first chunk is empty: kept as the spare (the one before it freed).
            self.head = 0;
            self.spare = self.chunks.pop_front();
        } else if self.len == 0 {
            // Only this chunk is left: filled again from its first slot.
            self.head = 0;
        }
        Some(v)
    }

    /// The entries, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        (0..self.len).map(move |i| self.get(i))
    }

    /// Chunks held, the spare included: what the queue costs, in [`CHUNK`]s.
    pub fn chunks_held(&self) -> usize {
        self.chunks.len() + usize::from(self.spare.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_come_out_in_order_across_chunks_and_memory_follows_the_length() {
        let mut q = ChunkedFifo::new(0u64);
        let mut next_out = 0u64;
        let mut next_in = 0u64;
        // Grow to 3.5 chunks, shrink to a few entries, grow again: order kept throughout.
        for (push, pop) in [
            (3 * CHUNK + CHUNK / 2, 0),
            (0, 3 * CHUNK + 10),
            (5 * CHUNK, 0),
        ] {
            for _ in 0..push {
                q.push_back(next_in);
                next_in += 1;
            }
            for _ in 0..pop {
                assert_eq!(q.pop_front(), Some(next_out));
                next_out += 1;
            }
            assert_eq!(q.len() as u64, next_in - next_out);
            assert!(
                q.chunks_held() <= q.len() / CHUNK + 3,
                "{} chunks",
                q.chunks_held()
            );
            for (i, v) in q.iter().enumerate().step_by(997) {
                assert_eq!(*v, next_out + i as u64);
            }
        }
        *q.get_mut(1) = 7;
        assert_eq!(*q.get(1), 7);
        while q.pop_front().is_some() {}
        assert!(q.is_empty());
        assert!(q.chunks_held() <= 2);
        q.push_back(42);
        assert_eq!(q.pop_front(), Some(42));
        assert_eq!(q.pop_front(), None);
    }
}
