//! The translation engine (to be written).
