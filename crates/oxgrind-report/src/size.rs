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
}
