// Hyper-connection kernels against their CPU twins (runtime/hyper_connections.h): the mix (pre,
// post, Sinkhorn comb) within 4 ulps (exp: the device rounds a double result, the CPU calls f32
// libm), the stream combination and the post update bit for bit on identical inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cuda/hyper_connections.h"
#include "backend/cuda/moe_ops.h"
#include "cuda_test_util.h"
#include "runtime/hyper_connections.h"

namespace ds4::cuda {
namespace {

using test::random_floats;
using test::to_device;
using test::to_host;
using test::ulps;

TEST(CudaHc, MixEqualsCpuWithinUlps) {
    DS4_REQUIRE_CUDA_DEVICE();
    // n = 4 is the model's; the others cover a block of 1 thread, odd rows and two warps.
    for (int kN : {1, 2, 3, 4, 8}) {
        const int kMix = 2 * kN + kN * kN;
        for (uint64_t seed = 1; seed <= 30; ++seed) {
            const auto mt = random_floats(size_t(kMix), seed, 4.0f),
                       base = random_floats(size_t(kMix), 50 + seed, 1.0f);
            const std::vector<float> scale = {0.7f, 1.3f, 2.1f};
            const runtime::HcMix want =
                runtime::hc_mix_from(mt.data(), scale.data(), base.data(), uint32_t(kN), 20, 1e-6f);
            const DeviceBuffer dm = to_device(mt), ds = to_device(scale), db = to_device(base);
            // Poisoned outputs: an entry the kernel leaves unwritten fails as NaN.
            DeviceBuffer pre = to_device(std::vector<float>(size_t(kN), NAN)),
                         post = to_device(std::vector<float>(size_t(kN), NAN)),
                         comb = to_device(std::vector<float>(size_t(kN * kN), NAN));
            hc_mix(dm.as<float>(), ds.as<float>(), db.as<float>(), kN, 20, 1e-6f, pre.as<float>(),
                   post.as<float>(), comb.as<float>(), nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const auto gp = to_host<float>(pre, size_t(kN)), gq = to_host<float>(post, size_t(kN)),
                       gc = to_host<float>(comb, size_t(kN * kN));
            for (int i = 0; i < kN; ++i) {
                ASSERT_LE(ulps(gp[size_t(i)], want.pre[size_t(i)]), 4.0) << "pre " << i;
                ASSERT_LE(ulps(gq[size_t(i)], want.post[size_t(i)]), 4.0) << "post " << i;
            }
            // 20 Sinkhorn passes of divisions: a few ulps of drift from one exp ulp.
            for (int k = 0; k < kN * kN; ++k)
                ASSERT_LE(ulps(gc[size_t(k)], want.comb[size_t(k)]), 16.0)
                    << "comb " << k << " n " << kN << " seed " << seed;
        }
    }
}

TEST(CudaHc, MixCombineEqualsMixThenCombineBitForBit) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kE = 4096 + 3;
    // n <= 5: the one-launch kernel (shuffles); 8: the two kernels it falls back to.
    for (int kN : {1, 2, 3, 4, 5, 8}) {
        const int kMix = 2 * kN + kN * kN;
        for (uint64_t seed = 1; seed <= 8; ++seed) {
            const auto mt = random_floats(size_t(kMix), 300 + seed, 4.0f),
                       base = random_floats(size_t(kMix), 400 + seed, 1.0f),
                       X = random_floats(size_t(kN * kE), 500 + seed, 10.0f);
            const std::vector<float> scale = {0.7f, 1.3f, 2.1f};
            const DeviceBuffer dm = to_device(mt), ds = to_device(scale), db = to_device(base),
                               dX = to_device(X);
            auto run = [&](bool fused) {
                DeviceBuffer mix = to_device(std::vector<float>(size_t(kMix), NAN)),
                             x = to_device(std::vector<float>(size_t(kE), NAN));
                float *pre = mix.as<float>(), *post = pre + kN, *comb = post + kN;
                if (fused) {
                    hc_mix_combine(dm.as<float>(), ds.as<float>(), db.as<float>(), kN, 20, 1e-6f,
                                   pre, post, comb, dX.as<float>(), kE, x.as<float>(), nullptr);
                } else {
                    hc_mix(dm.as<float>(), ds.as<float>(), db.as<float>(), kN, 20, 1e-6f, pre, post,
                           comb, nullptr);
                    hc_combine(pre, dX.as<float>(), kN, kE, x.as<float>(), nullptr);
                }
                DS4_CUDA_CHECK(cudaDeviceSynchronize());
                std::vector<float> out = to_host<float>(mix, size_t(kMix));
                const auto xs = to_host<float>(x, size_t(kE));
                out.insert(out.end(), xs.begin(), xs.end());
                return out;
            };
            const auto want = run(false), got = run(true);
            for (float v : got) ASSERT_FALSE(std::isnan(v)) << "unwritten output, n " << kN;
            ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
                << "n " << kN << " seed " << seed;
        }
    }
}

// The decode step's fork (cuda_ops.cpp hc_pre): pre, post and x on one stream, comb on another,
// equal the whole launch bit for bit, and each part leaves the other's outputs unwritten.
TEST(CudaHc, MixPartsOnTwoStreamsEqualTheWholeLaunchBitForBit) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kE = 4096 + 3;
    cudaStream_t side = nullptr;
    DS4_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    for (int kN : {1, 2, 4, 5}) {
        const int kMix = 2 * kN + kN * kN;
        for (uint64_t seed = 1; seed <= 4; ++seed) {
            const auto mt = random_floats(size_t(kMix), 700 + seed, 4.0f),
                       base = random_floats(size_t(kMix), 800 + seed, 1.0f),
                       X = random_floats(size_t(kN * kE), 900 + seed, 10.0f);
            const std::vector<float> scale = {0.7f, 1.3f, 2.1f};
            const DeviceBuffer dm = to_device(mt), ds = to_device(scale), db = to_device(base),
                               dX = to_device(X);
            auto run = [&](std::initializer_list<HcMixParts> parts) {
                DeviceBuffer mix = to_device(std::vector<float>(size_t(kMix), NAN)),
                             x = to_device(std::vector<float>(size_t(kE), NAN));
                float *pre = mix.as<float>(), *post = pre + kN, *comb = post + kN;
                for (HcMixParts p : parts)
                    hc_mix_combine(dm.as<float>(), ds.as<float>(), db.as<float>(), kN, 20, 1e-6f,
                                   pre, post, comb, dX.as<float>(), kE, x.as<float>(),
                                   p == HcMixParts::CombOnly ? side : nullptr, 1, p);
                DS4_CUDA_CHECK(cudaDeviceSynchronize());
                std::vector<float> out = to_host<float>(mix, size_t(kMix));
                const auto xs = to_host<float>(x, size_t(kE));
                out.insert(out.end(), xs.begin(), xs.end());
                return out;
            };
            const auto want = run({HcMixParts::All});
            const auto got = run({HcMixParts::WithoutComb, HcMixParts::CombOnly});
            for (float v : got) ASSERT_FALSE(std::isnan(v)) << "unwritten output, n " << kN;
            ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
                << "n " << kN << " seed " << seed;
            // Each part alone: its outputs are the whole launch's, the others stay unwritten.
            const auto head = run({HcMixParts::WithoutComb}), tail = run({HcMixParts::CombOnly});
            for (size_t i = 0; i < got.size(); ++i) {
                const bool comb = i >= size_t(2 * kN) && i < size_t(kMix);
                const float h = head[i], t = tail[i];
                ASSERT_TRUE(comb ? std::isnan(h) : std::memcmp(&h, &want[i], 4) == 0) << i;
                ASSERT_TRUE(comb ? std::memcmp(&t, &want[i], 4) == 0 : std::isnan(t)) << i;
            }
        }
    }
    DS4_CUDA_CHECK(cudaStreamDestroy(side));
}

TEST(CudaHc, CombineAndPostBitForBit) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int kN = 4;
    constexpr int64_t kE = 4096 + 3;
    const auto X = random_floats(kN * kE, 3, 10.0f), y = random_floats(kE, 4, 10.0f);
    const auto pre = random_floats(kN, 5, 1.0f), post = random_floats(kN, 6, 2.0f),
               comb = random_floats(kN * kN, 7, 1.0f);
    std::vector<float> want_x(kE);
    runtime::hc_combine(pre.data(), X.data(), kN, uint32_t(kE), want_x.data());
    std::vector<float> mix(2 * kN + kN * kN);
    runtime::pack_mix(runtime::HcMix{pre, post, comb}, mix.data());
    std::vector<float> want_X(X);
    runtime::hc_post(mix.data(), kN, y.data(), uint32_t(kE), want_X.data());

    const DeviceBuffer dpre = to_device(pre), dpost = to_device(post), dcomb = to_device(comb),
                       dy = to_device(y);
    DeviceBuffer dX = to_device(X), dx(kE * 4);
    hc_combine(dpre.as<float>(), dX.as<float>(), kN, kE, dx.as<float>(), nullptr);
    hc_post(dpost.as<float>(), dcomb.as<float>(), dy.as<float>(), kN, kE, dX.as<float>(), nullptr);
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    const auto gx = to_host<float>(dx, kE), gX = to_host<float>(dX, X.size());
    ASSERT_EQ(std::memcmp(gx.data(), want_x.data(), gx.size() * 4), 0);
    ASSERT_EQ(std::memcmp(gX.data(), want_X.data(), gX.size() * 4), 0);
}

TEST(CudaHyperConnections, HeadWeightsEqualCpu) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int kN = 4;
    for (uint64_t seed = 1; seed <= 20; ++seed) {
        const auto m = random_floats(kN, seed, 8.0f), base = random_floats(kN, 50 + seed, 2.0f);
        const auto scale = random_floats(1, 90 + seed, 3.0f);
        std::vector<float> want(kN);
        runtime::hc_head_weights(m.data(), scale[0], base.data(), kN, 1e-6f, want.data());
        const DeviceBuffer dm = to_device(m), ds = to_device(scale), db = to_device(base);
        DeviceBuffer dw = to_device(std::vector<float>(kN, std::nanf("")));
        hc_head_weights(dm.as<float>(), ds.as<float>(), db.as<float>(), kN, 1e-6f, dw.as<float>(),
                        nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(dw, kN);
        // exp: the device rounds a double result, the CPU calls f32 libm (a few ulps at most).
        for (int h = 0; h < kN; ++h) EXPECT_LE(ulps(got[h], want[h]), 4) << h;
    }
}

// The MoE's sum with the hc_post that reads it (one token): y and X of sum_slots then hc_post,
// bit for bit, with the shared output and without.
TEST(CudaHc, PostWithTheSlotsSumEqualsSumThenPost) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int kN = 4, kSlots = 6;
    constexpr int64_t kE = 4096 + 3;
    const auto X = random_floats(kN * kE, 13, 10.0f), slots = random_floats(kSlots * kE, 14, 3.0f),
               shared = random_floats(kE, 15, 3.0f), post = random_floats(kN, 16, 2.0f),
               comb = random_floats(kN * kN, 17, 1.0f);
    const DeviceBuffer dslots = to_device(slots), dshared = to_device(shared),
                       dpost = to_device(post), dcomb = to_device(comb);
    for (const bool with_shared : {true, false}) {
        const float *sh = with_shared ? dshared.as<float>() : nullptr;
        DeviceBuffer wX = to_device(X), gX = to_device(X), wy = to_device(test::poison_floats(kE)),
                     gy = to_device(test::poison_floats(kE));
        sum_slots(dslots.as<float>(), kSlots, kE, sh, wy.as<float>(), nullptr);
        hc_post(dpost.as<float>(), dcomb.as<float>(), wy.as<float>(), kN, kE, wX.as<float>(),
                nullptr);
        hc_post_slots(dpost.as<float>(), dcomb.as<float>(), dslots.as<float>(), kSlots, sh,
                      gy.as<float>(), kN, kE, gX.as<float>(), nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_TRUE(test::same_bits(to_host<float>(gy, kE), to_host<float>(wy, kE)));
        EXPECT_TRUE(test::same_bits(to_host<float>(gX, X.size()), to_host<float>(wX, X.size())));
        EXPECT_FALSE(test::same_bits(to_host<float>(gX, X.size()), X)) << "X unchanged";
    }
}

}  // namespace
}  // namespace ds4::cuda
