/* Memcheck's leak-check client requests in the middle of a run: a full search, the
 * ADDED and CHANGED delta forms after more leaks and after freeing some, the quick
 * (summary) form, and COUNT_LEAKS / COUNT_LEAK_BLOCKS printed to stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <valgrind/memcheck.h>

struct node { struct node *next; char pad[24]; };

static void *keep[8];   /* reachable blocks */
static void *lost;      /* overwritten to lose */

static void counts(const char *when)
{
    unsigned long leaked = 0, dubious = 0, reachable = 0, suppressed = 0;
    VALGRIND_COUNT_LEAKS(leaked, dubious, reachable, suppressed);
    printf("%s bytes: leaked %lu dubious %lu reachable %lu suppressed %lu\n",
           when, leaked, dubious, reachable, suppressed);
    VALGRIND_COUNT_LEAK_BLOCKS(leaked, dubious, reachable, suppressed);
    printf("%s blocks: leaked %lu dubious %lu reachable %lu suppressed %lu\n",
           when, leaked, dubious, reachable, suppressed);
}

__attribute__((noinline)) static void leak_some(int n, size_t size)
{
    for (int i = 0; i < n; i++) {
        lost = malloc(size);
        lost = 0;
    }
}

__attribute__((noinline)) static void leak_chain(void)
{
    struct node *a = malloc(sizeof *a);
    a->next = malloc(sizeof *a);
    a->next->next = 0;
    a = 0;
}

__attribute__((noinline)) static void *interior(void)
{
    char *p = malloc(40);
    return p + 8;
}

int main(void)
{
    counts("before");
    keep[0] = malloc(100);
    keep[1] = malloc(200);
    leak_some(2, 16);
    leak_chain();
    keep[2] = interior();
    VALGRIND_DO_LEAK_CHECK;
    counts("first");

    leak_some(3, 16);
    leak_some(1, 64);
    keep[3] = malloc(300);
    VALGRIND_DO_ADDED_LEAK_CHECK;
    counts("added");

    free(keep[1]);
    keep[1] = 0;
    free(keep[2] - 8);
    keep[2] = 0;
    VALGRIND_DO_CHANGED_LEAK_CHECK;
    counts("changed");

    VALGRIND_DO_ADDED_LEAK_CHECK;
    leak_some(1, 8);
    VALGRIND_DO_QUICK_LEAK_CHECK;
    counts("quick");
    return 0;
}
