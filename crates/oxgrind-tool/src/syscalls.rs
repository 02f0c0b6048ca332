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
//! After the call, [`for_each_written`] gives what the kernel wrote (Valgrind's
//! `POST_MEM_WRITE`s: the whole struct, or as many bytes as the call returned, read from
//! the memory as the call left it), which the definedness engine marks defined: a call
//! missing here leaves its output undefined, and the program's branch on it is a false
//! alarm (`find`'s `fstatfs` buffer gave 3000).
//!
//! Covered: the calls real programs make (read/write family, `readv`/`writev`,
//! `pread64`/`pwrite64`, `preadv`/`pwritev`, `process_vm_readv`, send/recv family with
//! `sendmsg`/`recvmsg`/`sendmmsg`/`recvmmsg`, `getsockopt`, `open`/`openat`, the stat and
//! statfs families, `getdents`/`getdents64`, `readlink`/`readlinkat`, `getcwd`, the xattr
//! gets and lists, `poll`/`ppoll`/`select`/`pselect6`, `epoll_wait`/`epoll_pwait`/
//! `epoll_ctl`, `futex`, the clock, sleep and timer calls (itimers, timerfd, POSIX timers),
//! `gettimeofday`, `time`, `times`, `getrusage`, `getrlimit`/`prlimit64`, `sysinfo`, `uname`,
//! `wait4`/`waitid`, `ioctl` (the terminal requests Valgrind names, else the `_IOC`
//! encoding), `fcntl`'s locks, `prctl`'s and `arch_prctl`'s gets, `clone`/`clone3`'s thread
//! ids, `getrandom`, `rt_sigaction`, `rt_sigprocmask`, `rt_sigpending`, `rt_sigtimedwait`,
//! `sigaltstack`, the id calls (`getresuid`, `getgroups`, `capget`), the scheduler's gets,
//! `getcpu`, `mincore`, `get_robust_list`, `sendfile`/`splice`/`copy_file_range`, SysV IPC
//! (`msgrcv`, `semctl`/`shmctl` `IPC_STAT`), `mq_timedreceive`, `name_to_handle_at`,
//! `pipe`/`pipe2`, `socketpair`, `getsockname`, `getpeername`, `connect`, `bind`,
//! `accept`/`accept4`). The names are Valgrind 3.19's as it prints them on x86-64 (glibc's
//! `stat` is `newfstatat`, which Valgrind calls `fstatat`; the socket calls keep their
//! `socketcall.` prefix; a struct Valgrind checks field by field is described so).

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
    /// Two indexes with text between (`recvmmsg`'s `mmsg[` 1 `].msg_hdr.msg_iov[` 0 `]`).
    Index2(u32, &'static str, u32),
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
            Part::Index2(i, mid, j) => write!(f, "{i}{mid}{j}")?,
        }
        f.write_str(self.tail)
    }
}

/// One range a system call reads or writes, found by [`for_each_range`] (or, after the
/// call, one it wrote: [`for_each_written`]).
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
    /// The value of argument `n` (an `int`: its low 32 bits) times a size (`epoll_wait`:
    /// `maxevents * 12`).
    ArgTimes(u8, u64),
    /// The value of argument `n` divided by 8 (`select`'s fd sets: `nfds / 8`, as Valgrind).
    ArgBits(u8),
    /// The pages argument `n` bytes span, one byte each (`mincore`'s vector).
    ArgPages(u8),
    /// A NUL-terminated string.
    String,
}

/// What the kernel has written of a [`Pointer`]'s memory once the call returned (Valgrind's
/// `POST_MEM_WRITE`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Post {
    /// Nothing (memory the kernel only reads).
    Never,
    /// All of it, when the call succeeded.
    Whole,
    /// As many bytes as the call returned, at most all of it (`read`'s buffer).
    Result,
    /// The call's result times a size, at most all of it (`epoll_wait`'s events).
    ResultTimes(u64),
    /// All of it, only when the call failed with `EINTR` (`nanosleep`'s remainder).
    Interrupted,
}

/// A pointer argument whose memory is one range.
#[derive(Copy, Clone, Debug)]
pub struct Pointer {
    /// Which argument (0-based: rdi, rsi, rdx, r10, r8, r9).
    pub arg: u8,
    /// Where the range starts past the pointer (a field of the struct it points at:
    /// `getitimer(&value->it_value)` is its `tv_sec` and its `tv_usec`, checked one by one).
    pub off: u8,
    pub name: &'static str,
    pub dir: Dir,
    pub len: Len,
    /// NULL is allowed and means "no such memory" (Valgrind checks only a non-NULL pointer).
    pub optional: bool,
    pub post: Post,
}

impl Pointer {
    /// The kernel writes as many bytes as the call returns.
    const fn res(mut self) -> Pointer {
        self.post = Post::Result;
        self
    }

    /// The kernel writes the call's result times `size` bytes.
    const fn res_times(mut self, size: u64) -> Pointer {
        self.post = Post::ResultTimes(size);
        self
    }

    /// The kernel writes it only when the call is interrupted.
    const fn on_eintr(mut self) -> Pointer {
        self.post = Post::Interrupted;
        self
    }

    /// The range starts `off` bytes past the pointer.
    const fn at(mut self, off: u8) -> Pointer {
        self.off = off;
        self
    }
}

/// Calls whose memory is not a list of single ranges: the ranges come from code here.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Only the [`Pointer`]s.
    Plain,
    /// `readv`/`writev`/`preadv`/`pwritev`/`process_vm_readv`: argument 1 is an array of
    /// argument 2 `iovec`s (read, named `array` unless a [`Pointer`] checks it), each
    /// entry's buffer is `elem` in direction `dir`; what a read wrote is the call's result,
    /// spread over the buffers in order.
    Iovecs {
        array: Option<&'static str>,
        elem: &'static str,
        dir: Dir,
    },
    /// `poll` / `ppoll`: `nfds` `pollfd`s, each checked field by field.
    Poll { prefix: &'static str },
    /// `sendmsg` (`send: true`) / `recvmsg`: argument 1 is a `msghdr`.
    Msghdr { send: bool },
    /// `sendmmsg` (`send: true`) / `recvmmsg`: argument 1 is an array of argument 2
    /// `mmsghdr`s.
    Mmsg { send: bool },
    /// A `sockaddr` the kernel reads (argument `addr`, its length argument `len`), named
    /// `head` + field + `)`.
    Sockaddr {
        addr: u8,
        len: u8,
        head: &'static str,
    },
    /// A buffer the kernel fills, its length in a `socklen_t` the program passes
    /// (`accept`, `getsockname`, `recvfrom`'s source): `len_name` is read (4 bytes), then
    /// `buf_name` is written for that many bytes; afterwards the length the kernel wrote
    /// back says how much it wrote.
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
    /// `ioctl`: what its request uses (the requests Valgrind knows by name, else the
    /// direction and size its `_IOC` encoding gives).
    Ioctl,
    /// `epoll_ctl`: the event, unless the operation is `EPOLL_CTL_DEL`.
    EpollCtl,
    /// `fcntl`: a `struct flock` (`F_GETLK` writes its `l_pid`), `F_GETOWN_EX`'s owner.
    Fcntl,
    /// `prctl`: the options that read or write memory (`PR_GET_NAME`...).
    Prctl,
    /// `arch_prctl`: `ARCH_GET_FS` / `ARCH_GET_GS` write the base.
    ArchPrctl,
    /// `clone`: the thread ids its flags ask the kernel to store.
    Clone,
    /// `clone3`: the same, from `struct clone_args` (Valgrind refuses the call, `ENOSYS`,
    /// and checks nothing: only what the kernel wrote is described).
    Clone3,
    /// `timer_create`: the `sigevent`, field by field, then the timer id.
    TimerCreate,
    /// `sched_getattr`: the size field, then that many bytes written.
    SchedGetattr,
    /// `name_to_handle_at`: the handle's `handle_bytes`, then the handle, then `mnt_id`.
    NameToHandle,
    /// `syslog` (`klogctl`): the buffer its read actions fill.
    Syslog,
    /// `get_mempolicy`: the policy, and the node mask of `maxnode` bits (as Valgrind sizes it).
    GetMempolicy,
    /// `utimensat`: the path, and the two timespecs' fields Valgrind reads.
    Utimensat,
    /// `semctl`: `IPC_STAT`'s and `IPC_SET`'s `struct semid64_ds`.
    Semctl,
    /// `shmctl`: `IPC_STAT`'s and `IPC_SET`'s `struct shmid64_ds`.
    Shmctl,
    /// `ptrace`: what its request reads or writes in the caller's memory (the peeked
    /// word, registers, siginfo, an `iovec`'s register set); never the tracee's.
    Ptrace,
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
        off: 0,
        name,
        dir,
        len,
        optional: false,
        post: match dir {
            Dir::Read => Post::Never,
            Dir::Write => Post::Whole,
        },
    }
}

const fn opt(arg: u8, name: &'static str, dir: Dir, len: Len) -> Pointer {
    let mut ptr = p(arg, name, dir, len);
    ptr.optional = true;
    ptr
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
/// `struct itimerspec`, `struct itimerval`.
const ITIMERSPEC: u64 = 32;
/// The kernel's `sigset_t`.
const SIGSET: u64 = 8;
/// `siginfo_t`.
const SIGINFO: u64 = 128;
/// `struct rusage`.
const RUSAGE: u64 = 144;
/// `struct statfs` on x86-64.
const STATFS: u64 = 120;

/// Every system call whose pointer arguments are described, by number.
pub const SYSCALLS: &[Syscall] = &[
    call(0, "read", &[p(1, "read(buf)", W, Len::Arg(2)).res()]),
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
    call(17, "pread64", &[p(1, "pread64(buf)", W, Len::Arg(2)).res()]),
    call(18, "pwrite64", &[p(1, "pwrite64(buf)", R, Len::Arg(2))]),
    shaped(
        19,
        "readv",
        &[],
        Shape::Iovecs {
            array: Some("readv(vector)"),
            elem: "readv(vector[...])",
            dir: W,
        },
    ),
    shaped(
        20,
        "writev",
        &[],
        Shape::Iovecs {
            array: Some("writev(vector)"),
            elem: "writev(vector[...])",
            dir: R,
        },
    ),
    call(22, "pipe", &[p(0, "pipe(filedes)", W, Len::Fixed(8))]),
    // The fd sets are read, nfds/8 bytes as Valgrind; it describes no write-back (they
    // were checked defined). The timeval is checked field by field (PRE_timeval_READ).
    call(
        23,
        "select",
        &[
            opt(1, "select(readfds)", R, Len::ArgBits(0)),
            opt(2, "select(writefds)", R, Len::ArgBits(0)),
            opt(3, "select(exceptfds)", R, Len::ArgBits(0)),
            opt(4, "select(timeout)", R, Len::Fixed(8)),
            opt(4, "select(timeout)", R, Len::Fixed(8)).at(8),
        ],
    ),
    call(27, "mincore", &[p(2, "mincore(vec)", W, Len::ArgPages(1))]),
    shaped(31, "shmctl", &[], Shape::Shmctl),
    call(
        35,
        "nanosleep",
        &[
            p(0, "nanosleep(req)", R, Len::Fixed(TIMESPEC)),
            opt(1, "nanosleep(rem)", W, Len::Fixed(TIMESPEC)).on_eintr(),
        ],
    ),
    call(
        36,
        "getitimer",
        &[
            p(1, "getitimer(&value->it_interval)", W, Len::Fixed(8)),
            p(1, "getitimer(&value->it_interval)", W, Len::Fixed(8)).at(8),
            p(1, "getitimer(&value->it_value)", W, Len::Fixed(8)).at(16),
            p(1, "getitimer(&value->it_value)", W, Len::Fixed(8)).at(24),
        ],
    ),
    call(
        38,
        "setitimer",
        &[
            opt(1, "setitimer(&value->it_interval)", R, Len::Fixed(8)),
            opt(1, "setitimer(&value->it_interval)", R, Len::Fixed(8)).at(8),
            opt(1, "setitimer(&value->it_value)", R, Len::Fixed(8)).at(16),
            opt(1, "setitimer(&value->it_value)", R, Len::Fixed(8)).at(24),
            opt(2, "setitimer(&ovalue->it_interval)", W, Len::Fixed(8)),
            opt(2, "setitimer(&ovalue->it_interval)", W, Len::Fixed(8)).at(8),
            opt(2, "setitimer(&ovalue->it_value)", W, Len::Fixed(8)).at(16),
            opt(2, "setitimer(&ovalue->it_value)", W, Len::Fixed(8)).at(24),
        ],
    ),
    call(
        40,
        "sendfile",
        &[opt(2, "sendfile(offset)", W, Len::Fixed(8))],
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
        &[p(1, "socketcall.recvfrom(buf)", W, Len::Arg(2)).res()],
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
    shaped(
        55,
        "getsockopt",
        &[],
        Shape::BufAndLen {
            buf: 3,
            len: 4,
            buf_name: "socketcall.getsockopt(optval)",
            len_name: "socketcall.getsockopt(optlen)",
        },
    ),
    shaped(56, "clone", &[], Shape::Clone),
    call(
        61,
        "wait4",
        &[
            opt(1, "wait4(status)", W, Len::Fixed(4)),
            opt(3, "wait4(rusage)", W, Len::Fixed(RUSAGE)),
        ],
    ),
    // struct new_utsname: 6 fields of 65 bytes.
    call(63, "uname", &[p(0, "uname(buf)", W, Len::Fixed(390))]),
    shaped(66, "semctl", &[], Shape::Semctl),
    call(
        70,
        "msgrcv",
        &[
            p(1, "msgrcv(msgp->mtype)", W, Len::Fixed(8)),
            p(1, "msgrcv(msgp->mtext)", W, Len::Arg(2)).at(8).res(),
        ],
    ),
    shaped(72, "fcntl", &[], Shape::Fcntl),
    call(
        78,
        "getdents",
        &[p(1, "getdents(dirp)", W, Len::Arg(2)).res()],
    ),
    call(79, "getcwd", &[p(0, "getcwd(buf)", W, Len::Arg(1)).res()]),
    call(
        89,
        "readlink",
        &[
            p(0, "readlink(path)", R, Len::String),
            p(1, "readlink(buf)", W, Len::Arg(2)).res(),
        ],
    ),
    call(
        96,
        "gettimeofday",
        &[
            opt(0, "gettimeofday(tv)", W, Len::Fixed(TIMESPEC)),
            opt(1, "gettimeofday(tz)", W, Len::Fixed(8)),
        ],
    ),
    call(
        97,
        "getrlimit",
        &[p(1, "getrlimit(rlim)", W, Len::Fixed(16))],
    ),
    call(
        98,
        "getrusage",
        &[p(1, "getrusage(usage)", W, Len::Fixed(RUSAGE))],
    ),
    call(99, "sysinfo", &[p(0, "sysinfo(info)", W, Len::Fixed(112))]),
    call(100, "times", &[opt(0, "times(buf)", W, Len::Fixed(32))]),
    shaped(101, "ptrace", &[], Shape::Ptrace),
    shaped(103, "syslog", &[], Shape::Syslog),
    call(
        115,
        "getgroups",
        &[p(1, "getgroups(list)", W, Len::ArgTimes(0, 4)).res_times(4)],
    ),
    call(
        118,
        "getresuid",
        &[
            p(0, "getresuid(ruid)", W, Len::Fixed(4)),
            p(1, "getresuid(euid)", W, Len::Fixed(4)),
            p(2, "getresuid(suid)", W, Len::Fixed(4)),
        ],
    ),
    call(
        120,
        "getresgid",
        &[
            p(0, "getresgid(rgid)", W, Len::Fixed(4)),
            p(1, "getresgid(egid)", W, Len::Fixed(4)),
            p(2, "getresgid(sgid)", W, Len::Fixed(4)),
        ],
    ),
    // struct __user_cap_header_struct; one __user_cap_data_struct (as Valgrind, although
    // version 3 fills two).
    call(
        125,
        "capget",
        &[
            p(0, "capget(header)", R, Len::Fixed(8)),
            opt(1, "capget(data)", W, Len::Fixed(12)),
        ],
    ),
    call(
        127,
        "rt_sigpending",
        &[p(0, "rt_sigpending(set)", W, Len::Fixed(SIGSET))],
    ),
    call(
        128,
        "rt_sigtimedwait",
        &[
            opt(0, "rt_sigtimedwait(set)", R, Len::Fixed(SIGSET)),
            opt(1, "rt_sigtimedwait(info)", W, Len::Fixed(SIGINFO)),
            opt(2, "rt_sigtimedwait(timeout)", R, Len::Fixed(TIMESPEC)),
        ],
    ),
    // stack_t: ss_sp 0, ss_flags 8, ss_size 16.
    call(
        131,
        "sigaltstack",
        &[
            opt(0, "sigaltstack(ss->ss_sp)", R, Len::Fixed(8)),
            opt(0, "sigaltstack(ss->ss_size)", R, Len::Fixed(8)).at(16),
            opt(0, "sigaltstack(ss->ss_flags)", R, Len::Fixed(4)).at(8),
            opt(1, "sigaltstack(oss)", W, Len::Fixed(24)),
        ],
    ),
    call(
        137,
        "statfs",
        &[
            p(0, "statfs(path)", R, Len::String),
            p(1, "statfs(buf)", W, Len::Fixed(STATFS)),
        ],
    ),
    call(
        138,
        "fstatfs",
        &[p(1, "fstatfs(buf)", W, Len::Fixed(STATFS))],
    ),
    call(
        143,
        "sched_getparam",
        &[p(1, "sched_getparam(p)", W, Len::Fixed(4))],
    ),
    call(
        148,
        "sched_rr_get_interval",
        &[p(
            1,
            "sched_rr_get_interval(timespec)",
            W,
            Len::Fixed(TIMESPEC),
        )],
    ),
    shaped(157, "prctl", &[], Shape::Prctl),
    shaped(158, "arch_prctl", &[], Shape::ArchPrctl),
    // struct timex: 208 bytes. Valgrind also reads the fields `modes` says are set.
    call(
        159,
        "adjtimex",
        &[
            p(0, "adjtimex(timex->modes)", R, Len::Fixed(4)),
            p(0, "adjtimex(timex)", W, Len::Fixed(208)),
        ],
    ),
    call(
        191,
        "getxattr",
        &[
            p(0, "getxattr(path)", R, Len::String),
            p(1, "getxattr(name)", R, Len::String),
            p(2, "getxattr(value)", W, Len::Arg(3)).res(),
        ],
    ),
    call(
        192,
        "lgetxattr",
        &[
            p(0, "lgetxattr(path)", R, Len::String),
            p(1, "lgetxattr(name)", R, Len::String),
            p(2, "lgetxattr(value)", W, Len::Arg(3)).res(),
        ],
    ),
    call(
        193,
        "fgetxattr",
        &[
            p(1, "fgetxattr(name)", R, Len::String),
            p(2, "fgetxattr(value)", W, Len::Arg(3)).res(),
        ],
    ),
    call(
        194,
        "listxattr",
        &[
            p(0, "listxattr(path)", R, Len::String),
            p(1, "listxattr(list)", W, Len::Arg(2)).res(),
        ],
    ),
    call(
        195,
        "llistxattr",
        &[
            p(0, "llistxattr(path)", R, Len::String),
            p(1, "llistxattr(list)", W, Len::Arg(2)).res(),
        ],
    ),
    call(
        196,
        "flistxattr",
        &[p(1, "flistxattr(list)", W, Len::Arg(2)).res()],
    ),
    call(201, "time", &[opt(0, "time(t)", W, Len::Fixed(8))]),
    shaped(202, "futex", &[], Shape::Futex),
    call(
        203,
        "sched_setaffinity",
        &[p(2, "sched_setaffinity(mask)", R, Len::Arg(1))],
    ),
    call(
        204,
        "sched_getaffinity",
        &[p(2, "sched_getaffinity(mask)", W, Len::Arg(1))],
    ),
    call(
        217,
        "getdents64",
        &[p(1, "getdents64(dirp)", W, Len::Arg(2)).res()],
    ),
    shaped(222, "timer_create", &[], Shape::TimerCreate),
    call(
        223,
        "timer_settime",
        &[
            p(2, "timer_settime(value)", R, Len::Fixed(ITIMERSPEC)),
            opt(3, "timer_settime(ovalue)", W, Len::Fixed(ITIMERSPEC)),
        ],
    ),
    call(
        224,
        "timer_gettime",
        &[p(1, "timer_gettime(value)", W, Len::Fixed(ITIMERSPEC))],
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
            opt(3, "clock_nanosleep(rmtp)", W, Len::Fixed(TIMESPEC)).on_eintr(),
        ],
    ),
    // struct epoll_event is packed on x86-64: 12 bytes.
    call(
        232,
        "epoll_wait",
        &[p(1, "epoll_wait(events)", W, Len::ArgTimes(2, 12)).res_times(12)],
    ),
    shaped(233, "epoll_ctl", &[], Shape::EpollCtl),
    shaped(239, "get_mempolicy", &[], Shape::GetMempolicy),
    call(
        243,
        "mq_timedreceive",
        &[
            p(1, "mq_timedreceive(msg_ptr)", W, Len::Arg(2)).res(),
            opt(3, "mq_timedreceive(msg_prio)", W, Len::Fixed(4)),
            opt(4, "mq_timedreceive(abs_timeout)", R, Len::Fixed(TIMESPEC)),
        ],
    ),
    call(
        247,
        "waitid",
        &[
            opt(2, "waitid(infop)", W, Len::Fixed(SIGINFO)),
            opt(4, "waitid(ru)", W, Len::Fixed(RUSAGE)),
        ],
    ),
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
        267,
        "readlinkat",
        &[
            p(1, "readlinkat(path)", R, Len::String),
            p(2, "readlinkat(buf)", W, Len::Arg(3)).res(),
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
        274,
        "get_robust_list",
        &[
            p(1, "get_robust_list(head_ptr)", W, Len::Fixed(8)),
            p(2, "get_robust_list(len_ptr)", W, Len::Fixed(8)),
        ],
    ),
    // The offsets are read, and written back, as Valgrind checks them (no POST).
    call(
        275,
        "splice",
        &[
            opt(1, "splice(off_in)", R, Len::Fixed(8)),
            opt(3, "splice(off_out)", R, Len::Fixed(8)),
        ],
    ),
    shaped(280, "utimensat", &[], Shape::Utimensat),
    call(
        281,
        "epoll_pwait",
        &[
            p(1, "epoll_pwait(events)", W, Len::ArgTimes(2, 12)).res_times(12),
            opt(4, "epoll_pwait(sigmask)", R, Len::Fixed(SIGSET)),
        ],
    ),
    call(
        286,
        "timerfd_settime",
        &[
            p(2, "timerfd_settime(new_value)", R, Len::Fixed(ITIMERSPEC)),
            opt(3, "timerfd_settime(old_value)", W, Len::Fixed(ITIMERSPEC)),
        ],
    ),
    call(
        287,
        "timerfd_gettime",
        &[p(
            1,
            "timerfd_gettime(curr_value)",
            W,
            Len::Fixed(ITIMERSPEC),
        )],
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
            array: Some("preadv(vector)"),
            elem: "preadv(vector[...])",
            dir: W,
        },
    ),
    shaped(
        296,
        "pwritev",
        &[],
        Shape::Iovecs {
            array: Some("pwritev(vector)"),
            elem: "pwritev(vector[...])",
            dir: R,
        },
    ),
    shaped(299, "recvmmsg", &[], Shape::Mmsg { send: false }),
    call(
        302,
        "prlimit64",
        &[
            opt(2, "rlimit64(new_rlim)", R, Len::Fixed(16)),
            opt(3, "rlimit64(old_rlim)", W, Len::Fixed(16)),
        ],
    ),
    shaped(
        303,
        "name_to_handle_at",
        &[p(1, "name_to_handle_at(name)", R, Len::String)],
        Shape::NameToHandle,
    ),
    // Valgrind names the written struct as adjtimex's.
    call(
        305,
        "clock_adjtime",
        &[
            p(1, "clock_adjtime(timex->modes)", R, Len::Fixed(4)),
            p(1, "adjtimex(timex)", W, Len::Fixed(208)),
        ],
    ),
    shaped(307, "sendmmsg", &[], Shape::Mmsg { send: true }),
    // struct getcpu_cache: 128 bytes.
    call(
        309,
        "getcpu",
        &[
            opt(0, "getcpu(cpu)", W, Len::Fixed(4)),
            opt(1, "getcpu(node)", W, Len::Fixed(4)),
            opt(2, "getcpu(tcache)", W, Len::Fixed(128)),
        ],
    ),
    shaped(
        310,
        "process_vm_readv",
        &[
            p(1, "process_vm_readv(lvec)", R, Len::ArgTimes(2, 16)),
            p(3, "process_vm_readv(rvec)", R, Len::ArgTimes(4, 16)),
        ],
        Shape::Iovecs {
            array: None,
            elem: "process_vm_readv(lvec[...])",
            dir: W,
        },
    ),
    shaped(315, "sched_getattr", &[], Shape::SchedGetattr),
    call(318, "getrandom", &[p(0, "getrandom(cpu)", W, Len::Arg(1))]),
    call(
        326,
        "copy_file_range",
        &[
            opt(1, "copy_file_range(off_in)", R, Len::Fixed(8)),
            opt(3, "copy_file_range(off_out)", R, Len::Fixed(8)),
        ],
    ),
    call(
        332,
        "statx",
        &[
            p(1, "statx(filename)", R, Len::String),
            // struct statx
            p(4, "statx(buf)", W, Len::Fixed(256)),
        ],
    ),
    shaped(435, "clone3", &[], Shape::Clone3),
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
    walk(nr, args, None, read, f);
}

/// After system call `nr` returned `result` (rax: a negative errno on failure), calls `f`
/// with every range the kernel wrote (Valgrind's `POST_MEM_WRITE`s), read from the memory
/// as the call left it (a length the kernel wrote back, a `msghdr`'s lengths): what the
/// definedness engine marks defined. Where Valgrind marks more than the kernel may have
/// written (a whole struct), so does this: a missed error at worst, never a false one.
pub fn for_each_written(
    nr: u64,
    args: &[u64; 6],
    result: u64,
    read: &mut dyn FnMut(Addr, &mut [u8]) -> usize,
    f: &mut dyn FnMut(&Range),
) {
    walk(nr, args, Some(result), read, f);
}

const EINTR: i64 = 4;

/// Whether `result` (rax after a system call) is a failure: -4095..-1.
pub fn failed(result: u64) -> bool {
    let r = result as i64;
    (-4095..0).contains(&r)
}

fn walk(
    nr: u64,
    args: &[u64; 6],
    after: Option<u64>,
    read: &mut dyn FnMut(Addr, &mut [u8]) -> usize,
    f: &mut dyn FnMut(&Range),
) {
    let Some(sc) = lookup(nr) else {
        return;
    };
    let mut w = Walk {
        r: Reader { read },
        f,
        after,
    };
    let interrupted = after.is_some_and(|r| r as i64 == -EINTR);
    if after.is_some_and(failed) && !interrupted {
        return;
    }
    for ptr in sc.pointers {
        let addr = args[ptr.arg as usize];
        if (ptr.optional || after.is_some()) && addr == 0 {
            continue;
        }
        let addr = addr.wrapping_add(ptr.off as u64);
        let name = ParamName::plain(ptr.name);
        let len = match ptr.len {
            Len::String => {
                if after.is_none() {
                    (w.f)(&w.r.string(name, addr));
                }
                continue;
            }
            Len::Fixed(n) => n,
            Len::Arg(n) => args[n as usize],
            Len::ArgTimes(n, size) => (args[n as usize] as u32 as u64).saturating_mul(size),
            Len::ArgBits(n) => args[n as usize] as u32 as u64 / 8,
            Len::ArgPages(n) => args[n as usize].div_ceil(4096),
        };
        match after {
            None => emit(w.f, name, ptr.dir, addr, len),
            Some(res) => {
                let wrote = match (ptr.post, interrupted) {
                    (Post::Interrupted, true) => len,
                    (_, true) | (Post::Never | Post::Interrupted, false) => 0,
                    (Post::Whole, false) => len,
                    (Post::Result, false) => len.min(res),
                    (Post::ResultTimes(size), false) => len.min(res.saturating_mul(size)),
                };
                emit(w.f, name, W, addr, wrote);
            }
        }
    }
    if interrupted {
        return;
    }
    shape(&mut w, sc.shape, args);
}

/// The walk of one call's ranges: before it (`after` None) every range it reads or writes,
/// for the checks; after it (`after` its result, a success) what the kernel wrote.
struct Walk<'a, 'b> {
    r: Reader<'a>,
    f: &'b mut dyn FnMut(&Range),
    after: Option<u64>,
}

impl Walk<'_, '_> {
    /// A range the call will read or write (before it only).
    fn pre(&mut self, name: &'static str, dir: Dir, addr: Addr, len: u64) {
        self.pre_named(ParamName::plain(name), dir, addr, len);
    }

    fn pre_named(&mut self, name: ParamName, dir: Dir, addr: Addr, len: u64) {
        if self.after.is_none() {
            emit(self.f, name, dir, addr, len);
        }
    }

    /// A range the kernel wrote (after the call only).
    fn post(&mut self, name: &'static str, addr: Addr, len: u64) {
        self.post_named(ParamName::plain(name), addr, len);
    }

    fn post_named(&mut self, name: ParamName, addr: Addr, len: u64) {
        if self.after.is_some() && addr != 0 {
            emit(self.f, name, W, addr, len);
        }
    }

    /// A range the kernel writes: checked before, marked after.
    fn both(&mut self, name: &'static str, addr: Addr, len: u64) {
        self.pre(name, W, addr, len);
        self.post(name, addr, len);
    }
}

fn shape(w: &mut Walk, shape: Shape, args: &[u64; 6]) {
    let res = w.after.unwrap_or(0);
    match shape {
        Shape::Plain => {}
        Shape::Iovecs { array, elem, dir } => {
            let (vec, count) = (args[1], args[2] as u32 as u64);
            // The kernel refuses more than UIO_MAXIOV entries; so does Valgrind's check.
            if count > 1024 {
                return;
            }
            if let Some(array) = array {
                w.pre(array, R, vec, count * 16);
            }
            let mut left = res;
            for i in 0..count {
                let (Some(base), Some(len)) = (w.r.u64(vec + 16 * i), w.r.u64(vec + 16 * i + 8))
                else {
                    break;
                };
                w.pre(elem, dir, base, len);
                if dir == W {
                    let n = len.min(left);
                    w.post(elem, base, n);
                    left -= n;
                }
            }
        }
        Shape::Poll { prefix } => poll(w, prefix, args[0], args[1] as u32 as u64),
        Shape::Msghdr { send } => {
            let got = w.after.unwrap_or(u64::MAX);
            msghdr(w, send, None, args[1], got)
        }
        Shape::Mmsg { send } => {
            // struct mmsghdr: a msghdr (56 bytes), msg_len (4), padding.
            let (vec, count) = (args[1], args[2] as u32 as u64);
            let len_name = |i| ParamName {
                head: if send {
                    "sendmmsg(mmsg["
                } else {
                    "recvmmsg(mmsg["
                },
                part: Part::Index(i),
                tail: "].msg_len)",
            };
            match w.after {
                None => {
                    for i in 0..count.min(1024) {
                        let hdr = vec + 64 * i;
                        msghdr(w, send, Some(i as u32), hdr, u64::MAX);
                        w.pre_named(len_name(i as u32), W, hdr + 56, 4);
                    }
                    if !send && args[4] != 0 {
                        w.pre("recvmmsg(timeout)", R, args[4], TIMESPEC);
                    }
                }
                Some(n) => {
                    for i in 0..n.min(count).min(1024) {
                        let hdr = vec + 64 * i;
                        if !send {
                            let got = w.r.u32(hdr + 56).unwrap_or(0) as u64;
                            msghdr(w, send, Some(i as u32), hdr, got);
                        }
                        w.post_named(len_name(i as u32), hdr + 56, 4);
                    }
                }
            }
        }
        Shape::Sockaddr { addr, len, head } => sockaddr(
            w,
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
            w.pre(len_name, R, len_p, 4);
            w.post(len_name, len_p, 4);
            // Before: the room the program offers; after: what the kernel says it wrote.
            if let Some(n) = w.r.u32(len_p) {
                w.both(buf_name, buf, n as u64);
            }
        }
        Shape::SigAction => {
            let (act, old) = (args[1], args[2]);
            if act != 0 {
                // The kernel's struct sigaction: handler, flags, restorer, mask.
                w.pre("rt_sigaction(act->sa_handler)", R, act, 8);
                w.pre("rt_sigaction(act->sa_mask)", R, act + 24, 8);
                w.pre("rt_sigaction(act->sa_flags)", R, act + 8, 8);
                const SA_RESTORER: u64 = 0x0400_0000;
                if w.after.is_none() && w.r.u64(act + 8).is_some_and(|fl| fl & SA_RESTORER != 0) {
                    w.pre("rt_sigaction(act->sa_restorer)", R, act + 16, 8);
                }
            }
            if old != 0 {
                w.both("rt_sigaction(oldact)", old, 32);
            }
        }
        Shape::Futex => {
            const PRIVATE: u64 = 128;
            const CLOCK_REALTIME: u64 = 256;
            match args[1] & !(PRIVATE | CLOCK_REALTIME) {
                // WAIT, LOCK_PI, WAIT_BITSET, WAIT_REQUEUE_PI
                0 | 6 | 9 | 11 => {
                    w.pre("futex(futex)", R, args[0], 4);
                    if args[3] != 0 {
                        w.pre("futex(timeout)", R, args[3], TIMESPEC);
                    }
                }
                // REQUEUE, CMP_REQUEUE, WAKE_OP, CMP_REQUEUE_PI
                3 | 4 | 5 | 12 => {
                    w.pre("futex(futex)", R, args[0], 4);
                    w.pre("futex(futex2)", R, args[4], 4);
                }
                // UNLOCK_PI, TRYLOCK_PI: the kernel reads and writes the word.
                7 | 8 => w.pre("futex(futex)", R, args[0], 4),
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
        Shape::Ioctl => ioctl(w, args[1] as u32, args[2], res),
        Shape::EpollCtl => {
            const EPOLL_CTL_DEL: u64 = 2;
            if args[1] as u32 as u64 != EPOLL_CTL_DEL {
                // Valgrind checks the `events` word only.
                w.pre("epoll_ctl(event)", R, args[3], 4);
            }
        }
        Shape::Fcntl => {
            const F_GETLK: u32 = 5;
            const F_SETLK: u32 = 6;
            const F_SETLKW: u32 = 7;
            const F_SETOWN_EX: u32 = 15;
            const F_GETOWN_EX: u32 = 16;
            const F_OFD_GETLK: u32 = 36;
            const F_OFD_SETLK: u32 = 37;
            const F_OFD_SETLKW: u32 = 38;
            let lock = args[2];
            match args[1] as u32 {
                // struct flock: l_type 0, l_whence 2, l_start 8, l_len 16, l_pid 24.
                cmd @ (F_GETLK | F_SETLK | F_SETLKW | F_OFD_GETLK | F_OFD_SETLK | F_OFD_SETLKW) => {
                    w.pre("fcntl(lock->l_type)", R, lock, 2);
                    w.pre("fcntl(lock->l_whence)", R, lock + 2, 2);
                    w.pre("fcntl(lock->l_start)", R, lock + 8, 8);
                    w.pre("fcntl(lock->l_len)", R, lock + 16, 8);
                    if matches!(cmd, F_GETLK | F_OFD_GETLK) {
                        // The kernel writes the whole struct back; Valgrind marks l_pid.
                        w.both("fcntl(lock->l_pid)", lock + 24, 4);
                    }
                }
                F_SETOWN_EX => w.pre("fcntl(F_SETOWN_EX)", R, args[2], 8),
                F_GETOWN_EX => w.both("fcntl(F_GETOWN_EX)", args[2], 8),
                _ => {}
            }
        }
        Shape::Prctl => {
            const TASK_COMM_LEN: u64 = 16;
            let name = match args[0] {
                2 => "prctl(get-death-signal)",
                5 => "prctl(get-unalign)",
                9 => "prctl(get-fpemu)",
                11 => "prctl(get-fpexc)",
                16 => "prctl(get-name)",
                19 => "prctl(get-endian)",
                _ => return,
            };
            let len = if args[0] == 16 { TASK_COMM_LEN } else { 4 };
            w.both(name, args[1], len);
        }
        Shape::ArchPrctl => {
            const ARCH_GET_GS: u64 = 0x1004;
            const ARCH_GET_FS: u64 = 0x1003;
            if matches!(args[0], ARCH_GET_FS | ARCH_GET_GS) {
                w.both("arch_prctl(addr)", args[1], 8);
            }
        }
        Shape::Clone => {
            const CLONE_PIDFD: u64 = 0x1000;
            const CLONE_PARENT_SETTID: u64 = 0x0010_0000;
            const CLONE_CHILD_CLEARTID: u64 = 0x0020_0000;
            const CLONE_CHILD_SETTID: u64 = 0x0100_0000;
            // x86-64: clone(flags, stack, parent_tid, child_tid, tls).
            let flags = args[0];
            if flags & (CLONE_PARENT_SETTID | CLONE_PIDFD) != 0 {
                w.both("clone(parent_tidptr)", args[2], 4);
            }
            if flags & (CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID) != 0 {
                w.both("clone(child_tidptr)", args[3], 4);
            }
        }
        Shape::Clone3 => {
            // struct clone_args: flags 0, pidfd 8, child_tid 16, parent_tid 24.
            const CLONE_PIDFD: u64 = 0x1000;
            const CLONE_PARENT_SETTID: u64 = 0x0010_0000;
            const CLONE_CHILD_SETTID: u64 = 0x0100_0000;
            let cl = args[0];
            if w.after.is_none() || args[1] < 32 {
                return;
            }
            let field = |w: &mut Walk, off| w.r.u64(cl + off).unwrap_or(0);
            let flags = field(w, 0);
            if flags & CLONE_PIDFD != 0 {
                let at = field(w, 8);
                w.post("clone3(cl_args->pidfd)", at, 4);
            }
            if flags & CLONE_PARENT_SETTID != 0 {
                let at = field(w, 24);
                w.post("clone3(cl_args->parent_tid)", at, 4);
            }
            if flags & CLONE_CHILD_SETTID != 0 {
                let at = field(w, 16);
                w.post("clone3(cl_args->child_tid)", at, 4);
            }
        }
        Shape::TimerCreate => {
            // struct sigevent: sigev_value 0, sigev_signo 8, sigev_notify 12, the thread
            // id 16.
            let evp = args[1];
            if evp != 0 {
                w.pre("timer_create(evp.sigev_value)", R, evp, 8);
                w.pre("timer_create(evp.sigev_signo)", R, evp + 8, 4);
                w.pre("timer_create(evp.sigev_notify)", R, evp + 12, 4);
                const SIGEV_THREAD_ID: u32 = 4;
                if w.after.is_none() && w.r.u32(evp + 12).is_some_and(|n| n & SIGEV_THREAD_ID != 0)
                {
                    w.pre("timer_create(evp.sigev_notify_thread_id)", R, evp + 16, 4);
                }
            }
            w.both("timer_create(timerid)", args[2], 4);
        }
        Shape::SchedGetattr => {
            // Valgrind's names say sched_setattr.
            let attr = args[1];
            w.pre("sched_setattr(attr->size)", R, attr, 4);
            if let Some(size) = w.r.u32(attr) {
                w.both("sched_setattr(attr)", attr, size as u64);
            }
        }
        Shape::NameToHandle => {
            // struct file_handle: handle_bytes 0, handle_type 4, f_handle 8.
            let fh = args[2];
            if let Some(bytes) = w.r.u32(fh) {
                w.pre("name_to_handle_at(handle)", R, fh, 4);
                w.both("name_to_handle_at(handle)", fh, 8 + bytes as u64);
            }
            w.both("name_to_handle_at(mnt_id)", args[3], 4);
        }
        Shape::Syslog => {
            // SYSLOG_ACTION_READ, READ_ALL, READ_CLEAR: the whole length, as Valgrind.
            if matches!(args[0], 2..=4) {
                w.both("syslog(bufp)", args[1], args[2] as u32 as u64);
            }
        }
        Shape::GetMempolicy => {
            if args[0] != 0 {
                w.both("get_mempolicy(policy)", args[0], 4);
            }
            if args[1] != 0 {
                let bits = args[2].wrapping_sub(1);
                let len = bits.div_ceil(64).saturating_mul(64) / 8;
                w.both("get_mempolicy(nodemask)", args[1], len.min(1 << 20));
            }
        }
        Shape::Utimensat => {
            const UTIME_NOW: u64 = (1 << 30) - 1;
            const UTIME_OMIT: u64 = (1 << 30) - 2;
            if args[1] != 0 && w.after.is_none() {
                let name = ParamName::plain("utimensat(filename)");
                let s = w.r.string(name, args[1]);
                (w.f)(&s);
            }
            let times = args[2];
            if times != 0 {
                w.pre("utimensat(times[0].tv_nsec)", R, times + 8, 8);
                w.pre("utimensat(times[1].tv_nsec)", R, times + 24, 8);
                if w.after.is_none() {
                    let (n0, n1) = (w.r.u64(times + 8), w.r.u64(times + 24));
                    if let (Some(n0), Some(n1)) = (n0, n1) {
                        if n0 != UTIME_NOW && n0 != UTIME_OMIT {
                            w.pre("utimensat(times[0].tv_sec)", R, times, 8);
                        }
                        if n1 != UTIME_NOW && n1 != UTIME_OMIT {
                            w.pre("utimensat(times[1].tv_sec)", R, times + 16, 8);
                        }
                    }
                }
            }
        }
        Shape::Semctl => {
            // semctl(semid, semnum, cmd, arg): arg is a union passed by value, its `buf`.
            const IPC_64: u64 = 0x100;
            const SEMID64_DS: u64 = 104;
            match args[2] & !IPC_64 {
                // IPC_STAT, SEM_STAT, SEM_STAT_ANY
                2 | 18 | 20 => w.both("semctl(IPC_STAT, arg.buf)", args[3], SEMID64_DS),
                // IPC_SET
                1 => w.pre("semctl(IPC_SET, arg.buf)", R, args[3], SEMID64_DS),
                _ => {}
            }
        }
        Shape::Shmctl => {
            const IPC_64: u64 = 0x100;
            const SHMID64_DS: u64 = 112;
            match args[1] & !IPC_64 {
                // IPC_STAT, SHM_STAT, SHM_STAT_ANY
                2 | 13 | 15 => w.both("shmctl(IPC_STAT, buf)", args[2], SHMID64_DS),
                1 => w.pre("shmctl(IPC_SET, buf)", R, args[2], SHMID64_DS),
                _ => {}
            }
        }
        Shape::Ptrace => ptrace(w, args[0], args[3]),
    }
}

/// `ptrace(request, pid, addr, data)` as Valgrind's amd64 wrapper: `data` points into the
/// caller's memory (`addr` is the tracee's, never checked). glibc's `PTRACE_PEEK*` wrapper
/// passes its own word as `data`, which the kernel fills: a debugger's every read of its
/// tracee (gdb: the registers, the breakpoint's siginfo) was undefined without this.
fn ptrace(w: &mut Walk, request: u64, data: Addr) {
    // struct user_regs_struct, user_fpregs_struct, siginfo_t, user_desc.
    const USER_REGS: u64 = 27 * 8;
    const USER_FPREGS: u64 = 512;
    const SIGINFO: u64 = 128;
    const USER_DESC: u64 = 16;
    match request {
        // PTRACE_PEEKTEXT, PEEKDATA, PEEKUSR
        1..=3 => w.both("ptrace(peek)", data, 8),
        12 => w.both("ptrace(getregs)", data, USER_REGS),
        13 => w.pre("ptrace(setregs)", R, data, USER_REGS),
        14 => w.both("ptrace(getfpregs)", data, USER_FPREGS),
        15 => w.pre("ptrace(setfpregs)", R, data, USER_FPREGS),
        25 => w.both("ptrace(get_thread_area)", data, USER_DESC),
        26 => w.pre("ptrace(set_thread_area)", R, data, USER_DESC),
        // PTRACE_GETEVENTMSG
        0x4201 => w.both("ptrace(geteventmsg)", data, 8),
        // PTRACE_GETSIGINFO, SETSIGINFO
        0x4202 => w.both("ptrace(getsiginfo)", data, SIGINFO),
        0x4203 => w.pre("ptrace(setsiginfo)", R, data, SIGINFO),
        // PTRACE_GETREGSET, SETREGSET: `data` is an iovec; after the call its length is the
        // one the kernel wrote back, and that many bytes are marked (as Valgrind, which
        // reads `iov_len` again in its POST).
        0x4204 | 0x4205 => {
            let get = request == 0x4204;
            let (base_name, len_name, buf_name) = if get {
                (
                    "ptrace(getregset iovec->iov_base)",
                    "ptrace(getregset iovec->iov_len)",
                    "ptrace(getregset *(iovec->iov_base))",
                )
            } else {
                (
                    "ptrace(setregset iovec->iov_base)",
                    "ptrace(setregset iovec->iov_len)",
                    "ptrace(setregset *(iovec->iov_base))",
                )
            };
            w.pre(base_name, R, data, 8);
            w.pre(len_name, R, data + 8, 8);
            let (Some(base), Some(len)) = (w.r.u64(data), w.r.u64(data + 8)) else {
                return;
            };
            if get {
                w.both(buf_name, base, len);
            } else {
                w.pre(buf_name, R, base, len);
            }
        }
        _ => {}
    }
}

/// `ioctl(fd, request, arg)`: the requests Valgrind names, else what the request's `_IOC`
/// encoding says (Valgrind's `PRE_unknown_ioctl`: `_IOC_WRITE`, the kernel reads
/// `_IOC_SIZE` bytes; `_IOC_READ`, it writes them, and they are defined after a call that
/// returned 0).
fn ioctl(w: &mut Walk, request: u32, arg: Addr, res: u64) {
    // struct termios as the kernel has it (Valgrind's vki_termios); struct termio.
    const TERMIOS: u64 = 36;
    const TERMIO: u64 = 18;
    let (name, dir, len) = match request {
        0x5401 => ("ioctl(TCGETS)", W, TERMIOS),
        0x5402..=0x5404 => ("ioctl(TCSET{S,SW,SF})", R, TERMIOS),
        0x5405 => ("ioctl(TCGETA)", W, TERMIO),
        0x540F => ("ioctl(TIOCGPGRP)", W, 4),
        // Valgrind's own name (and direction) for TIOCSPGRP.
        0x5410 => ("ioctl(TIOCGPGRP)", W, 4),
        0x5413 => ("ioctl(TIOCGWINSZ)", W, 8),
        0x5414 => ("ioctl(TIOCSWINSZ)", R, 8),
        0x5415 => ("ioctl(TIOCMGET)", W, 4),
        0x541B => ("ioctl(FIONREAD)", W, 4),
        0x5421 => ("ioctl(FIONBIO)", R, 4),
        0x5452 => ("ioctl(FIOASYNC)", R, 4),
        0x8004_5430 => ("ioctl(TIOCGPTN)", W, 4),
        0x4004_5431 => ("ioctl(TIOCSPTLCK)", R, 4),
        _ => {
            const IOC_WRITE: u32 = 1;
            const IOC_READ: u32 = 2;
            let (dir, size) = (request >> 30, ((request >> 16) & 0x3fff) as u64);
            if size == 0 {
                return;
            }
            if dir & IOC_WRITE != 0 {
                w.pre("ioctl(generic)", R, arg, size);
            }
            if dir & IOC_READ != 0 {
                w.pre("ioctl(generic)", W, arg, size);
                if res == 0 {
                    w.post("ioctl(generic)", arg, size);
                }
            }
            return;
        }
    };
    match dir {
        R => w.pre(name, R, arg, len),
        W => w.both(name, arg, len),
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

fn poll(w: &mut Walk, prefix: &'static str, ufds: Addr, n: u64) {
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
        if w.after.is_some() {
            w.post(revents, e + 6, 2);
            continue;
        }
        w.pre(fd, R, e, 4);
        let Some(v) = w.r.u32(e) else {
            break;
        };
        if (v as i32) >= 0 {
            w.pre(events, R, e + 4, 2);
        }
        w.pre(revents, W, e + 6, 2);
    }
}

/// The names of a `msghdr`'s parts: `recvmsg(msg...)`, or entry `i` of `recvmmsg`'s array
/// (`recvmsg(mmsg[i].msg_hdr...)`, as Valgrind names them).
fn msg_name(send: bool, entry: Option<u32>, field: usize, iov: Option<u32>) -> ParamName {
    // Field 0: the header itself, 1: msg_name, 2: msg_iov, 3: msg_iov[j], 4: msg_control.
    const SINGLE: [[&str; 5]; 2] = [
        [
            "recvmsg(msg)",
            "recvmsg(msg.msg_name)",
            "recvmsg(msg.msg_iov)",
            "recvmsg(msg.msg_iov[",
            "recvmsg(msg.msg_control)",
        ],
        [
            "sendmsg(msg)",
            "sendmsg(msg.msg_name)",
            "sendmsg(msg.msg_iov)",
            "sendmsg(msg.msg_iov[",
            "sendmsg(msg.msg_control)",
        ],
    ];
    const ENTRY_TAIL: [&str; 5] = [
        "].msg_hdr)",
        "].msg_hdr.msg_name)",
        "].msg_hdr.msg_iov)",
        "].msg_hdr.msg_iov[",
        "].msg_hdr.msg_control)",
    ];
    let verb = send as usize;
    match (entry, iov) {
        (None, None) => ParamName::plain(SINGLE[verb][field]),
        (None, Some(j)) => ParamName {
            head: SINGLE[verb][3],
            part: Part::Index(j),
            tail: "])",
        },
        (Some(i), None) => ParamName {
            head: ["recvmsg(mmsg[", "sendmsg(mmsg["][verb],
            part: Part::Index(i),
            tail: ENTRY_TAIL[field],
        },
        (Some(i), Some(j)) => ParamName {
            head: ["recvmsg(mmsg[", "sendmsg(mmsg["][verb],
            part: Part::Index2(i, ENTRY_TAIL[3], j),
            tail: "])",
        },
    }
}

/// `struct msghdr` (x86-64): name 0, namelen 8, iov 16, iovlen 24, control 32,
/// controllen 40, flags 48. Before a receive, `got` is unbounded; after it, the bytes
/// received, spread over the iovecs in order (Valgrind's `msghdr_foreachfield`).
fn msghdr(w: &mut Walk, send: bool, entry: Option<u32>, msg: Addr, got: u64) {
    if msg == 0 {
        return;
    }
    let name = |field| msg_name(send, entry, field, None);
    // The header fields the kernel reads, as Valgrind groups them: msg_name and
    // msg_namelen, then msg_iov to msg_controllen (the padding between is not read);
    // recvmsg's kernel writes msg_flags.
    w.pre_named(name(0), R, msg, 12);
    w.pre_named(name(0), R, msg + 16, 32);
    let dir = if send { R } else { W };
    if !send {
        w.pre_named(name(0), W, msg + 48, 4);
        w.post_named(name(0), msg + 48, 4);
    }
    let write = |w: &mut Walk, n: ParamName, addr: Addr, len: u64| {
        w.pre_named(n, dir, addr, len);
        if !send {
            w.post_named(n, addr, len);
        }
    };
    let namep = w.r.u64(msg);
    let namelen = w.r.u32(msg + 8);
    if let (Some(np), Some(namelen)) = (namep, namelen) {
        if np != 0 {
            write(w, name(1), np, namelen as u64);
        }
    }
    if let (Some(iov), Some(iovlen)) = (w.r.u64(msg + 16), w.r.u64(msg + 24)) {
        if iov != 0 && iovlen <= 1024 {
            w.pre_named(name(2), R, iov, iovlen * 16);
            let mut left = got;
            for i in 0..iovlen {
                if left == 0 {
                    break;
                }
                let (Some(base), Some(len)) = (w.r.u64(iov + 16 * i), w.r.u64(iov + 16 * i + 8))
                else {
                    break;
                };
                let n = len.min(left);
                write(w, msg_name(send, entry, 3, Some(i as u32)), base, n);
                left -= n;
            }
        }
    }
    if let (Some(control), Some(len)) = (w.r.u64(msg + 32), w.r.u64(msg + 40)) {
        if control != 0 {
            write(w, name(4), control, len);
        }
    }
}

/// A `sockaddr` the kernel reads, field by field as Valgrind's `pre_mem_read_sockaddr`.
fn sockaddr(w: &mut Walk, head: &'static str, sa: Addr, len: u64) {
    if sa == 0 || len == 0 || w.after.is_some() {
        return;
    }
    let field = |s: &'static str| ParamName {
        head,
        part: Part::Field(s),
        tail: ")",
    };
    w.pre_named(field("sa_family"), R, sa, 2);
    const AF_UNSPEC: u16 = 0;
    const AF_UNIX: u16 = 1;
    const AF_INET: u16 = 2;
    const AF_INET6: u16 = 10;
    const AF_NETLINK: u16 = 16;
    match w.r.u16(sa) {
        None | Some(AF_UNSPEC) => {}
        Some(AF_UNIX) => {
            let s = w.r.string(field("sun_path"), sa + 2);
            (w.f)(&s);
        }
        Some(AF_INET) => {
            w.pre_named(field("sin_port"), R, sa + 2, 2);
            w.pre_named(field("sin_addr"), R, sa + 4, 4);
        }
        Some(AF_INET6) => {
            w.pre_named(field("sin6_port"), R, sa + 2, 2);
            w.pre_named(field("sin6_flowinfo"), R, sa + 4, 4);
            w.pre_named(field("sin6_addr"), R, sa + 8, 16);
            w.pre_named(field("sin6_scope_id"), R, sa + 24, 4);
        }
        Some(AF_NETLINK) => {
            w.pre_named(field("nl_pid"), R, sa + 4, 4);
            w.pre_named(field("nl_groups"), R, sa + 8, 4);
        }
        Some(_) => w.pre_named(field("sa_data"), R, sa + 2, len.saturating_sub(2)),
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
                "sendmsg(msg)",
                "sendmsg(msg.msg_iov)",
                "sendmsg(msg.msg_iov[0])"
            ]
        );
        // The header as Valgrind groups its fields: the padding after msg_namelen is
        // not read (a msghdr filled field by field leaves it undefined).
        assert_eq!((r[0].2, r[0].3, r[1].2, r[1].3), (0x6000, 12, 0x6010, 32));
        assert_eq!(r[3].2, 0x8000);
        assert_eq!(r[3].3, 12);
    }

    /// What the kernel wrote after call `nr` returned `result`.
    fn written(
        nr: u64,
        args: [u64; 6],
        result: u64,
        mem: &[(Addr, &[u8])],
    ) -> Vec<(String, Addr, u64)> {
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
        for_each_written(nr, &args, result, &mut read, &mut |r| {
            assert_eq!(r.dir, Dir::Write);
            out.push((r.name.to_string(), r.addr, r.len))
        });
        out
    }

    #[test]
    fn fstatfs_writes_its_struct_statfs() {
        let r = ranges_of(138, [3, 0x1000, 0, 0, 0, 0], &[]);
        assert_eq!(r, [("fstatfs(buf)".to_string(), Dir::Write, 0x1000, 120)]);
        assert_eq!(
            written(138, [3, 0x1000, 0, 0, 0, 0], 0, &[]),
            [("fstatfs(buf)".to_string(), 0x1000, 120)]
        );
        // A failed call wrote nothing.
        assert!(written(138, [3, 0x1000, 0, 0, 0, 0], -9i64 as u64, &[]).is_empty());
    }

    #[test]
    fn a_read_writes_what_it_returned() {
        assert_eq!(
            written(0, [3, 0x1000, 4096, 0, 0, 0], 10, &[]),
            [("read(buf)".to_string(), 0x1000, 10)]
        );
        // getgroups: the result counts gid_t entries.
        assert_eq!(
            written(115, [32, 0x2000, 0, 0, 0, 0], 3, &[]),
            [("getgroups(list)".to_string(), 0x2000, 12)]
        );
    }

    #[test]
    fn a_sleep_writes_its_remainder_only_when_interrupted() {
        let args = [0x1000, 0x2000, 0, 0, 0, 0];
        assert!(written(35, args, 0, &[]).is_empty());
        assert_eq!(
            written(35, args, -4i64 as u64, &[]),
            [("nanosleep(rem)".to_string(), 0x2000, 16)]
        );
    }

    #[test]
    fn getitimer_checks_each_timeval_field() {
        let r = ranges_of(36, [0, 0x1000, 0, 0, 0, 0], &[]);
        let got: Vec<_> = r.iter().map(|x| (x.0.as_str(), x.2, x.3)).collect();
        assert_eq!(
            got,
            [
                ("getitimer(&value->it_interval)", 0x1000, 8),
                ("getitimer(&value->it_interval)", 0x1008, 8),
                ("getitimer(&value->it_value)", 0x1010, 8),
                ("getitimer(&value->it_value)", 0x1018, 8)
            ]
        );
    }

    #[test]
    fn unknown_ioctls_follow_their_ioc_encoding() {
        // _IOR('x', 1, 24 bytes): the kernel writes 24 bytes; _IOW: reads them.
        let ior = (2u64 << 30) | (24 << 16) | (0x78 << 8) | 1;
        let iow = (1u64 << 30) | (24 << 16) | (0x78 << 8) | 1;
        assert_eq!(
            ranges_of(16, [3, ior, 0x1000, 0, 0, 0], &[]),
            [("ioctl(generic)".to_string(), Dir::Write, 0x1000, 24)]
        );
        assert_eq!(
            written(16, [3, ior, 0x1000, 0, 0, 0], 0, &[]),
            [("ioctl(generic)".to_string(), 0x1000, 24)]
        );
        // Valgrind marks an unknown request's buffer only when it returned 0.
        assert!(written(16, [3, ior, 0x1000, 0, 0, 0], 1, &[]).is_empty());
        assert_eq!(
            ranges_of(16, [3, iow, 0x1000, 0, 0, 0], &[]),
            [("ioctl(generic)".to_string(), Dir::Read, 0x1000, 24)]
        );
        assert!(written(16, [3, iow, 0x1000, 0, 0, 0], 0, &[]).is_empty());
        // Old terminal requests carry no encoding: only the named ones are described.
        assert!(ranges_of(16, [3, 0x5429, 0x1000, 0, 0, 0], &[]).is_empty());
    }

    #[test]
    fn recvmsg_writes_the_received_bytes_over_its_iovecs() {
        let mut msg = [0u8; 56];
        msg[16..24].copy_from_slice(&0x7000u64.to_le_bytes());
        msg[24..32].copy_from_slice(&2u64.to_le_bytes());
        let mut iov = [0u8; 32];
        iov[..8].copy_from_slice(&0x8000u64.to_le_bytes());
        iov[8..16].copy_from_slice(&8u64.to_le_bytes());
        iov[16..24].copy_from_slice(&0x9000u64.to_le_bytes());
        iov[24..].copy_from_slice(&100u64.to_le_bytes());
        let mem: &[(Addr, &[u8])] = &[(0x6000, &msg), (0x7000, &iov)];
        let pre = ranges_of(47, [3, 0x6000, 0, 0, 0, 0], mem);
        let names: Vec<_> = pre.iter().map(|x| (x.0.as_str(), x.1, x.3)).collect();
        assert_eq!(
            names,
            [
                ("recvmsg(msg)", Dir::Read, 12),
                ("recvmsg(msg)", Dir::Read, 32),
                ("recvmsg(msg)", Dir::Write, 4),
                ("recvmsg(msg.msg_iov)", Dir::Read, 32),
                ("recvmsg(msg.msg_iov[0])", Dir::Write, 8),
                ("recvmsg(msg.msg_iov[1])", Dir::Write, 100)
            ]
        );
        assert_eq!(
            written(47, [3, 0x6000, 0, 0, 0, 0], 10, mem),
            [
                ("recvmsg(msg)".to_string(), 0x6030, 4),
                ("recvmsg(msg.msg_iov[0])".to_string(), 0x8000, 8),
                ("recvmsg(msg.msg_iov[1])".to_string(), 0x9000, 2)
            ]
        );
    }

    #[test]
    fn recvmmsg_names_entry_and_iovec() {
        let mut mm = [0u8; 64];
        mm[16..24].copy_from_slice(&0x7000u64.to_le_bytes());
        mm[24..32].copy_from_slice(&1u64.to_le_bytes());
        mm[56..60].copy_from_slice(&5u32.to_le_bytes());
        let mut iov = [0u8; 16];
        iov[..8].copy_from_slice(&0x8000u64.to_le_bytes());
        iov[8..].copy_from_slice(&64u64.to_le_bytes());
        let mem: &[(Addr, &[u8])] = &[(0x6000, &mm), (0x7000, &iov)];
        let pre = ranges_of(299, [3, 0x6000, 1, 0, 0, 0], mem);
        let names: Vec<_> = pre.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "recvmsg(mmsg[0].msg_hdr)",
                "recvmsg(mmsg[0].msg_hdr)",
                "recvmsg(mmsg[0].msg_hdr)",
                "recvmsg(mmsg[0].msg_hdr.msg_iov)",
                "recvmsg(mmsg[0].msg_hdr.msg_iov[0])",
                "recvmmsg(mmsg[0].msg_len)"
            ]
        );
        let post = written(299, [3, 0x6000, 1, 0, 0, 0], 1, mem);
        assert_eq!(
            post[1],
            ("recvmsg(mmsg[0].msg_hdr.msg_iov[0])".to_string(), 0x8000, 5)
        );
        assert_eq!(
            post[2],
            ("recvmmsg(mmsg[0].msg_len)".to_string(), 0x6038, 4)
        );
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
