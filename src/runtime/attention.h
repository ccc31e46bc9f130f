#pragma once
// The attention sublayer of one layer for a batch of tokens (docs/MODEL.md 4.3, 4.9): low-rank
// queries, one shared KV head, a sliding window of raw rows plus compressed rows (all of them, or
// the indexer's top-k), a per-head sink logit, and the grouped low-rank output projection.
#include <cstdint>

#include "runtime/forward.h"

namespace ds4::runtime {

// XN: the normalised sublayer inputs of the batch (n x n_embd), positions p0..p0+n-1. Appends
// the tokens' rows to `state` in position order and writes the outputs (n x n_embd) to Y.
void attention_batch(ForwardContext &ctx, uint32_t il, LayerState &state, const float *XN,
                     int64_t p0, int64_t n, float *Y);

}  // namespace ds4::runtime
