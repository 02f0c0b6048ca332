/* Definedness through many instruction forms, for comparing the inline fast path with the
 * interpreter (crates/oxgrind/tests/memcheck_definedness.rs): partly initialised structs,
 * bitfields, arithmetic, shifts, compares, string functions and copies, with a few real
 * uses of uninitialised values among many clean ones. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rec {
    unsigned flag : 1;
    unsigned kind : 3;
    unsigned pad : 4;
    char name[13];
    short s;
    long value;
    double d;
};

static volatile int sink;

__attribute__((noinline)) static long mix(const struct rec *r, int n) {
    long acc = 0;
    for (int i = 0; i < n; i++) {
        acc += r[i].value * 3 + (r[i].s << 2);
        acc ^= (long)r[i].kind << (i & 7);
        acc = (acc >> 1) | (acc << 63);
        if (r[i].flag)
            acc -= strlen(r[i].name);
    }
    return acc;
}

__attribute__((noinline)) static int maybe(int x) { return x > 10 ? x * 2 : x - 1; }

/* A 16-byte copy through a vector register (sqlite3's copies of partly initialised structs). */
struct pair {
    long a, b;
};
__attribute__((noinline)) static void copy_pair(struct pair *d, const struct pair *s) {
    __asm__ volatile("movdqu (%1), %%xmm0\n\tmovups %%xmm0, (%0)" : : "r"(d), "r"(s) : "xmm0", "memory");
}

int main(int argc, char **argv) {
    int n = 64;
    struct rec *r = malloc(n * sizeof *r);
    for (int i = 0; i < n; i++) {
        r[i].flag = i & 1;
        r[i].kind = i % 5;
        snprintf(r[i].name, sizeof r[i].name, "rec%d", i);
        r[i].s = (short)(i * 7);
        r[i].value = i * 1000003L;
        r[i].d = i / 3.0;
    }
    struct rec copy[64];
    memcpy(copy, r, sizeof copy);
    long clean = mix(copy, n);
    printf("clean %ld\n", clean);

    /* One record's value left uninitialised: arithmetic propagates, the branch reports. */
    struct rec *u = malloc(4 * sizeof *u);
    memcpy(u, r, 3 * sizeof *u);
    u[3].flag = 0;
    u[3].kind = 1;
    strcpy(u[3].name, "x");
    u[3].s = 1;
    long tainted = mix(u, 4);
    if (tainted > 0)
        sink = 1;

    /* A partly defined int: the defined low byte decides the compare exactly. */
    int *p = malloc(sizeof *p);
    *(char *)p = 5;
    if ((*p & 0xff) == 5)
        sink = 2;
    sink = maybe(*p);

    /* Bit tricks on defined data, then an undefined shift count. */
    unsigned long w = 0x0123456789abcdefUL;
    int cnt = __builtin_popcountl(w) + __builtin_ctzl(w | 0x100) + __builtin_clzl(w);
    sink = cnt;
    int *q = malloc(2 * sizeof *q);
    q[0] = 3;
    unsigned long shifted = w >> (q[1] & 63);
    if (shifted & 1)
        sink = 3;

    /* An undefined index. */
    static int table[16];
    sink = table[q[1] & 15];

    /* Half a struct initialised, copied through a vector register twice (stack, heap): the
     * V bits travel with the bytes, and only the branch on the undefined half reports. */
    struct pair *half = malloc(sizeof *half);
    half->a = 7;
    struct pair both;
    copy_pair(&both, half);
    struct pair *again = malloc(sizeof *again);
    copy_pair(again, &both);
    if (again->a == 7)
        sink = 4;
    if (again->b == 9)
        sink = 5;

    free(again);
    free(half);
    free(q);
    free(p);
    free(u);
    free(r);
    return 0;
}
