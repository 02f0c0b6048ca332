//! `/proc/self/maps`, read with raw system calls.
//!
//! The unwinder discovers modules and stack bounds from the kernel's own list of mappings
//! rather than `dl_iterate_phdr`, because an allocation hook can run while the dynamic loader
//! holds its locks (inside `dlopen`, during TLS set-up), where `dl_iterate_phdr` would
//! deadlock. Only `oxgrind_sys::raw::{open, read, close}` are used: no libc, no `std::fs`.
//! Rust allocation is allowed (the runtime's global allocator is a private mmap heap).

use alloc::vec::Vec;

/// One line of `/proc/self/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub readable: bool,
    pub writable: bool,
    pub executable: bool,
    /// File offset of `start`.
    pub offset: u64,
    pub inode: u64,
    /// Path or pseudo-name (`[stack]`, `[vdso]`), empty for anonymous memory.
    pub path: Vec<u8>,
}

/// The whole of `/proc/self/maps` (raw system calls, through the runtime's kept descriptor:
/// see `oxgrind_sys::procself`). `None` when it cannot be opened (no /proc in a sandbox).
pub fn read_self_maps() -> Option<Vec<u8>> {
    oxgrind_sys::procself::read(oxgrind_sys::procself::SelfFile::Maps)
}

fn parse_hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v: u64 = 0;
    for &c in s {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => return None,
        };
        v = (v << 4) | u64::from(d);
    }
    Some(v)
}

fn parse_dec(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    Some(v)
}

/// Parses one maps line: `start-end perms offset dev inode   path`.
pub fn parse_line(line: &[u8]) -> Option<Mapping> {
    let mut fields = line.splitn(6, |&c| c == b' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let offset = parse_hex(fields.next()?)?;
    let _dev = fields.next()?;
    let inode = parse_dec(fields.next()?)?;
    let path = fields.next().unwrap_or(b"");
    let dash = range.iter().position(|&c| c == b'-')?;
    let start = parse_hex(&range[..dash])?;
    let end = parse_hex(&range[dash + 1..])?;
    if perms.len() < 3 || end <= start {
        return None;
    }
    let path = {
        let first = path.iter().position(|&c| c != b' ').unwrap_or(path.len());
        &path[first..]
    };
    Some(Mapping {
        start,
        end,
        readable: perms[0] == b'r',
        writable: perms[1] == b'w',
        executable: perms[2] == b'x',
        offset,
        inode,
        path: path.to_vec(),
    })
}

/// Parses the text of a maps file; malformed lines are skipped.
pub fn parse_maps(text: &[u8]) -> Vec<Mapping> {
    text.split(|&c| c == b'\n')
        .filter(|l| !l.is_empty())
        .filter_map(parse_line)
        .collect()
}

/// One ELF object the dynamic loader mapped: its first mapping (file offset 0, where the
/// ELF header is) and every mapping of the object, in address order.
pub struct LoadedObject<'a> {
    pub base: &'a Mapping,
    pub mappings: Vec<&'a Mapping>,
}

/// The objects the loader mapped, told apart from other views of the same files.
///
/// A file can be mapped more than once: the loader's segments, and whole-file views that
/// read its symbols and debug information (ours, or the program's own symbolizer, such as
/// a Rust backtrace). Any view starts at file offset 0 like the loader's first segment, so
/// a file offset alone does not say which is the object. The loader reserves the object's
/// whole span and maps every segment inside it, so an object is a run of mappings of one
/// file from an offset-0 mapping up to the next offset-0 mapping of that file, and it holds
/// executable code; a view is a run without any.
pub fn loaded_objects(maps: &[Mapping]) -> Vec<LoadedObject<'_>> {
    let same_file = |a: &Mapping, b: &Mapping| a.inode == b.inode && a.path == b.path;
    let mut out = Vec::new();
    for (i, base) in maps.iter().enumerate() {
        if base.offset != 0 || !base.readable || base.path.is_empty() {
            continue;
        }
        let mut mappings = vec![base];
        for m in &maps[i + 1..] {
            if same_file(m, base) {
                if m.offset == 0 {
                    break;
                }
                mappings.push(m);
            }
        }
        if mappings.iter().any(|m| m.executable) {
            out.push(LoadedObject { base, mappings });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_file_views_are_not_loaded_objects() {
        // A view of the file below the object (as memmap places it) and one above.
        let text = b"7f0000000000-7f0000005000 r--s 00000000 fe:00 7 /lib/libx.so\n\
7f0000005000-7f0000006000 r--p 00000000 fe:00 7 /lib/libx.so\n\
7f0000006000-7f0000007000 r-xp 00001000 fe:00 7 /lib/libx.so\n\
7f0000007000-7f0000008000 r--p 00002000 fe:00 7 /lib/libx.so\n\
7f0000008000-7f0000009000 rw-p 00000000 00:00 0 \n\
7f0000009000-7f000000e000 r--p 00000000 fe:00 7 /lib/libx.so\n";
        let maps = parse_maps(text);
        let objects = loaded_objects(&maps);
        assert_eq!(objects.len(), 1);
        assert_eq!(objects[0].base.start, 0x7f0000005000);
        let starts: Vec<u64> = objects[0].mappings.iter().map(|m| m.start).collect();
        assert_eq!(starts, [0x7f0000005000, 0x7f0000006000, 0x7f0000007000]);
    }

    #[test]
    fn parses_file_and_anonymous_lines() {
        let text = b"55d0c8a00000-55d0c8a01000 r-xp 00001000 fe:01 1234                       /usr/bin/prog\n\
7ffd1c000000-7ffd1c021000 rw-p 00000000 00:00 0                          [stack]\n\
7f0000000000-7f0000001000 ---p 00000000 00:00 0 \n";
        let m = parse_maps(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].start, 0x55d0c8a00000);
        assert!(m[0].executable && m[0].readable && !m[0].writable);
        assert_eq!(m[0].offset, 0x1000);
        assert_eq!(m[0].inode, 1234);
        assert_eq!(m[0].path, b"/usr/bin/prog");
        assert_eq!(m[1].path, b"[stack]");
        assert!(!m[2].readable);
        assert!(m[2].path.is_empty());
    }

    #[test]
    fn reads_own_maps_with_raw_syscalls() {
        let text = read_self_maps().expect("/proc/self/maps readable");
        let maps = parse_maps(&text);
        let here = reads_own_maps_with_raw_syscalls as fn() as usize as u64;
        assert!(maps
            .iter()
            .any(|m| m.start <= here && here < m.end && m.executable));
    }
}
