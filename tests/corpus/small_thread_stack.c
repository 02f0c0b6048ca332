/* A thread on the smallest stack POSIX allows (PTHREAD_STACK_MIN, 16 KiB here): glibc
 * carves the static TLS of every loaded library out of it, so a preloaded library's large
 * static TLS left the thread too little for its own frames (a 2 KiB buffer and the dynamic
 * linker's lazy binding, which saves the vector registers), or none (pthread_create's
 * EINVAL). It allocates, frees and prints, as natively. */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *work(void *arg) {
    volatile char buf[2048];
    memset((char *)buf, (int)(long)arg, sizeof buf);
    char *p = malloc(100);
    if (!p) return NULL;
    snprintf(p, 100, "thread sum %d", buf[0] + buf[2047]);
    puts(p);
    free(p);
    return (void *)(long)buf[5];
}

int main(void) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    int r = pthread_attr_setstacksize(&attr, PTHREAD_STACK_MIN);
    pthread_t t;
    int c = pthread_create(&t, &attr, work, (void *)3L);
    void *ret = NULL;
    if (c == 0) pthread_join(t, &ret);
    printf("setstacksize %d, create %s, returned %ld\n", r, strerror(c), (long)ret);
    return c;
}
