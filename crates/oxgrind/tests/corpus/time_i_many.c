/* --time-unit=i: enough events that Massif culls its snapshot table several times and
 * takes detailed and peak snapshots, with program work between allocations that varies,
 * so which snapshots survive depends on the times being Valgrind's. */
#include <stdlib.h>

static void *volatile sink;

__attribute__((noinline)) static void spin(long k) {
    __asm__ volatile("1: dec %0\n\tjnz 1b" : "+r"(k) : : "cc");
}

__attribute__((noinline)) static void *grow(size_t n) { return malloc(n); }

int main(void) {
    void *live[64] = {0};
    for (int round = 0; round < 6; round++) {
        for (int i = 0; i < 64; i++) {
            live[i] = grow((size_t)(i + 1) * 64 * (round + 1));
            sink = live[i];
            spin(1000 + 37 * i);
        }
        for (int i = 0; i < 64; i += 1 + round % 3) {
            free(live[i]);
            live[i] = 0;
            spin(5000);
        }
        for (int i = 0; i < 64; i++) {
            free(live[i]);
            live[i] = 0;
        }
    }
    return 0;
}
