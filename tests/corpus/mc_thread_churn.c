/* 16 threads each allocating and freeing (argv[1] times, default 20000): glibc's malloc
 * internals at thread exit (tcache_thread_shutdown -> _int_free) must not be reported
 * (issue 10: 3,143 false errors). Also malloc_trim, mallinfo2 and fork's allocator
 * handlers, which walk glibc's chunks. */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static long rounds = 20000;

static void *churn(void *arg) {
    void *keep[64] = {0};
    for (long i = 0; i < rounds; i++) {
        int slot = (int)(i & 63);
        free(keep[slot]);
        keep[slot] = malloc(16 + (size_t)(i * 7 + (long)arg) % 600);
    }
    for (int i = 0; i < 64; i++)
        free(keep[i]);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1)
        rounds = atol(argv[1]);
    pthread_t t[16];
    for (long i = 0; i < 16; i++)
        pthread_create(&t[i], NULL, churn, (void *)i);
    for (int i = 0; i < 16; i++)
        pthread_join(t[i], NULL);
    struct mallinfo2 mi = mallinfo2();
    malloc_trim(0);
    pid_t pid = fork();
    if (pid == 0) {
        free(malloc(100));
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    printf("done %d\n", mi.arena > 0);
    return 0;
}
