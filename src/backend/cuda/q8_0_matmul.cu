#include <cuda_fp16.h>

#include <mutex>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma_s8.cuh"
#include "backend/cuda/per_device.h"
#include "backend/cuda/q8_0_matmul.h"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kBlockValues = 32;  // values per Q8_0 block: the k of one m16n8k32 product
constexpr int kMmaRows = 16, kMmaTokens = 8;
constexpr int kNTiles = 4;                           // n-tiles per warp: 32 tokens
constexpr int kWarpTokens = kNTiles * kMmaTokens;    // 32
constexpr int kWarpsM = 2, kWarpsN = 2;              // a block: 32 rows x 64 tokens
constexpr int kThreads = kWarp * kWarpsM * kWarpsN;  // 128
constexpr int kLeaves = 16;  // blocks one warp of the matvec adds per pass (its even lanes)

// 4-bit bit reversal: the leaf order of the matvec's butterfly (see below).
__host__ __device__ constexpr int bit_reverse4(int q) {
    return ((q & 1) << 3) | ((q & 2) << 1) | ((q & 4) >> 1) | ((q & 8) >> 3);
}

// The batched Q8_0 product on int8 tensor cores, with the float arithmetic of
// matvec_q8_0_kernel (q8_0_matvec.cu) term for term and in its order, so that every output has
// the bits of that token's matvec. The matvec with TPR threads per row (tpr here) reads
// passes of TPR / 2 blocks; the even lane 2p of warp w accumulates block
//   pass * TPR / 2 + 16 w + p
// over the passes, acc = fma(float(isum), f16(dw) * dx, acc) from 0; the warp then sums its
// lanes by a butterfly (xor 16, 8, 4, 2, 1; odd lanes hold 0), which is a balanced tree over
// the 16 accumulators in bit-reversed order (0, 8, 4, 12, 2, ...) followed by + 0; the warps of
// a row are then added in index order starting from 0 (only when TPR > 32).
// Here the int32 block sums come from one mma per block and 8 tokens (mma_s8.cuh; exact, as the
// matvec's dp4a sums), the per-leaf fma chains run in the same pass order, and the 16 leaves are
// folded as they complete, in that tree's order, with a stack of four partial sums per output.
// blockIdx.z is the group of a grouped product (matrix z of n_rows rows, activation slice z of
// each token's row); tokens are x_stride values and y_stride outputs apart.
//
// kStaged: the block's 64 tokens' activations and scales for the blocks of one w (its 16 p of
// each pass) are copied to shared memory (cp.async) before that w is computed, a token's 32
// bytes of a block beside the next token's: an mma's B fragment is then 256 contiguous bytes
// (two shared-memory wavefronts; from memory, 8 tokens' rows, it took eight L1 wavefronts, which
// bound the grouped routed products the same way). The same values in the same order. One stage
// (72 KiB for one pass) leaves three blocks a multiprocessor, which hide each other's copies.
constexpr int kBlockTokens = kWarpsN * kWarpTokens;                         // 64
constexpr int64_t kStageBytesPerBlock = kBlockTokens * (kBlockValues + 4);  // values, scale

__host__ __device__ constexpr int64_t q8_0_mma_passes(int64_t nb, int tpr) {
    return (nb + tpr / 2 - 1) / (tpr / 2);
}

// A stage: the passes' 16 blocks of one w, for the block's tokens.
__host__ __device__ constexpr int64_t q8_0_stage_bytes(int64_t passes) {
    return passes * 16 * kStageBytesPerBlock;
}

constexpr int64_t kMaxStagedBytes = kMaxDynamicSharedBytes;

template <bool kStaged>
__global__ void __launch_bounds__(kThreads)
    matmul_q8_0_mma_kernel(const int8_t *__restrict__ wq, const uint16_t *__restrict__ wd,
                           int64_t n_rows, int64_t k, int tpr, const int8_t *__restrict__ xq,
                           const float *__restrict__ xd, float *__restrict__ y, int64_t n_tokens,
                           int64_t x_stride, int64_t y_stride) {
    dev::wait_for_previous_kernels();
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int g = lane / 4, c = lane % 4;
    const int64_t nb = k / kBlockValues, x_nb = x_stride / kBlockValues;
    {
        const int64_t z = blockIdx.z;
        wq += z * n_rows * k;
        wd += z * n_rows * nb;
        xq += z * k;
        xd += z * nb;
        y += z * n_rows;
    }
    const int64_t row0 = (int64_t(blockIdx.x) * kWarpsM + warp % kWarpsM) * kMmaRows + g;
    const int64_t tok0 = (int64_t(blockIdx.y) * kWarpsN + warp / kWarpsM) * kWarpTokens;
    // Rows and tokens past the end are read clamped (valid memory) and not stored.
    const int64_t rows[2] = {min(row0, n_rows - 1), min(row0 + 8, n_rows - 1)};
    const int8_t *wa[2] = {wq + rows[0] * k + 8 * c, wq + rows[1] * k + 8 * c};
    const uint16_t *ws[2] = {wd + rows[0] * nb, wd + rows[1] * nb};
    const int8_t *xb[kNTiles];
    const float *xs[kNTiles][2];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
        const int64_t tb = min(tok0 + nt * kMmaTokens + g, n_tokens - 1);
        xb[nt] = xq + tb * x_stride + 8 * c;
#pragma unroll
        for (int h = 0; h < 2; ++h)
            xs[nt][h] = xd + min(tok0 + nt * kMmaTokens + 2 * c + h, n_tokens - 1) * x_nb;
    }
    const int warps_per_row = tpr / kWarp;
    const int64_t per_pass = tpr / 2;
    // Staged: for local block lb = m * 16 + p (block 16 w + p + m per_pass) and the block's
    // token t, its 32 values at sv[lb][t] and its scale at ss[lb][t].
    extern __shared__ int4 q8_0_stage[];
    const int64_t passes = q8_0_mma_passes(nb, tpr);
    const int64_t block_tok0 = int64_t(blockIdx.y) * kBlockTokens;
    int8_t *const sv = reinterpret_cast<int8_t *>(q8_0_stage);
    float *const ss = reinterpret_cast<float *>(sv + passes * 16 * kBlockTokens * kBlockValues);
    const auto issue_stage = [&](int w) {
        const int64_t n = passes * 16 * kBlockTokens;
        for (int64_t i = threadIdx.x; i < 2 * n; i += kThreads) {
            const int64_t lb = i / (2 * kBlockTokens), t = (i / 2) % kBlockTokens, h = i % 2;
            const int64_t blk = 16 * w + lb % 16 + lb / 16 * per_pass;
            const int64_t tok = min(block_tok0 + t, n_tokens - 1);
            const bool valid = blk < nb;
            dev::copy_16_async(sv + (lb * kBlockTokens + t) * kBlockValues + 16 * h,
                               xq + tok * x_stride + (valid ? blk : 0) * kBlockValues + 16 * h,
                               valid);
            if (h == 0 && valid)
                dev::copy_4_async(ss + lb * kBlockTokens + t, xd + tok * x_nb + blk);
        }
        dev::commit_async_copies();
    };
    // The lane's token of n-tile nt within the block, and its outputs' tokens 2 c, 2 c + 1.
    const int warp_tok = (warp / kWarpsM) * kWarpTokens;
    // Output (nt, i): row rows[i / 2], token tok0 + 8 nt + 2 c + i % 2 (the mma's c layout).
    float total[kNTiles][4];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) total[nt][i] = 0.0f;
    for (int w = 0; w < warps_per_row; ++w) {
        if constexpr (kStaged) {
            issue_stage(w);
            dev::wait_async_copies(0);
            __syncthreads();
        }
        float stack[4][kNTiles][4];  // stack[l]: a finished subtree of 2^l leaves
#pragma unroll
        for (int q = 0; q < kLeaves; ++q) {
            const int p = bit_reverse4(q);
            float leaf[kNTiles][4];
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) leaf[nt][i] = 0.0f;
            int64_t lb = p;  // the staged block: m * 16 + p
            for (int64_t blk = 16 * w + p; blk < nb; blk += per_pass, lb += 16) {
                const int2 a0 = __ldg(reinterpret_cast<const int2 *>(wa[0] + blk * kBlockValues));
                const int2 a1 = __ldg(reinterpret_cast<const int2 *>(wa[1] + blk * kBlockValues));
                const int a[4] = {a0.x, a1.x, a0.y, a1.y};
                const float dw[2] = {__half2float(__ushort_as_half(__ldg(ws[0] + blk))),
                                     __half2float(__ushort_as_half(__ldg(ws[1] + blk)))};
#pragma unroll
                for (int nt = 0; nt < kNTiles; ++nt) {
                    int2 b;
                    float dx[2];
                    if constexpr (kStaged) {
                        const int t0 = warp_tok + nt * kMmaTokens;
                        b = *reinterpret_cast<const int2 *>(
                            sv + (lb * kBlockTokens + t0 + g) * kBlockValues + 8 * c);
                        dx[0] = ss[lb * kBlockTokens + t0 + 2 * c];
                        dx[1] = ss[lb * kBlockTokens + t0 + 2 * c + 1];
                    } else {
                        b = __ldg(reinterpret_cast<const int2 *>(xb[nt] + blk * kBlockValues));
                        dx[0] = __ldg(xs[nt][0] + blk);
                        dx[1] = __ldg(xs[nt][1] + blk);
                    }
                    int isum[4];
                    dev::mma_s8_block(a, b.x, b.y, isum);
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const float scale = __fmul_rn(dw[i / 2], dx[i % 2]);
                        leaf[nt][i] = __fmaf_rn(static_cast<float>(isum[i]), scale, leaf[nt][i]);
                    }
                }
            }
            // Fold leaf q into the tree: pair with the finished subtrees its index completes.
            int level = 0;
#pragma unroll
            for (int l = 0; l < 4; ++l)
                if ((q >> l) & 1) {
#pragma unroll
                    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
                        for (int i = 0; i < 4; ++i)
                            leaf[nt][i] = __fadd_rn(stack[l][nt][i], leaf[nt][i]);
                    level = l + 1;
                } else {
                    break;
                }
            if (level < 4) {
#pragma unroll
                for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
                    for (int i = 0; i < 4; ++i) stack[level][nt][i] = leaf[nt][i];
            } else {
                // q = 15: the whole tree; + 0 is the butterfly's last step (odd lanes hold 0).
#pragma unroll
                for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const float warp_sum = __fadd_rn(leaf[nt][i], 0.0f);
                        total[nt][i] =
                            warps_per_row == 1 ? warp_sum : __fadd_rn(total[nt][i], warp_sum);
                    }
            }
        }
        if constexpr (kStaged) __syncthreads();  // stage w is consumed before w + 1 replaces it
    }
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int64_t row = row0 + 8 * (i / 2), tok = tok0 + nt * kMmaTokens + 2 * c + i % 2;
            if (row < n_rows && tok < n_tokens) y[tok * y_stride + row] = total[nt][i];
        }
}

}  // namespace

void matmul_q8_0_mma(const Q8_0Matrix &w, int threads_per_row, const int8_t *xq, const float *xd,
                     int64_t n_tokens, int64_t x_stride, int64_t y_stride, int groups, float *y,
                     cudaStream_t stream) {
    if (w.n_rows == 0 || n_tokens <= 0) return;
    if (threads_per_row % kWarp != 0 || threads_per_row < kWarp)
        throw ds4::Error("matmul_q8_0_mma: threads per row must be a multiple of 32");
    if (w.k % kBlockValues != 0 || x_stride % kBlockValues != 0)
        throw ds4::Error("matmul_q8_0_mma: rows must hold whole Q8_0 blocks");
    const int64_t row_tiles = (w.n_rows + kWarpsM * kMmaRows - 1) / (kWarpsM * kMmaRows);
    const int64_t token_tiles = (n_tokens + kWarpsN * kWarpTokens - 1) / (kWarpsN * kWarpTokens);
    if (row_tiles > 0x7fffffff || token_tiles > 65535 || groups < 1 || groups > 65535)
        throw ds4::Error("matmul_q8_0_mma: too many rows, tokens or groups for one launch");
    const dim3 grid{unsigned(row_tiles), unsigned(token_tiles), unsigned(groups)};
    // The staged kernel where a stage leaves two blocks a multiprocessor (one pass: every
    // published shape but k of 8,192, whose two passes read from memory).
    const int64_t stage = q8_0_stage_bytes(q8_0_mma_passes(w.k / kBlockValues, threads_per_row));
    if (staged_q8_0_enabled() && stage <= kMaxStagedBytes / 2) {
        static PerDevice<bool> sized;  // prefill only: never inside a graph capture
        sized.get([] {
            DS4_CUDA_CHECK(cudaFuncSetAttribute(matmul_q8_0_mma_kernel<true>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                int(kMaxStagedBytes)));
            return true;
        });
        launch_kernel(matmul_q8_0_mma_kernel<true>, grid, kThreads, size_t(stage), stream, w.qs,
                      w.d, w.n_rows, w.k, threads_per_row, xq, xd, y, n_tokens, x_stride, y_stride);
    } else {
        launch_kernel(matmul_q8_0_mma_kernel<false>, grid, kThreads, 0, stream, w.qs, w.d, w.n_rows,
                      w.k, threads_per_row, xq, xd, y, n_tokens, x_stride, y_stride);
    }
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
