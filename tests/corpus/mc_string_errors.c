/* One bad use of each replaced string or memory function, on heap blocks: each error is
 * reported inside the function, with the access Valgrind's replacement makes, and the
 * block it concerns. Compiled with -fno-builtin so every call is a real call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

static char *unterminated(size_t n) {
    char *p = malloc(n);
    memset(p, 'a', n);
    return p;
}

int main(void) {
    size_t sum = 0;
    char *u = unterminated(8);
    sum += strlen(u);                   /* reads 1 byte after the block */
    char *small = malloc(4);
    memset(small, 0, 5);                /* writes 1 byte after */
    char *src = unterminated(16);
    src[15] = 0;
    char *dst = malloc(8);
    strcpy(dst, src);                   /* writes 8 bytes after */
    char *freed = malloc(16);
    strcpy(freed, "hello");
    free(freed);
    sum += strncmp(freed, "hello", 6);  /* reads a freed block */
    char *c = unterminated(10);
    sum += memchr(c, 'z', 12) == NULL;  /* reads 2 bytes after */
    char *m = malloc(10);
    memcpy(m, c, 12);                   /* reads and writes 2 bytes after */
    sum += strchr(u, 'z') == NULL;      /* reads after */
    sum += strnlen(c, 11);              /* reads 1 byte after */
    wchar_t *w = malloc(3 * sizeof(wchar_t));
    w[0] = w[1] = w[2] = L'w';
    sum += wcslen(w);                   /* reads 4 bytes after */
    printf("%zu\n", sum);
    free(u);
    free(small);
    free(src);
    free(dst);
    free(c);
    free(m);
    free(w);
    return 0;
}
