/* Reads below a thread's stack pointer after it called malloc, free and puts: under
   Valgrind those run on Valgrind's own stack (its replacements), under oxgrind on the
   program's. Only where Valgrind reports may oxgrind report: never deeper than the
   thread's own stack pointer went. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define READ_BELOW(N)                                                   \
    __attribute__((noinline)) static long read_below_##N(void) {        \
        long v;                                                         \
        __asm__ volatile("mov -" #N "(%%rsp), %0" : "=r"(v));           \
        return v & 0;                                                   \
    }
READ_BELOW(136) READ_BELOW(192) READ_BELOW(256) READ_BELOW(512) READ_BELOW(1024)
READ_BELOW(1536) READ_BELOW(2048) READ_BELOW(3072) READ_BELOW(4096) READ_BELOW(6144)
READ_BELOW(8192)

static void *worker(void *arg) {
    char *p = malloc(100 + (long)arg);
    p[0] = 'x';
    p[1] = 0;
    puts(p);
    free(p);
    return (void *)(read_below_136() + read_below_192() + read_below_256() +
                    read_below_512() + read_below_1024() + read_below_1536() +
                    read_below_2048() + read_below_3072() + read_below_4096() +
                    read_below_6144() + read_below_8192());
}

int main(void) {
    pthread_t t;
    void *r;
    pthread_create(&t, NULL, worker, NULL);
    pthread_join(t, &r);
    printf("%ld\n", (long)r);
    return 0;
}
