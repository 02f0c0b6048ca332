/* Uses of uninitialised values, one case per argument, for the definedness tests
 * (crates/oxgrind/tests/memcheck_definedness.rs): each must give Valgrind's report. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <valgrind/memcheck.h>

/* The garbage bytes go to /dev/null: they differ between the tools. */
static int sink(void) { return open("/dev/null", O_WRONLY); }

static int __attribute__((noinline)) branch_on_local(void) {
    int x;
    if (x > 5)
        return 1;
    return 0;
}

static void __attribute__((noinline)) print_undefined(void) {
    /* A fresh heap int: undefined, and 0 under both tools (a stack local's garbage
     * differs between them, and so would the digits printf loops over). */
    int *x = malloc(sizeof(int));
    printf("%d\n", *x);
    free(x);
}

static void __attribute__((noinline)) print_comparison(void) {
    /* setcc of an undefined compare: bit 0 undefined, bits 7:1 defined. vfprintf's
     * `test rax,rax; js` on the argument is then undefined for Memcheck (VEX leaves a
     * 64-bit LOGIC + S to its flags helper: PCast of the whole value). */
    int *x = malloc(sizeof(int));
    printf("%d\n", *x > 3);
    free(x);
}

static void __attribute__((noinline)) write_stack(void) {
    char buf[16];
    buf[0] = 'a';
    int fd = sink();
    write(fd, buf, 10);
    close(fd);
}

static void __attribute__((noinline)) write_heap(void) {
    char *buf = malloc(16);
    memset(buf, 'b', 4);
    int fd = sink();
    write(fd, buf, 8);
    close(fd);
    free(buf);
}

static int __attribute__((noinline)) deref_local(void) {
    int v = 1;
    int *p;
    /* Defined address register after a store through a pointer read from an
     * uninitialised slot that happens to hold a valid address. */
    int *volatile slot;
    p = slot;
    (void)p;
    return v;
}

static int __attribute__((noinline)) heap_reads(void) {
    int *p = malloc(10 * sizeof(int));
    int n = 0;
    p[1] = 3;
    if (p[1] == 3)
        n++;
    if (p[2] == 7) /* undefined */
        n++;
    int *q = calloc(4, sizeof(int));
    if (q[1]) /* calloc'd: defined */
        n++;
    q[2] = 5;
    q = realloc(q, 64);
    if (q[2] == 5) /* kept by realloc */
        n++;
    if (q[10]) /* the new tail: undefined */
        n++;
    free(p);
    free(q);
    return n;
}

static int __attribute__((noinline)) index_with_undefined(void) {
    static int table[64];
    int *i = malloc(sizeof(int));
    int v = table[*i & 63]; /* address from an undefined value */
    free(i);
    return v;
}

/* VALGRIND_CHECK_MEM_IS_DEFINED: the first undefined byte of a heap block and of a stack
 * buffer; a fully written range gives nothing. */
static void __attribute__((noinline)) check_requests(void) {
    char *p = malloc(16);
    memset(p, 1, 6);
    VALGRIND_CHECK_MEM_IS_DEFINED(p, 16);
    memset(p, 1, 16);
    VALGRIND_CHECK_MEM_IS_DEFINED(p, 16);
    free(p);
    char buf[16];
    buf[0] = 1;
    VALGRIND_CHECK_MEM_IS_DEFINED(buf, 16);
}

/* Undefined sizes given to the allocator: Memcheck's replacements branch on them. Each
 * size is loaded right before its call (a volatile read). */
static void __attribute__((noinline)) alloc_sizes(void) {
    size_t *cell = malloc(sizeof *cell);
    volatile size_t *garbage = cell;
    char *volatile keep;
    char *a = malloc(*garbage & 15);
    keep = a;
    free(a);
    char *b = calloc(1, *garbage & 7);
    keep = b;
    free(b);
    char *c = malloc(8);
    keep = c;
    c = realloc(c, *garbage & 31);
    keep = c;
    free(c);
    free(cell);
    (void)keep;
}

/* Floating point on an uninitialised heap double (the SSE forms the inline fast path
 * handles): arithmetic and a conversion carry it to a compare and a branch (reported);
 * `xorps` of a register with itself, and a packed add whose undefined lane is not the
 * one compared, make defined values (not reported). */
static int __attribute__((noinline)) float_ops(void) {
    double *d = malloc(2 * sizeof(double));
    int n = 0;
    d[1] = 1.5;
    double x = d[0] * 2.0 + d[1];
    if (x > 3.0)
        n++;
    int i = (int)d[0];
    if (i == 7)
        n++;
    double z;
    __asm__ volatile("movsd %1, %0\n\txorps %0, %0" : "=x"(z) : "m"(d[0]));
    if (z > 0.5)
        n++;
    double lo;
    __asm__ volatile("movupd %1, %0\n\t"
                     "addpd %0, %0\n\t"
                     "unpckhpd %0, %0"
                     : "=x"(lo)
                     : "m"(d[0]));
    if (lo > 2.5)
        n++;
    free(d);
    return n;
}

/* An undefined value kept in a callee-saved register across calls into the allocator
 * (at -O2, x lives in rbx, rbp or r12-r15 over free and malloc): the calls keep its V
 * bits, as Valgrind's replacements do, and the branch on it after them is reported.
 * After a first malloc and free: our runtime's first call of each looks its own address
 * up with the program's dlsym, and a call into the program's code loses them. */
static int __attribute__((noinline)) across_calls(void) {
    char *volatile first = malloc(8);
    free(first);
    int *u = malloc(sizeof(int));
    int x = *u;
    free(u);
    char *volatile keep = malloc(24);
    free(keep);
    if (x == 42)
        puts("42");
    return x;
}

static int __attribute__((noinline)) clean(void) {
    char buf[64];
    int n = 0;
    snprintf(buf, sizeof buf, "%d %s %.3f", 42, "str", 2.5);
    n += (int)strlen(buf);
    char *h = malloc(32);
    strcpy(h, "hello");
    if (strcmp(h, "hello") == 0)
        n++;
    struct { char c; long l; } s = { 'x', 7 }, t;
    t = s;
    if (t.l == 7)
        n++;
    free(h);
    return n;
}

/* Large blocks, whose shadow is kept without resident pages while it says nothing
 * (all undefined: mapped from a file; all defined: pages given back, swept): an
 * untouched 4 MiB block is undefined deep inside; once written it is defined; a block
 * freed after being cleared and a new one in its place is undefined again. Two errors. */
static int large_blocks(void) {
    int n = 0;
    volatile char *p = malloc(4 << 20);
    if (p[3 << 20])
        n++;
    memset((char *)p, 1, 4 << 20);
    if (p[3 << 20] == 1)
        n++;
    free((char *)p);
    char *q = malloc(200000);
    memset(q, 0, 200000);
    free(q);
    volatile char *r = malloc(200000);
    if (r[100000])
        n++;
    free((char *)r);
    return n;
}

/* A copy of partly initialised memory through a vector register right after malloc (the
 * runtime's code leaves every vector shadow stale: all defined, not yet cleared; the
 * inline load clears the rest of its register's shadow and leaves the others stale): the
 * undefined half is reported where it is used, from the register and from the memory it
 * was stored to; the defined half is not. Twice, each after a malloc: 4 errors from 2
 * contexts. */
static int __attribute__((noinline)) vector_copy(void) {
    int n = 0;
    for (int i = 0; i < 2; i++) {
        unsigned long *p = malloc(16), *q = malloc(16);
        p[0] = 1;
        unsigned long lo, hi;
        __asm__ volatile("movdqu (%2), %%xmm1\n\t"
                         "movdqu %%xmm1, (%3)\n\t"
                         "movq %%xmm1, %0\n\t"
                         "movhlps %%xmm1, %%xmm1\n\t"
                         "movq %%xmm1, %1"
                         : "=r"(lo), "=r"(hi)
                         : "r"(p), "r"(q)
                         : "xmm1", "memory");
        if (lo == 1)
            n++;
        if (hi == 7)
            n++;
        if (q[1] == 7)
            n++;
        free(p);
        free(q);
    }
    return n;
}

/* x87 arithmetic on an undefined double (printf's and strtod's long double code): the
 * compare of a product of it is reported; once it is popped, a compare of constants (the
 * stack's shadows all defined again: the inline path) is not. One error. */
static int __attribute__((noinline)) x87_ops(void) {
    double *d = malloc(sizeof(double));
    int n = 0;
    unsigned char above, below;
    __asm__ volatile("fldl (%2)\n\t"
                     "fld1\n\t"
                     "fmul %%st(1), %%st\n\t"
                     "fcomip %%st(1), %%st\n\t"
                     "fstp %%st(0)\n\t"
                     "seta %0\n\t"
                     "fld1\n\t"
                     "fldz\n\t"
                     "fcomip %%st(1), %%st\n\t"
                     "fstp %%st(0)\n\t"
                     "setb %1"
                     : "=r"(above), "=r"(below)
                     : "r"(d)
                     : "st", "st(1)", "cc");
    if (above)
        n++;
    if (below)
        n++;
    free(d);
    return n;
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "clean";
    int r = 0;
    if (!strcmp(c, "branch")) r = branch_on_local();
    else if (!strcmp(c, "printf")) print_undefined();
    else if (!strcmp(c, "printf-compare")) print_comparison();
    else if (!strcmp(c, "check-requests")) check_requests();
    else if (!strcmp(c, "alloc-sizes")) alloc_sizes();
    else if (!strcmp(c, "write-stack")) write_stack();
    else if (!strcmp(c, "write-heap")) write_heap();
    else if (!strcmp(c, "deref")) r = deref_local();
    else if (!strcmp(c, "heap")) r = heap_reads();
    else if (!strcmp(c, "index")) r = index_with_undefined();
    else if (!strcmp(c, "float")) r = float_ops();
    else if (!strcmp(c, "across-calls")) r = across_calls();
    else if (!strcmp(c, "large-blocks")) r = large_blocks();
    else if (!strcmp(c, "vector-copy")) r = vector_copy();
    else if (!strcmp(c, "x87")) r = x87_ops();
    else r = clean();
    /* r depends on garbage in some cases: not printed, only computed. */
    (void)r;
    printf("%s\n", c);
    return 0;
}
