#pragma once
// Float-format products (F32, F16 and BF16 weights, f32 activations) on the double-precision
// tensor cores (mma.sync m8n8k4 f64, mma_f64.cuh), in one order of additions for a token whether
// it is alone (decode) or one of a batch (prefill): each token's outputs have the same bits
// either way, and a batch is a tensor-core product instead of a loop of double FMAs.
//
// Every product w x is exact in double (at most 24 by 24 significand bits), as on the CPU. The
// order of the additions:
//   - k is cut into chunks of 32 values (the tail past k is zeros). In chunk q, mma step j
//     (0..7) takes the four k positions 32 q + 8 c + j, c = 0..3: the fragment's column c is
//     read by its lanes as 8 consecutive values, one for each step;
//   - the chunks are cut into spans of span_chunks consecutive chunks (float_spans: a function
//     of the matrix's shape only); a span's sum is its chain of mma steps, from zero;
//   - an output is its spans' sums added in span order in double, then rounded to f32 once.
// One token's product (float_mma_decode_warp) spreads a matrix's (row tile, span) pairs over
// warps, each warp a span's chain for 8 rows; the last warp of a row tile to arrive adds the
// spans' sums, left in memory, in order. A batch's block (float_mma_batch_kernel) walks every
// span of its tile of rows and tokens, adding each span's sum to a running total as it ends.
// Lane (g, c) = (lane / 4, lane % 4) holds the fragments' row g (of A) or column g (of B) at
// position c, and the outputs D[g][2 c], D[g][2 c + 1] (the PTX ISA's m8n8k4 .f64 layout).
#include <algorithm>
#include <cstdint>

#include "backend/cuda/float_weights.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma_f64.cuh"

namespace ds4::cuda {

constexpr int kFloatChunk = 32;          // k values a chunk (8 mma steps of 4)
constexpr int kFloatTileRows = 8;        // rows of an mma tile
constexpr int kFloatDecodeWarps = 4096;  // a decode product's warps wanted: ~31 a multiprocessor
constexpr int kFloatMaxSpans = 64;

struct FloatSpans {
    int64_t chunks = 0, span_chunks = 0, spans = 0, row_tiles = 0;
};

// The spans of a matrix: as many as give a decode product ~kFloatDecodeWarps warps, each span
// at least 4 chunks (a warp's loads in flight), at most kFloatMaxSpans.
inline FloatSpans float_spans(int64_t n_rows, int64_t k) {
    FloatSpans sp;
    sp.chunks = (k + kFloatChunk - 1) / kFloatChunk;
    sp.row_tiles = (n_rows + kFloatTileRows - 1) / kFloatTileRows;
    const int64_t want =
        (kFloatDecodeWarps + sp.row_tiles - 1) / std::max<int64_t>(sp.row_tiles, 1);
    const int64_t most = std::clamp<int64_t>(sp.chunks / 4, 1, kFloatMaxSpans);
    const int64_t spans = std::clamp<int64_t>(want, 1, most);
    sp.span_chunks = (sp.chunks + spans - 1) / spans;
    sp.spans = (sp.chunks + sp.span_chunks - 1) / sp.span_chunks;
    return sp;
}

namespace dev {

constexpr int kFloatDecodeInFlight = 4;  // chunks a decode warp loads before its mma steps

// One token's product, warp `warp_index` of a matrix's row_tiles * spans: rows rt * 8 ..
// rt * 8 + 7 over span s. With one span the warp writes y; otherwise it leaves its 8 sums in
// partial[(rt * 8 + g) * spans + s], and the last warp of the row tile to arrive (its counter,
// zero before and left zero) adds them in span order.
template <GgmlType T>
__device__ __forceinline__ void float_mma_decode_warp(
    const void *__restrict__ w, int64_t n_rows, int64_t k, const FloatSpans &sp, int64_t warp_index,
    const float *__restrict__ x, float *__restrict__ y, double *__restrict__ partial,
    unsigned *__restrict__ counters) {
    constexpr int U = kFloatDecodeInFlight;
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int64_t rt = warp_index % sp.row_tiles, s = warp_index / sp.row_tiles;
    const int64_t row = rt * kFloatTileRows + g;
    const char *wrow =
        static_cast<const char *>(w) + min(row, n_rows - 1) * k * Weights8<T>::kBytes;
    const int64_t q_begin = s * sp.span_chunks;
    const int64_t q_end = min(sp.chunks, q_begin + sp.span_chunks);
    double d[2] = {0.0, 0.0};
    for (int64_t q0 = q_begin; q0 < q_end; q0 += U) {
        float wv[U][8], xv[U][8];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t pos = (q0 + u) * kFloatChunk + 8 * c;
            const bool in = q0 + u < q_end && pos < k;
            if (in)
                Weights8<T>::load(wrow, pos, wv[u]);
            else
#pragma unroll
                for (int v = 0; v < 8; ++v) wv[u][v] = 0.0f;
            if (in && g == 0) {  // B's column 0 is the token; columns 1-7 are zeros
                const float4 a = __ldg(reinterpret_cast<const float4 *>(x + pos));
                const float4 b = __ldg(reinterpret_cast<const float4 *>(x + pos) + 1);
                xv[u][0] = a.x, xv[u][1] = a.y, xv[u][2] = a.z, xv[u][3] = a.w;
                xv[u][4] = b.x, xv[u][5] = b.y, xv[u][6] = b.z, xv[u][7] = b.w;
            } else {
#pragma unroll
                for (int v = 0; v < 8; ++v) xv[u][v] = 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (q0 + u >= q_end) break;  // the same for the whole warp
#pragma unroll
            for (int j = 0; j < 8; ++j) mma_f64(d, double(wv[u][j]), double(xv[u][j]));
        }
    }
    // Lane (g, 0) holds row g's span sum in d[0].
    if (sp.spans == 1) {
        if (c == 0 && row < n_rows) y[row] = static_cast<float>(d[0]);
        return;
    }
    if (c == 0) partial[row * sp.spans + s] = d[0];
    // The threadfence reduction pattern: the sums are visible device-wide before the warp's
    // arrival is counted.
    __threadfence();
    __syncwarp();
    unsigned last = 0;
    if (lane == 0) last = atomicAdd(counters + rt, 1u) == unsigned(sp.spans - 1);
    if (!__shfl_sync(0xffffffffu, last, 0)) return;
    // Lane (g, c) loads row g's sums of spans c, c + 4, ... (kGather of them a round trip, all
    // in flight), and lane (g, 0) adds them in span order from its row's four lanes.
    constexpr int kGather = 8;
    const double *p = partial + row * sp.spans;
    double v = 0.0;
    for (int64_t s0 = 0; s0 < sp.spans; s0 += 4 * kGather) {
        double got[kGather];
#pragma unroll
        for (int i = 0; i < kGather; ++i) {
            const int64_t si = s0 + 4 * i + c;
            got[i] = si < sp.spans ? __ldcg(p + si) : 0.0;
        }
#pragma unroll
        for (int i = 0; i < kGather; ++i)
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) {
                const double t = __shfl_sync(0xffffffffu, got[i], (lane & ~3) + cc);
                const int64_t si = s0 + 4 * i + cc;  // the same for the whole warp
                if (si < sp.spans) v = si == 0 ? t : v + t;
            }
    }
    if (c == 0 && row < n_rows) y[row] = static_cast<float>(v);
    if (lane == 0) counters[rt] = 0;
}

}  // namespace dev

// A batch's tile: WM x WN warps, each TM row tiles by TN token tiles of 8; every chunk's weights
// and activations are converted to double once for the block and staged in shared memory in
// fragment order (a fragment is 32 consecutive doubles: two wavefronts, no bank conflict), two
// stages, the next chunk's loads in flight while the current one is multiplied.
template <int WM, int WN, int TM, int TN>
struct FloatBatchTile {
    static constexpr int kThreads = 32 * WM * WN;
    static constexpr int kRows = kFloatTileRows * TM * WM, kTokens = 8 * TN * WN;
    static constexpr int kFragment = 8 * 32;  // doubles of a tile's 8 steps of one chunk
    static constexpr int kStageDoubles = (kRows + kTokens) / 8 * kFragment;
    static constexpr size_t kSmemBytes = 2 * size_t(kStageDoubles) * sizeof(double);
    static constexpr int kAPieces = kRows * 4, kBPieces = kTokens * 4;  // 8 values a piece
    static constexpr int kAPerThread = (kAPieces + kThreads - 1) / kThreads;
    static constexpr int kBPerThread = (kBPieces + kThreads - 1) / kThreads;
};

// Y (m x n_rows) = X (m x k) W^T: block (x, y) takes rows x * kRows.. and tokens y * kTokens..
template <GgmlType T, int WM, int WN, int TM, int TN>
__global__ void __launch_bounds__(32 * WM * WN, 1)
    float_mma_batch_kernel(const void *__restrict__ w, int64_t n_rows, int64_t k, FloatSpans sp,
                           const float *__restrict__ X, int64_t m, float *__restrict__ Y) {
    dev::wait_for_previous_kernels();
    using Tile = FloatBatchTile<WM, WN, TM, TN>;
    extern __shared__ double float_stage[];  // [2][kRows / 8 + kTokens / 8][8 steps][32 lanes]
    const int64_t row0 = int64_t(blockIdx.x) * Tile::kRows,
                  tok0 = int64_t(blockIdx.y) * Tile::kTokens;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int wm = warp % WM, wn = warp / WM;
    float wa[Tile::kAPerThread][8], xb[Tile::kBPerThread][8];
    // Piece p of A: row p / 4, values 8 (p % 4) of the chunk; of B: token p / 4, the same.
    const auto fetch = [&](int64_t q) {
#pragma unroll
        for (int i = 0; i < Tile::kAPerThread; ++i) {
            const int p = threadIdx.x + i * Tile::kThreads;
            const int64_t pos = q * kFloatChunk + 8 * (p % 4);
            if (p < Tile::kAPieces && pos < k) {
                const int64_t row = min(row0 + p / 4, n_rows - 1);
                dev::Weights8<T>::template load<false>(
                    static_cast<const char *>(w) + row * k * dev::Weights8<T>::kBytes, pos, wa[i]);
            } else {
#pragma unroll
                for (int v = 0; v < 8; ++v) wa[i][v] = 0.0f;
            }
        }
#pragma unroll
        for (int i = 0; i < Tile::kBPerThread; ++i) {
            const int p = threadIdx.x + i * Tile::kThreads;
            const int64_t pos = q * kFloatChunk + 8 * (p % 4);
            if (p < Tile::kBPieces && pos < k) {
                const float *xs = X + min(tok0 + p / 4, m - 1) * k + pos;
                const float4 a = __ldg(reinterpret_cast<const float4 *>(xs));
                const float4 b = __ldg(reinterpret_cast<const float4 *>(xs) + 1);
                xb[i][0] = a.x, xb[i][1] = a.y, xb[i][2] = a.z, xb[i][3] = a.w;
                xb[i][4] = b.x, xb[i][5] = b.y, xb[i][6] = b.z, xb[i][7] = b.w;
            } else {
#pragma unroll
                for (int v = 0; v < 8; ++v) xb[i][v] = 0.0f;
            }
        }
    };
    // Value j of piece p goes to step j of its tile, at lane (p / 4 % 8) * 4 + p % 4 = p % 32.
    const auto store = [&](double *stage) {
#pragma unroll
        for (int i = 0; i < Tile::kAPerThread; ++i) {
            const int p = threadIdx.x + i * Tile::kThreads;
            if (p >= Tile::kAPieces) break;
            double *dst = stage + (p / 32) * Tile::kFragment + p % 32;
#pragma unroll
            for (int j = 0; j < 8; ++j) dst[j * 32] = double(wa[i][j]);
        }
        double *b_stage = stage + Tile::kRows / 8 * Tile::kFragment;
#pragma unroll
        for (int i = 0; i < Tile::kBPerThread; ++i) {
            const int p = threadIdx.x + i * Tile::kThreads;
            if (p >= Tile::kBPieces) break;
            double *dst = b_stage + (p / 32) * Tile::kFragment + p % 32;
#pragma unroll
            for (int j = 0; j < 8; ++j) dst[j * 32] = double(xb[i][j]);
        }
    };
    double acc[TM][TN][2], total[TM][TN][2];
#pragma unroll
    for (int a = 0; a < TM; ++a)
#pragma unroll
        for (int b = 0; b < TN; ++b)
            acc[a][b][0] = acc[a][b][1] = total[a][b][0] = total[a][b][1] = 0.0;
    fetch(0);
    store(float_stage);
    __syncthreads();
    for (int64_t q = 0; q < sp.chunks; ++q) {
        const double *cur = float_stage + (q & 1) * Tile::kStageDoubles;
        const double *cur_b = cur + Tile::kRows / 8 * Tile::kFragment;
        if (q + 1 < sp.chunks) fetch(q + 1);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            double a[TM], b[TN];
#pragma unroll
            for (int tm = 0; tm < TM; ++tm)
                a[tm] = cur[(wm * TM + tm) * Tile::kFragment + j * 32 + lane];
#pragma unroll
            for (int tn = 0; tn < TN; ++tn)
                b[tn] = cur_b[(wn * TN + tn) * Tile::kFragment + j * 32 + lane];
#pragma unroll
            for (int tm = 0; tm < TM; ++tm)
#pragma unroll
                for (int tn = 0; tn < TN; ++tn) dev::mma_f64(acc[tm][tn], a[tm], b[tn]);
        }
        if ((q + 1) % sp.span_chunks == 0 || q + 1 == sp.chunks) {  // a span ends
            const bool first = q < sp.span_chunks;
#pragma unroll
            for (int a = 0; a < TM; ++a)
#pragma unroll
                for (int b = 0; b < TN; ++b)
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        total[a][b][i] = first ? acc[a][b][i] : total[a][b][i] + acc[a][b][i];
                        acc[a][b][i] = 0.0;
                    }
        }
        if (q + 1 < sp.chunks) store(float_stage + ((q + 1) & 1) * Tile::kStageDoubles);
        __syncthreads();
    }
#pragma unroll
    for (int tm = 0; tm < TM; ++tm) {
        const int64_t row = row0 + (wm * TM + tm) * kFloatTileRows + g;
        if (row >= n_rows) continue;
#pragma unroll
        for (int tn = 0; tn < TN; ++tn)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int64_t tok = tok0 + (wn * TN + tn) * 8 + 2 * c + i;
                if (tok < m) Y[tok * n_rows + row] = static_cast<float>(total[tm][tn][i]);
            }
    }
}

}  // namespace ds4::cuda
