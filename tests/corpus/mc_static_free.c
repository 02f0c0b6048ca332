/* free() of a stack and of a global address: both invalid frees. */
#include <stdlib.h>
static char global_array[16];
__attribute__((noinline)) void free_stack(void) { int local; free(&local); }
__attribute__((noinline)) void free_global(void) { free(global_array); }
int main(void) { free_stack(); free_global(); return 0; }
