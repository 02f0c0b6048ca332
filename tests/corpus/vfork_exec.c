/* vfork then exec (and a failing exec then _exit): the child shares the parent's memory
 * until it execs, and runs no fork handlers. The parent's report must still be written. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

void *volatile keep;

int main(void) {
    keep = malloc(4096);
    pid_t pid = vfork();
    if (pid == 0) {
        char *argv[] = {"true", NULL};
        execvp("true", argv);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    pid = vfork();
    if (pid == 0) {
        char *argv[] = {"no-such-program-oxgrind", NULL};
        execvp(argv[0], argv);
        _exit(42);
    }
    waitpid(pid, &status, 0);
    keep = malloc(8192);
    printf("children done: %d\n", WEXITSTATUS(status));
    return 0;
}
