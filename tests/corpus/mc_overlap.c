/* Overlapping source and destination in each copying string function Memcheck checks,
 * next to a non-overlapping (adjacent or distinct) call of each that must not be reported.
 * Every overlapping call copies from higher to lower addresses, or stops within a few bytes,
 * so it terminates both under glibc and under Valgrind's byte-by-byte replacements.
 * Built with -fno-builtin so each call reaches the library. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <wchar.h>

extern void *__memcpy_chk(void *dst, const void *src, size_t len, size_t dstlen);
extern char *__strncpy_chk(char *dst, const char *src, size_t n, size_t dstlen);
extern char *__stpncpy_chk(char *dst, const char *src, size_t n, size_t dstlen);

static char buf[128];
static wchar_t wide[32];

static void reset(const char *text) {
    memset(buf, 0, sizeof buf);
    for (size_t i = 0; text[i]; i++) buf[i] = text[i];
}

static void show(const char *what) {
    printf("%-9s", what);
    for (int i = 0; i < 24; i++) putchar(buf[i] ? buf[i] : '.');
    putchar('\n');
}

int main(void) {
    char other[64];

    /* strcpy: src 2 bytes above dst. */
    reset("abcdefgh");
    strcpy(buf, buf + 2);
    show("strcpy");
    reset("abcdefgh");
    strcpy(buf + 9, buf); /* dst right after src's NUL: adjacent, no overlap */
    show("strcpy");

    /* strncpy: n bytes of dst all count; the report names dst and src after the copy. */
    reset("abcdefghijkl");
    strncpy(buf, buf + 3, 5);
    show("strncpy");
    reset("abc");
    strncpy(buf + 1, buf + 4, 6); /* src is empty: 1 byte of src, 6 of dst */
    show("strncpy");
    reset("abcdef");
    strncpy(other, buf, 10);
    printf("%s\n", other);

    /* strcat: the appended bytes run into the source string. */
    reset("ab");
    strcpy(buf + 3, "xyz");
    strcat(buf, buf + 3);
    show("strcat");
    reset("ab");
    strcpy(buf + 10, "xyz");
    strcat(buf, buf + 10);
    show("strcat");

    /* strncat: only the n copied bytes of src count, not its NUL. */
    reset("ab");
    strcpy(buf + 3, "xyz");
    strncat(buf, buf + 3, 2);
    show("strncat");
    reset("ab");
    strcpy(buf + 5, "xyz");
    strncat(buf, buf + 5, 2); /* dst ends at buf+4 (its new NUL): adjacent to src */
    show("strncat");

    /* stpcpy */
    reset("abcdefgh");
    printf("%td\n", stpcpy(buf, buf + 1) - buf);
    show("stpcpy");
    reset("abcdefgh");
    printf("%td\n", stpcpy(buf + 20, buf) - buf);
    show("stpcpy");

    /* stpncpy */
    reset("abcdefghijkl");
    printf("%td\n", stpncpy(buf, buf + 4, 6) - buf);
    show("stpncpy");
    reset("abcdefghijkl");
    printf("%td\n", stpncpy(buf + 12, buf, 8) - buf);
    show("stpncpy");

    /* mempcpy: memmove semantics, the length is printed. */
    reset("abcdefghijkl");
    printf("%td\n", (char *)mempcpy(buf + 2, buf, 8) - buf);
    show("mempcpy");
    reset("abcdefghijkl");
    printf("%td\n", (char *)mempcpy(buf + 8, buf, 8) - buf);
    show("mempcpy");

    /* __memcpy_chk (what -D_FORTIFY_SOURCE makes of memcpy): reported as memcpy_chk. */
    reset("abcdefghijkl");
    __memcpy_chk(buf + 3, buf, 7, sizeof buf - 3);
    show("memcpy_chk");
    reset("abcdefghijkl");
    __memcpy_chk(buf + 12, buf, 7, sizeof buf - 12);
    show("memcpy_chk");

    /* What -D_FORTIFY_SOURCE makes of strncpy and stpncpy when it cannot check at compile
     * time: glibc checks the size and tail-calls strncpy/stpncpy, reported as such. */
    reset("abcdefghijkl");
    __strncpy_chk(buf, buf + 3, 5, sizeof buf);
    show("strncpy_chk");
    reset("abcdefghijkl");
    __strncpy_chk(buf + 13, buf, 5, sizeof buf - 13);
    show("strncpy_chk");
    reset("abcdefghijkl");
    printf("%td\n", __stpncpy_chk(buf, buf + 2, 4, sizeof buf) - buf);
    show("stpncpy_chk");
    reset("abcdefghijkl");
    printf("%td\n", __stpncpy_chk(buf + 16, buf + 2, 4, sizeof buf - 16) - buf);
    show("stpncpy_chk");

    /* wcscpy: lengths in bytes, the terminating wide character included. */
    for (int i = 0; i < 8; i++) wide[i] = L'a' + i;
    wide[8] = 0;
    wcscpy(wide, wide + 3);
    printf("wcscpy   %ls\n", wide);
    wcscpy(wide + 9, wide); /* adjacent: dst starts right after src's terminator */
    printf("wcscpy   %ls\n", wide + 9);

    /* Not reported on amd64 by Valgrind 3.19: memcpy (glibc's is memmove there) and
     * memccpy (not replaced). */
    reset("abcdefghijkl");
    memcpy(buf + 2, buf, 8);
    show("memcpy");
    reset("abcdefghijkl");
    memccpy(buf, buf + 2, 'k', 10);
    show("memccpy");
    return 0;
}
