/* V bits around Memcheck's client requests that make memory unaddressable or hand out
 * custom blocks. Memcheck's no-access state holds no V bits: a load of a no-access byte
 * is one invalid read and gives a defined value (mc_main.c's get_vbits8), whatever the
 * bytes' V bits were (here: undefined, from malloc). A custom block is undefined when
 * allocated, zeroed ones defined (MC_(new_block)), whatever its memory's V bits were
 * (here: defined, from calloc). Each case loads a byte and branches on it, or compares
 * it in memory. 6 errors, as Valgrind: 4 invalid reads, 2 uninitialised values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <valgrind/memcheck.h>
static void *__attribute__((noinline)) launder(void *p) { __asm__ volatile("" : "+r"(p)); return p; }
int hits;
int main(void) {
    unsigned char *p = launder(malloc(64)); /* undefined, then no-access */
    VALGRIND_MAKE_MEM_NOACCESS(p + 32, 32);
    int x = ((volatile unsigned char *)p)[40];
    if (x == 3) hits++;
    __asm__ volatile("cmpb $7, %0\n\tjne 1f\n\tincl %1\n1:\n" : "+m"(*(volatile unsigned char *)(p + 41)), "+m"(hits) : : "cc");
    unsigned char *pool = launder(calloc(1, 4096)); /* defined */
    VALGRIND_CREATE_MEMPOOL(pool, 0, 0);
    VALGRIND_MAKE_MEM_NOACCESS(pool, 4096);
    VALGRIND_MEMPOOL_ALLOC(pool, pool + 64, 32);
    int u = ((volatile unsigned char *)pool)[66]; /* uninitialised chunk byte */
    if (u == 3) hits++;
    VALGRIND_MEMPOOL_FREE(pool, pool + 64);
    int y = ((volatile unsigned char *)pool)[70];
    if (y == 3) hits++;
    VALGRIND_MALLOCLIKE_BLOCK(pool + 256, 32, 0, 0);
    int v = ((volatile unsigned char *)pool)[257]; /* uninitialised custom block */
    if (v == 3) hits++;
    VALGRIND_MALLOCLIKE_BLOCK(pool + 512, 32, 0, 1);
    int w = ((volatile unsigned char *)pool)[513]; /* zeroed custom block */
    if (w == 3) hits++;
    VALGRIND_FREELIKE_BLOCK(pool + 256, 0);
    int z = ((volatile unsigned char *)pool)[260];
    if (z == 3) hits++;
    printf("%d\n", hits);
    VALGRIND_FREELIKE_BLOCK(pool + 512, 0);
    VALGRIND_DESTROY_MEMPOOL(pool);
    free(pool);
    free(p);
    return 0;
}
