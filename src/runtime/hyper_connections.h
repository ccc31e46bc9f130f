#pragma once
// Manifold-constrained hyper-connections (docs/MODEL.md 4.2): each sublayer reads a weighted sum of
// the n_hc residual streams and writes its output back into all of them through a doubly
// stochastic (Sinkhorn-normalised) mixing matrix.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/cpu_context.h"
#include "runtime/ops.h"

namespace ds4::runtime {

struct HcMix {
    std::vector<float> pre;   // n_hc input weights (not normalised)
    std::vector<float> post;  // n_hc output weights, in (0, 2)
    std::vector<float> comb;  // n_hc x n_hc, comb[i * n_hc + j] = C[i][j] (stream i -> j)
};

// For each of the m token states X (m x n_hc x n_embd): the mix (m x n_hc_mix: pre, post, comb;
// pack_mix's layout) and x_in = sum_h pre[h] X[h] (m x n_embd).
void hc_pre(ForwardContext &ctx, const HcWeights &hc, const float *X, int64_t m, float *mix,
            float *x_in);
// One token: X'[j] = post[j] y + sum_i C[i][j] X[i], from its packed mix (n_hc <= 16).
void hc_post(const float *mix, uint32_t n_hc, const float *y, uint32_t n_embd, float *X);
// The same for columns d0 .. d1 - 1 of every stream only (the parallel pieces of hc_post: a
// column's new values read only that column).
void hc_post_range(const float *mix, uint32_t n_hc, const float *y, uint32_t n_embd, uint32_t d0,
                   uint32_t d1, float *X);
// Columns per task when the CPU backend runs hc_post and hc_combine on the pool.
constexpr int64_t kHcGrain = 512;
// fn(t, d0, d1) over columns [d0, d1) of each of m tokens' n_embd columns, kHcGrain columns a
// task, all tokens in one loop on the pool (a task never spans two tokens).
template <class Fn>
void for_token_columns(backend::cpu::ThreadPool &pool, int64_t m, uint32_t n_embd, Fn &&fn) {
    const int64_t ranges = (int64_t(n_embd) + kHcGrain - 1) / kHcGrain;
    pool.parallel_for(m * ranges, 1, [&](int64_t i0, int64_t i1, int) {
        for (int64_t i = i0; i < i1; ++i) {
            const int64_t t = i / ranges, d0 = i % ranges * kHcGrain;
            fn(t, uint32_t(d0), uint32_t(std::min<int64_t>(n_embd, d0 + kHcGrain)));
        }
    });
}
// The output head's reduction of one token's streams to one vector (n_embd floats).
void hc_head(ForwardContext &ctx, const float *X, float *out);
// The output head's stream weights from its n mixer outputs: sigmoid(m[h] scale + base[h]) + eps.
void hc_head_weights(const float *m, float scale, const float *base, uint32_t n, float eps,
                     float *w);
// A mix as n_hc_mix floats: pre (n_hc), post (n_hc), comb (n_hc x n_hc).
void pack_mix(const HcMix &mix, float *out);

// The mix of one token from its n_hc_mix mixer outputs mt and the layer's scale[3] and base:
// pre = sigmoid(mt s0 + b) + eps, post = 2 sigmoid(mt s1 + b), comb = sinkhorn(mt s2 + b).
HcMix hc_mix_from(const float *mt, const float *scale, const float *base, uint32_t n_hc,
                  uint32_t sinkhorn_iters, float eps);
// x = sum_h pre[h] X[h] over one token's n_hc streams of n_embd values, in stream order.
void hc_combine(const float *pre, const float *X, uint32_t n_hc, uint32_t n_embd, float *x);
// The same for x[d0 .. d1 - 1] only.
void hc_combine_range(const float *pre, const float *X, uint32_t n_hc, uint32_t n_embd, uint32_t d0,
                      uint32_t d1, float *x);

// The Sinkhorn normalisation alone (exposed for tests): logits of an n x n matrix -> row-wise
// softmax + eps, then alternate column/row normalisation, `iters` passes in all.
std::vector<float> sinkhorn(const float *logits, uint32_t n, uint32_t iters, float eps);

}  // namespace ds4::runtime
