/* A block whose only pointer lies in a freed block of a thread's arena: definitely lost. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static void *volatile shared;

static void *worker(void *arg) {
    (void)arg;
    void **holder = malloc(64); /* in the thread's arena */
    holder[0] = shared;
    shared = 0;
    free(holder); /* the stale pointer stays in the freed chunk */
    return 0;
}

int main(void) {
    shared = malloc(48); /* main arena */
    memset(shared, 1, 48);
    pthread_t t;
    pthread_create(&t, 0, worker, 0);
    pthread_join(t, 0);
    return 0;
}
