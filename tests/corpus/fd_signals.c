/* Descriptor system calls that block until a signal arrives (track_fds.rs): the open of a
   FIFO without a writer, an accept without a client, a read of an empty pipe, each
   interrupted by SIGALRM from a repeating timer.

   `fd_signals eintr FIFO`: the handler has no SA_RESTART and does nothing; each call fails
   with EINTR.
   `fd_signals restart FIFO`: SA_RESTART; the handler makes the call able to complete (opens the
   FIFO for writing, connects to the socket, writes to the pipe) and the kernel restarts it.

   Every descriptor the handler makes is closed again by main, so that the descriptors left
   open at exit were all opened by main (their stacks need no unwinding through a signal
   frame). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

enum { OPEN_FIFO, ACCEPT, READ_PIPE, STAGES };

static volatile sig_atomic_t stage = -1;
static volatile sig_atomic_t done[STAGES];
static char fifo[4096];
static struct sockaddr_in listening;
static int pipe_in = -1;
/* What the handler opened, for main to close. */
static volatile int handler_fd[STAGES] = {-1, -1, -1};

static int restart;

static void on_alarm(int sig) {
    (void)sig;
    int s = stage;
    int saved = errno;
    if (!restart || s < 0 || s >= STAGES || done[s]) {
        return;
    }
    done[s] = 1;
    switch (s) {
    case OPEN_FIFO:
        /* A FIFO opened for reading and writing never blocks, and is a writer. */
        handler_fd[s] = open(fifo, O_RDWR);
        break;
    case ACCEPT: {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        connect(c, (struct sockaddr *)&listening, sizeof listening);
        handler_fd[s] = c;
        break;
    }
    case READ_PIPE:
        write(pipe_in, "x", 1);
        break;
    }
    errno = saved;
}

static void timer(int on) {
    /* Repeating: one tick that comes before the call blocks is followed by another. */
    struct itimerval t = {{0, 50000}, {0, on ? 50000 : 0}};
    setitimer(ITIMER_REAL, &t, 0);
}

static void said(const char *what, long r) {
    if (r < 0) {
        printf("%s: %s\n", what, strerror(errno));
    } else {
        printf("%s: done\n", what);
    }
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: fd_signals eintr|restart FIFO-PATH\n");
        return 2;
    }
    restart = !strcmp(argv[1], "restart");
    snprintf(fifo, sizeof fifo, "%s", argv[2]);
    unlink(fifo);
    if (mkfifo(fifo, 0600) != 0) {
        perror("mkfifo");
        return 2;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigaction(SIGALRM, &sa, 0);

    int ls = socket(AF_INET, SOCK_STREAM, 0);
    listening.sin_family = AF_INET;
    listening.sin_addr.s_addr = htonl(0x7f000001);
    bind(ls, (struct sockaddr *)&listening, sizeof listening);
    listen(ls, 1);
    socklen_t l = sizeof listening;
    getsockname(ls, (struct sockaddr *)&listening, &l);
    int p[2];
    pipe(p);
    pipe_in = p[1];

    stage = OPEN_FIFO;
    timer(1);
    int f = open(fifo, O_RDONLY);
    timer(0);
    said("open of a FIFO without a writer", f);

    stage = ACCEPT;
    timer(1);
    int a = accept(ls, 0, 0);
    timer(0);
    said("accept without a client", a);

    stage = READ_PIPE;
    char c;
    timer(1);
    long n = read(p[0], &c, 1);
    timer(0);
    said("read of an empty pipe", n);

    stage = STAGES;
    for (int s = 0; s < STAGES; s++) {
        if (handler_fd[s] >= 0) {
            close(handler_fd[s]);
        }
    }
    unlink(fifo);
    return restart ? 0 : 5;
}
