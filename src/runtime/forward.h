#pragma once
// DeepSeek V4's model order (docs/MODEL.md 4.8, 4.9): a batch of tokens at positions n_past.. ->
// the last token's logits, appending the tokens to the attention state. One order for every
// backend, stated against runtime/ops.h; the sublayers' orders are in attention.cpp and moe.cpp.
// The same code serves decode (a batch of one) and prefill (a chunk).
#include <cstdint>
#include <span>
#include <vector>

#include "model/hparams.h"
#include "model/weights.h"
#include "runtime/forward_options.h"
#include "runtime/layer_stages.h"
#include "runtime/ops.h"

namespace ds4::runtime {

// Evaluates `tokens` at positions n_past().. and appends them; `logits` receives the logits
// after the last one (n_vocab floats). Each stage runs its range of layers on its backend, in
// order: the first embeds the tokens, each hands the token states (n x n_hc x n_embd floats) to
// the next, the last applies the output head. The stages' ranges are consecutive and cover every
// layer (LayerStages checks it); one stage is the whole model on one backend. Throws, before
// evaluating anything, for an empty batch, an id outside the vocabulary or a batch that does not
// fit the context.
void forward(std::span<const Stage> stages, const model::HParams &hp, const model::ModelWeights &w,
             std::span<const int32_t> tokens, std::vector<float> &logits);

}  // namespace ds4::runtime
