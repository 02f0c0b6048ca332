/* A program at its descriptor limit while threads come and go: the main thread holds every
 * descriptor RLIMIT_NOFILE allows but one and opens and closes that one, over and over,
 * while other threads start, touch their new stacks and end. Natively every open succeeds;
 * a tool that opens a file of its own for a moment (to read /proc/self/maps when it meets a
 * new thread's stack) makes one of them fail with EMFILE. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

static atomic_int stop, started;

static void *short_lived(void *arg) {
    (void)arg;
    /* A read below the red zone: Memcheck looks up this thread's stack to judge it (an
     * error or not, depending on how deep the reused stack has been: not this test's
     * business). */
    long v;
    __asm__ volatile("mov -512(%%rsp), %0" : "=r"(v));
    return (void *)v;
}

static void *spawner(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
        pthread_t t;
        if (pthread_create(&t, NULL, short_lived, NULL) == 0) {
            atomic_fetch_add(&started, 1);
            pthread_join(t, NULL);
        }
    }
    return NULL;
}

int main(void) {
    struct rlimit lim = {32, 32};
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
        perror("setrlimit");
        return 2;
    }
    pthread_t s[2];
    /* Fill the table up to the last descriptor. */
    int last = -1;
    for (;;) {
        int fd = open("/dev/null", O_RDONLY);
        if (fd < 0)
            break;
        last = fd;
    }
    close(last); /* one slot free */
    for (int i = 0; i < 2; i++)
        pthread_create(&s[i], NULL, spawner, NULL);
    int failed = 0;
    while (atomic_load(&started) < 2000) {
        int fd = open("/dev/null", O_RDONLY);
        if (fd < 0) {
            failed++;
            continue;
        }
        close(fd);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(s[i], NULL);
    printf("%d opens failed while 2000 threads came and went\n", failed);
    return failed != 0;
}
