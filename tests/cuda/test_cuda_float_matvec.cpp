// The float-weight matvec of the CUDA backend (F32, F16, BF16) against its CPU twins
// (vec_dot_{f32,f16,bf16}_f32, scalar level): both sum exact double products and round once, so
// they may differ only by the double additions' order: |gpu - cpu| <= 1 ulp of the f32 result +
// 2 k 2^-53 sum |w x|. Shapes of the published model's float matrices (hyper-connection mixers,
// router, compressor, indexer) and small odd ones, the split-k path included; outputs poisoned
// with NaN first; two launches give the same bits. The routed-expert form (6 slots over 16 or
// 256 experts, one id repeated, x shared by all slots or one row per slot) meets the same bound
// against the CPU's vec_dot on the selected expert's rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/float_matvec.h"
#include "backend/cuda/float_mma.h"
#include "common/error.h"
#include "cuda_test_util.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace ds4::cuda {
namespace {

using test::random_floats;
using test::to_device;
using test::to_host;

// Whether the kernel's output for weight row `row` (k values of `type`) against x is within the
// bound above of the CPU's vec_dot.
::testing::AssertionResult within_one_ulp(GgmlType type, const uint8_t *row, const float *x,
                                          int64_t k, float got) {
    const float want = quant::kernels(type, quant::SimdLevel::Scalar).vec_dot(k, row, x);
    std::vector<float> wrow(static_cast<size_t>(k));
    quant::dequantize_row(type, row, wrow.data(), k);
    double abs_sum = 0;
    for (int64_t i = 0; i < k; ++i) abs_sum += std::fabs(double(wrow[size_t(i)]) * x[i]);
    const double ulp = std::fabs(std::nextafter(want, INFINITY) - want);
    const double bound = ulp + 2.0 * double(k) * DBL_EPSILON / 2 * abs_sum;
    if (std::isnan(got)) return ::testing::AssertionFailure() << "not written";
    if (std::fabs(double(got) - double(want)) > bound)
        return ::testing::AssertionFailure()
               << got << " vs the CPU's " << want << ", more than " << bound << " apart";
    return ::testing::AssertionSuccess();
}

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
    DS4_CUDA_CHECK(cudaMemset(scratch.get(), 0, scratch.bytes()));  // the arrival counters
    const FloatMatrix m{type, dw.get(), n_rows, k};
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
        for (int64_t r = 0; r < n_rows; ++r)
            ASSERT_TRUE(
                within_one_ulp(type, w.data() + size_t(r) * row_bytes, x.data(), k, got[size_t(r)]))
                << ggml_type_name(type) << " row " << r << " of " << n_rows << " x " << k;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaFloatMatvec,
    ::testing::Values(Case{GgmlType::F16, 24, 16384}, Case{GgmlType::F16, 4, 16384},
                      Case{GgmlType::F16, 256, 4096}, Case{GgmlType::F16, 1024, 4096},
                      Case{GgmlType::F16, 8192, 1024}, Case{GgmlType::F16, 64, 4096},
                      Case{GgmlType::F16, 37, 96}, Case{GgmlType::F32, 37, 96},
                      Case{GgmlType::F32, 300, 2048}, Case{GgmlType::BF16, 24, 16384},
                      Case{GgmlType::BF16, 129, 520}, Case{GgmlType::F16, 1, 8},
                      // the tiny test model's: one chunk, few rows, a mixer of 1024
                      Case{GgmlType::F32, 256, 32}, Case{GgmlType::F32, 24, 1024},
                      Case{GgmlType::F32, 8, 256}, Case{GgmlType::F32, 4, 256},
                      Case{GgmlType::F32, 512, 256}, Case{GgmlType::F32, 32, 128}),
    [](const auto &info) {
        return std::string(ggml_type_name(info.param.type)) + "_" +
               std::to_string(info.param.n_rows) + "x" + std::to_string(info.param.k);
    });

struct ExpertCase {
    GgmlType type;
    int64_t n_experts, n_rows, k;
};

void PrintTo(const ExpertCase &c, std::ostream *os) {
    *os << ggml_type_name(c.type) << " " << c.n_experts << " experts of " << c.n_rows << "x" << c.k;
}

class CudaFloatExperts : public ::testing::TestWithParam<ExpertCase> {};

TEST_P(CudaFloatExperts, EqualCpuToOneUlp) {
    DS4_REQUIRE_CUDA_DEVICE();
    const auto [type, n_experts, n_rows, k] = GetParam();
    const std::vector<int32_t> ids = {3, 0, int32_t(n_experts - 1), 3, int32_t(n_experts / 2 + 1),
                                      1};
    const int n_ids = int(ids.size());
    const auto w = quant::random_blocks(type, n_experts * n_rows * k, 47 + k + n_rows);
    const DeviceBuffer dw = to_device(w), dids = to_device(ids);
    const FloatMatrix m{type, dw.get(), n_rows, k};
    const size_t n_out = size_t(n_ids) * size_t(n_rows);
    DeviceBuffer y(n_out * sizeof(float)),
        scratch(std::max<size_t>(1, float_matvec_experts_scratch_bytes(m, n_ids)));
    DS4_CUDA_CHECK(cudaMemset(scratch.get(), 0, scratch.bytes()));  // the arrival counters
    const size_t row_bytes = quant::row_size(type, k);
    for (const bool per_slot : {false, true}) {
        const int64_t n_x = per_slot ? n_ids : 1;
        const auto x = random_floats(k * n_x, 53 + n_rows + (per_slot ? 1 : 0), 3.0f);
        const DeviceBuffer dx = to_device(x);
        std::vector<float> first;
        for (int run = 0; run < 2; ++run) {
            DS4_CUDA_CHECK(cudaMemset(y.get(), 0xff, y.bytes()));
            matvec_float_experts(m, dids.as<int32_t>(), n_ids, dx.as<float>(), per_slot,
                                 y.as<float>(), scratch.get(), nullptr);
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
                    ASSERT_TRUE(within_one_ulp(
                        type, w.data() + size_t(ids[size_t(i)] * n_rows + r) * row_bytes,
                        x.data() + (per_slot ? i * k : 0), k, got[size_t(i * n_rows + r)]))
                        << ggml_type_name(type) << " slot " << i << " (expert " << ids[size_t(i)]
                        << ") row " << r << " of " << n_rows << " x " << k
                        << (per_slot ? ", x per slot" : ", x shared");
        }
    }
}

// Few long rows per expert (the split-k path over all slots), many short ones, and the three
// formats, over 16 experts and all 256 of Flash.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaFloatExperts,
                         ::testing::Values(ExpertCase{GgmlType::F16, 16, 4, 16384},
                                           ExpertCase{GgmlType::F16, 16, 1024, 4096},
                                           ExpertCase{GgmlType::BF16, 256, 24, 4096},
                                           ExpertCase{GgmlType::BF16, 256, 37, 96},
                                           ExpertCase{GgmlType::F32, 16, 129, 520},
                                           ExpertCase{GgmlType::F32, 256, 8, 2048}),
                         [](const auto &info) {
                             return std::string(ggml_type_name(info.param.type)) + "_" +
                                    std::to_string(info.param.n_experts) + "experts_" +
                                    std::to_string(info.param.n_rows) + "x" +
                                    std::to_string(info.param.k);
                         });

// Several products of one x in one launch (a decode step's compressor and indexer projections):
// each output the bits of its own matvec_float launch (itself checked against the CPU above),
// split matrices among them (their own counters and partial sums), twice in a row (the counters
// are left zero), outputs poisoned first.
TEST(CudaFloatMatvecMany, EachOutputIsItsOwnLaunchBitForBit) {
    DS4_REQUIRE_CUDA_DEVICE();
    struct Group {
        GgmlType type;
        int64_t k;
        std::vector<int64_t> rows;
    };
    // The Flash layout's ratio-4 layer (comp kv, gate, indexer kv, gate, proj), its ratio-128
    // layer, split-k shapes (few rows of long k), eight products, one alone.
    for (const Group &g :
         {Group{GgmlType::F16, 4096, {1024, 1024, 256, 256, 64}},
          Group{GgmlType::F16, 4096, {512, 512}}, Group{GgmlType::F32, 16384, {24, 4, 300}},
          Group{GgmlType::BF16, 520, {129, 1, 7, 64, 3, 2, 1000, 5}},
          Group{GgmlType::F16, 96, {37}}}) {
        const int n = int(g.rows.size());
        const auto x = random_floats(g.k, 51 + n, 3.0f);
        const DeviceBuffer dx = to_device(x);
        std::vector<DeviceBuffer> weights, outputs;
        std::vector<FloatProduct> products;
        size_t one_scratch = 16;
        for (int j = 0; j < n; ++j) {
            const int64_t r = g.rows[size_t(j)];
            weights.push_back(to_device(quant::random_blocks(g.type, r * g.k, 60 + j + r)));
            outputs.emplace_back(size_t(r) * sizeof(float));
            const FloatMatrix m{g.type, weights.back().get(), r, g.k};
            products.push_back({m, outputs.back().as<float>()});
            one_scratch = std::max(one_scratch, float_matvec_scratch_bytes(m));
        }
        DeviceBuffer scratch(one_scratch),
            many(float_matvec_many_scratch_bytes(products.data(), n));
        DS4_CUDA_CHECK(cudaMemset(scratch.get(), 0, scratch.bytes()));
        DS4_CUDA_CHECK(cudaMemset(many.get(), 0, many.bytes()));
        std::vector<std::vector<float>> want;
        for (const FloatProduct &p : products) {
            DeviceBuffer y(size_t(p.w.n_rows) * sizeof(float));
            DS4_CUDA_CHECK(cudaMemset(y.get(), 0xff, y.bytes()));
            matvec_float(p.w, dx.as<float>(), y.as<float>(), scratch.get(), nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            want.push_back(to_host<float>(y, size_t(p.w.n_rows)));
        }
        for (int run = 0; run < 2; ++run) {
            for (const DeviceBuffer &y : outputs)
                DS4_CUDA_CHECK(cudaMemset(y.get(), 0xff, y.bytes()));
            matvec_float_many(products.data(), n, dx.as<float>(), many.get(), many.bytes(),
                              nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            for (int j = 0; j < n; ++j) {
                const auto got = to_host<float>(outputs[size_t(j)], want[size_t(j)].size());
                for (float v : got) ASSERT_FALSE(std::isnan(v)) << "product " << j << " unwritten";
                ASSERT_EQ(std::memcmp(got.data(), want[size_t(j)].data(), got.size() * 4), 0)
                    << ggml_type_name(g.type) << " product " << j << " of " << n << ", run " << run;
            }
        }
    }
}

// Groups of other matrices, in other orders, through one scratch (as a decode step's groups go
// through the step's): each output still the bits of its own launch, round after round. Where a
// product's counters sat after the group's earlier partial sums, another group's partial sums
// covered them, and the next launch found them nonzero (the tiny model's compressors, when
// every float matrix took the tensor cores). Shapes of both the tensor-core and the thread
// kernels' split products.
TEST(CudaFloatMatvecMany, GroupsOfOtherMatricesShareOneScratch) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t k = 4096;
    const std::vector<int64_t> rows = {1024, 256, 64, 512, 24};
    const auto x = random_floats(k, 91, 3.0f);
    const DeviceBuffer dx = to_device(x);
    std::vector<DeviceBuffer> weights, outputs;
    std::vector<FloatProduct> all;
    std::vector<std::vector<float>> want;
    size_t one_scratch = 16;
    for (size_t j = 0; j < rows.size(); ++j) {
        weights.push_back(to_device(quant::random_blocks(GgmlType::F16, rows[j] * k, 70 + j)));
        outputs.emplace_back(size_t(rows[j]) * sizeof(float));
        const FloatMatrix m{GgmlType::F16, weights.back().get(), rows[j], k};
        all.push_back({m, outputs.back().as<float>()});
        one_scratch = std::max(one_scratch, float_matvec_scratch_bytes(m));
    }
    DeviceBuffer scratch(one_scratch);
    DS4_CUDA_CHECK(cudaMemset(scratch.get(), 0, scratch.bytes()));
    for (const FloatProduct &p : all) {
        matvec_float(p.w, dx.as<float>(), p.y, scratch.get(), nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        want.push_back(to_host<float>(outputs[size_t(&p - all.data())], size_t(p.w.n_rows)));
    }
    const std::vector<std::vector<size_t>> groups = {{0, 1}, {1, 0, 3}, {2, 3, 1, 4}, {4, 0}};
    size_t many_bytes = 0;
    std::vector<std::vector<FloatProduct>> group_products;
    for (const auto &g : groups) {
        group_products.emplace_back();
        for (size_t j : g) group_products.back().push_back(all[j]);
        many_bytes = std::max(many_bytes, float_matvec_many_scratch_bytes(
                                              group_products.back().data(), int(g.size())));
    }
    DeviceBuffer many(many_bytes);
    DS4_CUDA_CHECK(cudaMemset(many.get(), 0, many.bytes()));
    for (int round = 0; round < 3; ++round)
        for (size_t gi = 0; gi < groups.size(); ++gi) {
            for (const DeviceBuffer &y : outputs)
                DS4_CUDA_CHECK(cudaMemset(y.get(), 0xff, y.bytes()));
            const auto &ps = group_products[gi];
            matvec_float_many(ps.data(), int(ps.size()), dx.as<float>(), many.get(), many.bytes(),
                              nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            for (size_t j : groups[gi]) {
                const auto got = to_host<float>(outputs[j], want[j].size());
                ASSERT_EQ(std::memcmp(got.data(), want[j].data(), got.size() * 4), 0)
                    << rows[j] << " rows in group " << gi << ", round " << round;
            }
        }
}

// The order a twin of float_mma.cuh must follow: one mma.sync m8n8k4 .f64 step adds its four
// products to the accumulator one after another in k order, each addition rounded, d = (((c + a0
// b0) + a1 b1) + a2 b2) + a3 b3. Float-valued operands (their products exact in double, as in the
// float products) of magnitudes 2^-12..2^12, a third of the tiles with C near -A B (cancellation,
// where other orders and a single rounding differ), compared bit for bit with that chain on the
// host.
TEST(CudaFloatMma, AStepAddsItsProductsInKOrder) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int kTiles = 4096;
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-12, 12);
    const auto value = [&](bool wide) {
        return double(std::ldexp(unit(rng), wide ? exponent(rng) : 0));
    };
    std::vector<double> a(size_t(kTiles) * 32), b(size_t(kTiles) * 32), c(size_t(kTiles) * 64);
    for (int t = 0; t < kTiles; ++t) {
        const bool wide = t % 2 == 1;
        for (int i = 0; i < 32; ++i)
            a[size_t(t * 32 + i)] = value(wide), b[size_t(t * 32 + i)] = value(wide);
        for (int g = 0; g < 8; ++g)
            for (int n = 0; n < 8; ++n) {
                double ab = 0.0;
                for (int q = 0; q < 4; ++q)
                    ab += a[size_t(t * 32 + g * 4 + q)] * b[size_t(t * 32 + q * 8 + n)];
                c[size_t(t * 64 + g * 8 + n)] =
                    t % 3 == 0 ? -ab * (1 + 0x1p-30) : value(wide) * value(wide);
            }
    }
    const DeviceBuffer da = to_device(a), db = to_device(b), dc = to_device(c);
    DeviceBuffer dd(c.size() * sizeof(double));
    float_mma_step(da.as<double>(), db.as<double>(), dc.as<double>(), dd.as<double>(), kTiles,
                   nullptr);
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = to_host<double>(dd, c.size());
    int64_t differ = 0;
    for (int t = 0; t < kTiles; ++t)
        for (int g = 0; g < 8; ++g)
            for (int n = 0; n < 8; ++n) {
                volatile double d = c[size_t(t * 64 + g * 8 + n)];
                for (int q = 0; q < 4; ++q) {
                    const volatile double p =
                        a[size_t(t * 32 + g * 4 + q)] * b[size_t(t * 32 + q * 8 + n)];
                    d = d + p;  // p is exact: this is the one rounding of the addition
                }
                const double want = d, have = got[size_t(t * 64 + g * 8 + n)];
                differ += std::memcmp(&want, &have, sizeof(double)) != 0;
            }
    EXPECT_EQ(differ, 0) << "outputs of " << kTiles * 64 << " not the k-order chain's";
}

TEST(CudaFloatMatvecMany, RejectsMixedShapesAndTooManyProducts) {
    const FloatMatrix a{GgmlType::F16, nullptr, 8, 64}, b{GgmlType::F16, nullptr, 8, 128},
        c{GgmlType::F32, nullptr, 8, 64};
    const FloatProduct mixed_k[] = {{a, nullptr}, {b, nullptr}};
    const FloatProduct mixed_type[] = {{a, nullptr}, {c, nullptr}};
    EXPECT_THROW(float_matvec_many_scratch_bytes(mixed_k, 2), ds4::Error);
    EXPECT_THROW(float_matvec_many_scratch_bytes(mixed_type, 2), ds4::Error);
    std::vector<FloatProduct> nine(size_t(kMaxFloatProducts) + 1, FloatProduct{a, nullptr});
    EXPECT_THROW(float_matvec_many_scratch_bytes(nine.data(), int(nine.size())), ds4::Error);
    EXPECT_THROW(float_matvec_many_scratch_bytes(nine.data(), 0), ds4::Error);
}

}  // namespace
}  // namespace ds4::cuda
