/* Address descriptions of memory outside the heap and the stack, as Memcheck words them
   when an access there is an error (here made one with VALGRIND_MAKE_MEM_NOACCESS): a data
   symbol, an anonymous mapping, a mapped file, the brk data segment. */
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
#include <valgrind/memcheck.h>

int arr[10];
static char sbuf[64];

int main(void) {
    volatile int *p = arr;
    VALGRIND_MAKE_MEM_NOACCESS(arr, sizeof arr);
    int s = p[1];
    VALGRIND_MAKE_MEM_DEFINED(arr, sizeof arr);
    volatile char *a = mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    VALGRIND_MAKE_MEM_NOACCESS(a, 8192);
    s += a[100];
    int fd = open("/etc/passwd", O_RDONLY);
    volatile char *f = mmap(0, 4096, PROT_READ, MAP_PRIVATE, fd, 0);
    VALGRIND_MAKE_MEM_NOACCESS(f, 4096);
    s += f[10];
    volatile char *b = sbrk(4096);
    VALGRIND_MAKE_MEM_NOACCESS(b, 4096);
    s += b[8];
    volatile char *sb = sbuf;
    VALGRIND_MAKE_MEM_NOACCESS(sbuf, 64);
    s += sb[3];
    printf("%d\n", s & 0);
    return 0;
}
