/* Four threads allocate and free in a loop while a timer's SIGALRM runs a
 * handler that allocates and frees too: at any instant of a thread's life, inside an
 * allocator call included. Natively glibc's per-thread cache serves the handler's malloc
 * without a lock, so the program finishes. Under a tool the handler can interrupt the
 * runtime's own bookkeeping of the same thread's blocks (the block table's shard lock the
 * interrupted call holds): it must not wait for it (blocks.rs: calls without an event).
 * Prints the threads' sums, which do not depend on the timing. With an argument no timer
 * is set: the reference run (a handler's malloc is not async-signal-safe: natively, one run
 * in a hundred or so ends in glibc's own reentrancy, a corrupted cache or its arena's lock).
 * The timer fires every 250 us: under the tool most ticks land in its hooks. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>

static volatile long handled;
static void *volatile sink;

static void on_alarm(int sig) {
    (void)sig;
    void *p = malloc(48);
    sink = p;
    free(p);
    handled++;
}

static void *work(void *arg) {
    long sum = 0;
    for (long i = 0; i < 20000; i++) {
        char *p = malloc(16 + (i & 255));
        sink = p;
        p[0] = (char)i;
        sum += p[0];
        free(p);
    }
    return (void *)(sum + (long)arg);
}

int main(int argc, char **argv) {
    (void)argv;
    struct sigaction sa = {.sa_handler = on_alarm};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 250}, {0, 250}};
    if (argc < 2) setitimer(ITIMER_REAL, &it, NULL);
    long total = 0;
    for (int round = 0; round < 20; round++) {
        pthread_t t[4];
        for (int i = 0; i < 4; i++)
            if (pthread_create(&t[i], NULL, work, (void *)(long)i)) return 1;
        for (int i = 0; i < 4; i++) {
            void *r;
            pthread_join(t[i], &r);
            total += (long)r;
        }
    }
    it = (struct itimerval){0};
    setitimer(ITIMER_REAL, &it, NULL);
    printf("total %ld\n", total);
    return 0;
}
