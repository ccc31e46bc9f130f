#pragma once
// The CPU's attention core (runtime/ops.h attention_core): per token, in position order, the KV
// row into the window ring, the compressors and the indexer (docs/MODEL.md 4.3-4.5), then
// attention over the rows the token sees: the raw window (oldest first), then the compressed
// rows (all, or the indexer's top-k), with the sink logit in the denominator.
#include <cstdint>

#include "runtime/cpu_context.h"
#include "runtime/kv_cache.h"
#include "runtime/ops.h"

namespace ds4::runtime {

void attention_core_cpu(ForwardContext &ctx, uint32_t il, LayerState &state,
                        const AttentionInputs &in, int64_t p0, int64_t n, float *O);

}  // namespace ds4::runtime
