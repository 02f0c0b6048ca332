/* Calls to memcpy/memmove, memcmp, strlen, strchr, strchrnul and strncpy that their native
 * tries (oxgrind_engine::native_try) do or decline (and to memset, which has none), each
 * with what Memcheck then reports or does not: V bits copied with the bytes (undefined ones
 * too, overlapping or not), defined bytes copied into undefined memory, comparisons and
 * searches decided before or after an undefined byte, an undefined fill value, overruns of
 * a block, and last a copy from unmapped memory (the try faults and declines: the loop
 * reports it). */
#define _GNU_SOURCE /* strchrnul */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static void use(int c, const char *what) {
    if (c) puts(what);
}

int main(void) {
    char *u = malloc(16), *d = malloc(16);
    memcpy(d, u, 10);             /* undefined bytes copied: no error */
    use(d[3] == 'x', "a");        /* error: they are still undefined */
    memset(u, 'y', 16);
    memcpy(d, u, 10);
    use(d[3] == 'x', "b");        /* defined now */

    char *f = malloc(24);
    memcpy(f, "0123456789abcdefghij", 20);
    use(f[19] == 'j', "c");       /* copied: defined */
    use(f[21] == 'j', "d");       /* error: never written */

    char *o = malloc(32), *u2 = malloc(8);
    memset(o, 'z', 32);
    o[5] = u2[0];
    memmove(o + 3, o, 20);        /* overlapping, one undefined byte */
    use(o[8] == 'q', "e");        /* error: it moved here */
    use(o[5] == 'q', "f");        /* defined: o[2] moved here */
    memmove(o, o + 2, 20);        /* backwards overlap */
    use(o[6] == 'q', "g");        /* error */

    char *m1 = malloc(16), *m2 = malloc(16);
    memcpy(m1, "abcdefgh", 8);
    memcpy(m2, "abcdefgX", 8);
    use(memcmp(m1, m2, 16) < 0, "h");   /* decided in the first word: no error */
    m2[7] = 'h';
    use(memcmp(m1, m2, 16) == 0, "i");  /* error: the second word is undefined */
    use(memcmp(m1 + 1, m2 + 1, 10) == 0, "j"); /* error: byte 8 undefined */
    use(memcmp(m1 + 1, m2 + 1, 7) == 0, "k");  /* all defined and equal */

    char *small = malloc(10);
    memset(small, 1, 10);
    memcpy(d, small, 10);         /* up to the block's end, in its partial last granule */
    use(memcmp(small + 1, d + 1, 9) == 0, "n"); /* the same */
    memcpy(d, small, 12);         /* invalid reads past the block */
    use(memcmp(small, d, 12) == 0, "l"); /* invalid reads (equal up to there) */
    free(small);
    d[0] = 2;
    use(memcmp(small, d, 4) == 0, "m");  /* a read of a freed block (its first byte differs) */

    /* strlen, strchr, strchrnul, strncpy: done natively or declined (memset, which has no
     * try, fills the string and reports as Valgrind's) */
    char *s1 = malloc(13);
    memset(s1, 'a', 13);          /* up to the block's end: no error */
    s1[12] = 0;
    use(strlen(s1) == 3, "p");    /* 12, all defined: no error */
    use(strchr(s1, 'b') != NULL, "q");     /* not found: no error */
    use(*strchrnul(s1, 'b') == 'x', "r");  /* the terminator: no error */
    use(strchr(s1 + 1, 0) == s1, "s");     /* the terminator itself */
    char *un = malloc(8);
    s1[5] = un[0];                /* one undefined byte */
    use(strlen(s1) == 3, "t");    /* error inside strlen, then its result */
    use(strchr(s1, 'a') == s1 + 1, "u");   /* stops before it: no error */
    use(strchr(s1 + 3, 'z') != NULL, "v"); /* error: reaches it */
    use(*strchrnul(s1 + 4, 'z') == 0, "w"); /* error: reaches it */
    char *n1 = malloc(16);
    strncpy(n1, s1, 4);           /* no terminator within n: no error */
    use(n1[3] == 'b', "z1");      /* defined */
    strncpy(n1, "ab", 16);        /* zeros after it: no error */
    use(n1[15] == 'b', "z2");     /* defined */
    strncpy(n1, s1, 8);           /* error: reaches the undefined byte */
    use(n1[5] == 'b', "z3");      /* error: copied, undefined */
    free(n1);
    memset(s1, un[1], 4);         /* undefined fill value: stored undefined */
    use(s1[2] == 'a', "x");       /* error */
    memset(s1, 'c', 14);          /* invalid write past the block */
    s1[12] = 'c';
    use(strlen(s1) == 1, "y");    /* unterminated: invalid read past the block */
    free(s1);
    free(un);

    free(u);
    free(u2);
    free(o);
    free(f);
    free(m1);
    free(m2);
    char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(p, 4096);
    memcpy(d, p + 8, 8);          /* unmapped: invalid read, then SIGSEGV */
    puts("not reached");
    return 0;
}
