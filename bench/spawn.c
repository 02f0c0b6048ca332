/* spawn: runs one command and reports its wall time, CPU time and peak RSS.
 *
 * Why not measure from Python directly: Linux folds the RSS peak of the memory image a
 * process had before execve into its ru_maxrss, and a child forked (or vforked) from the
 * Python runner carries the runner's ~18 MiB image until it execs. This helper is a small
 * C program, so the child it forks starts from ~1 MiB, like GNU time's.
 *
 * Usage: spawn RESULT_FILE COMMAND [ARGS...]
 * Writes "wall_ns user_us sys_us maxrss_kib wait_status" to RESULT_FILE and exits with
 * the command's exit code (128+signal if it was killed).
 *
 * ru_maxrss from wait4 is the largest peak of the child and of every descendant it
 * waited for (the kernel merges them): a maximum over processes, not a sum.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: spawn RESULT_FILE COMMAND [ARGS...]\n");
        return 125;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid < 0) {
        perror("spawn: fork");
        return 125;
    }
    if (pid == 0) {
        execvp(argv[2], argv + 2);
        fprintf(stderr, "spawn: cannot run %s: %s\n", argv[2], strerror(errno));
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    while (wait4(pid, &status, 0, &ru) < 0) {
        if (errno != EINTR) {
            perror("spawn: wait4");
            return 125;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long long wall_ns = (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    FILE *f = fopen(argv[1], "w");
    if (!f) {
        perror("spawn: result file");
        return 125;
    }
    fprintf(f, "%lld %lld %lld %ld %d\n", wall_ns,
            (long long)ru.ru_utime.tv_sec * 1000000LL + ru.ru_utime.tv_usec,
            (long long)ru.ru_stime.tv_sec * 1000000LL + ru.ru_stime.tv_usec, ru.ru_maxrss, status);
    fclose(f);
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 125;
}
