//! Native tries of replaced functions: a call the program makes to a function the embedder
//! replaces (`Embedder::redirect`: glibc's `memmove`, `memcmp`, ... under Memcheck) first
//! runs a native function of the embedder's (`Embedder::native_try`), which either does the
//! whole call's work, exactly as the replacement run translated would have, or declines;
//! only then does the replacement run translated.
//!
//! Why: the replacements run translated so that each of their accesses is checked like the
//! program's own, but nearly every call is short (bench `containers`: 8-12 byte string
//! compares and copies) and reports nothing, and translated, with its addressability and
//! definedness code, such a call costs a few hundred host instructions, mostly its prologue
//! and epilogue. The condition for "reports nothing" is cheap to decide natively for a short
//! range: its granules unmarked in the tool's shadow map (no filtered probe would call the
//! tool), none in the dead-frame window below the stack pointer, the arguments defined,
//! and for a function that branches on the bytes, those bytes defined.
//!
//! The contract for a try function (`TryFn`), called natively on the engine stack with the
//! program's call's six integer argument registers:
//!
//! * it returns `Tried { value, done: 1 }` only when the replacement, run translated from
//!   this call, would have made no report and had no effect but the one the try had (the
//!   memory it writes, the V bits of that memory, its result in `rax`, defined);
//! * it may decline (`done: 0`) at any point, having changed nothing the replacement would
//!   not then change the same way;
//! * it may fault on the program's memory (a pointer into unmapped memory): the fault
//!   declines the try from its gate (`asm::oxg_native_try_fault`), so the try must hold no
//!   lock and allocate nothing, and whatever it wrote before the fault must be written again
//!   by the replacement (a copy between ranges that do not overlap);
//! * it must not call the tool, the program, or anything that could enter the dispatcher.
//!
//! The helpers here answer the engine's half of the condition (the shadow map's marks, the
//! dead-frame window, the argument registers' V bits); [`crate::definedness`]'s
//! `first_undefined`, `copy` and `set` the memory's V bits.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::context as c;

/// What a try function returns (in `rax` and `rdx`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Tried {
    /// The call's result (the guest's `rax`) when done.
    pub value: u64,
    /// Nonzero: done; 0: declined, the replacement runs translated.
    pub done: u64,
}

impl Tried {
    pub const DECLINED: Tried = Tried { value: 0, done: 0 };

    pub fn done(value: u64) -> Tried {
        Tried { value, done: 1 }
    }
}

/// A try function: the program's call's `rdi`, `rsi`, `rdx`, `rcx`, `r8`, `r9`.
pub type TryFn = unsafe extern "C" fn(u64, u64, u64, u64, u64, u64) -> Tried;

/// The deepest window below the stack pointer any filtered probe compares an operand with
/// (`Plan::accesses_filtered_or_below_sp`'s `depth`), noted at translation.
static DEEPEST_BELOW_SP: AtomicU32 = AtomicU32::new(0);

/// Notes a filtered probe's below-the-stack-pointer window (at translation).
pub(crate) fn note_below_sp(depth: u32) {
    if depth > DEEPEST_BELOW_SP.load(Ordering::Relaxed) {
        DEEPEST_BELOW_SP.fetch_max(depth, Ordering::Relaxed);
    }
}

/// User addresses are below 2^47; the shadow map and the V bits cover those.
const ADDRESS_LIMIT: u64 = 1 << 47;

/// The calling thread's context, from a try function.
///
/// # Safety
/// Only from a try function: it runs natively on the engine stack, called by its gate
/// from translated code, where `gs` is the thread's context.
#[inline(always)]
unsafe fn ctx() -> &'static c::ThreadCtx {
    let p: u64;
    // SAFETY: reads the context's first word (its own address) through `gs`, the caller's
    // contract; nothing else.
    unsafe {
        core::arch::asm!("mov {}, gs:[0]", out(reg) p, options(nostack, readonly, preserves_flags))
    };
    // SAFETY: the thread's own live context (contexts are never unmapped).
    unsafe { &*(p as *const c::ThreadCtx) }
}

/// The stack pointer of the program's call being tried (its return address on top).
///
/// # Safety
/// As [`ctx`] (its gate saved the guest's `rsp`).
#[inline(always)]
unsafe fn guest_sp() -> u64 {
    // SAFETY: the caller's contract.
    unsafe { ctx() }.gregs[c::RSP]
}

/// Whether the replacement's accesses to `[p, p + n)` would pass every filtered probe
/// without a call: every granule they touch unmarked (0) in the tool's shadow map, and none
/// of them in or near the window below the stack pointer the probes compare with (the
/// replacement's own `rsp` lies at most a few words below the call's).
///
/// # Safety
/// Only from a try function (see [`guest_sp`]).
#[inline(always)]
pub unsafe fn unprobed(p: u64, n: u64) -> bool {
    if n == 0 {
        return true;
    }
    let Some(end) = p.checked_add(n).filter(|&e| e <= ADDRESS_LIMIT) else {
        return false;
    };
    // SAFETY: the caller's contract.
    let sp = unsafe { guest_sp() };
    // Before the first such probe is translated the window is not known yet (the
    // replacement's own probes may be the first): anything below the stack pointer then
    // declines. A decline is always sound: the replacement runs translated.
    let low = match DEEPEST_BELOW_SP.load(Ordering::Relaxed) as u64 {
        0 => 0,
        depth => sp.saturating_sub(depth + 64),
    };
    if p < sp && end > low {
        return false;
    }
    let base = crate::shadow::base();
    if base == 0 {
        return true;
    }
    let (mut g, last) = (p >> 3, (end - 1) >> 3);
    if last - g < 8 && g + 8 <= crate::shadow::SHADOW_SPAN {
        // A short range's granules (at most eight) in one load: the map holds a byte for
        // every granule below 2^47 (`SHADOW_SPAN` of them), so the word is inside it.
        // SAFETY: as below, for the eight bytes at `base + g`.
        let w = unsafe { core::ptr::read_unaligned((base + g) as *const u64) };
        let w = w & (u64::MAX >> (56 - 8 * (last - g)));
        if w == 0 {
            return true;
        }
        // The last granule may be a block's partial one, holding the range's end
        // (`ShadowSpec::prefix_values`: its first `v` bytes are unmarked).
        let top = 8 * (last - g);
        let v = w >> top;
        return w & !(0xff << top) == 0
            && v < 8
            && crate::shadow::prefix_values()
            && end - (last << 3) <= v;
    }
    // Eight granules at a time where they lie in one aligned word of the map.
    while g <= last {
        if g & 7 == 0 && last - g >= 7 {
            // SAFETY: the map is one reservation holding a shadow byte for every granule
            // below 2^47, never unmapped (pages never written read as zero); a byte racing
            // with a marking reads as the old or the new state, as the probes' loads do.
            let w = unsafe { core::ptr::read_volatile((base + g) as *const u64) };
            if w != 0 {
                // (A partial last granule among them: declined, for a long range.)
                return false;
            }
            g += 8;
            continue;
        }
        // SAFETY: as above.
        let v = unsafe { core::ptr::read_volatile((base + g) as *const u8) } as u64;
        if v != 0 {
            // Only the last granule may be partial, holding the range's end.
            return g == last && v < 8 && crate::shadow::prefix_values() && end - (g << 3) <= v;
        }
        g += 1;
    }
    true
}

/// Whether the first `count` integer arguments of the call being tried (rdi, rsi, rdx, rcx,
/// r8, r9) are known to be wholly defined: the replacement computes addresses and branches
/// from them, and reports an undefined one. False when unsure (a signal handler entered
/// since the program's last step); true without definedness, before the thread's first
/// step (all its shadows defined) and after the runtime's own code (every register holds
/// its values, defined: `definedness::catch_up`).
///
/// # Safety
/// As [`ctx`].
#[inline(always)]
pub unsafe fn arguments_defined(count: usize) -> bool {
    /// rdi, rsi, rdx, rcx, r8, r9 in the shadow file's (encoding) order.
    const ARGS: [usize; 6] = [7, 6, 2, 1, 8, 9];
    if !crate::definedness::enabled() {
        return true;
    }
    // SAFETY: the caller's contract; only this thread writes these fields, and it is here.
    let ctx = unsafe { ctx() };
    if ctx.vbits_signal != 0 {
        return false;
    }
    if ctx.vbits == 0 || ctx.vbits_own_code != 0 {
        return true;
    }
    ARGS[..count.min(ARGS.len())]
        .iter()
        .all(|&reg| ctx.vbits_gpr[reg] == 0)
}
