// containers: the C++ standard library's containers under churn.
//
// Why: C++ programs allocate through operator new, in many small nodes (std::map,
// std::unordered_map) and growing buffers (std::vector, std::string), with deep inlined
// call stacks. Each round fills a map of string keys to vectors, a hash map of ints to
// strings and a vector of strings, sorts, looks up and erases, and keeps only a bounded
// window of entries alive.
//
// Usage: containers ROUNDS
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

int main(int argc, char **argv) {
    long rounds = argc > 1 ? std::atol(argv[1]) : 100;
    std::map<std::string, std::vector<int>> index;
    std::unordered_map<int, std::string> names;
    std::uint64_t checksum = 0;
    std::uint64_t s = 88172645463325252ull;
    for (long r = 0; r < rounds; r++) {
        std::vector<std::string> words;
        for (int i = 0; i < 1000; i++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            std::string w = "word-" + std::to_string(s % 5000) + "-" + std::to_string(i % 7);
            index[w].push_back(i);
            names[static_cast<int>(s % 20000)] = w + w;
            words.push_back(std::move(w));
        }
        std::sort(words.begin(), words.end());
        words.erase(std::unique(words.begin(), words.end()), words.end());
        for (const auto &w : words) {
            auto it = index.find(w);
            if (it != index.end()) checksum += it->second.size();
        }
        // keep the live set bounded: drop every key that sorts into the lower half
        if (index.size() > 8000) {
            auto mid = index.begin();
            std::advance(mid, index.size() / 2);
            index.erase(index.begin(), mid);
        }
        if (names.size() > 8000) {
            for (auto it = names.begin(); it != names.end();) {
                if (it->first % 2 == r % 2) it = names.erase(it); else ++it;
            }
        }
        checksum += words.size();
    }
    std::printf("containers rounds=%ld checksum=%llu\n", rounds,
                static_cast<unsigned long long>(checksum));
    return 0;
}
