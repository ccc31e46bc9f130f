// The Q8_K activation quantizer and the IQ2_XXS expert matvec of the CUDA backend against their
// CPU twins (quant/kernels_ref.h through the CPU dispatch table):
//   - Q8_K: bit for bit quantize_row_q8_K (values, d, bsums) on random rows and on blocks built
//     for its edge cases: the largest |x| negative, two values tied for the largest (the first
//     one sets the sign), an all-zero block, a NaN, exact .5 ties of iscale * x;
//   - IQ2_XXS: each output equals vec_dot_iq2_xxs_q8_K of the selected expert's row within the
//     float-reassociation bound of its terms (2 * n_blocks * eps * sum |term|, then the exact
//     1/8), for expert ids in any order and repeated; outputs poisoned with NaN first; two
//     launches give the same bits.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cuda/iq2_xxs_matvec.h"
#include "backend/cuda/q8_k_quantize.h"
#include "cuda_test_util.h"
#include "expert_matvec_check.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace ds4::cuda {
namespace {

using test::cpu_quantize_q8_K;
using test::DeviceQ8_K;
using test::quantize_q8_K_on_device;
using test::random_floats;
using test::to_device;
using test::to_host;

void expect_q8_K_matches_cpu(const std::vector<float> &x) {
    const auto want = cpu_quantize_q8_K(x);
    const DeviceQ8_K a = quantize_q8_K_on_device(x);
    const auto q = to_host<int8_t>(a.q, x.size());
    const auto d = to_host<float>(a.d, want.size());
    const auto bs = to_host<int16_t>(a.bsums, x.size() / 16);
    for (size_t b = 0; b < want.size(); ++b) {
        ASSERT_EQ(std::memcmp(&d[b], &want[b].d, 4), 0) << "d of block " << b;
        for (int i = 0; i < 256; ++i) ASSERT_EQ(q[b * 256 + i], want[b].qs[i]) << b << ":" << i;
        for (int j = 0; j < 16; ++j) ASSERT_EQ(bs[b * 16 + j], want[b].bsums[j]) << b << ":" << j;
    }
}

TEST(CudaQ8_K, QuantizerEqualsCpuOnRandomRows) {
    DS4_REQUIRE_CUDA_DEVICE();
    for (uint64_t seed = 1; seed <= 3; ++seed)
        expect_q8_K_matches_cpu(random_floats(4096, seed, seed == 3 ? 1e-4f : 4.0f));
}

TEST(CudaQ8_K, QuantizerEqualsCpuOnEdgeCases) {
    DS4_REQUIRE_CUDA_DEVICE();
    std::vector<float> x(256 * 5, 0.0f);  // block 0: all zero
    for (int i = 0; i < 256; ++i) {
        x[256 + i] = 0.01f * (i - 128);
        x[512 + i] = 0.5f * (i % 7);
        x[768 + i] = i == 40 ? std::numeric_limits<float>::quiet_NaN() : 0.25f * (i % 5);
        x[1024 + i] = 127.0f * (i % 2 ? 0.5f : -0.5f) + (i % 3);  // halves of iscale * x
    }
    x[256 + 200] = -9.0f;  // block 1: the largest |x| is negative
    x[512 + 100] = -7.0f;  // block 2: tied largest |x|, the first (negative) one wins
    x[512 + 101] = 7.0f;
    x[1024 + 17] = -127.0f;  // block 4: vmax = -127, iscale = 1
    expect_q8_K_matches_cpu(x);
}

TEST(CudaIq2xxs, ExpertMatvecEqualsCpuWithinReassociationBound) {
    DS4_REQUIRE_CUDA_DEVICE();
    // Experts of the published shape (2048 rows of 4096) and a small odd one (37 rows of 768).
    for (const bool per_slot : {false, true})
        for (const auto &[n_rows, k] : {std::pair<int64_t, int64_t>{2048, 4096}, {37, 768}}) {
            constexpr int64_t kExperts = 9;
            const auto w = quant::random_blocks(GgmlType::IQ2_XXS, kExperts * n_rows * k, 17 + k);
            const Iq2xxsWeights dw(w.data(), n_rows, k, kExperts);
            test::check_expert_matvec(
                GgmlType::IQ2_XXS, w, n_rows, k, 23 + n_rows, per_slot,
                [&](const int32_t *ids, int n_ids, const Q8_KActivation &x, float *y) {
                    matvec_iq2_xxs(dw.experts(), ids, n_ids, x, y, nullptr, per_slot);
                },
                // sum |term| from the dequantized row: each value d (ls + 1/2) / 4 * grid * sign
                // times q * dx, i.e. the CPU's terms including the final 1/8.
                [&](const uint8_t *row, const std::vector<quant::BlockQ8_K> &xb) {
                    std::vector<float> deq(static_cast<size_t>(k));
                    quant::dequantize_row(GgmlType::IQ2_XXS, row, deq.data(), k);
                    double sum = 0;
                    for (size_t j = 0; j < deq.size(); ++j)
                        sum += std::fabs(double(deq[j]) * double(xb[j / 256].qs[j % 256]) *
                                         xb[j / 256].d);
                    return sum;
                });
        }
}

// The routed gate and up in one launch: each output the bits of its own launch.
TEST(CudaIq2xxs, GateAndUpInOneLaunchAreTheirOwnLaunchesBits) {
    DS4_REQUIRE_CUDA_DEVICE();
    for (const auto &[n_rows, k] : {std::pair<int64_t, int64_t>{2048, 4096}, {37, 768}}) {
        constexpr int64_t kExperts = 9;
        const auto wa = quant::random_blocks(GgmlType::IQ2_XXS, kExperts * n_rows * k, 71 + k);
        const auto wb = quant::random_blocks(GgmlType::IQ2_XXS, kExperts * n_rows * k, 73 + k);
        const Iq2xxsWeights da(wa.data(), n_rows, k, kExperts), db(wb.data(), n_rows, k, kExperts);
        test::check_expert_pair(
            n_rows, k, 79,
            [&](int which, const int32_t *ids, int n, const Q8_KActivation &x, float *y) {
                matvec_iq2_xxs((which ? db : da).experts(), ids, n, x, y, nullptr);
            },
            [&](const int32_t *ids, int n, const Q8_KActivation &x, float *ya, float *yb) {
                matvec_iq2_xxs_pair(da.experts(), db.experts(), ids, n, x, ya, yb, nullptr);
            });
    }
}

}  // namespace
}  // namespace ds4::cuda
