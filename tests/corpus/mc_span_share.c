/* Memory operands of one block with the same base register share one span lookup
 * (`translate::definedness::span_shares`): the first looks the span up and keeps where its
 * primary entry is, the later ones read the entry from there. Three cases, one error each,
 * as Valgrind:
 * 1. an undefined field read by a later operand of the sharing: the error at the branch;
 * 2. a store of an undefined value by the first operand into memory without V bits yet
 *    (a static buffer, all defined: its span may have no chunk), then a later operand
 *    reads it back: the chunk the store's slow step made must be seen;
 * 3. the base register written between two operands: the later one is not in the sharing,
 *    and its undefined bytes are still found. */
#include <stdio.h>
#include <stdlib.h>

static long buf[8];

int main(void) {
    long *p = malloc(64); /* undefined */
    p[0] = 1;
    p[2] = 3;
    long r = 0;
    /* 1: p[0] and p[2] defined, p[1] undefined */
    __asm__ volatile("mov (%1), %%rax\n\t"
                     "add 8(%1), %%rax\n\t"
                     "add 16(%1), %%rax\n\t"
                     "cmp $7, %%rax\n\t"
                     "jne 1f\n\t"
                     "add $1, %0\n"
                     "1:\n"
                     : "+r"(r)
                     : "r"(p)
                     : "rax", "cc", "memory");
    /* 2: an undefined value stored into buf[0], buf[1] read, buf[0] read back */
    long undef = p[3];
    __asm__ volatile("mov %2, (%1)\n\t"
                     "mov 8(%1), %%rdx\n\t"
                     "mov (%1), %%rax\n\t"
                     "cmp $0, %%rax\n\t"
                     "jne 1f\n\t"
                     "add $1, %0\n"
                     "1:\n"
                     : "+r"(r)
                     : "r"(buf), "r"(undef)
                     : "rax", "rdx", "cc", "memory");
    /* 3: p[0] read, the base moved to p + 4 (p[4] undefined), p[4] read */
    long *q = p;
    __asm__ volatile("mov (%1), %%rax\n\t"
                     "lea 32(%1), %1\n\t"
                     "add (%1), %%rax\n\t"
                     "cmp $0, %%rax\n\t"
                     "jne 1f\n\t"
                     "add $1, %0\n"
                     "1:\n"
                     : "+r"(r), "+r"(q)
                     :
                     : "rax", "cc", "memory");
    printf("%ld\n", r);
    free(p);
    return 0;
}
