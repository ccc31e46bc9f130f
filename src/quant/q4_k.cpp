// Q4_K (docs/MODEL.md 5.3): super-blocks of 256 values in 8 sub-blocks of 32. Each sub-block has a
// 6-bit scale and a 6-bit min against the f16 super-scales d and dmin:
//   value = d * sc_j * q - dmin * m_j,  q in 0..15.
// Sub-blocks 2i and 2i+1 share the 32 bytes qs[32i ..]: low nibbles, then high nibbles.
#include <algorithm>
#include <cmath>

#include "quant/blocks.h"
#include "quant/kernels_ref.h"
#include "quant/kquant_fit.h"

namespace ds4::quant::ref {
namespace {

constexpr int kSub = kQK_K / 32;

// The 12 scale bytes hold 8 six-bit (scale, min) pairs:
//   bytes 0..3: scale j (low 6 bits) | top 2 bits of scale j+4
//   bytes 4..7: min j   (low 6 bits) | top 2 bits of min j+4
//   bytes 8..11: low 4 bits of scale j+4 | low 4 bits of min j+4 << 4
struct ScaleMin {
    uint8_t scale;
    uint8_t min;
};

ScaleMin get_scale_min(int j, const uint8_t *s) {
    if (j < 4) return {static_cast<uint8_t>(s[j] & 63), static_cast<uint8_t>(s[j + 4] & 63)};
    return {static_cast<uint8_t>((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4)),
            static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4))};
}

void put_scale_min(int j, uint8_t scale, uint8_t min, uint8_t *s) {
    if (j < 4) {
        s[j] = scale;
        s[j + 4] = min;
    } else {
        s[j + 4] = static_cast<uint8_t>((scale & 0xf) | ((min & 0xf) << 4));
        s[j - 4] |= static_cast<uint8_t>((scale >> 4) << 6);
        s[j] |= static_cast<uint8_t>((min >> 4) << 6);
    }
}

}  // namespace

void dequantize_row_q4_K(const void *src, float *dst, int64_t n) {
    const auto *blocks = static_cast<const BlockQ4_K *>(src);
    float *y = dst;
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float d = f16_to_f32(blocks[b].d);
        const float dmin = f16_to_f32(blocks[b].dmin);
        for (int j = 0; j < kSub; ++j) {
            const ScaleMin sm = get_scale_min(j, blocks[b].scales);
            const float dl = d * sm.scale;
            const float ml = dmin * sm.min;
            const uint8_t *q = blocks[b].qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; ++l) *y++ = dl * ((q[l] >> shift) & 0xf) - ml;
        }
    }
}

void quantize_row_q4_K(const float *src, void *dst, int64_t n) {
    auto *blocks = static_cast<BlockQ4_K *>(dst);
    // levels 0..15; 21 candidate inverse scales from (15 - 1.0) to (15 + 1.0) over the range,
    // squared error weighted by rms(sub-block) + |x|
    constexpr KQuantFitParams kFit{15, -1.0f, 0.1f, 20, false};
    constexpr float kMaxSubScale = 63.0f;  // 6-bit sub-scales and sub-mins
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float *x = src + b * kQK_K;
        BlockQ4_K &out = blocks[b];
        uint8_t L[kQK_K];
        uint8_t scratch[32];
        float weights[32];
        float scales[kSub];
        float mins[kSub];
        float max_scale = 0;  // scales and mins are >= 0 by construction
        float max_min = 0;
        for (int j = 0; j < kSub; ++j) {
            const float *xs = x + 32 * j;
            float sum_x2 = 0;
            for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
            const float rms = std::sqrt(sum_x2 / 32);
            for (int l = 0; l < 32; ++l) weights[l] = rms + std::fabs(xs[l]);
            scales[j] = fit_scale_and_min(32, xs, weights, kFit, L + 32 * j, &mins[j], scratch);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }

        // 6-bit sub-scales relative to d = max_scale / 63, sub-mins relative to dmin
        const float inv_scale = max_scale > 0 ? kMaxSubScale / max_scale : 0.0f;
        const float inv_min = max_min > 0 ? kMaxSubScale / max_min : 0.0f;
        for (int j = 0; j < kSub; ++j) {
            const auto ls =
                static_cast<uint8_t>(std::clamp(nearest_int(inv_scale * scales[j]), 0, 63));
            const auto lm = static_cast<uint8_t>(std::clamp(nearest_int(inv_min * mins[j]), 0, 63));
            put_scale_min(j, ls, lm, out.scales);
        }
        out.d = f32_to_f16(max_scale / kMaxSubScale);
        out.dmin = f32_to_f16(max_min / kMaxSubScale);

        // re-quantize every value against the scales as stored
        for (int j = 0; j < kSub; ++j) {
            const ScaleMin sm = get_scale_min(j, out.scales);
            const float d = f16_to_f32(out.d) * sm.scale;
            if (d == 0) continue;  // every value of this sub-block decodes to -dm
            const float dm = f16_to_f32(out.dmin) * sm.min;
            for (int l = 0; l < 32; ++l)
                L[32 * j + l] =
                    static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + l] + dm) / d), 0, 15));
        }

        for (int i = 0; i < kSub / 2; ++i)
            for (int l = 0; l < 32; ++l)
                out.qs[32 * i + l] =
                    static_cast<uint8_t>(L[64 * i + l] | (L[64 * i + 32 + l] << 4));
    }
}

// y = sum over blocks of dy*d * sum_j sc_j * (sum_{l in j} q_l * qy_l)
//                     - dy*dmin * sum_j m_j * (bsums[2j] + bsums[2j+1])
float vec_dot_q4_K_q8_K(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockQ4_K *>(w);
    const auto *xb = static_cast<const BlockQ8_K *>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        int32_t scaled_sum = 0;
        int32_t min_sum = 0;
        for (int j = 0; j < kSub; ++j) {
            const ScaleMin sm = get_scale_min(j, wb[b].scales);
            const uint8_t *q = wb[b].qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            const int8_t *qy = xb[b].qs + 32 * j;
            int32_t sub_sum = 0;
            for (int l = 0; l < 32; ++l) sub_sum += ((q[l] >> shift) & 0xf) * qy[l];
            scaled_sum += sm.scale * sub_sum;
            min_sum += sm.min * (xb[b].bsums[2 * j] + xb[b].bsums[2 * j + 1]);
        }
        const float dall = xb[b].d * f16_to_f32(wb[b].d);
        const float dmin = xb[b].d * f16_to_f32(wb[b].dmin);
        sum += dall * static_cast<float>(scaled_sum) - dmin * static_cast<float>(min_sum);
    }
    return sum;
}

}  // namespace ds4::quant::ref
