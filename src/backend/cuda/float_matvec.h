#pragma once
// Decode matrix-vector products for the float weight formats (F32, F16, BF16: hyper-connection
// mixers, router, compressors, indexer) on the device, y = W x with f32 activations.
//
// Like the CPU's vec_dot_{f32,f16,bf16}_f32, every product w_i * x_i is formed exactly in double
// (24-bit by 24-bit significands) and summed in double; the sum is rounded to f32 once. The sums
// differ from the CPU's only in the order of the double additions (a relative error of at most
// ~k * 2^-53 of sum |w x|), so the results agree to one f32 ulp except under heavy cancellation.
// A matrix of float_mma.h's shapes (float_uses_mma) adds in float_mma.cuh's order on the fp64
// tensor cores, others in this file's thread kernels' order; either way a token's outputs have
// the same bits alone (matvec_float, matvec_float_many) or in a batch (matmul_float).
// The weights stay in the file's layout (rows of 2 or 4 bytes per value); k must be a multiple
// of 8, so that every row starts 16-byte aligned and a thread loads 8 values at once.
//
// matvec_float_experts runs several experts of one [n_experts][n_rows][k] tensor, with the expert
// ids read on the device as for the quantized expert formats (q2_k_matvec.h): y[i * n_rows + r]
// = row r of expert ids[i] times x, each output the same exact double products summed in double
// (threads' FMA chains, then a butterfly; its split of k depends on the number of slots, so only
// the double additions' order differs from a dense launch) and rounded once.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_buffer.h"
#include "gguf/ggml_type.h"

namespace ds4::cuda {

struct FloatMatrix {
    GgmlType type = GgmlType::F32;  // F32, F16 or BF16
    const void *data = nullptr;     // [n_rows][k], device memory
    int64_t n_rows = 0, k = 0;
};

// Matrices with few rows split k over several blocks (up to 8; float_mma.h's, over spans); their
// partial double sums go to `scratch` (at least float_matvec_scratch_bytes(w)), and the last
// block (or warp) of a row group to finish (an arrival counter per group) adds them in split
// order: one launch, the same bits whichever is last. The scratch's first
// kFloatMatvecCounterBytes hold the counters: they must be zero before the first product and
// each product leaves them zero.
constexpr size_t kFloatMatvecCounterBytes = 4096;
size_t float_matvec_scratch_bytes(const FloatMatrix &w);
void matvec_float(const FloatMatrix &w, const float *x, float *y, void *scratch,
                  cudaStream_t stream);

// w: the first expert's matrix (w.n_rows rows per expert), the others following it back to
// back; ids: n_ids expert ids (device; the caller validates them); y: n_ids * w.n_rows floats.
// x is one activation row of k floats for every slot, or (x_per_slot) n_ids rows back to back,
// row i for slot i. scratch: at least float_matvec_experts_scratch_bytes(w, n_ids) (the split-k
// partial sums of all slots).
size_t float_matvec_experts_scratch_bytes(const FloatMatrix &w, int n_ids);
void matvec_float_experts(const FloatMatrix &w, const int32_t *ids, int n_ids, const float *x,
                          bool x_per_slot, float *y, void *scratch, cudaStream_t stream);

// Several products of one activation x (a decode step's compressor and indexer projections of
// one normed input): one launch, each y the bits matvec_float gives it (each matrix keeps its
// own plan: the same split of k, the same blocks). At most kMaxFloatProducts, all of one type and
// k; scratch: at least float_matvec_many_scratch_bytes: kMaxFloatProducts fixed counter regions
// (product j's the j-th, whatever the group, so that no group's partial sums land on another's
// counters; zero before the first launch and left zero), then the split matrices' partial sums.
constexpr int kMaxFloatProducts = 8;
struct FloatProduct {
    FloatMatrix w;
    float *y = nullptr;
};
size_t float_matvec_many_scratch_bytes(const FloatProduct *products, int n);
void matvec_float_many(const FloatProduct *products, int n, const float *x, void *scratch,
                       size_t scratch_bytes, cudaStream_t stream);

// A batch's products (prefill): m activation rows X (m x k) into Y (m x n_rows), each output row
// the bits matvec_float gives its row (every row splits k as one product does); the thread
// kernel's block takes 8 rows, each weight value loaded once for the 8, and float_mma.h's tiles
// convert each chunk of their rows and tokens to double once. The scratch (the thread kernel's;
// float_mma.h's need none) has a fixed counter region, so that the partial sums of one matrix
// never land on the counters of another: counters (zero before the first product; each product
// leaves them zero) of at least float_matmul_counter_bytes(w, m) for every w and m it serves,
// partial sums of at least float_matmul_partial_bytes(w, m).
struct FloatMatmulScratch {
    void *counters = nullptr;
    size_t counter_bytes = 0;
    void *partial = nullptr;
    size_t partial_bytes = 0;
};
size_t float_matmul_counter_bytes(const FloatMatrix &w, int64_t m);
size_t float_matmul_partial_bytes(const FloatMatrix &w, int64_t m);
void matmul_float(const FloatMatrix &w, const float *X, int64_t m, float *Y,
                  const FloatMatmulScratch &scratch, cudaStream_t stream);

}  // namespace ds4::cuda
