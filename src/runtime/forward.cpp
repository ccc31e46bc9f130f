#include "runtime/forward.h"

#include <fmt/format.h>

#include <cstring>

#include "backend/cpu/matmul.h"
#include "backend/cpu/vector_ops.h"
#include "common/error.h"
#include "quant/kernels_ref.h"
#include "quant/quant.h"
#include "runtime/attention.h"
#include "runtime/hyper_connections.h"
#include "runtime/moe.h"

namespace ds4::runtime {

ForwardContext::ForwardContext(const model::HParams &hp_, const model::ModelWeights &w_,
                               backend::cpu::ThreadPool &pool_, experts::ExpertSource &experts_,
                               ForwardOptions opts_)
    : hp(hp_),
      w(w_),
      pool(pool_),
      experts(experts_),
      opts(opts_),
      rope_plain(backend::cpu::RopeFreqs::plain(hp_.n_rot, hp_.rope_freq_base)),
      rope_yarn(backend::cpu::RopeFreqs::yarn(hp_.n_rot, hp_.compress_rope_freq_base,
                                              hp_.rope_scaling_factor, double(hp_.rope_orig_ctx),
                                              hp_.yarn_beta_fast, hp_.yarn_beta_slow)) {}

backend::cpu::ActivationRows ForwardContext::quantize(GgmlType type, const float *X, int64_t m,
                                                      int64_t k,
                                                      backend::cpu::ScratchBuffer &buffer) {
    if (!opts.llama_cpp_rounding)
        return backend::cpu::quantize_activations(pool, buffer, type, X, m, k);
    if (type == GgmlType::F16) {  // ggml converts the activations to the weight's type
        auto *rounded = static_cast<float *>(buffer.reserve(sizeof(float) * size_t(m * k)));
        for (int64_t i = 0; i < m * k; ++i)
            rounded[i] = quant::ref::f16_to_f32(quant::ref::f32_to_f16(X[i]));
        X = rounded;  // F16 weights take f32 rows: used in place
    }
    return backend::cpu::quantize_activations(pool, buffer, type, X, m, k,
                                              backend::cpu::ActivationRounding::LlamaCpp);
}

void ForwardContext::matmul(GgmlType type, const void *w, int64_t n_rows,
                            const backend::cpu::ActivationRows &x, float *Y) {
    backend::cpu::matmul_activations(pool, backend::cpu::dense_matrix(type, w, n_rows, x.k), x, Y);
}

void ForwardContext::matmul(GgmlType type, const void *w, int64_t n_rows, int64_t k, const float *X,
                            int64_t m, float *Y) {
    matmul(type, w, n_rows, quantize(type, X, m, k, scratch), Y);
}

void ForwardContext::linear(model::Tensor t, const float *X, float *Y, int64_t m) {
    matmul(t->type, t->data, static_cast<int64_t>(t->ne[1]), static_cast<int64_t>(t->ne[0]), X, m,
           Y);
}
void ForwardContext::linear_rows(model::Tensor t, int64_t row0, int64_t n_rows, const float *X,
                                 float *Y, int64_t m) {
    matmul(t->type, t->data + row0 * t->row_bytes(), n_rows, static_cast<int64_t>(t->ne[0]), X, m,
           Y);
}

const std::vector<float> &Forward::eval(const std::vector<int32_t> &tokens, KvCache &cache) {
    const model::HParams &hp = ctx_.hp;
    const model::ModelWeights &w = ctx_.w;
    const uint32_t E = hp.n_embd, HC = hp.n_hc;
    const int64_t n = static_cast<int64_t>(tokens.size()), p0 = cache.n_past;
    if (n == 0) throw Error("eval of an empty batch");
    for (int32_t token : tokens)
        if (token < 0 || static_cast<uint32_t>(token) >= hp.n_vocab)
            throw Error(fmt::format("token id {} outside the vocabulary of {}", token, hp.n_vocab));
    if (p0 + n > cache.ctx)
        throw Error(fmt::format("context full: positions {}..{} do not fit a context of {} tokens",
                                p0, p0 + n - 1, cache.ctx));

    // Every token's n_hc streams start as its embedding.
    const size_t width = size_t(HC) * E;
    std::vector<float> X(n * width), e(E);
    for (int64_t t = 0; t < n; ++t) {
        quant::dequantize_row(w.token_embd->type,
                              w.token_embd->data + size_t(tokens[t]) * w.token_embd->row_bytes(),
                              e.data(), E);
        for (uint32_t h = 0; h < HC; ++h)
            std::copy(e.begin(), e.end(), X.begin() + t * width + size_t(h) * E);
    }

    std::vector<float> x_in, XN(n * E), Y(n * E);
    auto norm_rows = [&](model::Tensor weight) {
        for (int64_t t = 0; t < n; ++t)
            backend::cpu::rms_norm(x_in.data() + t * E,
                                   reinterpret_cast<const float *>(weight->data), XN.data() + t * E,
                                   E, hp.rms_eps);
    };
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        const model::LayerWeights &L = w.layers[il];
        auto mix = hc_pre(ctx_, L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base, X, n, x_in);
        norm_rows(L.attn_norm);
        attention_batch(ctx_, il, cache.layers[il], XN.data(), p0, n, Y.data());
        for (int64_t t = 0; t < n; ++t) hc_post(mix[t], Y.data() + t * E, E, X.data() + t * width);

        mix = hc_pre(ctx_, L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base, X, n, x_in);
        norm_rows(L.ffn_norm);
        moe_batch(ctx_, il, XN.data(), tokens, Y.data());
        for (int64_t t = 0; t < n; ++t) hc_post(mix[t], Y.data() + t * E, E, X.data() + t * width);
    }
    cache.n_past = p0 + n;

    // Only the last token's logits are needed.
    std::vector<float> head, normed(E);
    hc_head(ctx_, X.data() + (n - 1) * width, head);
    backend::cpu::rms_norm(head.data(), reinterpret_cast<const float *>(w.output_norm->data),
                           normed.data(), E, hp.rms_eps);
    logits_.resize(hp.n_vocab);
    ctx_.linear(w.output, normed.data(), logits_.data());
    return logits_;
}

}  // namespace ds4::runtime
