#pragma once
// The feed-forward sublayer (docs/MODEL.md 4.6): the router's logits, the routed experts (each a
// clamped SwiGLU weighted before its down projection, one output slot per selected expert), the
// always-on shared expert, and their sum in selection order.
#include <cstdint>

#include "model/hparams.h"
#include "model/weights.h"
#include "runtime/ops.h"

namespace ds4::runtime {

// XN: the normalised sublayer inputs of the batch (n x n_embd); Y: the outputs (n x n_embd).
void moe_sublayer(Ops &ops, const model::HParams &hp, const model::LayerWeights &L, uint32_t il,
                  const float *XN, int64_t n, float *Y);

}  // namespace ds4::runtime
