/* The flags' shadow across instructions of one block: an instruction that overwrites every
 * flag (cmp) leaves its zeroing of the shadow out when the next one to touch a flag
 * overwrites them again, with only flag-free instructions between. A compare of undefined
 * memory must still reach a branch after a flag-free move (an error), a defined compare
 * after it must make the branch clean, and an undefined compare after a defined one must
 * be caught. Two errors, as Valgrind. */
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    long *p = malloc(16); /* undefined */
    long r = 0, k = 5;
    /* cmp with undefined memory, a flag-free move, then a branch: an error */
    __asm__ volatile("cmp %2, %1\n\tmov %3, %0\n\tjne 1f\n\tadd $1, %0\n1:\n"
                     : "+r"(r)
                     : "r"(k), "m"(p[0]), "r"(k)
                     : "cc");
    /* cmp with undefined memory, a move, a defined cmp, then a branch: clean */
    __asm__ volatile("cmp %2, %1\n\tmov %3, %0\n\tcmp %1, %3\n\tjne 1f\n\tadd $1, %0\n1:\n"
                     : "+r"(r)
                     : "r"(k), "m"(p[1]), "r"(k)
                     : "cc");
    /* a defined cmp, a move, cmp with undefined memory, then a branch: an error */
    __asm__ volatile("cmp %1, %3\n\tmov %3, %0\n\tcmp %2, %1\n\tjne 1f\n\tadd $1, %0\n1:\n"
                     : "+r"(r)
                     : "r"(k), "m"(p[0]), "r"(k)
                     : "cc");
    printf("%ld\n", r);
    free(p);
    return 0;
}
