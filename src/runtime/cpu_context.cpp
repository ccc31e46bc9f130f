#include "runtime/cpu_context.h"

#include "backend/cpu/matmul.h"
#include "quant/kernels_ref.h"

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

}  // namespace ds4::runtime
