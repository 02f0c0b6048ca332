/* A daemon's start: close every descriptor (stderr included), with close(), close_range()
 * and closefrom(), then leak. The report must still reach the user. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <unistd.h>
#include <linux/close_range.h>

void *volatile leaked;

int main(void) {
    for (int fd = 0; fd < 1024; fd++) close(fd);
    close_range(3, ~0U, 0);
    closefrom(0);
    leaked = malloc(77);
    leaked = 0;
    return 0;
}
