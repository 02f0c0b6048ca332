/* Memcheck corpus: leaks made by threads, blocks reachable only from a running thread's stack
 * or from its thread-local storage, and exit() called from a thread with others running. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static pthread_barrier_t ready;
static __thread char *tls_only;

static void *leaker(void *arg) {
    char *volatile p = malloc(77);
    p[0] = (char)(long)arg;
    return NULL;
}

static void *holder(void *arg) {
    (void)arg;
    char *volatile mine = malloc(55);   /* reachable from this thread's stack */
    mine[0] = 1;
    tls_only = malloc(99);              /* reachable only from this thread's TLS */
    tls_only[0] = 2;
    pthread_barrier_wait(&ready);
    for (;;) pause();
    return NULL;
}

static void *exiter(void *arg) {
    (void)arg;
    pthread_barrier_wait(&ready);
    puts("mc_threads done");
    fflush(stdout);
    exit(0);
}

int main(void) {
    pthread_t t[4], h, e;
    for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, leaker, (void *)i);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    pthread_barrier_init(&ready, NULL, 3);
    pthread_create(&h, NULL, holder, NULL);
    pthread_create(&e, NULL, exiter, NULL);
    pthread_barrier_wait(&ready);
    for (;;) pause();
}
