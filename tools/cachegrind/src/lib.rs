//! Cachegrind: simulates the program's I1, D1 and LL caches and its branch predictors with
//! Valgrind 3.19's model, and writes the counts per source line as `cachegrind.out.<pid>`
//! (formats.md §7), with Valgrind's summary on stderr.
//!
//! * [`config`]: which caches (`--I1/--D1/--LL`, or CPUID as Valgrind reads it);
//! * [`sim`]: the caches, the predictors and the per-instruction costs, fed one event
//!   stream in program order;
//! * [`adapter`]: how the engine's trace records become that stream (and what Valgrind
//!   counts as an instruction, a read, a write, a branch).
//!
//! Threads run in parallel under oxgrind; Valgrind runs one at a time and all share one
//! simulated machine. We keep that: one [`sim::Simulator`], behind a spin lock, fed by every
//! thread a trace batch at a time (the program's threads only append records inline; no
//! lock on their access path); a batch that finds the simulator busy waits in a backlog
//! instead of its thread (see [`Cachegrind::on_trace`]). Interleavings differ from Valgrind's (which switches
//! threads every 100,000 blocks), so per-thread miss counts in a multi-threaded program can
//! differ where threads share lines (see docs/differences-from-valgrind.md, Cachegrind).
//!
//! Costs are kept per translated instruction and resolved to (file, function, line) once,
//! at exit, through [`Host::describe`]: the run itself does no symbol work.

pub mod adapter;
pub mod config;
pub mod sim;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use oxgrind_formats::cachegrind::{self, CacheConfig, CachegrindFile, Record, Totals};
use oxgrind_tool::instrument::{
    Insn, Plan, RecentLines, TraceRecord, MAX_INDEXED_COUNTERS, MAX_RECENT_CODE_WAYS,
    MAX_RECENT_LINE_SLOTS,
};
use oxgrind_tool::sync::SpinLock;
use oxgrind_tool::{Addr, Exit, Host, Needs, OptionError, Tool};

use sim::Simulator;

/// The simulated machine (one for all threads, as Valgrind's) and each thread's place in
/// its own trace.
struct Machine {
    sim: Simulator,
    threads: HashMap<i32, adapter::ThreadState>,
}

/// Trace batches handed over while another thread held the simulator (see
/// [`Cachegrind::on_trace`]), in the order they came, with their threads.
#[derive(Default)]
struct Backlog {
    batches: VecDeque<(i32, Vec<TraceRecord>)>,
    /// Emptied buffers, for the next batches.
    spare: Vec<Vec<TraceRecord>>,
}

/// Batches the backlog may hold (64 KiB each) before a thread waits for the simulator.
const MAX_BACKLOG: usize = 64;

/// The indexed counters of `rep` iterations (after the blocks' runs).
const REP_COUNTERS: u32 = 1 << 16;
const REP_COUNTERS_FROM: u32 = MAX_INDEXED_COUNTERS - REP_COUNTERS;

/// Command-line options.
#[derive(Clone, Debug)]
pub struct Options {
    pub i1: Option<CacheConfig>,
    pub d1: Option<CacheConfig>,
    pub ll: Option<CacheConfig>,
    pub cache_sim: bool,
    pub branch_sim: bool,
    pub out_file: String,
    pub quiet: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            i1: None,
            d1: None,
            ll: None,
            cache_sim: true,
            branch_sim: false,
            out_file: "cachegrind.out.%p".into(),
            quiet: false,
        }
    }
}

/// The Cachegrind tool. Create with [`Cachegrind::new`], feed options, hand to the runtime.
pub struct Cachegrind {
    opts: Options,
    chosen: Option<config::Chosen>,
    /// The simulated machine and where each thread is in its trace.
    sim: SpinLock<Option<Machine>>,
    /// Batches waiting for the simulator, and how many (read without the lock).
    backlog: SpinLock<Backlog>,
    backlog_len: AtomicUsize,
    /// Every translated block, indexed by the tag of its trace records.
    blocks: adapter::BlockTable,
    /// The pc of each cost index, in index order (an instruction translated twice gets two).
    pcs: SpinLock<Vec<Addr>>,
    /// The `rep` instructions whose iterations are counted inline: cost index and (Dr, Dw)
    /// per iteration, by counter (from [`REP_COUNTERS_FROM`]).
    reps: SpinLock<Vec<(u32, (u8, u8))>>,
    started: AtomicBool,
    finished: AtomicBool,
}

impl Default for Cachegrind {
    fn default() -> Self {
        Self::new()
    }
}

/// `Vg_FnNameBelowMain`: the functions that call `main`, shown as `(below main)`.
fn is_below_main(name: &str) -> bool {
    name == "__libc_start_main"
        || name == "__libc_start_call_main"
        || name.starts_with("__libc_start_main.")
        || name == "generic_start_main"
        || name.starts_with("generic_start_main.")
        || name == "_start"
}

fn yes_no(opt: &str, v: &str) -> Result<bool, OptionError> {
    match v {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(OptionError(format!(
            "Bad option: {opt}: expected 'yes' or 'no'"
        ))),
    }
}

impl Cachegrind {
    pub fn new() -> Self {
        Cachegrind {
            opts: Options::default(),
            chosen: None,
            sim: SpinLock::new(None),
            backlog: SpinLock::new(Backlog {
                batches: VecDeque::new(),
                spare: Vec::new(),
            }),
            backlog_len: AtomicUsize::new(0),
            blocks: adapter::BlockTable::new(),
            pcs: SpinLock::new(Vec::new()),
            reps: SpinLock::new(Vec::new()),
            started: AtomicBool::new(false),
            finished: AtomicBool::new(false),
        }
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// The code-lines table that lets translated code leave out the block records whose
    /// fetches all hit I1's most recently used lines: I1's lines, one slot per set (as
    /// [`Cachegrind::recent_lines`]). Not with the branch simulation, whose outcomes need
    /// every block entry.
    fn recent_code_lines(&self) -> Option<RecentLines> {
        let c = self.chosen.as_ref()?;
        if !self.opts.cache_sim || self.opts.branch_sim {
            return None;
        }
        let sets = c.i1.size / c.i1.line / c.i1.assoc;
        Some(RecentLines {
            line_shift: c.i1.line.trailing_zeros() as u8,
            slots: sets.min(u64::from(MAX_RECENT_LINE_SLOTS)) as u16,
        })
    }

    /// Blocks whose runs are counted inline (the first ones translated, up to the engine's
    /// limit of indexed counters), when block records are left out (see
    /// [`Cachegrind::recent_code_lines`]); the others count runs from their records.
    fn counted_blocks(&self) -> adapter::Counted {
        adapter::Counted(
            if self.recent_code_lines().is_some() || !self.block_records() {
                REP_COUNTERS_FROM
            } else {
                0
            },
        )
    }

    /// How many of I1's most recently used lines per set the code-lines table names
    /// (`Needs::recent_code_lines_ways`): every way, up to the engine's limits, where a
    /// slot is a set (0: one line per slot, with block records). The simulator replays
    /// the code-miss records with as many (`Simulator::i1_replace`).
    fn recent_code_lines_ways(&self) -> u8 {
        let (Some(c), Some(_)) = (self.chosen.as_ref(), self.recent_code_lines()) else {
            return 0;
        };
        let sets = c.i1.size / c.i1.line / c.i1.assoc;
        let ways = c.i1.assoc.min(u64::from(MAX_RECENT_CODE_WAYS));
        if ways >= 2 && sets >= 1 && ways * sets <= u64::from(MAX_RECENT_LINE_SLOTS) {
            ways as u8
        } else {
            0
        }
    }

    /// Whether blocks append records: not when only instructions are counted
    /// (`--cache-sim=no` without `--branch-sim=yes`): every block's runs are counted inline.
    fn block_records(&self) -> bool {
        self.opts.cache_sim || self.opts.branch_sim
    }

    /// The recent-lines table that lets translated code skip the records of D1 hits that
    /// change nothing (see `oxgrind_tool::instrument::RecentLines`): D1's lines, one slot
    /// per set (up to the engine's limit, a divisor of the set count: both are powers of
    /// two). Only where the simulator takes an access as D1 does (its accesses are clamped
    /// to the smallest line of the three caches: D1's must be that one).
    fn recent_lines(&self) -> Option<RecentLines> {
        let c = self.chosen.as_ref()?;
        if !self.opts.cache_sim || c.d1.line > c.i1.line.min(c.ll.line) {
            return None;
        }
        let sets = c.d1.size / c.d1.line / c.d1.assoc;
        Some(RecentLines {
            line_shift: c.d1.line.trailing_zeros() as u8,
            slots: sets.min(u64::from(MAX_RECENT_LINE_SLOTS)) as u16,
        })
    }

    /// Whether the recent-lines table names D1's two most recently used lines per set
    /// (`Needs::recent_lines_two_ways`): where a slot is a set (no more sets than slots,
    /// at least two) and a set has a second way.
    fn recent_lines_two_ways(&self) -> bool {
        let (Some(c), Some(_)) = (self.chosen.as_ref(), self.recent_lines()) else {
            return false;
        };
        let sets = c.d1.size / c.d1.line / c.d1.assoc;
        c.d1.assoc >= 2 && (2..=u64::from(MAX_RECENT_LINE_SLOTS)).contains(&sets)
    }

    /// Thread `tid`'s records, in order, through the simulator.
    fn feed(&self, m: &mut Machine, tid: i32, records: &[TraceRecord]) {
        let st = m.threads.entry(tid).or_default();
        adapter::consume(&mut m.sim, &self.blocks, self.counted_blocks(), st, records);
    }

    /// Runs the backlog's batches, oldest first (the simulator's lock held).
    fn run_backlog(&self, m: &mut Machine) {
        while self.backlog_len.load(Ordering::SeqCst) > 0 {
            let Some((tid, batch)) = self.backlog.lock().batches.pop_front() else {
                return;
            };
            self.backlog_len.fetch_sub(1, Ordering::SeqCst);
            self.feed(m, tid, &batch);
            self.backlog.lock().spare.push(batch);
        }
    }

    /// Runs the backlog if the simulator is free, and again while batches are left: one
    /// may have come just as the last holder let go.
    fn help_backlog(&self) {
        core::sync::atomic::fence(Ordering::SeqCst);
        while self.backlog_len.load(Ordering::SeqCst) > 0 {
            let Some(mut guard) = self.sim.try_lock() else {
                return;
            };
            if let Some(m) = guard.as_mut() {
                self.run_backlog(m);
            }
            drop(guard);
            core::sync::atomic::fence(Ordering::SeqCst);
        }
    }

    /// (file, function, line) of a code address, as Cachegrind names them.
    fn locate(host: &dyn Host, pc: Addr) -> (String, String, u32) {
        let frames = host.describe(pc);
        let func = frames
            .last()
            .and_then(|f| f.function.clone())
            .map(|f| {
                if is_below_main(&f) {
                    "(below main)".to_string()
                } else {
                    f
                }
            })
            .unwrap_or_else(|| "???".into());
        match frames.first() {
            Some(f) if f.file.is_some() && f.line > 0 => {
                let file = f.file.as_deref().unwrap_or("???");
                let path = match f.dir.as_deref() {
                    Some(d) if !d.is_empty() => format!("{d}/{file}"),
                    _ => file.to_string(),
                };
                (path, func, f.line)
            }
            _ => ("???".into(), func, 0),
        }
    }

    /// The file's model from the costs charged so far.
    fn build(
        &self,
        host: &dyn Host,
        costs: &[sim::Costs],
        branch_costs: &[sim::BranchCosts],
    ) -> (CachegrindFile, Totals) {
        let pcs = self.pcs.lock().clone();
        // The cost indices that charged anything, in pc order: an instruction translated
        // more than once has several, summed below. Four bytes per index instead of a
        // map from pc to a copy of its costs and a sorted vector of those (about 230 bytes
        // per instruction between them: python3's report took 60 MB more at exit than
        // its run).
        let mut ids: Vec<u32> = (0..costs.len().min(pcs.len()))
            .filter(|&id| {
                costs[id].iter().any(|&n| n != 0)
                    || branch_costs
                        .get(id)
                        .is_some_and(|b| b.iter().any(|&n| n != 0))
            })
            .map(|id| id as u32)
            .collect();
        ids.sort_unstable_by_key(|&id| pcs[id as usize]);
        let columns: Vec<usize> = {
            let mut v: Vec<usize> = if self.opts.cache_sim {
                (sim::IR..=sim::DLMW).collect()
            } else {
                vec![sim::IR]
            };
            if self.opts.branch_sim {
                v.extend(sim::BC..=sim::BIM);
            }
            v
        };
        let mut lines: BTreeMap<(String, String, u32), Vec<u64>> = BTreeMap::new();
        let mut all = [0u64; sim::COLUMNS];
        for same_pc in ids.chunk_by(|&a, &b| pcs[a as usize] == pcs[b as usize]) {
            let pc = pcs[same_pc[0] as usize];
            let mut c = [0u64; sim::COLUMNS];
            for &id in same_pc {
                let row = sim::row(costs, branch_costs, id as usize);
                for (sum, &n) in c.iter_mut().zip(&row) {
                    *sum += n;
                }
            }
            for k in 0..sim::COLUMNS {
                all[k] += c[k];
            }
            let key = Self::locate(host, pc);
            let v = lines.entry(key).or_insert_with(|| vec![0; columns.len()]);
            for (slot, &k) in v.iter_mut().zip(&columns) {
                *slot += c[k];
            }
        }
        let mut records: Vec<Record> = lines
            .into_iter()
            .map(|((file, func, line), counts)| Record {
                file,
                func,
                line,
                counts,
            })
            .collect();
        cachegrind::sort_records(&mut records);
        let chosen = self.chosen.as_ref();
        let desc = match chosen {
            Some(c) => CacheConfig::desc_lines(&c.i1, &c.d1, &c.ll),
            None => vec![],
        };
        let file = CachegrindFile {
            desc,
            cmd: host.command_line().join(" "),
            events: cachegrind::event_names(self.opts.cache_sim, self.opts.branch_sim),
            records,
            summary: columns.iter().map(|&k| all[k]).collect(),
        };
        let t = Totals {
            ir: all[sim::IR],
            i1mr: all[sim::I1MR],
            ilmr: all[sim::ILMR],
            dr: all[sim::DR],
            d1mr: all[sim::D1MR],
            dlmr: all[sim::DLMR],
            dw: all[sim::DW],
            d1mw: all[sim::D1MW],
            dlmw: all[sim::DLMW],
            bc: all[sim::BC],
            bcm: all[sim::BCM],
            bi: all[sim::BI],
            bim: all[sim::BIM],
        };
        (file, t)
    }
}

impl Tool for Cachegrind {
    fn name(&self) -> &'static str {
        "cachegrind"
    }

    fn help(&self) -> &'static str {
        "    --I1=<size>,<assoc>,<line_size>  set I1 cache manually
    --D1=<size>,<assoc>,<line_size>  set D1 cache manually
    --LL=<size>,<assoc>,<line_size>  set LL cache manually
    --cache-sim=yes|no               collect cache stats? [yes]
    --branch-sim=yes|no              collect branch prediction stats? [no]
    --cachegrind-out-file=<file>     output file name [cachegrind.out.%p]
"
    }

    fn core_options(&mut self, core: &oxgrind_tool::CoreView) {
        self.opts.quiet = !core.talks();
    }

    fn parse_option(&mut self, arg: &str) -> Result<bool, OptionError> {
        let (name, value) = arg.split_once('=').unwrap_or((arg, ""));
        match name {
            "--I1" => self.opts.i1 = Some(config::parse(name, value).map_err(OptionError)?),
            "--D1" => self.opts.d1 = Some(config::parse(name, value).map_err(OptionError)?),
            "--LL" | "--L2" => {
                self.opts.ll = Some(config::parse(name, value).map_err(OptionError)?)
            }
            "--cache-sim" => self.opts.cache_sim = yes_no(name, value)?,
            "--branch-sim" => self.opts.branch_sim = yes_no(name, value)?,
            "--cachegrind-out-file" => {
                if value.is_empty() {
                    return Err(OptionError(
                        "Bad option: --cachegrind-out-file: empty file name".into(),
                    ));
                }
                self.opts.out_file = value.to_string();
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn post_options(&mut self) -> Result<(), OptionError> {
        let chosen =
            config::choose(self.opts.i1, self.opts.d1, self.opts.ll).map_err(OptionError)?;
        *self.sim.lock() = Some(Machine {
            sim: Simulator::new(
                &chosen.i1,
                &chosen.d1,
                &chosen.ll,
                self.opts.cache_sim,
                self.opts.branch_sim,
            ),
            threads: HashMap::new(),
        });
        self.chosen = Some(chosen);
        let ways = self.recent_code_lines_ways();
        if let Some(m) = self.sim.lock().as_mut() {
            m.sim.set_code_table_ways(ways);
        }
        Ok(())
    }

    fn needs(&self) -> Needs {
        Needs {
            translation: true,
            instrument: true,
            ignores_heap: true,
            trace: true,
            recent_lines: self.recent_lines(),
            recent_lines_two_ways: self.recent_lines_two_ways(),
            recent_code_lines: self.recent_code_lines(),
            recent_code_lines_ways: self.recent_code_lines_ways(),
            indexed_counters: if self.counted_blocks().0 > 0 {
                MAX_INDEXED_COUNTERS
            } else {
                0
            },
            ..Needs::default()
        }
    }

    fn on_start(&self, host: &dyn Host) {
        if self.opts.quiet || self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut out = String::new();
        out.push_str(&host.banner(
            "Cachegrind, a cache and branch-prediction profiler",
            "Copyright (C) 2002-2017, and GNU GPL'd, by Nicholas Nethercote et al.",
        ));
        if let Some(c) = &self.chosen {
            for w in &c.warnings {
                out.push_str(&format!("--{}-- {w}\n", host.pid()));
            }
        }
        host.log(&out);
    }

    fn instrument(&self, _pc: Addr, block: &[Insn], plan: &mut Plan) {
        let i1_line_bits = self
            .chosen
            .as_ref()
            .map_or(6, |c| c.i1.line.trailing_zeros());
        adapter::instrument(
            block,
            plan,
            adapter::Tracing {
                i1_line_bits,
                data_records: self.opts.cache_sim,
                counted_blocks: self.counted_blocks().0,
                block_records: self.block_records(),
                code_miss_records: self.recent_code_lines_ways() >= 2,
            },
            &mut |pc| {
                let mut pcs = self.pcs.lock();
                pcs.push(pc);
                (pcs.len() - 1) as u32
            },
            &mut |info| self.blocks.push(info),
            &mut |lines| self.blocks.lines.push(lines),
            &mut |id, per_iteration| {
                let mut reps = self.reps.lock();
                let k = reps.len() as u32;
                (k < REP_COUNTERS).then(|| {
                    reps.push((id, per_iteration));
                    REP_COUNTERS_FROM + k
                })
            },
        );
    }

    fn on_fork_child(&self) {
        // A parent thread that was handing its trace to the simulator (or translating) when
        // another forked holds these locks in the child for ever, where it does not exist:
        // the child, which keeps the parent's counts as under Valgrind, hung at its next
        // drain (fault_injection.rs's fork-storm).
        // SAFETY: the child runs only the forking thread, which was inside fork(), not in a
        // Cachegrind handler, so it holds no guard of these locks.
        unsafe {
            self.sim.force_unlock();
            self.backlog.force_unlock();
            self.pcs.force_unlock();
            self.reps.force_unlock();
        }
    }

    /// One simulator for every thread, as Valgrind's: a thread that finds it busy does
    /// not wait (spinning, on a machine with fewer cores than threads, took the time of the
    /// program's other threads) but leaves a copy of its batch in the backlog, which the
    /// holder, or the next thread to take the simulator, runs first. A thread's batches are
    /// therefore simulated in order, the backlog's before any newer one. Only when the
    /// backlog is full does a thread wait.
    fn on_trace(&self, host: &dyn Host, records: &[TraceRecord]) {
        let tid = host.tid();
        let mut guard = match self.sim.try_lock() {
            Some(g) => g,
            None if self.backlog_len.load(Ordering::SeqCst) < MAX_BACKLOG => {
                let mut b = self.backlog.lock();
                let mut batch = b.spare.pop().unwrap_or_default();
                batch.clear();
                batch.extend_from_slice(records);
                b.batches.push_back((tid, batch));
                self.backlog_len.fetch_add(1, Ordering::SeqCst);
                drop(b);
                self.help_backlog();
                return;
            }
            None => self.sim.lock(),
        };
        let Some(m) = guard.as_mut() else { return };
        self.run_backlog(m);
        self.feed(m, tid, records);
        drop(guard);
        self.help_backlog();
    }

    fn fini(&self, host: &dyn Host, exit: Exit) {
        if self.finished.swap(true, Ordering::SeqCst) {
            return;
        }
        let talk = !self.opts.quiet && !matches!(exit, Exit::Exec);
        let costs = {
            let mut guard = self.sim.lock();
            let Some(m) = guard.as_mut() else { return };
            self.run_backlog(m);
            // The instructions of each thread's last block ran (the process is ending
            // after them): fetch them; where they would have gone is unknown.
            for st in m.threads.values_mut() {
                adapter::end_block(&mut m.sim, st, None);
            }
            let counted = self.counted_blocks().0.min(self.blocks.len());
            let reps = self.reps.lock().clone();
            let mut inline_runs = vec![
                0;
                if reps.is_empty() {
                    counted as usize
                } else {
                    (REP_COUNTERS_FROM as usize) + reps.len()
                }
            ];
            host.indexed_counter_totals(&mut inline_runs);
            adapter::charge_instructions(
                &mut m.sim,
                &self.blocks,
                &inline_runs[..counted as usize],
            );
            for (k, &(id, per_iteration)) in reps.iter().enumerate() {
                let iterations = inline_runs[REP_COUNTERS_FROM as usize + k];
                m.sim.charge_iterations(id, iterations, per_iteration);
            }
            m.sim.flush();
            // The simulator's work is done: its costs are moved out rather than copied,
            // and the rest of it (the caches' tags: 32 MiB for a 256 MiB LL) freed before
            // the report is built. Records that threads still running deliver from here
            // on find no simulator and are dropped, as they were left out of the report
            // before.
            let machine = guard.take();
            machine
                .map(|m| (m.sim.costs, m.sim.branch_costs))
                .unwrap_or_default()
        };
        let (file, totals) = self.build(host, &costs.0, &costs.1);
        let path = match host.expand_output_path(&self.opts.out_file) {
            Ok(p) => p,
            Err(e) => {
                host.log(&format!("cachegrind: --cachegrind-out-file: {}\n", e.0));
                return;
            }
        };
        let text = cachegrind::write(&file);
        if host.write_file(&path, text.as_bytes()).is_err() {
            host.log(&format!(
                "=={}== error: can't open cache simulation output file '{path}'\n",
                host.pid()
            ));
        }
        if talk {
            let pid = host.pid();
            let mut out = format!("=={pid}== \n");
            for l in cachegrind::summary_text(&totals, self.opts.cache_sim, self.opts.branch_sim) {
                out.push_str(&format!("=={pid}== {l}\n"));
            }
            host.log(&out);
        }
    }
}
