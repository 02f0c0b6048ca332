//! A minimal preload library that runs the whole program under the engine: the test
//! harness for `oxgrind-engine` (the real embedder is `oxgrind-runtime`).
//!
//! `LD_PRELOAD=libpreload.so prog args` runs `prog` from the code cache. Environment:
//! * `OXGRIND_ENGINE_OFF=1`: do not start the engine (native run, same library loaded);
//! * `OXGRIND_ENGINE_COUNT=1`: count guest instructions, print the total at exit;
//! * `OXGRIND_ENGINE_STATS=1`: print translation statistics at exit;
//! * `OXGRIND_ENGINE_FAR=1`: place the code cache far from all code (tests the far paths).
//! * `OXGRIND_ENGINE_PROBE=<code lo>:<code hi>:<data lo>:<data hi>` (hex): a test tool
//!   that probes every instruction in the code range (a counter bump, a pc call and an
//!   access call each) and tallies the accesses that land in the data range, printed as
//!   one `oxgrind-engine: probes: ...` line at exit. `OXGRIND_ENGINE_PROBE_FILTER=1`
//!   requests filtered access calls with every data granule marked (the calls must then
//!   be the same); `=2`: filtered access probes only (what the inline check costs).
//!   `OXGRIND_ENGINE_PROBE_TRACE=1`: trace probes instead of access calls (a block record
//!   per block, a record per access, filtered by the marks with `..._FILTER=1`), tallied
//!   from `Tool::on_trace` (`tblocks=... treads=...` on the same line); `=blocks` or
//!   `=accesses`: only those records, no counters and no calls (what they alone cost).
//!
//! The constructor reads the environment from `/proc/self/environ`-free sources: the
//! `envp` the dynamic loader passes to `.init_array` functions.

use oxgrind_sys::heap::PrivateHeap;

#[global_allocator]
static HEAP: PrivateHeap = PrivateHeap::new();

/// Whether `name` is set to `1` in the loader's environment array.
fn env_flag(envp: *const *const u8, name: &[u8]) -> bool {
    env_value(envp, name) == Some(&b"1"[..])
}

/// The value of `name` in the loader's environment array.
fn env_value(envp: *const *const u8, name: &[u8]) -> Option<&'static [u8]> {
    let mut p = envp;
    if p.is_null() {
        return None;
    }
    // SAFETY: as in env_flag; the strings live for the whole process.
    unsafe {
        while !(*p).is_null() {
            let s = *p;
            let mut i = 0;
            while i < name.len() && *s.add(i) == name[i] {
                i += 1;
            }
            if i == name.len() && *s.add(i) == b'=' {
                let v = s.add(i + 1);
                let mut n = 0;
                while *v.add(n) != 0 {
                    n += 1;
                }
                return Some(core::slice::from_raw_parts(v, n));
            }
            p = p.add(1);
        }
    }
    None
}

mod probe_test {
    use core::fmt::Write;
    use core::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use oxgrind_engine::probe::Embedder;
    use oxgrind_tool::instrument::{
        Access, AccessKind, CounterId, GuestRegs, Insn, Plan, TraceKind, TraceRecord,
    };
    use oxgrind_tool::{
        Addr, Exit, Frame, Host, LiveBlock, Needs, OptionError, RootRange, StackId, Tool,
    };

    pub struct Tally {
        pub code: (u64, u64),
        pub data: (u64, u64),
        pub filter: bool,
        /// Filtered access probes only (no counter, no pc calls): what the inline check costs.
        pub only_filtered: bool,
        /// Trace probes instead of access calls: a block record per block, a record per
        /// access (filtered by the shadow map with `filter`).
        pub trace: bool,
        /// Only the trace probes, no counters (what the records alone cost): `Some(true)`
        /// block records only, `Some(false)` access records only.
        pub trace_only_blocks: Option<bool>,
    }

    /// Marks every granule of the data range in the engine's shadow map (filter mode).
    pub fn mark_shadow(data: (u64, u64)) -> bool {
        let Some(map) =
            oxgrind_engine::shadow::reserve(oxgrind_tool::instrument::ShadowSpec::BYTE_PER_GRANULE)
        else {
            return false;
        };
        // (Not 1..=7: a filtered call reads those as ASan's partly unmarked granules.)
        map.set_granules(data.0 & !7, (data.1 + 7) & !7, 0xff);
        true
    }

    static CALLS: AtomicU64 = AtomicU64::new(0);

    /// The per-thread instruction counter (`Plan::count`).
    pub const INSNS: CounterId = CounterId(0);
    static PCS: AtomicU64 = AtomicU64::new(0);
    static PC_MISMATCH: AtomicU64 = AtomicU64::new(0);
    // reads, writes, modifies, conditional; bytes read, written, modified
    static N: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];
    // trace: blocks, reads, writes, modifies (in the data range); bytes; drains; records
    // out of order (a block record whose pc is not in the code range)
    static T: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];

    impl Tool for Tally {
        fn name(&self) -> &'static str {
            "probe-test"
        }
        fn parse_option(&mut self, _arg: &str) -> Result<bool, OptionError> {
            Ok(false)
        }
        fn needs(&self) -> Needs {
            Needs {
                instrument: true,
                counters: 1,
                trace: self.trace,
                thread_state: if self.trace { 8 } else { 0 },
                ..Needs::default()
            }
        }
        fn fini(&self, _host: &dyn Host, _exit: Exit) {}

        fn instrument(&self, pc: u64, block: &[Insn], plan: &mut Plan) {
            if pc < self.code.0 || pc >= self.code.1 {
                return;
            }
            if let Some(blocks) = self.trace_only_blocks {
                if blocks {
                    plan.trace_block(7);
                } else {
                    for i in 0..block.len() {
                        plan.trace_accesses(i, i as u32);
                    }
                }
                return;
            }
            if self.trace {
                plan.trace_block(7);
            }
            for (i, ins) in block.iter().enumerate() {
                if self.only_filtered {
                    plan.accesses_filtered(i, 0);
                    continue;
                }
                plan.count(i, INSNS, 1);
                if self.trace {
                    if self.filter {
                        plan.trace_accesses_filtered(i, 0);
                    } else {
                        plan.trace_accesses(i, i as u32);
                    }
                    continue;
                }
                plan.pc(i, ins.pc);
                if self.filter {
                    plan.accesses_filtered(i, 0);
                } else {
                    plan.accesses(i, 0);
                }
            }
        }

        fn on_pc(&self, _host: &dyn Host, regs: &GuestRegs, data: u64) {
            PCS.fetch_add(1, Relaxed);
            if regs.rip != data {
                PC_MISMATCH.fetch_add(1, Relaxed);
            }
        }

        fn on_accesses(
            &self,
            _host: &dyn Host,
            accesses: &[Access],
            _regs: &GuestRegs,
            _data: u64,
        ) {
            CALLS.fetch_add(1, Relaxed);
            for a in accesses {
                if a.addr < self.data.0 || a.addr >= self.data.1 {
                    continue;
                }
                let (k, b) = match a.kind {
                    AccessKind::Read => (0, 4),
                    AccessKind::Write => (1, 5),
                    AccessKind::Modify => (2, 6),
                };
                N[k].fetch_add(1, Relaxed);
                N[b].fetch_add(a.size as u64, Relaxed);
                if a.conditional {
                    N[3].fetch_add(1, Relaxed);
                }
            }
        }

        fn on_trace(&self, host: &dyn Host, records: &[TraceRecord]) {
            // The tool's own work, run translated in the middle of this delivery when the
            // program asked for the flush (`oxgrind_engine_test_flush`).
            let job = REENTER.lock().take();
            if let Some((work, p, n)) = job {
                // SAFETY: the program's own function, called as it asked, on its thread.
                unsafe { work(p as *mut u8, n) };
            }
            // Tallied locally, one atomic add per batch: the drain costs little next to the
            // appends it measures.
            let mut t = [0u64; 7];
            t[5] = 1;
            for r in records {
                match r.kind() {
                    TraceKind::Block => {
                        t[0] += 1;
                        if r.addr < self.code.0 || r.addr >= self.code.1 || r.tag != 7 {
                            t[6] += 1;
                        }
                    }
                    k => {
                        if r.addr < self.data.0 || r.addr >= self.data.1 {
                            continue;
                        }
                        let i = match k {
                            TraceKind::Read => 1,
                            TraceKind::Write => 2,
                            _ => 3,
                        };
                        t[i] += 1;
                        t[4] += r.size as u64;
                    }
                }
            }
            // Each thread also counts its own block records in its own state.
            host.with_thread_state(&mut |state| {
                let mut n = u64::from_le_bytes(state[..8].try_into().unwrap_or([0; 8]));
                n += t[0];
                state[..8].copy_from_slice(&n.to_le_bytes());
            });
            for (total, n) in T.iter().zip(t) {
                total.fetch_add(n, Relaxed);
            }
        }
    }

    /// A function of the program for `on_trace` to run once, with its arguments.
    pub type Work = unsafe extern "C" fn(*mut u8, i64);
    pub static REENTER: oxgrind_tool::sync::SpinLock<Option<(Work, usize, i64)>> =
        oxgrind_tool::sync::SpinLock::new(None);

    /// For the program (`probe_reenter`): flushes its trace buffer, and has the tool run
    /// `work(p, n)` while the records are being delivered (its accesses are then the
    /// tool's own work and must never reach the tool).
    #[unsafe(no_mangle)]
    pub extern "C" fn oxgrind_engine_test_flush(work: Work, p: *mut u8, n: i64) {
        *REENTER.lock() = Some((work, p as usize, n));
        oxgrind_engine::flush_trace();
    }

    /// For the program: what runs between `on` 1 and `on` 0 is the embedder's own work.
    #[unsafe(no_mangle)]
    pub extern "C" fn oxgrind_engine_test_hold(on: i32) {
        oxgrind_engine::hold_trace(on != 0);
    }

    /// The harness's host: nothing but what the probes need (the counters).
    pub struct NoHost;

    impl Host for NoHost {
        fn stack(&self, _id: StackId) -> Vec<Addr> {
            Vec::new()
        }
        fn describe(&self, _ip: Addr) -> Vec<Frame> {
            Vec::new()
        }
        fn elapsed_ms(&self) -> u64 {
            0
        }
        fn pid(&self) -> i32 {
            oxgrind_sys::raw::getpid()
        }
        fn command_line(&self) -> &[String] {
            &[]
        }
        fn expand_output_path(&self, t: &str) -> Result<String, OptionError> {
            Ok(t.to_string())
        }
        fn write_file(&self, _path: &str, _bytes: &[u8]) -> Result<(), i32> {
            Err(1)
        }
        fn log(&self, _text: &str) {}
        fn live_blocks(&self) -> Vec<LiveBlock> {
            Vec::new()
        }
        fn with_roots(&self, _f: &mut dyn FnMut(&[RootRange])) {}
        fn read_words(&self, _start: Addr, _len: u64, _f: &mut dyn FnMut(Addr, u64)) {}
        fn counter(&self, id: CounterId) -> u64 {
            oxgrind_engine::counter_total(id)
        }
        fn with_thread_state(&self, f: &mut dyn FnMut(&mut [u8])) -> bool {
            oxgrind_engine::with_thread_state(f)
        }
        fn each_thread_state(&self, f: &mut dyn FnMut(&[u8])) {
            oxgrind_engine::each_thread_state(f)
        }
    }

    /// The harness has no code of its own to hide and no allocator hooks.
    pub struct Always;

    impl Embedder for Always {
        fn is_own_code(&self, _pc: u64) -> bool {
            false
        }
        fn call(&self, _probe: bool, f: &mut dyn FnMut()) {
            f()
        }
    }

    pub unsafe extern "C" fn report(_status: i32) {
        oxgrind_engine::flush_all_traces();
        // The threads' own tallies of block records: how many threads counted any, and
        // their sum (equal to tblocks when every record reached its own thread's state).
        let (mut states, mut state_sum) = (0u64, 0u64);
        NoHost.each_thread_state(&mut |s| {
            let n = u64::from_le_bytes(s[..8].try_into().unwrap_or([0; 8]));
            states += (n > 0) as u64;
            state_sum += n;
        });
        let mut w = oxgrind_sys::fd::FdWriter::new(2);
        let n: [u64; 7] = core::array::from_fn(|i| N[i].load(Relaxed));
        let t: [u64; 7] = core::array::from_fn(|i| T[i].load(Relaxed));
        let _ = writeln!(
            w,
            "oxgrind-engine: probes: calls={} insns={} pcs={} pc_mismatch={} reads={} writes={} modifies={} conditional={} rbytes={} wbytes={} mbytes={} tblocks={} treads={} twrites={} tmodifies={} tbytes={} tdrains={} tstray={} tstates={} tstatesum={}",
            CALLS.load(Relaxed),
            oxgrind_engine::counter_total(INSNS),
            PCS.load(Relaxed),
            PC_MISMATCH.load(Relaxed),
            n[0], n[1], n[2], n[3], n[4], n[5], n[6],
            t[0], t[1], t[2], t[3], t[4], t[5], t[6], states, state_sum
        );
        w.flush();
    }

    pub fn parse(v: &[u8]) -> Option<Tally> {
        let s = core::str::from_utf8(v).ok()?;
        let mut it = s
            .split(':')
            .map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16));
        let mut next = || it.next()?.ok();
        Some(Tally {
            code: (next()?, next()?),
            data: (next()?, next()?),
            filter: false,
            only_filtered: false,
            trace: false,
            trace_only_blocks: None,
        })
    }
}

extern "C" fn init(_argc: i32, _argv: *const *const u8, envp: *const *const u8) {
    if env_flag(envp, b"OXGRIND_ENGINE_OFF") {
        return;
    }
    let count = env_flag(envp, b"OXGRIND_ENGINE_COUNT");
    let mut tally = env_value(envp, b"OXGRIND_ENGINE_PROBE").and_then(probe_test::parse);
    if let Some(t) = tally.as_mut() {
        let mode = env_value(envp, b"OXGRIND_ENGINE_PROBE_FILTER").unwrap_or(b"0");
        let trace = env_value(envp, b"OXGRIND_ENGINE_PROBE_TRACE").unwrap_or(b"0");
        t.trace = trace != b"0";
        t.trace_only_blocks = match trace {
            b"blocks" => Some(true),
            b"accesses" => Some(false),
            _ => None,
        };
        if mode != b"0" {
            t.filter = true;
            t.only_filtered = mode == b"2";
            probe_test::mark_shadow(t.data);
        }
    }
    let trace = tally.as_ref().is_some_and(|t| t.trace);
    let client = tally.map(|t| oxgrind_engine::probe::Client {
        tool: Box::leak(Box::new(t)),
        host: &probe_test::NoHost,
        embedder: &probe_test::Always,
    });
    let config = oxgrind_engine::Config {
        count_instructions: count,
        report_at_exit: count,
        stats: env_flag(envp, b"OXGRIND_ENGINE_STATS"),
        far_code_cache: env_flag(envp, b"OXGRIND_ENGINE_FAR"),
        on_exit: if client.is_some() {
            Some(probe_test::report)
        } else {
            None
        },
        client,
        trace,
        // The tool's state per thread (the harness has no runtime to read `Needs` for it).
        thread_state: if trace { 8 } else { 0 },
        ..Default::default()
    };
    // SAFETY: called once from the library's constructor on the main thread, before the
    // program has created threads; the global allocator is the private heap.
    if let Err(e) = unsafe { oxgrind_engine::start_from_constructor(config) } {
        let mut w = oxgrind_sys::fd::FdWriter::new(2);
        let _ = core::fmt::Write::write_fmt(
            &mut w,
            format_args!("oxgrind-engine: not started: {e:?}\n"),
        );
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn(i32, *const *const u8, *const *const u8) = init;
