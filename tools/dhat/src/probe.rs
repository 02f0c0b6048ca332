//! DHAT's client request: `DHAT_AD_HOC_EVENT(n)` (`dhat.h`), answered in ad-hoc mode.
//!
//! Which instructions DHAT probes is the contract's `Insn::may_touch_heap` (shared with
//! Memcheck): operands through general registers, not the stack, globals or TLS, and not
//! instructions that access no memory (`lea`, prefetches).

/// `VG_USERREQ__DHAT_AD_HOC_EVENT`: `VG_USERREQ_TOOL_BASE('D', 'H')`.
pub const AD_HOC_EVENT: u64 = ((b'D' as u64) << 24) | ((b'H' as u64) << 16);

/// The units of a `DHAT_AD_HOC_EVENT(n)` request, or `None` for any other request
/// (Valgrind's DHAT leaves those to other tools; so do we).
pub fn adhoc_units(args: &[u64; 6]) -> Option<u64> {
    (args[0] == AD_HOC_EVENT).then_some(args[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adhoc_request_is_read_from_the_argument_array() {
        assert_eq!(adhoc_units(&[AD_HOC_EVENT, 42, 0, 0, 0, 0]), Some(42));
        assert_eq!(adhoc_units(&[0x1001, 42, 0, 0, 0, 0]), None);
    }
}
