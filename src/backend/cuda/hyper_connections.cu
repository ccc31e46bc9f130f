#include "backend/cuda/cuda_check.h"
#include "backend/cuda/hyper_connections.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/row_device.cuh"
#include "common/error.h"

namespace ds4::cuda {
namespace {

__device__ __forceinline__ float sigmoid(float z) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, dev::exp_f(-z)));
}

// runtime/hyper_connections.cpp hc_mix_from's pre weight of stream h.
__device__ __forceinline__ float pre_weight(const float *mt, const float *s, const float *b, int h,
                                            float eps) {
    return __fadd_rn(sigmoid(__fadd_rn(__fmul_rn(mt[h], s[0]), b[h])), eps);
}

// runtime/hyper_connections.cpp hc_mix_from and sinkhorn, one thread per entry of comb (n^2
// threads): thread (i, j) owns comb[i][j] and computes the row or column sum it divides by itself,
// in the CPU's order (so every thread of a row or column gets the same sum, bit for bit), which
// makes a normalisation pass n additions deep instead of n^2. Sums read the other threads' values
// from shared memory between barriers.
__global__ void hc_mix_kernel(const float *mt, const float *s, const float *b, int n, int iters,
                              float eps, float *pre, float *post, float *comb) {
    dev::wait_for_previous_kernels();
    __shared__ float c[kMaxHcStreams * kMaxHcStreams];
    const int t = threadIdx.x, i = t / n, j = t % n;
    for (int h = t; h < 2 * n; h += blockDim.x) {
        if (h < n)
            pre[h] = pre_weight(mt, s, b, h, eps);
        else
            post[h - n] = __fmul_rn(2.0f, sigmoid(__fadd_rn(__fmul_rn(mt[h], s[1]), b[h])));
    }
    // Row i's softmax: every thread of the row computes the row's logits, max and sum.
    auto logit = [&](int q) {
        const int k = 2 * n + i * n + q;
        return __fadd_rn(__fmul_rn(mt[k], s[2]), b[k]);
    };
    float mx = -INFINITY;
    for (int q = 0; q < n; ++q) {
        const float l = logit(q);
        mx = mx < l ? l : mx;  // std::max
    }
    float sum = 0.0f, mine = 0.0f;
    for (int q = 0; q < n; ++q) {
        const float e = dev::exp_f(__fsub_rn(logit(q), mx));
        sum = __fadd_rn(sum, e);
        if (q == j) mine = e;
    }
    c[t] = __fadd_rn(__fdiv_rn(mine, sum), eps);
    auto normalize = [&](bool cols) {
        __syncthreads();
        float total = 0.0f;
        for (int q = 0; q < n; ++q) total = __fadd_rn(total, cols ? c[q * n + j] : c[i * n + q]);
        const float v = __fdiv_rn(c[t], __fadd_rn(total, eps));
        __syncthreads();
        c[t] = v;
    };
    normalize(true);
    for (int it = 1; it < iters; ++it) {
        normalize(false);
        normalize(true);
    }
    comb[t] = c[t];
}

// hc_mix then hc_combine in one launch, for n^2 <= 32 (the model's n is 4). Block 0's warp 0
// computes the mix with lane i n + j owning comb[i][j], every sum gathered by shuffles in the
// CPU's order (no barrier between Sinkhorn passes). The other blocks combine the streams, a value
// per thread; each computes the pre weights itself (pre does not depend on Sinkhorn), so the
// combination runs beside the Sinkhorn passes instead of after them. The bits are hc_mix's and
// hc_combine's. `parts` (HcMixParts): block 0 stops after pre and post (WithoutComb), or the
// grid is block 0 alone and writes comb only (CombOnly).
constexpr int kMixCombineThreads = 256;

__global__ void __launch_bounds__(kMixCombineThreads)
    hc_mix_combine_kernel(const float *mt, const float *s, const float *b, int n, int iters,
                          float eps, float *pre, float *post, float *comb,
                          const float *__restrict__ X, int64_t e, float *__restrict__ x,
                          HcMixParts parts) {
    dev::wait_for_previous_kernels();
    const int t = threadIdx.x;
    {  // the token of a batch (hc_mix_combine's n_tokens)
        const int64_t b = blockIdx.y, n_mix = 2 * n + n * n;
        mt += b * n_mix, pre += b * n_mix, post += b * n_mix, comb += b * n_mix;
        X += b * n * e, x += b * e;
    }
    if (blockIdx.x > 0) {
        __shared__ float s_pre[kMaxHcStreams];
        if (t < n) s_pre[t] = pre_weight(mt, s, b, t, eps);
        __syncthreads();
        const int64_t d = int64_t(blockIdx.x - 1) * kMixCombineThreads + t;
        if (d >= e) return;
        float acc = 0.0f;
        for (int h = 0; h < n; ++h) acc = __fadd_rn(acc, __fmul_rn(s_pre[h], X[h * e + d]));
        x[d] = acc;
        return;
    }
    if (t >= 32) return;
    const int nn = n * n, i = t / n, j = t % n;
    const bool mine = t < nn;
    if (parts != HcMixParts::CombOnly) {
        if (t < n)
            pre[t] = pre_weight(mt, s, b, t, eps);
        else if (t < 2 * n)
            post[t - n] = __fmul_rn(2.0f, sigmoid(__fadd_rn(__fmul_rn(mt[t], s[1]), b[t])));
    }
    if (parts == HcMixParts::WithoutComb) return;
    // Row i's softmax over its lanes: the max, then e_j and their sum in the order of j.
    const float l = mine ? __fadd_rn(__fmul_rn(mt[2 * n + t], s[2]), b[2 * n + t]) : 0.0f;
    const int row0 = mine ? i * n : 0;
    float mx = -INFINITY;
    for (int q = 0; q < n; ++q) {
        const float v = __shfl_sync(0xffffffffu, l, row0 + q);
        mx = mx < v ? v : mx;  // std::max
    }
    const float ex = dev::exp_f(__fsub_rn(l, mx));
    float sum = 0.0f;
    for (int q = 0; q < n; ++q) sum = __fadd_rn(sum, __shfl_sync(0xffffffffu, ex, row0 + q));
    float c = __fadd_rn(__fdiv_rn(ex, sum), eps);
    auto normalize = [&](bool cols) {
        float total = 0.0f;
        for (int q = 0; q < n; ++q) {
            const int src = mine ? (cols ? q * n + j : i * n + q) : 0;
            total = __fadd_rn(total, __shfl_sync(0xffffffffu, c, src));
        }
        c = __fdiv_rn(c, __fadd_rn(total, eps));
    };
    normalize(true);
    for (int it = 1; it < iters; ++it) {
        normalize(false);
        normalize(true);
    }
    if (mine) comb[t] = c;
}

__global__ void hc_combine_kernel(const float *__restrict__ pre, const float *__restrict__ X, int n,
                                  int64_t e, float *__restrict__ x) {
    dev::wait_for_previous_kernels();
    const int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (d >= e) return;
    float acc = 0.0f;
    for (int h = 0; h < n; ++h) acc = __fadd_rn(acc, __fmul_rn(pre[h], X[h * e + d]));
    x[d] = acc;
}

__global__ void hc_post_kernel(const float *__restrict__ post, const float *__restrict__ comb,
                               const float *__restrict__ y, int n, int64_t e, float *X) {
    dev::wait_for_previous_kernels();
    const int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (d >= e) return;
    {  // the token of a batch (hc_post's n_tokens)
        const int64_t b = blockIdx.y, n_mix = 2 * n + n * n;
        post += b * n_mix, comb += b * n_mix, y += b * e, X += b * n * e;
    }
    float xi[kMaxHcStreams];
    for (int i = 0; i < n; ++i) xi[i] = X[i * e + d];
    for (int j = 0; j < n; ++j) {
        float acc = __fmul_rn(post[j], y[d]);
        for (int i = 0; i < n; ++i) acc = __fadd_rn(acc, __fmul_rn(comb[i * n + j], xi[i]));
        X[j * e + d] = acc;
    }
}

// hc_post of one token whose y is the MoE's sum of its slots and shared output, formed here in
// sum_slots' order (moe_ops.h) and stored to y as well.
__global__ void hc_post_slots_kernel(const float *__restrict__ post, const float *__restrict__ comb,
                                     const float *__restrict__ slots, int n_slots,
                                     const float *__restrict__ shared, float *__restrict__ y, int n,
                                     int64_t e, float *X) {
    dev::wait_for_previous_kernels();
    const int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (d >= e) return;
    float yd = 0.0f;
    for (int i = 0; i < n_slots; ++i) yd = __fadd_rn(yd, slots[int64_t(i) * e + d]);
    if (shared) yd = __fadd_rn(yd, shared[d]);
    y[d] = yd;
    float xi[kMaxHcStreams];
    for (int i = 0; i < n; ++i) xi[i] = X[i * e + d];
    for (int j = 0; j < n; ++j) {
        float acc = __fmul_rn(post[j], yd);
        for (int i = 0; i < n; ++i) acc = __fadd_rn(acc, __fmul_rn(comb[i * n + j], xi[i]));
        X[j * e + d] = acc;
    }
}

// runtime/hyper_connections.cpp hc_head's stream weights, a thread per stream.
__global__ void hc_head_weights_kernel(const float *mt, const float *s, const float *b, int n,
                                       float eps, float *w) {
    dev::wait_for_previous_kernels();
    const int h = threadIdx.x;
    if (h < n) w[h] = __fadd_rn(sigmoid(__fadd_rn(__fmul_rn(mt[h], s[0]), b[h])), eps);
}

void check_streams(int n) {
    if (n < 1 || n > kMaxHcStreams)
        throw ds4::Error("hyper-connections on the GPU take 1 to 8 streams");
}

void check_tokens(int n_tokens) {
    if (n_tokens < 1 || n_tokens > 65535)
        throw ds4::Error("hyper-connections on the GPU take 1 to 65535 tokens a launch");
}

}  // namespace

void hc_mix(const float *mixes, const float *scale, const float *base, int n, int sinkhorn_iters,
            float eps, float *pre, float *post, float *comb, cudaStream_t stream) {
    check_streams(n);
    launch_kernel(hc_mix_kernel, 1, n * n, 0, stream, mixes, scale, base, n, sinkhorn_iters, eps,
                  pre, post, comb);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void hc_mix_combine(const float *mixes, const float *scale, const float *base, int n,
                    int sinkhorn_iters, float eps, float *pre, float *post, float *comb,
                    const float *X, int64_t e, float *x, cudaStream_t stream, int n_tokens,
                    HcMixParts parts) {
    check_streams(n);
    check_tokens(n_tokens);
    if (!hc_mix_parts_split(
            n)) {  // more entries than a warp's lanes: the two kernels, token by token
        if (parts != HcMixParts::All)
            throw ds4::Error("hc_mix_combine: split parts need at most 32 entries of comb");
        const int64_t n_mix = 2 * n + n * n;
        for (int64_t t = 0; t < n_tokens; ++t) {
            const int64_t o = t * n_mix;
            hc_mix(mixes + o, scale, base, n, sinkhorn_iters, eps, pre + o, post + o, comb + o,
                   stream);
            hc_combine(pre + o, X + t * n * e, n, e, x + t * e, stream);
        }
        return;
    }
    const unsigned combine_blocks =
        parts == HcMixParts::CombOnly ? 0
                                      : unsigned((e + kMixCombineThreads - 1) / kMixCombineThreads);
    launch_kernel(hc_mix_combine_kernel, dim3(1 + combine_blocks, unsigned(n_tokens)),
                  parts == HcMixParts::CombOnly ? 32 : kMixCombineThreads, 0, stream, mixes, scale,
                  base, n, sinkhorn_iters, eps, pre, post, comb, X, e, x, parts);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void hc_post_slots(const float *post, const float *comb, const float *slots, int n_slots,
                   const float *shared, float *y, int n, int64_t e, float *X, cudaStream_t stream) {
    check_streams(n);
    if (e == 0) return;
    launch_kernel(hc_post_slots_kernel, unsigned((e + 255) / 256), 256, 0, stream, post, comb,
                  slots, n_slots, shared, y, n, e, X);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void hc_head_weights(const float *mixes, const float *scale, const float *base, int n, float eps,
                     float *w, cudaStream_t stream) {
    check_streams(n);
    launch_kernel(hc_head_weights_kernel, 1, n, 0, stream, mixes, scale, base, n, eps, w);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void hc_combine(const float *pre, const float *X, int n, int64_t e, float *x, cudaStream_t stream) {
    check_streams(n);
    if (e == 0) return;
    launch_kernel(hc_combine_kernel, unsigned((e + 255) / 256), 256, 0, stream, pre, X, n, e, x);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void hc_post(const float *post, const float *comb, const float *y, int n, int64_t e, float *X,
             cudaStream_t stream, int n_tokens) {
    check_streams(n);
    check_tokens(n_tokens);
    if (e == 0) return;
    launch_kernel(hc_post_kernel, dim3(unsigned((e + 255) / 256), unsigned(n_tokens)), 256, 0,
                  stream, post, comb, y, n, e, X);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
