/* --time-unit=i: N calls of each allocation function in a tight loop, so that consecutive
 * snapshots are one call apart: the per-call instruction count (loop + wrapper) must be
 * Valgrind's. N is small enough that no culling happens (one snapshot per event). */
#include <stdlib.h>

#define N 6

static void *p[N];

int main(void) {
    for (int i = 0; i < N; i++) p[i] = malloc(100);
    for (int i = 0; i < N; i++) free(p[i]);
    for (int i = 0; i < N; i++) p[i] = calloc(1, 100);
    for (int i = 0; i < N; i++) p[i] = realloc(p[i], 200);
    for (int i = 0; i < N; i++) free(p[i]);
    return 0;
}
