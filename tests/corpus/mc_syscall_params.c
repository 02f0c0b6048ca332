/* Syscall parameter checks: each case passes a heap buffer that is too short (or freed) to
 * one system call, as a program with an off-by-N length would. Under Memcheck each gives
 * "Syscall param NAME points to unaddressable byte(s)" with the block's description. The
 * kernel either only reads the bytes past the block (they are the allocator's redzone) or
 * fails before writing (a closed descriptor, a missing file), so the run stays sound. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

static int pipe_with_byte(int fds[2]) {
  if (pipe(fds) != 0) return -1;
  return write(fds[1], "x", 1) == 1 ? 0 : -1;
}

/* A descriptor number that is surely closed: the kernel fails with EBADF, writing nothing. */
#define CLOSED_FD 1000

int main(int argc, char **argv) {
  const char *c = argc > 1 ? argv[1] : "write";
  char *p = malloc(8);
  memset(p, 'a', 8);
  int fds[2];
  if (!strcmp(c, "write")) {
    int fd = open("/dev/null", O_WRONLY);
    write(fd, p, 16);
  } else if (!strcmp(c, "read")) {
    pipe_with_byte(fds);
    read(fds[0], p, 16);
  } else if (!strcmp(c, "pread")) {
    pipe_with_byte(fds);
    pread(fds[0], p, 16, 0); /* ESPIPE */
  } else if (!strcmp(c, "pwrite")) {
    int fd = open("/dev/null", O_WRONLY);
    pwrite(fd, p, 16, 0);
  } else if (!strcmp(c, "writev")) {
    struct iovec *iov = malloc(sizeof *iov);
    iov->iov_base = p;
    iov->iov_len = 12;
    int fd = open("/dev/null", O_WRONLY);
    writev(fd, iov, 1);
  } else if (!strcmp(c, "writev_array")) {
    struct iovec *iov = malloc(sizeof *iov); /* one entry, two claimed */
    iov->iov_base = p;
    iov->iov_len = 8;
    int fd = open("/dev/null", O_WRONLY);
    writev(fd, iov, 2);
  } else if (!strcmp(c, "readv")) {
    struct iovec iov[2] = {{p, 4}, {p + 4, 8}};
    pipe_with_byte(fds);
    readv(fds[0], iov, 2);
  } else if (!strcmp(c, "send")) {
    socketpair(AF_UNIX, SOCK_STREAM, 0, fds);
    send(fds[0], p, 16, 0);
  } else if (!strcmp(c, "sendto")) {
    socketpair(AF_UNIX, SOCK_DGRAM, 0, fds);
    struct sockaddr_un *a = malloc(4);
    memset(a, 0x61, 4);
    sendto(fds[0], p, 8, 0, (struct sockaddr *)a, sizeof(struct sockaddr_un));
  } else if (!strcmp(c, "recv")) {
    socketpair(AF_UNIX, SOCK_STREAM, 0, fds);
    send(fds[1], "x", 1, 0);
    recv(fds[0], p, 16, 0);
  } else if (!strcmp(c, "recvfrom")) {
    socketpair(AF_UNIX, SOCK_DGRAM, 0, fds);
    send(fds[1], "x", 1, 0);
    socklen_t *len = malloc(2);
    memset(len, 0, 2);
    recvfrom(fds[0], p, 8, 0, (struct sockaddr *)malloc(64), len);
  } else if (!strcmp(c, "sendmsg")) {
    socketpair(AF_UNIX, SOCK_STREAM, 0, fds);
    struct iovec iov = {p, 12};
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    sendmsg(fds[0], &m, 0);
  } else if (!strcmp(c, "recvmsg")) {
    socketpair(AF_UNIX, SOCK_STREAM, 0, fds);
    send(fds[1], "x", 1, 0);
    struct iovec iov = {p, 12};
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    recvmsg(fds[0], &m, 0);
  } else if (!strcmp(c, "open")) {
    open(p, O_RDONLY); /* no NUL inside the block */
  } else if (!strcmp(c, "stat")) {
    struct stat *st = malloc(8);
    stat("/nonexistent/oxgrind", st);
  } else if (!strcmp(c, "stat_name")) {
    struct stat st;
    stat(p, &st);
  } else if (!strcmp(c, "fstat")) {
    struct stat *st = malloc(8);
    fstat(CLOSED_FD, st);
  } else if (!strcmp(c, "lstat")) {
    struct stat *st = malloc(8);
    lstat("/nonexistent/oxgrind", st);
  } else if (!strcmp(c, "statx")) {
    struct statx *st = malloc(8);
    statx(AT_FDCWD, "/nonexistent/oxgrind", 0, STATX_ALL, st);
  } else if (!strcmp(c, "statx_name")) {
    struct statx st;
    statx(AT_FDCWD, p, 0, STATX_ALL, &st);
  } else if (!strcmp(c, "getdents64")) {
    int fd = open("/", O_RDONLY | O_DIRECTORY);
    syscall(SYS_getdents64, fd, p, 16); /* EINVAL: too small for an entry */
  } else if (!strcmp(c, "poll")) {
    struct pollfd *f = malloc(sizeof *f); /* one entry, two claimed */
    f->fd = -1;
    f->events = 0;
    poll(f, 2, 0);
  } else if (!strcmp(c, "ppoll")) {
    struct pollfd *f = malloc(sizeof *f);
    f->fd = -1;
    f->events = 0;
    struct timespec ts = {0, 0};
    ppoll(f, 2, &ts, NULL);
  } else if (!strcmp(c, "select")) {
    fd_set *r = malloc(4);
    memset(r, 0, 4);
    struct timeval tv = {0, 0};
    select(64, r, NULL, NULL, &tv);
  } else if (!strcmp(c, "pselect")) {
    fd_set *r = malloc(4);
    memset(r, 0, 4);
    struct timespec ts = {0, 0};
    pselect(64, r, NULL, NULL, &ts, NULL);
  } else if (!strcmp(c, "epoll_wait")) {
    int ep = epoll_create1(0);
    epoll_wait(ep, (struct epoll_event *)p, 1, 0);
  } else if (!strcmp(c, "epoll_ctl")) {
    int ep = epoll_create1(0);
    pipe(fds);
    char *e = malloc(2);
    memset(e, 0, 2);
    epoll_ctl(ep, EPOLL_CTL_ADD, fds[0], (struct epoll_event *)e);
  } else if (!strcmp(c, "futex")) {
    int *w = malloc(2);
    memset(w, 0, 2);
    syscall(SYS_futex, w, FUTEX_WAIT, 12345, NULL, NULL, 0); /* EAGAIN */
  } else if (!strcmp(c, "clock_gettime")) {
    struct timespec *ts = malloc(8);
    syscall(SYS_clock_gettime, 12345, ts); /* EINVAL: no such clock */
  } else if (!strcmp(c, "nanosleep")) {
    struct timespec *ts = malloc(8);
    ts->tv_sec = 0;
    nanosleep(ts, NULL);
  } else if (!strcmp(c, "clock_nanosleep")) {
    struct timespec *ts = malloc(8);
    ts->tv_sec = 0;
    clock_nanosleep(CLOCK_MONOTONIC, 0, ts, NULL);
  } else if (!strcmp(c, "gettimeofday")) {
    struct timezone *tz = malloc(4);
    syscall(SYS_gettimeofday, NULL, tz);
  } else if (!strcmp(c, "tcgets")) {
    struct termios *t = malloc(8);
    ioctl(CLOSED_FD, TCGETS, t);
  } else if (!strcmp(c, "fionread")) {
    int *n = malloc(2);
    ioctl(CLOSED_FD, FIONREAD, n);
  } else if (!strcmp(c, "tiocgwinsz")) {
    struct winsize *w = malloc(4);
    ioctl(CLOSED_FD, TIOCGWINSZ, w);
  } else if (!strcmp(c, "getrandom")) {
    getrandom(p, 12, 0);
  } else if (!strcmp(c, "uname")) {
    char *u = malloc(sizeof(struct utsname));
    free(u);
    uname((struct utsname *)u); /* into a freed block: the tools keep it from reuse */
  } else if (!strcmp(c, "sigaction")) {
    struct sigaction *sa = malloc(16); /* handler and flags; the mask (+24) is not */
    memset(sa, 0, 16);
    syscall(SYS_rt_sigaction, SIGUSR1, sa, NULL, 8); /* SIG_DFL again */
  } else if (!strcmp(c, "sigprocmask")) {
    sigset_t *s = malloc(4);
    memset(s, 0, 4);
    syscall(SYS_rt_sigprocmask, SIG_BLOCK, s, NULL, 8); /* blocks nothing */
  } else if (!strcmp(c, "pipe2")) {
    int *f = malloc(4);
    syscall(SYS_pipe2, f, -1); /* EINVAL: bad flags */
  } else if (!strcmp(c, "socketpair")) {
    int *f = malloc(4);
    socketpair(12345, SOCK_STREAM, 0, f); /* EAFNOSUPPORT */
  } else if (!strcmp(c, "getsockname")) {
    socklen_t *len = malloc(2);
    memset(len, 0, 2);
    getsockname(CLOSED_FD, malloc(16), len);
  } else if (!strcmp(c, "getpeername")) {
    socklen_t *len = malloc(4);
    *len = 16;
    getpeername(CLOSED_FD, (struct sockaddr *)p, len);
  } else if (!strcmp(c, "connect")) {
    connect(CLOSED_FD, (struct sockaddr *)p, 16);
  } else if (!strcmp(c, "bind")) {
    bind(CLOSED_FD, (struct sockaddr *)p, 16);
  } else if (!strcmp(c, "accept4")) {
    socklen_t *len = malloc(4);
    *len = 16;
    accept4(CLOSED_FD, (struct sockaddr *)p, len, 0);
  } else if (!strcmp(c, "ok")) {
    /* every call with good buffers: no error */
    int fd = open("/dev/null", O_WRONLY);
    write(fd, p, 8);
  } else {
    fprintf(stderr, "unknown case %s\n", c);
    return 2;
  }
  return 0;
}
