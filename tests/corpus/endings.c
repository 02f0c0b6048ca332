/* Ways a process can end, chosen by argv[1]; each allocates first so there is something
 * to report:  exit | _exit | exit_group (the system call itself, no exit handlers) | abort
 * | segv | stack-overflow (main's stack runs out) | thread-stack-overflow (a thread's does)
 * | caught-stack-overflow (main's runs out, the program's SIGSEGV handler on its own
 * alternate stack jumps back and it exits 6)
 * | wait-signal | fork | exec PROG ARGS...
 * | heap-abort | heap-segv (a heap smashed so that glibc's allocator itself aborts or
 * faults: under Massif's default time unit that happens in glibc code oxgrind runs natively) */
#include <pthread.h>
#include <setjmp.h>
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

static sigjmp_buf back;
static char own_alt_stack[64 << 10];

static void jump_back(int sig) {
    (void)sig;
    siglongjmp(back, 1);
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
    if (!strcmp(how, "caught-stack-overflow")) {
        stack_t ss = {.ss_sp = own_alt_stack, .ss_size = sizeof own_alt_stack};
        struct sigaction sa = {.sa_handler = jump_back, .sa_flags = SA_ONSTACK};
        sigemptyset(&sa.sa_mask);
        if (sigaltstack(&ss, NULL) || sigaction(SIGSEGV, &sa, NULL)) return 1;
        if (!sigsetjmp(back, 1)) recurse(0);
        puts("caught");
        return 6;
    }
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
