/* DHAT: threads allocating and touching blocks at the same time. Each thread's work is
   fixed, so totals, bytes at exit and bytes read/written are deterministic; the global
   peak (and so t-gmax and the at-t-gmax bytes) depends on the interleaving. */
#include <pthread.h>
#include <stdlib.h>

#define ROUNDS 200

static void *worker(void *arg) {
    size_t size = (size_t)arg;
    void *kept = NULL;
    for (int i = 0; i < ROUNDS; i++) {
        volatile unsigned char *p = malloc(size);
        for (size_t j = 0; j < size; j++) p[j] = (unsigned char)j;
        unsigned s = 0;
        for (size_t j = 0; j < size; j += 2) s += p[j];
        if (i == ROUNDS - 1) {
            kept = (void *)p;
        } else {
            free((void *)p);
        }
        (void)s;
    }
    return kept;
}

int main(void) {
    pthread_t t[3];
    for (long i = 0; i < 3; i++) pthread_create(&t[i], NULL, worker, (void *)(16 + i * 16));
    void *kept[3];
    for (int i = 0; i < 3; i++) pthread_join(t[i], &kept[i]);
    free(kept[0]);
    return 0;
}
