//! A ptrace single-stepper that runs a program through the interpreter (shared by
//! `examples/trace.rs` and `tests/differential.rs`).
//!
//! It emulates the rest of Memcheck crudely: memory is defined unless made undefined;
//! `malloc` and `realloc` results (the part beyond the old size) become undefined, the stack
//! below `rsp` becomes undefined whenever `rsp` moves down (except what `push`/`call` write),
//! and the buffers of common system calls become defined; glibc's allocator is not reported
//! (it runs uninstrumented inside oxgrind's hooks, and Valgrind replaces it). No
//! addressability, no redirected string functions (so glibc's vector code runs, as it will
//! under the engine), main thread only. Slow: ptrace costs microseconds per instruction.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic};
use oxgrind_vbits::{Check, Guest, Interpreter, Segment, ShadowMemory, ShadowRegisters};

// ---------- the tracee ----------

struct XstateLayout {
    avx: usize,
    opmask: usize,
    zmm_hi256: usize,
    hi16_zmm: usize,
}

fn xstate_layout() -> XstateLayout {
    // SAFETY: cpuid is available on every x86-64 CPU.
    let off = |i: u32| core::arch::x86_64::__cpuid_count(0xd, i).ebx as usize;
    XstateLayout {
        avx: off(2),
        opmask: off(5),
        zmm_hi256: off(6),
        hi16_zmm: off(7),
    }
}

struct Tracee {
    pid: libc::pid_t,
    regs: libc::user_regs_struct,
    xstate: Vec<u8>,
    layout: XstateLayout,
}

impl Tracee {
    fn fetch(&mut self) -> bool {
        // SAFETY: plain ptrace requests on our stopped child with buffers of the right size.
        unsafe {
            if libc::ptrace(libc::PTRACE_GETREGS, self.pid, 0, &mut self.regs as *mut _) != 0 {
                return false;
            }
            let mut iov = libc::iovec {
                iov_base: self.xstate.as_mut_ptr().cast(),
                iov_len: self.xstate.len(),
            };
            libc::ptrace(
                libc::PTRACE_GETREGSET,
                self.pid,
                0x202usize, /* NT_X86_XSTATE */
                &mut iov as *mut _,
            );
        }
        true
    }

    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        let local = libc::iovec {
            iov_base: out.as_mut_ptr().cast(),
            iov_len: out.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut _,
            iov_len: out.len(),
        };
        // SAFETY: process_vm_readv writes at most out.len() bytes into out.
        let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        n == out.len() as isize
    }

    fn bytes(&self, at: usize, n: usize) -> &[u8] {
        self.xstate.get(at..at + n).unwrap_or(&[0; 32][..n.min(32)])
    }
}

impl Guest for Tracee {
    fn gpr(&self, i: usize) -> u64 {
        let r = &self.regs;
        [
            r.rax, r.rcx, r.rdx, r.rbx, r.rsp, r.rbp, r.rsi, r.rdi, r.r8, r.r9, r.r10, r.r11,
            r.r12, r.r13, r.r14, r.r15,
        ][i & 15]
    }
    fn rflags(&self) -> u64 {
        self.regs.eflags
    }
    fn vector(&self, i: usize) -> [u8; 64] {
        let mut v = [0u8; 64];
        if i < 16 {
            v[..16].copy_from_slice(self.bytes(160 + 16 * i, 16));
            v[16..32].copy_from_slice(self.bytes(self.layout.avx + 16 * i, 16));
            v[32..].copy_from_slice(self.bytes(self.layout.zmm_hi256 + 32 * i, 32));
        } else {
            let base = self.layout.hi16_zmm + 64 * (i - 16);
            v[..32].copy_from_slice(self.bytes(base, 32));
            v[32..].copy_from_slice(self.bytes(base + 32, 32));
        }
        v
    }
    fn opmask(&self, i: usize) -> u64 {
        u64::from_le_bytes(
            self.bytes(self.layout.opmask + 8 * (i & 7), 8)
                .try_into()
                .unwrap_or([0; 8]),
        )
    }
    fn segment_base(&self, s: Segment) -> u64 {
        match s {
            Segment::Fs => self.regs.fs_base,
            Segment::Gs => self.regs.gs_base,
        }
    }
    fn read_memory(&self, addr: u64, out: &mut [u8]) -> bool {
        self.read(addr, out)
    }
}

// ---------- shadow memory: pages, defined unless written ----------

#[derive(Default)]
struct Pages(HashMap<u64, Box<[u8; 4096]>>);

impl Pages {
    fn fill(&mut self, addr: u64, len: u64, v: u8) {
        let mut a = addr;
        let end = addr.wrapping_add(len);
        while a < end {
            let page = a & !4095;
            let n = (end - a).min(page + 4096 - a) as usize;
            if v == 0 && !self.0.contains_key(&page) {
                a += n as u64;
                continue;
            }
            let p = self.0.entry(page).or_insert_with(|| Box::new([0; 4096]));
            let off = (a - page) as usize;
            p[off..off + n].fill(v);
            a += n as u64;
        }
    }
}

impl ShadowMemory for Pages {
    fn load(&mut self, addr: u64, out: &mut [u8]) {
        for (i, b) in out.iter_mut().enumerate() {
            let a = addr.wrapping_add(i as u64);
            *b = self
                .0
                .get(&(a & !4095))
                .map(|p| p[(a & 4095) as usize])
                .unwrap_or(0);
        }
    }
    fn store(&mut self, addr: u64, shadow: &[u8]) {
        for (i, b) in shadow.iter().enumerate() {
            let a = addr.wrapping_add(i as u64);
            if *b == 0 && !self.0.contains_key(&(a & !4095)) {
                continue;
            }
            let p = self
                .0
                .entry(a & !4095)
                .or_insert_with(|| Box::new([0; 4096]));
            p[(a & 4095) as usize] = *b;
        }
    }
}

// ---------- symbols ----------

struct Module {
    start: u64,
    end: u64,
    bias: u64,
    name: String,
    symbols: BTreeMap<u64, String>,
    by_name: HashMap<String, u64>,
}

fn elf_symbols(data: &[u8]) -> (u64, BTreeMap<u64, String>, HashMap<String, u64>) {
    let mut out = BTreeMap::new();
    let mut by_name = HashMap::new();
    let u16_at = |o: usize| {
        data.get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
            .unwrap_or(0)
    };
    let u32_at = |o: usize| {
        data.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .unwrap_or(0)
    };
    let u64_at = |o: usize| {
        data.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .unwrap_or(0)
    };
    if data.len() < 64 || &data[..4] != b"\x7fELF" {
        return (0, out, by_name);
    }
    // Lowest PT_LOAD vaddr.
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    let mut first_vaddr = u64::MAX;
    for i in 0..phnum {
        let h = phoff + i * phentsize;
        if u32_at(h) == 1 {
            first_vaddr = first_vaddr.min(u64_at(h + 16) & !4095);
        }
    }
    let (shoff, shentsize, shnum) = (u64_at(0x28) as usize, u16_at(0x3a), u16_at(0x3c));
    for i in 0..shnum {
        let h = shoff + i * shentsize;
        let ty = u32_at(h + 4);
        if ty != 2 && ty != 11 {
            continue; // SYMTAB, DYNSYM
        }
        let (off, size, link) = (
            u64_at(h + 24) as usize,
            u64_at(h + 32) as usize,
            u32_at(h + 40) as usize,
        );
        let strh = shoff + link * shentsize;
        let stroff = u64_at(strh + 24) as usize;
        for k in 0..size / 24 {
            let s = off + k * 24;
            let (name, info, value) = (
                u32_at(s) as usize,
                data.get(s + 4).copied().unwrap_or(0),
                u64_at(s + 8),
            );
            if info & 0xf != 2 || value == 0 {
                continue; // functions only
            }
            let start = stroff + name;
            let end = data[start.min(data.len())..]
                .iter()
                .position(|b| *b == 0)
                .map(|p| start + p)
                .unwrap_or(start);
            if let Ok(n) = std::str::from_utf8(&data[start.min(data.len())..end]) {
                out.entry(value).or_insert_with(|| n.to_string());
                by_name.entry(n.to_string()).or_insert(value);
            }
        }
    }
    (
        if first_vaddr == u64::MAX {
            0
        } else {
            first_vaddr
        },
        out,
        by_name,
    )
}

fn load_modules(pid: libc::pid_t) -> Vec<Module> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut by_name: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || !f[5].starts_with('/') {
            continue;
        }
        let (range, offset) = (f[0], u64::from_str_radix(f[2], 16).unwrap_or(1));
        let mut it = range.split('-');
        let start = u64::from_str_radix(it.next().unwrap_or("0"), 16).unwrap_or(0);
        let end = u64::from_str_radix(it.next().unwrap_or("0"), 16).unwrap_or(0);
        let e = by_name
            .entry(f[5].to_string())
            .or_insert((u64::MAX, 0, u64::MAX));
        e.0 = e.0.min(start);
        e.1 = e.1.max(end);
        if offset == 0 {
            e.2 = e.2.min(start);
        }
    }
    by_name
        .into_iter()
        .map(|(name, (start, end, base))| {
            let data = std::fs::read(&name).unwrap_or_default();
            let (first_vaddr, symbols, by_name) = elf_symbols(&data);
            let base = if base == u64::MAX { start } else { base };
            Module {
                start,
                end,
                bias: base.wrapping_sub(first_vaddr),
                name,
                symbols,
                by_name,
            }
        })
        .collect()
}

fn describe(modules: &[Module], pc: u64) -> String {
    for m in modules {
        if pc >= m.start && pc < m.end {
            let rel = pc.wrapping_sub(m.bias);
            let short = m.name.rsplit('/').next().unwrap_or(&m.name);
            if let Some((start, name)) = m.symbols.range(..=rel).next_back() {
                return format!("{name}+{:#x} ({short})", rel - start);
            }
            return format!("{short}+{rel:#x}");
        }
    }
    format!("{pc:#x}")
}

fn symbol_address(modules: &[Module], module_suffix: &str, symbol: &str) -> Option<u64> {
    let m = modules.iter().find(|m| m.name.ends_with(module_suffix))?;
    Some(m.bias.wrapping_add(*m.by_name.get(symbol)?))
}

// ---------- system calls whose output buffers become defined ----------

fn syscall_outputs(nr: u64, a: [u64; 6], ret: u64) -> Vec<(u64, u64)> {
    let r = ret as i64;
    if r < 0 {
        return Vec::new();
    }
    let ret_len = |buf: u64| vec![(buf, ret)];
    match nr {
        0 | 17 | 45 | 217 | 318 => ret_len(if nr == 318 { a[0] } else { a[1] }), // read pread64 recvfrom getdents64 getrandom
        89 => ret_len(a[1]),                                                     // readlink
        267 => ret_len(a[2]),                                                    // readlinkat
        79 => ret_len(a[0]),                                                     // getcwd
        4..=6 => vec![(a[1], 144)],                                              // stat fstat lstat
        262 => vec![(a[2], 144)],                                                // newfstatat
        332 => vec![(a[4], 256)],                                                // statx
        63 => vec![(a[0], 390)],                                                 // uname
        228 | 96 => vec![(if nr == 228 { a[1] } else { a[0] }, 16)], // clock_gettime gettimeofday
        99 => vec![(a[0], 112)],                                     // sysinfo
        13 => vec![(a[2], 32)],                                      // rt_sigaction oldact
        14 => vec![(a[2], 8)],                                       // rt_sigprocmask oldset
        302 => vec![(a[3], 16)],                                     // prlimit64
        97 => vec![(a[1], 16)],                                      // getrlimit
        16 => match a[1] {
            0x5401 => vec![(a[2], 60)], // TCGETS
            0x5413 => vec![(a[2], 8)],  // TIOCGWINSZ
            _ => Vec::new(),
        },
        7 => vec![(a[0], a[1] * 8)],        // poll
        22 | 293 => vec![(a[0], 8)],        // pipe pipe2
        61 => vec![(a[1], 4), (a[3], 144)], // wait4
        9 => vec![(ret, a[1])],             // mmap: fresh mappings are defined
        _ => Vec::new(),
    }
}

// ---------- main loop ----------

struct Pending {
    ret: u64,
    rsp: u64,
    size: u64,
    old: Option<(u64, u64)>, // realloc: old pointer and its size
}

/// One reporting site: the check, how often it failed, and where (`function+offset (module)`).
pub struct Report {
    pub pc: u64,
    pub check: Check,
    pub count: u64,
    pub place: String,
}

pub struct Trace {
    pub steps: u64,
    pub reports: Vec<Report>,
}

/// Runs `argv` to completion under the tracer; its stdout goes to /dev/null if `quiet`.
pub fn trace(argv: &[String], quiet: bool) -> Trace {
    let args: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_str()).unwrap())
        .collect();
    // SAFETY: fork; the child only calls async-signal-safe functions before exec.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        // SAFETY: TRACEME then exec in the child.
        unsafe {
            if quiet {
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
                libc::dup2(null, 1);
            }
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) != 0 {
                libc::_exit(126);
            }
            libc::execvp(argv[0], argv.as_ptr());
            libc::_exit(127);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if !libc::WIFSTOPPED(status) {
        // ptrace refused (a restricted container) or exec failed: nothing traced.
        return Trace {
            steps: 0,
            reports: Vec::new(),
        };
    }
    let mut t = Tracee {
        pid,
        regs: unsafe { std::mem::zeroed() },
        xstate: vec![0; 16384],
        layout: xstate_layout(),
    };
    let mut interp = Interpreter::new();
    let mut shadow_regs = ShadowRegisters::default();
    let mut mem = Pages::default();
    let mut modules: Vec<Module> = Vec::new();
    let (mut malloc, mut calloc, mut realloc, mut free) = (None, None, None, None);
    let mut sizes: HashMap<u64, u64> = HashMap::new();
    let mut pending: Vec<Pending> = Vec::new();
    let mut reports: BTreeMap<u64, (Check, u64, String)> = BTreeMap::new();
    let mut steps = 0u64;
    let mut signal = 0;
    if !t.fetch() {
        return Trace {
            steps: 0,
            reports: Vec::new(),
        };
    }
    loop {
        // `t` holds the state before this instruction (fetched after the previous step).
        let (rip, rsp) = (t.regs.rip, t.regs.rsp);
        if malloc.is_none() && steps.is_multiple_of(4096) {
            modules = load_modules(pid);
            malloc = symbol_address(&modules, "libc.so.6", "malloc");
            calloc = symbol_address(&modules, "libc.so.6", "calloc");
            realloc = symbol_address(&modules, "libc.so.6", "realloc");
            free = symbol_address(&modules, "libc.so.6", "free");
        }
        // glibc's allocator runs uninstrumented inside the runtime's hooks under oxgrind (and
        // is replaced under Valgrind): nothing it does is reported (its tcache double-free
        // check reads the freed block's never-written key field, for one).
        if Some(rip) == free {
            let mut ret = [0u8; 8];
            t.read(rsp, &mut ret);
            pending.push(Pending {
                ret: u64::from_le_bytes(ret),
                rsp,
                size: 0,
                old: Some((0, u64::MAX)),
            });
        }
        // Heap: undefined malloc results.
        if Some(rip) == malloc || Some(rip) == realloc || Some(rip) == calloc {
            let mut ret = [0u8; 8];
            t.read(rsp, &mut ret);
            let (size, old) = if Some(rip) == realloc {
                (
                    t.regs.rsi,
                    Some((t.regs.rdi, *sizes.get(&t.regs.rdi).unwrap_or(&0))),
                )
            } else if Some(rip) == calloc {
                (t.regs.rdi.wrapping_mul(t.regs.rsi), None)
            } else {
                (t.regs.rdi, None)
            };
            let calloc_call = Some(rip) == calloc;
            pending.push(Pending {
                ret: u64::from_le_bytes(ret),
                rsp,
                size: if calloc_call { 0 } else { size },
                old,
            });
            if calloc_call {
                // calloc memory is defined: remember its size only.
                if let Some(p) = pending.last_mut() {
                    p.old = Some((0, u64::MAX));
                    p.size = size;
                }
            }
        }
        if let Some(p) = pending.last() {
            if rip == p.ret && rsp == p.rsp + 8 {
                let p = pending.pop().unwrap();
                let block = t.regs.rax;
                if block != 0 {
                    match p.old {
                        Some((0, u64::MAX)) => {}
                        Some((_, old_size)) if old_size < p.size => {
                            mem.fill(block + old_size, p.size - old_size, 0xff)
                        }
                        Some(_) => {}
                        None => mem.fill(block, p.size, 0xff),
                    }
                    sizes.insert(block, p.size);
                }
            }
        }
        let mut code = [0u8; 16];
        let mut n = 16;
        while n > 0 && !t.read(rip, &mut code[..n]) {
            n -= 1;
        }
        let mut decoder = Decoder::with_ip(64, &code[..n], rip, DecoderOptions::NONE);
        let insn: Instruction = decoder.decode();
        let out = interp.step(&insn, &t, &mut shadow_regs, &mut mem);
        let in_allocator = !pending.is_empty();
        for c in out.checks.iter().filter(|_| !in_allocator) {
            let site = reports.entry(rip).or_insert_with(|| {
                modules = load_modules(pid);
                (c, 0, describe(&modules, rip))
            });
            site.1 += 1;
        }
        let syscall_regs = (
            t.regs.orig_rax,
            t.regs.rax,
            [
                t.regs.rdi, t.regs.rsi, t.regs.rdx, t.regs.r10, t.regs.r8, t.regs.r9,
            ],
        );
        // SAFETY: single-step our stopped child, passing on any signal it received.
        unsafe {
            libc::ptrace(libc::PTRACE_SINGLESTEP, pid, 0, signal);
            libc::waitpid(pid, &mut status, 0);
        }
        steps += 1;
        signal = 0;
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            break;
        }
        if libc::WIFSTOPPED(status) && libc::WSTOPSIG(status) != libc::SIGTRAP {
            signal = libc::WSTOPSIG(status) as usize;
        }
        let before = t.regs;
        if !t.fetch() {
            break;
        }
        // The stack below rsp becomes undefined when rsp moves down, except what push and
        // call wrote.
        let pushes = matches!(
            insn.mnemonic(),
            Mnemonic::Push | Mnemonic::Call | Mnemonic::Pushfq | Mnemonic::Pushf
        );
        if t.regs.rsp < before.rsp && !pushes && before.rsp - t.regs.rsp < (1 << 24) {
            mem.fill(t.regs.rsp, before.rsp - t.regs.rsp, 0xff);
        }
        if insn.mnemonic() == Mnemonic::Syscall {
            let (_, nr, a) = syscall_regs;
            for (buf, len) in syscall_outputs(nr, a, t.regs.rax) {
                if len < (1 << 30) {
                    mem.fill(buf, len, 0);
                }
            }
        }
    }
    Trace {
        steps,
        reports: reports
            .into_iter()
            .map(|(pc, (check, count, place))| Report {
                pc,
                check,
                count,
                place,
            })
            .collect(),
    }
}
