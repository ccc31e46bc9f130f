#include "backend/cuda/cuda_check.h"

#include <fmt/format.h>

namespace ds4::cuda {

void throw_cuda_error(cudaError_t err, const char *call, const char *file, int line) {
    throw ds4::Error(fmt::format("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err),
                                 cudaGetErrorString(err), call, file, line));
}

}  // namespace ds4::cuda
