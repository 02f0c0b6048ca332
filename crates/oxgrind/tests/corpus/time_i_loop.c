/* --time-unit=i: a loop of exactly known instruction count between two allocations.
 * spin(k) runs 2*k instructions (dec, jnz) plus its call overhead, so the time between the
 * snapshots of the two mallocs is 2*K plus a few dozen (the call, the malloc wrapper). */
#include <stdlib.h>

#define K 1000000L

static void *volatile sink;

__attribute__((noinline)) static void spin(long k) {
    __asm__ volatile("1: dec %0\n\tjnz 1b" : "+r"(k) : : "cc");
}

int main(void) {
    void *a = malloc(16);
    sink = a;
    spin(K);
    void *b = malloc(32);
    sink = b;
    free(a);
    free(b);
    return 0;
}
