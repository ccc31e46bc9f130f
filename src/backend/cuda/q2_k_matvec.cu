#include <cuda_fp16.h>

#include <cstddef>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/expert_matmul.cuh"
#include "backend/cuda/expert_mma.cuh"
#include "backend/cuda/expert_planes.h"
#include "backend/cuda/host_upload.h"
#include "backend/cuda/q2_k_matvec.h"
#include "common/error.h"
#include "quant/blocks.h"

namespace ds4::cuda {
namespace {

constexpr int kQK = 256;

// The Q2_K format for expert_matvec.cuh. Piece j (0..3) of a super-block is quant bytes
// [16 j, 16 j + 16): half h = j / 2, part = j % 2. Byte i of half h holds values 128 h + 32 s + i
// at bits 2 s (s = 0..3), so a piece covers, for each s, the 16 values of sub-block
// k = 8 h + 2 s + part, whose activations are x[128 h + 32 s + 16 part ..][16].
struct Q2KFormat {
    static constexpr int kTableBytes = 0;
    __device__ static void load_tables(uint8_t *) {}
    struct Scales {
        static constexpr int kBytes = kQ2KRecordBytes;
        uint32_t sc0 = 0, sc1 = 0;  // scale bytes 8 h .. 8 h + 7 of the piece's half
        uint32_t d_dmin = 0;        // f16 d (low half), f16 dmin (high half)
    };
    struct Sums {
        int scaled = 0, mins = 0;
    };
    static constexpr int kPieces = 4;
    static constexpr float kOutputScale = 1.0f;

    __device__ static Scales load_scales(const uint8_t *rec, int64_t p) {
        const auto *w = reinterpret_cast<const uint32_t *>(rec);
        const int h = int(p % 4) / 2;
        return {__ldcs(w + 2 * h), __ldcs(w + 2 * h + 1), __ldcs(w + 4)};
    }
    struct XPiece {
        int4 x[4];     // for each shift s, the 16 activations of the piece's sub-block
        int bsums[4];  // and that sub-block's sum of activations
        int part = 0;  // the piece's part (0, 1): which scale bytes are its sub-blocks'
    };
    // Chunk q (values 16 q ..) of super-block sb at 16 sb + (q ^ (4 (q / 8) + 2 (sb % 2))): a
    // piece reads chunks 8 h + part + 2 s, and the lanes of a phase (two super-blocks, four
    // pieces each) then read 8 different 16-byte bank groups for each s.
    __device__ static int64_t swizzle(int64_t sb, int64_t q) {
        return 16 * sb + (q ^ (4 * (q >> 3) + 2 * (sb & 1)));
    }
    __device__ static int64_t staged_chunk(int64_t i) { return swizzle(i / 16, i % 16); }
    __device__ static XPiece load_x(const int8_t *sx, const int16_t *xbsums, int64_t p,
                                    int64_t sb) {
        const int j = int(p % 4), h = j / 2, part = j % 2;
        const int4 *x = reinterpret_cast<const int4 *>(sx);
        const int16_t *bs = xbsums + sb * 16 + 8 * h + part;
        XPiece xp;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            xp.x[s] = x[swizzle(sb, 8 * h + part + 2 * s)];
            xp.bsums[s] = __ldg(bs + 2 * s);
        }
        xp.part = part;
        return xp;
    }
    // The piece's quants for each shift s (4 words of 2-bit values as bytes) and its sub-blocks'
    // scale and min nibbles (expert_matmul.cuh decodes a piece once for several activation rows).
    struct Decoded {
        int q[4][4];
        int scale[4], min[4];
    };
    __device__ static Decoded decode_part(uint4 g, const Scales &sc, int part) {
        Decoded d;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const uint32_t m = 0x03030303u;
            d.q[s][0] = int((g.x >> (2 * s)) & m);
            d.q[s][1] = int((g.y >> (2 * s)) & m);
            d.q[s][2] = int((g.z >> (2 * s)) & m);
            d.q[s][3] = int((g.w >> (2 * s)) & m);
            // scale byte 8 h + 2 s + part is byte 2 s + part of the 8 loaded
            const int b = 2 * s + part;
            const uint32_t byte = ((b < 4 ? sc.sc0 : sc.sc1) >> (8 * (b % 4))) & 0xffu;
            d.scale[s] = int(byte & 0xfu);
            d.min[s] = int(byte >> 4);
        }
        return d;
    }
    __device__ static Decoded decode(uint4 g, const uint8_t *, int, const Scales &sc, int64_t p) {
        return decode_part(g, sc, int(p % 4) % 2);
    }
    __device__ static Sums dot_decoded(const Decoded &d, const XPiece &xp, const Scales &) {
        Sums out;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            int sub = __dp4a(d.q[s][0], xp.x[s].x, 0);
            sub = __dp4a(d.q[s][1], xp.x[s].y, sub);
            sub = __dp4a(d.q[s][2], xp.x[s].z, sub);
            sub = __dp4a(d.q[s][3], xp.x[s].w, sub);
            out.scaled += d.scale[s] * sub;
            out.mins += xp.bsums[s] * d.min[s];
        }
        return out;
    }
    __device__ static Sums dot(uint4 g, const XPiece &xp, const uint8_t *, int, const Scales &sc) {
        return dot_decoded(decode_part(g, sc, xp.part), xp, sc);
    }
    __device__ static Sums add(Sums a, Sums b) {
        return {a.scaled + b.scaled, a.mins + b.mins};
    }
    __device__ static Sums shuffle(Sums a, int x) {
        return {__shfl_xor_sync(0xffffffffu, a.scaled, x), __shfl_xor_sync(0xffffffffu, a.mins, x)};
    }
    __device__ static float term(Sums s, const Scales &sc, float dx) {
        const float d = __half2float(__ushort_as_half(uint16_t(sc.d_dmin & 0xffffu)));
        const float dmin = __half2float(__ushort_as_half(uint16_t(sc.d_dmin >> 16)));
        const float dall = dx * d, dm = dx * dmin;
        return dall * static_cast<float>(s.scaled) - dm * static_cast<float>(s.mins);
    }

    // expert_mma.cuh: product j is shift s = j % 4 of half h = j / 4, values 128 h + 32 s + i
    // (byte i of the half), and lane c takes i = 8 c .. 8 c + 7, all of sub-block 8 h + 2 s + c
    // / 2. Its scale nibble (at most 15) times a 2-bit quant is at most 45: the scales are folded
    // into the int8 weights (no byte carries), so a product's sum is already the decode's
    // sum over sub-blocks of scale x integer dot; the mins' part is the decode's, from the
    // activation's sub-block sums.
    struct MmaRow {
        uint2 q[2];           // bytes 8 c .. 8 c + 7 of each half
        uint32_t sc[4] = {};  // the 16 scale bytes
        uint32_t d_dmin = 0;
    };
    __device__ static MmaRow mma_row(const uint8_t *row, const uint8_t *rec, int64_t sb, int c) {
        MmaRow r;
#pragma unroll
        for (int h = 0; h < 2; ++h)
            r.q[h] = __ldcs(reinterpret_cast<const uint2 *>(row + sb * 64 + 32 * h + 8 * c));
        const auto *w = reinterpret_cast<const uint32_t *>(rec);
#pragma unroll
        for (int i = 0; i < 4; ++i) r.sc[i] = __ldcs(w + i);
        r.d_dmin = __ldcs(w + 4);
        return r;
    }
    __device__ static expert_mma::MmaA mma_a(const MmaRow &r, int j, const uint8_t *, int, int c) {
        const int h = j / 4, s = j % 4, sub = 8 * h + 2 * s + c / 2;
        const uint32_t scale = (r.sc[sub / 4] >> (8 * (sub % 4))) & 0xfu;
        const uint32_t m = 0x03030303u;
        return {int(((r.q[h].x >> (2 * s)) & m) * scale), int(((r.q[h].y >> (2 * s)) & m) * scale),
                1};
    }
    __device__ static int mma_x_offset(int j, int c) {
        return 128 * (j / 4) + 32 * (j % 4) + 8 * c;
    }
    // bsums: the super-block's 16 sums (32 bytes, 16-byte aligned; in shared memory).
    __device__ static Sums mma_sums(int scaled, const MmaRow &r, const int16_t *bsums) {
        const uint4 v[2] = {reinterpret_cast<const uint4 *>(bsums)[0],
                            reinterpret_cast<const uint4 *>(bsums)[1]};
        const uint32_t b[8] = {v[0].x, v[0].y, v[0].z, v[0].w, v[1].x, v[1].y, v[1].z, v[1].w};
        int mins = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const uint32_t pair = b[i], scales = r.sc[i / 2] >> (16 * (i % 2));
            mins += int(int16_t(pair & 0xffffu)) * int((scales >> 4) & 0xfu);
            mins += int(int16_t(pair >> 16)) * int((scales >> 12) & 0xfu);
        }
        return {scaled, mins};
    }
    __device__ static Scales mma_scales(const MmaRow &r) {
        return {r.sc[0], r.sc[1], r.d_dmin};
    }
};

}  // namespace

Q2KPlanes repack_q2_K(const void *ggml_blocks, int64_t n_blocks) {
    const auto *blocks = static_cast<const quant::BlockQ2_K *>(ggml_blocks);
    Q2KPlanes p;
    p.qs.resize(size_t(n_blocks) * 64);
    p.records.resize(size_t(n_blocks) * kQ2KRecordBytes);
    for (int64_t i = 0; i < n_blocks; ++i) {
        std::memcpy(p.qs.data() + i * 64, blocks[i].qs, 64);
        uint8_t *r = p.records.data() + i * kQ2KRecordBytes;
        std::memcpy(r, blocks[i].scales, 16);
        std::memcpy(r + 16, &blocks[i].d, 2);
        std::memcpy(r + 18, &blocks[i].dmin, 2);
    }
    return p;
}

Q2KWeights::Q2KWeights(const void *ggml_blocks, int64_t n_rows, int64_t k, int64_t n_experts) {
    if (k % kQK != 0) throw ds4::Error("Q2_K rows must hold a multiple of 256 values");
    // repack_q2_K on the device: the quants are the segment, the record is scales, d, dmin.
    const BlockSplit split = block_split(GgmlType::Q2_K);
    static_assert(sizeof(quant::BlockQ2_K) == 64 + kQ2KRecordBytes);
    const int64_t n_blocks = n_experts * n_rows * (k / kQK);
    qs_ = DeviceBuffer(size_t(n_blocks) * 64);
    records_ = DeviceBuffer(size_t(n_blocks) * kQ2KRecordBytes);
    upload_split_blocks(ggml_blocks, n_blocks, split.block_bytes, split.seg_off, split.seg_len,
                        qs_.get(), records_.get());
    expert_matvec::prepare<Q2KFormat>();
    expert_matmul::prepare<Q2KFormat>();
    expert_mma::prepare<Q2KFormat>();
    const int64_t expert_blocks = n_rows * (k / kQK);
    table_ = ResidentExpertTable(qs_.get(), size_t(expert_blocks) * 64, records_.get(),
                                 size_t(expert_blocks) * kQ2KRecordBytes, n_experts);
    view_ = {qs_.as<uint8_t>(), records_.as<uint8_t>(), n_rows, k, n_experts, table_.table()};
}

Q2KWeights::Q2KWeights(int64_t n_rows, int64_t k, int64_t n_experts, const ExpertTable &table) {
    if (k % kQK != 0) throw ds4::Error("Q2_K rows must hold a multiple of 256 values");
    expert_matvec::prepare<Q2KFormat>();
    expert_matmul::prepare<Q2KFormat>();
    expert_mma::prepare<Q2KFormat>();
    view_ = {nullptr, nullptr, n_rows, k, n_experts, table};
}

void matvec_q2_K(const Q2KExperts &w, const int32_t *ids, int n_ids, const Q8_KActivation &x,
                 float *y, cudaStream_t stream, bool x_per_slot) {
    if (n_ids <= 0 || w.n_rows == 0) return;
    expert_matvec::launch<Q2KFormat>(w.table, w.n_rows, w.k, ids, n_ids, x_per_slot, x.q, x.d,
                                     x.bsums, y, stream);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void matmul_q2_K_grouped(const Q2KExperts &w, const ExpertGroups &groups, const Q8_KActivation &x,
                         float *y, cudaStream_t stream) {
    if (w.n_rows == 0) return;
    if (mma_enabled())
        expert_mma::launch<Q2KFormat>(w.table, w.n_rows, w.k, groups, x.q, x.d, x.bsums, y, stream);
    else
        expert_matmul::launch<Q2KFormat>(w.table, w.n_rows, w.k, groups, x.q, x.d, x.bsums, y,
                                         stream);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
