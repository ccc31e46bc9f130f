// The AVX2 and AVX-512 kernels (kernels_simd.h) against their scalar twins (kernels_ref.h), at
// every level this CPU can run (the others are skipped, with the reason):
//   * activation quantizers (Q8_0, Q8_K): bit-identical output, nothing written past the row;
//   * dot products: |simd - ref| <= 1e-5 * sum_i |w_i * x_i| over the dequantized values.
// Row lengths of 1, 2, 3, 7, 16 and 64 blocks (and odd element counts for the float formats)
// reach every unrolled and tail path. Besides random valid blocks, extreme blocks (largest
// quants and sub-scales, activations of -128, all signs negative) reach the products that would
// overflow or wrap in 8- and 16-bit shortcuts.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "quant/blocks.h"
#include "quant/iq2_tables.h"
#include "quant/kernels_ref.h"
#include "quant/kernels_simd.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"
#include "quant/split_mix.h"
#include "random_activations.h"

namespace ds4::quant {
namespace {

// ---------------------------------------------------------------------------------------------
// The kernels of one level, by role.

struct SimdKernelSet {
    const char *name;
    SimdLevel level;
    QuantizeRowFn quantize_q8_0;
    QuantizeRowFn quantize_q8_0_activation;
    QuantizeRowFn quantize_q8_K;
    VecDotFn dot_f32;
    VecDotFn dot_f16;
    VecDotFn dot_bf16;
    VecDotFn dot_q8_0;
    VecDotFn dot_mxfp4;
    VecDotFn dot_q2_K;
    VecDotFn dot_q4_K;
    VecDotFn dot_iq2_xxs;
    DequantizeRowFn dequantize_f16;
    MultiRowTables multi_q8_0;
    VecDotMultiKernel *multi_f32, *multi_f16, *multi_bf16;
};

#define DS4_KERNEL_SET(ns, level)                                                                  \
    SimdKernelSet {                                                                                \
#ns, level, ns::quantize_row_q8_0, ns::quantize_row_q8_0_activation,                       \
            ns::quantize_row_q8_K, ns::vec_dot_f32_f32, ns::vec_dot_f16_f32, ns::vec_dot_bf16_f32, \
            ns::vec_dot_q8_0_q8_0, ns::vec_dot_mxfp4_q8_0, ns::vec_dot_q2_K_q8_K,                  \
            ns::vec_dot_q4_K_q8_K, ns::vec_dot_iq2_xxs_q8_K, ns::dequantize_row_f16,               \
            {ns::q8_0_multi_tables_bytes, ns::make_q8_0_multi_tables,                              \
             ns::vec_dot_multi_q8_0_q8_0_tables },                                                 \
             ns::vec_dot_multi_f32_f32, ns::vec_dot_multi_f16_f32, ns::vec_dot_multi_bf16_f32      \
    }
const SimdKernelSet kAvx2 = DS4_KERNEL_SET(avx2, SimdLevel::AVX2);
const SimdKernelSet kAvx512 = DS4_KERNEL_SET(avx512, SimdLevel::AVX512);
#undef DS4_KERNEL_SET

// One dot product: weight format, activation format, the reference, the SIMD twin's slot, and
// the reference dequantizers that give the values behind the tolerance.
struct DotCase {
    const char *name;
    GgmlType weight_type;
    GgmlType act_type;
    VecDotFn ref;
    VecDotFn SimdKernelSet::*simd;
    DequantizeRowFn dequantize_weight;
    DequantizeRowFn dequantize_act;
    int64_t block;  // values per weight block
};

const DotCase kDotCases[] = {
    {"f32", GgmlType::F32, GgmlType::F32, ref::vec_dot_f32_f32, &SimdKernelSet::dot_f32,
     ref::dequantize_row_f32, ref::dequantize_row_f32, 1},
    {"f16", GgmlType::F16, GgmlType::F32, ref::vec_dot_f16_f32, &SimdKernelSet::dot_f16,
     ref::dequantize_row_f16, ref::dequantize_row_f32, 1},
    {"bf16", GgmlType::BF16, GgmlType::F32, ref::vec_dot_bf16_f32, &SimdKernelSet::dot_bf16,
     ref::dequantize_row_bf16, ref::dequantize_row_f32, 1},
    {"q8_0", GgmlType::Q8_0, GgmlType::Q8_0, ref::vec_dot_q8_0_q8_0, &SimdKernelSet::dot_q8_0,
     ref::dequantize_row_q8_0, ref::dequantize_row_q8_0, kQK8_0},
    {"mxfp4", GgmlType::MXFP4, GgmlType::Q8_0, ref::vec_dot_mxfp4_q8_0, &SimdKernelSet::dot_mxfp4,
     ref::dequantize_row_mxfp4, ref::dequantize_row_q8_0, kQK_MXFP4},
    {"q2_K", GgmlType::Q2_K, GgmlType::Q8_K, ref::vec_dot_q2_K_q8_K, &SimdKernelSet::dot_q2_K,
     ref::dequantize_row_q2_K, ref::dequantize_row_q8_K, kQK_K},
    {"q4_K", GgmlType::Q4_K, GgmlType::Q8_K, ref::vec_dot_q4_K_q8_K, &SimdKernelSet::dot_q4_K,
     ref::dequantize_row_q4_K, ref::dequantize_row_q8_K, kQK_K},
    {"iq2_xxs", GgmlType::IQ2_XXS, GgmlType::Q8_K, ref::vec_dot_iq2_xxs_q8_K,
     &SimdKernelSet::dot_iq2_xxs, ref::dequantize_row_iq2_xxs, ref::dequantize_row_q8_K, kQK_K},
};

const DotCase &dot_case(const std::string &name) {
    for (const DotCase &c : kDotCases)
        if (name == c.name) return c;
    throw std::invalid_argument("no dot case " + name);
}

constexpr double kDotTolerance = 1e-5;  // relative to sum_i |w_i x_i|
constexpr int64_t kBlockCounts[] = {1, 2, 3, 7, 16, 64};
constexpr int64_t kFloatLengths[] = {1,  2,  3,  5,  7,   8,   15,   16,  17,
                                     31, 32, 33, 63, 100, 257, 1024, 4099};
constexpr int kRowsPerLength = 6;
constexpr size_t kGuardBytes = 64;
constexpr uint8_t kGuardByte = 0xA5;

// ---------------------------------------------------------------------------------------------
// Inputs

// SplitMix64, so the inputs are the same on every platform and standard library.
using Rng = ds4::quant::SplitMix64;

// f32 values for the quantizers: per 32 values, a random magnitude between 1e-6 and 1e6.
std::vector<float> random_activations(int64_t n, uint64_t seed) {
    return testing::random_activations(n, seed, -6.0f, 6.0f);
}

void recompute_bsums(BlockQ8_K &block) {
    for (int k = 0; k < kQK_K / 16; ++k) {
        int sum = 0;
        for (int i = 0; i < 16; ++i) sum += block.qs[16 * k + i];
        block.bsums[k] = static_cast<int16_t>(sum);
    }
}

// Puts -128 (which the quantizers never produce, but a Q8 block may hold) into about one value
// in eight of every Q8_0 / Q8_K block.
void sprinkle_minus_128(GgmlType type, std::vector<uint8_t> &row, uint64_t seed) {
    Rng rng(seed);
    if (type == GgmlType::Q8_0) {
        auto *blocks = reinterpret_cast<BlockQ8_0 *>(row.data());
        for (size_t b = 0; b < row.size() / sizeof(BlockQ8_0); ++b)
            for (auto &q : blocks[b].qs)
                if (rng.below(8) == 0) q = -128;
    } else if (type == GgmlType::Q8_K) {
        auto *blocks = reinterpret_cast<BlockQ8_K *>(row.data());
        for (size_t b = 0; b < row.size() / sizeof(BlockQ8_K); ++b) {
            for (auto &q : blocks[b].qs)
                if (rng.below(8) == 0) q = -128;
            recompute_bsums(blocks[b]);
        }
    }
}

// An activation row of the case's format: random valid blocks (half the rows also with -128s),
// or, for Q8 formats on odd rows, the reference quantization of random floats.
std::vector<uint8_t> activation_row(const DotCase &c, int64_t n, uint64_t seed, int row) {
    if (c.act_type != GgmlType::F32 && row % 2 == 1) {
        const std::vector<float> x = random_activations(n, seed);
        std::vector<uint8_t> out(row_size(c.act_type, n));
        if (c.act_type == GgmlType::Q8_0)
            ref::quantize_row_q8_0(x.data(), out.data(), n);
        else
            ref::quantize_row_q8_K(x.data(), out.data(), n);
        return out;
    }
    std::vector<uint8_t> out = random_blocks(c.act_type, n, seed, 3.0f);
    if (row % 4 == 2) sprinkle_minus_128(c.act_type, out, seed + 1);
    return out;
}

// ---------------------------------------------------------------------------------------------
// Checks

// sum_i |w_i x_i| over the dequantized rows: the scale of the allowed difference.
double abs_product_sum(const DotCase &c, const void *w, const void *x, int64_t n) {
    std::vector<float> wf(static_cast<size_t>(n)), xf(static_cast<size_t>(n));
    c.dequantize_weight(w, wf.data(), n);
    c.dequantize_act(x, xf.data(), n);
    double sum = 0.0;
    for (size_t i = 0; i < wf.size(); ++i) sum += std::fabs(static_cast<double>(wf[i]) * xf[i]);
    return sum;
}

void expect_dot_close(const SimdKernelSet &k, const DotCase &c, const void *w, const void *x,
                      int64_t n, const std::string &what) {
    const float want = c.ref(n, w, x);
    const float got = (k.*c.simd)(n, w, x);
    const double scale = abs_product_sum(c, w, x, n);
    ASSERT_TRUE(std::isfinite(want) && std::isfinite(scale)) << what << ": test input overflows";
    EXPECT_LE(std::fabs(static_cast<double>(got) - want), kDotTolerance * scale)
        << what << ": " << k.name << " " << got << ", reference " << want << ", sum|wx| " << scale;
}

// Runs a quantizer into a buffer followed by guard bytes and returns the row; fails the test
// if a guard byte changed.
std::vector<uint8_t> quantize_guarded(QuantizeRowFn fn, GgmlType type, const float *x, int64_t n,
                                      const std::string &what) {
    const size_t bytes = row_size(type, n);
    std::vector<uint8_t> out(bytes + kGuardBytes, kGuardByte);
    fn(x, out.data(), n);
    for (size_t i = bytes; i < out.size(); ++i) {
        if (out[i] != kGuardByte) {
            ADD_FAILURE() << what << ": wrote past the row at byte " << i - bytes;
            break;
        }
    }
    out.resize(bytes);
    return out;
}

// Bit-identical to the reference; the first differing block is reported.
void expect_quantize_identical(QuantizeRowFn simd, QuantizeRowFn reference, GgmlType type,
                               const std::vector<float> &x, const std::string &what) {
    const auto n = static_cast<int64_t>(x.size());
    const std::vector<uint8_t> want = quantize_guarded(reference, type, x.data(), n, what + " ref");
    const std::vector<uint8_t> got = quantize_guarded(simd, type, x.data(), n, what);
    if (want == got) return;
    const size_t block_bytes = row_size(type, ggml_type_info(type).block_elems);
    for (size_t i = 0; i < want.size(); ++i) {
        if (want[i] != got[i]) {
            ADD_FAILURE() << what << ": differs from the reference in block " << i / block_bytes
                          << " at byte " << i % block_bytes << " (" << int(got[i]) << " vs "
                          << int(want[i]) << ")";
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tests, once per level

class SimdKernels : public ::testing::TestWithParam<const SimdKernelSet *> {
  protected:
    void SetUp() override {
        if (cpu_simd_level() < GetParam()->level)
            GTEST_SKIP() << "this CPU lacks the " << GetParam()->name
                         << " instruction set (best: " << simd_level_name(cpu_simd_level()) << ")";
    }
    const SimdKernelSet &k() const { return *GetParam(); }
};

TEST_P(SimdKernels, DotProductsMatchReferenceOnRandomRows) {
    for (const DotCase &c : kDotCases) {
        std::vector<int64_t> lengths;
        if (c.block == 1)
            lengths.assign(std::begin(kFloatLengths), std::end(kFloatLengths));
        else
            for (int64_t nb : kBlockCounts) lengths.push_back(nb * c.block);
        for (int64_t n : lengths) {
            for (int row = 0; row < kRowsPerLength; ++row) {
                const uint64_t seed = 1000 * static_cast<uint64_t>(n) + static_cast<uint64_t>(row);
                const std::vector<uint8_t> w = random_blocks(c.weight_type, n, seed, 2.0f);
                const std::vector<uint8_t> x = activation_row(c, n, seed + 7777, row);
                expect_dot_close(k(), c, w.data(), x.data(), n,
                                 std::string(c.name) + " n=" + std::to_string(n) + " row " +
                                     std::to_string(row));
            }
        }
    }
}

// The Q8_0 dot has one order of float operations (the reference's 16 chains, q8_0.cpp), so every
// level gives the reference's float bit for bit, not just within kDotTolerance: lengths around
// the kernels' groups of 8 and 16 blocks, -128 in both operands, and scales from 2^-14 to 2^16
// with random mantissas (so that d_w * d_x rounds and the order of the products matters).
TEST_P(SimdKernels, Q8_0DotEqualsReferenceBitForBit) {
    const DotCase &c = dot_case("q8_0");
    int compared = 0;
    for (int64_t nb : {1, 2, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 128, 129, 136}) {
        const int64_t n = nb * kQK8_0;
        for (int row = 0; row < kRowsPerLength; ++row) {
            const uint64_t seed = 77 * static_cast<uint64_t>(nb) + static_cast<uint64_t>(row);
            std::vector<uint8_t> w = random_blocks(GgmlType::Q8_0, n, seed, 2.0f);
            std::vector<uint8_t> x = activation_row(c, n, seed + 31, row);
            sprinkle_minus_128(GgmlType::Q8_0, w, seed + 1);
            sprinkle_minus_128(GgmlType::Q8_0, x, seed + 2);
            Rng rng(seed + 3);
            for (size_t b = 0; b < w.size() / sizeof(BlockQ8_0); ++b) {
                reinterpret_cast<BlockQ8_0 *>(w.data())[b].d =
                    ref::f32_to_f16(std::ldexp(1.0f + static_cast<float>(rng.below(1024)) / 1024.0f,
                                               static_cast<int>(rng.below(30)) - 14));
            }
            const float want = c.ref(n, w.data(), x.data());
            const float got = k().dot_q8_0(n, w.data(), x.data());
            ASSERT_TRUE(std::isfinite(want)) << "nb " << nb << ": test input overflows";
            EXPECT_EQ(std::memcmp(&want, &got, sizeof(float)), 0)
                << k().name << " nb " << nb << " row " << row << ": " << got << ", reference "
                << want;
            ++compared;
        }
    }
    EXPECT_EQ(compared, 15 * kRowsPerLength);
}

// The level's Q8_0 multi-row kernel against the reference dot, bit for bit, on the shapes of its
// paths: 1 and 2 activation rows (the row kernel with the activation's tables), 3 and more
// (panels of 16 rows at AVX-512, from 8 rows panels of 8 at AVX2), weight rows that fill panels
// and leave partial ones, block counts around the groups of 8 and 16; -128 in both operands,
// random f16 scales, outputs in a wider row (out_stride) whose gaps must stay untouched.
TEST_P(SimdKernels, Q8_0MultiRowEqualsReferenceBitForBit) {
    const DotCase &c = dot_case("q8_0");
    int compared = 0;
    for (int64_t nb : {1, 9, 16, 33}) {
        const int64_t n = nb * kQK8_0;
        const size_t row_bytes = row_size(GgmlType::Q8_0, n);
        for (int64_t n_w : {1, 7, 16, 17, 40}) {
            for (int64_t m : {1, 2, 3, 8, 11}) {
                const uint64_t seed = 1000003 * static_cast<uint64_t>(nb) +
                                      1009 * static_cast<uint64_t>(n_w) + static_cast<uint64_t>(m);
                std::vector<uint8_t> w = random_blocks(GgmlType::Q8_0, n * n_w, seed, 2.0f);
                std::vector<uint8_t> x = random_blocks(GgmlType::Q8_0, n * m, seed + 1, 3.0f);
                sprinkle_minus_128(GgmlType::Q8_0, w, seed + 2);
                sprinkle_minus_128(GgmlType::Q8_0, x, seed + 3);
                const int64_t out_stride = n_w + 3;
                std::vector<float> out(static_cast<size_t>(m * out_stride), -7.0f);
                const MultiRowTables &mt = k().multi_q8_0;
                std::vector<uint8_t> tables(mt.bytes(n, m) + 1, 0xA5);  // + a guard byte
                mt.make(n, x.data(), row_bytes, m, tables.data());
                EXPECT_EQ(tables.back(), 0xA5) << "the tables overran their size, m " << m;
                mt.dot(n, w.data(), row_bytes, n_w, x.data(), row_bytes, m, tables.data(),
                       out.data(), out_stride);
                for (int64_t j = 0; j < m; ++j) {
                    for (int64_t i = 0; i < out_stride; ++i) {
                        const float got = out[static_cast<size_t>(j * out_stride + i)];
                        if (i >= n_w) {
                            EXPECT_EQ(got, -7.0f) << "wrote outside the rows, m " << m;
                            continue;
                        }
                        const float want =
                            c.ref(n, w.data() + i * row_bytes, x.data() + j * row_bytes);
                        EXPECT_EQ(std::memcmp(&want, &got, sizeof(float)), 0)
                            << k().name << " nb " << nb << ", " << n_w << " weight rows, m " << m
                            << ", row " << i << " x " << j << ": " << got << ", reference " << want;
                        ++compared;
                    }
                }
            }
        }
    }
    EXPECT_EQ(compared, 4 * (1 + 7 + 16 + 17 + 40) * (1 + 2 + 3 + 8 + 11));
}

// The float formats' multi-row kernels (f64 accumulation, several weight rows a pass) against
// the level's own one-row dot, bit for bit: lengths with and without the 16- and 32-value steps'
// remainders and spans of 256 converted at once, weight rows that leave a partial pass.
TEST_P(SimdKernels, FloatMultiRowEqualsTheOneRowDotBitForBit) {
    struct Case {
        const char *name;
        GgmlType type;
        VecDotFn SimdKernelSet::*dot;
        VecDotMultiKernel *SimdKernelSet::*multi;
    };
    const Case cases[] = {
        {"f32", GgmlType::F32, &SimdKernelSet::dot_f32, &SimdKernelSet::multi_f32},
        {"f16", GgmlType::F16, &SimdKernelSet::dot_f16, &SimdKernelSet::multi_f16},
        {"bf16", GgmlType::BF16, &SimdKernelSet::dot_bf16, &SimdKernelSet::multi_bf16}};
    int compared = 0;
    for (const Case &c : cases) {
        for (int64_t n : {3, 16, 35, 300, 1003}) {
            const size_t row_bytes = row_size(c.type, n);
            for (int64_t n_w : {1, 2, 5}) {
                const int64_t m = 3;
                const uint64_t seed = 31 * static_cast<uint64_t>(n) + static_cast<uint64_t>(n_w);
                const std::vector<uint8_t> w = random_blocks(c.type, n * n_w, seed, 2.0f);
                const std::vector<float> x = random_activations(n * m, seed + 1);
                std::vector<float> out(static_cast<size_t>(m * n_w));
                (k().*c.multi)(n, w.data(), row_bytes, n_w, x.data(), n * sizeof(float), m,
                               out.data(), n_w);
                for (int64_t j = 0; j < m; ++j)
                    for (int64_t i = 0; i < n_w; ++i) {
                        const float want =
                            (k().*c.dot)(n, w.data() + i * row_bytes, x.data() + j * n);
                        const float got = out[static_cast<size_t>(j * n_w + i)];
                        EXPECT_EQ(std::memcmp(&want, &got, sizeof(float)), 0)
                            << k().name << " " << c.name << " n " << n << " row " << i << " x " << j
                            << ": " << got << ", one row " << want;
                        ++compared;
                    }
            }
        }
    }
    EXPECT_EQ(compared, 3 * 5 * (1 + 2 + 5) * 3);
}

// Every weight at its largest quant and sub-scale and every activation at -128 (then +127, then
// alternating), so each per-block integer sum is as large as the format allows.
TEST_P(SimdKernels, DotProductsExactAtExtremeQuants) {
    const int64_t nb = 7;
    for (int variant = 0; variant < 3; ++variant) {
        auto act_q = [&](int i) -> int8_t {
            if (variant == 0) return -128;
            if (variant == 1) return 127;
            return i % 2 == 0 ? -128 : 127;
        };
        const std::string tag = " activations " + std::string(variant == 0   ? "-128"
                                                              : variant == 1 ? "127"
                                                                             : "+-");

        std::vector<BlockQ8_0> x0(static_cast<size_t>(nb * kQK_K / kQK8_0));
        for (auto &b : x0) {
            b.d = ref::f32_to_f16(1000.0f);
            for (int i = 0; i < kQK8_0; ++i) b.qs[i] = act_q(i);
        }
        std::vector<BlockQ8_K> xk(static_cast<size_t>(nb));
        for (auto &b : xk) {
            b.d = 1000.0f;
            for (int i = 0; i < kQK_K; ++i) b.qs[i] = act_q(i);
            recompute_bsums(b);
        }

        // Q8_0: weights all -128
        std::vector<BlockQ8_0> w80(x0.size());
        for (auto &b : w80) {
            b.d = ref::f32_to_f16(60000.0f);
            std::memset(b.qs, 0x80, sizeof b.qs);
        }
        const int64_t n0 = static_cast<int64_t>(x0.size()) * kQK8_0;
        expect_dot_close(k(), dot_case("q8_0"), w80.data(), x0.data(), n0, "q8_0 all -128" + tag);
        // MXFP4: every code -6 (doubled: -12), then every code +6
        for (uint8_t code : {uint8_t{0xFF}, uint8_t{0x77}}) {
            std::vector<BlockMXFP4> wm(x0.size());
            for (auto &b : wm) {
                b.e = 127 + 20;
                std::memset(b.qs, code, sizeof b.qs);
            }
            expect_dot_close(k(), dot_case("mxfp4"), wm.data(), x0.data(), n0, "mxfp4 |6|" + tag);
        }
        // Q2_K: sub-scales and mins 15, quants 3
        std::vector<BlockQ2_K> w2(static_cast<size_t>(nb));
        for (auto &b : w2) {
            std::memset(b.scales, 0xFF, sizeof b.scales);
            std::memset(b.qs, 0xFF, sizeof b.qs);
            b.d = ref::f32_to_f16(60000.0f);
            b.dmin = ref::f32_to_f16(50000.0f);
        }
        expect_dot_close(k(), dot_case("q2_K"), w2.data(), xk.data(), nb * kQK_K, "q2_K max" + tag);
        // Q4_K: scales and mins 63, quants 15
        std::vector<BlockQ4_K> w4(static_cast<size_t>(nb));
        for (auto &b : w4) {
            std::memset(b.scales, 0xFF, sizeof b.scales);
            std::memset(b.qs, 0xFF, sizeof b.qs);
            b.d = ref::f32_to_f16(60000.0f);
            b.dmin = ref::f32_to_f16(50000.0f);
        }
        expect_dot_close(k(), dot_case("q4_K"), w4.data(), xk.data(), nb * kQK_K, "q4_K max" + tag);
        // IQ2_XXS: the grid point of largest magnitudes, scale 15, all signs negative (a1 of all
        // ones: four sign indices of 127, whose parity completes them to 0xFF), then all positive
        int largest = 0;
        auto grid_sum = [](int i) {
            int s = 0;
            for (int j = 0; j < 8; ++j) s += static_cast<int>((kIq2xxsGrid[i] >> (8 * j)) & 0xFF);
            return s;
        };
        for (int i = 1; i < 256; ++i)
            if (grid_sum(i) > grid_sum(largest)) largest = i;
        for (uint32_t a1 : {0xFFFFFFFFu, 0xF0000000u}) {
            std::vector<BlockIQ2_XXS> wi(static_cast<size_t>(nb));
            for (auto &b : wi) {
                b.d = ref::f32_to_f16(60000.0f);
                for (int g = 0; g < 8; ++g) {
                    const uint32_t a0 = 0x01010101u * static_cast<uint32_t>(largest);
                    std::memcpy(&b.qs[4 * g], &a0, 4);
                    std::memcpy(&b.qs[4 * g + 2], &a1, 4);
                }
            }
            expect_dot_close(k(), dot_case("iq2_xxs"), wi.data(), xk.data(), nb * kQK_K,
                             "iq2_xxs max a1=" + std::to_string(a1) + tag);
        }
    }
}

// Weights and activations of extreme float magnitudes for the float formats: f16 65504 and
// subnormals, bf16 near 1e30, huge and tiny f32.
TEST_P(SimdKernels, FloatDotProductsAtExtremeValues) {
    const int64_t n = 1031;
    Rng rng(99);
    std::vector<float> x(static_cast<size_t>(n)), wf(static_cast<size_t>(n));
    std::vector<uint16_t> wh(static_cast<size_t>(n)), wb(static_cast<size_t>(n));
    for (size_t i = 0; i < x.size(); ++i) {
        x[i] = rng.uniform(-1.0f, 1.0f) * (i % 3 == 0 ? 1e20f : 1e-20f);
        wf[i] = rng.uniform(-1.0f, 1.0f) * (i % 5 == 0 ? 1e15f : 1e-30f);
        wh[i] = i % 2 == 0 ? uint16_t{0x7BFF}
                           : static_cast<uint16_t>(0x8001 + i % 0x3FF);        // max, subnormal
        wb[i] = static_cast<uint16_t>(i % 2 == 0 ? 0x7149 : 0x0080 + i % 64);  // ~1e30, tiny
    }
    expect_dot_close(k(), dot_case("f32"), wf.data(), x.data(), n, "f32 extremes");
    expect_dot_close(k(), dot_case("f16"), wh.data(), x.data(), n, "f16 extremes");
    for (float &v : x) v *= 1e-22f;
    expect_dot_close(k(), dot_case("bf16"), wb.data(), x.data(), n, "bf16 extremes");
}

TEST_P(SimdKernels, ActivationQuantizersBitIdenticalOnRandomRows) {
    for (int64_t nb : kBlockCounts) {
        for (int row = 0; row < kRowsPerLength; ++row) {
            const uint64_t seed = 500 * static_cast<uint64_t>(nb) + static_cast<uint64_t>(row);
            const std::string where =
                " blocks=" + std::to_string(nb) + " row " + std::to_string(row);
            const std::vector<float> x0 = random_activations(nb * kQK8_0, seed);
            expect_quantize_identical(k().quantize_q8_0, ref::quantize_row_q8_0, GgmlType::Q8_0, x0,
                                      "q8_0" + where);
            expect_quantize_identical(k().quantize_q8_0_activation,
                                      ref::quantize_row_q8_0_activation, GgmlType::Q8_0, x0,
                                      "q8_0 activation" + where);
            const std::vector<float> xk = random_activations(nb * kQK_K, seed);
            expect_quantize_identical(k().quantize_q8_K, ref::quantize_row_q8_K, GgmlType::Q8_K, xk,
                                      "q8_K" + where);
        }
    }
}

// Blocks that take the quantizers' special paths, one block each, for both block sizes:
// all zero; one nonzero value; the largest magnitude negative; a tie between +a and -a for the
// largest magnitude (Q8_K keeps the first); values that scale to exact halves (rounding
// direction); a tiny largest magnitude (1/d overflows in Q8_0); signed zeros.
std::vector<float> special_blocks(int block, uint64_t seed) {
    Rng rng(seed);
    std::vector<std::vector<float>> blocks;
    auto random_block = [&](float mag) {
        std::vector<float> b(static_cast<size_t>(block));
        for (float &v : b) v = mag * rng.uniform(-1.0f, 1.0f);
        return b;
    };
    blocks.push_back(std::vector<float>(static_cast<size_t>(block), 0.0f));
    {
        std::vector<float> b(static_cast<size_t>(block), 0.0f);
        b[5] = -3.5f;
        blocks.push_back(b);
    }
    {
        auto b = random_block(1.0f);
        b[7] = -4.0f;
        blocks.push_back(b);
    }
    for (float first : {1.0f, -1.0f}) {
        auto b = random_block(0.9f);
        b[3] = first;
        b[block - 2] = -first;
        blocks.push_back(b);
    }
    {
        // k/2 * amax/127 for integer k: x / d lands on or next to a half
        std::vector<float> b(static_cast<size_t>(block));
        for (float &v : b) v = static_cast<float>(rng.below(509) - 254) / 2.0f * (3.0f / 127.0f);
        b[0] = 3.0f;
        blocks.push_back(b);
        for (float &v : b) v = -v;
        blocks.push_back(b);
    }
    {
        std::vector<float> b(static_cast<size_t>(block));
        for (int i = 0; i < block; ++i)
            b[static_cast<size_t>(i)] = static_cast<float>(i - block / 2) * 0.5f;
        blocks.push_back(b);
    }
    blocks.push_back(random_block(1e-36f));  // Q8_K's iscale stays finite
    blocks.push_back(random_block(1e30f));
    {
        auto b = random_block(1.0f);
        for (int i = 0; i < block; i += 3) b[static_cast<size_t>(i)] = (i % 2 == 0) ? 0.0f : -0.0f;
        blocks.push_back(b);
    }
    std::vector<float> x;
    for (const auto &b : blocks) x.insert(x.end(), b.begin(), b.end());
    return x;
}

TEST_P(SimdKernels, ActivationQuantizersBitIdenticalOnSpecialBlocks) {
    expect_quantize_identical(k().quantize_q8_0, ref::quantize_row_q8_0, GgmlType::Q8_0,
                              special_blocks(kQK8_0, 1), "q8_0 special");
    expect_quantize_identical(k().quantize_q8_0_activation, ref::quantize_row_q8_0_activation,
                              GgmlType::Q8_0, special_blocks(kQK8_0, 1), "q8_0 activation special");
    expect_quantize_identical(k().quantize_q8_K, ref::quantize_row_q8_K, GgmlType::Q8_K,
                              special_blocks(kQK_K, 2), "q8_K special");

    // Q8_0 defines the non-finite cases (NaN -> 0, +-inf -> the int8 bounds, 1/d overflowing
    // for a subnormal amax); Q8_K's lrint of them is unspecified, so only Q8_0 sees them.
    std::vector<float> x = special_blocks(kQK8_0, 3);
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> odd(4 * kQK8_0);
    Rng rng(4);
    for (float &v : odd) v = rng.uniform(-1.0f, 1.0f);
    odd[3] = nan;           // block 0: a NaN
    odd[kQK8_0 + 4] = inf;  // block 1: +inf
    odd[kQK8_0 + 9] = -inf;
    for (int i = 0; i < kQK8_0; ++i) odd[2 * kQK8_0 + i] *= 1e-39f;  // block 2: subnormal amax
    odd[3 * kQK8_0 + 1] = nan;                                       // block 3: NaN first
    odd[3 * kQK8_0] = nan;
    x.insert(x.end(), odd.begin(), odd.end());
    expect_quantize_identical(k().quantize_q8_0, ref::quantize_row_q8_0, GgmlType::Q8_0, x,
                              "q8_0 non-finite");
    expect_quantize_identical(k().quantize_q8_0_activation, ref::quantize_row_q8_0_activation,
                              GgmlType::Q8_0, x, "q8_0 activation non-finite");
}

// Every one of the 65,536 halves, at every offset of a SIMD register (rows of 1..40 values):
// the reference's float bit for bit, but for the signaling NaNs, which come back quiet (still
// NaNs of the same sign; no computed value is one).
TEST_P(SimdKernels, F16DequantizeEqualsReferenceForEveryHalf) {
    std::vector<uint16_t> all(65536);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
    std::vector<float> got(all.size() + 1, -1.0f), want(all.size());
    ref::dequantize_row_f16(all.data(), want.data(), int64_t(all.size()));
    k().dequantize_f16(all.data(), got.data(), int64_t(all.size()));
    EXPECT_EQ(got.back(), -1.0f) << "wrote past the row";
    int differing = 0;
    for (size_t i = 0; i < all.size(); ++i) {
        const bool signaling_nan =
            (all[i] & 0x7c00) == 0x7c00 && (all[i] & 0x3ff) != 0 && (all[i] & 0x200) == 0;
        if (signaling_nan) {
            EXPECT_TRUE(std::isnan(got[i]) && std::signbit(got[i]) == std::signbit(want[i]))
                << std::hex << all[i];
        } else if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i]) &&
                   ++differing <= 5) {
            ADD_FAILURE() << "half 0x" << std::hex << all[i] << ": " << got[i] << ", reference "
                          << want[i];
        }
    }
    EXPECT_EQ(differing, 0);
    for (int64_t n = 1; n <= 40; ++n) {  // the tails after whole registers
        std::vector<float> part(size_t(n) + 1, -1.0f);
        k().dequantize_f16(all.data() + 15360, part.data(), n);  // 0x3c00 = 1.0 onward
        for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(std::bit_cast<uint32_t>(part[size_t(i)]),
                      std::bit_cast<uint32_t>(want[15360 + size_t(i)]))
                << "n " << n << " value " << i;
        EXPECT_EQ(part.back(), -1.0f) << "n " << n << ": wrote past the row";
    }
}

// The quantized activation and the dot product together: what a matvec does with them.
TEST_P(SimdKernels, QuantizedActivationDotsAgreeWithReferencePipeline) {
    const int64_t n = 16 * kQK_K;
    const std::vector<float> x = random_activations(n, 77);
    for (const DotCase &c : kDotCases) {
        if (c.act_type == GgmlType::F32) continue;
        const std::vector<uint8_t> w = random_blocks(c.weight_type, n, 78, 1.0f);
        std::vector<uint8_t> x_ref(row_size(c.act_type, n)), x_simd(x_ref.size());
        const bool q80 = c.act_type == GgmlType::Q8_0;
        (q80 ? ref::quantize_row_q8_0_activation : ref::quantize_row_q8_K)(x.data(), x_ref.data(),
                                                                           n);
        (q80 ? k().quantize_q8_0_activation : k().quantize_q8_K)(x.data(), x_simd.data(), n);
        ASSERT_EQ(x_ref, x_simd) << c.name;
        expect_dot_close(k(), c, w.data(), x_simd.data(), n, std::string(c.name) + " pipeline");
    }
}

INSTANTIATE_TEST_SUITE_P(Levels, SimdKernels, ::testing::Values(&kAvx2, &kAvx512),
                         [](const ::testing::TestParamInfo<const SimdKernelSet *> &info) {
                             return std::string(info.param->name);
                         });

}  // namespace
}  // namespace ds4::quant
