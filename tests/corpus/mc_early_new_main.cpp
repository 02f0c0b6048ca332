// A program with its own operator new and delete (each its own function: a `new[]` that
// tail-calls `new` leaves no trace of which one the caller used), linked with
// mc_early_new_lib.cpp, whose constructor allocates through them before main.
#include <cstdio>
#include <cstdlib>
#include <new>

void *operator new(std::size_t n) {
    void *p = std::malloc(n ? n : 1);
    if (!p)
        throw std::bad_alloc();
    return p;
}
void *operator new[](std::size_t n) {
    void *p = std::malloc(n ? n : 1);
    if (!p)
        throw std::bad_alloc();
    return p;
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete[](void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }
void operator delete[](void *p, std::size_t) noexcept { std::free(p); }

extern "C" int early_sum();

int main() {
    std::printf("sum %d\n", early_sum());
    int *later = new int[3]();
    delete[] later;
    return 0;
}
