//! The memory a system call's pointer arguments name, described once for every checker.
//!
//! Valgrind's syscall wrappers (`coregrind/m_syswrap/syswrap-*.c`) say, for each system call,
//! which of its arguments point at memory the kernel reads (`PRE_MEM_READ`, a NUL-terminated
//! string: `PRE_MEM_RASCIIZ`) or writes (`PRE_MEM_WRITE`), how long that memory is, and under
//! which name a problem is reported (`write(buf)`, `writev(vector[...])`,
//! `socketcall.sendto(msg)`). Memcheck checks those ranges for addressability ("Syscall param
//! write(buf) points to unaddressable byte(s)") and, for what the kernel reads, definedness
//! ("... points to uninitialised byte(s)"); what the kernel writes becomes defined afterwards.
//! This module is that description, as data ([`SYSCALLS`]) plus [`for_each_range`], which
//! turns one call's arguments into the concrete ranges in Valgrind's order, so that the
//! addressability check (Memcheck, through [`crate::Tool::before_syscall`]) and the definedness
//! engine use the same names and lengths.
//!
//! Some ranges depend on the memory itself (an `iovec` array's entries, a `msghdr`, a
//! `sockaddr`'s family, a string's NUL): [`for_each_range`] reads it through the caller's
//! `read`, which must never fault (the pointer may be wild: Valgrind's `safe_to_deref`);
//! a range whose description cannot be read is reported as far as it is known and its
//! dependants are skipped, as Valgrind does.
//!
//! Covered: the calls real programs make (read/write family, `readv`/`writev`,
//! `pread64`/`pwrite64`, `preadv`/`pwritev`, send/recv family with `sendmsg`/`recvmsg`,
//! `open`/`openat`, the stat family, `getdents64`, `poll`/`ppoll`/`select`/`pselect6`,
//! `epoll_wait`/`epoll_pwait`/`epoll_ctl`, `futex`, the clock and sleep calls,
//! `gettimeofday`, `ioctl`'s `TCGETS`/`TIOCGWINSZ`/`FIONREAD`, `getrandom`, `uname`,
//! `rt_sigaction`, `rt_sigprocmask`, `pipe`/`pipe2`, `socketpair`, `getsockname`,
//! `getpeername`, `connect`, `bind`, `accept`/`accept4`). The names are Valgrind 3.19's as it
//! prints them on x86-64 (glibc's `stat` is `newfstatat`, which Valgrind calls `fstatat`;
//! the socket calls keep their `socketcall.` prefix).

use core::fmt;

use crate::Addr;

/// Which way the kernel uses a range.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Dir {
    /// The kernel reads it (Valgrind's `PRE_MEM_READ` / `PRE_MEM_RASCIIZ`): it must be
    /// addressable and defined.
    Read,
    /// The kernel writes it (`PRE_MEM_WRITE`): it must be addressable; afterwards what the
    /// kernel wrote is defined.
    Write,
}

/// A parameter's name as Valgrind prints it: `head`, then `part`, then `tail`
/// (`socketcall.connect(serv_addr.` + `sa_family` + `)`; `sendmsg(msg.msg_iov[` + `0` + `])`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ParamName {
    pub head: &'static str,
    pub part: Part,
    pub tail: &'static str,
}

/// The variable middle of a [`ParamName`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Part {
    None,
    /// A field name (`sa_family`, `sin_port`, ...).
    Field(&'static str),
    /// An array index (`msg_iov[0]`).
    Index(u32),
}

impl ParamName {
    pub const fn plain(name: &'static str) -> ParamName {
        ParamName {
            head: name,
            part: Part::None,
            tail: "",
        }
    }

    /// The whole name when it has no variable part (most names).
    pub fn as_static(&self) -> Option<&'static str> {
        match self.part {
            Part::None if self.tail.is_empty() => Some(self.head),
            _ => None,
        }
    }
}

impl fmt::Display for ParamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.head)?;
        match self.part {
            Part::None => {}
            Part::Field(s) => f.write_str(s)?,
            Part::Index(i) => write!(f, "{i}")?,
        }
        f.write_str(self.tail)
    }
}

/// One range a system call reads or writes, found by [`for_each_range`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Range {
    pub name: ParamName,
    pub dir: Dir,
    pub addr: Addr,
    /// Bytes; for a NUL-terminated string, up to and including the NUL as far as it could
    /// be read (at least 1).
    pub len: u64,
    /// A NUL-terminated string (`PRE_MEM_RASCIIZ`).
    pub string: bool,
}

/// How long the memory behind a pointer argument is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Len {
    /// A fixed size (a struct).
    Fixed(u64),
    /// The value of argument `n` (0-based).
    Arg(u8),
    /// The value of argument `n` times a size (`epoll_wait`: `maxevents * 12`).
    ArgTimes(u8, u64),
    /// The value of argument `n` divided by 8 (`select`'s fd sets: `nfds / 8`, as Valgrind).
    ArgBits(u8),
    /// A NUL-terminated string.
    String,
}

/// A pointer argument whose memory is one range.
#[derive(Copy, Clone, Debug)]
pub struct Pointer {
    /// Which argument (0-based: rdi, rsi, rdx, r10, r8, r9).
    pub arg: u8,
    pub name: &'static str,
    pub dir: Dir,
    pub len: Len,
    /// NULL is allowed and means "no such memory" (Valgrind checks only a non-NULL pointer).
    pub optional: bool,
}

/// Calls whose memory is not a list of single ranges: the ranges come from code here.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Only the [`Pointer`]s.
    Plain,
    /// `readv`/`writev`/`preadv`/`pwritev`: argument 1 is an array of argument 2 `iovec`s
    /// (read, named `array`), each entry's buffer is `elem` in direction `dir`.
    Iovecs {
        array: &'static str,
        elem: &'static str,
        dir: Dir,
    },
    /// `poll` / `ppoll`: `nfds` `pollfd`s, each checked field by field.
    Poll { prefix: &'static str },
    /// `sendmsg` (`send: true`) / `recvmsg`: argument 1 is a `msghdr`.
    Msghdr { send: bool },
    /// A `sockaddr` the kernel reads (argument `addr`, its length argument `len`), named
    /// `head` + field + `)`.
    Sockaddr {
        addr: u8,
        len: u8,
        head: &'static str,
    },
    /// A buffer the kernel fills, its length in a `socklen_t` the program passes
    /// (`accept`, `getsockname`, `recvfrom`'s source): `len_name` is read (4 bytes), then
    /// `buf_name` is written for that many bytes.
    BufAndLen {
        buf: u8,
        len: u8,
        buf_name: &'static str,
        len_name: &'static str,
    },
    /// `rt_sigaction`: the new action field by field, then the old one.
    SigAction,
    /// `futex`: what its operation uses.
    Futex,
    /// `ioctl`: what its request uses (a few common terminal requests).
    Ioctl,
    /// `epoll_ctl`: the event, unless the operation is `EPOLL_CTL_DEL`.
    EpollCtl,
}

/// A system call's pointer arguments.
#[derive(Copy, Clone, Debug)]
pub struct Syscall {
    /// x86-64 number.
    pub nr: u64,
    pub name: &'static str,
    /// Single-range pointers, checked in this order, before `shape`'s ranges (except for
    /// [`Shape::Sockaddr`] and [`Shape::BufAndLen`] which come after, as in Valgrind).
    pub pointers: &'static [Pointer],
    pub shape: Shape,
}

const fn p(arg: u8, name: &'static str, dir: Dir, len: Len) -> Pointer {
    Pointer {
        arg,
        name,
        dir,
        len,
        optional: false,
    }
}

const fn opt(arg: u8, name: &'static str, dir: Dir, len: Len) -> Pointer {
    Pointer {
        arg,
        name,
        dir,
        len,
        optional: true,
    }
}

const fn call(nr: u64, name: &'static str, pointers: &'static [Pointer]) -> Syscall {
    Syscall {
        nr,
        name,
        pointers,
        shape: Shape::Plain,
    }
}

const fn shaped(
    nr: u64,
    name: &'static str,
    pointers: &'static [Pointer],
    shape: Shape,
) -> Syscall {
    Syscall {
        nr,
        name,
        pointers,
        shape,
    }
}

use Dir::{Read as R, Write as W};

/// `struct stat` on x86-64.
const STAT: u64 = 144;
/// `struct timespec`, `struct timeval`.
const TIMESPEC: u64 = 16;
/// The kernel's `sigset_t`.
const SIGSET: u64 = 8;

/// Every system call whose pointer arguments are described, by number.
pub const SYSCALLS: &[Syscall] = &[
    call(0, "read", &[p(1, "read(buf)", W, Len::Arg(2))]),
    call(1, "write", &[p(1, "write(buf)", R, Len::Arg(2))]),
    call(2, "open", &[p(0, "open(filename)", R, Len::String)]),
    call(
        4,
        "stat",
        &[
            p(0, "stat(file_name)", R, Len::String),
            p(1, "stat(buf)", W, Len::Fixed(STAT)),
        ],
    ),
    call(5, "fstat", &[p(1, "fstat(buf)", W, Len::Fixed(STAT))]),
    call(
        6,
        "lstat",
        &[
            p(0, "lstat(file_name)", R, Len::String),
            p(1, "lstat(buf)", W, Len::Fixed(STAT)),
        ],
    ),
    shaped(7, "poll", &[], Shape::Poll { prefix: "poll" }),
    shaped(13, "rt_sigaction", &[], Shape::SigAction),
    call(
        14,
        "rt_sigprocmask",
        &[
            opt(1, "rt_sigprocmask(set)", R, Len::Fixed(SIGSET)),
            opt(2, "rt_sigprocmask(oldset)", W, Len::Fixed(SIGSET)),
        ],
    ),
    shaped(16, "ioctl", &[], Shape::Ioctl),
    call(17, "pread64", &[p(1, "pread64(buf)", W, Len::Arg(2))]),
    call(18, "pwrite64", &[p(1, "pwrite64(buf)", R, Len::Arg(2))]),
    shaped(
        19,
        "readv",
        &[],
        Shape::Iovecs {
            array: "readv(vector)",
            elem: "readv(vector[...])",
            dir: W,
        },
    ),
    shaped(
        20,
        "writev",
        &[],
        Shape::Iovecs {
            array: "writev(vector)",
            elem: "writev(vector[...])",
            dir: R,
        },
    ),
    call(22, "pipe", &[p(0, "pipe(filedes)", W, Len::Fixed(8))]),
    call(
        23,
        "select",
        &[
            opt(1, "select(readfds)", R, Len::ArgBits(0)),
            opt(2, "select(writefds)", R, Len::ArgBits(0)),
            opt(3, "select(exceptfds)", R, Len::ArgBits(0)),
            opt(4, "select(timeout)", R, Len::Fixed(TIMESPEC)),
        ],
    ),
    call(
        35,
        "nanosleep",
        &[
            p(0, "nanosleep(req)", R, Len::Fixed(TIMESPEC)),
            opt(1, "nanosleep(rem)", W, Len::Fixed(TIMESPEC)),
        ],
    ),
    shaped(
        42,
        "connect",
        &[],
        Shape::Sockaddr {
            addr: 1,
            len: 2,
            head: "socketcall.connect(serv_addr.",
        },
    ),
    shaped(
        43,
        "accept",
        &[],
        Shape::BufAndLen {
            buf: 1,
            len: 2,
            buf_name: "socketcall.accept(addr)",
            len_name: "socketcall.accept(addrlen_in)",
        },
    ),
    shaped(
        44,
        "sendto",
        &[p(1, "socketcall.sendto(msg)", R, Len::Arg(2))],
        Shape::Sockaddr {
            addr: 4,
            len: 5,
            head: "socketcall.sendto(to.",
        },
    ),
    shaped(
        45,
        "recvfrom",
        &[p(1, "socketcall.recvfrom(buf)", W, Len::Arg(2))],
        Shape::BufAndLen {
            buf: 4,
            len: 5,
            buf_name: "socketcall.recvfrom(from)",
            len_name: "socketcall.recvfrom(fromlen_in)",
        },
    ),
    shaped(46, "sendmsg", &[], Shape::Msghdr { send: true }),
    shaped(47, "recvmsg", &[], Shape::Msghdr { send: false }),
    shaped(
        49,
        "bind",
        &[],
        Shape::Sockaddr {
            addr: 1,
            len: 2,
            head: "socketcall.bind(my_addr.",
        },
    ),
    shaped(
        51,
        "getsockname",
        &[],
        Shape::BufAndLen {
            buf: 1,
            len: 2,
            buf_name: "socketcall.getsockname(name)",
            len_name: "socketcall.getsockname(namelen_in)",
        },
    ),
    shaped(
        52,
        "getpeername",
        &[],
        Shape::BufAndLen {
            buf: 1,
            len: 2,
            buf_name: "socketcall.getpeername(name)",
            len_name: "socketcall.getpeername(namelen_in)",
        },
    ),
    call(
        53,
        "socketpair",
        &[p(3, "socketcall.socketpair(sv)", W, Len::Fixed(8))],
    ),
    // struct new_utsname: 6 fields of 65 bytes.
    call(63, "uname", &[p(0, "uname(buf)", W, Len::Fixed(390))]),
    call(
        96,
        "gettimeofday",
        &[
            opt(0, "gettimeofday(tv)", W, Len::Fixed(TIMESPEC)),
            opt(1, "gettimeofday(tz)", W, Len::Fixed(8)),
        ],
    ),
    shaped(202, "futex", &[], Shape::Futex),
    call(
        217,
        "getdents64",
        &[p(1, "getdents64(dirp)", W, Len::Arg(2))],
    ),
    call(
        228,
        "clock_gettime",
        &[p(1, "clock_gettime(tp)", W, Len::Fixed(TIMESPEC))],
    ),
    call(
        229,
        "clock_getres",
        &[opt(1, "clock_getres(res)", W, Len::Fixed(TIMESPEC))],
    ),
    call(
        230,
        "clock_nanosleep",
        &[
            p(2, "clock_nanosleep(rqtp)", R, Len::Fixed(TIMESPEC)),
            opt(3, "clock_nanosleep(rmtp)", W, Len::Fixed(TIMESPEC)),
        ],
    ),
    // struct epoll_event is packed on x86-64: 12 bytes.
    call(
        232,
        "epoll_wait",
        &[p(1, "epoll_wait(events)", W, Len::ArgTimes(2, 12))],
    ),
    shaped(233, "epoll_ctl", &[], Shape::EpollCtl),
    call(257, "openat", &[p(1, "openat(filename)", R, Len::String)]),
    call(
        262,
        "newfstatat",
        &[
            p(1, "fstatat(file_name)", R, Len::String),
            p(2, "fstatat(buf)", W, Len::Fixed(STAT)),
        ],
    ),
    call(
        270,
        "pselect6",
        &[
            opt(1, "pselect6(readfds)", R, Len::ArgBits(0)),
            opt(2, "pselect6(writefds)", R, Len::ArgBits(0)),
            opt(3, "pselect6(exceptfds)", R, Len::ArgBits(0)),
            opt(4, "pselect6(timeout)", R, Len::Fixed(TIMESPEC)),
            // struct { const sigset_t *ss; size_t ss_len; }
            opt(5, "pselect6(sig)", R, Len::Fixed(16)),
        ],
    ),
    shaped(
        271,
        "ppoll",
        &[
            opt(2, "ppoll(tsp)", R, Len::Fixed(TIMESPEC)),
            opt(3, "ppoll(sigmask)", R, Len::Fixed(SIGSET)),
        ],
        Shape::Poll { prefix: "ppoll" },
    ),
    call(
        281,
        "epoll_pwait",
        &[
            p(1, "epoll_pwait(events)", W, Len::ArgTimes(2, 12)),
            opt(4, "epoll_pwait(sigmask)", R, Len::Fixed(SIGSET)),
        ],
    ),
    shaped(
        288,
        "accept4",
        &[],
        Shape::BufAndLen {
            buf: 1,
            len: 2,
            buf_name: "socketcall.accept(addr)",
            len_name: "socketcall.accept(addrlen_in)",
        },
    ),
    call(293, "pipe2", &[p(0, "pipe2(filedes)", W, Len::Fixed(8))]),
    shaped(
        295,
        "preadv",
        &[],
        Shape::Iovecs {
            array: "preadv(vector)",
            elem: "preadv(vector[...])",
            dir: W,
        },
    ),
    shaped(
        296,
        "pwritev",
        &[],
        Shape::Iovecs {
            array: "pwritev(vector)",
            elem: "pwritev(vector[...])",
            dir: R,
        },
    ),
    call(318, "getrandom", &[p(0, "getrandom(cpu)", W, Len::Arg(1))]),
    call(
        332,
        "statx",
        &[
            p(1, "statx(filename)", R, Len::String),
            // struct statx
            p(4, "statx(buf)", W, Len::Fixed(256)),
        ],
    ),
];

/// The description of system call `nr`, if it has pointer arguments we know.
pub fn lookup(nr: u64) -> Option<&'static Syscall> {
    SYSCALLS.iter().find(|s| s.nr == nr)
}

/// Longest string [`for_each_range`] follows looking for its NUL (`PATH_MAX`).
pub const MAX_STRING: u64 = 4096;

/// Calls `f` with every range system call `nr` with arguments `args` (rdi, rsi, rdx, r10,
/// r8, r9) will read or write, in the order Valgrind checks them. `read(addr, buf)` copies
/// the program's memory at `addr` into `buf` and returns how many bytes it could (never
/// faulting); it is used for what the description itself lives in (iovec entries, a
/// `msghdr`, a string's length).
pub fn for_each_range(
    nr: u64,
    args: &[u64; 6],
    read: &mut dyn FnMut(Addr, &mut [u8]) -> usize,
    f: &mut dyn FnMut(&Range),
) {
    let Some(sc) = lookup(nr) else {
        return;
    };
    let mut r = Reader { read };
    for ptr in sc.pointers {
        let addr = args[ptr.arg as usize];
        if ptr.optional && addr == 0 {
            continue;
        }
        let name = ParamName::plain(ptr.name);
        match ptr.len {
            Len::String => f(&r.string(name, addr)),
            len => {
                let len = match len {
                    Len::Fixed(n) => n,
                    Len::Arg(n) => args[n as usize],
                    Len::ArgTimes(n, size) => args[n as usize].saturating_mul(size),
                    Len::ArgBits(n) => args[n as usize] as u32 as u64 / 8,
                    Len::String => unreachable!(),
                };
                emit(f, name, ptr.dir, addr, len);
            }
        }
    }
    match sc.shape {
        Shape::Plain => {}
        Shape::Iovecs { array, elem, dir } => {
            let (vec, count) = (args[1], args[2] as u32 as u64);
            // The kernel refuses more than UIO_MAXIOV entries; so does Valgrind's check.
            if count > 1024 {
                return;
            }
            emit(f, ParamName::plain(array), R, vec, count * 16);
            for i in 0..count {
                let (Some(base), Some(len)) = (r.u64(vec + 16 * i), r.u64(vec + 16 * i + 8)) else {
                    break;
                };
                emit(f, ParamName::plain(elem), dir, base, len);
            }
        }
        Shape::Poll { prefix } => poll(&mut r, f, prefix, args[0], args[1] as u32 as u64),
        Shape::Msghdr { send } => msghdr(&mut r, f, send, args[1]),
        Shape::Sockaddr { addr, len, head } => sockaddr(
            &mut r,
            f,
            head,
            args[addr as usize],
            args[len as usize] as u32 as u64,
        ),
        Shape::BufAndLen {
            buf,
            len,
            buf_name,
            len_name,
        } => {
            let (buf, len_p) = (args[buf as usize], args[len as usize]);
            if buf == 0 || len_p == 0 {
                return;
            }
            emit(f, ParamName::plain(len_name), R, len_p, 4);
            if let Some(n) = r.u32(len_p) {
                emit(f, ParamName::plain(buf_name), W, buf, n as u64);
            }
        }
        Shape::SigAction => {
            let (act, old) = (args[1], args[2]);
            if act != 0 {
                // The kernel's struct sigaction: handler, flags, restorer, mask.
                emit(
                    f,
                    ParamName::plain("rt_sigaction(act->sa_handler)"),
                    R,
                    act,
                    8,
                );
                emit(
                    f,
                    ParamName::plain("rt_sigaction(act->sa_mask)"),
                    R,
                    act + 24,
                    8,
                );
                emit(
                    f,
                    ParamName::plain("rt_sigaction(act->sa_flags)"),
                    R,
                    act + 8,
                    8,
                );
                const SA_RESTORER: u64 = 0x0400_0000;
                if r.u64(act + 8).is_some_and(|fl| fl & SA_RESTORER != 0) {
                    let name = ParamName::plain("rt_sigaction(act->sa_restorer)");
                    emit(f, name, R, act + 16, 8);
                }
            }
            if old != 0 {
                emit(f, ParamName::plain("rt_sigaction(oldact)"), W, old, 32);
            }
        }
        Shape::Futex => {
            const PRIVATE: u64 = 128;
            const CLOCK_REALTIME: u64 = 256;
            let futex = ParamName::plain("futex(futex)");
            match args[1] & !(PRIVATE | CLOCK_REALTIME) {
                // WAIT, LOCK_PI, WAIT_BITSET, WAIT_REQUEUE_PI
                0 | 6 | 9 | 11 => {
                    emit(f, futex, R, args[0], 4);
                    if args[3] != 0 {
                        emit(f, ParamName::plain("futex(timeout)"), R, args[3], TIMESPEC);
                    }
                }
                // REQUEUE, CMP_REQUEUE, WAKE_OP, CMP_REQUEUE_PI
                3 | 4 | 5 | 12 => {
                    emit(f, futex, R, args[0], 4);
                    emit(f, ParamName::plain("futex(futex2)"), R, args[4], 4);
                }
                // UNLOCK_PI, TRYLOCK_PI: the kernel reads and writes the word.
                7 | 8 => emit(f, futex, R, args[0], 4),
                // WAKE, WAKE_BITSET, FD: the kernel only hashes the address (Valgrind checks
                // the word): with threads in parallel, a waker may wake a word in a frame
                // its waiter has already returned from (glibc's unlock after the waiter saw
                // the lock free without sleeping), which Valgrind's serialised threads
                // never show: node's worker threads gave "futex(futex) points to
                // uninitialised byte(s)" now and then.
                1 | 2 | 10 => {}
                _ => {}
            }
        }
        Shape::Ioctl => {
            let (name, len) = match args[1] as u32 {
                // struct termios as the kernel has it (Valgrind's vki_termios).
                0x5401 => ("ioctl(TCGETS)", 36),
                0x5413 => ("ioctl(TIOCGWINSZ)", 8),
                0x541B => ("ioctl(FIONREAD)", 4),
                _ => return,
            };
            emit(f, ParamName::plain(name), W, args[2], len);
        }
        Shape::EpollCtl => {
            const EPOLL_CTL_DEL: u64 = 2;
            if args[1] as u32 as u64 != EPOLL_CTL_DEL {
                // Valgrind checks the `events` word only.
                emit(f, ParamName::plain("epoll_ctl(event)"), R, args[3], 4);
            }
        }
    }
}

fn emit(f: &mut dyn FnMut(&Range), name: ParamName, dir: Dir, addr: Addr, len: u64) {
    if len > 0 {
        f(&Range {
            name,
            dir,
            addr,
            len,
            string: false,
        });
    }
}

/// Reads the program's memory for [`for_each_range`], never faulting.
struct Reader<'a> {
    read: &'a mut dyn FnMut(Addr, &mut [u8]) -> usize,
}

impl Reader<'_> {
    fn bytes<const N: usize>(&mut self, addr: Addr) -> Option<[u8; N]> {
        let mut b = [0u8; N];
        ((self.read)(addr, &mut b) == N).then_some(b)
    }

    fn u64(&mut self, addr: Addr) -> Option<u64> {
        self.bytes::<8>(addr).map(u64::from_le_bytes)
    }

    fn u32(&mut self, addr: Addr) -> Option<u32> {
        self.bytes::<4>(addr).map(u32::from_le_bytes)
    }

    fn u16(&mut self, addr: Addr) -> Option<u16> {
        self.bytes::<2>(addr).map(u16::from_le_bytes)
    }

    /// The string at `addr` as a range: up to and including its NUL, or as far as it could
    /// be read (at least one byte, so that a wild pointer is still checked).
    fn string(&mut self, name: ParamName, addr: Addr) -> Range {
        let mut len = 0u64;
        let mut chunk = [0u8; 256];
        'scan: while len < MAX_STRING {
            let a = addr + len;
            // Never read across a page boundary in one go: the next page may be unmapped
            // while the string ends before it.
            let to_page = 4096 - (a & 4095);
            let want = (chunk.len() as u64).min(to_page) as usize;
            let got = (self.read)(a, &mut chunk[..want]);
            if got == 0 {
                break;
            }
            for &b in &chunk[..got] {
                len += 1;
                if b == 0 {
                    break 'scan;
                }
            }
            if got < want {
                break;
            }
        }
        Range {
            name,
            dir: Dir::Read,
            addr,
            len: len.max(1),
            string: true,
        }
    }
}

fn poll(r: &mut Reader, f: &mut dyn FnMut(&Range), prefix: &'static str, ufds: Addr, n: u64) {
    let (fd, events, revents) = match prefix {
        "ppoll" => (
            "ppoll(ufds.fd)",
            "ppoll(ufds.events)",
            "ppoll(ufds.revents)",
        ),
        _ => ("poll(ufds.fd)", "poll(ufds.events)", "poll(ufds.revents)"),
    };
    for i in 0..n.min(1 << 20) {
        let e = ufds + 8 * i;
        emit(f, ParamName::plain(fd), R, e, 4);
        let Some(v) = r.u32(e) else {
            break;
        };
        if (v as i32) >= 0 {
            emit(f, ParamName::plain(events), R, e + 4, 2);
        }
        emit(f, ParamName::plain(revents), W, e + 6, 2);
    }
}

/// `struct msghdr` (x86-64): name 0, namelen 8, iov 16, iovlen 24, control 32,
/// controllen 40, flags 48.
fn msghdr(r: &mut Reader, f: &mut dyn FnMut(&Range), send: bool, msg: Addr) {
    if msg == 0 {
        return;
    }
    let n = |s: &'static str, r: &'static str| if send { s } else { r };
    // The header fields the kernel reads, as one range; recvmsg's kernel writes msg_flags.
    emit(
        f,
        ParamName::plain(n("sendmsg(msg)", "recvmsg(msg)")),
        R,
        msg,
        48,
    );
    let dir = if send { R } else { W };
    if !send {
        emit(f, ParamName::plain("recvmsg(msg)"), W, msg + 48, 4);
    }
    let name = r.u64(msg);
    let namelen = r.u32(msg + 8);
    if let (Some(name), Some(namelen)) = (name, namelen) {
        if name != 0 {
            let p = ParamName::plain(n("sendmsg(msg.msg_name)", "recvmsg(msg.msg_name)"));
            emit(f, p, dir, name, namelen as u64);
        }
    }
    if let (Some(iov), Some(iovlen)) = (r.u64(msg + 16), r.u64(msg + 24)) {
        if iov != 0 && iovlen <= 1024 {
            let p = ParamName::plain(n("sendmsg(msg.msg_iov)", "recvmsg(msg.msg_iov)"));
            emit(f, p, R, iov, iovlen * 16);
            for i in 0..iovlen {
                let (Some(base), Some(len)) = (r.u64(iov + 16 * i), r.u64(iov + 16 * i + 8)) else {
                    break;
                };
                let p = ParamName {
                    head: n("sendmsg(msg.msg_iov[", "recvmsg(msg.msg_iov["),
                    part: Part::Index(i as u32),
                    tail: "])",
                };
                emit(f, p, dir, base, len);
            }
        }
    }
    if let (Some(control), Some(len)) = (r.u64(msg + 32), r.u64(msg + 40)) {
        if control != 0 {
            let p = ParamName::plain(n("sendmsg(msg.msg_control)", "recvmsg(msg.msg_control)"));
            emit(f, p, dir, control, len);
        }
    }
}

/// A `sockaddr` the kernel reads, field by field as Valgrind's `pre_mem_read_sockaddr`.
fn sockaddr(r: &mut Reader, f: &mut dyn FnMut(&Range), head: &'static str, sa: Addr, len: u64) {
    if sa == 0 || len == 0 {
        return;
    }
    let field = |s: &'static str| ParamName {
        head,
        part: Part::Field(s),
        tail: ")",
    };
    emit(f, field("sa_family"), R, sa, 2);
    const AF_UNSPEC: u16 = 0;
    const AF_UNIX: u16 = 1;
    const AF_INET: u16 = 2;
    const AF_INET6: u16 = 10;
    const AF_NETLINK: u16 = 16;
    match r.u16(sa) {
        None | Some(AF_UNSPEC) => {}
        Some(AF_UNIX) => {
            let mut s = r.string(field("sun_path"), sa + 2);
            s.name = field("sun_path");
            f(&s);
        }
        Some(AF_INET) => {
            emit(f, field("sin_port"), R, sa + 2, 2);
            emit(f, field("sin_addr"), R, sa + 4, 4);
        }
        Some(AF_INET6) => {
            emit(f, field("sin6_port"), R, sa + 2, 2);
            emit(f, field("sin6_flowinfo"), R, sa + 4, 4);
            emit(f, field("sin6_addr"), R, sa + 8, 16);
            emit(f, field("sin6_scope_id"), R, sa + 24, 4);
        }
        Some(AF_NETLINK) => {
            emit(f, field("nl_pid"), R, sa + 4, 4);
            emit(f, field("nl_groups"), R, sa + 8, 4);
        }
        Some(_) => emit(f, field("sa_data"), R, sa + 2, len.saturating_sub(2)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::{String, ToString};
    use alloc::vec::Vec;

    /// A fake address space: `(addr, bytes)` regions.
    fn ranges_of(nr: u64, args: [u64; 6], mem: &[(Addr, &[u8])]) -> Vec<(String, Dir, Addr, u64)> {
        let mut out = Vec::new();
        let mut read = |a: Addr, buf: &mut [u8]| {
            for (base, bytes) in mem {
                if a >= *base && a < base + bytes.len() as u64 {
                    let off = (a - base) as usize;
                    let n = buf.len().min(bytes.len() - off);
                    buf[..n].copy_from_slice(&bytes[off..off + n]);
                    return n;
                }
            }
            0
        };
        for_each_range(nr, &args, &mut read, &mut |r| {
            out.push((r.name.to_string(), r.dir, r.addr, r.len))
        });
        out
    }

    #[test]
    fn write_reads_its_buffer_for_count_bytes() {
        let r = ranges_of(1, [1, 0x1000, 16, 0, 0, 0], &[]);
        assert_eq!(r, [("write(buf)".to_string(), Dir::Read, 0x1000, 16)]);
    }

    #[test]
    fn a_zero_count_checks_nothing() {
        assert!(ranges_of(0, [0, 0x1000, 0, 0, 0, 0], &[]).is_empty());
    }

    #[test]
    fn strings_end_at_their_nul_or_where_memory_ends() {
        let r = ranges_of(257, [0, 0x2000, 0, 0, 0, 0], &[(0x2000, b"/tmp/x\0junk")]);
        assert_eq!(r, [("openat(filename)".to_string(), Dir::Read, 0x2000, 7)]);
        let r = ranges_of(257, [0, 0x2000, 0, 0, 0, 0], &[(0x2000, b"abc")]);
        assert_eq!(r[0].3, 3);
        // A wild pointer still gives one byte to check.
        let r = ranges_of(257, [0, 0x9000, 0, 0, 0, 0], &[]);
        assert_eq!(r[0].3, 1);
    }

    #[test]
    fn writev_checks_the_array_then_each_buffer() {
        let mut iov = Vec::new();
        for (b, l) in [(0x5000u64, 4u64), (0x6000, 8)] {
            iov.extend_from_slice(&b.to_le_bytes());
            iov.extend_from_slice(&l.to_le_bytes());
        }
        let r = ranges_of(20, [1, 0x4000, 2, 0, 0, 0], &[(0x4000, &iov)]);
        let names: Vec<_> = r.iter().map(|x| (x.0.as_str(), x.2, x.3)).collect();
        assert_eq!(
            names,
            [
                ("writev(vector)", 0x4000, 32),
                ("writev(vector[...])", 0x5000, 4),
                ("writev(vector[...])", 0x6000, 8)
            ]
        );
    }

    #[test]
    fn sendmsg_names_each_iovec_by_its_index() {
        let mut msg = [0u8; 56];
        msg[16..24].copy_from_slice(&0x7000u64.to_le_bytes());
        msg[24..32].copy_from_slice(&1u64.to_le_bytes());
        let mut iov = [0u8; 16];
        iov[..8].copy_from_slice(&0x8000u64.to_le_bytes());
        iov[8..].copy_from_slice(&12u64.to_le_bytes());
        let r = ranges_of(
            46,
            [3, 0x6000, 0, 0, 0, 0],
            &[(0x6000, &msg), (0x7000, &iov)],
        );
        let names: Vec<_> = r.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "sendmsg(msg)",
                "sendmsg(msg.msg_iov)",
                "sendmsg(msg.msg_iov[0])"
            ]
        );
        assert_eq!(r[2].2, 0x8000);
        assert_eq!(r[2].3, 12);
    }

    #[test]
    fn poll_checks_each_entry_field_by_field() {
        let fds = [0xffu8, 0xff, 0xff, 0xff, 0, 0, 0, 0];
        let r = ranges_of(7, [0x3000, 2, 0, 0, 0, 0], &[(0x3000, &fds)]);
        let names: Vec<_> = r.iter().map(|x| (x.0.as_str(), x.2)).collect();
        // Entry 0 has a negative fd (events unread); entry 1 cannot be read: only its fd.
        assert_eq!(
            names,
            [
                ("poll(ufds.fd)", 0x3000),
                ("poll(ufds.revents)", 0x3006),
                ("poll(ufds.fd)", 0x3008)
            ]
        );
    }

    #[test]
    fn sockaddr_fields_follow_the_family() {
        let mut sa = [0u8; 16];
        sa[0] = 2; // AF_INET
        let r = ranges_of(42, [3, 0x3000, 16, 0, 0, 0], &[(0x3000, &sa)]);
        let names: Vec<_> = r.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "socketcall.connect(serv_addr.sa_family)",
                "socketcall.connect(serv_addr.sin_port)",
                "socketcall.connect(serv_addr.sin_addr)"
            ]
        );
    }

    #[test]
    fn every_number_is_described_once() {
        for (i, a) in SYSCALLS.iter().enumerate() {
            assert!(SYSCALLS[i + 1..].iter().all(|b| b.nr != a.nr), "{}", a.name);
        }
    }
}
