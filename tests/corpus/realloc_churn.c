/* Realloc-heavy and fragmenting allocation patterns with a known sequence, for comparing
 * Massif's numbers with Valgrind's: buffers grown and shrunk by realloc (in place and
 * moved), strings of odd sizes freed in an interleaved order so that later requests are
 * served from split or unsplit free blocks, calloc blocks among them. */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

static void *slots[512];

int main(void) {
    /* A growing buffer, doubled and then trimmed, as a vector or string builder does. */
    char *buf = NULL;
    size_t cap = 0;
    for (int i = 0; i < 200; i++) {
        size_t want = 24 + (size_t)i * 37;
        if (want > cap) {
            cap = cap ? cap * 2 : 32;
            while (cap < want) cap *= 2;
            buf = realloc(buf, cap);
        }
        memset(buf, i, want);
        if (i % 50 == 49) {
            cap = want;
            buf = realloc(buf, cap); /* shrink to fit: stays in place under Valgrind */
        }
    }
    /* Odd sizes, freed every other one, then refilled with slightly smaller requests. */
    for (int i = 0; i < 512; i++)
        slots[i] = malloc(8 + (i * 13) % 200);
    for (int i = 0; i < 512; i += 2) {
        free(slots[i]);
        slots[i] = NULL;
    }
    for (int i = 0; i < 512; i += 2)
        slots[i] = (i % 6 == 0) ? calloc(1, 4 + (i * 7) % 180) : malloc(4 + (i * 7) % 180);
    /* Reallocs of fragmented blocks, up and down. */
    for (int round = 0; round < 4; round++)
        for (int i = round; i < 512; i += 3)
            slots[i] = realloc(slots[i], round % 2 ? 16 + (i % 40) : 60 + (i * 11) % 300);
    for (int i = 1; i < 512; i += 2) {
        free(slots[i]);
        slots[i] = NULL;
    }
    for (int i = 1; i < 512; i += 4)
        slots[i] = malloc(40);
    for (int i = 0; i < 512; i++)
        free(slots[i]);
    buf = realloc(buf, 100000); /* moved: bigger than what is usable */
    free(buf);
    printf("realloc churn done\n");
    return 0;
}
