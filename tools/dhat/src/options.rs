//! DHAT's command-line options, as Valgrind 3.19 parses them (`dh_process_cmd_line_option`),
//! plus the core options its output depends on (`-q`, `--num-callers`, ...), which the core
//! parses and hands over (`Options::apply_core`).

use oxgrind_formats::dhat::Mode;
use oxgrind_tool::OptionError;

#[derive(Clone, Debug)]
pub struct Options {
    /// `-q`: no banner and no summary.
    pub quiet: bool,
    /// `--log-file` given: the banner shows the parent pid.
    pub log_to_file: bool,
    pub mode: Mode,
    pub out_file: String,
    /// `--ignore-fn` names and the contents of `--ignore-fns-file` (globs: `*`, `?`).
    pub ignore_fns: Vec<String>,
    /// `--ignore-fns-file` paths, read in [`Options::check`].
    pub ignore_files: Vec<String>,
    /// `--num-callers`: frames per allocation stack (the allocator's own frame included).
    pub num_callers: usize,
    pub show_below_main: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            quiet: false,
            log_to_file: false,
            mode: Mode::Heap,
            out_file: String::from("dhat.out.%p"),
            ignore_fns: Vec::new(),
            ignore_files: Vec::new(),
            num_callers: 12,
            show_below_main: false,
        }
    }
}

impl Options {
    /// Takes the core options DHAT's output depends on, as the core parsed them.
    pub fn apply_core(&mut self, core: &oxgrind_tool::CoreView) {
        self.quiet = !core.talks();
        self.log_to_file = core.log_to_file;
        self.num_callers = core.num_callers;
        self.show_below_main = core.show_below_main;
    }

    /// Takes one option; `Ok(false)` when it is not DHAT's.
    pub fn parse(&mut self, arg: &str) -> Result<bool, OptionError> {
        let Some((key, v)) = arg.split_once('=') else {
            return Ok(false);
        };
        match key {
            "--dhat-out-file" => self.out_file = v.to_string(),
            "--mode" => {
                self.mode = match v {
                    "heap" => Mode::Heap,
                    "copy" => Mode::Copy,
                    "ad-hoc" => Mode::AdHoc,
                    // VG_XACT_CLO: anything else is not an option DHAT knows.
                    _ => return Ok(false),
                }
            }
            "--ignore-fn" => self.ignore_fns.push(v.to_string()),
            "--ignore-fns-file" => self.ignore_files.push(v.to_string()),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// After all options: reads the `--ignore-fns-file`s and refuses what oxgrind cannot
    /// do yet.
    pub fn check(&mut self) -> Result<(), OptionError> {
        if self.mode == Mode::Copy {
            return Err(OptionError(String::from(
                "--mode=copy is not implemented in oxgrind's DHAT yet (heap and ad-hoc are)",
            )));
        }
        for path in std::mem::take(&mut self.ignore_files) {
            let text = std::fs::read_to_string(&path).map_err(|e| {
                OptionError(format!(
                    "DHAT ignore function file: can't open '{path}' ({e})"
                ))
            })?;
            // As VG_(load_tool_function_list): one name per line, blanks around it
            // dropped, empty lines and `#` comments skipped.
            for line in text.lines() {
                let name = line.trim();
                if !name.is_empty() && !name.starts_with('#') {
                    self.ignore_fns.push(name.to_string());
                }
            }
        }
        Ok(())
    }
}

/// Valgrind's `VG_(string_match)`: `*` matches any run, `?` any one character, `\` quotes
/// the next character.
pub fn glob_match(pat: &str, s: &str) -> bool {
    let p: Vec<char> = pat.chars().collect();
    let t: Vec<char> = s.chars().collect();
    // Iterative matcher with one backtrack point (the last `*`): linear enough for names.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() {
            match p[pi] {
                '*' => {
                    star = Some((pi, ti));
                    pi += 1;
                    continue;
                }
                '?' => {
                    pi += 1;
                    ti += 1;
                    continue;
                }
                '\\' if pi + 1 < p.len() => {
                    if p[pi + 1] == t[ti] {
                        pi += 2;
                        ti += 1;
                        continue;
                    }
                }
                c if c == t[ti] => {
                    pi += 1;
                    ti += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, st)) => {
                pi = sp + 1;
                ti = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dhat_options_are_taken_and_core_ones_only_noted() {
        let mut o = Options::default();
        assert!(o.parse("--dhat-out-file=x.%p").unwrap());
        assert!(o.parse("--mode=ad-hoc").unwrap());
        assert!(!o.parse("--mode=bogus").unwrap());
        assert!(o.parse("--ignore-fn=foo*").unwrap());
        assert!(!o.parse("--num-callers=4").unwrap());
        assert!(!o.parse("-q").unwrap());
        assert!(!o.parse("--depth=3").unwrap());
        o.apply_core(&oxgrind_tool::CoreView::from_options(&["--num-callers=4", "-q"]).unwrap());
        assert_eq!(o.out_file, "x.%p");
        assert_eq!(o.mode, Mode::AdHoc);
        assert_eq!(o.num_callers, 4);
        assert!(o.quiet);
        assert_eq!(o.ignore_fns, ["foo*"]);
    }

    #[test]
    fn copy_mode_is_refused_with_a_sentence() {
        let mut o = Options::default();
        o.parse("--mode=copy").unwrap();
        assert!(o.check().unwrap_err().0.contains("--mode=copy"));
    }

    #[test]
    fn missing_ignore_file_is_an_error_naming_it() {
        let mut o = Options::default();
        o.parse("--ignore-fns-file=/nonexistent/x").unwrap();
        assert!(o.check().unwrap_err().0.contains("/nonexistent/x"));
    }

    #[test]
    fn globs_match_as_valgrind_string_match() {
        assert!(glob_match("foo", "foo"));
        assert!(!glob_match("foo", "foobar"));
        assert!(glob_match("foo*", "foobar"));
        assert!(glob_match("*bar", "foobar"));
        assert!(glob_match("f?o*r", "foobar"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("a*b", "ac"));
        assert!(glob_match("a\\*", "a*"));
        assert!(!glob_match("a\\*", "ab"));
    }
}
