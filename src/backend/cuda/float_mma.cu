#include <mutex>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/float_mma.cuh"
#include "backend/cuda/float_mma.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/per_device.h"
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

// The product this block computes.
__device__ __forceinline__ int product_of_block(const DecodeProducts &ps) {
    int j = 0;
    while (j + 1 < ps.n && blockIdx.x >= ps.first_block[j + 1]) ++j;
    return j;
}

template <GgmlType T>
__global__ void __launch_bounds__(kDecodeThreads)
    float_mma_decode_kernel(const __grid_constant__ DecodeProducts ps, int64_t k,
                            const float *__restrict__ x) {
    dev::wait_for_previous_kernels();
    const int j = product_of_block(ps);
    const DecodeProduct &p = ps.p[j];
    const int64_t warp =
        int64_t(blockIdx.x - ps.first_block[j]) * kDecodeWarpsPerBlock + threadIdx.x / 32;
    if (warp >= decode_warps(p.sp)) return;  // the whole warp
    dev::float_mma_decode_warp<T>(p.w, p.n_rows, k, p.sp, warp, x, p.y, p.partial, p.counters);
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
        static PerDevice<bool> sized;  // prefill only: never inside a graph capture
        sized.get([kernel] {
            DS4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                int(Tile::kSmemBytes)));
            return true;
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
    if (!float_mma_enabled()) return false;
    if (float_mma_every_shape()) return w.n_rows <= kFloatMmaEveryShapeMaxRows;
    return w.n_rows >= kFloatMmaMinRows && w.n_rows <= kFloatMmaMaxRows;
}

size_t float_mma_partial_bytes(const FloatMatrix &w) {  // a row's spans' sums together
    const FloatSpans sp = float_spans(w.n_rows, w.k);
    return sp.spans == 1
               ? 0
               : size_t(sp.row_tiles) * kFloatTileRows * size_t(sp.spans) * sizeof(double);
}

void float_mma_matvec(const FloatMmaProduct *products, int n, const float *x, cudaStream_t stream) {
    DecodeProducts ps{};
    unsigned blocks = 0;
    for (int j = 0; j < n; ++j) {
        const FloatMatrix &w = products[j].w;
        check_float_rows(w.k);
        if (w.n_rows == 0) continue;
        const FloatSpans sp = float_spans(w.n_rows, w.k);
        if (sp.spans > 1 && size_t(sp.row_tiles) * sizeof(unsigned) > kFloatMatvecCounterBytes)
            throw ds4::Error("matvec_float: more split row tiles than counters");
        if (sp.spans > 1 && (!products[j].counters || !products[j].partial))
            throw ds4::Error("matvec_float: this matrix needs scratch");
        ps.p[ps.n] = {w.data, products[j].y, products[j].partial, products[j].counters, w.n_rows,
                      sp};
        ps.first_block[ps.n++] = blocks;
        blocks += unsigned(decode_blocks(sp));
    }
    ps.first_block[ps.n] = blocks;
    if (blocks == 0) return;
    with_float_type(products[0].w.type, "matvec_float", [&](auto type) {
        launch_kernel(float_mma_decode_kernel<decltype(type)::value>, blocks, kDecodeThreads, 0,
                      stream, ps, products[0].w.k, x);
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

namespace {

__global__ void float_mma_step_kernel(const double *a, const double *b, const double *c, double *d,
                                      int n) {
    dev::wait_for_previous_kernels();
    const int t = blockIdx.x, lane = threadIdx.x, g = lane / 4, q = lane % 4;
    if (t >= n) return;
    double acc[2] = {c[t * 64 + g * 8 + 2 * q], c[t * 64 + g * 8 + 2 * q + 1]};
    dev::mma_f64(acc, a[t * 32 + g * 4 + q], b[t * 32 + q * 8 + g]);  // A[g][q], B[q][g]
    d[t * 64 + g * 8 + 2 * q] = acc[0];
    d[t * 64 + g * 8 + 2 * q + 1] = acc[1];
}

}  // namespace

void float_mma_step(const double *a, const double *b, const double *c, double *d, int n,
                    cudaStream_t stream) {
    if (n <= 0) return;
    launch_kernel(float_mma_step_kernel, unsigned(n), 32, 0, stream, a, b, c, d, n);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
