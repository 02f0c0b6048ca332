// A program with its own malloc, calloc, realloc and free (a bump allocator over a static
// arena), as rustc links jemalloc into its executable. Memcheck replaces them: they never
// run from main on ("calls 0"), the overrun and the leak are reported as with glibc's.
// Linked with mc_early_malloc_lib.c, whose constructor allocates through them before main
// (and before a preloaded tool's constructor) and whose destructor frees at exit.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Alignas(16) unsigned char arena[1 << 20];
static size_t used;
static int calls;

// Each block is preceded by 16 bytes holding its size.
void *malloc(size_t n) {
    calls++;
    size_t need = 16 + ((n + 15) & ~(size_t)15);
    if (used + need > sizeof arena)
        return NULL;
    unsigned char *p = arena + used;
    used += need;
    *(size_t *)p = n;
    return p + 16;
}
void free(void *p) {
    calls++;
    (void)p; // a bump allocator never reuses
}
void *calloc(size_t n, size_t size) {
    void *p = malloc(n * size);
    if (p)
        memset(p, 0, n * size);
    return p;
}
void *realloc(void *p, size_t n) {
    void *q = malloc(n);
    if (p && q) {
        size_t old = *(size_t *)((unsigned char *)p - 16);
        memcpy(q, p, old < n ? old : n);
    }
    return q;
}

int early_sum(void);

int main(void) {
    calls = 0;
    int sum = early_sum();
    char *a = malloc(10);
    a[10] = 'x'; // one past the end
    free(a);
    char *leak = calloc(4, 8); // never freed
    leak[0] = 1;
    char *r = realloc(NULL, 5);
    r = realloc(r, 50);
    free(r);
    printf("sum %d calls %d\n", sum, calls);
    return 0;
}
