//! Writing to file descriptors oxgrind owns, with `core::fmt`.
//!
//! Output written from inside the program must not go through stdio (its buffers belong to
//! the program and may be locked by the thread we interrupted). [`FdWriter`] buffers on the
//! stack and writes with raw `write(2)`, retrying short writes and `EINTR`.

use core::fmt;

use crate::raw;

/// A `core::fmt::Write` sink over a raw descriptor, with a small inline buffer.
pub struct FdWriter {
    fd: i32,
    buf: [u8; 4096],
    len: usize,
    /// First error seen (an errno); later writes are dropped.
    pub error: Option<i32>,
}

impl FdWriter {
    pub const fn new(fd: i32) -> Self {
        FdWriter {
            fd,
            buf: [0; 4096],
            len: 0,
            error: None,
        }
    }

    pub fn fd(&self) -> i32 {
        self.fd
    }

    pub fn write_bytes(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.len == self.buf.len() {
                self.flush();
            }
            let n = bytes.len().min(self.buf.len() - self.len);
            self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
            self.len += n;
            bytes = &bytes[n..];
        }
    }

    pub fn flush(&mut self) {
        let mut off = 0;
        while off < self.len && self.error.is_none() {
            match raw::write(self.fd, &self.buf[off..self.len]) {
                Ok(n) => off += n,
                Err(4) => continue, // EINTR
                Err(e) => self.error = Some(e),
            }
        }
        self.len = 0;
    }
}

impl fmt::Write for FdWriter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.write_bytes(s.as_bytes());
        Ok(())
    }
}

impl Drop for FdWriter {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Writes all of `bytes` to `fd` unbuffered; errors are ignored (diagnostics only).
pub fn write_all(fd: i32, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        match raw::write(fd, bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(4) => continue,
            Err(_) => return,
        }
    }
}
