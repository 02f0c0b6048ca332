//! One code location, printed as Valgrind's `describe_IP` prints it (formats.md §0.1).
//!
//! ```text
//! 0x109245: main (mc_errors.c:24)
//! 0x48417B4: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
//! 0x1234: ???
//! ```
//! Memcheck stacks, Massif trees and DHAT's frame table all use this text.

use alloc::string::String;
use core::fmt;

/// What is known about one code address. An address inside inlined code is described by
/// several `Frame`s sharing the same `ip`, innermost first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Frame {
    pub ip: u64,
    /// Demangled function name.
    pub function: Option<String>,
    /// Mangled (linkage) name, for suppressions; `None` when the same as `function`.
    pub mangled: Option<String>,
    /// Source file name (without directory).
    pub file: Option<String>,
    /// Directory of the source file, from DWARF (printed only with `--fullpath-after`).
    pub dir: Option<String>,
    pub line: u32,
    /// Path of the ELF object containing `ip`.
    pub object: Option<String>,
}

impl fmt::Display for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:X}: ", self.ip)?;
        match (&self.function, &self.file, &self.object) {
            (None, None, None) => f.write_str("???"),
            (func, Some(file), _) if self.line > 0 => {
                write!(
                    f,
                    "{} ({}:{})",
                    func.as_deref().unwrap_or("???"),
                    file,
                    self.line
                )
            }
            (func, _, Some(obj)) => write!(f, "{} (in {})", func.as_deref().unwrap_or("???"), obj),
            (Some(func), _, None) => write!(f, "{func} (in ???)"),
            (None, _, None) => f.write_str("???"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    fn s(x: &str) -> Option<String> {
        Some(x.into())
    }

    #[test]
    fn frame_text_matches_valgrind() {
        let mut fr = Frame {
            ip: 0x109245,
            function: s("main"),
            file: s("mc_errors.c"),
            line: 24,
            ..Default::default()
        };
        assert_eq!(fr.to_string(), "0x109245: main (mc_errors.c:24)");
        fr.file = None;
        fr.line = 0;
        fr.object = s("/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(
            fr.to_string(),
            "0x109245: main (in /usr/lib/x86_64-linux-gnu/libc.so.6)"
        );
        fr.function = None;
        assert_eq!(
            fr.to_string(),
            "0x109245: ??? (in /usr/lib/x86_64-linux-gnu/libc.so.6)"
        );
        fr.object = None;
        assert_eq!(fr.to_string(), "0x109245: ???");
        let only_fn = Frame {
            ip: 0x10,
            function: s("f"),
            ..Default::default()
        };
        assert_eq!(only_fn.to_string(), "0x10: f (in ???)");
    }
}
