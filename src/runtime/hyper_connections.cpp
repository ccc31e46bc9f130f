#include "runtime/hyper_connections.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "backend/cpu/matmul.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/vector_ops.h"
#include "common/error.h"
#include "quant/quant.h"

namespace ds4::runtime {

using backend::cpu::sigmoid;

namespace {

// mixes = fn . (flat / rms(flat)) over each token's flattened n_hc x n_embd state.
// One token: the norm, then the product over the pool by rows of fn. A batch: a task is a few
// tokens, their norms and their product with all of fn's rows (a few dozen) while their
// flattened states (64 KiB each at the published widths) are in L2; split by fn's rows, every
// thread streamed every token's state from memory. The same bits either way (matmul.h).
std::vector<float> hc_mixes(ForwardContext &ctx, model::Tensor fn, const float *X, int64_t m) {
    const int64_t width = int64_t(ctx.hp.n_hc) * ctx.hp.n_embd, n_mix = fn->ne[1];
    std::vector<float> mixes(size_t(m * n_mix));
    if (m == 1) {
        std::vector<float> flat(static_cast<size_t>(width));
        backend::cpu::rms_norm(X, nullptr, flat.data(), width, ctx.hp.rms_eps);
        ctx.linear(fn, flat.data(), mixes.data(), 1);
        return mixes;
    }
    if (quant::kernels(fn->type).vec_dot_type != GgmlType::F32)
        throw Error("hc_pre: the mixer " + fn->name + " is " +
                    std::string(ggml_type_name(fn->type)) +
                    ", whose products take quantized activations (F32, F16 or BF16 expected)");
    constexpr int64_t kTokensPerTask = 8;
    const backend::cpu::WeightMatrix w =
        backend::cpu::dense_matrix(fn->type, fn->data, n_mix, width);
    // Each thread's block of states, written before it is read (not zero-filled: 512 KiB a
    // thread and a call at the published widths).
    std::vector<std::unique_ptr<float[]>> flat(size_t(ctx.pool.n_threads()));
    ctx.pool.parallel_for(m, kTokensPerTask, [&](int64_t t0, int64_t t1, int thread) {
        std::unique_ptr<float[]> &f = flat[size_t(thread)];
        if (!f) f = std::make_unique_for_overwrite<float[]>(size_t(kTokensPerTask * width));
        for (int64_t t = t0; t < t1; ++t)
            backend::cpu::rms_norm(X + t * width, nullptr, f.get() + (t - t0) * width, width,
                                   ctx.hp.rms_eps);
        const backend::cpu::ActivationRows x{GgmlType::F32, f.get(), t1 - t0, width,
                                             size_t(width) * sizeof(float)};
        backend::cpu::matmul_activations_here(w, x, mixes.data() + t0 * n_mix);
    });
    return mixes;
}

const float *f32(model::Tensor t) {
    return reinterpret_cast<const float *>(t->data);
}

}  // namespace

std::vector<float> sinkhorn(const float *logits, uint32_t n, uint32_t iters, float eps) {
    std::vector<float> c(size_t(n) * n);
    for (uint32_t i = 0; i < n; ++i) {
        float mx = -INFINITY;
        for (uint32_t j = 0; j < n; ++j) mx = std::max(mx, logits[i * n + j]);
        float sum = 0.0f;
        for (uint32_t j = 0; j < n; ++j) sum += (c[i * n + j] = std::exp(logits[i * n + j] - mx));
        for (uint32_t j = 0; j < n; ++j) c[i * n + j] = c[i * n + j] / sum + eps;
    }
    auto normalize_cols = [&] {
        for (uint32_t j = 0; j < n; ++j) {
            float s = 0.0f;
            for (uint32_t i = 0; i < n; ++i) s += c[i * n + j];
            for (uint32_t i = 0; i < n; ++i) c[i * n + j] /= (s + eps);
        }
    };
    auto normalize_rows = [&] {
        for (uint32_t i = 0; i < n; ++i) {
            float s = 0.0f;
            for (uint32_t j = 0; j < n; ++j) s += c[i * n + j];
            for (uint32_t j = 0; j < n; ++j) c[i * n + j] /= (s + eps);
        }
    };
    normalize_cols();
    for (uint32_t it = 1; it < iters; ++it) {
        normalize_rows();
        normalize_cols();
    }
    return c;
}

HcMix hc_mix_from(const float *mt, const float *s, const float *b, uint32_t n, uint32_t iters,
                  float eps) {
    HcMix mix;
    mix.pre.resize(n);
    mix.post.resize(n);
    for (uint32_t h = 0; h < n; ++h) {
        mix.pre[h] = sigmoid(mt[h] * s[0] + b[h]) + eps;
        mix.post[h] = 2.0f * sigmoid(mt[n + h] * s[1] + b[n + h]);
    }
    std::vector<float> logits(size_t(n) * n);
    for (uint32_t k = 0; k < n * n; ++k) logits[k] = mt[2 * n + k] * s[2] + b[2 * n + k];
    mix.comb = sinkhorn(logits.data(), n, iters, eps);
    return mix;
}

void hc_combine(const float *pre, const float *X, uint32_t n, uint32_t E, float *x) {
    hc_combine_range(pre, X, n, E, 0, E, x);
}

void hc_combine_range(const float *pre, const float *X, uint32_t n, uint32_t E, uint32_t d0,
                      uint32_t d1, float *x) {
    std::fill(x + d0, x + d1, 0.0f);
    for (uint32_t h = 0; h < n; ++h)
        for (uint32_t d = d0; d < d1; ++d) x[d] += pre[h] * X[size_t(h) * E + d];
}

void pack_mix(const HcMix &mix, float *out) {
    out = std::copy(mix.pre.begin(), mix.pre.end(), out);
    out = std::copy(mix.post.begin(), mix.post.end(), out);
    std::copy(mix.comb.begin(), mix.comb.end(), out);
}

void hc_pre(ForwardContext &ctx, const HcWeights &hc, const float *X, int64_t m, float *mix,
            float *x_in) {
    const uint32_t n = ctx.hp.n_hc, E = ctx.hp.n_embd, n_mix = ctx.hp.n_hc_mix();
    const std::vector<float> mixes = hc_mixes(ctx, hc.fn, X, m);
    std::vector<float> pre(size_t(m) * n);
    // Each token's Sinkhorn on its own (a batch's tokens on the pool, 16 a task).
    const auto mix_tokens = [&](int64_t t0, int64_t t1, int) {
        for (int64_t t = t0; t < t1; ++t) {
            const HcMix one = hc_mix_from(mixes.data() + t * n_mix, f32(hc.scale), f32(hc.base), n,
                                          ctx.hp.sinkhorn_iters, ctx.hp.hc_eps);
            pack_mix(one, mix + t * n_mix);
            std::copy(one.pre.begin(), one.pre.end(), pre.begin() + t * n);
        }
    };
    ctx.pool.parallel_for(m, 16, mix_tokens);  // one task (a decode step) runs inline
    // Each output's sum runs over the streams in order whatever the split.
    for_token_columns(ctx.pool, m, E, [&](int64_t t, uint32_t d0, uint32_t d1) {
        hc_combine_range(pre.data() + t * n, X + size_t(t) * n * E, n, E, d0, d1,
                         x_in + size_t(t) * E);
    });
}

void hc_post(const float *mix, uint32_t n, const float *y, uint32_t E, float *X) {
    hc_post_range(mix, n, y, E, 0, E, X);
}

void hc_post_range(const float *mix, uint32_t n, const float *y, uint32_t E, uint32_t d0,
                   uint32_t d1, float *X) {
    // Column d of every stream reads only column d: a range is updated in place through a
    // buffer of its n columns' new values.
    const float *post = mix + n, *comb = mix + 2 * n;
    constexpr uint32_t kMaxStreams = 16;
    if (n > kMaxStreams)
        throw Error("hc_post: " + std::to_string(n) + " hyper-connection streams, at most 16");
    float out[kMaxStreams];
    for (uint32_t d = d0; d < d1; ++d) {
        for (uint32_t j = 0; j < n; ++j) {
            float acc = post[j] * y[d];
            for (uint32_t i = 0; i < n; ++i) acc += comb[i * n + j] * X[size_t(i) * E + d];
            out[j] = acc;
        }
        for (uint32_t j = 0; j < n; ++j) X[size_t(j) * E + d] = out[j];
    }
}

void hc_head(ForwardContext &ctx, const float *X, float *out) {
    const uint32_t n = ctx.hp.n_hc, E = ctx.hp.n_embd;
    const std::vector<float> m = hc_mixes(ctx, ctx.w.output_hc_fn, X, 1);
    const float scale = f32(ctx.w.output_hc_scale)[0];
    const float *base = f32(ctx.w.output_hc_base);
    std::vector<float> wgt(n);
    hc_head_weights(m.data(), scale, base, n, ctx.hp.hc_eps, wgt.data());
    std::fill(out, out + E, 0.0f);
    for (uint32_t h = 0; h < n; ++h)
        for (uint32_t d = 0; d < E; ++d) out[d] += wgt[h] * X[size_t(h) * E + d];
}

void hc_head_weights(const float *m, float scale, const float *base, uint32_t n, float eps,
                     float *w) {
    for (uint32_t h = 0; h < n; ++h) w[h] = sigmoid(m[h] * scale + base[h]) + eps;
}

}  // namespace ds4::runtime
