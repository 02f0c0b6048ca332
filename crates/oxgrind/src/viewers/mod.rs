//! Viewers for the files oxgrind's tools write: `ms_print`, `cg_annotate`, and `report` and
//! `diff` (`oxgrind-report`).
pub mod cg_annotate;
pub mod cg_diff;
pub mod cg_merge;
pub mod diff;
pub mod ms_print;
pub mod report;
