/* Heap accesses, good and bad, for memcheck's Invalid read / Invalid write reports
   (crates/oxgrind/tests/memcheck_access.rs compares them with Valgrind's). */
#include <emmintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile char sink_c;
static volatile int sink_i;
static volatile long sink_l;

/* Reads of 1, 2, 4 and 8 bytes just past the end of a 40-byte block, then 1..8 bytes past. */
static void overrun_reads(void) {
    char *p = malloc(40);
    memset(p, 0, 40);
    sink_c = p[40];
    sink_i = *(int *)(p + 40);
    sink_l = *(long *)(p + 40);
    for (int k = 1; k <= 8; k++)
        sink_c = p[39 + k];
    free(p);
}

static void overrun_writes(void) {
    char *p = malloc(13);
    p[13] = 1;
    *(short *)(p + 14) = 2;
    *(int *)(p + 16) = 3;
    *(long *)(p + 20) = 4;
    free(p);
}

static void underrun(void) {
    int *p = malloc(10 * sizeof(int));
    sink_i = p[-1];
    /* Into the chunk's prev_size field: a write over glibc's size field (p[-1], p[-2])
       corrupts its heap for real under oxgrind, as it does natively. */
    p[-3] = 7;
    free(p);
}

static void use_after_free(void) {
    long *p = malloc(40);
    p[0] = 1;
    free(p);
    sink_l = p[1];
    p[2] = 5;
}

static void realloced_away(void) {
    char *p = malloc(16);
    memset(p, 'a', 16);
    char *q = realloc(p, 64);
    sink_c = p[3];
    free(q);
}

/* An unaligned 8-byte read that starts inside the block and ends past it. */
static void partly_in_bounds(void) {
    char *p = malloc(40);
    memset(p, 0, 40);
    sink_l = *(long *)(p + 36);
    free(p);
}

/* A read-modify-write of freed memory: Memcheck checks the read, then the write, and
   counts both in one context. */
static void modify_freed(void) {
    int *p = malloc(40);
    free(p);
    __asm__ volatile("incl (%0)" : : "r"(p + 2) : "memory");
}

/* 16-byte loads and stores over the end of a block, and an aligned 8-byte load that is
   partly in bounds (not an error with --partial-loads-ok=yes, Valgrind's default). */
static void vectors(void) {
    char *p = malloc(13);
    memset(p, 0, 13);
    __m128i v = _mm_loadu_si128((__m128i *)(p + 8));
    _mm_storeu_si128((__m128i *)(p + 8), v);
    sink_l = *(volatile long *)(p + 8);
    free(p);
}

/* Correct uses of glibc's string functions on heap buffers: never an error. */
static void correct_strings(void) {
    for (int n = 1; n < 70; n++) {
        char *s = malloc(n);
        memset(s, 'x', n - 1);
        s[n - 1] = 0;
        char *d = malloc(n);
        strcpy(d, s);
        memcpy(d, s, n);
        sink_i = strlen(d) + (strchr(d, 'y') != NULL) + (memchr(d, 0, n) != NULL);
        sink_i += strcmp(d, s) + memcmp(d, s, n) + (int)strnlen(d, n);
        char *e = strdup(d);
        sink_i += strlen(e);
        free(e);
        free(d);
        free(s);
    }
}

int main(void) {
    correct_strings();
    overrun_reads();
    overrun_writes();
    underrun();
    use_after_free();
    realloced_away();
    partly_in_bounds();
    modify_freed();
    vectors();
    printf("done\n");
    return 0;
}
