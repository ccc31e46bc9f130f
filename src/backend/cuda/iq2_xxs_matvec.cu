#include <cuda_fp16.h>

#include <cstring>
#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/iq2_xxs_matvec.h"
#include "common/error.h"
#include "quant/blocks.h"
#include "quant/iq2_tables.h"

namespace ds4::cuda {
namespace {

constexpr int kQK = 256;
constexpr int kGroupBytes = 64;  // per super-block: 8 groups of 8 bytes
constexpr int kThreads = 256;

// The 256 grid points (8 magnitudes of 8, 25 or 43 each), copied from the CPU's table once, and
// for each of the 128 sign patterns (7 stored bits; the 8th makes the parity even, kIq2Signs) a
// mask with byte j = 0xff where value j is negative.
__device__ uint64_t g_grid[256];
__device__ uint64_t g_sign_masks[128];

void upload_tables_once() {
    static std::once_flag once;
    std::call_once(once, [] {
        uint64_t masks[128];
        for (int i = 0; i < 128; ++i) {
            masks[i] = 0;
            for (int j = 0; j < 8; ++j)
                if ((quant::kIq2Signs[i] >> j) & 1) masks[i] |= uint64_t(0xff) << (8 * j);
        }
        DS4_CUDA_CHECK(cudaMemcpyToSymbol(g_grid, quant::kIq2xxsGrid, sizeof(g_grid)));
        DS4_CUDA_CHECK(cudaMemcpyToSymbol(g_sign_masks, masks, sizeof(masks)));
    });
}

// Grid magnitudes (4 bytes) with the masked bytes negated: b -> (b ^ 0xff) + 1 = -b. Magnitudes
// are 8..43, so the +1 never carries into the next byte.
__device__ __forceinline__ int apply_signs(uint32_t mag, uint32_t mask) {
    return int((mag ^ mask) + (mask & 0x01010101u));
}

// sum over the 32 values of one group of (+-grid) * q, times (2 ls + 1): the CPU's group_sum
// times its scale factor, exactly (int32).
__device__ __forceinline__ int group_dot(const uint64_t *grid, const uint64_t *sign_masks,
                                         uint32_t indices, uint32_t signs_scale, const int *q) {
    int sum = 0;
#pragma unroll
    for (int l = 0; l < 4; ++l) {
        const uint64_t g = grid[(indices >> (8 * l)) & 0xffu];
        const uint64_t m = sign_masks[(signs_scale >> (7 * l)) & 127u];
        sum = __dp4a(apply_signs(uint32_t(g), uint32_t(m)), q[2 * l], sum);
        sum = __dp4a(apply_signs(uint32_t(g >> 32), uint32_t(m >> 32)), q[2 * l + 1], sum);
    }
    return sum * int(2 * (signs_scale >> 28) + 1);
}

// A block of 256 threads computes R rows of one expert (blockIdx.y = output slot). Thread pieces:
// piece p of a row is its 16 bytes [16 p, 16 p + 16) of the group plane = groups 2 (p % 4),
// 2 (p % 4) + 1 of super-block p / 4. The four pieces of a super-block are four consecutive
// lanes; their integer sums are added exactly (shuffles) before the super-block's scale is
// applied by the first of them. x's int8 values are staged in shared memory once per block.
template <int R>
__global__ void __launch_bounds__(kThreads)
    matvec_iq2_xxs_kernel(const uint8_t *__restrict__ wq, const uint16_t *__restrict__ wd,
                          int64_t n_rows, int64_t k, const int32_t *__restrict__ ids,
                          const int8_t *__restrict__ xq, const float *__restrict__ xd,
                          float *__restrict__ y) {
    extern __shared__ int4 smem[];
    __shared__ uint64_t grid[256], sign_masks[128];
    grid[threadIdx.x] = g_grid[threadIdx.x];
    if (threadIdx.x < 128) sign_masks[threadIdx.x] = g_sign_masks[threadIdx.x];
    int8_t *sx = reinterpret_cast<int8_t *>(smem);
    for (int64_t i = threadIdx.x; i < k / 16; i += kThreads)
        smem[i] = __ldg(reinterpret_cast<const int4 *>(xq) + i);
    __syncthreads();

    const int64_t expert = ids[blockIdx.y];
    const int64_t nb = k / kQK, row_bytes = nb * kGroupBytes;
    const int64_t pieces = nb * 4;
    constexpr int kWarps = kThreads / 32;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t row0 = (int64_t(blockIdx.x) * kWarps + warp) * R;
    const uint8_t *wbase = wq + expert * n_rows * row_bytes;
    const uint16_t *dbase = wd + expert * n_rows * nb;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int64_t p0 = 0; p0 < pieces; p0 += 32) {
        const int64_t p = p0 + lane;
        const bool active = p < pieces;  // pieces is a multiple of 4: super-blocks stay whole
        const int64_t sb = p / 4;
        int q[16];
        if (active) {
            const int4 *xs = reinterpret_cast<const int4 *>(sx + p * 64);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int4 v = xs[j];
                q[4 * j] = v.x, q[4 * j + 1] = v.y, q[4 * j + 2] = v.z, q[4 * j + 3] = v.w;
            }
        }
        const float dx = active ? __ldg(xd + sb) : 0.0f;
        // All R rows' loads are issued before any of them is used, so they are in flight together.
        uint4 g[R];
        uint16_t dw[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int64_t row = min(row0 + r, n_rows - 1);  // a clamped duplicate is not stored
            g[r] = make_uint4(0, 0, 0, 0);
            dw[r] = 0;
            if (active) {
                g[r] = __ldcs(reinterpret_cast<const uint4 *>(wbase + row * row_bytes) + p);
                dw[r] = __ldcs(dbase + row * nb + sb);
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            int s = active ? group_dot(grid, sign_masks, g[r].x, g[r].y, q) +
                                 group_dot(grid, sign_masks, g[r].z, g[r].w, q + 8)
                           : 0;
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            if (active && lane % 4 == 0)
                acc[r] += __half2float(__ushort_as_half(dw[r])) * dx * static_cast<float>(s);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float v = acc[r];
        for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && row0 + r < n_rows) y[int64_t(blockIdx.y) * n_rows + row0 + r] = 0.125f * v;
    }
}

}  // namespace

Iq2xxsPlanes repack_iq2_xxs(const void *ggml_blocks, int64_t n_blocks) {
    const auto *blocks = static_cast<const quant::BlockIQ2_XXS *>(ggml_blocks);
    Iq2xxsPlanes p;
    p.qs.resize(size_t(n_blocks) * kGroupBytes);
    p.d.resize(size_t(n_blocks));
    for (int64_t i = 0; i < n_blocks; ++i) {
        std::memcpy(p.qs.data() + i * kGroupBytes, blocks[i].qs, kGroupBytes);
        p.d[size_t(i)] = blocks[i].d;
    }
    return p;
}

Iq2xxsWeights::Iq2xxsWeights(const void *ggml_blocks, int64_t n_rows, int64_t k,
                             int64_t n_experts) {
    if (k % kQK != 0) throw ds4::Error("IQ2_XXS rows must hold a multiple of 256 values");
    upload_tables_once();  // here, not at the first launch, which may be inside a graph capture
    const Iq2xxsPlanes p = repack_iq2_xxs(ggml_blocks, n_experts * n_rows * (k / kQK));
    qs_ = DeviceBuffer(p.qs.size());
    d_ = DeviceBuffer(p.d.size() * sizeof(uint16_t));
    DS4_CUDA_CHECK(cudaMemcpy(qs_.get(), p.qs.data(), qs_.bytes(), cudaMemcpyHostToDevice));
    DS4_CUDA_CHECK(cudaMemcpy(d_.get(), p.d.data(), d_.bytes(), cudaMemcpyHostToDevice));
    view_ = {qs_.as<uint8_t>(), d_.as<uint16_t>(), n_rows, k, n_experts};
}

void matvec_iq2_xxs(const Iq2xxsExperts &w, const int32_t *ids, int n_ids, const Q8_KActivation &x,
                    float *y, cudaStream_t stream) {
    if (n_ids <= 0 || w.n_rows == 0) return;
    const size_t smem = size_t(w.k);  // the int8 activations
    constexpr int kWarps = kThreads / 32;
    // Up to four rows per warp (each activation piece read from shared memory once for all of
    // them) while the grid stays above ~2 blocks per multiprocessor of an H200 (132).
    const int64_t warp_rows = (w.n_rows + kWarps - 1) / kWarps * n_ids;
    const int r = warp_rows >= 4 * 264 ? 4 : warp_rows >= 2 * 264 ? 2 : 1;
    const int rows_per_block = kWarps * r;
    const dim3 grid(unsigned((w.n_rows + rows_per_block - 1) / rows_per_block), unsigned(n_ids));
    if (r == 4)
        matvec_iq2_xxs_kernel<4>
            <<<grid, kThreads, smem, stream>>>(w.qs, w.d, w.n_rows, w.k, ids, x.q, x.d, y);
    else if (r == 2)
        matvec_iq2_xxs_kernel<2>
            <<<grid, kThreads, smem, stream>>>(w.qs, w.d, w.n_rows, w.k, ids, x.q, x.d, y);
    else
        matvec_iq2_xxs_kernel<1>
            <<<grid, kThreads, smem, stream>>>(w.qs, w.d, w.n_rows, w.k, ids, x.q, x.d, y);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
