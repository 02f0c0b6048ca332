/* threads: four threads churning the heap at once.
 *
 * Why: a heap tool must be thread-safe, and how it synchronises (one global lock,
 * per-thread buffers, Valgrind's serialisation of all threads) shows up here and not in
 * the single-threaded workloads. Each thread keeps its own bounded live set; one block in
 * 64 is handed to the next thread through a small locked mailbox and freed there, so
 * cross-thread frees happen too.
 *
 * Usage: threads ITERATIONS_PER_THREAD
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 4
#define LIVE 1024
#define MAILBOX 64

struct mailbox {
    pthread_mutex_t lock;
    void *items[MAILBOX];
    int count;
};

static struct mailbox boxes[THREADS];
static long iters;
static uint64_t sums[THREADS];

static __attribute__((noinline)) void *thread_alloc(size_t n) {
    unsigned char *p = malloc(n);
    if (!p) abort();
    memset(p, 7, n < 24 ? n : 24);
    return p;
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t s = 0x2545f4914f6cdd1dull * (uint64_t)(id + 1);
    void **slots = calloc(LIVE, sizeof(void *));
    uint64_t sum = 0;
    for (long i = 0; i < iters; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        size_t idx = s % LIVE;
        unsigned char *old = slots[idx];
        if (old) {
            sum += old[0];
            if ((s >> 32) % 64 == 0) {
                /* hand it to the next thread; free it ourselves if its mailbox is full */
                struct mailbox *b = &boxes[(id + 1) % THREADS];
                pthread_mutex_lock(&b->lock);
                if (b->count < MAILBOX) { b->items[b->count++] = old; old = NULL; }
                pthread_mutex_unlock(&b->lock);
            }
            free(old);
        }
        slots[idx] = thread_alloc(16 + (s >> 20) % 200);
        if (i % 256 == 0) {
            struct mailbox *mine = &boxes[id];
            pthread_mutex_lock(&mine->lock);
            while (mine->count > 0) free(mine->items[--mine->count]);
            pthread_mutex_unlock(&mine->lock);
        }
    }
    for (size_t i = 0; i < LIVE; i++) free(slots[i]);
    free(slots);
    sums[id] = sum;
    return NULL;
}

int main(int argc, char **argv) {
    iters = argc > 1 ? atol(argv[1]) : 250000;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_mutex_init(&boxes[i].lock, NULL);
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i) != 0) abort();
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < THREADS; i++)
        while (boxes[i].count > 0) free(boxes[i].items[--boxes[i].count]);
    uint64_t total = 0;
    for (int i = 0; i < THREADS; i++) total += sums[i];
    printf("threads threads=%d iterations=%ld checksum=%llu\n", THREADS, iters,
           (unsigned long long)total);
    return 0;
}
