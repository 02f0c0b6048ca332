//! `oxgrind cg_merge [-o outfile] files...`: Valgrind 3.19's `cg_merge`, byte for byte.
//!
//! The C program reads each file strictly (`desc: ` lines, `cmd: `, `events: `, then only
//! cost lines, `fl=`, `fn=` and a final `summary: ` that must equal the sum of the costs),
//! adds the costs per (file, function, line), and writes one file: the first file's header
//! lines as they were, then every (file, function) in `strcmp` order, each with a `fl=` and
//! a `fn=` line, its lines in ascending order as `N   c1 c2 ... ` (three spaces, a space after
//! each count), and the summed `summary:`. Its progress messages go to stderr. Errors are
//! its messages on one `oxgrind: cg_merge: ...` line with exit status 1 (it exits 1 too).

use anyhow::{anyhow, bail, Result};
use std::collections::BTreeMap;
use std::io::Write;

/// (file, function) -> line -> counts.
type Costs = BTreeMap<(Vec<u8>, Vec<u8>), BTreeMap<u64, Vec<u64>>>;

struct Profile {
    header: Vec<Vec<u8>>,
    events_line: Vec<u8>,
    n_events: usize,
    costs: Costs,
    summary: Vec<u64>,
}

/// The leading unsigned numbers of `s` (as `parse_ULong` reads them), and what follows.
fn numbers(s: &[u8]) -> (Vec<u64>, &[u8]) {
    let mut v = vec![];
    let mut rest = s;
    loop {
        let t = rest
            .iter()
            .position(|c| !c.is_ascii_whitespace())
            .map_or(&rest[rest.len()..], |p| &rest[p..]);
        let digits = t.iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return (v, t);
        }
        let n = t[..digits].iter().fold(0u64, |a, d| {
            a.wrapping_mul(10).wrapping_add((d - b'0') as u64)
        });
        v.push(n);
        rest = &t[digits..];
    }
}

fn parse(name: &str, bytes: &[u8]) -> Result<Profile> {
    let mut lines = bytes
        .split(|&b| b == b'\n')
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .peekable();
    // A file ending in a newline has no line after it.
    let total = bytes.split(|&b| b == b'\n').count() - usize::from(bytes.ends_with(b"\n"));
    let err = |n: usize, msg: &str| anyhow!("parse error: {msg} (at {name}:{n})");
    let mut header = vec![];
    let mut line = None;
    for (n, l) in lines.by_ref() {
        if n > total {
            break;
        }
        if l.starts_with(b"desc: ") {
            header.push(l.to_vec());
        } else {
            line = Some((n, l));
            break;
        }
    }
    if header.is_empty() {
        return Err(err(1, "parse_CacheProfFile: no DESC lines present"));
    }
    let (n, l) = line.unwrap_or((total + 1, b""));
    if !l.starts_with(b"cmd: ") {
        return Err(err(n, "parse_CacheProfFile: no CMD line present"));
    }
    header.push(l.to_vec());
    let (n, l) = match lines.next() {
        Some((n, l)) if n <= total => (n, l),
        _ => return Err(err(n + 1, "parse_CacheProfFile: eof before EVENTS line")),
    };
    if !l.starts_with(b"events: ") {
        return Err(err(n, "parse_CacheProfFile: no EVENTS line present"));
    }
    let events_line = l.to_vec();
    let n_events = events_line[6..]
        .windows(2)
        .filter(|w| w[0] == b' ' && w[1].is_ascii_alphabetic())
        .count();
    let mut p = Profile {
        header,
        events_line,
        n_events,
        costs: BTreeMap::new(),
        summary: vec![0; n_events],
    };
    let mut fl = b"???".to_vec();
    let mut fnn = b"???".to_vec();
    let mut last = n;
    loop {
        let Some((n, l)) = lines.next().filter(|(n, _)| *n <= total) else {
            return Err(err(
                last + 1,
                "parse_CacheProfFile: eof before SUMMARY line",
            ));
        };
        last = n;
        if l.first().is_some_and(u8::is_ascii_digit) {
            let (v, rest) = numbers(l);
            if !rest.is_empty() {
                return Err(err(n, "garbage in counts line"));
            }
            if v.len() < 2 {
                return Err(err(n, "too few counts in count line"));
            }
            if v.len() - 1 != p.n_events {
                bail!("out of memory in handle_counts (the counts do not match the events) (at {name}:{n})");
            }
            let counts = &v[1..];
            let slot = p
                .costs
                .entry((fl.clone(), fnn.clone()))
                .or_default()
                .entry(v[0])
                .or_insert_with(|| vec![0; counts.len()]);
            for (a, b) in slot.iter_mut().zip(counts) {
                *a = a.wrapping_add(*b);
            }
            for (a, b) in p.summary.iter_mut().zip(counts) {
                *a = a.wrapping_add(*b);
            }
        } else if let Some(f) = l.strip_prefix(b"fn=") {
            fnn = f.to_vec();
        } else if let Some(f) = l.strip_prefix(b"fl=") {
            fl = f.to_vec();
        } else if let Some(rest) = l.strip_prefix(b"summary: ") {
            if lines.next().is_some_and(|(n, _)| n <= total) {
                return Err(err(
                    n + 1,
                    "parse_CacheProfFile: extraneous content after SUMMARY line",
                ));
            }
            let (v, rest) = numbers(rest);
            if !rest.is_empty() {
                return Err(err(n, "garbage in counts line"));
            }
            if v.is_empty() {
                return Err(err(n, "too few counts in count line"));
            }
            if v.len() != p.n_events {
                return Err(err(
                    n,
                    "parse_CacheProfFile: wrong # counts in SUMMARY line",
                ));
            }
            if v != p.summary {
                return Err(err(
                    n,
                    "parse_CacheProfFile: computed vs stated SUMMARY counts mismatch",
                ));
            }
            return Ok(p);
        } else {
            return Err(err(n, "parse_CacheProfFile: unexpected line in main data"));
        }
    }
}

fn merge(dst: &mut Profile, src: Profile, name: &str) -> Result<()> {
    if dst.events_line != src.events_line {
        bail!(
            "\"events:\" line of most recent file does not match those previously processed (in {name})"
        );
    }
    for (key, lines) in src.costs {
        let d = dst.costs.entry(key).or_default();
        for (line, counts) in lines {
            match d.get_mut(&line) {
                Some(c) => {
                    if c.len() != counts.len() {
                        bail!("parse error: addCounts: inconsistent number of counts");
                    }
                    for (a, b) in c.iter_mut().zip(&counts) {
                        *a = a.wrapping_add(*b);
                    }
                }
                None => {
                    d.insert(line, counts);
                }
            }
        }
    }
    for (a, b) in dst.summary.iter_mut().zip(&src.summary) {
        *a = a.wrapping_add(*b);
    }
    Ok(())
}

fn render(p: &Profile) -> Vec<u8> {
    let mut out = Vec::new();
    for h in &p.header {
        out.extend_from_slice(h);
        out.push(b'\n');
    }
    out.extend_from_slice(&p.events_line);
    out.push(b'\n');
    for ((fl, fnn), lines) in &p.costs {
        out.extend_from_slice(b"fl=");
        out.extend_from_slice(fl);
        out.extend_from_slice(b"\nfn=");
        out.extend_from_slice(fnn);
        out.push(b'\n');
        for (line, counts) in lines {
            out.extend_from_slice(format!("{line}   ").as_bytes());
            for c in counts {
                // `%lld` of the unsigned sum.
                out.extend_from_slice(format!("{} ", *c as i64).as_bytes());
            }
            out.push(b'\n');
        }
    }
    out.extend_from_slice(b"summary:");
    for c in &p.summary {
        out.extend_from_slice(format!(" {}", *c as i64).as_bytes());
    }
    out.push(b'\n');
    out
}

/// Runs cg_merge with `args` (the arguments after `cg_merge`).
pub fn main(args: &[String]) -> Result<()> {
    run(args, &mut std::io::stdout().lock(), &mut std::io::stderr())
}

/// [`main`] with the merged file (without `-o`) going to `out` and progress to `log`.
pub fn run(args: &[String], out: &mut dyn Write, log: &mut dyn Write) -> Result<()> {
    const USAGE: &str = "usage: oxgrind cg_merge [-o outfile] [files-to-merge]";
    if args.is_empty() || args.iter().any(|a| a == "-h" || a == "--help") {
        writeln!(
            log,
            "cg_merge: Merges multiple cachegrind output files into one"
        )?;
        writeln!(
            log,
            "cg_merge: usage: cg_merge [-o outfile] [files-to-merge]"
        )?;
        if args.is_empty() {
            bail!("cg_merge: no files given ({USAGE})");
        }
        return Ok(());
    }
    let out_ix = args.iter().position(|a| a == "-o");
    let out_name = match out_ix {
        Some(i) => Some(
            args.get(i + 1)
                .ok_or_else(|| anyhow!("cg_merge: -o needs a file name ({USAGE})"))?
                .clone(),
        ),
        None => None,
    };
    let mut merged: Option<Profile> = None;
    let mut i = 0;
    while i < args.len() {
        if Some(i) == out_ix {
            i += 2;
            continue;
        }
        let name = &args[i];
        writeln!(log, "cg_merge: parsing {name}")?;
        let bytes = std::fs::read(name)
            .map_err(|e| anyhow!("cg_merge: Cannot open input file {name}: {e}"))?;
        let p = parse(name, &bytes).map_err(|e| anyhow!("cg_merge: {e}"))?;
        match merged.as_mut() {
            None => merged = Some(p),
            Some(m) => {
                writeln!(log, "cg_merge: merging {name}")?;
                merge(m, p, name).map_err(|e| anyhow!("cg_merge: {e}"))?;
            }
        }
        i += 1;
    }
    if let Some(m) = merged {
        writeln!(
            log,
            "cg_merge: writing {}",
            out_name.as_deref().unwrap_or("(stdout)")
        )?;
        let bytes = render(&m);
        match &out_name {
            Some(f) => std::fs::write(f, bytes)
                .map_err(|e| anyhow!("cg_merge: can't create output file {f}: {e}"))?,
            None => {
                out.write_all(&bytes)?;
                out.flush()?;
            }
        }
    }
    Ok(())
}
