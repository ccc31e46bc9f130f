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
#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace ds4::cuda {
namespace {

using test::to_device;
using test::to_host;

struct DeviceQ8_K {
    DeviceBuffer q, d, bsums;
    Q8_KActivation view() const { return {q.as<int8_t>(), d.as<float>(), bsums.as<int16_t>()}; }
};

DeviceQ8_K quantize_on_device(const std::vector<float> &x) {
    const int64_t k = int64_t(x.size());
    DeviceBuffer dx = to_device(x);
    DeviceQ8_K a{DeviceBuffer(size_t(k)), DeviceBuffer(size_t(k / 256) * 4),
                 DeviceBuffer(size_t(k / 16) * 2)};
    quantize_q8_K_activation(dx.as<float>(), k, a.view(), nullptr);
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    return a;
}

std::vector<quant::BlockQ8_K> cpu_quantize(const std::vector<float> &x) {
    std::vector<quant::BlockQ8_K> b(x.size() / 256);
    quant::kernels(GgmlType::Q8_K).quantize_activation_row(x.data(), b.data(), int64_t(x.size()));
    return b;
}

void expect_q8_K_matches_cpu(const std::vector<float> &x) {
    const auto want = cpu_quantize(x);
    const DeviceQ8_K a = quantize_on_device(x);
    const auto q = to_host<int8_t>(a.q, x.size());
    const auto d = to_host<float>(a.d, want.size());
    const auto bs = to_host<int16_t>(a.bsums, x.size() / 16);
    for (size_t b = 0; b < want.size(); ++b) {
        ASSERT_EQ(std::memcmp(&d[b], &want[b].d, 4), 0) << "d of block " << b;
        for (int i = 0; i < 256; ++i) ASSERT_EQ(q[b * 256 + i], want[b].qs[i]) << b << ":" << i;
        for (int j = 0; j < 16; ++j) ASSERT_EQ(bs[b * 16 + j], want[b].bsums[j]) << b << ":" << j;
    }
}

std::vector<float> random_floats(int64_t n, uint64_t seed, float magnitude) {
    std::vector<float> v(static_cast<size_t>(n));
    quant::fill_random_blocks(GgmlType::F32, v.data(), n, seed, magnitude);
    return v;
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
    for (const auto &[n_rows, k] : {std::pair<int64_t, int64_t>{2048, 4096}, {37, 768}}) {
        constexpr int64_t kExperts = 9;
        const auto w = quant::random_blocks(GgmlType::IQ2_XXS, kExperts * n_rows * k, 17 + k);
        const Iq2xxsWeights dw(w.data(), n_rows, k, kExperts);
        const auto x = random_floats(k, 23 + n_rows, 2.0f);
        const DeviceQ8_K a = quantize_on_device(x);
        const auto xb = cpu_quantize(x);
        const std::vector<int32_t> ids = {3, 0, 8, 3, 5, 1};
        const DeviceBuffer dids = to_device(ids);
        const size_t n_out = ids.size() * size_t(n_rows);
        DeviceBuffer y(n_out * sizeof(float));
        const size_t row_bytes = quant::row_size(GgmlType::IQ2_XXS, k);
        const int64_t nb = k / 256;
        std::vector<float> first;
        for (int run = 0; run < 2; ++run) {
            DS4_CUDA_CHECK(cudaMemset(y.get(), 0xff, y.bytes()));
            matvec_iq2_xxs(dw.experts(), dids.as<int32_t>(), int(ids.size()), a.view(),
                           y.as<float>(), nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const auto got = to_host<float>(y, n_out);
            if (run == 1) {
                ASSERT_EQ(std::memcmp(got.data(), first.data(), n_out * 4), 0);
                break;
            }
            first = got;
            for (size_t i = 0; i < ids.size(); ++i)
                for (int64_t r = 0; r < n_rows; ++r) {
                    const uint8_t *row = w.data() + (size_t(ids[i]) * n_rows + r) * row_bytes;
                    // The scalar level: its dot takes Q8_K rows in the plain block layout (the
                    // AVX-512 VBMI one wants them position-major).
                    const float want = quant::kernels(GgmlType::IQ2_XXS, quant::SimdLevel::Scalar)
                                           .vec_dot(k, row, xb.data());
                    // sum |term| from the dequantized row: each value d (ls + 1/2) / 4 * grid *
                    // sign times q * dx, i.e. the CPU's terms including the final 1/8.
                    std::vector<float> deq(static_cast<size_t>(k));
                    quant::dequantize_row(GgmlType::IQ2_XXS, row, deq.data(), k);
                    double abs_terms = 0;
                    for (int64_t b = 0; b < nb; ++b)
                        for (int j = 0; j < 256; ++j)
                            abs_terms += std::fabs(double(deq[size_t(b * 256 + j)]) *
                                                   double(xb[size_t(b)].qs[j]) * xb[size_t(b)].d);
                    const double bound = 2.0 * double(nb) * FLT_EPSILON * abs_terms;
                    const float g = got[i * size_t(n_rows) + size_t(r)];
                    ASSERT_FALSE(std::isnan(g)) << "slot " << i << " row " << r << " not written";
                    ASSERT_LE(std::fabs(double(g) - double(want)), bound)
                        << "slot " << i << " (expert " << ids[i] << ") row " << r << " k " << k;
                }
        }
    }
}

}  // namespace
}  // namespace ds4::cuda
