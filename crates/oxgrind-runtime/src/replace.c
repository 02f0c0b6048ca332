/* Checked string and memory functions: what runs, under the translation engine, in place of
 * glibc's and the dynamic loader's (Valgrind's function replacement, vg_replace_strmem.c).
 *
 * glibc's versions are vector code that reads whole aligned vectors past the end of a string
 * (never across a page); a tool checking every access would call that an error, and a tool
 * that lets it pass misses the program's real overruns in them. These are byte and word
 * loops making the same accesses as Valgrind's replacements, so an overrun is reported
 * exactly where and with the size Valgrind reports it.
 *
 * replace.rs redirects every entry point of these functions in libc.so.6 and ld.so (the
 * exported names and every IFUNC variant: __strlen_avx2, __memmove_evex_unaligned_erms, ...)
 * here. Unlike the rest of our library, this section ("oxgrind_replace") is instrumented as
 * the program's code is: the functions run on the program's behalf and their accesses are
 * the program's. So nothing here may call into the rest of the runtime except to report an
 * overlap (oxgrind_strings_overlap, strings.rs), and nothing may take a lock.
 *
 * Compiled with -fno-builtin, -fno-tree-loop-distribute-patterns (no loop becomes a call to
 * itself), and no vectorisation or store merging: the accesses must be the ones written. */
#include <stddef.h>
#include <stdint.h>

#define REPLACE __attribute__((section("oxgrind_replace"), used, noinline, visibility("hidden")))

/* Indices of strings.rs's FNS, for overlap reports (the names Valgrind gives). */
enum { F_STRCPY, F_STRNCPY, F_STRCAT, F_STRNCAT, F_STPCPY, F_STPNCPY, F_MEMPCPY, F_MEMCPY_CHK,
       F_MEMCCPY, F_WCSCPY };

extern void oxgrind_strings_overlap(int which, const void *dst, const void *src, size_t len);
extern void __chk_fail(void) __attribute__((noreturn));

typedef unsigned char u8;
typedef uint64_t word;

/* Valgrind's is_overlap: [dst, dst+dstlen) and [src, src+srclen) share a byte. Inlined into
 * each function, so it lives in the replacement section too. */
static inline __attribute__((always_inline)) int overlaps(const void *dst, const void *src,
                                                          size_t dstlen, size_t srclen) {
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (dstlen == 0 || srclen == 0) return 0;
    if (s < d) return !(s + srclen - 1 < d);
    if (d < s) return !(d + dstlen - 1 < s);
    return 1;
}

/* ---- lengths and searches: one byte at a time ---- */

/* strchr and strrchr are named index and rindex, as Valgrind's reports name them (its
 * replacement is found through glibc's alias). */

REPLACE size_t oxgrind_replace_strlen(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

REPLACE size_t oxgrind_replace_strnlen(const char *s, size_t max) {
    size_t n = 0;
    while (n < max && s[n]) n++;
    return n;
}

REPLACE char *oxgrind_replace_index(const char *s, int c) {
    char ch = (char)c;
    for (;; s++) {
        if (*s == ch) return (char *)s;
        if (*s == 0) return NULL;
    }
}

REPLACE char *oxgrind_replace_strchrnul(const char *s, int c) {
    char ch = (char)c;
    while (*s && *s != ch) s++;
    return (char *)s;
}

REPLACE char *oxgrind_replace_rindex(const char *s, int c) {
    char ch = (char)c;
    const char *last = NULL;
    for (;; s++) {
        if (*s == ch) last = s;
        if (*s == 0) return (char *)last;
    }
}

REPLACE void *oxgrind_replace_memchr(const void *s, int c, size_t n) {
    const u8 *p = s;
    for (size_t i = 0; i < n; i++)
        if (p[i] == (u8)c) return (void *)(p + i);
    return NULL;
}

REPLACE void *oxgrind_replace_rawmemchr(const void *s, int c) {
    const u8 *p = s;
    while (*p != (u8)c) p++;
    return (void *)p;
}

REPLACE void *oxgrind_replace_memrchr(const void *s, int c, size_t n) {
    const u8 *p = s;
    while (n-- > 0)
        if (p[n] == (u8)c) return (void *)(p + n);
    return NULL;
}

REPLACE int oxgrind_replace_strcmp(const char *a, const char *b) {
    for (;; a++, b++) {
        u8 x = (u8)*a, y = (u8)*b;
        if (x < y) return -1;
        if (x > y) return 1;
        if (x == 0) return 0;
    }
}

REPLACE int oxgrind_replace_strncmp(const char *a, const char *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        u8 x = (u8)a[i], y = (u8)b[i];
        if (x < y) return -1;
        if (x > y) return 1;
        if (x == 0) return 0;
    }
    return 0;
}

/* Word-wise over an aligned equal prefix, then bytes: Valgrind's memcmp. Valgrind then loads
 * the bytes of the first word that differs again, a translated block and two checked loads per
 * byte (most of the time of a std::string comparison); we compare them from the registers the
 * word was loaded into, in the same order, one byte against the other, so each comparison is
 * decided exactly when the byte loop's is: the same errors, the same result and V bits. The
 * one difference: a word that runs off the end of a block (a partial load, no error) reports
 * its missing bytes as undefined rather than as invalid reads of size 1
 * (docs/differences-from-valgrind.md). Named bcmp, as Valgrind 3.19's reports name it for a
 * call of memcmp (glibc's memcmp and bcmp are one address, which its replacement of bcmp
 * claims). */
REPLACE int oxgrind_replace_bcmp(const void *av, const void *bv, size_t n) {
    uintptr_t a = (uintptr_t)av, b = (uintptr_t)bv;
    if (((a | b) & 7) == 0) {
        word x = 0, y = 0;
        while (n >= 8 && (x = *(const word *)a) == (y = *(const word *)b)) {
            a += 8;
            b += 8;
            n -= 8;
        }
        if (n >= 8) {
            /* One comparison site, as the byte loop has: its errors are reported once per
             * context, as there. */
            int cx, cy;
            do {
                cx = (u8)x;
                cy = (u8)y;
                x >>= 8;
                y >>= 8;
            } while (cx == cy);
            return cx - cy;
        }
    }
    for (; n; n--, a++, b++) {
        int d = (int)*(const u8 *)a - (int)*(const u8 *)b;
        if (d) return d;
    }
    return 0;
}

REPLACE char *oxgrind_replace_strstr(const char *hay, const char *needle) {
    size_t nlen = 0;
    while (needle[nlen]) nlen++;
    if (nlen == 0) return (char *)hay;
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < nlen && hay[i] == needle[i]) i++;
        if (i == nlen) return (char *)hay;
    }
    return NULL;
}

static inline __attribute__((always_inline)) int in_set(const char *set, char c) {
    for (; *set; set++)
        if (*set == c) return 1;
    return 0;
}

REPLACE size_t oxgrind_replace_strspn(const char *s, const char *accept) {
    size_t n = 0;
    while (s[n] && in_set(accept, s[n])) n++;
    return n;
}

REPLACE size_t oxgrind_replace_strcspn(const char *s, const char *reject) {
    size_t n = 0;
    while (s[n] && !in_set(reject, s[n])) n++;
    return n;
}

REPLACE char *oxgrind_replace_strpbrk(const char *s, const char *accept) {
    for (; *s; s++)
        if (in_set(accept, *s)) return (char *)s;
    return NULL;
}

/* ---- copies ---- */

/* Without GCC's induction-variable rewriting (for memmove alone: every other function's
 * loops compile as before): with it, the unrolled loops' extra induction registers made the
 * function save and restore rbx on every call, one instrumented push and pop (a store and a
 * load with their A checks and V copies) even for the shortest copy. */
#pragma GCC push_options
#pragma GCC optimize("no-ivopts")
/* Valgrind's memmove: words when source and destination are equally aligned, then halves,
 * then bytes; backwards when the destination is above an overlapping source. Each loop is
 * unrolled by four (the same accesses in the same order, so the same reports): under the
 * engine a loop's every turn is a translated block, its test and its jump. */
#define COPY_F(T) do { *(T *)d = *(const T *)s; d += sizeof(T); s += sizeof(T); n -= sizeof(T); } while (0)
#define COPY_B(T) do { d -= sizeof(T); s -= sizeof(T); *(T *)d = *(const T *)s; n -= sizeof(T); } while (0)
static inline __attribute__((always_inline)) void move(void *dst, const void *src, size_t n) {
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (n == 0) return;
    if (d < s || !overlaps(dst, src, n, n)) {
        if (((s ^ d) & 7) == 0) {
            while ((s & 7) && n) COPY_F(u8);
            while (n >= 32) { COPY_F(word); COPY_F(word); COPY_F(word); COPY_F(word); }
            while (n >= 8) COPY_F(word);
            if (n == 0) return;
        }
        if (((s | d) & 1) == 0) {
            while (n >= 8) { COPY_F(uint16_t); COPY_F(uint16_t); COPY_F(uint16_t); COPY_F(uint16_t); }
            while (n >= 2) COPY_F(uint16_t);
        }
        while (n >= 4) { COPY_F(u8); COPY_F(u8); COPY_F(u8); COPY_F(u8); }
        while (n) COPY_F(u8);
    } else if (d > s) {
        d += n;
        s += n;
        if (((s ^ d) & 7) == 0) {
            while ((s & 7) && n) COPY_B(u8);
            while (n >= 32) { COPY_B(word); COPY_B(word); COPY_B(word); COPY_B(word); }
            while (n >= 8) COPY_B(word);
            if (n == 0) return;
        }
        if (((s | d) & 1) == 0) {
            while (n >= 8) { COPY_B(uint16_t); COPY_B(uint16_t); COPY_B(uint16_t); COPY_B(uint16_t); }
            while (n >= 2) COPY_B(uint16_t);
        }
        while (n >= 4) { COPY_B(u8); COPY_B(u8); COPY_B(u8); COPY_B(u8); }
        while (n) COPY_B(u8);
    }
}
#undef COPY_F
#undef COPY_B

/* memcpy and memmove share their code (and so their addresses) in glibc on amd64: both are
 * memmove, as Valgrind 3.19 treats memcpy there (no overlap report; its bug 402833). */
REPLACE void *oxgrind_replace_memmove(void *dst, const void *src, size_t n) {
    move(dst, src, n);
    return dst;
}
#pragma GCC pop_options

/* Byte copies in the safe direction: Valgrind's mempcpy and its _chk forms. */
static inline __attribute__((always_inline)) void move_bytes(void *dst, const void *src, size_t n) {
    u8 *d = dst;
    const u8 *s = src;
    if (d > s) {
        while (n--) d[n] = s[n];
    } else if (d < s) {
        for (size_t i = 0; i < n; i++) d[i] = s[i];
    }
}

REPLACE void *oxgrind_replace_memmove_chk(void *dst, const void *src, size_t n, size_t dstlen) {
    if (dstlen < n) __chk_fail();
    move_bytes(dst, src, n);
    return dst;
}

REPLACE void *oxgrind_replace_mempcpy(void *dst, const void *src, size_t n) {
    if (overlaps(dst, src, n, n)) oxgrind_strings_overlap(F_MEMPCPY, dst, src, n);
    move_bytes(dst, src, n);
    return (u8 *)dst + n;
}

REPLACE void *oxgrind_replace_mempcpy_chk(void *dst, const void *src, size_t n, size_t dstlen) {
    if (dstlen < n) __chk_fail();
    if (overlaps(dst, src, n, n)) oxgrind_strings_overlap(F_MEMPCPY, dst, src, n);
    move_bytes(dst, src, n);
    return (u8 *)dst + n;
}

/* Valgrind's memset: bytes up to an 8-byte boundary, words, then bytes. */
static inline __attribute__((always_inline)) void fill(void *s, int c, size_t n) {
    uintptr_t a = (uintptr_t)s;
    word c8 = (u8)c;
    c8 |= c8 << 8;
    c8 |= c8 << 16;
    c8 |= c8 << 32;
    while ((a & 7) && n) { *(u8 *)a++ = (u8)c; n--; }
    while (n >= 8) { *(word *)a = c8; a += 8; n -= 8; }
    while (n) { *(u8 *)a++ = (u8)c; n--; }
}

REPLACE void *oxgrind_replace_memset(void *s, int c, size_t n) {
    fill(s, c, n);
    return s;
}

REPLACE void *oxgrind_replace_memset_chk(void *s, int c, size_t n, size_t dstlen) {
    if (dstlen < n) __chk_fail();
    fill(s, c, n);
    return s;
}

/* The string copies: Valgrind's loops, then its overlap check of what was touched. */
REPLACE char *oxgrind_replace_strcpy(char *dst, const char *src) {
    const char *s0 = src;
    char *d0 = dst;
    while (*src) *dst++ = *src++;
    *dst = 0;
    if (overlaps(d0, s0, (size_t)(dst - d0) + 1, (size_t)(src - s0) + 1))
        oxgrind_strings_overlap(F_STRCPY, d0, s0, 0);
    return d0;
}

REPLACE char *oxgrind_replace_stpcpy(char *dst, const char *src) {
    const char *s0 = src;
    char *d0 = dst;
    while (*src) *dst++ = *src++;
    *dst = 0;
    if (overlaps(d0, s0, (size_t)(dst - d0) + 1, (size_t)(src - s0) + 1))
        oxgrind_strings_overlap(F_STPCPY, d0, s0, 0);
    return dst;
}

REPLACE char *oxgrind_replace_strncpy(char *dst, const char *src, size_t n) {
    const char *s0 = src;
    char *d0 = dst;
    size_t m = 0;
    while (m < n && *src) { m++; *dst++ = *src++; }
    /* Valgrind reports the pointers as they are after its loop. */
    if (overlaps(d0, s0, n, m < n ? m + 1 : n)) oxgrind_strings_overlap(F_STRNCPY, dst, src, n);
    while (m++ < n) *dst++ = 0;
    return d0;
}

REPLACE char *oxgrind_replace_stpncpy(char *dst, const char *src, size_t n) {
    const char *s0 = src;
    char *d0 = dst;
    size_t m = 0;
    while (m < n && *src) { m++; *dst++ = *src++; }
    if (overlaps(d0, s0, n, m < n ? m + 1 : n)) oxgrind_strings_overlap(F_STPNCPY, dst, src, n);
    char *end = dst;
    while (m++ < n) *dst++ = 0;
    return end;
}

REPLACE char *oxgrind_replace_strcat(char *dst, const char *src) {
    const char *s0 = src;
    char *d0 = dst;
    while (*dst) dst++;
    while (*src) *dst++ = *src++;
    *dst = 0;
    if (overlaps(d0, s0, (size_t)(dst - d0) + 1, (size_t)(src - s0) + 1))
        oxgrind_strings_overlap(F_STRCAT, d0, s0, 0);
    return d0;
}

REPLACE char *oxgrind_replace_strncat(char *dst, const char *src, size_t n) {
    const char *s0 = src;
    char *d0 = dst;
    while (*dst) dst++;
    size_t m = 0;
    while (m < n && *src) { m++; *dst++ = *src++; }
    *dst = 0;
    if (overlaps(d0, s0, (size_t)(dst - d0) + 1, (size_t)(src - s0) + 1))
        oxgrind_strings_overlap(F_STRNCAT, d0, s0, n);
    return d0;
}

/* ---- wide strings (wchar_t is a 4-byte int in glibc) ---- */

REPLACE size_t oxgrind_replace_wcslen(const int32_t *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

REPLACE size_t oxgrind_replace_wcsnlen(const int32_t *s, size_t max) {
    size_t n = 0;
    while (n < max && s[n]) n++;
    return n;
}

REPLACE int oxgrind_replace_wcscmp(const int32_t *a, const int32_t *b) {
    for (;; a++, b++) {
        if (*a < *b) return -1;
        if (*a > *b) return 1;
        if (*a == 0) return 0;
    }
}

REPLACE int32_t *oxgrind_replace_wcscpy(int32_t *dst, const int32_t *src) {
    const int32_t *s0 = src;
    int32_t *d0 = dst;
    while (*src) *dst++ = *src++;
    *dst = 0;
    if (overlaps(d0, s0, (size_t)(dst - d0 + 1) * 4, (size_t)(src - s0 + 1) * 4))
        oxgrind_strings_overlap(F_WCSCPY, d0, s0, 0);
    return d0;
}

REPLACE int32_t *oxgrind_replace_wcschr(const int32_t *s, int32_t c) {
    for (;; s++) {
        if (*s == c) return (int32_t *)s;
        if (*s == 0) return NULL;
    }
}

REPLACE int32_t *oxgrind_replace_wcsrchr(const int32_t *s, int32_t c) {
    const int32_t *last = NULL;
    for (;; s++) {
        if (*s == c) last = s;
        if (*s == 0) return (int32_t *)last;
    }
}

REPLACE int32_t *oxgrind_replace_wmemchr(const int32_t *s, int32_t c, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] == c) return (int32_t *)(s + i);
    return NULL;
}
