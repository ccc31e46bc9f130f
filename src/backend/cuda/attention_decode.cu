#include <algorithm>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/attention_decode.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma_f64.cuh"
#include "backend/cuda/per_device.h"
#include "backend/cuda/quantize_block.cuh"
#include "backend/cuda/row_device.cuh"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;

// A token's visible rows: in place (VisibleRows, its words read here) or gathered (`rows`,
// row i at rows + i d).
struct RowMap {
    const float *rows;
    VisibleRows v;
    int64_t d, first = 0, n_raw = 0;
    const int32_t *sel = nullptr;
    __device__ RowMap(const float *rows_, int64_t d_, const VisibleRows &vis)
        : rows(rows_), v(vis), d(d_) {
        if (v.ring) {
            first = v.words[0];
            n_raw = v.words[1];
            if (v.words[3]) sel = v.selected;
        }
    }
    __device__ const float *row(int64_t i) const {
        if (!v.ring) return rows + i * d;
        return i < n_raw ? v.ring + ((first + i) % v.window) * d
                         : v.comp + (sel ? int64_t(sel[i - n_raw]) : i - n_raw) * d;
    }
};

// The scores on the double-precision tensor cores: a block scores 64 heads (4 warps of 16 along
// the heads) against 16 WN rows (2 warps of 8 WN along the rows), a warp's tile 2 x WN m8n8
// fragments. The dims go by in chunks of 32, staged in shared memory as doubles (each value
// converted once per block; the next chunk's loads are in flight while this one is multiplied),
// 8 k steps of 4 a chunk. f32 values are exact in double and so are their products; a score's
// sum is its d / 4 k steps in dim order whatever WN, the tile or the token count, so a batch's
// scores are a one-token launch's bits.
constexpr int kHeadTile = 64, kChunk = 32;
constexpr int kPad = kChunk + 4;  // a row's doubles in shared memory: a fragment's lanes, 4 rows
                                  // apart by 72 banks, hit 16 different bank pairs

// Chunk [k0, k0 + 32) of `rows` rows (stride d) of src: thread t loads float4s t, t + 256, ..
template <int Rows>
struct ChunkStage {
    static constexpr int kVecs = Rows * kChunk / 4;
    static constexpr int kPerThread = (kVecs + kThreads - 1) / kThreads;
    float4 v[kPerThread];

    // row(r): where row r starts.
    template <class RowPtr>
    __device__ __forceinline__ void load(RowPtr row, int valid, int64_t k0) {
#pragma unroll
        for (int u = 0; u < kPerThread; ++u) {
            const int i = int(threadIdx.x) + kThreads * u, r = i / (kChunk / 4);
            v[u] = i < kVecs && r < valid
                       ? __ldg(reinterpret_cast<const float4 *>(row(r) + k0) + i % (kChunk / 4))
                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    __device__ __forceinline__ void store(double (*dst)[kPad]) const {
#pragma unroll
        for (int u = 0; u < kPerThread; ++u) {
            const int i = int(threadIdx.x) + kThreads * u, r = i / (kChunk / 4);
            const int c = 4 * (i % (kChunk / 4));
            if (i < kVecs) {
                dst[r][c] = double(v[u].x), dst[r][c + 1] = double(v[u].y);
                dst[r][c + 2] = double(v[u].z), dst[r][c + 3] = double(v[u].w);
            }
        }
    }
};

// The token of a batch (AttentionTokens, blockIdx.z): its q, rows and scores, and its row count
// (read on the device where given; also a head's stride in scores, as mix reads them).
__device__ __forceinline__ int64_t scores_token(const float *__restrict__ &q,
                                                const float *__restrict__ &rows,
                                                float *__restrict__ &scores, int64_t n_rows,
                                                int64_t n_heads, int64_t d,
                                                const int64_t *n_rows_dev, int64_t word_stride) {
    const int64_t t = blockIdx.z;
    q += t * n_heads * d, rows += t * n_rows * d, scores += t * n_heads * n_rows;
    return n_rows_dev ? n_rows_dev[t * word_stride] : n_rows;
}

template <int WN>
__global__ void __launch_bounds__(kThreads)
    scores_kernel(const float *__restrict__ q, const float *__restrict__ rows, int64_t n_rows,
                  int64_t n_heads, int64_t d, float *__restrict__ scores,
                  const int64_t *__restrict__ n_rows_dev, int64_t word_stride,
                  VisibleRows visible) {
    constexpr int kRowTile = 16 * WN;
    dev::wait_for_previous_kernels();
    n_rows = scores_token(q, rows, scores, n_rows, n_heads, d, n_rows_dev, word_stride);
    const int64_t j0 = int64_t(blockIdx.x) * kRowTile, h0 = int64_t(blockIdx.y) * kHeadTile;
    if (j0 >= n_rows) return;  // beyond the rows in use (the grid is sized for the most)
    __shared__ double sq[kHeadTile][kPad];
    __shared__ double sr[kRowTile][kPad];
    const int n_valid = int(min(int64_t(kRowTile), n_rows - j0));
    const int h_valid = int(min(int64_t(kHeadTile), n_heads - h0));
    q += h0 * d;
    __shared__ const float *row_at[kRowTile];  // the block's rows
    if (threadIdx.x < n_valid) row_at[threadIdx.x] = RowMap(rows, d, visible).row(j0 + threadIdx.x);
    __syncthreads();
    const auto q_row = [&](int r) { return q + r * d; };
    const auto kv_row = [&](int r) { return row_at[r]; };
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int wm = warp % 4, wn = warp / 4;
    ChunkStage<kHeadTile> q_stage;
    ChunkStage<kRowTile> row_stage;
    q_stage.load(q_row, h_valid, 0);
    row_stage.load(kv_row, n_valid, 0);
    double acc[2][WN][2] = {};
    for (int64_t k0 = 0; k0 < d; k0 += kChunk) {
        __syncthreads();  // the previous chunk is consumed
        q_stage.store(sq);
        row_stage.store(sr);
        __syncthreads();
        if (k0 + kChunk < d) {
            q_stage.load(q_row, h_valid, k0 + kChunk);
            row_stage.load(kv_row, n_valid, k0 + kChunk);
        }
#pragma unroll
        for (int ks = 0; ks < kChunk; ks += 4) {
            double a[2], b[WN];
#pragma unroll
            for (int fm = 0; fm < 2; ++fm) a[fm] = sq[16 * wm + 8 * fm + g][ks + c];
#pragma unroll
            for (int fn = 0; fn < WN; ++fn) b[fn] = sr[8 * WN * wn + 8 * fn + g][ks + c];
#pragma unroll
            for (int fm = 0; fm < 2; ++fm)
#pragma unroll
                for (int fn = 0; fn < WN; ++fn) dev::mma_f64(acc[fm][fn], a[fm], b[fn]);
        }
    }
#pragma unroll
    for (int fm = 0; fm < 2; ++fm) {
        const int h = 16 * wm + 8 * fm + g;
#pragma unroll
        for (int fn = 0; fn < WN; ++fn)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int j = 8 * WN * wn + 8 * fn + 2 * c + i;
                if (h < h_valid && j < n_valid)
                    scores[(h0 + h) * n_rows + j0 + j] = static_cast<float>(acc[fm][fn][i]);
            }
    }
}

template <int WN>
void launch_scores(const float *q, const float *rows, int64_t n_rows, int64_t n_heads, int64_t d,
                   float *scores, cudaStream_t stream, const int64_t *n_rows_dev,
                   AttentionTokens tokens, const VisibleRows &visible) {
    const dim3 grid(unsigned((n_rows + 16 * WN - 1) / (16 * WN)),
                    unsigned((n_heads + kHeadTile - 1) / kHeadTile), unsigned(tokens.n));
    launch_kernel(scores_kernel<WN>, grid, kThreads, 0, stream, q, rows, n_rows, n_heads, d, scores,
                  n_rows_dev, tokens.word_stride, visible);
}

// One token's scores with all of a block's operands in flight at once. The tiled kernel above
// keeps one chunk of 32 dims in flight a block, so a one-token step waits for d / 32 round trips
// to memory one after another (and a 2K context's ratio-128 layers, 144 rows, fill 9 blocks).
// Here a block scores 32 heads (4 warps of 8) against 16 rows (2 warps of 8), each warp one
// m8n8 fragment; the block's q rows and rows, as floats in shared memory, arrive by cp.async in
// groups of 128 dims, all issued before the first is multiplied. Each score is the same chain of
// d / 4 k steps in dim order as above (a fragment's value converted to double where it is
// read), so the bits are the tiled kernel's.
constexpr int kStagedHeads = 32, kStagedRows = 16, kStageDims = 128;
constexpr int64_t kStagedMaxD = 1024;  // (32 + 16) (d + 4) floats of shared memory

constexpr size_t staged_scores_smem(int64_t d) {
    return sizeof(float) * (kStagedHeads + kStagedRows) * size_t(d + 4);
}

__global__ void __launch_bounds__(kThreads)
    scores_staged_kernel(const float *__restrict__ q, const float *__restrict__ rows,
                         int64_t n_rows, int64_t n_heads, int64_t d, float *__restrict__ scores,
                         const int64_t *__restrict__ n_rows_dev, int64_t word_stride,
                         VisibleRows visible) {
    dev::wait_for_previous_kernels();
    n_rows = scores_token(q, rows, scores, n_rows, n_heads, d, n_rows_dev, word_stride);
    const int64_t j0 = int64_t(blockIdx.x) * kStagedRows, h0 = int64_t(blockIdx.y) * kStagedHeads;
    if (j0 >= n_rows) return;
    extern __shared__ float4 scores_smem[];
    const int ld = int(d) + 4;  // a staged row's floats: fragment lanes 4 banks apart per row
    float *sq = reinterpret_cast<float *>(scores_smem), *sr = sq + kStagedHeads * ld;
    __shared__ const float *row_at[kStagedRows];
    const int n_valid = int(min(int64_t(kStagedRows), n_rows - j0));
    const int h_valid = int(min(int64_t(kStagedHeads), n_heads - h0));
    const int vecs = int(d / 4), n_stages = int((d + kStageDims - 1) / kStageDims);
    constexpr int kStageVecs = kStageDims / 4;
    // Stage s of r rows from row(r): 16-byte pieces, zeros past the valid rows.
    const auto issue = [&](float *dst, int n_rows_tile, int valid, int s, auto row) {
        for (int i = int(threadIdx.x); i < n_rows_tile * kStageVecs; i += kThreads) {
            const int r = i / kStageVecs, c = s * kStageVecs + i % kStageVecs;
            if (c >= vecs) continue;
            float *to = dst + r * ld + 4 * c;
            if (r < valid)
                dev::copy_16_async(to, row(r) + 4 * c, true);
            else
                *reinterpret_cast<float4 *>(to) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    };
    const auto q_row = [&](int r) { return q + (h0 + r) * d; };
    const auto kv_row = [&](int r) { return row_at[r]; };
    issue(sq, kStagedHeads, h_valid, 0, q_row);  // q's first stage while the row words are read
    if (threadIdx.x < n_valid) row_at[threadIdx.x] = RowMap(rows, d, visible).row(j0 + threadIdx.x);
    __syncthreads();
    for (int s = 0; s < n_stages; ++s) {
        if (s > 0) issue(sq, kStagedHeads, h_valid, s, q_row);
        issue(sr, kStagedRows, n_valid, s, kv_row);
        dev::commit_async_copies();
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int wm = warp % 4, wn = warp / 4;
    const float *a = sq + (8 * wm + g) * ld + c, *b = sr + (8 * wn + g) * ld + c;
    double acc[2] = {};
    for (int s = 0; s < n_stages; ++s) {
        dev::wait_async_copies(n_stages - 1 - s);
        __syncthreads();
        const int k_end = int(min(d, int64_t(s + 1) * kStageDims));
#pragma unroll 8
        for (int k = s * kStageDims; k < k_end; k += 4)
            dev::mma_f64(acc, double(a[k]), double(b[k]));
    }
    const int h = 8 * wm + g;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int j = 8 * wn + 2 * c + i;
        if (h < h_valid && j < n_valid)
            scores[(h0 + h) * n_rows + j0 + j] = static_cast<float>(acc[i]);
    }
}

constexpr int kMixThreads = kThreads;
constexpr int kMixStage = 8192;  // floats of rows staged at a time (32 KiB)

// A block mixes 8 HPW heads (warp i: heads h0 + HPW i ..) for 32 W output dims (lane l: dims
// d0 + l + 32 w, w < W): the grid is head groups x dim slices x tokens. Each block computes its
// heads' max, e_j and denominators itself (the dim slices repeat that small work rather than
// wait for one another): W = 1, HPW = 1 gives a one-token step 128 blocks. A tile of rows at a
// time, the block stages e (per head) and the rows' dims in shared memory, every thread loading
// its share at once (the loads overlap), then each lane adds over the tile's rows in order, as
// on the CPU: the denominator (by every lane of its head's warp: the same sum) and its output
// dims. W and HPW change which lane computes an output, not its arithmetic.
template <int W, int HPW>
__global__ void __launch_bounds__(kMixThreads)
    mix_kernel(const float *__restrict__ scores, const float *__restrict__ rows, int64_t n_rows,
               const float *__restrict__ sinks, float scale, int64_t n_heads, int64_t d,
               float *__restrict__ o, const int64_t *__restrict__ n_rows_dev, int64_t word_stride,
               VisibleRows visible, MixRopeQ8_0 rope_q8_0) {
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
    __shared__ const float *row_at[kTile];  // the tile's rows
    const RowMap map(rows, d, visible);
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
        for (int j = threadIdx.x; j < n; j += kMixThreads) row_at[j] = map.row(j0 + j);
        __syncthreads();
#pragma unroll
        for (int u = 0; u < HPW; ++u)
            if (head[u])
                for (int j = lane; j < n; j += 32)
                    e[HPW * warp + u][j] =
                        dev::exp_f(__fsub_rn(__fmul_rn(sc[u][j0 + j], scale), mx[u]));
        for (int i = threadIdx.x; i < n * kDims; i += kMixThreads) {
            const int j = i / kDims, c = i % kDims;
            v[j][c] = d0 + c < d ? __ldg(row_at[j] + d0 + c) : 0.0f;
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
    if constexpr (W == 1 && HPW == 1) {
        if (rope_q8_0.xq) {  // the warp holds one Q8_0 block of its head: lane l, dim d0 + l
            if (!head[0] || d0 >= d) return;  // the same for the whole warp (d % 32 == 0)
            const int64_t dim = d0 + lane;
            const float v =
                dev::rope_pair_lanes(__fdiv_rn(acc[0][0], den[0]), dim, d - 2 * rope_q8_0.n_freq,
                                     rope_q8_0.freqs, *rope_q8_0.pos, true);
            o[h0 * d + dim] = v;
            dev::quantize_q8_0_lane(v, rope_q8_0.xq + h0 * d + d0,
                                    rope_q8_0.xd + (h0 * d + d0) / 32);
            return;
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

// One token's mix with its rows in flight ahead of use: mix_kernel<1, 1>'s blocks, warps and
// arithmetic (warp w: head h0 + w, lane l: dim d0 + l, the same sums in row order, so the same
// bits), but a tile of 256 rows (their 32 dims of the block) and its 8 heads' scores come by
// cp.async into one of two buffers, all of a thread's pieces at once, the next tile's while this
// one is summed; the max reads 8 scores a lane at a time. mix_kernel staged each tile through
// registers in a loop, a few loads in flight, a round trip to memory after another. d % 32 == 0.
constexpr int kStagedTile = 256;
constexpr size_t kStagedMixSmem = sizeof(float) * 2 * kStagedTile * (32 + kWarps);

__global__ void __launch_bounds__(kMixThreads)
    mix_staged_kernel(const float *__restrict__ scores, const float *__restrict__ rows,
                      int64_t n_rows, const float *__restrict__ sinks, float scale, int64_t n_heads,
                      int64_t d, float *__restrict__ o, const int64_t *__restrict__ n_rows_dev,
                      VisibleRows visible, MixRopeQ8_0 rope_q8_0) {
    dev::wait_for_previous_kernels();
    if (n_rows_dev) n_rows = *n_rows_dev;
    extern __shared__ float4 mix_staged_smem[];
    float *v_buf = reinterpret_cast<float *>(mix_staged_smem);  // [2][kStagedTile][32]
    float *s_buf = v_buf + 2 * kStagedTile * 32;                // [2][kWarps][kStagedTile]
    const RowMap map(rows, d, visible);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t h0 = int64_t(blockIdx.x) * kWarps, h = h0 + warp;
    const int64_t d0 = int64_t(blockIdx.y) * 32;
    const bool head = h < n_heads;
    const int64_t n_tiles = (n_rows + kStagedTile - 1) / kStagedTile;
    // Tile t into buffer t % 2: thread i copies the 16-byte piece i % 8 of rows i / 8 + 32 u and
    // the score of row i of the block's heads u (u < 8); one group a tile, empty past the last.
    const auto issue = [&](int64_t t) {
        if (t < n_tiles) {
            const int64_t j0 = t * kStagedTile;
            const int n = int(min(int64_t(kStagedTile), n_rows - j0));
            float *v = v_buf + (t % 2) * kStagedTile * 32,
                  *sc = s_buf + (t % 2) * kWarps * kStagedTile;
            const int piece = int(threadIdx.x) % 8;
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int r = int(threadIdx.x) / 8 + 32 * u;
                float *to = v + r * 32 + 4 * piece;
                if (r < n)
                    dev::copy_16_async(to, map.row(j0 + r) + d0 + 4 * piece, true);
                else
                    *reinterpret_cast<float4 *>(to) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < kWarps; ++u) {
                const int j = int(threadIdx.x);
                if (j < n && h0 + u < n_heads)
                    dev::copy_4_async(sc + u * kStagedTile + j,
                                      scores + (h0 + u) * n_rows + j0 + j);
            }
        }
        dev::commit_async_copies();
    };
    issue(0);
    issue(1);
    // 1. m = max(sink, max_j s_j scale) (a max does not depend on the order).
    float mx = head ? sinks[h] : 0.0f;
    if (head) {
        const float *sc = scores + h * n_rows;
        for (int64_t j = lane; j < n_rows; j += 32 * 8) {
            float s[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) s[u] = j + 32 * u < n_rows ? __ldg(sc + j + 32 * u) : 0.0f;
#pragma unroll
            for (int u = 0; u < 8; ++u)
                if (j + 32 * u < n_rows) {
                    const float x = __fmul_rn(s[u], scale);
                    mx = mx < x ? x : mx;
                }
        }
    }
    for (int off = 16; off > 0; off /= 2) {
        const float other = __shfl_xor_sync(0xffffffffu, mx, off);
        mx = mx < other ? other : mx;
    }
    float den = head ? dev::exp_f(__fsub_rn(sinks[h], mx)) : 0.0f, acc = 0.0f;
    // 2. per tile: e_j = exp(s_j scale - m) in place of the staged scores, then the sums in
    // row order.
    for (int64_t t = 0; t < n_tiles; ++t) {
        dev::wait_async_copies(1);  // every group but the next tile's
        __syncthreads();
        const int n = int(min(int64_t(kStagedTile), n_rows - t * kStagedTile));
        const float *v = v_buf + (t % 2) * kStagedTile * 32;
        float *e = s_buf + (t % 2) * kWarps * kStagedTile + warp * kStagedTile;
        if (head) {
            for (int j = lane; j < n; j += 32)
                e[j] = dev::exp_f(__fsub_rn(__fmul_rn(e[j], scale), mx));
            __syncwarp();
#pragma unroll 4
            for (int j = 0; j < n; ++j) {
                const float ej = e[j];
                den = __fadd_rn(den, ej);
                acc = __fadd_rn(acc, __fmul_rn(ej, v[j * 32 + lane]));
            }
        }
        __syncthreads();  // this buffer is consumed
        issue(t + 2);
    }
    if (!head) return;
    const int64_t dim = d0 + lane;
    if (rope_q8_0.xq) {  // the warp holds one Q8_0 block of its head: lane l, dim d0 + l
        const float v = dev::rope_pair_lanes(__fdiv_rn(acc, den), dim, d - 2 * rope_q8_0.n_freq,
                                             rope_q8_0.freqs, *rope_q8_0.pos, true);
        o[h * d + dim] = v;
        dev::quantize_q8_0_lane(v, rope_q8_0.xq + h * d + d0, rope_q8_0.xd + (h * d + d0) / 32);
        return;
    }
    o[h * d + dim] = __fdiv_rn(acc, den);
}

// A batch's mix: a block takes 32 heads and all d <= 512 dims. Warp w computes the 8 heads
// 8 (w / 2) .. + 7 of the block's for the dims of half w % 2 (lane l: dims 256 (w % 2) + 128 i
// + 4 l .. + 3, i < 2, so that a lane reads a row's values as float4s and each instruction of a
// warp reads 512 contiguous bytes); each value read serves 8 heads (the float adds and
// multiplies, not shared memory, are then the limit). Rows come 32 at a time, staged with 8 of
// a thread's float4 loads in flight at once; e_j of the 8 heads is two float4s in shared memory
// (the two warps of a head group compute 4 heads each). Each output is the CPU's sum over rows in
// row order, as mix_kernel computes it (the same operations; which lane computes an output
// differs).
constexpr int kBatchHeads = 8, kBatchRows = 32, kBatchDims = 512;
constexpr size_t kBatchSmem =
    sizeof(float) * (kBatchRows * kBatchDims + kWarps / 2 * kBatchRows * kBatchHeads);

__global__ void __launch_bounds__(kMixThreads, 2)
    mix_batch_kernel(const float *__restrict__ scores, const float *__restrict__ rows,
                     int64_t n_rows, const float *__restrict__ sinks, float scale, int64_t n_heads,
                     int64_t d, float *__restrict__ o, const int64_t *__restrict__ n_rows_dev,
                     int64_t word_stride) {
    constexpr int HPW = kBatchHeads, kDimVecs = kBatchDims / 256, kRowVecs = kBatchDims / 4;
    dev::wait_for_previous_kernels();
    {  // the token of a batch (AttentionTokens)
        const int64_t t = blockIdx.y;
        scores += t * n_heads * n_rows, rows += t * n_rows * d, o += t * n_heads * d;
        if (n_rows_dev) n_rows_dev += t * word_stride;
    }
    if (n_rows_dev) n_rows = *n_rows_dev;
    extern __shared__ float4 mix_smem[];
    float4 *v = mix_smem;                          // [kBatchRows][kRowVecs]
    float4 *e = mix_smem + kBatchRows * kRowVecs;  // [head group][kBatchRows][2]: 8 heads each
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = warp / 2, half = warp % 2;
    const int64_t h0 = (int64_t(blockIdx.x) * (kWarps / 2) + group) * HPW;
    const int dv = int(d / 4);                                                // float4s of a row
    const int heads = int(max(int64_t(0), min(int64_t(HPW), n_heads - h0)));  // of this warp
    const float *sc = scores + min(h0, n_heads - 1) * n_rows;  // head h0 + u at + u n_rows
    float den[HPW], acc[HPW][kDimVecs][4];
    float mx[HPW / 2];  // of the 4 heads whose e this warp computes: 4 half + u
#pragma unroll
    for (int u = 0; u < HPW; ++u) {
        // 1. m = max(sink, max_j s_j scale) (a max does not depend on the order).
        float m = u < heads ? sinks[h0 + u] : 0.0f;
        if (u < heads)
            for (int64_t j = lane; j < n_rows; j += 32) {
                const float s = __fmul_rn(sc[u * n_rows + j], scale);
                m = m < s ? s : m;
            }
        for (int off = 16; off > 0; off /= 2) {
            const float other = __shfl_xor_sync(0xffffffffu, m, off);
            m = m < other ? other : m;
        }
        if (u / 4 == half) mx[u % 4] = m;
        den[u] = u < heads ? dev::exp_f(__fsub_rn(sinks[h0 + u], m)) : 0.0f;
#pragma unroll
        for (int i = 0; i < kDimVecs; ++i)
#pragma unroll
            for (int k = 0; k < 4; ++k) acc[u][i][k] = 0.0f;
    }
    // 2. per tile: e_j = exp(s_j scale - m) and the rows' values, then the sums in row order.
    for (int64_t j0 = 0; j0 < n_rows; j0 += kBatchRows) {
        const int n = int(min(int64_t(kBatchRows), n_rows - j0));
        __syncthreads();  // the previous tile is consumed
#pragma unroll
        for (int part = 0; part < 2; ++part) {  // 8 loads in flight a thread, twice
            constexpr int kPerThread = kBatchRows * kRowVecs / kMixThreads / 2;
            float4 staged[kPerThread];
#pragma unroll
            for (int p = 0; p < kPerThread; ++p) {
                const int i = int(threadIdx.x) + kMixThreads * (p + kPerThread * part);
                const int j = i / kRowVecs, c = i % kRowVecs;
                staged[p] = j < n && c < dv
                                ? __ldg(reinterpret_cast<const float4 *>(rows + (j0 + j) * d) + c)
                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int p = 0; p < kPerThread; ++p)
                v[int(threadIdx.x) + kMixThreads * (p + kPerThread * part)] = staged[p];
        }
        if (lane < n) {
            float ej[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int h = 4 * half + u;
                ej[u] =
                    h < heads
                        ? dev::exp_f(__fsub_rn(__fmul_rn(sc[h * n_rows + j0 + lane], scale), mx[u]))
                        : 0.0f;
            }
            e[(group * kBatchRows + lane) * 2 + half] = make_float4(ej[0], ej[1], ej[2], ej[3]);
        }
        __syncthreads();
        if (heads > 0)
            for (int j = 0; j < n; ++j) {
                const float4 ea = e[(group * kBatchRows + j) * 2],
                             eb = e[(group * kBatchRows + j) * 2 + 1];
                const float ej[HPW] = {ea.x, ea.y, ea.z, ea.w, eb.x, eb.y, eb.z, eb.w};
#pragma unroll
                for (int u = 0; u < HPW; ++u) den[u] = __fadd_rn(den[u], ej[u]);
#pragma unroll
                for (int i = 0; i < kDimVecs; ++i) {
                    const float4 x4 = v[j * kRowVecs + 64 * half + 32 * i + lane];
                    const float x[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
                    for (int u = 0; u < HPW; ++u)
#pragma unroll
                        for (int k = 0; k < 4; ++k)
                            acc[u][i][k] = __fadd_rn(acc[u][i][k], __fmul_rn(ej[u], x[k]));
                }
            }
    }
#pragma unroll
    for (int u = 0; u < HPW; ++u)
#pragma unroll
        for (int i = 0; i < kDimVecs; ++i)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int64_t dim = 4 * (64 * half + 32 * i + lane) + k;
                if (u < heads && dim < d) o[(h0 + u) * d + dim] = __fdiv_rn(acc[u][i][k], den[u]);
            }
}

template <int W, int HPW>
void launch_mix(float *scores, const float *rows, int64_t n_rows, const float *sinks, float scale,
                int64_t n_heads, int64_t d, float *o, cudaStream_t stream,
                const int64_t *n_rows_dev, AttentionTokens tokens, const VisibleRows &visible = {},
                const MixRopeQ8_0 &rope_q8_0 = {}) {
    const dim3 grid(unsigned((n_heads + kWarps * HPW - 1) / (kWarps * HPW)),
                    unsigned((d + 32 * W - 1) / (32 * W)), unsigned(tokens.n));
    launch_kernel(mix_kernel<W, HPW>, grid, kMixThreads, 0, stream, scores, rows, n_rows, sinks,
                  scale, n_heads, d, o, n_rows_dev, tokens.word_stride, visible, rope_q8_0);
}

}  // namespace

void attention_scores(const float *q, const float *rows, int64_t n_rows, int64_t n_heads, int64_t d,
                      float *scores, cudaStream_t stream, const int64_t *n_rows_dev,
                      AttentionTokens tokens, const VisibleRows *visible) {
    if (d <= 0 || d % 32 != 0)
        throw ds4::Error("attention_scores: head size must be a positive multiple of 32");
    if (tokens.n < 1 || tokens.n > 65535)
        throw ds4::Error("attention_scores: 1 to 65535 tokens a launch");
    if (visible && (tokens.n != 1 || !visible->ring || !visible->words || visible->window < 1))
        throw ds4::Error("attention_scores: rows in place for one token, with their words");
    if (n_rows == 0 || n_heads == 0) return;
    const VisibleRows in_place = visible ? *visible : VisibleRows{};
    // The staged kernel takes more shared memory than a static array may have: what d =
    // kStagedMaxD needs, or the device's opt-in limit where that is less (a larger d then takes
    // the register kernel).
    static PerDevice<size_t> staged_smem;
    const size_t staged_smem_limit = staged_smem.get([] {
        int optin = 0;
        DS4_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                              current_device()));
        const size_t limit = std::min(staged_scores_smem(kStagedMaxD), size_t(optin));
        DS4_CUDA_CHECK(cudaFuncSetAttribute(
            scores_staged_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(limit)));
        return limit;
    });
    // One token wants many blocks (16 rows each) and all of their loads in flight; a batch has
    // blocks enough and reads q less often.
    if (tokens.n < 4 && d <= kStagedMaxD && staged_scores_smem(d) <= staged_smem_limit &&
        staged_attention_enabled()) {
        const dim3 grid(unsigned((n_rows + kStagedRows - 1) / kStagedRows),
                        unsigned((n_heads + kStagedHeads - 1) / kStagedHeads), unsigned(tokens.n));
        launch_kernel(scores_staged_kernel, grid, kThreads, staged_scores_smem(d), stream, q, rows,
                      n_rows, n_heads, d, scores, n_rows_dev, tokens.word_stride, in_place);
    } else if (tokens.n >= 4)
        launch_scores<4>(q, rows, n_rows, n_heads, d, scores, stream, n_rows_dev, tokens, in_place);
    else
        launch_scores<1>(q, rows, n_rows, n_heads, d, scores, stream, n_rows_dev, tokens, in_place);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void attention_mix(float *scores, const float *rows, int64_t n_rows, const float *sinks,
                   float scale, int64_t n_heads, int64_t d, float *o, cudaStream_t stream,
                   const int64_t *n_rows_dev, AttentionTokens tokens, const VisibleRows *visible,
                   const MixRopeQ8_0 *rope_q8_0) {
    if (d < 1) throw ds4::Error("attention_mix: head size must be at least 1");
    if (tokens.n < 1 || tokens.n > 65535)
        throw ds4::Error("attention_mix: 1 to 65535 tokens a launch");
    if (visible && (tokens.n != 1 || !visible->ring || !visible->words || visible->window < 1))
        throw ds4::Error("attention_mix: rows in place for one token, with their words");
    if (rope_q8_0 && (tokens.n != 1 || d % 32 != 0 || 2 * rope_q8_0->n_freq > d || !rope_q8_0->xq ||
                      !rope_q8_0->xd || !rope_q8_0->pos))
        throw ds4::Error("attention_mix: the rotation and Q8_0 output for one token, d % 32 == 0");
    if (n_heads == 0) return;
    // A batch has blocks enough with whole heads; one token wants the dim slices.
    if (tokens.n >= 4 && d > 256 && d <= kBatchDims && d % 4 == 0) {
        static PerDevice<bool> sized;  // more shared memory than a static array may have
        sized.get([] {
            DS4_CUDA_CHECK(cudaFuncSetAttribute(
                mix_batch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kBatchSmem)));
            return true;
        });
        constexpr int64_t kBlockHeads = kWarps / 2 * kBatchHeads;
        const dim3 grid(unsigned((n_heads + kBlockHeads - 1) / kBlockHeads), unsigned(tokens.n));
        launch_kernel(mix_batch_kernel, grid, kMixThreads, kBatchSmem, stream, scores, rows, n_rows,
                      sinks, scale, n_heads, d, o, n_rows_dev, tokens.word_stride);
    } else if (tokens.n >= 4 && d > 64) {
        launch_mix<4, 2>(scores, rows, n_rows, sinks, scale, n_heads, d, o, stream, n_rows_dev,
                         tokens);
    } else if (tokens.n == 1 && d % 32 == 0 && staged_attention_enabled()) {
        static PerDevice<bool> sized;
        sized.get([] {
            DS4_CUDA_CHECK(cudaFuncSetAttribute(mix_staged_kernel,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                int(kStagedMixSmem)));
            return true;
        });
        const dim3 grid(unsigned((n_heads + kWarps - 1) / kWarps), unsigned(d / 32));
        launch_kernel(mix_staged_kernel, grid, kMixThreads, kStagedMixSmem, stream, scores, rows,
                      n_rows, sinks, scale, n_heads, d, o, n_rows_dev,
                      visible ? *visible : VisibleRows{}, rope_q8_0 ? *rope_q8_0 : MixRopeQ8_0{});
    } else {  // one token (the only launches that take visible and rope_q8_0: checked above)
        launch_mix<1, 1>(scores, rows, n_rows, sinks, scale, n_heads, d, o, stream, n_rows_dev,
                         tokens, visible ? *visible : VisibleRows{},
                         rope_q8_0 ? *rope_q8_0 : MixRopeQ8_0{});
    }
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
