// Q2_K (docs/MODEL.md 5.2): super-blocks of 256 values in 16 sub-blocks of 16. Each sub-block has a
// 4-bit scale and a 4-bit min against the f16 super-scales d and dmin:
//   value = d * sc_k * q - dmin * m_k,  q in 0..3.
// Quant byte l of each 128-value half holds values l, l+32, l+64, l+96 of that half (2 bits
// each, lowest first); sub-block k covers 16 consecutive values.
#include <algorithm>
#include <cmath>

#include "quant/blocks.h"
#include "quant/kernels_ref.h"
#include "quant/kquant_fit.h"

namespace ds4::quant::ref {

void dequantize_row_q2_K(const void *src, float *dst, int64_t n) {
    const auto *blocks = static_cast<const BlockQ2_K *>(src);
    float *y = dst;
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float d = f16_to_f32(blocks[b].d);
        const float dmin = f16_to_f32(blocks[b].dmin);
        int k = 0;  // sub-block
        for (int half = 0; half < 2; ++half) {
            const uint8_t *q = blocks[b].qs + 32 * half;
            for (int shift = 0; shift < 8; shift += 2) {
                for (int part = 0; part < 2; ++part, ++k) {
                    const uint8_t sc = blocks[b].scales[k];
                    const float dl = d * (sc & 0xf);
                    const float ml = dmin * (sc >> 4);
                    for (int l = 0; l < 16; ++l) *y++ = dl * ((q[16 * part + l] >> shift) & 3) - ml;
                }
            }
        }
    }
}

void quantize_row_q2_K(const float *src, void *dst, int64_t n) {
    auto *blocks = static_cast<BlockQ2_K *>(dst);
    constexpr int kSub = kQK_K / 16;
    // levels 0..3; 16 candidate inverse scales from (3 - 0.5) to (3 + 1.0) over the range,
    // absolute error weighted by |x|
    constexpr KQuantFitParams kFit{3, -0.5f, 0.1f, 15, true};
    constexpr float kMaxSubScale = 15.0f;  // 4-bit sub-scales and sub-mins
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float *x = src + b * kQK_K;
        BlockQ2_K &out = blocks[b];
        uint8_t L[kQK_K];
        uint8_t scratch[16];
        float weights[16];
        float scales[kSub];
        float mins[kSub];
        float max_scale = 0;  // scales and mins are >= 0 by construction
        float max_min = 0;
        for (int k = 0; k < kSub; ++k) {
            for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * k + l]);
            scales[k] =
                fit_scale_and_min(16, x + 16 * k, weights, kFit, L + 16 * k, &mins[k], scratch);
            if (scales[k] > max_scale) max_scale = scales[k];
            if (mins[k] > max_min) max_min = mins[k];
        }

        // 4-bit sub-scales relative to d = max_scale / 15, sub-mins relative to dmin
        for (int k = 0; k < kSub; ++k) out.scales[k] = 0;
        out.d = f32_to_f16(0.0f);
        out.dmin = f32_to_f16(0.0f);
        if (max_scale > 0) {
            const float iscale = kMaxSubScale / max_scale;
            for (int k = 0; k < kSub; ++k)
                out.scales[k] =
                    static_cast<uint8_t>(std::clamp(nearest_int(iscale * scales[k]), 0, 15));
            out.d = f32_to_f16(max_scale / kMaxSubScale);
        }
        if (max_min > 0) {
            const float iscale = kMaxSubScale / max_min;
            for (int k = 0; k < kSub; ++k)
                out.scales[k] |=
                    static_cast<uint8_t>(std::clamp(nearest_int(iscale * mins[k]), 0, 15) << 4);
            out.dmin = f32_to_f16(max_min / kMaxSubScale);
        }

        // re-quantize every value against the scales as stored
        for (int k = 0; k < kSub; ++k) {
            const float d = f16_to_f32(out.d) * (out.scales[k] & 0xf);
            if (d == 0) continue;  // every value of this sub-block decodes to -dm
            const float dm = f16_to_f32(out.dmin) * (out.scales[k] >> 4);
            for (int l = 0; l < 16; ++l)
                L[16 * k + l] =
                    static_cast<uint8_t>(std::clamp(nearest_int((x[16 * k + l] + dm) / d), 0, 3));
        }

        for (int half = 0; half < 2; ++half)
            for (int l = 0; l < 32; ++l) {
                const uint8_t *v = L + 128 * half + l;
                out.qs[32 * half + l] =
                    static_cast<uint8_t>(v[0] | (v[32] << 2) | (v[64] << 4) | (v[96] << 6));
            }
    }
}

// y = sum over blocks of dy*d * sum_k sc_k * (sum_{l in k} q_l * qy_l)
//                     - dy*dmin * sum_k m_k * bsums[k]
float vec_dot_q2_K_q8_K(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockQ2_K *>(w);
    const auto *xb = static_cast<const BlockQ8_K *>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const uint8_t *scales = wb[b].scales;
        int32_t min_sum = 0;
        for (int k = 0; k < kQK_K / 16; ++k) min_sum += xb[b].bsums[k] * (scales[k] >> 4);

        int32_t scaled_sum = 0;
        int k = 0;
        const int8_t *qy = xb[b].qs;
        for (int half = 0; half < 2; ++half) {
            const uint8_t *q = wb[b].qs + 32 * half;
            for (int shift = 0; shift < 8; shift += 2) {
                for (int part = 0; part < 2; ++part, ++k) {
                    int32_t sub_sum = 0;
                    for (int l = 0; l < 16; ++l)
                        sub_sum += qy[l] * ((q[16 * part + l] >> shift) & 3);
                    scaled_sum += (scales[k] & 0xf) * sub_sum;
                    qy += 16;
                }
            }
        }
        const float dall = xb[b].d * f16_to_f32(wb[b].d);
        const float dmin = xb[b].d * f16_to_f32(wb[b].dmin);
        sum += dall * static_cast<float>(scaled_sum) - dmin * static_cast<float>(min_sum);
    }
    return sum;
}

}  // namespace ds4::quant::ref
