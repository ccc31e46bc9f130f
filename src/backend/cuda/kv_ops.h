#pragma once
// The attention KV state of a decode step on the device (runtime/kv_cache.h, docs/MODEL.md 8.1),
// each the twin of a CPU loop. Cached rows live on the device as f32 values; where the CPU keeps
// them as f16 (RowStore with f16 rows), the device keeps the f32 value of that f16, so a row read
// back holds the floats RowStore::get returns.
//   store_row         RowStore::set then get: quant::ref::f32_to_f16 (round to nearest even,
//                     65520 and above to inf, NaN quieted with its top payload bits) then
//                     f16_to_f32, ported bit for bit (not __float2half_rn, whose NaN differs);
//                     or the row as it is;
//   gather_rows       attention_batch's visible rows: the raw window oldest first (ring slot
//                     (first + i) % window), then the selected compressed rows; copies;
//   compressor_push   runtime/compressor.cpp compressor_push's store of a token: the kv row, and
//                     score + ape (one f32 add), into the window's slot;
//   compressor_pool   backend/cpu/compressor_pool.h: per column, the max, then e = exp(s - max),
//                     den and num summed in candidate order, num / den, unfused; the only
//                     difference is exp (double, rounded to f32, against the CPU's f32 libm);
//                     a column with no written row (max -inf) pools 0 exactly;
//   compressor_shift  the overlapped window's roll after pooling: rows r..2r-1 to rows 0..r-1.
// The caller validates what is read on the device (the selected ids).
#include <cuda_runtime.h>

#include <cstdint>

namespace ds4::cuda {

// dst[i] = f16_round ? f32(f16_rne(row[i])) : row[i], i < d.
void store_row(const float *row, int64_t d, bool f16_round, float *dst, cudaStream_t stream);

// ring: [window][d]; comp: compressed rows [*][d]; out: [n_raw + n_sel][d]. Row i < n_raw of out
// is ring row (first + i) % window (first >= 0, n_raw <= window); row n_raw + j is comp row
// selected[j] (device ids), or comp row j when selected is null.
void gather_rows(const float *ring, int64_t window, int64_t first, int64_t n_raw, const float *comp,
                 const int32_t *selected, int64_t n_sel, int64_t d, float *out,
                 cudaStream_t stream);

// state_kv, state_score: [rows][width]. Row `slot` <- kv_in, and sc_in + ape_row (width each).
void compressor_push(const float *kv_in, const float *sc_in, const float *ape_row, int64_t width,
                     int64_t slot, float *state_kv, float *state_score, cudaStream_t stream);

// The state as compressor_push left it (rows = r, or 2 r with overlap; width = d, or 2 d with
// overlap); pooled: d values. ratio >= 1.
void compressor_pool(const float *state_kv, const float *state_score, int ratio, bool overlap,
                     int64_t d, int64_t width, float *pooled, cudaStream_t stream);

// Overlapped windows only: rows r..2r-1 of both arrays copied to rows 0..r-1.
void compressor_shift(float *state_kv, float *state_score, int ratio, int64_t width,
                      cudaStream_t stream);

// The same kernels with their position-dependent parameters read from device words, so that a
// decode step captured once as a CUDA graph replays at every position (the host writes the
// words before each replay):
//   store_row_at          dst = base + *index * d; nothing when *index < 0;
//   gather_rows_step      words = {first, n_raw, n_sel, use_selected}: gather_rows(ring, window,
//                         first, n_raw, comp, use_selected ? selected : nullptr, n_sel); grid for
//                         max_rows >= n_raw + n_sel;
//   compressor_push_step  slot = slot_base + *phase, ape row = ape + *phase * width;
//   compressor_shift_if   compressor_shift when *when >= 0 (the index of the row the window
//                         completed), else nothing.
// (Where a window completes the decode step pools, normalises, rotates, rounds and stores its row
// in one launch: row_finish.h, compared with compressor_pool and store_row_at here.)
void store_row_at(const float *row, int64_t d, bool f16_round, float *base, const int64_t *index,
                  cudaStream_t stream);
// gather_rows_step over n_tokens tokens at once (prefill): token t's words at words + t
// word_stride, its selected ids at selected + t selected_stride, its rows at out + t max_rows d.
void gather_rows_step(const float *ring, int64_t window, const float *comp, const int32_t *selected,
                      const int64_t *words, int64_t max_rows, int64_t d, float *out,
                      cudaStream_t stream, int n_tokens = 1, int64_t word_stride = 0,
                      int64_t selected_stride = 0);
void compressor_push_step(const float *kv_in, const float *sc_in, const float *ape, int64_t width,
                          const int64_t *phase, int64_t slot_base, float *state_kv,
                          float *state_score, cudaStream_t stream);
void compressor_shift_if(float *state_kv, float *state_score, int ratio, int64_t width,
                         const int64_t *when, cudaStream_t stream);

// A batch's tokens through a compressor (prefill): what compressor_push_step for each token t
// (its rows at kv, score + t width, slots from slot_base: 0, or ratio overlapped), the pool
// where t completes a window (phase ratio - 1) and with overlap the window's shift leave, bit
// for bit: the state, and the c-th completion's pooled row at pooled + c d. Windows are aligned,
// so token 0's phase (*phase, on the device) places them all; the pools run in parallel (a
// thread per completion and column, reading the batch's rows and the state as the batch found
// it), then the state is written. The rows still need row_finish (norm, rotation, rounding,
// store), one launch for all of them.
void compressor_batch(const float *kv, const float *score, const float *ape, int64_t d,
                      int64_t width, int ratio, bool overlap, int64_t slot_base,
                      const int64_t *phase, int n_tokens, float *state_kv, float *state_score,
                      float *pooled, cudaStream_t stream);

}  // namespace ds4::cuda
