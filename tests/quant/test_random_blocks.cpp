// The random block generator: reproducible, valid, and spread over the requested magnitude.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "quant/blocks.h"
#include "quant/kernels_ref.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace ds4::quant {
namespace {

constexpr GgmlType kGenerated[] = {GgmlType::F32,  GgmlType::F16,     GgmlType::BF16,
                                   GgmlType::Q8_0, GgmlType::MXFP4,   GgmlType::Q2_K,
                                   GgmlType::Q4_K, GgmlType::IQ2_XXS, GgmlType::Q8_K};

TEST(RandomBlocks, ReproducibleFromSeed) {
    for (GgmlType type : kGenerated) {
        const auto a = random_blocks(type, 1024, 11);
        const auto b = random_blocks(type, 1024, 11);
        const auto c = random_blocks(type, 1024, 12);
        EXPECT_EQ(a, b) << ggml_type_name(type);
        EXPECT_NE(a, c) << ggml_type_name(type);
        EXPECT_EQ(a.size(), row_size(type, 1024));
    }
}

TEST(RandomBlocks, ValuesAreFiniteAndSpanTheMagnitude) {
    for (GgmlType type : kGenerated) {
        for (float magnitude : {0.02f, 1.0f, 40.0f}) {
            const int64_t n = 256 * 32;
            const auto blocks = random_blocks(type, n, 3, magnitude);
            std::vector<float> v(n);
            dequantize_row(type, blocks.data(), v.data(), n);
            float amax = 0;
            for (float x : v) {
                ASSERT_TRUE(std::isfinite(x)) << ggml_type_name(type);
                amax = std::fmax(amax, std::fabs(x));
            }
            const std::string what =
                std::string(ggml_type_name(type)) + " magnitude " + std::to_string(magnitude);
            EXPECT_LE(amax, magnitude * 1.01f) << what;
            EXPECT_GE(amax, magnitude * 0.25f) << what;
        }
    }
}

TEST(RandomBlocks, QuantsAsTheQuantizersProduceThem) {
    const int64_t n = 256 * 16;
    const auto q80 = random_blocks(GgmlType::Q8_0, n, 5);
    for (const auto &b :
         std::vector<BlockQ8_0>(reinterpret_cast<const BlockQ8_0 *>(q80.data()),
                                reinterpret_cast<const BlockQ8_0 *>(q80.data()) + n / kQK8_0)) {
        EXPECT_GT(ref::f16_to_f32(b.d), 0.0f);
        for (int8_t q : b.qs) EXPECT_GE(q, -127);
    }
    const auto q8k = random_blocks(GgmlType::Q8_K, n, 5);
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        BlockQ8_K b;
        std::memcpy(&b, q8k.data() + i * sizeof(BlockQ8_K), sizeof b);
        EXPECT_GT(b.d, 0.0f);
        for (int k = 0; k < kQK_K / 16; ++k) {
            int sum = 0;
            for (int j = 0; j < 16; ++j) {
                EXPECT_GE(b.qs[16 * k + j], -127);
                sum += b.qs[16 * k + j];
            }
            EXPECT_EQ(b.bsums[k], sum) << "block " << i << " bsum " << k;
        }
    }
}

TEST(RandomBlocks, RejectsWhatItCannotMake) {
    std::vector<uint8_t> buf(4096);
    EXPECT_THROW(fill_random_blocks(GgmlType::Q6_K, buf.data(), 256, 1), Error);
    EXPECT_THROW(fill_random_blocks(GgmlType::Q8_0, buf.data(), 33, 1), Error);
    EXPECT_THROW(fill_random_blocks(GgmlType::Q8_0, buf.data(), 32, 1, 0.0f), Error);
    EXPECT_THROW(fill_random_blocks(GgmlType::Q8_0, buf.data(), 32, 1, NAN), Error);
}

}  // namespace
}  // namespace ds4::quant
