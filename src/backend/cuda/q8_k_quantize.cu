#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/q8_k_quantize.h"
#include "backend/cuda/quantize_block.cuh"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kQK = 256;

// One thread block of 256 threads per Q8_K block: thread i owns x[i].
__global__ void __launch_bounds__(kQK)
    quantize_q8_K_kernel(const float *__restrict__ x, int8_t *__restrict__ q, float *__restrict__ d,
                         int16_t *__restrict__ bsums) {
    dev::wait_for_previous_kernels();
    const int64_t base = int64_t(blockIdx.x) * kQK;
    dev::quantize_q8_K_block(x[base + threadIdx.x], q + base, d + blockIdx.x, bsums + base / 16);
}

}  // namespace

void quantize_q8_K_activation(const float *x, int64_t k, const Q8_KActivation &out,
                              cudaStream_t stream) {
    if (k % kQK != 0) throw ds4::Error("Q8_K activations must hold a multiple of 256 values");
    if (k == 0) return;
    launch_kernel(quantize_q8_K_kernel, unsigned(k / kQK), kQK, 0, stream, x, out.q, out.d,
                  out.bsums);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
