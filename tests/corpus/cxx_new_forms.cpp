// Every operator new / delete form: plain, array, nothrow, aligned, aligned nothrow, sized.
// All pairs match, so Memcheck reports no error; one aligned block stays reachable.
#include <cstdio>
#include <cstdint>
#include <new>

struct alignas(64) Wide { char bytes[200]; };

void *volatile leaked;

int main() {
    int *a = new int(1);
    delete a;
    int *b = new int[10];
    delete[] b;
    int *c = new (std::nothrow) int(2);
    delete c;
    int *d = new (std::nothrow) int[5];
    delete[] d;
    Wide *w = new Wide;                       // operator new(size_t, align_val_t)
    bool aligned = (reinterpret_cast<std::uintptr_t>(w) % 64) == 0;
    delete w;                                 // sized aligned delete
    Wide *ws = new Wide[3];
    delete[] ws;
    Wide *wn = new (std::nothrow) Wide;
    delete wn;
    void *raw = ::operator new(100, std::align_val_t(128));
    aligned = aligned && (reinterpret_cast<std::uintptr_t>(raw) % 128) == 0;
    ::operator delete(raw, std::align_val_t(128));
    leaked = new Wide;
    std::printf("aligned=%d\n", aligned);
    return 0;
}
