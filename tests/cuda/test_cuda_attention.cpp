// Decode attention on the device against the CPU's (the F32 vec_dot scores and
// backend/cpu/attention_mix.h), on the published geometry (64 heads of 512, the window of 128
// plus 512 selected compressed rows) and small odd ones:
//   - scores within one f32 ulp + the double-order bound of their exact products;
//   - the mix, fed the CPU's own scores, within 1e-6 of max |v| per output (exp is the only
//     difference: each e_j within an ulp), NaN never passing; sinks both below and above the
//     largest score.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "backend/cpu/attention_mix.h"
#include "backend/cuda/attention_decode.h"
#include "cuda_test_util.h"
#include "quant/quant.h"

namespace ds4::cuda {
namespace {

using test::random_floats;
using test::to_device;
using test::to_host;

struct Case {
    int64_t n_heads, d, n_rows;
};

// How gtest prints a case (the test list that CTest reads names each case by it).
void PrintTo(const Case &c, std::ostream *os) {
    *os << c.n_heads << " heads of " << c.d << ", " << c.n_rows << " rows";
}

class CudaAttention : public ::testing::TestWithParam<Case> {};

TEST_P(CudaAttention, ScoresAndMixEqualCpu) {
    DS4_REQUIRE_CUDA_DEVICE();
    const auto [H, D, n] = GetParam();
    const auto q = random_floats(H * D, 61 + n, 1.0f), rows = random_floats(n * D, 67 + D, 1.0f);
    auto sinks = random_floats(H, 71, 3.0f);
    sinks[0] = 50.0f;  // a sink above every score
    const float scale = static_cast<float>(1.0 / std::sqrt(double(D)));
    const auto &dot = quant::kernels(GgmlType::F32, quant::SimdLevel::Scalar);

    std::vector<float> want_scores(size_t(H * n));
    for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < n; ++j)
            want_scores[size_t(h * n + j)] = dot.vec_dot(D, rows.data() + j * D, q.data() + h * D);

    const DeviceBuffer dq = to_device(q), dr = to_device(rows), ds = to_device(sinks);
    DeviceBuffer scores(size_t(H * n) * 4 + 4), o(size_t(H * D) * 4);
    DS4_CUDA_CHECK(cudaMemset(scores.get(), 0xff, scores.bytes()));
    attention_scores(dq.as<float>(), dr.as<float>(), n, H, D, scores.as<float>(), nullptr);
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got_scores = to_host<float>(scores, size_t(H * n));
    for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < n; ++j) {
            const float w = want_scores[size_t(h * n + j)], g = got_scores[size_t(h * n + j)];
            double abs_sum = 0;
            for (int64_t i = 0; i < D; ++i)
                abs_sum += std::fabs(double(q[size_t(h * D + i)]) * rows[size_t(j * D + i)]);
            const double bound =
                std::fabs(std::nextafter(w, INFINITY) - w) + double(D) * DBL_EPSILON * abs_sum;
            ASSERT_FALSE(std::isnan(g)) << "score " << h << "," << j << " not written";
            ASSERT_LE(std::fabs(double(g) - double(w)), bound) << "head " << h << " row " << j;
        }

    // The mix from identical scores: the CPU's scores uploaded.
    std::vector<float> want_o(size_t(H * D)), cpu_scores(want_scores);
    for (int64_t h = 0; h < H; ++h)
        backend::cpu::attention_mix_head(cpu_scores.data() + h * n, size_t(n), scale,
                                         sinks[size_t(h)], rows.data(), uint32_t(D),
                                         want_o.data() + h * D);
    DeviceBuffer same = to_device(want_scores);
    DS4_CUDA_CHECK(cudaMemset(o.get(), 0xff, o.bytes()));
    attention_mix(same.as<float>(), dr.as<float>(), n, ds.as<float>(), scale, H, D, o.as<float>(),
                  nullptr);
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got_o = to_host<float>(o, size_t(H * D));
    float vmax = 0;
    for (float v : rows) vmax = std::max(vmax, std::fabs(v));
    for (size_t i = 0; i < got_o.size(); ++i) {
        ASSERT_FALSE(std::isnan(got_o[i])) << "output " << i << " not written";
        ASSERT_LE(std::fabs(double(got_o[i]) - double(want_o[i])), 1e-6 * vmax) << "output " << i;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         ::testing::Values(Case{64, 512, 640}, Case{64, 512, 1}, Case{64, 512, 131},
                                           Case{3, 64, 17}, Case{13, 96, 200},
                                           Case{8, 512, 2500},   // rows beyond one tile
                                           Case{40, 1088, 37}),  // past the staged scores' d
                         [](const auto &info) {
                             return std::to_string(info.param.n_heads) + "heads_" +
                                    std::to_string(info.param.d) + "d_" +
                                    std::to_string(info.param.n_rows) + "rows";
                         });

}  // namespace
}  // namespace ds4::cuda
