/* The client requests Valgrind's core answers for every tool: RUNNING_ON_VALGRIND,
 * VALGRIND_PRINTF and VALGRIND_PRINTF_BACKTRACE, VALGRIND_STACK_REGISTER/CHANGE/DEREGISTER.
 * Natively each is a no-op answering 0. */
#include <stdio.h>
#include <valgrind/valgrind.h>

static char coroutine_stack[16384];

static void report(void) {
  VALGRIND_PRINTF_BACKTRACE("backtrace from %s\n", "report");
}

int main(void) {
  printf("running on valgrind: %d\n", (int)RUNNING_ON_VALGRIND);
  fflush(stdout);
  int n = VALGRIND_PRINTF("hello %d %s %5.2f|%-4x|%lu|%c%%\n", 42, "str", 3.14159, 255,
                          123456789012UL, 'z');
  VALGRIND_PRINTF("two\nlines\n");
  report();
  unsigned a = VALGRIND_STACK_REGISTER(coroutine_stack, coroutine_stack + sizeof coroutine_stack);
  unsigned b = VALGRIND_STACK_REGISTER(coroutine_stack, coroutine_stack + 1024);
  VALGRIND_STACK_CHANGE(b, coroutine_stack, coroutine_stack + 2048);
  VALGRIND_STACK_DEREGISTER(a);
  VALGRIND_STACK_DEREGISTER(b);
  printf("printed %d, stacks %u %u\n", n, a, b);
  return 0;
}
