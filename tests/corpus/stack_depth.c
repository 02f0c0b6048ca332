/* A known stack depth for Massif's --stacks=yes: a recursion DEPTH calls deep whose frames
 * hold a 1000-byte buffer each, then a shallow phase, and a little heap. The deepest point is
 * about DEPTH * (1000 + frame overhead) bytes below main's frame. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEPTH 2000

char *volatile heap;

__attribute__((noinline)) static long recurse(int n, volatile char *parent) {
    volatile char buf[1000];
    memset((char *)buf, n, sizeof buf);
    if (parent)
        buf[0] ^= parent[1];
    if (n == 0)
        return buf[10];
    return recurse(n - 1, buf) + buf[n % 1000];
}

int main(int argc, char **argv) {
    (void)argv;
    heap = malloc(100000);
    memset(heap, 1, 100000);
    long r = recurse(DEPTH + argc - 1, NULL);
    free(heap);
    r += recurse(10, NULL);
    printf("stack depth done %ld\n", r & 1);
    return 0;
}
