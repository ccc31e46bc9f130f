#pragma once
// The attention sublayer of one layer for a batch of tokens (docs/MODEL.md 4.3, 4.9): low-rank
// queries, one shared KV head, a sliding window of raw rows plus compressed rows (all of them, or
// the indexer's top-k), a per-head sink logit, and the grouped low-rank output projection.
#include <cstdint>

#include "model/hparams.h"
#include "model/weights.h"
#include "runtime/ops.h"

namespace ds4::runtime {

// XN: the normalised sublayer inputs of the batch (n x n_embd). Appends the tokens' rows to the
// attention state of layer il and writes the outputs (n x n_embd) to Y.
void attention_sublayer(Ops &ops, const model::HParams &hp, const model::LayerWeights &L,
                        uint32_t il, const float *XN, int64_t n, float *Y);

}  // namespace ds4::runtime
