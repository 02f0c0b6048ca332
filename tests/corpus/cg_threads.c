/* Cachegrind corpus: two threads, each running a deterministic kernel on its own data, and
 * the main thread one of its own. Per-function instruction, read and write counts do not
 * depend on how the threads interleave. */
#include <pthread.h>

#define N 4096
static int a[2][N];

__attribute__((noinline)) long work(int *v, int rounds) {
    long s = 0;
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < N; i++) {
            v[i] += i;
            s += v[i] & 7;
        }
    return s;
}

static void *thread_main(void *arg) {
    int k = (int)(long)arg;
    return (void *)work(a[k], 3 + k);
}

__attribute__((noinline)) long alone(void) {
    long s = 0;
    for (int i = 0; i < 1000; i++)
        s += i % 7;
    return s;
}

int main(void) {
    pthread_t t[2];
    for (long k = 0; k < 2; k++)
        pthread_create(&t[k], 0, thread_main, (void *)k);
    long s = alone();
    for (int k = 0; k < 2; k++) {
        void *r;
        pthread_join(t[k], &r);
        s += (long)r;
    }
    return (int)(s & 1);
}
