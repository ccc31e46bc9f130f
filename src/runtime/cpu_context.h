#pragma once
// What the CPU backend's operations share (runtime/cpu_ops.h): the model, the threads, scratch,
// and the two RoPE tables, with the matrix products every sublayer's CPU code calls.
#include <cstdint>

#include "backend/cpu/activations.h"
#include "backend/cpu/rope.h"
#include "backend/cpu/thread_pool.h"
#include "experts/expert_source.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "runtime/cpu_profile.h"
#include "runtime/forward_options.h"
#include "runtime/kv_cache.h"

namespace ds4::runtime {

struct ForwardContext {
    const model::HParams &hp;
    const model::ModelWeights &w;
    backend::cpu::ThreadPool &pool;
    experts::ExpertSource &experts;
    ForwardOptions opts;
    backend::cpu::ScratchBuffer scratch;
    backend::cpu::RopeFreqs rope_plain, rope_yarn;
    CpuProfile profile;  // DS4_CPU_PROFILE

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
    // Scratch of the routed experts' shared input: all tokens, and one expert's rows of them;
    // and of a batch's gate, up and down outputs (a prefill chunk's are ~50 MB together: reused,
    // not cleared, from one step to the next).
    backend::cpu::ScratchBuffer expert_input, expert_rows;
    backend::cpu::ScratchBuffer expert_gate, expert_up, expert_down;
};

}  // namespace ds4::runtime
