#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_ops.h"
#include "backend/cuda/quantize_block.cuh"
#include "backend/cuda/row_device.cuh"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kThreads = 256;

// f32 log1p, correctly rounded but for double-rounding cases (as dev::exp_f).
__device__ __forceinline__ float log1p_f(float x) {
    return static_cast<float>(log1p(static_cast<double>(x)));
}

// backend/cpu/vector_ops.cpp softplus and silu, operation for operation.
__device__ __forceinline__ float softplus(float z) {
    if (z > 20.0f) return z;
    if (z < -20.0f) return dev::exp_f(z);
    return log1p_f(dev::exp_f(z));
}
__device__ __forceinline__ float silu(float x) {
    return __fmul_rn(x, __fdiv_rn(1.0f, __fadd_rn(1.0f, dev::exp_f(-x))));
}

// (value, index) order of the selection: larger value first, the lower index on ties.
__device__ __forceinline__ bool before(float v, int i, float w, int j) {
    return v > w || (v == w && i < j);
}

// One block per token: thread t owns experts t, t + 256, ...; n_used rounds of a block-wide
// argmax.
// The token of block b, by the whole block.
__device__ __forceinline__ void route_token(const float *__restrict__ logits, RouteDeviceParams p,
                                            int32_t *__restrict__ experts,
                                            float *__restrict__ weights, int64_t b) {
    logits += b * p.n_expert;
    experts += b * p.n_used;
    weights += b * p.n_used;
    if (p.token) p.token += b;
    __shared__ float prob[1024], biased[1024];
    __shared__ float best_v[kThreads / 32];
    __shared__ int best_i[kThreads / 32];
    __shared__ int chosen[64];
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    for (uint32_t e = t; e < p.n_expert; e += kThreads) {
        prob[e] = sqrtf(softplus(logits[e]));  // IEEE sqrt (no fast-math)
        biased[e] = p.bias ? __fadd_rn(prob[e], p.bias[e]) : prob[e];
    }
    __syncthreads();
    if (p.hash_table) {
        if (t == 0) {
            const int64_t token = min(max(int64_t(*p.token), int64_t(0)), p.hash_rows - 1);
            for (uint32_t i = 0; i < p.n_used; ++i) chosen[i] = p.hash_table[token * p.n_used + i];
        }
    } else {
        for (uint32_t round = 0; round < p.n_used; ++round) {
            float v = -INFINITY;
            int idx = 0x7fffffff;
            for (uint32_t e = t; e < p.n_expert; e += kThreads)
                if (before(biased[e], int(e), v, idx)) v = biased[e], idx = int(e);
            for (int off = 16; off > 0; off /= 2) {
                const float ov = __shfl_xor_sync(0xffffffffu, v, off);
                const int oi = __shfl_xor_sync(0xffffffffu, idx, off);
                if (before(ov, oi, v, idx)) v = ov, idx = oi;
            }
            if (lane == 0) best_v[warp] = v, best_i[warp] = idx;
            __syncthreads();
            if (t == 0) {
                float bv = best_v[0];
                int bi = best_i[0];
                for (int w = 1; w < kThreads / 32; ++w)
                    if (before(best_v[w], best_i[w], bv, bi)) bv = best_v[w], bi = best_i[w];
                chosen[round] = bi;
                biased[bi] = -INFINITY;  // out of the next rounds (indices break the tie)
            }
            __syncthreads();
        }
    }
    __syncthreads();
    if (t == 0) {
        float sum = 0.0f;
        for (uint32_t i = 0; i < p.n_used; ++i) sum = __fadd_rn(sum, prob[chosen[i]]);
        const float denom = p.normalize ? fmaxf(sum, 6.103515625e-5f) : 1.0f;
        for (uint32_t i = 0; i < p.n_used; ++i) {
            experts[i] = chosen[i];
            weights[i] = __fmul_rn(__fdiv_rn(prob[chosen[i]], denom), p.scale);
        }
    }
}

__global__ void __launch_bounds__(kThreads)
    route_kernel(const float *__restrict__ logits, RouteDeviceParams p,
                 int32_t *__restrict__ experts, float *__restrict__ weights) {
    dev::wait_for_previous_kernels();
    route_token(logits, p, experts, weights, blockIdx.x);
}

// One token: block 0 routes it, blocks 1.. quantize its 256-value blocks of x to Q8_K (the
// experts' activation; q8_k_quantize.h's bits), independent work in one launch.
__global__ void __launch_bounds__(kThreads)
    route_q8_K_kernel(const float *__restrict__ logits, RouteDeviceParams p,
                      int32_t *__restrict__ experts, float *__restrict__ weights,
                      const float *__restrict__ x, Q8_KActivation xk) {
    dev::wait_for_previous_kernels();
    if (blockIdx.x == 0) {
        route_token(logits, p, experts, weights, 0);
        return;
    }
    const int64_t b = blockIdx.x - 1, base = b * 256;
    dev::quantize_q8_K_block(x[base + threadIdx.x], xk.q + base, xk.d + b, xk.bsums + base / 16);
}

// Value i of swiglu_slots' output.
__device__ __forceinline__ float swiglu_at(const float *__restrict__ g, const float *__restrict__ u,
                                           int64_t i, int64_t n, float clamp,
                                           const float *__restrict__ weights) {
    const bool on = clamp > 1e-6f;
    // std::min and std::clamp's comparisons, so that a NaN passes through as on the CPU
    const float gi = on && clamp < g[i] ? clamp : g[i];
    const float ui = !on ? u[i] : u[i] < -clamp ? -clamp : clamp < u[i] ? clamp : u[i];
    const float w = weights ? weights[i / n] : 1.0f;
    return __fmul_rn(__fmul_rn(silu(gi), ui), w);
}

__global__ void swiglu_kernel(const float *__restrict__ g, const float *__restrict__ u,
                              int64_t total, int64_t n, float clamp,
                              const float *__restrict__ weights, float *__restrict__ out) {
    dev::wait_for_previous_kernels();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= total) return;
    out[i] = swiglu_at(g, u, i, n, clamp, weights);
}

// swiglu_kernel, and its output quantized in the same launch (total a multiple of 32, or of
// 256 for Q8_K): a warp per Q8_0 block, or a block of 256 threads per Q8_K block.
__global__ void swiglu_q8_0_kernel(const float *__restrict__ g, const float *__restrict__ u,
                                   int64_t total, int64_t n, float clamp,
                                   const float *__restrict__ weights, float *__restrict__ out,
                                   int8_t *__restrict__ xq, float *__restrict__ xd) {
    dev::wait_for_previous_kernels();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= total) return;  // whole warps: total is a multiple of 32
    const float v = swiglu_at(g, u, i, n, clamp, weights);
    out[i] = v;
    dev::quantize_q8_0_lane(v, xq + i / 32 * 32, xd + i / 32);
}

__global__ void __launch_bounds__(256)
    swiglu_q8_K_kernel(const float *__restrict__ g, const float *__restrict__ u, int64_t n,
                       float clamp, const float *__restrict__ weights, float *__restrict__ out,
                       Q8_KActivation x) {
    dev::wait_for_previous_kernels();
    const int64_t base = int64_t(blockIdx.x) * 256, i = base + threadIdx.x;
    const float v = swiglu_at(g, u, i, n, clamp, weights);
    out[i] = v;
    dev::quantize_q8_K_block(v, x.q + base, x.d + blockIdx.x, x.bsums + base / 16);
}

__global__ void split_ids_kernel(const int32_t *__restrict__ ids, int n, uint32_t mask,
                                 int32_t *__restrict__ in, int32_t *__restrict__ out) {
    dev::wait_for_previous_kernels();
    const int i = int(threadIdx.x);
    if (i >= n) return;
    const bool set = (mask >> i) & 1u;
    in[i] = set ? ids[i] : -1;
    out[i] = set ? -1 : ids[i];
}

__global__ void sum_slots_kernel(const float *__restrict__ o, int n_slots, int64_t n,
                                 const float *__restrict__ shared, float *__restrict__ y) {
    dev::wait_for_previous_kernels();
    const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (j >= n) return;
    o += int64_t(blockIdx.y) * n_slots * n;
    if (shared) shared += int64_t(blockIdx.y) * n;
    y += int64_t(blockIdx.y) * n;
    float acc = 0.0f;
    for (int i = 0; i < n_slots; ++i) acc = __fadd_rn(acc, o[int64_t(i) * n + j]);
    if (shared) acc = __fadd_rn(acc, shared[j]);
    y[j] = acc;
}

void check_route(const RouteDeviceParams &p) {
    if (p.n_expert == 0 || p.n_expert > 1024 || p.n_used == 0 || p.n_used > 64 ||
        p.n_used > p.n_expert)
        throw ds4::Error("route_experts: the CUDA router takes up to 1024 experts, 64 selected");
    if (p.hash_table && (!p.token || p.hash_rows <= 0))
        throw ds4::Error("route_experts: a hash table needs the token and its row count");
}

unsigned blocks_for(int64_t n) {
    return unsigned((n + kThreads - 1) / kThreads);
}

}  // namespace

void route_experts(const float *logits, const RouteDeviceParams &p, int32_t *experts,
                   float *weights, cudaStream_t stream, int n_tokens) {
    check_route(p);
    if (n_tokens <= 0) return;
    launch_kernel(route_kernel, unsigned(n_tokens), kThreads, 0, stream, logits, p, experts,
                  weights);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void route_experts_q8_K(const float *logits, const RouteDeviceParams &p, int32_t *experts,
                        float *weights, const float *x, int64_t k, const Q8_KActivation &xk,
                        cudaStream_t stream) {
    check_route(p);
    if (k <= 0 || k % 256 != 0)
        throw ds4::Error("Q8_K activations must hold a multiple of 256 values");
    launch_kernel(route_q8_K_kernel, unsigned(1 + k / 256), kThreads, 0, stream, logits, p, experts,
                  weights, x, xk);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void swiglu_slots(const float *g, const float *u, int n_slots, int64_t n, float clamp,
                  const float *weights, float *out, cudaStream_t stream) {
    const int64_t total = int64_t(n_slots) * n;
    if (total == 0) return;
    launch_kernel(swiglu_kernel, blocks_for(total), kThreads, 0, stream, g, u, total, n, clamp,
                  weights, out);
    DS4_CUDA_CHECK(cudaGetLastError());
}

bool swiglu_slots_q8_0(const float *g, const float *u, int n_slots, int64_t n, float clamp,
                       const float *weights, float *out, int8_t *xq, float *xd,
                       cudaStream_t stream) {
    const int64_t total = int64_t(n_slots) * n;
    if (total == 0 || total % 32 != 0) return false;
    launch_kernel(swiglu_q8_0_kernel, blocks_for(total), kThreads, 0, stream, g, u, total, n, clamp,
                  weights, out, xq, xd);
    DS4_CUDA_CHECK(cudaGetLastError());
    return true;
}

bool swiglu_slots_q8_K(const float *g, const float *u, int n_slots, int64_t n, float clamp,
                       const float *weights, float *out, const Q8_KActivation &x,
                       cudaStream_t stream) {
    const int64_t total = int64_t(n_slots) * n;
    if (total == 0 || total % 256 != 0) return false;
    launch_kernel(swiglu_q8_K_kernel, unsigned(total / 256), 256, 0, stream, g, u, n, clamp,
                  weights, out, x);
    DS4_CUDA_CHECK(cudaGetLastError());
    return true;
}

void split_ids(const int32_t *ids, int n, uint32_t mask, int32_t *in, int32_t *out,
               cudaStream_t stream) {
    if (n < 0 || n > 32) throw ds4::Error("split_ids: 0 to 32 ids");
    if (n == 0) return;
    launch_kernel(split_ids_kernel, 1, 32, 0, stream, ids, n, mask, in, out);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void sum_slots(const float *o, int n_slots, int64_t n, const float *shared, float *y,
               cudaStream_t stream, int n_tokens) {
    if (n == 0 || n_tokens <= 0) return;
    if (n_tokens > 65535) throw ds4::Error("sum_slots: at most 65535 tokens a launch");
    launch_kernel(sum_slots_kernel, dim3(blocks_for(n), unsigned(n_tokens)), kThreads, 0, stream, o,
                  n_slots, n, shared, y);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
