//! The stacks of threads that have exited, which are no leak roots below where the thread
//! last was.
//!
//! glibc keeps an exited thread's stack mapped (its stack cache) until a new thread takes
//! it, so the root set offers it as writable memory, whole: the dead thread's frames, full
//! of stale pointers, would make blocks Valgrind calls definitely lost "still reachable".
//! Valgrind holds all of a thread's stack below its pointer unaddressable once the pointer
//! has come back up, and a leak search scans addressable memory only: of a dead thread's
//! stack it scans what lies above the pointer at its last system call (the thread's own
//! descriptor, its static TLS), 128 bytes of red zone included. So the program's `exit`
//! system call of each thread is noted here (`Tool::before_syscall`, the last point the
//! thread is seen), and a leak search leaves out the part of the global roots below it.

use oxgrind_tool::sync::SpinLock;
use oxgrind_tool::{Addr, Host, RootKind, RootRange, SelfFile};

use crate::outside_heap::{stack_mapping_at, StackMapping, RED_ZONE};

/// `exit`: one thread ends (`exit_group` ends the process).
const SYS_EXIT: u64 = 60;
const SYS_MMAP: u64 = 9;
const SYS_MUNMAP: u64 = 11;
const SYS_MREMAP: u64 = 25;
const MAP_FIXED: u64 = 0x10;
const MAP_FIXED_NOREPLACE: u64 = 0x10_0000;

/// More notes than this are folded (one per stack mapping still there) when one is added.
const FOLD_AT: usize = 1024;

/// The stack pointers of exited threads at their `exit`, oldest first.
pub(crate) struct GoneThreads {
    last_sps: SpinLock<Vec<Addr>>,
}

impl GoneThreads {
    pub(crate) const fn new() -> GoneThreads {
        GoneThreads {
            last_sps: SpinLock::new(Vec::new()),
        }
    }

    /// The program's system call `nr` is about to run with `args`, on a thread whose stack
    /// pointer is `sp`: a thread's `exit` is noted; memory unmapped or mapped over is no
    /// longer a dead stack.
    pub(crate) fn before_syscall(&self, host: &dyn Host, nr: u64, args: &[u64; 6], sp: Addr) {
        let gone = |lo: u64, len: u64| {
            let hi = lo.saturating_add(len);
            self.last_sps.lock().retain(|&s| s < lo || s >= hi);
        };
        match nr {
            SYS_EXIT => {
                let full = {
                    let mut sps = self.last_sps.lock();
                    sps.push(sp);
                    sps.len() > FOLD_AT
                };
                if full {
                    // Folded without the lock held (threads exiting meanwhile add theirs
                    // after the folded ones, the latest last still).
                    let old = core::mem::take(&mut *self.last_sps.lock());
                    let mut kept = fold(&old, &maps(host));
                    let mut sps = self.last_sps.lock();
                    kept.append(&mut sps);
                    *sps = kept;
                }
            }
            SYS_MUNMAP => gone(args[0], args[1]),
            SYS_MREMAP => gone(args[0], args[1]),
            SYS_MMAP if args[3] & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0 => gone(args[0], args[1]),
            _ => {}
        }
    }

    /// The ranges no leak search scans: on each stack mapping an exited thread last ran on
    /// (the main thread's, or a glibc thread stack), from its start up to 128 bytes below
    /// the last such thread's stack pointer.
    pub(crate) fn dead_ranges(&self, host: &dyn Host) -> Vec<(Addr, Addr)> {
        let sps = self.last_sps.lock().clone();
        if sps.is_empty() {
            return Vec::new();
        }
        let maps = maps(host);
        fold(&sps, &maps)
            .into_iter()
            .filter_map(|sp| match stack_mapping_at(&maps, sp)? {
                StackMapping::Main { lo, .. } | StackMapping::Thread { lo, .. } => {
                    Some((lo, sp.saturating_sub(RED_ZONE).max(lo)))
                }
                StackMapping::Other { .. } => None,
            })
            .filter(|(lo, hi)| lo < hi)
            .collect()
    }
}

fn maps(host: &dyn Host) -> String {
    host.read_self_file(SelfFile::Maps).unwrap_or_default()
}

/// The latest of `sps` on each mapping of `maps` that holds one (a stack glibc handed to
/// thread after thread keeps its last one's).
fn fold(sps: &[Addr], maps: &str) -> Vec<Addr> {
    let mut latest: Vec<(u64, Addr)> = Vec::new(); // (mapping start, sp)
    for &sp in sps {
        let lo = match stack_mapping_at(maps, sp) {
            Some(StackMapping::Main { lo, .. } | StackMapping::Thread { lo, .. }) => lo,
            _ => continue,
        };
        match latest.iter_mut().find(|(l, _)| *l == lo) {
            Some(slot) => slot.1 = sp,
            None => latest.push((lo, sp)),
        }
    }
    latest.into_iter().map(|(_, sp)| sp).collect()
}

/// `r` less the `dead` ranges when it is a global root (a live thread's stack is its own
/// root, from its pointer up: a stack glibc gave a new thread is that thread's).
pub(crate) fn live_parts(r: &RootRange, dead: &[(Addr, Addr)]) -> Vec<(Addr, Addr)> {
    let mut parts = vec![(r.start, r.end)];
    if !matches!(r.kind, RootKind::Global) {
        return parts;
    }
    for &(lo, hi) in dead {
        parts = parts
            .into_iter()
            .flat_map(|(s, e)| [(s, e.min(lo)), (s.max(hi), e)])
            .filter(|(s, e)| s < e)
            .collect();
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_global_root_loses_the_dead_part_of_a_stack_and_a_live_stack_keeps_it() {
        let dead = [(0x1000, 0x3000)];
        let global = RootRange {
            start: 0x800,
            end: 0x4000,
            kind: RootKind::Global,
        };
        assert_eq!(
            live_parts(&global, &dead),
            vec![(0x800, 0x1000), (0x3000, 0x4000)]
        );
        let stack = RootRange {
            kind: RootKind::Stack { tid: 5 },
            ..global
        };
        assert_eq!(live_parts(&stack, &dead), vec![(0x800, 0x4000)]);
    }

    #[test]
    fn the_last_thread_on_a_stack_decides() {
        let maps = "1000-2000 ---p 00000000 00:00 0 \n\
                    2000-9000 rw-p 00000000 00:00 0 \n\
                    9000-a000 rw-p 00000000 00:00 0 [heap]\n";
        assert_eq!(fold(&[0x8000, 0x9500, 0x7000], maps), vec![0x7000]);
    }
}
