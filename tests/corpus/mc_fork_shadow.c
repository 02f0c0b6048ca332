/* A forked child's V bits are its own, and its parent's stay the parent's. A private
 * mapping of 16 shadow spans (64 KiB each), all defined, made before the fork. The child
 * makes the first byte of spans 0-7 undefined (each span's first undefined byte makes its
 * shadow chunk) and branches on one of them: 1 error. The parent waits for the child,
 * makes the first byte of spans 8-15 undefined, writes the first byte of spans 0-7 (the
 * child's undefined bytes, never the parent's), and branches on each of spans 8-15: 8
 * errors, one context each. Were the table of shadow chunks shared between the two
 * processes, the parent would find the child's chunks for spans 0-7 (taken from the same
 * place of the shadow pool as its own for spans 8-15, since both continue from the pool
 * as it was at the fork), its writes there would make spans 8-15 defined, and fewer
 * errors would be reported. As Valgrind: 1 error in the child, 8 in the parent. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <valgrind/memcheck.h>

#define SPAN 65536
int hits;

static void __attribute__((noinline)) branch_on(volatile unsigned char *p) {
    if (*p == 3) hits++;
}

/* One call site per span, so each is its own error context (as Valgrind counts them). */
#define AT(i) branch_on(m + (i) * SPAN)

int main(void) {
    unsigned char *m = mmap(0, 16 * SPAN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 1;
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) return 1;
    if (child == 0) {
        for (int i = 0; i < 8; i++) VALGRIND_MAKE_MEM_UNDEFINED(m + i * SPAN, 1);
        AT(3);
        _exit(0);
    }
    int status;
    waitpid(child, &status, 0);
    for (int i = 8; i < 16; i++) VALGRIND_MAKE_MEM_UNDEFINED(m + i * SPAN, 1);
    for (int i = 0; i < 8; i++) ((volatile unsigned char *)m)[i * SPAN] = 1;
    AT(8); AT(9); AT(10); AT(11); AT(12); AT(13); AT(14); AT(15);
    printf("child %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}
