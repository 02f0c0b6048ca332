/* Moves that use rax between checked loads and stores while the flags are live: Memcheck's
   inline checks keep rax and the flags borrowed over them, giving only rax back around
   each such copy (the engine's `definedness::flags_carry_past`). One of them faults
   (`mov rdi, [rax]` with rax = 8): the handler must see the program's rax and flags, and
   the program must have both back after, with what the other moves read and wrote.
   Prints what the handler saw and the results; natively the same. */
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
    uc->uc_mcontext.gregs[REG_RIP] += 3; /* skip the faulting `mov rdi, [rax]` (48 8b 38) */
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
    heap[3] = 0;
    long first, stored, loaded, moved, cf, sf, zf, of;
    __asm__ volatile("mov $8, %%eax\n\t"
                     "mov $5, %%ecx\n\t"
                     "cmp $7, %%ecx\n\t"
                     "mov (%[h]), %%rcx\n\t"
                     "mov (%%rax), %%rdi\n\t"
                     "mov %%rax, 24(%[h])\n\t"
                     "lea 1(%%rax), %%rax\n\t"
                     "mov 8(%[h]), %%rsi\n\t"
                     "mov %%rax, %%r8\n\t"
                     "mov 16(%[h]), %%rax\n\t"
                     "mov 24(%[h]), %%rdi\n\t"
                     "mov %%rax, %[loaded]\n\t"
                     "mov %%rdi, %[stored]\n\t"
                     "mov %%r8, %[moved]\n\t"
                     "mov %%rcx, %[first]\n\t"
                     "setb %%r9b\n\t"
                     "sets %%r10b\n\t"
                     "setz %%r11b\n\t"
                     "seto %%dl\n\t"
                     "movzbq %%r9b, %%r9\n\t"
                     "movzbq %%r10b, %%r10\n\t"
                     "movzbq %%r11b, %%r11\n\t"
                     "movzbq %%dl, %%rdx\n\t"
                     "mov %%r9, %[cf]\n\t"
                     "mov %%r10, %[sf]\n\t"
                     "mov %%r11, %[zf]\n\t"
                     "mov %%rdx, %[of]\n\t"
                     : [first] "=m"(first), [stored] "=m"(stored), [loaded] "=m"(loaded),
                       [moved] "=m"(moved), [cf] "=m"(cf), [sf] "=m"(sf), [zf] "=m"(zf),
                       [of] "=m"(of)
                     : [h] "b"(heap)
                     : "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "cc",
                       "memory");
    printf("first %ld stored %ld loaded %ld moved %ld rax in handler %lx flags in handler %lx "
           "cf %ld sf %ld zf %ld of %ld\n",
           first, stored, loaded, moved, seen_rax, seen_flags, cf, sf, zf, of);
    free(heap);
    return 0;
}
