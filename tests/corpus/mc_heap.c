/* Memcheck corpus: every leak kind and every allocator misuse that needs no translation.
 * Deterministic: no uninitialised reads, no out-of-bounds accesses. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <malloc.h>

struct node { struct node *next; char pad[24]; };

void *global_reachable;
static char *interior_only;

__attribute__((noinline)) void leak_definite(void) { char *volatile p = malloc(100); p[0] = 1; }

__attribute__((noinline)) void leak_chain(void) {
    /* head -> a -> b: head definitely lost, a and b indirectly lost */
    struct node *b = calloc(1, sizeof *b);
    struct node *a = calloc(1, sizeof *a);
    struct node *head = calloc(1, sizeof *head);
    a->next = b;
    head->next = a;
}

__attribute__((noinline)) void leak_cycle(void) {
    struct node *x = malloc(sizeof *x), *y = malloc(sizeof *y);
    x->next = y;
    y->next = x;
}

__attribute__((noinline)) void leak_possible(void) { char *p = malloc(64); interior_only = p + 10; }

__attribute__((noinline)) void keep_reachable(void) { global_reachable = malloc(33); }

__attribute__((noinline)) void bad_frees(void) {
    char *p = malloc(10);
    free(p);
    free(p);                       /* double free */
    char *q = malloc(20);
    free(q + 4);                   /* interior pointer */
    free(q);
    char *r = malloc(8);
    free(r);
    r = realloc(r, 16);            /* realloc of a freed block */
}

__attribute__((noinline)) void fishy(void) {
    void *volatile p = malloc((size_t)-5);
    void *volatile q = realloc(NULL, (size_t)-7);
    void *volatile m = memalign(16, (size_t)-9);
    (void)p; (void)q; (void)m;
}

int main(void) {
    leak_definite();
    leak_chain();
    leak_cycle();
    leak_possible();
    keep_reachable();
    bad_frees();
    fishy();
    puts("mc_heap done");
    return 0;
}
