#pragma once
// One token's float product in float_mma.cuh's order, on the thread cores: the same bits as the
// tensor cores give it, where a one-token mma step uses one of its eight columns and converts
// every weight and activation to double in each warp.
//
// An mma.sync m8n8k4 .f64 step adds its four products to the accumulator one after another, in
// k order, each addition rounded: d = (((d + a0 b0) + a1 b1) + a2 b2) + a3 b3 (measured on an
// H100: 1,280,000 outputs of random float-valued operands, some with cancellation, all equal to
// that chain and none to the other orders or to a single rounding). Every product w x of float
// operands is exact in double, so fma(w, x, d) is that addition. A span's sum in float_mma.cuh is
// then, for each chunk q of the span, for step j = 0..7, for c = 0..3: d = fma(w[p], x[p], d)
// with p = 32 q + 8 c + j, from d = 0 — a chain of 32 fmas a chunk that one thread can follow.
//
// A thread follows the chain of one (row, span): a warp takes 32 rows of one span (the token's
// values the same for every lane), a block 2 spans; the spans' sums of a row group go to memory
// and the last block of the group to arrive adds them in span order, as float_mma.cuh's decode
// does. Each thread keeps a whole span's weights in flight at once where they fit in 64
// registers (4 chunks of F16 or BF16, 2 of F32).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/float_mma.cuh"
#include "backend/cuda/float_weights.cuh"

namespace ds4::cuda {

constexpr int kChainRows = 32;          // rows of a warp (and of a block)
constexpr int kChainSpansPerBlock = 2;  // warps of a block, one span each
constexpr int kChainThreads = 32 * kChainSpansPerBlock;

struct ChainGrid {
    int64_t row_groups = 0, span_groups = 0;
};

inline ChainGrid chain_grid(int64_t n_rows, const FloatSpans &sp) {
    return {(n_rows + kChainRows - 1) / kChainRows,
            (sp.spans + kChainSpansPerBlock - 1) / kChainSpansPerBlock};
}

// The partial sums a split product needs: a row's spans together, rows padded to whole groups.
inline int64_t chain_partial_doubles(int64_t n_rows, const FloatSpans &sp) {
    return sp.spans == 1 ? 0 : chain_grid(n_rows, sp).row_groups * kChainRows * sp.spans;
}

namespace dev {

// A chunk's 32 weights of one row as they were loaded: 16-byte words (4 of F16 or BF16, 8 of
// F32), value v in word v / (16 / bytes).
template <GgmlType T>
struct ChunkWords {
    static constexpr int kWords = kFloatChunk * Weights8<T>::kBytes / 16;
    uint4 w[kWords];

    // The chunk from value pos of a row of k values: the words past k (k is a multiple of 8: a
    // word is whole or absent) and every word of a chunk past the span (!in) are zeros.
    __device__ __forceinline__ void load(const char *row, int64_t pos, int64_t k, bool in) {
        constexpr int kPerWord = 16 / Weights8<T>::kBytes;
        const uint4 *p = reinterpret_cast<const uint4 *>(row + pos * Weights8<T>::kBytes);
#pragma unroll
        for (int i = 0; i < kWords; ++i)
            w[i] =
                in && pos + int64_t(i + 1) * kPerWord <= k ? __ldcs(p + i) : make_uint4(0, 0, 0, 0);
    }
    // Value v (a constant after unrolling) as a double.
    __device__ __forceinline__ double value(int v) const {
        constexpr int kPerWord = 16 / Weights8<T>::kBytes;
        const uint4 &word = w[v / kPerWord];
        const int i = v % kPerWord;
        if constexpr (T == GgmlType::F32) {
            const uint32_t u = i == 0 ? word.x : i == 1 ? word.y : i == 2 ? word.z : word.w;
            return double(__uint_as_float(u));
        } else {
            const uint32_t u = i / 2 == 0   ? word.x
                               : i / 2 == 1 ? word.y
                               : i / 2 == 2 ? word.z
                                            : word.w;
            const uint16_t h = i % 2 == 0 ? uint16_t(u & 0xffffu) : uint16_t(u >> 16);
            if constexpr (T == GgmlType::F16)
                return double(__half2float(__ushort_as_half(h)));
            else  // bf16 is the top half of an f32
                return double(__uint_as_float(uint32_t(h) << 16));
        }
    }
};

// The chain of row `row` (clamped to the matrix for its loads) over span s: its span sum.
template <GgmlType T>
__device__ __forceinline__ double float_chain_span(const void *__restrict__ w, int64_t n_rows,
                                                   int64_t k, const FloatSpans &sp, int64_t row,
                                                   int64_t s, const float *__restrict__ x) {
    constexpr int U = 64 / (4 * ChunkWords<T>::kWords);  // chunks in flight: 64 registers
    const char *wrow =
        static_cast<const char *>(w) + min(row, n_rows - 1) * k * Weights8<T>::kBytes;
    const int64_t q_begin = s * sp.span_chunks, q_end = min(sp.chunks, q_begin + sp.span_chunks);
    double d = 0.0;
    for (int64_t q0 = q_begin; q0 < q_end; q0 += U) {
        ChunkWords<T> cw[U];
#pragma unroll
        for (int u = 0; u < U; ++u) cw[u].load(wrow, (q0 + u) * kFloatChunk, k, q0 + u < q_end);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (q0 + u >= q_end) break;  // the same for the whole warp
            const int64_t pos = (q0 + u) * kFloatChunk;
            float xv[kFloatChunk];
#pragma unroll
            for (int i = 0; i < kFloatChunk / 4; ++i) {
                const float4 v = pos + 4 * i < k
                                     ? __ldg(reinterpret_cast<const float4 *>(x + pos) + i)
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                xv[4 * i] = v.x, xv[4 * i + 1] = v.y, xv[4 * i + 2] = v.z, xv[4 * i + 3] = v.w;
            }
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int c = 0; c < 4; ++c)
                    d = fma(cw[u].value(8 * c + j), double(xv[8 * c + j]), d);
        }
    }
    return d;
}

}  // namespace dev
}  // namespace ds4::cuda
