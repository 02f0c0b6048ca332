/* Operands addressed through `rax` right after the inline part stored the guest `rax`
 * (`translate`: `Emitter::rax_guest_at`, no reload of it for the address). Three cases,
 * one error each, as Valgrind:
 * 1. a load into rax of a pointer, then a load through it of an undefined field: the
 *    error at the branch on it (the shadow read at the field the guest reads);
 * 2. a pointer loaded into rax, then a byte read through rax plus an index one past its
 *    16-byte block: an invalid read of size 1, 0 bytes after the block;
 * 3. a load through rax and an index while the flags of a compare before it are live
 *    (their save borrows rax, so the address needs the guest rax reloaded): the undefined
 *    element is found, the defined flags still taken. */
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    int *q = malloc(16); /* undefined */
    q[0] = 1;
    q[1] = 2;
    q[3] = 4;
    int **pp = malloc(sizeof *pp);
    *pp = q;
    long r = 0;
    /* 1: q[2] undefined, read through rax loaded just before */
    __asm__ volatile("mov (%1), %%rax\n\t"
                     "mov 8(%%rax), %%edx\n\t"
                     "cmp $0, %%edx\n\t"
                     "je 1f\n\t"
                     "add $1, %0\n"
                     "1:\n"
                     : "+r"(r)
                     : "r"(pp)
                     : "rax", "rdx", "cc", "memory");
    /* 2: one byte past the block, through rax and an index */
    long zero = r - r;
    __asm__ volatile("mov (%1), %%rax\n\t"
                     "movzbl 16(%%rax,%2,1), %%edx\n\t"
                     "add %%rdx, %0\n"
                     : "+r"(r)
                     : "r"(pp), "r"(zero)
                     : "rax", "rdx", "cc", "memory");
    /* 3: the flags of the compare live across the load of the undefined q[2] */
    long two = zero + 2;
    __asm__ volatile("mov (%1), %%rax\n\t"
                     "cmp $2, %2\n\t"
                     "mov (%%rax,%2,4), %%edx\n\t"
                     "jne 2f\n\t"
                     "cmp $0, %%edx\n\t"
                     "je 2f\n\t"
                     "add $2, %0\n"
                     "2:\n"
                     : "+r"(r)
                     : "r"(pp), "r"(two)
                     : "rax", "rdx", "cc", "memory");
    printf("%ld\n", r > 0);
    free(q);
    free(pp);
    return 0;
}
