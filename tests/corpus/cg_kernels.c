/* Cachegrind corpus: deterministic kernels, each in its own function, exercising what the
 * simulator models: sequential and strided data (D1 and LL misses), a transpose (conflict
 * misses), data-dependent branches (conditional mispredicts), calls through a table
 * (indirect branches), read-modify-write and locked instructions (how Valgrind counts
 * them), accesses straddling two cache lines, and rep string instructions (an Ir per
 * iteration). No heap, no libc calls in the kernels: their counts do not depend on the
 * allocator or on which glibc variant runs. */
#include <stdint.h>

#define N 16384
static int big[N];            /* 64 KiB: twice the D1 of the tests */
static int mat[64][64], matt[64][64];
static unsigned char buf[8192], buf2[8192];
static volatile long counter;

struct __attribute__((packed)) unaligned { char pad[61]; uint64_t v; };
static struct unaligned straddle[64];

__attribute__((noinline)) long stream(int stride) {
    long s = 0;
    for (int i = 0; i < N; i += stride)
        s += big[i];
    return s;
}

__attribute__((noinline)) void fill(void) {
    for (int i = 0; i < N; i++)
        big[i] = i * 7;
}

__attribute__((noinline)) void transpose(void) {
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < 64; j++)
            matt[j][i] = mat[i][j];
}

__attribute__((noinline)) long branchy(int n) {
    unsigned x = 12345;
    long taken = 0;
    for (int i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        if ((x >> 16) & 1)
            taken++;
        else
            taken--;
    }
    return taken;
}

static long f0(long v) { return v + 1; }
static long f1(long v) { return v * 3; }
static long f2(long v) { return v - 7; }
static long (*const table[3])(long) = {f0, f1, f2};

__attribute__((noinline)) long indirect(int n) {
    long v = 1;
    for (int i = 0; i < n; i++)
        v = table[(i * i) % 3](v);
    return v;
}

__attribute__((noinline)) void rmw(int n) {
    for (int i = 0; i < n; i++) {
        big[i & 1023] += 3;                       /* add [m], r: one read */
        __atomic_fetch_add(&counter, 1, __ATOMIC_SEQ_CST);   /* lock xadd: two reads */
        long expect = counter;
        __atomic_compare_exchange_n(&counter, &expect, expect + 1, 0,
                                    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); /* lock cmpxchg */
    }
}

__attribute__((noinline)) uint64_t straddling(void) {
    uint64_t s = 0;
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < 64; i++) {
            straddle[i].v += (uint64_t)i;     /* 8 bytes at offset 61: two lines */
            s ^= straddle[i].v;
        }
    return s;
}

__attribute__((noinline)) long strings(void) {
    long n = sizeof buf;
    unsigned char *d = buf, *s = buf2;
    __asm__ volatile("rep stosb" : "+D"(d), "+c"(n) : "a"(0x41) : "memory");
    n = sizeof buf;
    d = buf2;
    s = buf;
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
    buf[5000] = 0;
    n = sizeof buf;
    d = buf;
    __asm__ volatile("repne scasb" : "+D"(d), "+c"(n) : "a"(0) : "memory", "cc");
    long found = n;
    n = sizeof buf;
    d = buf;
    s = buf2;
    __asm__ volatile("repe cmpsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory", "cc");
    return found + n;
}

int main(int argc, char **argv) {
    (void)argv;
    if (argc > 1)   /* the short run: one small kernel */
        return (int)(branchy(2000) & 1);
    long r = 0;
    fill();
    r += stream(1);
    r += stream(16);
    r += stream(16);
    transpose();
    r += branchy(4000);
    r += indirect(900);
    rmw(500);
    r += (long)straddling();
    r += strings();
    return (int)(r & 1);
}
