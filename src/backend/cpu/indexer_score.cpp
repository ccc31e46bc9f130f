#include "backend/cpu/indexer_score.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "common/error.h"

namespace ds4::backend::cpu {

void indexer_scores(const float *q, const float *w, float wscale, const float *rows,
                    uint32_t n_rows, uint32_t n_heads, uint32_t head_dim, float *score) {
    std::vector<float> ws(n_heads);
    for (uint32_t h = 0; h < n_heads; ++h) ws[h] = w[h] * wscale;
    for (uint32_t c = 0; c < n_rows; ++c) {
        const float *k = rows + size_t(c) * head_dim;
        float acc = 0.0f;
        for (uint32_t h = 0; h < n_heads; ++h) {
            const float *qh = q + size_t(h) * head_dim;
            float dot = 0.0f;
            for (uint32_t j = 0; j < head_dim; ++j) dot += qh[j] * k[j];
            acc += std::max(dot, 0.0f) * ws[h];
        }
        score[c] = acc;
    }
}

void top_k_ascending(const float *score, uint32_t n, uint32_t k, uint32_t *out) {
    if (k > n) throw ds4::Error("top_k_ascending: k is larger than the number of scores");
    std::vector<uint32_t> all(n);
    std::iota(all.begin(), all.end(), 0u);
    std::partial_sort(all.begin(), all.begin() + k, all.end(), [&](uint32_t a, uint32_t b) {
        return score[a] > score[b] || (score[a] == score[b] && a < b);
    });
    std::sort(all.begin(), all.begin() + k);
    std::copy(all.begin(), all.begin() + k, out);
}

}  // namespace ds4::backend::cpu
