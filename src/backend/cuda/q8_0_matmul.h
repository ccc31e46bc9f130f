#pragma once
// The batched Q8_0 product of a prefill chunk on int8 tensor cores (mma.sync m16n8k32), with
// the bits of the decode matvec (q8_0_matvec.h) for every token.
//
// The matvec's output for a row is a fixed expression of exact int32 block sums: per block
// float(isum) * (f16(dw) * dx), accumulated in an order set by its threads per row (lanes,
// passes, a butterfly, then warps). The tensor cores give the same int32 sums for 16 rows x 8
// tokens per instruction; the float part is then the matvec's, operation for operation, so a
// prompt prefilled in one chunk and the same tokens decoded one by one see the same numbers.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/q8_0_matvec.h"

namespace ds4::cuda {

// The matvec's threads per row for rows of k values: one 16-byte load per thread per pass, as
// many threads as a row has 16-byte pieces, from one warp up to a block of 256. Its order of
// additions depends on this number, so the batched product takes it from here too.
inline int q8_0_threads_per_row(int64_t k) {
    const int64_t pieces = k / 16;
    return pieces >= 256 ? 256 : pieces >= 128 ? 128 : pieces >= 64 ? 64 : 32;
}

// y[t * y_stride + z * w.n_rows + r] = row r of matrix z (w.n_rows rows of w.k, `groups` of them
// back to back) times slice z of token t's quantized row (x_stride int8 values and x_stride / 32
// scales per token; the slice is w.k of them at z * w.k), for t < n_tokens: the bits of
// matvec_q8_0 with threads_per_row = q8_0_threads_per_row(w.k).
void matmul_q8_0_mma(const Q8_0Matrix &w, int threads_per_row, const int8_t *xq, const float *xd,
                     int64_t n_tokens, int64_t x_stride, int64_t y_stride, int groups, float *y,
                     cudaStream_t stream);

}  // namespace ds4::cuda
