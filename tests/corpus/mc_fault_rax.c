/* A fault in an instruction that does not use rax, right after one with a memory operand:
   Memcheck's inline checks of the two may keep rax borrowed across the first one's copy
   (the engine's `Emitter::carry_borrow`), so the engine must show the program's rax to the
   handler, and the program must have it back when the handler resumes it.
   Then a fault in a load into rax itself, which reads no rax: its inline checks' borrow of
   rax ends at its copy without giving rax back (`Emitter::carry_borrow`, `overwrites_rax`),
   so the handler must again see the program's rax, and the program have it after.
   Prints what the handler saw and what rax held after; Valgrind prints the same. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

static volatile long seen_rax;

static void on_segv(int sig, siginfo_t *si, void *ctx) {
    ucontext_t *uc = ctx;
    (void)sig;
    (void)si;
    seen_rax = uc->uc_mcontext.gregs[REG_RAX];
    uc->uc_mcontext.gregs[REG_RIP] += 3; /* skip the faulting `mov rcx, [rdx]` (48 8b 0a) */
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, 0);
    long *heap = malloc(2 * sizeof(long));
    heap[0] = 5;
    heap[1] = 6;
    long first, second, after;
    __asm__ volatile("movabs $0x1234567887654321, %%rax\n\t"
                     "mov (%[h]), %%rcx\n\t"
                     "mov 8(%[h]), %%rsi\n\t"
                     "mov (%[bad]), %%rcx\n\t"
                     "mov %%rax, %[after]\n\t"
                     "mov %%rsi, %[second]\n\t"
                     "mov (%[h]), %%rcx\n\t"
                     "mov %%rcx, %[first]\n\t"
                     /* Overwrites every flag: the flags are dead above, so the inline
                        parts borrow rax alone and may carry it. */
                     "test %%rcx, %%rcx\n\t"
                     : [after] "=m"(after), [first] "=m"(first), [second] "=m"(second)
                     : [h] "r"(heap), [bad] "d"(8L)
                     : "rax", "rcx", "rsi", "cc", "memory");
    long seen_first = seen_rax, loaded;
    __asm__ volatile("movabs $0x1122334455667788, %%rax\n\t"
                     "mov (%[bad]), %%rax\n\t" /* 48 8b 02: skipped by the handler */
                     "mov %%rax, %[loaded]\n\t"
                     "test %%rax, %%rax\n\t"
                     : [loaded] "=m"(loaded)
                     : [bad] "d"(8L)
                     : "rax", "cc", "memory");
    printf("first %ld second %ld rax in handler %lx after %lx; load into rax: handler %lx "
           "after %lx\n",
           first, second, seen_first, after, seen_rax, loaded);
    free(heap);
    return 0;
}
