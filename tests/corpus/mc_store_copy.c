/* Store copies (`translate::definedness`, `Emitter::store_copy`) of registers that are
 * not all defined, into heap blocks that have V bits: the inline path zeroes the operand's
 * shadow when the register's is zero, and leaves for the out-of-line copy otherwise. Each
 * of five stores (8 bytes through rcx, which the copy borrows; 8 through rax; 4 through two
 * registers; a byte; a word) puts an undefined value once in three rounds, and a defined
 * one in the others: the branch on each value read back is one error, as by Valgrind
 * (a copy that zeroed instead would report none; one that kept the old shadow, or wrote
 * through the wrong address, would report the defined rounds too, or corrupt the program's
 * data). */
#include <stdlib.h>
#include <stdio.h>
__attribute__((noinline)) void st_rcx(long *p, long v) {
    __asm__ volatile("mov %1, %%rcx\n\tmov %0, 8(%%rcx)" :: "r"(v), "r"(p) : "rcx", "memory");
}
__attribute__((noinline)) void st_rax(long *p, long v) {
    __asm__ volatile("mov %1, %%rax\n\tmov %0, 16(%%rax)" :: "r"(v), "r"(p) : "rax", "memory");
}
__attribute__((noinline)) void st_idx(int *p, long i, int v) {
    __asm__ volatile("mov %1, %%rcx\n\tmov %0, 4(%2,%%rcx,4)" :: "r"(v), "r"(i), "r"(p) : "rcx", "memory");
}
__attribute__((noinline)) void st_b(char *p, long i, char v) {
    __asm__ volatile("mov %1, %%rcx\n\tmovb %0, (%2,%%rcx)" :: "q"(v), "r"(i), "r"(p) : "rcx", "memory");
}
__attribute__((noinline)) void st_w(short *p, short v) {
    __asm__ volatile("mov %1, %%rcx\n\tmovw %0, 2(%%rcx)" :: "r"(v), "r"(p) : "rcx", "memory");
}
int main(void) {
    long *a = malloc(64); int *b = malloc(64); char *c = malloc(64); short *d = malloc(64);
    long *u = malloc(64); /* undefined contents */
    int n = 0;
    for (int k = 0; k < 3; k++) {
        a[1] = 1; a[2] = 2; b[3] = 3; c[5] = 5; d[1] = 7;
        st_rcx(a, k == 1 ? u[0] : 11);
        st_rax(a, k == 2 ? u[1] : 12);
        st_idx(b, 2, k == 0 ? (int)u[2] : 13);
        st_b(c, 5, k == 1 ? (char)u[3] : 14);
        st_w(d, k == 2 ? (short)u[4] : 15);
        if (a[1] == 11) n++;
        if (a[2] == 12) n++;
        if (b[3] == 13) n++;
        if (c[5] == 14) n++;
        if (d[1] == 15) n++;
    }
    printf("%d\n", n);
    free(a); free(b); free(c); free(d); free(u);
    return 0;
}
