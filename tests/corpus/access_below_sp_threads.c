/* Accesses below the stack pointer on threads' stacks. Valgrind holds a thread's stack
   (memory glibc mapped) unaddressable only where the thread's stack pointer has been and
   come back up: below the pointer after a deep call, an access is reported ("is on thread
   N's stack", "N bytes below stack pointer"); deeper than the thread has ever been, or on
   a fresh thread's stack, it is not. The threads run one after another (each waits for the
   one before), so thread numbers and report order are the same under any tool. */
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <string.h>

__attribute__((noinline)) static long read_below(void) {
    long v;
    __asm__ volatile("mov -256(%%rsp), %0" : "=r"(v));
    return v & 0;
}

__attribute__((noinline)) static long read_far_below(void) {
    long v;
    __asm__ volatile("mov -16384(%%rsp), %0" : "=r"(v));
    return v & 0;
}

__attribute__((noinline)) static void write_below(void) {
    __asm__ volatile("movl $1, -200(%%rsp)" ::: "memory");
}

__attribute__((noinline)) static void vector_below(void) {
    /* A 16-byte store: two 8-byte pieces, as Memcheck stores vectors. */
    __asm__ volatile("pxor %%xmm0, %%xmm0\n\tmovups %%xmm0, -160(%%rsp)" ::: "xmm0", "memory");
}

__attribute__((noinline)) static long red_zone(void) {
    long v;
    __asm__ volatile("movq $7, -128(%%rsp)\n\tmov -128(%%rsp), %0" : "=r"(v) :: "memory");
    return v;
}

/* A frame of 4 KiB, written whole: the thread's stack pointer goes that deep. */
__attribute__((noinline)) static int deep(int n) {
    volatile char frame[4096];
    memset((char *)frame, n, sizeof frame);
    return frame[n] - n;
}

static sem_t turn[4], done[4];

/* Thread 2: deep, then below its pointer (errors), then far deeper than it has been. */
static void *deep_then_below(void *arg) {
    long sum = deep(3);
    for (int i = 0; i < 3; i++)
        sum += read_below();
    write_below();
    vector_below();
    sum += read_far_below();
    sum += red_zone() - 7;
    sem_post(&done[1]);
    sem_wait(&turn[3]); /* keep this stack in use while thread 3 runs */
    return (void *)sum;
}

/* Thread 3, on a fresh stack: below its pointer before it has been anywhere deep. */
static void *fresh_below(void *arg) {
    long sum = read_below();
    write_below();
    sum += red_zone() - 7;
    return (void *)sum;
}

int main(void) {
    pthread_t a, b;
    for (int k = 0; k < 4; k++) {
        sem_init(&turn[k], 0, 0);
        sem_init(&done[k], 0, 0);
    }
    pthread_create(&a, NULL, deep_then_below, NULL);
    sem_wait(&done[1]);
    pthread_create(&b, NULL, fresh_below, NULL);
    void *rb, *ra;
    pthread_join(b, &rb);
    sem_post(&turn[3]);
    pthread_join(a, &ra);
    printf("%ld\n", (long)ra + (long)rb);
    return 0;
}
