#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/row_device.cuh"
#include "backend/cuda/row_finish.h"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kThreads = 256;  // the rms_norm kernel's block: the same reduction order
constexpr int kMaxD = 1024;

// Row r of p, by the whole block.
__device__ __forceinline__ void finish_row(const RowFinish &p, int64_t r) {
    __shared__ float v[kMaxD];
    __shared__ double part[kThreads / 32];
    __shared__ float s_scale;
    const int64_t d = p.d;
    const int t = threadIdx.x;
    const int64_t token = p.rows_per_token ? r / p.rows_per_token : 0;
    const int64_t *pos = p.pos ? p.pos + token * p.word_stride : nullptr;
    const int64_t *index = p.index ? p.index + token * p.word_stride : nullptr;
    if (index && *index < 0) return;  // nothing to store (the whole block agrees)
    for (int64_t i = t; i < d; i += kThreads)
        v[i] = p.state_kv
                   ? dev::pool_column(p.state_kv, p.state_score, p.ratio, p.overlap, d, p.width, i)
                   : p.rows[r * d + i];
    __syncthreads();
    if (p.norm) {
        const float scale =
            dev::rms_scale<kThreads>([&](int64_t i) { return v[i]; }, d, p.eps, part, &s_scale);
        for (int64_t i = t; i < d; i += kThreads)
            v[i] =
                p.norm_w ? __fmul_rn(__fmul_rn(v[i], scale), p.norm_w[i]) : __fmul_rn(v[i], scale);
        __syncthreads();
    }
    if (p.freqs) {
        for (int64_t k = t; k < p.n_freq; k += kThreads)
            dev::rope_pair(v + d - 2 * p.n_freq, k, p.freqs[k], *pos, false);
        __syncthreads();
    }
    if (p.rounding == RowRounding::Fp8) {
        const int warp = t / 32;
        for (int64_t b = warp; b * 64 < p.n_fp8; b += kThreads / 32)
            dev::block_sim<false>(v + b * 64, min(int64_t(64), p.n_fp8 - b * 64), 448.0f, 1e-4f);
        __syncthreads();
    } else if (p.rounding == RowRounding::Indexer) {
        dev::indexer_qat_row(v, d);
    }
    if (p.table) {
        float *dst = p.table + (index ? *index : 0) * d;
        for (int64_t i = t; i < d; i += kThreads)
            dst[i] = p.f16 ? dev::f16_bits_to_f32(dev::f32_to_f16_bits(v[i])) : v[i];
    } else {
        for (int64_t i = t; i < d; i += kThreads) p.out[r * d + i] = v[i];
    }
}

__global__ void __launch_bounds__(kThreads) row_finish_kernel(const RowFinish p) {
    dev::wait_for_previous_kernels();
    finish_row(p, blockIdx.x);
}

__global__ void __launch_bounds__(kThreads)
    row_finish_pair_kernel(const RowFinish a, const RowFinish b) {
    dev::wait_for_previous_kernels();
    const int64_t r = blockIdx.x;
    if (r < a.n_rows)
        finish_row(a, r);
    else
        finish_row(b, r - a.n_rows);
}

// compressor_push_kernel's stores, the pooled row, compressor_shift_kernel's copies, in that
// order, barriers between them (global writes of the block are visible to it after one).
__global__ void __launch_bounds__(kThreads)
    compressor_step_kernel(const CompressorStep c, const RowFinish p) {
    dev::wait_for_previous_kernels();
    const int64_t ph = *c.phase, slot = c.slot_base + ph;
    for (int64_t j = threadIdx.x; j < c.width; j += kThreads) {
        c.state_kv[slot * c.width + j] = c.kv[j];
        c.state_score[slot * c.width + j] = __fadd_rn(c.score[j], c.ape[ph * c.width + j]);
    }
    __syncthreads();
    if (*p.index < 0) return;  // the window goes on (the whole block agrees)
    finish_row(p, 0);
    if (!c.shift) return;
    __syncthreads();  // the pool has read the window
    const int64_t n = int64_t(p.ratio) * c.width;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
        c.state_kv[i] = c.state_kv[n + i];
        c.state_score[i] = c.state_score[n + i];
    }
}

void check(const RowFinish &p);

}  // namespace

void row_finish(const RowFinish &p, cudaStream_t stream) {
    check(p);
    if (p.n_rows <= 0) return;
    launch_kernel(row_finish_kernel, unsigned(p.n_rows), kThreads, 0, stream, p);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void row_finish_pair(const RowFinish &a, const RowFinish &b, cudaStream_t stream) {
    check(a);
    check(b);
    if (a.n_rows <= 0 || b.n_rows <= 0) {
        row_finish(a, stream);
        row_finish(b, stream);
        return;
    }
    launch_kernel(row_finish_pair_kernel, unsigned(a.n_rows + b.n_rows), kThreads, 0, stream, a, b);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void compressor_step(const CompressorStep &c, const RowFinish &f, cudaStream_t stream) {
    check(f);
    if (!f.state_kv || f.state_kv != c.state_kv || f.state_score != c.state_score || !f.index ||
        !f.table || !c.phase || c.width != f.width || c.width <= 0 || c.slot_base < 0 ||
        (c.shift && !f.overlap))
        throw ds4::Error("compressor_step: the push, the pool and the store of one window");
    launch_kernel(compressor_step_kernel, 1, kThreads, 0, stream, c, f);
    DS4_CUDA_CHECK(cudaGetLastError());
}

namespace {

void check(const RowFinish &p) {
    if (p.d <= 0 || p.d > kMaxD) throw ds4::Error("row_finish: rows of 1 to 1024 values");
    if (p.freqs && (2 * p.n_freq > p.d || !p.pos))
        throw ds4::Error("row_finish: a rotation needs a position and at most d rotary values");
    if (p.rounding == RowRounding::Indexer && (p.d & (p.d - 1)) != 0)
        throw ds4::Error("row_finish: the indexer rounding needs a power-of-two length");
    if (p.rounding == RowRounding::Fp8 && (p.n_fp8 < 0 || p.n_fp8 > p.d))
        throw ds4::Error("row_finish: FP8 values beyond the row");
    if (p.state_kv && p.n_rows != 1) throw ds4::Error("row_finish: pooling takes one row");
    if (p.table && p.n_rows != 1 && p.rows_per_token != 1)
        throw ds4::Error("row_finish: storing takes one row a token");
    if (p.rows_per_token < 0 || (p.rows_per_token > 0 && p.n_rows % p.rows_per_token != 0))
        throw ds4::Error("row_finish: rows must be whole tokens");
    if (!p.state_kv && !p.rows) throw ds4::Error("row_finish: no source");
    if (!p.table && !p.out) throw ds4::Error("row_finish: no destination");
}

}  // namespace
}  // namespace ds4::cuda
