#include <cuda_fp16.h>

#include <cstddef>
#include <cstring>

#include "backend/cuda/host_upload.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/q8_0_matmul.h"
#include "backend/cuda/q8_0_matvec.h"
#include "backend/cuda/quantize_block.cuh"
#include "backend/cuda/row_device.cuh"
#include "common/error.h"
#include "quant/blocks.h"

namespace ds4::cuda {
namespace {

constexpr int kBlock = 32;  // values per Q8_0 block
constexpr int kWarp = 32;
constexpr int kLaneBytes = 16;   // one int4 load: half a block
constexpr int kBatchTokens = 8;  // tokens per block of a batched product
// From this many tokens a batch goes to the tensor-core product (q8_0_matmul.h; same bits),
// whose tiles of 64 tokens would be mostly padding below it.
constexpr int64_t kMmaMinTokens = 32;

// One warp per block of 32 activations: lane i owns x[i].
__global__ void quantize_q8_0_activation_kernel(const float *__restrict__ x, int64_t n_blocks,
                                                int8_t *__restrict__ xq, float *__restrict__ xd) {
    dev::wait_for_previous_kernels();
    const int64_t b = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
    if (b >= n_blocks) return;  // the warp agrees
    dev::quantize_q8_0_lane(x[b * kBlock + threadIdx.x % kWarp], xq + b * kBlock, xd + b);
}

__device__ __forceinline__ int dot16(const int4 w, const int4 x) {
    int s = __dp4a(w.x, x.x, 0);
    s = __dp4a(w.y, x.y, s);
    s = __dp4a(w.z, x.z, s);
    return __dp4a(w.w, x.w, s);
}

// A block of 256 threads is split into groups of TPR threads; each group computes R rows. In
// a pass, thread t of a group reads bytes [16 t, 16 t + 16) of a 16 TPR-byte span of each of its
// rows: half of one Q8_0 block. The two halves of a block (lanes 2i, 2i+1) are summed exactly as
// integers (one shuffle) before the block's scale is applied, so every term is the CPU's
// float(sumi) * (dw * dx), accumulated by the even lane. The activation's 16 bytes are loaded
// once per pass for all R rows, so the block reads x once per R rows, not once per row.
// Partial sums are reduced in a fixed order: a butterfly within each warp, then the warps of a
// group in index order (shared memory): the same bits on every run.
// blockIdx.y is the output slot: with ids, the rows are those of expert ids[slot] (clamped
// into the n_experts matrices), and with x_per_slot the activation is the slot's own row. A
// dense product is one slot without ids: the same arithmetic either way.
// With T > 1 (a batch of tokens, no ids) slot s holds tokens s T .. s T + T - 1 (of n_tokens):
// each weight piece loaded is used for T activations, so a pass over the matrix serves T tokens.
// Each token's terms, order and reductions are those of T = 1: the same bits per token.
template <int TPR, int R, int T>
__global__ void __launch_bounds__(256)
    matvec_q8_0_kernel(const int8_t *__restrict__ wq, const uint16_t *__restrict__ wd,
                       int64_t n_rows, int64_t k, const int32_t *__restrict__ ids,
                       int64_t n_experts, bool x_per_slot, const int8_t *__restrict__ xq,
                       const float *__restrict__ xd, float *__restrict__ y, int64_t n_tokens,
                       int64_t x_stride, int64_t y_stride) {
    dev::wait_for_previous_kernels();
    constexpr int kGroups = 256 / TPR, kWarpsPerGroup = TPR / kWarp;
    __shared__ float partial[kGroups][kWarpsPerGroup][R * T];
    const int group = threadIdx.x / TPR, t = threadIdx.x % TPR, lane = threadIdx.x % kWarp;
    const int64_t row0 = (int64_t(blockIdx.x) * kGroups + group) * R;
    const int64_t nb = k / kBlock, slot = blockIdx.y;
    int n_tok = 1;  // tokens of this slot
    if constexpr (T == 1) {
        if (ids) {
            const int64_t expert = min(max(int64_t(ids[slot]), int64_t(0)), n_experts - 1);
            wq += expert * n_rows * k;
            wd += expert * n_rows * nb;
        }
        if (x_per_slot) {
            xq += slot * k;
            xd += slot * nb;
        }
        y += slot * n_rows;
    } else {
        // blockIdx.z: the group of a grouped product (matrix z of n_rows rows, activation
        // slice z of each token's row); tokens are x_stride values and y_stride outputs apart.
        const int64_t tok0 = slot * T, g = blockIdx.z;
        n_tok = int(min(int64_t(T), n_tokens - tok0));
        wq += g * n_rows * k;
        wd += g * n_rows * nb;
        xq += tok0 * x_stride + g * k;
        xd += tok0 * (x_stride / kBlock) + g * nb;
        y += tok0 * y_stride + g * n_rows;
    }
    float acc[R][T];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int u = 0; u < T; ++u) acc[r][u] = 0.0f;
    const bool even = (lane & 1) == 0;
    for (int64_t base = 0; base < k; base += int64_t(TPR) * kLaneBytes) {
        const int64_t off = base + int64_t(t) * kLaneBytes;
        const bool active = off < k;  // k is a multiple of 32: both halves of a block agree
        const int64_t blk = off / kBlock;
        int4 x[T];
        float dx[T];
#pragma unroll
        for (int u = 0; u < T; ++u) {
            x[u] = make_int4(0, 0, 0, 0);
            dx[u] = 0.0f;
            if (active && u < n_tok) {
                x[u] = __ldg(reinterpret_cast<const int4 *>(xq + u * x_stride + off));
                dx[u] = __ldg(xd + u * (x_stride / kBlock) + blk);
            }
        }
        int4 w[R];
        uint16_t dw[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int64_t row = min(row0 + r, n_rows - 1);  // a clamped duplicate is not stored
            w[r] = make_int4(0, 0, 0, 0);
            dw[r] = 0;
            if (active) {
                w[r] = __ldcs(reinterpret_cast<const int4 *>(wq + row * k + off));
                dw[r] = __ldcs(wd + row * nb + blk);
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int u = 0; u < T; ++u) {
                int s = dot16(w[r], x[u]);
                s += __shfl_xor_sync(0xffffffffu, s, 1);
                const float scale = __half2float(__ushort_as_half(dw[r])) * dx[u];
                if (even && active) acc[r][u] += static_cast<float>(s) * scale;
            }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int u = 0; u < T; ++u) {
            float v = acc[r][u];
            for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
            acc[r][u] = v;
        }
    if constexpr (kWarpsPerGroup == 1) {
        if (lane == 0)
#pragma unroll
            for (int u = 0; u < T; ++u)
#pragma unroll
                for (int r = 0; r < R; ++r)
                    if (row0 + r < n_rows && u < n_tok) y[u * y_stride + row0 + r] = acc[r][u];
    } else {
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int u = 0; u < T; ++u) partial[group][t / kWarp][r * T + u] = acc[r][u];
        __syncthreads();
        for (int i = t; i < R * T; i += TPR) {
            const int r = i / T, u = i % T;
            if (row0 + r >= n_rows || u >= n_tok) continue;
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < kWarpsPerGroup; ++w) v += partial[group][w][i];
            y[u * y_stride + row0 + r] = v;
        }
    }
}

// The experts of a launch: ids (device; null for a dense product) for n_slots output slots.
struct Slots {
    const int32_t *ids = nullptr;
    int64_t n_experts = 1;
    int n_slots = 1;
    bool x_per_slot = false;
};

// A batch of tokens for T > 1: n_tokens of them, x_stride / y_stride apart, over `groups`
// matrices of w.n_rows rows (a grouped product; 1: a plain one).
struct Batch {
    int64_t n_tokens = 1, x_stride = 0, y_stride = 0;
    int groups = 1;
};

template <int TPR, int R, int T = 1>
void launch_matvec(const Q8_0Matrix &w, const Slots &s, const int8_t *xq, const float *xd, float *y,
                   cudaStream_t stream, const Batch &b = {}) {
    constexpr int kRowsPerBlock = 256 / TPR * R;
    const int64_t slots = T == 1 ? s.n_slots : (b.n_tokens + T - 1) / T;
    const dim3 grid(unsigned((w.n_rows + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(slots),
                    unsigned(T == 1 ? 1 : b.groups));
    launch_kernel(matvec_q8_0_kernel<TPR, R, T>, grid, 256, 0, stream, w.qs, w.d, w.n_rows, w.k,
                  s.ids, s.n_experts, s.x_per_slot, xq, xd, y, b.n_tokens, b.x_stride, b.y_stride);
}

template <int TPR>
void launch_matvec_rows(const Q8_0Matrix &w, const Slots &s, const int8_t *xq, const float *xd,
                        float *y, cudaStream_t stream) {
    // Four rows per group read x once per four rows; fewer where that would leave the grid
    // with less than ~2 blocks per multiprocessor of an H200 (132). (R changes which rows a
    // group computes, not the arithmetic of a row.)
    const int64_t groups = w.n_rows * s.n_slots / (256 / TPR);
    if (groups >= 4 * 264)
        launch_matvec<TPR, 4>(w, s, xq, xd, y, stream);
    else if (groups >= 2 * 264)
        launch_matvec<TPR, 2>(w, s, xq, xd, y, stream);
    else
        launch_matvec<TPR, 1>(w, s, xq, xd, y, stream);
}

void launch_matvec_any(const Q8_0Matrix &w, const Slots &s, const int8_t *xq, const float *xd,
                       float *y, cudaStream_t stream) {
    with_threads_per_row(q8_0_threads_per_row(w.k), [&](auto tpr) {
        launch_matvec_rows<decltype(tpr)::value>(w, s, xq, xd, y, stream);
    });
    DS4_CUDA_CHECK(cudaGetLastError());
}

// A batch of tokens: 8 per block, two rows per group (x for 8 tokens is loaded once per pass
// for both rows).
template <int TPR>
void launch_batch(const Q8_0Matrix &w, const int8_t *xq, const float *xd, const Batch &b, float *y,
                  cudaStream_t stream) {
    launch_matvec<TPR, 2, kBatchTokens>(w, Slots{}, xq, xd, y, stream, b);
}

void launch_batch_any(const Q8_0Matrix &w, const int8_t *xq, const float *xd, const Batch &b,
                      float *y, cudaStream_t stream) {
    if (w.n_rows == 0 || b.n_tokens <= 0) return;
    const int tpr = q8_0_threads_per_row(w.k);
    if (b.n_tokens >= kMmaMinTokens && mma_enabled()) {
        matmul_q8_0_mma(w, tpr, xq, xd, b.n_tokens, b.x_stride, b.y_stride, b.groups, y, stream);
        return;
    }
    if ((b.n_tokens + kBatchTokens - 1) / kBatchTokens > 65535 || b.groups > 65535)
        throw ds4::Error("matmul_q8_0: too many tokens or groups for one launch");
    with_threads_per_row(
        tpr, [&](auto t) { launch_batch<decltype(t)::value>(w, xq, xd, b, y, stream); });
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

Q8_0Planes repack_q8_0(const void *ggml_rows, int64_t n_rows, int64_t k) {
    if (k % kBlock != 0) throw ds4::Error("Q8_0 rows must hold a multiple of 32 values");
    const auto *blocks = static_cast<const quant::BlockQ8_0 *>(ggml_rows);
    const int64_t nb = k / kBlock;
    Q8_0Planes p;
    p.qs.resize(size_t(n_rows * k));
    p.d.resize(size_t(n_rows * nb));
    for (int64_t i = 0; i < n_rows * nb; ++i) {
        std::memcpy(p.qs.data() + i * kBlock, blocks[i].qs, kBlock);
        p.d[size_t(i)] = blocks[i].d;
    }
    return p;
}

Q8_0Weights::Q8_0Weights(const void *ggml_rows, int64_t n_rows, int64_t k, int64_t n_experts)
    : n_experts_(n_experts) {
    if (n_experts < 1) throw ds4::Error("Q8_0 weights need at least one expert");
    if (k % kBlock != 0) throw ds4::Error("Q8_0 rows must hold a multiple of 32 values");
    // repack_q8_0 on the device: the quants are the segment, the scale the rest.
    using Block = quant::BlockQ8_0;
    static_assert(offsetof(Block, qs) == 2 && sizeof(Block) == 34);
    const int64_t n_blocks = n_experts * n_rows * (k / kBlock);
    qs_ = DeviceBuffer(size_t(n_blocks) * kBlock);
    d_ = DeviceBuffer(size_t(n_blocks) * sizeof(uint16_t));
    upload_split_blocks(ggml_rows, n_blocks, sizeof(Block), 2, kBlock, qs_.get(), d_.get());
    view_ = {qs_.as<int8_t>(), d_.as<uint16_t>(), n_rows, k};
}

void quantize_q8_0_activation(const float *x, int64_t k, int8_t *xq, float *xd,
                              cudaStream_t stream) {
    if (k % kBlock != 0) throw ds4::Error("Q8_0 activations must hold a multiple of 32 values");
    const int64_t n_blocks = k / kBlock;
    constexpr int kThreads = 256;
    const int64_t grid = (n_blocks * kWarp + kThreads - 1) / kThreads;
    launch_kernel(quantize_q8_0_activation_kernel, unsigned(grid), kThreads, 0, stream, x, n_blocks,
                  xq, xd);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void matvec_q8_0(const Q8_0Matrix &w, const int8_t *xq, const float *xd, float *y,
                 cudaStream_t stream) {
    if (w.n_rows == 0) return;
    launch_matvec_any(w, Slots{}, xq, xd, y, stream);
}

void matmul_q8_0(const Q8_0Matrix &w, const int8_t *xq, const float *xd, int64_t n_tokens, float *y,
                 cudaStream_t stream) {
    launch_batch_any(w, xq, xd, Batch{n_tokens, w.k, w.n_rows, 1}, y, stream);
}

void matmul_q8_0_groups(const Q8_0Matrix &w, int groups, const int8_t *xq, const float *xd,
                        int64_t n_tokens, float *y, cudaStream_t stream) {
    if (groups < 1) throw ds4::Error("matmul_q8_0_groups: at least one group");
    launch_batch_any(w, xq, xd, Batch{n_tokens, groups * w.k, groups * w.n_rows, groups}, y,
                     stream);
}

void matvec_q8_0_experts(const Q8_0Matrix &w, int64_t n_experts, const int32_t *ids, int n_ids,
                         const int8_t *xq, const float *xd, bool x_per_slot, float *y,
                         cudaStream_t stream) {
    if (n_ids <= 0 || w.n_rows == 0) return;
    if (n_experts < 1) throw ds4::Error("matvec_q8_0_experts: needs at least one expert");
    if (n_ids > 65535) throw ds4::Error("matvec_q8_0_experts: at most 65535 slots");
    launch_matvec_any(w, Slots{ids, n_experts, n_ids, x_per_slot}, xq, xd, y, stream);
}

}  // namespace ds4::cuda
