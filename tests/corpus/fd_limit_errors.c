/* A Memcheck error reported while the program holds every descriptor its limit allows
   (fault_injection.rs): the symboliser must still open the objects to name the frames,
   the program's own code and libc's (whose line numbers come from a separate debug
   file), without taking a descriptor the program would have had natively. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>
static int *block;
static int cmp(const void *a, const void *b) {
    (void)a; (void)b;
    return block[4] - block[0];   /* block is freed: an invalid read under qsort */
}
int main(void) {
    /* The soft limit only: Valgrind refuses to change the hard one (EPERM). */
    struct rlimit r;
    getrlimit(RLIMIT_NOFILE, &r);
    r.rlim_cur = 16;
    setrlimit(RLIMIT_NOFILE, &r);
    int n = 0;
    while (open("/dev/null", O_RDONLY) >= 0) n++;
    block = malloc(16);
    free(block);
    int v[3] = {3, 1, 2};
    qsort(v, 3, sizeof v[0], cmp);
    printf("opened %d more\n", n);
    return 0;
}
