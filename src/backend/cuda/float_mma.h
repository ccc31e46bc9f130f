#pragma once
// The float products on the fp64 tensor cores (float_mma.cuh's order), for the matrices whose
// batches gain from them: float_matvec.cu sends a matrix here when float_uses_mma(w), for one
// token and for a batch alike, so that a token's bits do not depend on the batch. The choice is
// a function of the matrix's shape: rows enough to fill the batch's tiles (the compressors, the
// indexer's compressor, the router of the published file); the hyper-connection mixers (24 rows
// of 16,384) and other short matrices keep the thread kernels, whose one-token latency is lower.
// DS4_CUDA_FLOAT_MMA=0 keeps every matrix on the thread kernels, for comparisons.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/float_matvec.h"

namespace ds4::cuda {

constexpr int64_t kFloatMmaMinRows = 256, kFloatMmaMaxRows = 4096;
// DS4_CUDA_FLOAT_MMA=all (launch.cuh): every float matrix up to this many rows (the tensor-core
// decode's counters: a row tile each).
constexpr int64_t kFloatMmaEveryShapeMaxRows = 8192;

bool float_uses_mma(const FloatMatrix &w);

// One token's spans' sums (0 when the matrix has one span: it needs no scratch). A split
// matrix also needs kFloatMatvecCounterBytes of arrival counters (a counter a row tile), zero
// before and left zero.
size_t float_mma_partial_bytes(const FloatMatrix &w);

struct FloatMmaProduct {
    FloatMatrix w;
    float *y = nullptr;
    unsigned *counters = nullptr;  // with float_mma_partial_bytes(w) > 0: its own, and
    double *partial = nullptr;     // float_mma_partial_bytes(w) of its own
};
// Products of one x (one launch; all of one type and k).
void float_mma_matvec(const FloatMmaProduct *products, int n, const float *x, cudaStream_t stream);

void float_mma_matmul(const FloatMatrix &w, const float *X, int64_t m, float *Y,
                      cudaStream_t stream);

// One mma.sync m8n8k4 .f64 step for each of n tiles, D = C + A B (A 8 x 4 and B 4 x 8 row-major,
// C and D 8 x 8; device memory), for the test that pins down the instruction's order of additions
// (the four products added one after another in k order, each addition rounded): what a thread
// kernel or a CPU twin must follow to give float_mma.cuh's bits.
void float_mma_step(const double *a, const double *b, const double *c, double *d, int n,
                    cudaStream_t stream);

}  // namespace ds4::cuda
