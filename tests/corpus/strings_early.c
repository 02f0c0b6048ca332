/* Copying string functions called before any library is initialised (from the executable's
 * .preinit_array, which runs before every shared library's constructor, oxgrind's
 * included): the runtime's replacements must already copy correctly. main prints what the
 * early calls produced. Built with -fno-builtin so each call reaches the library. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <wchar.h>

extern void *__memcpy_chk(void *dst, const void *src, size_t len, size_t dstlen);
extern char *__strncpy_chk(char *dst, const char *src, size_t n, size_t dstlen);
extern char *__stpncpy_chk(char *dst, const char *src, size_t n, size_t dstlen);

static char out[12][32];
static wchar_t wout[16];
static long ends[4];

static void early(int argc, char **argv, char **envp) {
    (void)argc;
    (void)argv;
    (void)envp;
    const char *src = "early bird";
    strcpy(out[0], src);
    strncpy(out[1], src, 5);
    strcpy(out[2], "the ");
    strcat(out[2], src);
    strcpy(out[3], "an ");
    strncat(out[3], src, 3);
    ends[0] = stpcpy(out[4], src) - out[4];
    ends[1] = stpncpy(out[5], src, 20) - out[5];
    ends[2] = (char *)mempcpy(out[6], src, 4) - out[6];
    ends[3] = (char *)memccpy(out[7], src, 'b', 10) - out[7];
    __memcpy_chk(out[8], src, 6, sizeof out[8]);
    __strncpy_chk(out[9], src, 7, sizeof out[9]);
    __stpncpy_chk(out[10], src, 8, sizeof out[10]);
    wcscpy(wout, L"wide early");
}

__attribute__((section(".preinit_array"), used)) static void (*const preinit)(int, char **,
                                                                             char **) = early;

int main(void) {
    for (int i = 0; i < 11; i++) printf("%d [%s]\n", i, out[i]);
    printf("ends %ld %ld %ld %ld\n", ends[0], ends[1], ends[2], ends[3]);
    printf("[%ls]\n", wout);
    return 0;
}
