#include "quant/random_blocks.h"

#include <cmath>
#include <string>

#include "common/error.h"
#include "quant/blocks.h"
#include "quant/kernels_ref.h"
#include "quant/quant.h"
#include "quant/split_mix.h"

namespace ds4::quant {
namespace {

// The shared generator plus the draws the block formats need.
class Rng : public SplitMix64 {
  public:
    using SplitMix64::SplitMix64;
    uint8_t byte() { return static_cast<uint8_t>(next() >> 56); }
    int8_t q8() { return static_cast<int8_t>(static_cast<int>(next() % 255) - 127); }  // -127..127
    void bytes(uint8_t *dst, int n) {
        for (int i = 0; i < n; ++i) dst[i] = byte();
    }
};

// A positive scale between half and all of `top`, as f16.
uint16_t f16_scale(Rng &rng, float top) {
    return ref::f32_to_f16(top * rng.uniform(0.5f, 1.0f));
}

template <typename Block>
Block *blocks_of(void *dst) {
    return static_cast<Block *>(dst);
}

}  // namespace

void fill_random_blocks(GgmlType type, void *dst, int64_t n_values, uint64_t seed,
                        float magnitude) {
    if (!(magnitude > 0.0f) || !std::isfinite(magnitude))
        throw Error("fill_random_blocks: magnitude must be positive and finite, got " +
                    std::to_string(magnitude));
    const uint32_t block_elems = ggml_type_info(type).block_elems;
    if (n_values % block_elems != 0)
        throw Error("fill_random_blocks: " + std::to_string(n_values) +
                    " values is not a multiple of the " + std::string(ggml_type_name(type)) +
                    " block size " + std::to_string(block_elems));
    const int64_t nb = n_values / block_elems;
    Rng rng(seed);
    switch (type) {
        case GgmlType::F32:
            for (int64_t i = 0; i < nb; ++i)
                static_cast<float *>(dst)[i] = rng.uniform(-magnitude, magnitude);
            return;
        case GgmlType::F16:
            for (int64_t i = 0; i < nb; ++i)
                static_cast<uint16_t *>(dst)[i] =
                    ref::f32_to_f16(rng.uniform(-magnitude, magnitude));
            return;
        case GgmlType::BF16:
            for (int64_t i = 0; i < nb; ++i)
                static_cast<uint16_t *>(dst)[i] =
                    ref::f32_to_bf16(rng.uniform(-magnitude, magnitude));
            return;
        case GgmlType::Q8_0:
            for (int64_t b = 0; b < nb; ++b) {
                auto &block = blocks_of<BlockQ8_0>(dst)[b];
                block.d = f16_scale(rng, magnitude / 127);
                for (auto &q : block.qs) q = rng.q8();
            }
            return;
        case GgmlType::Q8_K:
            for (int64_t b = 0; b < nb; ++b) {
                auto &block = blocks_of<BlockQ8_K>(dst)[b];
                block.d = magnitude / 127 * rng.uniform(0.5f, 1.0f);
                for (auto &q : block.qs) q = rng.q8();
                for (int k = 0; k < kQK_K / 16; ++k) {
                    int sum = 0;
                    for (int i = 0; i < 16; ++i) sum += block.qs[16 * k + i];
                    block.bsums[k] = static_cast<int16_t>(sum);
                }
            }
            return;
        case GgmlType::Q2_K:
            // value = d*sc*q - dmin*m with sc, m <= 15 and q <= 3: up to 45 d above and 15 dmin
            // below 0
            for (int64_t b = 0; b < nb; ++b) {
                auto &block = blocks_of<BlockQ2_K>(dst)[b];
                rng.bytes(block.scales, sizeof block.scales);
                rng.bytes(block.qs, sizeof block.qs);
                block.d = f16_scale(rng, magnitude / 45);
                block.dmin = f16_scale(rng, magnitude / 30);
            }
            return;
        case GgmlType::Q4_K:
            // value = d*sc*q - dmin*m with sc, m <= 63 and q <= 15
            for (int64_t b = 0; b < nb; ++b) {
                auto &block = blocks_of<BlockQ4_K>(dst)[b];
                rng.bytes(block.scales, sizeof block.scales);
                rng.bytes(block.qs, sizeof block.qs);
                block.d = f16_scale(rng, magnitude / (63 * 15));
                block.dmin = f16_scale(rng, magnitude / (63 * 2));
            }
            return;
        case GgmlType::IQ2_XXS:
            // |value| <= d * (15 + 1/2) / 4 * 43 ~= 167 d; every index, sign and scale bit is valid
            for (int64_t b = 0; b < nb; ++b) {
                auto &block = blocks_of<BlockIQ2_XXS>(dst)[b];
                for (auto &q : block.qs) q = static_cast<uint16_t>(rng.next() >> 48);
                block.d = f16_scale(rng, magnitude / 167);
            }
            return;
        case GgmlType::MXFP4:
            // |value| <= 6 * 2^(e-127): pick e with 6 * 2^(e-127) in (mag/4, mag]
            for (int64_t b = 0; b < nb; ++b) {
                auto &block = blocks_of<BlockMXFP4>(dst)[b];
                const int top = 127 + static_cast<int>(std::floor(std::log2(magnitude / 6.0f)));
                const int e = top - static_cast<int>(rng.next() % 2);
                block.e = static_cast<uint8_t>(e < 0 ? 0 : (e > 254 ? 254 : e));
                rng.bytes(block.qs, sizeof block.qs);
            }
            return;
        default:
            throw Error("fill_random_blocks: no generator for type " +
                        std::string(ggml_type_name(type)));
    }
}

std::vector<uint8_t> random_blocks(GgmlType type, int64_t n_values, uint64_t seed,
                                   float magnitude) {
    std::vector<uint8_t> out(row_size(type, n_values));
    fill_random_blocks(type, out.data(), n_values, seed, magnitude);
    return out;
}

}  // namespace ds4::quant
