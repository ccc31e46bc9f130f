#pragma once
// Decode attention of one token on the device, the twin of the CPU's (runtime/attention.cpp's
// attend with backend/cpu/attention_mix.h): H query heads of d values against n_rows visible
// rows (K = V = the row: the raw window, then the selected compressed rows).
//   attention_scores: scores[h][j] = f32(sum_i q[h][i] rows[j][i]), exact double products summed
//     in double (the F32 vec_dot of the CPU) on the double-precision tensor cores, four dims a
//     step in dim order, so equal to one f32 ulp but for heavy cancellation, and a batch's
//     scores a one-token launch's bits;
//   attention_mix: per head, the CPU's attention_mix_head: scores scaled in place, the sink in
//     the denominator only, e_j and the sums over rows in row order, unfused, so the only
//     difference is exp (double, rounded to f32, against the CPU's f32 libm call).
// The inverse RoPE on the output's tail is vector_ops.h rope_tail.
#include <cuda_runtime.h>

#include <cstdint>

namespace ds4::cuda {

// Several tokens in one launch (prefill): token t's q and o at + t n_heads d, its rows at
// + t n_rows d and its scores at + t n_heads n_rows (n_rows: the launch's, the most rows a token
// has), its row count at n_rows_dev + t word_stride.
struct AttentionTokens {
    int n = 1;
    int64_t word_stride = 0;
};

// Where one token's visible rows are, for reading them in place (no gathered copy): the words
// of kv_ops.h gather_rows_step, {first, n_raw, n_sel, use_selected} on the device. Row i <
// n_raw is the ring's row (first + i) % window, row n_raw + j the compressed row selected[j]
// where use_selected, else j. `rows` is then not read.
struct VisibleRows {
    const float *ring = nullptr;
    int64_t window = 0;
    const float *comp = nullptr;
    const int32_t *selected = nullptr;
    const int64_t *words = nullptr;
};

// One token's mix output as the grouped output projection takes it: the inverse RoPE of each
// head's tail (its last 2 n_freq values, at the position *pos) and the Q8_0 activation of all
// heads into xq, xd, in the mix's launch (vector_ops.h rope_tail_q8_0's operations, bit for
// bit). d a multiple of 32.
struct MixRopeQ8_0 {
    const double *freqs = nullptr;
    int64_t n_freq = 0;
    const int64_t *pos = nullptr;
    int8_t *xq = nullptr;
    float *xd = nullptr;
};

// q: [n_heads][d]; rows: [n_rows][d]; scores: [n_heads][n_rows] (all device). d a multiple of
// 32; q and rows 16-byte aligned.
// n_rows_dev (device, optional): the row count read on the device, at most n_rows (which then
// only sizes the grid), for a step captured once and replayed at every position.
void attention_scores(const float *q, const float *rows, int64_t n_rows, int64_t n_heads, int64_t d,
                      float *scores, cudaStream_t stream, const int64_t *n_rows_dev = nullptr,
                      AttentionTokens tokens = {}, const VisibleRows *visible = nullptr);

// scores as attention_scores wrote them (read only); sinks: [n_heads]; o: [n_heads][d]. Any d,
// any row count (e is staged a tile of rows at a time); one token with d a multiple of 32, and a
// batch with d a multiple of 4 from 260 to 512, read rows in 16-byte pieces (16-byte aligned).
// visible and rope_q8_0: one token only.
void attention_mix(float *scores, const float *rows, int64_t n_rows, const float *sinks,
                   float scale, int64_t n_heads, int64_t d, float *o, cudaStream_t stream,
                   const int64_t *n_rows_dev = nullptr, AttentionTokens tokens = {},
                   const VisibleRows *visible = nullptr, const MixRopeQ8_0 *rope_q8_0 = nullptr);

}  // namespace ds4::cuda
