#pragma once
// The per-row chains of a decode step's attention (runtime/attention.cpp, compressor.cpp), one
// launch each instead of one per operation, built from the device functions the separate
// kernels use (row_device.cuh) in their order, so the bits are theirs:
//   source -> rms_norm (weights optional) -> rope_tail at *pos -> rounding -> destination
// The source is a row (n_rows rows of d values, a block each), or a compressor window pooled
// column by column (compressor_pool); the destination `out` may be the source. Rounding is none,
// FP8 E4M3 on the first n_fp8 values in blocks of 64 (fp8_e4m3_sim), or the indexer's Hadamard +
// FP4 (indexer_qat). The destination is `out`, or row *index of a table (store_row_at, f16-rounded
// or not; nothing when *index < 0: a compressor row is only pooled and stored where its window
// completes).
#include <cuda_runtime.h>

#include <cstdint>

namespace ds4::cuda {

enum class RowRounding { None, Fp8, Indexer };

struct RowFinish {
    int64_t d = 0;                // values per row, at most 1024
    int64_t n_rows = 1;           // rows of `rows` (one when pooling or storing)
    const float *rows = nullptr;  // the source rows
    float *out = nullptr;         // the destination rows when `table` is null (may be `rows`)
    // pooling instead of `rows`: the window as compressor_pool reads it
    const float *state_kv = nullptr, *state_score = nullptr;
    int ratio = 0;
    bool overlap = false;
    int64_t width = 0;
    bool norm = true;
    const float *norm_w = nullptr;  // null: no weights
    float eps = 0.0f;
    const double *freqs = nullptr;  // null: no rotation
    int64_t n_freq = 0;
    const int64_t *pos = nullptr;
    RowRounding rounding = RowRounding::None;
    int64_t n_fp8 = 0;
    float *table = nullptr;  // store to table + *index * d
    const int64_t *index = nullptr;
    bool f16 = false;
    // Several tokens' rows in one launch (prefill): row r belongs to token r / rows_per_token,
    // whose position is at pos + token word_stride and, storing one row a token, whose table
    // index is at index + token word_stride. 0: every row is one token's.
    int64_t rows_per_token = 0;
    int64_t word_stride = 0;
};

void row_finish(const RowFinish &p, cudaStream_t stream);
// row_finish(a) and row_finish(b) in one launch (independent rows: the attention's q heads and
// its KV row), each row the bits of its own launch.
void row_finish_pair(const RowFinish &a, const RowFinish &b, cudaStream_t stream);

// A decode step's compressor in one launch (a block): the token's push (kv_ops.h
// compressor_push_step: its rows kv and score, plus ape's row of *phase, into slot slot_base +
// *phase of the window), then where the window completes (*f.index >= 0) f's pooled row
// (f.state_kv and f.state_score are the window) and, with shift, the window's shift
// (compressor_shift_if). The bits of those three launches.
struct CompressorStep {
    const float *kv = nullptr, *score = nullptr, *ape = nullptr;
    int64_t width = 0;
    const int64_t *phase = nullptr;
    int64_t slot_base = 0;
    float *state_kv = nullptr, *state_score = nullptr;
    bool shift = false;
};
void compressor_step(const CompressorStep &c, const RowFinish &f, cudaStream_t stream);

}  // namespace ds4::cuda
