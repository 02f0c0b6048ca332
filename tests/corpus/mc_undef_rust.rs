// Uninitialised values in Rust as unsafe code makes them, one case per argument, for the
// definedness differential test (memcheck_definedness.rs): a Vec grown with `set_len`
// over memory never written, a raw allocation read before it is written, uninitialised
// bytes written to stdout through std's buffered writer, an uninitialised value sent to
// another thread, and a clean case through the same paths with every value set.
// `black_box` keeps the optimiser from reasoning about the uninitialised reads.
use std::alloc::{alloc, dealloc, Layout};
use std::hint::black_box;
use std::io::Write;
use std::sync::mpsc;

extern "C" {
    fn write(fd: i32, buf: *const u8, len: usize) -> isize;
}

/// A different function on each side of a branch, so that the branch stays a branch (one
/// call with a selected argument would move the undefined value into std's formatting).
#[inline(never)]
fn yes() {
    println!("yes");
}

#[inline(never)]
fn no() {
    println!("no");
}

fn main() {
    let what = std::env::args().nth(1).unwrap_or_else(|| "clean".to_string());
    match what.as_str() {
        "set-len" => {
            let mut v: Vec<u32> = Vec::with_capacity(16);
            v.push(1);
            // The other 15 elements were never written.
            unsafe { v.set_len(16) };
            let v = black_box(v);
            let s: u32 = v.iter().fold(0u32, |a, b| a.wrapping_add(*b));
            if s > 10 {
                yes()
            } else {
                no()
            }
        }
        "raw-alloc" => unsafe {
            let layout = Layout::from_size_align(64, 8).unwrap();
            let p = alloc(layout) as *mut u64;
            let x = std::ptr::read_volatile(p.add(3));
            if x == 7 {
                yes()
            } else {
                no()
            }
            dealloc(p as *mut u8, layout);
        },
        "write" => {
            let layout = Layout::from_size_align(24, 8).unwrap();
            let mut buf = [b'-'; 32];
            buf[31] = b'\n';
            // Copy uninitialised heap bytes without reading them as values.
            unsafe {
                let p = alloc(layout);
                std::ptr::copy_nonoverlapping(black_box(p), buf.as_mut_ptr().add(4), 24);
                dealloc(p, layout);
            }
            // Straight to the system call: stdout's line buffer would search the bytes
            // for a newline first (errors inside std whose places depend on how VEX
            // unrolls that loop).
            let buf = black_box(buf);
            unsafe { write(1, buf.as_ptr(), buf.len()) };
        }
        "thread" => {
            let (tx, rx) = mpsc::channel::<u64>();
            let t = std::thread::spawn(move || {
                let v = rx.recv().unwrap();
                if v > 5 {
                    yes()
                } else {
                    no()
                }
            });
            // The allocation is freed only after the send: an undefined value kept in a
            // register across a call of our allocator hooks is not tracked yet
            // (docs/differences-from-valgrind.md).
            let layout = Layout::from_size_align(32, 8).unwrap();
            let p = unsafe { alloc(layout) as *mut u64 };
            let x = unsafe { std::ptr::read_volatile(p) };
            tx.send(black_box(x)).unwrap();
            t.join().unwrap();
            unsafe { dealloc(p as *mut u8, layout) };
        }
        _ => {
            let mut v: Vec<u32> = Vec::with_capacity(16);
            v.extend(0..16);
            let v = black_box(v);
            let s: u32 = v.iter().fold(0u32, |a, b| a.wrapping_add(*b));
            let (tx, rx) = mpsc::channel::<u32>();
            let t = std::thread::spawn(move || rx.recv().unwrap() + 1);
            tx.send(s).unwrap();
            let r = t.join().unwrap();
            let mut out = std::io::stdout().lock();
            writeln!(out, "clean {} {}", s, r).unwrap();
        }
    }
}
