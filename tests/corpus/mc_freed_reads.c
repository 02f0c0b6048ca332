/* Reads of freed memory and the V bits they give: Memcheck reports each as an invalid read
 * and takes the value as defined (mc_main.c's get_vbits8 of a no-access byte), so a branch
 * on it, or a write() of it, is no uninitialised-value error. Every case below is one
 * invalid access and nothing more, whatever the freed bytes' V bits were before the free:
 * never written (undefined), written with defined values, written with an undefined one,
 * written after the free (an invalid write, then a read), and a block realloc moved away.
 * Reads go through volatile pointers so that -O0 and -O2 make the same single access, and
 * each case branches on what it read (a load into a register, then a compare; and a
 * compare against memory). 8 errors, as Valgrind. */
#include <emmintrin.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int hits;

/* Keeps the compiler from folding the freed pointer away. */
static void *__attribute__((noinline)) launder(void *p) {
    __asm__ volatile("" : "+r"(p));
    return p;
}

int main(void) {
    /* 1: never written, freed, a byte loaded and branched on */
    unsigned char *a = launder(malloc(64));
    free(a);
    int x = ((volatile unsigned char *)a)[3];
    if (x == 42)
        hits++;

    /* 2: written with defined values, freed, a qword loaded and branched on */
    long *b = launder(malloc(64));
    for (int i = 0; i < 8; i++)
        b[i] = i;
    free(b);
    long y = ((volatile long *)b)[2];
    if (y > 1)
        hits++;

    /* 3: a byte written with an undefined value, freed, compared in memory */
    unsigned char *c = launder(malloc(32));
    unsigned char *u = launder(malloc(4)); /* undefined */
    c[5] = u[0];
    free(c);
    __asm__ volatile("cmpb $7, %0\n\tjne 1f\n\tincl %1\n1:\n"
                     : "+m"(*(volatile unsigned char *)(c + 5)), "+m"(hits)
                     :
                     : "cc");

    /* 4: never written, freed, 16 bytes loaded into a vector, a mask branched on */
    unsigned char *d = launder(malloc(48));
    free(d);
    __m128i v = _mm_loadu_si128((__m128i *)launder(d + 16));
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_setzero_si128())) == 0xffff)
        hits++;

    /* 5: written after the free (an invalid write), then read and branched on */
    int *e = launder(malloc(40));
    free(e);
    int z = u[1]; /* undefined value, stored into freed memory */
    ((volatile int *)e)[4] = z;
    int w = ((volatile int *)e)[4];
    if (w == 3)
        hits++;

    /* 6: realloc moved the block away: its old bytes are freed */
    char *f = launder(malloc(8));
    char *g = launder(realloc(f, 4096));
    long old = ((volatile long *)f)[0];
    if (old == 9)
        hits++;

    /* 7: a write() of a freed, never written buffer: one Syscall param error */
    char *h = launder(malloc(24));
    free(h);
    int fd = open("/dev/null", O_WRONLY);
    write(fd, h, 24);
    close(fd);

    printf("%d\n", hits);
    free(u);
    free(g);
    return 0;
}
