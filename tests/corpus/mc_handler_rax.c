/* A fault in an instruction that reads rax, between two instructions whose Memcheck inline
   checks borrow rax: the engine leaves out the second borrow's store when the guest rax is
   in its slot already (`Emitter::stub_has_rax`). The handler makes the page readable and
   changes rax in its frame, then returns to the faulting instruction, which the engine
   resumes in place: the program must go on with the handler's rax, not the one the slot
   held before the signal. Prints rax after; natively and under Valgrind: 2. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

static char *page;

static void on_segv(int sig, siginfo_t *si, void *ctx) {
    ucontext_t *uc = ctx;
    (void)sig;
    (void)si;
    mprotect(page, 4096, PROT_READ | PROT_WRITE);
    uc->uc_mcontext.gregs[REG_RAX] = 2;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, 0);
    page = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(page, 7, 4096);
    mprotect(page, 4096, PROT_NONE);
    long *heap = malloc(2 * sizeof(long));
    heap[0] = 5;
    heap[1] = 6;
    long after, second;
    __asm__ volatile("mov $1, %%eax\n\t"
                     "mov (%[h]), %%rcx\n\t"
                     /* Reads rax: its copy runs with rax given back, at a boundary. */
                     "movzbl (%[p],%%rax,1), %%ecx\n\t"
                     "mov 8(%[h]), %%rsi\n\t"
                     "mov %%rsi, %[second]\n\t"
                     "mov %%rax, %[after]\n\t"
                     "test %%rcx, %%rcx\n\t"
                     : [after] "=m"(after), [second] "=m"(second)
                     : [h] "r"(heap), [p] "r"(page)
                     : "rax", "rcx", "rsi", "cc", "memory");
    printf("second %ld rax after the handler %ld\n", second, after);
    free(heap);
    munmap(page, 4096);
    return 0;
}
