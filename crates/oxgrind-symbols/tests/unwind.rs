//! In-process capture through C code built without frame pointers, checked against glibc's
//! `backtrace()` (libgcc's DWARF unwinder) and named with the symbolizer.

mod common;

use std::ffi::c_int;
use std::sync::{Mutex, OnceLock};

use oxgrind_symbols::{capture, capture_from, text_range_of, Regs, Symbolizer};

/// Every frame between the callback and the Rust caller is C built with
/// `-O2 -fomit-frame-pointer`; one frame leaves garbage in rbp, one realigns its stack (CFA
/// from a DWARF expression), one has a variable-length array (CFA from rbp). The test
/// checks the library really has that CFI.
const CHAIN_C: &str = r#"
#include <signal.h>
typedef int (*cb_t)(int);
volatile int sink;

__attribute__((noinline)) int clobber_bp_then_call(cb_t cb, int x) {
    int r;
    /* rbp holds garbage while cb runs: a frame-pointer walk breaks here. */
    __asm__ volatile("mov $0x12345, %%rbp" ::: "rbp");
    r = cb(x);
    sink += r;
    return r;
}

__attribute__((noinline)) int realign_then_call(cb_t cb, int x) {
    /* Over-aligned local plus a VLA: GCC realigns through a DRAP register, and the CFA
       becomes the DWARF expression *(rbp - 8). */
    int big[16] __attribute__((aligned(64)));
    volatile char pad[x + 16];
    big[x & 15] = x;
    pad[0] = (char)x;
    int r = clobber_bp_then_call(cb, big[(x + 1) & 15] + x + pad[0]);
    sink += big[3];
    return r;
}

__attribute__((noinline)) int vla_then_call(cb_t cb, int n) {
    volatile char buf[n + 16];
    buf[0] = (char)n;
    int r = realign_then_call(cb, buf[0]);
    sink += buf[n];
    return r;
}

__attribute__((noinline)) int chain(int depth, cb_t cb) {
    int r;
    if (depth == 0)
        r = vla_then_call(cb, 4);
    else
        r = chain(depth - 1, cb);
    sink += r;
    return r + 1;
}

__attribute__((noinline)) int raise_in_chain(int sig) {
    raise(sig);
    sink += 1;
    return 0;
}

__attribute__((noinline)) int chain_then_raise(int depth, int sig) {
    int r;
    if (depth == 0)
        r = raise_in_chain(sig);
    else
        r = chain_then_raise(depth - 1, sig);
    sink += r;
    return r + 1;
}
"#;

type ChainFn = unsafe extern "C" fn(c_int, extern "C" fn(c_int) -> c_int) -> c_int;
type RaiseFn = unsafe extern "C" fn(c_int, c_int) -> c_int;

struct Chain {
    chain: ChainFn,
    chain_then_raise: RaiseFn,
}

fn chain_lib() -> &'static Chain {
    static LIB: OnceLock<Chain> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = common::scratch("unwind");
        let so = common::compile(
            &dir,
            "gcc",
            "chain",
            "c",
            CHAIN_C,
            &["-O2", "-g", "-fomit-frame-pointer", "-fPIC", "-shared"],
            "libchain.so",
        );
        let lib = common::Lib::open(&so);
        // SAFETY: the symbols have the declared C signatures (CHAIN_C above).
        unsafe {
            Chain {
                chain: std::mem::transmute::<*mut std::ffi::c_void, ChainFn>(lib.sym("chain")),
                chain_then_raise: std::mem::transmute::<*mut std::ffi::c_void, RaiseFn>(
                    lib.sym("chain_then_raise"),
                ),
            }
        }
    })
}

struct Captured {
    ours: Vec<u64>,
    oracle: Vec<u64>,
}

static CAPTURED: Mutex<Option<Captured>> = Mutex::new(None);
static SKIP: Mutex<(u64, u64)> = Mutex::new((0, 0));
/// Tests that go through `record` share CAPTURED and SKIP: they hold this.
static SERIAL: Mutex<()> = Mutex::new(());

extern "C" fn record(x: c_int) -> c_int {
    let mut buf = [0u64; 256];
    let skip = *SKIP.lock().unwrap();
    let n = capture(&mut buf, skip);
    let oracle = common::glibc_backtrace();
    *CAPTURED.lock().unwrap() = Some(Captured {
        ours: buf[..n].to_vec(),
        oracle,
    });
    x + 1
}

/// Runs the C chain `depth` deep with `record` at the top; tests share the statics, so they
/// take this lock.
fn run_chain(depth: c_int, skip: (u64, u64)) -> Captured {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    *SKIP.lock().unwrap() = skip;
    let lib = chain_lib();
    // SAFETY: chain is the C function above; record matches cb_t.
    unsafe { (lib.chain)(depth, record) };
    CAPTURED.lock().unwrap().take().expect("callback ran")
}

fn names(sym: &mut Symbolizer, ras: &[u64]) -> Vec<String> {
    ras.iter()
        .map(|&ra| {
            let frames = sym.describe(ra - 1);
            frames
                .last()
                .and_then(|f| f.function.clone())
                .unwrap_or_else(|| "???".into())
        })
        .collect()
}

#[test]
fn capture_matches_libgcc_through_code_without_frame_pointers() {
    let c = run_chain(12, (0, 0));
    // ours[0] returns into `record`; the oracle's [0] returns into glibc_backtrace's caller
    // frame (`record` too, at another call site), [1] is... compare from the C frames on.
    assert!(c.ours.len() > 20, "short capture: {:x?}", c.ours);
    assert_eq!(
        &c.ours[1..],
        &c.oracle[2..],
        "ours {:x?}\noracle {:x?}",
        c.ours,
        c.oracle
    );

    let cfi = std::process::Command::new("readelf")
        .args(["--debug-dump=frames"])
        .arg(common::scratch("unwind").join("libchain.so"))
        .output()
        .expect("readelf");
    let cfi = String::from_utf8_lossy(&cfi.stdout);
    assert!(
        cfi.contains("DW_CFA_def_cfa_expression (DW_OP_breg6 (rbp): -8; DW_OP_deref)"),
        "no DRAP frame built"
    );
    assert!(
        cfi.contains("DW_CFA_def_cfa_register: r6 (rbp)"),
        "no rbp-based frame built"
    );

    let mut sym = Symbolizer::from_self();
    let got = names(&mut sym, &c.ours[1..17]);
    let mut want = vec!["clobber_bp_then_call", "realign_then_call", "vla_then_call"];
    want.extend(std::iter::repeat_n("chain", 13));
    assert_eq!(got, want);
}

#[test]
fn leading_frames_in_the_skip_range_are_not_recorded() {
    let own = text_range_of(record as extern "C" fn(c_int) -> c_int as usize as u64)
        .expect("test binary text range");
    let c = run_chain(2, own);
    // Symbolise while no other test maps or unmaps libraries (they run in parallel).
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut sym = Symbolizer::from_self();
    let got = names(&mut sym, &c.ours);
    assert_eq!(
        &got[..5],
        &[
            "clobber_bp_then_call",
            "realign_then_call",
            "vla_then_call",
            "chain",
            "chain"
        ]
    );
    // Only leading frames are skipped: the Rust caller further out is still there.
    assert!(c.ours[5..].iter().any(|&ra| own.0 <= ra && ra < own.1));
}

#[test]
fn capture_stops_when_the_buffer_is_full() {
    let lib = chain_lib();
    extern "C" fn four(x: c_int) -> c_int {
        let mut buf = [0u64; 4];
        let n = capture(&mut buf, (0, 0));
        assert_eq!(n, 4);
        assert!(buf.iter().all(|&a| a != 0));
        x
    }
    // SAFETY: as in run_chain.
    unsafe { (lib.chain)(8, four) };
}

#[test]
fn concurrent_captures_agree_with_themselves() {
    let lib = chain_lib();
    extern "C" fn many(x: c_int) -> c_int {
        let mut first = [0u64; 64];
        let n = capture(&mut first, (0, 0));
        for _ in 0..2000 {
            let mut again = [0u64; 64];
            let m = capture(&mut again, (0, 0));
            // Same frames above the capture call site (same caller, same stack).
            assert_eq!(&first[1..n], &again[1..m]);
        }
        x
    }
    let threads: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                // SAFETY: as in run_chain.
                unsafe { (lib.chain)(3 + i, many) };
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
}

#[test]
fn garbage_registers_end_the_walk_without_faulting() {
    let mut sp: u64;
    // SAFETY: reads rsp only.
    unsafe { std::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack)) };
    let libc_code = common::backtrace
        as unsafe extern "C" fn(*mut *mut std::ffi::c_void, c_int) -> c_int
        as usize as u64;
    let mut out = [0u64; 64];
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..2000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let regs = Regs {
            pc: libc_code.wrapping_add(seed % 0x10_0000),
            sp: sp.wrapping_sub(seed % 8192) & !7,
            bp: seed,
        };
        let n = capture_from(regs, &mut out, (0, 0));
        assert!(n <= out.len());
    }
    // Addresses outside any mapping end at once.
    let n = capture_from(
        Regs {
            pc: 8,
            sp: 16,
            bp: 24,
        },
        &mut out,
        (0, 0),
    );
    assert_eq!(n, 1, "only the given pc: {:x?}", &out[..n]);
}

static IN_HANDLER: Mutex<Vec<u64>> = Mutex::new(Vec::new());

extern "C" fn on_signal(_sig: c_int) {
    let mut buf = [0u64; 64];
    let n = capture(&mut buf, (0, 0));
    // try_lock: never block in a signal handler.
    if let Ok(mut v) = IN_HANDLER.try_lock() {
        *v = buf[..n].to_vec();
    }
}

extern "C" {
    fn signal(sig: c_int, handler: extern "C" fn(c_int)) -> usize;
}

#[test]
fn capture_in_a_signal_handler_continues_through_the_signal_frame() {
    const SIGUSR1: c_int = 10;
    let lib = chain_lib();
    // SAFETY: on_signal is a valid handler; SIGUSR1 is raised only by this test.
    unsafe { signal(SIGUSR1, on_signal) };
    // SAFETY: chain_then_raise is the C function above.
    unsafe { (lib.chain_then_raise)(3, SIGUSR1) };
    let ras = IN_HANDLER.lock().unwrap().clone();
    let mut sym = Symbolizer::from_self();
    let got = names(&mut sym, &ras);
    let pos = got
        .iter()
        .position(|n| n == "raise_in_chain")
        .unwrap_or_else(|| panic!("no raise_in_chain in {got:?}"));
    assert_eq!(
        &got[pos..pos + 5],
        &[
            "raise_in_chain",
            "chain_then_raise",
            "chain_then_raise",
            "chain_then_raise",
            "chain_then_raise"
        ]
    );
}

/// `cargo test -p oxgrind-symbols --release --test unwind -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_capture_15_frames() {
    extern "C" fn bench(x: c_int) -> c_int {
        let mut buf = [0u64; 15];
        for _ in 0..10_000 {
            capture(&mut buf, (0, 0));
        }
        let iters = 1_000_000u32;
        let t = std::time::Instant::now();
        let mut total = 0;
        for _ in 0..iters {
            total += capture(&mut buf, (0, 0));
        }
        let ns = t.elapsed().as_nanos() as f64 / f64::from(iters);
        println!(
            "capture: {ns:.1} ns per call, {} frames each",
            total / iters as usize
        );
        x
    }
    let lib = chain_lib();
    // 12 chain + vla + realign + clobber frames = 15 C frames without frame pointers.
    // SAFETY: as in run_chain.
    unsafe { (lib.chain)(11, bench) };
}

#[test]
fn objects_loaded_after_earlier_captures_are_unwound_after_invalidate() {
    // Warm the module list, then load a library it cannot know yet.
    let _ = run_chain(1, (0, 0));
    let dir = common::scratch("late");
    let so = common::compile(
        &dir,
        "gcc",
        "late",
        "c",
        "typedef int (*cb_t)(int);\nvolatile int sink;\n\
         __attribute__((noinline)) int late_entry(int x, cb_t cb) { int r = cb(x); sink += r; return r; }\n",
        &["-O2", "-fomit-frame-pointer", "-fPIC", "-shared"],
        "liblate.so",
    );
    let lib = common::Lib::open(&so);
    oxgrind_symbols::invalidate();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    *SKIP.lock().unwrap() = (0, 0);
    // SAFETY: late_entry has the (int, cb_t) signature.
    let f = unsafe {
        std::mem::transmute::<
            *mut std::ffi::c_void,
            unsafe extern "C" fn(c_int, extern "C" fn(c_int) -> c_int) -> c_int,
        >(lib.sym("late_entry"))
    };
    // SAFETY: record matches cb_t.
    unsafe { f(1, record) };
    let c = CAPTURED.lock().unwrap().take().expect("callback ran");
    assert_eq!(&c.ours[1..], &c.oracle[2..]);
    let mut sym = Symbolizer::from_self();
    assert_eq!(names(&mut sym, &c.ours[1..2]), vec!["late_entry"]);
}

#[repr(C)]
struct StackT {
    ss_sp: *mut std::ffi::c_void,
    ss_flags: c_int,
    ss_size: usize,
}

/// glibc's x86-64 `struct sigaction`.
#[repr(C)]
struct SigAction {
    sa_handler: usize,
    sa_mask: [u64; 16],
    sa_flags: c_int,
    sa_restorer: usize,
}

extern "C" {
    fn sigaltstack(ss: *const StackT, old: *mut StackT) -> c_int;
    fn sigaction(sig: c_int, act: *const SigAction, old: *mut SigAction) -> c_int;
}

static ON_ALT: Mutex<Vec<u64>> = Mutex::new(Vec::new());

extern "C" fn on_alt_signal(_sig: c_int) {
    let mut buf = [0u64; 64];
    let n = capture(&mut buf, (0, 0));
    if let Ok(mut v) = ON_ALT.try_lock() {
        *v = buf[..n].to_vec();
    }
}

#[test]
fn capture_on_a_signal_stack_returns_to_the_thread_stack() {
    const SIGUSR2: c_int = 12;
    const SA_ONSTACK: c_int = 0x0800_0000;
    let lib = chain_lib();
    // Run on a fresh thread so the alternate stack stays private to this test.
    let got = std::thread::spawn(move || {
        let mut alt = vec![0u8; 256 * 1024];
        let ss = StackT {
            ss_sp: alt.as_mut_ptr().cast(),
            ss_flags: 0,
            ss_size: alt.len(),
        };
        let act = SigAction {
            sa_handler: on_alt_signal as extern "C" fn(c_int) as usize,
            sa_mask: [0; 16],
            sa_flags: SA_ONSTACK,
            sa_restorer: 0,
        };
        // SAFETY: ss describes memory that outlives the signal; act is a valid handler.
        unsafe {
            assert_eq!(sigaltstack(&ss, std::ptr::null_mut()), 0);
            assert_eq!(sigaction(SIGUSR2, &act, std::ptr::null_mut()), 0);
            (lib.chain_then_raise)(2, SIGUSR2);
        }
        let disable = StackT {
            ss_sp: std::ptr::null_mut(),
            ss_flags: 2, /* SS_DISABLE */
            ss_size: 0,
        };
        // SAFETY: disabling the alternate stack before its memory is freed.
        unsafe { sigaltstack(&disable, std::ptr::null_mut()) };
        drop(alt);
        ON_ALT.lock().unwrap().clone()
    })
    .join()
    .expect("thread");
    let mut sym = Symbolizer::from_self();
    let names = names(&mut sym, &got);
    let pos = names
        .iter()
        .position(|n| n == "raise_in_chain")
        .unwrap_or_else(|| panic!("no raise_in_chain in {names:?}"));
    assert_eq!(
        &names[pos..pos + 3],
        &["raise_in_chain", "chain_then_raise", "chain_then_raise"]
    );
}

/// Whole-file views of loaded objects (a symbolizer's, ours or the program's) come and go
/// while other threads unwind: the module list must neither take a view for the object
/// (wrong load bias: every frame "???") nor read a view's header after it is unmapped
/// (a fault inside an allocation hook, seen as "internal error" in ~1% of threaded runs).
#[test]
fn views_of_object_files_coming_and_going_do_not_disturb_unwinding() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let lib = chain_lib();
    let files = [
        std::env::current_exe().expect("test binary"),
        common::scratch("unwind").join("libchain.so"),
    ];
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                for f in &files {
                    let file = std::fs::File::open(f).expect("open object file");
                    // SAFETY: a read-only view of a file nobody writes during the test.
                    let view = unsafe { memmap2::Mmap::map(&file) }.expect("map");
                    std::hint::black_box(&view);
                }
            }
        });
        let end = std::time::Instant::now() + std::time::Duration::from_millis(1500);
        while std::time::Instant::now() < end {
            oxgrind_symbols::invalidate();
            let mut buf = [0u64; 64];
            assert!(capture(&mut buf, (0, 0)) > 2);
        }
        stop.store(true, Ordering::Relaxed);
    });
    let c = run_chain(2, (0, 0));
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let views: Vec<_> = files
        .iter()
        .map(|f| {
            let file = std::fs::File::open(f).expect("open object file");
            // SAFETY: as above.
            unsafe { memmap2::Mmap::map(&file) }.expect("map")
        })
        .collect();
    let mut sym = Symbolizer::from_self();
    drop(views);
    let got = names(&mut sym, &c.ours[1..4]);
    assert_eq!(
        got,
        ["clobber_bp_then_call", "realign_then_call", "vla_then_call"]
    );
    let _ = lib;
}
