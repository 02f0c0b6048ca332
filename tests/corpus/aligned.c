// Massif accounting of aligned allocations (issue 11): memalign, posix_memalign and
// aligned_alloc at several alignments, interleaved with plain blocks and frees, so Valgrind's
// allocator splits blocks and refills holes; the slop Massif counts depends on the
// alignment asked for, not on the address glibc returned.
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>

static void *keep[64];

int main(void) {
  int n = 0;
  size_t aligns[] = {16, 32, 64, 128, 256, 1024, 4096};
  for (int round = 0; round < 3; round++) {
    for (unsigned i = 0; i < sizeof aligns / sizeof *aligns; i++) {
      size_t a = aligns[i];
      keep[n++] = memalign(a, 100 + 37 * i + round);
      void *p = NULL;
      if (posix_memalign(&p, a, 1000 + 11 * i) == 0) keep[n++] = p;
      keep[n++] = aligned_alloc(a, a * (1 + round));
      void *tmp = malloc(300 + i);
      free(keep[n - 3]);
      keep[n - 3] = tmp;
    }
  }
  for (int i = 0; i < n; i += 2) free(keep[i]);
  printf("%d blocks\n", n);
  return 0;
}
