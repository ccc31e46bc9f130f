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

// One part of a model split by tensors (runtime/tensor_shards.h): its backend (with its own
// attention state of every layer), the part's hyper-parameters and weights, and the first of its
// rows of the vocabulary.
struct TensorRank {
    Ops *ops = nullptr;
    const model::HParams *hp = nullptr;
    const model::ModelWeights *w = nullptr;
    uint64_t vocab_begin = 0;
};

// As forward, with the model split by tensors over `ranks` (hp: the whole model's): each
// sublayer runs on every rank, the ranks' partial outputs are added (in rank order, through host
// memory) and every rank continues from the sum; the logits are the ranks' rows put together.
void forward_tensor_split(std::span<const TensorRank> ranks, const model::HParams &hp,
                          std::span<const int32_t> tokens, std::vector<float> &logits);

}  // namespace ds4::runtime
