//! Valgrind's treatment of the frames under `main` (formats.md §0.5).
//!
//! Unless `--show-below-main=yes`, Valgrind prints the C start-up functions as
//! `(below main)` and cuts every stack after `main` (or, when there is no `main`, after the
//! innermost start-up frame). The names are those of `VG_(get_fnname_kind)` for Linux.
//!
//! The one place for this rule: the symboliser (Memcheck's reports), Massif's and DHAT's
//! stack handling all use it.

/// The name Valgrind prints for a start-up function.
pub const BELOW_MAIN: &str = "(below main)";

/// What a function is, for stack cutting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FnNameKind {
    Main,
    BelowMain,
    Normal,
}

/// Classifies a raw (mangled, symbol-table) function name as Valgrind 3.19 does on Linux.
pub fn fn_name_kind(name: &str) -> FnNameKind {
    if name == "main" {
        FnNameKind::Main
    } else if name == "__libc_start_main"
        || name == "__libc_start_call_main"
        || name.starts_with("__libc_start_main.")
        || name == "generic_start_main"
        || name.starts_with("generic_start_main.")
        || name == "_start"
        || name == BELOW_MAIN
    {
        FnNameKind::BelowMain
    } else {
        FnNameKind::Normal
    }
}

/// Whether Valgrind counts `name` as a start-up function under `main`.
pub fn is_below_main(name: &str) -> bool {
    fn_name_kind(name) == FnNameKind::BelowMain
}

/// The name to print for a function named `name` (raw): `(below main)` for start-up
/// functions unless `show_below_main`.
pub fn below_main_name(name: &str, show_below_main: bool) -> &str {
    if !show_below_main && is_below_main(name) {
        BELOW_MAIN
    } else {
        name
    }
}

/// The kind of one code address from its description (the frames the symboliser
/// returned for it): that of its
/// outermost, non-inlined function, by raw name when known. Works with or without the
/// `(below main)` renaming, so report writers holding only `Frame`s can cut stacks.
pub fn frames_kind(frames: &[crate::frame::Frame]) -> FnNameKind {
    match frames.last() {
        Some(f) => match f.mangled.as_deref().or(f.function.as_deref()) {
            Some(name) => fn_name_kind(name),
            None => FnNameKind::Normal,
        },
        None => FnNameKind::Normal,
    }
}

/// How many of `stack`'s frames (innermost first) Valgrind keeps without
/// `--show-below-main=yes`: scanning from the outermost frame, the stack ends at the first
/// `main`, or else at the innermost below-main frame; a stack with neither is kept whole.
/// `kind` classifies one frame (e.g. the symboliser's `fn_name_kind` on its address).
pub fn cut_below_main<T>(stack: &[T], mut kind: impl FnMut(&T) -> FnNameKind) -> usize {
    let mut n = stack.len();
    for i in (0..stack.len()).rev() {
        match kind(&stack[i]) {
            FnNameKind::Main => return i + 1,
            FnNameKind::BelowMain => n = i + 1,
            FnNameKind::Normal => {}
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(names: &[&str]) -> usize {
        cut_below_main(names, |n| fn_name_kind(n))
    }

    #[test]
    fn stack_is_cut_after_main() {
        assert_eq!(
            kinds(&[
                "malloc",
                "f",
                "main",
                "__libc_start_call_main",
                "__libc_start_main",
                "_start"
            ]),
            3
        );
    }

    #[test]
    fn stack_without_main_keeps_the_innermost_below_main_frame() {
        assert_eq!(
            kinds(&[
                "malloc",
                "start_thread_fn",
                "__libc_start_call_main",
                "__libc_start_main",
                "_start"
            ]),
            3
        );
    }

    #[test]
    fn stack_without_start_up_frames_is_kept_whole() {
        assert_eq!(kinds(&["malloc", "worker", "start_thread", "clone3"]), 4);
    }

    #[test]
    fn described_frames_are_classified_by_their_outermost_function() {
        use crate::frame::Frame;
        let f = |name: &str| Frame {
            function: Some(name.into()),
            ..Frame::default()
        };
        assert_eq!(frames_kind(&[f("inlined"), f("main")]), FnNameKind::Main);
        assert_eq!(frames_kind(&[f("(below main)")]), FnNameKind::BelowMain);
        assert_eq!(
            frames_kind(&[f("__libc_start_call_main")]),
            FnNameKind::BelowMain
        );
        assert_eq!(frames_kind(&[f("main"), f("caller")]), FnNameKind::Normal);
        assert_eq!(frames_kind(&[]), FnNameKind::Normal);
        let stack = vec![vec![f("malloc")], vec![f("main")], vec![f("(below main)")]];
        assert_eq!(cut_below_main(&stack, |fr| frames_kind(fr)), 2);
    }

    #[test]
    fn start_up_functions_are_renamed() {
        assert_eq!(
            below_main_name("__libc_start_call_main", false),
            "(below main)"
        );
        assert_eq!(
            below_main_name("__libc_start_call_main", true),
            "__libc_start_call_main"
        );
        assert_eq!(below_main_name("main", false), "main");
    }
}
