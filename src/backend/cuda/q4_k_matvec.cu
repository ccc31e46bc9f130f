#include <cuda_fp16.h>

#include <cstddef>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/expert_matmul.cuh"
#include "backend/cuda/expert_planes.h"
#include "backend/cuda/host_upload.h"
#include "backend/cuda/q4_k_matvec.h"
#include "common/error.h"
#include "quant/blocks.h"

namespace ds4::cuda {
namespace {

constexpr int kQK = 256;

// The Q4_K format for expert_matvec.cuh. Quant bytes [32 c, 32 c + 32) hold sub-blocks 2 c (low
// nibbles) and 2 c + 1 (high nibbles), value l of sub-block j at 32 j + l. Piece q (0..7) is
// bytes [16 q, 16 q + 16): chunk c = q / 2, half h = q % 2, i.e. values 16 h .. 16 h + 15 of
// both sub-blocks; bsums[2 j + h] is exactly the sum of those activations of sub-block j, so the
// two pieces of a chunk split each mins term without overlap.
struct Q4KFormat {
    static constexpr int kTableBytes = 0;
    __device__ static void load_tables(uint8_t *) {}
    struct Scales {
        static constexpr int kBytes = 16;
        uint4 header{};  // f16 d, f16 dmin, 12 bytes of scales and mins
    };
    struct Sums {
        int scaled = 0, mins = 0;
    };
    struct XPiece {
        int4 lo, hi;       // activations of the piece's values in sub-blocks 2 c and 2 c + 1
        int bs_lo, bs_hi;  // their sums
        int c = 0;
    };
    static constexpr int kPieces = 8;
    static constexpr float kOutputScale = 1.0f;

    __device__ static Scales load_scales(const uint8_t *rec, int64_t) {
        return {__ldcs(reinterpret_cast<const uint4 *>(rec))};
    }
    // Chunk q (values 16 q ..) of super-block sb at 16 sb + (q ^ (2 (q / 8))): a piece reads
    // chunks 4 c + h and 4 c + h + 2, and the 8 pieces of a super-block (a phase's lanes) then
    // read 8 different 16-byte bank groups for each.
    __device__ static int64_t swizzle(int64_t sb, int64_t q) {
        return 16 * sb + (q ^ (2 * (q >> 3)));
    }
    __device__ static int64_t staged_chunk(int64_t i) { return swizzle(i / 16, i % 16); }
    __device__ static XPiece load_x(const int8_t *sx, const int16_t *xbsums, int64_t p,
                                    int64_t sb) {
        const int q = int(p % 8), c = q / 2, h = q % 2;
        const int4 *x = reinterpret_cast<const int4 *>(sx);
        XPiece xp;
        xp.lo = x[swizzle(sb, 4 * c + h)];
        xp.hi = x[swizzle(sb, 4 * c + h + 2)];
        xp.bs_lo = __ldg(xbsums + sb * 16 + 2 * (2 * c) + h);
        xp.bs_hi = __ldg(xbsums + sb * 16 + 2 * (2 * c + 1) + h);
        xp.c = c;
        return xp;
    }
    // get_scale_min of quant/q4_k.cpp: scales (s[0..12)) -> (scale, min) of sub-block j.
    __device__ static void scale_min(const uint8_t *s, int j, int &sc, int &m) {
        if (j < 4) {
            sc = s[j] & 63;
            m = s[j + 4] & 63;
        } else {
            sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
            m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
    }
    // The piece's low and high nibbles (its values of sub-blocks 2 c and 2 c + 1) and their
    // scales and mins (expert_matmul.cuh decodes a piece once for several activation rows).
    struct Decoded {
        int lo[4], hi[4];
        int sc_lo = 0, m_lo = 0, sc_hi = 0, m_hi = 0;
    };
    __device__ static Decoded decode_chunk(uint4 g, const Scales &sc, int c) {
        const uint32_t m = 0x0f0f0f0fu;
        Decoded d;
        const uint32_t w[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            d.lo[i] = int(w[i] & m);
            d.hi[i] = int((w[i] >> 4) & m);
        }
        const uint8_t *s = reinterpret_cast<const uint8_t *>(&sc.header) + 4;
        scale_min(s, 2 * c, d.sc_lo, d.m_lo);
        scale_min(s, 2 * c + 1, d.sc_hi, d.m_hi);
        return d;
    }
    __device__ static Decoded decode(uint4 g, const uint8_t *, int, const Scales &sc, int64_t p) {
        return decode_chunk(g, sc, int(p % 8) / 2);
    }
    __device__ static Sums dot_decoded(const Decoded &d, const XPiece &xp, const Scales &) {
        int lo = __dp4a(d.lo[0], xp.lo.x, 0);
        lo = __dp4a(d.lo[1], xp.lo.y, lo);
        lo = __dp4a(d.lo[2], xp.lo.z, lo);
        lo = __dp4a(d.lo[3], xp.lo.w, lo);
        int hi = __dp4a(d.hi[0], xp.hi.x, 0);
        hi = __dp4a(d.hi[1], xp.hi.y, hi);
        hi = __dp4a(d.hi[2], xp.hi.z, hi);
        hi = __dp4a(d.hi[3], xp.hi.w, hi);
        return {d.sc_lo * lo + d.sc_hi * hi, d.m_lo * xp.bs_lo + d.m_hi * xp.bs_hi};
    }
    __device__ static Sums dot(uint4 g, const XPiece &xp, const uint8_t *, int, const Scales &sc) {
        return dot_decoded(decode_chunk(g, sc, xp.c), xp, sc);
    }
    __device__ static Sums add(Sums a, Sums b) {
        return {a.scaled + b.scaled, a.mins + b.mins};
    }
    __device__ static Sums shuffle(Sums a, int x) {
        return {__shfl_xor_sync(0xffffffffu, a.scaled, x), __shfl_xor_sync(0xffffffffu, a.mins, x)};
    }
    __device__ static float term(Sums s, const Scales &sc, float dx) {
        const float d = __half2float(__ushort_as_half(uint16_t(sc.header.x & 0xffffu)));
        const float dmin = __half2float(__ushort_as_half(uint16_t(sc.header.x >> 16)));
        const float dall = __fmul_rn(dx, d), dm = __fmul_rn(dx, dmin);
        return __fsub_rn(__fmul_rn(dall, float(s.scaled)), __fmul_rn(dm, float(s.mins)));
    }
};

}  // namespace

Q4KPlanes repack_q4_K(const void *ggml_blocks, int64_t n_blocks) {
    const auto *blocks = static_cast<const quant::BlockQ4_K *>(ggml_blocks);
    Q4KPlanes p;
    p.qs.resize(size_t(n_blocks) * 128);
    p.headers.resize(size_t(n_blocks) * 16);
    for (int64_t i = 0; i < n_blocks; ++i) {
        std::memcpy(p.qs.data() + i * 128, blocks[i].qs, 128);
        std::memcpy(p.headers.data() + i * 16, &blocks[i], 16);  // d, dmin, scales
    }
    return p;
}

Q4KWeights::Q4KWeights(const void *ggml_blocks, int64_t n_rows, int64_t k, int64_t n_experts) {
    if (k % kQK != 0) throw ds4::Error("Q4_K rows must hold a multiple of 256 values");
    // repack_q4_K on the device: the quants are the segment, the header d, dmin, scales.
    const BlockSplit split = block_split(GgmlType::Q4_K);
    static_assert(sizeof(quant::BlockQ4_K) == 128 + 16);
    const int64_t n_blocks = n_experts * n_rows * (k / kQK);
    qs_ = DeviceBuffer(size_t(n_blocks) * 128);
    headers_ = DeviceBuffer(size_t(n_blocks) * 16);
    upload_split_blocks(ggml_blocks, n_blocks, split.block_bytes, split.seg_off, split.seg_len,
                        qs_.get(), headers_.get());
    expert_matvec::prepare<Q4KFormat>();
    expert_matmul::prepare<Q4KFormat>();
    const int64_t expert_blocks = n_rows * (k / kQK);
    table_ = ResidentExpertTable(qs_.get(), size_t(expert_blocks) * 128, headers_.get(),
                                 size_t(expert_blocks) * 16, n_experts);
    view_ = {qs_.as<uint8_t>(), headers_.as<uint8_t>(), n_rows, k, n_experts, table_.table()};
}

Q4KWeights::Q4KWeights(int64_t n_rows, int64_t k, int64_t n_experts, const ExpertTable &table) {
    if (k % kQK != 0) throw ds4::Error("Q4_K rows must hold a multiple of 256 values");
    expert_matvec::prepare<Q4KFormat>();
    expert_matmul::prepare<Q4KFormat>();
    view_ = {nullptr, nullptr, n_rows, k, n_experts, table};
}

void matvec_q4_K(const Q4KExperts &w, const int32_t *ids, int n_ids, const Q8_KActivation &x,
                 float *y, cudaStream_t stream, bool x_per_slot) {
    if (n_ids <= 0 || w.n_rows == 0) return;
    expert_matvec::launch<Q4KFormat>(w.table, w.n_rows, w.k, ids, n_ids, x_per_slot, x.q, x.d,
                                     x.bsums, y, stream);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void matvec_q4_K_pair(const Q4KExperts &a, const Q4KExperts &b, const int32_t *ids, int n_ids,
                      const Q8_KActivation &x, float *ya, float *yb, cudaStream_t stream) {
    if (a.n_rows != b.n_rows || a.k != b.k || a.n_experts != b.n_experts)
        throw ds4::Error("matvec_q4_K_pair: two tensors of one shape");
    if (n_ids <= 0 || a.n_rows == 0) return;
    const expert_matvec::Second second{b.table, yb, n_ids};
    expert_matvec::launch<Q4KFormat>(a.table, a.n_rows, a.k, ids, n_ids, false, x.q, x.d, x.bsums,
                                     ya, stream, second);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void matmul_q4_K_grouped(const Q4KExperts &w, const ExpertGroups &groups, const Q8_KActivation &x,
                         float *y, cudaStream_t stream) {
    if (w.n_rows == 0) return;
    expert_matmul::launch<Q4KFormat>(w.table, w.n_rows, w.k, groups, x.q, x.d, x.bsums, y, stream);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
