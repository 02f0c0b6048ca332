//! Reading the files a report is made of: which format a file is (from its content, not its
//! name: Valgrind's `--massif-out-file` and `--xml-file` take any name), and its model.

use oxgrind_formats::{cachegrind, dhat, massif, memcheck_xml_reader};
use std::fmt;
use std::path::{Path, PathBuf};

/// One input file, read.
pub struct Input {
    /// As given on the command line (shown in the page and in messages).
    pub path: PathBuf,
    pub data: Data,
}

pub enum Data {
    Massif(massif::MassifFile),
    Dhat(dhat::DhatFile),
    Memcheck(memcheck_xml_reader::MemcheckXml),
    Cachegrind(cachegrind::CachegrindFile),
}

impl Data {
    /// `massif`, `dhat`, `memcheck`, `cachegrind`: the kind's name in messages and in the JSON.
    pub fn kind(&self) -> &'static str {
        match self {
            Data::Massif(_) => "massif",
            Data::Dhat(_) => "dhat",
            Data::Memcheck(_) => "memcheck",
            Data::Cachegrind(_) => "cachegrind",
        }
    }
}

/// Why a file could not be read.
#[derive(Debug)]
pub enum Error {
    Io {
        path: PathBuf,
        err: std::io::Error,
    },
    /// Not a format we read: says what the file looks like.
    Unknown {
        path: PathBuf,
        what: &'static str,
    },
    Parse {
        path: PathBuf,
        kind: &'static str,
        err: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { path, err } => write!(f, "cannot read {}: {err}", path.display()),
            Error::Unknown { path, what } => write!(
                f,
                "{}: {what}; oxgrind reads massif.out, dhat.out, cachegrind.out and Memcheck XML (--xml=yes) files",
                path.display()
            ),
            Error::Parse { path, kind, err } => {
                write!(f, "{}: not a valid {kind} file: {err}", path.display())
            }
        }
    }
}

impl std::error::Error for Error {}

/// Which format `bytes` are in, from the first significant characters.
fn sniff(bytes: &[u8]) -> Result<&'static str, &'static str> {
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    let head = &bytes[start..bytes.len().min(start + 4096)];
    let has_line = |prefix: &[u8]| {
        head.starts_with(prefix)
            || head
                .windows(prefix.len() + 1)
                .any(|w| w[0] == b'\n' && &w[1..] == prefix)
    };
    // cachegrind.out also starts with `desc:` and `cmd:` lines; `events:` tells it apart.
    if has_line(b"events:") {
        return Ok("cachegrind");
    }
    if head.starts_with(b"desc:") || head.starts_with(b"cmd:") {
        return Ok("massif");
    }
    if head.starts_with(b"{") {
        return Ok("dhat");
    }
    if head.starts_with(b"<") {
        let text = String::from_utf8_lossy(head);
        if text.contains("<valgrindoutput") || text.starts_with("<?xml") {
            return Ok("memcheck");
        }
        return Err("an XML or HTML file that is not Valgrind's XML output");
    }
    if head.starts_with(b"==") {
        return Err("Valgrind's text output; run with --xml=yes --xml-file=FILE for a report");
    }
    Err("not a file format oxgrind knows")
}

/// Reads and parses one file.
pub fn load(path: &Path) -> Result<Input, Error> {
    let bytes = std::fs::read(path).map_err(|err| Error::Io {
        path: path.to_path_buf(),
        err,
    })?;
    parse(path, &bytes)
}

/// Parses `bytes` read from `path`.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Input, Error> {
    let kind = sniff(bytes).map_err(|what| Error::Unknown {
        path: path.to_path_buf(),
        what,
    })?;
    let bad = |err: String| Error::Parse {
        path: path.to_path_buf(),
        kind,
        err,
    };
    let data = match kind {
        "massif" => Data::Massif(massif::parse(bytes).map_err(|e| bad(e.to_string()))?),
        "dhat" => Data::Dhat(dhat::parse(bytes).map_err(|e| bad(e.to_string()))?),
        "cachegrind" => Data::Cachegrind(cachegrind::parse(bytes).map_err(|e| bad(e.to_string()))?),
        _ => Data::Memcheck(memcheck_xml_reader::parse(bytes).map_err(|e| bad(e.to_string()))?),
    };
    Ok(Input {
        path: path.to_path_buf(),
        data,
    })
}
