/* trivial: the probe used to find which oxgrind tools work. It allocates, frees and
 * prints one known line; a tool "works" if the run exits 0 and that line comes out. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    char *p = malloc(64);
    if (!p) return 1;
    strcpy(p, "oxgrind-bench-probe-ok");
    puts(p);
    free(p);
    return 0;
}
