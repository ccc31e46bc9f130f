#pragma once
// Per-vector operations of a decode step on the device, each the twin of a CPU function:
//   rms_norm      backend/cpu/vector_ops.h: sum of squares in double, scale rounded to f32 once,
//                 y = x * scale * w (unfused);
//   rope_tail     backend/cpu/rope.h: theta = p * f_k in double, cos/sin in double rounded to
//                 f32, x0 c - x1 s and x0 s + x1 c unfused; the position is read on the device;
//   fp8_e4m3_sim  backend/cpu/qat_sim.h, bit for bit (power-of-two scales, exact rounding);
//   indexer_qat   backend/cpu/qat_sim.h: Walsh-Hadamard in the CPU's butterfly order, 1/sqrt(n),
//                 then the FP4 E2M1 simulation, bit for bit.
// rms_norm and rope_tail may differ from the CPU by one f32 ulp where the double sum's order or
// the device's double cos/sin (within 2 double ulps) moves a value across an f32 rounding edge.
#include <cuda_runtime.h>

#include <cstdint>

namespace ds4::cuda {

// n_rows rows of n values: y[r] = rms_norm(x[r]) * w (w may be null).
void rms_norm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps,
              cudaStream_t stream);

// rms_norm, and y quantized to Q8_0 in the same launch: xq [n_rows n], xd [n_rows n / 32] get
// the bits quantize_q8_0_activation (q8_0_matvec.h) would give y. False, and nothing launched,
// where the rows do not allow it (n not a multiple of 32, unaligned, or in place over several
// blocks): then call rms_norm and quantize.
bool rms_norm_q8_0(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps,
                   int8_t *xq, float *xd, cudaStream_t stream);

// n_heads heads of head_dim values back to back; the last 2 n_freq values of each are rotated
// at position *pos (device) with frequencies freqs[n_freq] (device, double).
// n_tokens > 1: that many tokens' heads back to back (n_heads each), token t's position at
// pos + t pos_stride.
void rope_tail(float *heads, int64_t n_heads, int64_t head_dim, const double *freqs, int64_t n_freq,
               const int64_t *pos, bool inverse, cudaStream_t stream, int n_tokens = 1,
               int64_t pos_stride = 0);

// rope_tail of one token's heads, and the heads quantized to Q8_0 in the same launch as one row
// of n_heads head_dim values (xq: that many int8, xd: a scale per 32; the bits
// quantize_q8_0_activation gives the rotated heads): the attention output before its grouped
// projection. head_dim must be a multiple of 32.
void rope_tail_q8_0(float *heads, int64_t n_heads, int64_t head_dim, const double *freqs,
                    int64_t n_freq, const int64_t *pos, bool inverse, int8_t *xq, float *xd,
                    cudaStream_t stream);

// In place over n_rows rows of n values, blocks of `block` within each row (the last shorter).
void fp8_e4m3_sim(float *x, int64_t n_rows, int64_t n, int64_t block, cudaStream_t stream);

// In place over n_rows vectors of n values (n a power of two, at most 1024).
void indexer_qat(float *x, int64_t n_rows, int64_t n, cudaStream_t stream);

}  // namespace ds4::cuda
