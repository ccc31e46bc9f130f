#pragma once
// dst = src on the device by the multiprocessors (16-byte loads and stores, a grid-stride loop),
// not by the copy engines: the copy that kernels are measured against, since it moves bytes the
// way they do. The CPU twin is memcpy.
#include <cuda_runtime.h>

#include <cstddef>

namespace ds4::cuda {

void device_copy(void *dst, const void *src, size_t bytes, cudaStream_t stream);

}  // namespace ds4::cuda
