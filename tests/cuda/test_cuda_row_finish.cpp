// The fused row chains (backend/cuda/row_finish.h) against the separate kernels they replace
// (each compared with its CPU twin in its own test): the same bits for the attention's q heads
// (norm, RoPE), the KV row (norm with weights, RoPE, FP8, stored f16-rounded or not at a ring
// slot), the compressor rows (pool, norm, RoPE, FP8 or the indexer's rounding, stored where the
// window completes, nothing otherwise), the decode step's compressor launch (push, that row and
// the window's shift in one) and the indexer's q heads (RoPE, rounding, no norm).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/rope.h"
#include "backend/cuda/kv_ops.h"
#include "backend/cuda/row_finish.h"
#include "backend/cuda/vector_ops.h"
#include "cuda_test_util.h"

namespace ds4::cuda {
namespace {

using test::random_floats;
using test::same_bits;
using test::to_device;
using test::to_host;

struct Rope {
    DeviceBuffer freqs, pos;
    int64_t n_freq;
};

Rope rope(int64_t n_rot, int64_t p) {
    const auto f =
        backend::cpu::RopeFreqs::yarn(uint32_t(n_rot), 160000.0, 16.0, 65536.0, 32.0, 1.0);
    return {to_device(f.f), to_device(std::vector<int64_t>{p}), n_rot / 2};
}

// The compressed row of a window (the tests' case): pooled, normed with w, rotated at r's
// position, rounded as the attention's (FP8) or the indexer's row, stored f16 at *index of table.
struct CompressorCase {
    int ratio;
    bool overlap, indexer;
    int64_t d;
};
RowFinish compressor_row(const CompressorCase &c, const float *kv, const float *score,
                         const float *w, const Rope &r, float *table, const int64_t *index) {
    RowFinish f;
    f.d = c.d;
    f.state_kv = kv;
    f.state_score = score;
    f.ratio = c.ratio;
    f.overlap = c.overlap;
    f.width = (c.overlap ? 2 : 1) * c.d;
    f.norm_w = w;
    f.eps = 1e-6f;
    f.freqs = r.freqs.as<double>();
    f.n_freq = r.n_freq;
    f.pos = r.pos.as<int64_t>();
    f.rounding = c.indexer ? RowRounding::Indexer : RowRounding::Fp8;
    f.n_fp8 = c.d - 64;
    f.table = table;
    f.index = index;
    f.f16 = true;
    return f;
}

TEST(CudaRowFinish, QHeadsEqualNormThenRope) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kH = 64, kD = 512;
    const auto q = random_floats(kH * kD, 21, 3.0f);
    const Rope r = rope(64, 1234);
    DeviceBuffer want = to_device(q), got = to_device(q);
    rms_norm(want.as<float>(), nullptr, want.as<float>(), kH, kD, 1e-6f, nullptr);
    rope_tail(want.as<float>(), kH, kD, r.freqs.as<double>(), r.n_freq, r.pos.as<int64_t>(), false,
              nullptr);
    RowFinish f;
    f.d = kD;
    f.n_rows = kH;
    f.rows = f.out = got.as<float>();
    f.eps = 1e-6f;
    f.freqs = r.freqs.as<double>();
    f.n_freq = r.n_freq;
    f.pos = r.pos.as<int64_t>();
    row_finish(f, nullptr);
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(to_host<float>(got, kH * kD), to_host<float>(want, kH * kD)));
}

TEST(CudaRowFinish, KvRowEqualsNormRopeFp8Store) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kD = 512, kNope = 448, kRing = 8;
    const auto kv = random_floats(kD, 22, 5.0f), w = random_floats(kD, 23, 1.0f);
    const Rope r = rope(64, 77);
    const DeviceBuffer dkv = to_device(kv), dw = to_device(w);
    const DeviceBuffer slot = to_device(std::vector<int64_t>{5});
    for (const bool f16 : {false, true}) {
        DeviceBuffer row = to_device(test::poison_floats(kD));
        DeviceBuffer want = to_device(test::poison_floats(kRing * kD)),
                     got = to_device(test::poison_floats(kRing * kD));
        rms_norm(dkv.as<float>(), dw.as<float>(), row.as<float>(), 1, kD, 1e-6f, nullptr);
        rope_tail(row.as<float>(), 1, kD, r.freqs.as<double>(), r.n_freq, r.pos.as<int64_t>(),
                  false, nullptr);
        fp8_e4m3_sim(row.as<float>(), 1, kNope, 64, nullptr);
        store_row_at(row.as<float>(), kD, f16, want.as<float>(), slot.as<int64_t>(), nullptr);
        RowFinish f;
        f.d = kD;
        f.rows = dkv.as<float>();
        f.norm_w = dw.as<float>();
        f.eps = 1e-6f;
        f.freqs = r.freqs.as<double>();
        f.n_freq = r.n_freq;
        f.pos = r.pos.as<int64_t>();
        f.rounding = RowRounding::Fp8;
        f.n_fp8 = kNope;
        f.table = got.as<float>();
        f.index = slot.as<int64_t>();
        f.f16 = f16;
        row_finish(f, nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_TRUE(same_bits(to_host<float>(got, kRing * kD), to_host<float>(want, kRing * kD)))
            << "f16 " << f16;
    }
}

// The attention's q heads and KV row in one launch (row_finish_pair) against two row_finish
// launches: the same bits in both destinations.
TEST(CudaRowFinish, PairEqualsItsTwoLaunches) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kH = 64, kD = 512, kRing = 8;
    const auto q = random_floats(kH * kD, 24, 3.0f), kv = random_floats(kD, 25, 5.0f),
               w = random_floats(kD, 26, 1.0f);
    const Rope r = rope(64, 99);
    const DeviceBuffer dkv = to_device(kv), dw = to_device(w),
                       slot = to_device(std::vector<int64_t>{3});
    auto run = [&](bool pair) {
        DeviceBuffer dq = to_device(q), table = to_device(test::poison_floats(kRing * kD));
        RowFinish fq;
        fq.d = kD;
        fq.n_rows = kH;
        fq.rows = fq.out = dq.as<float>();
        fq.eps = 1e-6f;
        fq.freqs = r.freqs.as<double>();
        fq.n_freq = r.n_freq;
        fq.pos = r.pos.as<int64_t>();
        RowFinish fkv = fq;
        fkv.n_rows = 1;
        fkv.rows = dkv.as<float>();
        fkv.out = nullptr;
        fkv.norm_w = dw.as<float>();
        fkv.rounding = RowRounding::Fp8;
        fkv.n_fp8 = kD - 64;
        fkv.table = table.as<float>();
        fkv.index = slot.as<int64_t>();
        fkv.f16 = true;
        if (pair) {
            row_finish_pair(fq, fkv, nullptr);
        } else {
            row_finish(fq, nullptr);
            row_finish(fkv, nullptr);
        }
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<float> out = to_host<float>(dq, kH * kD);
        const auto t = to_host<float>(table, kRing * kD);
        out.insert(out.end(), t.begin(), t.end());
        return out;
    };
    const auto want = run(false), got = run(true);
    EXPECT_TRUE(same_bits(got, want));
    EXPECT_FALSE(same_bits(std::vector<float>(got.begin(), got.begin() + kH * kD), q));
}

TEST(CudaRowFinish, CompressorRowEqualsPoolNormRopeRoundStore) {
    DS4_REQUIRE_CUDA_DEVICE();
    for (const CompressorCase c :
         {CompressorCase{4, true, false, 512}, CompressorCase{4, true, true, 128},
          CompressorCase{128, false, false, 512}}) {
        const int64_t W = (c.overlap ? 2 : 1) * c.d, rows = (c.overlap ? 2 : 1) * c.ratio;
        const auto kv = random_floats(rows * W, 30 + c.d, 2.0f);
        auto sc = random_floats(rows * W, 31 + c.d, 4.0f);
        for (int64_t j = 0; j < W; j += 7) sc[size_t(j)] = -INFINITY;  // unwritten candidates
        const auto w = random_floats(c.d, 32, 1.0f);
        const Rope r = rope(64, 4 * 9 + 1 - 4);
        const DeviceBuffer dkv = to_device(kv), dsc = to_device(sc), dw = to_device(w);
        for (const int64_t index : {int64_t(3), int64_t(-1)}) {
            const DeviceBuffer when = to_device(std::vector<int64_t>{index});
            DeviceBuffer pooled = to_device(test::poison_floats(c.d)),
                         row = to_device(test::poison_floats(c.d));
            DeviceBuffer want = to_device(test::poison_floats(6 * c.d)),
                         got = to_device(test::poison_floats(6 * c.d));
            compressor_pool(dkv.as<float>(), dsc.as<float>(), c.ratio, c.overlap, c.d, W,
                            pooled.as<float>(), nullptr);
            rms_norm(pooled.as<float>(), dw.as<float>(), row.as<float>(), 1, c.d, 1e-6f, nullptr);
            rope_tail(row.as<float>(), 1, c.d, r.freqs.as<double>(), r.n_freq, r.pos.as<int64_t>(),
                      false, nullptr);
            if (c.indexer)
                indexer_qat(row.as<float>(), 1, c.d, nullptr);
            else
                fp8_e4m3_sim(row.as<float>(), 1, c.d - 64, 64, nullptr);
            store_row_at(row.as<float>(), c.d, true, want.as<float>(), when.as<int64_t>(), nullptr);
            row_finish(compressor_row(c, dkv.as<float>(), dsc.as<float>(), dw.as<float>(), r,
                                      got.as<float>(), when.as<int64_t>()),
                       nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const auto g = to_host<float>(got, 6 * c.d);
            EXPECT_TRUE(same_bits(g, to_host<float>(want, 6 * c.d)))
                << "ratio " << c.ratio << " indexer " << c.indexer << " index " << index;
            if (index < 0) {
                EXPECT_TRUE(same_bits(g, test::poison_floats(6 * c.d))) << "stored a dead row";
            }
        }
    }
}

// The decode step's compressor launch (compressor_step) against compressor_push_step, row_finish
// and compressor_shift_if: the same window state and stored row, bit for bit, where the token
// completes its window and where it does not, with and without the overlapped shift.
TEST(CudaRowFinish, CompressorStepEqualsPushFinishShift) {
    DS4_REQUIRE_CUDA_DEVICE();
    for (const CompressorCase c :
         {CompressorCase{4, true, false, 512}, CompressorCase{4, true, true, 128},
          CompressorCase{128, false, false, 512}}) {
        const int64_t W = (c.overlap ? 2 : 1) * c.d, rows = (c.overlap ? 2 : 1) * c.ratio;
        const int64_t slot_base = c.overlap ? c.ratio : 0;
        const auto kv0 = random_floats(rows * W, 40 + c.d, 2.0f);
        auto sc0 = random_floats(rows * W, 41 + c.d, 4.0f);
        for (int64_t j = 0; j < W; j += 7) sc0[size_t(j)] = -INFINITY;
        const auto x = random_floats(W, 42, 2.0f), xs = random_floats(W, 43, 3.0f),
                   ape = random_floats(W * c.ratio, 44, 1.0f), w = random_floats(c.d, 45, 1.0f);
        const Rope r = rope(64, 4 * 9 + 1 - 4);
        const DeviceBuffer dx = to_device(x), dxs = to_device(xs), dape = to_device(ape),
                           dw = to_device(w);
        for (const int64_t phase : {int64_t(c.ratio - 1), int64_t(1)}) {
            const int64_t index = phase == c.ratio - 1 ? 3 : -1;
            const DeviceBuffer dphase = to_device(std::vector<int64_t>{phase}),
                               when = to_device(std::vector<int64_t>{index});
            auto run = [&](bool fused) {
                DeviceBuffer kv = to_device(kv0), sc = to_device(sc0),
                             table = to_device(test::poison_floats(6 * c.d));
                const RowFinish f =
                    compressor_row(c, kv.as<float>(), sc.as<float>(), dw.as<float>(), r,
                                   table.as<float>(), when.as<int64_t>());
                if (fused) {
                    CompressorStep step;
                    step.kv = dx.as<float>();
                    step.score = dxs.as<float>();
                    step.ape = dape.as<float>();
                    step.width = W;
                    step.phase = dphase.as<int64_t>();
                    step.slot_base = slot_base;
                    step.state_kv = kv.as<float>();
                    step.state_score = sc.as<float>();
                    step.shift = c.overlap;
                    compressor_step(step, f, nullptr);
                } else {
                    compressor_push_step(dx.as<float>(), dxs.as<float>(), dape.as<float>(), W,
                                         dphase.as<int64_t>(), slot_base, kv.as<float>(),
                                         sc.as<float>(), nullptr);
                    row_finish(f, nullptr);
                    if (c.overlap)
                        compressor_shift_if(kv.as<float>(), sc.as<float>(), c.ratio, W,
                                            when.as<int64_t>(), nullptr);
                }
                DS4_CUDA_CHECK(cudaDeviceSynchronize());
                std::vector<float> out = to_host<float>(table, 6 * c.d);
                for (const DeviceBuffer *b : {&kv, &sc}) {
                    const auto v = to_host<float>(*b, size_t(rows * W));
                    out.insert(out.end(), v.begin(), v.end());
                }
                return out;
            };
            const auto want = run(false), got = run(true);
            EXPECT_TRUE(same_bits(got, want))
                << "ratio " << c.ratio << " indexer " << c.indexer << " phase " << phase;
            EXPECT_FALSE(same_bits(std::vector<float>(want.begin() + 6 * c.d, want.end()),
                                   [&] {
                                       std::vector<float> v(kv0);
                                       v.insert(v.end(), sc0.begin(), sc0.end());
                                       return v;
                                   }()))
                << "the push changed nothing";
        }
    }
}

TEST(CudaRowFinish, IndexerQHeadsEqualRopeThenRounding) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kH = 64, kI = 128;
    const auto q = random_floats(kH * kI, 40, 3.0f);
    const Rope r = rope(64, 999);
    DeviceBuffer want = to_device(q), got = to_device(q);
    rope_tail(want.as<float>(), kH, kI, r.freqs.as<double>(), r.n_freq, r.pos.as<int64_t>(), false,
              nullptr);
    indexer_qat(want.as<float>(), kH, kI, nullptr);
    RowFinish f;
    f.d = kI;
    f.n_rows = kH;
    f.rows = f.out = got.as<float>();
    f.norm = false;
    f.freqs = r.freqs.as<double>();
    f.n_freq = r.n_freq;
    f.pos = r.pos.as<int64_t>();
    f.rounding = RowRounding::Indexer;
    row_finish(f, nullptr);
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(to_host<float>(got, kH * kI), to_host<float>(want, kH * kI)));
}

}  // namespace
}  // namespace ds4::cuda
