// device_copy against its CPU twin (memcpy): aligned and unaligned ends, sizes that are not a
// multiple of 16 bytes, and bytes around the destination left untouched.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_copy.h"
#include "cuda_test_util.h"

namespace ds4::cuda {
namespace {

TEST(CudaCopy, EqualsMemcpy) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr size_t kSize = (size_t(1) << 20) + 77;
    std::vector<unsigned char> src(kSize);
    for (size_t i = 0; i < kSize; ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
    DeviceBuffer dsrc(kSize), ddst(kSize);
    DS4_CUDA_CHECK(cudaMemcpy(dsrc.get(), src.data(), kSize, cudaMemcpyHostToDevice));
    for (size_t offset : {size_t(0), size_t(3), size_t(16)})
        for (size_t bytes : {size_t(0), size_t(1), size_t(15), size_t(4096), kSize - 64}) {
            DS4_CUDA_CHECK(cudaMemset(ddst.get(), 0xAB, kSize));
            device_copy(ddst.as<unsigned char>() + offset, dsrc.as<unsigned char>() + offset, bytes,
                        nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            std::vector<unsigned char> got(kSize), want(kSize, 0xAB);
            std::memcpy(want.data() + offset, src.data() + offset, bytes);
            DS4_CUDA_CHECK(cudaMemcpy(got.data(), ddst.get(), kSize, cudaMemcpyDeviceToHost));
            ASSERT_EQ(got, want) << "offset " << offset << ", " << bytes << " bytes";
        }
}

}  // namespace
}  // namespace ds4::cuda
