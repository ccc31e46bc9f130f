#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/row_device.cuh"
#include "backend/cuda/vector_ops.h"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row; the double sum of squares is reduced in a fixed order.
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(const float *__restrict__ x, const float *__restrict__ w, float *__restrict__ y,
                    int64_t n, float eps) {
    dev::wait_for_previous_kernels();
    __shared__ double part[kThreads / 32];
    __shared__ float s_scale;
    const float *xr = x + int64_t(blockIdx.x) * n;
    float *yr = y + int64_t(blockIdx.x) * n;
    const float scale =
        dev::rms_scale<kThreads>([&](int64_t i) { return xr[i]; }, n, eps, part, &s_scale);
    for (int64_t i = threadIdx.x; i < n; i += kThreads)
        yr[i] = w ? __fmul_rn(__fmul_rn(xr[i], scale), w[i]) : __fmul_rn(xr[i], scale);
}

__global__ void rope_kernel(float *__restrict__ heads, int64_t n_heads, int64_t head_dim,
                            const double *__restrict__ freqs, int64_t n_freq,
                            const int64_t *__restrict__ pos, bool inverse) {
    dev::wait_for_previous_kernels();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_heads * n_freq) return;
    const int64_t h = i / n_freq, k = i % n_freq;
    dev::rope_pair(heads + h * head_dim + head_dim - 2 * n_freq, k, freqs[k], *pos, inverse);
}

__global__ void fp8_kernel(float *x, int64_t n_rows, int64_t n, int64_t block) {
    dev::wait_for_previous_kernels();
    const int64_t blocks_per_row = (n + block - 1) / block;
    const int64_t b = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    if (b >= n_rows * blocks_per_row) return;
    const int64_t row = b / blocks_per_row, start = (b % blocks_per_row) * block;
    dev::block_sim<false>(x + row * n + start, min(block, n - start), 448.0f, 1e-4f);
}

// One block per vector: the butterflies of the CPU's loop, stage by stage, in shared memory.
__global__ void indexer_qat_kernel(float *x, int64_t n) {
    dev::wait_for_previous_kernels();
    __shared__ float v[1024];
    float *xr = x + int64_t(blockIdx.x) * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v[i] = xr[i];
    dev::indexer_qat_row(v, n);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) xr[i] = v[i];
}

}  // namespace

void rms_norm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps,
              cudaStream_t stream) {
    if (n_rows == 0) return;
    launch_kernel(rms_norm_kernel, unsigned(n_rows), kThreads, 0, stream, x, w, y, n, eps);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void rope_tail(float *heads, int64_t n_heads, int64_t head_dim, const double *freqs, int64_t n_freq,
               const int64_t *pos, bool inverse, cudaStream_t stream) {
    if (2 * n_freq > head_dim) throw ds4::Error("rope_tail: more rotary dims than the head has");
    const int64_t total = n_heads * n_freq;
    if (total == 0) return;
    launch_kernel(rope_kernel, unsigned((total + kThreads - 1) / kThreads), kThreads, 0, stream,
                  heads, n_heads, head_dim, freqs, n_freq, pos, inverse);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void fp8_e4m3_sim(float *x, int64_t n_rows, int64_t n, int64_t block, cudaStream_t stream) {
    if (block <= 0 || block > 64) throw ds4::Error("fp8_e4m3_sim: blocks of 1 to 64 values");
    const int64_t warps = n_rows * ((n + block - 1) / block);
    if (warps == 0) return;
    launch_kernel(fp8_kernel, unsigned((warps * 32 + kThreads - 1) / kThreads), kThreads, 0, stream,
                  x, n_rows, n, block);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void indexer_qat(float *x, int64_t n_rows, int64_t n, cudaStream_t stream) {
    if (n <= 0 || n > 1024 || (n & (n - 1)) != 0)
        throw ds4::Error("indexer_qat: the length must be a power of two up to 1024");
    if (n_rows == 0) return;
    launch_kernel(indexer_qat_kernel, unsigned(n_rows), kThreads, 0, stream, x, n);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
