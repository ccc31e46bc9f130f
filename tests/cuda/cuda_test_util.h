#pragma once
// Helpers shared by the CUDA kernel tests: a skip without a device, host <-> device copies.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "backend/cuda/device_buffer.h"

namespace ds4::cuda::test {

inline bool have_device() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define DS4_REQUIRE_CUDA_DEVICE() \
    if (!::ds4::cuda::test::have_device()) GTEST_SKIP() << "no CUDA device"

template <typename T>
DeviceBuffer to_device(const std::vector<T> &v) {
    DeviceBuffer b(v.size() * sizeof(T));
    if (!v.empty())
        DS4_CUDA_CHECK(cudaMemcpy(b.get(), v.data(), b.bytes(), cudaMemcpyHostToDevice));
    return b;
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer &b, size_t n) {
    std::vector<T> v(n);
    if (n) DS4_CUDA_CHECK(cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

}  // namespace ds4::cuda::test
