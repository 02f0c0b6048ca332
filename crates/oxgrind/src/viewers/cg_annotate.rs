//! `oxgrind cg_annotate [options] cachegrind-out-file [source-files...]`: Valgrind 3.19's
//! `cg_annotate`, byte for byte.
//!
//! The Perl script is the specification, quirks included: its own reader (costs keyed by
//! `file:function` and by file and line, `.` for "no value", malformed lines warned about
//! and skipped), column widths computed over every function even when few are printed,
//! percentages as `%5.2f` or `%5.1f`, the threshold rule that stops the function table at the
//! first function below every threshold, and source annotation with context markers,
//! `<bogus line N>` and the "more recent than input file" warning.
//!
//! The script walks Perl hashes, whose order changes from run to run: functions with equal
//! sort keys, the annotated files and the user-annotated list come out in random order there.
//! We print ties by name, which is one of the orders Perl may print.
//!
//! Deliberate differences, as for `oxgrind ms_print`: `-h`/`--help` prints the usage on stdout
//! and `--version` prints `cg_annotate-3.19.0`, both with success; problems the script reports
//! by dying (usage, unreadable file, bad events) are one `oxgrind: cg_annotate: ...` line and
//! exit status 1. Warnings (malformed lines) go to stderr in the script's words.

use anyhow::{anyhow, bail, Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};

const VERSION: &str = "3.19.0";
const DEFAULT_THRESHOLD: &str = "0.1";

fn usage() -> String {
    format!(
        "usage: cg_annotate [options] cachegrind-out-file [source-files...]

  options for the user, with defaults in [ ], are:
    -h --help             show this message
    --version             show version
    --show=A,B,C          only show figures for events A,B,C [all]
    --sort=A,B,C          sort columns by events A,B,C [event column order]
    --threshold=<0--20>   a function is shown if it accounts for more than x% of
                          the counts of the primary sort event [{DEFAULT_THRESHOLD}]
    --show-percs=yes|no   show a percentage for each non-zero count [yes]
    --auto=yes|no         annotate all source files containing functions
                          that helped reach the event count threshold [yes]
    --context=N           print N lines of context before and after
                          annotated lines [8]
    -I<d> --include=<d>   add <d> to list of directories to search for 
                          source files

  cg_annotate is Copyright (C) 2002-2017 Nicholas Nethercote.
  and licensed under the GNU General Public License, version 2.
  Bug reports, feedback, admiration, abuse, etc, to: njn@valgrind.org.
                                                
"
    )
}

/// A cost vector as the script holds it: one slot per event, `None` where no value was ever
/// given (printed as `.`). Shorter than the event list when the last events never had one.
type Cc = Vec<Option<i64>>;

/// `$a2 += $a1` slot by slot, skipping absent values.
fn add_into(from: &[Option<i64>], to: &mut Cc) {
    for (i, v) in from.iter().enumerate() {
        if let Some(v) = v {
            if to.len() <= i {
                to.resize(i + 1, None);
            }
            to[i] = Some(to[i].unwrap_or(0).wrapping_add(*v));
        }
    }
}

/// Perl's numeric value of a count token: its leading integer, 0 if none (`.` is handled
/// by the caller as "no value").
fn numify(tok: &str) -> i64 {
    let t = tok.trim_start();
    let (neg, digits) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    let v: i64 = digits[..end].parse().unwrap_or(0);
    if neg {
        -v
    } else {
        v
    }
}

/// The script's `commify`: commas in the leading `-?\d+` run of the text.
fn commify(text: &str) -> String {
    let sign = usize::from(text.starts_with('-'));
    let end = text[sign..]
        .find(|c: char| !c.is_ascii_digit())
        .map_or(text.len(), |e| e + sign);
    let digits = &text[sign..end];
    if digits.is_empty() {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + digits.len() / 3);
    out.push_str(&text[..sign]);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out.push_str(&text[end..]);
    out
}

/// What the command line asked for.
struct Args {
    show_events: Vec<String>,
    sort_events: Vec<String>,
    /// From `--sort=A:pct`: the thresholds as typed (empty: none given there).
    sort_thresholds: Vec<String>,
    single_threshold: String,
    show_percs: bool,
    auto: bool,
    context: i64,
    /// `""` first, then each `-I` directory with a trailing `/`.
    include_dirs: Vec<String>,
    input: String,
    user_files: Vec<String>,
}

enum Invocation {
    Help,
    Version,
    Run(Args),
}

fn parse_args(argv: &[String]) -> Result<Invocation> {
    let mut a = Args {
        show_events: vec![],
        sort_events: vec![],
        sort_thresholds: vec![],
        single_threshold: DEFAULT_THRESHOLD.into(),
        show_percs: true,
        auto: true,
        context: 8,
        include_dirs: vec![String::new()],
        input: String::new(),
        user_files: vec![],
    };
    let mut input = None;
    for arg in argv {
        if arg.starts_with('-') {
            if arg == "--version" {
                return Ok(Invocation::Version);
            } else if arg == "-h" || arg == "--help" {
                return Ok(Invocation::Help);
            } else if let Some(v) = arg.strip_prefix("--show=") {
                a.show_events = split_commas(v);
            } else if let Some(v) = arg.strip_prefix("--sort=") {
                a.sort_events = split_commas(v);
                let mut ths = Vec::new();
                let mut any = false;
                for ev in a.sort_events.iter_mut() {
                    // `A:pct` or `A:pct%`: the number after the last colon.
                    let th = ev.rsplit_once(':').and_then(|(_, t)| {
                        let t = t.strip_suffix('%').unwrap_or(t);
                        (!t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.'))
                            .then(|| t.to_string())
                    });
                    match th {
                        Some(t) => {
                            let v = perl_num(&t);
                            if !(0.0..=100.0).contains(&v) {
                                bail!("threshold out of range in `{arg}` (0 to 100)");
                            }
                            let cut = ev.find(':').unwrap_or(ev.len());
                            ev.truncate(cut);
                            ths.push(t);
                            any = true;
                        }
                        None => ths.push("0".into()),
                    }
                }
                a.sort_thresholds = if any { ths } else { vec![] };
            } else if let Some(v) = arg.strip_prefix("--threshold=") {
                let t = v.strip_suffix('%').unwrap_or(v);
                if t.is_empty() || !t.chars().all(|c| c.is_ascii_digit() || c == '.') {
                    bail!("bad option `{arg}`");
                }
                if !(0.0..=20.0).contains(&perl_num(t)) {
                    bail!("value out of range in `{arg}` (0 to 20)");
                }
                a.single_threshold = t.to_string();
            } else if arg == "--show-percs=yes" {
                a.show_percs = true;
            } else if arg == "--show-percs=no" {
                a.show_percs = false;
            } else if arg == "--auto=yes" {
                a.auto = true;
            } else if arg == "--auto=no" {
                a.auto = false;
            } else if let Some(v) = arg.strip_prefix("--context=") {
                a.context = v
                    .parse::<i64>()
                    .map_err(|_| anyhow!("bad option `{arg}` (a whole number of lines)"))?;
            } else if arg == "-I" {
                bail!("Sorry, no space is allowed after a -I flag");
            } else if let Some(dir) = arg
                .strip_prefix("-I=")
                .or_else(|| arg.strip_prefix("-I"))
                .or_else(|| arg.strip_prefix("--include="))
            {
                let dir = dir.strip_suffix('/').unwrap_or(dir);
                a.include_dirs.push(format!("{dir}/"));
            } else {
                bail!("unknown option `{arg}`");
            }
        } else if input.is_none() {
            input = Some(arg.clone());
        } else {
            let readable = a
                .include_dirs
                .iter()
                .any(|d| std::fs::File::open(format!("{d}{arg}")).is_ok());
            if !readable {
                bail!(
                    "File {arg} not found in any of: {}",
                    a.include_dirs.join(" ")
                );
            }
            if !a.user_files.contains(arg) {
                a.user_files.push(arg.clone());
            }
        }
    }
    a.input = input.ok_or_else(|| anyhow!("no cachegrind-out-file given"))?;
    Ok(Invocation::Run(a))
}

fn split_commas(v: &str) -> Vec<String> {
    // Perl's split drops trailing empty fields.
    let mut parts: Vec<String> = v.split(',').map(str::to_string).collect();
    while parts.last().is_some_and(|p| p.is_empty()) {
        parts.pop();
    }
    parts
}

/// Perl's numeric value of a string such as `0.1` or `5.` (leading number, 0 if none).
fn perl_num(s: &str) -> f64 {
    let t = s.trim_start();
    let mut end = 0;
    let mut dot = false;
    for (i, c) in t.char_indices() {
        if c.is_ascii_digit() || (c == '.' && !dot) {
            dot |= c == '.';
            end = i + 1;
        } else {
            break;
        }
    }
    t[..end].parse().unwrap_or(0.0)
}

/// Everything read from the data file.
struct Data {
    desc: String,
    cmd: String,
    events: Vec<String>,
    summary: Vec<String>,
    fn_totals: HashMap<String, Cc>,
    /// file -> line -> costs (only files that may be annotated).
    all_ccs: HashMap<String, BTreeMap<i64, Cc>>,
}

/// Reads lines as Perl's `<FH>` does: each with its `\n`, the last one possibly without.
fn perl_lines(bytes: &[u8]) -> Vec<String> {
    bytes
        .split_inclusive(|&b| b == b'\n')
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect()
}

fn strip_nl(s: &str) -> &str {
    s.strip_suffix('\n').unwrap_or(s)
}

/// `s/^KEY\s+//`: the text after `key` and at least one whitespace character.
fn after_key<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(key)?;
    let trimmed = rest.trim_start_matches(|c: char| c.is_ascii_whitespace());
    (trimmed.len() < rest.len()).then_some(trimmed)
}

fn read_data(path: &str, args: &Args, warn: &mut dyn Write) -> Result<Data> {
    let bytes = std::fs::read(path).with_context(|| format!("Cannot open {path} for reading"))?;
    let lines = perl_lines(&bytes);
    let mut it = lines.iter().enumerate().map(|(i, l)| (i + 1, l.as_str()));
    let mut desc = String::new();
    let mut dot = 0;
    let mut line = None;
    for (n, l) in it.by_ref() {
        dot = n;
        // `s/desc:\s+//`, unanchored: the first `desc:` followed by whitespace.
        let found = l.match_indices("desc:").find_map(|(i, _)| {
            after_key(&l[i..], "desc:").map(|rest| format!("{}{}", &l[..i], rest))
        });
        match found {
            Some(text) => desc.push_str(&text),
            None => {
                line = Some(l);
                break;
            }
        }
    }
    let cmd = line
        .and_then(|l| after_key(l, "cmd:"))
        .ok_or_else(|| anyhow!("Line {dot}: missing command line"))?;
    let cmd = strip_nl(cmd).to_string();
    let (n, l) = it.next().unwrap_or((dot, ""));
    dot = n;
    let events: Vec<String> = after_key(l, "events:")
        .ok_or_else(|| anyhow!("Line {dot}: missing events line"))?
        .split_ascii_whitespace()
        .map(str::to_string)
        .collect();
    let mut data = Data {
        desc,
        cmd,
        events,
        summary: vec![],
        fn_totals: HashMap::new(),
        all_ccs: HashMap::new(),
    };
    let nev = data.events.len();
    let mut cur_file: Option<String> = None;
    let mut cur_fn: Option<String> = None;
    // Cost lines before any `fl=` go to a table nobody reads, as in the script.
    let mut orphan_lines: BTreeMap<i64, Cc> = BTreeMap::new();
    let mut summary = None;
    for (n, l) in it {
        let body = strip_nl(l);
        if body
            .trim_matches(|c: char| c.is_ascii_whitespace())
            .is_empty()
            || l.starts_with('#')
        {
            continue;
        }
        let digits_end = {
            let s = usize::from(l.starts_with('-'));
            let d = l[s..]
                .find(|c: char| !c.is_ascii_digit())
                .map_or(l.len(), |e| e + s);
            if d > s {
                Some(d)
            } else {
                None
            }
        };
        let cost = digits_end.and_then(|d| {
            let rest = &l[d..];
            let t = rest.trim_start_matches(|c: char| c.is_ascii_whitespace());
            (t.len() < rest.len()).then(|| (&l[..d], t))
        });
        if let Some((num, rest)) = cost {
            let toks: Vec<&str> = rest.split_ascii_whitespace().collect();
            if toks.len() > nev {
                bail!("Line {n}: too many event counts");
            }
            let cc: Vec<Option<i64>> = toks
                .iter()
                .map(|t| if *t == "." { None } else { Some(numify(t)) })
                .collect();
            let key = cur_fn
                .clone()
                .ok_or_else(|| anyhow!("Line {n}: cost line before any fn= line"))?;
            add_into(&cc, data.fn_totals.entry(key).or_default());
            let annotate = args.auto
                || cur_file
                    .as_ref()
                    .is_some_and(|f| args.user_files.contains(f));
            if annotate {
                let table = match &cur_file {
                    Some(f) => data.all_ccs.entry(f.clone()).or_default(),
                    None => &mut orphan_lines,
                };
                add_into(&cc, table.entry(numify(num)).or_default());
            }
        } else if let Some(name) = body.strip_prefix("fn=") {
            cur_fn = Some(format!("{}:{name}", cur_file.as_deref().unwrap_or("")));
            data.fn_totals.entry(cur_fn.clone().unwrap()).or_default();
        } else if let Some(name) = body.strip_prefix("fl=") {
            cur_file = Some(name.to_string());
            data.all_ccs.entry(name.to_string()).or_default();
        } else if let Some(rest) = after_key(l, "summary:") {
            let toks: Vec<String> = rest.split_ascii_whitespace().map(str::to_string).collect();
            if toks.len() > nev {
                bail!("Line {n}: too many event counts");
            }
            if toks.len() != nev {
                bail!("Line {n}: summary event and total event mismatch");
            }
            summary = Some(toks);
        } else {
            writeln!(warn, "WARNING: line {n} malformed, ignoring")?;
        }
    }
    data.summary = summary.ok_or_else(|| anyhow!("missing final summary line, aborting"))?;
    Ok(data)
}

/// The column layout and the numbers percentages are taken of.
struct Printer<'a> {
    events: &'a [String],
    show_order: Vec<usize>,
    summary: Vec<i64>,
    show_percs: bool,
}

impl Printer<'_> {
    /// Column widths: at least the event name, else the widest commified count (+9 for the
    /// percentage), over every vector given.
    fn widths<'c>(&self, ccs: impl IntoIterator<Item = &'c Cc>) -> Vec<usize> {
        let mut w: Vec<usize> = self.events.iter().map(String::len).collect();
        for cc in ccs {
            for (i, v) in cc.iter().enumerate() {
                if let Some(v) = v {
                    self.widen(&mut w, i, &v.to_string());
                }
            }
        }
        w
    }

    fn widen(&self, w: &mut Vec<usize>, i: usize, text: &str) {
        let len = text.len();
        let mut width = len + (len.saturating_sub(1)) / 3;
        if self.show_percs {
            width += 9;
        }
        if w.len() <= i {
            w.resize(i + 1, 0);
        }
        w[i] = w[i].max(width);
    }

    fn events_row(&self, w: &[usize], out: &mut String) {
        for &i in &self.show_order {
            let e = &self.events[i];
            out.push_str(e);
            out.push_str(&" ".repeat(w[i].saturating_sub(e.len())));
            out.push(' ');
        }
    }

    /// One row of counts; `texts` gives each slot's printed number (the raw token for the
    /// summary, the sum otherwise).
    fn cc_row(&self, cc: &[Option<(i64, String)>], w: &[usize], out: &mut String) {
        for &i in &self.show_order {
            let slot = cc.get(i).and_then(|s| s.as_ref());
            let mut text = slot.map_or_else(|| ".".to_string(), |(_, t)| commify(t));
            if self.show_percs {
                match slot {
                    Some((v, _)) if *v != 0 => {
                        let total = self.summary.get(i).copied().unwrap_or(0);
                        let perc = if total == 0 {
                            0.0
                        } else {
                            (*v as f64 * 100.0) / total as f64
                        };
                        if -9.995 < perc && perc < 99.995 {
                            text.push_str(&format!(" ({perc:5.2}%)"));
                        } else {
                            text.push_str(&format!(" ({perc:5.1}%)"));
                        }
                    }
                    _ => text.push_str("         "),
                }
            }
            let width = w.get(i).copied().unwrap_or(0);
            out.push_str(&" ".repeat(width.saturating_sub(text.len())));
            out.push_str(&text);
            out.push(' ');
        }
    }

    fn cc(&self, cc: &Cc, w: &[usize], out: &mut String) {
        let slots: Vec<Option<(i64, String)>> =
            cc.iter().map(|v| v.map(|v| (v, v.to_string()))).collect();
        self.cc_row(&slots, w, out);
    }
}

const FANCY: &str =
    "--------------------------------------------------------------------------------\n";

/// Renders the whole report for `args` into `out`; warnings about the data file go to `warn`.
fn render(args: &Args, out: &mut String, warn: &mut dyn Write) -> Result<()> {
    let data = read_data(&args.input, args, warn)?;
    let index: HashMap<&str, usize> = data
        .events
        .iter()
        .enumerate()
        .map(|(i, e)| (e.as_str(), i))
        .collect();
    let show_events = if args.show_events.is_empty() {
        data.events.clone()
    } else {
        args.show_events.clone()
    };
    let mut show_order = vec![];
    for e in &show_events {
        let i = index
            .get(e.as_str())
            .ok_or_else(|| anyhow!("--show event `{e}' did not appear in input"))?;
        show_order.push(*i);
    }
    let sort_events = if args.sort_events.is_empty() {
        data.events.clone()
    } else {
        args.sort_events.clone()
    };
    let mut sort_order = vec![];
    for e in &sort_events {
        let i = index
            .get(e.as_str())
            .ok_or_else(|| anyhow!("--sort event `{e}' did not appear in input"))?;
        sort_order.push(*i);
    }
    let thresholds: Vec<String> = if args.sort_thresholds.is_empty() {
        let mut t = vec!["100".to_string(); sort_order.len()];
        if let Some(first) = t.first_mut() {
            *first = args.single_threshold.clone();
        }
        t
    } else {
        args.sort_thresholds.clone()
    };
    if thresholds.len() != sort_order.len() {
        bail!("sort_order length != thresholds length");
    }
    let p = Printer {
        events: &data.events,
        show_order,
        summary: data.summary.iter().map(|t| numify(t)).collect(),
        show_percs: args.show_percs,
    };

    // Options.
    out.push_str(FANCY);
    out.push_str(&data.desc);
    out.push_str(&format!("Command:          {}\n", data.cmd));
    out.push_str(&format!("Data file:        {}\n", args.input));
    out.push_str(&format!("Events recorded:  {}\n", data.events.join(" ")));
    out.push_str(&format!("Events shown:     {}\n", show_events.join(" ")));
    out.push_str(&format!("Event sort order: {}\n", sort_events.join(" ")));
    out.push_str(&format!("Thresholds:       {}\n", thresholds.join(" ")));
    let mut dirs: Vec<&str> = args.include_dirs[1..].iter().map(String::as_str).collect();
    if dirs.is_empty() {
        dirs.push("");
    }
    out.push_str(&format!("Include dirs:     {}\n", dirs[0]));
    for d in &dirs[1..] {
        out.push_str(&format!("                  {d}\n"));
    }
    let mut users: Vec<&str> = args.user_files.iter().map(String::as_str).collect();
    users.sort();
    if users.is_empty() {
        users.push("");
    }
    out.push_str(&format!("User annotated:   {}\n", users[0]));
    for u in &users[1..] {
        out.push_str(&format!("                  {u}\n"));
    }
    out.push_str(&format!(
        "Auto-annotation:  {}\n\n",
        if args.auto { "on" } else { "off" }
    ));

    // Program totals.
    let summary_slots: Vec<Option<(i64, String)>> = data
        .summary
        .iter()
        .map(|t| Some((numify(t), t.clone())))
        .collect();
    let mut sw: Vec<usize> = data.events.iter().map(String::len).collect();
    for (i, t) in data.summary.iter().enumerate() {
        p.widen(&mut sw, i, t);
    }
    out.push_str(FANCY);
    p.events_row(&sw, out);
    out.push('\n');
    out.push_str(FANCY);
    p.cc_row(&summary_slots, &sw, out);
    out.push_str(" PROGRAM TOTALS\n\n");

    // Functions.
    let fw = p.widths(data.fn_totals.values());
    out.push_str(FANCY);
    p.events_row(&fw, out);
    out.push_str(" file:function\n");
    out.push_str(FANCY);
    let key = |cc: &Cc, i: usize| cc.get(i).copied().flatten().unwrap_or(-1).unsigned_abs();
    let mut names: Vec<&String> = data.fn_totals.keys().collect();
    names.sort_by(|a, b| {
        let (ca, cb) = (&data.fn_totals[*a], &data.fn_totals[*b]);
        for &i in &sort_order {
            let o = key(cb, i).cmp(&key(ca, i));
            if o.is_ne() {
                return o;
            }
        }
        a.cmp(b)
    });
    let mut threshold_files: Vec<String> = vec![];
    for name in names {
        let cc = &data.fn_totals[name];
        let exceeded = thresholds.iter().enumerate().any(|(k, th)| {
            let i = sort_order[k];
            let v = cc.get(i).copied().flatten().unwrap_or(0).unsigned_abs() as f64 * 100.0;
            let total = p.summary.get(i).copied().unwrap_or(0).unsigned_abs() as f64;
            let prop = if total == 0.0 { 0.0 } else { v / total };
            prop >= perl_num(th)
        });
        if !exceeded {
            break;
        }
        p.cc(cc, &fw, out);
        out.push_str(&format!(" {name}\n"));
        // `s/:.+$//`: cut at the first colon that has something after it.
        let file = match name
            .char_indices()
            .find(|&(i, c)| c == ':' && i + 1 < name.len())
        {
            Some((i, _)) => name[..i].to_string(),
            None => name.clone(),
        };
        if !threshold_files.contains(&file) {
            threshold_files.push(file);
        }
    }
    out.push('\n');

    annotate(args, &data, &p, threshold_files, out)
}

fn annotate(
    args: &Args,
    data: &Data,
    p: &Printer,
    threshold_files: Vec<String>,
    out: &mut String,
) -> Result<()> {
    let mut files: Vec<String> = args.user_files.clone();
    if args.auto {
        for f in threshold_files {
            if f != "???" && !files.contains(&f) {
                files.push(f);
            }
        }
    }
    files.sort();
    let mut unfound = vec![];
    let mut printed_totals: Cc = vec![];
    let mut did_annotations = false;
    let input_mtime = mtime_secs(&args.input);
    for src in &files {
        let mut opened = None;
        for dir in &args.include_dirs {
            let try_name = format!("{dir}{src}");
            if let Ok(f) = std::fs::File::open(&try_name) {
                let full = if dir.is_empty() {
                    src.clone()
                } else {
                    format!("{dir} + {src}")
                };
                opened = Some((f, try_name, full));
                break;
            }
        }
        let Some((file, opened_name, full_name)) = opened else {
            if args.user_files.contains(src) {
                bail!(
                    "File {src} not opened in any of: {}",
                    args.include_dirs.join(" ")
                );
            }
            unfound.push(src.clone());
            continue;
        };
        out.push_str(FANCY);
        let kind = if args.user_files.contains(src) {
            "User"
        } else {
            "Auto"
        };
        out.push_str(&format!("-- {kind}-annotated source: {full_name}\n"));
        out.push_str(FANCY);
        let Some(ccs) = data.all_ccs.get(src) else {
            out.push_str(&format!(
                "  No information has been collected for {src}\n\n"
            ));
            continue;
        };
        did_annotations = true;
        let mut line_nums: Vec<i64> = ccs.keys().copied().collect();
        let more_recent = mtime_secs(&opened_name) > input_mtime;
        if more_recent {
            out.push_str(&format!(
                "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@@ WARNING @@ WARNING @@ WARNING @@ WARNING @@ WARNING @@ WARNING @@ WARNING @@
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@ Source file '{src}' is more recent than input file '{}'.
@ Annotations may not be correct.
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@

",
                args.input
            ));
        }
        let w = p.widths(ccs.values());
        p.events_row(&w, out);
        out.push_str("\n\n");
        // The script drops line 0 when it sorts first (its counts are listed at the end).
        if line_nums.first() == Some(&0) {
            line_nums.remove(0);
        }
        let ctx = args.context;
        let n = line_nums.len();
        let mut pairs = vec![];
        let mut i = 0;
        while i < n {
            pairs.push(line_nums[i] - ctx);
            while i + 1 < n && line_nums[i] + 2 * ctx >= line_nums[i + 1] {
                i += 1;
            }
            pairs.push(line_nums[i] + ctx);
            i += 1;
        }
        let mut reader = PerlReader::new(file);
        let mut pending: std::collections::VecDeque<i64> = line_nums.into_iter().collect();
        if !pairs.is_empty() {
            if pairs[0] < 1 {
                pairs[0] = 1;
            }
            for pair in pairs.chunks(2) {
                let (low, high) = (pair[0], pair[1]);
                while reader.dot < low - 1 {
                    if reader.next_line().is_none() {
                        break;
                    }
                }
                if low != 1 {
                    out.push_str(&format!("-- line {low} {}\n", "-".repeat(40)));
                }
                let mut last: Option<String> = None;
                while reader.dot < high {
                    last = reader.next_line();
                    let Some(src_line) = last.as_deref().filter(|l| perl_true(l)) else {
                        break;
                    };
                    if pending.front() == Some(&reader.dot) {
                        let cc = &ccs[&reader.dot];
                        p.cc(cc, &w, out);
                        add_into(cc, &mut printed_totals);
                        pending.pop_front();
                    } else {
                        p.cc(&vec![], &w, out);
                    }
                    out.push(' ');
                    out.push_str(src_line);
                }
                if last.as_deref().is_some_and(perl_true) {
                    out.push_str(&format!("-- line {high} {}\n", "-".repeat(40)));
                } else {
                    break;
                }
            }
        }
        if !pending.is_empty() {
            for l in &pending {
                p.cc(&ccs[l], &w, out);
                out.push_str(&format!(" <bogus line {l}>\n"));
            }
            out.push('\n');
            let cause = if more_recent {
                format!(
                    "@@ cause:    '{src}' has changed since information was gathered.
@@           If so, a warning will have already been issued about this.
@@ solution: Recompile program and rerun under \"valgrind --cachesim=yes\" to 
@@           gather new information.
"
                )
            } else if src.ends_with(".h") {
                "@@ cause:    bug in the Valgrind's debug info reader that screws up with .h
@@           files sometimes
@@ solution: none, sorry
"
                .to_string()
            } else {
                "@@ cause:    not sure, sorry\n".to_string()
            };
            out.push_str(&format!(
                "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@@ WARNING @@ WARNING @@ WARNING @@ WARNING @@ WARNING @@ WARNING @@ WARNING @@
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@@
@@ Information recorded about lines past the end of '{src}'.
@@
@@ Probable cause and solution:
{cause}@@
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
"
            ));
        }
        out.push('\n');
        if let Some(cc) = ccs.get(&0) {
            p.cc(cc, &w, out);
            out.push_str(&format!(" <counts for unidentified lines in {src}>\n\n"));
        }
    }
    if !unfound.is_empty() {
        unfound.sort();
        out.push_str(FANCY);
        out.push_str("The following files chosen for auto-annotation could not be found:\n");
        out.push_str(FANCY);
        for f in &unfound {
            out.push_str(&format!("  {f}\n"));
        }
        out.push('\n');
    }
    if did_annotations {
        let w = p.widths([&printed_totals]);
        out.push_str(FANCY);
        p.events_row(&w, out);
        out.push('\n');
        out.push_str(FANCY);
        p.cc(&printed_totals, &w, out);
        out.push_str(" events annotated\n\n");
    }
    Ok(())
}

/// Perl's truth of a line just read: everything but `""` and `"0"`.
fn perl_true(s: &str) -> bool {
    !s.is_empty() && s != "0"
}

fn mtime_secs(path: &str) -> i64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map_or(0, |m| m.mtime())
}

/// A source file read line by line, counting lines as Perl's `$.` does (not past the end).
struct PerlReader {
    inner: std::io::BufReader<std::fs::File>,
    dot: i64,
}

impl PerlReader {
    fn new(f: std::fs::File) -> Self {
        PerlReader {
            inner: std::io::BufReader::new(f),
            dot: 0,
        }
    }

    fn next_line(&mut self) -> Option<String> {
        let mut buf = Vec::new();
        match self.inner.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => None,
            Ok(_) => {
                self.dot += 1;
                Some(String::from_utf8_lossy(&buf).into_owned())
            }
        }
    }
}

/// Runs cg_annotate with `args` (the arguments after `cg_annotate`), printing to stdout.
pub fn main(args: &[String]) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    run(args, &mut out, &mut std::io::stderr())
}

/// [`main`] with the report going to `out` and warnings to `warn`.
pub fn run(args: &[String], out: &mut dyn Write, warn: &mut dyn Write) -> Result<()> {
    let inv = parse_args(args).map_err(|e| {
        anyhow!("cg_annotate: {e} (usage: oxgrind cg_annotate [options] cachegrind-out-file [source-files...])")
    })?;
    match inv {
        Invocation::Help => emit(out, usage().as_bytes()),
        Invocation::Version => emit(out, format!("cg_annotate-{VERSION}\n").as_bytes()),
        Invocation::Run(a) => {
            let mut text = String::new();
            let result = render(&a, &mut text, warn);
            // What the script printed before dying is printed too.
            emit(out, text.as_bytes())?;
            result.map_err(|e| anyhow!("cg_annotate: {e:#}"))
        }
    }
}

fn emit(out: &mut dyn Write, bytes: &[u8]) -> Result<()> {
    out.write_all(bytes)?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{commify, numify};

    #[test]
    fn commify_works_on_the_leading_number_only() {
        assert_eq!(commify("500089"), "500,089");
        assert_eq!(commify("-1234"), "-1,234");
        assert_eq!(commify("12"), "12");
        assert_eq!(commify("1234x5678"), "1,234x5678");
        assert_eq!(commify("."), ".");
    }

    #[test]
    fn numify_reads_the_leading_integer() {
        assert_eq!(numify("42"), 42);
        assert_eq!(numify("-7"), -7);
        assert_eq!(numify("abc"), 0);
        assert_eq!(numify("12abc"), 12);
    }
}
