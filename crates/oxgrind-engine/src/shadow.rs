//! The tool's shadow map: reserved here because the tool declares it (`Needs::shadow`) and
//! the filtered probes the translator emits read it inline (`gs:[shadow]`).
//!
//! One byte per 8-byte granule of the 47-bit user address space: one `MAP_NORESERVE`
//! reservation of 2^44 bytes made once, before the program's first allocator event; pages
//! never written read as zero ("nothing to check here") and cost nothing.

use core::sync::atomic::{AtomicU64, Ordering};

use oxgrind_tool::instrument::{ShadowMap, ShadowSpec};

/// Bytes of the reservation: one shadow byte per 8 bytes of a 2^47-byte address space.
pub const SHADOW_SPAN: u64 = 1 << 44;

static BASE: AtomicU64 = AtomicU64::new(0);
/// `ShadowSpec::prefix_values` of the map reserved.
static PREFIX_VALUES: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Whether a value below 8 means the granule's first that many bytes are unmarked
/// (`ShadowSpec::prefix_values`).
#[inline]
pub fn prefix_values() -> bool {
    PREFIX_VALUES.load(Ordering::Relaxed)
}

/// The map's base, 0 before [`reserve`] (or if it failed).
#[inline]
pub fn base() -> u64 {
    BASE.load(Ordering::Acquire)
}

/// Reserves the shadow map a tool declared; `None` if the geometry is not one the
/// translator can check inline, or the reservation failed (the tool then checks nothing,
/// rather than fail the program). Call once, before the engine starts and before the
/// first allocator event; later calls return the same map.
pub fn reserve(spec: ShadowSpec) -> Option<ShadowMap> {
    if spec.granule_shift != 3 || spec.bits != 8 {
        return None;
    }
    PREFIX_VALUES.store(spec.prefix_values, Ordering::Relaxed);
    let mut b = base();
    if b == 0 {
        // Placed low in the address space (a hint, not MAP_FIXED) rather than where the
        // kernel would put it, just below the program's libraries: there, 16 TiB would push
        // every later mapping 16 TiB down, and programs whose data structures depend on
        // address bits (python's obmalloc radix tree) would allocate differently than
        // natively or under Valgrind.
        const HINT: usize = 1 << 44;
        const SYS_MMAP: usize = 9;
        const PROT_RW: usize = 0x1 | 0x2;
        const MAP_PRIVATE_ANON_NORESERVE: usize = 0x02 | 0x20 | 0x4000;
        // SAFETY: an anonymous mapping with a hint (no MAP_FIXED) replaces nothing.
        let r = unsafe {
            oxgrind_sys::syscall::syscall6(
                SYS_MMAP,
                HINT,
                SHADOW_SPAN as usize,
                PROT_RW,
                MAP_PRIVATE_ANON_NORESERVE,
                usize::MAX,
                0,
            )
        };
        let p = match oxgrind_sys::syscall::check(r) {
            Ok(p) => p as u64,
            Err(_) => oxgrind_sys::raw::mmap_anon(SHADOW_SPAN as usize)? as u64,
        };
        // The map holds no pointers into the program's heap.
        oxgrind_sys::heap::note_private_mapping(p as usize, SHADOW_SPAN as usize);
        match BASE.compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => b = p,
            Err(other) => {
                // SAFETY: `p` is the reservation just made here, which nothing has seen.
                unsafe { oxgrind_sys::raw::munmap(p as *mut u8, SHADOW_SPAN as usize) };
                b = other;
            }
        }
        // Contexts made before (none, normally: this runs before the engine starts).
        crate::context::for_each(|ctx| {
            // SAFETY: contexts are never freed; translated code reads `shadow` only
            // through filtered probes, which are emitted only once a base exists.
            unsafe { core::ptr::write_volatile(&mut (*ctx).shadow, b) };
        });
    }
    // SAFETY: `b` is a 2^44-byte read-write reservation that is never unmapped, and
    // `discard` only drops whole pages inside it.
    Some(unsafe { ShadowMap::new(b, discard) })
}

/// Gives whole pages of the map back to the kernel: they read as zero again.
fn discard(start: u64, len: u64) {
    // SAFETY: `ShadowMap` passes whole pages of our own reservation; dropping them only
    // zeroes shadow bytes, which is the state being written.
    unsafe { oxgrind_sys::raw::discard(start as *mut u8, len as usize) };
}
