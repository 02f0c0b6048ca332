/* System-call buffers that are undefined, unaddressable, or both: Memcheck reports one
 * error per parameter, decided by the buffer's first bad byte (is_mem_defined). One case
 * per run, named by argv[1]. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>

static int devnull(void) { return open("/dev/null", O_WRONLY); }

__attribute__((noinline)) static void stack_buffer(int fd) {
    char b[16];
    b[0] = 'a';
    write(fd, b, sizeof b); /* bytes 1..15 undefined, on this frame */
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "";
    int fd = devnull();
    char *p = malloc(10);
    if (!strcmp(c, "undefined_then_unaddressable")) {
        p[0] = 1;
        write(fd, p, 14); /* byte 1 undefined comes first */
    } else if (!strcmp(c, "unaddressable_then_undefined")) {
        write(fd, p - 4, 8); /* the block's leading redzone comes first */
    } else if (!strcmp(c, "undefined_heap")) {
        memset(p, 'x', 6);
        write(fd, p, 10);
    } else if (!strcmp(c, "stack")) {
        stack_buffer(fd);
    } else if (!strcmp(c, "defined")) {
        memset(p, 'x', 10);
        write(fd, p, 10);
    }
    free(p);
    close(fd);
    return 0;
}
