// The AVX512Vbmi IQ2_XXS kernels (kernels_avx512_vbmi.cpp) against the scalar reference:
//   * the position-major activation rows hold exactly the Q8_K quantizer's values and scales,
//     and the bias corrections (-64 x each sub-block's sum), where the kernel file says, and
//     nothing past the Q8_K row size is written;
//   * the dot product is within 1e-5 of sum |w x| of the reference dot on the plain Q8_K row
//     (random rows, odd and even super-block counts, extreme grid points, scales and signs);
//   * the multi-row dot equals the single dot bit for bit;
//   * the dispatch hands these out at the AVX512Vbmi level only.
// Skipped, saying so, on CPUs without VBMI and GFNI.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "quant/blocks.h"
#include "quant/iq2_tables.h"
#include "quant/kernels_ref.h"
#include "quant/kernels_simd.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"
#include "random_activations.h"

namespace ds4::quant {
namespace {

constexpr int64_t kBlockCounts[] = {1, 2, 3, 7, 16, 64};
constexpr double kDotTolerance = 1e-5;  // relative to sum_i |w_i x_i|
constexpr uint8_t kGuardByte = 0xA5;
constexpr size_t kGuardBytes = 64;

class Iq2xxsVbmi : public ::testing::Test {
  protected:
    void SetUp() override {
        if (cpu_simd_level() < SimdLevel::AVX512Vbmi)
            GTEST_SKIP() << "this CPU lacks AVX-512 VBMI / GFNI (best level: "
                         << simd_level_name(cpu_simd_level()) << ")";
    }
};

// Per 32 values a random magnitude between 1e-3 and 1e3, signs random.
std::vector<float> random_activations(int64_t n, uint64_t seed) {
    return testing::random_activations(n, seed, -3.0f, 3.0f);
}

struct Activations {
    std::vector<uint8_t> blocks;      // plain Q8_K, by the reference quantizer
    std::vector<uint8_t> positional;  // the kernel's layout, Q8_K row size
};

Activations quantize_both(const std::vector<float> &x) {
    const auto n = static_cast<int64_t>(x.size());
    Activations a;
    a.blocks.resize(row_size(GgmlType::Q8_K, n));
    ref::quantize_row_q8_K(x.data(), a.blocks.data(), n);
    a.positional.assign(a.blocks.size() + kGuardBytes, kGuardByte);
    avx512vbmi::quantize_row_q8_K_iq2_xxs(x.data(), a.positional.data(), n);
    for (size_t i = a.blocks.size(); i < a.positional.size(); ++i) {
        if (a.positional[i] != kGuardByte) {
            ADD_FAILURE() << "n=" << n << ": wrote past the Q8_K row size at byte "
                          << i - a.blocks.size();
            break;
        }
    }
    a.positional.resize(a.blocks.size());
    return a;
}

double abs_product_sum(const void *w, const void *x_blocks, int64_t n) {
    std::vector<float> wf(static_cast<size_t>(n)), xf(static_cast<size_t>(n));
    ref::dequantize_row_iq2_xxs(w, wf.data(), n);
    ref::dequantize_row_q8_K(x_blocks, xf.data(), n);
    double sum = 0.0;
    for (size_t i = 0; i < wf.size(); ++i) sum += std::fabs(double(wf[i]) * xf[i]);
    return sum;
}

void expect_dot_close(const void *w, const Activations &a, int64_t n, const std::string &what) {
    const float want = ref::vec_dot_iq2_xxs_q8_K(n, w, a.blocks.data());
    const float got = avx512vbmi::vec_dot_iq2_xxs_q8_K(n, w, a.positional.data());
    const double scale = abs_product_sum(w, a.blocks.data(), n);
    ASSERT_TRUE(std::isfinite(want) && std::isfinite(scale)) << what;
    EXPECT_LE(std::fabs(double(got) - want), kDotTolerance * scale)
        << what << ": got " << got << ", reference " << want << ", sum|wx| " << scale;
}

TEST_F(Iq2xxsVbmi, ActivationLayoutHoldsTheQ8KValuesPositionMajor) {
    for (const int64_t nb : kBlockCounts) {
        const int64_t n = nb * kQK_K;
        const Activations a = quantize_both(random_activations(n, 100 + nb));
        const auto *blocks = reinterpret_cast<const BlockQ8_K *>(a.blocks.data());
        const auto *q = reinterpret_cast<const int8_t *>(a.positional.data());
        int mismatches = 0;
        for (int64_t b = 0; b < nb; ++b) {
            // A pair of blocks shares 64 groups, 16 int32 lanes of 4 groups; lane t holds
            // sub-block 2 (t / 4) + t % 2 of block (t % 4) / 2 of the pair. A last odd block
            // stands alone with 32 groups, sub-block s in lane s.
            const int64_t pair_start = b / 2 * 2;
            const int64_t h = b - pair_start;
            const bool alone = pair_start + 1 == nb;
            const int64_t groups = alone ? 32 : 64;
            for (int s = 0; s < 8; ++s) {
                const int64_t lane = alone ? s : 4 * (s / 2) + 2 * h + s % 2;
                for (int i = 0; i < 4; ++i)
                    for (int j = 0; j < 8; ++j) {
                        const int64_t at = pair_start * kQK_K + groups * j + 4 * lane + i;
                        const int value = 32 * s + 8 * i + j;
                        if (q[at] != blocks[b].qs[value] && ++mismatches <= 5)
                            ADD_FAILURE() << "nb=" << nb << " block " << b << " value " << value;
                    }
                // the weight bias correction: -64 times the sub-block's sum of quants
                int32_t want = 0;
                for (int v = 0; v < 32; ++v) want += blocks[b].qs[32 * s + v];
                want *= -64;
                int32_t got;
                std::memcpy(&got, a.positional.data() + n + 4 * nb + 4 * (8 * pair_start + lane),
                            sizeof got);
                EXPECT_EQ(got, want) << "nb=" << nb << " block " << b << " sub-block " << s;
            }
            float d;
            std::memcpy(&d, a.positional.data() + n + 4 * b, sizeof d);
            EXPECT_EQ(d, blocks[b].d) << "nb=" << nb << " block " << b;
        }
        EXPECT_EQ(mismatches, 0) << "nb=" << nb;
        // q, d and the corrections fill the Q8_K row exactly
        EXPECT_EQ(static_cast<size_t>(n + 4 * nb + 32 * nb), a.positional.size()) << "nb=" << nb;
    }
}

TEST_F(Iq2xxsVbmi, DotMatchesReferenceOnRandomRows) {
    for (const int64_t nb : kBlockCounts) {
        const int64_t n = nb * kQK_K;
        for (uint64_t row = 0; row < 8; ++row) {
            const uint64_t seed = 1000 * static_cast<uint64_t>(nb) + row;
            const std::vector<uint8_t> w = random_blocks(GgmlType::IQ2_XXS, n, seed, 2.0f);
            expect_dot_close(w.data(), quantize_both(random_activations(n, seed + 7)), n,
                             "nb=" + std::to_string(nb) + " row " + std::to_string(row));
        }
    }
}

// Every grid point (each block cycles through all 256), every scale, and the sign patterns at
// both ends: all negative (a sign word of all ones, parity-completed to 0xFF), all positive,
// alternating; activations at +-127 (the quantizer's extremes).
TEST_F(Iq2xxsVbmi, DotExactOverEveryGridPointScaleAndSign) {
    const int64_t nb = 9;
    const int64_t n = nb * kQK_K;
    std::vector<float> extremes(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) extremes[static_cast<size_t>(i)] = i % 3 == 0 ? -1.0f : 1.0f;
    const Activations a = quantize_both(extremes);
    for (const uint32_t signs : {0x0FFFFFFFu, 0u, 0x0AAAAAAAu, 0x05555555u}) {
        std::vector<BlockIQ2_XXS> w(static_cast<size_t>(nb));
        for (int64_t b = 0; b < nb; ++b) {
            w[static_cast<size_t>(b)].d = ref::f32_to_f16(b % 2 ? 3.0f : -0.5f);
            for (int g = 0; g < 8; ++g) {
                uint32_t a0 = 0;
                for (int l = 0; l < 4; ++l)
                    a0 |= static_cast<uint32_t>((b * 32 + g * 4 + l) * 7 % 256) << (8 * l);
                const uint32_t a1 = signs | static_cast<uint32_t>((b + g) % 16) << 28;
                std::memcpy(&w[static_cast<size_t>(b)].qs[4 * g], &a0, 4);
                std::memcpy(&w[static_cast<size_t>(b)].qs[4 * g + 2], &a1, 4);
            }
        }
        expect_dot_close(w.data(), a, n, "sign word " + std::to_string(signs));
    }
}

// 3 weight rows (one pass of two, one of one) against m activation rows.
TEST_F(Iq2xxsVbmi, MultiRowDotEqualsSingleDotBitForBit) {
    constexpr int64_t kWeightRows = 3, kOutStride = kWeightRows + 1;  // + a column never written
    for (const int64_t nb : {int64_t{1}, int64_t{4}, int64_t{7}}) {
        const int64_t n = nb * kQK_K;
        const size_t w_stride = row_size(GgmlType::IQ2_XXS, n);
        const std::vector<uint8_t> w =
            random_blocks(GgmlType::IQ2_XXS, kWeightRows * n, 5 + nb, 1.0f);
        for (const int64_t m : {int64_t{1}, int64_t{5}, int64_t{33}}) {
            const size_t stride = row_size(GgmlType::Q8_K, n);
            std::vector<uint8_t> x(stride * static_cast<size_t>(m));
            for (int64_t j = 0; j < m; ++j) {
                const std::vector<float> xf = random_activations(n, 50 + j);
                avx512vbmi::quantize_row_q8_K_iq2_xxs(xf.data(), x.data() + j * stride, n);
            }
            std::vector<float> out(static_cast<size_t>(kOutStride * m), -1.0f);
            avx512vbmi::vec_dot_multi_iq2_xxs_q8_K(n, w.data(), w_stride, kWeightRows, x.data(),
                                                   stride, m, out.data(), kOutStride);
            for (int64_t j = 0; j < m; ++j) {
                for (int64_t i = 0; i < kWeightRows; ++i) {
                    const float single = avx512vbmi::vec_dot_iq2_xxs_q8_K(
                        n, w.data() + i * w_stride, x.data() + j * stride);
                    const float got = out[static_cast<size_t>(kOutStride * j + i)];
                    EXPECT_EQ(std::memcmp(&got, &single, sizeof single), 0)
                        << "nb=" << nb << " m=" << m << " weight row " << i << " row " << j << ": "
                        << got << " vs " << single;
                }
                EXPECT_EQ(out[static_cast<size_t>(kOutStride * j + kWeightRows)], -1.0f)
                    << "wrote between outputs";
            }
        }
    }
}

TEST_F(Iq2xxsVbmi, DispatchedAtTheVbmiLevelOnly) {
    const TypeKernels &k = kernels(GgmlType::IQ2_XXS, SimdLevel::AVX512Vbmi);
    EXPECT_EQ(k.vec_dot, avx512vbmi::vec_dot_iq2_xxs_q8_K);
    EXPECT_EQ(k.vec_dot_multi, avx512vbmi::vec_dot_multi_iq2_xxs_q8_K);
    EXPECT_EQ(k.quantize_activation_row, avx512vbmi::quantize_row_q8_K_iq2_xxs);
    EXPECT_EQ(k.activation_layout, ActivationLayout::Iq2xxsPositionMajor);
    EXPECT_EQ(kernels(GgmlType::IQ2_XXS, SimdLevel::AVX512).activation_layout,
              ActivationLayout::Blocks);
    EXPECT_EQ(kernels(GgmlType::Q2_K, SimdLevel::AVX512Vbmi).vec_dot,
              kernels(GgmlType::Q2_K, SimdLevel::AVX512).vec_dot);
}

}  // namespace
}  // namespace ds4::quant
