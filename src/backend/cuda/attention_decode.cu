#include <algorithm>

#include "backend/cuda/attention_decode.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/row_device.cuh"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kHeadsPerBlock = 8, kRowsPerBlock = 8, kThreads = 256;
constexpr int kMaxDim = 512, kMaxDimsPerLane = kMaxDim / 32;

// A block scores 8 heads (warp w: head h0 + w) against 8 rows. The rows are staged in shared
// memory as doubles, each value converted once per block (f32 -> f64 conversions run at a
// quarter of the double rate: converting per head was the kernel's cost); lane l holds its
// head's dims l, l + 32, ... as doubles in registers. Each row's exact products are summed by
// the lane in dim order, then by a fixed butterfly: the same bits on every run.
__global__ void __launch_bounds__(kThreads)
    scores_kernel(const float *__restrict__ q, const float *__restrict__ rows, int64_t n_rows,
                  int64_t n_heads, int64_t d, float *__restrict__ scores,
                  const int64_t *__restrict__ n_rows_dev, int64_t word_stride) {
    dev::wait_for_previous_kernels();
    __shared__ double tile[kRowsPerBlock][kMaxDim];
    {  // the token of a batch (AttentionTokens)
        const int64_t t = blockIdx.z;
        q += t * n_heads * d, rows += t * n_rows * d, scores += t * n_heads * n_rows;
        if (n_rows_dev) n_rows_dev += t * word_stride;
    }
    if (n_rows_dev) n_rows = *n_rows_dev;
    const int64_t j0 = int64_t(blockIdx.x) * kRowsPerBlock;
    if (j0 >= n_rows) return;  // beyond the rows in use (the grid is sized for the most)
    const int n = int(min(int64_t(kRowsPerBlock), n_rows - j0)), dd = int(d);
    for (int r = 0; r < n; ++r)
        for (int c = threadIdx.x; c < dd; c += kThreads)
            tile[r][c] = double(__ldg(rows + (j0 + r) * d + c));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t h = int64_t(blockIdx.y) * kHeadsPerBlock + warp;
    const int nd = dd / 32;
    double qv[kMaxDimsPerLane];
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i)
        qv[i] = i < nd && h < n_heads ? double(q[h * d + lane + 32 * i]) : 0.0;
    __syncthreads();
    if (h >= n_heads) return;
    for (int r = 0; r < n; ++r) {
        double acc = 0.0;
#pragma unroll
        for (int i = 0; i < kMaxDimsPerLane; ++i)
            if (i < nd) acc += qv[i] * tile[r][lane + 32 * i];  // exact products
        for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) scores[h * n_rows + j0 + r] = static_cast<float>(acc);
    }
}

constexpr int kMixDims = 32;   // output dims of a mix block: a warp's lanes
constexpr int kMixTile = 256;  // rows staged at a time
constexpr int kMixThreads = kHeadsPerBlock * kMixDims;

// A block mixes 8 heads (warp i: head h0 + i) for 32 output dims (lane l: dim d0 + l): the grid
// is head groups x dim slices, so a 64-head, 512-dim step runs 128 blocks. Each block computes
// its heads' max, e_j and denominators itself (the dim slices repeat that small work rather than
// wait for one another). A tile of rows at a time, the block stages e (per head) and the rows'
// 32 dims in shared memory, every thread loading its share at once (the loads overlap), then
// each lane adds over the tile's rows in order, as on the CPU: the denominator (by every lane of
// its head's warp: the same sum) and its output dim.
__global__ void __launch_bounds__(kMixThreads)
    mix_kernel(const float *__restrict__ scores, const float *__restrict__ rows, int64_t n_rows,
               const float *__restrict__ sinks, float scale, int64_t n_heads, int64_t d,
               float *__restrict__ o, const int64_t *__restrict__ n_rows_dev, int64_t word_stride) {
    dev::wait_for_previous_kernels();
    {  // the token of a batch (AttentionTokens)
        const int64_t t = blockIdx.z;
        scores += t * n_heads * n_rows, rows += t * n_rows * d, o += t * n_heads * d;
        if (n_rows_dev) n_rows_dev += t * word_stride;
    }
    if (n_rows_dev) n_rows = *n_rows_dev;
    __shared__ float e[kHeadsPerBlock][kMixTile];
    __shared__ float v[kMixTile][kMixDims];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t h = int64_t(blockIdx.x) * kHeadsPerBlock + warp;
    const int64_t d0 = int64_t(blockIdx.y) * kMixDims, dim = d0 + lane;
    const bool head = h < n_heads;
    const float *sc = scores + (head ? h : 0) * n_rows;
    // 1. m = max(sink, max_j s_j scale) (a max does not depend on the order).
    float mx = head ? sinks[h] : 0.0f;
    if (head)
        for (int64_t j = lane; j < n_rows; j += 32) {
            const float s = __fmul_rn(sc[j], scale);
            mx = mx < s ? s : mx;
        }
    for (int off = 16; off > 0; off /= 2) {
        const float other = __shfl_xor_sync(0xffffffffu, mx, off);
        mx = mx < other ? other : mx;
    }
    // 2. per tile: e_j = exp(s_j scale - m) and the rows' values, then the sums in row order.
    float den = head ? dev::exp_f(__fsub_rn(sinks[h], mx)) : 0.0f, acc = 0.0f;
    for (int64_t j0 = 0; j0 < n_rows; j0 += kMixTile) {
        const int n = int(min(int64_t(kMixTile), n_rows - j0));
        __syncthreads();  // the previous tile is consumed
        if (head)
            for (int j = lane; j < n; j += 32)
                e[warp][j] = dev::exp_f(__fsub_rn(__fmul_rn(sc[j0 + j], scale), mx));
        const bool has_dim = dim < d;
#pragma unroll 8
        for (int j = warp; j < n; j += kHeadsPerBlock)
            v[j][lane] = has_dim ? __ldg(rows + (j0 + j) * d + dim) : 0.0f;
        __syncthreads();
        if (head) {
#pragma unroll 8
            for (int j = 0; j < n; ++j) {
                const float ej = e[warp][j];
                den = __fadd_rn(den, ej);
                acc = __fadd_rn(acc, __fmul_rn(ej, v[j][lane]));
            }
        }
    }
    if (head && dim < d) o[h * d + dim] = __fdiv_rn(acc, den);
}

}  // namespace

void attention_scores(const float *q, const float *rows, int64_t n_rows, int64_t n_heads, int64_t d,
                      float *scores, cudaStream_t stream, const int64_t *n_rows_dev,
                      AttentionTokens tokens) {
    if (d % 32 != 0 || d > 512)
        throw ds4::Error("attention_scores: head size must be a multiple of 32, at most 512");
    if (tokens.n < 1 || tokens.n > 65535)
        throw ds4::Error("attention_scores: 1 to 65535 tokens a launch");
    if (n_rows == 0 || n_heads == 0) return;
    const dim3 grid(unsigned((n_rows + kRowsPerBlock - 1) / kRowsPerBlock),
                    unsigned((n_heads + kHeadsPerBlock - 1) / kHeadsPerBlock), unsigned(tokens.n));
    launch_kernel(scores_kernel, grid, kThreads, 0, stream, q, rows, n_rows, n_heads, d, scores,
                  n_rows_dev, tokens.word_stride);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void attention_mix(float *scores, const float *rows, int64_t n_rows, const float *sinks,
                   float scale, int64_t n_heads, int64_t d, float *o, cudaStream_t stream,
                   const int64_t *n_rows_dev, AttentionTokens tokens) {
    if (d < 1) throw ds4::Error("attention_mix: head size must be at least 1");
    if (tokens.n < 1 || tokens.n > 65535)
        throw ds4::Error("attention_mix: 1 to 65535 tokens a launch");
    if (n_heads == 0) return;
    const dim3 grid(unsigned((n_heads + kHeadsPerBlock - 1) / kHeadsPerBlock),
                    unsigned((d + kMixDims - 1) / kMixDims), unsigned(tokens.n));
    launch_kernel(mix_kernel, grid, kMixThreads, 0, stream, scores, rows, n_rows, sinks, scale,
                  n_heads, d, o, n_rows_dev, tokens.word_stride);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
