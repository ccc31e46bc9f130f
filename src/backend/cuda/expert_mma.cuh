#pragma once
// The routed products of a prefill chunk (expert_matmul.cuh's job: a chunk's (token, slot)
// pairs grouped by expert) on int8 tensor cores, with the bits of the decode matvec
// (expert_matvec.cuh) for every (row, pair).
//
// The decode's output for a row is a fixed expression of exact integer super-block sums: lane
// 4 i of the warp accumulates the super-blocks sb = i, i + 8, i + 16, ... in that order,
// acc_i += Format::term(sums of sb, scales, dx); the warp's butterfly (xor 16, 8, 4, 2, 1; the
// other lanes hold 0) is then ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), + 0, + 0, and
// the row is kOutputScale times that. Here a warp takes 16 rows x the 8 pairs of a tile and a
// super-block is 8 mma products of 32 values (mma_s8.cuh): the format decodes each lane's 8
// weights of a product (Format::mma_a) and names which 8 activations they meet
// (Format::mma_x_offset); the integer sums are combined exactly as the decode's (a product's
// sum times its integer factor, then Format::mma_sums), and the float part is the decode's term,
// accumulator and tree, operation for operation.
//
// A Format provides, beyond expert_matvec.cuh's (load_tables, Scales, Sums, term, kOutputScale,
// kPieces: 16 kPieces bytes of quants per super-block):
//   struct MmaRow; MmaRow mma_row(row's quants, super-block's scale record, sb, c)  what lane
//                  c of a quad holds of one row's super-block
//   MmaA mma_a(row, j, tables, lane, c)   product j (0..7): the lane's 8 weights as two words
//                  of int8 (lo, hi) and the integer factor of the product's sum; called by all
//                  lanes together (it may shuffle within the quad)
//   int mma_x_offset(j, c)                where in the super-block those 8 weights' values are
//   Sums mma_sums(scaled, row, bsums of the pair's super-block)   the decode's Sums
//   Scales mma_scales(row)                the super-block's scales for term
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/expert_groups.h"
#include "backend/cuda/expert_table.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma_s8.cuh"

namespace ds4::cuda::expert_mma {

constexpr int kThreads = 256, kWarps = kThreads / 32, kQK = 256;
constexpr int kRows = 16;       // rows of a warp's tile (the mma's m)
constexpr int kTile = 8;        // pairs of a tile (the mma's n)
constexpr int kRowSplit = 4;    // blocks per expert and tile (each loops over its share of rows)
constexpr int kLanesPerSb = 8;  // the decode's accumulating lanes: 4 i, i = sb % 8

struct MmaA {
    int lo = 0, hi = 0;  // weights 8 c .. 8 c + 3 and 8 c + 4 .. 8 c + 7 of the product
    int scale = 1;       // the integer factor of the product's sum
};

template <class Format>
__global__ void __launch_bounds__(kThreads, 2)
    kernel(ExpertTable table, int64_t n_rows, int64_t k, ExpertGroups groups,
           const int8_t *__restrict__ xq, const float *__restrict__ xd,
           const int16_t *__restrict__ xbsums, float *__restrict__ y) {
    dev::wait_for_previous_kernels();
    const int64_t expert = blockIdx.z;
    const int begin = groups.offsets[expert], end = groups.offsets[expert + 1];
    if (begin + int(blockIdx.x) * kTile >= end) return;  // most blocks: no such tile
    extern __shared__ int4 smem[];  // [lookup tables][the tile's activations, sums, scales]
    uint8_t *tables = reinterpret_cast<uint8_t *>(smem);
    Format::load_tables(tables);
    // The tile's activations as 32-byte slices (k / 32 of a row), slice q of its kTile pairs
    // side by side: the mma's B fragment of product j is then 8 pairs x 32 bytes in a row, which
    // a warp reads in two shared-memory wavefronts (from the rows in memory, 8 lines apart, it
    // took eight L1 wavefronts: the kernel was bound by its L1/shared-memory pipe).
    // Beside them the pairs' super-block sums of 16 (32 bytes a super-block and pair, as
    // [sb][pair]) and scales ([sb][pair]), read by the float terms.
    static_assert(Format::kTableBytes % 16 == 0);
    int4 *sx = smem + Format::kTableBytes / 16;
    int16_t *sbsums = reinterpret_cast<int16_t *>(sx + kTile * k / 16);
    float *sdx = reinterpret_cast<float *>(sbsums + kTile * k / 16);

    const int64_t nb = k / kQK, row_bytes = nb * Format::kPieces * 16;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const uint8_t *wbase = table.qs[expert], *sbase = table.scales[expert];
    for (int tile = begin + int(blockIdx.x) * kTile; tile < end; tile += int(gridDim.x) * kTile) {
        const int nt = min(kTile, end - tile);
        // The lane's pair as the mma's column g (in the staged slices), and its outputs' pairs
        // 2 c, 2 c + 1 of the tile (past the tile's end: read as its last pair, not stored).
        const int out_pair[2] = {min(2 * c, nt - 1), min(2 * c + 1, nt - 1)};
        __syncthreads();  // the tables are in; the previous tile's slices are consumed
        for (int64_t i = threadIdx.x; i < kTile * (k / 16); i += kThreads) {
            // 16-byte half h of slice q of pair p, and of its sums (k / 16 int16, 32 bytes a
            // super-block)
            const int64_t q = i / (2 * kTile), p = (i / 2) % kTile, h = i % 2;
            const int64_t x = groups.order[tile + min(int(p), nt - 1)] / groups.x_div;
            sx[(q * kTile + p) * 2 + h] =
                __ldg(reinterpret_cast<const int4 *>(xq + x * k + 32 * q) + h);
            if (q < nb) {
                reinterpret_cast<int4 *>(sbsums)[(q * kTile + p) * 2 + h] =
                    __ldg(reinterpret_cast<const int4 *>(xbsums + x * (k / 16) + 16 * q) + h);
                if (h == 0) sdx[q * kTile + p] = __ldg(xd + x * nb + q);
            }
        }
        __syncthreads();
        const int8_t *xs = reinterpret_cast<const int8_t *>(sx) + g * 32 + c * 8;
        for (int64_t r0 = (int64_t(blockIdx.y) * kWarps + warp) * kRows; r0 < n_rows;
             r0 += int64_t(gridDim.y) * kWarps * kRows) {
            const int64_t rows[2] = {min(r0 + g, n_rows - 1), min(r0 + g + 8, n_rows - 1)};
            float acc[kLanesPerSb][4];
#pragma unroll
            for (int i = 0; i < kLanesPerSb; ++i)
#pragma unroll
                for (int o = 0; o < 4; ++o) acc[i][o] = 0.0f;
            for (int64_t sb0 = 0; sb0 < nb; sb0 += kLanesPerSb) {
#pragma unroll
                for (int i = 0; i < kLanesPerSb; ++i) {
                    const int64_t sb = sb0 + i;
                    if (sb >= nb) break;  // the same for every lane
                    typename Format::MmaRow wr[2];
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        wr[h] = Format::mma_row(
                            wbase + rows[h] * row_bytes,
                            sbase + (rows[h] * nb + sb) * Format::Scales::kBytes, sb, c);
                    int scaled[4] = {0, 0, 0, 0};
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        const MmaA a0 = Format::mma_a(wr[0], j, tables, lane, c);
                        const MmaA a1 = Format::mma_a(wr[1], j, tables, lane, c);
                        // slice sb * 8 + (the product's offset) / 32 of pair g, bytes 8 c ..
                        const int2 b = *reinterpret_cast<const int2 *>(
                            xs + (sb * 8 + Format::mma_x_offset(j, 0) / 32) * (32 * kTile));
                        const int a[4] = {a0.lo, a1.lo, a0.hi, a1.hi};
                        int isum[4];
                        dev::mma_s8_block(a, b.x, b.y, isum);
                        scaled[0] += isum[0] * a0.scale;
                        scaled[1] += isum[1] * a0.scale;
                        scaled[2] += isum[2] * a1.scale;
                        scaled[3] += isum[3] * a1.scale;
                    }
#pragma unroll
                    for (int o = 0; o < 4; ++o) {
                        const int64_t at = sb * kTile + out_pair[o % 2];
                        const typename Format::Sums s =
                            Format::mma_sums(scaled[o], wr[o / 2], sbsums + at * 16);
                        const float dx = sdx[at];
                        acc[i][o] += Format::term(s, Format::mma_scales(wr[o / 2]), dx);
                    }
                }
            }
#pragma unroll
            for (int o = 0; o < 4; ++o) {
                // The decode's butterfly over lanes 0, 4, .., 28 (xor 16, 8, 4), then its xor 2
                // and xor 1 steps, which add the other lanes' zeros.
                float v = ((acc[0][o] + acc[4][o]) + (acc[2][o] + acc[6][o])) +
                          ((acc[1][o] + acc[5][o]) + (acc[3][o] + acc[7][o]));
                v = v + 0.0f;
                v = v + 0.0f;
                const int64_t row = r0 + g + 8 * (o / 2);
                const int pair = 2 * c + o % 2;
                if (row < n_rows && pair < nt)
                    y[int64_t(groups.order[tile + pair]) * n_rows + row] = Format::kOutputScale * v;
            }
        }
    }
}

// The tables, then per pair of a tile: k int8 activations, k / 16 int16 sums, k / 256 scales.
template <class Format>
size_t shared_bytes(int64_t k) {
    return size_t(Format::kTableBytes) +
           size_t(kTile) * (size_t(k) + size_t(k) / 8 + size_t(k) / 64);
}

constexpr size_t kMaxSharedBytes = kMaxDynamicSharedBytes;

// Called when the weights are uploaded, outside any graph capture.
template <class Format>
void prepare() {
    DS4_CUDA_CHECK(cudaFuncSetAttribute(kernel<Format>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(kMaxSharedBytes)));
}

// As expert_matmul::launch: table the [n_experts][n_rows][k] tensor's experts; groups over
// its experts; x the activation rows (Q8_K planes, rows of k values) the pairs name via x_div.
template <class Format>
void launch(const ExpertTable &table, int64_t n_rows, int64_t k, const ExpertGroups &groups,
            const int8_t *xq, const float *xd, const int16_t *xbsums, float *y,
            cudaStream_t stream) {
    const dim3 grid = grouped_grid(groups, kRowSplit, kTile, "expert_mma");
    if (shared_bytes<Format>(k) > kMaxSharedBytes)
        throw ds4::Error("expert_mma: rows too long for the staged activations");
    launch_kernel(kernel<Format>, grid, kThreads, shared_bytes<Format>(k), stream, table, n_rows, k,
                  groups, xq, xd, xbsums, y);
}

}  // namespace ds4::cuda::expert_mma
