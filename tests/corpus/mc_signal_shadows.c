/* A signal handler's return gives the interrupted point its registers back, and with them
 * their V bits; a system call the handler interrupted (or that returned just before it ran)
 * still has its results marked defined when it completes.
 *
 * 1. kill() to self: the handler runs right after the syscall returns and leaves an
 *    undefined value in rax; rt_sigreturn restores rax (kill's result, defined), and glibc's
 *    wrapper and main branch on it.
 * 2. A SIGCHLD handler (SA_RESTART) while wait3() waits for a child: wait4 writes the
 *    status after the handler ran; main branches on it (dash's job control does this).
 * 3. The same with read() on a pipe the child writes to after a delay.
 * Clean: no errors under Valgrind or oxgrind. Prints "ok". */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

volatile int sink;

static void __attribute__((noinline)) on_usr1(int sig) {
    int garbage;
    /* An undefined value computed in rax and stored: no use, so no error. */
    __asm__ volatile("" : "=a"(garbage) : "0"(garbage));
    sink = garbage + sig;
}

static void on_chld(int sig) { (void)sig; }

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, 0);
    for (int i = 0; i < 3; i++)
        if (kill(getpid(), SIGUSR1) != 0)
            return 1;

    sa.sa_handler = on_chld;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGCHLD, &sa, 0);
    for (int i = 0; i < 3; i++) {
        pid_t p = fork();
        if (p == 0) {
            usleep(20000);
            _exit(7);
        }
        int st;
        if (wait3(&st, 0, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st) != 7)
            return 2;
    }
    for (int i = 0; i < 3; i++) {
        int fds[2];
        if (pipe(fds) != 0)
            return 3;
        pid_t p = fork();
        if (p == 0) {
            usleep(20000);
            if (write(fds[1], "xyz", 3) != 3)
                _exit(1);
            _exit(0);
        }
        close(fds[1]);
        char buf[8];
        /* The child's exit (SIGCHLD) may arrive while read() waits or right after. */
        if (read(fds[0], buf, sizeof buf) != 3 || buf[0] != 'x' || buf[2] != 'z')
            return 4;
        usleep(30000);
        if (read(fds[0], buf, sizeof buf) != 0)
            return 5;
        close(fds[0]);
        int st;
        if (waitpid(p, &st, 0) != p || WEXITSTATUS(st) != 0)
            return 6;
    }
    puts("ok");
    return 0;
}
