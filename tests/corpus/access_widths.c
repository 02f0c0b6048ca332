/* Loads and stores of 2, 4, 8, 16 and 32 bytes at every offset of heap blocks of 1 to 40
 * bytes that keeps them inside the block (no error, however close to the redzone after the
 * block), then a few of 2 to 16 bytes that reach one byte past a block's end or before its
 * start (errors). The inline addressability check compares every granule an access of its
 * size could touch in one read, and the granules it does touch exactly only when that read
 * finds a nonzero one: the first half must not report, the second must, as Valgrind does. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t sink;

/* Volatile, so that each load and store is one instruction of its size. */
#define TOUCH(T, p)                                                                       \
    do {                                                                                   \
        T v_ = *(volatile T *)(p);                                                         \
        sink += v_;                                                                        \
        *(volatile T *)(p) = v_;                                                           \
    } while (0)

__attribute__((noinline)) static void touch(unsigned char *p, size_t size) {
    switch (size) {
    case 2: TOUCH(uint16_t, p); break;
    case 4: TOUCH(uint32_t, p); break;
    case 8: TOUCH(uint64_t, p); break;
    case 16: {
        __m128i v;
        __asm__ volatile("movdqu (%1), %0" : "=x"(v) : "r"(p) : "memory");
        __asm__ volatile("movdqu %0, (%1)" : : "x"(v), "r"(p) : "memory");
        break;
    }
    }
}

__attribute__((noinline, target("avx"))) static void touch32(unsigned char *p) {
    __m256i v;
    __asm__ volatile("vmovdqu (%1), %0" : "=x"(v) : "r"(p) : "memory");
    __asm__ volatile("vmovdqu %0, (%1)" : : "x"(v), "r"(p) : "memory");
}

int main(void) {
    static const size_t sizes[] = {2, 4, 8, 16};
    for (size_t n = 1; n <= 40; n++) {
        unsigned char *p = malloc(n);
        memset(p, 1, n);
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (size_t o = 0; o + sizes[s] <= n; o++)
                touch(p + o, sizes[s]);
        if (__builtin_cpu_supports("avx"))
            for (size_t o = 0; o + 32 <= n; o++)
                touch32(p + o);
        free(p);
    }
    /* One byte past the end, at offsets no alignment rule excuses. */
    unsigned char *q = malloc(23);
    memset(q, 1, 23);
    touch(q + 22, 2);
    touch(q + 21, 4);
    touch(q + 17, 8);
    touch(q + 8, 16);
    /* One byte before the start. */
    touch(q - 1, 4);
    free(q);
    return 0;
}
