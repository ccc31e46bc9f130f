#include "model_boundaries.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace ds4::tools {

Boundaries model_boundaries(const model::HParams &hp) {
    std::set<size_t> points;
    std::vector<std::string> parts;
    const size_t W = hp.sliding_window;
    points.insert(W);
    parts.push_back(fmt::format("window {}", W));

    const std::set<uint32_t> ratios(hp.compress_ratio.begin(), hp.compress_ratio.end());
    for (uint32_t r : ratios) {
        if (r == 0) continue;
        for (size_t k = 1; k <= 3; ++k) points.insert(k * r);
        parts.push_back(fmt::format("ratio {} rows 1-3 ({},{},{})", r, r, 2 * r, 3 * r));
    }
    // Below this length the indexer keeps every compressed row; from it on it chooses top-k.
    if (ratios.count(model::kOverlapRatio) && hp.idx_top_k > 0) {
        const size_t start = size_t(model::kOverlapRatio) * (hp.idx_top_k + 1);
        points.insert(start);
        parts.push_back(fmt::format("indexer start {}", start));
    }
    Boundaries b;
    // Odd small chunks split every boundary; the window and 4x the window are the sizes a
    // chunk boundary meets a window boundary at.
    b.chunks = {3, uint32_t(W), uint32_t(4 * W)};
    for (uint32_t c : b.chunks) points.insert(c);
    parts.push_back(fmt::format("chunks {},{},{}", b.chunks[0], b.chunks[1], b.chunks[2]));

    std::set<size_t> lengths;
    for (size_t p : points)
        for (size_t l : {p - 1, p, p + 1})
            if (l >= 1) lengths.insert(l);
    b.lengths.assign(lengths.begin(), lengths.end());
    b.chunks.push_back(uint32_t(b.max_length()));  // the whole prompt in one batch
    std::sort(b.chunks.begin(), b.chunks.end());
    b.chunks.erase(std::unique(b.chunks.begin(), b.chunks.end()), b.chunks.end());
    for (const auto &p : parts) b.description += (b.description.empty() ? "" : ", ") + p;
    return b;
}

std::vector<int32_t> spread_tokens(size_t n, uint32_t n_vocab, uint32_t salt) {
    std::vector<int32_t> t(n);
    for (size_t i = 0; i < n; ++i)
        t[i] = static_cast<int32_t>((uint64_t(i) * 7919 + 104729ull * salt + 17) % n_vocab);
    return t;
}

}  // namespace ds4::tools
