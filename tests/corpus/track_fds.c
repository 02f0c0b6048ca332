/* --track-fds cases: each leaves some descriptors open at exit, made in a different way.
   Run as `track_fds CASE`; compared with Valgrind's report (track_fds.rs). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/wait.h>

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "basic";
    if (!strcmp(c, "basic")) {
        int a = open("/dev/null", O_RDONLY);
        int b = open("/dev/zero", O_RDONLY);
        close(b);
        int p[2];
        pipe(p);
        dup(a);
        socket(AF_INET, SOCK_STREAM, 0);
    } else if (!strcmp(c, "dups")) {
        int a = open("/dev/null", O_RDONLY);
        int b = open("/dev/zero", O_RDONLY);
        dup2(a, b);                 /* replaces b in place */
        dup3(a, 9, O_CLOEXEC);
        fcntl(a, F_DUPFD, 20);
        fcntl(a, F_DUPFD_CLOEXEC, 30);
        dup2(a, a);
    } else if (!strcmp(c, "libc")) {
        fopen("/dev/null", "r");    /* libc's internal openat */
        int sv[2];
        socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
        pipe2(sv, O_CLOEXEC);
        creat("/tmp/oxg_track_fds_creat", 0600);
        unlink("/tmp/oxg_track_fds_creat");
    } else if (!strcmp(c, "close_range")) {
        for (int i = 0; i < 5; i++)
            open("/dev/null", O_RDONLY);   /* 3..7 */
        close_range(4, 6, 0);
        close_range(7, 7, CLOSE_RANGE_CLOEXEC);
    } else if (!strcmp(c, "exec")) {
        open("/dev/null", O_RDONLY);              /* survives the exec: inherited */
        open("/dev/zero", O_RDONLY | O_CLOEXEC);  /* gone */
        execl(argv[0], argv[0], "after_exec", (char *)0);
    } else if (!strcmp(c, "after_exec")) {
        open("/dev/zero", O_RDONLY);
    } else if (!strcmp(c, "fork_accept")) {
        /* a connected pair over loopback, then a child that inherits them and opens one */
        int ls = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(0x7f000001);
        bind(ls, (void *)&a, sizeof a);
        listen(ls, 1);
        socklen_t l = sizeof a;
        getsockname(ls, (void *)&a, &l);
        int s = socket(AF_INET, SOCK_STREAM, 0);
        connect(s, (void *)&a, sizeof a);
        accept4(ls, 0, 0, SOCK_CLOEXEC);
        close(ls);
        pid_t pid = fork();
        if (pid == 0) {
            open("/dev/null", O_RDONLY);
            _exit(0);
        }
        waitpid(pid, 0, 0);
    } else if (!strcmp(c, "none")) {
    }
    return 0;
}
