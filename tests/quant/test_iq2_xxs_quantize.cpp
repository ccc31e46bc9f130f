// The IQ2_XXS quantizer (src/quant/iq2_xxs_quantize.cpp): round-trip error on random rows, the
// format's invariants in every emitted block (signs that follow the input except the one value
// per 8 that the even-parity rule flips, the largest group at ls 15), edge inputs (zero rows and
// groups, tiny and huge magnitudes, one outlier, inf/NaN), determinism, use from several threads.
// The byte-for-byte comparison with ggml's own quantizer is test_iq2_xxs_vs_ggml.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "quant/blocks.h"
#include "quant/iq2_tables.h"
#include "quant/kernels_ref.h"
#include "quant/quant.h"

namespace ds4::quant {
namespace {

constexpr GgmlType kType = GgmlType::IQ2_XXS;

// Relative rms error bounds, sqrt(sum (x - y)^2 / sum x^2), measured on the rows below: N(0,
// sigma^2) 0.3456 at sigma 0.02, 1 and 1e5 alike (the search is scale free while f16 holds d);
// U(-1, 1) 0.3351; N(0, 1) with every other value zero 0.4503 (a zero is decoded as
// +-(grid level) * group scale: the format has no zero). ggml's own quantizer gives the same
// blocks byte for byte (test_iq2_xxs_vs_ggml.py: 0.343 on its N(0, 1) rows). The bounds leave
// ~2.5% for other seeds. They catch a broken neighbour choice (always the first neighbour: 0.405
// on the Gaussian rows) but not a shortened scale search (centre candidate only: 0.3475); the
// byte comparison with ggml catches that.
constexpr double kGaussianBound = 0.355;
constexpr double kUniformBound = 0.345;
constexpr double kHalfZeroBound = 0.46;

std::vector<float> gaussian_row(size_t n, uint64_t seed, float sigma) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> normal(0.0f, sigma);
    std::vector<float> x(n);
    for (float &v : x) v = normal(gen);
    return x;
}

std::vector<float> uniform_row(size_t n, uint64_t seed) {
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> x(n);
    for (float &v : x) v = uniform(gen);
    return x;
}

std::vector<BlockIQ2_XXS> quantize(const std::vector<float> &x) {
    std::vector<BlockIQ2_XXS> q(x.size() / kQK_K);
    quantize_row(kType, x.data(), q.data(), static_cast<int64_t>(x.size()));
    return q;
}

std::vector<float> dequantize(const std::vector<BlockIQ2_XXS> &q) {
    std::vector<float> y(q.size() * kQK_K);
    dequantize_row(kType, q.data(), y.data(), static_cast<int64_t>(y.size()));
    return y;
}

double relative_rms_error(const std::vector<float> &x, const std::vector<float> &y) {
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        err += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
        ref += static_cast<double>(x[i]) * x[i];
    }
    return std::sqrt(err / ref);
}

// The second u32 of group g: 4 sign patterns of 7 bits, then ls in bits 28..31.
uint32_t signs_scale_word(const BlockIQ2_XXS &block, int g) {
    uint32_t w;
    std::memcpy(&w, &block.qs[4 * g + 2], 4);
    return w;
}

// Invariants of blocks that quantize x (finite, nonzero blocks): per 8 values the decoded signs
// are the input's, except exactly one flipped when the input has an odd count of negatives, and
// that one is a value of least |x| of the 8 (it has the least w x^2, w growing with |x|); the
// 8-bit patterns have even parity (ksigns); in a block whose d is not zero, the group of largest
// scale has ls = 15 (d = max scale / 31).
void expect_format_invariants(const std::vector<float> &x, const std::vector<BlockIQ2_XXS> &q) {
    for (size_t b = 0; b < q.size(); ++b) {
        int max_ls = 0;
        for (int g = 0; g < kQK_K / 32; ++g) {
            const uint32_t word = signs_scale_word(q[b], g);
            max_ls = std::max(max_ls, static_cast<int>(word >> 28));
            for (int l = 0; l < 4; ++l) {
                const uint8_t signs = kIq2Signs[(word >> (7 * l)) & 127];
                ASSERT_EQ(__builtin_popcount(signs) % 2, 0);
                const float *x8 = &x[b * kQK_K + 32 * g + 8 * l];
                int negatives = 0, flipped = 0, flipped_at = -1;
                for (int j = 0; j < 8; ++j) {
                    const bool input_negative = x8[j] < 0;
                    negatives += input_negative;
                    if (input_negative != (((signs >> j) & 1) != 0)) {
                        ++flipped;
                        flipped_at = j;
                    }
                }
                const std::string where = "block " + std::to_string(b) + " values " +
                                          std::to_string(32 * g + 8 * l) + "..";
                ASSERT_EQ(flipped, negatives % 2) << where;
                if (flipped) {
                    for (int j = 0; j < 8; ++j)
                        ASSERT_LE(std::fabs(x8[flipped_at]), std::fabs(x8[j])) << where;
                }
            }
        }
        if (q[b].d != 0) {
            EXPECT_EQ(max_ls, 15) << "block " << b;
        }
    }
}

TEST(Iq2xxsQuantize, DispatchHandsOutTheReferenceAtEveryLevel) {
    for (SimdLevel level : kAllSimdLevels) {
        if (level > cpu_simd_level()) continue;
        EXPECT_EQ(kernels(kType, level).quantize_row, ref::quantize_row_iq2_xxs)
            << simd_level_name(level);
    }
}

TEST(Iq2xxsQuantize, RoundTripErrorOnGaussianRows) {
    for (float sigma : {0.02f, 1.0f, 1e5f}) {
        const std::vector<float> x = gaussian_row(kQK_K * 64, 42, sigma);
        const std::vector<BlockIQ2_XXS> q = quantize(x);
        const double e = relative_rms_error(x, dequantize(q));
        std::printf("N(0, %g): relative rms error %.4f\n", sigma, e);
        EXPECT_LT(e, kGaussianBound) << "sigma " << sigma;
        expect_format_invariants(x, q);
    }
}

TEST(Iq2xxsQuantize, RoundTripErrorOnUniformRows) {
    const std::vector<float> x = uniform_row(kQK_K * 64, 7);
    const std::vector<BlockIQ2_XXS> q = quantize(x);
    const double e = relative_rms_error(x, dequantize(q));
    std::printf("U(-1, 1): relative rms error %.4f\n", e);
    EXPECT_LT(e, kUniformBound);
    expect_format_invariants(x, q);
}

TEST(Iq2xxsQuantize, RowsWithZeros) {
    std::vector<float> x = gaussian_row(kQK_K * 64, 11, 1.0f);
    for (size_t i = 0; i < x.size(); i += 2) x[i] = 0.0f;  // half the values
    const double e = relative_rms_error(x, dequantize(quantize(x)));
    std::printf("N(0, 1), every other value zero: relative rms error %.4f\n", e);
    EXPECT_LT(e, kHalfZeroBound);

    // An all-zero block is all zero bytes (d = 0) and decodes to exact zeros; a zero group in a
    // nonzero block has ls 0, grid point 0 and no signs, so it decodes to +d (the format's
    // smallest magnitude, d * (0.5 + 0) * 0.25 * 8).
    std::vector<float> z = gaussian_row(kQK_K * 3, 12, 1.0f);
    std::fill(z.begin(), z.begin() + kQK_K, 0.0f);                    // block 0
    std::fill(z.begin() + kQK_K + 64, z.begin() + kQK_K + 96, 0.0f);  // block 1, group 2
    const std::vector<BlockIQ2_XXS> q = quantize(z);
    const std::vector<float> y = dequantize(q);
    std::vector<uint8_t> zeros(sizeof(BlockIQ2_XXS), 0);
    EXPECT_EQ(std::memcmp(&q[0], zeros.data(), zeros.size()), 0);
    for (int i = 0; i < kQK_K; ++i) ASSERT_EQ(y[i], 0.0f) << i;
    const float d1 = ref::f16_to_f32(q[1].d);
    EXPECT_GT(d1, 0.0f);
    for (int i = kQK_K + 64; i < kQK_K + 96; ++i) ASSERT_EQ(y[i], d1) << i;

    const std::vector<float> all_zero(kQK_K * 2, 0.0f);
    for (float v : dequantize(quantize(all_zero))) ASSERT_EQ(v, 0.0f);
}

// Groups whose largest |x| is below 1e-15 are zero groups (ggml's GROUP_MAX_EPS); a block of
// them is all zeros. (Above that, f16 d underflows to 0 below |x| ~ 1e-6 anyway.)
TEST(Iq2xxsQuantize, TinyMagnitudesGiveZeros) {
    const std::vector<float> x = gaussian_row(kQK_K * 4, 13, 1e-30f);
    const std::vector<BlockIQ2_XXS> q = quantize(x);
    for (const BlockIQ2_XXS &b : q) {
        EXPECT_EQ(b.d, 0);
        for (uint16_t v : b.qs) ASSERT_EQ(v, 0);
    }
    for (float v : dequantize(q)) ASSERT_EQ(v, 0.0f);
}

// One value 1000x the others: its block is ruined (a group spans only 5x between its smallest
// and largest magnitude, and the block's d follows the outlier's group) but the outlier itself
// is kept within 10%, and every other block is exactly what it is without the outlier.
TEST(Iq2xxsQuantize, OneHugeOutlier) {
    const std::vector<float> base = gaussian_row(kQK_K * 8, 14, 1.0f);
    std::vector<float> x = base;
    constexpr size_t kAt = kQK_K + 37;
    x[kAt] = 1000.0f;
    const std::vector<BlockIQ2_XXS> q = quantize(x), q_base = quantize(base);
    const std::vector<float> y = dequantize(q);
    std::printf("outlier 1000 decoded as %g\n", y[kAt]);
    EXPECT_NEAR(y[kAt], 1000.0f, 100.0f);
    for (size_t b = 0; b < q.size(); ++b) {
        if (b != kAt / kQK_K) {
            EXPECT_EQ(std::memcmp(&q[b], &q_base[b], sizeof(BlockIQ2_XXS)), 0) << "block " << b;
        }
    }
    expect_format_invariants(x, q);
}

TEST(Iq2xxsQuantize, NonFiniteValuesAreRefused) {
    for (float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity()}) {
        std::vector<float> x = gaussian_row(kQK_K * 2, 15, 1.0f);
        x[300] = bad;
        std::vector<BlockIQ2_XXS> q(2);
        try {
            quantize_row(kType, x.data(), q.data(), kQK_K * 2);
            ADD_FAILURE() << bad << " was accepted";
        } catch (const Error &e) {
            EXPECT_NE(std::string(e.what()).find("position 300 "), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
        }
    }
}

// Finite values past what f16 d can scale (~1e7) still give blocks of valid fields (no crash,
// no out-of-range table index); they decode to non-finite or meaningless values.
TEST(Iq2xxsQuantize, HugeFiniteValuesDoNotCrash) {
    for (float sigma : {1e8f, 1e20f, 1e30f}) {
        const std::vector<float> x = gaussian_row(kQK_K * 2, 16, sigma);
        std::vector<BlockIQ2_XXS> q(2);
        EXPECT_NO_THROW(quantize_row(kType, x.data(), q.data(), kQK_K * 2)) << sigma;
    }
}

TEST(Iq2xxsQuantize, DeterministicAndEveryByteWritten) {
    const std::vector<float> x = gaussian_row(kQK_K * 4, 17, 1.0f);
    std::vector<uint8_t> a(row_size(kType, kQK_K * 4), 0x00), b(a.size(), 0xff);
    quantize_row(kType, x.data(), a.data(), kQK_K * 4);
    quantize_row(kType, x.data(), b.data(), kQK_K * 4);
    EXPECT_EQ(a, b);
}

// The neighbour tables are built on first use; every thread must see them whole.
TEST(Iq2xxsQuantize, SameBlocksFromSeveralThreads) {
    constexpr int kThreads = 4;
    const std::vector<float> x = gaussian_row(kQK_K * 16, 18, 1.0f);
    const std::vector<BlockIQ2_XXS> serial = quantize(x);
    std::vector<std::vector<BlockIQ2_XXS>> got(kThreads, std::vector<BlockIQ2_XXS>(16));
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back(
            [&, t] { ref::quantize_row_iq2_xxs(x.data(), got[t].data(), kQK_K * 16); });
    for (std::thread &t : threads) t.join();
    for (int t = 0; t < kThreads; ++t)
        EXPECT_EQ(std::memcmp(got[t].data(), serial.data(), serial.size() * sizeof(BlockIQ2_XXS)),
                  0)
            << "thread " << t;
}

}  // namespace
}  // namespace ds4::quant
