//! What a "site" is when views and the diff compare or group code locations.
//!
//! Massif labels and DHAT frames start with the code address (`0x109180: big_alloc
//! (ms_prog.c:6)`). The address changes between builds and with address-space layout, the rest
//! does not, so sites are keyed by the text after the address: two runs of a rebuilt program
//! still line up in `oxgrind diff`, and two call sites on the same source line are one site
//! (as people read them).

/// `big_alloc (ms_prog.c:6)` for `0x109180: big_alloc (ms_prog.c:6)`; other text unchanged.
pub fn without_address(label: &str) -> &str {
    let Some(rest) = label.strip_prefix("0x") else {
        return label;
    };
    let hex = rest.bytes().take_while(u8::is_ascii_hexdigit).count();
    match rest[hex..].strip_prefix(": ") {
        Some(tail) if hex > 0 => tail,
        _ => label,
    }
}

/// Whether a frame's text is the allocator's replacement rather than the program: Valgrind's
/// preloaded `vgpreload_<tool>-<arch>.so` or oxgrind's runtime. Such leading frames differ
/// between the two tools and say nothing about the site, so site keys leave them out.
pub fn is_allocator_frame(text: &str) -> bool {
    text.contains("/vgpreload_") || text.contains("liboxgrind_runtime")
}

/// A stack as one site key: frames without addresses, innermost first, joined by ` <- `,
/// leading allocator frames left out (all of them if nothing else remains).
pub fn stack_key<'a>(frames: impl IntoIterator<Item = &'a str>) -> String {
    let frames: Vec<&str> = frames.into_iter().map(without_address).collect();
    let skip = frames.iter().take_while(|f| is_allocator_frame(f)).count();
    let kept = if skip == frames.len() {
        &frames[..]
    } else {
        &frames[skip..]
    };
    kept.join(" <- ")
}

/// Whether a Massif label is the aggregate of sites below the threshold
/// (`in 3 places, all below massif's threshold (1.00%)`).
pub fn is_below_threshold(label: &str) -> bool {
    label.starts_with("in ") && label.contains("below massif's threshold")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_not_part_of_a_site() {
        assert_eq!(
            without_address("0x109180: big_alloc (a.c:6)"),
            "big_alloc (a.c:6)"
        );
        assert_eq!(without_address("0xZZ: x"), "0xZZ: x");
        assert_eq!(without_address("[root]"), "[root]");
        assert_eq!(
            stack_key([
                "0x48417B4: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)",
                "0x1: f (a.c:1)",
                "0x2: main (a.c:9)"
            ]),
            "f (a.c:1) <- main (a.c:9)"
        );
        assert!(is_below_threshold(
            "in 2 places, all below massif's threshold (1.00%)"
        ));
    }
}
