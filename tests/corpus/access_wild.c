/* Accesses to memory nothing is mapped at: Memcheck reports the invalid access before
   the SIGSEGV is delivered ("is not stack'd, malloc'd or (recently) free'd"), whether the
   program dies of it or handles it. A PROT_NONE mapping is unaddressable too; one that
   allows some access (read-only) is addressable, and a write there is no error. */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

static sigjmp_buf back;

static void on_segv(int sig) {
    (void)sig;
    siglongjmp(back, 1);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "write";
    if (!strcmp(mode, "write")) {
        int *p = (int *)0x12345678;
        *p = 42;
    } else if (!strcmp(mode, "munmap")) {
        char *m = mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        memset(m, 1, 8192);
        munmap(m, 8192);
        volatile long *q = (long *)(m + 16);
        printf("%ld\n", *q);
    } else if (!strcmp(mode, "handled")) {
        signal(SIGSEGV, on_segv);
        int caught = 0;
        for (int i = 0; i < 3; i++) {
            if (sigsetjmp(back, 1) == 0) {
                volatile char *p = (char *)0x1000 + i * 8;
                caught += *p;
            } else {
                caught++;
            }
        }
        printf("caught %d\n", caught);
    } else if (!strcmp(mode, "prot_none")) {
        char *none = mmap(0, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        signal(SIGSEGV, on_segv);
        int caught = 0;
        if (sigsetjmp(back, 1) == 0)
            caught = none[10];
        else
            caught = 1;
        printf("caught %d\n", caught);
    } else if (!strcmp(mode, "readonly")) {
        char *m = mmap(0, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        printf("%d\n", m[3]);
        m[5] = 1;
    }
    return 0;
}
