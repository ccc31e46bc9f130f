// The routed-expert kernels reach an expert's weights only through its tensor's expert table
// (backend/cuda/expert_table.h): with every expert's planes copied to an allocation of its own,
// in reverse order with gaps between them, and the view's plane pointers set to null, the
// decode products (one tensor, and the gate + up pair) and the grouped prefill products give
// the resident tensor's outputs bit for bit, for IQ2_XXS, Q2_K and Q4_K. This is what lets a
// table point at the slots of an expert cache instead of a resident tensor. A negative id leaves
// its slot's outputs unwritten and the others unchanged (hits first). Outputs are
// poisoned with NaN before every launch. Without a CUDA device every test skips and says so.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/expert_groups.h"
#include "backend/cuda/expert_table.h"
#include "backend/cuda/iq2_xxs_matvec.h"
#include "backend/cuda/q2_k_matvec.h"
#include "backend/cuda/q4_k_matvec.h"
#include "cuda_test_util.h"
#include "quant/random_blocks.h"

namespace ds4::cuda {
namespace {

using test::to_device;
using test::to_host;

constexpr int kExperts = 9;

// Each expert's two planes (qs_bytes, then scale_bytes) in an allocation of its own, made in
// reverse expert order with an unused allocation between two, and the table naming them.
struct ScatteredExperts {
    std::vector<DeviceBuffer> buffers;
    DeviceBuffer pointers;
    ExpertTable table;
};

ScatteredExperts scatter(const void *qs, size_t qs_bytes, const void *scales, size_t scale_bytes,
                         int n_experts) {
    ScatteredExperts s;
    std::vector<const uint8_t *> host(2 * size_t(n_experts));
    for (int e = n_experts - 1; e >= 0; --e) {
        DeviceBuffer slot(qs_bytes + scale_bytes);
        auto *base = slot.as<uint8_t>();
        DS4_CUDA_CHECK(cudaMemcpy(base, static_cast<const uint8_t *>(qs) + size_t(e) * qs_bytes,
                                  qs_bytes, cudaMemcpyDeviceToDevice));
        DS4_CUDA_CHECK(cudaMemcpy(base + qs_bytes,
                                  static_cast<const uint8_t *>(scales) + size_t(e) * scale_bytes,
                                  scale_bytes, cudaMemcpyDeviceToDevice));
        host[size_t(e)] = base;
        host[size_t(n_experts + e)] = base + qs_bytes;
        s.buffers.push_back(std::move(slot));
        s.buffers.emplace_back(4096);  // a gap
    }
    s.pointers = to_device(host);
    const auto *p = s.pointers.as<const uint8_t *>();
    s.table = {p, p + n_experts};
    return s;
}

// A view of the same experts through the scattered table only.
template <class View>
View through(View v, const ScatteredExperts &s) {
    v.qs = nullptr;
    v.table = s.table;
    return v;
}

// run(view, y) into poisoned outputs of n floats, for the resident and the scattered view.
template <class View, class Run>
void expect_same_bits(const View &resident, const View &scattered, size_t n, Run &&run,
                      const char *what) {
    std::vector<float> out[2];
    for (int i = 0; i < 2; ++i) {
        DeviceBuffer y = to_device(test::poison_floats(n));
        run(i == 0 ? resident : scattered, y.as<float>());
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        out[i] = to_host<float>(y, n);
    }
    for (size_t j = 0; j < n; ++j) ASSERT_FALSE(std::isnan(out[0][j])) << what << ": output " << j;
    ASSERT_EQ(std::memcmp(out[0].data(), out[1].data(), n * sizeof(float)), 0) << what;
}

// The decode products (shared and per-slot activations) and the grouped products of one
// format's view, resident and scattered. pair: the gate + up launch of two such tensors.
template <class View, class Single, class Grouped, class Pair>
void check_format(const View &resident, const View &scattered, const View &resident_b,
                  const View &scattered_b, Single &&single, Grouped &&grouped, Pair &&pair) {
    const int64_t n_rows = resident.n_rows, k = resident.k;
    const std::vector<int32_t> ids = {3, 0, 8, 3, 5, 1};
    const int n_ids = int(ids.size());
    const DeviceBuffer dids = to_device(ids);
    const size_t n_out = size_t(n_ids) * size_t(n_rows);
    for (const bool per_slot : {false, true}) {
        const auto x = test::random_floats(k * (per_slot ? n_ids : 1), 71 + k, 2.0f);
        const test::DeviceQ8_K a = test::quantize_q8_K_on_device(x);
        expect_same_bits(
            resident, scattered, n_out,
            [&](const View &v, float *y) {
                single(v, dids.as<int32_t>(), n_ids, a.view(), y, per_slot);
            },
            per_slot ? "decode, x per slot" : "decode, x shared");
    }
    {
        // A negative id leaves its slot out (the device tier's hits-first launches): its outputs
        // keep their poison, the other slots' are the whole launch's bits.
        std::vector<int32_t> part = ids;
        part[1] = part[4] = -1;
        const DeviceBuffer dpart = to_device(part);
        const test::DeviceQ8_K a = test::quantize_q8_K_on_device(test::random_floats(k, 75, 2.0f));
        auto run_pair = [&](const int32_t *d_ids) {
            DeviceBuffer ya = to_device(test::poison_floats(n_out));
            DeviceBuffer yb = to_device(test::poison_floats(n_out));
            pair(scattered, scattered_b, d_ids, n_ids, a.view(), ya.as<float>(), yb.as<float>());
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            std::vector<float> out = to_host<float>(ya, n_out);
            const auto b = to_host<float>(yb, n_out);
            out.insert(out.end(), b.begin(), b.end());
            return out;
        };
        const auto all = run_pair(dids.as<int32_t>()), left = run_pair(dpart.as<int32_t>());
        for (size_t j = 0; j < all.size(); ++j) {
            const size_t slot = j % n_out / size_t(n_rows);
            ASSERT_FALSE(std::isnan(all[j])) << "slot " << slot;
            if (part[slot] < 0)
                ASSERT_TRUE(std::isnan(left[j])) << "slot " << slot << " left out, yet written";
            else
                ASSERT_EQ(std::memcmp(&all[j], &left[j], sizeof(float)), 0) << "slot " << slot;
        }
    }
    {
        const test::DeviceQ8_K a = test::quantize_q8_K_on_device(test::random_floats(k, 73, 2.0f));
        std::vector<float> out[2];
        for (int i = 0; i < 2; ++i) {
            DeviceBuffer ya = to_device(test::poison_floats(n_out));
            DeviceBuffer yb = to_device(test::poison_floats(n_out));
            pair(i == 0 ? resident : scattered, i == 0 ? resident_b : scattered_b,
                 dids.as<int32_t>(), n_ids, a.view(), ya.as<float>(), yb.as<float>());
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            out[i] = to_host<float>(ya, n_out);
            const auto b = to_host<float>(yb, n_out);
            out[i].insert(out[i].end(), b.begin(), b.end());
        }
        for (float v : out[0]) ASSERT_FALSE(std::isnan(v)) << "pair";
        ASSERT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)), 0)
            << "gate + up pair";
    }
    // A chunk of 21 tokens, 3 distinct experts each: pair p = 3 t + s takes expert (t + 3 s) % 9.
    constexpr int kTokens = 21, kUsed = 3;
    std::vector<int32_t> pair_ids;
    for (int t = 0; t < kTokens; ++t)
        for (int s = 0; s < kUsed; ++s) pair_ids.push_back((t + 3 * s) % kExperts);
    const DeviceBuffer dpairs = to_device(pair_ids);
    DeviceBuffer offsets((kExperts + 1) * sizeof(int32_t)), order(pair_ids.size() * 4);
    group_by_expert(dpairs.as<int32_t>(), int(pair_ids.size()), kExperts, offsets.as<int32_t>(),
                    order.as<int32_t>(), nullptr);
    const ExpertGroups groups{offsets.as<int32_t>(), order.as<int32_t>(), kExperts, kUsed, kTokens};
    const test::DeviceQ8_K a =
        test::quantize_q8_K_on_device(test::random_floats(kTokens * k, 79 + k, 2.0f));
    expect_same_bits(
        resident, scattered, pair_ids.size() * size_t(n_rows),
        [&](const View &v, float *y) { grouped(v, groups, a.view(), y); }, "grouped chunk");
}

TEST(CudaExpertTable, Iq2xxsKernelsReadExpertsThroughTheTable) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kRows = 64, kK = 512, kSb = kK / 256;
    const auto wa = quant::random_blocks(GgmlType::IQ2_XXS, kExperts * kRows * kK, 81);
    const auto wb = quant::random_blocks(GgmlType::IQ2_XXS, kExperts * kRows * kK, 82);
    const Iq2xxsWeights da(wa.data(), kRows, kK, kExperts), db(wb.data(), kRows, kK, kExperts);
    const size_t qs = size_t(kRows * kSb) * 64, d = size_t(kRows * kSb) * 2;
    const ScatteredExperts sa = scatter(da.experts().qs, qs, da.experts().d, d, kExperts);
    const ScatteredExperts sb = scatter(db.experts().qs, qs, db.experts().d, d, kExperts);
    auto na = through(da.experts(), sa), nb = through(db.experts(), sb);
    na.d = nb.d = nullptr;
    check_format(
        da.experts(), na, db.experts(), nb,
        [](const Iq2xxsExperts &v, const int32_t *ids, int n, const Q8_KActivation &x, float *y,
           bool per_slot) { matvec_iq2_xxs(v, ids, n, x, y, nullptr, per_slot); },
        [](const Iq2xxsExperts &v, const ExpertGroups &g, const Q8_KActivation &x, float *y) {
            matmul_iq2_xxs_grouped(v, g, x, y, nullptr);
        },
        [](const Iq2xxsExperts &a, const Iq2xxsExperts &b, const int32_t *ids, int n,
           const Q8_KActivation &x, float *ya,
           float *yb) { matvec_iq2_xxs_pair(a, b, ids, n, x, ya, yb, nullptr); });
}

TEST(CudaExpertTable, Q2KKernelsReadExpertsThroughTheTable) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kRows = 64, kK = 512, kSb = kK / 256;
    const auto w = quant::random_blocks(GgmlType::Q2_K, kExperts * kRows * kK, 83);
    const Q2KWeights dw(w.data(), kRows, kK, kExperts);
    const ScatteredExperts s =
        scatter(dw.experts().qs, size_t(kRows * kSb) * 64, dw.experts().records,
                size_t(kRows * kSb) * kQ2KRecordBytes, kExperts);
    auto n = through(dw.experts(), s);
    n.records = nullptr;
    // Q2_K has no pair launch (the routed down projection): its pair check runs the two
    // tensors as two launches.
    check_format(
        dw.experts(), n, dw.experts(), n,
        [](const Q2KExperts &v, const int32_t *ids, int n_ids, const Q8_KActivation &x, float *y,
           bool per_slot) { matvec_q2_K(v, ids, n_ids, x, y, nullptr, per_slot); },
        [](const Q2KExperts &v, const ExpertGroups &g, const Q8_KActivation &x, float *y) {
            matmul_q2_K_grouped(v, g, x, y, nullptr);
        },
        [](const Q2KExperts &a, const Q2KExperts &b, const int32_t *ids, int n_ids,
           const Q8_KActivation &x, float *ya, float *yb) {
            matvec_q2_K(a, ids, n_ids, x, ya, nullptr);
            matvec_q2_K(b, ids, n_ids, x, yb, nullptr);
        });
}

TEST(CudaExpertTable, Q4KKernelsReadExpertsThroughTheTable) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kRows = 64, kK = 512, kSb = kK / 256;
    const auto wa = quant::random_blocks(GgmlType::Q4_K, kExperts * kRows * kK, 85);
    const auto wb = quant::random_blocks(GgmlType::Q4_K, kExperts * kRows * kK, 86);
    const Q4KWeights da(wa.data(), kRows, kK, kExperts), db(wb.data(), kRows, kK, kExperts);
    const size_t qs = size_t(kRows * kSb) * 128, headers = size_t(kRows * kSb) * 16;
    const ScatteredExperts sa =
        scatter(da.experts().qs, qs, da.experts().headers, headers, kExperts);
    const ScatteredExperts sb =
        scatter(db.experts().qs, qs, db.experts().headers, headers, kExperts);
    auto na = through(da.experts(), sa), nb = through(db.experts(), sb);
    na.headers = nb.headers = nullptr;
    check_format(
        da.experts(), na, db.experts(), nb,
        [](const Q4KExperts &v, const int32_t *ids, int n, const Q8_KActivation &x, float *y,
           bool per_slot) { matvec_q4_K(v, ids, n, x, y, nullptr, per_slot); },
        [](const Q4KExperts &v, const ExpertGroups &g, const Q8_KActivation &x, float *y) {
            matmul_q4_K_grouped(v, g, x, y, nullptr);
        },
        [](const Q4KExperts &a, const Q4KExperts &b, const int32_t *ids, int n,
           const Q8_KActivation &x, float *ya,
           float *yb) { matvec_q4_K_pair(a, b, ids, n, x, ya, yb, nullptr); });
}

// The resident table: expert e at base + e * stride, for both planes.
TEST(CudaExpertTable, ResidentTablePointsAtEachExpertsPlanes) {
    DS4_REQUIRE_CUDA_DEVICE();
    DeviceBuffer qs(5 * 100), scales(5 * 12);
    const ResidentExpertTable t(qs.get(), 100, scales.get(), 12, 5);
    std::vector<const uint8_t *> got(10);  // the two arrays are adjacent
    DS4_CUDA_CHECK(
        cudaMemcpy(got.data(), t.table().qs, got.size() * sizeof(got[0]), cudaMemcpyDeviceToHost));
    for (int e = 0; e < 5; ++e) {
        EXPECT_EQ(got[size_t(e)], qs.as<uint8_t>() + 100 * e) << "expert " << e;
        EXPECT_EQ(got[size_t(5 + e)], scales.as<uint8_t>() + 12 * e) << "expert " << e;
    }
    EXPECT_EQ(t.table().scales, t.table().qs + 5);
    EXPECT_THROW(ResidentExpertTable(qs.get(), 100, scales.get(), 12, 0), ds4::Error);
}

}  // namespace
}  // namespace ds4::cuda
