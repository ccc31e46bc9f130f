// Q8_K: the activation format of the K-quant and IQ2 dot products. Blocks of 256 int8 values
// with an f32 scale and the sums of each 16 values (bsums), which fold the K-quant mins into
// one multiply per sub-block.
#include <cmath>

#include "quant/blocks.h"
#include "quant/kernels_ref.h"

namespace ds4::quant::ref {

void dequantize_row_q8_K(const void *src, float *dst, int64_t n) {
    const auto *blocks = static_cast<const BlockQ8_K *>(src);
    for (int64_t b = 0; b < n / kQK_K; ++b)
        for (int i = 0; i < kQK_K; ++i) dst[b * kQK_K + i] = blocks[b].d * blocks[b].qs[i];
}

void quantize_row_q8_K(const float *src, void *dst, int64_t n) {
    auto *blocks = static_cast<BlockQ8_K *>(dst);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float *x = src + b * kQK_K;
        BlockQ8_K &out = blocks[b];
        // the first element of largest magnitude, with its sign
        float amax = 0.0f, vmax = 0.0f;
        for (int i = 0; i < kQK_K; ++i) {
            if (std::fabs(x[i]) > amax) {
                amax = std::fabs(x[i]);
                vmax = x[i];
            }
        }
        if (amax == 0.0f) {
            out = BlockQ8_K{};
            continue;
        }
        // iscale maps vmax to -127, so every |q| <= 127 up to rounding
        const float iscale = -127.0f / vmax;
        for (int i = 0; i < kQK_K; ++i) {
            const long q = std::lrint(iscale * x[i]);  // round half to even
            out.qs[i] = static_cast<int8_t>(q < -128 ? -128 : (q > 127 ? 127 : q));
        }
        for (int k = 0; k < kQK_K / 16; ++k) {
            int sum = 0;
            for (int i = 0; i < 16; ++i) sum += out.qs[16 * k + i];
            out.bsums[k] = static_cast<int16_t>(sum);
        }
        out.d = 1.0f / iscale;
    }
}

}  // namespace ds4::quant::ref
