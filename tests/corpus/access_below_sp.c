/* Accesses below the stack pointer, past amd64's 128-byte red zone: Memcheck reports
   each ("is on thread N's stack", "N bytes below stack pointer"); the red zone itself is
   the function's to use. */
#include <pthread.h>
#include <stdio.h>

static long read_below(void) {
    long v;
    __asm__ volatile("mov -256(%%rsp), %0" : "=r"(v));
    return v & 0;
}

static void write_below(void) {
    __asm__ volatile("movl $1, -200(%%rsp)" ::: "memory");
}

static long red_zone(void) {
    long v;
    __asm__ volatile("movq $7, -128(%%rsp)\n\tmov -128(%%rsp), %0" : "=r"(v) :: "memory");
    return v;
}

static void vector_below(void) {
    /* A 16-byte store: two 8-byte pieces, as Memcheck stores vectors. */
    __asm__ volatile("pxor %%xmm0, %%xmm0\n\tmovups %%xmm0, -160(%%rsp)" ::: "xmm0", "memory");
}

static void straddling(void) {
    /* 8 bytes from 132 below: 4 of them past the red zone. */
    __asm__ volatile("movq $0, -132(%%rsp)" ::: "memory");
}

static void *thread_main(void *arg) {
    (void)arg;
    return (void *)read_below();
}

int main(void) {
    long sum = 0;
    for (int i = 0; i < 5; i++)
        sum += read_below();
    write_below();
    sum += red_zone();
    vector_below();
    straddling();
    pthread_t t;
    pthread_create(&t, NULL, thread_main, NULL);
    pthread_join(t, NULL);
    printf("%ld\n", sum);
    return 0;
}
