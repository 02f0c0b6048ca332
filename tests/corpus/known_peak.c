/* A heap whose peak is known by construction: 14,000 live requested bytes.
 * Phase 1: ten blocks of 1,000 (10,000 live). Phase 2: free five (5,000). Phase 3: three
 * blocks of 3,000 (14,000: the peak). Phase 4: free everything. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) void *thousand(void) { return malloc(1000); }
__attribute__((noinline)) void *three_thousand(void) { return malloc(3000); }

int main(void) {
    void *a[10], *b[3];
    for (int i = 0; i < 10; i++) a[i] = thousand();
    for (int i = 0; i < 10; i += 2) free(a[i]);
    for (int i = 0; i < 3; i++) b[i] = three_thousand();
    for (int i = 1; i < 10; i += 2) free(a[i]);
    for (int i = 0; i < 3; i++) free(b[i]);
    puts("done");
    return 0;
}
