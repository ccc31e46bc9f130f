#pragma once
// Helpers shared by the CUDA kernel tests: a skip without a device, host <-> device copies.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/q8_k_quantize.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"

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

// |a - b| in units of the f32 spacing at b; two NaNs are equal, a NaN against a number is far.
// n NaNs with a payload: an output left unwritten keeps them, and fails a bitwise comparison.
inline std::vector<float> poison_floats(size_t n) {
    return std::vector<float>(n, std::nanf("0x7a"));
}

inline bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline double ulps(float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : 1e30;
    if (a == b) return 0;
    return std::fabs(double(a) - double(b)) /
           std::fabs(double(std::nextafter(b, INFINITY)) - double(b));
}

inline float f16_value(uint16_t h) {
    float f;
    quant::dequantize_row(GgmlType::F16, &h, &f, 1);
    return f;
}

inline std::vector<float> random_floats(int64_t n, uint64_t seed, float magnitude) {
    std::vector<float> v(static_cast<size_t>(n));
    quant::fill_random_blocks(GgmlType::F32, v.data(), n, seed, magnitude);
    return v;
}

// Q8_K activations on the device, and the CPU twin's blocks for the same row.
struct DeviceQ8_K {
    DeviceBuffer q, d, bsums;
    Q8_KActivation view() const { return {q.as<int8_t>(), d.as<float>(), bsums.as<int16_t>()}; }
};

inline DeviceQ8_K quantize_q8_K_on_device(const std::vector<float> &x) {
    const int64_t k = int64_t(x.size());
    DeviceBuffer dx = to_device(x);
    DeviceQ8_K a{DeviceBuffer(size_t(k)), DeviceBuffer(size_t(k / 256) * 4),
                 DeviceBuffer(size_t(k / 16) * 2)};
    quantize_q8_K_activation(dx.as<float>(), k, a.view(), nullptr);
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    return a;
}

inline std::vector<quant::BlockQ8_K> cpu_quantize_q8_K(const std::vector<float> &x) {
    std::vector<quant::BlockQ8_K> b(x.size() / 256);
    quant::kernels(GgmlType::Q8_K).quantize_activation_row(x.data(), b.data(), int64_t(x.size()));
    return b;
}

}  // namespace ds4::cuda::test
