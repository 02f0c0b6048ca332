//! ELF/DWARF symbolication and in-process stack unwinding (to be written).
