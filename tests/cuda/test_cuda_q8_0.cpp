// The Q8_0 decode kernels of the CUDA backend against their CPU twins (quant/kernels_ref.h,
// through the dispatch table of the CPU backend):
//   - the activation quantizer is bit for bit the CPU's quantize_row_q8_0_activation, on random
//     rows and on rows built to hit its edge cases (exact ties of x / d, an all-zero block,
//     NaN, a block whose largest value is negative);
//   - the matvec equals the CPU's matvec within the float-reassociation bound of its terms:
//     both sum the same per-block terms float(sumi) * (dw * dx), so for n_blocks terms
//     |gpu - cpu| <= 2 * n_blocks * eps_f32 * sum_b |term_b| (each order's rounding error is at
//     most (n_blocks - 1) eps times that sum);
//   - outputs are poisoned with NaN before every launch (a row the kernel skips fails), and two
//     launches give the same bits (no atomics, a fixed reduction order);
//   - the routed-expert form (6 slots over 16 or 256 experts, one id repeated, the activation
//     shared by all slots or one per slot) meets the same bound against vec_dot on the selected
//     expert's rows, and each slot's outputs are bit for bit the dense kernel's on that expert.
// Without a CUDA device every test skips and says so.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/q8_0_matvec.h"
#include "cuda_test_util.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace ds4::cuda {
namespace {

using test::to_device;
using test::to_host;

std::vector<float> random_floats(int64_t n, uint64_t seed, float magnitude) {
    std::vector<float> v(static_cast<size_t>(n));
    quant::fill_random_blocks(GgmlType::F32, v.data(), n, seed, magnitude);
    return v;
}

struct DeviceActivation {
    DeviceBuffer q, d;
};

DeviceActivation quantize_on_device(const std::vector<float> &x) {
    const int64_t k = static_cast<int64_t>(x.size());
    DeviceBuffer dx = to_device(x);
    DeviceActivation a{DeviceBuffer(size_t(k)), DeviceBuffer(size_t(k / 32) * sizeof(float))};
    quantize_q8_0_activation(dx.as<float>(), k, a.q.as<int8_t>(), a.d.as<float>(), nullptr);
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    return a;
}

// The CPU twin's blocks for x, unpacked into the device's two planes.
void cpu_quantize(const std::vector<float> &x, std::vector<int8_t> &q, std::vector<float> &d) {
    const int64_t k = static_cast<int64_t>(x.size());
    std::vector<quant::BlockQ8_0> blocks(size_t(k / 32));
    quant::kernels(GgmlType::Q8_0).quantize_activation_row(x.data(), blocks.data(), k);
    q.resize(size_t(k));
    d.resize(blocks.size());
    for (size_t b = 0; b < blocks.size(); ++b) {
        std::memcpy(q.data() + b * 32, blocks[b].qs, 32);
        quant::dequantize_row(GgmlType::F16, &blocks[b].d, &d[b], 1);
    }
}

void expect_quantizer_matches_cpu(const std::vector<float> &x) {
    std::vector<int8_t> want_q;
    std::vector<float> want_d;
    cpu_quantize(x, want_q, want_d);
    const DeviceActivation a = quantize_on_device(x);
    const auto got_q = to_host<int8_t>(a.q, want_q.size());
    const auto got_d = to_host<float>(a.d, want_d.size());
    for (size_t i = 0; i < want_q.size(); ++i)
        ASSERT_EQ(got_q[i], want_q[i]) << "value " << i << " x=" << x[i];
    for (size_t b = 0; b < want_d.size(); ++b)
        ASSERT_EQ(std::memcmp(&got_d[b], &want_d[b], sizeof(float)), 0) << "scale of block " << b;
}

TEST(CudaQ8_0, ActivationQuantizerEqualsCpuOnRandomRows) {
    DS4_REQUIRE_CUDA_DEVICE();
    for (uint64_t seed = 1; seed <= 4; ++seed)
        expect_quantizer_matches_cpu(random_floats(4096, seed, seed == 4 ? 1e-3f : 3.0f));
}

TEST(CudaQ8_0, ActivationQuantizerEqualsCpuOnEdgeCases) {
    DS4_REQUIRE_CUDA_DEVICE();
    std::vector<float> x(32 * 5, 0.0f);  // block 0: all zero
    for (int i = 0; i < 32; ++i) {
        x[32 + i] = 127.0f * (i - 16) / 32.0f + 0.5f * (i % 2);  // block 1: d = 1, ties at .5
        x[64 + i] = i == 7 ? -5.0f : 0.1f * i;                   // block 2: largest is negative
        x[96 + i] = i == 3 ? std::numeric_limits<float>::quiet_NaN() : 1.0f;  // block 3: NaN
        x[128 + i] = std::ldexp(1.0f, -140) * (i + 1);  // block 4: subnormal values
    }
    x[32 + 31] = 127.0f;  // block 1's amax, so d = 1 exactly
    expect_quantizer_matches_cpu(x);
}

// Whether the kernel's output for weight row w (k values) against activation blocks xb is
// within the bound above of the CPU's vec_dot.
::testing::AssertionResult within_reassociation_bound(const quant::BlockQ8_0 *w,
                                                      const quant::BlockQ8_0 *xb, int64_t k,
                                                      float got) {
    const float want = quant::kernels(GgmlType::Q8_0).vec_dot(k, w, xb);
    const int64_t nb = k / 32;
    double abs_terms = 0;
    for (int64_t b = 0; b < nb; ++b) {
        int32_t s = 0;
        for (int i = 0; i < 32; ++i) s += w[b].qs[i] * xb[b].qs[i];
        float dw_f, dx_f;
        quant::dequantize_row(GgmlType::F16, &w[b].d, &dw_f, 1);
        quant::dequantize_row(GgmlType::F16, &xb[b].d, &dx_f, 1);
        abs_terms += std::fabs(double(s) * double(dw_f * dx_f));
    }
    const double bound = 2.0 * double(nb) * FLT_EPSILON * abs_terms;
    if (std::isnan(got)) return ::testing::AssertionFailure() << "not written";
    if (std::fabs(double(got) - double(want)) > bound)
        return ::testing::AssertionFailure()
               << got << " vs the CPU's " << want << ", more than " << bound << " apart";
    return ::testing::AssertionSuccess();
}

struct MatvecCase {
    int64_t n_rows, k;
};

// How gtest prints a case (the test list that CTest reads names each case by it).
void PrintTo(const MatvecCase &c, std::ostream *os) {
    *os << c.n_rows << "x" << c.k;
}

class CudaQ8_0Matvec : public ::testing::TestWithParam<MatvecCase> {};

TEST_P(CudaQ8_0Matvec, EqualsCpuWithinReassociationBound) {
    DS4_REQUIRE_CUDA_DEVICE();
    const auto [n_rows, k] = GetParam();
    const auto w = quant::random_blocks(GgmlType::Q8_0, n_rows * k, 11 + k);
    const auto x = random_floats(k, 5 + n_rows, 2.0f);
    const Q8_0Weights dw(w.data(), n_rows, k);
    const DeviceActivation a = quantize_on_device(x);

    // CPU twin: the same activation blocks, vec_dot per row; the bound from the same terms.
    std::vector<quant::BlockQ8_0> xb(size_t(k / 32));
    quant::kernels(GgmlType::Q8_0).quantize_activation_row(x.data(), xb.data(), k);
    const auto *wb = reinterpret_cast<const quant::BlockQ8_0 *>(w.data());
    const int64_t nb = k / 32;

    DeviceBuffer y(size_t(n_rows) * sizeof(float));
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
        DS4_CUDA_CHECK(cudaMemset(y.get(), 0xff, y.bytes()));  // NaN in every output
        matvec_q8_0(dw.matrix(), a.q.as<int8_t>(), a.d.as<float>(), y.as<float>(), nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(y, size_t(n_rows));
        if (run == 1) {
            ASSERT_EQ(std::memcmp(got.data(), first.data(), got.size() * sizeof(float)), 0)
                << "two launches differ";
            break;
        }
        first = got;
        for (int64_t r = 0; r < n_rows; ++r)
            ASSERT_TRUE(within_reassociation_bound(wb + r * nb, xb.data(), k, got[size_t(r)]))
                << "row " << r << " of " << n_rows << " x " << k;
    }
}

// Shapes of the published model (k x rows: q_a, kv, q_b, wo_b, shared expert down) and odd ones:
// a row count that does not fill a block of warps, k not a multiple of the 512-value chunk.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaQ8_0Matvec,
                         ::testing::Values(MatvecCase{1024, 4096}, MatvecCase{512, 4096},
                                           MatvecCase{32768, 1024}, MatvecCase{4096, 8192},
                                           MatvecCase{4096, 2048}, MatvecCase{37, 96},
                                           MatvecCase{8193, 544}, MatvecCase{1, 32}),
                         [](const auto &info) {
                             return std::to_string(info.param.n_rows) + "x" +
                                    std::to_string(info.param.k);
                         });

struct ExpertCase {
    int64_t n_experts, n_rows, k;
};

void PrintTo(const ExpertCase &c, std::ostream *os) {
    *os << c.n_experts << " experts of " << c.n_rows << "x" << c.k;
}

class CudaQ8_0Experts : public ::testing::TestWithParam<ExpertCase> {};

TEST_P(CudaQ8_0Experts, EqualCpuWithinReassociationBoundAndDenseBits) {
    DS4_REQUIRE_CUDA_DEVICE();
    const auto [n_experts, n_rows, k] = GetParam();
    const std::vector<int32_t> ids = {3, 0, int32_t(n_experts - 1), 3, int32_t(n_experts / 2 + 1),
                                      1};
    const int n_ids = int(ids.size());
    const auto w = quant::random_blocks(GgmlType::Q8_0, n_experts * n_rows * k, 13 + k + n_experts);
    const Q8_0Weights dw(w.data(), n_rows, k, n_experts);
    ASSERT_EQ(dw.n_experts(), n_experts);
    ASSERT_EQ(dw.matrix().n_rows, n_rows);
    const auto *wb = reinterpret_cast<const quant::BlockQ8_0 *>(w.data());
    const int64_t nb = k / 32;
    const DeviceBuffer dids = to_device(ids);
    const size_t n_out = size_t(n_ids) * size_t(n_rows);
    DeviceBuffer y(n_out * sizeof(float)), y1(size_t(n_rows) * sizeof(float));
    for (const bool per_slot : {false, true}) {
        const int64_t n_x = per_slot ? n_ids : 1;
        // Q8_0 quantizes blocks of 32 on their own: the slots' rows are quantized as one.
        const auto x = random_floats(k * n_x, 17 + n_rows + (per_slot ? 1 : 0), 2.0f);
        const DeviceActivation a = quantize_on_device(x);
        std::vector<quant::BlockQ8_0> xb(size_t(n_x * nb));
        quant::kernels(GgmlType::Q8_0).quantize_activation_row(x.data(), xb.data(), k * n_x);
        std::vector<float> first;
        for (int run = 0; run < 2; ++run) {
            DS4_CUDA_CHECK(cudaMemset(y.get(), 0xff, y.bytes()));  // NaN in every output
            matvec_q8_0_experts(dw.matrix(), n_experts, dids.as<int32_t>(), n_ids, a.q.as<int8_t>(),
                                a.d.as<float>(), per_slot, y.as<float>(), nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const auto got = to_host<float>(y, n_out);
            if (run == 1) {
                ASSERT_EQ(std::memcmp(got.data(), first.data(), n_out * sizeof(float)), 0)
                    << "two launches differ";
                break;
            }
            first = got;
            for (int i = 0; i < n_ids; ++i)
                for (int64_t r = 0; r < n_rows; ++r)
                    ASSERT_TRUE(within_reassociation_bound(wb + (ids[size_t(i)] * n_rows + r) * nb,
                                                           xb.data() + (per_slot ? i * nb : 0), k,
                                                           got[size_t(i * n_rows + r)]))
                        << "slot " << i << " (expert " << ids[size_t(i)] << ") row " << r << " of "
                        << n_rows << " x " << k << (per_slot ? ", x per slot" : ", x shared");
        }
        // Each slot's outputs are the dense kernel's on its expert, bit for bit.
        for (int i = 0; i < n_ids; ++i) {
            Q8_0Matrix m = dw.matrix();
            m.qs += ids[size_t(i)] * n_rows * k;
            m.d += ids[size_t(i)] * n_rows * nb;
            const int64_t xo = per_slot ? i : 0;
            DS4_CUDA_CHECK(cudaMemset(y1.get(), 0xff, y1.bytes()));
            matvec_q8_0(m, a.q.as<int8_t>() + xo * k, a.d.as<float>() + xo * nb, y1.as<float>(),
                        nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const auto dense = to_host<float>(y1, size_t(n_rows));
            ASSERT_EQ(std::memcmp(dense.data(), first.data() + size_t(i) * size_t(n_rows),
                                  size_t(n_rows) * sizeof(float)),
                      0)
                << "slot " << i << " differs from the dense product"
                << (per_slot ? ", x per slot" : ", x shared");
        }
    }
}

// The routed experts of the q8 files (gate and up: 2048 rows of 4096; down: 4096 of 2048) over
// 16 of them, and all 256 of Flash with small odd rows (k not a multiple of the 512-value chunk).
INSTANTIATE_TEST_SUITE_P(Shapes, CudaQ8_0Experts,
                         ::testing::Values(ExpertCase{16, 2048, 4096}, ExpertCase{16, 4096, 2048},
                                           ExpertCase{256, 64, 512}, ExpertCase{256, 37, 96}),
                         [](const auto &info) {
                             return std::to_string(info.param.n_experts) + "experts_" +
                                    std::to_string(info.param.n_rows) + "x" +
                                    std::to_string(info.param.k);
                         });

// A batch of tokens (matmul_q8_0) against one matvec per token: the same bits, for batches that
// fill, do not fill, and exceed the small kernel's 8 tokens per block, batches of the tensor-core
// product (32 tokens and up: a partial tile of 64, one and a half tiles, several), rows of
// every thread split (k of 96 to 9248 values: one warp to 256 threads per row, one to three
// passes, the last one partial) and row counts that are not a multiple of its 32-row tiles.
TEST(CudaQ8_0, BatchedProductHasEachTokensMatvecBits) {
    DS4_REQUIRE_CUDA_DEVICE();
    struct Shape {
        int64_t n_rows, k;
    };
    for (const Shape sh : {Shape{300, 4096}, Shape{1024, 1024}, Shape{37, 96}, Shape{64, 8192},
                           Shape{200, 2048}, Shape{48, 9248}, Shape{256, 32}, Shape{32, 256}}) {
        const auto w = quant::random_blocks(GgmlType::Q8_0, sh.n_rows * sh.k, 900 + sh.k);
        const Q8_0Weights dw(w.data(), sh.n_rows, sh.k);
        for (const int64_t m :
             {int64_t(1), int64_t(3), int64_t(8), int64_t(13), int64_t(31), int64_t(32),
              int64_t(33), int64_t(100), int64_t(246), int64_t(257)}) {
            const auto x = random_floats(m * sh.k, 950 + m, 4.0f);
            const DeviceActivation a = quantize_on_device(x);  // the m rows' blocks back to back
            const int64_t nb = sh.k / 32;
            DeviceBuffer batch(size_t(m * sh.n_rows) * sizeof(float)),
                one(size_t(sh.n_rows) * sizeof(float));
            DS4_CUDA_CHECK(cudaMemset(batch.get(), 0xff, batch.bytes()));
            matmul_q8_0(dw.matrix(), a.q.as<int8_t>(), a.d.as<float>(), m, batch.as<float>(),
                        nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const auto got = to_host<float>(batch, size_t(m * sh.n_rows));
            for (int64_t t = 0; t < m; ++t) {
                DS4_CUDA_CHECK(cudaMemset(one.get(), 0xff, one.bytes()));
                matvec_q8_0(dw.matrix(), a.q.as<int8_t>() + t * sh.k, a.d.as<float>() + t * nb,
                            one.as<float>(), nullptr);
                DS4_CUDA_CHECK(cudaDeviceSynchronize());
                const auto want = to_host<float>(one, size_t(sh.n_rows));
                for (float v : want) ASSERT_FALSE(std::isnan(v));
                ASSERT_EQ(std::memcmp(got.data() + t * sh.n_rows, want.data(),
                                      size_t(sh.n_rows) * sizeof(float)),
                          0)
                    << sh.n_rows << "x" << sh.k << ", token " << t << " of " << m;
            }
        }
    }
}

// The grouped batch (matmul_q8_0_groups, the output projection of a prefill chunk) against one
// matvec per token and group on its slice: the same bits.
TEST(CudaQ8_0, GroupedBatchHasEachGroupsMatvecBits) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int kGroups = 8;
    constexpr int64_t kR = 64, kK = 512, kNb = kK / 32;
    const auto w = quant::random_blocks(GgmlType::Q8_0, kGroups * kR * kK, 990);
    const Q8_0Weights dw(w.data(), kGroups * kR, kK);
    const Q8_0Matrix full = dw.matrix();
    for (const int64_t m : {int64_t(1), int64_t(5), int64_t(9), int64_t(40), int64_t(130)}) {
        const auto x = random_floats(m * kGroups * kK, 991 + m, 4.0f);
        const DeviceActivation a = quantize_on_device(x);
        DeviceBuffer batch(size_t(m * kGroups * kR) * sizeof(float)), one(size_t(kR) * 4);
        DS4_CUDA_CHECK(cudaMemset(batch.get(), 0xff, batch.bytes()));
        matmul_q8_0_groups(Q8_0Matrix{full.qs, full.d, kR, kK}, kGroups, a.q.as<int8_t>(),
                           a.d.as<float>(), m, batch.as<float>(), nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(batch, size_t(m * kGroups * kR));
        for (int64_t t = 0; t < m; ++t)
            for (int g = 0; g < kGroups; ++g) {
                const Q8_0Matrix block{full.qs + g * kR * kK, full.d + g * kR * kNb, kR, kK};
                const int64_t x0 = t * kGroups * kK + g * kK;
                DS4_CUDA_CHECK(cudaMemset(one.get(), 0xff, one.bytes()));
                matvec_q8_0(block, a.q.as<int8_t>() + x0, a.d.as<float>() + x0 / 32,
                            one.as<float>(), nullptr);
                DS4_CUDA_CHECK(cudaDeviceSynchronize());
                const auto want = to_host<float>(one, size_t(kR));
                for (float v : want) ASSERT_FALSE(std::isnan(v));
                ASSERT_EQ(std::memcmp(got.data() + (t * kGroups + g) * kR, want.data(),
                                      size_t(kR) * sizeof(float)),
                          0)
                    << "token " << t << " group " << g << " of a batch of " << m;
            }
    }
}

}  // namespace
}  // namespace ds4::cuda
