#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/q8_k_quantize.h"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kQK = 256;

// One thread block of 256 threads per Q8_K block: thread i owns x[i].
__global__ void __launch_bounds__(kQK)
    quantize_q8_K_kernel(const float *__restrict__ x, int8_t *__restrict__ q, float *__restrict__ d,
                         int16_t *__restrict__ bsums) {
    dev::wait_for_previous_kernels();
    __shared__ float s_amax[kQK / 32];
    __shared__ int s_index[kQK / 32];
    __shared__ float s_vmax;
    const int i = threadIdx.x, lane = i % 32, warp = i / 32;
    const int64_t base = int64_t(blockIdx.x) * kQK;
    const float v = x[base + i];
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
        s_vmax = best == 0.0f ? 0.0f : x[base + best_i];
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
        if (i == 0) d[blockIdx.x] = 1.0f / iscale;
    } else if (i == 0) {
        d[blockIdx.x] = 0.0f;
    }
    q[base + i] = static_cast<int8_t>(qi);
    // bsums: 16 consecutive values are half a warp; a butterfly over 16 lanes sums them exactly.
    int s = qi;
    for (int off = 8; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (i % 16 == 0) bsums[base / 16 + i / 16] = static_cast<int16_t>(s);
}

}  // namespace

void quantize_q8_K_activation(const float *x, int64_t k, const Q8_KActivation &out,
                              cudaStream_t stream) {
    if (k % kQK != 0) throw ds4::Error("Q8_K activations must hold a multiple of 256 values");
    if (k == 0) return;
    launch_kernel(quantize_q8_K_kernel, unsigned(k / kQK), kQK, 0, stream, x, out.q, out.d,
                  out.bsums);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
