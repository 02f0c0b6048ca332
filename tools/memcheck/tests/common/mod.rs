//! A fake host for Memcheck tests: it stands for the runtime's stacks (raw addresses), the
//! symbolizer (`describe`), the live-block table, the program's memory and its root set,
//! and records what Memcheck writes.
#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use oxgrind_memcheck::Memcheck;
use oxgrind_tool::{
    Addr, Alloc, AllocFn, Frame, Free, Host, LiveBlock, Misuse, MisuseEvent, OptionError,
    RootRange, StackId, Tool,
};

pub const PRELOAD: &str = "/usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so";

#[derive(Default)]
pub struct FakeHost {
    /// The run logs to a file (the banner then shows `Parent PID:`, as the runtime's does).
    pub log_to_file: bool,
    pub stacks: RefCell<Vec<Vec<Addr>>>,
    pub frames: HashMap<Addr, Frame>,
    pub live: RefCell<BTreeMap<Addr, LiveBlock>>,
    pub words: RefCell<BTreeMap<Addr, u64>>,
    pub roots: Vec<RootRange>,
    pub log: RefCell<String>,
    pub files: RefCell<HashMap<String, Vec<u8>>>,
    pub cmd: Vec<String>,
    pub pid: i32,
}

impl Host for FakeHost {
    fn stack(&self, id: StackId) -> Vec<Addr> {
        self.stacks.borrow()[id.0 as usize].clone()
    }
    fn describe(&self, ip: Addr) -> Vec<Frame> {
        self.frames.get(&ip).cloned().into_iter().collect()
    }
    fn elapsed_ms(&self) -> u64 {
        41
    }
    fn pid(&self) -> i32 {
        self.pid
    }
    fn banner(&self, name: &str, copyright: &str) -> String {
        // The runtime's banner, as it writes it when logging to stderr.
        let mut out = String::new();
        let parent = self.log_to_file.then_some(4242);
        oxgrind_formats::memcheck_text::tool_banner(
            &mut out, self.pid, name, copyright, &self.cmd, parent,
        );
        out
    }
    fn command_line(&self) -> &[String] {
        &self.cmd
    }
    fn expand_output_path(&self, template: &str) -> Result<String, OptionError> {
        Ok(template.replace("%p", &self.pid.to_string()))
    }
    fn write_file(&self, path: &str, bytes: &[u8]) -> Result<(), i32> {
        self.files
            .borrow_mut()
            .insert(path.to_string(), bytes.to_vec());
        Ok(())
    }
    fn log(&self, text: &str) {
        self.log.borrow_mut().push_str(text);
    }
    /// The XML stream, kept under the name `<xml>`.
    fn xml(&self, text: &str) {
        self.files
            .borrow_mut()
            .entry("<xml>".to_string())
            .or_default()
            .extend_from_slice(text.as_bytes());
    }
    fn live_blocks(&self) -> Vec<LiveBlock> {
        self.live.borrow().values().copied().collect()
    }
    fn with_roots(&self, f: &mut dyn FnMut(&[RootRange])) {
        f(&self.roots)
    }
    fn read_words(&self, start: Addr, len: u64, f: &mut dyn FnMut(Addr, u64)) {
        for (&a, &v) in self.words.borrow().range(start..start.saturating_add(len)) {
            f(a, v)
        }
    }
}

pub fn frame(ip: Addr, func: &str, line: u32) -> Frame {
    if line == 0 {
        Frame {
            ip,
            function: Some(func.into()),
            object: Some(PRELOAD.into()),
            ..Default::default()
        }
    } else {
        Frame {
            ip,
            function: Some(func.into()),
            object: Some("/src/fmt/mc_errors".into()),
            dir: Some("/src/fmt".into()),
            file: Some("mc_errors.c".into()),
            line,
            ..Default::default()
        }
    }
}

/// Plays the program: each step interns its stack in order, as the runtime would.
pub struct Program<'a> {
    pub host: &'a FakeHost,
    pub tool: &'a Memcheck,
}

pub const MALLOC: Addr = 0x48417B4;
pub const FREE: Addr = 0x484417B;

impl Program<'_> {
    pub fn stack(&self, ips: &[Addr]) -> StackId {
        let mut s = self.host.stacks.borrow_mut();
        s.push(ips.to_vec());
        StackId(s.len() as u32 - 1)
    }
    pub fn malloc(&self, addr: Addr, size: u64, ips: &[Addr]) {
        self.alloc_with(AllocFn::Malloc, addr, size, ips)
    }
    pub fn alloc_with(&self, func: AllocFn, addr: Addr, size: u64, ips: &[Addr]) {
        let stack = self.stack(ips);
        self.host.live.borrow_mut().insert(
            addr,
            LiveBlock {
                addr,
                size,
                func,
                stack,
            },
        );
        let ev = Alloc {
            addr,
            size,
            slop: 0,
            align: 0,
            func,
            stack,
            tid: 1,
        };
        self.tool.on_alloc(self.host, &ev);
    }
    pub fn free(&self, addr: Addr, ips: &[Addr]) {
        self.free_with(AllocFn::Free, addr, ips)
    }
    pub fn free_with(&self, func: AllocFn, addr: Addr, ips: &[Addr]) {
        let stack = self.stack(ips);
        let block = self.host.live.borrow().get(&addr).copied();
        match block {
            Some(b) => {
                let ev = Free {
                    addr,
                    size: b.size,
                    slop: 0,
                    alloc_stack: b.stack,
                    alloc_func: b.func,
                    func,
                    stack,
                    tid: 1,
                    tool_word: 0,
                };
                self.tool.on_free(self.host, &ev);
                self.host.live.borrow_mut().remove(&addr);
            }
            None => self.tool.on_misuse(
                self.host,
                &MisuseEvent {
                    kind: Misuse::InvalidFree {
                        addr,
                        func,
                        size: 0,
                    },
                    stack,
                    tid: 1,
                },
            ),
        }
    }
    pub fn misuse(&self, kind: Misuse, ips: &[Addr]) {
        let stack = self.stack(ips);
        self.tool.on_misuse(
            self.host,
            &MisuseEvent {
                kind,
                stack,
                tid: 1,
            },
        );
    }
    pub fn store(&self, addr: Addr, value: u64) {
        self.host.words.borrow_mut().insert(addr, value);
    }
}
