#pragma once
// The quantization the official model was trained with and that inference reproduces
// (docs/MODEL.md 4.0, 10): FP8 E4M3 on cached KV rows (all but the rotary tail), and a Hadamard
// rotation followed by FP4 E2M1 on indexer vectors. Scales are powers of two (ue8m0).
#include <cstdint>

namespace ds4::backend::cpu {

// Nearest E4M3FN magnitude (max 448), ties to the even code.
float round_e4m3(float magnitude);
// Nearest of {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to the even index.
float round_e2m1(float magnitude);

// x[0..n) in blocks of `block` (the last may be shorter): s = 2^ceil(log2(amax / 448)) with
// amax floored at 1e-4; x <- round_e4m3(clamp(x / s)) * s.
void fp8_e4m3_sim(float *x, int64_t n, int64_t block = 64);
// Blocks of 32: s = 2^ceil(log2(amax / 6)), amax floored at 7.052966104933725e-38.
void fp4_e2m1_sim(float *x, int64_t n);
// In-place Walsh-Hadamard transform of a power-of-two length, scaled by 1/sqrt(n).
void hadamard(float *x, int64_t n);
// The indexer's rotation + FP4 simulation of one head vector.
void indexer_qat(float *x, int64_t n);

}  // namespace ds4::backend::cpu
