#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_ops.h"
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
__global__ void __launch_bounds__(kThreads)
    route_kernel(const float *__restrict__ logits, RouteDeviceParams p,
                 int32_t *__restrict__ experts, float *__restrict__ weights) {
    dev::wait_for_previous_kernels();
    logits += int64_t(blockIdx.x) * p.n_expert;
    experts += int64_t(blockIdx.x) * p.n_used;
    weights += int64_t(blockIdx.x) * p.n_used;
    if (p.token) p.token += blockIdx.x;
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

__global__ void swiglu_kernel(const float *__restrict__ g, const float *__restrict__ u,
                              int64_t total, int64_t n, float clamp,
                              const float *__restrict__ weights, float *__restrict__ out) {
    dev::wait_for_previous_kernels();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const bool on = clamp > 1e-6f;
    // std::min and std::clamp's comparisons, so that a NaN passes through as on the CPU
    const float gi = on && clamp < g[i] ? clamp : g[i];
    const float ui = !on ? u[i] : u[i] < -clamp ? -clamp : clamp < u[i] ? clamp : u[i];
    const float w = weights ? weights[i / n] : 1.0f;
    out[i] = __fmul_rn(__fmul_rn(silu(gi), ui), w);
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

unsigned blocks_for(int64_t n) {
    return unsigned((n + kThreads - 1) / kThreads);
}

}  // namespace

void route_experts(const float *logits, const RouteDeviceParams &p, int32_t *experts,
                   float *weights, cudaStream_t stream, int n_tokens) {
    if (p.n_expert == 0 || p.n_expert > 1024 || p.n_used == 0 || p.n_used > 64 ||
        p.n_used > p.n_expert)
        throw ds4::Error("route_experts: the CUDA router takes up to 1024 experts, 64 selected");
    if (p.hash_table && (!p.token || p.hash_rows <= 0))
        throw ds4::Error("route_experts: a hash table needs the token and its row count");
    if (n_tokens <= 0) return;
    launch_kernel(route_kernel, unsigned(n_tokens), kThreads, 0, stream, logits, p, experts,
                  weights);
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

void sum_slots(const float *o, int n_slots, int64_t n, const float *shared, float *y,
               cudaStream_t stream, int n_tokens) {
    if (n == 0 || n_tokens <= 0) return;
    if (n_tokens > 65535) throw ds4::Error("sum_slots: at most 65535 tokens a launch");
    launch_kernel(sum_slots_kernel, dim3(blocks_for(n), unsigned(n_tokens)), kThreads, 0, stream, o,
                  n_slots, n, shared, y);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
