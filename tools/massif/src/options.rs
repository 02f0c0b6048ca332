//! Massif's command-line options (formats.md §8.3), parsed as Valgrind 3.19 parses them.
//!
//! Values are checked with Valgrind's ranges and rejected with its wording (`Bad option:
//! --depth=0` then `'--depth' argument must be between 1 and 200`), so scripts that grep
//! for those messages keep working.

use oxgrind_tool::OptionError;

/// `--time-unit`: what the `time=` of a snapshot counts.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum TimeUnit {
    /// Guest instructions executed so far (the default, as in Valgrind): the translation
    /// engine counts them.
    Instructions,
    /// Wall-clock milliseconds since the program started.
    Ms,
    /// Bytes allocated plus bytes freed so far (deterministic).
    Bytes,
}

impl TimeUnit {
    pub fn as_str(self) -> &'static str {
        match self {
            TimeUnit::Instructions => "i",
            TimeUnit::Ms => "ms",
            TimeUnit::Bytes => "B",
        }
    }
}

/// `--time-unit` when none is given: Valgrind's, `i` (instructions, counted by the
/// translation engine), `--pages-as-heap=yes` included.
pub const DEFAULT_TIME_UNIT: TimeUnit = TimeUnit::Instructions;

/// Largest `--depth` (Valgrind's MAX_DEPTH).
pub const MAX_DEPTH: usize = 200;
/// Frames captured beyond `--depth` so that allocator frames can be dropped (MAX_OVERESTIMATE).
pub const OVERESTIMATE: usize = 50;

#[derive(Clone, Debug)]
pub struct Options {
    /// `-q`: no banner.
    pub quiet: bool,
    /// `--log-file` given: the banner shows the parent pid.
    pub log_to_file: bool,
    pub heap: bool,
    pub heap_admin: u64,
    pub stacks: bool,
    pub pages_as_heap: bool,
    pub depth: usize,
    /// User `--alloc-fn`s (the built-in list is in `classify`).
    pub alloc_fns: Vec<String>,
    pub ignore_fns: Vec<String>,
    pub threshold: f64,
    pub peak_inaccuracy: f64,
    pub time_unit: TimeUnit,
    /// Whether `--time-unit` was given at all.
    pub time_unit_given: bool,
    pub detailed_freq: u32,
    pub max_snapshots: usize,
    pub out_file: String,
    /// `--show-below-main` (a core option the core also offers to tools).
    pub show_below_main: bool,
    /// `--alignment` (a core option): what Valgrind's `malloc` aligns blocks to.
    pub alignment: u64,
    /// Every option taken, verbatim and in order, for the `desc:` line.
    pub desc_args: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            quiet: false,
            log_to_file: false,
            heap: true,
            heap_admin: 8,
            stacks: false,
            pages_as_heap: false,
            depth: 30,
            alloc_fns: Vec::new(),
            ignore_fns: Vec::new(),
            threshold: 1.0,
            peak_inaccuracy: 1.0,
            time_unit: DEFAULT_TIME_UNIT,
            time_unit_given: false,
            detailed_freq: 10,
            max_snapshots: 100,
            out_file: String::from("massif.out.%p"),
            show_below_main: false,
            alignment: 16,
            desc_args: Vec::new(),
        }
    }
}

fn bad(arg: &str, why: &str) -> OptionError {
    OptionError(format!("Bad option: {arg}\n{why}"))
}

/// `yes`/`no`, as VG_BOOL_CLO.
fn parse_bool(arg: &str, v: &str) -> Result<bool, OptionError> {
    match v {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(bad(
            arg,
            &format!("Invalid boolean value '{v}' (should be 'yes' or 'no')"),
        )),
    }
}

/// A bounded integer, as VG_BINT_CLO: strtoll base 10 over the whole value, then the range.
fn parse_bint(arg: &str, name: &str, v: &str, lo: i64, hi: i64) -> Result<i64, OptionError> {
    let n: i64 = v
        .parse()
        .map_err(|_| bad(arg, &format!("Invalid integer value '{v}'")))?;
    if n < lo || n > hi {
        return Err(bad(
            arg,
            &format!("'{name}' argument must be between {lo} and {hi}"),
        ));
    }
    Ok(n)
}

/// A decimal number as VG_(strtod) reads it: optional sign, digits, optional `.` and digits,
/// nothing else (no exponent, no `inf`).
fn parse_double(arg: &str, v: &str) -> Result<f64, OptionError> {
    let invalid = || bad(arg, &format!("Invalid floating point value '{v}'"));
    let body = v.strip_prefix(['+', '-']).unwrap_or(v);
    let (int, frac) = match body.split_once('.') {
        Some((i, f)) => (i, f),
        None => (body, ""),
    };
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int.len() + frac.len() == 0 || !all_digits(int) || !all_digits(frac) {
        return Err(invalid());
    }
    v.parse::<f64>().map_err(|_| invalid())
}

impl Options {
    /// Takes the core options Massif's banner and stacks depend on, as the core parsed them.
    pub fn apply_core(&mut self, core: &oxgrind_tool::CoreView) {
        self.quiet = !core.talks();
        self.log_to_file = core.log_to_file;
        self.show_below_main = core.show_below_main;
    }

    /// Takes one option; `Ok(false)` when it is not Massif's (Valgrind then tries the
    /// malloc-replacement options, then reports `Unknown option`).
    pub fn parse(&mut self, arg: &str) -> Result<bool, OptionError> {
        let Some((key, v)) = arg.split_once('=') else {
            return Ok(false);
        };
        match key {
            "--heap" => self.heap = parse_bool(arg, v)?,
            "--heap-admin" => self.heap_admin = parse_bint(arg, key, v, 0, 1024)? as u64,
            "--stacks" => self.stacks = parse_bool(arg, v)?,
            "--pages-as-heap" => self.pages_as_heap = parse_bool(arg, v)?,
            "--depth" => self.depth = parse_bint(arg, key, v, 1, MAX_DEPTH as i64)? as usize,
            "--alloc-fn" => self.alloc_fns.push(v.to_string()),
            "--ignore-fn" => self.ignore_fns.push(v.to_string()),
            "--threshold" => {
                let t = parse_double(arg, v)?;
                if !(0.0..=100.0).contains(&t) {
                    return Err(bad(arg, "--threshold must be between 0.0 and 100.0"));
                }
                self.threshold = t;
            }
            "--peak-inaccuracy" => self.peak_inaccuracy = parse_double(arg, v)?,
            "--time-unit" => {
                self.time_unit = match v {
                    "i" => TimeUnit::Instructions,
                    "ms" => TimeUnit::Ms,
                    "B" => TimeUnit::Bytes,
                    // VG_XACT_CLO: anything else is not an option Massif knows.
                    _ => return Ok(false),
                };
                self.time_unit_given = true;
            }
            "--detailed-freq" => self.detailed_freq = parse_bint(arg, key, v, 1, 1_000_000)? as u32,
            "--max-snapshots" => self.max_snapshots = parse_bint(arg, key, v, 10, 1000)? as usize,
            "--massif-out-file" => self.out_file = v.to_string(),
            // Core options, not Massif's: the core validates and consumes them. Valgrind
            // lists the malloc-replacement ones on Massif's `desc:` line.
            "--alignment" => {
                self.alignment = v.parse().unwrap_or(16).max(16);
                self.desc_args.push(arg.to_string());
                return Ok(false);
            }
            "--redzone-size" | "--xtree-memory" | "--xtree-memory-file" => {
                self.desc_args.push(arg.to_string());
                return Ok(false);
            }
            _ => return Ok(false),
        }
        self.desc_args.push(arg.to_string());
        Ok(true)
    }

    /// Checks that hold between options, once all are parsed (Valgrind's post_clo_init),
    /// and applies the implied settings.
    pub fn check(&mut self) -> Result<(), OptionError> {
        if self.pages_as_heap && self.stacks {
            return Err(bad(
                "--pages-as-heap=yes",
                "Cannot be used together with --stacks=yes",
            ));
        }
        if !self.heap {
            self.pages_as_heap = false;
        }
        if self.pages_as_heap {
            // No heap admin on pages.
            self.heap_admin = 0;
        }
        Ok(())
    }

    /// The `desc:` text: every option given to Massif, in order, or `(none)`.
    pub fn desc(&self) -> String {
        if self.desc_args.is_empty() {
            String::from("(none)")
        } else {
            self.desc_args.join(" ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(arg: &str) -> String {
        Options::default().parse(arg).unwrap_err().0
    }

    #[test]
    fn out_of_range_integers_use_valgrinds_wording() {
        assert_eq!(
            err("--depth=0"),
            "Bad option: --depth=0\n'--depth' argument must be between 1 and 200"
        );
        assert_eq!(
            err("--heap-admin=1025"),
            "Bad option: --heap-admin=1025\n'--heap-admin' argument must be between 0 and 1024"
        );
        assert_eq!(
            err("--max-snapshots=9"),
            "Bad option: --max-snapshots=9\n'--max-snapshots' argument must be between 10 and 1000"
        );
        assert_eq!(
            err("--detailed-freq=0"),
            "Bad option: --detailed-freq=0\n'--detailed-freq' argument must be between 1 and 1000000"
        );
    }

    #[test]
    fn malformed_values_are_rejected_not_truncated() {
        assert_eq!(
            err("--depth=5x"),
            "Bad option: --depth=5x\nInvalid integer value '5x'"
        );
        assert_eq!(
            err("--depth="),
            "Bad option: --depth=\nInvalid integer value ''"
        );
        assert_eq!(
            err("--heap=maybe"),
            "Bad option: --heap=maybe\nInvalid boolean value 'maybe' (should be 'yes' or 'no')"
        );
        assert_eq!(
            err("--threshold=1.5x"),
            "Bad option: --threshold=1.5x\nInvalid floating point value '1.5x'"
        );
        assert_eq!(
            err("--peak-inaccuracy=1e3"),
            "Bad option: --peak-inaccuracy=1e3\nInvalid floating point value '1e3'"
        );
        assert_eq!(
            err("--threshold=-1"),
            "Bad option: --threshold=-1\n--threshold must be between 0.0 and 100.0"
        );
    }

    #[test]
    fn desc_lists_massif_options_verbatim_in_order() {
        let mut o = Options::default();
        assert_eq!(o.desc(), "(none)");
        for a in [
            "--depth=3",
            "--alloc-fn=my_alloc",
            "--threshold=10.0",
            "--time-unit=B",
        ] {
            assert!(o.parse(a).unwrap());
        }
        assert!(!o.parse("--num-callers=4").unwrap());
        assert!(
            !o.parse("--time-unit=x").unwrap(),
            "unknown unit is an unknown option"
        );
        assert_eq!(
            o.desc(),
            "--depth=3 --alloc-fn=my_alloc --threshold=10.0 --time-unit=B"
        );
        assert_eq!(o.depth, 3);
        assert_eq!(o.alloc_fns, ["my_alloc"]);
        assert_eq!(o.threshold, 10.0);
        assert_eq!(o.time_unit, TimeUnit::Bytes);
    }

    #[test]
    fn malloc_replacement_options_are_listed_in_desc_but_left_to_the_core() {
        let mut o = Options::default();
        assert!(!o.parse("--alignment=64").unwrap());
        assert!(o.parse("--heap-admin=0").unwrap());
        assert!(!o.parse("--show-below-main=yes").unwrap());
        assert_eq!(o.desc(), "--alignment=64 --heap-admin=0");
        // Core options reach Massif parsed, through the core's view.
        o.apply_core(&oxgrind_tool::CoreView::from_options(&["--show-below-main=yes"]).unwrap());
        assert!(o.show_below_main);
    }

    #[test]
    fn negative_peak_inaccuracy_is_accepted_as_valgrind_does() {
        let mut o = Options::default();
        assert!(o.parse("--peak-inaccuracy=-5").unwrap());
        assert_eq!(o.peak_inaccuracy, -5.0);
    }

    #[test]
    fn instructions_are_accepted_explicitly() {
        let mut o = Options::default();
        o.check().unwrap();
        assert_eq!(o.time_unit, DEFAULT_TIME_UNIT);
        assert_eq!(o.desc(), "(none)", "the default is not on the desc: line");
        let mut o = Options::default();
        o.parse("--time-unit=B").unwrap();
        o.parse("--time-unit=i").unwrap();
        o.check().unwrap();
        assert_eq!(o.time_unit, TimeUnit::Instructions);
        assert_eq!(o.desc(), "--time-unit=B --time-unit=i");
    }

    #[test]
    fn stacks_are_refused_only_with_pages_as_heap() {
        let mut o = Options::default();
        o.parse("--stacks=yes").unwrap();
        o.check().unwrap();
        assert!(o.stacks);

        let mut o = Options::default();
        o.parse("--pages-as-heap=yes").unwrap();
        o.parse("--stacks=yes").unwrap();
        assert_eq!(
            o.check().unwrap_err().0,
            "Bad option: --pages-as-heap=yes\nCannot be used together with --stacks=yes"
        );
    }

    #[test]
    fn pages_as_heap_forces_heap_admin_to_zero() {
        let mut o = Options::default();
        o.parse("--heap-admin=100").unwrap();
        o.parse("--pages-as-heap=yes").unwrap();
        o.check().unwrap();
        assert_eq!(o.heap_admin, 0);
    }
}
