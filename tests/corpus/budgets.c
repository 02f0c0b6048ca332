/* A heap with known figures, for the --max-* budget tests (crates/oxgrind/tests/budgets.rs):
 * 101 allocations; a peak of 105,000 live requested bytes (5,000 leaked first, then 100
 * blocks of 1,000 live together); 5,000 bytes definitely lost, allocated in leak_it. Nothing
 * is printed, so stdio allocates nothing. */
#include <stdlib.h>

void *volatile keep;

__attribute__((noinline)) void leak_it(void) { keep = malloc(5000); keep = 0; }
__attribute__((noinline)) void *many_small(void) { return malloc(1000); }

int main(void) {
    void *blocks[100];
    leak_it();
    for (int i = 0; i < 100; i++) blocks[i] = many_small();
    for (int i = 0; i < 100; i++) free(blocks[i]);
    return 0;
}
