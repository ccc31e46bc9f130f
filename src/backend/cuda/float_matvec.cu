#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/float_matvec.h"
#include "backend/cuda/float_mma.h"
#include "backend/cuda/float_weights.cuh"
#include "backend/cuda/launch.cuh"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kThreads = 256, kWarp = 32, kValues = 8;  // values per thread per pass
constexpr int kMaxSplit = 8;
constexpr int64_t kMinBlocks = 264;  // ~2 blocks per multiprocessor of an H200 (132)

// Groups of TPR threads compute R rows each (256 / TPR groups per block), over the split
// blockIdx.y of S equal parts of k. Each thread sums its exact double products; the warp adds
// them with a butterfly, then the warps of a group in index order (shared memory).
// blockIdx.z covers NT output slots (of n_slots): with ids (NT = 1), the rows are those of
// expert ids[slot], and with x_per_slot the activation is the slot's own row; outputs and
// partial sums of slot s are those of rows s * n_rows + row. A dense product is one slot
// without ids; a batch (matmul_float) is NT rows of x per block, each weight value loaded once
// for all of them and each slot's sum formed exactly as a one-slot launch forms it. With R > 1
// each thread takes the same k positions of R rows, so each x value is converted to double once
// for R rows (the conversions, a quarter of the double rate, are the batch's cost); a row's
// terms and order do not depend on R.
//
// The block's coordinates are arguments (bx: its row group, by of split: its part of k, bz: its
// slots, n_bx: the row groups) so that matvec_float_many_kernel runs the same blocks for several
// matrices in one grid.
template <GgmlType T, int TPR, int NT, int R>
__device__ __forceinline__ void matvec_float_block(
    const void *__restrict__ w, int64_t n_rows, int64_t k, int64_t span,
    const int32_t *__restrict__ ids, bool x_per_slot, int64_t n_slots, const float *__restrict__ x,
    float *__restrict__ y, double *__restrict__ partial, unsigned *__restrict__ counters,
    int64_t bx, unsigned by, unsigned split, int64_t bz, int64_t n_bx) {
    constexpr int kGroups = kThreads / TPR, kWarpsPerGroup = TPR / kWarp;
    __shared__ double sums[NT][R][kGroups][kWarpsPerGroup];
    const int group = threadIdx.x / TPR, t = threadIdx.x % TPR, lane = threadIdx.x % kWarp;
    const int64_t row0 = (bx * kGroups + group) * R;
    const int64_t slot0 = bz * NT;
    // the block's slots (a one-slot block always has its slot: the grid has no spare blocks)
    const int ns = NT == 1 ? 1 : int(min(int64_t(NT), n_slots - slot0));
    const int64_t begin = int64_t(by) * span, end = min(k, begin + span);
    const int64_t first_row = ids ? int64_t(ids[slot0]) * n_rows : 0;
    const void *wrow[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
        wrow[r] = static_cast<const char *>(w) +
                  (first_row + min(row0 + r, n_rows - 1)) * k * dev::Weights8<T>::kBytes;
    double acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[r][j] = 0.0;
    for (int64_t i = begin + int64_t(t) * kValues; i < end; i += int64_t(TPR) * kValues) {
        double wd[R][8];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float wv[8];
            dev::Weights8<T>::load(wrow[r], i, wv);
#pragma unroll
            for (int v = 0; v < 8; ++v) wd[r][v] = double(wv[v]);
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            if (NT > 1 && j >= ns) break;  // the same for the whole block
            const float *xs = x + (x_per_slot ? (slot0 + j) * k : 0) + i;
            const float4 xa = __ldg(reinterpret_cast<const float4 *>(xs));
            const float4 xb = __ldg(reinterpret_cast<const float4 *>(xs) + 1);
            const double xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int v = 0; v < 8; ++v) acc[r][j] += wd[r][v] * xv[v];  // exact products
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            for (int o = kWarp / 2; o > 0; o /= 2)
                acc[r][j] += __shfl_xor_sync(0xffffffffu, acc[r][j], o);
            if (lane == 0) sums[j][r][group][t / kWarp] = acc[r][j];
        }
    __syncthreads();
    if (t == 0)
        for (int r = 0; r < R; ++r) {
            const int64_t row = row0 + r;
            if (row >= n_rows) break;
            for (int j = 0; j < ns; ++j) {
                double v = 0.0;
#pragma unroll
                for (int i = 0; i < kWarpsPerGroup; ++i) v += sums[j][r][group][i];
                const int64_t slot = slot0 + j;
                if (split == 1)
                    y[slot * n_rows + row] = static_cast<float>(v);
                else
                    partial[(slot * n_rows + row) * split + by] = v;
            }
        }
    if (split == 1) return;
    // Split k: the last block of this row group to arrive adds the partial sums in split order
    // (the threadfence reduction pattern: each block's partials are visible device-wide before
    // its arrival is counted). The counter is reset for the next launch.
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    unsigned *arrived = counters + bz * n_bx + bx;
    if (threadIdx.x == 0) last = atomicAdd(arrived, 1u) == split - 1;
    __syncthreads();
    if (!last) return;
    if (t == 0)
        for (int r = 0; r < R; ++r) {
            const int64_t row = row0 + r;
            if (row >= n_rows) break;
            for (int j = 0; j < ns; ++j) {
                const int64_t slot = slot0 + j;
                double v = 0.0;
                for (unsigned s = 0; s < split; ++s)
                    v += __ldcg(partial + (slot * n_rows + row) * split + s);
                y[slot * n_rows + row] = static_cast<float>(v);
            }
        }
    if (threadIdx.x == 0) *arrived = 0;
}

template <GgmlType T, int TPR, int NT, int R>
__global__ void __launch_bounds__(kThreads)
    matvec_float_kernel(const void *__restrict__ w, int64_t n_rows, int64_t k, int64_t span,
                        const int32_t *__restrict__ ids, bool x_per_slot, int64_t n_slots,
                        const float *__restrict__ x, float *__restrict__ y,
                        double *__restrict__ partial, unsigned *__restrict__ counters) {
    dev::wait_for_previous_kernels();
    matvec_float_block<T, TPR, NT, R>(w, n_rows, k, span, ids, x_per_slot, n_slots, x, y, partial,
                                      counters, blockIdx.x, blockIdx.y, gridDim.y, blockIdx.z,
                                      gridDim.x);
}

// matvec_float_many: products j = 0..n-1 of one x, each its own grid of matvec_float_kernel's
// blocks (first_block[j] on), each block what that launch's block (bx, by) computes.
struct ManyProducts {
    const void *w[kMaxFloatProducts];
    float *y[kMaxFloatProducts];
    double *partial[kMaxFloatProducts];
    unsigned *counters[kMaxFloatProducts];
    int64_t n_rows[kMaxFloatProducts], span[kMaxFloatProducts];
    unsigned split[kMaxFloatProducts], n_bx[kMaxFloatProducts];
    unsigned first_block[kMaxFloatProducts + 1];
    int n;
};

template <GgmlType T, int TPR, int R>
__global__ void __launch_bounds__(kThreads)
    matvec_float_many_kernel(const __grid_constant__ ManyProducts p, int64_t k,
                             const float *__restrict__ x) {
    dev::wait_for_previous_kernels();
    int j = 0;
    while (j + 1 < p.n && blockIdx.x >= p.first_block[j + 1]) ++j;
    const unsigned local = blockIdx.x - p.first_block[j];
    matvec_float_block<T, TPR, 1, R>(p.w[j], p.n_rows[j], k, p.span[j], nullptr, false, 1, x,
                                     p.y[j], p.partial[j], p.counters[j], local % p.n_bx[j],
                                     local / p.n_bx[j], p.split[j], 0, p.n_bx[j]);
}

struct Plan {
    int tpr, split;
    int64_t span;
};

// n_slots: the products of one launch (the experts' slots), each of w.n_rows rows.
Plan plan(const FloatMatrix &w, int n_slots = 1) {
    check_float_rows(w.k);
    const int64_t pieces = w.k / kValues;
    const int tpr = pieces >= 256 ? 256 : pieces >= 128 ? 128 : pieces >= 64 ? 64 : 32;
    const int64_t blocks = (w.n_rows + kThreads / tpr - 1) / (kThreads / tpr) * n_slots;
    // Split k when the rows alone leave the grid small, in spans of whole passes.
    const int64_t pass = int64_t(tpr) * kValues;
    const int64_t passes = (w.k + pass - 1) / pass;
    const int split = int(std::clamp<int64_t>((kMinBlocks + blocks - 1) / blocks, 1,
                                              std::min<int64_t>(kMaxSplit, passes)));
    const int64_t span = (passes + split - 1) / split * pass;
    return {tpr, int((w.k + span - 1) / span), span};
}

// The experts of a launch: ids (device; null for a dense product) for n_slots output slots.
struct Slots {
    const int32_t *ids = nullptr;
    int n_slots = 1;
    bool x_per_slot = false;
};

// Rows of x a matmul_float block takes (each weight value loaded once for all of them).
constexpr int kBatchRows = 8;

// Rows per thread group of a batch (each x value converted once for both). 2 measured best on
// the H200 (F16 compressor products of a 1024-token chunk: 1 row 5.9, 2 rows 4.8, 4 rows 6.0 us
// a token: at 4 the registers leave one block a multiprocessor).
constexpr int kBatchRowsPerGroup = 2;

template <GgmlType T, int TPR, int NT, int R>
void launch_tpr(const FloatMatrix &w, const Plan &p, const Slots &sl, const float *x, float *y,
                double *partial, unsigned *counters, cudaStream_t s) {
    constexpr int kRowsPerBlock = kThreads / TPR * R;
    const dim3 grid(unsigned((w.n_rows + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(p.split),
                    unsigned((sl.n_slots + NT - 1) / NT));
    launch_kernel(matvec_float_kernel<T, TPR, NT, R>, grid, kThreads, 0, s, w.data, w.n_rows, w.k,
                  p.span, sl.ids, sl.x_per_slot, int64_t(sl.n_slots), x, y, partial, counters);
}

// Rows per thread group of a one-token product: each thread then has R rows' loads in flight
// instead of one (a matrix of few passes per row is otherwise latency-bound: the F16 indexer and
// compressor products ran at 1.5 TB/s), as long as the grid keeps a block per multiprocessor.
// A row's terms and order do not depend on R.
int decode_rows_per_group(int64_t row_groups) {
    constexpr int64_t kMultiprocessors = kMinBlocks / 2;
    return row_groups >= 4 * kMultiprocessors ? 4 : row_groups >= 2 * kMultiprocessors ? 2 : 1;
}

template <class F>
void with_rows_per_group(int r, F &&f) {
    if (r == 4)
        f(std::integral_constant<int, 4>{});
    else if (r == 2)
        f(std::integral_constant<int, 2>{});
    else
        f(std::integral_constant<int, 1>{});
}

template <GgmlType T, int NT>
void launch(const FloatMatrix &w, const Plan &p, const Slots &sl, const float *x, float *y,
            double *partial, unsigned *counters, cudaStream_t s) {
    with_threads_per_row(p.tpr, [&](auto tpr) {
        constexpr int kTpr = decltype(tpr)::value;
        if constexpr (NT == 1) {
            const int64_t groups =
                (w.n_rows + kThreads / kTpr - 1) / (kThreads / kTpr) * sl.n_slots;
            with_rows_per_group(decode_rows_per_group(groups), [&](auto r) {
                launch_tpr<T, kTpr, 1, decltype(r)::value>(w, p, sl, x, y, partial, counters, s);
            });
        } else {
            launch_tpr<T, kTpr, NT, kBatchRowsPerGroup>(w, p, sl, x, y, partial, counters, s);
        }
    });
}

// NT slots per block: 1 for a product or the experts' slots, kBatchRows for a batch (no ids).
template <int NT>
void launch_type(const FloatMatrix &w, const Plan &p, const Slots &sl, const float *x, float *y,
                 double *partial, unsigned *counters, cudaStream_t stream) {
    with_float_type(w.type, "matvec_float", [&](auto type) {
        launch<decltype(type)::value, NT>(w, p, sl, x, y, partial, counters, stream);
    });
}

// The counters of a launch's split row groups (a multiple of 256 bytes, at least
// kFloatMatvecCounterBytes).
size_t counter_bytes(const FloatMatrix &w, const Plan &p, int64_t n_slots) {
    const int64_t groups = (w.n_rows + kThreads / p.tpr - 1) / (kThreads / p.tpr) * n_slots;
    return std::max(kFloatMatvecCounterBytes,
                    (size_t(groups) * sizeof(unsigned) + 255) / 256 * 256);
}

size_t partial_bytes(const FloatMatrix &w, const Plan &p, int64_t n_slots) {
    return p.split > 1 ? size_t(w.n_rows) * size_t(n_slots) * size_t(p.split) * sizeof(double) : 0;
}

// p: the plan (plan(w, n_slots), or a one-slot plan that every slot of a batch follows).
void run(const FloatMatrix &w, const Plan &p, const Slots &sl, const float *x, float *y,
         unsigned *counters, double *partial, cudaStream_t stream, bool batch = false) {
    if (p.split > 1 && (!counters || !partial))
        throw ds4::Error("matvec_float: this matrix needs scratch");
    if (batch)
        launch_type<kBatchRows>(w, p, sl, x, y, partial, counters, stream);
    else
        launch_type<1>(w, p, sl, x, y, partial, counters, stream);
    DS4_CUDA_CHECK(cudaGetLastError());
}

// matvec's scratch: kFloatMatvecCounterBytes of counters, then the partial sums.
size_t scratch_bytes(const FloatMatrix &w, const Plan &p, int64_t n_slots) {
    return p.split > 1 ? kFloatMatvecCounterBytes + partial_bytes(w, p, n_slots) : 0;
}

void run_with_scratch(const FloatMatrix &w, const Plan &p, const Slots &sl, const float *x,
                      float *y, void *scratch, cudaStream_t stream) {
    if (p.split > 1 && counter_bytes(w, p, sl.n_slots) > kFloatMatvecCounterBytes)
        throw ds4::Error("matvec_float: more split row groups than counters");
    run(w, p, sl, x, y, static_cast<unsigned *>(scratch),
        scratch
            ? reinterpret_cast<double *>(static_cast<char *>(scratch) + kFloatMatvecCounterBytes)
            : nullptr,
        stream);
}

// A product's partial sums in a scratch (float_mma.h's or the thread kernel's plan); its
// counters come before them.
size_t partial_bytes_of(const FloatMatrix &w) {
    return float_uses_mma(w) ? float_mma_partial_bytes(w) : partial_bytes(w, plan(w), 1);
}

}  // namespace

size_t float_matvec_scratch_bytes(const FloatMatrix &w) {
    const size_t partial = partial_bytes_of(w);
    return partial > 0 ? kFloatMatvecCounterBytes + partial : 0;
}

void matvec_float(const FloatMatrix &w, const float *x, float *y, void *scratch,
                  cudaStream_t stream) {
    if (w.n_rows == 0) return;
    if (float_uses_mma(w)) {
        char *sc = static_cast<char *>(scratch);
        const FloatMmaProduct one{
            w, y, reinterpret_cast<unsigned *>(sc),
            sc ? reinterpret_cast<double *>(sc + kFloatMatvecCounterBytes) : nullptr};
        float_mma_matvec(&one, 1, x, stream);
        return;
    }
    run_with_scratch(w, plan(w), Slots{}, x, y, scratch, stream);
}

size_t float_matvec_experts_scratch_bytes(const FloatMatrix &w, int n_ids) {
    if (n_ids <= 0) return 0;
    return scratch_bytes(w, plan(w, n_ids), n_ids);
}

void matvec_float_experts(const FloatMatrix &w, const int32_t *ids, int n_ids, const float *x,
                          bool x_per_slot, float *y, void *scratch, cudaStream_t stream) {
    if (n_ids <= 0 || w.n_rows == 0) return;
    if (n_ids > 65535) throw ds4::Error("matvec_float_experts: at most 65535 slots");
    run_with_scratch(w, plan(w, n_ids), Slots{ids, n_ids, x_per_slot}, x, y, scratch, stream);
}

namespace {

void check_many(const FloatProduct *products, int n) {
    if (n < 1 || n > kMaxFloatProducts)
        throw ds4::Error("matvec_float_many: 1 to " + std::to_string(kMaxFloatProducts) +
                         " products, not " + std::to_string(n));
    for (int j = 0; j < n; ++j)
        if (products[j].w.type != products[0].w.type || products[j].w.k != products[0].w.k)
            throw ds4::Error("matvec_float_many: products of one weight format and row length");
}

}  // namespace

size_t float_matvec_many_scratch_bytes(const FloatProduct *products, int n) {
    check_many(products, n);
    size_t bytes = kMaxFloatProducts * kFloatMatvecCounterBytes;
    for (int j = 0; j < n; ++j) bytes += partial_bytes_of(products[j].w);
    return bytes;
}

void matvec_float_many(const FloatProduct *products, int n, const float *x, void *scratch,
                       size_t scratch_bytes_given, cudaStream_t stream) {
    if (float_matvec_many_scratch_bytes(products, n) > scratch_bytes_given)
        throw ds4::Error("matvec_float_many: the scratch is smaller than these products need");
    // Product j's counters are the j-th of kMaxFloatProducts fixed regions, the partial sums
    // follow them in product order: a group's partial sums never land where another group (of
    // other matrices, whose sums take other lengths) keeps its counters, which stay zero between
    // launches. Those of float_uses_mma go to float_mma_matvec (a launch of their own), the
    // others to one launch of the thread kernel.
    FloatMmaProduct mma[kMaxFloatProducts];
    bool on_mma[kMaxFloatProducts];
    int n_mma = 0;
    ManyProducts mp{};
    const int tpr = plan(products[0].w).tpr;
    int64_t row_groups = 0;  // of the thread kernel's products, as one product's would be counted
    for (int j = 0; j < n; ++j) {
        on_mma[j] = float_uses_mma(products[j].w);
        if (!on_mma[j])
            row_groups += (products[j].w.n_rows + kThreads / tpr - 1) / (kThreads / tpr);
    }
    const int r = decode_rows_per_group(row_groups);
    unsigned blocks = 0;
    char *const counters = static_cast<char *>(scratch);
    char *free = counters + kMaxFloatProducts * kFloatMatvecCounterBytes;
    for (int j = 0; j < n; ++j) {
        const FloatMatrix &w = products[j].w;
        unsigned *own_counters =
            reinterpret_cast<unsigned *>(counters + j * kFloatMatvecCounterBytes);
        if (on_mma[j]) {
            mma[n_mma++] = {w, products[j].y, own_counters, reinterpret_cast<double *>(free)};
            free += float_mma_partial_bytes(w);
            continue;
        }
        const Plan p = plan(w);  // matvec_float's plan: the same split, the same bits
        if (p.split > 1 && counter_bytes(w, p, 1) > kFloatMatvecCounterBytes)
            throw ds4::Error("matvec_float_many: more split row groups than counters");
        const int i = mp.n++;
        mp.w[i] = w.data;
        mp.y[i] = products[j].y;
        mp.n_rows[i] = w.n_rows;
        mp.span[i] = p.span;
        mp.split[i] = unsigned(p.split);
        mp.n_bx[i] = unsigned((w.n_rows + kThreads / tpr * r - 1) / (kThreads / tpr * r));
        mp.first_block[i] = blocks;
        blocks += mp.n_bx[i] * mp.split[i];
        if (p.split > 1) {  // its own counters and partial sums
            mp.counters[i] = own_counters;
            mp.partial[i] = reinterpret_cast<double *>(free);
            free += partial_bytes(w, p, 1);
        }
    }
    mp.first_block[mp.n] = blocks;
    if (n_mma > 0) float_mma_matvec(mma, n_mma, x, stream);
    if (blocks == 0) return;
    auto go = [&](auto type) {
        with_threads_per_row(tpr, [&](auto t) {
            with_rows_per_group(r, [&](auto rows) {
                launch_kernel(matvec_float_many_kernel<decltype(type)::value, decltype(t)::value,
                                                       decltype(rows)::value>,
                              blocks, kThreads, 0, stream, mp, products[0].w.k, x);
            });
        });
    };
    with_float_type(products[0].w.type, "matvec_float_many", go);
    DS4_CUDA_CHECK(cudaGetLastError());
}

size_t float_matmul_counter_bytes(const FloatMatrix &w, int64_t m) {
    if (float_uses_mma(w)) return 0;
    const Plan p = plan(w);
    return m > 0 && p.split > 1 ? counter_bytes(w, p, m) : 0;
}

size_t float_matmul_partial_bytes(const FloatMatrix &w, int64_t m) {
    if (float_uses_mma(w)) return 0;
    return m > 0 ? partial_bytes(w, plan(w), m) : 0;
}

void matmul_float(const FloatMatrix &w, const float *X, int64_t m, float *Y,
                  const FloatMatmulScratch &scratch, cudaStream_t stream) {
    if (m <= 0 || w.n_rows == 0) return;
    if (float_uses_mma(w)) {
        float_mma_matmul(w, X, m, Y, stream);
        return;
    }
    if (m > 65535) throw ds4::Error("matmul_float: at most 65535 rows a launch");
    // Every row with the one-token plan: the same split of k, so each output is matvec's.
    const Plan p = plan(w);
    if (p.split > 1 && (scratch.counter_bytes < counter_bytes(w, p, m) ||
                        scratch.partial_bytes < partial_bytes(w, p, m)))
        throw ds4::Error("matmul_float: the scratch is smaller than this batch needs");
    run(w, p, Slots{nullptr, int(m), true}, X, Y, static_cast<unsigned *>(scratch.counters),
        static_cast<double *>(scratch.partial), stream, true);
}

}  // namespace ds4::cuda
