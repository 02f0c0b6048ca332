//! Number formatting shared by the text formats (formats.md §0.2).

use alloc::string::String;

/// `72761` → `72,761`: a comma every three digits from the right, as Valgrind's `%'lu` and
/// the Perl tools' `commify` print them. A leading `-` is kept.
pub fn commify(n: impl core::fmt::Display) -> String {
    use core::fmt::Write;
    let mut digits = String::new();
    let _ = write!(digits, "{n}");
    let (sign, body) = match digits.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", digits.as_str()),
    };
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    out.push_str(sign);
    for (i, c) in body.chars().enumerate() {
        if i > 0 && (body.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::commify;

    #[test]
    fn commify_groups_by_three_and_keeps_sign() {
        assert_eq!(commify(0), "0");
        assert_eq!(commify(999), "999");
        assert_eq!(commify(1024), "1,024");
        assert_eq!(commify(72761), "72,761");
        assert_eq!(commify(1234567), "1,234,567");
        assert_eq!(commify(-1234), "-1,234");
    }
}
