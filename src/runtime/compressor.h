#pragma once
// The KV compressor of a compressed layer (docs/MODEL.md 4.4): every token adds a projected value
// row and a score row to a rolling window; when the token completes a window of `ratio` positions,
// a softmax over the window (per column) pools one compressed row, which is normalised, rotated
// at the window's first position and appended to the cache.
//
// Ratio 4 overlaps windows: its state holds the previous window (rows 0..3, first half of the
// columns) and the current one (rows 4..7, second half), and each pooled value mixes all 8.
#include <cstdint>

#include "runtime/cpu_context.h"

namespace ds4::runtime {

struct CompressorWeights {
    model::Tensor ape, kv, gate, norm;
};

// Feeds the token at position p (its projected kv and score rows, `width` = coff * d floats).
// Returns true and fills `row` (d floats) when the token completes a window; the caller applies
// the per-cache rounding and stores the row.
bool compressor_push(ForwardContext &ctx, uint32_t il, const CompressorWeights &cw,
                     CompressorState &state, uint32_t d, const float *kv, const float *sc,
                     int64_t p, float *row);

}  // namespace ds4::runtime
