// The Q4_K routed-expert matvec of the CUDA backend against its CPU twin (vec_dot_q4_K_q8_K):
// expert_matvec_check.h's check on the q4 files' gate/up (2048 rows of 4096) and down (4096 rows
// of 2048) shapes and a small odd one, shared and per-slot activations.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cuda/q4_k_matvec.h"
#include "cuda_test_util.h"
#include "expert_matvec_check.h"
#include "quant/blocks.h"

namespace ds4::cuda {
namespace {

// The 6-bit scale and min of sub-block j (ggml's packing of Q4_K's 12 scale bytes).
void scale_min(const uint8_t *s, int j, int &sc, int &m) {
    if (j < 4) {
        sc = s[j] & 63, m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

TEST(CudaQ4K, ExpertMatvecEqualsCpuWithinReassociationBound) {
    DS4_REQUIRE_CUDA_DEVICE();
    for (const bool per_slot : {false, true})
        for (const auto &[n_rows, k] :
             {std::pair<int64_t, int64_t>{2048, 4096}, {4096, 2048}, {37, 768}}) {
            constexpr int64_t kExperts = 9;
            const auto w = quant::random_blocks(GgmlType::Q4_K, kExperts * n_rows * k, 53 + k);
            const Q4KWeights dw(w.data(), n_rows, k, kExperts);
            test::check_expert_matvec(
                GgmlType::Q4_K, w, n_rows, k, 59 + n_rows, per_slot,
                [&](const int32_t *ids, int n_ids, const Q8_KActivation &x, float *y) {
                    matvec_q4_K(dw.experts(), ids, n_ids, x, y, nullptr, per_slot);
                },
                // A super-block's two terms are bounded by |dx d| sum_j sc_j 15 sum_l |qx_l| and
                // |dx dmin| sum_j m_j |bsums_2j + bsums_2j+1| (quants are 0..15).
                [&](const uint8_t *row, const std::vector<quant::BlockQ8_K> &xb) {
                    const auto *b = reinterpret_cast<const quant::BlockQ4_K *>(row);
                    double sum = 0;
                    for (int64_t s = 0; s < k / 256; ++s) {
                        const auto &x = xb[size_t(s)];
                        const double dx = std::fabs(double(x.d));
                        for (int j = 0; j < 8; ++j) {
                            int sc, m;
                            scale_min(b[s].scales, j, sc, m);
                            double ax = 0;
                            for (int l = 0; l < 32; ++l) ax += std::fabs(double(x.qs[32 * j + l]));
                            sum += dx * std::fabs(double(test::f16_value(b[s].d))) * sc * 15 * ax +
                                   dx * std::fabs(double(test::f16_value(b[s].dmin))) * m *
                                       std::fabs(double(x.bsums[2 * j] + x.bsums[2 * j + 1]));
                        }
                    }
                    return sum;
                });
        }
}

// The routed gate and up of the q4 files in one launch: each output the bits of its own launch.
TEST(CudaQ4K, GateAndUpInOneLaunchAreTheirOwnLaunchesBits) {
    DS4_REQUIRE_CUDA_DEVICE();
    for (const auto &[n_rows, k] : {std::pair<int64_t, int64_t>{2048, 4096}, {37, 768}}) {
        constexpr int64_t kExperts = 9;
        const auto wa = quant::random_blocks(GgmlType::Q4_K, kExperts * n_rows * k, 81 + k);
        const auto wb = quant::random_blocks(GgmlType::Q4_K, kExperts * n_rows * k, 83 + k);
        const Q4KWeights da(wa.data(), n_rows, k, kExperts), db(wb.data(), n_rows, k, kExperts);
        test::check_expert_pair(
            n_rows, k, 89,
            [&](int which, const int32_t *ids, int n, const Q8_KActivation &x, float *y) {
                matvec_q4_K((which ? db : da).experts(), ids, n, x, y, nullptr);
            },
            [&](const int32_t *ids, int n, const Q8_KActivation &x, float *ya, float *yb) {
                matvec_q4_K_pair(da.experts(), db.experts(), ids, n, x, ya, yb, nullptr);
            });
    }
}

}  // namespace
}  // namespace ds4::cuda
