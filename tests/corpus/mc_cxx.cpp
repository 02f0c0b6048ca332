// Memcheck corpus: mismatched allocation and deallocation families, and C++ leaks.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

struct Widget { std::vector<int> v; std::string name; };

__attribute__((noinline)) static void mismatches() {
    int *a = new int[10];
    delete a;                       // new[] then delete
    int *b = new int;
    delete[] b;                     // new then delete[]
    char *c = (char *)std::malloc(5);
    delete c;                       // malloc then delete
    int *d = new int(3);
    std::free(d);                   // new then free
}

__attribute__((noinline)) static Widget *leak_widget() {
    Widget *w = new Widget;
    w->v.resize(100);
    w->name = std::string(40, 'w');
    return w;
}

int main() {
    mismatches();
    Widget *lost = leak_widget();
    lost = nullptr;
    (void)lost;
    std::puts("mc_cxx done");
    return 0;
}
