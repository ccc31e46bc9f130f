// The NCCL group (backend/cuda/nccl_group.h): a communicator of one leaves its buffer bit for bit,
// every visible GPU gets the sum that the CPU computes, and bad groups are refused with an error.
// Label "cuda": the collectives need a device (the sum, two or more).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/nccl_group.h"
#include "common/error.h"
#include "cuda_test_util.h"

namespace ds4::cuda {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    std::vector<float> v(n);
    for (float &x : v) x = dist(rng);
    return v;
}

TEST(NcclGroup, RefusesAnEmptyGroupAndAMissingDevice) {
    EXPECT_THROW(NcclGroup({}), Error);
    // without a device, the device count itself fails; with one, device 4096 does not exist
    EXPECT_THROW(NcclGroup({4096}), Error);
    EXPECT_THROW(NcclGroup({-1}), Error);
}

TEST(NcclGroup, RefusesADeviceListedTwice) {
    DS4_REQUIRE_CUDA_DEVICE();
    try {
        NcclGroup group({0, 0});
        FAIL() << "a group of device 0 twice was made";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("device 0 is in the group twice"), std::string::npos)
            << e.what();
    }
}

TEST(NcclGroup, ACommunicatorOfOneLeavesTheBufferAsItIs) {
    DS4_REQUIRE_CUDA_DEVICE();
    EXPECT_EQ(NcclGroup::library_version().rfind("2.", 0), 0u) << NcclGroup::library_version();
    NcclGroup group({0});
    ASSERT_EQ(group.size(), 1u);
    const std::vector<float> v = random_values(4099, 1);
    DeviceBuffer b = test::to_device(v);
    cudaStream_t s = nullptr;
    DS4_CUDA_CHECK(cudaStreamCreate(&s));
    group.all_reduce_sum({static_cast<float *>(b.get())}, v.size(), {s});
    DS4_CUDA_CHECK(cudaStreamSynchronize(s));
    DS4_CUDA_CHECK(cudaStreamDestroy(s));
    EXPECT_TRUE(test::same_bits(test::to_host<float>(b, v.size()), v));
    EXPECT_THROW(group.all_reduce_sum({}, v.size(), {}), Error);
}

// Two ranks: a + b is one rounding in any order, so the sum is exact; more ranks are within the
// reassociation of n - 1 additions.
TEST(NcclGroup, EveryVisibleGpuGetsTheSum) {
    DS4_REQUIRE_CUDA_DEVICE();
    int n = 0;
    DS4_CUDA_CHECK(cudaGetDeviceCount(&n));
    if (n < 2) GTEST_SKIP() << "fewer than 2 CUDA devices (" << n << ")";
    std::vector<int> devices;
    for (int d = 0; d < n; ++d) devices.push_back(d);
    NcclGroup group(devices);
    const size_t count = 1 << 20;
    std::vector<std::vector<float>> values;
    std::vector<DeviceBuffer> buffers;
    std::vector<float *> pointers;
    std::vector<cudaStream_t> streams(n);
    for (int d = 0; d < n; ++d) {
        DS4_CUDA_CHECK(cudaSetDevice(d));
        values.push_back(random_values(count, 100 + d));
        buffers.push_back(test::to_device(values.back()));
        pointers.push_back(static_cast<float *>(buffers.back().get()));
        DS4_CUDA_CHECK(cudaStreamCreate(&streams[d]));
    }
    group.all_reduce_sum(pointers, count, streams);
    std::vector<float> sum(count, 0.0f), magnitude(count, 0.0f);
    for (const auto &v : values)
        for (size_t i = 0; i < count; ++i) sum[i] += v[i], magnitude[i] += std::fabs(v[i]);
    for (int d = 0; d < n; ++d) {
        DS4_CUDA_CHECK(cudaSetDevice(d));
        DS4_CUDA_CHECK(cudaStreamSynchronize(streams[d]));
        DS4_CUDA_CHECK(cudaStreamDestroy(streams[d]));
        const std::vector<float> got = test::to_host<float>(buffers[d], count);
        if (n == 2) {
            EXPECT_TRUE(test::same_bits(got, sum)) << "rank " << d;
            continue;
        }
        size_t bad = 0;
        for (size_t i = 0; i < count; ++i)
            if (!(std::fabs(got[i] - sum[i]) <= 1.2e-7f * (n - 1) * magnitude[i])) ++bad;
        EXPECT_EQ(bad, 0u) << "rank " << d;
    }
    DS4_CUDA_CHECK(cudaSetDevice(0));
}

}  // namespace
}  // namespace ds4::cuda
