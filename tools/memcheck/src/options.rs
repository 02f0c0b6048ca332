//! Memcheck's options: its own (`--leak-check`, `--show-leak-kinds`, ...) and the core ones
//! the runtime forwards because they shape Memcheck's report (`-q`, `-s`, `--xml`,
//! `--suppressions`, `--error-exitcode`, `--num-callers`, ...). formats.md §8.1–8.2.
//!
//! Parsing is separate from meaning: [`Options::parse`] takes one argument at a time and
//! keeps what the user typed, [`Options::finish`] applies the cross-option rules (XML forces
//! a full leak check, `--gen-suppressions=yes` is refused in XML mode).

use alloc::format;
use oxgrind_formats::suppressions::{LeakKind, LeakKinds};
use oxgrind_tool::OptionError;

/// `--leak-check=`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LeakCheck {
    No,
    Summary,
    Full,
}

/// `--leak-resolution=`: how many frames two allocation stacks must share to be merged into
/// one loss record.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    Low,
    Med,
    High,
}

impl Resolution {
    /// Frames compared; `None` is all of them.
    pub fn frames(self) -> Option<usize> {
        match self {
            Resolution::Low => Some(2),
            Resolution::Med => Some(4),
            Resolution::High => None,
        }
    }
}

/// `--gen-suppressions=`: the core's. `Yes`: Valgrind asks interactively; without a
/// terminal to ask on, we print every one (as answering `Y` each time would).
pub use oxgrind_tool::GenSuppressions as GenSupp;

/// `--keep-stacktraces=`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum KeepStacks {
    Alloc,
    Free,
    AllocAndFree,
    AllocThenFree,
    None,
}

/// The leak-check heuristics (`--leak-check-heuristics=`), as a bit set in Memcheck's order.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Heuristics(pub u8);

impl Heuristics {
    pub const STDSTRING: u8 = 1;
    pub const LENGTH64: u8 = 2;
    pub const NEWARRAY: u8 = 4;
    pub const MULTIPLE_INHERITANCE: u8 = 8;
    pub const ALL: Heuristics = Heuristics(15);

    pub fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }

    fn parse(text: &str) -> Option<Heuristics> {
        match text {
            "all" => return Some(Heuristics::ALL),
            "none" => return Some(Heuristics(0)),
            _ => {}
        }
        let mut h = 0;
        for w in text.split(',') {
            h |= match w {
                "stdstring" => Self::STDSTRING,
                "length64" => Self::LENGTH64,
                "newarray" => Self::NEWARRAY,
                "multipleinheritance" => Self::MULTIPLE_INHERITANCE,
                _ => return None,
            };
        }
        Some(Heuristics(h))
    }
}

/// Everything Memcheck was told.
#[derive(Clone, Debug)]
pub struct Options {
    pub leak_check: LeakCheck,
    pub resolution: Resolution,
    pub show_leak_kinds: LeakKinds,
    pub errors_for_leak_kinds: LeakKinds,
    pub heuristics: Heuristics,
    pub freelist_vol: u64,
    pub freelist_big_blocks: u64,
    pub keep_stacks: KeepStacks,
    pub show_mismatched_frees: bool,
    /// `--partial-loads-ok` (yes in Valgrind 3.19): an aligned word or vector load that is
    /// partly addressable is not an error.
    pub partial_loads_ok: bool,
    /// `--undef-value-errors` (yes unless given as no, as in Valgrind): track definedness
    /// and report uses of undefined values.
    pub undef_value_errors: bool,
    /// `--track-origins=yes`: say where undefined values came from (refused with
    /// `--undef-value-errors=no`, as by Valgrind).
    pub track_origins: bool,
    /// The core options that shape the report (verbosity, `--num-callers`, the error
    /// options...), as the core parsed them (`oxgrind_tool::CoreView`).
    pub core: oxgrind_tool::CoreView,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            leak_check: LeakCheck::Summary,
            resolution: Resolution::High,
            show_leak_kinds: LeakKinds::DEFAULT,
            errors_for_leak_kinds: LeakKinds::DEFAULT,
            heuristics: Heuristics::ALL,
            freelist_vol: 20_000_000,
            freelist_big_blocks: 1_000_000,
            keep_stacks: KeepStacks::AllocAndFree,
            show_mismatched_frees: true,
            partial_loads_ok: true,
            undef_value_errors: true,
            track_origins: false,
            core: oxgrind_tool::CoreView::default(),
        }
    }
}

fn bad(arg: &str) -> OptionError {
    OptionError(format!("Bad option: {arg}"))
}

fn yes_no(arg: &str, v: &str) -> Result<bool, OptionError> {
    match v {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(OptionError(format!(
            "Bad option: {arg}: expected 'yes' or 'no'"
        ))),
    }
}

fn number(arg: &str, v: &str, min: u64, max: u64) -> Result<u64, OptionError> {
    match v.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        Ok(_) => Err(OptionError(format!(
            "Bad option: {arg}: must be between {min} and {max}"
        ))),
        Err(_) => Err(OptionError(format!(
            "Bad option: {arg}: invalid integer value '{v}'"
        ))),
    }
}

fn kinds(arg: &str, v: &str) -> Result<LeakKinds, OptionError> {
    LeakKinds::parse(v).ok_or_else(|| bad(arg))
}

impl Options {
    /// Takes one argument. `Ok(false)`: not an option Memcheck knows.
    pub fn parse(&mut self, arg: &str) -> Result<bool, OptionError> {
        let (key, val) = match arg.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (arg, None),
        };
        let v = val.unwrap_or("");
        match (key, val) {
            ("--leak-check", Some(_)) => {
                self.leak_check = match v {
                    "no" => LeakCheck::No,
                    "summary" => LeakCheck::Summary,
                    "full" | "yes" => LeakCheck::Full,
                    _ => return Err(bad(arg)),
                }
            }
            ("--leak-resolution", Some(_)) => {
                self.resolution = match v {
                    "low" => Resolution::Low,
                    "med" => Resolution::Med,
                    "high" => Resolution::High,
                    _ => return Err(bad(arg)),
                }
            }
            ("--show-leak-kinds", Some(_)) => self.show_leak_kinds = kinds(arg, v)?,
            ("--errors-for-leak-kinds", Some(_)) => self.errors_for_leak_kinds = kinds(arg, v)?,
            ("--show-reachable", Some(_)) => {
                self.show_leak_kinds = if yes_no(arg, v)? {
                    LeakKinds::ALL
                } else {
                    LeakKinds(self.show_leak_kinds.0 & !(1 << LeakKind::Reachable as u8))
                }
            }
            ("--show-possibly-lost", Some(_)) => {
                self.show_leak_kinds = if yes_no(arg, v)? {
                    self.show_leak_kinds.with(LeakKind::Possible)
                } else {
                    LeakKinds(self.show_leak_kinds.0 & !(1 << LeakKind::Possible as u8))
                }
            }
            ("--leak-check-heuristics", Some(_)) => {
                self.heuristics = Heuristics::parse(v).ok_or_else(|| bad(arg))?
            }
            ("--freelist-vol", Some(_)) => self.freelist_vol = number(arg, v, 0, i64::MAX as u64)?,
            ("--freelist-big-blocks", Some(_)) => {
                self.freelist_big_blocks = number(arg, v, 0, i64::MAX as u64)?
            }
            ("--keep-stacktraces", Some(_)) => {
                self.keep_stacks = match v {
                    "alloc" => KeepStacks::Alloc,
                    "free" => KeepStacks::Free,
                    "alloc-and-free" => KeepStacks::AllocAndFree,
                    "alloc-then-free" => KeepStacks::AllocThenFree,
                    "none" => KeepStacks::None,
                    _ => return Err(bad(arg)),
                }
            }
            ("--show-mismatched-frees", Some(_)) => self.show_mismatched_frees = yes_no(arg, v)?,
            ("--partial-loads-ok", Some(_)) => self.partial_loads_ok = yes_no(arg, v)?,
            ("--undef-value-errors", Some(_)) => {
                self.undef_value_errors = yes_no(arg, v)?;
            }
            ("--track-origins", Some(_)) => self.track_origins = yes_no(arg, v)?,
            // Memcheck's =no instruments add, sub and ==/!= cheaply (more reports), =auto
            // expensively where a block needs it; our rules are always the exact ones
            // (docs/differences-from-valgrind.md), so every value gives the same result.
            ("--expensive-definedness-checks", Some("no" | "auto" | "yes")) => {}
            (
                "--malloc-fill" | "--free-fill" | "--ignore-ranges" | "--ignore-range-below-sp",
                Some(_),
            ) => {}
            ("--workaround-gcc296-bugs", Some(_)) => {
                yes_no(arg, v)?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Takes the core options that shape Memcheck's report, as the core parsed them.
    pub fn apply_core(&mut self, core: &oxgrind_tool::CoreView) {
        self.core = core.clone();
    }

    /// Applies the rules that involve several options.
    pub fn finish(&mut self) -> Result<(), OptionError> {
        if self.core.xml {
            if self.core.xml_file.is_none() && !self.core.xml_fd {
                return Err(OptionError(
                    "Bad option: --xml=yes, but no XML destination specified".into(),
                ));
            }
            if self.core.gen_suppressions == GenSupp::Yes {
                return Err(OptionError(
                    "Bad option: --gen-suppressions=yes: --gen-suppressions=yes is not compatible with --xml=yes".into(),
                ));
            }
            // Memcheck 3.19 always runs the full leak search in XML mode.
            if self.leak_check == LeakCheck::Summary {
                self.leak_check = LeakCheck::Full;
            }
        }
        if self.track_origins {
            if !self.undef_value_errors {
                return Err(OptionError(
                    "Bad option: --undef-value-errors=no\n--track-origins=yes has no effect when --undef-value-errors=no."
                        .into(),
                ));
            }
        }
        if self.core.exit_on_first_error && self.core.error_exitcode == 0 {
            return Err(OptionError(
                "Bad option: --exit-on-first-error=yes\nYou must define a non nul exit error code, with --error-exitcode=..."
                    .into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As the core hands them: its options through `CoreView`, the rest to Memcheck.
    fn parsed(args: &[&str]) -> Result<Options, OptionError> {
        let mut o = Options::default();
        let mut core = oxgrind_tool::CoreView::default();
        for a in args {
            if !core.parse_option(a)? && !o.parse(a)? {
                return Err(OptionError(format!("not ours: {a}")));
            }
        }
        core.args = args.iter().map(|a| a.to_string()).collect();
        o.apply_core(&core);
        o.finish()?;
        Ok(o)
    }

    #[test]
    fn defaults_are_memchecks() {
        let o = parsed(&[]).unwrap();
        assert_eq!(o.leak_check, LeakCheck::Summary);
        assert_eq!(o.show_leak_kinds, LeakKinds::DEFAULT);
        assert_eq!(o.core.num_callers, 12);
        assert_eq!(o.core.verbosity, 1);
        assert_eq!(o.heuristics, Heuristics::ALL);
    }

    #[test]
    fn show_reachable_and_possibly_lost_edit_the_shown_kinds() {
        assert_eq!(
            parsed(&["--show-reachable=yes"]).unwrap().show_leak_kinds,
            LeakKinds::ALL
        );
        let o = parsed(&["--show-reachable=no", "--show-possibly-lost=no"]).unwrap();
        assert_eq!(o.show_leak_kinds, LeakKinds(0).with(LeakKind::Definite));
    }

    #[test]
    fn xml_forces_full_leak_check_and_needs_a_file() {
        assert_eq!(
            parsed(&["--xml=yes", "--xml-file=x.xml"])
                .unwrap()
                .leak_check,
            LeakCheck::Full
        );
        assert!(parsed(&["--xml=yes"])
            .unwrap_err()
            .0
            .contains("no XML destination"));
        assert!(parsed(&["--xml=yes", "--xml-file=x", "--gen-suppressions=yes"]).is_err());
    }

    #[test]
    fn bad_values_are_errors_not_panics() {
        for a in [
            "--leak-check=maybe",
            "--num-callers=0",
            "--num-callers=x",
            "--show-leak-kinds=most",
            "--xml=1",
        ] {
            assert!(parsed(&[a]).is_err(), "{a}");
        }
        let mut o = Options::default();
        assert!(!o.parse("--depth=3").unwrap());
        assert!(!o.parse("--tool=massif").unwrap());
    }

    #[test]
    fn core_options_forwarded_by_the_runtime_are_accepted() {
        let o = parsed(&[
            "-q",
            "-s",
            "--error-exitcode=42",
            "--suppressions=a.supp",
            "--suppressions=b.supp",
            "--gen-suppressions=all",
            "--num-callers=30",
        ])
        .unwrap();
        assert_eq!(
            (
                o.core.verbosity,
                o.core.show_error_list,
                o.core.error_exitcode
            ),
            (0, true, 42)
        );
        assert_eq!(o.core.suppressions, ["a.supp", "b.supp"]);
        assert_eq!(o.core.gen_suppressions, GenSupp::All);
        assert_eq!(o.core.num_callers, 30);
        assert_eq!(o.core.args.len(), 7);
    }
}
