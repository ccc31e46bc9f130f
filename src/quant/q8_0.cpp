// Q8_0: blocks of 32 int8 values with one f16 scale. value_i = d * q_i.
#include <climits>
#include <cmath>

#include "quant/blocks.h"
#include "quant/kernels_ref.h"

namespace ds4::quant::ref {
namespace {

float block_amax(const float *x) {
    float amax = 0.0f;
    for (int i = 0; i < kQK8_0; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    return amax;
}

// x86's cvtps2dq in the default rounding mode: nearest, ties to even; NaN and values outside
// int32 give INT_MIN (the "integer indefinite"), as the SIMD twins see it.
int32_t cvt_nearest_even_x86(float v) {
    if (!(v >= -2147483648.0f && v < 2147483648.0f)) return INT_MIN;
    return static_cast<int32_t>(std::nearbyint(v));
}

int8_t clamp_to_int8(int32_t q) {
    return static_cast<int8_t>(q < -128 ? -128 : q > 127 ? 127 : q);
}

}  // namespace

void dequantize_row_q8_0(const void *src, float *dst, int64_t n) {
    const auto *blocks = static_cast<const BlockQ8_0 *>(src);
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
        const float d = f16_to_f32(blocks[b].d);
        for (int i = 0; i < kQK8_0; ++i) dst[b * kQK8_0 + i] = blocks[b].qs[i] * d;
    }
}

void quantize_row_q8_0(const float *src, void *dst, int64_t n) {
    auto *blocks = static_cast<BlockQ8_0 *>(dst);
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
        const float *x = src + b * kQK8_0;
        const float d = block_amax(x) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        blocks[b].d = f32_to_f16(d);
        for (int i = 0; i < kQK8_0; ++i) {
            float q = std::round(x[i] * id);  // half away from zero, as ggml's roundf
            // |x * id| <= 127 up to rounding; the clamp only matters when 1/d overflows
            // (amax below ~4e-37), where x * id is inf or NaN.
            if (!(q >= -128.0f)) q = (q < 0.0f) ? -128.0f : 0.0f;
            if (q > 127.0f) q = 127.0f;
            blocks[b].qs[i] = static_cast<int8_t>(q);
        }
    }
}

void quantize_row_q8_0_activation(const float *src, void *dst, int64_t n) {
    auto *blocks = static_cast<BlockQ8_0 *>(dst);
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
        const float *x = src + b * kQK8_0;
        const float d = block_amax(x) / 127.0f;
        blocks[b].d = f32_to_f16(d);
        for (int i = 0; i < kQK8_0; ++i)
            blocks[b].qs[i] = d == 0.0f ? 0 : clamp_to_int8(cvt_nearest_even_x86(x[i] / d));
    }
}

void quantize_row_q8_0_llamacpp(const float *src, void *dst, int64_t n) {
    auto *blocks = static_cast<BlockQ8_0 *>(dst);
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
        const float *x = src + b * kQK8_0;
        const float amax = block_amax(x);
        blocks[b].d = f32_to_f16(amax / 127.0f);
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int i = 0; i < kQK8_0; ++i)
            blocks[b].qs[i] = clamp_to_int8(cvt_nearest_even_x86(x[i] * id));
    }
}

// y = sum over blocks of f16(d_w) * f16(d_x) * (sum_i q_w[i] * q_x[i]), in one fixed order that
// every SIMD twin follows bit for bit (docs/MODEL.md 5.1): block b's exact integer sum s_b gives
// the term float(s_b) * (d_w * d_x), two roundings; the term is added to chain b mod 16 (the
// chains start at +0); then chain l takes chain l + 8, l + 4, l + 2 and l + 1 in turn, and chain 0
// is the result. Sixteen chains let one register hold them (a single row's blocks in lanes) and a
// block's term be one lane of a register whose other lanes are other weight rows (the multi-row
// kernels), with no more float work than one product and one addition per block.
float vec_dot_q8_0_q8_0(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockQ8_0 *>(w);
    const auto *xb = static_cast<const BlockQ8_0 *>(x);
    float chains[kQ8_0Chains] = {};
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
        int32_t sumi = 0;
        for (int i = 0; i < kQK8_0; ++i) sumi += wb[b].qs[i] * xb[b].qs[i];
        const float term = static_cast<float>(sumi) * (f16_to_f32(wb[b].d) * f16_to_f32(xb[b].d));
        chains[b % kQ8_0Chains] = chains[b % kQ8_0Chains] + term;
    }
    for (int half = kQ8_0Chains / 2; half >= 1; half /= 2)
        for (int l = 0; l < half; ++l) chains[l] = chains[l] + chains[l + half];
    return chains[0];
}

}  // namespace ds4::quant::ref
