#pragma once
// Hyper-connection glue of a decode step on the device (docs/MODEL.md 4.2), twins of
// runtime/hyper_connections.h, operation for operation and unfused:
//   hc_mix      hc_mix_from: pre, post and the Sinkhorn-normalised comb from the mixer outputs
//               (a thread per entry of comb); exp in double rounded to f32, against the CPU's f32
//               libm;
//   hc_combine  x = sum_h pre[h] X[h], in stream order;
//   hc_post     X'[j] = post[j] y + sum_i comb[i][j] X[i], in place, in stream order;
//   hc_head_weights  the output head's stream weights (its pre weights).
// The mixer outputs themselves are rms_norm (vector_ops.h) then matvec_float (float_matvec.h).
#include <cuda_runtime.h>

#include <cstdint>

namespace ds4::cuda {

constexpr int kMaxHcStreams = 8;

// mixes: 2 n + n^2 mixer outputs; scale: 3; base: 2 n + n^2; pre, post: n; comb: n^2 (device).
void hc_mix(const float *mixes, const float *scale, const float *base, int n, int sinkhorn_iters,
            float eps, float *pre, float *post, float *comb, cudaStream_t stream);

// The output head's stream weights from its n mixer outputs: w[h] = sigmoid(m[h] scale[0] +
// base[h]) + eps (runtime/hyper_connections.cpp hc_head); the head's vector is then hc_combine
// with these weights.
void hc_head_weights(const float *mixes, const float *scale, const float *base, int n, float eps,
                     float *w, cudaStream_t stream);

// What a hc_mix_combine launch writes: everything, or (a decode step's fork) pre, post and x
// without the Sinkhorn passes on one stream and comb alone on another, so that the passes (a
// warp's ~40 dependent divisions, the launch's whole length) run beside the sublayer, which
// needs only x; comb is first read by hc_post. Each part computes its outputs as the whole
// launch does, bit for bit.
enum class HcMixParts { All, WithoutComb, CombOnly };

// hc_mix then hc_combine(pre, X, n, e, x), one launch when n^2 <= 32 (a warp's lanes hold
// comb; the Sinkhorn sums are shuffles), the two kernels otherwise: the same bits either way.
// n_tokens > 1: that many tokens at once, token t's mixes, pre, post and comb at + t (2 n + n^2),
// its X at + t n e and its x at + t e (a batch's mix buffers, runtime/ops.h hc_pre).
// parts other than All need n^2 <= 32 (hc_mix_parts_split says whether a model has it).
void hc_mix_combine(const float *mixes, const float *scale, const float *base, int n,
                    int sinkhorn_iters, float eps, float *pre, float *post, float *comb,
                    const float *X, int64_t e, float *x, cudaStream_t stream, int n_tokens = 1,
                    HcMixParts parts = HcMixParts::All);
inline bool hc_mix_parts_split(int n) {
    return n * n <= 32;
}

// X: n streams of e values; x: e values.
void hc_combine(const float *pre, const float *X, int n, int64_t e, float *x, cudaStream_t stream);

// n_tokens > 1: token t's post and comb at + t (2 n + n^2), y at + t e, X at + t n e.
void hc_post(const float *post, const float *comb, const float *y, int n, int64_t e, float *X,
             cudaStream_t stream, int n_tokens = 1);

// One token: y = ((slots[0] + slots[1]) + ...) + shared (moe_ops.h sum_slots; shared may be
// null), stored, then hc_post with it, in one launch: the bits of sum_slots then hc_post.
void hc_post_slots(const float *post, const float *comb, const float *slots, int n_slots,
                   const float *shared, float *y, int n, int64_t e, float *X, cudaStream_t stream);

}  // namespace ds4::cuda
