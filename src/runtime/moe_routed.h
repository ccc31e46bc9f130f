#pragma once
// The CPU's routed experts (runtime/ops.h moe_routed, docs/MODEL.md 4.6): a router picks
// n_expert_used routed experts per token (by score, or by a token-id table on hash layers); the
// batch's (token, slot) pairs are grouped by expert so that each expert's rows are read once
// per batch, for all tokens routed to it; each is a clamped SwiGLU weighted before its down
// projection, written to its own slot.
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/cpu_context.h"

namespace ds4::runtime {

struct Routing {
    std::vector<uint32_t> experts;  // in selection order
    std::vector<float> weights;     // normalised and scaled
};

// Router decision of layer il for one token from its router logits (n_expert floats), with the
// experts' probabilities computed on ctx.pool when on_pool (not from inside a pool task).
Routing route(ForwardContext &ctx, uint32_t il, const float *logits, int32_t token, bool on_pool);

// slot_out: n x n_expert_used x n_embd.
void moe_routed_cpu(ForwardContext &ctx, uint32_t il, const float *XN, const float *logits,
                    std::span<const int32_t> tokens, float *slot_out);

}  // namespace ds4::runtime
