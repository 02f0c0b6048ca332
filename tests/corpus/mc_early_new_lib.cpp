// A library whose static constructor allocates with `new` and `new[]` before main (and
// before a preloaded tool's constructor: nothing depends on the tool's library), which its
// destructor frees at exit. The program it is linked into defines its own operator new and
// delete (mc_early_new_main.cpp), as gdb does: the constructor's `new` runs the program's.
#include <map>
#include <vector>

namespace {
struct Registry {
    std::map<int, std::vector<int>> entries;
    Registry() {
        for (int i = 0; i < 20; i++)
            entries[i].assign(i + 1, i);
    }
};

Registry *registry = new Registry;
int *counts = new int[7]();

struct Cleanup {
    ~Cleanup() {
        delete registry;
        delete[] counts;
    }
} cleanup;
} // namespace

extern "C" int early_sum() {
    int s = counts[3];
    for (auto &kv : registry->entries)
        s += static_cast<int>(kv.second.size());
    return s;
}
