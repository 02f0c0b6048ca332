/* DHAT differential test for the accesses counted inline in a thread's hot ranges (blocks
   without a histogram, over 1024 bytes): loops that alternate between two and three large
   blocks (so ranges are replaced), a large block grown by realloc while in use, freed and
   allocated again at the same address and size, read-modify-writes, accesses that start
   inside a block and run past its end or start just before it, and the sizes on either side
   of the histogram limit. Explicit loops only, so bytes read and written are exact. */
#include <stdint.h>
#include <stdlib.h>

static void fill(volatile unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++) p[i] = v;
}

static unsigned sum64(volatile uint64_t *p, size_t n) {
    unsigned s = 0;
    for (size_t i = 0; i < n; i++) s += (unsigned)p[i];
    return s;
}

int main(void) {
    unsigned s = 0;
    /* Two blocks in one loop: read one, write the other, many times. */
    volatile uint64_t *a = malloc(8192);
    volatile uint64_t *b = malloc(8192);
    for (int i = 0; i < 1024; i++) a[i] = (uint64_t)i;
    for (int round = 0; round < 50; round++)
        for (int i = 1; i < 1023; i++) b[i] = a[i - 1] + a[i + 1];
    /* A third block in the same loop: three blocks for two ranges. */
    volatile uint64_t *c = malloc(16384);
    for (int round = 0; round < 20; round++)
        for (int i = 0; i < 1024; i++) c[i] = a[i] + b[i];
    s += sum64(c, 2048);
    /* Read-modify-write in a large block. */
    for (int round = 0; round < 10; round++)
        for (int i = 0; i < 1024; i++) __asm__ volatile("addq $1, (%0)" : : "r"(&a[i]) : "memory");
    /* An 8-byte read whose first byte is the block's last: charged to it. */
    unsigned char *edge = malloc(3000);
    fill(edge, 3000, 5);
    s += (unsigned)*(volatile uint64_t *)(edge + 2999 - 0) & 0xFF;
    /* Grown by realloc while in use, then used again. */
    volatile unsigned char *g = malloc(2048);
    fill(g, 2048, 1);
    g = realloc((void *)g, 40000);
    fill(g, 40000, 2);
    s += sum64((volatile uint64_t *)g, 5000);
    /* Freed and allocated again (likely at the same address, with the same size). */
    free((void *)b);
    b = malloc(8192);
    for (int i = 0; i < 1024; i++) b[i] = (uint64_t)i;
    s += sum64(b, 1024);
    /* Either side of the histogram limit. */
    unsigned char *h1024 = malloc(1024);
    unsigned char *h1025 = malloc(1025);
    for (int round = 0; round < 3; round++) {
        fill(h1024, 1024, 7);
        fill(h1025, 1025, 7);
    }
    free(h1024);
    free(h1025);
    /* A small block without a histogram (reallocated), used and freed, then one of its size
       made in its place (glibc hands the same chunk back): never a hot range, so none of
       the new block's accesses may be lost. */
    volatile unsigned char *sr = malloc(100);
    sr = realloc((void *)sr, 200);
    fill(sr, 200, 3);
    free((void *)sr);
    volatile unsigned char *again = malloc(200);
    fill(again, 200, 4);
    free((void *)again);
    free((void *)a);
    free((void *)c);
    free(edge);
    free((void *)g);
    /* b stays live to the end: its counts are taken at exit. */
    return s == 12345 ? 1 : 0; /* keeps s alive; never 12345 */
}
