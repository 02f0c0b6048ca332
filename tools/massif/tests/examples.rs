//! Massif driven through its public API exactly as the runtime drives it (options, events,
//! `fini`), replaying the allocation sequence of a reference program, and compared with the
//! file Valgrind 3.19 wrote for that program (`tests/data/`).
//!
//! The scripted host answers stacks and symbol lookups with the addresses and names of
//! Valgrind's run, so with `--time-unit=B` (time depends only on the allocation sequence)
//! the output must match byte for byte: scheduling, culling, peak, trees.
//!
//! The data files: `massif.out.tuB` and `massif.out.small` are
//! `shared/reference/examples/massif/`'s; the others were made on the same machine with the
//! sources of `shared/reference/examples/src/` built by `gcc -g -O0` (which gives the
//! addresses used below), e.g.
//! `valgrind --tool=massif --time-unit=B --depth=1 --massif-out-file=massif.out.B-depth1 ./ms_prog`
//! (the options of each file are on its `desc:` line, in order).

use oxgrind_massif::Massif;
use oxgrind_tool::*;
use std::collections::HashMap;
use std::sync::Mutex;

/// Our replacement `malloc`/`realloc`/`free`: frame 0 of every stack.
const MALLOC: Addr = 0x4848899;
const REALLOC: Addr = 0x484DCD3;
const FREE: Addr = 0x484B27F;
const BELOW_MAIN: [Addr; 3] = [0x48F0D8F, 0x48F0E3F, 0x1090A4];

struct ScriptHost {
    stacks: HashMap<u32, Vec<Addr>>,
    names: HashMap<Addr, (&'static str, &'static str, u32)>,
    cmd: Vec<String>,
    written: Mutex<Vec<(String, Vec<u8>)>>,
}

impl ScriptHost {
    fn new(cmd: &str) -> Self {
        let mut names = HashMap::new();
        names.insert(MALLOC, ("malloc", "vg_replace_malloc.c", 381));
        names.insert(REALLOC, ("realloc", "vg_replace_malloc.c", 1437));
        names.insert(FREE, ("free", "vg_replace_malloc.c", 872));
        names.insert(
            BELOW_MAIN[0],
            ("__libc_start_call_main", "libc_start_call_main.h", 58),
        );
        names.insert(
            BELOW_MAIN[1],
            ("__libc_start_main_impl", "libc-start.c", 392),
        );
        names.insert(BELOW_MAIN[2], ("_start", "start.S", 115));
        ScriptHost {
            stacks: HashMap::new(),
            names,
            cmd: vec![cmd.into()],
            written: Mutex::new(vec![]),
        }
    }

    /// Registers a stack: `alloc_fn`, then the program frames, then the frames below main.
    fn add_stack(
        &mut self,
        id: u32,
        alloc_fn: Addr,
        frames: &[(Addr, &'static str, &'static str, u32)],
    ) -> StackId {
        let mut s = vec![alloc_fn];
        for &(ip, f, file, line) in frames {
            self.names.insert(ip, (f, file, line));
            s.push(ip);
        }
        s.extend(BELOW_MAIN);
        self.stacks.insert(id, s);
        StackId(id)
    }

    fn output(&self) -> String {
        let w = self.written.lock().unwrap();
        assert_eq!(w.len(), 1, "exactly one file written");
        String::from_utf8(w[0].1.clone()).unwrap()
    }
}

impl Host for ScriptHost {
    fn stack(&self, id: StackId) -> Vec<Addr> {
        self.stacks[&id.0].clone()
    }
    fn describe(&self, ip: Addr) -> Vec<Frame> {
        match self.names.get(&ip) {
            Some(&(f, file, line)) => vec![Frame {
                ip,
                function: Some(f.into()),
                file: Some(file.into()),
                line,
                ..Default::default()
            }],
            None => vec![Frame {
                ip,
                ..Default::default()
            }],
        }
    }
    fn elapsed_ms(&self) -> u64 {
        0
    }
    fn pid(&self) -> i32 {
        1
    }
    fn command_line(&self) -> &[String] {
        &self.cmd
    }
    fn expand_output_path(&self, template: &str) -> Result<String, OptionError> {
        Ok(format!("/tmp/{template}"))
    }
    fn write_file(&self, path: &str, bytes: &[u8]) -> Result<(), i32> {
        self.written
            .lock()
            .unwrap()
            .push((path.into(), bytes.into()));
        Ok(())
    }
    fn log(&self, text: &str) {
        // Massif's only words on the log channel at exit: Valgrind's closing line.
        assert_eq!(text, format!("=={}== \n", self.pid()), "unexpected log");
    }
    fn live_blocks(&self) -> Vec<LiveBlock> {
        vec![]
    }
    fn with_roots(&self, _f: &mut dyn FnMut(&[RootRange])) {}
    fn read_words(&self, _s: Addr, _l: u64, _f: &mut dyn FnMut(Addr, u64)) {}
}

/// Slop of Valgrind's replacement allocator on amd64 with `--alignment=16`.
fn slop(n: u64) -> u64 {
    n.next_multiple_of(16) - n
}

/// A tiny heap: address → (size, allocating stack, the tool's word for the block), as the
/// runtime's block table keeps them.
struct Heap {
    next: Addr,
    live: HashMap<Addr, (u64, StackId, u32)>,
}

impl Heap {
    fn new() -> Self {
        Heap {
            next: 0x4A4A040,
            live: HashMap::new(),
        }
    }
    fn malloc(&mut self, m: &Massif, h: &ScriptHost, size: u64, stack: StackId) -> Addr {
        let addr = self.next;
        self.next += size.next_multiple_of(16) + 16;
        let ev = Alloc {
            addr,
            size,
            slop: slop(size),
            align: 0,
            func: AllocFn::Malloc,
            stack,
            tid: 1,
        };
        let word = m.on_alloc(h, &ev);
        self.live.insert(addr, (size, stack, word));
        addr
    }
    fn free_ev(&self, addr: Addr, func: AllocFn, free_stack: StackId) -> Free {
        let (size, alloc_stack, tool_word) = self.live[&addr];
        Free {
            addr,
            size,
            slop: slop(size),
            alloc_stack,
            alloc_func: AllocFn::Malloc,
            func,
            stack: free_stack,
            tid: 1,
            tool_word,
        }
    }
    fn free(&mut self, m: &Massif, h: &ScriptHost, addr: Addr, free_stack: StackId) {
        if addr == 0 {
            return; // free(NULL): the runtime reports nothing.
        }
        let ev = self.free_ev(addr, AllocFn::Free, free_stack);
        m.on_free(h, &ev);
        self.live.remove(&addr);
    }
    fn realloc(
        &mut self,
        m: &Massif,
        h: &ScriptHost,
        addr: Addr,
        size: u64,
        stack: StackId,
    ) -> Addr {
        let old = self.free_ev(addr, AllocFn::Realloc, stack);
        let new_addr = self.next;
        self.next += size.next_multiple_of(16) + 16;
        self.live.remove(&addr);
        let new = Alloc {
            addr: new_addr,
            size,
            slop: slop(size),
            align: 0,
            func: AllocFn::Realloc,
            stack,
            tid: 1,
        };
        let word = m.on_realloc(h, &old, &new);
        self.live.insert(new_addr, (size, stack, word));
        new_addr
    }
}

fn massif(args: &[&str]) -> Massif {
    let mut m = Massif::new();
    for a in args {
        assert!(m.parse_option(a).unwrap(), "{a} is Massif's");
    }
    m.post_options().unwrap();
    m
}

/// Replays `examples/src/ms_prog.c` (built with `gcc -g -O0`) under Massif with `args`, and
/// returns the file written.
// The loops index `p` as ms_prog.c does, to keep the replay recognisably the same program.
#[allow(clippy::needless_range_loop)]
fn replay_ms_prog(args: &[&str]) -> String {
    let mut h = ScriptHost::new("./ms_prog");
    let via_a = h.add_stack(
        1,
        MALLOC,
        &[
            (0x109180, "big_alloc", "ms_prog.c", 6),
            (0x1091CE, "via_a", "ms_prog.c", 9),
            (0x109231, "main", "ms_prog.c", 16),
        ],
    );
    let via_b = h.add_stack(
        2,
        MALLOC,
        &[
            (0x109180, "big_alloc", "ms_prog.c", 6),
            (0x1091E8, "via_b", "ms_prog.c", 10),
            (0x109267, "main", "ms_prog.c", 16),
        ],
    );
    let mid = h.add_stack(
        3,
        MALLOC,
        &[
            (0x10919A, "mid_alloc", "ms_prog.c", 7),
            (0x109273, "main", "ms_prog.c", 16),
        ],
    );
    let tiny = h.add_stack(
        4,
        MALLOC,
        &[
            (0x1091B4, "tiny_alloc", "ms_prog.c", 8),
            (0x109305, "main", "ms_prog.c", 20),
        ],
    );
    let re = h.add_stack(5, REALLOC, &[(0x1093AB, "main", "ms_prog.c", 24)]);
    let fr = h.add_stack(6, FREE, &[(0x1093F0, "main", "ms_prog.c", 26)]);

    let m = massif(args);
    let mut heap = Heap::new();
    let mut p = vec![0 as Addr; 4000];
    for i in 0..1000 {
        p[i] = match i % 3 {
            0 => heap.malloc(&m, &h, 1000, via_a),
            1 => heap.malloc(&m, &h, 600, via_b),
            _ => heap.malloc(&m, &h, 200, mid),
        };
    }
    for i in 1000..1100 {
        p[i] = heap.malloc(&m, &h, 1 + (i as u64 % 7), tiny);
    }
    for i in (0..1000).step_by(2) {
        heap.free(&m, &h, p[i], fr);
        p[i] = 0;
    }
    for i in (1..1000).step_by(4) {
        p[i] = heap.realloc(&m, &h, p[i], 3000, re);
    }
    for i in 0..1100 {
        heap.free(&m, &h, p[i], fr);
    }
    m.fini(&h, Exit::Normal(0));
    let name = args
        .last()
        .unwrap()
        .trim_start_matches("--massif-out-file=");
    assert_eq!(h.written.lock().unwrap()[0].0, format!("/tmp/{name}"));
    h.output()
}

fn assert_same_file(got: &str, expected: &str, what: &str) {
    if got != expected {
        let first = got
            .lines()
            .zip(expected.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        let show = |s: &str| {
            s.lines()
                .skip(first.saturating_sub(8))
                .take(16)
                .collect::<Vec<_>>()
                .join("\n")
        };
        panic!(
            "{what}: first difference at line {}\n--- ours:\n{}\n--- valgrind:\n{}",
            first + 1,
            show(got),
            show(expected)
        );
    }
}

/// `ms_prog --time-unit=B`: every snapshot, the culling, the peak and every tree as
/// Valgrind wrote them (this is `shared/reference/examples/massif/massif.out.tuB`).
#[test]
fn ms_prog_with_time_unit_b_matches_valgrind_byte_for_byte() {
    let got = replay_ms_prog(&["--time-unit=B", "--massif-out-file=massif.out.tuB"]);
    assert_same_file(&got, include_str!("data/massif.out.tuB"), "massif.out.tuB");
}

/// The same program under other options, against files written by Valgrind 3.19 on this
/// machine (`valgrind --tool=massif --time-unit=B <options> --massif-out-file=... ./ms_prog`).
#[test]
fn ms_prog_option_variants_match_valgrind_byte_for_byte() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--threshold=10.0"],
            include_str!("data/massif.out.B-threshold10"),
        ),
        (&["--depth=1"], include_str!("data/massif.out.B-depth1")),
        (
            &["--max-snapshots=10"],
            include_str!("data/massif.out.B-maxsnap10"),
        ),
        (
            &["--peak-inaccuracy=0.0", "--detailed-freq=3"],
            include_str!("data/massif.out.B-peakinacc0-freq3"),
        ),
        (
            &["--heap-admin=0", "--threshold=0"],
            include_str!("data/massif.out.B-admin0-threshold0"),
        ),
        (
            &["--alloc-fn=big_alloc"],
            include_str!("data/massif.out.B-allocfn"),
        ),
        (
            &["--ignore-fn=mid_alloc"],
            include_str!("data/massif.out.B-ignorefn"),
        ),
        (
            &["--detailed-freq=1", "--max-snapshots=11"],
            include_str!("data/massif.out.B-freq1-maxsnap11"),
        ),
    ];
    for (opts, expected) in cases {
        let desc = expected.lines().next().unwrap();
        let name = desc.rsplit("--massif-out-file=").next().unwrap();
        let out_opt = format!("--massif-out-file={name}");
        let mut args = vec!["--time-unit=B"];
        args.extend_from_slice(opts);
        args.push(&out_opt);
        let got = replay_ms_prog(&args);
        assert_same_file(&got, expected, name);
    }
}

/// `examples/src/ms_small.c` with `--detailed-freq=1`: calloc, realloc(NULL, n), frees, and
/// the "in N places" lines of contexts whose blocks are all freed.
#[test]
fn ms_small_with_detailed_freq_one_matches_valgrind() {
    let mut h = ScriptHost::new("./ms_small");
    let site = |h: &mut ScriptHost, id, fr0, frames: &[(Addr, &'static str, &'static str, u32)]| {
        h.add_stack(id, fr0, frames)
    };
    let s1 = site(
        &mut h,
        1,
        MALLOC,
        &[
            (0x109166, "s1", "ms_small.c", 3),
            (0x1091DD, "main", "ms_small.c", 9),
        ],
    );
    let s2 = site(
        &mut h,
        2,
        MALLOC,
        &[
            (0x10917E, "s2", "ms_small.c", 4),
            (0x1091E2, "main", "ms_small.c", 9),
        ],
    );
    let s3 = site(
        &mut h,
        3,
        MALLOC,
        &[
            (0x109196, "s3", "ms_small.c", 5),
            (0x1091E7, "main", "ms_small.c", 9),
        ],
    );
    let s4 = site(
        &mut h,
        4,
        MALLOC,
        &[
            (0x1091AE, "s4", "ms_small.c", 6),
            (0x1091EC, "main", "ms_small.c", 9),
        ],
    );
    let big = site(
        &mut h,
        5,
        MALLOC,
        &[
            (0x1091C6, "big", "ms_small.c", 7),
            (0x1091F1, "main", "ms_small.c", 9),
        ],
    );
    let ca = site(
        &mut h,
        6,
        0x484D8B3,
        &[(0x109200, "main", "ms_small.c", 10)],
    );
    h.names
        .insert(0x484D8B3, ("calloc", "vg_replace_malloc.c", 1328));
    let re = site(&mut h, 7, REALLOC, &[(0x109211, "main", "ms_small.c", 11)]);
    let fr = site(&mut h, 8, FREE, &[(0x109240, "main", "ms_small.c", 12)]);

    let m = massif(&[
        "--time-unit=B",
        "--detailed-freq=1",
        "--massif-out-file=massif.out.small-B",
    ]);
    let mut heap = Heap::new();
    let mut keep = vec![0 as Addr; 16];
    keep[0] = heap.malloc(&m, &h, 10, s1);
    keep[1] = heap.malloc(&m, &h, 12, s2);
    keep[2] = heap.malloc(&m, &h, 14, s3);
    keep[3] = heap.malloc(&m, &h, 16, s4);
    keep[4] = heap.malloc(&m, &h, 5000, big);
    keep[5] = heap.malloc(&m, &h, 3000, ca);
    keep[6] = heap.malloc(&m, &h, 2000, re); // realloc(NULL, n) is a malloc
    for k in keep {
        heap.free(&m, &h, k, fr);
    }
    m.fini(&h, Exit::Normal(0));

    let got = h.output();
    assert_same_file(
        &got,
        include_str!("data/massif.out.small-B"),
        "massif.out.small-B",
    );
    // And Valgrind's reference file (counted in instructions): same snapshots and trees.
    let strip = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| {
                !l.starts_with("time=") && !l.starts_with("time_unit:") && !l.starts_with("desc:")
            })
            .map(String::from)
            .collect()
    };
    assert_eq!(strip(&got), strip(include_str!("data/massif.out.small")));
}
