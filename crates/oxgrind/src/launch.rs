//! Starting the program under a tool.
//!
//! The runtime library goes in through `LD_PRELOAD`, so the program must be something the
//! dynamic loader will preload into: a dynamically linked x86-64 ELF, or a `#!` script whose
//! interpreter is one. We check that here, before `exec`, because afterwards a failure would
//! look like the program's own (a static binary would simply run unmeasured).

use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use oxgrind_options::{self as opts, Action, LogDest};

/// A failure that ends the launcher with a status of its own rather than 1: the program could
/// not be run at all, for which Valgrind and every shell answer 127 (not found) or 126 (found
/// but not executable), so scripts that tell those apart keep working under oxgrind.
#[derive(Debug)]
pub struct CannotRun {
    pub status: u8,
    pub message: String,
}

impl std::fmt::Display for CannotRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CannotRun {}

fn cannot_run(status: u8, message: String) -> anyhow::Error {
    CannotRun { status, message }.into()
}

const RUNTIME_NAME: &str = "liboxgrind_runtime.so";

pub fn main(args: &[String]) -> Result<()> {
    let (given, program) = opts::split_command_line(args);
    // As Valgrind does: options from ~/.valgrindrc, $VALGRIND_OPTS and ./.valgrindrc come
    // first, in that order, then the command line's (so the command line wins).
    let mut options = default_options();
    options.extend(given);
    // Valgrind splits some messages over two lines; ours are always one.
    let parsed =
        match opts::parse(&options).map_err(|e| anyhow!("{}", e.0.trim().replace('\n', ": ")))? {
            Action::Help => {
                print!("{}", help_text());
                let tool = options
                    .iter()
                    .rev()
                    .find_map(|o| o.strip_prefix("--tool="))
                    .unwrap_or("memcheck");
                if let Ok(t) = opts::new_tool(tool) {
                    if !t.help().is_empty() {
                        print!("\n{}", t.help());
                    }
                }
                return Ok(());
            }
            Action::Version => {
                println!("oxgrind-{}", env!("CARGO_PKG_VERSION"));
                return Ok(());
            }
            Action::Run(p) => p,
        };
    let Some(prog) = program.first() else {
        bail!("no program specified (use --help for more information)");
    };
    let resolved = resolve_program(prog)?;
    check_preloadable(&resolved, 0)?;
    let runtime = find_runtime()?;
    check_output_files(&parsed.core)?;

    let mut preload = OsString::from(&runtime);
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(existing);
    }
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let handoff = opts::Handoff {
        state: opts::STATE_FRESH.into(),
        cwd: cwd.to_string_lossy().into_owned(),
        options: parsed.options.clone(),
        command: program.clone(),
    }
    .encode();
    let mut ours: Vec<(&str, OsString)> = vec![
        ("LD_PRELOAD", preload),
        (opts::ENV_NAME, OsString::from(handoff)),
    ];
    if parsed.core.tool == "memcheck" {
        // As Valgrind's memcheck does: libstdc++'s pool allocators then use plain new/delete,
        // so their blocks are tracked one by one instead of hidden in pools.
        ours.push(("GLIBCXX_FORCE_NEW", "1".into()));
        ours.push(("GLIBCPP_FORCE_NEW", "1".into()));
    }
    let env = environment_with(std::env::vars_os(), &ours);
    // exec only returns on failure.
    let err = exec_with_environment(&resolved, prog, &program[1..], &env);
    Err(anyhow!("{prog}: cannot execute: {err}"))
}

/// The program's environment: ours, in the order we were given it, with each of `ours`
/// replacing the variable of its name where it stands or, if absent, appended.
///
/// The order matters because a program sees it (`env` prints it, shells and interpreters
/// copy it in order): `std::process::Command` would hand the program a sorted environment
/// as soon as one variable is set, so `oxgrind env` would not print what `env` prints.
fn environment_with(
    given: impl Iterator<Item = (OsString, OsString)>,
    ours: &[(&str, OsString)],
) -> Vec<OsString> {
    let mut placed = vec![false; ours.len()];
    let mut out: Vec<OsString> = given
        .map(|(name, value)| {
            let value = match ours.iter().position(|(n, _)| name == *n) {
                Some(i) => {
                    placed[i] = true;
                    ours[i].1.clone()
                }
                None => value,
            };
            entry(&name, &value)
        })
        .collect();
    for (i, (name, value)) in ours.iter().enumerate() {
        if !placed[i] {
            out.push(entry(name.as_ref(), value));
        }
    }
    out
}

fn entry(name: &std::ffi::OsStr, value: &std::ffi::OsStr) -> OsString {
    let mut e = OsString::from(name);
    e.push("=");
    e.push(value);
    e
}

/// `execve` of `path` with `arg0`, `args` and exactly `env`; returns only on failure.
fn exec_with_environment(
    path: &Path,
    arg0: &str,
    args: &[String],
    env: &[OsString],
) -> std::io::Error {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |b: &[u8]| {
        CString::new(b).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    };
    let build = || -> std::io::Result<(CString, Vec<CString>, Vec<CString>)> {
        let path = c(path.as_os_str().as_bytes())?;
        let argv = std::iter::once(arg0)
            .chain(args.iter().map(String::as_str))
            .map(|a| c(a.as_bytes()))
            .collect::<std::io::Result<Vec<_>>>()?;
        let envp = env
            .iter()
            .map(|e| c(e.as_bytes()))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok((path, argv, envp))
    };
    let (path, argv, envp) = match build() {
        Ok(v) => v,
        Err(e) => return e,
    };
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).collect();
    envp_ptrs.push(std::ptr::null());
    // Rust's start-up ignores SIGPIPE and an ignored signal stays ignored across exec: put
    // back the default, or `oxgrind prog | head` would leave prog writing to a closed pipe
    // instead of ending as it does natively.
    // SAFETY: setting a signal's disposition to SIG_DFL has no memory-safety precondition.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // SAFETY: every pointer is to a NUL-terminated string owned by `argv`/`envp`, alive until
    // after the call, and both arrays end in a null pointer as execve requires.
    unsafe { libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr()) };
    std::io::Error::last_os_error()
}

/// Options from Valgrind's start-up files and environment variable, whitespace-separated.
/// A file that does not exist is skipped, as Valgrind skips it.
fn default_options() -> Vec<String> {
    let mut out = Vec::new();
    let mut sources: Vec<String> = Vec::new();
    if let Some(home) = std::env::var_os("HOME") {
        sources.extend(fs::read_to_string(Path::new(&home).join(".valgrindrc")).ok());
    }
    sources.extend(std::env::var("VALGRIND_OPTS").ok());
    sources.extend(fs::read_to_string(".valgrindrc").ok());
    for text in sources {
        out.extend(text.split_whitespace().map(str::to_string));
    }
    out
}

/// Finds `prog` as the shell would: a name with a `/` is a path, anything else is looked up
/// in `PATH`.
fn resolve_program(prog: &str) -> Result<PathBuf> {
    if prog.contains('/') {
        let p = PathBuf::from(prog);
        match fs::metadata(&p) {
            Ok(_) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(cannot_run(
                    127,
                    format!("{prog}: No such file or directory"),
                ));
            }
            Err(e) => return Err(cannot_run(126, format!("{prog}: {}", io_reason(&e)))),
        }
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(prog);
        if let Ok(md) = fs::metadata(&candidate) {
            if md.is_file() && md.permissions().mode() & 0o111 != 0 {
                return Ok(candidate);
            }
        }
    }
    Err(cannot_run(127, format!("{prog}: command not found")))
}

/// The C library's text for an I/O error ("Permission denied"), without Rust's " (os error
/// 13)" suffix: the words Valgrind prints.
fn io_reason(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// Creates the `--log-file` and `--xml-file` now, as Valgrind does at start-up, so a path
/// that cannot be written is refused before the program runs (exit 1, naming the path and
/// the reason) rather than found out when the report is due. The launcher's pid is the
/// program's (we `exec` it), so `%p` expands to the same name the runtime will open.
fn check_output_files(core: &opts::CoreOptions) -> Result<()> {
    let files = [(Some(&core.log), "log"), (core.xml.as_ref(), "XML")];
    for (dest, what) in files {
        let Some(LogDest::File(template)) = dest else {
            continue;
        };
        let cwd = std::env::current_dir().context("cannot read the current directory")?;
        let getenv = |v: &str| std::env::var(v).ok();
        let path = opts::template::expand(
            template,
            std::process::id() as i32,
            1,
            &getenv,
            &cwd.to_string_lossy(),
        )
        .map_err(|e| anyhow!("{}", e.0))?;
        if let Err(e) = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
        {
            bail!("Cannot create {what} file '{path}': {}", io_reason(&e));
        }
    }
    Ok(())
}

/// Checks that the dynamic loader will preload our runtime into `path`.
fn check_preloadable(path: &Path, depth: u32) -> Result<()> {
    let shown = path.display();
    let md = fs::metadata(path).map_err(|e| {
        let status = if e.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        };
        cannot_run(status, format!("{shown}: {}", io_reason(&e)))
    })?;
    if md.is_dir() {
        return Err(cannot_run(126, format!("{shown}: is a directory")));
    }
    if md.permissions().mode() & 0o111 == 0 {
        return Err(cannot_run(126, format!("{shown}: Permission denied")));
    }
    if md.permissions().mode() & 0o6000 != 0 {
        bail!("{shown}: is set-user-ID or set-group-ID: the dynamic loader ignores LD_PRELOAD for it, so oxgrind cannot run it");
    }
    let mut head = vec![0u8; 4096];
    let n = fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .with_context(|| format!("{shown}: cannot read"))?;
    head.truncate(n);
    if head.starts_with(b"#!") {
        if depth > 4 {
            bail!("{shown}: too many levels of #! interpreters");
        }
        let line = head[2..].split(|&b| b == b'\n').next().unwrap_or(&[]);
        let line = String::from_utf8_lossy(line);
        let interp = line.split_whitespace().next().unwrap_or("");
        if interp.is_empty() {
            bail!("{shown}: #! line names no interpreter");
        }
        return check_preloadable(Path::new(interp), depth + 1)
            .with_context(|| format!("{shown}: its interpreter {interp}"));
    }
    check_elf(&head, &shown.to_string())
}

fn check_elf(head: &[u8], shown: &str) -> Result<()> {
    if head.len() < 64 || &head[..4] != b"\x7fELF" {
        bail!("{shown}: not an ELF executable or #! script");
    }
    if head[4] != 2 || head[5] != 1 {
        bail!("{shown}: not a 64-bit little-endian ELF file; oxgrind runs x86-64 programs only");
    }
    let u16_at = |o: usize| u16::from_le_bytes([head[o], head[o + 1]]);
    let u64_at = |o: usize| u64::from_le_bytes(head[o..o + 8].try_into().expect("8 bytes"));
    if u16_at(18) != 62 {
        bail!("{shown}: not an x86-64 program; oxgrind runs x86-64 programs only");
    }
    let (phoff, phentsize, phnum) = (
        u64_at(32) as usize,
        u16_at(54) as usize,
        u16_at(56) as usize,
    );
    let mut has_interp = false;
    for i in 0..phnum {
        let off = phoff + i * phentsize;
        if off + 4 > head.len() {
            // Program headers beyond the first page: unusual; let the loader decide.
            return Ok(());
        }
        let p_type = u32::from_le_bytes(head[off..off + 4].try_into().expect("4 bytes"));
        has_interp |= p_type == 3; // PT_INTERP
    }
    if !has_interp {
        bail!("{shown}: is statically linked; oxgrind's runtime library can only be preloaded into dynamically linked programs");
    }
    Ok(())
}

/// The runtime library sits next to the `oxgrind` executable (both come out of one
/// `cargo build`); `OXGRIND_RUNTIME` overrides it.
fn find_runtime() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("OXGRIND_RUNTIME") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("OXGRIND_RUNTIME={}: no such file", p.display());
    }
    let exe = std::env::current_exe().context("cannot locate the oxgrind executable")?;
    let exe = fs::canonicalize(&exe).unwrap_or(exe);
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow!("oxgrind executable has no directory"))?;
    for candidate in [
        dir.join(RUNTIME_NAME),
        dir.join("../lib/oxgrind").join(RUNTIME_NAME),
    ] {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "cannot find {RUNTIME_NAME} next to {} (build it with `cargo build --release`, or set OXGRIND_RUNTIME)",
        exe.display()
    )
}

fn help_text() -> String {
    let tools = opts::TOOLS.join(", ");
    let planned = opts::PLANNED_TOOLS.join(", ");
    let raw = r#"usage: oxgrind [options] prog-and-args
       oxgrind ms_print [--peak-only] [options] massif-out-file
       oxgrind report [--format=html|json|sarif] [-o FILE] FILE...
       oxgrind diff [--html] [--fail-if-grown=PCT] OLD NEW

  tool-selection option, with default in [ ]:
    --tool=<name>             use the tool named <name> [memcheck]
                              available: TOOLS
                              not yet: PLANNED

  basic user options for all tools, with defaults in [ ]:
    -h --help                 show this message
    --version                 show version
    -q --quiet                run silently; only print error msgs
    -v --verbose              be more verbose -- show misc extra info
    --trace-children=no|yes   measure child processes (follow execve)? [no]
    --trace-children-skip=patt1,patt2,...    executables that
                              --trace-children=yes should not trace into
    --child-silent-after-fork=no|yes omit child output between fork & exec? [no]
    --log-fd=<number>         log messages to file descriptor [2=stderr]
    --log-file=<file>         log messages to <file> (%p: pid, %q{VAR}: env var)
    --time-stamp=no|yes       add timestamps to log messages? [no]

  user options for tools that report errors:
    --xml=yes                 emit error output in XML
    --xml-fd=<number>         XML output to file descriptor
    --xml-file=<file>         XML output to <file>
    --demangle=no|yes         automatically demangle C++ names? [yes]
    --num-callers=<number>    show <number> callers in stack traces [12]
    --error-limit=no|yes      stop showing new errors if too many? [yes]
    --error-exitcode=<number> exit code to return if errors found [0=disable]
    -s --show-error-list=no|yes  show detected errors list and
                              suppression counts at exit [no]
    --show-below-main=no|yes  continue stack traces below main() [no]
    --fullpath-after=<string> show full source paths in call stacks
    --suppressions=<filename> suppress errors described in <filename>
    --gen-suppressions=no|yes|all    print suppressions for errors? [no]

  user options for tools that replace malloc:
    --alignment=<number>      set minimum alignment of heap allocations [16]

  memory budgets (exit status 3 and one line per broken budget; docs/report.md):
    --max-peak=<size>         most heap bytes live at once (e.g. 64M)
    --max-leaked=<size>       most bytes definitely + indirectly lost (memcheck)
    --max-allocs=<number>     most allocations

  Options accepted for compatibility with Valgrind and ignored: --vgdb, --vgdb-error,
  --smc-check, --read-var-info, --keep-debuginfo, --redzone-size, --fair-sched, ...

  Tool options (massif: --heap, --heap-admin, --depth, --alloc-fn, --ignore-fn,
  --threshold, --peak-inaccuracy, --time-unit, --detailed-freq, --max-snapshots,
  --pages-as-heap, --massif-out-file; memcheck: --leak-check, --show-leak-kinds,
  --errors-for-leak-kinds, --show-reachable, ...) are those of Valgrind's tools.

  Extra options read from ~/.valgrindrc, $VALGRIND_OPTS, ./.valgrindrc (before the
  command line's).

  oxgrind runs the program with its runtime library preloaded: the program must be
  dynamically linked (or a #! script whose interpreter is).
"#;
    raw.replace("TOOLS", &tools).replace("PLANNED", &planned)
}
