// MXFP4 (OCP microscaling): blocks of 32 E2M1 values sharing one E8M0 exponent.
// value = e2m1 * 2^(e-127), computed as (2 * e2m1) * 2^(e-128) so the table stays integral.
#include <bit>

#include "quant/blocks.h"
#include "quant/kernels_ref.h"

namespace ds4::quant::ref {

const int8_t kMxfp4DoubledValues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float e8m0_to_f32_half(uint8_t e) {
    // 2^(e-128): for e >= 2 a normal f32 with biased exponent e-1; below that a subnormal,
    // 2^-128 = 0x00200000 and 2^-127 = 0x00400000.
    const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
    return std::bit_cast<float>(bits);
}

void dequantize_row_mxfp4(const void *src, float *dst, int64_t n) {
    const auto *blocks = static_cast<const BlockMXFP4 *>(src);
    constexpr int kHalf = kQK_MXFP4 / 2;
    for (int64_t b = 0; b < n / kQK_MXFP4; ++b) {
        const float d = e8m0_to_f32_half(blocks[b].e);
        float *y = dst + b * kQK_MXFP4;
        for (int j = 0; j < kHalf; ++j) {
            y[j] = kMxfp4DoubledValues[blocks[b].qs[j] & 0x0f] * d;
            y[j + kHalf] = kMxfp4DoubledValues[blocks[b].qs[j] >> 4] * d;
        }
    }
}

// y = sum over blocks of (f16(d_x) * 2^(e-128)) * sum_j table[code_j] * q_x[j]
float vec_dot_mxfp4_q8_0(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockMXFP4 *>(w);
    const auto *xb = static_cast<const BlockQ8_0 *>(x);
    constexpr int kHalf = kQK_MXFP4 / 2;
    static_assert(kQK_MXFP4 == kQK8_0);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / kQK_MXFP4; ++b) {
        int32_t sumi = 0;
        for (int j = 0; j < kHalf; ++j) {
            sumi += kMxfp4DoubledValues[wb[b].qs[j] & 0x0f] * xb[b].qs[j];
            sumi += kMxfp4DoubledValues[wb[b].qs[j] >> 4] * xb[b].qs[j + kHalf];
        }
        sum += f16_to_f32(xb[b].d) * e8m0_to_f32_half(wb[b].e) * static_cast<float>(sumi);
    }
    return sum;
}

}  // namespace ds4::quant::ref
