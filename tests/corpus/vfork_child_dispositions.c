/* A child that shares the parent's memory (vfork, and posix_spawn's clone(CLONE_VM))
 * puts signal dispositions back to the default before it execs or exits, as gdb's and
 * posix_spawn's children do. Those are the child's own: the parent's handler must still
 * run afterwards. Natively this prints three "handled" lines and exits 0; a parent whose
 * handler was lost dies of SIGUSR1 instead. */
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t handled;

static void on_usr1(int sig) { (void)sig; handled++; }

static void check(const char *after) {
    handled = 0;
    raise(SIGUSR1);
    printf("%s: %s\n", after, handled == 1 ? "handled" : "lost");
    fflush(stdout);
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    check("before");

    pid_t pid = vfork();
    if (pid == 0) {
        signal(SIGUSR1, SIG_DFL);
        _exit(7);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    check("after vfork");

    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t def;
    sigemptyset(&def);
    sigaddset(&def, SIGUSR1);
    posix_spawnattr_setsigdefault(&attr, &def);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    char *argv[] = {"true", NULL};
    char *envp[] = {NULL};
    if (posix_spawn(&pid, "/bin/true", NULL, &attr, argv, envp) == 0)
        waitpid(pid, &status, 0);
    check("after posix_spawn");
    return WEXITSTATUS(status);
}
