#pragma once
// One head's attention output from its scores (docs/MODEL.md 4.3), the CPU reference for the GPU
// twin: s_j <- s_j * scale; m = max(sink, max_j s_j); e_j = exp(s_j - m);
// o = (sum_j e_j v_j) / (exp(sink - m) + sum_j e_j), sums in row order. K = V = the row; the
// sink logit is in the denominator only.
#include <cstddef>
#include <cstdint>

namespace ds4::backend::cpu {

// scores: n_rows unscaled scores (scaled in place); rows: n_rows x d; o: d values.
void attention_mix_head(float *scores, size_t n_rows, float scale, float sink, const float *rows,
                        uint32_t d, float *o);

}  // namespace ds4::backend::cpu
