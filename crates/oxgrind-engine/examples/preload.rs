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
    use oxgrind_engine::probe::{
        iced_x86::Instruction, Access, AccessKind, GuestRegs, Instrument, Plan,
    };

    pub struct Tally {
        pub code: (u64, u64),
        pub data: (u64, u64),
        pub filter: bool,
        /// Filtered access probes only (no counter, no pc calls): what the inline check costs.
        pub only_filtered: bool,
    }

    /// Marks every granule of the data range in a fresh shadow map (filter mode).
    pub fn make_shadow(data: (u64, u64)) -> Option<u64> {
        let base = oxgrind_sys::raw::mmap_anon(1 << 44)? as u64;
        for g in (data.0 >> 3)..((data.1 + 7) >> 3) {
            // SAFETY: the shadow map covers every user address >> 3.
            unsafe { *((base + g) as *mut u8) = 1 };
        }
        Some(base)
    }

    static CALLS: AtomicU64 = AtomicU64::new(0);

    pub static INSNS: AtomicU64 = AtomicU64::new(0);
    static PCS: AtomicU64 = AtomicU64::new(0);
    static PC_MISMATCH: AtomicU64 = AtomicU64::new(0);
    // reads, writes, modifies, conditional; bytes read, written, modified
    static N: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];

    impl Instrument for Tally {
        fn instrument(&self, pc: u64, block: &[Instruction], plan: &mut Plan) {
            if pc < self.code.0 || pc >= self.code.1 {
                return;
            }
            for (i, ins) in block.iter().enumerate() {
                if self.only_filtered {
                    plan.accesses_filtered(i, 0);
                    continue;
                }
                plan.count(i, &INSNS, 1);
                plan.pc(i, ins.ip());
                if self.filter {
                    plan.accesses_filtered(i, 0);
                } else {
                    plan.accesses(i, 0);
                }
            }
        }

        fn on_pc(&self, regs: &GuestRegs, data: u64) {
            PCS.fetch_add(1, Relaxed);
            if regs.rip != data {
                PC_MISMATCH.fetch_add(1, Relaxed);
            }
        }

        fn on_accesses(&self, accesses: &[Access], _regs: &GuestRegs, _data: u64) {
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
    }

    pub unsafe extern "C" fn report(_status: i32) {
        let mut w = oxgrind_sys::fd::FdWriter::new(2);
        let n: [u64; 7] = core::array::from_fn(|i| N[i].load(Relaxed));
        let _ = writeln!(
            w,
            "oxgrind-engine: probes: calls={} insns={} pcs={} pc_mismatch={} reads={} writes={} modifies={} conditional={} rbytes={} wbytes={} mbytes={}",
            CALLS.load(Relaxed),
            INSNS.load(Relaxed),
            PCS.load(Relaxed),
            PC_MISMATCH.load(Relaxed),
            n[0], n[1], n[2], n[3], n[4], n[5], n[6]
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
        if mode != b"0" {
            t.filter = true;
            t.only_filtered = mode == b"2";
            if let Some(base) = probe_test::make_shadow(t.data) {
                oxgrind_engine::probe::set_shadow_base(base);
            }
        }
    }
    let instrument: Option<&'static dyn oxgrind_engine::probe::Instrument> =
        tally.map(|t| &*Box::leak(Box::new(t)) as &'static dyn oxgrind_engine::probe::Instrument);
    let config = oxgrind_engine::Config {
        count_instructions: count,
        report_at_exit: count,
        stats: env_flag(envp, b"OXGRIND_ENGINE_STATS"),
        far_code_cache: env_flag(envp, b"OXGRIND_ENGINE_FAR"),
        on_exit: if instrument.is_some() {
            Some(probe_test::report)
        } else {
            None
        },
        instrument,
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
