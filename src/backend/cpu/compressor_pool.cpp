#include "backend/cpu/compressor_pool.h"

#include <cmath>
#include <cstddef>

namespace ds4::backend::cpu {

void compressor_pool(const float *kv, const float *score, uint32_t ratio, bool overlap, uint32_t d,
                     uint32_t width, float *pooled) {
    const uint32_t r = ratio, n = overlap ? 2 * r : r;
    for (uint32_t j = 0; j < d; ++j) {
        // Candidate i: row i at column j, or (overlap, i >= r) row i at column d + j.
        const auto at = [&](uint32_t i) {
            return size_t(i) * width + (overlap && i >= r ? d + j : j);
        };
        // std::max_element's value: the first candidate, replaced by each later larger one.
        float mx = score[at(0)];
        for (uint32_t i = 1; i < n; ++i)
            if (mx < score[at(i)]) mx = score[at(i)];
        if (mx == -INFINITY) {
            pooled[j] = 0.0f;
            continue;
        }
        float den = 0.0f, num = 0.0f;
        for (uint32_t i = 0; i < n; ++i) {
            const float e = std::exp(score[at(i)] - mx);
            den += e;
            num += e * kv[at(i)];
        }
        pooled[j] = num / den;
    }
}

}  // namespace ds4::backend::cpu
