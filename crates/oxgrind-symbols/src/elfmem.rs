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

/// `buf.len()` bytes at `addr`, copied by the kernel: `false` when any of them is no longer
/// mapped. The header and program headers of a mapping are read this way because the map
/// list is a snapshot: another thread may unmap the mapping between the list and the read
/// (the symbolizer's own view of an object file, a file the program maps and drops), and a
/// plain load would then fault inside an allocation hook.
fn copy_in(addr: u64, buf: &mut [u8]) -> bool {
    oxgrind_sys::raw::read_own_memory(addr, buf) == buf.len()
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Builds the module whose ELF header is mapped at `m.start`, or `None` when the mapping is
/// not the start of a 64-bit little-endian ELF object (or is gone by now).
pub(crate) fn module_at(maps: &[Mapping], m: &Mapping) -> Option<CfiModule> {
    if !m.readable || m.offset != 0 || m.end - m.start < 64 {
        return None;
    }
    let base = m.start;
    let mut header = [0u8; 64];
    if !copy_in(base, &mut header) || header[..6] != [0x7f, b'E', b'L', b'F', 2, 1] {
        return None;
    }
    let phoff = le_u64(&header, 32);
    let phentsize = usize::from(le_u16(&header, 54));
    let phnum = usize::from(le_u16(&header, 56));
    if phentsize < 56 || phnum == 0 || phnum > 512 {
        return None;
    }
    let ph_start = base.checked_add(phoff)?;
    let mut table = vec![0u8; phentsize * phnum];
    if !copy_in(ph_start, &mut table) {
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
    let phs: Vec<Ph> = table
        .chunks_exact(phentsize)
        .map(|p| Ph {
            kind: le_u32(p, 0),
            flags: le_u32(p, 4),
            offset: le_u64(p, 8),
            vaddr: le_u64(p, 16),
            filesz: le_u64(p, 32),
            memsz: le_u64(p, 40),
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
    // Only objects the loader mapped: their headers are read in place, and a data file the
    // program mapped may have been truncated (touching it would raise SIGBUS inside an
    // allocation hook).
    crate::maps::loaded_objects(maps)
        .into_iter()
        .filter(|o| o.base.path.first() == Some(&b'/') || o.base.path == b"[vdso]")
        .filter_map(|o| module_at(maps, o.base))
        .collect()
}
