#pragma once
// The prefill twin of expert_matvec.cuh: the routed products of a chunk's (token, slot) pairs
// grouped by expert (expert_groups.h), each expert's weights read and decoded once per kTile of
// its pairs. A block is (a tile of the expert's pairs, a share of the rows, an expert): the
// tile's int8 activation rows are staged in shared memory, and each warp takes one weight row
// at a time, decodes each of its pieces once (Format::decode) and dots it with every staged row
// (Format::dot_decoded). Output row p (the pair) gets row r at y[p * n_rows + r].
//
// Each (row, pair) output is computed exactly as expert_matvec's kernel computes it for that
// pair's slot: the same lane owns the same pieces, forms the same integer sums (dot is
// dot_decoded of decode) and float terms and adds them in the same order, and the warp reduces
// with the same butterfly; so a chunk's outputs are the bits of its tokens' decode steps,
// however the pairs fall into groups and tiles.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/expert_groups.h"
#include "backend/cuda/expert_matvec.cuh"
#include "backend/cuda/expert_table.h"
#include "backend/cuda/launch.cuh"

namespace ds4::cuda::expert_matmul {

using expert_matvec::kPieceBytes;
using expert_matvec::kQK;
using expert_matvec::kThreads;
using expert_matvec::kWarps;

constexpr int kTile = 8;      // pairs staged per pass over an expert's rows
constexpr int kAhead = 4;     // 32-piece passes whose loads are issued together
constexpr int kRowSplit = 4;  // blocks per expert (each loops over its share of the row groups)

template <class Format>
__global__ void __launch_bounds__(kThreads, 2)
    kernel(ExpertTable table, int64_t n_rows, int64_t k, ExpertGroups groups,
           const int8_t *__restrict__ xq, const float *__restrict__ xd,
           const int16_t *__restrict__ xbsums, float *__restrict__ y) {
    dev::wait_for_previous_kernels();
    const int64_t expert = blockIdx.z;
    const int begin = groups.offsets[expert], end = groups.offsets[expert + 1];
    // Tiles blockIdx.x, + gridDim.x, ... of the expert's pairs; none for most blocks.
    if (begin + int(blockIdx.x) * kTile >= end) return;
    extern __shared__ int4 smem[];  // [lookup tables][kTile rows of k int8 activations]
    uint8_t *tables = reinterpret_cast<uint8_t *>(smem);
    Format::load_tables(tables);
    int4 *sx4 = smem + Format::kTableBytes / 16;
    const int8_t *sx = reinterpret_cast<const int8_t *>(sx4);

    const int64_t nb = k / kQK, row_bytes = nb * Format::kPieces * kPieceBytes;
    const int64_t pieces = nb * Format::kPieces;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint8_t *wbase = table.qs[expert], *sbase = table.scales[expert];
    __shared__ int64_t xrow[kTile];
    for (int tile = begin + int(blockIdx.x) * kTile; tile < end; tile += int(gridDim.x) * kTile) {
        const int nt = min(kTile, end - tile);
        __syncthreads();  // the previous tile's rows are no longer read
        if (threadIdx.x < nt) xrow[threadIdx.x] = groups.order[tile + threadIdx.x] / groups.x_div;
        __syncthreads();
        for (int j = 0; j < nt; ++j)
            for (int64_t i = threadIdx.x; i < k / 16; i += kThreads)
                sx4[j * (k / 16) + Format::staged_chunk(i)] =
                    __ldg(reinterpret_cast<const int4 *>(xq + xrow[j] * k) + i);
        __syncthreads();
        for (int64_t row = int64_t(blockIdx.y) * kWarps + warp; row < n_rows;
             row += int64_t(gridDim.y) * kWarps) {
            float acc[kTile];
#pragma unroll
            for (int j = 0; j < kTile; ++j) acc[j] = 0.0f;
            for (int64_t p0 = 0; p0 < pieces; p0 += 32 * kAhead) {
                uint4 g[kAhead];
                typename Format::Scales sc[kAhead];
#pragma unroll
                for (int a = 0; a < kAhead; ++a) {
                    const int64_t p = p0 + 32 * a + lane;
                    if (p < pieces) {
                        g[a] = __ldcs(reinterpret_cast<const uint4 *>(wbase + row * row_bytes) + p);
                        sc[a] = Format::load_scales(
                            sbase + (row * nb + p / Format::kPieces) * Format::Scales::kBytes, p);
                    } else {
                        g[a] = make_uint4(0, 0, 0, 0);
                        sc[a] = typename Format::Scales{};
                    }
                }
#pragma unroll
                for (int a = 0; a < kAhead; ++a) {
                    const int64_t p = p0 + 32 * a + lane;
                    if (p0 + 32 * a >= pieces) break;  // the same for every lane
                    const bool active = p < pieces;
                    const int64_t sb = p / Format::kPieces;
                    typename Format::Decoded w{};
                    if (active) w = Format::decode(g[a], tables, lane, sc[a], p);
#pragma unroll
                    for (int j = 0; j < kTile; ++j) {
                        if (j >= nt) break;  // the same for every lane
                        const float dx = active ? __ldg(xd + xrow[j] * nb + sb) : 0.0f;
                        typename Format::Sums s{};
                        if (active)
                            s = Format::dot_decoded(
                                w, Format::load_x(sx + j * k, xbsums + xrow[j] * (k / 16), p, sb),
                                sc[a]);
#pragma unroll
                        for (int o = 1; o < Format::kPieces; o *= 2)
                            s = Format::add(s, Format::shuffle(s, o));
                        if (active && lane % Format::kPieces == 0)
                            acc[j] += Format::term(s, sc[a], dx);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < kTile; ++j) {
                if (j >= nt) break;
                float v = acc[j];
                for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
                if (lane == 0)
                    y[int64_t(groups.order[tile + j]) * n_rows + row] = Format::kOutputScale * v;
            }
        }
    }
}

template <class Format>
size_t shared_bytes(int64_t k) {
    return size_t(Format::kTableBytes) + size_t(kTile) * size_t(k);
}

// Called with expert_matvec::prepare, outside any graph capture.
template <class Format>
void prepare() {
    DS4_CUDA_CHECK(cudaFuncSetAttribute(kernel<Format>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        kMaxDynamicSharedBytes));
}

// table: where the experts of the [n_experts][n_rows][k] tensor are (expert_table.h); groups over
// its n_experts experts; x: the activation rows (Q8_K planes, rows of k values) the pairs name
// through x_div.
template <class Format>
void launch(const ExpertTable &table, int64_t n_rows, int64_t k, const ExpertGroups &groups,
            const int8_t *xq, const float *xd, const int16_t *xbsums, float *y,
            cudaStream_t stream) {
    const dim3 grid = grouped_grid(groups, kRowSplit, kTile, "expert_matmul");
    if (shared_bytes<Format>(k) > size_t(kMaxDynamicSharedBytes))
        throw ds4::Error("expert_matmul: rows too long for the staged activations");
    launch_kernel(kernel<Format>, grid, kThreads, shared_bytes<Format>(k), stream, table, n_rows, k,
                  groups, xq, xd, xbsums, y);
}

}  // namespace ds4::cuda::expert_matmul
