/* Ways a process can end, chosen by argv[1]; each allocates first so there is something
 * to report:  exit | _exit | exit_group (the system call itself, no exit handlers) | abort
 * | segv | stack-overflow (main's stack runs out) | thread-stack-overflow (a thread's does)
 * | wait-signal | fork | exec PROG ARGS...
 * | heap-abort | heap-segv (a heap smashed so that glibc's allocator itself aborts or
 * faults: under Massif's default time unit that happens in glibc code oxgrind runs natively) */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* Global and read back, so the compiler cannot drop the allocations. */
void *keep[64];

__attribute__((noinline)) static void allocate_some(void) {
    for (int i = 0; i < 64; i++) keep[i] = malloc(1024);
}

/* Recursion without end: each frame keeps a buffer the compiler cannot drop. */
__attribute__((noinline)) static int recurse(int n) {
    volatile char frame[256];
    frame[0] = (char)n;
    return recurse(n + 1) + frame[0];
}

static void *recurse_in_thread(void *arg) {
    (void)arg;
    return (void *)(intptr_t)recurse(0);
}

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "exit";
    allocate_some();
    if (!keep[63]) return 1;
    if (!strcmp(how, "exit")) { puts("exit"); return 3; }
    if (!strcmp(how, "_exit")) { puts("_exit"); fflush(stdout); _exit(4); }
    if (!strcmp(how, "exit_group")) { puts("exit_group"); fflush(stdout); syscall(SYS_exit_group, 5); }
    if (!strcmp(how, "abort")) { fflush(stdout); abort(); }
    if (!strcmp(how, "segv")) { volatile int *p = (int *)16; return *p; }
    if (!strcmp(how, "stack-overflow")) { fflush(stdout); return recurse(0); }
    if (!strcmp(how, "thread-stack-overflow")) {
        pthread_t t;
        fflush(stdout);
        pthread_create(&t, NULL, recurse_in_thread, NULL);
        pthread_join(t, NULL);
        return 1;
    }
    if (!strcmp(how, "heap-abort")) {
        /* Both chunk headers overwritten: free finds an impossible size and aborts
         * ("munmap_chunk(): invalid pointer" or "free(): invalid size"). */
        char *p = malloc(32), *q = malloc(32);
        fflush(stdout);
        memset(p - 16, 0xff, 64);
        /* The stores are to memory freed next: without this, -O2 drops them as dead. */
        __asm__ volatile("" : : "r"(p), "r"(q) : "memory");
        free(q);
        free(p);
        return 0;
    }
    if (!strcmp(how, "heap-segv")) {
        /* A freed chunk's tcache link (safe-linked: stored as next ^ (chunk >> 12)) made to
         * point at an aligned unmapped address: the second malloc of its size reads it. */
        uintptr_t *q = malloc(32), *p = malloc(32);
        __asm__ volatile("" : : "r"(p), "r"(q) : "memory"); /* or -O2 drops q */
        free(q);
        free(p);
        p[0] = ((uintptr_t)p >> 12) ^ (uintptr_t)0x100000000000ull;
        __asm__ volatile("" : : "r"(p) : "memory");
        fflush(stdout);
        void *volatile a = malloc(32);
        void *volatile b = malloc(32);
        return a != b;
    }
    if (!strcmp(how, "wait-signal")) {
        /* A server: keep allocating until a signal arrives. */
        puts("ready");
        fflush(stdout);
        for (unsigned long i = 0;; i++) {
            void *p = malloc(64 + i % 512);
            free(p);
            if (i % 1000 == 0) usleep(1000);
        }
    }
    if (!strcmp(how, "fork")) {
        pid_t pid = fork();
        if (pid == 0) { keep[0] = malloc(5000); printf("child %d\n", keep[0] != NULL); return 0; }
        int status;
        waitpid(pid, &status, 0);
        printf("parent child_status=%d\n", WEXITSTATUS(status));
        return 0;
    }
    if (!strcmp(how, "exec") && argc > 2) {
        fflush(stdout);
        execv(argv[2], argv + 2);
        perror("execv");
        return 127;
    }
    fprintf(stderr, "unknown mode %s\n", how);
    return 2;
}
