#include "backend/cuda/cuda_check.h"
#include "backend/cuda/vector_ops.h"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row; the double sum of squares is reduced in a fixed order.
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(const float *__restrict__ x, const float *__restrict__ w, float *__restrict__ y,
                    int64_t n, float eps) {
    __shared__ double part[kThreads / 32];
    __shared__ float s_scale;
    const float *xr = x + int64_t(blockIdx.x) * n;
    float *yr = y + int64_t(blockIdx.x) * n;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) ss += double(xr[i]) * double(xr[i]);
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
    for (int64_t i = threadIdx.x; i < n; i += kThreads)
        yr[i] = w ? __fmul_rn(__fmul_rn(xr[i], scale), w[i]) : __fmul_rn(xr[i], scale);
}

__global__ void rope_kernel(float *__restrict__ heads, int64_t n_heads, int64_t head_dim,
                            const double *__restrict__ freqs, int64_t n_freq,
                            const int64_t *__restrict__ pos, bool inverse) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_heads * n_freq) return;
    const int64_t h = i / n_freq, k = i % n_freq;
    float *x = heads + h * head_dim + head_dim - 2 * n_freq;
    const double theta = double(*pos) * freqs[k];
    const float c = static_cast<float>(cos(theta));
    const float s = static_cast<float>(inverse ? -sin(theta) : sin(theta));
    const float x0 = x[2 * k], x1 = x[2 * k + 1];
    x[2 * k] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    x[2 * k + 1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// backend/cpu/qat_sim.cpp, operation for operation.
__device__ float round_e4m3(float a) {
    if (a >= 448.0f) return 448.0f;
    int e;
    frexpf(a, &e);
    const int exp2 = max(e - 1, -6);
    const float step = ldexpf(1.0f, exp2 - 3);
    return fminf(448.0f, __fmul_rn(rintf(__fdiv_rn(a, step)), step));
}

__device__ float round_e2m1(float a) {
    const float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    int best = 0;
    float best_d = fabsf(a);
    for (int i = 1; i < 8; ++i) {
        const float d = fabsf(__fsub_rn(a, kValues[i]));
        if (d < best_d || (d == best_d && i % 2 == 0 && best % 2 == 1)) {
            best = i;
            best_d = d;
        }
    }
    return kValues[best];
}

__device__ float pow2_ceil(float r) {
    int e;
    const float m = frexpf(r, &e);
    return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

// One warp per block of up to 64 values (two per lane): amax, the power-of-two scale, rounding.
template <bool kFp4>
__device__ void block_sim(float *x, int64_t count, float qmax, float amax_floor) {
    const int lane = threadIdx.x % 32;
    float amax = 0.0f;
    for (int64_t i = lane; i < count; i += 32) amax = fmaxf(amax, fabsf(x[i]));
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = pow2_ceil(__fdiv_rn(fmaxf(amax, amax_floor), qmax));
    for (int64_t i = lane; i < count; i += 32) {
        const float q = __fdiv_rn(x[i], s);
        const float v = q < -qmax ? -qmax : qmax < q ? qmax : q;  // std::clamp
        const float r = kFp4 ? round_e2m1(fabsf(v)) : round_e4m3(fabsf(v));
        x[i] = __fmul_rn(copysignf(r, v), s);
    }
}

__global__ void fp8_kernel(float *x, int64_t n_rows, int64_t n, int64_t block) {
    const int64_t blocks_per_row = (n + block - 1) / block;
    const int64_t b = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    if (b >= n_rows * blocks_per_row) return;
    const int64_t row = b / blocks_per_row, start = (b % blocks_per_row) * block;
    block_sim<false>(x + row * n + start, min(block, n - start), 448.0f, 1e-4f);
}

// One block per vector: the butterflies of the CPU's loop, stage by stage, in shared memory.
__global__ void indexer_qat_kernel(float *x, int64_t n) {
    __shared__ float v[1024];
    float *xr = x + int64_t(blockIdx.x) * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v[i] = xr[i];
    __syncthreads();
    for (int64_t stride = 1; stride < n; stride *= 2) {
        for (int64_t t = threadIdx.x; t < n / 2; t += blockDim.x) {
            const int64_t j = (t / stride) * 2 * stride + t % stride;
            const float a = v[j], b = v[j + stride];
            v[j] = __fadd_rn(a, b);
            v[j + stride] = __fsub_rn(a, b);
        }
        __syncthreads();
    }
    const float scale = static_cast<float>(1.0 / sqrt(double(n)));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v[i] = __fmul_rn(v[i], scale);
    __syncthreads();
    // FP4 in blocks of 32: one warp per block.
    const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int64_t b = warp; b * 32 < n; b += warps)
        block_sim<true>(v + b * 32, min(int64_t(32), n - b * 32), 6.0f, 7.052966104933725e-38f);
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) xr[i] = v[i];
}

}  // namespace

void rms_norm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps,
              cudaStream_t stream) {
    if (n_rows == 0) return;
    rms_norm_kernel<<<unsigned(n_rows), kThreads, 0, stream>>>(x, w, y, n, eps);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void rope_tail(float *heads, int64_t n_heads, int64_t head_dim, const double *freqs, int64_t n_freq,
               const int64_t *pos, bool inverse, cudaStream_t stream) {
    if (2 * n_freq > head_dim) throw ds4::Error("rope_tail: more rotary dims than the head has");
    const int64_t total = n_heads * n_freq;
    if (total == 0) return;
    rope_kernel<<<unsigned((total + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        heads, n_heads, head_dim, freqs, n_freq, pos, inverse);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void fp8_e4m3_sim(float *x, int64_t n_rows, int64_t n, int64_t block, cudaStream_t stream) {
    if (block <= 0 || block > 64) throw ds4::Error("fp8_e4m3_sim: blocks of 1 to 64 values");
    const int64_t warps = n_rows * ((n + block - 1) / block);
    if (warps == 0) return;
    fp8_kernel<<<unsigned((warps * 32 + kThreads - 1) / kThreads), kThreads, 0, stream>>>(x, n_rows,
                                                                                          n, block);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void indexer_qat(float *x, int64_t n_rows, int64_t n, cudaStream_t stream) {
    if (n <= 0 || n > 1024 || (n & (n - 1)) != 0)
        throw ds4::Error("indexer_qat: the length must be a power of two up to 1024");
    if (n_rows == 0) return;
    indexer_qat_kernel<<<unsigned(n_rows), kThreads, 0, stream>>>(x, n);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
