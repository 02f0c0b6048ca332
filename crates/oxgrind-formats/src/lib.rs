//! Valgrind's output formats, byte for byte: a plain data model per format, a writer and a
//! tolerant reader.
//!
//! Writers run inside the profiled program (the runtime), so this crate is `no_std` + `alloc`
//! and writes into a `String`/`Vec<u8>` the caller then sends to its own file descriptor.
//! Readers and viewers (ms_print) run in the launcher. The reference for every byte is
//! `shared/reference/formats.md` and the real Valgrind 3.19 files in
//! `shared/reference/examples/`; round trips over those files are the first tests.
//!
//! * [`frame`]: one code location in Valgrind's `describe_IP` text (`0x4005A3: main (a.c:12)`),
//!   shared by every format.
//! * [`massif`]: `massif.out.<pid>` model, writer and reader; [`massif::ms_print`] renders
//!   it as `ms_print` does.
//! * [`cachegrind`]: `cachegrind.out.<pid>` model, writer and reader; Cachegrind's exit summary.
//! * [`dhat`]: `dhat.out.<pid>` (DHAT's JSON, version 2) model, writer and reader.
//! * [`memcheck_text`], [`memcheck_xml`]: Memcheck's report in text and in XML protocol 4;
//!   [`memcheck_xml_reader`] reads XML back (protocols 4 to 6) for viewers.
//! * [`suppressions`]: suppression files (parser, matcher) and `--gen-suppressions` text.
#![cfg_attr(not(feature = "std"), no_std)]
extern crate alloc;

pub mod below_main;
pub mod cachegrind;
pub mod dhat;
pub mod frame;
pub mod massif;
pub mod memcheck_text;
pub mod memcheck_xml;
pub mod memcheck_xml_reader;
pub mod number;
pub mod suppressions;
