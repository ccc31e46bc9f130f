#pragma once
// The feed-forward sublayer (docs/MODEL.md 4.6): a router picks n_expert_used routed experts (by
// score, or by a token-id table on hash layers), each a clamped SwiGLU weighted before its down
// projection, plus the always-on shared expert.
#include <cstdint>
#include <vector>

#include "runtime/forward.h"

namespace ds4::runtime {

struct Routing {
    std::vector<uint32_t> experts;  // in selection order
    std::vector<float> weights;     // normalised and scaled
};

// Router decision of layer il for one token from its router logits (n_expert floats).
Routing route(ForwardContext &ctx, uint32_t il, const float *logits, int32_t token);

// For each token t of the batch: Y[t] = sum_i w_i * expert_i(XN[t]) + shared(XN[t]), summed in
// selection order. Each expert's rows are read once per batch, for all tokens routed to it.
void moe_batch(ForwardContext &ctx, uint32_t il, const float *XN,
               const std::vector<int32_t> &tokens, float *Y);

}  // namespace ds4::runtime
