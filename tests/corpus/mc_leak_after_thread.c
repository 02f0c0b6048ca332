/* Leak checks after a thread exited: the thread left pointers to its blocks only in its
   own dead frames (Valgrind: definitely lost: below where the thread's stack pointer last
   was, its stack is no root) and in its thread-local storage (above it: still reachable
   while glibc keeps the stack, at the request; at exit glibc's cache is freed). With an
   argument, VALGRIND_DO_LEAK_CHECK after the join. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <valgrind/memcheck.h>

static __thread void *in_tls;

__attribute__((noinline)) static void *deep(int n) {
    void *volatile slots[8];
    for (int i = 0; i < 8; i++)
        slots[i] = n > 0 ? deep(n - 1) : 0;
    void *volatile p = malloc(100 + n);
    slots[0] = p;
    return n == 3 ? (void *)slots[0] : 0;
}

static void *worker(void *arg) {
    void *volatile local = malloc(24);
    in_tls = malloc(40);
    deep(3);
    local = 0;
    (void)local;
    return arg;
}

int main(int argc, char **argv) {
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    pthread_join(t, NULL);
    if (argc > 1)
        VALGRIND_DO_LEAK_CHECK;
    printf("done\n");
    return 0;
}
