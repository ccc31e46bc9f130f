// The device-word forms of the kernels whose parameters depend on a token's position (the forms
// a decode step replayed as a CUDA graph uses) against their host-parameter forms, which the
// other tests compare with the CPU twins: the same bits for the same values, outputs poisoned
// first, and nothing written where the words say there is nothing to do.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cuda/attention_decode.h"
#include "backend/cuda/indexer_ops.h"
#include "backend/cuda/kv_ops.h"
#include "backend/cuda/vector_ops.h"
#include "cuda_test_util.h"

namespace ds4::cuda {
namespace {

using test::random_floats;
using test::same_bits;
using test::to_device;
using test::to_host;

TEST(CudaStepWords, StoreRowAtWritesTheIndexedRowOrNothing) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kD = 96, kRows = 5;
    const auto row = random_floats(kD, 1, 3.0f);
    const DeviceBuffer drow = to_device(row);
    for (const int64_t index : {int64_t(3), int64_t(-1)}) {
        const auto init = test::poison_floats(kRows * kD);
        DeviceBuffer want = to_device(init), got = to_device(init);
        const DeviceBuffer dindex = to_device(std::vector<int64_t>{index});
        if (index >= 0)
            store_row(drow.as<float>(), kD, true, want.as<float>() + index * kD, nullptr);
        store_row_at(drow.as<float>(), kD, true, got.as<float>(), dindex.as<int64_t>(), nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_TRUE(same_bits(to_host<float>(got, init.size()), to_host<float>(want, init.size())))
            << "index " << index;
    }
}

TEST(CudaStepWords, GatherRowsStepEqualsGatherRows) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kD = 64, kWindow = 8, kComp = 12, kMax = kWindow + 6;
    const auto ring = random_floats(kWindow * kD, 2, 1.0f),
               comp = random_floats(kComp * kD, 3, 1.0f);
    const std::vector<int32_t> sel = {1, 4, 5, 9, 10, 11};
    const DeviceBuffer dring = to_device(ring), dcomp = to_device(comp), dsel = to_device(sel);
    struct Case {
        int64_t first, n_raw, n_sel, use_selected;
    };
    for (const Case c : {Case{13, 8, 6, 1}, Case{0, 3, 0, 0}, Case{5, 8, 4, 0}}) {
        DeviceBuffer want = to_device(test::poison_floats(kMax * kD)),
                     got = to_device(test::poison_floats(kMax * kD));
        gather_rows(dring.as<float>(), kWindow, c.first, c.n_raw, dcomp.as<float>(),
                    c.use_selected ? dsel.as<int32_t>() : nullptr, c.n_sel, kD, want.as<float>(),
                    nullptr);
        const DeviceBuffer words =
            to_device(std::vector<int64_t>{c.first, c.n_raw, c.n_sel, c.use_selected});
        gather_rows_step(dring.as<float>(), kWindow, dcomp.as<float>(), dsel.as<int32_t>(),
                         words.as<int64_t>(), kMax, kD, got.as<float>(), nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_TRUE(same_bits(to_host<float>(got, kMax * kD), to_host<float>(want, kMax * kD)))
            << "first " << c.first;
    }
}

TEST(CudaStepWords, CompressorPushAndShiftFollowTheirWords) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int kRatio = 4;
    constexpr int64_t kWidth = 256, kRows = 2 * kRatio;
    const auto kv = random_floats(kWidth, 4, 1.0f), sc = random_floats(kWidth, 5, 1.0f);
    const auto ape = random_floats(kRatio * kWidth, 6, 1.0f);
    const auto state = random_floats(kRows * kWidth, 7, 1.0f);
    const DeviceBuffer dkv = to_device(kv), dsc = to_device(sc), dape = to_device(ape);
    for (const int64_t phase : {int64_t(0), int64_t(3)}) {
        DeviceBuffer wk = to_device(state), ws = to_device(state), gk = to_device(state),
                     gs = to_device(state);
        compressor_push(dkv.as<float>(), dsc.as<float>(), dape.as<float>() + phase * kWidth, kWidth,
                        kRatio + phase, wk.as<float>(), ws.as<float>(), nullptr);
        const DeviceBuffer dphase = to_device(std::vector<int64_t>{phase});
        compressor_push_step(dkv.as<float>(), dsc.as<float>(), dape.as<float>(), kWidth,
                             dphase.as<int64_t>(), kRatio, gk.as<float>(), gs.as<float>(), nullptr);
        // Shift where the word names a completed row, not where it is -1.
        const int64_t when = phase == 3 ? 7 : -1;
        if (when >= 0) compressor_shift(wk.as<float>(), ws.as<float>(), kRatio, kWidth, nullptr);
        const DeviceBuffer dwhen = to_device(std::vector<int64_t>{when});
        compressor_shift_if(gk.as<float>(), gs.as<float>(), kRatio, kWidth, dwhen.as<int64_t>(),
                            nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const size_t n = state.size();
        EXPECT_TRUE(same_bits(to_host<float>(gk, n), to_host<float>(wk, n))) << phase;
        EXPECT_TRUE(same_bits(to_host<float>(gs, n), to_host<float>(ws, n))) << phase;
    }
}

TEST(CudaStepWords, AttentionWithRowCountOnTheDevice) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kHeads = 16, kD = 128, kRows = 37, kMax = 64;
    const auto q = random_floats(kHeads * kD, 8, 1.0f), rows = random_floats(kMax * kD, 9, 1.0f);
    const auto sinks = random_floats(kHeads, 10, 1.0f);
    const DeviceBuffer dq = to_device(q), drows = to_device(rows), dsinks = to_device(sinks);
    const DeviceBuffer dn = to_device(std::vector<int64_t>{kRows});
    DeviceBuffer ws = to_device(test::poison_floats(kHeads * kMax)),
                 gs = to_device(test::poison_floats(kHeads * kMax));
    DeviceBuffer wo = to_device(test::poison_floats(kHeads * kD)),
                 go = to_device(test::poison_floats(kHeads * kD));
    attention_scores(dq.as<float>(), drows.as<float>(), kRows, kHeads, kD, ws.as<float>(), nullptr);
    attention_mix(ws.as<float>(), drows.as<float>(), kRows, dsinks.as<float>(), 0.125f, kHeads, kD,
                  wo.as<float>(), nullptr);
    attention_scores(dq.as<float>(), drows.as<float>(), kMax, kHeads, kD, gs.as<float>(), nullptr,
                     dn.as<int64_t>());
    attention_mix(gs.as<float>(), drows.as<float>(), kMax, dsinks.as<float>(), 0.125f, kHeads, kD,
                  go.as<float>(), nullptr, dn.as<int64_t>());
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(to_host<float>(go, kHeads * kD), to_host<float>(wo, kHeads * kD)));
}

TEST(CudaStepWords, IndexerWithRowCountOnTheDevice) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int kHeads = 8, kI = 32;
    constexpr int64_t kCap = 300, kTopK = 16;
    const auto q = random_floats(kHeads * kI, 11, 1.0f), w = random_floats(kHeads, 12, 1.0f);
    const auto rows = random_floats(kCap * kI, 13, 1.0f);
    const DeviceBuffer dq = to_device(q), dw = to_device(w), drows = to_device(rows);
    for (const int64_t n : {int64_t(200), int64_t(10)}) {  // selecting, and not (n <= top-k)
        const DeviceBuffer dn = to_device(std::vector<int64_t>{n});
        DeviceBuffer want_s = to_device(test::poison_floats(kCap)),
                     got_s = to_device(test::poison_floats(kCap));
        const std::vector<int32_t> init(kTopK, -7);
        DeviceBuffer want_k = to_device(init), got_k = to_device(init);
        indexer_scores(dq.as<float>(), dw.as<float>(), 0.1f, drows.as<float>(), n, kHeads, kI,
                       want_s.as<float>(), nullptr);
        indexer_scores(dq.as<float>(), dw.as<float>(), 0.1f, drows.as<float>(), kCap, kHeads, kI,
                       got_s.as<float>(), nullptr, dn.as<int64_t>());
        if (n > kTopK)
            top_k_ascending(want_s.as<float>(), n, kTopK, want_k.as<int32_t>(), nullptr, nullptr);
        top_k_ascending(got_s.as<float>(), kCap, kTopK, got_k.as<int32_t>(), nullptr, nullptr,
                        dn.as<int64_t>());
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto gs = to_host<float>(got_s, kCap), ws = to_host<float>(want_s, kCap);
        EXPECT_EQ(std::memcmp(gs.data(), ws.data(), size_t(n) * 4), 0) << n;
        for (int64_t i = n; i < kCap; ++i) ASSERT_TRUE(std::isnan(gs[size_t(i)])) << "row " << i;
        EXPECT_EQ(to_host<int32_t>(got_k, kTopK), to_host<int32_t>(want_k, kTopK)) << n;
    }
}

// A decode step reads its visible rows where they are: the scores and the mix on VisibleRows
// equal them on the rows gather_rows_step copies, bit for bit, with and without the indexer's
// selection, with the window wrapped around the ring, over more rows than one of the mix's
// tiles (256) and with a head count that leaves warps of the mix without a head.
TEST(CudaStepWords, AttentionOnRowsInPlaceEqualsGatheredRows) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kHeads = 12, kD = 128, kWindow = 8, kComp = 300, kMax = kWindow + 280;
    const auto q = random_floats(kHeads * kD, 21, 1.0f), sinks = random_floats(kHeads, 22, 1.0f);
    const auto ring = random_floats(kWindow * kD, 23, 1.0f),
               comp = random_floats(kComp * kD, 24, 1.0f);
    std::vector<int32_t> sel(280);  // distinct ids, out of order (7 and 300 are coprime)
    for (size_t i = 0; i < sel.size(); ++i) sel[i] = int32_t((7 * i + 3) % kComp);
    const DeviceBuffer dq = to_device(q), dsinks = to_device(sinks), dring = to_device(ring),
                       dcomp = to_device(comp), dsel = to_device(sel);
    struct Case {
        int64_t first, n_raw, n_sel, use_selected;
    };
    for (const Case c : {Case{13, 8, 280, 1}, Case{0, 3, 0, 0}, Case{5, 8, 270, 0}}) {
        const DeviceBuffer words =
            to_device(std::vector<int64_t>{c.first, c.n_raw, c.n_sel, c.use_selected});
        const DeviceBuffer dn = to_device(std::vector<int64_t>{c.n_raw + c.n_sel});
        DeviceBuffer rows = to_device(test::poison_floats(kMax * kD));
        gather_rows_step(dring.as<float>(), kWindow, dcomp.as<float>(), dsel.as<int32_t>(),
                         words.as<int64_t>(), kMax, kD, rows.as<float>(), nullptr);
        DeviceBuffer ws = to_device(test::poison_floats(kHeads * kMax)),
                     gs = to_device(test::poison_floats(kHeads * kMax));
        DeviceBuffer wo = to_device(test::poison_floats(kHeads * kD)),
                     go = to_device(test::poison_floats(kHeads * kD));
        attention_scores(dq.as<float>(), rows.as<float>(), kMax, kHeads, kD, ws.as<float>(),
                         nullptr, dn.as<int64_t>());
        attention_mix(ws.as<float>(), rows.as<float>(), kMax, dsinks.as<float>(), 0.125f, kHeads,
                      kD, wo.as<float>(), nullptr, dn.as<int64_t>());
        const VisibleRows in_place{dring.as<float>(), kWindow, dcomp.as<float>(),
                                   dsel.as<int32_t>(), words.as<int64_t>()};
        const DeviceBuffer unused = to_device(test::poison_floats(kMax * kD));
        attention_scores(dq.as<float>(), unused.as<float>(), kMax, kHeads, kD, gs.as<float>(),
                         nullptr, dn.as<int64_t>(), {}, &in_place);
        attention_mix(gs.as<float>(), unused.as<float>(), kMax, dsinks.as<float>(), 0.125f, kHeads,
                      kD, go.as<float>(), nullptr, dn.as<int64_t>(), {}, &in_place);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto gsh = to_host<float>(gs, kHeads * kMax), wsh = to_host<float>(ws, kHeads * kMax);
        const size_t used = size_t(kHeads * (c.n_raw + c.n_sel));  // heads' stride: the count
        EXPECT_EQ(std::memcmp(gsh.data(), wsh.data(), used * 4), 0) << "first " << c.first;
        EXPECT_TRUE(same_bits(to_host<float>(go, kHeads * kD), to_host<float>(wo, kHeads * kD)))
            << "first " << c.first;
        for (float v : to_host<float>(go, kHeads * kD)) ASSERT_FALSE(std::isnan(v));
    }
}

// The mix of one token with the inverse rotation and the Q8_0 activation in its launch equals
// the mix followed by rope_tail_q8_0: the output heads, the codes and the scales, bit for bit.
TEST(CudaStepWords, MixWithRopeAndQ8_0EqualsMixThenRopeTailQ8_0) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kHeads = 12, kD = 128, kRows = 300, kFreq = 32;
    const auto q = random_floats(kHeads * kD, 31, 1.0f), rows = random_floats(kRows * kD, 32, 1.0f);
    const auto sinks = random_floats(kHeads, 33, 1.0f);
    std::vector<double> freqs(kFreq);
    for (int64_t k = 0; k < kFreq; ++k) freqs[size_t(k)] = std::pow(10000.0, -double(k) / kFreq);
    const DeviceBuffer dq = to_device(q), drows = to_device(rows), dsinks = to_device(sinks),
                       df = to_device(freqs), dpos = to_device(std::vector<int64_t>{1234});
    DeviceBuffer scores = to_device(test::poison_floats(kHeads * kRows));
    attention_scores(dq.as<float>(), drows.as<float>(), kRows, kHeads, kD, scores.as<float>(),
                     nullptr);
    DeviceBuffer wo = to_device(test::poison_floats(kHeads * kD)),
                 go = to_device(test::poison_floats(kHeads * kD));
    const std::vector<int8_t> q_init(kHeads * kD, 99);
    const std::vector<float> d_init = test::poison_floats(kHeads * kD / 32);
    DeviceBuffer wq = to_device(q_init), gq = to_device(q_init), wd = to_device(d_init),
                 gd = to_device(d_init);
    attention_mix(scores.as<float>(), drows.as<float>(), kRows, dsinks.as<float>(), 0.125f, kHeads,
                  kD, wo.as<float>(), nullptr);
    rope_tail_q8_0(wo.as<float>(), kHeads, kD, df.as<double>(), kFreq, dpos.as<int64_t>(), true,
                   wq.as<int8_t>(), wd.as<float>(), nullptr);
    const MixRopeQ8_0 fused{df.as<double>(), kFreq, dpos.as<int64_t>(), gq.as<int8_t>(),
                            gd.as<float>()};
    attention_mix(scores.as<float>(), drows.as<float>(), kRows, dsinks.as<float>(), 0.125f, kHeads,
                  kD, go.as<float>(), nullptr, nullptr, {}, nullptr, &fused);
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(to_host<float>(go, kHeads * kD), to_host<float>(wo, kHeads * kD)));
    EXPECT_EQ(to_host<int8_t>(gq, kHeads * kD), to_host<int8_t>(wq, kHeads * kD));
    EXPECT_TRUE(
        same_bits(to_host<float>(gd, kHeads * kD / 32), to_host<float>(wd, kHeads * kD / 32)));
    for (float v : to_host<float>(go, kHeads * kD)) ASSERT_FALSE(std::isnan(v));
}

}  // namespace
}  // namespace ds4::cuda
