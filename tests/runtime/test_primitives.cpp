// The model's numeric primitives against independent references: ml_dtypes' FP8/FP4 casts and
// scipy's Hadamard matrix (fixtures/primitives.json, from gen_primitive_fixtures.py), the
// YaRN frequency table printed in docs/MODEL.md 4.0, the sum of squares against a long double
// sum, and the attention mix's split forms against its one-head form.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/attention_mix.h"
#include "backend/cpu/qat_sim.h"
#include "backend/cpu/rope.h"
#include "backend/cpu/vector_ops.h"
#include "runtime/hyper_connections.h"

using namespace ds4::backend::cpu;

namespace {

const nlohmann::json &fixtures() {
    static const nlohmann::json j = [] {
        std::ifstream in(std::string(DS4_SOURCE_DIR) + "/tests/runtime/fixtures/primitives.json");
        return nlohmann::json::parse(in);
    }();
    return j;
}

template <typename Fn>
void check_cases(const char *name, Fn &&apply, double tol) {
    const auto &cases = fixtures().at(name);
    ASSERT_GE(cases.size(), 10u);
    for (size_t c = 0; c < cases.size(); ++c) {
        std::vector<float> x = cases[c].at("x").get<std::vector<float>>();
        const std::vector<double> y = cases[c].at("y").get<std::vector<double>>();
        apply(x.data(), static_cast<int64_t>(x.size()));
        for (size_t i = 0; i < x.size(); ++i)
            ASSERT_NEAR(x[i], y[i], tol * std::max(1.0, std::fabs(y[i])))
                << name << " case " << c << " index " << i;
    }
}

TEST(QatSim, Fp8MatchesMlDtypesBitForBit) {
    check_cases(
        "fp8", [](float *x, int64_t n) { fp8_e4m3_sim(x, n, 64); }, 0.0);
}

TEST(QatSim, Fp4MatchesMlDtypesBitForBit) {
    check_cases(
        "fp4", [](float *x, int64_t n) { fp4_e2m1_sim(x, n); }, 0.0);
}

TEST(QatSim, HadamardMatchesScipy) {
    check_cases(
        "hadamard", [](float *x, int64_t n) { hadamard(x, n); }, 2e-6);
}

TEST(QatSim, HadamardTwiceIsIdentity) {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    std::vector<float> x(128), y;
    for (auto &v : x) v = nd(rng);
    y = x;
    hadamard(y.data(), 128);
    hadamard(y.data(), 128);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
    EXPECT_ANY_THROW(hadamard(y.data(), 96));
}

TEST(QatSim, RoundingEdges) {
    EXPECT_EQ(round_e4m3(448.0f), 448.0f);
    EXPECT_EQ(round_e4m3(1000.0f), 448.0f);
    EXPECT_EQ(round_e4m3(1.0625f), 1.0f);   // tie between codes 56 (even) and 57
    EXPECT_EQ(round_e4m3(1.1875f), 1.25f);  // tie between 1.125 (odd) and 1.25 (even)
    EXPECT_EQ(round_e2m1(0.25f), 0.0f);
    EXPECT_EQ(round_e2m1(5.0f), 4.0f);
    EXPECT_EQ(round_e2m1(2.5f), 2.0f);
}

// docs/MODEL.md 4.0: compressed-layer frequencies for base 160000, YaRN factor 16, original context
// 65536, betas 32 / 1 (the spec prints them to 6 significant digits).
TEST(Rope, YarnTableMatchesTheSpec) {
    const double expect[32] = {
        1,           0.687656,    0.472871,    0.325172,    0.223607,    0.153765,    0.105737,
        0.0727108,   0.05,        0.0343828,   0.0236435,   0.0162586,   0.0111803,   0.00768823,
        0.00528686,  0.00363554,  0.00226563,  0.0013968,   0.00084969,  0.000508082, 0.000296978,
        0.00016818,  9.08678e-05, 4.54442e-05, 1.95312e-05, 5.37231e-06, 3.6943e-06,  2.54041e-06,
        1.74693e-06, 1.20129e-06, 8.26071e-07, 5.68053e-07};
    const RopeFreqs f = RopeFreqs::yarn(64, 160000, 16, 65536, 32, 1);
    ASSERT_EQ(f.f.size(), 32u);
    for (int k = 0; k < 32; ++k) EXPECT_NEAR(f.f[k], expect[k], expect[k] * 6e-6) << k;
}

TEST(Rope, InverseUndoesForward) {
    const RopeFreqs f = RopeFreqs::plain(16, 10000);
    std::vector<float> x(64), y;
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) * 0.1f - 3.0f;
    y = x;
    rope_tail(y.data(), 64, f, 1234, false);
    EXPECT_EQ(y[0], x[0]);  // the first 48 dims do not rotate
    EXPECT_NE(y[63], x[63]);
    rope_tail(y.data(), 64, f, 1234, true);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
}

// A position's angles are the f32 roundings of the double cos and sin of theta_k = p f_k, for
// both frequency sets at positions up to 1M (theta large); rope_tail rotates each tail pair by
// them (x0 c - x1 s, x0 s + x1 c in f32, s negated for the inverse: docs/MODEL.md 4.0) and leaves
// the other dims alone.
TEST(Rope, AnglesAreTheRoundedDoubleCosSinAndRotateEachPair) {
    for (const RopeFreqs &f :
         {RopeFreqs::plain(64, 10000), RopeFreqs::yarn(64, 160000, 16, 65536, 32, 1)}) {
        for (const int64_t p : {int64_t(0), int64_t(1), int64_t(805), int64_t(1048575)}) {
            const RopeAngles angles(f, p);
            ASSERT_EQ(angles.cos.size(), 32u);
            for (size_t k = 0; k < 32; ++k) {
                const double theta = double(p) * f.f[k];
                ASSERT_EQ(angles.cos[k], static_cast<float>(std::cos(theta))) << p << " " << k;
                ASSERT_EQ(angles.sin[k], static_cast<float>(std::sin(theta))) << p << " " << k;
            }
            for (const bool inverse : {false, true}) {
                std::vector<float> x(512);
                for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.37f) * 5.0f;
                std::vector<float> y = x;
                rope_tail(y.data(), 512, f, p, inverse);
                for (size_t i = 0; i < 448; ++i) ASSERT_EQ(y[i], x[i]) << i;
                for (size_t k = 0; k < 32; ++k) {
                    const float c = angles.cos[k], s = inverse ? -angles.sin[k] : angles.sin[k];
                    const float x0 = x[448 + 2 * k], x1 = x[449 + 2 * k];
                    ASSERT_EQ(y[448 + 2 * k], x0 * c - x1 * s) << "position " << p << " pair " << k;
                    ASSERT_EQ(y[449 + 2 * k], x0 * s + x1 * c) << "position " << p << " pair " << k;
                }
            }
        }
    }
}

// Appendix A: after 20 iterations the columns sum to 1 within ~1e-6 and rows approximately 1.
TEST(HyperConnections, SinkhornIsDoublyStochastic) {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int trial = 0; trial < 20; ++trial) {
        float logits[16];
        for (auto &v : logits) v = nd(rng);
        const auto c = ds4::runtime::sinkhorn(logits, 4, 20, 1e-6f);
        for (int j = 0; j < 4; ++j) {
            float col = 0, row = 0;
            for (int i = 0; i < 4; ++i) {
                col += c[i * 4 + j];
                row += c[j * 4 + i];
                EXPECT_GT(c[i * 4 + j], 0.0f);
            }
            EXPECT_NEAR(col, 1.0f, 2e-6);
            EXPECT_NEAR(row, 1.0f,
                        1e-2);  // rows converge more slowly (the last pass is on columns)
        }
    }
}

// 16 interleaved double sums of exact squares: within n double roundings of the exact sum
// (long double here, whose 64-bit significand makes this sum's own error ~2^11 times smaller),
// at every length around the 16-lane groups, on values spanning 2^-20..2^20.
TEST(RmsNorm, SumOfSquaresIsTheSumWithinDoubleRounding) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> mant(1.0f, 2.0f);
    std::uniform_int_distribution<int> ex(-20, 20), sign(0, 1);
    for (int64_t n : {0, 1, 15, 16, 17, 31, 33, 512, 4096, 16384, 16397}) {
        std::vector<float> x(static_cast<size_t>(n));
        for (float &v : x) v = std::ldexp(mant(rng), ex(rng)) * (sign(rng) ? -1.0f : 1.0f);
        long double exact = 0.0L;
        for (float v : x) exact += (long double)v * (long double)v;
        const double got = sum_of_squares(x.data(), n);
        EXPECT_LE(std::fabs((long double)got - exact), (long double)(n + 1) * 0x1p-53L * exact)
            << "n " << n;
        if (n == 0) {
            EXPECT_EQ(got, 0.0);
        }
    }
    // rms_norm's scale is 1 / sqrt(mean + eps) of that sum, rounded to float.
    std::vector<float> x(4096), y(4096);
    for (float &v : x) v = std::ldexp(mant(rng), ex(rng) / 4);
    rms_norm(x.data(), nullptr, y.data(), 4096, 1e-6f);
    long double ss = 0.0L;
    for (float v : x) ss += (long double)v * v;
    const float scale = float(1.0L / std::sqrt(ss / 4096.0L + 1e-6L));
    for (size_t i = 0; i < x.size(); ++i)
        ASSERT_NEAR(y[i], x[i] * scale, 2.0f * std::fabs(x[i] * scale) * 0x1p-24f) << i;
}

// attention_mix_heads (4 heads at once, kMixValues values) and attention_softmax +
// attention_mix_range give attention_mix_head's bits: 6 heads (a group of 4 and 2 alone), 2
// slices of values, rows in two segments, scores spanning large magnitudes.
TEST(AttentionMix, SplitFormsEqualOneHeadBitForBit) {
    constexpr uint32_t D = 2 * kMixValues;
    constexpr size_t H = 6, n0 = 37, n1 = 21, n = n0 + n1;
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> rows0(n0 * D), rows1(n1 * D), scores(H * n), sinks(H);
    for (float &v : rows0) v = nd(rng);
    for (float &v : rows1) v = nd(rng);
    for (float &v : scores) v = 8.0f * nd(rng);
    for (float &v : sinks) v = nd(rng);
    const RowSegment seg[2] = {{rows0.data(), n0}, {rows1.data(), n1}};
    const float scale = 0.125f;
    std::vector<float> want(H * D), heads(H * D, NAN), range(H * D, NAN);
    std::vector<float> sc = scores;
    for (size_t h = 0; h < H; ++h)
        attention_mix_head(sc.data() + h * n, seg, 2, scale, sinks[h], D, want.data() + h * D);
    std::vector<float> e = scores, den(H);
    for (size_t h = 0; h < H; ++h) den[h] = attention_softmax(e.data() + h * n, n, scale, sinks[h]);
    for (uint32_t d0 = 0; d0 < D; d0 += kMixValues)
        attention_mix_heads(e.data(), n, den.data(), H, seg, 2, D, d0, heads.data());
    for (size_t h = 0; h < H; ++h)
        for (uint32_t d0 = 0; d0 < D; d0 += 16)  // ranges of any width
            attention_mix_range(e.data() + h * n, seg, 2, den[h], D, d0, d0 + 16,
                                range.data() + h * D);
    for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_TRUE(std::isfinite(want[i])) << i;
        ASSERT_EQ(std::bit_cast<uint32_t>(heads[i]), std::bit_cast<uint32_t>(want[i])) << i;
        ASSERT_EQ(std::bit_cast<uint32_t>(range[i]), std::bit_cast<uint32_t>(want[i])) << i;
    }
}

}  // namespace
