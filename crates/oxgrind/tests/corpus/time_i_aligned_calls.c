/* --time-unit=i: as time_i_calls.c, for the allocation functions that take an alignment
 * and reallocarray: N calls of each in a tight loop, one snapshot per call (the test asks
 * for enough snapshots that none is culled), so the per-call instruction count (loop +
 * wrapper) can be compared with Valgrind's. */
#include <malloc.h>
#include <stdlib.h>

#define N 6

static void *p[N];

int main(void) {
    for (int i = 0; i < N; i++) p[i] = memalign(64, 100);
    for (int i = 0; i < N; i++) free(p[i]);
    for (int i = 0; i < N; i++) posix_memalign(&p[i], 64, 100);
    for (int i = 0; i < N; i++) free(p[i]);
    for (int i = 0; i < N; i++) p[i] = aligned_alloc(64, 128);
    for (int i = 0; i < N; i++) free(p[i]);
    for (int i = 0; i < N; i++) p[i] = valloc(100);
    for (int i = 0; i < N; i++) free(p[i]);
    /* Valgrind counts reallocarray of a null pointer 14 instructions more than of a block. */
    for (int i = 0; i < N; i++) p[i] = reallocarray(0, 10, 10);
    for (int i = 0; i < N; i++) p[i] = reallocarray(p[i], 20, 10);
    for (int i = 0; i < N; i++) free(p[i]);
    return 0;
}
