// Massif accounting of the aligned forms of operator new (issue 11): alignas types above
// 16 bytes, single and array, throwing and nothrow, interleaved with plain new and deletes.
#include <cstdio>
#include <new>
#include <vector>

struct alignas(64) A64 { char b[200]; };
struct alignas(32) A32 { char b[40]; };
struct alignas(256) A256 { char b[300]; };

int main() {
  std::vector<void *> keep;
  for (int r = 0; r < 3; r++) {
    A64 *a = new A64;
    A32 *b = new A32[5];
    A256 *c = new A256;
    A64 *d = new (std::nothrow) A64[2];
    int *plain = new int[30 + r];
    delete[] b;
    keep.push_back(a);
    keep.push_back(c);
    keep.push_back(d);
    keep.push_back(plain);
  }
  std::printf("%zu\n", keep.size());
  return 0;
}
