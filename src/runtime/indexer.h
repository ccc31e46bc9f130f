#pragma once
// The lightning indexer of ratio-4 layers (docs/MODEL.md 4.5): scores every visible compressed row
// from the indexer's own compressed cache and keeps the top-k for attention.
#include <cstdint>
#include <vector>

#include "runtime/cpu_context.h"

namespace ds4::runtime {

// Rows (ascending) of the attention compressed cache that token p attends to: all visible rows
// when there are at most top_k of them, else the top_k by indexer score. `q` is the token's
// indexer query (n_idx_head x idx_head_dim, projected, not yet rotated) and `w` its per-head
// weights (n_idx_head, projected, not yet scaled); q is rotated and rounded in place. Both may
// be null where the token sees at most top_k rows (then unused); a selection without them throws.
std::vector<uint32_t> indexer_select(ForwardContext &ctx, uint32_t il, const LayerState &state,
                                     float *q, float *w, int64_t p);

}  // namespace ds4::runtime
