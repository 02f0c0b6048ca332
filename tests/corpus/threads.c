/* Eight threads allocating and freeing under a mutex-protected shared list. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 8
#define ROUNDS 20000

struct node { struct node *next; char payload[40]; };
static struct node *shared;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long total;

static void *work(void *arg) {
    long id = (long)arg, mine = 0;
    for (int i = 0; i < ROUNDS; i++) {
        char *tmp = malloc(16 + (i % 200));
        memset(tmp, (int)id, 16);
        mine += tmp[3];
        free(tmp);
        if (i % 100 == 0) {
            struct node *n = malloc(sizeof *n);
            pthread_mutex_lock(&lock);
            n->next = shared;
            shared = n;
            pthread_mutex_unlock(&lock);
        }
    }
    pthread_mutex_lock(&lock);
    total += mine;
    pthread_mutex_unlock(&lock);
    return NULL;
}

int main(void) {
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, work, (void *)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    int n = 0;
    while (shared) { struct node *x = shared; shared = x->next; free(x); n++; }
    printf("total=%ld nodes=%d\n", total, n);
    return 0;
}
