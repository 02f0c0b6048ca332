/* Faults in PROT_NONE memory, by how the memory lost its permissions. Valgrind's Memcheck
   holds memory unaddressable when mmap made it PROT_NONE (an invalid access, reported
   before the signal), and addressable when mprotect did after it was mapped with some
   permission (no error: only the signal). mprotect to any permission makes what was
   unaddressable addressable; mremap carries the old range's state and a grown PROT_NONE
   tail is unaddressable. Handled faults: the handler gives the faulting page read-write
   and returns, and the read is made again (Valgrind needs
   --vex-iropt-register-updates=allregs-at-mem-access to resume there). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096
static char *page;
static sigjmp_buf back;

/* Gives the faulting page read-write (only it: the others keep their state). */
static void reenable(int sig, siginfo_t *si, void *ctx) {
    (void)sig;
    (void)ctx;
    mprotect((char *)((unsigned long)si->si_addr & ~(unsigned long)(PAGE - 1)), PAGE,
             PROT_READ | PROT_WRITE);
}

static void on_segv_reenable(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = reenable;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, 0);
}

static void jump_back(int sig) {
    (void)sig;
    siglongjmp(back, 1);
}

static char *map(int prot) {
    return mmap(0, PAGE, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

/* Leaves the address of a local of the thread's. */
static void *idle(void *arg) {
    char local = 0;
    *(unsigned long *)arg = (unsigned long)&local;
    return 0;
}

static void on_segv_jump_back(void) {
    signal(SIGSEGV, jump_back);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "mprotect";
    volatile char c = 0;
    if (!strcmp(mode, "mprotect")) {
        /* Mapped read-write, then mprotect PROT_NONE: addressable to Valgrind. */
        page = map(PROT_READ | PROT_WRITE);
        page[5] = 3;
        mprotect(page, PAGE, PROT_NONE);
        on_segv_reenable();
        c = page[5];
    } else if (!strcmp(mode, "mmap")) {
        /* Mapped PROT_NONE: unaddressable, reported once, then read after the handler. */
        page = map(PROT_NONE);
        on_segv_reenable();
        c = page[5];
    } else if (!strcmp(mode, "mmap-rw")) {
        /* Mapped PROT_NONE, then mprotect read-write: addressable. */
        page = map(PROT_NONE);
        mprotect(page, PAGE, PROT_READ | PROT_WRITE);
        c = page[5];
    } else if (!strcmp(mode, "mmap-rw-none")) {
        /* Mapped PROT_NONE, read-write, PROT_NONE again: addressable since the second. */
        page = map(PROT_NONE);
        mprotect(page, PAGE, PROT_READ);
        mprotect(page, PAGE, PROT_NONE);
        on_segv_reenable();
        c = page[5];
    } else if (!strcmp(mode, "mprotect-rw")) {
        /* Read-write, PROT_NONE, read-write: no fault, no error. */
        page = map(PROT_READ | PROT_WRITE);
        mprotect(page, PAGE, PROT_NONE);
        mprotect(page, PAGE, PROT_READ | PROT_WRITE);
        c = page[5];
    } else if (!strcmp(mode, "mremap")) {
        /* Read-write then PROT_NONE, grown by mremap (moved): the first page keeps its
           state (addressable), the grown one is unaddressable. */
        char *hold = map(PROT_READ);
        page = map(PROT_READ | PROT_WRITE);
        page[1] = 1;
        mprotect(page, PAGE, PROT_NONE);
        page = mremap(page, PAGE, 2 * PAGE, MREMAP_MAYMOVE);
        munmap(hold, PAGE);
        on_segv_reenable();
        c = page[1];
        c += page[PAGE + 1];
    } else if (!strcmp(mode, "heap-page")) {
        /* A page of a big heap block (mapped by the allocator) made PROT_NONE by mprotect:
           addressable (a heap block), no error. */
        char *block;
        if (posix_memalign((void **)&block, PAGE, 64 * PAGE))
            return 1;
        page = block + 8 * PAGE;
        page[5] = 4;
        mprotect(page, PAGE, PROT_NONE);
        on_segv_reenable();
        c = page[5];
        free(block);
    } else if (!strcmp(mode, "munmap")) {
        /* Unmapped: reported, then the program dies ("Access not within mapped region"). */
        page = map(PROT_READ | PROT_WRITE);
        munmap(page, PAGE);
        c = page[5];
    } else if (!strcmp(mode, "mprotect-dies")) {
        /* No handler: no error, the program dies ("Bad permissions for mapped region"). */
        page = map(PROT_READ | PROT_WRITE);
        mprotect(page, PAGE, PROT_NONE);
        c = page[5];
    } else if (!strcmp(mode, "mmap-dies")) {
        /* No handler: reported, then the program dies ("Bad permissions"). */
        page = map(PROT_NONE);
        c = page[5];
    } else if (!strcmp(mode, "thread-guard")) {
        /* The guard page below a thread's stack (glibc maps the stack PROT_NONE and gives
           all but the guard read-write): unaddressable in both. Found from
           /proc/self/maps, read without malloc: the mapping right below the one holding
           a local of the thread's. */
        pthread_t t;
        unsigned long local = 0;
        pthread_create(&t, 0, idle, &local);
        pthread_join(t, 0);
        static char maps[1 << 16];
        int fd = open("/proc/self/maps", O_RDONLY);
        size_t n = 0;
        ssize_t got;
        while (fd >= 0 && n < sizeof maps - 1 &&
               (got = read(fd, maps + n, sizeof maps - 1 - n)) > 0)
            n += got;
        maps[n] = 0;
        unsigned long lo, hi, guard = 0, prev_hi = 0;
        char perms[5];
        for (char *line = maps; line && *line;
             line = strchr(line, '\n') ? strchr(line, '\n') + 1 : 0) {
            if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) != 3)
                break;
            if (lo <= local && local < hi && prev_hi == lo)
                guard = lo;
            prev_hi = hi;
        }
        on_segv_jump_back();
        if (guard && sigsetjmp(back, 1) == 0)
            c = ((volatile char *)guard)[-10];
        printf("guard %s\n", guard ? "read" : "none");
        c = 0;
    }
    printf("%s: read %d\n", mode, c);
    return 0;
}
