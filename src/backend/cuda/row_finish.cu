#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/row_device.cuh"
#include "backend/cuda/row_finish.h"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kThreads = 256;  // the rms_norm kernel's block: the same reduction order
constexpr int kMaxD = 1024;

__global__ void __launch_bounds__(kThreads) row_finish_kernel(const RowFinish p) {
    dev::wait_for_previous_kernels();
    __shared__ float v[kMaxD];
    __shared__ double part[kThreads / 32];
    __shared__ float s_scale;
    const int64_t d = p.d, r = blockIdx.x;
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

}  // namespace

void row_finish(const RowFinish &p, cudaStream_t stream) {
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
    if (p.n_rows <= 0) return;
    launch_kernel(row_finish_kernel, unsigned(p.n_rows), kThreads, 0, stream, p);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
