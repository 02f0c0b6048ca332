/* VALGRIND_DO_QUICK_LEAK_CHECK, 50 times, while four threads malloc and free without
 * pause: the search stops them between their allocator calls and must never wait on one
 * that waits on it. The program prints the blocks the last search found leaked. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <valgrind/memcheck.h>

static volatile int stop;

static void *churn(void *arg)
{
    while (!stop) {
        void *p[16];
        for (int i = 0; i < 16; i++)
            p[i] = malloc(32 + i);
        for (int i = 0; i < 16; i++)
            free(p[i]);
    }
    return arg;
}

int main(void)
{
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], 0, churn, 0);
    for (int i = 0; i < 50; i++) {
        void *lost = malloc(8);
        lost = 0;
        VALGRIND_DO_QUICK_LEAK_CHECK;
    }
    unsigned long leaked, dubious, reachable, suppressed;
    VALGRIND_COUNT_LEAK_BLOCKS(leaked, dubious, reachable, suppressed);
    stop = 1;
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], 0);
    printf("leaked blocks %lu\n", leaked);
    return 0;
}
