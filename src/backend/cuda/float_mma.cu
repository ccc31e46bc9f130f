#include <algorithm>
#include <mutex>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/float_mma.cuh"
#include "backend/cuda/float_mma.h"
#include "backend/cuda/launch.cuh"
#include "common/error.h"

namespace ds4::cuda {
namespace {

// ---- one token: float_mma.cuh's order, a warp a (row tile, span) ----

constexpr int kDecodeThreads = 256, kDecodeWarpsPerBlock = kDecodeThreads / 32;

__host__ __device__ int64_t decode_warps(const FloatSpans &sp) {
    return sp.row_tiles * sp.spans;
}
int64_t decode_blocks(const FloatSpans &sp) {
    return (decode_warps(sp) + kDecodeWarpsPerBlock - 1) / kDecodeWarpsPerBlock;
}

// A split matrix's scratch: a counter a row tile (kFloatMatvecCounterBytes of them), then its
// spans' sums, a row's spans together.
size_t decode_scratch_bytes(const FloatMatrix &w) {
    const FloatSpans sp = float_spans(w.n_rows, w.k);
    if (sp.spans == 1) return 0;
    return kFloatMatvecCounterBytes +
           size_t(sp.row_tiles) * kFloatTileRows * size_t(sp.spans) * sizeof(double);
}

struct DecodeProduct {
    const void *w;
    float *y;
    double *partial;
    unsigned *counters;
    int64_t n_rows;
    FloatSpans sp;
};

// Products j = 0..n-1 of one x (one when called by matvec_float), each its own blocks from
// first_block[j] on.
struct DecodeProducts {
    DecodeProduct p[kMaxFloatProducts];
    unsigned first_block[kMaxFloatProducts + 1];
    int n;
};

// The doubles a decode block stages (18 KiB): the token's values of up to 64 chunks, padded.
constexpr int64_t kDecodeStagedChunks = 64;
constexpr int kDecodeStageDoubles = int(kDecodeStagedChunks * kFloatChunk * 9 / 8);

// Whether every block of a product's decode stages its chunks: a block's 8 warps take at most
// 8 / row_tiles + 2 spans (warp w: span w / row_tiles).
bool decode_stages(const FloatSpans &sp) {
    const int64_t spans = std::min<int64_t>(sp.spans, kDecodeWarpsPerBlock / sp.row_tiles + 2);
    return spans * sp.span_chunks <= kDecodeStagedChunks;
}

// kStaged (every product's blocks stage; decode_stages): the block converts the token's values
// of the chunks its warps take to double once, in shared memory, and 80 registers leave room for
// 3 blocks a multiprocessor; otherwise each warp converts its own (128 registers).
template <GgmlType T, bool kStaged>
__global__ void __launch_bounds__(kDecodeThreads, kStaged ? 3 : 1)
    float_mma_decode_kernel(const __grid_constant__ DecodeProducts ps, int64_t k,
                            const float *__restrict__ x) {
    dev::wait_for_previous_kernels();
    int j = 0;
    while (j + 1 < ps.n && blockIdx.x >= ps.first_block[j + 1]) ++j;
    const DecodeProduct &p = ps.p[j];
    const int64_t first_warp = int64_t(blockIdx.x - ps.first_block[j]) * kDecodeWarpsPerBlock;
    const int64_t warp = first_warp + threadIdx.x / 32;
    const int64_t last_warp = min(first_warp + kDecodeWarpsPerBlock, decode_warps(p.sp)) - 1;
    if constexpr (kStaged) {
        __shared__ double xs[kDecodeStageDoubles];
        const int64_t q0 = first_warp / p.sp.row_tiles * p.sp.span_chunks;
        const int64_t q1 = min(p.sp.chunks, (last_warp / p.sp.row_tiles + 1) * p.sp.span_chunks);
        for (int64_t i = 4 * threadIdx.x; i < (q1 - q0) * kFloatChunk; i += 4 * kDecodeThreads) {
            const int64_t pos = q0 * kFloatChunk + i;  // k is a multiple of 8: all 4 or none
            const float4 v = pos < k ? __ldg(reinterpret_cast<const float4 *>(x + pos))
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            double *dst = xs + dev::staged_x_index(i);  // 4 of one group of 8: contiguous
            dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
        }
        __syncthreads();
        if (warp > last_warp) return;  // the whole warp
        dev::float_mma_decode_warp<T, true>(p.w, p.n_rows, k, p.sp, warp, x, xs, q0, p.y, p.partial,
                                            p.counters);
    } else {
        if (warp > last_warp) return;
        dev::float_mma_decode_warp<T, false>(p.w, p.n_rows, k, p.sp, warp, x, nullptr, 0, p.y,
                                             p.partial, p.counters);
    }
}

// ---- a batch: float_mma.cuh's tiles ----

// The tile shapes a batch may take, largest first; a batch takes the first that gives the grid
// kBatchBlocks blocks (a wave of an H100's or H200's 132 multiprocessors), or the last.
constexpr int64_t kBatchBlocks = 128;

template <int WM, int WN, int TM, int TN>
struct BatchShape {
    using Tile = FloatBatchTile<WM, WN, TM, TN>;
    static int64_t blocks(int64_t n_rows, int64_t m) {
        return (n_rows + Tile::kRows - 1) / Tile::kRows * ((m + Tile::kTokens - 1) / Tile::kTokens);
    }
    template <GgmlType T>
    static void launch(const FloatMatrix &w, const FloatSpans &sp, const float *X, int64_t m,
                       float *Y, cudaStream_t stream) {
        auto *kernel = float_mma_batch_kernel<T, WM, WN, TM, TN>;
        static std::once_flag once;  // prefill only: never inside a graph capture
        std::call_once(once, [kernel] {
            DS4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                int(Tile::kSmemBytes)));
        });
        const dim3 grid(unsigned((w.n_rows + Tile::kRows - 1) / Tile::kRows),
                        unsigned((m + Tile::kTokens - 1) / Tile::kTokens));
        launch_kernel(kernel, grid, Tile::kThreads, Tile::kSmemBytes, stream, w.data, w.n_rows, w.k,
                      sp, X, m, Y);
    }
};

// (2, 4, 4, 4), 64 rows x 128 tokens, needs 255 registers and spills.
using BatchWide = BatchShape<2, 4, 4, 2>;    // 64 rows x 64 tokens, 64 KiB of stages
using BatchNarrow = BatchShape<2, 4, 4, 1>;  // 64 x 32
using BatchSmall = BatchShape<1, 4, 4, 1>;   // 32 x 32
using BatchTiny = BatchShape<1, 2, 4, 1>;    // 32 x 16: the 24-row mixers

template <GgmlType T>
void launch_batch(const FloatMatrix &w, const float *X, int64_t m, float *Y, cudaStream_t s) {
    const FloatSpans sp = float_spans(w.n_rows, w.k);
    if (BatchWide::blocks(w.n_rows, m) >= kBatchBlocks)
        BatchWide::launch<T>(w, sp, X, m, Y, s);
    else if (BatchNarrow::blocks(w.n_rows, m) >= kBatchBlocks)
        BatchNarrow::launch<T>(w, sp, X, m, Y, s);
    else if (BatchSmall::blocks(w.n_rows, m) >= kBatchBlocks)
        BatchSmall::launch<T>(w, sp, X, m, Y, s);
    else
        BatchTiny::launch<T>(w, sp, X, m, Y, s);
}

}  // namespace

bool float_uses_mma(const FloatMatrix &w) {
    return float_mma_enabled() && w.n_rows >= kFloatMmaMinRows && w.n_rows <= kFloatMmaMaxRows;
}

size_t float_mma_scratch_bytes(const FloatMatrix &w) {
    return decode_scratch_bytes(w);
}

void float_mma_matvec(const FloatMmaProduct *products, int n, const float *x, cudaStream_t stream) {
    DecodeProducts ps{};
    unsigned blocks = 0;
    bool staged = true;
    for (int j = 0; j < n; ++j) {
        const FloatMatrix &w = products[j].w;
        check_float_rows(w.k);
        if (w.n_rows == 0) continue;
        const FloatSpans sp = float_spans(w.n_rows, w.k);
        staged = staged && decode_stages(sp);
        if (sp.spans > 1 && size_t(sp.row_tiles) * sizeof(unsigned) > kFloatMatvecCounterBytes)
            throw ds4::Error("matvec_float: more split row tiles than counters");
        if (sp.spans > 1 && !products[j].scratch)
            throw ds4::Error("matvec_float: this matrix needs scratch");
        char *scratch = static_cast<char *>(products[j].scratch);
        ps.p[ps.n] = {w.data, products[j].y, nullptr, nullptr, w.n_rows, sp};
        if (sp.spans > 1) {  // counters, then the spans' sums (decode_scratch_bytes' layout)
            ps.p[ps.n].counters = reinterpret_cast<unsigned *>(scratch);
            ps.p[ps.n].partial = reinterpret_cast<double *>(scratch + kFloatMatvecCounterBytes);
        }
        ps.first_block[ps.n++] = blocks;
        blocks += unsigned(decode_blocks(sp));
    }
    ps.first_block[ps.n] = blocks;
    if (blocks == 0) return;
    with_float_type(products[0].w.type, "matvec_float", [&](auto type) {
        constexpr GgmlType T = decltype(type)::value;
        launch_kernel(staged ? float_mma_decode_kernel<T, true> : float_mma_decode_kernel<T, false>,
                      blocks, kDecodeThreads, 0, stream, ps, products[0].w.k, x);
    });
    DS4_CUDA_CHECK(cudaGetLastError());
}

void float_mma_matmul(const FloatMatrix &w, const float *X, int64_t m, float *Y,
                      cudaStream_t stream) {
    check_float_rows(w.k);
    if (m > 65535 * 16) throw ds4::Error("matmul_float: too many rows for one launch");
    with_float_type(w.type, "matmul_float",
                    [&](auto type) { launch_batch<decltype(type)::value>(w, X, m, Y, stream); });
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
