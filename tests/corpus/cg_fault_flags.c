/* A fault in an instruction that touches neither rax nor the flags, between two with memory
   operands, while the flags are live: Cachegrind's recent-lines checks of the two, and
   Memcheck's inline checks, keep rax and the flags borrowed across the first one's copy
   (the engine's `Emitter::carry_flags`),
   so the engine must show the program's rax and flags to the handler, and the program must
   have them back when the handler resumes it. Prints what the handler saw and the flags
   after; natively the same. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

static volatile long seen_rax, seen_flags;

static void on_segv(int sig, siginfo_t *si, void *ctx) {
    ucontext_t *uc = ctx;
    (void)sig;
    (void)si;
    seen_rax = uc->uc_mcontext.gregs[REG_RAX];
    seen_flags = uc->uc_mcontext.gregs[REG_EFL] & 0x8D5;
    uc->uc_mcontext.gregs[REG_RIP] += 3; /* skip the faulting `mov rdi, [rdx]` (48 8b 3a) */
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, 0);
    long *heap = malloc(4 * sizeof(long));
    heap[0] = 5;
    heap[1] = 6;
    heap[2] = 7;
    long first, second, after, cf, sf, zf;
    __asm__ volatile("movabs $0x1234567887654321, %%rax\n\t"
                     "mov $5, %%ecx\n\t"
                     "cmp $7, %%ecx\n\t"
                     "mov (%[h]), %%rcx\n\t"
                     "mov (%[bad]), %%rdi\n\t"
                     "mov 8(%[h]), %%rsi\n\t"
                     "mov 16(%[h]), %%r8\n\t"
                     "mov %%rax, %[after]\n\t"
                     "mov %%rsi, %[second]\n\t"
                     "mov %%rcx, %[first]\n\t"
                     "setb %%r9b\n\t"
                     "sets %%r10b\n\t"
                     "setz %%r11b\n\t"
                     "movzbq %%r9b, %%r9\n\t"
                     "movzbq %%r10b, %%r10\n\t"
                     "movzbq %%r11b, %%r11\n\t"
                     "mov %%r9, %[cf]\n\t"
                     "mov %%r10, %[sf]\n\t"
                     "mov %%r11, %[zf]\n\t"
                     : [after] "=m"(after), [first] "=m"(first), [second] "=m"(second),
                       [cf] "=m"(cf), [sf] "=m"(sf), [zf] "=m"(zf)
                     : [h] "r"(heap), [bad] "d"(8L)
                     : "rax", "rcx", "rsi", "rdi", "r8", "r9", "r10", "r11", "cc", "memory");
    printf("first %ld second %ld rax in handler %lx after %lx flags in handler %lx cf %ld sf %ld zf %ld\n",
           first, second, seen_rax, after, seen_flags, cf, sf, zf);
    free(heap);
    return 0;
}
