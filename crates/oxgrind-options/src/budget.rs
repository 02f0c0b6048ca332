//! Memory budgets for CI: `--max-peak=SIZE`, `--max-leaked=SIZE`, `--max-allocs=N`.
//!
//! Parsed here with the other core options (so the launcher rejects a bad value before the
//! program starts); the runtime measures and checks them at exit (`oxgrind-runtime`'s
//! `budget` module). A broken budget ends the run with exit status [`BUDGET_EXIT_CODE`] and
//! one line saying which budget, by how much, and the site most responsible.

use oxgrind_tool::OptionError;

/// The exit status of a run (or `oxgrind diff --fail-if-grown`) whose budget broke: not 1,
/// which means oxgrind itself failed, and not a signal's 128+N.
pub const BUDGET_EXIT_CODE: i32 = 3;

/// The budgets given on the command line; `None` means no budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budgets {
    /// Most heap bytes live at once (requested sizes, as Massif's `mem_heap_B`).
    pub max_peak: Option<u64>,
    /// Most bytes definitely plus indirectly lost at exit (Memcheck's leak check).
    pub max_leaked: Option<u64>,
    /// Most allocations (malloc, calloc, realloc, new, ... calls that returned a block).
    pub max_allocs: Option<u64>,
}

impl Budgets {
    pub fn any(&self) -> bool {
        self.max_peak.is_some() || self.max_leaked.is_some() || self.max_allocs.is_some()
    }
}

/// A size as typed on a command line: `1048576`, `512K`, `64M`, `1.5G`, `2GiB`, `10MB`
/// (K, M, G, T are powers of 1024, with or without a `B` or `iB`).
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    if num.is_empty() {
        return None;
    }
    if num.contains('.') {
        let v: f64 = num.parse().ok()?;
        let r = v * mult as f64;
        (r.is_finite() && r >= 0.0 && r < u64::MAX as f64).then_some(r as u64)
    } else {
        num.parse::<u64>().ok()?.checked_mul(mult)
    }
}

/// Handles `--max-*` options; `Ok(false)` when `name` is not one.
pub fn parse_option(
    b: &mut Budgets,
    opt: &str,
    name: &str,
    value: Option<&str>,
) -> Result<bool, OptionError> {
    let slot = match name {
        "--max-peak" => &mut b.max_peak,
        "--max-leaked" => &mut b.max_leaked,
        "--max-allocs" => &mut b.max_allocs,
        _ => return Ok(false),
    };
    let v = value.ok_or_else(|| OptionError(format!("Bad option: {opt}: expected a value")))?;
    let n = if name == "--max-allocs" {
        v.parse::<u64>().ok()
    } else {
        parse_size(v)
    };
    *slot = Some(n.ok_or_else(|| {
        OptionError(if name == "--max-allocs" {
            format!("Bad option: {opt}: expected a number of allocations")
        } else {
            format!("Bad option: {opt}: expected a size (e.g. 1048576, 512K, 64M, 1.5G)")
        })
    })?);
    Ok(true)
}

/// Budgets the selected tool cannot measure are refused before the program starts:
/// `ignores_heap` is the tool's `Needs::ignores_heap` (then the runtime sees no allocation).
pub fn check_tool(b: &Budgets, tool: &str, ignores_heap: bool) -> Result<(), OptionError> {
    if b.max_leaked.is_some() && tool != "memcheck" {
        return Err(OptionError(format!(
            "--max-leaked needs Memcheck's leak check (--tool=memcheck), not --tool={tool}"
        )));
    }
    if (b.max_peak.is_some() || b.max_allocs.is_some()) && ignores_heap {
        return Err(OptionError(format!(
            "--max-peak and --max-allocs need a tool that tracks the heap (memcheck, massif, dhat), not --tool={tool}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_on_the_command_line() {
        assert_eq!(parse_size("100"), Some(100));
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("2MiB"), Some(2 << 20));
        assert_eq!(parse_size("1.5G"), Some(3 << 29));
        assert_eq!(parse_size("10MB"), Some(10 << 20));
        assert_eq!(parse_size("12Q"), None);
        assert_eq!(parse_size("M"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999999999999"), None);
    }
}
