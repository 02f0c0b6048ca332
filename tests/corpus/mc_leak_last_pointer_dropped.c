/* The only pointer to a block is overwritten in main just before it returns: Valgrind says
 * "definitely lost". The copies of the address that our allocator hook's own code left on
 * the program's stack (below main, where exit()'s frames later run) must not keep it
 * reachable: the leak scan at exit starts where the process began to end, as Valgrind's
 * does at its exit_group. Also an uninitialised condition, as a first error. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int x;
    (void)argv;
    char *p = malloc(100);
    p[0] = 1;
    if (argc > 5)
        x = 1;
    if (x)
        puts("x");
    p = 0;
    return 0;
}
