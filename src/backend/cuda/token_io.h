#pragma once
// The two ends of a decode step on the device, where token ids live in device words so that a
// replayed graph uploads nothing and the host reads 4 bytes per token:
//   embed_token   the token's embedding row (F16 or F32 table) into each of the n_hc residual
//                 streams, exactly (f16 -> f32 is exact), as runtime/forward.cpp starts a token;
//   argmax        greedy selection, runtime/sampler.h argmax: the first maximal index (a NaN is
//                 never larger than anything), written to a device word.
#include <cuda_runtime.h>

#include <cstdint>

#include "gguf/ggml_type.h"

namespace ds4::cuda {

// table: [n_vocab][e] of `type` (F16 or F32), device; token: device; out: [n_hc][e]. The token
// is clamped into the table (the caller validates ids).
void embed_token(const void *table, GgmlType type, int64_t n_vocab, int64_t e, const int32_t *token,
                 int n_hc, float *out, cudaStream_t stream);

// logits: n values (device); *token receives the index.
void argmax(const float *logits, int64_t n, int32_t *token, cudaStream_t stream);

}  // namespace ds4::cuda
