#include "runtime/moe.h"

namespace ds4::runtime {

void moe_sublayer(Ops &ops, const model::HParams &hp, const model::LayerWeights &L, uint32_t il,
                  const float *XN, int64_t n, float *Y) {
    const size_t scratch = ops.mark();
    const uint32_t E = hp.n_embd, FS = hp.n_ff_exp * hp.n_expert_shared;
    // The routed experts (router, selection, the selected experts) are a branch beside the
    // shared expert; the sum joins them.
    float *logits = ops.buffer(n * hp.n_expert);
    float *slots = ops.buffer(n * hp.n_expert_used * E);
    ops.begin_branch();
    ops.linear(L.ffn_gate_inp, XN, logits, n);
    ops.moe_routed(il, XN, logits, n, slots);
    ops.end_branch();

    float *SG = ops.buffer(n * FS), *SU = ops.buffer(n * FS), *SD = ops.buffer(n * E);
    ops.linear(L.ffn_gate_shexp, XN, SG, n);
    ops.linear(L.ffn_up_shexp, XN, SU, n);
    ops.swiglu(SG, SU, n, FS, hp.swiglu_clamp[il]);
    ops.linear(L.ffn_down_shexp, SG, SD, n);
    ops.join_branch();
    ops.moe_sum(slots, SD, n, Y);
    ops.release(scratch);
}

}  // namespace ds4::runtime
