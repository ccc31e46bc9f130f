#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/indexer_ops.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/per_device.h"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kScoreThreads = 256, kTileRows = 16;
constexpr int64_t kScoreBlocks = 4 * 132;  // ~4 resident blocks per multiprocessor of an H200
constexpr size_t kMaxScoreSmem = 48 * 1024;

// Each block stages q (rows padded to head_dim + 1 floats, so that the threads of a warp, one
// head each, read different banks) and w' = w * wscale once, then loops over tiles of 16 rows.
// Thread t computes head t % n_heads of rows t / n_heads, t / n_heads + 256 / n_heads, ... of
// the tile: a sequential f32 dot product (the CPU's order), relu, times w'. Then thread r adds
// its row's n_heads products in head order. Every operation is rounded on its own.
__global__ void __launch_bounds__(kScoreThreads)
    indexer_scores_kernel(const float *__restrict__ q, const float *__restrict__ w, float wscale,
                          const float *__restrict__ rows, int64_t n_rows, int n_heads, int head_dim,
                          float *__restrict__ score, const int64_t *__restrict__ n_rows_dev,
                          int64_t word_stride) {
    dev::wait_for_previous_kernels();
    {  // the token of a batch (IndexerTokens)
        const int64_t tok = blockIdx.y;
        q += tok * n_heads * head_dim, w += tok * n_heads, score += tok * n_rows;
        if (n_rows_dev) n_rows_dev += tok * word_stride;
    }
    if (n_rows_dev) n_rows = *n_rows_dev;
    extern __shared__ float smem[];
    const int H = n_heads, I = head_dim, q_stride = I + 1, p_stride = H + 1;
    float *sq = smem;                      // [H][I + 1]
    float *sw = sq + H * q_stride;         // [H]
    float *srows = sw + H;                 // [kTileRows][I]
    float *sprod = srows + kTileRows * I;  // [kTileRows][H + 1]
    const int t = threadIdx.x;
    for (int i = t; i < H * I; i += kScoreThreads) sq[(i / I) * q_stride + i % I] = q[i];
    for (int h = t; h < H; h += kScoreThreads) sw[h] = __fmul_rn(w[h], wscale);
    const int groups = kScoreThreads / H, h = t % H, g = t / H;
    const int64_t n_tiles = (n_rows + kTileRows - 1) / kTileRows;
    for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
        const int64_t row0 = tile * kTileRows;
        const int tile_rows = int(min(int64_t(kTileRows), n_rows - row0));
        __syncthreads();  // q and w' staged; the previous tile's rows and products consumed
        for (int i = t; i < tile_rows * I; i += kScoreThreads) srows[i] = rows[row0 * I + i];
        __syncthreads();
        if (g < groups)
            for (int r = g; r < tile_rows; r += groups) {
                const float *qh = sq + h * q_stride, *k = srows + r * I;
                float dot = 0.0f;
                for (int j = 0; j < I; ++j) dot = __fadd_rn(dot, __fmul_rn(qh[j], k[j]));
                // std::max(dot, 0.0f) is (dot < 0) ? 0 : dot (a NaN stays a NaN)
                sprod[r * p_stride + h] = __fmul_rn(dot < 0.0f ? 0.0f : dot, sw[h]);
            }
        __syncthreads();
        if (t < tile_rows) {
            float acc = 0.0f;
            for (int i = 0; i < H; ++i) acc = __fadd_rn(acc, sprod[t * p_stride + i]);
            score[row0 + t] = acc;
        }
    }
}

// The same scores with a register tile (the shape of Flash's indexer: at most 64 heads, a head
// size that is a multiple of 4, at most 128): thread t holds the dot products of heads t % 16 +
// 16 u (u < 4) with rows t / 16 + 16 v (v < V) of a tile of 16 V rows, reading q and the rows as
// float4s (4 + V shared-memory reads for 4 V products, not 8 V). Each dot product is still the
// sequential f32 sum over j of its own; then the products go to shared memory and thread r adds
// its row's in head order, as above. q rows are padded to head_dim + 4 floats when head_dim is a
// multiple of 8 (a quarter warp's 8 heads then read 8 different bank groups). q and each tile's
// rows arrive by cp.async, every 16-byte piece of them in flight at once (a loop that stores
// each loaded value to shared memory before it issues the next load waits a memory latency per
// piece). V = 4 (64-row tiles) for batches and long contexts; one token of up to 33,792 rows
// takes V = 1, so that a 2K context's ~512 rows are 33 blocks of 16 rows instead of 9 of 64.
// Blocks past the rows counted on the device return at once.
constexpr int kTiledHeads = 64, kTiledMaxDim = 128;

__host__ __device__ constexpr int tiled_stride(int head_dim) {
    return head_dim % 8 == 0 ? head_dim + 4 : head_dim;
}
template <int V>
__host__ __device__ constexpr size_t tiled_smem_floats(int head_dim) {
    return size_t(kTiledHeads + 16 * V) * size_t(tiled_stride(head_dim)) + kTiledHeads +
           size_t(16 * V) * (kTiledHeads + 1);
}

template <int V>
__global__ void __launch_bounds__(kScoreThreads)
    indexer_scores_tiled_kernel(const float *__restrict__ q, const float *__restrict__ w,
                                float wscale, const float *__restrict__ rows, int64_t n_rows,
                                int n_heads, int head_dim, float *__restrict__ score,
                                const int64_t *__restrict__ n_rows_dev, int64_t word_stride) {
    constexpr int kRows = 16 * V;
    dev::wait_for_previous_kernels();
    {  // the token of a batch (IndexerTokens)
        const int64_t tok = blockIdx.y;
        q += tok * n_heads * head_dim, w += tok * n_heads, score += tok * n_rows;
        if (n_rows_dev) n_rows_dev += tok * word_stride;
    }
    if (n_rows_dev) n_rows = *n_rows_dev;
    const int64_t n_tiles = (n_rows + kRows - 1) / kRows;
    if (blockIdx.x >= n_tiles) return;  // a grid sized for the capacity: rows not written yet
    extern __shared__ float4 tiled_smem[];
    const int H = n_heads, I = head_dim, S = tiled_stride(I), p_stride = kTiledHeads + 1;
    const int quads = I / 4;                            // float4s a row
    float *sq = reinterpret_cast<float *>(tiled_smem);  // [64][S], heads >= H zero
    float *srows = sq + kTiledHeads * S;                // [kRows][S]
    float *sw = srows + kRows * S;                      // [64]
    float *sprod = sw + kTiledHeads;                    // [kRows][65]
    const int t = threadIdx.x, hg = t % 16, rg = t / 16;
    for (int i = t; i < kTiledHeads * quads; i += kScoreThreads) {
        const int h = i / quads, c = 4 * (i % quads);
        dev::copy_16_async(sq + h * S + c, h < H ? q + h * I + c : q, h < H);
    }
    dev::commit_async_copies();
    for (int h = t; h < H; h += kScoreThreads) sw[h] = __fmul_rn(w[h], wscale);
    for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
        const int64_t row0 = tile * kRows;
        const int tile_rows = int(min(int64_t(kRows), n_rows - row0));
        __syncthreads();  // the previous tile's rows and products consumed
        for (int i = t; i < kRows * quads; i += kScoreThreads) {
            const int r = i / quads, c = 4 * (i % quads);
            dev::copy_16_async(srows + r * S + c, r < tile_rows ? rows + (row0 + r) * I + c : rows,
                               r < tile_rows);
        }
        dev::commit_async_copies();
        dev::wait_async_copies(0);  // this thread's pieces of q and of the tile
        __syncthreads();            // everybody's
        float dot[4][V] = {};
        for (int j = 0; j < I; j += 4) {
            float4 qv[4], kv[V];
#pragma unroll
            for (int u = 0; u < 4; ++u)
                qv[u] = *reinterpret_cast<const float4 *>(sq + (hg + 16 * u) * S + j);
#pragma unroll
            for (int v = 0; v < V; ++v)
                kv[v] = *reinterpret_cast<const float4 *>(srows + (rg + 16 * v) * S + j);
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int v = 0; v < V; ++v) {
                    float x = dot[u][v];
                    x = __fadd_rn(x, __fmul_rn(qv[u].x, kv[v].x));
                    x = __fadd_rn(x, __fmul_rn(qv[u].y, kv[v].y));
                    x = __fadd_rn(x, __fmul_rn(qv[u].z, kv[v].z));
                    dot[u][v] = __fadd_rn(x, __fmul_rn(qv[u].w, kv[v].w));
                }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int v = 0; v < V; ++v) {
                const int h = hg + 16 * u;
                // std::max(dot, 0.0f) is (dot < 0) ? 0 : dot (a NaN stays a NaN)
                if (h < H)
                    sprod[(rg + 16 * v) * p_stride + h] =
                        __fmul_rn(dot[u][v] < 0.0f ? 0.0f : dot[u][v], sw[h]);
            }
        __syncthreads();
        if (t < tile_rows) {
            float acc = 0.0f;
            for (int i = 0; i < H; ++i) acc = __fadd_rn(acc, sprod[t * p_stride + i]);
            score[row0 + t] = acc;
        }
    }
}

constexpr int kTopKThreads = 1024, kTopKWarps = kTopKThreads / 32;

// An order-preserving map of the (non-NaN) floats to unsigned integers: a larger float has a
// larger key, equal floats equal keys (-0 is mapped as +0, as the two compare equal).
__device__ __forceinline__ uint32_t order_key(float s) {
    uint32_t u = __float_as_uint(s);
    if ((u << 1) == 0u) u = 0u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The sum of v over the threads before this one (all threads of the block call it).
__device__ uint32_t block_exclusive_sum(uint32_t v, uint32_t *warp_sums) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    uint32_t x = v;
    for (int o = 1; o < 32; o *= 2) {
        const uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        uint32_t s = warp_sums[lane];
        for (int o = 1; o < 32; o *= 2) {
            const uint32_t y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        warp_sums[lane] = s;  // inclusive sums over the warps
    }
    __syncthreads();
    const uint32_t before = (warp ? warp_sums[warp - 1] : 0u) + x - v;
    __syncthreads();  // warp_sums free for the next call
    return before;
}

// One block. Radix select, most significant byte first: at each pass the keys that agree with
// the prefix chosen so far are counted by their next byte; the bins' counts from the top, summed
// by a block scan, find the byte of the remaining-th largest of them. After four passes the
// prefix is the k-th largest key T itself, and `take` the number of keys equal to T among the k
// best. Then the flags sel_i = key_i > T || (key_i == T && #{j < i : key_j == T} < take) (ties to
// the lower index, as on the CPU) are scanned over the block in index order, thread t owning the
// t-th contiguous segment, and each selected index goes to its position. The keys of a warp that
// fall in one bin are counted by one shared-memory atomic (most scores share their top byte).
__global__ void __launch_bounds__(kTopKThreads)
    top_k_kernel(const float *__restrict__ score, uint32_t n, uint32_t k, int32_t *__restrict__ out,
                 const int64_t *__restrict__ n_dev, int64_t word_stride) {
    dev::wait_for_previous_kernels();
    {  // the token of a batch (IndexerTokens): a block each
        const int64_t tok = blockIdx.x;
        score += tok * int64_t(n), out += tok * int64_t(k);
        if (n_dev) n_dev += tok * word_stride;
    }
    if (n_dev) {  // the count read on the device: nothing to select while it is at most k
        if (*n_dev <= int64_t(k)) return;
        n = uint32_t(*n_dev);
    }
    __shared__ uint32_t hist[256];
    __shared__ uint32_t warp_sums[kTopKWarps];
    __shared__ uint32_t s_prefix, s_remaining;
    const uint32_t t = threadIdx.x, lane = t % 32;
    uint32_t prefix = 0, mask = 0, remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        if (t < 256) hist[t] = 0;
        __syncthreads();
        // The warp's first index is the same for its 32 lanes, so all of them run each pass.
        for (uint32_t i0 = t - lane; i0 < n; i0 += kTopKThreads) {
            const uint32_t i = i0 + lane;
            const uint32_t key = i < n ? order_key(score[i]) : 0u;
            const bool counted = i < n && (key & mask) == prefix;
            const uint32_t bin = counted ? (key >> shift) & 0xffu : 256u;
            const uint32_t same = __match_any_sync(0xffffffffu, bin);
            if (counted && lane == uint32_t(__ffs(same) - 1)) atomicAdd(&hist[bin], __popc(same));
        }
        __syncthreads();
        // Thread u < 256 takes bin 255 - u: `before` counts the keys of the bins above it. The
        // chosen bin is the first from the top whose keys reach `remaining` (bin 0 if none does;
        // 1 <= remaining <= the keys counted, so some bin does).
        const uint32_t count = t < 256 ? hist[255 - t] : 0u;
        const uint32_t before = block_exclusive_sum(count, warp_sums);
        if (t < 256 && before < remaining && (before + count >= remaining || t == 255)) {
            s_prefix = prefix | ((255u - t) << shift);
            s_remaining = remaining - before;
        }
        __syncthreads();
        prefix = s_prefix;
        remaining = s_remaining;
        mask |= 0xffu << shift;
    }
    const uint32_t T = prefix, take = remaining;

    const uint32_t seg = (n + kTopKThreads - 1) / kTopKThreads;
    const uint32_t begin = min(n, t * seg), end = min(n, begin + seg);
    uint32_t n_eq = 0;
    for (uint32_t i = begin; i < end; ++i) n_eq += order_key(score[i]) == T ? 1u : 0u;
    const uint32_t ties_before = block_exclusive_sum(n_eq, warp_sums);
    uint32_t n_sel = 0, tie = ties_before;
    for (uint32_t i = begin; i < end; ++i) {
        const uint32_t key = order_key(score[i]);
        if (key > T || (key == T && tie++ < take)) ++n_sel;
    }
    uint32_t pos = block_exclusive_sum(n_sel, warp_sums);
    tie = ties_before;
    for (uint32_t i = begin; i < end; ++i) {
        const uint32_t key = order_key(score[i]);
        if (key > T || (key == T && tie++ < take)) out[pos++] = int32_t(i);
    }
}

}  // namespace

void indexer_scores(const float *q, const float *w, float wscale, const float *rows, int64_t n_rows,
                    int n_heads, int head_dim, float *score, cudaStream_t stream,
                    const int64_t *n_rows_dev, IndexerTokens tokens) {
    if (tokens.n < 1 || tokens.n > 65535)
        throw ds4::Error("indexer_scores: 1 to 65535 tokens a launch");
    if (n_rows <= 0) return;
    if (n_heads <= 0 || n_heads > kScoreThreads || head_dim <= 0)
        throw ds4::Error("indexer_scores: needs 1 to 256 heads of at least one value");
    const int64_t n_tiles = (n_rows + kTileRows - 1) / kTileRows;
    const bool aligned =
        reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(rows) % 16 == 0;
    if (n_heads <= kTiledHeads && head_dim % 4 == 0 && head_dim <= kTiledMaxDim && aligned) {
        // A block per token and several tiles each when a batch has blocks enough (q is staged
        // once per block); one token takes 16-row tiles up to 4 a block (33,792 rows, a context
        // of 135K tokens at ratio 4), where the grid is otherwise a few blocks.
        const auto launch_tiled = [&](auto rows_per_group) {
            constexpr int V = decltype(rows_per_group)::value;
            constexpr size_t kSmem = tiled_smem_floats<V>(kTiledMaxDim) * sizeof(float);
            static PerDevice<bool> sized;  // more shared memory than a static array may have
            sized.get([] {
                DS4_CUDA_CHECK(cudaFuncSetAttribute(indexer_scores_tiled_kernel<V>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    int(kSmem)));
                return true;
            });
            const int64_t tiles = (n_rows + 16 * V - 1) / (16 * V);
            const int64_t per_token = std::max<int64_t>(1, kScoreBlocks / tokens.n);
            const dim3 grid(unsigned(std::min(tiles, per_token)), unsigned(tokens.n));
            launch_kernel(indexer_scores_tiled_kernel<V>, grid, kScoreThreads,
                          tiled_smem_floats<V>(head_dim) * sizeof(float), stream, q, w, wscale,
                          rows, n_rows, n_heads, head_dim, score, n_rows_dev, tokens.word_stride);
        };
        if (tokens.n == 1 && n_rows <= 4 * 16 * kScoreBlocks)
            launch_tiled(std::integral_constant<int, 1>{});
        else
            launch_tiled(std::integral_constant<int, 4>{});
        DS4_CUDA_CHECK(cudaGetLastError());
        return;
    }
    const size_t smem = (size_t(n_heads) * size_t(head_dim + 1) + size_t(n_heads) +
                         size_t(kTileRows) * size_t(head_dim + n_heads + 1)) *
                        sizeof(float);
    if (smem > kMaxScoreSmem)
        throw ds4::Error("indexer_scores: n_heads x head_dim does not fit 48 KiB of shared memory");
    const dim3 grid(unsigned(std::min(n_tiles, kScoreBlocks)), unsigned(tokens.n));
    launch_kernel(indexer_scores_kernel, grid, kScoreThreads, smem, stream, q, w, wscale, rows,
                  n_rows, n_heads, head_dim, score, n_rows_dev, tokens.word_stride);
    DS4_CUDA_CHECK(cudaGetLastError());
}

size_t top_k_scratch_bytes(int64_t) {
    return 0;
}

void top_k_ascending(const float *score, int64_t n, int64_t k, int32_t *out, void *,
                     cudaStream_t stream, const int64_t *n_dev, IndexerTokens tokens) {
    if (k < 0 || k > n || n >= (int64_t(1) << 31))
        throw ds4::Error("top_k_ascending: needs 0 <= k <= n < 2^31");
    if (tokens.n < 1 || tokens.n > 65535)
        throw ds4::Error("top_k_ascending: 1 to 65535 tokens a launch");
    if (k == 0) return;
    launch_kernel(top_k_kernel, unsigned(tokens.n), kTopKThreads, 0, stream, score, uint32_t(n),
                  uint32_t(k), out, n_dev, tokens.word_stride);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
