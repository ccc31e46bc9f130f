#pragma once
// DeepSeek V4 on the CPU: a batch of tokens at positions n_past.. -> the last token's logits,
// updating the KV cache (docs/MODEL.md 4.8, 4.9). One code path serves decode (a batch of one) and
// prefill (a chunk): matrix products run over the whole batch, so each weight is read once per
// chunk, while the per-token state updates (raw window, compressors, indexer, attention) run in
// position order. Each output element is computed by the same kernel call in both cases, so
// prefill-then-decode equals decode-only bit for bit.
//
// The order of operations lives here and in the sublayer files beside it (hyper_connections,
// attention, compressor, indexer, moe); the arithmetic of each operation lives in backend/cpu.
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/activations.h"
#include "backend/cpu/rope.h"
#include "backend/cpu/thread_pool.h"
#include "experts/expert_source.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "runtime/kv_cache.h"

namespace ds4::runtime {

struct ForwardOptions {
    // Simulate the FP8 KV and Hadamard+FP4 indexer quantization the model was trained with
    // (docs/MODEL.md 4.0). Off only to compare with references that omit it (transformers).
    bool qat_sim = true;
    // Round as llama.cpp's CPU backend does, for comparisons with it only (docs/LLAMACPP.md):
    // activations of F16 weights are rounded to f16 (ggml converts them to the weight's type),
    // and the route weight scales each expert's output after W2 instead of its input before.
    // Both are equal to the default in exact arithmetic; ds4 keeps f32 (docs/MODEL.md 4.6, 10.4).
    bool llama_cpp_rounding = false;
};

// Everything a sublayer needs: the model, the threads, scratch, and the two RoPE tables.
struct ForwardContext {
    const model::HParams &hp;
    const model::ModelWeights &w;
    backend::cpu::ThreadPool &pool;
    experts::ExpertSource &experts;
    ForwardOptions opts;
    backend::cpu::ScratchBuffer scratch;
    backend::cpu::RopeFreqs rope_plain, rope_yarn;

    ForwardContext(const model::HParams &hp, const model::ModelWeights &w,
                   backend::cpu::ThreadPool &pool, experts::ExpertSource &experts,
                   ForwardOptions opts);
    const backend::cpu::RopeFreqs &rope_for_layer(uint32_t il) const {
        return hp.compress_ratio[il] == 0 ? rope_plain : rope_yarn;
    }
    // Y = X W^T for m input rows (a 2-D weight: rows = ne[1], row length = ne[0]).
    void linear(model::Tensor w, const float *X, float *Y, int64_t m = 1);
    // Same over `n_rows` rows starting at row `row0` of a 2-D tensor.
    void linear_rows(model::Tensor w, int64_t row0, int64_t n_rows, const float *X, float *Y,
                     int64_t m = 1);
    // Y = X W^T for a dense matrix of n_rows rows of k values in `type` (with the activation
    // rounding that opts asks for).
    void matmul(GgmlType type, const void *w, int64_t n_rows, int64_t k, const float *X, int64_t m,
                float *Y);
    // The two halves of matmul, for an input that several matrices of one type share (the
    // routed experts' gate and up): X quantized once into `buffer` (valid until its next use),
    // then any number of products with those rows.
    backend::cpu::ActivationRows quantize(GgmlType type, const float *X, int64_t m, int64_t k,
                                          backend::cpu::ScratchBuffer &buffer);
    void matmul(GgmlType type, const void *w, int64_t n_rows, const backend::cpu::ActivationRows &x,
                float *Y);
    // Scratch of the routed experts' shared input: all tokens, and one expert's rows of them.
    backend::cpu::ScratchBuffer expert_input, expert_rows;
};

// Hyper-connection state of one token: n_hc streams of n_embd values, stream-major.
using HcState = std::vector<float>;

// One batch of tokens: ids and absolute positions.
struct Batch {
    std::vector<int32_t> tokens;
    int64_t p0 = 0;  // position of tokens[0]
    int64_t n() const { return static_cast<int64_t>(tokens.size()); }
};

class Forward {
  public:
    explicit Forward(ForwardContext &ctx) : ctx_(ctx) {}
    // Evaluates `tokens` at positions cache.n_past.. and appends them; returns the logits after
    // the last one (n_vocab floats).
    const std::vector<float> &eval(const std::vector<int32_t> &tokens, KvCache &cache);

  private:
    ForwardContext &ctx_;
    std::vector<float> logits_;
};

}  // namespace ds4::runtime
