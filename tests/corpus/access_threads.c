/* One invalid heap access per thread, in a fixed order (each thread waits for the one
   before it), so thread numbers and report order are the same under any tool. */
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>

static sem_t turn[4];
static volatile int sink;

static void *worker(void *arg) {
    int k = (int)(long)arg;
    sem_wait(&turn[k]);
    int *p = malloc(sizeof(int) * (k + 4));
    if (k == 1)
        sink = p[k + 4];        /* read just past the end */
    else if (k == 2)
        p[-3] = k;              /* write into the left redzone (not over glibc's size
                                   field, which would corrupt its heap natively) */
    else {
        free(p);
        sink = p[0];            /* read after free */
        p = NULL;
    }
    free(p);
    if (k < 3)
        sem_post(&turn[k + 1]);
    return NULL;
}

int main(void) {
    pthread_t t[4];
    for (int k = 1; k <= 3; k++)
        sem_init(&turn[k], 0, 0);
    for (int k = 1; k <= 3; k++)
        pthread_create(&t[k], NULL, worker, (void *)(long)k);
    sem_post(&turn[1]);
    for (int k = 1; k <= 3; k++)
        pthread_join(t[k], NULL);
    printf("joined\n");
    return 0;
}
