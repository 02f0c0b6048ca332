/* DHAT differential test: every heap event DHAT distinguishes, with accesses made by
   explicit loops (no libc string functions, whose implementations differ between a
   native run and Valgrind's replacements), so bytes read and written are exact. */
#include <stdint.h>
#include <stdlib.h>

static void fill(volatile unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++) p[i] = v;
}

static unsigned sum(volatile unsigned char *p, size_t n) {
    unsigned s = 0;
    for (size_t i = 0; i < n; i++) s += p[i];
    return s;
}

static void *keep[8];

int main(void) {
    unsigned s = 0;
    /* One small block: written once byte by byte, each half read a different number of
       times, with 8-byte reads for the first half. */
    unsigned char *a = malloc(16);
    fill(a, 16, 1);
    for (int k = 0; k < 4; k++) s += (unsigned)*(volatile uint64_t *)a;
    s += sum(a + 8, 8);
    /* A big block (no histogram), half written. */
    unsigned char *big = malloc(5000);
    fill(big, 2500, 2);
    /* calloc: zeroed by the allocator, which is not a program write. */
    int *c = calloc(10, sizeof(int));
    c[3] = 7;
    free(a);
    /* Grown then shrunk by realloc: the copies count, the histogram is dropped. */
    unsigned char *r = malloc(100);
    fill(r, 16, 3);
    r = realloc(r, 200);
    s += sum(r, 50);
    r = realloc(r, 40);
    /* The same site many times, same size: one PP with several blocks and a histogram. */
    for (int i = 0; i < 8; i++) {
        keep[i] = malloc(24);
        fill(keep[i], (size_t)(i + 1), (unsigned char)i);
    }
    for (int i = 0; i < 8; i += 2) free(keep[i]);
    /* One site, two sizes: no histogram. */
    for (int i = 0; i < 2; i++) {
        void *m = malloc(32 + (size_t)i * 8);
        fill(m, 4, 9);
        free(m);
    }
    /* Zero bytes is one byte to DHAT. */
    void *z = malloc(0);
    free(big);
    free(c);
    free(r);
    /* After the peak: Valgrind 3.19 gives this PP no maximum. */
    unsigned char *late = malloc(7);
    late[0] = (unsigned char)s;
    free(z);
    /* Read-modify-write: one read and one write of 4 bytes. */
    int *m = malloc(sizeof(int));
    *m = 1;
    __asm__ volatile("addl $1, (%0)" : : "r"(m) : "memory");
    return 0;
}
