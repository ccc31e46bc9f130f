#pragma once
// Small per-vector operations of the model (docs/MODEL.md 4.0), the CPU reference for their GPU
// twins.
#include <cstdint>

namespace ds4::backend::cpu {

// sum x[i]^2 in double, in 16 interleaved sums added in a fixed tree (vector_ops.cpp): the same
// bits on every instruction set.
double sum_of_squares(const float *x, int64_t n);
// y = x / sqrt(mean(x^2) + eps) * w (w may be null: no weight). Sum of squares: sum_of_squares.
void rms_norm(const float *x, const float *w, float *y, int64_t n, float eps);

float silu(float x);
// softplus as the reference computes it: z > 20 -> z, z < -20 -> e^z, else log1p(e^z).
float softplus(float z);
float sigmoid(float z);

// The experts' clamped SwiGLU, in place: g <- silu(min(g, c)) * clamp(u, -c, c) * weight, with
// no clamp when c <= 1e-6.
void swiglu_clamped(float *g, const float *u, int64_t n, float clamp, float weight);

// IEEE binary16 round trip (round to nearest even).
float round_to_f16(float x);

}  // namespace ds4::backend::cpu
