#pragma once
// ds4's Q8_K activation quantizer on the device, bit for bit the CPU's quantize_row_q8_K
// (quant/kernels_ref.h), for the weights whose dot products take Q8_K rows (IQ2_XXS, Q2_K,
// Q4_K). Per block of 256 values:
//   vmax = the first value of largest |x| (its sign kept); vmax == 0 -> a zero block;
//   iscale = -127 / vmax;  q = clamp(round-half-even(iscale * x), -128, 127);  d = 1 / iscale;
//   bsums[j] = sum of q[16 j .. 16 j + 15].
// The three parts go to separate planes so that kernels load each with aligned vector loads.
#include <cuda_runtime.h>

#include <cstdint>

namespace ds4::cuda {

struct Q8_KActivation {
    int8_t *q;       // [k]
    float *d;        // [k / 256]
    int16_t *bsums;  // [k / 16]
};

// x: k floats (k a multiple of 256) in device memory.
void quantize_q8_K_activation(const float *x, int64_t k, const Q8_KActivation &out,
                              cudaStream_t stream);

}  // namespace ds4::cuda
