//! Loaded ELF modules as they lie in memory: load bias, executable ranges and the
//! `.eh_frame_hdr` / `.eh_frame` data the unwinder interprets.
//!
//! Everything is found from the program headers that the loader maps with the first
//! `PT_LOAD` segment (`PT_GNU_EH_FRAME` points at `.eh_frame_hdr`), so stripped objects
//! without section headers in memory work, and nothing is read from disk.

use alloc::vec::Vec;

use gimli::{BaseAddresses, EhFrame, EhFrameHdr, EndianSlice, LittleEndian, ParsedEhFrameHdr};

use crate::maps::Mapping;

pub(crate) type Slice = EndianSlice<'static, LittleEndian>;

const PT_LOAD: u32 = 1;
const PT_GNU_EH_FRAME: u32 = 0x6474_e550;
const PF_X: u32 = 1;

/// One module's call-frame information, borrowed from the module's own memory.
pub(crate) struct CfiModule {
    /// Address of the ELF header (start of the mapping with file offset 0).
    pub base: u64,
    /// Executable segments, `[start, end)`.
    pub text: Vec<(u64, u64)>,
    pub inode: u64,
    pub path: Vec<u8>,
    pub cfi: Option<Cfi>,
}

pub(crate) struct Cfi {
    pub hdr: ParsedEhFrameHdr<Slice>,
    pub eh_frame: EhFrame<Slice>,
    pub bases: BaseAddresses,
}

/// Is `[addr, addr+len)` inside one readable mapping of `maps`?
fn readable(maps: &[Mapping], addr: u64, len: u64) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    // Adjacent readable mappings of one object are common (r-- then r-x): allow a range to
    // span several contiguous readable mappings.
    let mut cur = addr;
    while cur < end {
        match maps
            .iter()
            .find(|m| m.readable && m.start <= cur && cur < m.end)
        {
            Some(m) => cur = m.end,
            None => return false,
        }
    }
    true
}

fn read_u16(p: u64) -> u16 {
    // SAFETY: callers check with `readable` that [p, p+2) lies in a readable mapping.
    unsafe { core::ptr::read_unaligned(p as *const u16) }
}
fn read_u32(p: u64) -> u32 {
    // SAFETY: as read_u16.
    unsafe { core::ptr::read_unaligned(p as *const u32) }
}
fn read_u64(p: u64) -> u64 {
    // SAFETY: as read_u16.
    unsafe { core::ptr::read_unaligned(p as *const u64) }
}

/// Builds the module whose ELF header is mapped at `m.start`, or `None` when the mapping is
/// not the start of a 64-bit little-endian ELF object.
pub(crate) fn module_at(maps: &[Mapping], m: &Mapping) -> Option<CfiModule> {
    if !m.readable || m.offset != 0 || m.end - m.start < 64 {
        return None;
    }
    let base = m.start;
    // SAFETY: the mapping is readable and at least 64 bytes long (checked above).
    let ident = unsafe { core::ptr::read_unaligned(base as *const [u8; 6]) };
    if ident != [0x7f, b'E', b'L', b'F', 2, 1] {
        return None;
    }
    let phoff = read_u64(base + 32);
    let phentsize = u64::from(read_u16(base + 54));
    let phnum = u64::from(read_u16(base + 56));
    if phentsize < 56 || phnum == 0 || phnum > 512 {
        return None;
    }
    let ph_start = base.checked_add(phoff)?;
    if !readable(maps, ph_start, phentsize * phnum) {
        return None;
    }
    struct Ph {
        kind: u32,
        flags: u32,
        offset: u64,
        vaddr: u64,
        filesz: u64,
        memsz: u64,
    }
    let phs: Vec<Ph> = (0..phnum)
        .map(|i| {
            let p = ph_start + i * phentsize;
            Ph {
                kind: read_u32(p),
                flags: read_u32(p + 4),
                offset: read_u64(p + 8),
                vaddr: read_u64(p + 16),
                filesz: read_u64(p + 32),
                memsz: read_u64(p + 40),
            }
        })
        .collect();
    let first_load = phs.iter().find(|p| p.kind == PT_LOAD && p.offset == 0)?;
    let bias = base.wrapping_sub(first_load.vaddr & !0xfff);
    let text: Vec<(u64, u64)> = phs
        .iter()
        .filter(|p| p.kind == PT_LOAD && p.flags & PF_X != 0 && p.memsz > 0)
        .map(|p| {
            (
                bias.wrapping_add(p.vaddr),
                bias.wrapping_add(p.vaddr).wrapping_add(p.memsz),
            )
        })
        // An object the program merely mmap'ed (not loaded) has no executable mapping there.
        .filter(|&(s, _)| {
            maps.iter()
                .any(|m| m.executable && m.start <= s && s < m.end)
        })
        .collect();
    if text.is_empty() {
        return None;
    }
    let cfi = phs
        .iter()
        .find(|p| p.kind == PT_GNU_EH_FRAME)
        .and_then(|eh| {
            let hdr_addr = bias.wrapping_add(eh.vaddr);
            if eh.memsz == 0 || eh.memsz > 1 << 30 || !readable(maps, hdr_addr, eh.memsz) {
                return None;
            }
            // SAFETY: [hdr_addr, hdr_addr+memsz) is readable (checked) and stays mapped while the
            // object is loaded; see the crate docs on dlclose.
            let hdr_bytes: &'static [u8] =
                unsafe { core::slice::from_raw_parts(hdr_addr as *const u8, eh.memsz as usize) };
            let mut bases = BaseAddresses::default().set_eh_frame_hdr(hdr_addr);
            let hdr = EhFrameHdr::new(hdr_bytes, LittleEndian)
                .parse(&bases, 8)
                .ok()?;
            let eh_frame_addr = match hdr.eh_frame_ptr() {
                gimli::Pointer::Direct(a) => a,
                gimli::Pointer::Indirect(_) => return None,
            };
            // .eh_frame has no length in memory: it runs at most to the end of its segment.
            let seg = phs.iter().find(|p| {
                p.kind == PT_LOAD
                    && bias.wrapping_add(p.vaddr) <= eh_frame_addr
                    && eh_frame_addr < bias.wrapping_add(p.vaddr).wrapping_add(p.filesz)
            })?;
            let seg_end = bias.wrapping_add(seg.vaddr).wrapping_add(seg.filesz);
            let len = seg_end - eh_frame_addr;
            if !readable(maps, eh_frame_addr, len) {
                return None;
            }
            // SAFETY: checked readable just above; same lifetime argument as hdr_bytes.
            let frame_bytes: &'static [u8] =
                unsafe { core::slice::from_raw_parts(eh_frame_addr as *const u8, len as usize) };
            bases = bases.set_eh_frame(eh_frame_addr).set_text(text[0].0);
            let mut eh_frame = EhFrame::new(frame_bytes, LittleEndian);
            eh_frame.set_address_size(8);
            hdr.table()?; // a header without a search table is useless for lookups
            Some(Cfi {
                hdr,
                eh_frame,
                bases,
            })
        });
    Some(CfiModule {
        base,
        text,
        inode: m.inode,
        path: m.path.clone(),
        cfi,
    })
}

/// Every ELF object mapped in `maps` (the main program, shared libraries, the vDSO).
pub(crate) fn modules_from_maps(maps: &[Mapping]) -> Vec<CfiModule> {
    maps.iter()
        .filter(|m| {
            m.offset == 0 && m.readable && (m.path.first() == Some(&b'/') || m.path == b"[vdso]")
        })
        // A loaded object always has executable code mapped from the same file. Requiring it
        // keeps the header read away from data files the program mmap'ed (which may have
        // been truncated: touching them would raise SIGBUS inside an allocation hook).
        .filter(|m| {
            maps.iter()
                .any(|x| x.executable && x.inode == m.inode && x.path == m.path)
        })
        .filter_map(|m| module_at(maps, m))
        .collect()
}
