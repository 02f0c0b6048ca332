/* malloc_usable_size on pointers the allocator did not hand out: Valgrind answers 0 (its
 * replacement knows its blocks); glibc's own would read a chunk header that is not there. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>

static char global[64];

int main(void) {
    char local[64];
    char *p = malloc(10);
    char *q = malloc(100);
    free(q);
    printf("live %zu\n", malloc_usable_size(p));
    printf("null %zu\n", malloc_usable_size(NULL));
    printf("interior %zu\n", malloc_usable_size(p + 1));
    printf("freed %zu\n", malloc_usable_size(q));
    printf("stack %zu\n", malloc_usable_size(local + 16));
    printf("global %zu\n", malloc_usable_size(global + 16));
    free(p);
    return 0;
}
