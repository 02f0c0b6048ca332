/* DHAT: four threads each allocating, filling and freeing many small blocks. The program
   reads none of its blocks, so all the bytes read DHAT reports are someone else's: glibc's
   own (thread start-up, stdio), and nothing that the memory tool's runtime does per
   allocation, such as looking up its thread-local state through the dynamic loader (which
   reads the thread's TLS vector, a heap block). */
#include <pthread.h>
#include <stdlib.h>

#define ROUNDS 5000

static void *worker(void *arg) {
    size_t size = (size_t)arg;
    for (int i = 0; i < ROUNDS; i++) {
        volatile unsigned char *p = malloc(size);
        for (size_t j = 0; j < size; j++) p[j] = (unsigned char)j;
        free((void *)p);
    }
    return NULL;
}

int main(void) {
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, (void *)(8 + i * 8));
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    return 0;
}
