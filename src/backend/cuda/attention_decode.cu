#include <algorithm>

#include "backend/cuda/attention_decode.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/row_device.cuh"
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
    dev::wait_for_previous_kernels();
    if (n_rows_dev) n_rows = *n_rows_dev;
    extern __shared__ float tile[];  // [8 heads][d], then [8 rows][d]
    float *sq = tile, *sr = tile + kHeadsPerBlock * d;
    const int64_t h0 = int64_t(blockIdx.y) * kHeadsPerBlock,
                  j0 = int64_t(blockIdx.x) * kRowsPerBlock;
    if (j0 >= n_rows) return;  // beyond the rows in use (the grid is sized for the most)
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

constexpr int kMixDims = 32;    // output dims of a mix block: a warp's lanes
constexpr int kMixTile = 1024;  // rows of e staged at a time
constexpr int kMixThreads = kHeadsPerBlock * kMixDims;

// A block mixes 8 heads (warp i: head h0 + i) for 32 output dims (lane l: dim d0 + l): the grid
// is head groups x dim slices, so a 64-head, 512-dim step runs 128 blocks. Each block computes
// its heads' max, e_j and denominators itself (the dim slices repeat that small work rather than
// wait for one another) and keeps e in shared memory, a tile of rows at a time. Every sum runs
// over rows in order, as on the CPU: the denominator (by every lane of its head's warp) and each
// output dim (by its lane).
__global__ void __launch_bounds__(kMixThreads)
    mix_kernel(const float *__restrict__ scores, const float *__restrict__ rows, int64_t n_rows,
               const float *__restrict__ sinks, float scale, int64_t n_heads, int64_t d,
               float *__restrict__ o, const int64_t *__restrict__ n_rows_dev) {
    dev::wait_for_previous_kernels();
    if (n_rows_dev) n_rows = *n_rows_dev;
    __shared__ float e[kHeadsPerBlock][kMixTile];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t h = int64_t(blockIdx.x) * kHeadsPerBlock + warp;
    const int64_t dim = int64_t(blockIdx.y) * kMixDims + lane;
    const bool head = h < n_heads;
    const float *sc = scores + (head ? h : 0) * n_rows;
    // 1. m = max(sink, max_j s_j scale) (a max does not depend on the order).
    float mx = head ? sinks[h] : 0.0f;
    if (head)
        for (int64_t j = lane; j < n_rows; j += 32) {
            const float v = __fmul_rn(sc[j], scale);
            mx = mx < v ? v : mx;
        }
    for (int off = 16; off > 0; off /= 2) {
        const float other = __shfl_xor_sync(0xffffffffu, mx, off);
        mx = mx < other ? other : mx;
    }
    // 2. per tile: e_j = exp(s_j scale - m) into shared memory, then the sums in row order.
    float den = head ? dev::exp_f(__fsub_rn(sinks[h], mx)) : 0.0f, acc = 0.0f;
    for (int64_t j0 = 0; j0 < n_rows; j0 += kMixTile) {
        const int n = int(min(int64_t(kMixTile), n_rows - j0));
        __syncthreads();  // the previous tile is consumed
        if (head)
            for (int j = lane; j < n; j += 32)
                e[warp][j] = dev::exp_f(__fsub_rn(__fmul_rn(sc[j0 + j], scale), mx));
        __syncwarp();
        if (head) {
            // Every lane adds the denominator too (the same values in the same order: the same
            // sum), so the warp never waits for one lane; the rows' values are loaded 8 at a time
            // ahead of their additions, which stay in row order.
            const bool has_dim = dim < d;
            const float *v = rows + j0 * d + (has_dim ? dim : 0);
            int j = 0;
            for (; j + 8 <= n; j += 8) {
                float vv[8], ee[8];
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    vv[u] = has_dim ? v[int64_t(j + u) * d] : 0.0f;
                    ee[u] = e[warp][j + u];
                }
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    den = __fadd_rn(den, ee[u]);
                    acc = __fadd_rn(acc, __fmul_rn(ee[u], vv[u]));
                }
            }
            for (; j < n; ++j) {
                const float ej = e[warp][j];
                den = __fadd_rn(den, ej);
                acc = __fadd_rn(acc, __fmul_rn(ej, has_dim ? v[int64_t(j) * d] : 0.0f));
            }
        }
    }
    if (head && dim < d) o[h * d + dim] = __fdiv_rn(acc, den);
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
    launch_kernel(scores_kernel, grid, kThreads, smem, stream, q, rows, n_rows, n_heads, d, scores,
                  n_rows_dev);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void attention_mix(float *scores, const float *rows, int64_t n_rows, const float *sinks,
                   float scale, int64_t n_heads, int64_t d, float *o, cudaStream_t stream,
                   const int64_t *n_rows_dev) {
    if (d < 1) throw ds4::Error("attention_mix: head size must be at least 1");
    if (n_heads == 0) return;
    const dim3 grid(unsigned((n_heads + kHeadsPerBlock - 1) / kHeadsPerBlock),
                    unsigned((d + kMixDims - 1) / kMixDims));
    launch_kernel(mix_kernel, grid, kMixThreads, 0, stream, scores, rows, n_rows, sinks, scale,
                  n_heads, d, o, n_rows_dev);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
