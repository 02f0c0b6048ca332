/* Origins of uninitialised values (--track-origins=yes), one case per argument, for
 * crates/oxgrind/tests/memcheck_origins.rs: each must give Valgrind's report, origin lines
 * ("Uninitialised value was created by a heap allocation / a stack allocation / a client
 * request" and their stacks) included. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <valgrind/memcheck.h>

/* The garbage bytes go to /dev/null: they differ between the tools. */
static int sink(void) { return open("/dev/null", O_WRONLY); }

/* A heap int read before it is written: a branch, then printf of it. */
static void __attribute__((noinline)) heap_int(void) {
    int *p = malloc(4 * sizeof(int));
    p[1] = 7;
    if (p[0] == 42)
        puts("forty-two");
    printf("%d\n", p[2]);
    free(p);
}

/* write() of a heap buffer with one byte written. */
static void __attribute__((noinline)) heap_write(void) {
    char *buf = malloc(16);
    buf[0] = 'a';
    int fd = sink();
    write(fd, buf, 16);
    close(fd);
    free(buf);
}

/* realloc's new tail is undefined, made so by the realloc. */
static void __attribute__((noinline)) realloc_tail(void) {
    int *p = malloc(2 * sizeof(int));
    p[0] = 1;
    p[1] = 2;
    p = realloc(p, 64 * sizeof(int));
    if (p[40] > 0)
        puts("positive");
    free(p);
}

/* Branches on stack garbage count here, not in the output: its values differ between the
 * tools. */
static volatile int seen;

/* A local in a leaf's red zone, and one in a frame made by `sub rsp`. */
static int __attribute__((noinline)) leaf(int a) {
    int x;
    if (a > 0)
        x = a;
    return x;
}

static int __attribute__((noinline)) framed(int a) {
    volatile int y[8];
    y[0] = a;
    if (leaf(0) == 5)
        seen++;
    return y[a + 3];
}

static void __attribute__((noinline)) stack_values(void) {
    if (framed(0) > 3)
        seen++;
}

/* An undefined value copied through memcpy and a struct before it is used. */
struct pair {
    int a, b;
};
static void __attribute__((noinline)) copied(void) {
    struct pair *src = malloc(sizeof *src);
    src->a = 1;
    struct pair local;
    memcpy(&local, src, sizeof local);
    if (local.b == 3)
        puts("three");
    free(src);
}

/* A system call's argument register: a heap value's, then a stack value's. */
static void __attribute__((noinline)) syscall_arg(void) {
    int *n = malloc(sizeof(int));
    int m;
    int fd = sink();
    write(fd, "abc", *n & 3);
    write(fd, "abc", m & 1);
    close(fd);
    free(n);
}

static int global[4] = {1, 2, 3, 4};

/* Memory made undefined by a client request. */
static void __attribute__((noinline)) client(void) {
    VALGRIND_MAKE_MEM_UNDEFINED(&global[1], sizeof(int));
    if (global[1] == 2)
        puts("two");
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "all";
    int all = !strcmp(c, "all");
    if (all || !strcmp(c, "heap"))
        heap_int();
    if (all || !strcmp(c, "heap-write"))
        heap_write();
    if (all || !strcmp(c, "realloc"))
        realloc_tail();
    if (all || !strcmp(c, "stack"))
        stack_values();
    if (all || !strcmp(c, "copied"))
        copied();
    if (all || !strcmp(c, "syscall-arg"))
        syscall_arg();
    if (all || !strcmp(c, "client"))
        client();
    return 0;
}
