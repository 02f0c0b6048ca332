//! The program's address-space, data and descriptor limits, kept apart from oxgrind's own.
//!
//! The kernel counts every mapping of the process against `RLIMIT_AS` (and every private
//! writable one against `RLIMIT_DATA`): the program's and ours alike. Ours is large in
//! address space though small in memory (Memcheck's shadow is a 16 TiB `MAP_NORESERVE`
//! reservation; the engine's code cache, the private heap's reserve), so a program that
//! lowers its limit to what *it* needs (`setrlimit(RLIMIT_AS, 64 MiB)`) left nothing for
//! either: every later mapping failed, ours first, and the process aborted.
//!
//! As Valgrind does for `RLIMIT_DATA`, the program's limits are virtual: our `setrlimit`,
//! `getrlimit` and `prlimit` (and their `64` names) keep the values the program set and
//! show them back, with the kernel's rules (soft above hard: `EINVAL`; raising the hard
//! limit without privilege: `EPERM`). The kernel gets the program's soft limit plus the
//! address space that is ours when it is set, plus [`HEADROOM`] for what we cannot count
//! (file mappings the symboliser makes, engine memory made later); the kernel's hard limit
//! is left alone. So the program's own mappings fail where they would natively, within
//! `HEADROOM`, and ours do not. The private heap draws on its reserve first (counted here
//! already); each mapping it makes beyond the reserve moves the kernel's limit up by its
//! size, and each one it gives back down ([`map_outside_the_program_limit`]), so its
//! growth does not move that point either.
//!
//! Before an `exec` the program's values go to the kernel, so the new image (run natively,
//! without `--trace-children`) gets exactly what the program asked for; a failed `exec` puts
//! ours back. When the report is being written (the program has finished), the soft limits
//! go up to the hard ones: symbolising needs mappings the program's limit did not allow.
//!
//! `RLIMIT_NOFILE` is virtual the same way (as Valgrind keeps its own descriptors above the
//! program's limit): the kernel gets the program's soft limit, but not its hard one, so a
//! program that used every descriptor its limit allows still gets its report file.

use core::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

use oxgrind_sys::lock::SpinLock;
use oxgrind_sys::raw;
use oxgrind_sys::syscall::{check, syscall4};

const RLIMIT_DATA: c_int = 2;
const RLIMIT_NOFILE: c_int = 7;
const RLIMIT_AS: c_int = 9;
const RLIM_INFINITY: u64 = u64::MAX;
const SYS_PRLIMIT64: usize = 302;
const SYS_CAPGET: usize = 125;
const CAP_SYS_RESOURCE: u32 = 24;
const EINVAL: c_int = 22;
const EPERM: c_int = 1;
const EFAULT: c_int = 14;

/// Address space we add to the program's limit for our mappings we do not count.
pub const HEADROOM: u64 = 64 << 20;
/// Mappings this large are ours: a shadow reservation (no program keeps 1 TiB mapped under
/// a lowered limit).
const SHADOW_SIZE: u64 = 1 << 40;

/// `struct rlimit`.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Rlimit {
    pub cur: u64,
    pub max: u64,
}

/// The program's view of RLIMIT_AS and RLIMIT_DATA, once it has set one (before that, the
/// kernel's values are the program's).
static VIRTUAL: SpinLock<[Option<Rlimit>; 3]> = SpinLock::new([None, None, None]);
/// Whether the kernel currently holds our (raised) soft limits rather than the program's.
static RAISED: AtomicBool = AtomicBool::new(false);

fn slot(resource: c_int) -> Option<usize> {
    match resource {
        RLIMIT_AS => Some(0),
        RLIMIT_DATA => Some(1),
        RLIMIT_NOFILE => Some(2),
        _ => None,
    }
}

fn kernel_prlimit(
    resource: c_int,
    new: Option<&Rlimit>,
    old: Option<&mut Rlimit>,
) -> Result<(), c_int> {
    let n = new.map_or(0, |r| r as *const Rlimit as usize);
    let o = old.map_or(0, |r| r as *mut Rlimit as usize);
    // SAFETY: prlimit64 on ourselves (pid 0) with valid `struct rlimit` pointers or null.
    check(unsafe { syscall4(SYS_PRLIMIT64, 0, resource as usize, n, o) })
        .map(|_| ())
        .map_err(|e| e as c_int)
}

fn kernel_get(resource: c_int) -> Rlimit {
    let mut r = Rlimit {
        cur: RLIM_INFINITY,
        max: RLIM_INFINITY,
    };
    let _ = kernel_prlimit(resource, None, Some(&mut r));
    r
}

/// Address space oxgrind holds now, as the kernel counts it against `resource`: the private
/// heap's mappings (with its reserve and the engine's thread contexts), anonymous
/// executable-and-writable mappings (the code cache), and shadow-sized reservations. The
/// kernel counts every mapping against `RLIMIT_AS` but only private writable ones against
/// `RLIMIT_DATA`: there the shared and read-only parts of ours do not count (definedness's
/// primary table and each context's view of it are shared mappings of one file, 16 GiB
/// each), or the program would get that much more data than its limit allows.
fn ours_now(resource: c_int) -> u64 {
    let mut total = 0u64;
    let mut regions: Vec<(u64, u64)> = Vec::new();
    oxgrind_sys::heap::for_each_region(|s, l| {
        total += l as u64;
        regions.push((s as u64, (s + l) as u64));
    });
    for m in crate::roots::read_maps() {
        let anonymous = m.path.is_empty();
        let len = m.end - m.start;
        let in_regions: u64 = regions
            .iter()
            .map(|&(s, e)| m.end.min(e).saturating_sub(m.start.max(s)))
            .sum();
        if in_regions == 0 {
            if anonymous && ((m.writable && m.executable) || len >= SHADOW_SIZE) {
                total += len;
            }
        } else if resource == RLIMIT_DATA && (m.shared || !m.writable) {
            total = total.saturating_sub(in_regions);
        }
    }
    total
}

/// The kernel's soft limit for a program soft limit `cur`, given `ours` and the hard limit.
fn raised(cur: u64, ours: u64, kernel_max: u64) -> u64 {
    if cur == RLIM_INFINITY {
        return RLIM_INFINITY;
    }
    cur.saturating_add(ours)
        .saturating_add(HEADROOM)
        .min(kernel_max)
}

fn set(resource: c_int, new: &Rlimit) -> Result<(), c_int> {
    let i = slot(resource).expect("only AS and DATA are virtual");
    if new.cur > new.max {
        return Err(EINVAL);
    }
    let current = VIRTUAL.lock()[i].unwrap_or_else(|| kernel_get(resource));
    if new.max > current.max && !may_raise_hard_limits() {
        return Err(EPERM);
    }
    let kernel = kernel_get(resource);
    let kernel_max = kernel.max.max(new.max);
    // Descriptors: the program's soft limit as it is (ours live above it, opened at
    // start-up); the hard one stays, so the report can lift the soft one to open its files.
    let cur = if resource == RLIMIT_NOFILE {
        new.cur.min(kernel_max)
    } else {
        raised(new.cur, ours_now(resource), kernel_max)
    };
    let wanted = Rlimit {
        cur,
        max: kernel_max,
    };
    kernel_prlimit(resource, Some(&wanted), None)?;
    VIRTUAL.lock()[i] = Some(*new);
    RAISED.store(true, Ordering::Release);
    Ok(())
}

/// Whether the process has CAP_SYS_RESOURCE, which the kernel requires to raise a hard limit
/// (being root is not enough in a container that dropped it).
fn may_raise_hard_limits() -> bool {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    let header = Header {
        version: 0x2008_0522,
        pid: 0,
    }; // _LINUX_CAPABILITY_VERSION_3
    let mut data = [[0u32; 3]; 2]; // effective, permitted, inheritable; two words
                                   // SAFETY: capget with a version-3 header and room for its two data words.
    let r = unsafe {
        syscall4(
            SYS_CAPGET,
            &header as *const Header as usize,
            data.as_mut_ptr() as usize,
            0,
            0,
        )
    };
    check(r).is_ok() && data[0][0] & (1 << CAP_SYS_RESOURCE) != 0
}

fn get(resource: c_int) -> Rlimit {
    slot(resource)
        .and_then(|i| VIRTUAL.lock()[i])
        .unwrap_or_else(|| kernel_get(resource))
}

/// Puts the program's own values in the kernel (before `exec`: the new image is not ours).
pub fn apply_program_limits() {
    if !RAISED.swap(false, Ordering::AcqRel) {
        return;
    }
    for resource in [RLIMIT_AS, RLIMIT_DATA, RLIMIT_NOFILE] {
        let Some(v) = VIRTUAL.lock()[slot(resource).unwrap()] else {
            continue;
        };
        let kernel = kernel_get(resource);
        // Lowering the hard limit is always allowed; keep it where it is if the program's is
        // higher (it was raised as root, and is the kernel's then).
        let _ = kernel_prlimit(
            resource,
            Some(&Rlimit {
                cur: v.cur.min(kernel.max),
                max: v.max.min(kernel.max),
            }),
            None,
        );
    }
}

/// Gives our raised limits back after an `exec` that failed.
pub fn restore_after_failed_exec() {
    for resource in [RLIMIT_AS, RLIMIT_DATA, RLIMIT_NOFILE] {
        let Some(v) = VIRTUAL.lock()[slot(resource).unwrap()] else {
            continue;
        };
        let _ = set(resource, &v);
    }
}

/// Moves the kernel's soft address-space and data limits by `delta` bytes (within the hard
/// limits), when the kernel holds our raised ones. Read and write are two system calls: two
/// threads doing this at once may lose one's change (a drift of one mapping's size).
fn shift_ours(delta: i64) {
    for resource in [RLIMIT_AS, RLIMIT_DATA] {
        let k = kernel_get(resource);
        if k.cur == RLIM_INFINITY {
            continue;
        }
        let cur = (k.cur as i128 + delta as i128).clamp(0, k.max as i128) as u64;
        if cur != k.cur {
            let _ = kernel_prlimit(resource, Some(&Rlimit { cur, max: k.max }), None);
        }
    }
}

/// The private heap's mapping hook: once the program has set a limit, the kernel's moves
/// up by each mapping of ours (by its `slack` too, for the time of the call), so our growth
/// never comes out of the program's share. Allocates nothing.
pub fn map_outside_the_program_limit(
    bytes: usize,
    slack: usize,
    map: &mut dyn FnMut() -> *mut u8,
) -> *mut u8 {
    if !RAISED.load(Ordering::Acquire) {
        return map();
    }
    let (bytes, slack) = (bytes as i64, slack as i64);
    shift_ours(bytes + slack);
    let p = map();
    shift_ours(if p.is_null() {
        -(bytes + slack)
    } else {
        -slack
    });
    p
}

/// The private heap's unmapping hook: the room goes back to where it was.
pub fn unmapped_outside_the_program_limit(bytes: usize) {
    if RAISED.load(Ordering::Acquire) {
        shift_ours(-(bytes as i64));
    }
}

/// Set while set-up holds the kernel's address-space limit lifted ([`lift_for_setup`]).
static LIFTED_FOR_SETUP: AtomicBool = AtomicBool::new(false);

/// Before set-up reserves oxgrind's address space (the shadows' reservations, the private
/// heap's reserve, the code cache): a finite `RLIMIT_AS` the process started with (`ulimit
/// -v`) becomes the program's virtual limit, as if the program had set it, and the kernel's
/// is lifted (to the hard limit; past it, with CAP_SYS_RESOURCE) until
/// [`settle_after_setup`] puts it at the program's plus ours. Without this the shadows'
/// reservations failed under a limit Valgrind runs within (Memcheck's under `ulimit -v
/// 2000000`: no definedness, no addressability checks), because they are large in address
/// space though small in memory. Under a finite hard limit and no privilege to raise it
/// (bash's `ulimit -v` sets both, unless given `-S`) they still fail, and say so: the
/// inline checks index one table over the whole address space (16 GiB for definedness,
/// 16 TiB for addressability), which no such limit leaves room for.
pub fn lift_for_setup() {
    let k = kernel_get(RLIMIT_AS);
    // Under a finite hard limit we may not raise, nothing changes: the reservations fail
    // as before (and, the kernel's soft limit being at the hard one, the private heap's
    // mapping hooks could only take room away, `shift_ours` being clamped to it).
    let may_raise = may_raise_hard_limits();
    if k.cur == RLIM_INFINITY || (k.max != RLIM_INFINITY && !may_raise) {
        return;
    }
    {
        let mut v = VIRTUAL.lock();
        if v[0].is_some() {
            return;
        }
        v[0] = Some(k);
    }
    let unlimited = Rlimit {
        cur: RLIM_INFINITY,
        max: RLIM_INFINITY,
    };
    let to_hard = Rlimit {
        cur: k.max,
        max: k.max,
    };
    if !(may_raise && kernel_prlimit(RLIMIT_AS, Some(&unlimited), None).is_ok()) {
        let _ = kernel_prlimit(RLIMIT_AS, Some(&to_hard), None);
    }
    RAISED.store(true, Ordering::Release);
    LIFTED_FOR_SETUP.store(true, Ordering::Release);
}

/// Once set-up has made its reservations: the kernel's address-space limit becomes the
/// program's plus the address space that is ours (see the module comment).
pub fn settle_after_setup() {
    if !LIFTED_FOR_SETUP.swap(false, Ordering::AcqRel) {
        return;
    }
    let Some(program) = VIRTUAL.lock()[0] else {
        return;
    };
    let k = kernel_get(RLIMIT_AS);
    let cur = raised(program.cur, ours_now(RLIMIT_AS), k.max);
    let _ = kernel_prlimit(RLIMIT_AS, Some(&Rlimit { cur, max: k.max }), None);
}

/// Lifts the soft limits to the hard ones while the report is written (the program is done).
pub fn lift_for_report() {
    if !RAISED.load(Ordering::Acquire) {
        return;
    }
    for resource in [RLIMIT_AS, RLIMIT_DATA, RLIMIT_NOFILE] {
        let mut k = kernel_get(resource);
        k.cur = k.max;
        let _ = kernel_prlimit(resource, Some(&k), None);
    }
}

// ---------------------------------------------------------------------------------------
// The program's entry points. Each leaves `errno` alone on success and sets it on failure,
// as glibc's do; anything but AS and DATA, or another process, goes to glibc unchanged.

type PrlimitFn = unsafe extern "C" fn(c_int, c_int, *const Rlimit, *mut Rlimit) -> c_int;

fn set_errno(e: c_int) {
    extern "C" {}
    // SAFETY: glibc's errno location for this thread.
    unsafe { *crate::guard::errno_slot() = e };
}

fn real_prlimit() -> Option<PrlimitFn> {
    static REAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let mut f = REAL.load(Ordering::Acquire);
    if f == 0 {
        f = crate::libc_api::next_symbol(b"prlimit64\0") as usize;
        REAL.store(f, Ordering::Release);
    }
    // SAFETY: dlsym found glibc's prlimit64, whose signature is PrlimitFn.
    (f != 0).then(|| unsafe { core::mem::transmute::<usize, PrlimitFn>(f) })
}

/// `prlimit(pid, resource, new, old)` for every name the program may call.
unsafe fn prlimit_common(
    pid: c_int,
    resource: c_int,
    new: *const Rlimit,
    old: *mut Rlimit,
) -> c_int {
    // dlsym and the maps reader allocate: as oxgrind, not as the program.
    let _inside = crate::guard::Entered::try_enter();
    let me = pid == 0 || pid == raw::getpid();
    if !me || slot(resource).is_none() {
        let Some(real) = real_prlimit() else {
            set_errno(EINVAL);
            return -1;
        };
        // SAFETY: forwarded as given.
        return unsafe { real(pid, resource, new, old) };
    }
    let previous = get(resource);
    if !new.is_null() {
        // SAFETY: the caller's `struct rlimit`, read once.
        let new = unsafe { core::ptr::read_unaligned(new) };
        if let Err(e) = set(resource, &new) {
            set_errno(e);
            return -1;
        }
    }
    if !old.is_null() {
        // SAFETY: the caller's out-parameter.
        unsafe { core::ptr::write_unaligned(old, previous) };
        // Written by our code, which runs without definedness steps.
        oxgrind_engine::definedness::set(old as u64, core::mem::size_of::<Rlimit>() as u64, true);
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn prlimit64(
    pid: c_int,
    resource: c_int,
    new: *const Rlimit,
    old: *mut Rlimit,
) -> c_int {
    // SAFETY: same contract as glibc's prlimit64.
    unsafe { prlimit_common(pid, resource, new, old) }
}

#[no_mangle]
pub unsafe extern "C" fn prlimit(
    pid: c_int,
    resource: c_int,
    new: *const Rlimit,
    old: *mut Rlimit,
) -> c_int {
    // SAFETY: same contract as glibc's prlimit (64-bit rlim_t on x86-64).
    unsafe { prlimit_common(pid, resource, new, old) }
}

#[no_mangle]
pub unsafe extern "C" fn setrlimit(resource: c_int, new: *const Rlimit) -> c_int {
    if new.is_null() {
        set_errno(EFAULT);
        return -1;
    }
    // SAFETY: same contract as glibc's setrlimit.
    unsafe { prlimit_common(0, resource, new, core::ptr::null_mut()) }
}

#[no_mangle]
pub unsafe extern "C" fn setrlimit64(resource: c_int, new: *const Rlimit) -> c_int {
    // SAFETY: same contract.
    unsafe { setrlimit(resource, new) }
}

#[no_mangle]
pub unsafe extern "C" fn getrlimit(resource: c_int, old: *mut Rlimit) -> c_int {
    if old.is_null() {
        set_errno(EFAULT);
        return -1;
    }
    // SAFETY: same contract as glibc's getrlimit.
    unsafe { prlimit_common(0, resource, core::ptr::null(), old) }
}

#[no_mangle]
pub unsafe extern "C" fn getrlimit64(resource: c_int, old: *mut Rlimit) -> c_int {
    // SAFETY: same contract.
    unsafe { getrlimit(resource, old) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_limit_is_the_programs_plus_ours_within_the_hard_limit() {
        assert_eq!(raised(RLIM_INFINITY, 10, RLIM_INFINITY), RLIM_INFINITY);
        assert_eq!(
            raised(64 << 20, 1 << 44, RLIM_INFINITY),
            (64 << 20) + (1 << 44) + HEADROOM
        );
        assert_eq!(raised(64 << 20, 1 << 44, 1 << 30), 1 << 30);
    }
}
