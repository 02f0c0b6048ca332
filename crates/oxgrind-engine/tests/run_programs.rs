//! Real programs run under the engine (the `preload` example library) must behave exactly as
//! they do natively: same stdout, stderr and exit status.
//!
//! Every engine run sets `OXGRIND_ENGINE_COUNT=1`, and the test requires the engine's
//! "instructions executed" line on stderr: it is printed from the dispatcher's `exit_group`
//! hook, so it proves that the process ended *inside* the code cache (a program that had
//! escaped to native execution, as a `siglongjmp` out of a natively run handler would,
//! exits without it).

mod common;

use common::{compile, run, work_dir};
use std::process::Command;

const REPORT: &str = "oxgrind-engine: instructions executed: ";

/// Splits the engine's lines off stderr; returns (stderr without them, the main
/// process's count, all engine lines).
fn split_report(stderr: &[u8]) -> (String, Option<u64>, Vec<String>) {
    let text = String::from_utf8_lossy(stderr);
    let mut rest = String::new();
    let mut count = None;
    let mut engine = Vec::new();
    for line in text.split_inclusive('\n') {
        if let Some(n) = line.strip_prefix(REPORT) {
            count = n.trim().parse().ok();
        }
        if line.starts_with("oxgrind-engine: ") {
            engine.push(line.trim_end().to_string());
        } else {
            rest.push_str(line);
        }
    }
    (rest, count, engine)
}

/// Runs natively and under the engine; asserts identical behaviour; returns the engine's
/// own stderr lines.
fn same_as_native(cmd: &[&str], extra_env: &[(&str, &str)]) -> Vec<String> {
    let native = run(cmd, false, extra_env);
    let engine = run(cmd, true, extra_env);
    let (stderr, count, engine_lines) = split_report(&engine.stderr);
    assert_eq!(
        String::from_utf8_lossy(&engine.stdout),
        String::from_utf8_lossy(&native.stdout),
        "stdout differs for {cmd:?}"
    );
    assert_eq!(
        stderr,
        String::from_utf8_lossy(&native.stderr),
        "stderr differs for {cmd:?}"
    );
    assert_eq!(
        engine.status.code(),
        native.status.code(),
        "exit status differs for {cmd:?}"
    );
    let count = count.unwrap_or_else(|| panic!("{cmd:?} did not exit under the engine: {stderr}"));
    assert!(count > 0);
    engine_lines
}

const C_PROGRAM: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
__attribute__((noinline)) int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
static double (*volatile op)(double) = 0;
static double twice(double x) { return 2 * x; }
int main(int argc, char **argv) {
  int a[1000];
  for (int i = 0; i < 1000; i++) a[i] = (i * 7919) % 1000;
  qsort(a, 1000, sizeof(int), cmp);
  char buf[4096]; memset(buf, 'x', sizeof buf); buf[4095] = 0;
  op = twice;
  double d = 0; for (int i = 0; i < 100000; i++) d += op(i * 0.5);
  printf("fib=%d a[500]=%d len=%zu d=%.1f argc=%d\n", fib(22), a[500], strlen(buf), d, argc);
  fprintf(stderr, "to stderr\n");
  return 3;
}
"#;

#[test]
fn c_program_with_loops_calls_and_printf_behaves_as_native() {
    let bin = compile("cprog", "c", C_PROGRAM, &[]);
    same_as_native(&[bin.to_str().unwrap(), "x", "y"], &[]);
}

#[test]
fn far_code_cache_rewrites_rip_relative_operands_correctly() {
    let bin = compile("cprog_far", "c", C_PROGRAM, &[]);
    let lines = same_as_native(
        &[bin.to_str().unwrap()],
        &[("OXGRIND_ENGINE_FAR", "1"), ("OXGRIND_ENGINE_STATS", "1")],
    );
    let stats = lines
        .iter()
        .find(|l| l.contains("far rip-relative rewrites"))
        .expect("stats line");
    let n: u64 = stats.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n > 100, "far path barely used: {stats}");
}

#[test]
fn ls_la_usr_bin_behaves_as_native() {
    same_as_native(&["ls", "-la", "/usr/bin"], &[("LC_ALL", "C")]);
}

#[test]
fn sort_of_a_generated_file_behaves_as_native() {
    let dir = work_dir();
    let file = dir.join("unsorted.txt");
    let mut text = String::new();
    let mut x: u64 = 12345;
    for i in 0..20000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        text.push_str(&format!("{:x} line {i}\n", x >> 20));
    }
    std::fs::write(&file, text).unwrap();
    same_as_native(&["sort", file.to_str().unwrap()], &[("LC_ALL", "C")]);
}

#[test]
fn python3_sum_behaves_as_native() {
    // The interpreter itself: `python3` on the PATH may be a shell shim.
    same_as_native(&["/usr/bin/python3", "-c", "print(sum(range(10**6)))"], &[]);
}

#[test]
fn perl_one_liner_behaves_as_native() {
    same_as_native(
        &["perl", "-e", "my %h; $h{$_ % 97} += $_ for 1..100000; print join(',', map { \"$_=$h{$_}\" } sort { $a <=> $b } keys %h), \"\\n\"; exit 4"],
        &[],
    );
}

#[test]
fn cpp_exceptions_thrown_and_caught_behave_as_native() {
    let bin = compile(
        "exc",
        "cc",
        r#"
#include <cstdio>
#include <stdexcept>
#include <string>
static int thrower(int i) { if (i % 3 == 0) throw std::runtime_error("boom " + std::to_string(i)); return i; }
int main() {
  long caught = 0, sum = 0;
  for (int i = 0; i < 1000; i++) {
    try { sum += thrower(i); } catch (const std::exception &e) { caught++; if (i == 999) std::printf("last: %s\n", e.what()); }
  }
  std::printf("caught=%ld sum=%ld\n", caught, sum);
}
"#,
        &[],
    );
    same_as_native(&[bin.to_str().unwrap()], &[]);
}

#[test]
fn four_pthreads_with_a_mutex_behave_as_native() {
    let bin = compile(
        "threads",
        "c",
        r#"
#include <pthread.h>
#include <stdio.h>
static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static long total;
static void *work(void *arg) {
  long id = (long)arg;
  for (long i = 0; i < 100000; i++) { pthread_mutex_lock(&m); total += id + 1; pthread_mutex_unlock(&m); }
  return (void *)(id * 10);
}
int main(void) {
  pthread_t t[4]; long rets = 0;
  for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, work, (void *)i);
  for (int i = 0; i < 4; i++) { void *r; pthread_join(t[i], &r); rets += (long)r; }
  printf("total=%ld rets=%ld\n", total, rets);
  return 0;
}
"#,
        &["-pthread"],
    );
    same_as_native(&[bin.to_str().unwrap()], &[]);
}

#[test]
fn sigsegv_handler_with_siglongjmp_stays_under_the_engine() {
    let bin = compile(
        "segv",
        "c",
        r#"
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
static sigjmp_buf env;
static volatile int hits;
static void on_segv(int sig) { hits++; siglongjmp(env, 1); }
static void on_usr1(int sig, siginfo_t *si, void *uc) { hits += 100 * (si->si_signo == SIGUSR1); }
int main(void) {
  struct sigaction sa; memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_segv; sigaction(SIGSEGV, &sa, NULL);
  sa.sa_sigaction = on_usr1; sa.sa_flags = SA_SIGINFO; sigaction(SIGUSR1, &sa, NULL);
  for (int i = 0; i < 5; i++)
    if (sigsetjmp(env, 1) == 0) { volatile int *p = (int *)(long)(16 + i); *p = 1; puts("not reached"); }
  raise(SIGUSR1);
  struct sigaction old; sigaction(SIGSEGV, NULL, &old);
  printf("hits=%d handler_reported=%d\n", hits, old.sa_handler == on_segv);
  return 0;
}
"#,
        &[],
    );
    same_as_native(&[bin.to_str().unwrap()], &[]);
}

#[test]
fn timer_signals_during_a_busy_loop_are_delivered_to_the_guest_handler() {
    let bin = compile(
        "alarm",
        "c",
        r#"
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
static volatile long ticks;
static void on_alarm(int sig) { ticks++; }
int main(void) {
  struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_handler = on_alarm; sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, NULL);
  struct itimerval it = {{0, 1000}, {0, 1000}};
  setitimer(ITIMER_REAL, &it, NULL);
  volatile unsigned long x = 0;
  while (ticks < 50) { for (int i = 0; i < 1000; i++) x += i; getppid(); }
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  printf("ticks>=50: %d\n", ticks >= 50);
  return 0;
}
"#,
        &[],
    );
    same_as_native(&[bin.to_str().unwrap()], &[]);
}

#[test]
fn undecodable_instruction_is_reported_and_the_program_stops_with_status_1() {
    let bin = compile(
        "invalid",
        "c",
        r#"
#include <stdio.h>
int main(void) {
  puts("before");
  fflush(stdout);
  __asm__ volatile(".globl bad_insn\nbad_insn: .byte 0x06");  /* push es: invalid in 64-bit mode */
  puts("after");
  return 0;
}
"#,
        &[],
    );
    let out = run(&[bin.to_str().unwrap()], true, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "before\n");
    assert!(
        stderr.contains("oxgrind-engine: invalid instruction at 0x"),
        "stderr: {stderr}"
    );
    assert!(stderr.contains("bytes: 06"), "stderr: {stderr}");
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn code_unmapped_by_dlclose_is_retranslated_when_another_library_takes_its_place() {
    let dir = work_dir();
    for (name, mul, val) in [("liba", 10, 1), ("libb", 100, 2)] {
        let src = dir.join(format!("{name}.c"));
        std::fs::write(
            &src,
            format!("int value(void) {{ return {val}; }}\nint helper(int x) {{ return x * {mul} + value(); }}\n"),
        )
        .unwrap();
        let out = Command::new("gcc")
            .args(["-O2", "-shared", "-fPIC", "-o"])
            .arg(dir.join(format!("{name}.so")))
            .arg(&src)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let bin = compile(
        "dl",
        "c",
        r#"
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
  for (int i = 0; i < 6; i++) {
    void *h = dlopen(argv[1 + i % 2], RTLD_NOW);
    if (!h) { printf("dlopen failed\n"); return 1; }
    int (*f)(int) = (int (*)(int))dlsym(h, "helper");
    printf("%d\n", f(i));
    dlclose(h);
  }
  return 0;
}
"#,
        &["-ldl"],
    );
    let a = dir.join("liba.so");
    let b = dir.join("libb.so");
    same_as_native(
        &[
            bin.to_str().unwrap(),
            a.to_str().unwrap(),
            b.to_str().unwrap(),
        ],
        &[],
    );
}

#[test]
fn threads_creating_threads_five_hundred_times_behave_as_native() {
    let bin = compile(
        "nested_threads",
        "c",
        r#"
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
static atomic_long total;
static void *leaf(void *arg) { atomic_fetch_add(&total, (long)arg); return NULL; }
static void *mid(void *arg) {
  pthread_t t[4];
  for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, leaf, (void *)(i + (long)arg));
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  return NULL;
}
int main(void) {
  for (int round = 0; round < 25; round++) {
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, mid, (void *)(i * 10));
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  }
  printf("total=%ld\n", (long)total);
  return 0;
}
"#,
        &["-pthread"],
    );
    same_as_native(&[bin.to_str().unwrap()], &[]);
}

#[test]
fn rust_program_with_threads_hashmap_and_caught_panic_behaves_as_native() {
    let dir = work_dir();
    let src = dir.join("rustprog.rs");
    std::fs::write(
        &src,
        r#"
use std::collections::HashMap;
fn main() {
    let mut m = HashMap::new();
    for i in 0..200000u64 { *m.entry(i % 1000).or_insert(0u64) += i; }
    let mut v: Vec<_> = m.into_iter().collect();
    v.sort();
    let hs: Vec<_> = (0..4u64)
        .map(|t| std::thread::spawn(move || (0..100000u64).map(|x| x * t).sum::<u64>()))
        .collect();
    let s: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    // The default hook prints the thread id, which differs between runs.
    std::panic::set_hook(Box::new(|info| eprintln!("panic: {}", info.payload().downcast_ref::<&str>().unwrap_or(&"?"))));
    let r = std::panic::catch_unwind(|| { if v.len() > 5 { panic!("caught panic"); } });
    println!("{} {:?} {} {}", v.len(), v[7], s, r.is_err());
    std::process::exit(7);
}
"#,
    )
    .unwrap();
    let bin = dir.join("rustprog");
    let out = Command::new("rustc")
        .arg("-O")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("run rustc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    same_as_native(&[bin.to_str().unwrap()], &[("RUST_BACKTRACE", "0")]);
}

#[test]
fn fork_vfork_and_system_behave_as_native() {
    let bin = compile(
        "forks",
        "c",
        r#"
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
  int r = system("echo from-system");
  printf("system=%d\n", r);
  fflush(stdout);
  int st;
  pid_t p = vfork();
  if (p == 0) { execl("/bin/echo", "echo", "vforked", (char *)NULL); _exit(9); }
  waitpid(p, &st, 0);
  printf("vfork status=%d\n", WEXITSTATUS(st));
  fflush(stdout);
  pid_t q = fork();
  if (q == 0) { printf("fork child\n"); exit(5); }
  waitpid(q, &st, 0);
  printf("fork status=%d\n", WEXITSTATUS(st));
  return 0;
}
"#,
        &[],
    );
    same_as_native(&[bin.to_str().unwrap()], &[]);
}

#[test]
fn contexts_of_exited_threads_are_reused_by_new_threads() {
    let bin = compile(
        "sequential_threads",
        "c",
        r#"
#include <pthread.h>
#include <stdio.h>
static void *f(void *a) { return a; }
int main(void) {
  long s = 0;
  for (long i = 0; i < 2000; i++) { pthread_t t; void *r; pthread_create(&t, NULL, f, (void *)i); pthread_join(t, &r); s += (long)r; }
  printf("%ld\n", s);
  return 0;
}
"#,
        &["-pthread"],
    );
    let lines = same_as_native(&[bin.to_str().unwrap()], &[("OXGRIND_ENGINE_STATS", "1")]);
    let stats = lines
        .iter()
        .find(|l| l.contains("thread contexts created"))
        .expect("stats line");
    let created: u64 = stats
        .split("created: ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .expect("created count");
    assert!(
        created < 100,
        "2000 sequential threads made {created} contexts: {stats}"
    );
}

#[test]
fn rust_stack_overflow_is_detected_on_the_alternate_signal_stack_as_natively() {
    use std::os::unix::process::ExitStatusExt;
    let dir = work_dir();
    let src = dir.join("overflow.rs");
    std::fs::write(
        &src,
        r#"
fn rec(n: u64, v: &mut [u8; 1024]) -> u64 {
    v[0] = n as u8;
    let mut w = [0u8; 1024];
    if n == 0 { 0 } else { rec(n - 1, &mut w) + w[0] as u64 + v[1] as u64 }
}
fn main() { let mut v = [0u8; 1024]; println!("{}", rec(u64::MAX, &mut v)); }
"#,
    )
    .unwrap();
    let bin = dir.join("overflow");
    let out = Command::new("rustc")
        .arg("-O")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("run rustc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cmd = [bin.to_str().unwrap()];
    let native = run(&cmd, false, &[]);
    let engine = run(&cmd, true, &[]);
    // Rust's std catches the guard-page SIGSEGV on its sigaltstack, reports, and aborts.
    for out in [&native, &engine] {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("has overflowed its stack"),
            "stderr: {stderr}"
        );
        assert_eq!(out.status.signal(), Some(6), "status: {:?}", out.status);
    }
}

/// A tiny JIT: code written into RWX memory, run, overwritten in place and run again; code
/// written while RW and run while RX (`mprotect` in between, never `munmap`); and an
/// immediate patched in a function of the program's own text that already ran.
const JIT_PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int (*fn_t)(int);

/* f(x) = sum_{i=1..n} (x + k) via a loop: exercises a multi-block JIT function.
   mov eax, 0; mov ecx, n; L: lea edx,[rdi+k]; add eax, edx; dec ecx; jnz L; ret */
static size_t emit_loop(uint8_t *p, int32_t n, int8_t k) {
  size_t i = 0;
  p[i++] = 0xB8; memset(p + i, 0, 4); i += 4;               /* mov eax, 0 */
  p[i++] = 0xB9; memcpy(p + i, &n, 4); i += 4;              /* mov ecx, n */
  p[i++] = 0x8D; p[i++] = 0x57; p[i++] = (uint8_t)k;        /* lea edx, [rdi+k] */
  p[i++] = 0x01; p[i++] = 0xD0;                             /* add eax, edx */
  p[i++] = 0xFF; p[i++] = 0xC9;                             /* dec ecx */
  p[i++] = 0x75; p[i++] = (uint8_t)(-9);                    /* jnz L */
  p[i++] = 0xC3;                                            /* ret */
  return i;
}
/* f(x) = x * m + c: imul eax, edi, m; add eax, c; ret */
static size_t emit_affine(uint8_t *p, int32_t m, int32_t c) {
  size_t i = 0;
  p[i++] = 0x69; p[i++] = 0xC7; memcpy(p + i, &m, 4); i += 4;
  p[i++] = 0x05; memcpy(p + i, &c, 4); i += 4;
  p[i++] = 0xC3;
  return i;
}

static long run_all(uint8_t *code, int nfn, int x) {
  long s = 0;
  for (int f = 0; f < nfn; f++) s = s * 31 + ((fn_t)(code + 64 * f))(x);
  return s;
}

/* RWX memory: write, run, overwrite in place, run again; several rounds. */
static void rwx(void) {
  uint8_t *code = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  for (int round = 0; round < 6; round++) {
    for (int f = 0; f < 8; f++) {
      if ((f + round) % 2) emit_loop(code + 64 * f, 10 + f + round, (int8_t)(f - round));
      else emit_affine(code + 64 * f, f + 2 * round, 1000 * round - f);
    }
    long a = run_all(code, 8, 3), b = run_all(code, 8, 3);
    /* Patch one byte of an immediate in function 0 only, then run it again. */
    code[2] ^= 1;
    long c = ((fn_t)code)(5);
    printf("rwx round %d: %ld %ld %ld\n", round, a, b, c);
  }
  munmap(code, 4096);
}

/* W^X: RW while writing, RX while running (mprotect in between, no munmap). */
static void wx(void) {
  uint8_t *code = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  for (int round = 0; round < 5; round++) {
    mprotect(code, 8192, PROT_READ | PROT_WRITE);
    for (int f = 0; f < 8; f++) emit_affine(code + 64 * f, 3 * f + round, round - f);
    emit_loop(code + 4096, 7 + round, (int8_t)round);
    mprotect(code, 8192, PROT_READ | PROT_EXEC);
    printf("wx round %d: %ld %d\n", round, run_all(code, 8, 11), ((fn_t)(code + 4096))(2));
  }
  munmap(code, 8192);
}

__attribute__((noinline)) int patched(int x) { return x + 0x11223344; }
static fn_t volatile patched_ptr = patched;

/* Patch an immediate inside a function of the program's own text that already ran. */
static void own_text(void) {
  uint8_t *p = (uint8_t *)patched;
  int at = -1;
  for (int i = 0; i < 32; i++)
    if (p[i] == 0x44 && p[i + 1] == 0x33 && p[i + 2] == 0x22 && p[i + 3] == 0x11) { at = i; break; }
  if (at < 0) { puts("immediate not found"); return; }
  long page = sysconf(_SC_PAGESIZE);
  uint8_t *pg = (uint8_t *)((uintptr_t)p & ~(uintptr_t)(page - 1));
  printf("own text before: %#x\n", patched_ptr(1));
  if (mprotect(pg, 2 * page, PROT_READ | PROT_WRITE | PROT_EXEC)) { puts("mprotect failed"); return; }
  for (int v = 1; v <= 3; v++) {
    int32_t imm = 0x1000 * v;
    memcpy(p + at, &imm, 4);
    printf("own text patched %d: %#x\n", v, patched_ptr(1));
  }
  mprotect(pg, 2 * page, PROT_READ | PROT_EXEC);
  printf("own text after: %#x\n", patched_ptr(1));
}

int main(void) {
  rwx();
  wx();
  own_text();
  return 0;
}
"#;

fn stats_number(lines: &[String], key: &str) -> u64 {
    lines
        .iter()
        .find_map(|l| l.split(key).nth(1))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key:?} in {lines:?}"))
}

#[test]
fn code_rewritten_in_place_by_a_tiny_jit_is_retranslated_before_it_runs() {
    let bin = compile("jit", "c", JIT_PROGRAM, &[]);
    let lines = same_as_native(&[bin.to_str().unwrap()], &[("OXGRIND_ENGINE_STATS", "1")]);
    // The RWX rounds can only be right if failed entry checks sent blocks back to the
    // translator (W^X rounds and the text patch go through mprotect instead).
    assert!(
        stats_number(&lines, "stale blocks retranslated: ") >= 10,
        "{lines:?}"
    );
    assert!(stats_number(&lines, "checked blocks: ") > 0, "{lines:?}");
}

#[test]
fn node_runs_its_jit_under_the_engine_as_natively() {
    if Command::new("node").arg("--version").output().is_err() {
        eprintln!("node not installed: skipped");
        return;
    }
    same_as_native(
        &[
            "node",
            "-e",
            "let s = 0; for (let i = 0; i < 3e6; i++) s += i % 7; console.log(s, [3, 1, 2].sort().join())",
        ],
        &[],
    );
}

/// Fault handlers that read and change `uc_mcontext`: each faulting instruction has a
/// label, the handler checks that RIP is exactly there (after the `int3`), that registers
/// and `si_addr` are the guest's, then skips the instruction by its known length.
const UCONTEXT_PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

extern char load_insn[], riprel_insn[], ud2_insn[], int3_after[], div_insn[];
static char guard[8192] __attribute__((aligned(4096)));

/* Each faulting instruction has a global label and a known length, so the handler can
   check the pc it is shown and skip the instruction by advancing RIP. */
__attribute__((noinline, noclone)) long do_load(long *p) {
  long v;
  __asm__ volatile(".globl load_insn\nload_insn: movl (%%rdi), %%eax" : "=a"(v) : "D"(p), "c"(0x1234L) : "memory");
  return v;
}
__attribute__((noinline, noclone)) long do_riprel(void) {
  long v;
  __asm__ volatile(".globl riprel_insn\nriprel_insn: movl guard(%%rip), %%eax" : "=a"(v) : "c"(0x5678L) : "memory");
  return v;
}
__attribute__((noinline, noclone)) void do_ud2(void) { __asm__ volatile(".globl ud2_insn\nud2_insn: ud2"); }
__attribute__((noinline, noclone)) void do_int3(void) { __asm__ volatile("int3\n.globl int3_after\nint3_after:"); }
__attribute__((noinline, noclone)) long do_div(long x) {
  long v;
  __asm__ volatile("xor %%edx, %%edx\n.globl div_insn\ndiv_insn: divl %%ecx" : "=a"(v) : "a"(x), "c"(0L) : "rdx");
  return v;
}

static void on_sig(int sig, siginfo_t *si, void *ucv) {
  ucontext_t *uc = ucv;
  greg_t *g = uc->uc_mcontext.gregs;
  uintptr_t rip = (uintptr_t)g[REG_RIP], addr = (uintptr_t)si->si_addr;
  if (sig == SIGSEGV && rip == (uintptr_t)load_insn) {
    printf("SIGSEGV at load_insn: si_addr=%#lx rcx=%#llx\n", (unsigned long)addr, (long long)g[REG_RCX]);
    g[REG_RIP] += 2; g[REG_RAX] = 42;
  } else if (sig == SIGSEGV && rip == (uintptr_t)riprel_insn) {
    printf("SIGSEGV at riprel_insn: si_addr-guard=%ld rcx=%#llx\n", (long)(addr - (uintptr_t)guard), (long long)g[REG_RCX]);
    g[REG_RIP] += 6; g[REG_RAX] = 43;
  } else if (sig == SIGILL && rip == (uintptr_t)ud2_insn) {
    printf("SIGILL at ud2_insn: si_addr is the insn: %d\n", addr == rip);
    g[REG_RIP] += 2;
  } else if (sig == SIGTRAP && rip == (uintptr_t)int3_after) {
    printf("SIGTRAP after int3\n");
  } else if (sig == SIGFPE && rip == (uintptr_t)div_insn) {
    printf("SIGFPE at div_insn: si_addr is the insn: %d\n", addr == rip);
    g[REG_RIP] += 2; g[REG_RAX] = 7;
  } else {
    printf("signal %d at an unexpected pc\n", sig);
    fflush(stdout);
    _exit(3);
  }
}

int main(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sig;
  sa.sa_flags = SA_SIGINFO;
  int sigs[] = {SIGSEGV, SIGILL, SIGTRAP, SIGFPE};
  for (int i = 0; i < 4; i++) sigaction(sigs[i], &sa, NULL);
  mprotect(guard, 4096, PROT_NONE);
  long total = 0;
  for (int round = 0; round < 3; round++) {
    long a = do_load((long *)0x1000), b = do_riprel();
    do_ud2();
    do_int3();
    long c = do_div(100);
    printf("round %d: %ld %ld %ld\n", round, a, b, c);
    total += a + b + c;
  }
  printf("total %ld\n", total);
  return 0;
}
"#;

#[test]
fn fault_handlers_see_guest_rip_and_registers_and_can_skip_the_faulting_instruction() {
    let bin = compile("uctx", "c", UCONTEXT_PROGRAM, &[]);
    same_as_native(&[bin.to_str().unwrap()], &[]);
}

#[test]
fn fault_in_a_far_rip_relative_rewrite_shows_the_guest_value_of_the_borrowed_register() {
    let bin = compile("uctx_far", "c", UCONTEXT_PROGRAM, &[]);
    // `movl guard(%rip), %eax` is rewritten through rcx (which holds 0x5678) when the code
    // cache is far; the handler prints rcx.
    same_as_native(&[bin.to_str().unwrap()], &[("OXGRIND_ENGINE_FAR", "1")]);
}

#[test]
fn java_with_hotspot_jit_runs_under_the_engine_as_natively() {
    // HotSpot generates code into RWX memory, patches it in place (call sites, entry
    // barriers) and sets EFLAGS.AC while probing the CPU at start-up.
    if Command::new("javac").arg("-version").output().is_err() {
        eprintln!("javac not installed: skipped");
        return;
    }
    let dir = work_dir().join("java");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("Hot.java"), JAVA_PROGRAM).unwrap();
    let out = Command::new("javac")
        .arg("-d")
        .arg(&dir)
        .arg(dir.join("Hot.java"))
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run javac");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    same_as_native(&["java", "-cp", dir.to_str().unwrap(), "Hot"], &[]);
}

const JAVA_PROGRAM: &str = r#"import java.util.*;
public class Hot {
  static long f(long x) { return x * 31 + (x >>> 3); }
  public static void main(String[] a) {
    long s = 0;
    for (int i = 0; i < 5_000_000; i++) s += f(i) % 1000;
    HashMap<Integer, Integer> m = new HashMap<>();
    for (int i = 0; i < 200000; i++) m.merge(i % 1000, i, Integer::sum);
    List<String> l = new ArrayList<>();
    for (int i = 0; i < 20000; i++) l.add(Integer.toHexString(i * 7919));
    Collections.sort(l);
    System.out.println(s + " " + m.get(7) + " " + l.get(123));
  }
}
"#;

/// `%gs` belongs to the engine (it addresses the thread's context), so the guest's own gs
/// base is emulated: `arch_prctl(ARCH_SET_GS/ARCH_GET_GS)`, `gs:` memory operands (plain,
/// indexed, read-modify-write, locked), `rdgsbase`/`wrgsbase`, inheritance by threads.
const GS_PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <unistd.h>

static long area[64];

static void *thread(void *arg) {
  long v;
  __asm__ volatile("mov %%gs:8, %0" : "=r"(v));
  return (void *)v;
}

int main(void) {
  for (int i = 0; i < 64; i++) area[i] = i * 3;
  long r = syscall(SYS_arch_prctl, ARCH_SET_GS, area);
  unsigned long got = 0;
  syscall(SYS_arch_prctl, ARCH_GET_GS, &got);
  printf("set=%ld get==area: %d\n", r, got == (unsigned long)area);
  long v, idx = 5, off = 8;
  __asm__ volatile("mov %%gs:8, %0" : "=r"(v));
  printf("gs:8 = %ld\n", v);
  __asm__ volatile("mov %%gs:(,%1,8), %0" : "=r"(v) : "r"(idx));
  printf("gs:(,5,8) = %ld\n", v);
  __asm__ volatile("movq $77, %%gs:16" ::: "memory");
  __asm__ volatile("addq $1, %%gs:8(%0,%1,8)" ::"r"(off), "r"(2L) : "memory", "cc");
  __asm__ volatile("lock xaddq %0, %%gs:(%1)" : "+r"(v) : "r"(24L) : "memory");
  printf("area[2]=%ld area[4]=%ld area[3]=%ld old=%ld\n", area[2], area[4], area[3], v);
  pthread_t t; void *tv;
  pthread_create(&t, NULL, thread, NULL);
  pthread_join(t, &tv);
  printf("thread sees gs:8 = %ld\n", (long)tv);
  int fsgs = (getauxval(AT_HWCAP2) & 2) != 0;
  unsigned long b = (unsigned long)area;
  if (fsgs) {
    __asm__ volatile("rdgsbase %0" : "=r"(b));
    __asm__ volatile("wrgsbase %0" ::"r"(area + 1));
    __asm__ volatile("mov %%gs:0, %0" : "=r"(v));
  } else {
    v = 3;
  }
  printf("rdgsbase==area: %d, after wrgsbase gs:0 = %ld\n", b == (unsigned long)area, v);
  return 0;
}
"#;

#[test]
fn guest_gs_base_and_gs_operands_behave_as_native() {
    let bin = compile("gs", "c", GS_PROGRAM, &["-pthread"]);
    same_as_native(&[bin.to_str().unwrap()], &[]);
}

#[test]
fn guest_gs_operands_work_with_a_far_code_cache() {
    let bin = compile("gs_far", "c", GS_PROGRAM, &["-pthread"]);
    same_as_native(&[bin.to_str().unwrap()], &[("OXGRIND_ENGINE_FAR", "1")]);
}

const PROFILER_PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <ucontext.h>

/* A sampling profiler in miniature: SIGPROF records the interrupted RIP while a loop
   written in assembly runs; every sample must lie inside that loop's code. */
extern char region_begin[], region_end[];
static volatile int phase;
static uintptr_t samples[4096];
static volatile int nsamples;

static void on_prof(int sig, siginfo_t *si, void *ucv) {
  ucontext_t *uc = ucv;
  if (phase == 1 && nsamples < 4096) samples[nsamples++] = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
}

__attribute__((noinline, noclone)) long spin(long n) {
  long acc = 0;
  __asm__ volatile(
      ".globl region_begin\nregion_begin:\n"
      "movl $1, phase(%%rip)\n"
      "1: add $3, %0\n"
      "xor $5, %0\n"
      "dec %1\n"
      "jnz 1b\n"
      "movl $2, phase(%%rip)\n"
      ".globl region_end\nregion_end:\n"
      : "+r"(acc), "+r"(n) : : "memory", "cc");
  return acc;
}

int main(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_prof;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(SIGPROF, &sa, NULL);
  struct itimerval it = {{0, 2000}, {0, 2000}};
  setitimer(ITIMER_PROF, &it, NULL);
  long r = 0;
  for (int i = 0; i < 20 && nsamples < 20; i++) r += spin(20000000);
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_PROF, &off, NULL);
  int outside = 0;
  for (int i = 0; i < nsamples; i++)
    if (samples[i] < (uintptr_t)region_begin || samples[i] >= (uintptr_t)region_end) outside++;
  printf("samples>=5: %d outside: %d r!=0: %d\n", nsamples >= 5, outside, r != 0);
  return 0;
}
"#;

#[test]
fn sampling_profiler_signals_show_guest_pcs_inside_the_running_loop() {
    // Asynchronous SIGPROF ticks land between guest instructions or on linked exits of the
    // loop's translation; both must read as guest pcs of the loop.
    let bin = compile("prof", "c", PROFILER_PROGRAM, &[]);
    same_as_native(&[bin.to_str().unwrap()], &[]);
}

#[test]
fn signals_arriving_during_translation_keep_their_siginfo() {
    // A 50 µs timer while 1500 functions run for the first time: many ticks arrive while
    // the thread is translating, are deferred and re-raised; the handler checks si_code.
    let n = 1500;
    let mut src = String::from(
        r#"#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
static volatile long ticks, bad;
static void on_alarm(int sig, siginfo_t *si, void *uc) { ticks++; if (si->si_code != SI_KERNEL || si->si_signo != SIGALRM) bad++; }
"#,
    );
    for i in 0..n {
        src.push_str(&format!(
            "long f{i}(long x) {{ return x * {} + (x >> {}) - {i}; }}\n",
            i + 3,
            i % 7 + 1
        ));
    }
    src.push_str("typedef long (*fn)(long);\nstatic fn table[] = {");
    src.push_str(
        &(0..n)
            .map(|i| format!("f{i}"))
            .collect::<Vec<_>>()
            .join(","),
    );
    src.push_str(&format!(
        r#"}};
int main(void) {{
  struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_sigaction = on_alarm; sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(SIGALRM, &sa, NULL);
  struct itimerval it = {{{{0, 50}}, {{0, 50}}}};
  setitimer(ITIMER_REAL, &it, NULL);
  long s = 0;
  for (int r = 0; r < 3; r++) for (int i = 0; i < {n}; i++) s += table[i](i + r);
  while (ticks < 20) s += table[ticks % {n}](s);
  struct itimerval off = {{{{0, 0}}, {{0, 0}}}};
  setitimer(ITIMER_REAL, &off, NULL);
  printf("s!=0: %d ticks>=20: %d bad: %ld\n", s != 0, ticks >= 20, bad);
  return 0;
}}
"#
    ));
    // -O0: 1500 functions compile in about a second.
    let bin = compile("siginfo", "c", &src, &["-O0"]);
    same_as_native(&[bin.to_str().unwrap()], &[]);
}

#[test]
fn bad_pointers_to_emulated_system_calls_give_efault_as_natively() {
    // rt_sigaction, arch_prctl(ARCH_GET_GS) and clone3 read or write guest memory inside
    // the engine; a bad pointer must be the program's EFAULT, not an engine crash.
    let bin = compile(
        "badptr",
        "c",
        r#"#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <asm/prctl.h>
int main(void) {
  long r1 = syscall(SYS_rt_sigaction, SIGUSR1, (void *)16, NULL, 8);
  int e1 = errno;
  long r2 = syscall(SYS_rt_sigaction, SIGUSR1, NULL, (void *)"read-only string", 8);
  int e2 = errno;
  long r3 = syscall(SYS_arch_prctl, ARCH_GET_GS, (void *)8);
  int e3 = errno;
  long r4 = syscall(SYS_clone3, (void *)24, 88);
  int e4 = errno;
  printf("%ld %d / %ld %d / %ld %d / %ld %d\n", r1, e1, r2, e2, r3, e3, r4, e4);
  return 0;
}
"#,
        &[],
    );
    same_as_native(&[bin.to_str().unwrap()], &[]);
}

#[test]
fn jumping_to_non_executable_data_faults_as_natively_and_runs_once_made_executable() {
    let bin = compile(
        "nx",
        "c",
        r#"#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

static sigjmp_buf env;
static uint8_t *code;
static void on_segv(int sig, siginfo_t *si, void *ucv) {
  ucontext_t *uc = ucv;
  printf("SIGSEGV: rip==code %d si_addr==code %d code=%d\n", (uint8_t *)uc->uc_mcontext.gregs[REG_RIP] == code,
         (uint8_t *)si->si_addr == code, si->si_code);
  siglongjmp(env, 1);
}

int main(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, NULL);
  code = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  static const uint8_t ret42[] = {0xB8, 42, 0, 0, 0, 0xC3}; /* mov eax, 42; ret */
  memcpy(code, ret42, sizeof ret42);
  for (int i = 0; i < 2; i++) {
    if (sigsetjmp(env, 1) == 0) printf("ran data: %d\n", ((int (*)(void))code)());
  }
  mprotect(code, 4096, PROT_READ | PROT_EXEC);
  printf("after mprotect: %d\n", ((int (*)(void))code)());
  return 0;
}
"#,
        &[],
    );
    same_as_native(&[bin.to_str().unwrap()], &[]);
}

/// Every instruction probed (a counter, a pc call and an access call each, all memory
/// tallied): the clean calls must leave no trace on the program, with threads running in
/// parallel and timer signals arriving while probes run.
#[test]
fn programs_probed_at_every_instruction_behave_as_native() {
    let everything = [("OXGRIND_ENGINE_PROBE", "0:7fffffffffff:0:7fffffffffff")];
    // Filtered access probes only, with nothing marked: the inline checks alone.
    let inline_only = [
        ("OXGRIND_ENGINE_PROBE", "0:7fffffffffff:0:0"),
        ("OXGRIND_ENGINE_PROBE_FILTER", "2"),
    ];
    let bin = compile("cprog_probed", "c", C_PROGRAM, &[]);
    same_as_native(&[bin.to_str().unwrap(), "x"], &inline_only);
    let bin = compile(
        "threads_timer_probed",
        "c",
        r#"
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
static volatile long ticks;
static void on_alarm(int sig) { ticks++; }
static void *worker(void *arg) {
  long id = (long)arg, sum = 0;
  for (int i = 0; i < 200; i++) {
    char *p = malloc(64 + i % 100);
    memset(p, (int)id, 64);
    for (int j = 0; j < 64; j++) sum += p[j];
    free(p);
  }
  return (void *)sum;
}
int main(void) {
  struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_handler = on_alarm; sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, NULL);
  struct itimerval it = {{0, 2000}, {0, 2000}};
  setitimer(ITIMER_REAL, &it, NULL);
  pthread_t t[4];
  for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, (void *)i);
  long total = 0;
  for (int i = 0; i < 4; i++) { void *r; pthread_join(t[i], &r); total += (long)r; }
  while (ticks < 3) getppid();
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  printf("total=%ld\n", total);
  return 0;
}
"#,
        &["-pthread"],
    );
    same_as_native(&[bin.to_str().unwrap()], &everything);
    same_as_native(&[bin.to_str().unwrap()], &inline_only);
    same_as_native(
        &[
            "/usr/bin/python3",
            "-c",
            "import json; print(len(json.dumps(list(range(5000)))))",
        ],
        &inline_only,
    );
}

/// A sampling profiler inside the program (SIGPROF, reading the interrupted pc from the
/// ucontext) must only ever see the program's own code: a signal that arrives in engine
/// code (an exit stub, the indirect-branch lookup) is held back to the next guest
/// instruction. Call-heavy code spends much of its time in the lookup, where about four
/// samples in ten used to show code-cache addresses.
#[test]
fn profiling_signals_show_only_guest_pcs() {
    let bin = compile(
        "sampler",
        "c",
        r#"
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <ucontext.h>
static volatile unsigned long pcs[4096];
static volatile int n;
static void on_prof(int sig, siginfo_t *si, void *ctx) {
  ucontext_t *uc = ctx;
  if (n < 4096) pcs[n++] = uc->uc_mcontext.gregs[REG_RIP];
}
__attribute__((noinline)) static long fib(long k) { return k < 2 ? k : fib(k - 1) + fib(k - 2); }
/* Whether pc lies in a file-backed executable mapping (the code cache is anonymous). */
static int in_file_text(unsigned long pc) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512];
  int ok = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi; char perms[8]; char path[256] = "";
    if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %255s", &lo, &hi, perms, path) >= 3 &&
        pc >= lo && pc < hi && perms[2] == 'x' && (path[0] == '/' || !strcmp(path, "[vdso]")))
      ok = 1;
  }
  fclose(f);
  return ok;
}
int main(void) {
  struct sigaction sa; memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_prof; sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(SIGPROF, &sa, NULL);
  struct itimerval it = {{0, 1000}, {0, 1000}};
  setitimer(ITIMER_PROF, &it, NULL);
  long r = 0;
  while (n < 200) r += fib(20);
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_PROF, &off, NULL);
  int bad = 0;
  for (int i = 0; i < n; i++) bad += !in_file_text(pcs[i]);
  printf("bad=%d enough=%d\n", bad, n >= 200);
  return r == 0;
}
"#,
        &[],
    );
    same_as_native(&[bin.to_str().unwrap()], &[]);
}
