/* Flags read across a shift whose count is 0: a shift or rotate by a count that masks to 0
   leaves every flag as it was, so the flags a `cmp` set before it reach the `setb`/`setz`
   after it. The translator must not take such a shift as overwriting the flags: between
   the `cmp` and the shift come a load the tools check inline (Memcheck, DHAT, Cachegrind)
   and, in the second sequence, a jump to a new block whose first instruction is the shift
   (where an instruction counter's update would go, were the shift taken as writing them).
   Prints the same natively and under every tool. */
#include <stdio.h>
#include <stdlib.h>

static void across_a_checked_load(unsigned long a, unsigned long b, unsigned long count,
                                  const unsigned long *p) {
    unsigned char below, zero;
    unsigned long v = 5, loaded;
    __asm__ volatile("cmpq %[b], %[a]\n\t"
                     "movq 8(%[p]), %[loaded]\n\t"
                     "shlq %%cl, %[v]\n\t"
                     "setb %[below]\n\t"
                     "setz %[zero]\n\t"
                     : [below] "=&q"(below), [zero] "=&q"(zero), [loaded] "=&r"(loaded),
                       [v] "+r"(v)
                     : [a] "r"(a), [b] "r"(b), [p] "r"(p), "c"(count)
                     : "cc", "memory");
    printf("load: %lu-%lu below %d zero %d v %lu loaded %lu\n", a, b, below, zero, v, loaded);
}

static void at_a_block_start(unsigned long a, unsigned long b, unsigned long count) {
    unsigned char below, zero;
    unsigned long v = 7;
    __asm__ volatile("cmpq %[b], %[a]\n\t"
                     "jmp 1f\n\t"
                     "1:\n\t"
                     "rolq %%cl, %[v]\n\t"
                     "setb %[below]\n\t"
                     "setz %[zero]\n\t"
                     : [below] "=&q"(below), [zero] "=&q"(zero), [v] "+r"(v)
                     : [a] "r"(a), [b] "r"(b), "c"(count)
                     : "cc");
    printf("block: %lu-%lu below %d zero %d v %lu\n", a, b, below, zero, v);
}

int main(int argc, char **argv) {
    (void)argv;
    unsigned long zero_count = (unsigned long)argc - 1; /* 0, unknown to the compiler */
    unsigned long *p = malloc(8 * sizeof *p);
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned long)i;
    for (int round = 0; round < 3; round++) {
        across_a_checked_load(1, 2, zero_count, p); /* CF 1, ZF 0 */
        across_a_checked_load(2, 2, zero_count, p); /* CF 0, ZF 1 */
        across_a_checked_load(3, 2, zero_count + 64, p); /* count 64 masks to 0 */
        at_a_block_start(1, 2, zero_count);
        at_a_block_start(2, 2, zero_count);
    }
    free(p);
    return 0;
}
