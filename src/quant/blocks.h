#pragma once
// Byte layouts of the block formats, identical to ggml's (docs/MODEL.md section 5).
// f16 fields are IEEE binary16 bit patterns.
#include <cstdint>

namespace ds4::quant {

constexpr int kQK8_0 = 32;  // values per Q8_0 block
constexpr int kQK_K = 256;  // values per K-quant / IQ2 / Q8_K super-block
constexpr int kQK_MXFP4 = 32;

struct BlockQ8_0 {
    uint16_t d;         // f16 scale
    int8_t qs[kQK8_0];  // value_i = d * qs[i]
};
static_assert(sizeof(BlockQ8_0) == 34);
// The Q8_0 dot adds block b's term to chain b mod kQ8_0Chains (q8_0.cpp, docs/MODEL.md 5.1).
constexpr int kQ8_0Chains = 16;

struct BlockQ2_K {
    uint8_t scales[kQK_K / 16];  // low nibble: sub-scale, high nibble: sub-min (16 sub-blocks)
    uint8_t qs[kQK_K / 4];       // 2-bit quants
    uint16_t d;                  // f16 super-scale for scales
    uint16_t dmin;               // f16 super-scale for mins
};
static_assert(sizeof(BlockQ2_K) == 84);

struct BlockQ4_K {
    uint16_t d;             // f16 super-scale for scales
    uint16_t dmin;          // f16 super-scale for mins
    uint8_t scales[12];     // 8 x (6-bit scale, 6-bit min), packed
    uint8_t qs[kQK_K / 2];  // 4-bit quants
};
static_assert(sizeof(BlockQ4_K) == 144);

struct BlockIQ2_XXS {
    uint16_t d;              // f16
    uint16_t qs[kQK_K / 8];  // per 32 values: 4 grid indices (bytes) + 4x7 sign bits + 4-bit scale
};
static_assert(sizeof(BlockIQ2_XXS) == 66);

struct BlockQ8_K {
    float d;  // f32 scale
    int8_t qs[kQK_K];
    int16_t bsums[kQK_K / 16];  // sums of each 16 quants
};
static_assert(sizeof(BlockQ8_K) == 292);

struct BlockMXFP4 {
    uint8_t e;                  // E8M0 shared exponent: scale = 2^(e - 127)
    uint8_t qs[kQK_MXFP4 / 2];  // E2M1 codes: value j in low nibble of qs[j], value j+16 in high
};
static_assert(sizeof(BlockMXFP4) == 17);

}  // namespace ds4::quant
