#pragma once
// The activation quantizers' per-block code as device functions, so that a kernel that computes
// the values (a SwiGLU) quantizes them in the same launch with the bits of the separate
// quantizer kernels, which are built from these too:
//   quantize_q8_0_lane  a warp codes one Q8_0 block of 32 values, lane i holding value i
//                       (q8_0_matvec.h quantize_q8_0_activation);
//   quantize_q8_K_block a block of 256 threads codes one Q8_K block, thread i holding value i
//                       (q8_k_quantize.h quantize_q8_K_activation).
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/row_device.cuh"

namespace ds4::cuda::dev {

// d = amax / 127 over the warp's 32 values; lane i writes q[i], lane 0 the f16-rounded scale.
__device__ __forceinline__ void quantize_q8_0_lane(float v, int8_t *q, float *d_out) {
    const int lane = threadIdx.x % 32;
    float amax = fabsf(v);  // fmaxf ignores a NaN operand, as the CPU's std::fmax does
    for (int off = 16; off > 0; off /= 2)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float d = amax / 127.0f;
    q[lane] = static_cast<int8_t>(q8_0_code(v, d));
    if (lane == 0) *d_out = __half2float(__float2half_rn(d));
}

// Thread i (of 256) holds v = x[i] of the block; q: the block's 256 codes, d: its scale, bsums:
// its 16 sums. Every thread of the block must call it (it has barriers).
__device__ __forceinline__ void quantize_q8_K_block(float v, int8_t *q, float *d, int16_t *bsums) {
    constexpr int kQK = 256;
    __shared__ float s_amax[kQK / 32];
    __shared__ int s_index[kQK / 32];
    __shared__ float s_v[kQK];
    __shared__ float s_vmax;
    const int i = threadIdx.x, lane = i % 32, warp = i / 32;
    s_v[i] = v;
    // Largest |x|, the lowest index on ties (the CPU keeps the first strictly larger value);
    // NaN never compares larger, as on the CPU.
    float a = fabsf(v);
    if (isnan(a)) a = 0.0f;
    int idx = i;
    for (int off = 16; off > 0; off /= 2) {
        const float oa = __shfl_xor_sync(0xffffffffu, a, off);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, off);
        if (oa > a || (oa == a && oi < idx)) {
            a = oa;
            idx = oi;
        }
    }
    if (lane == 0) {
        s_amax[warp] = a;
        s_index[warp] = idx;
    }
    __syncthreads();
    if (i == 0) {
        float best = s_amax[0];
        int best_i = s_index[0];
        for (int w = 1; w < kQK / 32; ++w)
            if (s_amax[w] > best) {  // warps in index order: strictly larger only
                best = s_amax[w];
                best_i = s_index[w];
            }
        s_vmax = best == 0.0f ? 0.0f : s_v[best_i];
    }
    __syncthreads();
    const float vmax = s_vmax;
    int qi = 0;
    if (vmax != 0.0f) {
        const float iscale = -127.0f / vmax;
        const float r = iscale * v;
        // lrint gives LONG_MIN for NaN and out-of-range values; clamped that is -128.
        qi = isnan(r) || fabsf(r) >= 2147483648.0f ? -128 : __float2int_rn(r);
        qi = max(-128, min(127, qi));
        if (i == 0) *d = 1.0f / iscale;
    } else if (i == 0) {
        *d = 0.0f;
    }
    q[i] = static_cast<int8_t>(qi);
    // bsums: 16 consecutive values are half a warp; a butterfly over 16 lanes sums them exactly.
    int s = qi;
    for (int off = 8; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (i % 16 == 0) bsums[i / 16] = static_cast<int16_t>(s);
}

}  // namespace ds4::cuda::dev
