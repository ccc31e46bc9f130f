#include "backend/cpu/vector_ops.h"

#include <algorithm>
#include <cmath>

#include "quant/kernels_ref.h"

namespace ds4::backend::cpu {

double sum_of_squares(const float *x, int64_t n) {
    // Each square is exact in double (24-bit significands); lane j sums x[i]^2 for i = j mod 16
    // over the whole groups of 16 in order, the lanes are added pairwise (j + 8 into j, then
    // j + 4, ...), then the tail in order. Every lane's chain is sequential, so the compiler may
    // hold the 16 sums in vectors of any width (or in scalars) and the bits stay the same; a
    // single chain took ~4 cycles an element (16,384 of them in each hyper-connection norm).
    constexpr int kLanes = 16;
    double acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; ++j) acc[j] += double(x[i + j]) * double(x[i + j]);
    for (int width = kLanes / 2; width > 0; width /= 2)
        for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
    double ss = acc[0];
    for (; i < n; ++i) ss += double(x[i]) * double(x[i]);
    return ss;
}

void rms_norm(const float *x, const float *w, float *y, int64_t n, float eps) {
    const double ss = sum_of_squares(x, n);
    const float scale = static_cast<float>(1.0 / std::sqrt(ss / double(n) + double(eps)));
    if (w) {
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
    } else {
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale;
    }
}

float sigmoid(float z) {
    return 1.0f / (1.0f + std::exp(-z));
}
float silu(float x) {
    return x * sigmoid(x);
}

float softplus(float z) {
    if (z > 20.0f) return z;
    if (z < -20.0f) return std::exp(z);
    return std::log1p(std::exp(z));
}

void swiglu_clamped(float *g, const float *u, int64_t n, float clamp, float weight) {
    const bool on = clamp > 1e-6f;
    for (int64_t i = 0; i < n; ++i) {
        const float gi = on ? std::min(g[i], clamp) : g[i];
        const float ui = on ? std::clamp(u[i], -clamp, clamp) : u[i];
        g[i] = silu(gi) * ui * weight;
    }
}

float round_to_f16(float x) {
    return quant::ref::f16_to_f32(quant::ref::f32_to_f16(x));
}

}  // namespace ds4::backend::cpu
