#pragma once
// The routed-MoE glue of a decode step on the device, each the twin of a CPU function:
//   route_experts   backend/cpu/routing.h: sqrt-softplus, top-k of prob + bias (or the hash
//                   table's row for the token), weights normalised in selection order;
//   swiglu_slots    backend/cpu/vector_ops.h swiglu_clamped, one row per selected expert, times
//                   its route weight (ds4 weights W2's input, docs/MODEL.md 4.6);
//   sum_slots       y = o_0 + o_1 + ... (+ shared), added in selection order as moe_batch does;
//   split_ids       (the streamed decode's glue, no CPU counterpart: the CPU has no device tier)
//                   the selected ids as two launches take them, hits first.
// exp and log1p are evaluated in double and rounded to f32, which agrees with the CPU's f32
// libm calls except where those are not correctly rounded (a few ulps at most); additions and
// products are the CPU's, unfused.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/q8_k_quantize.h"

namespace ds4::cuda {

struct RouteDeviceParams {
    uint32_t n_expert = 0, n_used = 0;
    const float *bias = nullptr;  // device, n_expert selection biases, or none
    bool normalize = true;
    float scale = 1.0f;
    // Hash layers: the [n_tokens][n_used] table and the token id (both device); its row replaces
    // the selection. The token is clamped into the table (the caller validates ids).
    const int32_t *hash_table = nullptr;
    const int32_t *token = nullptr;
    int64_t hash_rows = 0;
};

// logits: n_expert floats (device); experts, weights: n_used each (device). n_tokens > 1 routes
// that many tokens in one launch (a block each): logits, experts, weights and p.token advance by
// a token's n_expert, n_used, n_used and 1.
void route_experts(const float *logits, const RouteDeviceParams &p, int32_t *experts,
                   float *weights, cudaStream_t stream, int n_tokens = 1);

// route_experts of one token, and its input x (k values, a multiple of 256) quantized to Q8_K in
// the same launch (quantize_q8_K_activation's bits): the decode step's routed experts' inputs.
void route_experts_q8_K(const float *logits, const RouteDeviceParams &p, int32_t *experts,
                        float *weights, const float *x, int64_t k, const Q8_KActivation &xk,
                        cudaStream_t stream);

// out[i][j] = silu(min(g, c)) * clamp(u, -c, c) * weights[i] for slot i < n_slots, j < n
// (no clamp when c <= 1e-6; weights may be null: 1). g, u, out: [n_slots][n].
void swiglu_slots(const float *g, const float *u, int n_slots, int64_t n, float clamp,
                  const float *weights, float *out, cudaStream_t stream);

// swiglu_slots, and out quantized in the same launch as the next product needs it: to Q8_0
// (xq: total int8, xd: total / 32 scales; q8_0_matvec.h quantize_q8_0_activation's bits) or to
// Q8_K (q8_k_quantize.h quantize_q8_K_activation's bits). False, and nothing launched, where
// n_slots n is not a multiple of the format's block (32, 256): then quantize separately.
bool swiglu_slots_q8_0(const float *g, const float *u, int n_slots, int64_t n, float clamp,
                       const float *weights, float *out, int8_t *xq, float *xd,
                       cudaStream_t stream);
bool swiglu_slots_q8_K(const float *g, const float *u, int n_slots, int64_t n, float clamp,
                       const float *weights, float *out, const Q8_KActivation &x,
                       cudaStream_t stream);

// For a layer's experts in two launches (the device tier's hits first: the expert kernels leave
// out a slot whose id is negative): in[i] = ids[i] where bit i of mask is set, else -1; out[i]
// the other way round. n <= 32; ids, in, out: n int32 each (device).
void split_ids(const int32_t *ids, int n, uint32_t mask, int32_t *in, int32_t *out,
               cudaStream_t stream);

// y[j] = ((o[0][j] + o[1][j]) + ...) + shared[j] (shared may be null); n_tokens such sums, token
// t's at o + t n_slots n, shared + t n and y + t n.
void sum_slots(const float *o, int n_slots, int64_t n, const float *shared, float *y,
               cudaStream_t stream, int n_tokens = 1);

}  // namespace ds4::cuda
