// Lowers its address-space limit to argv[1] MiB (0: keeps the limit it was started with),
// then fills it with 16-byte blocks until malloc fails (never_lose_the_report.rs: our own
// data must not come out of that limit, and the report must still be written).
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
int main(int argc, char **argv) {
  long limit_mib = argc > 1 ? atol(argv[1]) : 512;
  struct rlimit r = {(rlim_t)limit_mib << 20, (rlim_t)limit_mib << 20};
  if (limit_mib > 0 && setrlimit(RLIMIT_AS, &r) != 0) { perror("setrlimit"); return 2; }
  long n = 0;
  for (;;) {
    void *p = malloc(16);
    if (!p) {
      if (errno != ENOMEM) return 3; /* as natively: a refused allocation says why */
      break;
    }
    n++;
  }
  printf("malloc failed after %ld blocks\n", n);
  return 0;
}
