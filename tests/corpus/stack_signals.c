/* Signal handlers on the main stack and on an alternate stack (sigaltstack), then a
 * recursion 100 calls deep (528-byte frames with gcc -O1) left with longjmp: under
 * --stacks=yes the handlers' frames must not be lost when their stack is switched to. */
#include <signal.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static jmp_buf jb;
static volatile int hits;
static void h(int s) { volatile char b[3000]; memset((char*)b, s, sizeof b); hits += b[5]; }
__attribute__((noinline)) static void deep(int n) { volatile char b[500]; b[0] = n; if (n) deep(n - 1); else longjmp(jb, 1); }
int main(void) {
  stack_t ss = { .ss_sp = malloc(65536), .ss_size = 65536 };
  sigaltstack(&ss, 0);
  struct sigaction sa = { .sa_handler = h, .sa_flags = SA_ONSTACK };
  sigaction(SIGUSR1, &sa, 0);
  struct sigaction sb = { .sa_handler = h };
  sigaction(SIGUSR2, &sb, 0);
  for (int i = 0; i < 5; i++) { raise(SIGUSR1); raise(SIGUSR2); }
  if (!setjmp(jb)) deep(100);
  printf("sig done %d\n", hits != 0);
  return 0;
}
