// IQ2_XXS (docs/MODEL.md 5.4): 2.0625 bits per value. Each group of 32 values is four 8-value grid
// points (one byte index each), four 7-bit sign patterns and a 4-bit scale, packed in 8 bytes.
#include <cstring>

#include "quant/blocks.h"
#include "quant/iq2_tables.h"
#include "quant/kernels_ref.h"

namespace ds4::quant::ref {
namespace {

// The two little-endian u32 words of group g: grid indices, then signs and scale.
struct Iq2Group {
    uint32_t grid_indices;  // byte l = grid index of values 8l .. 8l+7
    uint32_t signs_scale;   // bits 7l .. 7l+6: sign pattern l; bits 28..31: scale ls
};

Iq2Group read_group(const BlockIQ2_XXS &block, int g) {
    Iq2Group group;
    std::memcpy(&group.grid_indices, &block.qs[4 * g], 4);
    std::memcpy(&group.signs_scale, &block.qs[4 * g + 2], 4);
    return group;
}

uint8_t grid_index(const Iq2Group &group, int l) {
    return (group.grid_indices >> (8 * l)) & 0xff;
}
uint8_t sign_pattern(const Iq2Group &group, int l) {
    return kIq2Signs[(group.signs_scale >> (7 * l)) & 127];
}
uint8_t grid_magnitude(uint8_t index, int j) {
    return (kIq2xxsGrid[index] >> (8 * j)) & 0xff;
}

}  // namespace

void dequantize_row_iq2_xxs(const void *src, float *dst, int64_t n) {
    const auto *blocks = static_cast<const BlockIQ2_XXS *>(src);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float d = f16_to_f32(blocks[b].d);
        for (int g = 0; g < kQK_K / 32; ++g) {
            const Iq2Group group = read_group(blocks[b], g);
            // group scale d * (ls + 1/2) / 4
            const float dg = d * (0.5f + static_cast<float>(group.signs_scale >> 28)) * 0.25f;
            for (int l = 0; l < 4; ++l) {
                const uint8_t index = grid_index(group, l);
                const uint8_t signs = sign_pattern(group, l);
                for (int j = 0; j < 8; ++j) {
                    const float sign = (signs >> j) & 1 ? -1.0f : 1.0f;
                    dst[b * kQK_K + 32 * g + 8 * l + j] = dg * grid_magnitude(index, j) * sign;
                }
            }
        }
    }
}

// y = 1/8 * sum over blocks of f16(d) * dy * sum_g (2 ls_g + 1) * sum_{32 values} (+-grid) * qy
float vec_dot_iq2_xxs_q8_K(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockIQ2_XXS *>(w);
    const auto *xb = static_cast<const BlockQ8_K *>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const int8_t *qy = xb[b].qs;
        int32_t block_sum = 0;
        for (int g = 0; g < kQK_K / 32; ++g) {
            const Iq2Group group = read_group(wb[b], g);
            int32_t group_sum = 0;
            for (int l = 0; l < 4; ++l) {
                const uint8_t index = grid_index(group, l);
                const uint8_t signs = sign_pattern(group, l);
                for (int j = 0; j < 8; ++j) {
                    const int32_t v = grid_magnitude(index, j) * qy[32 * g + 8 * l + j];
                    group_sum += (signs >> j) & 1 ? -v : v;
                }
            }
            block_sum += group_sum * static_cast<int32_t>(2 * (group.signs_scale >> 28) + 1);
        }
        sum += f16_to_f32(wb[b].d) * xb[b].d * static_cast<float>(block_sum);
    }
    return 0.125f * sum;
}

}  // namespace ds4::quant::ref
