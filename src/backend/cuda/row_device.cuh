#pragma once
// Device functions shared by the kernels of one row (vector_ops.cu, kv_ops.cu) and by the fused
// row kernel (row_finish.cu): the same code in both, so a fused step has the separate kernels'
// bits. Each is the twin of the CPU function named in its comment.
#include <cuda_runtime.h>

#include <cstdint>

namespace ds4::cuda::dev {

// quant::ref::f32_to_f16 (quant/float_formats.cpp), operation for operation.
__device__ __forceinline__ uint32_t f32_to_f16_bits(float f) {
    const uint32_t bits = __float_as_uint(f);
    const uint32_t sign = (bits >> 16) & 0x8000u;
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u)  // NaN: the quiet bit set, the top payload bits kept
        return sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu);
    if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and above: inf
    if (magnitude >= 0x38800000u) {                       // normal f16: round to nearest even
        const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
        return (sign | ((rounded - (112u << 23)) >> 13)) & 0xffffu;
    }
    // subnormal f16: round_even(|f| / 2^-24)
    const uint32_t e = magnitude >> 23;
    const uint32_t shift = 126 - e;
    if (e == 0 || shift > 24) return sign;  // below 2^-25, or exactly it (a tie to 0)
    const uint32_t m = (magnitude & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) ++q;  // may carry into the smallest normal
    return sign | q;
}

// quant::ref::f16_to_f32, exact.
__device__ __forceinline__ float f16_bits_to_f32(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu;
    const uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0)  // zero or subnormal: mantissa * 2^-24, exact in f32
        return __uint_as_float(sign |
                               __float_as_uint(__fmul_rn(__uint2float_rn(mantissa), 0x1p-24f)));
    if (exponent == 31) return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
    return __uint_as_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// quant/q8_0.cpp's code of one activation value v in a block of scale d = amax / 127 (IEEE
// division, no fast-math): x86's cvtps2dq gives INT_MIN for NaN and out-of-range quotients,
// which the clamp makes -128.
__device__ __forceinline__ int q8_0_code(float v, float d) {
    if (d == 0.0f) return 0;
    const float r = v / d;
    const int q = isnan(r) || fabsf(r) >= 2147483648.0f ? -128 : __float2int_rn(r);
    return max(-128, min(127, q));
}

// f32 exp: the double exp rounded to f32, correctly rounded but for double-rounding cases (the
// CPU calls f32 libm: the twins' tests allow an ulp).
__device__ __forceinline__ float exp_f(float x) {
    return static_cast<float>(exp(static_cast<double>(x)));
}

// backend/cpu/qat_sim.cpp, operation for operation.
__device__ inline float round_e4m3(float a) {
    if (a >= 448.0f) return 448.0f;
    int e;
    frexpf(a, &e);
    const int exp2 = max(e - 1, -6);
    const float step = ldexpf(1.0f, exp2 - 3);
    return fminf(448.0f, __fmul_rn(rintf(__fdiv_rn(a, step)), step));
}

__device__ inline float round_e2m1(float a) {
    const float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    int best = 0;
    float best_d = fabsf(a);
    for (int i = 1; i < 8; ++i) {
        const float d = fabsf(__fsub_rn(a, kValues[i]));
        if (d < best_d || (d == best_d && i % 2 == 0 && best % 2 == 1)) {
            best = i;
            best_d = d;
        }
    }
    return kValues[best];
}

__device__ inline float pow2_ceil(float r) {
    int e;
    const float m = frexpf(r, &e);
    return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

// One warp per block of up to 64 values (two per lane): amax, the power-of-two scale, rounding.
template <bool kFp4>
__device__ void block_sim(float *x, int64_t count, float qmax, float amax_floor) {
    const int lane = threadIdx.x % 32;
    float amax = 0.0f;
    for (int64_t i = lane; i < count; i += 32) amax = fmaxf(amax, fabsf(x[i]));
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = pow2_ceil(__fdiv_rn(fmaxf(amax, amax_floor), qmax));
    for (int64_t i = lane; i < count; i += 32) {
        const float q = __fdiv_rn(x[i], s);
        const float v = q < -qmax ? -qmax : qmax < q ? qmax : q;  // std::clamp
        const float r = kFp4 ? round_e2m1(fabsf(v)) : round_e4m3(fabsf(v));
        x[i] = __fmul_rn(copysignf(r, v), s);
    }
}

// The f32 scale 1 / sqrt(mean(x^2) + eps) of a row of n values read by the kThreads threads of a
// block (thread t: values t, t + kThreads, ...): double sums, a warp butterfly, the warps' sums
// in index order. Every thread gets the scale. `part` holds kThreads / 32 doubles.
template <int kThreads, typename Load>
__device__ float rms_scale(Load load, int64_t n, float eps, double *part, float *s_scale) {
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
        const float v = load(i);
        ss += double(v) * double(v);
    }
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int i = 0; i < kThreads / 32; ++i) t += part[i];
        *s_scale = static_cast<float>(1.0 / sqrt(t / double(n) + double(eps)));
    }
    __syncthreads();
    return *s_scale;
}

// backend/cpu/rope.h on one pair: x[2k], x[2k+1] rotated by theta = pos f_k (double; cos and sin
// rounded to f32), unfused.
__device__ inline void rope_pair(float *x, int64_t k, double freq, int64_t pos, bool inverse) {
    const double theta = double(pos) * freq;
    const float c = static_cast<float>(cos(theta));
    const float s = static_cast<float>(inverse ? -sin(theta) : sin(theta));
    const float x0 = x[2 * k], x1 = x[2 * k + 1];
    x[2 * k] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    x[2 * k + 1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// rope_pair with the pair (x[2k], x[2k + 1]) in lanes 2k and 2k + 1 of a warp: v is the lane's
// value, j its index in the row, tail (even) the row's first rotated index. Each lane computes
// its half of the rotation from the other's value (a shuffle: every lane of the warp calls this)
// with rope_pair's operations; a lane before the tail gets v back.
__device__ inline float rope_pair_lanes(float v, int64_t j, int64_t tail, const double *freqs,
                                        int64_t pos, bool inverse) {
    const float other = __shfl_xor_sync(0xffffffffu, v, 1);
    if (j < tail) return v;
    const int64_t k = (j - tail) / 2;
    const double theta = double(pos) * freqs[k];
    const float c = static_cast<float>(cos(theta));
    const float s = static_cast<float>(inverse ? -sin(theta) : sin(theta));
    const bool first = (j - tail) % 2 == 0;
    const float x0 = first ? v : other, x1 = first ? other : v;
    return first ? __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s))
                 : __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// backend/cpu/compressor_pool.h over n candidates, candidate i's score score_at(i) and value
// kv_at(i): the max, e = exp(s - max), den and num in candidate order, num / den; 0 when no
// candidate was written (max -inf).
template <class Score, class Kv>
__device__ inline float pool_values(int n, Score score_at, Kv kv_at) {
    float mx = score_at(0);
    for (int i = 1; i < n; ++i)
        if (mx < score_at(i)) mx = score_at(i);  // std::max_element's value
    if (mx == -INFINITY) return 0.0f;
    float den = 0.0f, num = 0.0f;
    for (int i = 0; i < n; ++i) {
        const float e = exp_f(__fsub_rn(score_at(i), mx));
        den = __fadd_rn(den, e);
        num = __fadd_rn(num, __fmul_rn(e, kv_at(i)));
    }
    return __fdiv_rn(num, den);
}

// pool_values for column j of a window state of n = r (or 2 r overlapped) rows: row i's column
// j, or d + j for the overlapped window's second half.
__device__ inline float pool_column(const float *kv, const float *score, int r, bool overlap,
                                    int64_t d, int64_t width, int64_t j) {
    const auto at = [&](int i) { return int64_t(i) * width + (overlap && i >= r ? d + j : j); };
    return pool_values(
        overlap ? 2 * r : r, [&](int i) { return score[at(i)]; }, [&](int i) { return kv[at(i)]; });
}

// backend/cpu/qat_sim.h indexer_qat on a row of n values (a power of two, at most 1024) in shared
// memory, by all threads of the block: the Walsh-Hadamard butterflies stage by stage, 1/sqrt(n),
// then FP4 in blocks of 32 (a warp per block).
__device__ inline void indexer_qat_row(float *v, int64_t n) {
    __syncthreads();
    for (int64_t stride = 1; stride < n; stride *= 2) {
        for (int64_t t = threadIdx.x; t < n / 2; t += blockDim.x) {
            const int64_t j = (t / stride) * 2 * stride + t % stride;
            const float a = v[j], b = v[j + stride];
            v[j] = __fadd_rn(a, b);
            v[j + stride] = __fsub_rn(a, b);
        }
        __syncthreads();
    }
    const float scale = static_cast<float>(1.0 / sqrt(double(n)));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v[i] = __fmul_rn(v[i], scale);
    __syncthreads();
    const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int64_t b = warp; b * 32 < n; b += warps)
        block_sim<true>(v + b * 32, min(int64_t(32), n - b * 32), 6.0f, 7.052966104933725e-38f);
    __syncthreads();
}

}  // namespace ds4::cuda::dev
