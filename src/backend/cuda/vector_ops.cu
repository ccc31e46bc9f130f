#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quantize_block.cuh"
#include "backend/cuda/row_device.cuh"
#include "backend/cuda/vector_ops.h"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row; the double sum of squares is reduced in a fixed order.
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(const float *__restrict__ x, const float *__restrict__ w, float *__restrict__ y,
                    int64_t n, float eps) {
    dev::wait_for_previous_kernels();
    __shared__ double part[kThreads / 32];
    __shared__ float s_scale;
    const float *xr = x + int64_t(blockIdx.x) * n;
    float *yr = y + int64_t(blockIdx.x) * n;
    const float scale =
        dev::rms_scale<kThreads>([&](int64_t i) { return xr[i]; }, n, eps, part, &s_scale);
    for (int64_t i = threadIdx.x; i < n; i += kThreads)
        yr[i] = w ? __fmul_rn(__fmul_rn(xr[i], scale), w[i]) : __fmul_rn(xr[i], scale);
}

// Rows of a multiple of 4 values: grid (slices, rows). Every block of a row computes the row's
// whole double sum of squares (float4 loads, all a thread's in flight, the same order in each
// block: the same scale), then writes its slice of kSlice values. A row's latency is then one
// read of it, not a read and a write by one block. With xq (rows of a multiple of 32 values),
// the slice is also quantized to Q8_0 as quantize_q8_0_activation would quantize y: the 8 lanes
// of a block of 32 values take its amax by shuffles, each codes its 4 values.
constexpr int64_t kSlice = 1024;
__global__ void __launch_bounds__(kThreads)
    rms_norm_wide_kernel(const float *__restrict__ x, const float *__restrict__ w,
                         float *__restrict__ y, int64_t n, float eps, int8_t *__restrict__ xq,
                         float *__restrict__ xd) {
    dev::wait_for_previous_kernels();
    __shared__ double part[kThreads / 32];
    __shared__ float s_scale;
    const int64_t n4 = n / 4, row = blockIdx.y;
    const float4 *x4 = reinterpret_cast<const float4 *>(x + row * n);
    double ss = 0.0;
#pragma unroll 8
    for (int64_t i = threadIdx.x; i < n4; i += kThreads) {
        const float4 v = x4[i];
        ss += double(v.x) * double(v.x) + double(v.y) * double(v.y) +
              (double(v.z) * double(v.z) + double(v.w) * double(v.w));
    }
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int i = 0; i < kThreads / 32; ++i) t += part[i];
        s_scale = static_cast<float>(1.0 / sqrt(t / double(n) + double(eps)));
    }
    __syncthreads();
    const float scale = s_scale;
    float4 *y4 = reinterpret_cast<float4 *>(y + row * n);
    const float4 *w4 = reinterpret_cast<const float4 *>(w);
    const int64_t begin = int64_t(blockIdx.x) * (kSlice / 4), end = min(n4, begin + kSlice / 4);
    // Whole warps run every pass (the shuffles of a block of 32 need its 8 lanes).
    for (int64_t i0 = begin; i0 < end; i0 += kThreads) {
        const int64_t i = i0 + threadIdx.x;
        const bool in = i < end;
        float4 r = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (in) {
            const float4 v = x4[i];
            r = make_float4(__fmul_rn(v.x, scale), __fmul_rn(v.y, scale), __fmul_rn(v.z, scale),
                            __fmul_rn(v.w, scale));
            if (w) {
                const float4 g = w4[i];
                r = make_float4(__fmul_rn(r.x, g.x), __fmul_rn(r.y, g.y), __fmul_rn(r.z, g.z),
                                __fmul_rn(r.w, g.w));
            }
            y4[i] = r;
        }
        if (!xq) continue;
        // fmaxf ignores a NaN operand, as the CPU's std::fmax does.
        float amax = fmaxf(fmaxf(fabsf(r.x), fabsf(r.y)), fmaxf(fabsf(r.z), fabsf(r.w)));
        for (int o = 1; o < 8; o *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if (!in) continue;
        const float d = amax / 127.0f;
        const uint32_t codes = uint32_t(uint8_t(dev::q8_0_code(r.x, d))) |
                               uint32_t(uint8_t(dev::q8_0_code(r.y, d))) << 8 |
                               uint32_t(uint8_t(dev::q8_0_code(r.z, d))) << 16 |
                               uint32_t(uint8_t(dev::q8_0_code(r.w, d))) << 24;
        reinterpret_cast<uint32_t *>(xq + row * n)[i] = codes;
        if (threadIdx.x % 8 == 0) xd[(row * n) / 32 + i / 8] = __half2float(__float2half_rn(d));
    }
}

__global__ void rope_kernel(float *__restrict__ heads, int64_t n_heads, int64_t head_dim,
                            const double *__restrict__ freqs, int64_t n_freq,
                            const int64_t *__restrict__ pos, bool inverse, int64_t pos_stride) {
    dev::wait_for_previous_kernels();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_heads * n_freq) return;
    heads += int64_t(blockIdx.y) * n_heads * head_dim;  // the token of a batch
    pos += int64_t(blockIdx.y) * pos_stride;
    const int64_t h = i / n_freq, k = i % n_freq;
    dev::rope_pair(heads + h * head_dim + head_dim - 2 * n_freq, k, freqs[k], *pos, inverse);
}

// A thread per value, whole warps per Q8_0 block (head_dim a multiple of 32): the tail's pairs
// (x[2k], x[2k+1]) are lanes 2k and 2k + 1 of a warp, each computing its half of rope_pair's
// rotation from the other's value (a shuffle) with rope_pair's operations.
__global__ void rope_q8_0_kernel(float *__restrict__ heads, int64_t n_values, int64_t head_dim,
                                 const double *__restrict__ freqs, int64_t n_freq,
                                 const int64_t *__restrict__ pos, bool inverse,
                                 int8_t *__restrict__ xq, float *__restrict__ xd) {
    dev::wait_for_previous_kernels();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_values) return;  // whole warps: n_values is a multiple of 32
    const int64_t j = i % head_dim, tail = head_dim - 2 * n_freq;
    const float v = dev::rope_pair_lanes(heads[i], j, tail, freqs, *pos, inverse);
    if (j >= tail) heads[i] = v;
    dev::quantize_q8_0_lane(v, xq + i / 32 * 32, xd + i / 32);
}

__global__ void fp8_kernel(float *x, int64_t n_rows, int64_t n, int64_t block) {
    dev::wait_for_previous_kernels();
    const int64_t blocks_per_row = (n + block - 1) / block;
    const int64_t b = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    if (b >= n_rows * blocks_per_row) return;
    const int64_t row = b / blocks_per_row, start = (b % blocks_per_row) * block;
    dev::block_sim<false>(x + row * n + start, min(block, n - start), 448.0f, 1e-4f);
}

// One block per vector: the butterflies of the CPU's loop, stage by stage, in shared memory.
__global__ void indexer_qat_kernel(float *x, int64_t n) {
    dev::wait_for_previous_kernels();
    __shared__ float v[1024];
    float *xr = x + int64_t(blockIdx.x) * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v[i] = xr[i];
    dev::indexer_qat_row(v, n);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) xr[i] = v[i];
}

}  // namespace

namespace {

bool aligned16(const void *p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Whether the wide kernel may run: float4 rows, and in place only where one block owns a row
// (a block must not write values another block of the row still reads).
bool wide_rows(const float *x, const float *w, const float *y, int64_t n_rows, int64_t n) {
    const bool apart = y + n_rows * n <= x || x + n_rows * n <= y;
    return n % 4 == 0 && n_rows <= 65535 && aligned16(x) && aligned16(y) && (!w || aligned16(w)) &&
           (n <= kSlice || apart);
}

}  // namespace

void rms_norm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps,
              cudaStream_t stream) {
    if (n_rows == 0) return;
    if (wide_rows(x, w, y, n_rows, n)) {
        const dim3 grid(unsigned((n + kSlice - 1) / kSlice), unsigned(n_rows));
        launch_kernel(rms_norm_wide_kernel, grid, kThreads, 0, stream, x, w, y, n, eps, nullptr,
                      nullptr);
    } else {
        launch_kernel(rms_norm_kernel, unsigned(n_rows), kThreads, 0, stream, x, w, y, n, eps);
    }
    DS4_CUDA_CHECK(cudaGetLastError());
}

bool rms_norm_q8_0(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps,
                   int8_t *xq, float *xd, cudaStream_t stream) {
    if (n_rows == 0 || n % 32 != 0 || !wide_rows(x, w, y, n_rows, n) || !aligned16(xq))
        return false;
    const dim3 grid(unsigned((n + kSlice - 1) / kSlice), unsigned(n_rows));
    launch_kernel(rms_norm_wide_kernel, grid, kThreads, 0, stream, x, w, y, n, eps, xq, xd);
    DS4_CUDA_CHECK(cudaGetLastError());
    return true;
}

void rope_tail(float *heads, int64_t n_heads, int64_t head_dim, const double *freqs, int64_t n_freq,
               const int64_t *pos, bool inverse, cudaStream_t stream, int n_tokens,
               int64_t pos_stride) {
    if (2 * n_freq > head_dim) throw ds4::Error("rope_tail: more rotary dims than the head has");
    if (n_tokens < 1 || n_tokens > 65535) throw ds4::Error("rope_tail: 1 to 65535 tokens a launch");
    const int64_t total = n_heads * n_freq;
    if (total == 0) return;
    launch_kernel(rope_kernel,
                  dim3(unsigned((total + kThreads - 1) / kThreads), unsigned(n_tokens)), kThreads,
                  0, stream, heads, n_heads, head_dim, freqs, n_freq, pos, inverse, pos_stride);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void rope_tail_q8_0(float *heads, int64_t n_heads, int64_t head_dim, const double *freqs,
                    int64_t n_freq, const int64_t *pos, bool inverse, int8_t *xq, float *xd,
                    cudaStream_t stream) {
    if (2 * n_freq > head_dim || head_dim % 32 != 0)
        throw ds4::Error(
            "rope_tail_q8_0: heads of a multiple of 32 values, the rotary ones in them");
    const int64_t n = n_heads * head_dim;
    if (n == 0) return;
    launch_kernel(rope_q8_0_kernel, unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream,
                  heads, n, head_dim, freqs, n_freq, pos, inverse, xq, xd);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void fp8_e4m3_sim(float *x, int64_t n_rows, int64_t n, int64_t block, cudaStream_t stream) {
    if (block <= 0 || block > 64) throw ds4::Error("fp8_e4m3_sim: blocks of 1 to 64 values");
    const int64_t warps = n_rows * ((n + block - 1) / block);
    if (warps == 0) return;
    launch_kernel(fp8_kernel, unsigned((warps * 32 + kThreads - 1) / kThreads), kThreads, 0, stream,
                  x, n_rows, n, block);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void indexer_qat(float *x, int64_t n_rows, int64_t n, cudaStream_t stream) {
    if (n <= 0 || n > 1024 || (n & (n - 1)) != 0)
        throw ds4::Error("indexer_qat: the length must be a power of two up to 1024");
    if (n_rows == 0) return;
    launch_kernel(indexer_qat_kernel, unsigned(n_rows), kThreads, 0, stream, x, n);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
