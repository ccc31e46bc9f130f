// The float-weight matvec of the CUDA backend (F32, F16, BF16) against its CPU twins
// (vec_dot_{f32,f16,bf16}_f32, scalar level): both sum exact double products and round once, so
// they may differ only by the double additions' order: |gpu - cpu| <= 1 ulp of the f32 result +
// 2 k 2^-53 sum |w x|. Shapes of the published model's float matrices (hyper-connection mixers,
// router, compressor, indexer) and small odd ones, the split-k path included; outputs poisoned
// with NaN first; two launches give the same bits.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "backend/cuda/float_matvec.h"
#include "cuda_test_util.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace ds4::cuda {
namespace {

using test::random_floats;
using test::to_device;
using test::to_host;

struct Case {
    GgmlType type;
    int64_t n_rows, k;
};

// How gtest prints a case (the test list that CTest reads names each case by it).
void PrintTo(const Case &c, std::ostream *os) {
    *os << ggml_type_name(c.type) << " " << c.n_rows << "x" << c.k;
}

class CudaFloatMatvec : public ::testing::TestWithParam<Case> {};

TEST_P(CudaFloatMatvec, EqualsCpuToOneUlp) {
    DS4_REQUIRE_CUDA_DEVICE();
    const auto [type, n_rows, k] = GetParam();
    const auto w = quant::random_blocks(type, n_rows * k, 41 + k + n_rows);
    const auto x = random_floats(k, 43 + n_rows, 3.0f);
    const FloatMatrix host_view{type, nullptr, n_rows, k};
    const DeviceBuffer dw = to_device(w), dx = to_device(x);
    DeviceBuffer y(size_t(n_rows) * sizeof(float)),
        scratch(std::max<size_t>(1, float_matvec_scratch_bytes(host_view)));
    const FloatMatrix m{type, dw.get(), n_rows, k};
    const auto &cpu = quant::kernels(type, quant::SimdLevel::Scalar);
    const size_t row_bytes = quant::row_size(type, k);
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
        DS4_CUDA_CHECK(cudaMemset(y.get(), 0xff, y.bytes()));
        matvec_float(m, dx.as<float>(), y.as<float>(), scratch.get(), nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(y, size_t(n_rows));
        if (run == 1) {
            ASSERT_EQ(std::memcmp(got.data(), first.data(), got.size() * sizeof(float)), 0);
            return;
        }
        first = got;
        std::vector<float> wrow(static_cast<size_t>(k));
        for (int64_t r = 0; r < n_rows; ++r) {
            const uint8_t *row = w.data() + size_t(r) * row_bytes;
            const float want = cpu.vec_dot(k, row, x.data());
            quant::dequantize_row(type, row, wrow.data(), k);
            double abs_sum = 0;
            for (int64_t i = 0; i < k; ++i)
                abs_sum += std::fabs(double(wrow[size_t(i)]) * x[size_t(i)]);
            const double ulp = std::fabs(std::nextafter(want, INFINITY) - want);
            const double bound = ulp + 2.0 * double(k) * DBL_EPSILON / 2 * abs_sum;
            ASSERT_FALSE(std::isnan(got[size_t(r)])) << "row " << r << " not written";
            ASSERT_LE(std::fabs(double(got[size_t(r)]) - double(want)), bound)
                << ggml_type_name(type) << " row " << r << " of " << n_rows << " x " << k;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaFloatMatvec,
    ::testing::Values(Case{GgmlType::F16, 24, 16384}, Case{GgmlType::F16, 4, 16384},
                      Case{GgmlType::F16, 256, 4096}, Case{GgmlType::F16, 1024, 4096},
                      Case{GgmlType::F16, 8192, 1024}, Case{GgmlType::F16, 64, 4096},
                      Case{GgmlType::F16, 37, 96}, Case{GgmlType::F32, 37, 96},
                      Case{GgmlType::F32, 300, 2048}, Case{GgmlType::BF16, 24, 16384},
                      Case{GgmlType::BF16, 129, 520}, Case{GgmlType::F16, 1, 8}),
    [](const auto &info) {
        return std::string(ggml_type_name(info.param.type)) + "_" +
               std::to_string(info.param.n_rows) + "x" + std::to_string(info.param.k);
    });

}  // namespace
}  // namespace ds4::cuda
