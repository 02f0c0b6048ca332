//! The core options a tool's report depends on, parsed in one place.
//!
//! In Valgrind these are the core's (its error manager, its stack-trace depth, its log):
//! `-q`/`-v`, `--num-callers`, `--show-below-main`, `--xml`, the error-reporting options,
//! `--log-file`. The core parses them here, once ([`CoreView::parse_option`]), and hands
//! the result to the tool ([`Tool::core_options`](crate::Tool::core_options)); a tool never
//! parses them itself.

use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::OptionError;

/// `--gen-suppressions`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GenSuppressions {
    #[default]
    No,
    /// Ask for each error.
    Yes,
    All,
}

/// The core options tools see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreView {
    /// 0 with `-q`, 1 by default, +1 per `-v`.
    pub verbosity: u32,
    /// `-s` / `--show-error-list=yes` (implied by `-v`).
    pub show_error_list: bool,
    /// `--num-callers` (1..=500).
    pub num_callers: usize,
    pub show_below_main: bool,
    /// `--log-file` was given (the banner then shows `Parent PID:`).
    pub log_to_file: bool,
    /// `--xml=yes`.
    pub xml: bool,
    pub xml_file: Option<String>,
    /// `--xml-fd=N` given (the runtime writes to that descriptor).
    pub xml_fd: bool,
    pub xml_user_comment: Option<String>,
    pub error_limit: bool,
    /// `--error-exitcode=N`; 0 is off.
    pub error_exitcode: i32,
    pub exit_on_first_error: bool,
    /// `--suppressions=` files in the order given.
    pub suppressions: Vec<String>,
    pub default_suppressions: bool,
    pub gen_suppressions: GenSuppressions,
    /// `--error-markers=BEGIN,END`.
    pub error_markers: Option<(String, String)>,
    /// Every option given, in order (XML's `<vargv>`).
    pub args: Vec<String>,
}

impl Default for CoreView {
    fn default() -> Self {
        CoreView {
            verbosity: 1,
            show_error_list: false,
            num_callers: 12,
            show_below_main: false,
            log_to_file: false,
            xml: false,
            xml_file: None,
            xml_fd: false,
            xml_user_comment: None,
            error_limit: true,
            error_exitcode: 0,
            exit_on_first_error: false,
            suppressions: Vec::new(),
            default_suppressions: true,
            gen_suppressions: GenSuppressions::No,
            error_markers: None,
            args: Vec::new(),
        }
    }
}

fn bad(arg: &str) -> OptionError {
    OptionError(alloc::format!("Bad option: {arg}"))
}

fn yes_no(arg: &str, v: &str) -> Result<bool, OptionError> {
    match v {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(OptionError(alloc::format!(
            "Bad option: {arg}: expected 'yes' or 'no'"
        ))),
    }
}

fn number(arg: &str, v: &str, min: u64, max: u64) -> Result<u64, OptionError> {
    match v.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        Ok(_) => Err(OptionError(alloc::format!(
            "Bad option: {arg}: must be between {min} and {max}"
        ))),
        Err(_) => Err(OptionError(alloc::format!(
            "Bad option: {arg}: invalid integer value '{v}'"
        ))),
    }
}

impl CoreView {
    /// Takes one option if it is one of these. `Ok(false)`: not one of them (it may still
    /// be another core option, or the tool's).
    pub fn parse_option(&mut self, arg: &str) -> Result<bool, OptionError> {
        let (key, val) = match arg.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (arg, None),
        };
        let v = val.unwrap_or("");
        match (key, val) {
            ("-q" | "--quiet", None) => self.verbosity = 0,
            ("-v" | "--verbose", None) => {
                self.verbosity += 1;
                self.show_error_list = true;
            }
            ("-s", None) => self.show_error_list = true,
            ("--show-error-list", Some(_)) => self.show_error_list = yes_no(arg, v)?,
            ("--num-callers", Some(_)) => self.num_callers = number(arg, v, 1, 500)? as usize,
            ("--show-below-main", Some(_)) => self.show_below_main = yes_no(arg, v)?,
            ("--log-file", Some(_)) => self.log_to_file = true,
            ("--xml", Some(_)) => self.xml = yes_no(arg, v)?,
            ("--xml-file", Some(_)) => self.xml_file = Some(v.to_string()),
            ("--xml-fd", Some(_)) => self.xml_fd = true,
            ("--xml-user-comment", Some(_)) => self.xml_user_comment = Some(v.to_string()),
            ("--error-limit", Some(_)) => self.error_limit = yes_no(arg, v)?,
            ("--error-exitcode", Some(_)) => {
                self.error_exitcode = number(arg, v, 0, i32::MAX as u64)? as i32
            }
            ("--exit-on-first-error", Some(_)) => self.exit_on_first_error = yes_no(arg, v)?,
            ("--suppressions", Some(_)) => self.suppressions.push(v.to_string()),
            ("--default-suppressions", Some(_)) => self.default_suppressions = yes_no(arg, v)?,
            ("--gen-suppressions", Some(_)) => {
                self.gen_suppressions = match v {
                    "no" => GenSuppressions::No,
                    "yes" => GenSuppressions::Yes,
                    "all" => GenSuppressions::All,
                    _ => return Err(bad(arg)),
                }
            }
            ("--error-markers", Some(_)) => {
                let (b, e) = v.split_once(',').unwrap_or((v, ""));
                self.error_markers = Some((b.to_string(), e.to_string()));
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// A view of `options` as a whole command line's (the others are ignored), with
    /// `args` set to all of them: what tests of a tool hand it.
    pub fn from_options<S: AsRef<str>>(options: &[S]) -> Result<CoreView, OptionError> {
        let mut v = CoreView::default();
        for o in options {
            v.parse_option(o.as_ref())?;
            v.args.push(o.as_ref().to_string());
        }
        Ok(v)
    }

    /// Whether the text log shows the tool's banner and the usual chatter (`-q` silences
    /// it; with `--xml=yes` the XML file carries the report).
    pub fn talks(&self) -> bool {
        self.verbosity > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_options_are_taken_and_others_left() {
        let v = CoreView::from_options(&[
            "-v",
            "--num-callers=30",
            "--leak-check=full",
            "--gen-suppressions=all",
            "--error-markers=B,E",
        ])
        .unwrap();
        assert_eq!(v.verbosity, 2);
        assert!(v.show_error_list);
        assert_eq!(v.num_callers, 30);
        assert_eq!(v.gen_suppressions, GenSuppressions::All);
        assert_eq!(v.error_markers, Some(("B".into(), "E".into())));
        assert_eq!(v.args.len(), 5);
        assert!(!CoreView::default()
            .parse_option("--leak-check=full")
            .unwrap());
        assert!(CoreView::default().parse_option("--num-callers=0").is_err());
    }
}
