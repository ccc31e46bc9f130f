#pragma once
// f32 activation rows for the quantizer and dot-product tests: per 32 values a random magnitude
// 10^u, u uniform in [min_exp10, max_exp10], times values uniform in [-1, 1). SplitMix64, so
// the rows are the same on every platform and standard library.
#include <cmath>
#include <cstdint>
#include <vector>

#include "quant/split_mix.h"

namespace ds4::quant::testing {

inline std::vector<float> random_activations(int64_t n, uint64_t seed, float min_exp10,
                                             float max_exp10) {
    SplitMix64 rng(seed);
    std::vector<float> x(static_cast<size_t>(n));
    float magnitude = 1.0f;
    for (int64_t i = 0; i < n; ++i) {
        if (i % 32 == 0) magnitude = std::pow(10.0f, rng.uniform(min_exp10, max_exp10));
        x[static_cast<size_t>(i)] = magnitude * rng.uniform(-1.0f, 1.0f);
    }
    return x;
}

}  // namespace ds4::quant::testing
