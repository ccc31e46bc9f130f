#include "backend/cpu/vector_ops.h"

#include <algorithm>
#include <cmath>

#include "quant/kernels_ref.h"

namespace ds4::backend::cpu {

void rms_norm(const float *x, const float *w, float *y, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
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
