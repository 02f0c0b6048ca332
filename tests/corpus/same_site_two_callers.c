/* same_site_two_callers: one malloc call site reached through two callers whose frames are
 * the same size, so every call arrives with the same return address and stack pointer and
 * only the caller's return address, further up, tells them apart.
 *
 * Why: the runtime reuses the stack of an earlier call from the same return address and
 * stack pointer when every word its walk read is unchanged (stacks.rs, CachedWalk); a
 * check that looked at the registers alone would give all of these blocks one stack.
 * Massif's tree must give via_a and via_b their own bytes (3 x 40 x 100 and 3 x 40 x 200),
 * as Valgrind's does. */
#include <stdlib.h>
#include <string.h>

static __attribute__((noinline)) void *leaf(size_t n) {
    void *p = malloc(n);
    if (!p) abort();
    return p;
}

static __attribute__((noinline)) void *via_a(size_t n) {
    char *p = leaf(n);
    p[0] = 'a';
    return p;
}

static __attribute__((noinline)) void *via_b(size_t n) {
    char *p = leaf(n * 2);
    p[0] = 'b';
    return p;
}

int main(void) {
    static void *keep[240];
    int k = 0;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 40; i++) {
            keep[k++] = via_a(100);
            keep[k++] = via_b(100);
        }
    }
    for (int i = 0; i < k; i++) free(keep[i]);
    return 0;
}
