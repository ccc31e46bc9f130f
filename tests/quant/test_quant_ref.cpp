// The scalar reference kernels against independent oracles:
//  - dequantization: bit for bit against gguf-py's numpy decoders (fixtures);
//  - the activation quantizers Q8_0 and Q8_K: bit for bit against gguf-py (Q8_0) and a numpy
//    transcription of docs/MODEL.md 5.5 (Q8_K), at every SIMD level this CPU runs;
//  - dot products: against an f64 dot of the dequantized operands;
//  - the Q2_K / Q4_K quantizers: round-trip error bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fixture_files.h"
#include "quant/blocks.h"
#include "quant/iq2_tables.h"
#include "quant/kernels_ref.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace ds4::quant {
namespace {

using testing::read_fixture;
using testing::read_fixture_as;

int64_t values_in(GgmlType type, size_t bytes) {
    const GgmlTypeInfo &info = ggml_type_info(type);
    return static_cast<int64_t>(bytes / info.block_bytes * info.block_elems);
}

// Every level whose kernels can run on this CPU.
std::vector<SimdLevel> runnable_levels() {
    std::vector<SimdLevel> levels;
    for (SimdLevel l : kAllSimdLevels)
        if (l <= cpu_simd_level()) levels.push_back(l);
    return levels;
}

// ---------------------------------------------------------------- dequantization vs gguf-py

struct DequantCase {
    GgmlType type;
    const char *fixture;  // <fixture>.blocks and <fixture>.dequant.f32
    DequantizeRowFn ref;
};

const DequantCase kDequantCases[] = {
    {GgmlType::F16, "f16", ref::dequantize_row_f16},
    {GgmlType::BF16, "bf16", ref::dequantize_row_bf16},
    {GgmlType::Q8_0, "q8_0", ref::dequantize_row_q8_0},
    {GgmlType::MXFP4, "mxfp4", ref::dequantize_row_mxfp4},
    {GgmlType::Q2_K, "q2_k", ref::dequantize_row_q2_K},
    {GgmlType::Q4_K, "q4_k", ref::dequantize_row_q4_K},
    {GgmlType::IQ2_XXS, "iq2_xxs", ref::dequantize_row_iq2_xxs},
    {GgmlType::Q8_K, "q8_k", ref::dequantize_row_q8_K},  // oracle: numpy d*q (gguf-py has no Q8_K)
};

class DequantizeMatchesGgufPy : public ::testing::TestWithParam<DequantCase> {};

TEST_P(DequantizeMatchesGgufPy, BitForBit) {
    const DequantCase &c = GetParam();
    const std::vector<uint8_t> blocks = read_fixture(std::string(c.fixture) + ".blocks");
    const std::vector<uint32_t> expected =
        read_fixture_as<uint32_t>(std::string(c.fixture) + ".dequant.f32");
    const int64_t n = values_in(c.type, blocks.size());
    ASSERT_EQ(blocks.size() % ggml_type_info(c.type).block_bytes, 0u);
    ASSERT_EQ(static_cast<int64_t>(expected.size()), n);
    ASSERT_GT(n, 1000);

    // The reference, then the dequantizer the dispatch table hands out at every level this CPU
    // runs (F16 has SIMD ones; the others are the reference itself).
    auto check = [&](DequantizeRowFn fn, const std::string &what) {
        std::vector<float> got(static_cast<size_t>(n));
        fn(blocks.data(), got.data(), n);
        int64_t mismatches = 0;
        for (int64_t i = 0; i < n; ++i) {
            uint32_t bits;
            std::memcpy(&bits, &got[i], 4);
            if (bits != expected[i] && mismatches++ < 5) {
                float want;
                std::memcpy(&want, &expected[i], 4);
                ADD_FAILURE() << c.fixture << " " << what << " value " << i << " (block "
                              << i / ggml_type_info(c.type).block_elems << "): got " << got[i]
                              << ", gguf-py " << want;
            }
        }
        EXPECT_EQ(mismatches, 0) << what << ": of " << n << " values";
    };
    check(c.ref, "reference");
    for (SimdLevel level : runnable_levels()) {
        const DequantizeRowFn fn = kernels(c.type, level).dequantize_row;
        if (fn != c.ref) check(fn, simd_level_name(level));
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, DequantizeMatchesGgufPy, ::testing::ValuesIn(kDequantCases),
                         [](const auto &info) { return std::string(info.param.fixture); });

TEST(Iq2Tables, MatchGgufPy) {
    const std::vector<uint8_t> grid = read_fixture("iq2xxs_grid.u8");
    ASSERT_EQ(grid.size(), 256u * 8u);
    for (int k = 0; k < 256; ++k)
        for (int j = 0; j < 8; ++j)
            ASSERT_EQ((kIq2xxsGrid[k] >> (8 * j)) & 0xff, grid[8 * k + j])
                << "grid entry " << k << " byte " << j;
    const std::vector<uint8_t> signs = read_fixture("iq2_ksigns.u8");
    ASSERT_EQ(signs.size(), 128u);
    for (int i = 0; i < 128; ++i) {
        EXPECT_EQ(kIq2Signs[i], signs[i]) << i;
        // the 8th sign makes the count of negatives even
        EXPECT_EQ(std::popcount(static_cast<unsigned>(kIq2Signs[i])) % 2, 0) << i;
    }
}

// ---------------------------------------------------------------- activation quantizers

// Quantizes the fixture input at every runnable level and compares the bytes.
void expect_quantizer_matches_fixture(GgmlType type, const std::string &fixture) {
    const std::vector<float> input = read_fixture_as<float>(fixture + ".quantize.in.f32");
    const std::vector<uint8_t> expected = read_fixture(fixture + ".quantize.out");
    const auto n = static_cast<int64_t>(input.size());
    const size_t bytes = row_size(type, n);
    ASSERT_EQ(expected.size(), bytes);
    const uint32_t block_bytes = ggml_type_info(type).block_bytes;
    for (SimdLevel level : runnable_levels()) {
        std::vector<uint8_t> got(bytes, 0xAA);
        kernels(type, level).quantize_row(input.data(), got.data(), n);
        int bad_blocks = 0;
        for (size_t b = 0; b < bytes / block_bytes; ++b)
            if (std::memcmp(&got[b * block_bytes], &expected[b * block_bytes], block_bytes) != 0 &&
                bad_blocks++ < 3)
                ADD_FAILURE() << fixture << " at level " << simd_level_name(level) << ": block "
                              << b << " differs";
        EXPECT_EQ(bad_blocks, 0) << fixture << " at level " << simd_level_name(level);
    }
}

TEST(ActivationQuantizers, Q8_0WeightQuantizerMatchesGgufPy) {
    expect_quantizer_matches_fixture(GgmlType::Q8_0, "q8_0");
}

// docs/MODEL.md 5.1: ds4 quantizes Q8_0 activations with q = lrint(x / d), rounding half to even,
// where the weight quantizer (gguf-py, ggml's reference) rounds half away from zero. With
// amax = 127, d = 1 exactly, so the values below sit exactly on ties.
TEST(ActivationQuantizers, Q8_0ActivationsRoundTiesToEvenAsDs4) {
    std::vector<float> x(kQK8_0, 0.0f);
    const std::vector<float> ties = {127.0f, 2.5f, -2.5f, 0.5f, 1.5f, -3.5f, -0.5f, 126.5f};
    std::copy(ties.begin(), ties.end(), x.begin());
    const std::vector<int8_t> ds4 = {127, 2, -2, 0, 2, -4, 0, 126};
    const std::vector<int8_t> gguf_py = {127, 3, -3, 1, 2, -4, -1, 127};
    for (SimdLevel level : runnable_levels()) {
        BlockQ8_0 act{}, weight{};
        kernels(GgmlType::Q8_0, level).quantize_activation_row(x.data(), &act, kQK8_0);
        kernels(GgmlType::Q8_0, level).quantize_row(x.data(), &weight, kQK8_0);
        EXPECT_EQ(ref::f16_to_f32(act.d), 1.0f);
        for (size_t i = 0; i < ties.size(); ++i) {
            EXPECT_EQ(act.qs[i], ds4[i]) << simd_level_name(level) << " x = " << ties[i];
            EXPECT_EQ(weight.qs[i], gguf_py[i]) << simd_level_name(level) << " x = " << ties[i];
        }
    }
    BlockQ8_0 llama{};  // llama.cpp's x86 rule rounds x * (127 / amax) half to even
    ref::quantize_row_q8_0_llamacpp(x.data(), &llama, kQK8_0);
    for (size_t i = 0; i < ties.size(); ++i) EXPECT_EQ(llama.qs[i], ds4[i]) << "x = " << ties[i];
}

TEST(ActivationQuantizers, Q8_KMatchesNumpyModelSpec) {
    expect_quantizer_matches_fixture(GgmlType::Q8_K, "q8_k");
}

TEST(ActivationQuantizers, Q8_KProperties) {
    std::mt19937 gen(7);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> x(kQK_K * 32);
    for (float &v : x) v = normal(gen);
    std::fill(x.begin(), x.begin() + kQK_K, 0.0f);  // block 0: all zero
    std::vector<BlockQ8_K> q(32);
    ref::quantize_row_q8_K(x.data(), q.data(), static_cast<int64_t>(x.size()));

    for (const int8_t v : q[0].qs) EXPECT_EQ(v, 0);
    EXPECT_EQ(q[0].d, 0.0f);
    for (int b = 1; b < 32; ++b) {
        const float *xb = x.data() + b * kQK_K;
        int first_max = 0;
        for (int i = 1; i < kQK_K; ++i)
            if (std::fabs(xb[i]) > std::fabs(xb[first_max])) first_max = i;
        EXPECT_EQ(q[b].qs[first_max], -127) << "the largest |x| maps to -127";
        for (int k = 0; k < kQK_K / 16; ++k) {
            int sum = 0;
            for (int i = 0; i < 16; ++i) sum += q[b].qs[16 * k + i];
            EXPECT_EQ(q[b].bsums[k], sum);
        }
        // round to nearest: every value within half a step of d*q (plus f32 rounding)
        for (int i = 0; i < kQK_K; ++i) {
            EXPECT_LE(q[b].qs[i], 127);
            EXPECT_GE(q[b].qs[i], -127);
            EXPECT_LE(std::fabs(xb[i] - q[b].d * q[b].qs[i]), std::fabs(q[b].d) * 0.5001f)
                << b << "," << i;
        }
    }
}

// ---------------------------------------------------------------- dot products

// The oracle: both operands dequantized (by the reference dequantizers, checked above against
// gguf-py), multiplied and summed in f64. Also returns sum |w_i x_i|, the scale of the error.
struct ExactDot {
    double value;
    double magnitude;
};

ExactDot exact_dot(GgmlType w_type, const void *w, GgmlType x_type, const void *x, int64_t n) {
    std::vector<float> wf(static_cast<size_t>(n)), xf(static_cast<size_t>(n));
    kernels(w_type, SimdLevel::Scalar).dequantize_row(w, wf.data(), n);
    kernels(x_type, SimdLevel::Scalar).dequantize_row(x, xf.data(), n);
    ExactDot d{0.0, 0.0};
    for (int64_t i = 0; i < n; ++i) {
        const double p = static_cast<double>(wf[i]) * static_cast<double>(xf[i]);
        d.value += p;
        d.magnitude += std::fabs(p);
    }
    return d;
}

// An activation row in the format `type` expects: random f32, quantized by the reference.
std::vector<uint8_t> activation_row(GgmlType act_type, int64_t n, uint64_t seed) {
    std::vector<float> x(static_cast<size_t>(n));
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float &v : x) v = normal(gen);
    // one outlier, as real activations have
    x[static_cast<size_t>(gen() % static_cast<uint64_t>(n))] = 9.0f;
    std::vector<uint8_t> out(row_size(act_type, n));
    kernels(act_type, SimdLevel::Scalar).quantize_row(x.data(), out.data(), n);
    return out;
}

// Bound on |dot - exact| relative to sum |w_i x_i| (which avoids blaming cancellation on the
// kernel). The int32 block sums are exact; what rounds is the f32 scale products (a few ulp
// per block) and the f32 sum across blocks (at most n/block ulp, about the square root of that
// in practice); the F32/F16/BF16 dots round only their double sum. Measured worst case over
// 400 rows of 4096 and 16384 values: 2.7e-8 (Q8_0), 2.2e-8 (MXFP4), 1.1e-8 (Q4_K), 2.8e-9 (F32).
constexpr double kDotRelativeBound = 1e-5;

void expect_dot_close(GgmlType w_type, VecDotFn dot, const std::vector<uint8_t> &w, int64_t n,
                      uint64_t seed) {
    const GgmlType x_type = kernels(w_type, SimdLevel::Scalar).vec_dot_type;
    const std::vector<uint8_t> x = activation_row(x_type, n, seed);
    const ExactDot exact = exact_dot(w_type, w.data(), x_type, x.data(), n);
    const float got = dot(n, w.data(), x.data());
    ASSERT_GT(exact.magnitude, 0.0);
    EXPECT_LE(std::fabs(got - exact.value), kDotRelativeBound * exact.magnitude)
        << ggml_type_name(w_type) << " n=" << n << " seed=" << seed << ": got " << got << ", exact "
        << exact.value << ", sum|wx| " << exact.magnitude;
}

struct DotCase {
    GgmlType type;
    VecDotFn ref;
};

const DotCase kDotCases[] = {
    {GgmlType::F32, ref::vec_dot_f32_f32},      {GgmlType::F16, ref::vec_dot_f16_f32},
    {GgmlType::BF16, ref::vec_dot_bf16_f32},    {GgmlType::Q8_0, ref::vec_dot_q8_0_q8_0},
    {GgmlType::MXFP4, ref::vec_dot_mxfp4_q8_0}, {GgmlType::Q2_K, ref::vec_dot_q2_K_q8_K},
    {GgmlType::Q4_K, ref::vec_dot_q4_K_q8_K},   {GgmlType::IQ2_XXS, ref::vec_dot_iq2_xxs_q8_K},
};

std::string dot_case_name(const ::testing::TestParamInfo<DotCase> &info) {
    return std::string(ggml_type_name(info.param.type));
}

class VecDotRef : public ::testing::TestWithParam<DotCase> {};

TEST_P(VecDotRef, MatchesF64DotOfDequantizedRandomRows) {
    const DotCase &c = GetParam();
    EXPECT_EQ(kernels(c.type, SimdLevel::Scalar).vec_dot, c.ref);
    const int64_t block = ggml_type_info(c.type).block_elems;
    for (const int64_t blocks : {int64_t{1}, int64_t{3}, int64_t{16}, 4096 / block}) {
        const int64_t n = blocks * block;
        for (uint64_t seed = 1; seed <= 12; ++seed) {
            const std::vector<uint8_t> w = random_blocks(c.type, n, 1000 + seed, 0.05f);
            expect_dot_close(c.type, c.ref, w, n, seed);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, VecDotRef, ::testing::ValuesIn(kDotCases), dot_case_name);

// Weights from the dequantization fixtures: negative, subnormal and zero f16 scales. (The BF16
// and MXFP4 fixtures span their whole exponent range, whose dots overflow f32: not used.)
const DotCase kFixtureDotCases[] = {
    {GgmlType::F16, ref::vec_dot_f16_f32},          {GgmlType::Q8_0, ref::vec_dot_q8_0_q8_0},
    {GgmlType::Q2_K, ref::vec_dot_q2_K_q8_K},       {GgmlType::Q4_K, ref::vec_dot_q4_K_q8_K},
    {GgmlType::IQ2_XXS, ref::vec_dot_iq2_xxs_q8_K},
};

class VecDotRefOnFixtureWeights : public ::testing::TestWithParam<DotCase> {};

TEST_P(VecDotRefOnFixtureWeights, MatchesF64Dot) {
    const DotCase &c = GetParam();
    std::string fixture(ggml_type_name(c.type));
    std::transform(fixture.begin(), fixture.end(), fixture.begin(),
                   [](char ch) { return std::tolower(ch); });
    const std::vector<uint8_t> w = read_fixture(fixture + ".blocks");
    const int64_t n = values_in(c.type, w.size());
    for (uint64_t seed = 1; seed <= 3; ++seed) expect_dot_close(c.type, c.ref, w, n, seed);
}

INSTANTIATE_TEST_SUITE_P(Formats, VecDotRefOnFixtureWeights, ::testing::ValuesIn(kFixtureDotCases),
                         dot_case_name);

// F32-family dots accumulate in double: on a row whose exact sum is known they are exact.
TEST(VecDotRef, FloatDotsRoundOnceFromDouble) {
    // 1e8 + 1 - 1e8 in f32 order would give 0; with a double accumulator it gives 1
    const float w[3] = {1.0f, 1.0f, 1.0f};
    const float x[3] = {1e8f, 1.0f, -1e8f};
    EXPECT_EQ(ref::vec_dot_f32_f32(3, w, x), 1.0f);
    const uint16_t w16[3] = {0x3c00, 0x3c00, 0x3c00};  // 1.0 in f16
    EXPECT_EQ(ref::vec_dot_f16_f32(3, w16, x), 1.0f);
    const uint16_t wbf[3] = {0x3f80, 0x3f80, 0x3f80};  // 1.0 in bf16
    EXPECT_EQ(ref::vec_dot_bf16_f32(3, wbf, x), 1.0f);
}

// ---------------------------------------------------------------- Q2_K / Q4_K quantizers

// sqrt(sum (x - deq(q(x)))^2 / sum x^2)
double relative_rms_error(GgmlType type, const std::vector<float> &x) {
    const auto n = static_cast<int64_t>(x.size());
    std::vector<uint8_t> q(row_size(type, n));
    kernels(type, SimdLevel::Scalar).quantize_row(x.data(), q.data(), n);
    std::vector<float> y(x.size());
    kernels(type, SimdLevel::Scalar).dequantize_row(q.data(), y.data(), n);
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        err += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
        ref += static_cast<double>(x[i]) * x[i];
    }
    return std::sqrt(err / ref);
}

std::vector<float> gaussian_row(int64_t n, uint64_t seed, float sigma) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> normal(0.0f, sigma);
    std::vector<float> x(static_cast<size_t>(n));
    for (float &v : x) v = normal(gen);
    return x;
}

// The baseline a K-quant search must beat: each sub-block quantized uniformly between its own
// min(x, 0) and max(x) with exact (unquantized) f64 scale and offset. Relative rms error, as above.
double min_max_baseline_error(const std::vector<float> &x, int sub_block, int nmax) {
    double err = 0, ref = 0;
    for (size_t s = 0; s < x.size(); s += static_cast<size_t>(sub_block)) {
        double lo = 0, hi = x[s];
        for (int i = 0; i < sub_block; ++i) {
            lo = std::min(lo, static_cast<double>(x[s + i]));
            hi = std::max(hi, static_cast<double>(x[s + i]));
        }
        const double step = (hi - lo) / nmax;
        for (int i = 0; i < sub_block; ++i) {
            const double level =
                step > 0 ? std::clamp(std::round((x[s + i] - lo) / step), 0.0, double(nmax)) : 0.0;
            const double y = lo + level * step;
            err += (x[s + i] - y) * (x[s + i] - y);
            ref += static_cast<double>(x[s + i]) * x[s + i];
        }
    }
    return std::sqrt(err / ref);
}

// On N(0, sigma^2) rows the baseline gives 0.327 (Q2_K: 4 levels over 16 values) and 0.078
// (Q4_K: 16 levels over 32 values), for any sigma. ggml's scale/min search lands about 10%
// below it even though its sub-scales are then rounded to 4 (Q2_K) or 6 (Q4_K) bits; we ask
// for at least 5% below, and for the absolute bounds below (measured: 0.2953 and 0.0714).
constexpr double kQ2KRelativeRmsBound = 0.30;
constexpr double kQ4KRelativeRmsBound = 0.075;
constexpr double kRequiredGainOverBaseline = 0.95;

TEST(KQuantQuantize, RoundTripErrorOnGaussianRows) {
    for (float sigma : {0.02f, 1.0f, 300.0f}) {
        const std::vector<float> x = gaussian_row(kQK_K * 64, 42, sigma);
        const double q2 = relative_rms_error(GgmlType::Q2_K, x);
        const double q4 = relative_rms_error(GgmlType::Q4_K, x);
        const double q2_baseline = min_max_baseline_error(x, 16, 3);
        const double q4_baseline = min_max_baseline_error(x, 32, 15);
        EXPECT_LT(q2, kQ2KRelativeRmsBound) << "sigma " << sigma;
        EXPECT_LT(q4, kQ4KRelativeRmsBound) << "sigma " << sigma;
        EXPECT_LT(q2, kRequiredGainOverBaseline * q2_baseline) << "sigma " << sigma;
        EXPECT_LT(q4, kRequiredGainOverBaseline * q4_baseline) << "sigma " << sigma;
        std::printf(
            "sigma %g: relative rms error Q2_K %.4f (min/max baseline %.4f), Q4_K %.4f (%.4f)\n",
            sigma, q2, q2_baseline, q4, q4_baseline);
    }
}

TEST(KQuantQuantize, ZeroAndConstantBlocks) {
    for (GgmlType type : {GgmlType::Q2_K, GgmlType::Q4_K}) {
        std::vector<float> x(kQK_K * 3, 0.0f);
        std::fill(x.begin() + kQK_K, x.begin() + 2 * kQK_K, 0.75f);  // constant positive
        std::fill(x.begin() + 2 * kQK_K, x.end(), -0.25f);           // constant negative
        std::vector<uint8_t> q(row_size(type, kQK_K * 3));
        quantize_row(type, x.data(), q.data(), kQK_K * 3);
        std::vector<float> y(x.size());
        dequantize_row(type, q.data(), y.data(), kQK_K * 3);
        for (int i = 0; i < kQK_K; ++i) ASSERT_EQ(y[i], 0.0f) << ggml_type_name(type);
        // a constant is one level of the fit: only the f16 rounding of the scale remains
        for (size_t i = kQK_K; i < x.size(); ++i)
            ASSERT_NEAR(y[i], x[i], 1e-3 * std::fabs(x[i]))
                << ggml_type_name(type) << " value " << i;
    }
}

TEST(KQuantQuantize, Deterministic) {
    const std::vector<float> x = gaussian_row(kQK_K * 4, 5, 1.0f);
    for (GgmlType type : {GgmlType::Q2_K, GgmlType::Q4_K}) {
        std::vector<uint8_t> a(row_size(type, kQK_K * 4), 0x00), b(row_size(type, kQK_K * 4), 0xff);
        quantize_row(type, x.data(), a.data(), kQK_K * 4);
        quantize_row(type, x.data(), b.data(), kQK_K * 4);
        EXPECT_EQ(a, b) << "every output byte is written, and only from the input";
    }
}

}  // namespace
}  // namespace ds4::quant
