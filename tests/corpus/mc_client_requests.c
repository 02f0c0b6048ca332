/* Memcheck's client requests (valgrind/memcheck.h; no-ops natively): memory made
 * unaddressable is checked as a redzone is, made addressable again is fine, and a check
 * request reports the first unaddressable byte and returns its address. */
#include <stdio.h>
#include <stdlib.h>
#include <valgrind/memcheck.h>

static char pool[64];

/* A pool allocator announcing its blocks, with 8-byte redzones. */
static char *arena;
static size_t used;

static void *pool_alloc(size_t n) {
    char *p = arena + used + 8;
    used += n + 16;
    VALGRIND_MALLOCLIKE_BLOCK(p, n, 8, 0);
    return p;
}

static void pool_free(void *p) {
    VALGRIND_FREELIKE_BLOCK(p, 8);
}

int main(void) {
    char *volatile p = malloc(16);
    VALGRIND_MAKE_MEM_NOACCESS(p + 8, 8);
    p[10] = 1;                          /* invalid write of size 1 */
    char c = p[12];                     /* invalid read of size 1 */
    VALGRIND_MAKE_MEM_DEFINED(p + 8, 8);
    p[10] = c;                          /* fine again */
    unsigned long bad = VALGRIND_CHECK_MEM_IS_ADDRESSABLE(p, 20);
    char *volatile q = pool;
    VALGRIND_MAKE_MEM_NOACCESS(pool + 32, 32);
    q[40] = 2;                          /* invalid write inside a global */
    VALGRIND_MAKE_MEM_UNDEFINED(pool + 32, 32);
    q[40] = 3;
    unsigned long fine = VALGRIND_CHECK_MEM_IS_ADDRESSABLE(pool, 64);
    arena = malloc(1024);
    VALGRIND_MAKE_MEM_NOACCESS(arena, 1024);
    char *volatile a = pool_alloc(24);
    char *volatile b = pool_alloc(40);
    a[0] = 1;
    a[24] = 1;                          /* invalid write: 0 bytes after a block of size 24 */
    pool_free(b);
    b[3] = 1;                           /* invalid write: inside a freed block */
    pool_free(b);                       /* invalid free */
    a = pool_alloc(8);                  /* the first block of 24 leaks */
    printf("%d %lu %u %u\n", bad == (unsigned long)(p + 16), fine, VALGRIND_COUNT_ERRORS,
           RUNNING_ON_VALGRIND);
    free(p);
    return 0;
}
