#pragma once
// Every CUDA runtime call goes through ds4_cuda_check: a failure becomes a ds4::Error naming the
// call, the file and line, and the runtime's own message (e.g. "no CUDA-capable device is
// detected"), so tools report it as a one-line error instead of continuing on a broken device.
#include <cuda_runtime.h>

#include <string>

#include "common/error.h"

namespace ds4::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char *call, const char *file, int line);

inline void check(cudaError_t err, const char *call, const char *file, int line) {
    if (err != cudaSuccess) throw_cuda_error(err, call, file, line);
}

}  // namespace ds4::cuda

#define DS4_CUDA_CHECK(call) ::ds4::cuda::check((call), #call, __FILE__, __LINE__)
