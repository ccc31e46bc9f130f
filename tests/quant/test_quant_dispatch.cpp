// The kernel table: which functions each type and SIMD level gets, the DS4_SIMD cap, and the
// row wrappers' checks.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.h"
#include "quant/kernels_ref.h"
#include "quant/quant.h"

namespace ds4::quant {
namespace {

constexpr GgmlType kSupported[] = {GgmlType::F32,  GgmlType::F16,     GgmlType::BF16,
                                   GgmlType::Q8_0, GgmlType::MXFP4,   GgmlType::Q2_K,
                                   GgmlType::Q4_K, GgmlType::IQ2_XXS, GgmlType::Q8_K};

TEST(SimdLevelCap, Ds4SimdValues) {
    EXPECT_EQ(cap_simd_level(SimdLevel::AVX512, nullptr), SimdLevel::AVX512);
    EXPECT_EQ(cap_simd_level(SimdLevel::AVX512, ""), SimdLevel::AVX512);
    EXPECT_EQ(cap_simd_level(SimdLevel::AVX512, "scalar"), SimdLevel::Scalar);
    EXPECT_EQ(cap_simd_level(SimdLevel::AVX512, "avx2"), SimdLevel::AVX2);
    EXPECT_EQ(cap_simd_level(SimdLevel::AVX512, "avx512"), SimdLevel::AVX512);
    EXPECT_EQ(cap_simd_level(SimdLevel::AVX512Vbmi, "avx512"), SimdLevel::AVX512);
    EXPECT_EQ(cap_simd_level(SimdLevel::AVX512Vbmi, "avx512vbmi"), SimdLevel::AVX512Vbmi);
    EXPECT_EQ(cap_simd_level(SimdLevel::AVX512, "avx512vbmi"), SimdLevel::AVX512);
    EXPECT_EQ(cap_simd_level(SimdLevel::AVX2, "avx512"), SimdLevel::AVX2)
        << "a cap never raises the level";
    EXPECT_EQ(cap_simd_level(SimdLevel::Scalar, "avx2"), SimdLevel::Scalar);
    EXPECT_THROW(cap_simd_level(SimdLevel::AVX2, "sse4"), Error);
    EXPECT_THROW(cap_simd_level(SimdLevel::AVX2, "AVX2"), Error);
}

// Run by ctest once more with DS4_SIMD=scalar and DS4_EXPECT_SIMD=scalar: proves the cap
// reaches the kernels the engine uses.
TEST(SimdLevelCap, DetectedLevelHonoursEnvironment) {
    const SimdLevel detected = detected_simd_level();
    EXPECT_EQ(detected, cap_simd_level(cpu_simd_level(), std::getenv("DS4_SIMD")));
    EXPECT_LE(detected, cpu_simd_level());
    if (const char *expect = std::getenv("DS4_EXPECT_SIMD")) {
        EXPECT_STREQ(simd_level_name(detected), expect);
        for (GgmlType type : kSupported)
            EXPECT_EQ(&kernels(type), &kernels(type, detected)) << ggml_type_name(type);
    }
    std::printf("cpu level %s, detected level %s\n", simd_level_name(cpu_simd_level()),
                simd_level_name(detected));
}

TEST(KernelTable, ScalarEntriesAreTheReference) {
    const TypeKernels &q80 = kernels(GgmlType::Q8_0, SimdLevel::Scalar);
    EXPECT_EQ(q80.quantize_row, ref::quantize_row_q8_0);
    EXPECT_EQ(q80.vec_dot, ref::vec_dot_q8_0_q8_0);
    const TypeKernels &q8k = kernels(GgmlType::Q8_K, SimdLevel::Scalar);
    EXPECT_EQ(q8k.quantize_row, ref::quantize_row_q8_K);
    EXPECT_EQ(q8k.vec_dot, nullptr);
    EXPECT_EQ(kernels(GgmlType::Q2_K, SimdLevel::Scalar).quantize_row, ref::quantize_row_q2_K);
    EXPECT_EQ(kernels(GgmlType::Q4_K, SimdLevel::Scalar).quantize_row, ref::quantize_row_q4_K);
    EXPECT_EQ(kernels(GgmlType::IQ2_XXS, SimdLevel::Scalar).quantize_row,
              ref::quantize_row_iq2_xxs);
    EXPECT_EQ(kernels(GgmlType::MXFP4, SimdLevel::Scalar).quantize_row, nullptr);
}

TEST(KernelTable, EveryRunnableLevelIsComplete) {
    for (SimdLevel level : kAllSimdLevels) {
        if (level > cpu_simd_level()) continue;
        for (GgmlType type : kSupported) {
            const TypeKernels &k = kernels(type, level);
            const std::string where =
                std::string(ggml_type_name(type)) + " at " + simd_level_name(level);
            EXPECT_EQ(k.type, type) << where;
            EXPECT_NE(k.dequantize_row, nullptr) << where;
            EXPECT_EQ(k.vec_dot == nullptr, type == GgmlType::Q8_K) << where;
            const GgmlType want_act =
                type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16
                    ? GgmlType::F32
                : type == GgmlType::Q8_0 || type == GgmlType::MXFP4 ? GgmlType::Q8_0
                                                                    : GgmlType::Q8_K;
            EXPECT_EQ(k.vec_dot_type, want_act) << where;
            // the activation format of every dot can be produced at this level, and the weight
            // type names its quantizer (f32 activations are used as they are)
            EXPECT_NE(kernels(k.vec_dot_type, level).quantize_row, nullptr) << where;
            EXPECT_EQ(k.quantize_activation_row == nullptr, want_act == GgmlType::F32) << where;
            const bool own_layout = type == GgmlType::IQ2_XXS && level == SimdLevel::AVX512Vbmi;
            EXPECT_EQ(k.activation_layout,
                      own_layout ? ActivationLayout::Iq2xxsPositionMajor : ActivationLayout::Blocks)
                << where;
            if (!own_layout && want_act != GgmlType::F32 && type != GgmlType::Q8_0) {
                EXPECT_EQ(k.quantize_activation_row,
                          kernels(want_act, level).quantize_activation_row)
                    << where;
            }
        }
    }
}

TEST(KernelTable, SupportedTypes) {
    for (GgmlType type : kSupported) EXPECT_TRUE(is_supported(type)) << ggml_type_name(type);
    for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q6_K, GgmlType::IQ2_XS, GgmlType::I32}) {
        EXPECT_FALSE(is_supported(type)) << ggml_type_name(type);
        EXPECT_THROW(kernels(type), Error) << ggml_type_name(type);
    }
}

TEST(KernelTable, LevelAboveTheCpuIsRefused) {
    if (cpu_simd_level() == SimdLevel::AVX512Vbmi) GTEST_SKIP() << "this CPU runs every level";
    EXPECT_THROW(kernels(GgmlType::Q8_0, SimdLevel::AVX512Vbmi), Error);
}

TEST(RowWrappers, CheckLengthAndFormat) {
    std::vector<float> x(64, 1.0f);
    std::vector<uint8_t> buf(1024);
    EXPECT_THROW(quantize_row(GgmlType::Q8_0, x.data(), buf.data(), 33), Error);
    EXPECT_THROW(quantize_row(GgmlType::MXFP4, x.data(), buf.data(), 64), Error);  // no quantizer
    EXPECT_THROW(quantize_row(GgmlType::IQ2_XXS, x.data(), buf.data(), 128), Error);
    EXPECT_THROW(dequantize_row(GgmlType::Q4_K, buf.data(), x.data(), 64), Error);
    EXPECT_NO_THROW(quantize_row(GgmlType::Q8_0, x.data(), buf.data(), 64));
    EXPECT_EQ(row_size(GgmlType::Q8_0, 64), 68u);
    EXPECT_EQ(row_size(GgmlType::Q4_K, 512), 288u);
    EXPECT_EQ(row_size(GgmlType::IQ2_XXS, 4096), 16u * 66u);
    EXPECT_EQ(row_size(GgmlType::MXFP4, 64), 34u);
    EXPECT_EQ(row_size(GgmlType::BF16, 3), 6u);
    EXPECT_THROW(row_size(GgmlType::Q2_K, 100), Error);
}

}  // namespace
}  // namespace ds4::quant
