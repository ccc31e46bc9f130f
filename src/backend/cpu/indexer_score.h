#pragma once
// The lightning indexer's scoring and selection (docs/MODEL.md 4.5), runtime/indexer.cpp's
// arithmetic as the CPU reference for the GPU twin (backend/cuda/indexer_ops.h):
//   w'_h = w_h * wscale (one f32 product per head);
//   score_c = sum_h max(q_h . k_c, 0) * w'_h, every dot product and the sum over heads in f32,
//     in index order, each product and addition rounded on its own (never fused);
//   selection: the k best scores, ties to the lower row, returned in ascending row order.
#include <cstdint>

namespace ds4::backend::cpu {

// q: [n_heads][head_dim]; w: [n_heads] (not modified: the scaled weights are a copy);
// rows: [n_rows][head_dim] back to back; score: [n_rows].
void indexer_scores(const float *q, const float *w, float wscale, const float *rows,
                    uint32_t n_rows, uint32_t n_heads, uint32_t head_dim, float *score);

// out: the k (<= n) indices of the largest scores, a larger score first and the lower index on
// ties (std::partial_sort with that order, as the runtime selects), in ascending index order.
// With a NaN score the order is not a strict weak order and the result is not defined.
void top_k_ascending(const float *score, uint32_t n, uint32_t k, uint32_t *out);

}  // namespace ds4::backend::cpu
