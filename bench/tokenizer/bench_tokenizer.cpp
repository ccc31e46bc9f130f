// Encode throughput of the tokenizer on one core: ds4-bench-tokenizer VOCAB.gguf TEXT [REPEAT]
//
// Encodes the whole file as plain text REPEAT times (after one warm-up run) and prints one JSON
// line: bytes, tokens, best and median seconds, MB/s at the best time (1 MB = 1e6 bytes), and
// the FNV-1a hash of the ids (as little-endian u32) so a runner can check the ids it compares.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/error.h"
#include "tokenizer/tokenizer.h"

namespace {

uint64_t fnv1a_ids(const std::vector<int32_t> &ids) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int32_t id : ids) {
        for (int shift = 0; shift < 32; shift += 8) {
            h ^= (static_cast<uint32_t>(id) >> shift) & 0xFF;
            h *= 0x100000001b3ull;
        }
    }
    return h;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s VOCAB.gguf TEXT [REPEAT]\n", argv[0]);
        return 2;
    }
    const int repeat = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
    try {
        const auto tok = ds4::tokenizer::Tokenizer::from_gguf(argv[1]);
        std::ifstream in(argv[2], std::ios::binary);
        if (!in) throw ds4::Error(fmt::format("cannot read {}", argv[2]));
        const std::string text((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());

        std::vector<int32_t> ids = tok.encode(text);  // warm-up
        std::vector<double> seconds;
        for (int r = 0; r < repeat; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            ids = tok.encode(text);
            const auto t1 = std::chrono::steady_clock::now();
            seconds.push_back(std::chrono::duration<double>(t1 - t0).count());
        }
        std::sort(seconds.begin(), seconds.end());
        fmt::print(
            "{{\"bytes\": {}, \"tokens\": {}, \"best_s\": {:.6f}, \"median_s\": {:.6f}, "
            "\"mb_per_s\": {:.3f}, \"ids_fnv1a\": \"{:016x}\"}}\n",
            text.size(), ids.size(), seconds.front(), seconds[seconds.size() / 2],
            text.size() / seconds.front() / 1e6, fnv1a_ids(ids));
    } catch (const ds4::Error &e) {
        std::fprintf(stderr, "ds4-bench-tokenizer: %s\n", e.what());
        return 1;
    }
    return 0;
}
