#pragma once
// Decode matrix-vector products for the float weight formats (F32, F16, BF16: hyper-connection
// mixers, router, compressors, indexer) on the device, y = W x with f32 activations.
//
// Like the CPU's vec_dot_{f32,f16,bf16}_f32, every product w_i * x_i is formed exactly in double
// (24-bit by 24-bit significands) and summed in double; the sum is rounded to f32 once. The sums
// differ from the CPU's only in the order of the double additions (a relative error of at most
// ~k * 2^-53 of sum |w x|), so the results agree to one f32 ulp except under heavy cancellation.
// The weights stay in the file's layout (rows of 2 or 4 bytes per value); k must be a multiple
// of 8, so that every row starts 16-byte aligned and a thread loads 8 values at once.
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

// Matrices with few rows split k over several blocks (up to 8); their partial double sums go to
// `scratch` (at least float_matvec_scratch_bytes(w)), then one more kernel adds them in order.
size_t float_matvec_scratch_bytes(const FloatMatrix &w);
void matvec_float(const FloatMatrix &w, const float *x, float *y, void *scratch,
                  cudaStream_t stream);

}  // namespace ds4::cuda
