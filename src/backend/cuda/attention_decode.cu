#include <algorithm>

#include "backend/cuda/attention_decode.h"
#include "backend/cuda/cuda_check.h"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kHeadsPerBlock = 8, kRowsPerBlock = 8, kThreads = 256;

// A block scores 8 heads (one per warp) against 8 rows, both staged in shared memory; lane l
// takes dims l, l + 32, ...; the warp's double partial sums are added by a fixed butterfly.
__global__ void __launch_bounds__(kThreads)
    scores_kernel(const float *__restrict__ q, const float *__restrict__ rows, int64_t n_rows,
                  int64_t n_heads, int64_t d, float *__restrict__ scores,
                  const int64_t *__restrict__ n_rows_dev) {
    if (n_rows_dev) n_rows = *n_rows_dev;
    extern __shared__ float tile[];  // [8 heads][d], then [8 rows][d]
    float *sq = tile, *sr = tile + kHeadsPerBlock * d;
    const int64_t h0 = int64_t(blockIdx.y) * kHeadsPerBlock,
                  j0 = int64_t(blockIdx.x) * kRowsPerBlock;
    for (int64_t i = threadIdx.x; i < kHeadsPerBlock * d; i += kThreads) {
        const int64_t h = h0 + i / d;
        sq[i] = h < n_heads ? q[h * d + i % d] : 0.0f;
        const int64_t j = j0 + i / d;
        sr[i] = j < n_rows ? rows[j * d + i % d] : 0.0f;
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t h = h0 + warp;
    for (int r = 0; r < kRowsPerBlock; ++r) {
        double acc = 0.0;
        for (int64_t i = lane; i < d; i += 32)
            acc += double(sq[warp * d + i]) * double(sr[r * d + i]);  // exact products
        for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0 && h < n_heads && j0 + r < n_rows)
            scores[h * n_rows + j0 + r] = static_cast<float>(acc);
    }
}

__device__ __forceinline__ float exp_f(float x) {
    return static_cast<float>(exp(static_cast<double>(x)));
}

// A block of d threads mixes 8 heads: thread i owns output dim i of each of them, so each row
// value is read once for the 8 heads. Sums run over rows in order, as on the CPU.
__global__ void mix_kernel(float *__restrict__ scores, const float *__restrict__ rows,
                           int64_t n_rows, const float *__restrict__ sinks, float scale,
                           int64_t n_heads, int64_t d, float *__restrict__ o,
                           const int64_t *__restrict__ n_rows_dev) {
    if (n_rows_dev) n_rows = *n_rows_dev;
    __shared__ float s_max[kHeadsPerBlock], s_den[kHeadsPerBlock];
    const int64_t h0 = int64_t(blockIdx.x) * kHeadsPerBlock;
    const int nh = int(min(int64_t(kHeadsPerBlock), n_heads - h0));
    const int t = threadIdx.x;
    // 1. scale in place; the max with the sink (a max does not depend on the order).
    for (int i = 0; i < nh; ++i) {
        float *sc = scores + (h0 + i) * n_rows;
        for (int64_t j = t; j < n_rows; j += blockDim.x) sc[j] = __fmul_rn(sc[j], scale);
    }
    __syncthreads();
    if (t < nh) {
        const float *sc = scores + (h0 + t) * n_rows;
        float mx = sinks[h0 + t];
        for (int64_t j = 0; j < n_rows; ++j) mx = mx < sc[j] ? sc[j] : mx;  // std::max
        s_max[t] = mx;
    }
    __syncthreads();
    // 2. e_j = exp(s_j - max), in place.
    for (int i = 0; i < nh; ++i) {
        float *sc = scores + (h0 + i) * n_rows;
        for (int64_t j = t; j < n_rows; j += blockDim.x) sc[j] = exp_f(__fsub_rn(sc[j], s_max[i]));
    }
    __syncthreads();
    // 3. the denominators, in row order.
    if (t < nh) {
        const float *e = scores + (h0 + t) * n_rows;
        float den = exp_f(__fsub_rn(sinks[h0 + t], s_max[t]));
        for (int64_t j = 0; j < n_rows; ++j) den = __fadd_rn(den, e[j]);
        s_den[t] = den;
    }
    __syncthreads();
    // 4. o = sum_j e_j v_j / den, in row order.
    if (t >= d) return;
    float acc[kHeadsPerBlock];
#pragma unroll
    for (int i = 0; i < kHeadsPerBlock; ++i) acc[i] = 0.0f;
    for (int64_t j = 0; j < n_rows; ++j) {
        const float v = rows[j * d + t];
#pragma unroll
        for (int i = 0; i < kHeadsPerBlock; ++i)
            if (i < nh) acc[i] = __fadd_rn(acc[i], __fmul_rn(scores[(h0 + i) * n_rows + j], v));
    }
#pragma unroll
    for (int i = 0; i < kHeadsPerBlock; ++i)
        if (i < nh) o[(h0 + i) * d + t] = __fdiv_rn(acc[i], s_den[i]);
}

}  // namespace

void attention_scores(const float *q, const float *rows, int64_t n_rows, int64_t n_heads, int64_t d,
                      float *scores, cudaStream_t stream, const int64_t *n_rows_dev) {
    if (d % 32 != 0 || d > 512)
        throw ds4::Error("attention_scores: head size must be a multiple of 32, at most 512");
    if (n_rows == 0 || n_heads == 0) return;
    const dim3 grid(unsigned((n_rows + kRowsPerBlock - 1) / kRowsPerBlock),
                    unsigned((n_heads + kHeadsPerBlock - 1) / kHeadsPerBlock));
    const size_t smem = size_t(kHeadsPerBlock + kRowsPerBlock) * size_t(d) * sizeof(float);
    scores_kernel<<<grid, kThreads, smem, stream>>>(q, rows, n_rows, n_heads, d, scores,
                                                    n_rows_dev);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void attention_mix(float *scores, const float *rows, int64_t n_rows, const float *sinks,
                   float scale, int64_t n_heads, int64_t d, float *o, cudaStream_t stream,
                   const int64_t *n_rows_dev) {
    if (d > 1024 || d < 1) throw ds4::Error("attention_mix: head size must be 1 to 1024");
    if (n_heads == 0) return;
    const int threads = int(std::max<int64_t>(d, kHeadsPerBlock) + 31) / 32 * 32;
    mix_kernel<<<unsigned((n_heads + kHeadsPerBlock - 1) / kHeadsPerBlock), unsigned(threads), 0,
                 stream>>>(scores, rows, n_rows, sinks, scale, n_heads, d, o, n_rows_dev);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
