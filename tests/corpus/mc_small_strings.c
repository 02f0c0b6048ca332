/* Correct string and memory work on heap blocks of every small size: glibc's vector code
 * (AVX-512 masked stores, AVX2 and SSE2 over-reads) must not be reported. Issue 10:
 * `p = malloc(8); memset(p, 0, 8);` alone gave two invalid writes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

int main(void) {
    unsigned long sum = 0;
    for (size_t n = 1; n <= 200; n++) {
        char *a = malloc(n), *b = malloc(n);
        memset(a, 'x', n);
        a[n - 1] = 0;
        memcpy(b, a, n);
        memmove(b + (n > 1), b, n - (n > 1));
        b[n - 1] = 0;
        strcpy(b, a);
        sum += strlen(a) + strnlen(b, n) + (strcmp(a, b) == 0) + (memcmp(a, b, n) == 0);
        sum += (strchr(a, 'y') == NULL) + (memchr(a, 'y', n) == NULL) + (strrchr(b, 'x') != NULL);
        sum += strspn(a, "x") + strcspn(a, "y") + (strstr(a, "xy") == NULL);
        char *d = strdup(a);
        sum += strlen(d) + (strncmp(d, a, n) == 0);
        char *c = calloc(1, n + 8);
        strncpy(c, a, n);
        strcat(c, "");
        sum += strlen(c);
        wchar_t *w = malloc(n * sizeof(wchar_t));
        wmemset(w, L'w', n);
        w[n - 1] = 0;
        sum += wcslen(w);
        free(w);
        free(c);
        free(d);
        free(a);
        free(b);
    }
    printf("%lu\n", sum);
    return 0;
}
