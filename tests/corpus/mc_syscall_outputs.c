/* System calls that write the program's memory: each writes into an uninitialised heap
 * buffer (or a stack struct filled field by field), and the program then branches on every
 * byte the kernel wrote (Valgrind's POST_MEM_WRITE), so an output left undefined is a
 * "Conditional jump" error. Valgrind's Memcheck reports none. With argv[1] a case name,
 * one call gets a freed buffer instead: "Syscall param ... points to unaddressable byte(s)". */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/random.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/msg.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/sem.h>
#include <sys/sendfile.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/timex.h>
#include <sys/timerfd.h>
#include <sys/times.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

/* A branch on each byte: an undefined one is a conditional jump on uninitialised data. */
__attribute__((noinline)) static void use(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] == 0x5a)
            sink++;
}

/* A buffer with undefined contents. */
static void *fresh(size_t n) { return malloc(n); }

static void files(void) {
    struct statfs *sf = fresh(sizeof *sf);
    if (statfs("/", sf) == 0)
        use(sf, sizeof *sf);
    int fd = open("/", O_RDONLY | O_DIRECTORY);
    if (fstatfs(fd, sf) == 0)
        use(sf, sizeof *sf);
    char *d = fresh(4096);
    long n = syscall(SYS_getdents64, fd, d, 4096);
    if (n > 0)
        use(d, n);
    close(fd);
    char *link = fresh(256);
    n = readlinkat(AT_FDCWD, "/proc/self/cwd", link, 256);
    if (n > 0)
        use(link, n);
    char *cwd = fresh(4096);
    if (syscall(SYS_getcwd, cwd, 4096) > 0)
        use(cwd, strlen(cwd) + 1);

    char path[] = "/tmp/mc_syscall_outputsXXXXXX";
    int f = mkstemp(path);
    char *list = fresh(256);
    if (fsetxattr(f, "user.oxgrind", "value", 5, 0) == 0) {
        n = fgetxattr(f, "user.oxgrind", list, 256);
        if (n > 0)
            use(list, n);
        n = getxattr(path, "user.oxgrind", list, 256);
        if (n > 0)
            use(list, n);
        n = lgetxattr(path, "user.oxgrind", list, 256);
        if (n > 0)
            use(list, n);
    }
    n = flistxattr(f, list, 256);
    if (n > 0)
        use(list, n);
    n = listxattr(path, list, 256);
    if (n > 0)
        use(list, n);
    n = llistxattr(path, list, 256);
    if (n > 0)
        use(list, n);

    /* F_GETLK: the kernel writes the lock back; Valgrind marks l_pid. */
    struct flock lk;
    lk.l_type = F_WRLCK;
    lk.l_whence = SEEK_SET;
    lk.l_start = 0;
    lk.l_len = 0;
    if (fcntl(f, F_GETLK, &lk) == 0)
        use(&lk.l_pid, sizeof lk.l_pid);

    /* sendfile's offset */
    write(f, "0123456789", 10);
    int out = open("/dev/null", O_WRONLY);
    off_t *off = fresh(sizeof *off);
    *off = 2;
    if (sendfile(out, f, off, 4) >= 0)
        use(off, sizeof *off);
    close(out);

    struct { unsigned int bytes; int type; unsigned char h[128]; } *fh = fresh(sizeof *fh);
    int *mnt = fresh(sizeof *mnt);
    fh->bytes = 128;
    if (name_to_handle_at(AT_FDCWD, path, (struct file_handle *)fh, mnt, 0) == 0) {
        use(fh, 8 + fh->bytes);
        use(mnt, sizeof *mnt);
    }
    struct timespec times[2] = {{1, 0}, {0, UTIME_OMIT}};
    utimensat(AT_FDCWD, path, times, 0);
    close(f);
    unlink(path);
    free(sf), free(d), free(link), free(cwd), free(list), free(off), free(fh), free(mnt);
}

static void ids_and_limits(void) {
    uid_t *u = fresh(3 * sizeof *u);
    if (getresuid(&u[0], &u[1], &u[2]) == 0)
        use(u, 3 * sizeof *u);
    gid_t *g = fresh(3 * sizeof *g);
    if (getresgid(&g[0], &g[1], &g[2]) == 0)
        use(g, 3 * sizeof *g);
    gid_t *groups = fresh(256 * sizeof *groups);
    int ng = getgroups(256, groups);
    if (ng > 0)
        use(groups, ng * sizeof *groups);
    struct { unsigned int version; int pid; } hdr = {0x20080522, 0};
    struct { unsigned int eff, perm, inh; } *caps = fresh(2 * 12);
    if (syscall(SYS_capget, &hdr, caps) == 0)
        use(caps, 12); /* Valgrind marks one __user_cap_data_struct */
    struct rlimit *rl = fresh(sizeof *rl);
    if (getrlimit(RLIMIT_NOFILE, rl) == 0)
        use(rl, sizeof *rl);
    if (prlimit(0, RLIMIT_STACK, NULL, rl) == 0)
        use(rl, sizeof *rl);
    struct rusage *ru = fresh(sizeof *ru);
    if (getrusage(RUSAGE_SELF, ru) == 0)
        use(ru, sizeof *ru);
    struct tms *t = fresh(sizeof *t);
    if (times(t) != (clock_t)-1)
        use(t, sizeof *t);
    char *name = fresh(16);
    if (prctl(PR_GET_NAME, name) == 0)
        use(name, 16);
    int *pdeath = fresh(sizeof *pdeath);
    if (prctl(PR_GET_PDEATHSIG, pdeath) == 0)
        use(pdeath, sizeof *pdeath);
    unsigned long *fsbase = fresh(sizeof *fsbase);
    if (syscall(SYS_arch_prctl, 0x1003 /* ARCH_GET_FS */, fsbase) == 0)
        use(fsbase, sizeof *fsbase);
    unsigned *cpu = fresh(2 * sizeof *cpu);
    if (syscall(SYS_getcpu, &cpu[0], &cpu[1], NULL) == 0)
        use(cpu, 2 * sizeof *cpu);
    void **head = fresh(sizeof *head);
    size_t *len = fresh(sizeof *len);
    if (syscall(SYS_get_robust_list, 0, head, len) == 0) {
        use(head, sizeof *head);
        use(len, sizeof *len);
    }
    struct sched_param *sp = fresh(sizeof *sp);
    if (sched_getparam(0, sp) == 0)
        use(sp, sizeof *sp);
    struct timespec *rr = fresh(sizeof *rr);
    if (sched_rr_get_interval(0, rr) == 0)
        use(rr, sizeof *rr);
    unsigned int *attr = fresh(56);
    attr[0] = 56; /* Valgrind reads attr->size */
    if (syscall(SYS_sched_getattr, 0, attr, 56, 0) == 0)
        use(attr, attr[0]);
    struct timex *tx = fresh(sizeof *tx);
    tx->modes = 0; /* a query: allowed to anyone */
    if (adjtimex(tx) >= 0)
        use(tx, sizeof *tx);
    int *policy = fresh(sizeof *policy);
    unsigned long *nodes = fresh(8 * sizeof *nodes);
    if (syscall(SYS_get_mempolicy, policy, nodes, 64 * 8 + 1, NULL, 0) == 0) {
        use(policy, sizeof *policy);
        use(nodes, 8 * sizeof *nodes);
    }
    char *klog = fresh(64);
    long kn = syscall(SYS_syslog, 3 /* READ_ALL */, klog, 64);
    if (kn > 0)
        use(klog, kn);
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        sched_setaffinity(0, sizeof set, &set);
    free(tx), free(policy), free(nodes), free(klog);
    free(u), free(g), free(groups), free(caps), free(rl), free(ru), free(t), free(name);
    free(pdeath), free(fsbase), free(cpu), free(head), free(len), free(sp), free(rr), free(attr);
}

static void timers_and_signals(void) {
    struct itimerval *iv = fresh(sizeof *iv);
    if (getitimer(ITIMER_REAL, iv) == 0)
        use(iv, sizeof *iv);
    struct itimerval zero;
    memset(&zero, 0, sizeof zero);
    if (setitimer(ITIMER_VIRTUAL, &zero, iv) == 0)
        use(iv, sizeof *iv);

    stack_t *oss = fresh(sizeof *oss);
    if (sigaltstack(NULL, oss) == 0)
        use(oss, sizeof *oss);

    int tfd = timerfd_create(CLOCK_MONOTONIC, 0);
    struct itimerspec set, *its = fresh(sizeof *its);
    memset(&set, 0, sizeof set);
    set.it_value.tv_sec = 100;
    if (timerfd_settime(tfd, 0, &set, its) == 0)
        use(its, sizeof *its);
    if (timerfd_gettime(tfd, its) == 0)
        use(its, sizeof *its);
    close(tfd);

    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_NONE;
    int *kid = fresh(sizeof *kid);
    if (syscall(SYS_timer_create, CLOCK_MONOTONIC, &sev, kid) == 0) {
        use(kid, sizeof *kid);
        if (syscall(SYS_timer_settime, *kid, 0, &set, its) == 0)
            use(its, sizeof *its);
        if (syscall(SYS_timer_gettime, *kid, its) == 0)
            use(its, sizeof *its);
        syscall(SYS_timer_delete, *kid);
    }

    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    sigprocmask(SIG_BLOCK, &block, NULL);
    raise(SIGUSR1);
    unsigned long *pending = fresh(8);
    if (syscall(SYS_rt_sigpending, pending, 8) == 0)
        use(pending, 8);
    siginfo_t *si = fresh(sizeof *si);
    struct timespec ts = {1, 0};
    if (sigtimedwait(&block, si, &ts) == SIGUSR1)
        use(si, sizeof *si);

    struct timespec *rem = fresh(sizeof *rem);
    struct timespec shortly = {0, 1000};
    nanosleep(&shortly, rem); /* rem is written only when interrupted */
    free(iv), free(oss), free(its), free(kid), free(pending), free(si), free(rem);
}

static void children(void) {
    pid_t pid = fork();
    if (pid == 0)
        _exit(3);
    siginfo_t *si = fresh(sizeof *si);
    if (waitid(P_PID, pid, si, WEXITED) == 0)
        use(si, sizeof *si);
    pid = fork();
    if (pid == 0)
        _exit(4);
    int *status = fresh(sizeof *status);
    struct rusage *ru = fresh(sizeof *ru);
    if (wait4(pid, status, 0, ru) == pid) {
        use(status, sizeof *status);
        use(ru, sizeof *ru);
    }
    free(si), free(status), free(ru);
}

/* A child stopped under our ptrace, as a debugger's tracee is. */
static pid_t traced_child(void) {
    pid_t pid = fork();
    if (pid == 0) {
        ptrace(PTRACE_TRACEME, 0, 0, 0);
        raise(SIGSTOP);
        _exit(5);
    }
    int status;
    waitpid(pid, &status, 0);
    return pid;
}

/* What a debugger reads of its tracee (gdb: registers, siginfo, words of its memory). */
static void debugger(void) {
    pid_t pid = traced_child();
    struct user_regs_struct *regs = fresh(sizeof *regs);
    if (ptrace(PTRACE_GETREGS, pid, 0, regs) == 0) {
        use(regs, sizeof *regs);
        /* The peeked word, written by the kernel into the caller's `data`. */
        long *word = fresh(sizeof *word);
        if (syscall(SYS_ptrace, PTRACE_PEEKDATA, pid, regs->rsp, word) == 0)
            use(word, sizeof *word);
        free(word);
    }
    struct user_fpregs_struct *fp = fresh(sizeof *fp);
    if (ptrace(PTRACE_GETFPREGS, pid, 0, fp) == 0)
        use(fp, sizeof *fp);
    siginfo_t *si = fresh(sizeof *si);
    if (ptrace(PTRACE_GETSIGINFO, pid, 0, si) == 0)
        use(si, sizeof *si);
    unsigned long *msg = fresh(sizeof *msg);
    if (ptrace(PTRACE_GETEVENTMSG, pid, 0, msg) == 0)
        use(msg, sizeof *msg);
    /* A register set bigger than the kernel's: iov_len comes back as what it wrote. */
    struct iovec *iov = fresh(sizeof *iov);
    iov->iov_base = fresh(1024);
    iov->iov_len = 1024;
    if (ptrace(PTRACE_GETREGSET, pid, 1 /* NT_PRSTATUS */, iov) == 0)
        use(iov->iov_base, iov->iov_len);
    ptrace(PTRACE_CONT, pid, 0, 0);
    int status;
    waitpid(pid, &status, 0);
    free(regs), free(fp), free(si), free(msg), free(iov->iov_base), free(iov);
}

static void memory(void) {
    long page = sysconf(_SC_PAGESIZE);
    char *m = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    m[0] = 1;
    unsigned char *vec = fresh(3);
    if (mincore(m, 3 * page - 10, vec) == 0)
        use(vec, 3);
    munmap(m, 3 * page);

    char src[32];
    memset(src, 'r', sizeof src);
    char *dst = fresh(32);
    struct iovec *local = fresh(sizeof *local), remote = {src, sizeof src};
    local->iov_base = dst;
    local->iov_len = 32;
    ssize_t n = process_vm_readv(getpid(), local, 1, &remote, 1, 0);
    if (n > 0)
        use(dst, n);
    free(vec), free(dst), free(local);
}

static void sockets(void) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) != 0)
        return;
    int *type = fresh(sizeof *type);
    socklen_t *tlen = fresh(sizeof *tlen);
    *tlen = sizeof *type;
    if (getsockopt(sv[0], SOL_SOCKET, SO_TYPE, type, tlen) == 0) {
        use(tlen, sizeof *tlen);
        use(type, *tlen);
    }

    /* recvmsg into a msghdr filled field by field: its padding stays undefined. */
    send(sv[1], "hello", 5, 0);
    char *buf = fresh(64);
    struct iovec iov = {buf, 64};
    struct msghdr msg;
    msg.msg_name = NULL;
    msg.msg_namelen = 0;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = NULL;
    msg.msg_controllen = 0;
    ssize_t n = recvmsg(sv[0], &msg, 0);
    if (n > 0) {
        use(buf, n);
        use(&msg.msg_flags, sizeof msg.msg_flags);
    }

    send(sv[1], "world!", 6, 0);
    send(sv[1], "again", 5, 0);
    struct mmsghdr *mm = fresh(2 * sizeof *mm);
    char *b2 = fresh(128);
    struct iovec iov2[2] = {{b2, 64}, {b2 + 64, 64}};
    for (int i = 0; i < 2; i++) {
        mm[i].msg_hdr.msg_name = NULL;
        mm[i].msg_hdr.msg_namelen = 0;
        mm[i].msg_hdr.msg_iov = &iov2[i];
        mm[i].msg_hdr.msg_iovlen = 1;
        mm[i].msg_hdr.msg_control = NULL;
        mm[i].msg_hdr.msg_controllen = 0;
    }
    int got = recvmmsg(sv[0], mm, 2, MSG_DONTWAIT, NULL);
    for (int i = 0; i < got; i++) {
        use(&mm[i].msg_len, sizeof mm[i].msg_len);
        use(iov2[i].iov_base, mm[i].msg_len);
    }

    struct pollfd pfd;
    pfd.fd = sv[0];
    pfd.events = POLLIN;
    struct timespec zero = {0, 0};
    if (ppoll(&pfd, 1, &zero, NULL) >= 0)
        use(&pfd.revents, sizeof pfd.revents);
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(sv[0], &rd);
    struct timeval tv = {0, 0};
    if (select(sv[0] + 1, &rd, NULL, NULL, &tv) >= 0)
        use(&rd, sizeof rd);

    int ep = epoll_create1(0);
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLOUT;
    epoll_ctl(ep, EPOLL_CTL_ADD, sv[1], &ev);
    struct epoll_event *evs = fresh(4 * sizeof *evs);
    n = epoll_wait(ep, evs, 4, 0);
    if (n > 0)
        use(evs, n * sizeof *evs);
    close(ep);
    close(sv[0]);
    close(sv[1]);
    free(type), free(tlen), free(buf), free(mm), free(b2), free(evs);
}

static void ioctls(void) {
    /* An _IOR request Valgrind does not know by name: its encoding says 4 bytes written. */
    int r = open("/dev/urandom", O_RDONLY);
    int *entropy = fresh(sizeof *entropy);
    if (ioctl(r, RNDGETENTCNT, entropy) == 0)
        use(entropy, sizeof *entropy);
    close(r);
    int pt = posix_openpt(O_RDWR | O_NOCTTY);
    if (pt >= 0) {
        unsigned int *ptn = fresh(sizeof *ptn);
        if (ioctl(pt, TIOCGPTN, ptn) == 0)
            use(ptn, sizeof *ptn);
        struct winsize *ws = fresh(sizeof *ws);
        if (ioctl(pt, TIOCGWINSZ, ws) == 0)
            use(ws, sizeof *ws);
        int *avail = fresh(sizeof *avail);
        if (ioctl(pt, FIONREAD, avail) == 0)
            use(avail, sizeof *avail);
        close(pt);
        free(ptn), free(ws), free(avail);
    }
    free(entropy);
}

static void ipc(void) {
    int q = msgget(IPC_PRIVATE, 0600);
    if (q >= 0) {
        struct { long type; char text[16]; } out = {7, "message"};
        msgsnd(q, &out, 8, 0);
        struct { long type; char text[64]; } *in = fresh(sizeof *in);
        ssize_t n = msgrcv(q, in, 64, 0, IPC_NOWAIT);
        if (n > 0) {
            use(&in->type, sizeof in->type);
            use(in->text, n);
        }
        struct msqid_ds *ds = fresh(sizeof *ds);
        msgctl(q, IPC_RMID, NULL);
        free(in), free(ds);
    }
    int s = semget(IPC_PRIVATE, 1, 0600);
    if (s >= 0) {
        struct semid_ds *ds = fresh(sizeof *ds);
        if (semctl(s, 0, IPC_STAT, ds) == 0)
            use(ds, sizeof *ds);
        semctl(s, 0, IPC_RMID);
        free(ds);
    }
    int m = shmget(IPC_PRIVATE, 4096, 0600);
    if (m >= 0) {
        struct shmid_ds *ds = fresh(sizeof *ds);
        if (shmctl(m, IPC_STAT, ds) == 0)
            use(ds, sizeof *ds);
        shmctl(m, IPC_RMID, NULL);
        free(ds);
    }
}

/* A freed buffer: the kernel would write into memory the program no longer owns. */
static void *freed(size_t n) {
    void *p = malloc(n);
    free(p);
    return p;
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "";
    if (!strcmp(c, "fstatfs")) {
        int fd = open("/", O_RDONLY);
        fstatfs(fd, freed(sizeof(struct statfs)));
        close(fd);
    } else if (!strcmp(c, "getresuid")) {
        uid_t *u = freed(3 * sizeof *u);
        getresuid(&u[0], &u[1], &u[2]);
    } else if (!strcmp(c, "prctl")) {
        prctl(PR_GET_NAME, freed(16));
    } else if (!strcmp(c, "ioctl")) {
        int r = open("/dev/urandom", O_RDONLY);
        ioctl(r, RNDGETENTCNT, freed(sizeof(int)));
        close(r);
    } else if (!strcmp(c, "ptrace")) {
        pid_t pid = traced_child();
        ptrace(PTRACE_GETREGS, pid, 0, freed(sizeof(struct user_regs_struct)));
        ptrace(PTRACE_CONT, pid, 0, 0);
        waitpid(pid, 0, 0);
    } else if (!strcmp(c, "getitimer")) {
        getitimer(ITIMER_REAL, freed(sizeof(struct itimerval)));
    } else {
        files();
        ids_and_limits();
        timers_and_signals();
        children();
        debugger();
        memory();
        sockets();
        ioctls();
        ipc();
    }
    return 0;
}
