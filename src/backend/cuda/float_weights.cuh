#pragma once
// Eight consecutive weights of a float-format row (F32, F16, BF16) as floats, by one 16-byte
// load (two for F32). kStream (a decode product, each weight read once) marks the lines
// evict-first; a batch's products, whose blocks share each weight through L2, load normally.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "common/error.h"
#include "gguf/ggml_type.h"

namespace ds4::cuda::dev {

template <bool kStream, class V>
__device__ __forceinline__ V load_16(const V *p) {
    if constexpr (kStream)
        return __ldcs(p);
    else
        return __ldg(p);
}

template <GgmlType T>
struct Weights8;  // 8 consecutive weights of a row as floats

template <>
struct Weights8<GgmlType::F32> {
    static constexpr int kBytes = 4;
    template <bool kStream = true>
    __device__ static void load(const void *row, int64_t i, float (&w)[8]) {
        const float4 *p = reinterpret_cast<const float4 *>(static_cast<const float *>(row) + i);
        const float4 a = load_16<kStream>(p), b = load_16<kStream>(p + 1);
        w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z,
        w[7] = b.w;
    }
};

template <>
struct Weights8<GgmlType::F16> {
    static constexpr int kBytes = 2;
    template <bool kStream = true>
    __device__ static void load(const void *row, int64_t i, float (&w)[8]) {
        const uint4 v =
            load_16<kStream>(reinterpret_cast<const uint4 *>(static_cast<const __half *>(row) + i));
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&u[j]));
            w[2 * j] = f.x, w[2 * j + 1] = f.y;
        }
    }
};

template <>
struct Weights8<GgmlType::BF16> {
    static constexpr int kBytes = 2;
    template <bool kStream = true>
    __device__ static void load(const void *row, int64_t i, float (&w)[8]) {
        const uint4 v = load_16<kStream>(
            reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(row) + i));
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // bf16 is the top half of an f32
            w[2 * j] = __uint_as_float(u[j] << 16);
            w[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
        }
    }
};

}  // namespace ds4::cuda::dev

namespace ds4::cuda {

// Every float product loads 8 values of a row at once, 16-byte aligned: k a multiple of 8.
inline void check_float_rows(int64_t k) {
    if (k % 8 != 0) throw ds4::Error("the CUDA float products need rows of a multiple of 8 values");
}

// f(std::integral_constant<GgmlType, T>{}) for a float format T (F32, F16 or BF16): the kernels
// are compiled for each; `what` names the caller in the error for any other format.
template <class F>
void with_float_type(GgmlType type, const char *what, F &&f) {
    switch (type) {
        case GgmlType::F32:
            f(std::integral_constant<GgmlType, GgmlType::F32>{});
            break;
        case GgmlType::F16:
            f(std::integral_constant<GgmlType, GgmlType::F16>{});
            break;
        case GgmlType::BF16:
            f(std::integral_constant<GgmlType, GgmlType::BF16>{});
            break;
        default:
            throw ds4::Error(std::string(what) + " takes F32, F16 or BF16 weights");
    }
}

}  // namespace ds4::cuda
