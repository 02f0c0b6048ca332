/* A block leaves out the inline check of a register or of the flags an earlier
 * instruction of it already proved defined (`translate::definedness::Proofs`); when an
 * instruction whose fast path such a proof relies on goes slow, the block leaves through
 * a side exit, and the later uses are checked again. Each use below of an undefined
 * register is reported, as by Valgrind (5 errors):
 * 1. an undefined index used by two loads in a row (the second's check is left out in the
 *    block: proven by the first instruction that read it; scaled differently, so that
 *    Valgrind, which reports one address expression once per superblock, reports both);
 * 2. a defined index proven, then an undefined one read by an instruction in between that
 *    goes slow, then both used (the defined one's check left out);
 * 3. a register proven, overwritten by a load of undefined bytes, then used: the load
 *    kills the proof;
 * 4. a register written by an instruction that goes slow (its other operand undefined,
 *    the result undefined), then written again with a constant: that write's
 *    zeroing of the shadow is left out (proven zero by the first one's fast path), so the
 *    first must leave the block; the register, branched on in the next block, is defined
 *    (no error). */
#include <stdio.h>
#include <stdlib.h>

static long buf[64];

int main(int argc, char **argv) {
    (void)argv;
    long *p = malloc(64); /* undefined */
    long r = 0;
    long defined = argc - 1; /* 0 */
    /* 1: rax undefined (p[1] & 7), used as an index twice */
    __asm__ volatile("mov 8(%2), %%rax\n\t"
                     "add $0, %%rcx\n\t"
                     "and $7, %%rax\n\t"
                     "mov (%1,%%rax,8), %%rdx\n\t"
                     "add 8(%1,%%rax,4), %%rdx\n\t"
                     "add %%rdx, %0\n\t"
                     : "+r"(r)
                     : "r"(buf), "r"(p)
                     : "rax", "rcx", "rdx", "cc", "memory");
    /* 2: rcx defined and proven by the first load; rax undefined, made so in the block;
     *    the second load uses both (rcx's check left out, rax's made) */
    __asm__ volatile("mov %3, %%rcx\n\t"
                     "mov (%1,%%rcx,8), %%rdx\n\t"
                     "mov 16(%2), %%rax\n\t"
                     "and $3, %%rax\n\t"
                     "add %%rcx, %%rdx\n\t"
                     "add 8(%1,%%rax,8), %%rdx\n\t"
                     "add 16(%1,%%rax,4), %%rdx\n\t"
                     "add %%rdx, %0\n\t"
                     : "+r"(r)
                     : "r"(buf), "r"(p), "r"(defined)
                     : "rax", "rcx", "rdx", "cc", "memory");
    /* 3: rcx proven, then loaded with undefined bytes and used as an index */
    __asm__ volatile("mov %3, %%rcx\n\t"
                     "mov (%1,%%rcx,8), %%rdx\n\t"
                     "mov 24(%2), %%rcx\n\t"
                     "and $7, %%rcx\n\t"
                     "add (%1,%%rcx,8), %%rdx\n\t"
                     "add %%rdx, %0\n\t"
                     : "+r"(r)
                     : "r"(buf), "r"(p), "r"(defined)
                     : "rcx", "rdx", "cc", "memory");
    /* 4: rax = 1 + p[4] (undefined, never used), then rax = 0, tested in the block after
     *    the jne (its first instruction checks rax); nothing else in the block relies on
     *    the add's fast path */
    __asm__ volatile("mov 32(%1), %%rdx\n\t"
                     "mov $1, %%eax\n\t"
                     "add %%rdx, %%rax\n\t"
                     "mov $0, %%eax\n\t"
                     "test %2, %2\n\t"
                     "jne 1f\n\t"
                     "test %%rax, %%rax\n\t"
                     "jne 1f\n\t"
                     "add $1, %0\n"
                     "1:\n\t"
                     : "+r"(r)
                     : "r"(p), "r"(defined)
                     : "rax", "rdx", "cc", "memory");
    printf("%ld\n", r);
    free(p);
    return 0;
}
