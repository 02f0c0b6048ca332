// A program that defines its own operator new and delete. Memcheck replaces them, as it
// replaces libstdc++'s: the program's definitions never run ("calls 0"), `new[]` then
// `free` is a mismatch, and the leak's stack starts at Valgrind's operator new.
#include <cstdio>
#include <cstdlib>
#include <new>

static int calls;

void *operator new(std::size_t n) {
  calls++;
  void *p = std::malloc(n);
  if (!p) throw std::bad_alloc();
  return p;
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }

int main() {
  int *a = new int[4];
  int *b = new int(3);
  delete b;
  free(a);
  int *c = new int(5);
  (void)c;
  std::printf("calls %d\n", calls);
  return 0;
}
