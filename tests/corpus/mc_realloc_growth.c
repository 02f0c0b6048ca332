/* A buffer grown by realloc from 16 bytes to 4 MiB (glibc maps the larger ones by
 * themselves), then freed. With a small --freelist-vol the old block of each realloc leaves
 * the freed-block queue at once: it must still be glibc's while the tool hears of the
 * realloc (it once was unmapped first, and the runtime faulted reading its chunk header). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    char *p = NULL;
    size_t n = 16;
    for (int i = 0; i < 19; i++) {
        p = realloc(p, n);
        memset(p, i, n);
        n *= 2;
    }
    printf("%zu %d\n", n / 2, p[n / 2 - 1]);
    free(p);
    return 0;
}
