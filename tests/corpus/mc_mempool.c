/* A custom pool allocator annotated for Memcheck (the MEMPOOL client requests), the leak
 * check requests, and the core's PRINTF and STACK requests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <valgrind/memcheck.h>
#include <valgrind/valgrind.h>

struct pool {
  char *base;
  size_t used;
};

static struct pool *pool_new(void) {
  struct pool *p = malloc(sizeof *p);
  p->base = malloc(4096);
  p->used = 0;
  VALGRIND_MAKE_MEM_NOACCESS(p->base, 4096);
  VALGRIND_CREATE_MEMPOOL(p, 8, 0);
  return p;
}

static void *pool_alloc(struct pool *p, size_t n) {
  char *r = p->base + p->used + 8;
  p->used += n + 16;
  VALGRIND_MEMPOOL_ALLOC(p, r, n);
  return r;
}

int main(int argc, char **argv) {
  const char *c = argc > 1 ? argv[1] : "pool";
  struct pool *p = pool_new();
  if (!strcmp(c, "pool")) {
    char *a = pool_alloc(p, 16);
    char *b = pool_alloc(p, 32);
    a[16] = 1;                      /* just past a chunk */
    VALGRIND_MEMPOOL_FREE(p, b);
    b[0] = 2;                       /* freed chunk */
    VALGRIND_MEMPOOL_FREE(p, a + 1); /* not a chunk */
    printf("exists %d %d\n", VALGRIND_MEMPOOL_EXISTS(p), VALGRIND_MEMPOOL_EXISTS(a));
    VALGRIND_MEMPOOL_FREE((void *)8, a); /* no such pool */
    VALGRIND_DESTROY_MEMPOOL(p);
    a[0] = 3;                       /* after the pool is gone */
  } else if (!strcmp(c, "trim")) {
    char *a = pool_alloc(p, 16);
    char *b = pool_alloc(p, 16);
    char *d = pool_alloc(p, 16);
    VALGRIND_MEMPOOL_TRIM(p, b, 16); /* keeps b only */
    a[0] = 1;
    b[0] = 1;
    d[0] = 1;
    VALGRIND_MEMPOOL_CHANGE(p, b, b, 8);
    b[8] = 1;
    struct pool *q = malloc(sizeof *q);
    VALGRIND_MOVE_MEMPOOL(p, q);
    printf("exists %d %d\n", VALGRIND_MEMPOOL_EXISTS(p), VALGRIND_MEMPOOL_EXISTS(q));
    VALGRIND_DESTROY_MEMPOOL(q);
    free(q);
  } else if (!strcmp(c, "leaks")) {
    char *a = malloc(10);
    a = 0;
    VALGRIND_DO_LEAK_CHECK;
    char *b = malloc(20);
    b = 0;
    VALGRIND_DO_ADDED_LEAK_CHECK;
    VALGRIND_DO_CHANGED_LEAK_CHECK;
    VALGRIND_DO_QUICK_LEAK_CHECK;
    unsigned long l, d, r, s;
    VALGRIND_COUNT_LEAKS(l, d, r, s);
    printf("leaked %lu dubious %lu reachable %lu suppressed %lu\n", l, d, r, s);
    VALGRIND_COUNT_LEAK_BLOCKS(l, d, r, s);
    printf("blocks %lu %lu %lu %lu\n", l, d, r, s);
  }
  return 0;
}
