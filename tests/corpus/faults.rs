// Fault injection, Rust (see faults.c): the same modes, with threads that allocate the whole
// time (the Rust case of issue 11: SIGTERM to a threaded Rust program lost Massif's file).
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

extern "C" {
    fn raise(sig: i32) -> i32;
    fn kill(pid: i32, sig: i32) -> i32;
    fn getpid() -> i32;
    fn _exit(code: i32) -> !;
    fn fork() -> i32;
    fn vfork() -> i32;
    fn execl(path: *const u8, arg0: *const u8, ...) -> i32;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    fn setrlimit(resource: i32, rlim: *const [u64; 2]) -> i32;
    fn open(path: *const u8, flags: i32, ...) -> i32;
    fn close(fd: i32) -> i32;
    fn pause() -> i32;
}

static STOP: AtomicBool = AtomicBool::new(false);
/// Threads whose body has begun: the standard library's thread start-up (which holds its
/// own locks, among them the one `std::process::exit` takes again) is over for them.
static STARTED: AtomicUsize = AtomicUsize::new(0);
/// Forks of the `fork-storm` mode.
const FORK_STORM: usize = 20;

fn limit(resource: i32, bytes: u64) -> i32 {
    let r = [bytes, bytes];
    // SAFETY: a valid struct rlimit.
    if unsafe { setrlimit(resource, &r) } != 0 {
        return 1;
    }
    let mut v = Vec::new();
    for i in 0..4000 {
        v.push(vec![1u8; 1000 + i]);
    }
    let mut big: Vec<u8> = Vec::new();
    let ok = big.try_reserve_exact(bytes as usize * 2).is_ok();
    println!("small={} big={}", v.len(), if ok { "ok" } else { "null" });
    0
}

fn main() {
    let how = std::env::args().nth(1).unwrap_or_else(|| "exit".into());
    let mut keep: Vec<Vec<u8>> = (0..64).map(|_| vec![7u8; 16384]).collect();
    for i in 0..3 {
        std::thread::spawn(move || {
            STARTED.fetch_add(1, Ordering::AcqRel);
            while !STOP.load(Ordering::Relaxed) {
                let v = vec![i as u8; 100 + i * 10];
                std::hint::black_box(&v);
                std::thread::sleep(std::time::Duration::from_micros(2000));
            }
        });
    }
    // Every thread past its start before any mode runs: a thread still starting holds the
    // standard library's thread-info lock, and a fork at that instant left the child
    // waiting on it for ever in `process::exit` (natively too; seen under oxgrind, where a
    // thread's start takes longer).
    while STARTED.load(Ordering::Acquire) < 3 {
        std::thread::yield_now();
    }
    println!("mode {how}");
    std::io::stdout().flush().unwrap();
    // SAFETY (every block below): plain libc calls with valid arguments.
    let code = unsafe {
        match how.as_str() {
            "exit" => 3,
            "sigint" => { raise(2); 0 }
            "sigterm" => { kill(getpid(), 15); std::thread::sleep(std::time::Duration::from_secs(10)); 0 }
            "segv" => std::ptr::read_volatile(16 as *const i32),
            "abort" => std::process::abort(),
            "_exit" => _exit(4),
            "thread-exit" => { std::thread::spawn(|| std::process::exit(7)); loop { pause(); } }
            "exec" => { let e = std::process::Command::new("/bin/sh").args(["-c", "echo exec-ed; exit 9"]).exec(); eprintln!("{e}"); 126 }
            "fork" | "vfork" => {
                let pid = if how == "vfork" { vfork() } else { fork() };
                if pid == 0 {
                    if how == "vfork" { execl(b"/bin/true\0".as_ptr(), b"true\0".as_ptr(), std::ptr::null::<u8>()); _exit(127); }
                    keep.push(vec![1; 5000]);
                    std::process::exit(5);
                }
                let mut status = 0;
                waitpid(pid, &mut status, 0);
                println!("child status {}", (status >> 8) & 0xff);
                6
            }
            "fork-storm" => {
                // Forks while the threads allocate without pause: a lock or flag one of them
                // held at the instant of a fork must not hang that child (fault_injection.rs).
                for _ in 0..3 {
                    std::thread::spawn(|| {
                        STARTED.fetch_add(1, Ordering::AcqRel);
                        while !STOP.load(Ordering::Relaxed) {
                            std::hint::black_box(vec![0u8; 48]);
                        }
                    });
                }
                // A child calls std::process::exit, which takes a lock of the standard
                // library's that a thread holds while it starts: a fork in that window
                // leaves the child waiting for ever, natively too (seen under oxgrind, where
                // threads start slower). So the forks begin once every thread is running.
                while STARTED.load(Ordering::Acquire) < 6 {
                    std::thread::yield_now();
                }
                let mut fine = 0;
                for _ in 0..FORK_STORM {
                    let pid = fork();
                    if pid == 0 {
                        keep.push(vec![1; 5000]);
                        std::process::exit(5);
                    }
                    let mut status = 0;
                    waitpid(pid, &mut status, 0);
                    fine += (status == 5 << 8) as i32;
                }
                println!("children exited 5: {fine}");
                6
            }
            "rlimit-as" => limit(9, 256 << 20),
            "rlimit-data" => limit(2, 64 << 20),
            "rlimit-nofile" => {
                setrlimit(7, &[16, 16]);
                let mut n = 0;
                while open(b"/dev/null\0".as_ptr(), 0) >= 0 { n += 1; }
                println!("opened {n} more");
                0
            }
            "close-std" => { close(0); close(1); close(2); keep.push(vec![0; 10]); 8 }
            _ => { eprintln!("unknown mode {how}"); 2 }
        }
    };
    STOP.store(true, Ordering::Relaxed);
    std::hint::black_box(&keep);
    std::process::exit(code);
}
