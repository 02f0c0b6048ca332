/* DHAT: heap blocks used through libc's string functions. Valgrind's DHAT replaces
   them with byte and word loops; natively they are glibc's vector code, which touches
   whole vectors (overlapping stores, reads past the terminator): bytes read and
   written agree only within a tolerance. Block counts and sizes agree exactly. */
#include <stdlib.h>
#include <string.h>

int main(void) {
    char *src = malloc(1000);
    memset(src, 'x', 999);
    src[999] = 0;
    char *dst = malloc(1000);
    memcpy(dst, src, 1000);
    size_t n = strlen(dst);
    char *copy = malloc(n + 1);
    strcpy(copy, dst);
    int same = memcmp(copy, src, n) == 0;
    free(src);
    free(dst);
    free(copy);
    return same ? 0 : 1;
}
