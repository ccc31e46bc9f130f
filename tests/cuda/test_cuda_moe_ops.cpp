// The routed-MoE glue kernels against their CPU twins:
//   - route_experts: the same experts as backend/cpu/routing.h route_experts (random logits and
//     biases, so no two biased scores tie within an ulp: margins are clear), hash rows taken as
//     they are, weights within 4 ulps (exp and log1p: the device rounds double results, the CPU
//     calls f32 libm);
//   - swiglu_slots: within 4 ulps of swiglu_clamped times the slot's weight, NaN kept;
//   - swiglu_slots_q8_0 / _q8_K and route_experts_q8_K: the separate launches, bit for bit;
//   - sum_slots: bit for bit the CPU's in-order sum.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/routing.h"
#include "backend/cpu/vector_ops.h"
#include "backend/cuda/moe_ops.h"
#include "backend/cuda/q8_0_matvec.h"
#include "backend/cuda/q8_k_quantize.h"
#include "cuda_test_util.h"

namespace ds4::cuda {
namespace {

using test::random_floats;
using test::to_device;
using test::to_host;
using test::ulps;

TEST(CudaRoute, SameExpertsAndWeightsAsCpu) {
    DS4_REQUIRE_CUDA_DEVICE();
    struct Case {
        uint32_t n_expert, n_used;
        bool bias, normalize, hash;
    };
    for (const Case c : {Case{256, 6, true, true, false}, Case{256, 6, false, true, false},
                         Case{64, 8, true, false, false}, Case{256, 6, false, true, true},
                         Case{1000, 12, true, true, false}})
        for (uint64_t seed = 1; seed <= 20; ++seed) {
            auto logits = random_floats(c.n_expert, seed, 6.0f);
            if (seed == 2) logits[5] = 25.0f, logits[9] = -30.0f;  // softplus' two outer branches
            const auto bias = random_floats(c.n_expert, 100 + seed, 0.5f);
            std::vector<int32_t> table(size_t(50) * c.n_used);
            for (size_t i = 0; i < table.size(); ++i)
                table[i] = int32_t((i * 37 + seed) % c.n_expert);
            const int32_t token = int32_t(seed % 50);

            backend::cpu::RouteParams cp{c.n_expert, c.n_used, c.bias ? bias.data() : nullptr,
                                         c.normalize, 1.5f};
            std::vector<uint32_t> want_e(c.n_used);
            std::vector<float> want_w(c.n_used);
            backend::cpu::route_experts(logits.data(), cp,
                                        c.hash ? table.data() + size_t(token) * c.n_used : nullptr,
                                        want_e.data(), want_w.data());

            const DeviceBuffer dl = to_device(logits), db = to_device(bias), dt = to_device(table),
                               dtok = to_device(std::vector<int32_t>{token});
            DeviceBuffer de(c.n_used * 4), dw(c.n_used * 4);
            RouteDeviceParams gp{c.n_expert, c.n_used, c.bias ? db.as<float>() : nullptr,
                                 c.normalize, 1.5f};
            if (c.hash)
                gp.hash_table = dt.as<int32_t>(), gp.token = dtok.as<int32_t>(), gp.hash_rows = 50;
            DS4_CUDA_CHECK(cudaMemset(dw.get(), 0xff, dw.bytes()));
            route_experts(dl.as<float>(), gp, de.as<int32_t>(), dw.as<float>(), nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const auto got_e = to_host<int32_t>(de, c.n_used);
            const auto got_w = to_host<float>(dw, c.n_used);
            for (uint32_t i = 0; i < c.n_used; ++i) {
                ASSERT_EQ(uint32_t(got_e[i]), want_e[i]) << "slot " << i << " seed " << seed;
                ASSERT_LE(ulps(got_w[i], want_w[i]), 4.0) << "slot " << i << " seed " << seed;
            }
        }
}

// A decode step's router with the experts' Q8_K input in the same launch: the experts, weights,
// codes, scales and sums of route_experts then quantize_q8_K_activation, bit for bit (score
// routing and hash routing).
TEST(CudaRoute, WithQ8_KInputEqualsRouteThenQuantize) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr uint32_t kExperts = 256, kUsed = 6;
    constexpr int64_t kE = 4096;
    const auto logits = random_floats(kExperts, 91, 6.0f), bias = random_floats(kExperts, 92, 0.5f);
    auto x = random_floats(kE, 93, 3.0f);
    for (int64_t i = 256; i < 512; ++i) x[size_t(i)] = 0.0f;  // a zero block
    std::vector<int32_t> table(size_t(50) * kUsed);
    for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t((i * 37) % kExperts);
    const DeviceBuffer dl = to_device(logits), db = to_device(bias), dx = to_device(x),
                       dt = to_device(table), dtok = to_device(std::vector<int32_t>{7});
    auto bytes = [](const DeviceBuffer &b) { return to_host<uint8_t>(b, b.bytes()); };
    for (const bool hash : {false, true}) {
        RouteDeviceParams p{kExperts, kUsed, db.as<float>(), true, 1.5f};
        if (hash) p.hash_table = dt.as<int32_t>(), p.token = dtok.as<int32_t>(), p.hash_rows = 50;
        auto run = [&](bool fused, std::vector<std::vector<uint8_t>> &out) {
            DeviceBuffer e(kUsed * 4), w(kUsed * 4), q(kE), d(kE / 256 * 4), bs(kE / 16 * 2);
            for (const DeviceBuffer *b : {&e, &w, &q, &d, &bs})
                DS4_CUDA_CHECK(cudaMemset(b->get(), 0xff, b->bytes()));
            const Q8_KActivation a{q.as<int8_t>(), d.as<float>(), bs.as<int16_t>()};
            if (fused) {
                route_experts_q8_K(dl.as<float>(), p, e.as<int32_t>(), w.as<float>(),
                                   dx.as<float>(), kE, a, nullptr);
            } else {
                route_experts(dl.as<float>(), p, e.as<int32_t>(), w.as<float>(), nullptr);
                quantize_q8_K_activation(dx.as<float>(), kE, a, nullptr);
            }
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            for (const DeviceBuffer *b : {&e, &w, &q, &d, &bs}) out.push_back(bytes(*b));
        };
        std::vector<std::vector<uint8_t>> want, got;
        run(false, want);
        run(true, got);
        for (size_t i = 0; i < want.size(); ++i)
            EXPECT_EQ(got[i], want[i]) << "output " << i << " hash " << hash;
    }
}

TEST(CudaSwiglu, EqualsCpuWithinUlps) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int kSlots = 6;
    constexpr int64_t kN = 2048;
    for (const float clamp : {10.0f, 0.0f}) {
        auto g = random_floats(kSlots * kN, 7, 12.0f), u = random_floats(kSlots * kN, 8, 12.0f);
        g[3] = std::numeric_limits<float>::quiet_NaN();
        u[10] = std::numeric_limits<float>::quiet_NaN();
        g[11] = 95.0f, g[12] = -95.0f;  // exp over- and underflow inside sigmoid
        const std::vector<float> w = {0.5f, 1.25f, 0.01f, 2.0f, 0.3f, 0.7f};
        std::vector<float> want(g);
        for (int i = 0; i < kSlots; ++i)
            backend::cpu::swiglu_clamped(want.data() + i * kN, u.data() + i * kN, kN, clamp,
                                         w[size_t(i)]);
        const DeviceBuffer dg = to_device(g), du = to_device(u), dw = to_device(w);
        DeviceBuffer out(g.size() * 4);
        swiglu_slots(dg.as<float>(), du.as<float>(), kSlots, kN, clamp, dw.as<float>(),
                     out.as<float>(), nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(out, g.size());
        for (size_t i = 0; i < g.size(); ++i)
            ASSERT_LE(ulps(got[i], want[i]), 4.0) << i << ": " << got[i] << " vs " << want[i];
    }
}

// The SwiGLU with its output quantized in the same launch (the down products' activations)
// against swiglu_slots then quantize_q8_0_activation or quantize_q8_K_activation: the same
// output, codes, scales and sums bit for bit; a NaN and a zero block among the values, weighted
// slots and none, a clamp and none; sizes the block does not divide are refused (nothing runs).
TEST(CudaSwiglu, QuantizedInTheSameLaunchBitForBit) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int kSlots = 6;
    constexpr int64_t kN = 2048;
    auto g = random_floats(kSlots * kN, 21, 8.0f), u = random_floats(kSlots * kN, 22, 8.0f);
    g[77] = std::numeric_limits<float>::quiet_NaN();
    for (int64_t i = 512; i < 768; ++i) u[size_t(i)] = 0.0f;  // a zero Q8_K (and Q8_0) block
    const auto w = random_floats(kSlots, 23, 1.0f);
    const DeviceBuffer dg = to_device(g), du = to_device(u), dw = to_device(w);
    const int64_t total = kSlots * kN;
    for (const float clamp : {0.0f, 7.0f})
        for (const bool weighted : {true, false}) {
            const float *wt = weighted ? dw.as<float>() : nullptr;
            auto bytes = [](const DeviceBuffer &b) { return to_host<uint8_t>(b, b.bytes()); };
            DeviceBuffer want_out(total * 4), got_out(total * 4);
            swiglu_slots(dg.as<float>(), du.as<float>(), kSlots, kN, clamp, wt,
                         want_out.as<float>(), nullptr);
            {  // Q8_0
                DeviceBuffer wq(total), wd(total / 32 * 4), gq(total), gd(total / 32 * 4);
                DS4_CUDA_CHECK(cudaMemset(gq.get(), 0x5a, gq.bytes()));
                DS4_CUDA_CHECK(cudaMemset(gd.get(), 0xff, gd.bytes()));
                DS4_CUDA_CHECK(cudaMemset(got_out.get(), 0xff, got_out.bytes()));
                quantize_q8_0_activation(want_out.as<float>(), total, wq.as<int8_t>(),
                                         wd.as<float>(), nullptr);
                ASSERT_TRUE(swiglu_slots_q8_0(dg.as<float>(), du.as<float>(), kSlots, kN, clamp, wt,
                                              got_out.as<float>(), gq.as<int8_t>(), gd.as<float>(),
                                              nullptr));
                DS4_CUDA_CHECK(cudaDeviceSynchronize());
                EXPECT_EQ(bytes(got_out), bytes(want_out)) << "clamp " << clamp;
                EXPECT_EQ(bytes(gq), bytes(wq)) << "clamp " << clamp;
                EXPECT_EQ(bytes(gd), bytes(wd)) << "clamp " << clamp;
            }
            {  // Q8_K
                DeviceBuffer wq(total), wd(total / 256 * 4), wb(total / 16 * 2), gq(total),
                    gd(total / 256 * 4), gb(total / 16 * 2);
                for (const DeviceBuffer *b : {&gq, &gd, &gb, &got_out})
                    DS4_CUDA_CHECK(cudaMemset(b->get(), 0xff, b->bytes()));
                quantize_q8_K_activation(
                    want_out.as<float>(), total,
                    Q8_KActivation{wq.as<int8_t>(), wd.as<float>(), wb.as<int16_t>()}, nullptr);
                ASSERT_TRUE(swiglu_slots_q8_K(
                    dg.as<float>(), du.as<float>(), kSlots, kN, clamp, wt, got_out.as<float>(),
                    Q8_KActivation{gq.as<int8_t>(), gd.as<float>(), gb.as<int16_t>()}, nullptr));
                DS4_CUDA_CHECK(cudaDeviceSynchronize());
                EXPECT_EQ(bytes(got_out), bytes(want_out)) << "clamp " << clamp;
                EXPECT_EQ(bytes(gq), bytes(wq)) << "clamp " << clamp;
                EXPECT_EQ(bytes(gd), bytes(wd)) << "clamp " << clamp;
                EXPECT_EQ(bytes(gb), bytes(wb)) << "clamp " << clamp;
            }
        }
    DeviceBuffer out(64 * 4), q(64), d(64);
    EXPECT_FALSE(swiglu_slots_q8_0(dg.as<float>(), du.as<float>(), 1, 40, 0.0f, nullptr,
                                   out.as<float>(), q.as<int8_t>(), d.as<float>(), nullptr));
    EXPECT_FALSE(swiglu_slots_q8_K(
        dg.as<float>(), du.as<float>(), 1, 128, 0.0f, nullptr, out.as<float>(),
        Q8_KActivation{q.as<int8_t>(), d.as<float>(), reinterpret_cast<int16_t *>(d.as<float>())},
        nullptr));
}

TEST(CudaSumSlots, EqualsCpuOrderBitForBit) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int kSlots = 6;
    constexpr int64_t kN = 4096 + 7;
    const auto o = random_floats(kSlots * kN, 9, 100.0f), shared = random_floats(kN, 10, 1.0f);
    std::vector<float> want(kN);
    for (int64_t j = 0; j < kN; ++j) {
        float acc = 0.0f;
        for (int i = 0; i < kSlots; ++i) acc += o[size_t(i * kN + j)];
        want[size_t(j)] = acc + shared[size_t(j)];
    }
    const DeviceBuffer d_o = to_device(o), d_s = to_device(shared);
    DeviceBuffer y(kN * 4);
    sum_slots(d_o.as<float>(), kSlots, kN, d_s.as<float>(), y.as<float>(), nullptr);
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = to_host<float>(y, kN);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0);
}

// The two launches of a hits-first pass: bit i of the mask sends slot i's id to `in`, the
// others to `out`, and -1 in its place; a mask of 0 sends every id to out.
TEST(CudaSplitIds, EachSlotGoesToOneSideAndMinusOneToTheOther) {
    DS4_REQUIRE_CUDA_DEVICE();
    const std::vector<int32_t> ids = {17, 0, 255, 3, 42, 9};
    const DeviceBuffer d_ids = to_device(ids);
    for (const uint32_t mask : {0u, 0b101001u, 0b111111u, 0b000010u}) {
        DeviceBuffer in = to_device(std::vector<int32_t>(ids.size(), 7777));
        DeviceBuffer out = to_device(std::vector<int32_t>(ids.size(), 7777));
        split_ids(d_ids.as<int32_t>(), int(ids.size()), mask, in.as<int32_t>(), out.as<int32_t>(),
                  nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got_in = to_host<int32_t>(in, ids.size());
        const auto got_out = to_host<int32_t>(out, ids.size());
        for (size_t i = 0; i < ids.size(); ++i) {
            const bool set = (mask >> i) & 1u;
            EXPECT_EQ(got_in[i], set ? ids[i] : -1) << "mask " << mask << " slot " << i;
            EXPECT_EQ(got_out[i], set ? -1 : ids[i]) << "mask " << mask << " slot " << i;
        }
    }
    EXPECT_THROW(split_ids(d_ids.as<int32_t>(), 33, 0, nullptr, nullptr, nullptr), ds4::Error);
}

}  // namespace
}  // namespace ds4::cuda
