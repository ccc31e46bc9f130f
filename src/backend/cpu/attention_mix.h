#pragma once
// One head's attention output from its scores (docs/MODEL.md 4.3), the CPU reference for the GPU
// twin: s_j <- s_j * scale; m = max(sink, max_j s_j); e_j = exp(s_j - m);
// o = (sum_j e_j v_j) / (exp(sink - m) + sum_j e_j), sums in row order. K = V = the row; the
// sink logit is in the denominator only.
#include <cstddef>
#include <cstdint>

namespace ds4::backend::cpu {

// n rows of d values, contiguous.
struct RowSegment {
    const float *rows = nullptr;
    size_t n = 0;
};

// scores: one unscaled score per row of the segments, in order (scaled in place); the rows are
// the segments' rows one after the other (a token's raw window, then its compressed rows); o: d
// values. Where the rows lie changes nothing: the same operations in the same order.
void attention_mix_head(float *scores, const RowSegment *segments, size_t n_segments, float scale,
                        float sink, uint32_t d, float *o);

// attention_mix_head in two steps, for a caller that splits a head's output over threads by its
// values: attention_softmax turns the n_rows scores into the weights e_j (in place) and returns
// the denominator; attention_mix_range writes values [d0, d1) of o from them. Together they do
// attention_mix_head's operations in its order: the same bits.
float attention_softmax(float *scores, size_t n_rows, float scale, float sink);
void attention_mix_range(const float *weights, const RowSegment *segments, size_t n_segments,
                         float denominator, uint32_t d, uint32_t d0, uint32_t d1, float *o);
// attention_mix_range over values [d0, d0 + kMixValues) of n_heads heads at once (head h: weights
// + h * weights_stride, denominators[h], o + h * d), every row read once per four heads.
constexpr uint32_t kMixValues = 64;
void attention_mix_heads(const float *weights, size_t weights_stride, const float *denominators,
                         size_t n_heads, const RowSegment *segments, size_t n_segments, uint32_t d,
                         uint32_t d0, float *o);

// The same over n_rows contiguous rows.
inline void attention_mix_head(float *scores, size_t n_rows, float scale, float sink,
                               const float *rows, uint32_t d, float *o) {
    const RowSegment all{rows, n_rows};
    attention_mix_head(scores, &all, 1, scale, sink, d, o);
}

}  // namespace ds4::backend::cpu
