// A library whose constructor allocates with malloc, calloc and realloc before main (and
// before a preloaded tool's constructor: nothing depends on the tool's library), and whose
// destructor frees at exit. The program it is linked into defines its own malloc family
// (mc_own_malloc.c): the constructor's calls run the program's allocator.
#include <stdlib.h>

static int *numbers;
static char *name;
static long *table;

__attribute__((constructor)) static void fill(void) {
    numbers = malloc(7 * sizeof *numbers);
    for (int i = 0; i < 7; i++)
        numbers[i] = i;
    name = calloc(1, 16);
    table = realloc(NULL, 4 * sizeof *table);
    table = realloc(table, 8 * sizeof *table);
    for (int i = 0; i < 8; i++)
        table[i] = i;
}

__attribute__((destructor)) static void empty(void) {
    table = realloc(table, 2 * sizeof *table);
    free(table);
    free(name);
    free(numbers);
}

int early_sum(void) {
    return numbers[3] + (int)table[7] + name[0];
}
