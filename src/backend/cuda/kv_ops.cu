#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kv_ops.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/row_device.cuh"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n, int threads = kThreads) {
    return unsigned((n + threads - 1) / threads);
}

__global__ void store_row_kernel(const float *__restrict__ row, int64_t d, bool f16_round,
                                 float *__restrict__ dst, const int64_t *__restrict__ index) {
    dev::wait_for_previous_kernels();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (index) {  // the row's index, read on the device; negative: nothing to store
        if (*index < 0) return;
        dst += *index * d;
    }
    if (i >= d) return;
    dst[i] = f16_round ? dev::f16_bits_to_f32(dev::f32_to_f16_bits(row[i])) : row[i];
}

// One block per output row.
__global__ void gather_rows_kernel(const float *__restrict__ ring, int64_t window, int64_t first,
                                   int64_t n_raw, const float *__restrict__ comp,
                                   const int32_t *__restrict__ selected, int64_t d,
                                   float *__restrict__ out, const int64_t *__restrict__ words,
                                   int64_t word_stride, int64_t selected_stride) {
    dev::wait_for_previous_kernels();
    const int64_t i = blockIdx.x;
    {  // the token of a batch (gather_rows_step's n_tokens): its rows after the previous ones
        const int64_t t = blockIdx.y;
        out += t * int64_t(gridDim.x) * d;
        if (words) words += t * word_stride;
        if (selected) selected += t * selected_stride;
    }
    if (words) {  // first, n_raw, n_sel, use_selected, read on the device
        first = words[0];
        n_raw = words[1];
        if (i >= n_raw + words[2]) return;
        if (words[3] == 0) selected = nullptr;
    }
    const float *src = i < n_raw ? ring + ((first + i) % window) * d
                                 : comp + (selected ? int64_t(selected[i - n_raw]) : i - n_raw) * d;
    float *dst = out + i * d;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) dst[k] = src[k];
}

__global__ void compressor_push_kernel(const float *__restrict__ kv_in,
                                       const float *__restrict__ sc_in,
                                       const float *__restrict__ ape_row, int64_t width,
                                       int64_t slot, float *__restrict__ state_kv,
                                       float *__restrict__ state_score,
                                       const int64_t *__restrict__ phase) {
    dev::wait_for_previous_kernels();
    const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (phase) {  // the token's phase in its window, read on the device; slot is then the base
        slot += *phase;
        ape_row += *phase * width;
    }
    if (j >= width) return;
    state_kv[slot * width + j] = kv_in[j];
    state_score[slot * width + j] = __fadd_rn(sc_in[j], ape_row[j]);
}

// One thread per output column: backend/cpu/compressor_pool.cpp, operation for operation.
__global__ void compressor_pool_kernel(const float *__restrict__ kv,
                                       const float *__restrict__ score, int r, bool overlap,
                                       int64_t d, int64_t width, float *__restrict__ pooled) {
    dev::wait_for_previous_kernels();
    const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (j >= d) return;
    pooled[j] = dev::pool_column(kv, score, r, overlap, d, width, j);
}

// rows r..2r-1 -> rows 0..r-1 of both arrays (disjoint ranges).
__global__ void compressor_shift_kernel(float *__restrict__ kv, float *__restrict__ score,
                                        int64_t n, const int64_t *__restrict__ when) {
    dev::wait_for_previous_kernels();
    if (when && *when < 0) return;  // the window did not complete
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    kv[i] = kv[n + i];
    score[i] = score[n + i];
}

// compressor_batch, in parallel. Windows are aligned: batch token u has phase (p0 + u) % r (p0:
// token 0's), so the c-th completion is token t = r - 1 - p0 + c r, and its window's row i
// (phase i) is token t - (r - 1) + i, the overlapped window's first half (rows i < r) token
// t - (2 r - 1) + i. A row of a token before the batch is in the state as the batch found it:
// the current window's slot slot_base + i, or with overlap, for the first half, slot i when the
// previous window completed before the batch (t < r) and slot r + i otherwise (that window was
// the current one). The batch's own rows are read from its inputs, the score plus ape[i] as the
// push adds it: the values the token-by-token pool reads, in the same order.
__device__ __forceinline__ int64_t first_completion(const int64_t *phase, int ratio) {
    return ratio - 1 - phase[0];
}

__global__ void compressor_batch_pool_kernel(
    const float *__restrict__ kv, const float *__restrict__ score, const float *__restrict__ ape,
    int64_t d, int64_t width, int ratio, bool overlap, int64_t slot_base,
    const int64_t *__restrict__ phase, int n_tokens, const float *__restrict__ state_kv,
    const float *__restrict__ state_score, float *__restrict__ pooled) {
    dev::wait_for_previous_kernels();
    const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, c = blockIdx.y;
    const int64_t t = first_completion(phase, ratio) + c * ratio;
    if (j >= d || t >= n_tokens) return;
    const int r = ratio;
    // candidate i: its token, its slot in the state and its column
    const auto token = [&](int i) {
        return overlap && i < r ? t - (2 * r - 1) + i : t - (r - 1) + (i % r);
    };
    const auto slot = [&](int i) {
        if (overlap && i < r) return int64_t(t < r ? i : r + i);
        return slot_base + i % r;
    };
    const auto col = [&](int i) { return overlap && i >= r ? d + j : j; };
    const auto score_at = [&](int i) {
        const int64_t u = token(i);
        return u >= 0 ? __fadd_rn(score[u * width + col(i)], ape[(i % r) * width + col(i)])
                      : state_score[slot(i) * width + col(i)];
    };
    const auto kv_at = [&](int i) {
        const int64_t u = token(i);
        return u >= 0 ? kv[u * width + col(i)] : state_kv[slot(i) * width + col(i)];
    };
    pooled[c * d + j] = dev::pool_values(overlap ? 2 * r : r, score_at, kv_at);
}

// The state the token-by-token launches leave: the current window's slot slot_base + i holds
// the batch's last token of phase i (if any); with overlap, slot i holds, when the batch
// completed a window (the last at tc), that window's row i: token tc - (r - 1) + i, or the
// current slot r + i as the batch found it for a token before it. Thread (i, col) owns column
// col of both slots of phase i (it reads slot r + i before writing it).
__global__ void compressor_batch_state_kernel(const float *__restrict__ kv,
                                              const float *__restrict__ score,
                                              const float *__restrict__ ape, int64_t width,
                                              int ratio, bool overlap, int64_t slot_base,
                                              const int64_t *__restrict__ phase, int n_tokens,
                                              float *state_kv, float *state_score) {
    dev::wait_for_previous_kernels();
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= int64_t(ratio) * width) return;
    const int r = ratio;
    const int i = int(idx / width);
    const int64_t col = idx % width, cur = (slot_base + i) * width + col;
    const auto from_batch = [&](int64_t u, float *kv_dst, float *score_dst) {
        *kv_dst = kv[u * width + col];
        *score_dst = __fadd_rn(score[u * width + col], ape[i * width + col]);
    };
    if (overlap) {
        const int64_t first = first_completion(phase, r);
        if (first < n_tokens) {
            const int64_t tc = first + (n_tokens - 1 - first) / r * r, u = tc - (r - 1) + i;
            const int64_t prev = int64_t(i) * width + col;
            if (u >= 0)
                from_batch(u, state_kv + prev, state_score + prev);
            else
                state_kv[prev] = state_kv[cur], state_score[prev] = state_score[cur];
        }
    }
    const int64_t u_first = (i - phase[0] + r) % r;
    if (u_first >= n_tokens) return;
    from_batch(u_first + (n_tokens - 1 - u_first) / r * r, state_kv + cur, state_score + cur);
}

}  // namespace

void compressor_batch(const float *kv, const float *score, const float *ape, int64_t d,
                      int64_t width, int ratio, bool overlap, int64_t slot_base,
                      const int64_t *phase, int n_tokens, float *state_kv, float *state_score,
                      float *pooled, cudaStream_t stream) {
    if (ratio < 1 || d <= 0 || width != (overlap ? 2 * d : d) || slot_base < 0)
        throw ds4::Error("compressor_batch: bad ratio, width or slots");
    if (n_tokens <= 0) return;
    if (slot_base != (overlap ? ratio : 0))
        throw ds4::Error("compressor_batch: the window's slots start at 0, or at ratio overlapped");
    constexpr int kBatchThreads = 64;  // d is a few hundred columns: spread them
    const unsigned completions = unsigned(n_tokens / ratio + 1);
    launch_kernel(compressor_batch_pool_kernel, dim3(blocks_for(d, kBatchThreads), completions),
                  kBatchThreads, 0, stream, kv, score, ape, d, width, ratio, overlap, slot_base,
                  phase, n_tokens, state_kv, state_score, pooled);
    DS4_CUDA_CHECK(cudaGetLastError());
    launch_kernel(compressor_batch_state_kernel, blocks_for(int64_t(ratio) * width), kThreads, 0,
                  stream, kv, score, ape, width, ratio, overlap, slot_base, phase, n_tokens,
                  state_kv, state_score);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void store_row(const float *row, int64_t d, bool f16_round, float *dst, cudaStream_t stream) {
    if (d < 0) throw ds4::Error("store_row: negative row size");
    if (d == 0) return;
    launch_kernel(store_row_kernel, blocks_for(d), kThreads, 0, stream, row, d, f16_round, dst,
                  nullptr);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void gather_rows(const float *ring, int64_t window, int64_t first, int64_t n_raw, const float *comp,
                 const int32_t *selected, int64_t n_sel, int64_t d, float *out,
                 cudaStream_t stream) {
    if (d <= 0 || n_raw < 0 || n_sel < 0 || first < 0 || n_raw > window)
        throw ds4::Error("gather_rows: bad window or row geometry");
    const int64_t n_rows = n_raw + n_sel;
    if (n_rows == 0) return;
    if (n_rows > 0x7fffffff) throw ds4::Error("gather_rows: too many rows");
    launch_kernel(gather_rows_kernel, unsigned(n_rows), 128, 0, stream, ring, window, first, n_raw,
                  comp, selected, d, out, nullptr, int64_t(0), int64_t(0));
    DS4_CUDA_CHECK(cudaGetLastError());
}

void compressor_push(const float *kv_in, const float *sc_in, const float *ape_row, int64_t width,
                     int64_t slot, float *state_kv, float *state_score, cudaStream_t stream) {
    if (width < 0 || slot < 0) throw ds4::Error("compressor_push: bad width or slot");
    if (width == 0) return;
    launch_kernel(compressor_push_kernel, blocks_for(width), kThreads, 0, stream, kv_in, sc_in,
                  ape_row, width, slot, state_kv, state_score, nullptr);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void compressor_pool(const float *state_kv, const float *state_score, int ratio, bool overlap,
                     int64_t d, int64_t width, float *pooled, cudaStream_t stream) {
    if (ratio < 1 || d < 0 || width < (overlap ? 2 * d : d))
        throw ds4::Error("compressor_pool: ratio must be at least 1 and width cover the columns");
    if (d == 0) return;
    // Small blocks: d is a few hundred columns, spread over as many multiprocessors as it allows.
    constexpr int kPoolThreads = 64;
    launch_kernel(compressor_pool_kernel, blocks_for(d, kPoolThreads), kPoolThreads, 0, stream,
                  state_kv, state_score, ratio, overlap, d, width, pooled);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void compressor_shift(float *state_kv, float *state_score, int ratio, int64_t width,
                      cudaStream_t stream) {
    if (ratio < 1 || width < 0) throw ds4::Error("compressor_shift: bad ratio or width");
    const int64_t n = int64_t(ratio) * width;
    if (n == 0) return;
    launch_kernel(compressor_shift_kernel, blocks_for(n), kThreads, 0, stream, state_kv,
                  state_score, n, nullptr);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void store_row_at(const float *row, int64_t d, bool f16_round, float *base, const int64_t *index,
                  cudaStream_t stream) {
    if (d <= 0) throw ds4::Error("store_row_at: bad row size");
    launch_kernel(store_row_kernel, blocks_for(d), kThreads, 0, stream, row, d, f16_round, base,
                  index);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void gather_rows_step(const float *ring, int64_t window, const float *comp, const int32_t *selected,
                      const int64_t *words, int64_t max_rows, int64_t d, float *out,
                      cudaStream_t stream, int n_tokens, int64_t word_stride,
                      int64_t selected_stride) {
    if (d <= 0 || window <= 0 || max_rows <= 0 || max_rows > 0x7fffffff)
        throw ds4::Error("gather_rows_step: bad window or row geometry");
    if (n_tokens < 1 || n_tokens > 65535)
        throw ds4::Error("gather_rows_step: 1 to 65535 tokens a launch");
    launch_kernel(gather_rows_kernel, dim3(unsigned(max_rows), unsigned(n_tokens)), 128, 0, stream,
                  ring, window, int64_t(0), int64_t(0), comp, selected, d, out, words, word_stride,
                  selected_stride);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void compressor_push_step(const float *kv_in, const float *sc_in, const float *ape, int64_t width,
                          const int64_t *phase, int64_t slot_base, float *state_kv,
                          float *state_score, cudaStream_t stream) {
    if (width <= 0 || slot_base < 0) throw ds4::Error("compressor_push_step: bad width or slot");
    launch_kernel(compressor_push_kernel, blocks_for(width), kThreads, 0, stream, kv_in, sc_in, ape,
                  width, slot_base, state_kv, state_score, phase);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void compressor_shift_if(float *state_kv, float *state_score, int ratio, int64_t width,
                         const int64_t *when, cudaStream_t stream) {
    if (ratio < 1 || width <= 0) throw ds4::Error("compressor_shift_if: bad ratio or width");
    const int64_t n = int64_t(ratio) * width;
    launch_kernel(compressor_shift_kernel, blocks_for(n), kThreads, 0, stream, state_kv,
                  state_score, n, when);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
