#pragma once
// The decode matvec skeleton shared by the routed-expert formats whose dot products take Q8_K
// activations (IQ2_XXS, Q2_K): one launch covers n_ids experts of a [n_experts][n_rows][k]
// tensor, expert ids[i] in output slot i (blockIdx.y), the ids read on the device and the
// expert's planes found through the tensor's expert table (expert_table.h); a negative id
// leaves its slot out (the device tier's hits-first pass runs a layer's experts in two launches).
// The activation is one row for every slot (gate, up: the layer's input) or one row per slot
// (down: each expert's own SwiGLU output), rows of k values.
//
// A block of 256 threads computes R rows of one expert per warp, looping over row groups (a
// grid of ~3 blocks per multiprocessor, so that per-block set-up such as lookup tables is paid
// a few hundred times per launch, not once per 8 R rows). The weights of a super-block
// (256 values) are kPieces pieces of 16 bytes (4 for IQ2_XXS and Q2_K, 8 for Q4_K; consecutive
// lanes); each lane computes the integer sums of its piece exactly, the lanes of a super-block
// add them (shuffles, exact), and the first applies the
// super-block's scales, so every float term is the CPU's per-super-block term. The int8
// activations are staged in shared memory once per block; all R rows' loads are issued before
// any is used. Partial sums are reduced in a fixed order (a butterfly): the same bits every run.
//
// A Format provides:
//   kTableBytes; load_tables(uint8_t *smem)   shared-memory lookup tables (0 bytes: none),
//                  filled by all threads of the block
//   struct Scales;  Scales load_scales(super-block scale record, piece)  what the piece needs
//   struct XPiece; XPiece load_x(x in shared memory, xbsums, piece, sb)  the activations a piece
//                  needs, loaded once per pass for all R rows
//   int64_t staged_chunk(i)  where 16-byte chunk i of an activation row goes in shared memory:
//                  a permutation within each super-block (256 bytes) chosen so that the 8 lanes
//                  of a 128-byte shared-memory phase of load_x read 8 different bank groups (the
//                  plain layout has lanes 128 bytes apart reading the same banks)
//   struct Sums { ...ints... };  Sums dot(uint4 piece, xpiece, tables, lane, scales)
//   struct Decoded;  Decoded decode(uint4 piece, tables, lane, scales, piece index) and
//                  Sums dot_decoded(decoded, xpiece, scales): dot in two steps, so that a piece
//                  decoded once serves several activation rows (expert_matmul.cuh)
//   Sums add(Sums, Sums), Sums shuffle(Sums, lane_xor)   exact integer addition across lanes
//   float term(Sums, Scales, dx)  the CPU's float term of one super-block
//   kOutputScale                 a constant applied once to the row's sum (1/8 for IQ2_XXS)
//   kPieces: 16-byte pieces of quants per super-block (a power of two up to 32)
//   planes: qs (16 kPieces bytes per super-block), scales (Scales::kBytes per super-block)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/expert_table.h"
#include "backend/cuda/launch.cuh"

namespace ds4::cuda::expert_matvec {

constexpr int kThreads = 256, kWarps = kThreads / 32, kQK = 256, kPieceBytes = 16;

// A second tensor of the same shape and format for the same slots (the routed gate and up):
// one launch of 2 n_ids slots, each output the bits of its own launch (a row's sum does not
// depend on the grid). table.qs null: none.
struct Second {
    ExpertTable table;
    float *y = nullptr;
    int64_t n_ids = 0;
};

// At most 80 registers a thread, so that 3 blocks fit on a multiprocessor (kTargetBlocks; the
// IQ2_XXS tables allow 3).
template <class Format, int R>
__global__ void __launch_bounds__(kThreads, 3)
    kernel(ExpertTable table, int64_t n_rows, int64_t k, const int32_t *__restrict__ ids,
           bool x_per_slot, const int8_t *__restrict__ xq, const float *__restrict__ xd,
           const int16_t *__restrict__ xbsums, float *__restrict__ y, Second second) {
    dev::wait_for_previous_kernels();
    // The slot of blockIdx.y, and with a second tensor the slots after the first's n_ids are
    // its own (the same ids, x, rows and k).
    int64_t slot = blockIdx.y;
    if (second.table.qs && slot >= second.n_ids) {
        slot -= second.n_ids;
        table = second.table;
        y = second.y;
    }
    const int64_t expert = ids[slot];
    if (expert < 0) return;  // a slot this launch leaves out: its outputs are not written
    if (x_per_slot) {
        xq += slot * k;
        xd += slot * (k / kQK);
        xbsums += slot * (k / 16);
    }
    extern __shared__ int4 smem[];  // [lookup tables][k int8 activations]
    uint8_t *tables = reinterpret_cast<uint8_t *>(smem);
    Format::load_tables(tables);
    int4 *sx4 = smem + Format::kTableBytes / 16;
    for (int64_t i = threadIdx.x; i < k / 16; i += kThreads)
        sx4[Format::staged_chunk(i)] = __ldg(reinterpret_cast<const int4 *>(xq) + i);
    __syncthreads();
    const int8_t *sx = reinterpret_cast<const int8_t *>(sx4);

    const int64_t nb = k / kQK, row_bytes = nb * Format::kPieces * kPieceBytes;
    const int64_t pieces = nb * Format::kPieces;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint8_t *wbase = table.qs[expert], *sbase = table.scales[expert];
    for (int64_t group = blockIdx.x; group * kWarps * R < n_rows; group += gridDim.x) {
        const int64_t row0 = (group * kWarps + warp) * R;
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = 0.0f;
        // kAhead passes of 32 pieces at a time: their loads (4 per lane whatever R) are all
        // issued before the first is used; the terms are still added pass by pass.
        constexpr int kAhead = 4 / R;
        for (int64_t p0 = 0; p0 < pieces; p0 += 32 * kAhead) {
            uint4 g[kAhead][R];
            typename Format::Scales sc[kAhead][R];
#pragma unroll
            for (int a = 0; a < kAhead; ++a) {
                const int64_t p = p0 + 32 * a + lane;
                const bool active = p < pieces;  // a multiple of kPieces: super-blocks stay whole
                const int64_t sb = p / Format::kPieces;
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const int64_t row = min(row0 + r, n_rows - 1);  // a clamped duplicate: unstored
                    if (active) {
                        g[a][r] =
                            __ldcs(reinterpret_cast<const uint4 *>(wbase + row * row_bytes) + p);
                        sc[a][r] = Format::load_scales(
                            sbase + (row * nb + sb) * Format::Scales::kBytes, p);
                    } else {
                        g[a][r] = make_uint4(0, 0, 0, 0);
                        sc[a][r] = typename Format::Scales{};
                    }
                }
            }
#pragma unroll
            for (int a = 0; a < kAhead; ++a) {
                const int64_t p = p0 + 32 * a + lane;
                if (p0 + 32 * a >= pieces) break;  // the same for every lane
                const bool active = p < pieces;
                const int64_t sb = p / Format::kPieces;
                const float dx = active ? __ldg(xd + sb) : 0.0f;
                typename Format::XPiece xp{};
                if (active) xp = Format::load_x(sx, xbsums, p, sb);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    typename Format::Sums s{};
                    if (active) s = Format::dot(g[a][r], xp, tables, lane, sc[a][r]);
#pragma unroll
                    for (int o = 1; o < Format::kPieces; o *= 2)
                        s = Format::add(s, Format::shuffle(s, o));
                    if (active && lane % Format::kPieces == 0)
                        acc[r] += Format::term(s, sc[a][r], dx);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float v = acc[r];
            for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0 && row0 + r < n_rows)
                y[slot * n_rows + row0 + r] = Format::kOutputScale * v;
        }
    }
}

// Shared memory beyond the default 48 KiB needs each kernel's permission. Called when the
// weights are uploaded, outside any graph capture.
template <class Format>
void prepare() {
    constexpr int kMax = kMaxDynamicSharedBytes;
    DS4_CUDA_CHECK(
        cudaFuncSetAttribute(kernel<Format, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMax));
    DS4_CUDA_CHECK(
        cudaFuncSetAttribute(kernel<Format, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMax));
    DS4_CUDA_CHECK(
        cudaFuncSetAttribute(kernel<Format, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMax));
}

template <class Format, int R>
void launch_rows(dim3 grid, size_t smem, const ExpertTable &table, int64_t n_rows, int64_t k,
                 const int32_t *ids, bool x_per_slot, const int8_t *xq, const float *xd,
                 const int16_t *xbsums, float *y, const Second &second, cudaStream_t stream) {
    launch_kernel(kernel<Format, R>, grid, kThreads, smem, stream, table, n_rows, k, ids,
                  x_per_slot, xq, xd, xbsums, y, second);
}

// Up to four rows per warp while there are ~3 row groups per multiprocessor of an H200 (132);
// at most that many blocks, each looping over row groups. Dynamic shared memory: the format's
// tables and the k int8 activations.
template <class Format>
void launch(const ExpertTable &table, int64_t n_rows, int64_t k, const int32_t *ids, int n_ids,
            bool x_per_slot, const int8_t *xq, const float *xd, const int16_t *xbsums, float *y,
            cudaStream_t stream, const Second &second = {}) {
    constexpr int64_t kTargetBlocks = 3 * 132;
    if (second.table.qs) n_ids = int(2 * second.n_ids);  // the two tensors' slots
    const int64_t warp_rows = (n_rows + kWarps - 1) / kWarps * n_ids;
    const int r = warp_rows >= 4 * kTargetBlocks ? 4 : warp_rows >= 2 * kTargetBlocks ? 2 : 1;
    const int64_t groups = (n_rows + kWarps * r - 1) / (kWarps * r);
    const int64_t per_slot = std::max<int64_t>(1, (kTargetBlocks + n_ids - 1) / n_ids);
    const dim3 grid(unsigned(std::min(groups, per_slot)), unsigned(n_ids));
    const size_t smem = size_t(Format::kTableBytes) + size_t(k);
    if (r == 4)
        launch_rows<Format, 4>(grid, smem, table, n_rows, k, ids, x_per_slot, xq, xd, xbsums, y,
                               second, stream);
    else if (r == 2)
        launch_rows<Format, 2>(grid, smem, table, n_rows, k, ids, x_per_slot, xq, xd, xbsums, y,
                               second, stream);
    else
        launch_rows<Format, 1>(grid, smem, table, n_rows, k, ids, x_per_slot, xq, xd, xbsums, y,
                               second, stream);
}

}  // namespace ds4::cuda::expert_matvec
