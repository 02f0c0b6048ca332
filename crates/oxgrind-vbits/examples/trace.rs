//! Runs a program under ptrace, single-stepping every instruction through the interpreter,
//! and prints the reports Memcheck's definedness checking would make: an end-to-end test of
//! the rules on real code (glibc's string functions, printf, the dynamic loader) before the
//! engine is wired. See `tests/tracer/mod.rs` for what it emulates.
//!
//!     cargo run --release -p oxgrind-vbits --example trace -- ./prog args...

#[path = "../tests/tracer/mod.rs"]
mod tracer;

use oxgrind_vbits::Check;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        eprintln!("usage: trace PROGRAM [ARGS...]");
        std::process::exit(2);
    }
    let t = tracer::trace(&args, false);
    eprintln!(
        "trace: {} instructions, {} reporting sites",
        t.steps,
        t.reports.len()
    );
    for r in &t.reports {
        let what = match r.check {
            Check::Condition => {
                "Conditional jump or move depends on uninitialised value(s)".to_string()
            }
            Check::Value { size, .. } => format!("Use of uninitialised value of size {size}"),
        };
        eprintln!("  {what}\n     at {:#x}: {} ({}x)", r.pc, r.place, r.count);
    }
}
