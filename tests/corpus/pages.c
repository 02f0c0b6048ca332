/* Page-level memory for --pages-as-heap=yes: an explicit mmap, a large malloc that glibc
 * serves with its own internal mmap, an mremap that grows a mapping, and sbrk. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

char *volatile keep;

__attribute__((noinline)) void *map_64m(void) {
    void *p = mmap(0, 64 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(p, 1, 4096);
    return p;
}

__attribute__((noinline)) char *malloc_10m(void) { char *p = malloc(10 << 20); p[0] = 1; return p; }

int main(void) {
    void *m = map_64m();
    keep = malloc_10m();
    void *g = mremap(m, 64 << 20, 80 << 20, MREMAP_MAYMOVE);
    void *b = sbrk(1 << 20);
    if (g == MAP_FAILED || b == (void *)-1) return 1;
    munmap(g, 80 << 20);
    free(keep);
    puts("pages done");
    return 0;
}
