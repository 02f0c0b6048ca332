//! Valgrind's command line, parsed once, for both sides of the process boundary.
//!
//! The launcher parses the options to reject mistakes before the program starts (one line,
//! non-zero exit, as `valgrind: Unknown option: --foo` does); the runtime, preloaded into the
//! program, parses the very same list (passed in `OXGRIND_OPTIONS`) to configure itself and
//! its tool. One parser means the two can never disagree about what an option means.
//!
//! Core options are the ones every tool shares (`--log-file`, `--trace-children`,
//! `--num-callers`, ...). Those that shape a tool's report (verbosity, `--num-callers`, the
//! error-reporting options) are parsed by the contract's [`CoreView`] and handed to the tool
//! whole ([`Tool::core_options`]); the tool never parses them. Everything else is offered to
//! the selected tool's [`Tool::parse_option`].

use oxgrind_tool::{CoreView, OptionError, Tool};

pub mod budget;
pub mod template;

pub use budget::{Budgets, BUDGET_EXIT_CODE};

/// The tools oxgrind knows, in `--help` order.
pub const TOOLS: &[&str] = &["memcheck", "massif", "dhat", "cachegrind", "none"];

/// Valgrind tools oxgrind does not implement yet: named so the user gets a clear answer.
pub const PLANNED_TOOLS: &[&str] = &["callgrind", "helgrind", "drd"];

/// Where the `==PID==` log goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogDest {
    Fd(i32),
    /// A file-name template (`%p`, `%q{VAR}`, ...), expanded by the runtime.
    File(String),
}

/// Options every tool shares.
#[derive(Clone, Debug)]
pub struct CoreOptions {
    pub tool: String,
    /// The options that shape the tool's report (verbosity, `--num-callers`,
    /// `--show-below-main`, error reporting), as the tool sees them.
    pub view: CoreView,
    pub log: LogDest,
    /// `--xml-file` / `--xml-fd`: where `--xml=yes` output goes.
    pub xml: Option<LogDest>,
    pub trace_children: bool,
    pub trace_children_skip: Vec<String>,
    pub child_silent_after_fork: bool,
    pub demangle: bool,
    pub fullpath_after: Vec<String>,
    pub read_inline_info: bool,
    pub time_stamp: bool,
    pub alignment: u64,
    pub run_libc_freeres: bool,
    pub run_cxx_freeres: bool,
    /// `--track-fds`: the descriptors open at exit, with where they were opened (`Yes`
    /// leaves out 0, 1 and 2, `All` lists them too).
    pub track_fds: TrackFds,
    /// `--max-peak`, `--max-leaked`, `--max-allocs`: checked by the runtime at exit.
    pub budgets: Budgets,
}

impl Default for CoreOptions {
    fn default() -> Self {
        CoreOptions {
            tool: "memcheck".into(),
            view: CoreView::default(),
            log: LogDest::Fd(2),
            xml: None,
            trace_children: false,
            trace_children_skip: Vec::new(),
            child_silent_after_fork: false,
            demangle: true,
            fullpath_after: Vec::new(),
            read_inline_info: true,
            time_stamp: false,
            alignment: 16,
            run_libc_freeres: true,
            run_cxx_freeres: true,
            track_fds: TrackFds::No,
            budgets: Budgets::default(),
        }
    }
}

/// `--track-fds=no|yes|all`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrackFds {
    No,
    Yes,
    All,
}

/// A parsed command line: core options, the configured tool, and where the program starts.
pub struct Parsed {
    pub core: CoreOptions,
    pub tool: Box<dyn Tool>,
    /// The options exactly as given, in order (they travel to the runtime verbatim).
    pub options: Vec<String>,
    /// The tool options in command-line order (Massif's `desc:` line).
    pub tool_options: Vec<String>,
}

/// What the launcher should do.
pub enum Action {
    Help,
    Version,
    Run(Box<Parsed>),
}

/// Creates the tool called `name`.
pub fn new_tool(name: &str) -> Result<Box<dyn Tool>, OptionError> {
    match name {
        "massif" => Ok(Box::new(oxgrind_massif::Massif::new())),
        "memcheck" => Ok(Box::new(oxgrind_memcheck::Memcheck::new())),
        "dhat" => Ok(Box::new(oxgrind_dhat::Dhat::new())),
        "cachegrind" => Ok(Box::new(oxgrind_cachegrind::Cachegrind::new())),
        "none" => Ok(Box::new(oxgrind_none::Nulgrind::new())),
        other if PLANNED_TOOLS.contains(&other) => Err(OptionError(format!(
            "the tool '{other}' is not implemented in oxgrind yet (available: {})",
            TOOLS.join(", ")
        ))),
        other => Err(OptionError(format!(
            "failed to start tool '{other}': no such tool (available: {})",
            TOOLS.join(", ")
        ))),
    }
}

fn bool_value(opt: &str, v: &str) -> Result<bool, OptionError> {
    match v {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(OptionError(format!(
            "Bad option: {opt}: expected 'yes' or 'no'"
        ))),
    }
}

fn num_value(opt: &str, v: &str, lo: u64, hi: u64) -> Result<u64, OptionError> {
    match v.parse::<u64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        Ok(_) => Err(OptionError(format!(
            "Bad option: {opt}: argument must be between {lo} and {hi}"
        ))),
        Err(_) => Err(OptionError(format!("Bad option: {opt}: expected a number"))),
    }
}

/// Core options that are *also* offered to the tool: the replacement allocator's options,
/// which Valgrind's tools parse (Massif lists them on its `desc:` line); a tool that does not
/// know them is not an error.
fn shared_with_tool(arg: &str) -> bool {
    const SHARED: &[&str] = &[
        "--alignment",
        "--redzone-size",
        "--xtree-memory",
        "--xtree-memory-file",
    ];
    let name = arg.split('=').next().unwrap_or(arg);
    SHARED.contains(&name)
}

/// Core options accepted for compatibility that change nothing in oxgrind.
fn accepted_and_ignored(name: &str) -> bool {
    const IGNORED: &[&str] = &[
        "--vgdb",
        "--vgdb-error",
        "--vgdb-stop-at",
        "--smc-check",
        "--read-var-info",
        "--keep-debuginfo",
        "--sym-offsets",
        "--max-stackframe",
        "--main-stacksize",
        "--fair-sched",
        "--redzone-size",
        "--xtree-memory",
        "--xtree-memory-file",
        "--error-markers",
        "--trace-children-skip-by-arg",
    ];
    IGNORED.contains(&name)
}

/// Splits `args` (everything after `oxgrind`) into options and the program with its
/// arguments: options come first; the first argument that does not start with `-`, or
/// everything after `--`, is the program.
pub fn split_command_line(args: &[String]) -> (Vec<String>, Vec<String>) {
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a == "--" {
            return (args[..i].to_vec(), args[i + 1..].to_vec());
        }
        if !a.starts_with('-') || a == "-" {
            break;
        }
        i += 1;
    }
    (args[..i].to_vec(), args[i..].to_vec())
}

/// Parses the options (not the program) of a command line.
pub fn parse(options: &[String]) -> Result<Action, OptionError> {
    let mut core = CoreOptions::default();
    // The tool must be known before tool options can be offered to it.
    for o in options {
        match o.as_str() {
            "-h" | "--help" | "--help-debug" => return Ok(Action::Help),
            "--version" => return Ok(Action::Version),
            _ => {}
        }
        if let Some(t) = o.strip_prefix("--tool=") {
            core.tool = t.to_string();
        }
    }
    let mut tool = new_tool(&core.tool)?;
    let mut tool_options = Vec::new();
    for o in options {
        let (name, value) = match o.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (o.as_str(), None),
        };
        let val = || value.ok_or_else(|| OptionError(format!("Bad option: {o}: expected a value")));
        let mut consumed = true;
        // The options that shape the tool's report: parsed once, here, for the tool.
        let viewed = core.view.parse_option(o)?;
        match name {
            "--tool" => {}
            _ if viewed && !matches!(name, "--log-file" | "--xml-file" | "--xml-fd") => {}
            "--log-fd" => core.log = LogDest::Fd(num_value(o, val()?, 0, 1 << 20)? as i32),
            "--log-file" => {
                let v = val()?;
                template::check(v)?;
                core.log = LogDest::File(v.to_string());
            }
            "--xml-fd" => core.xml = Some(LogDest::Fd(num_value(o, val()?, 0, 1 << 20)? as i32)),
            "--xml-file" => {
                let v = val()?;
                template::check(v)?;
                core.xml = Some(LogDest::File(v.to_string()));
            }
            "--log-socket" => {
                return Err(OptionError(
                    "--log-socket is not supported by oxgrind; use --log-file".into(),
                ))
            }
            "--trace-children" => core.trace_children = bool_value(o, val()?)?,
            "--trace-children-skip" => {
                core.trace_children_skip = val()?.split(',').map(str::to_string).collect()
            }
            "--child-silent-after-fork" => core.child_silent_after_fork = bool_value(o, val()?)?,
            "--demangle" => core.demangle = bool_value(o, val()?)?,
            "--fullpath-after" => core.fullpath_after.push(value.unwrap_or("").to_string()),
            "--read-inline-info" => core.read_inline_info = bool_value(o, val()?)?,
            "--time-stamp" => core.time_stamp = bool_value(o, val()?)?,
            "--run-libc-freeres" => core.run_libc_freeres = bool_value(o, val()?)?,
            "--run-cxx-freeres" => core.run_cxx_freeres = bool_value(o, val()?)?,
            "--track-fds" => {
                core.track_fds = match val()? {
                    "no" => TrackFds::No,
                    "yes" => TrackFds::Yes,
                    "all" => TrackFds::All,
                    _ => {
                        return Err(OptionError(format!(
                            "Bad option: {o}: expected no, yes or all"
                        )))
                    }
                }
            }
            "--alignment" => {
                let n = num_value(o, val()?, 16, 4096)?;
                if !n.is_power_of_two() {
                    return Err(OptionError(format!(
                        "Bad option: {o}: must be a power of 2"
                    )));
                }
                core.alignment = n;
            }
            n if accepted_and_ignored(n) => {}
            n if budget::parse_option(&mut core.budgets, o, n, value)? => {}
            _ => consumed = false,
        }
        if consumed && !shared_with_tool(o) {
            continue;
        }
        let taken = tool.parse_option(o)?;
        if !taken && !consumed {
            return Err(OptionError(format!("Unknown option: {o}")));
        }
        if taken && !consumed {
            tool_options.push(o.clone());
        }
    }
    core.view.args = options.to_vec();
    tool.core_options(&core.view);
    tool.post_options()?;
    budget::check_tool(&core.budgets, &core.tool, tool.needs().ignores_heap)?;
    Ok(Action::Run(Box::new(Parsed {
        core,
        tool,
        options: options.to_vec(),
        tool_options,
    })))
}

/// Separator of list items inside one environment variable (ASCII unit separator: cannot
/// appear in a command-line argument typed by a user, unlike space or comma).
pub const ENV_SEP: char = '\u{1f}';

pub fn encode_list(items: &[String]) -> String {
    items.join(&ENV_SEP.to_string())
}

pub fn decode_list(s: &str) -> Vec<String> {
    if s.is_empty() {
        Vec::new()
    } else {
        s.split(ENV_SEP).map(str::to_string).collect()
    }
}

/// The one environment variable through which the launcher configures the runtime.
///
/// One variable, not several: programs that copy their environment (perl does) then see
/// one entry more than without oxgrind, as under Valgrind (`VALGRIND_LAUNCHER`).
/// Its value is `STATE RS cwd RS options RS command`, lists joined by [`ENV_SEP`]; the five
/// bytes of STATE are rewritten in place by the runtime (no allocation, and every later
/// `exec` that passes `environ` carries the change).
pub const ENV_NAME: &str = "OXGRIND";
/// Record separator between the fields of [`ENV_NAME`].
pub const ENV_RS: char = '\u{1e}';
/// The first image: measure it; `command` is the user's command line.
pub const STATE_FRESH: &str = "fresh";
/// An image exec'd under `--trace-children=yes`: measure it; its command line is its own.
pub const STATE_CHILD: &str = "child";
/// An image exec'd under `--trace-children=no`: do not measure.
pub const STATE_TAKEN: &str = "taken";

/// What the launcher passes to the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handoff {
    pub state: String,
    pub cwd: String,
    pub options: Vec<String>,
    pub command: Vec<String>,
}

impl Handoff {
    pub fn encode(&self) -> String {
        let rs = ENV_RS.to_string();
        [
            self.state.clone(),
            self.cwd.clone(),
            encode_list(&self.options),
            encode_list(&self.command),
        ]
        .join(&rs)
    }

    pub fn decode(value: &str) -> Option<Handoff> {
        let mut it = value.split(ENV_RS);
        let state = it.next()?.to_string();
        let cwd = it.next()?.to_string();
        let options = decode_list(it.next()?);
        let command = decode_list(it.next().unwrap_or(""));
        Some(Handoff {
            state,
            cwd,
            options,
            command,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn program_starts_at_first_non_option_or_after_double_dash() {
        let (o, p) = split_command_line(&v(&["--tool=massif", "-q", "./prog", "-x", "y"]));
        assert_eq!(o, v(&["--tool=massif", "-q"]));
        assert_eq!(p, v(&["./prog", "-x", "y"]));
        let (o, p) = split_command_line(&v(&["-q", "--", "-weird-name", "a"]));
        assert_eq!(o, v(&["-q"]));
        assert_eq!(p, v(&["-weird-name", "a"]));
    }

    #[test]
    fn unknown_option_is_rejected_with_valgrinds_words() {
        let err = match parse(&v(&["--tool=massif", "--frobnicate=yes"])) {
            Err(e) => e,
            Ok(_) => panic!("accepted an unknown option"),
        };
        assert_eq!(err.0, "Unknown option: --frobnicate=yes");
    }

    #[test]
    fn unknown_tool_is_named() {
        let err = parse(&v(&["--tool=nosuch"])).err().expect("must fail");
        assert!(err.0.contains("'nosuch'"), "{}", err.0);
    }

    #[test]
    fn core_options_are_parsed() {
        let Action::Run(p) = parse(&v(&[
            "--tool=massif",
            "-q",
            "--num-callers=30",
            "--trace-children=yes",
            "--log-file=log.%p",
        ]))
        .ok()
        .expect("valid") else {
            panic!("not a run")
        };
        assert_eq!(p.core.view.verbosity, 0);
        assert_eq!(p.core.view.num_callers, 30);
        assert!(p.core.trace_children);
        assert_eq!(p.core.log, LogDest::File("log.%p".into()));
        assert!(p.tool_options.is_empty());
    }

    #[test]
    fn handoff_round_trips() {
        let h = Handoff {
            state: STATE_FRESH.into(),
            cwd: "/tmp/a b".into(),
            options: v(&["--tool=massif", "--depth=3"]),
            command: v(&["./prog", "arg with space", ""]),
        };
        assert_eq!(Handoff::decode(&h.encode()), Some(h));
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(parse(&v(&["--num-callers=0"])).is_err());
        assert!(parse(&v(&["--trace-children=maybe"])).is_err());
        assert!(parse(&v(&["--alignment=24"])).is_err());
    }
}

#[cfg(test)]
mod registry_tests {
    use super::*;

    #[test]
    fn every_listed_tool_starts_and_no_tool_is_both_available_and_planned() {
        for t in TOOLS {
            assert!(new_tool(t).is_ok(), "{t} is listed but does not start");
            assert!(
                !PLANNED_TOOLS.contains(t),
                "{t} is listed as available and as planned"
            );
        }
        for t in PLANNED_TOOLS {
            assert!(new_tool(t).is_err(), "{t} starts but is listed as planned");
        }
    }
}
