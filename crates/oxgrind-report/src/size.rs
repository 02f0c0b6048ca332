//! Byte counts as people read them: Valgrind's exact, comma-grouped figure beside a rounded
//! binary one (`15,012,345 B (14.3 MiB)`), the same in every view, the diff and budget lines.

use oxgrind_formats::number::commify;

/// `14.3 MiB`: one decimal above 1 KiB, binary units, as heaptrack and massif-visualizer show.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// `15,012,345 B (14.3 MiB)`; below 1 KiB only the exact figure.
pub fn both(bytes: u64) -> String {
    if bytes < 1024 {
        format!("{} B", commify(bytes))
    } else {
        format!("{} B ({})", commify(bytes), human(bytes))
    }
}

/// Signed change, `+1,024 B (+1.0 KiB)` / `-12 B`.
pub fn signed(delta: i128) -> String {
    let sign = if delta < 0 { "-" } else { "+" };
    let mag = delta.unsigned_abs().min(u64::MAX as u128) as u64;
    if mag < 1024 {
        format!("{sign}{} B", commify(mag))
    } else {
        format!("{sign}{} B ({sign}{})", commify(mag), human(mag))
    }
}

/// Parses a size given on a command line: `1048576`, `512K`, `64M`, `2G`, `1.5GiB`, `10MB`
/// (K, M, G, T are powers of 1024, with or without `B`/`iB`).
pub fn parse(text: &str) -> Option<u64> {
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
    if num.contains('.') {
        let v: f64 = num.parse().ok()?;
        let r = v * mult as f64;
        (r.is_finite() && r >= 0.0 && r < u64::MAX as f64).then_some(r as u64)
    } else {
        num.parse::<u64>().ok()?.checked_mul(mult)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_valgrind_and_people_write_them() {
        assert_eq!(both(15_012_345), "15,012,345 B (14.3 MiB)");
        assert_eq!(both(80), "80 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(signed(-2048), "-2,048 B (-2.0 KiB)");
        assert_eq!(signed(5), "+5 B");
    }

    #[test]
    fn command_line_sizes() {
        assert_eq!(parse("100"), Some(100));
        assert_eq!(parse("64K"), Some(65536));
        assert_eq!(parse("2MiB"), Some(2 << 20));
        assert_eq!(parse("1.5G"), Some(3 << 29));
        assert_eq!(parse("12Q"), None);
        assert_eq!(parse(""), None);
    }
}
