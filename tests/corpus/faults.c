/* Fault injection (crates/oxgrind/tests/fault_injection.rs): keeps 1 MiB of heap live, starts
 * a thread that allocates, then ends the way argv[1] says. Every mode prints one line first
 * so the test sees the program's own output survive. */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

void *keep[64];
static volatile int stop;

static void *churn(void *arg) {
    (void)arg;
    while (!stop) { void *p = malloc(100); free(p); usleep(2000); }
    return NULL;
}

static void *exit_from_thread(void *arg) { (void)arg; exit(7); }

static int limit(int resource, rlim_t bytes) {
    struct rlimit r = { bytes, bytes };
    if (setrlimit(resource, &r)) { perror("setrlimit"); return 1; }
    /* What the program can still do under its limit: many small blocks, a few large ones. */
    size_t ok = 0;
    for (int i = 0; i < 4000; i++) { void *p = malloc(1000 + i); if (p) { memset(p, 1, 1000); ok++; } if (i % 2) free(p); }
    void *big = malloc((size_t)bytes * 2);
    printf("small=%zu big=%s\n", ok, big ? "ok" : "null");
    return 0;
}

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "exit";
    for (int i = 0; i < 64; i++) keep[i] = malloc(16384);
    pthread_t t;
    pthread_create(&t, NULL, churn, NULL);
    printf("mode %s\n", how);
    fflush(stdout);
    if (!strcmp(how, "exit")) return 3;
    if (!strcmp(how, "sigint")) raise(SIGINT);
    if (!strcmp(how, "sigterm")) kill(getpid(), SIGTERM);
    if (!strcmp(how, "segv")) { volatile int *p = (int *)16; return *p; }
    if (!strcmp(how, "abort")) abort();
    if (!strcmp(how, "_exit")) _exit(4);
    if (!strcmp(how, "thread-exit")) { pthread_t u; pthread_create(&u, NULL, exit_from_thread, NULL); for (;;) pause(); }
    if (!strcmp(how, "exec")) { execl("/bin/sh", "sh", "-c", "echo exec-ed; exit 9", (char *)NULL); return 126; }
    if (!strcmp(how, "fork") || !strcmp(how, "vfork")) {
        pid_t pid = how[0] == 'v' ? vfork() : fork();
        if (pid == 0) {
            if (how[0] == 'v') { execl("/bin/true", "true", (char *)NULL); _exit(127); }
            keep[0] = malloc(5000);
            return 5;
        }
        int status;
        waitpid(pid, &status, 0);
        printf("child status %d\n", WEXITSTATUS(status));
        return 6;
    }
    if (!strcmp(how, "rlimit-as")) return limit(RLIMIT_AS, 256 << 20);
    if (!strcmp(how, "rlimit-data")) return limit(RLIMIT_DATA, 64 << 20);
    if (!strcmp(how, "rlimit-nofile")) {
        struct rlimit r = { 16, 16 };
        setrlimit(RLIMIT_NOFILE, &r);
        int n = 0;
        while (open("/dev/null", O_RDONLY) >= 0) n++;
        printf("opened %d more\n", n);
        return 0;
    }
    if (!strcmp(how, "close-std")) { close(0); close(1); close(2); keep[1] = malloc(10); return 8; }
    fprintf(stderr, "unknown mode %s\n", how);
    return 2;
}
