// Uninitialised values in C++ as programs make them, one case per argument, for the
// definedness differential test (memcheck_definedness.rs): a member a constructor forgot,
// an element of `new[]` never written, a value carried through a thrown exception, an
// uninitialised int printed through iostreams (errors inside libstdc++), and a clean case
// that uses the same paths with every value set.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>

struct Config {
    int verbose;
    int level;  // the constructor forgets this one
    explicit Config(int v) : verbose(v) {}
};

struct Failure : std::runtime_error {
    int code;
    explicit Failure(int c) : std::runtime_error("failure"), code(c) {}
};

__attribute__((noinline)) static void fail(int code) { throw Failure(code); }

__attribute__((noinline)) static int sum(const int *a, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += a[i];
    return s;
}

int main(int argc, char **argv) {
    std::string what = argc > 1 ? argv[1] : "clean";
    if (what == "member") {
        Config *c = new Config(1);
        if (c->level > 2) std::puts("high");
        else std::puts("low");
        delete c;
    } else if (what == "new-array") {
        int *a = new int[8];
        for (int i = 0; i < 7; i++) a[i] = i;  // a[7] never written
        if (sum(a, 8) > 100) std::puts("big");
        else std::puts("small");
        delete[] a;
    } else if (what == "exception") {
        int code;  // never set
        try {
            fail(code);
        } catch (const Failure &f) {
            if (f.code == 3) std::puts("three");
            else std::puts("other");
        }
    } else if (what == "iostream") {
        int *n = new int;
        std::cout << "n=" << *n << std::endl;
        delete n;
    } else {
        Config *c = new Config(1);
        c->level = 4;
        int *a = new int[8];
        for (int i = 0; i < 8; i++) a[i] = i;
        int code = 3;
        try {
            fail(code);
        } catch (const Failure &f) {
            std::cout << "clean " << c->level << " " << sum(a, 8) << " " << f.code << std::endl;
        }
        delete[] a;
        delete c;
    }
    return 0;
}
