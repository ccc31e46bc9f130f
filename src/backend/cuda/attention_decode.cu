#include <algorithm>

#include "backend/cuda/attention_decode.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/row_device.cuh"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kWarps = 8, kRowsPerBlock = 8, kThreads = 32 * kWarps;
constexpr int kMaxDim = 512, kMaxDimsPerLane = kMaxDim / 32;

// The butterflies (xor 16, 8, 4, 2, 1) of N sums a lane (a power of two up to 32) as one
// reduce-scatter: at xor 16 a lane keeps the half of the sums its bit 4 names and adds its
// partner's values of them, at xor 8 a half of those, and so on while more than one is left,
// then the remaining steps on that one. Every sum is its butterfly's tree (the same pairs of
// lanes at every level), with about 2 N + 10 shuffles, not 10 N. Lane l returns sum l / (32 / N).
template <int N>
__device__ __forceinline__ double reduce_scatter(const double (&in)[N], int lane) {
    double cur[N];
#pragma unroll
    for (int i = 0; i < N; ++i) cur[i] = in[i];
    int offset = 16;
#pragma unroll
    for (int size = N; size > 1; size /= 2, offset /= 2) {
        const bool upper = lane & offset;
#pragma unroll
        for (int i = 0; i < size / 2; ++i)
            cur[i] = (upper ? cur[i + size / 2] : cur[i]) +
                     __shfl_xor_sync(0xffffffffu, upper ? cur[i] : cur[i + size / 2], offset);
    }
    double v = cur[0];
    for (; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// A block scores 8 heads (warp w: head h0 + w) against 8 rows. The rows are staged in shared
// memory as doubles, each value converted once per block (f32 -> f64 conversions run at a
// quarter of the double rate: converting per head was the kernel's cost), all of a thread's
// loads issued before the first conversion (the rows come from L2: one load at a time left the
// block waiting on each); lane l holds its head's dims l, l + 32, ... as doubles in registers.
// Each row's exact products are summed by the lane in dim order, then by a fixed butterfly (a
// reduce-scatter over the 8 rows): the same bits on every run.
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
    {
        constexpr int kPerThread = kMaxDim / kThreads;
        float staged[kRowsPerBlock][kPerThread];
#pragma unroll
        for (int r = 0; r < kRowsPerBlock; ++r)
#pragma unroll
            for (int i = 0; i < kPerThread; ++i) {
                const int c = int(threadIdx.x) + kThreads * i;
                staged[r][i] = r < n && c < dd ? __ldg(rows + (j0 + r) * d + c) : 0.0f;
            }
#pragma unroll
        for (int r = 0; r < kRowsPerBlock; ++r)
#pragma unroll
            for (int i = 0; i < kPerThread; ++i) {
                const int c = int(threadIdx.x) + kThreads * i;
                if (r < n && c < dd) tile[r][c] = double(staged[r][i]);
            }
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t h = int64_t(blockIdx.y) * kWarps + warp;
    const int nd = dd / 32;
    double qv[kMaxDimsPerLane];
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i)
        qv[i] = i < nd && h < n_heads ? double(q[h * d + lane + 32 * i]) : 0.0;
    __syncthreads();
    if (h >= n_heads) return;
    double acc[kRowsPerBlock];
#pragma unroll
    for (int r = 0; r < kRowsPerBlock; ++r) {
        acc[r] = 0.0;
#pragma unroll
        for (int i = 0; i < kMaxDimsPerLane; ++i)
            if (r < n && i < nd) acc[r] += qv[i] * tile[r][lane + 32 * i];  // exact products
    }
    const double v = reduce_scatter(acc, lane);
    const int r = lane / (32 / kRowsPerBlock);
    if (lane % (32 / kRowsPerBlock) == 0 && r < n)
        scores[h * n_rows + j0 + r] = static_cast<float>(v);
}

constexpr int kMixThreads = kThreads;
constexpr int kMixStage = 8192;  // floats of rows staged at a time (32 KiB)

// A block mixes 8 HPW heads (warp i: heads h0 + HPW i ..) for 32 W output dims (lane l: dims
// d0 + l + 32 w, w < W): the grid is head groups x dim slices x tokens. Each block computes its
// heads' max, e_j and denominators itself (the dim slices repeat that small work rather than
// wait for one another): W = 1, HPW = 1 gives a one-token step 128 blocks; a batch takes W = 16
// (a whole head of 512 a block, e computed once) and HPW = 2 (each staged value read serves two
// heads: the shared-memory reads are the kernel's limit). A tile of rows at a time, the block
// stages e (per head) and the rows' dims in shared memory, every thread loading its share at
// once (the loads overlap), then each lane adds over the tile's rows in order, as on the CPU:
// the denominator (by every lane of its head's warp: the same sum) and its output dims. W and
// HPW change which lane computes an output, not its arithmetic.
template <int W, int HPW>
__global__ void __launch_bounds__(kMixThreads)
    mix_kernel(const float *__restrict__ scores, const float *__restrict__ rows, int64_t n_rows,
               const float *__restrict__ sinks, float scale, int64_t n_heads, int64_t d,
               float *__restrict__ o, const int64_t *__restrict__ n_rows_dev, int64_t word_stride) {
    constexpr int kDims = 32 * W, kTile = kMixStage / kDims;
    dev::wait_for_previous_kernels();
    {  // the token of a batch (AttentionTokens)
        const int64_t t = blockIdx.z;
        scores += t * n_heads * n_rows, rows += t * n_rows * d, o += t * n_heads * d;
        if (n_rows_dev) n_rows_dev += t * word_stride;
    }
    if (n_rows_dev) n_rows = *n_rows_dev;
    __shared__ float e[kWarps * HPW][kTile];
    __shared__ float v[kTile][kDims];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t h0 = (int64_t(blockIdx.x) * kWarps + warp) * HPW;
    const int64_t d0 = int64_t(blockIdx.y) * kDims;
    bool head[HPW];
    const float *sc[HPW];
    float mx[HPW], den[HPW], acc[HPW][W];
#pragma unroll
    for (int u = 0; u < HPW; ++u) {
        head[u] = h0 + u < n_heads;
        sc[u] = scores + (head[u] ? h0 + u : 0) * n_rows;
        // 1. m = max(sink, max_j s_j scale) (a max does not depend on the order).
        mx[u] = head[u] ? sinks[h0 + u] : 0.0f;
        if (head[u])
            for (int64_t j = lane; j < n_rows; j += 32) {
                const float s = __fmul_rn(sc[u][j], scale);
                mx[u] = mx[u] < s ? s : mx[u];
            }
        for (int off = 16; off > 0; off /= 2) {
            const float other = __shfl_xor_sync(0xffffffffu, mx[u], off);
            mx[u] = mx[u] < other ? other : mx[u];
        }
        den[u] = head[u] ? dev::exp_f(__fsub_rn(sinks[h0 + u], mx[u])) : 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) acc[u][w] = 0.0f;
    }
    // 2. per tile: e_j = exp(s_j scale - m) and the rows' values, then the sums in row order.
    for (int64_t j0 = 0; j0 < n_rows; j0 += kTile) {
        const int n = int(min(int64_t(kTile), n_rows - j0));
        __syncthreads();  // the previous tile is consumed
#pragma unroll
        for (int u = 0; u < HPW; ++u)
            if (head[u])
                for (int j = lane; j < n; j += 32)
                    e[HPW * warp + u][j] =
                        dev::exp_f(__fsub_rn(__fmul_rn(sc[u][j0 + j], scale), mx[u]));
        for (int i = threadIdx.x; i < n * kDims; i += kMixThreads) {
            const int j = i / kDims, c = i % kDims;
            v[j][c] = d0 + c < d ? __ldg(rows + (j0 + j) * d + d0 + c) : 0.0f;
        }
        __syncthreads();
        if (head[0]) {
#pragma unroll(W >= 16 ? 1 : 4)
            for (int j = 0; j < n; ++j) {
                float ej[HPW];
#pragma unroll
                for (int u = 0; u < HPW; ++u) {
                    ej[u] = e[HPW * warp + u][j];
                    den[u] = __fadd_rn(den[u], ej[u]);
                }
#pragma unroll
                for (int w = 0; w < W; ++w) {
                    const float x = v[j][lane + 32 * w];
#pragma unroll
                    for (int u = 0; u < HPW; ++u)
                        acc[u][w] = __fadd_rn(acc[u][w], __fmul_rn(ej[u], x));
                }
            }
        }
    }
#pragma unroll
    for (int u = 0; u < HPW; ++u)
#pragma unroll
        for (int w = 0; w < W; ++w) {
            const int64_t dim = d0 + lane + 32 * w;
            if (head[u] && dim < d) o[(h0 + u) * d + dim] = __fdiv_rn(acc[u][w], den[u]);
        }
}

template <int W, int HPW>
void launch_mix(float *scores, const float *rows, int64_t n_rows, const float *sinks, float scale,
                int64_t n_heads, int64_t d, float *o, cudaStream_t stream,
                const int64_t *n_rows_dev, AttentionTokens tokens) {
    const dim3 grid(unsigned((n_heads + kWarps * HPW - 1) / (kWarps * HPW)),
                    unsigned((d + 32 * W - 1) / (32 * W)), unsigned(tokens.n));
    launch_kernel(mix_kernel<W, HPW>, grid, kMixThreads, 0, stream, scores, rows, n_rows, sinks,
                  scale, n_heads, d, o, n_rows_dev, tokens.word_stride);
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
                    unsigned((n_heads + kWarps - 1) / kWarps), unsigned(tokens.n));
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
    // A batch has blocks enough with whole heads; one token wants the dim slices.
    if (tokens.n >= 4 && d > 256)
        launch_mix<16, 2>(scores, rows, n_rows, sinks, scale, n_heads, d, o, stream, n_rows_dev,
                          tokens);
    else if (tokens.n >= 4 && d > 64)
        launch_mix<4, 2>(scores, rows, n_rows, sinks, scale, n_heads, d, o, stream, n_rows_dev,
                         tokens);
    else
        launch_mix<1, 1>(scores, rows, n_rows, sinks, scale, n_heads, d, o, stream, n_rows_dev,
                         tokens);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
