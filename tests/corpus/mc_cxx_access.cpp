// Memcheck corpus: invalid heap accesses made from C++ functions, the first error of the
// run. Reporting them demangles the names of the frames (libstdc++'s __cxa_demangle, which
// calls malloc, looked up with dlsym on first use) from the slow path of an access probe:
// none of those allocations may show in HEAP SUMMARY, the leak check or the errors.
#include <cstdio>
#include <string>
#include <vector>

namespace shapes {

struct Grid {
    int *cells;
    int n;
    explicit Grid(int count) : cells(new int[count]), n(count) {
        for (int i = 0; i < count; i++)
            cells[i] = i;
    }
    __attribute__((noinline)) int read_past_end() const { return cells[n]; }
    __attribute__((noinline)) void write_before_start(int v) { cells[-1] = v; }
};

template <typename T>
__attribute__((noinline)) T read_after_free(const std::vector<T *> &blocks, size_t i) {
    return *blocks[i];
}

}  // namespace shapes

int main() {
    shapes::Grid g(10);
    volatile int x = g.read_past_end();
    g.write_before_start(7);
    std::vector<long *> blocks;
    for (int i = 0; i < 4; i++)
        blocks.push_back(new long(i));
    delete blocks[2];
    volatile long y = shapes::read_after_free(blocks, 2);
    (void)x;
    (void)y;
    std::string *kept = new std::string(64, 'k');
    kept = nullptr;
    (void)kept;
    delete[] g.cells;
    for (int i = 0; i < 4; i++)
        if (i != 2)
            delete blocks[i];
    std::puts("mc_cxx_access done");
    return 0;
}
