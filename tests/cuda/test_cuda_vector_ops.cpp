// The per-vector kernels of the CUDA backend against their CPU twins (backend/cpu): the FP8 KV
// and Hadamard + FP4 indexer simulations bit for bit; RMSNorm and RoPE within one f32 ulp
// (vector_ops.h says why one), NaN never passing. RoPE runs at positions up to 1M, where theta
// needs a careful range reduction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "backend/cpu/qat_sim.h"
#include "backend/cpu/rope.h"
#include "backend/cpu/vector_ops.h"
#include "backend/cuda/q8_0_matvec.h"
#include "backend/cuda/vector_ops.h"
#include "cuda_test_util.h"

namespace ds4::cuda {
namespace {

using test::random_floats;
using test::to_device;
using test::to_host;
using test::ulps;

TEST(CudaVectorOps, RmsNormWithinOneUlp) {
    DS4_REQUIRE_CUDA_DEVICE();
    // 16384 and 4096: the wide kernel (several blocks a row); 96: one block a row; 1: the
    // values of a row not a multiple of 4.
    for (const int64_t n : {int64_t(16384), int64_t(4096), int64_t(512), int64_t(96), int64_t(1)}) {
        constexpr int64_t kRows = 5;
        const auto x = random_floats(kRows * n, 3 + n, 5.0f), w = random_floats(n, 4 + n, 1.0f);
        for (const bool weighted : {true, false}) {
            std::vector<float> want(x.size());
            for (int64_t r = 0; r < kRows; ++r)
                backend::cpu::rms_norm(x.data() + r * n, weighted ? w.data() : nullptr,
                                       want.data() + r * n, n, 1e-6f);
            const DeviceBuffer dx = to_device(x), dw = to_device(w);
            DeviceBuffer y(x.size() * 4);
            rms_norm(dx.as<float>(), weighted ? dw.as<float>() : nullptr, y.as<float>(), kRows, n,
                     1e-6f, nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const auto got = to_host<float>(y, x.size());
            for (size_t i = 0; i < got.size(); ++i) ASSERT_LE(ulps(got[i], want[i]), 1.0) << i;
            // In place: the same values (a wide row is then left to one block).
            DeviceBuffer inplace = to_device(x);
            rms_norm(inplace.as<float>(), weighted ? dw.as<float>() : nullptr, inplace.as<float>(),
                     kRows, n, 1e-6f, nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const auto same = to_host<float>(inplace, x.size());
            for (size_t i = 0; i < same.size(); ++i)
                ASSERT_LE(ulps(same[i], want[i]), 1.0) << "in place " << i;
        }
    }
}

// The fused norm + Q8_0 quantization against the two kernels it replaces: the same bits in y,
// the codes and the block scales. Rows of 32 values (a warp handles 4 blocks: partial warps),
// 96, whole slices and several slices a row; two rows; zero rows (scale 0) and outliers.
TEST(CudaVectorOps, RmsNormQ8_0EqualsNormThenQuantize) {
    DS4_REQUIRE_CUDA_DEVICE();
    for (const int64_t n :
         {int64_t(16384), int64_t(4096), int64_t(1024), int64_t(96), int64_t(32)}) {
        for (const int64_t rows : {int64_t(1), int64_t(2)}) {
            auto x = random_floats(size_t(rows * n), 70 + n, 5.0f);
            const auto w = random_floats(size_t(n), 71 + n, 1.0f);
            x[0] = 3e4f;                                                   // an outlier block
            if (n >= 64) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // amax 0: scale 0
            const DeviceBuffer dx = to_device(x), dw = to_device(w);
            const size_t total = size_t(rows * n);
            auto run = [&](bool fused) {
                DeviceBuffer y = to_device(std::vector<float>(total, NAN)),
                             xq = to_device(std::vector<int8_t>(total, int8_t(0x5a))),
                             xd = to_device(std::vector<float>(total / 32, NAN));
                if (fused) {
                    EXPECT_TRUE(rms_norm_q8_0(dx.as<float>(), dw.as<float>(), y.as<float>(), rows,
                                              n, 1e-6f, xq.as<int8_t>(), xd.as<float>(), nullptr));
                } else {
                    rms_norm(dx.as<float>(), dw.as<float>(), y.as<float>(), rows, n, 1e-6f,
                             nullptr);
                    quantize_q8_0_activation(y.as<float>(), rows * n, xq.as<int8_t>(),
                                             xd.as<float>(), nullptr);
                }
                DS4_CUDA_CHECK(cudaDeviceSynchronize());
                return std::make_tuple(to_host<float>(y, total), to_host<int8_t>(xq, total),
                                       to_host<float>(xd, total / 32));
            };
            const auto [wy, wq, wd] = run(false);
            const auto [gy, gq, gd] = run(true);
            for (float v : gy) ASSERT_FALSE(std::isnan(v)) << "unwritten output, n " << n;
            for (float v : gd) ASSERT_FALSE(std::isnan(v)) << "unwritten scale, n " << n;
            ASSERT_EQ(std::memcmp(gy.data(), wy.data(), total * 4), 0) << "y, n " << n;
            ASSERT_EQ(std::memcmp(gq.data(), wq.data(), total), 0) << "codes, n " << n;
            ASSERT_EQ(std::memcmp(gd.data(), wd.data(), total / 32 * 4), 0) << "scales, n " << n;
        }
    }
    // Refused (the caller then runs the two kernels): in place over several slices, and rows
    // that are not whole Q8_0 blocks.
    DeviceBuffer v = to_device(random_floats(4096, 5, 1.0f)), out(4096 * 4), xq(4096), xd(512);
    EXPECT_FALSE(rms_norm_q8_0(v.as<float>(), nullptr, v.as<float>(), 1, 4096, 1e-6f,
                               xq.as<int8_t>(), xd.as<float>(), nullptr));
    EXPECT_FALSE(rms_norm_q8_0(v.as<float>(), nullptr, out.as<float>(), 1, 48, 1e-6f,
                               xq.as<int8_t>(), xd.as<float>(), nullptr));
}

TEST(CudaVectorOps, RopeTailWithinOneUlp) {
    DS4_REQUIRE_CUDA_DEVICE();
    const auto plain = backend::cpu::RopeFreqs::plain(64, 10000.0);
    const auto yarn = backend::cpu::RopeFreqs::yarn(64, 160000.0, 16.0, 65536.0, 32.0, 1.0);
    constexpr int64_t kHeads = 8, kDim = 512;
    for (const auto *f : {&plain, &yarn})
        for (const int64_t p :
             {int64_t(0), int64_t(1), int64_t(2047), int64_t(65537), int64_t(1) << 20})
            for (const bool inverse : {false, true}) {
                const auto x = random_floats(kHeads * kDim, 9 + p, 2.0f);
                std::vector<float> want(x);
                for (int64_t h = 0; h < kHeads; ++h)
                    backend::cpu::rope_tail(want.data() + h * kDim, kDim, *f, p, inverse);
                DeviceBuffer dx = to_device(x), df = to_device(f->f),
                             dp = to_device(std::vector<int64_t>{p});
                rope_tail(dx.as<float>(), kHeads, kDim, df.as<double>(), int64_t(f->f.size()),
                          dp.as<int64_t>(), inverse, nullptr);
                DS4_CUDA_CHECK(cudaDeviceSynchronize());
                const auto got = to_host<float>(dx, x.size());
                for (size_t i = 0; i < got.size(); ++i)
                    ASSERT_LE(ulps(got[i], want[i]), 1.0) << "p " << p << " value " << i;
            }
}

// The attention output's last rotation with its Q8_0 quantization in the same launch: the heads
// and the codes and scales of rope_tail then quantize_q8_0_activation, bit for bit.
TEST(CudaVectorOps, RopeTailQ8_0EqualsRopeThenQuantize) {
    DS4_REQUIRE_CUDA_DEVICE();
    const auto yarn = backend::cpu::RopeFreqs::yarn(64, 160000.0, 16.0, 65536.0, 32.0, 1.0);
    constexpr int64_t kHeads = 64, kDim = 512, kN = kHeads * kDim;
    const DeviceBuffer df = to_device(yarn.f);
    for (const int64_t p : {int64_t(0), int64_t(2047), int64_t(1) << 20})
        for (const bool inverse : {false, true}) {
            auto x = random_floats(kN, 31 + p, 2.0f);
            x[5 * kDim + 500] = 40.0f;  // a block's largest value in the rotated tail
            const DeviceBuffer dp = to_device(std::vector<int64_t>{p});
            DeviceBuffer want = to_device(x), got = to_device(x), wq(kN), wd(kN / 32 * 4), gq(kN),
                         gd(kN / 32 * 4);
            DS4_CUDA_CHECK(cudaMemset(gq.get(), 0x5a, gq.bytes()));
            DS4_CUDA_CHECK(cudaMemset(gd.get(), 0xff, gd.bytes()));
            rope_tail(want.as<float>(), kHeads, kDim, df.as<double>(), int64_t(yarn.f.size()),
                      dp.as<int64_t>(), inverse, nullptr);
            quantize_q8_0_activation(want.as<float>(), kN, wq.as<int8_t>(), wd.as<float>(),
                                     nullptr);
            rope_tail_q8_0(got.as<float>(), kHeads, kDim, df.as<double>(), int64_t(yarn.f.size()),
                           dp.as<int64_t>(), inverse, gq.as<int8_t>(), gd.as<float>(), nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            auto bytes = [](const DeviceBuffer &b) { return to_host<uint8_t>(b, b.bytes()); };
            EXPECT_EQ(bytes(got), bytes(want)) << "p " << p << " inverse " << inverse;
            EXPECT_EQ(bytes(gq), bytes(wq)) << "p " << p << " inverse " << inverse;
            EXPECT_EQ(bytes(gd), bytes(wd)) << "p " << p << " inverse " << inverse;
            if (p > 0) {
                EXPECT_NE(bytes(got), bytes(to_device(x))) << "nothing rotated";
            }
        }
}

TEST(CudaVectorOps, Fp8SimBitForBit) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kRows = 7, kN = 448;  // 7 blocks of 64 per row; then a short last block
    for (const int64_t block : {int64_t(64), int64_t(60)}) {
        auto x = random_floats(kRows * kN, 21 + block, 300.0f);
        x[5] = 0.0f, x[6] = 1e-9f, x[70] = 1e6f;                   // subnormal steps, the 448 cap
        for (int i = 128; i < 192; ++i) x[size_t(i)] = 1e-7f * i;  // amax below the 1e-4 floor
        std::vector<float> want(x);
        for (int64_t r = 0; r < kRows; ++r)
            backend::cpu::fp8_e4m3_sim(want.data() + r * kN, kN, block);
        DeviceBuffer dx = to_device(x);
        fp8_e4m3_sim(dx.as<float>(), kRows, kN, block, nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(dx, x.size());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "block " << block;
    }
}

TEST(CudaVectorOps, IndexerQatBitForBit) {
    DS4_REQUIRE_CUDA_DEVICE();
    for (const int64_t n : {int64_t(128), int64_t(32), int64_t(1024)}) {
        constexpr int64_t kRows = 9;
        auto x = random_floats(kRows * n, 31 + n, 4.0f);
        x[1] = 0.0f;
        std::vector<float> want(x);
        for (int64_t r = 0; r < kRows; ++r) backend::cpu::indexer_qat(want.data() + r * n, n);
        DeviceBuffer dx = to_device(x);
        indexer_qat(dx.as<float>(), kRows, n, nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(dx, x.size());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "n " << n;
    }
}

}  // namespace
}  // namespace ds4::cuda
