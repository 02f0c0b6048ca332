/* Memcheck corpus: the memory of big freed blocks while they wait in the freed-block queue.
 * Each block is written whole (every page resident), then freed; the program prints how
 * much its resident set dropped at the free, in KiB, then reads one freed byte (an invalid
 * read, reported as Valgrind reports it).
 *
 * Natively glibc unmaps the 1 MiB block at its free (its own mapping). Under Memcheck it is
 * held back from glibc for --freelist-vol bytes of frees; its whole pages go back to the
 * kernel at the free all the same. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long resident_kib(void) {
    long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &size, &resident) != 2) abort();
    fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static void churn(size_t n, const char *name) {
    char *p = malloc(n);
    if (!p) abort();
    memset(p, 0x5a, n);
    long before = resident_kib();
    free(p);
    long after = resident_kib();
    printf("%s freed: resident dropped by %ld KiB\n", name, before - after);
}

int main(void) {
    churn(1 << 20, "1 MiB block");
    char *q = malloc(256 << 10);
    if (!q) abort();
    memset(q, 1, 256 << 10);
    free(q);
    volatile char c = q[100 << 10]; /* invalid read of a freed block */
    (void)c;
    return 0;
}
