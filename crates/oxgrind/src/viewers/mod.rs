//! Viewers for the files oxgrind's tools write (the `ms_print` family).
pub mod cg_annotate;
pub mod ms_print;
