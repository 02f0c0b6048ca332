// C++ containers and exceptions: maps, strings, vectors, and a thousand throws caught.
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

static int thrower(int i) {
    if (i % 3 == 0) throw std::runtime_error("multiple of three: " + std::to_string(i));
    return i;
}

int main() {
    std::map<std::string, std::vector<int>> m;
    for (int i = 0; i < 20000; i++) m["key" + std::to_string(i % 500)].push_back(i);
    long caught = 0, sum = 0;
    for (int i = 0; i < 1000; i++) {
        try { sum += thrower(i); } catch (const std::exception &e) { caught += e.what()[0] == 'm'; }
    }
    auto big = std::make_unique<int[]>(100000);
    big[99999] = 7;
    std::vector<std::string> words;
    for (int i = 0; i < 10000; i++) words.emplace_back(std::string(i % 64, 'x'));
    std::printf("keys=%zu caught=%ld sum=%ld last=%d words=%zu\n", m.size(), caught, sum, big[99999], words.size());
    return 0;
}
