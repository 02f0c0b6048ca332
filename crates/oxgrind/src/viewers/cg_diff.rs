//! `oxgrind cg_diff FILE1 FILE2`: Valgrind 3.19's `cg_diff`, byte for byte.
//!
//! The Perl script reads both files loosely (`desc:` lines, `cmd:`, `events:`, then cost
//! lines, `fl=`, `fn=`, `summary:`; comments and blank lines skipped, anything else a
//! warning on stderr), sums each file's costs per (file, function), the line numbers
//! dropped, subtracts the first file's sums from the second's, and prints one file: the two
//! names as `desc:`, both commands as `cmd:`, the events, then each (file, function) with
//! one cost line at line 0, and the difference of the summaries.
//!
//! Where the script walks a hash (the order of the functions) its order is random from run
//! to run; ours is by name. `--mod-filename`/`--mod-funcname` take Perl expressions that
//! the script `eval`s: not supported (refused). Counts are integers (the script's numbers
//! are Perl's: `1e3` would be 1000 there, 1 here). `-h`/`--help` and `--version` print on
//! stdout with success; errors are one `oxgrind: cg_diff: ...` line and exit status 1 (the
//! script dies with status 255).

use anyhow::{anyhow, bail, Result};
use std::collections::BTreeMap;
use std::io::Write;

const VERSION: &str = "3.19.0";

const USAGE: &str = "usage: cg_diff [options] <cachegrind-out-file1> <cachegrind-out-file2>

  options for the user, with defaults in [ ], are:
    -h --help             show this message
    -v --version          show version
    --mod-filename=<expr> a Perl search-and-replace expression that is applied
                          to filenames, eg. --mod-filename='s/prog[0-9]/projN/'
    --mod-funcname=<expr> like --mod-filename, but applied to function names

  cg_diff is Copyright (C) 2002-2017 Nicholas Nethercote.
  and licensed under the GNU General Public License, version 2.
  Bug reports, feedback, admiration, abuse, etc, to: njn@valgrind.org.
                                                
";

/// A cost array as the script holds it: a hole (`undef`) prints as nothing.
type Cc = Vec<Option<i64>>;

/// A count field as Perl's numeric conversion reads it (warnings off): an optional sign and
/// the leading digits; anything else is 0. `.` (Valgrind's "no count") is 0 too.
fn num(s: &[u8]) -> i64 {
    let (neg, digits) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let n = digits
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .fold(0i64, |a, d| {
            a.wrapping_mul(10).wrapping_add((d - b'0') as i64)
        });
    if neg {
        -n
    } else {
        n
    }
}

/// Perl's `split /\s+/` of a line: a leading empty field if it starts with white space, no
/// trailing empty fields.
fn split_ws(s: &[u8]) -> Vec<&[u8]> {
    let mut v: Vec<&[u8]> = s.split(|c| c.is_ascii_whitespace()).collect();
    // Runs of white space make empty fields inside: `\s+` takes them as one separator.
    let lead = v.first().is_some_and(|f| f.is_empty()) && !s.is_empty();
    v.retain(|f| !f.is_empty());
    if lead && !v.is_empty() {
        v.insert(0, b"");
    }
    v
}

/// `add_array_a_to_b`: `b[i] += a[i]` where `a[i]` is defined and not `.`.
fn add(a: &[&[u8]], b: &mut Cc) {
    for (i, f) in a.iter().enumerate() {
        if *f == b"." {
            continue;
        }
        if b.len() <= i {
            b.resize(i + 1, None);
        }
        b[i] = Some(b[i].unwrap_or(0).wrapping_add(num(f)));
    }
}

/// `sub_array_b_from_a`: `a[i] -= b[i]` over the longer of the two (holes are 0).
fn sub(a: &mut Cc, b: &Cc) {
    let n = a.len().max(b.len());
    a.resize(n, None);
    for (i, x) in a.iter_mut().enumerate() {
        let y = b.get(i).copied().flatten().unwrap_or(0);
        *x = Some(x.unwrap_or(0).wrapping_sub(y));
    }
}

struct Profile {
    cmd: Vec<u8>,
    events: Vec<Vec<u8>>,
    /// "file###function" -> costs.
    ccs: BTreeMap<Vec<u8>, Cc>,
    summary: Cc,
}

/// `s/^PREFIX\s+//`: what follows the prefix and its white space, if the line has both.
fn strip_ws_prefix<'a>(line: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    let rest = line.strip_prefix(prefix)?;
    let ws = rest.iter().take_while(|c| c.is_ascii_whitespace()).count();
    (ws > 0).then(|| &rest[ws..])
}

fn read(name: &str, log: &mut dyn Write) -> Result<Profile> {
    let bytes =
        std::fs::read(name).map_err(|_| anyhow!("cg_diff: Cannot open {name} for reading"))?;
    // Perl's lines keep their newline; the last may have none.
    let mut lines = bytes
        .split_inclusive(|&b| b == b'\n')
        .enumerate()
        .map(|(i, l)| (i + 1, l));
    let mut n = 0;
    let mut line: Option<&[u8]> = None;
    // `desc:` lines (`s/desc:\s+//` matches anywhere in the line).
    for (i, l) in lines.by_ref() {
        n = i;
        let desc = l
            .windows(5)
            .position(|w| w == b"desc:")
            .filter(|&p| l.get(p + 5).is_some_and(|c| c.is_ascii_whitespace()));
        if desc.is_none() {
            line = Some(l);
            break;
        }
    }
    let cmd = line
        .and_then(|l| strip_ws_prefix(l, b"cmd:"))
        .ok_or_else(|| anyhow!("cg_diff: Line {n}: missing command line"))?;
    let cmd = cmd.strip_suffix(b"\n").unwrap_or(cmd).to_vec();
    let events = match lines.next() {
        Some((i, l)) => {
            n = i;
            strip_ws_prefix(l, b"events:")
        }
        None => None,
    }
    .ok_or_else(|| anyhow!("cg_diff: Line {n}: missing events line"))?;
    let events: Vec<Vec<u8>> = split_ws(events).iter().map(|e| e.to_vec()).collect();
    let n_events = events.len();
    let mut file: Option<Vec<u8>> = None;
    let mut current: Option<Vec<u8>> = None;
    let mut ccs: BTreeMap<Vec<u8>, Cc> = BTreeMap::new();
    let mut summary: Option<Cc> = None;
    for (n, l) in lines {
        let body = l.strip_suffix(b"\n").unwrap_or(l);
        if l.iter().all(|c| c.is_ascii_whitespace()) || l.starts_with(b"#") {
            continue;
        }
        // `s/^(-?\d+)\s+//`: a cost line.
        let sign = usize::from(l.starts_with(b"-"));
        let digits = l[sign..].iter().take_while(|c| c.is_ascii_digit()).count();
        let ws = l[sign + digits..]
            .iter()
            .take_while(|c| c.is_ascii_whitespace())
            .count();
        if digits > 0 && ws > 0 {
            let counts = split_ws(&l[sign + digits + ws..]);
            if counts.len() > n_events {
                bail!("cg_diff: Line {n}: too many event counts");
            }
            let key = current
                .as_ref()
                .ok_or_else(|| anyhow!("cg_diff: line {n}: counts before fn="))?;
            add(&counts, ccs.entry(key.clone()).or_default());
        } else if let Some(func) = body.strip_prefix(b"fn=") {
            let f = file
                .as_ref()
                .ok_or_else(|| anyhow!("cg_diff: line {n}: fn= before fl="))?;
            let mut key = f.clone();
            key.extend_from_slice(b"###");
            key.extend_from_slice(func);
            ccs.entry(key.clone()).or_default();
            current = Some(key);
        } else if let Some(name) = body.strip_prefix(b"fl=") {
            // The script forgets the function's name but not its costs: counts before the
            // next `fn=` still go to the previous function.
            file = Some(name.to_vec());
        } else if let Some(rest) = strip_ws_prefix(l, b"summary:") {
            let counts = split_ws(rest);
            if counts.len() > n_events {
                bail!("cg_diff: Line {n}: too many event counts");
            }
            if counts.len() != n_events {
                bail!("cg_diff: Line {n}: summary event and total event mismatch");
            }
            // The script keeps the summary's fields as they were; only subtraction makes
            // them numbers, and every summary is subtracted from.
            summary = Some(counts.iter().map(|f| Some(num(f))).collect());
        } else {
            writeln!(log, "WARNING: line {n} malformed, ignoring")?;
        }
    }
    let summary =
        summary.ok_or_else(|| anyhow!("cg_diff: missing final summary line, aborting"))?;
    Ok(Profile {
        cmd,
        events,
        ccs,
        summary,
    })
}

/// Perl's `split(/###/, $s)` without trailing empty fields.
fn split_key(key: &[u8]) -> Vec<&[u8]> {
    let mut parts = vec![];
    let mut rest = key;
    while let Some(p) = rest.windows(3).position(|w| w == b"###") {
        parts.push(&rest[..p]);
        rest = &rest[p + 3..];
    }
    parts.push(rest);
    while parts.last().is_some_and(|p| p.is_empty()) {
        parts.pop();
    }
    parts
}

fn write_cc(out: &mut Vec<u8>, cc: &Cc) {
    for x in cc {
        out.push(b' ');
        if let Some(v) = x {
            out.extend_from_slice(v.to_string().as_bytes());
        }
    }
}

pub fn main(args: &[String]) -> Result<()> {
    run(args, &mut std::io::stdout().lock(), &mut std::io::stderr())
}

/// [`main`] with the difference going to `out` and warnings to `log`.
pub fn run(args: &[String], out: &mut dyn Write, log: &mut dyn Write) -> Result<()> {
    let mut files: Vec<&str> = vec![];
    for a in args {
        if a.starts_with('-') {
            if a == "-v" || a == "--version" {
                writeln!(out, "cg_diff-{VERSION}")?;
                return Ok(());
            }
            if a.starts_with("--mod-filename=") || a.starts_with("--mod-funcname=") {
                bail!("cg_diff: {a}: Perl expressions are not supported");
            }
            if a == "-h" || a == "--help" {
                out.write_all(USAGE.as_bytes())?;
                return Ok(());
            }
            bail!("cg_diff: unknown option {a}\n{USAGE}");
        }
        files.push(a);
    }
    let [f1, f2] = files[..] else {
        bail!("cg_diff: two files are needed\n{USAGE}");
    };
    let p1 = read(f1, log)?;
    let mut p2 = read(f2, log)?;
    if p1.events != p2.events {
        bail!("cg_diff: events don't match, aborting");
    }
    for (key, cc1) in &p1.ccs {
        sub(p2.ccs.entry(key.clone()).or_default(), cc1);
    }
    sub(&mut p2.summary, &p1.summary);
    let mut text = Vec::new();
    text.extend_from_slice(format!("desc: Files compared:   {f1}; {f2}\n").as_bytes());
    text.extend_from_slice(b"cmd:  ");
    text.extend_from_slice(&p1.cmd);
    text.extend_from_slice(b"; ");
    text.extend_from_slice(&p2.cmd);
    text.extend_from_slice(b"\nevents: ");
    for e in &p1.events {
        text.push(b' ');
        text.extend_from_slice(e);
    }
    text.push(b'\n');
    for (key, cc) in &p2.ccs {
        let parts = split_key(key);
        if parts.len() != 2 {
            bail!("cg_diff: a file or function name holds '###' or is empty");
        }
        text.extend_from_slice(b"fl=");
        text.extend_from_slice(parts[0]);
        text.extend_from_slice(b"\nfn=");
        text.extend_from_slice(parts[1]);
        text.extend_from_slice(b"\n0");
        write_cc(&mut text, cc);
        text.push(b'\n');
    }
    text.extend_from_slice(b"summary:");
    write_cc(&mut text, &p2.summary);
    text.push(b'\n');
    out.write_all(&text)?;
    Ok(())
}
