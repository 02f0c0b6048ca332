/* alloc: millions of small malloc/free with a bounded live set.
 *
 * Why: this is the case where a heap tool's per-allocation cost dominates: every
 * iteration frees one block and allocates another of 16..271 bytes, from one of three
 * call sites at different stack depths, so profilers see several distinct stacks.
 * The live set stays at LIVE blocks, so peak memory is small and bounded.
 *
 * Usage: alloc ITERATIONS   (prints a checksum so a tool run can be compared with native)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIVE 4096

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static inline uint64_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static __attribute__((noinline)) void *make_small(size_t n) {
    unsigned char *p = malloc(n);
    if (!p) abort();
    memset(p, (int)(n & 0xff), n < 32 ? n : 32);
    return p;
}

static __attribute__((noinline)) void *make_medium(size_t n, int depth) {
    if (depth > 0) return make_medium(n, depth - 1);
    return make_small(n + 64);
}

static __attribute__((noinline)) void *make_record(size_t n) {
    unsigned char *p = calloc(1, n + 8);
    if (!p) abort();
    p[0] = 1;
    return p;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 1000000;
    void **slots = calloc(LIVE, sizeof(void *));
    uint64_t sum = 0;
    for (long i = 0; i < iters; i++) {
        uint64_t r = rng();
        size_t idx = r % LIVE;
        size_t n = 16 + (r >> 16) % 256;
        unsigned char *old = slots[idx];
        if (old) sum += old[0];
        free(old);
        switch ((r >> 40) % 4) {
        case 0: slots[idx] = make_medium(n, (int)((r >> 48) % 8)); break;
        case 1: slots[idx] = make_record(n); break;
        default: slots[idx] = make_small(n); break;
        }
    }
    for (size_t i = 0; i < LIVE; i++) free(slots[i]);
    free(slots);
    printf("alloc iterations=%ld checksum=%llu\n", iters, (unsigned long long)sum);
    return 0;
}
