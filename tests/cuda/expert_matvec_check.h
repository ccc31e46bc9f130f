#pragma once
// The check every routed-expert matvec of the CUDA backend passes against its CPU twin: for
// expert ids in any order and repeated, each output equals the scalar CPU vec_dot of the selected
// expert's row within the float-reassociation bound of its terms, 2 * n_blocks * eps * sum|term|
// (each summation order errs by at most (n_blocks - 1) eps sum|term|; the slack covers a fused
// multiply-add inside a term); outputs are poisoned with NaN before each launch; two launches
// give the same bits. The activation is one row shared by all slots, or (per_slot) one row for
// each slot.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "cuda_test_util.h"

namespace ds4::cuda::test {

// launch(ids, n_ids, activation, y) runs the kernel; abs_terms(row, xb) is sum |term| of one
// row's dot with the activation blocks xb.
template <class Launch, class AbsTerms>
void check_expert_matvec(GgmlType type, const std::vector<uint8_t> &w, int64_t n_rows, int64_t k,
                         uint64_t seed, bool per_slot, Launch &&launch, AbsTerms &&abs_terms) {
    const std::vector<int32_t> ids = {3, 0, 8, 3, 5, 1};
    // Q8_K quantizes blocks of 256 independently, so the rows can be quantized as one.
    const auto x = random_floats(k * (per_slot ? int64_t(ids.size()) : 1), seed, 2.0f);
    const DeviceQ8_K a = quantize_q8_K_on_device(x);
    const auto xb = cpu_quantize_q8_K(x);
    const DeviceBuffer dids = to_device(ids);
    const size_t n_out = ids.size() * size_t(n_rows);
    DeviceBuffer y(n_out * sizeof(float));
    const size_t row_bytes = quant::row_size(type, k);
    // The scalar level: its dot takes Q8_K rows in the plain block layout (the AVX-512 VBMI
    // IQ2_XXS dot wants them position-major).
    const auto &cpu = quant::kernels(type, quant::SimdLevel::Scalar);
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
        DS4_CUDA_CHECK(cudaMemset(y.get(), 0xff, y.bytes()));
        launch(dids.as<int32_t>(), int(ids.size()), a.view(), y.as<float>());
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(y, n_out);
        if (run == 1) {
            ASSERT_EQ(std::memcmp(got.data(), first.data(), n_out * sizeof(float)), 0)
                << "two launches differ";
            return;
        }
        first = got;
        for (size_t i = 0; i < ids.size(); ++i)
            for (int64_t r = 0; r < n_rows; ++r) {
                const uint8_t *row =
                    w.data() + (size_t(ids[i]) * size_t(n_rows) + size_t(r)) * row_bytes;
                const std::vector<quant::BlockQ8_K> xi(
                    xb.begin() + (per_slot ? int64_t(i) * (k / 256) : 0),
                    xb.begin() + (per_slot ? int64_t(i) * (k / 256) : 0) + k / 256);
                const float want = cpu.vec_dot(k, row, xi.data());
                const double bound = 2.0 * double(k / 256) * FLT_EPSILON * abs_terms(row, xi);
                const float g = got[i * size_t(n_rows) + size_t(r)];
                ASSERT_FALSE(std::isnan(g)) << "slot " << i << " row " << r << " not written";
                ASSERT_LE(std::fabs(double(g) - double(want)), bound)
                    << "slot " << i << " (expert " << ids[i] << ") row " << r << " k " << k;
            }
    }
}

// A pair launch (the routed gate and up of one input: pair(ids, n_ids, x, ya, yb)) against two
// single launches (single(0 or 1, ids, n_ids, x, y)): every output bit for bit, outputs poisoned.
template <class Single, class Pair>
void check_expert_pair(int64_t n_rows, int64_t k, uint64_t seed, Single &&single, Pair &&pair) {
    const std::vector<int32_t> ids = {3, 0, 8, 3, 5, 1};
    const int n = int(ids.size());
    const DeviceQ8_K a = quantize_q8_K_on_device(random_floats(k, seed, 2.0f));
    const DeviceBuffer dids = to_device(ids);
    const size_t count = size_t(n) * size_t(n_rows);
    auto poisoned = [&] { return to_device(poison_floats(int64_t(count))); };
    DeviceBuffer want_a = poisoned(), want_b = poisoned(), got_a = poisoned(), got_b = poisoned();
    single(0, dids.as<int32_t>(), n, a.view(), want_a.as<float>());
    single(1, dids.as<int32_t>(), n, a.view(), want_b.as<float>());
    pair(dids.as<int32_t>(), n, a.view(), got_a.as<float>(), got_b.as<float>());
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    for (const auto &[got, want] : {std::pair{&got_a, &want_a}, std::pair{&got_b, &want_b}}) {
        const auto g = to_host<float>(*got, count), w = to_host<float>(*want, count);
        for (float v : g) ASSERT_FALSE(std::isnan(v)) << "unwritten output";
        ASSERT_EQ(std::memcmp(g.data(), w.data(), count * 4), 0) << n_rows << " x " << k;
    }
}

}  // namespace ds4::cuda::test
