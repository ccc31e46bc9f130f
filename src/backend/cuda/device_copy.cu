#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_copy.h"
#include "backend/cuda/launch.cuh"

namespace ds4::cuda {
namespace {

__global__ void copy16_kernel(const int4 *__restrict__ src, int4 *__restrict__ dst, size_t n) {
    dev::wait_for_previous_kernels();
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        __stcs(dst + i, __ldcs(src + i));
}

__global__ void copy1_kernel(const unsigned char *src, unsigned char *dst, size_t n) {
    dev::wait_for_previous_kernels();
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

}  // namespace

void device_copy(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
    const bool aligned =
        (reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % 16 == 0;
    const size_t n16 = aligned ? bytes / 16 : 0;
    if (n16) {
        int sms = 0, dev = 0;
        DS4_CUDA_CHECK(cudaGetDevice(&dev));
        DS4_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        const size_t blocks = std::min<size_t>((n16 + 255) / 256, size_t(sms) * 8);
        launch_kernel(copy16_kernel, unsigned(blocks), 256, 0, stream,
                      static_cast<const int4 *>(src), static_cast<int4 *>(dst), n16);
        DS4_CUDA_CHECK(cudaGetLastError());
    }
    const size_t tail = bytes - n16 * 16;
    if (tail) {
        launch_kernel(copy1_kernel, unsigned((tail + 255) / 256), 256, 0, stream,
                      static_cast<const unsigned char *>(src) + n16 * 16,
                      static_cast<unsigned char *>(dst) + n16 * 16, tail);
        DS4_CUDA_CHECK(cudaGetLastError());
    }
}

}  // namespace ds4::cuda
