//! A census of the dispatcher's entries (`OXGRIND_CENSUS`, engine development): which
//! instructions' clean calls and which blocks' lookups leave the code cache, and how often.
//!
//! Every entry of the dispatcher saves and restores the whole guest state (the XSAVE area
//! included), a few hundred cycles; under Memcheck an instruction without an inline
//! definedness fast form (`definedness::fast_form`), or whose fast path finds an undefined
//! input, pays that at each run. A profile shows the time in the dispatcher but not which
//! guest instructions send it there: this counts, per probe record (one per translated
//! instruction site) and per guest pc looked up, the entries, and names them at exit by
//! mnemonic and operand form, so the hot ones can be given a fast form.
//!
//! Off unless [`enable`] ran (one relaxed load per dispatcher entry then, beside its
//! XSAVE). The table is fixed (allocated at [`enable`], before the engine starts): counts
//! are atomics, keys are claimed with a compare-and-swap, so threads never take a lock.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use iced_x86::{Instruction, OpKind};

/// Keys (and counts) the table holds (16 MiB, only when the census is on); later keys are
/// counted in [`LOST`] only. 65,536 were too few for node: V8's generated code has that many
/// sites.
const SLOTS: usize = 1 << 20;

struct Slot {
    key: AtomicU64,
    count: AtomicU64,
}

/// The table, null while the census is off.
static TABLE: AtomicPtr<Slot> = AtomicPtr::new(core::ptr::null_mut());
/// Entries whose key found no free slot.
static LOST: AtomicU64 = AtomicU64::new(0);

/// What a key counts (its top byte).
const TAG_PROBE: u64 = 1;
const TAG_LOOKUP: u64 = 2;

/// Why a definedness step ran (bits 48..55 of a probe key): the step was due whatever the
/// inputs (`vbits_need_step`: after a move of `rsp` no fast form made, a `rep`, a system
/// call), the runtime's code or a signal ran before (`vbits_own_code`, `vbits_signal`), or
/// neither (the instruction has no fast form, or its fast path found an input undefined or
/// a memory operand's shadow with a chunk it could not check).
pub(crate) const STEP_DUE: u64 = 1;
pub(crate) const STEP_CATCH_UP: u64 = 2;
pub(crate) const STEP_OTHER: u64 = 0;

/// Turns the census on (before the engine starts: the table is allocated here, from our
/// own heap).
pub fn enable() {
    let mut v: Vec<Slot> = Vec::with_capacity(SLOTS);
    v.resize_with(SLOTS, || Slot {
        key: AtomicU64::new(0),
        count: AtomicU64::new(0),
    });
    let table = v.leak().as_mut_ptr();
    TABLE.store(table, Ordering::Release);
}

fn count(key: u64) {
    let table = TABLE.load(Ordering::Acquire);
    if table.is_null() {
        return;
    }
    // SAFETY: a non-null table is the leaked `SLOTS`-long array of `enable`, never freed.
    let slots = unsafe { core::slice::from_raw_parts(table, SLOTS) };
    let mut i = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOTS.trailing_zeros())) as usize;
    for _ in 0..SLOTS {
        let s = &slots[i % SLOTS];
        let k = s.key.load(Ordering::Relaxed);
        if k == key
            || k == 0
                && match s
                    .key
                    .compare_exchange(0, key, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => true,
                    Err(other) => other == key,
                }
        {
            s.count.fetch_add(1, Ordering::Relaxed);
            return;
        }
        i += 1;
    }
    LOST.fetch_add(1, Ordering::Relaxed);
}

/// A clean call with probe record `rec` (`why`: one of the `STEP_` reasons for a
/// definedness step, else 0).
#[inline]
pub(crate) fn probe(rec: u64, why: u64) {
    if !TABLE.load(Ordering::Relaxed).is_null() {
        count(TAG_PROBE << 56 | why << 48 | rec);
    }
}

/// A dispatcher entry that looks up the block of guest `pc` (an exit no link or the
/// indirect-branch table took, a system call, a signal's return).
#[inline]
pub(crate) fn lookup(pc: u64) {
    if !TABLE.load(Ordering::Relaxed).is_null() {
        count(TAG_LOOKUP << 56 | pc & ((1 << 48) - 1));
    }
}

/// An instruction's operand form: `r64`, `xmm`, `m32`, `imm`... in order.
pub(crate) fn operand_form(ins: &Instruction) -> String {
    let mut s = String::new();
    for i in 0..ins.op_count() {
        if i > 0 {
            s.push(',');
        }
        match ins.op_kind(i) {
            OpKind::Register => {
                let r = ins.op_register(i);
                let _ = if r.is_xmm() {
                    write!(s, "xmm")
                } else if r.is_ymm() {
                    write!(s, "ymm")
                } else if r.is_zmm() {
                    write!(s, "zmm")
                } else if r.is_gpr() {
                    write!(s, "r{}", r.size() * 8)
                } else {
                    write!(s, "{r:?}")
                };
            }
            OpKind::Memory => {
                let _ = write!(s, "m{}", ins.memory_size().size() * 8);
            }
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64 => s.push_str("rel"),
            k if format!("{k:?}").starts_with("Immediate") => s.push_str("imm"),
            k => {
                let _ = write!(s, "{k:?}");
            }
        }
    }
    if ins.has_rep_prefix() || ins.has_repne_prefix() {
        s.push_str(" (rep)");
    }
    if ins.has_op_mask() {
        s.push_str(" {k}");
    }
    s
}

/// The census so far, as text: totals, the entries by form (mnemonic, operands, why) and
/// the hottest sites. `None` when the census is off.
pub fn report() -> Option<String> {
    let table = TABLE.load(Ordering::Acquire);
    if table.is_null() {
        return None;
    }
    // SAFETY: as in `count`.
    let slots = unsafe { core::slice::from_raw_parts(table, SLOTS) };
    let mut by_form: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut sites: Vec<(u64, String)> = Vec::new();
    let (mut steps, mut probes, mut lookups) = (0u64, 0u64, 0u64);
    for s in slots {
        let (key, n) = (
            s.key.load(Ordering::Relaxed),
            s.count.load(Ordering::Relaxed),
        );
        if key == 0 || n == 0 {
            continue;
        }
        let label = match key >> 56 {
            TAG_PROBE => {
                let rec = key & ((1 << 48) - 1);
                let why = key >> 48 & 0xff;
                match crate::probe::describe_record(rec) {
                    crate::probe::RecordKind::Definedness(pc, ins) => {
                        steps += n;
                        let fast = crate::definedness::fast_form(ins).is_some();
                        let reason = match (fast, why) {
                            (false, _) => "no fast form",
                            (true, STEP_DUE) => "fast form, step due",
                            (true, STEP_CATCH_UP) => "fast form, catch-up",
                            _ => "fast form, input undefined",
                        };
                        sites.push((
                            n,
                            format!(
                                "{pc:#x} {:?} {} [{reason}]",
                                ins.mnemonic(),
                                operand_form(ins)
                            ),
                        ));
                        format!("step {:?} {} [{reason}]", ins.mnemonic(), operand_form(ins))
                    }
                    crate::probe::RecordKind::Other(pc, kind) => {
                        probes += n;
                        sites.push((n, format!("{pc:#x} probe {kind}")));
                        format!("probe {kind}")
                    }
                }
            }
            _ => {
                lookups += n;
                let pc = key & ((1 << 48) - 1);
                sites.push((n, format!("{pc:#x} block lookup")));
                String::from("block lookup")
            }
        };
        let e = by_form.entry(label).or_insert((0, 0));
        e.0 += n;
        e.1 += 1;
    }
    let mut forms: Vec<(u64, u64, String)> = by_form
        .into_iter()
        .map(|(k, (n, sites))| (n, sites, k))
        .collect();
    forms.sort_unstable_by(|a, b| b.0.cmp(&a.0));
    sites.sort_unstable_by(|a, b| b.0.cmp(&a.0));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "census: definedness steps {steps}, other probe calls {probes}, block lookups {lookups}, uncounted (table full) {}",
        LOST.load(Ordering::Relaxed)
    );
    let _ = writeln!(out, "census: by form (entries, sites, form)");
    for (n, sites, label) in forms.iter().take(80) {
        let _ = writeln!(out, "{n:>12} {sites:>6}  {label}");
    }
    let _ = writeln!(out, "census: by site (entries, pc, form)");
    for (n, label) in sites.iter().take(60) {
        let _ = writeln!(out, "{n:>12}  {label}");
    }
    Some(out)
}
