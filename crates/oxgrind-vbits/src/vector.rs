//! SSE, AVX and AVX-512 rules. Filled in below.
use crate::ctx::Ctx;
use crate::state::{Guest, ShadowMemory};

pub(crate) fn rule<G: Guest, M: ShadowMemory>(_cx: &mut Ctx<G, M>) -> bool {
    false
}
