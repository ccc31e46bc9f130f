// The Q2_K routed-expert matvec of the CUDA backend against its CPU twin (vec_dot_q2_K_q8_K):
// expert_matvec_check.h's check on the published down-projection shape (4096 rows of 2048) and a
// small odd one.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cuda/q2_k_matvec.h"
#include "cuda_test_util.h"
#include "expert_matvec_check.h"
#include "quant/blocks.h"

namespace ds4::cuda {
namespace {

TEST(CudaQ2K, ExpertMatvecEqualsCpuWithinReassociationBound) {
    DS4_REQUIRE_CUDA_DEVICE();
    for (const bool per_slot : {false, true})
        for (const auto &[n_rows, k] : {std::pair<int64_t, int64_t>{4096, 2048}, {37, 768}}) {
            constexpr int64_t kExperts = 9;
            const auto w = quant::random_blocks(GgmlType::Q2_K, kExperts * n_rows * k, 29 + k);
            const Q2KWeights dw(w.data(), n_rows, k, kExperts);
            test::check_expert_matvec(
                GgmlType::Q2_K, w, n_rows, k, 31 + n_rows, per_slot,
                [&](const int32_t *ids, int n_ids, const Q8_KActivation &x, float *y) {
                    matvec_q2_K(dw.experts(), ids, n_ids, x, y, nullptr, per_slot);
                },
                // A super-block's two terms are bounded by |dx d| sum_k sc_k sum_l 3 |qx_l| and
                // |dx dmin| sum_k m_k |bsums_k| (quants are 0..3).
                [&](const uint8_t *row, const std::vector<quant::BlockQ8_K> &xb) {
                    const auto *b = reinterpret_cast<const quant::BlockQ2_K *>(row);
                    double sum = 0;
                    for (int64_t s = 0; s < k / 256; ++s)
                        for (int sub = 0; sub < 16; ++sub) {
                            double ax = 0;
                            for (int l = 0; l < 16; ++l)
                                ax += std::fabs(double(xb[size_t(s)].qs[16 * sub + l]));
                            const double dx = std::fabs(double(xb[size_t(s)].d));
                            sum += dx * std::fabs(double(test::f16_value(b[s].d))) *
                                       (b[s].scales[sub] & 15) * 3 * ax +
                                   dx * std::fabs(double(test::f16_value(b[s].dmin))) *
                                       (b[s].scales[sub] >> 4) *
                                       std::fabs(double(xb[size_t(s)].bsums[sub]));
                        }
                    return sum;
                });
        }
}

}  // namespace
}  // namespace ds4::cuda
