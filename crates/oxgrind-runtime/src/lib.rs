//! The runtime preloaded into the program (to be written).
