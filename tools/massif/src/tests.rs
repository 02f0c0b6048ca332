//! Event-level behaviour of [`Massif`] against a scripted host: what is counted, when
//! snapshots are taken, and what ends up in the file.

use super::*;
use crate::classify::fake::FakeHost;
use oxgrind_tool::{AllocFn, Mapping};

const MALLOC: Addr = 0x1000;
const REALLOC: Addr = 0x1001;

fn host() -> FakeHost {
    let h = FakeHost::new();
    h.name(MALLOC, "malloc", "r.c", 1);
    h.name(REALLOC, "realloc", "r.c", 2);
    h.name(0x10, "f", "a.c", 10);
    h.name(0x11, "f", "a.c", 11);
    h.name(0x20, "g", "a.c", 20);
    h.name(0x30, "main", "a.c", 30);
    h.name(0x40, "noisy", "a.c", 40);
    h.stack(1, &[MALLOC, 0x10, 0x30]);
    h.stack(2, &[MALLOC, 0x20, 0x30]);
    h.stack(3, &[REALLOC, 0x20, 0x30]);
    h.stack(4, &[MALLOC, 0x40, 0x30]);
    h
}

fn massif(args: &[&str]) -> Massif {
    let mut m = Massif::new();
    for a in args {
        assert!(m.parse_option(a).unwrap(), "{a}");
    }
    m.post_options().unwrap();
    m
}

fn alloc(addr: Addr, size: u64, slop: u64, stack: u32) -> Alloc {
    Alloc {
        addr,
        size,
        slop,
        align: 0,
        func: AllocFn::Malloc,
        stack: StackId(stack),
        tid: 1,
    }
}

/// A block as the runtime keeps it: the event and the number the tool gave it.
#[derive(Copy, Clone)]
struct Held {
    a: Alloc,
    word: u32,
}

impl std::ops::Deref for Held {
    type Target = Alloc;
    fn deref(&self) -> &Alloc {
        &self.a
    }
}

fn free(h: &Held) -> Free {
    let a = &h.a;
    Free {
        addr: a.addr,
        size: a.size,
        slop: a.slop,
        alloc_stack: a.stack,
        alloc_func: a.func,
        func: AllocFn::Free,
        stack: StackId(99),
        // Freed on the allocating thread unless a test says otherwise (a thread id names
        // one live thread: its log is that thread's alone).
        tid: a.tid,
        tool_word: h.word,
    }
}

/// What the runtime does around the tool's handlers: keeps the number the tool gives each
/// new block ([`Tool::on_alloc`], [`Tool::on_realloc`]) with the block, for its free.
trait AsRuntime {
    /// `a` allocated: told; returns it as the runtime keeps it.
    fn alloc_ev(&self, h: &dyn Host, a: Alloc) -> Held;
    /// `old` reallocated to `new`: told; returns `new` as the runtime keeps it.
    fn realloc_ev(&self, h: &dyn Host, old: &Free, new: Alloc) -> Held;
}

impl AsRuntime for Massif {
    fn alloc_ev(&self, h: &dyn Host, a: Alloc) -> Held {
        let word = self.on_alloc(h, &a);
        Held { a, word }
    }
    fn realloc_ev(&self, h: &dyn Host, old: &Free, new: Alloc) -> Held {
        let word = self.on_realloc(h, old, &new);
        Held { a: new, word }
    }
}

fn totals(m: &Massif, h: &dyn Host) -> (u64, u64) {
    let st = m.state_now(h);
    (st.heap, st.extra)
}

/// (time, heap, extra, kind) of every snapshot.
fn snaps(m: &Massif, h: &FakeHost) -> Vec<(i64, u64, u64, SnapshotKind)> {
    m.massif_file(h)
        .unwrap()
        .snapshots
        .iter()
        .map(|s| (s.time, s.mem_heap_b, s.mem_heap_extra_b, s.kind))
        .collect()
}

#[test]
fn heap_admin_and_slop_are_counted_as_extra_heap() {
    let h = host();
    let m = massif(&[]);
    m.alloc_ev(&h, alloc(0xa0, 10, 6, 1));
    m.alloc_ev(&h, alloc(0xb0, 16, 0, 1));
    assert_eq!(totals(&m, &h), (26, 14 + 8));
    let m0 = massif(&["--heap-admin=0"]);
    m0.alloc_ev(&h, alloc(0xa0, 10, 6, 1));
    assert_eq!(totals(&m0, &h), (10, 6));
}

#[test]
fn time_unit_b_adds_the_absolute_change_of_each_event() {
    let h = host();
    let m = massif(&["--time-unit=B"]);
    let a = alloc(0xa0, 100, 12, 1);
    let a = m.alloc_ev(&h, a); // +100 +12 +8 = 120
    let grown = Alloc {
        size: 150,
        stack: StackId(3),
        ..*a
    };
    // Valgrind moves the block: 160 usable, slop 10: |+50 - 2| = 48 -> 168.
    let grown = m.realloc_ev(&h, &free(&a), grown);
    m.on_free(&h, &free(&grown)); // 150 + 10 + 8 = 168 -> 336
    let times: Vec<i64> = snaps(&m, &h).iter().map(|s| s.0).collect();
    // startup 0, alloc 120, realloc 168, peak before the free 168, free 336.
    assert_eq!(times, [0, 120, 168, 168, 336]);
}

/// Valgrind's realloc keeps a block in place when the new size fits in its usable size:
/// the slop takes up what the request gave back (and a later growth within it is free).
#[test]
fn realloc_within_the_usable_size_moves_bytes_from_heap_to_slop() {
    let h = host();
    let m = massif(&["--time-unit=B", "--heap-admin=0"]);
    let a = alloc(0xa0, 100, 12, 1);
    let a = m.alloc_ev(&h, a); // usable 112
    let shrunk = Alloc { size: 20, ..*a };
    let shrunk = m.realloc_ev(&h, &free(&a), shrunk);
    assert_eq!(totals(&m, &h), (20, 92), "slop 12 + 80 given back");
    let regrown = Alloc { size: 112, ..*a };
    let _ = m.realloc_ev(&h, &free(&shrunk), regrown);
    assert_eq!(totals(&m, &h), (112, 0), "grown in place");
    let times: Vec<i64> = snaps(&m, &h).iter().map(|s| s.0).collect();
    // Neither realloc changes heap + extra: the clock stays at the allocation's 112.
    assert_eq!(times, [0, 112, 112, 112, 112]);
}

#[test]
fn a_free_first_records_the_peak_then_the_decrease() {
    let h = host();
    let m = massif(&["--time-unit=B"]);
    let a = alloc(0xa0, 1000, 8, 1);
    let b = alloc(0xb0, 10, 6, 2);
    let a = m.alloc_ev(&h, a);
    let b = m.alloc_ev(&h, b);
    m.on_free(&h, &free(&b));
    m.on_free(&h, &free(&a));
    let s = snaps(&m, &h);
    use SnapshotKind::*;
    assert_eq!(
        s,
        [
            (0, 0, 0, Empty),
            (1016, 1000, 16, Empty),
            (1040, 1010, 30, Empty),
            (1040, 1010, 30, Peak),
            (1064, 1000, 16, Empty),
            (2080, 0, 0, Empty),
        ]
    );
}

#[test]
fn realloc_moves_the_bytes_to_the_realloc_site() {
    let h = host();
    let m = massif(&["--detailed-freq=1", "--time-unit=B"]);
    let a = alloc(0xa0, 100, 12, 1);
    let a = m.alloc_ev(&h, a);
    let grown = Alloc {
        addr: 0xc0,
        size: 300,
        slop: 4,
        stack: StackId(3),
        ..*a
    };
    let _ = m.realloc_ev(&h, &free(&a), grown);
    let file = m.massif_file(&h).unwrap();
    let last = file.snapshots.last().unwrap().tree.as_ref().unwrap();
    assert_eq!(
        tree::to_text(last),
        "n2: 300 (heap allocation functions) malloc/new/new[], --alloc-fns, etc.\n \
         n1: 300 0x20: g (a.c:20)\n  n0: 300 0x30: main (a.c:30)\n \
         n0: 0 in 1 place, below massif's threshold (1.00%)\n"
    );
    assert_eq!(totals(&m, &h), (300, 8 + 4));
}

#[test]
fn ignore_fn_allocations_and_their_frees_and_reallocs_are_not_counted() {
    let h = host();
    let m = massif(&["--ignore-fn=noisy", "--time-unit=B"]);
    let a = alloc(0xa0, 100, 12, 4);
    let a = m.alloc_ev(&h, a);
    assert_eq!(totals(&m, &h), (0, 0));
    // A realloc from a counted site keeps the block ignored (Valgrind keeps its old EC).
    let moved = Alloc {
        addr: 0xd0,
        size: 500,
        slop: 12,
        stack: StackId(3),
        ..*a
    };
    let moved = m.realloc_ev(&h, &free(&a), moved);
    assert_eq!(totals(&m, &h), (0, 0));
    m.on_free(
        &h,
        &Free {
            alloc_stack: StackId(3),
            ..free(&moved)
        },
    );
    assert_eq!(totals(&m, &h), (0, 0));
    assert_eq!(snaps(&m, &h).len(), 1, "only the startup snapshot");
}

#[test]
fn stacks_that_filter_to_the_same_frames_share_one_context() {
    let h = host();
    // Two raw stacks differing only in the allocator frame.
    h.stack(10, &[MALLOC, 0x10, 0x30]);
    h.stack(11, &[REALLOC, 0x10, 0x30]);
    let m = massif(&[]);
    m.alloc_ev(&h, alloc(0xa0, 10, 6, 10));
    m.alloc_ev(&h, alloc(0xb0, 20, 12, 11));
    let st = m.state_now(&h);
    assert_eq!(st.ec_frames.len(), 1);
    assert_eq!(st.ec_bytes, [30]);
}

#[test]
fn a_known_stack_is_not_described_again() {
    let h = host();
    let m = massif(&[]);
    m.alloc_ev(&h, alloc(0xa0, 10, 6, 1));
    // Applied (and its stack classified) now rather than with the thread's next batch.
    drop(m.state_now(&h));
    let calls = *h.describe_calls.lock().unwrap();
    for i in 0..100 {
        m.alloc_ev(&h, alloc(0x100 + i * 16, 10, 6, 1));
    }
    assert_eq!(*h.describe_calls.lock().unwrap(), calls);
}

#[test]
fn pages_as_heap_counts_whole_pages_and_keeps_frame_zero() {
    let h = FakeHost::new();
    h.name(0x500, "mmap", "mmap64.c", 46);
    h.name(0x30, "main", "a.c", 30);
    h.stack(1, &[0x500, 0x30]);
    let m = massif(&["--pages-as-heap=yes", "--time-unit=B", "--detailed-freq=1"]);
    assert!(m.needs().page_events);
    let map = Mapping {
        addr: 0x7000_0000,
        len: 3 * 4096 - 100,
        stack: StackId(1),
        tid: 1,
    };
    m.on_map(&h, &map);
    assert_eq!(totals(&m, &h), (3 * 4096, 0));
    // Mapping the same pages again does not count them twice.
    m.on_map(&h, &Mapping { len: 4096, ..map });
    assert_eq!(totals(&m, &h), (3 * 4096, 0));
    m.on_unmap(
        &h,
        &Mapping {
            addr: 0x7000_1000,
            len: 4096,
            ..map
        },
    );
    assert_eq!(totals(&m, &h), (2 * 4096, 0));
    // Heap events are not Massif's business in this mode.
    m.alloc_ev(&h, alloc(0xa0, 10, 6, 1));
    assert_eq!(totals(&m, &h), (2 * 4096, 0));

    let file = m.massif_file(&h).unwrap();
    let kinds: Vec<SnapshotKind> = file.snapshots.iter().map(|s| s.kind).collect();
    assert_eq!(
        kinds,
        [
            SnapshotKind::Detailed,
            SnapshotKind::Peak,
            SnapshotKind::Detailed
        ]
    );
    assert_eq!(
        tree::to_text(file.snapshots[0].tree.as_ref().unwrap()),
        "n1: 12288 (page allocation syscalls) mmap/mremap/brk, --alloc-fns, etc.\n \
         n1: 12288 0x500: mmap (mmap64.c:46)\n  n0: 12288 0x30: main (a.c:30)\n"
    );
}

#[test]
fn fini_writes_the_file_once_at_the_expanded_path() {
    let h = host();
    let mut m = Massif::new();
    m.parse_option("--depth=5").unwrap();
    assert!(!m.parse_option("--alignment=64").unwrap(), "a core option");
    m.parse_option("--massif-out-file=ms.%p").unwrap();
    m.post_options().unwrap();
    m.alloc_ev(&h, alloc(0xa0, 10, 6, 1));
    m.fini(&h, Exit::Normal(0));
    m.fini(&h, Exit::Normal(0));
    let w = h.written.lock().unwrap();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].0, "/out/ms.4242");
    let text = String::from_utf8(w[0].1.clone()).unwrap();
    assert!(
        text.starts_with(
            "desc: --depth=5 --alignment=64 --massif-out-file=ms.%p\ncmd: ./prog a\ntime_unit: i\n"
        ),
        "{text}"
    );
}

#[test]
fn a_program_without_heap_events_still_gets_the_startup_snapshot() {
    let h = host();
    let m = massif(&[]);
    m.fini(&h, Exit::Normal(0));
    let text = String::from_utf8(h.written.lock().unwrap()[0].1.clone()).unwrap();
    assert_eq!(
        text,
        "desc: (none)\ncmd: ./prog a\ntime_unit: i\n#-----------\nsnapshot=0\n#-----------\n\
         time=0\nmem_heap_B=0\nmem_heap_extra_B=0\nmem_stacks_B=0\nheap_tree=empty\n"
    );
}

#[test]
fn heap_no_ignores_heap_events() {
    let h = host();
    let m = massif(&["--heap=no"]);
    m.alloc_ev(&h, alloc(0xa0, 10, 6, 1));
    assert_eq!(totals(&m, &h), (0, 0));
    assert_eq!(
        snaps(&m, &h),
        [(0, 0, 0, SnapshotKind::Empty)],
        "only the startup snapshot"
    );
}

#[test]
fn milliseconds_come_from_the_host_and_never_go_backwards() {
    let h = host();
    let m = massif(&["--time-unit=ms"]);
    *h.now_ms.lock().unwrap() = 5;
    m.alloc_ev(&h, alloc(0xa0, 10, 6, 1));
    *h.now_ms.lock().unwrap() = 3;
    m.alloc_ev(&h, alloc(0xb0, 10, 6, 1));
    let times: Vec<i64> = snaps(&m, &h).iter().map(|s| s.0).collect();
    assert_eq!(times, [0, 5, 5], "startup at program start, then the clock");
}

#[test]
fn instruction_times_come_from_the_host_count() {
    let h = host();
    let m = massif(&["--time-unit=i"]);
    *h.instructions.lock().unwrap() = 120_000;
    m.alloc_ev(&h, alloc(0xa0, 10, 6, 1));
    *h.instructions.lock().unwrap() = 2_120_000;
    m.alloc_ev(&h, alloc(0xb0, 10, 6, 1));
    let times: Vec<i64> = snaps(&m, &h).iter().map(|s| s.0).collect();
    assert_eq!(times, [0, 120_000, 2_120_000]);
    assert!(m.massif_file(&h).unwrap().time_unit.eq("i"));
}

#[test]
fn only_instruction_time_asks_for_the_engine() {
    assert!(massif(&["--time-unit=i"]).needs().count_instructions);
    for unit in ["--time-unit=ms", "--time-unit=B"] {
        assert!(!massif(&[unit]).needs().count_instructions, "{unit}");
    }
    assert_eq!(
        massif(&[]).needs().count_instructions,
        options::DEFAULT_TIME_UNIT == TimeUnit::Instructions
    );
}

#[test]
fn events_from_many_threads_balance_out() {
    let h = std::sync::Arc::new(host());
    let m = std::sync::Arc::new(massif(&["--time-unit=B"]));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (h, m) = (h.clone(), m.clone());
            std::thread::spawn(move || {
                for i in 0..2000u64 {
                    let mut a = alloc((t << 32) | (i * 16), 1 + i % 50, 7, 1 + (i % 2) as u32);
                    a.tid = 1 + t as i32;
                    let a = m.alloc_ev(&*h, a);
                    m.on_free(&*h, &free(&a));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(totals(&m, &*h), (0, 0));
    let st = m.state_now(&*h);
    assert!(st.ec_bytes.iter().all(|&b| b == 0));
    assert!(st.sched.snaps.len() < 100);
}

#[test]
fn pages_as_heap_without_mapping_events_still_writes_one_snapshot() {
    let h = host();
    let m = massif(&["--pages-as-heap=yes"]);
    assert_eq!(snaps(&m, &h), [(0, 0, 0, SnapshotKind::Empty)]);
}

/// Blocks freed on another thread than the one that allocated them, their addresses reused
/// at once (as glibc does): each thread's log is applied in its order and each block's free
/// after its allocation, so every free finds its block.
#[test]
fn cross_thread_frees_and_reused_addresses_are_applied_in_causal_order() {
    use std::sync::mpsc;
    let h = std::sync::Arc::new(host());
    let m = std::sync::Arc::new(massif(&["--time-unit=B"]));
    let (to_freer, freer_gets) = mpsc::sync_channel::<Held>(0);
    let (freed, allocator_hears) = mpsc::sync_channel::<()>(0);
    let freer = {
        let (h, m) = (h.clone(), m.clone());
        std::thread::spawn(move || {
            while let Ok(a) = freer_gets.recv() {
                let mut f = free(&a);
                f.tid = 2;
                m.on_free(&*h, &f);
                freed.send(()).unwrap();
            }
        })
    };
    const ROUNDS: u64 = 1000;
    for i in 0..ROUNDS {
        // The same two addresses again and again: each is live on one thread, then free.
        let mut a = alloc(0x1000 + (i % 2) * 0x100, 10 + i % 7, 6, 1);
        a.tid = 1;
        let a = m.alloc_ev(&*h, a);
        to_freer.send(a).unwrap();
        allocator_hears.recv().unwrap();
    }
    let mut last = alloc(0x1000, 24, 8, 1);
    last.tid = 1;
    m.alloc_ev(&*h, last);
    drop(to_freer);
    freer.join().unwrap();
    let st = m.state_now(&*h);
    assert_eq!(st.heap, 24, "only the last block is live");
    assert_eq!(st.live_blocks, 1);
    assert!((0..log::SLOTS).all(|i| m.logs.available(i, &st.cursors[i]) == 0));
}

/// More threads than logs: the ones left without a log apply their events one by one, and
/// every event still counts once.
#[test]
fn threads_beyond_the_logs_apply_their_events_directly() {
    let h = std::sync::Arc::new(host());
    let m = std::sync::Arc::new(massif(&["--time-unit=B"]));
    let n = log::SLOTS as u64 + 8;
    let threads: Vec<_> = (0..n)
        .map(|t| {
            let (h, m) = (h.clone(), m.clone());
            std::thread::spawn(move || {
                let mut live = Vec::new();
                for i in 0..300u64 {
                    let mut a = alloc((t << 32) | (i * 16), 8, 8, 1);
                    a.tid = 1000 + t as i32;
                    let a = m.alloc_ev(&*h, a);
                    live.push(a);
                }
                for a in live.iter().take(100) {
                    m.on_free(&*h, &free(a));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let st = m.state_now(&*h);
    assert_eq!(st.heap, n * 200 * 8);
    assert_eq!(st.live_blocks, n * 200);
}

#[test]
fn a_log_slot_is_the_size_the_log_limit_assumes() {
    // log::LIMIT's memory bound (512 KiB per thread) counts 32 bytes per slot.
    assert_eq!(std::mem::size_of::<crate::log::Slot>(), 32);
}

/// Reallocs take two log slots, so some do not fit in what is left of a chunk and leave a
/// pad there: every event still applies once, in order, on one thread and on two.
#[test]
fn two_slot_events_across_chunk_ends_apply_once() {
    for threads in [1u64, 2] {
        let h = std::sync::Arc::new(host());
        let m = std::sync::Arc::new(massif(&["--time-unit=B"]));
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (h, m) = (h.clone(), m.clone());
                std::thread::spawn(move || {
                    let mut kept = Vec::new();
                    for i in 0..3000u64 {
                        let mut a = alloc((t << 40) | (i << 8), 16, 0, 1);
                        a.tid = 1 + t as i32;
                        let a = m.alloc_ev(&*h, a);
                        let mut b = alloc((t << 40) | (i << 8) | 0x80, 48, 0, 3);
                        b.tid = a.tid;
                        let b = m.realloc_ev(&*h, &free(&a), b);
                        if i % 3 == 0 {
                            m.on_free(&*h, &free(&b));
                        } else {
                            kept.push(b);
                        }
                    }
                    kept.len() as u64
                })
            })
            .collect();
        let kept: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        let st = m.state_now(&*h);
        assert_eq!(st.heap, kept * 48, "{threads} thread(s)");
        assert_eq!(st.live_blocks, kept, "{threads} thread(s)");
        assert!((0..log::SLOTS).all(|i| m.logs.available(i, &st.cursors[i]) == 0));
    }
}

/// A free of a block Massif never numbered carries its slop in the event, however wide.
#[test]
fn a_free_of_an_unnumbered_block_keeps_a_wide_slop() {
    let h = host();
    let m = massif(&["--time-unit=B", "--heap-admin=0"]);
    for slop in [7u64, 5 << 32] {
        // Never told to Massif: held with no number.
        let a = Held {
            a: alloc(0xa0, 10, slop, 1),
            word: 0,
        };
        let before = m.state_now(&h).total_bytes_time;
        m.on_free(&h, &free(&a));
        let st = m.state_now(&h);
        assert_eq!(st.total_bytes_time - before, 10 + slop);
    }
}
