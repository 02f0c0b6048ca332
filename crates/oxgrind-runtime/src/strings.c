/* The copying string functions, checked for overlapping source and destination the way
 * Valgrind 3.19's Memcheck replacements (shared/vg_replace_strmem.c) check them on amd64.
 *
 * The exported names (strcpy, ...) are naked Rust functions (strings.rs) that jump through
 * a table. The table starts out pointing here; once the runtime is set up, strings.rs points
 * it at glibc's own functions when the tool does not check overlaps (Massif, none), so those
 * tools pay one indirect jump per call and nothing more. When the tool checks, the table
 * keeps pointing here:
 *
 * - a conservative pre-check covers every byte the copy can read or write; when nothing
 *   overlaps, the copy is glibc's (same result as Valgrind's byte loop, no report);
 * - otherwise the copy is Valgrind's own loop followed by its own post-check, byte for byte,
 *   so what is reported (and what the program then reads) is what Valgrind gives.
 *
 * Before set-up (other libraries' constructors run first), and while the real functions are
 * not resolved, each function is a plain loop. Compiled with -fno-builtin and
 * -fno-tree-loop-distribute-patterns so gcc turns none of the loops into library calls.
 *
 * The set is what Valgrind 3.19 checks on amd64: strcpy, strncpy, strcat, strncat, stpcpy,
 * stpncpy, mempcpy, __memcpy_chk (reported as memcpy_chk) and wcscpy; plus the glibc
 * functions that tail-call one of those through an internal symbol Valgrind also intercepts,
 * reported as the function called: memccpy (mempcpy), __strncpy_chk (strncpy) and
 * __stpncpy_chk (stpncpy). Not checked, as in Valgrind 3.19: memcpy (glibc's is memmove on
 * amd64, bug 402833), __strcpy_chk, __stpcpy_chk, __strcat_chk, __strncat_chk,
 * __mempcpy_chk.
 */
#include <stddef.h>
#include <stdint.h>

/* Indices shared with strings.rs (FNS). */
enum {
    F_STRCPY,
    F_STRNCPY,
    F_STRCAT,
    F_STRNCAT,
    F_STPCPY,
    F_STPNCPY,
    F_MEMPCPY,
    F_MEMCPY_CHK,
    F_MEMCCPY,
    F_WCSCPY,
    F_STRNCPY_CHK,
    F_STPNCPY_CHK,
    N_FNS
};

/* glibc's functions, filled by strings.rs (oxgrind_strings_install); NULL until then. */
static void *real[N_FNS];
/* 0: not resolved yet; 1: resolved. Written after `real` and `checked`. */
static int resolved;
/* Which functions are checked here (bit F_*): those of a tool that checks overlaps, unless
 * the engine replaces glibc's code with checked versions (replace.c). The others go to glibc
 * (the jump table is pointed at glibc too, this is for calls already on their way here). */
static unsigned checked;
#define CHECKING(f) (checked & (1u << (f)))

/* Implemented in Rust (strings.rs). */
extern int oxgrind_strings_resolve(void);
extern void oxgrind_strings_overlap(int which, const void *dst, const void *src, size_t len);

/* glibc functions this file calls directly: none of them is one of ours. */
extern size_t strlen(const char *s);
extern size_t strnlen(const char *s, size_t n);
extern void *memmove(void *dst, const void *src, size_t n);
extern void *memchr(const void *s, int c, size_t n);

void oxgrind_strings_install(void *const *fns, int n, int check_mask) {
    for (int i = 0; i < n && i < N_FNS; i++) real[i] = fns[i];
    checked = (unsigned)check_mask;
    __atomic_store_n(&resolved, 1, __ATOMIC_RELEASE);
}

/* Whether `real` can be used: resolves on first use after set-up. */
static inline int ready(void) {
    if (__builtin_expect(__atomic_load_n(&resolved, __ATOMIC_ACQUIRE), 1)) return 1;
    return oxgrind_strings_resolve();
}

/* Valgrind's is_overlap: [dst, dst+dstlen) and [src, src+srclen) share a byte. */
static inline int is_overlap(const void *dst, const void *src, size_t dstlen, size_t srclen) {
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (dstlen == 0 || srclen == 0) return 0;
    if (s < d) return !(s + srclen - 1 < d);
    if (d < s) return !(d + dstlen - 1 < s);
    return 1;
}

/* A forward byte copy, for the plain (unresolved) paths; memmove-safe callers only. */
static void move_bytes(char *d, const char *s, size_t n) {
    if (d < s) {
        for (size_t i = 0; i < n; i++) d[i] = s[i];
    } else if (d > s) {
        for (size_t i = n; i > 0; i--) d[i - 1] = s[i - 1];
    }
}

static size_t plain_strlen(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

typedef char *(*str2_fn)(char *, const char *);
typedef char *(*str3_fn)(char *, const char *, size_t);
typedef void *(*mem3_fn)(void *, const void *, size_t);
typedef void *(*mem4_fn)(void *, const void *, size_t, size_t);
typedef void *(*memccpy_fn)(void *, const void *, int, size_t);
typedef char *(*str4_fn)(char *, const char *, size_t, size_t);
typedef int32_t *(*wcs2_fn)(int32_t *, const int32_t *);
/* wchar_t is 4 bytes in glibc; Valgrind's loop copies whole (possibly unaligned) ones. */
typedef int32_t __attribute__((aligned(1))) wchar_unaligned;
extern size_t wcslen(const int32_t *s);

/* ---- strcpy / stpcpy ---- */

/* Valgrind's loop and post-check; returns the end (the copied NUL). */
static char *vg_strcpy(int which, char *dst, const char *src) {
    const char *src_orig = src;
    char *dst_orig = dst;
    while (*src) *dst++ = *src++;
    *dst = 0;
    if (is_overlap(dst_orig, src_orig, (size_t)(dst - dst_orig) + 1, (size_t)(src - src_orig) + 1))
        oxgrind_strings_overlap(which, dst_orig, src_orig, 0);
    return dst;
}

char *oxgrind_c_strcpy(char *dst, const char *src) {
    if (!ready()) {
        char *d = dst;
        while ((*d++ = *src++)) {}
        return dst;
    }
    if (!CHECKING(F_STRCPY)) return ((str2_fn)real[F_STRCPY])(dst, src);
    size_t n = strlen(src) + 1;
    if (!is_overlap(dst, src, n, n)) return ((str2_fn)real[F_STRCPY])(dst, src);
    vg_strcpy(F_STRCPY, dst, src);
    return dst;
}

char *oxgrind_c_stpcpy(char *dst, const char *src) {
    if (!ready()) {
        while ((*dst = *src++)) dst++;
        return dst;
    }
    if (!CHECKING(F_STPCPY)) return ((str2_fn)real[F_STPCPY])(dst, src);
    size_t n = strlen(src) + 1;
    if (!is_overlap(dst, src, n, n)) return ((str2_fn)real[F_STPCPY])(dst, src);
    return vg_strcpy(F_STPCPY, dst, src);
}

/* ---- strncpy / stpncpy ---- */

/* Valgrind's loop: all n bytes of dst count, m+1 of src if its NUL came first. The report
 * names dst and src as they are after the copy loop (Valgrind passes its moved pointers).
 * Returns dst after the copied characters (before the padding). */
static char *vg_strncpy(int which, char *dst, const char *src, size_t n) {
    const char *src_orig = src;
    char *dst_orig = dst;
    size_t m = 0;
    while (m < n && *src) {
        m++;
        *dst++ = *src++;
    }
    size_t srclen = (m < n) ? m + 1 : n;
    if (is_overlap(dst_orig, src_orig, n, srclen)) oxgrind_strings_overlap(which, dst, src, n);
    char *end = dst;
    while (m++ < n) *dst++ = 0;
    return end;
}

/* Whether the copy of strncpy(dst, src, n) could touch a byte it also reads. */
static inline int strncpy_may_overlap(char *dst, const char *src, size_t n) {
    size_t m = strnlen(src, n);
    return is_overlap(dst, src, n, m < n ? m + 1 : n);
}

/* strncpy before the real functions are known; returns the end of the copied characters. */
static char *plain_strncpy(char *dst, const char *src, size_t n) {
    size_t i = 0;
    for (; i < n && src[i]; i++) dst[i] = src[i];
    char *end = dst + i;
    for (; i < n; i++) dst[i] = 0;
    return end;
}

char *oxgrind_c_strncpy(char *dst, const char *src, size_t n) {
    if (!ready()) {
        plain_strncpy(dst, src, n);
        return dst;
    }
    if (!CHECKING(F_STRNCPY)) return ((str3_fn)real[F_STRNCPY])(dst, src, n);
    if (!strncpy_may_overlap(dst, src, n)) return ((str3_fn)real[F_STRNCPY])(dst, src, n);
    vg_strncpy(F_STRNCPY, dst, src, n);
    return dst;
}

char *oxgrind_c_stpncpy(char *dst, const char *src, size_t n) {
    if (!ready()) return plain_strncpy(dst, src, n);
    if (!CHECKING(F_STPNCPY)) return ((str3_fn)real[F_STPNCPY])(dst, src, n);
    if (!strncpy_may_overlap(dst, src, n)) return ((str3_fn)real[F_STPNCPY])(dst, src, n);
    return vg_strncpy(F_STPNCPY, dst, src, n);
}

/* glibc's __strncpy_chk and __stpncpy_chk check the size, then tail-call strncpy and
 * stpncpy, which Valgrind intercepts: the report is strncpy's (frame 0 too). An overflowing
 * call is glibc's to reject ("buffer overflow detected"). */
char *oxgrind_c___strncpy_chk(char *dst, const char *src, size_t n, size_t destlen) {
    if (!ready()) {
        if (destlen < n) __builtin_trap();
        plain_strncpy(dst, src, n);
        return dst;
    }
    if (!CHECKING(F_STRNCPY_CHK) || destlen < n) return ((str4_fn)real[F_STRNCPY_CHK])(dst, src, n, destlen);
    if (!strncpy_may_overlap(dst, src, n)) return ((str3_fn)real[F_STRNCPY])(dst, src, n);
    vg_strncpy(F_STRNCPY, dst, src, n);
    return dst;
}

char *oxgrind_c___stpncpy_chk(char *dst, const char *src, size_t n, size_t destlen) {
    if (!ready()) {
        if (destlen < n) __builtin_trap();
        return plain_strncpy(dst, src, n);
    }
    if (!CHECKING(F_STPNCPY_CHK) || destlen < n) return ((str4_fn)real[F_STPNCPY_CHK])(dst, src, n, destlen);
    if (!strncpy_may_overlap(dst, src, n)) return ((str3_fn)real[F_STPNCPY])(dst, src, n);
    return vg_strncpy(F_STPNCPY, dst, src, n);
}

/* ---- strcat / strncat ---- */

char *oxgrind_c_strcat(char *dst, const char *src) {
    if (!ready()) {
        char *d = dst + plain_strlen(dst);
        while ((*d++ = *src++)) {}
        return dst;
    }
    if (!CHECKING(F_STRCAT)) return ((str2_fn)real[F_STRCAT])(dst, src);
    size_t ls = strlen(src);
    if (!is_overlap(dst, src, strlen(dst) + ls + 1, ls + 1))
        return ((str2_fn)real[F_STRCAT])(dst, src);
    /* Valgrind's loop: dst counts up to its new NUL, src up to its NUL. */
    const char *src_orig = src;
    char *dst_orig = dst;
    while (*dst) dst++;
    while (*src) *dst++ = *src++;
    *dst = 0;
    if (is_overlap(dst_orig, src_orig, (size_t)(dst - dst_orig) + 1, (size_t)(src - src_orig) + 1))
        oxgrind_strings_overlap(F_STRCAT, dst_orig, src_orig, 0);
    return dst_orig;
}

char *oxgrind_c_strncat(char *dst, const char *src, size_t n) {
    if (!ready()) {
        char *d = dst + plain_strlen(dst);
        size_t i = 0;
        for (; i < n && src[i]; i++) d[i] = src[i];
        d[i] = 0;
        return dst;
    }
    if (!CHECKING(F_STRNCAT)) return ((str3_fn)real[F_STRNCAT])(dst, src, n);
    size_t m = strnlen(src, n);
    /* Conservative: src's NUL (read when m < n) counts too, though Valgrind's check omits it. */
    if (!is_overlap(dst, src, strlen(dst) + m + 1, m < n ? m + 1 : m))
        return ((str3_fn)real[F_STRNCAT])(dst, src, n);
    const char *src_orig = src;
    char *dst_orig = dst;
    m = 0;
    while (*dst) dst++;
    while (m < n && *src) {
        m++;
        *dst++ = *src++;
    }
    *dst = 0;
    if (is_overlap(dst_orig, src_orig, (size_t)(dst - dst_orig) + 1, (size_t)(src - src_orig)))
        oxgrind_strings_overlap(F_STRNCAT, dst_orig, src_orig, n);
    return dst_orig;
}

/* ---- mempcpy / memccpy / __memcpy_chk ---- */

/* Valgrind's mempcpy: the whole length of both counts; the copy is a memmove. */
static void *checked_mempcpy(void *dst, const void *src, size_t len) {
    if (len == 0) return dst;
    if (!is_overlap(dst, src, len, len)) return ((mem3_fn)real[F_MEMPCPY])(dst, src, len);
    oxgrind_strings_overlap(F_MEMPCPY, dst, src, len);
    memmove(dst, src, len);
    return (char *)dst + len;
}

void *oxgrind_c_mempcpy(void *dst, const void *src, size_t len) {
    if (!ready()) {
        move_bytes(dst, src, len);
        return (char *)dst + len;
    }
    if (!CHECKING(F_MEMPCPY)) return ((mem3_fn)real[F_MEMPCPY])(dst, src, len);
    return checked_mempcpy(dst, src, len);
}

/* glibc's memccpy is memchr, then mempcpy up to and including the byte (a tail call, so
 * Valgrind's stack shows mempcpy called from memccpy's caller) or memcpy of everything. */
void *oxgrind_c_memccpy(void *dst, const void *src, int c, size_t n) {
    if (!ready()) {
        unsigned char *d = dst;
        const unsigned char *s = src;
        for (size_t i = 0; i < n; i++) {
            d[i] = s[i];
            if (s[i] == (unsigned char)c) return d + i + 1;
        }
        return NULL;
    }
    if (!CHECKING(F_MEMCCPY)) return ((memccpy_fn)real[F_MEMCCPY])(dst, src, c, n);
    const char *p = memchr(src, c, n);
    if (p) return checked_mempcpy(dst, src, (size_t)(p - (const char *)src) + 1);
    /* glibc's memcpy on amd64 is memmove, and Valgrind's does not check. */
    memmove(dst, src, n);
    return NULL;
}

void *oxgrind_c___memcpy_chk(void *dst, const void *src, size_t len, size_t dstlen) {
    if (!ready()) {
        if (dstlen < len) __builtin_trap();
        move_bytes(dst, src, len);
        return dst;
    }
    if (!CHECKING(F_MEMCPY_CHK)) return ((mem4_fn)real[F_MEMCPY_CHK])(dst, src, len, dstlen);
    /* An overflowing call is glibc's to reject ("buffer overflow detected"). */
    if (dstlen < len || len == 0 || !is_overlap(dst, src, len, len))
        return ((mem4_fn)real[F_MEMCPY_CHK])(dst, src, len, dstlen);
    oxgrind_strings_overlap(F_MEMCPY_CHK, dst, src, len);
    return memmove(dst, src, len);
}

/* ---- wcscpy ---- */

int32_t *oxgrind_c_wcscpy(int32_t *dst, const int32_t *src) {
    if (!ready()) {
        int32_t *d = dst;
        while ((*d++ = *src++)) {}
        return dst;
    }
    if (!CHECKING(F_WCSCPY)) return ((wcs2_fn)real[F_WCSCPY])(dst, src);
    size_t bytes = (wcslen(src) + 1) * 4;
    if (!is_overlap(dst, src, bytes, bytes)) return ((wcs2_fn)real[F_WCSCPY])(dst, src);
    /* Valgrind's loop; both lengths include the terminating wide character. */
    const wchar_unaligned *s = (const wchar_unaligned *)src;
    wchar_unaligned *d = (wchar_unaligned *)dst;
    while (*s) *d++ = *s++;
    *d = 0;
    if (is_overlap(dst, src, (size_t)((char *)d - (char *)dst) + 4,
                   (size_t)((const char *)s - (const char *)src) + 4))
        oxgrind_strings_overlap(F_WCSCPY, dst, src, 0);
    return dst;
}
