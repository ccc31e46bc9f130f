#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/token_io.h"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kThreads = 1024;

template <typename T>
__global__ void embed_kernel(const T *__restrict__ table, int64_t n_vocab, int64_t e,
                             const int32_t *__restrict__ token, int n_hc, float *__restrict__ out) {
    dev::wait_for_previous_kernels();
    const int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (d >= e) return;
    const int64_t t = min(max(int64_t(*token), int64_t(0)), n_vocab - 1);
    float v;
    if constexpr (sizeof(T) == 2)
        v = __half2float(table[t * e + d]);
    else
        v = table[t * e + d];
    for (int h = 0; h < n_hc; ++h) out[h * e + d] = v;
}

// std::max_element with operator< returns x[0] when it is NaN, else the first maximum of the
// numbers (a later NaN never compares larger). `better` orders the numbers that way, NaN last.
__device__ __forceinline__ bool better(float v, int64_t i, float w, int64_t j) {
    return !isnan(v) && (isnan(w) || v > w || (v == w && i < j));
}

// One block: a strided pass per thread, then a fixed-order tree over the block.
__global__ void __launch_bounds__(kThreads)
    argmax_kernel(const float *__restrict__ x, int64_t n, int32_t *__restrict__ token) {
    dev::wait_for_previous_kernels();
    __shared__ float sv[kThreads];
    __shared__ int64_t si[kThreads];
    float v = NAN;
    int64_t idx = INT64_MAX;
    for (int64_t i = threadIdx.x; i < n; i += kThreads)
        if (better(x[i], i, v, idx)) v = x[i], idx = i;
    sv[threadIdx.x] = v;
    si[threadIdx.x] = idx;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) {
            const int o = threadIdx.x + s;
            if (better(sv[o], si[o], sv[threadIdx.x], si[threadIdx.x]))
                sv[threadIdx.x] = sv[o], si[threadIdx.x] = si[o];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) *token = isnan(x[0]) || si[0] == INT64_MAX ? 0 : int32_t(si[0]);
}

}  // namespace

void embed_token(const void *table, GgmlType type, int64_t n_vocab, int64_t e, const int32_t *token,
                 int n_hc, float *out, cudaStream_t stream) {
    if (n_vocab <= 0 || e <= 0) throw ds4::Error("embed_token: empty embedding table");
    const unsigned blocks = unsigned((e + 255) / 256);
    if (type == GgmlType::F16)
        launch_kernel(embed_kernel<__half>, blocks, 256, 0, stream,
                      static_cast<const __half *>(table), n_vocab, e, token, n_hc, out);
    else if (type == GgmlType::F32)
        launch_kernel(embed_kernel<float>, blocks, 256, 0, stream,
                      static_cast<const float *>(table), n_vocab, e, token, n_hc, out);
    else
        throw ds4::Error("embed_token: the CUDA embedding takes F16 or F32 tables");
    DS4_CUDA_CHECK(cudaGetLastError());
}

void argmax(const float *logits, int64_t n, int32_t *token, cudaStream_t stream) {
    if (n <= 0) throw ds4::Error("argmax of empty logits");
    launch_kernel(argmax_kernel, 1, kThreads, 0, stream, logits, n, token);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
