//! Whether our constructor runs before other objects' constructors.
//!
//! A preloaded library is initialised after every library the program depends on, so
//! allocations made by their constructors (rustc's libLLVM) would come before the engine
//! takes over and stay unseen. `init_order.c` moves our initialisation to right after our
//! own dependencies' (libc, libgcc_s, the loader), from an IFUNC resolver the loader calls
//! while it relocates this library; this module reads what it did.

extern "C" {
    fn oxg_init_order_result() -> i32;
}

/// What the resolver in `init_order.c` did with the loader's initialisation order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitOrder {
    /// The resolver never ran (a loader that does not call IFUNC resolvers of ours).
    NotRun,
    /// Our constructor runs right after our dependencies', before every other object's.
    Moved,
    /// We were not loaded with the program (dlopen): there is no order to change.
    NotPreloaded,
    /// The loader's structures were not the shape we know: the order is the loader's.
    Unrecognised,
    /// Nothing but our dependencies was initialised before us anyway.
    AlreadyFirst,
}

/// What happened to the initialisation order (see [`InitOrder`]).
pub fn result() -> InitOrder {
    // SAFETY: reads a static int the resolver wrote before any constructor ran.
    match unsafe { oxg_init_order_result() } {
        1 => InitOrder::Moved,
        2 => InitOrder::NotPreloaded,
        3 => InitOrder::Unrecognised,
        4 => InitOrder::AlreadyFirst,
        _ => InitOrder::NotRun,
    }
}

/// Whether other objects' constructors may have run before ours (their allocations unseen).
pub fn others_initialised_first() -> bool {
    matches!(result(), InitOrder::NotRun | InitOrder::Unrecognised)
}
