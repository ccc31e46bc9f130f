#include <cuda_fp16.h>

#include <cstddef>
#include <cstring>
#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/expert_matmul.cuh"
#include "backend/cuda/expert_mma.cuh"
#include "backend/cuda/expert_planes.h"
#include "backend/cuda/host_upload.h"
#include "backend/cuda/iq2_xxs_matvec.h"
#include "backend/cuda/per_device.h"
#include "common/error.h"
#include "quant/blocks.h"
#include "quant/iq2_tables.h"

namespace ds4::cuda {
namespace {

constexpr int kQK = 256;
constexpr int kGroupBytes = 64;  // per super-block: 8 groups of 8 bytes

// Lookup tables, built on the host from the CPU's tables once:
//   g_grid[e]: grid point e, its 8 magnitudes (8, 25 or 43) as bytes (quant::kIq2xxsGrid).
//   g_sign_masks[i]: for the 7 stored sign bits i (the 8th makes the parity even, kIq2Signs), a
//     mask with byte j = 0xff where value j is negative.
// In shared memory each entry is repeated 16 times ([entry][copy], copy = lane % 16): a warp's
// 8-byte lookups take two 128-byte phases whatever the entries (lanes l and l + 16 are in
// different phases), so none waits for a bank; and an entry's address is one multiply-add.
__device__ uint64_t g_grid[256];
__device__ uint64_t g_sign_masks[128];
constexpr int kCopies = 16;

void upload_tables_once() {
    static PerDevice<bool> uploaded;  // __device__ tables: one copy per device
    uploaded.get([] {
        for (int e = 0; e < 256; ++e)
            for (int j = 0; j < 8; ++j) {
                const unsigned m = (quant::kIq2xxsGrid[e] >> (8 * j)) & 0xff;
                if (m != 8 && m != 25 && m != 43)
                    throw ds4::Error("IQ2_XXS grid magnitude outside {8, 25, 43}");
            }
        uint64_t masks[128];
        for (int i = 0; i < 128; ++i) {
            masks[i] = 0;
            for (int j = 0; j < 8; ++j)
                if ((quant::kIq2Signs[i] >> j) & 1) masks[i] |= uint64_t(0xff) << (8 * j);
        }
        DS4_CUDA_CHECK(cudaMemcpyToSymbol(g_grid, quant::kIq2xxsGrid, sizeof(g_grid)));
        DS4_CUDA_CHECK(cudaMemcpyToSymbol(g_sign_masks, masks, sizeof(masks)));
        return true;
    });
}

constexpr int kGridTableBytes = 256 * kCopies * 8, kSignTableBytes = 128 * kCopies * 8;

// Grid magnitudes (4 bytes) with the masked bytes negated: b -> (b ^ 0xff) + 1 = -b. Magnitudes
// are 8..43, so the +1 never carries into the next byte.
__device__ __forceinline__ int apply_signs(uint32_t mag, uint32_t mask) {
    return int((mag ^ mask) + (mask & 0x01010101u));
}

// The lane's copies of the tables (shared memory, `t` as Iq2xxsFormat::load_tables fills it).
struct LaneTables {
    const uint2 *grid, *signs;
    __device__ LaneTables(const uint8_t *t, int lane)
        : grid(reinterpret_cast<const uint2 *>(t) + lane % kCopies),
          signs(reinterpret_cast<const uint2 *>(t + kGridTableBytes) + lane % kCopies) {}
    // Values 8 l .. 8 l + 7 of a group (grid point l of `indices`, sign bits l of
    // `signs_scale`) as two words of int8.
    __device__ __forceinline__ void point(uint32_t indices, uint32_t signs_scale, int l, int &w0,
                                          int &w1) const {
        const uint32_t e = __byte_perm(indices, 0, 0x4440 | l);  // byte l
        const uint2 g = grid[e * kCopies];
        const uint2 m = signs[((signs_scale >> (7 * l)) & 127u) * kCopies];
        w0 = apply_signs(g.x, m.x);
        w1 = apply_signs(g.y, m.y);
    }
};

// The 32 signed grid values of one group as 8 words of int8 (values 4 j .. 4 j + 3 in word j).
__device__ __forceinline__ void decode_group(const LaneTables &lt, uint32_t indices,
                                             uint32_t signs_scale, int (&w)[8]) {
#pragma unroll
    for (int l = 0; l < 4; ++l) lt.point(indices, signs_scale, l, w[2 * l], w[2 * l + 1]);
}

// A group's scale factor 2 ls + 1 (ls: the top 4 bits of its sign word).
__device__ __forceinline__ int group_scale(uint32_t signs_scale) {
    return int(2 * (signs_scale >> 28) + 1);
}

// sum over the 32 values of one group of (+-grid) * q, times (2 ls + 1): the CPU's group_sum
// times its scale factor, exactly (int32).
__device__ __forceinline__ int group_dot(const int (&w)[8], const int *q, int scale) {
    int sum = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) sum = __dp4a(w[j], q[j], sum);
    return sum * scale;
}

// The IQ2_XXS format for expert_matvec.cuh: a piece is two groups (64 values), its sum the
// integer sum of both groups; the term is (f16(d) * dx) * float(block sum), the row's sum then
// times 1/8 (the grid's scale), as in the CPU's vec_dot_iq2_xxs_q8_K.
struct Iq2xxsFormat {
    static constexpr int kTableBytes = kGridTableBytes + kSignTableBytes;
    __device__ static void load_tables(uint8_t *t) {
        // Two copies of an entry per uint4: kCopies / 2 uint4 per entry.
        auto fill = [](uint4 *dst, const uint64_t *src, int n_entries) {
            for (int i = threadIdx.x; i < n_entries * kCopies / 2; i += expert_matvec::kThreads) {
                const uint64_t v = src[i / (kCopies / 2)];
                const uint32_t lo = uint32_t(v), hi = uint32_t(v >> 32);
                dst[i] = make_uint4(lo, hi, lo, hi);
            }
        };
        fill(reinterpret_cast<uint4 *>(t), g_grid, 256);
        fill(reinterpret_cast<uint4 *>(t + kGridTableBytes), g_sign_masks, 128);
    }
    struct Scales {
        static constexpr int kBytes = 2;
        uint16_t d = 0;
    };
    struct Sums {
        int s = 0;
    };
    static constexpr int kPieces = 4;
    static constexpr float kOutputScale = 0.125f;

    __device__ static Scales load_scales(const uint8_t *p, int64_t) {
        return {__ldcs(reinterpret_cast<const uint16_t *>(p))};
    }
    struct XPiece {
        int q[16];  // the piece's 64 int8 activations as words
    };
    // Chunk c of piece p (values 16 c .. of its 64) at 4 p + ((c + p / 2) & 3): the lanes of a
    // phase (pieces p .. p + 7) read 8 different 16-byte bank groups.
    __device__ static int64_t staged_chunk(int64_t i) {
        const int64_t p = i / 4;
        return 4 * p + ((i + p / 2) & 3);
    }
    __device__ static XPiece load_x(const int8_t *sx, const int16_t *, int64_t p, int64_t) {
        XPiece x;
        const int4 *xs = reinterpret_cast<const int4 *>(sx + p * 64);
        const int rot = int(p / 2);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int4 v = xs[(j + rot) & 3];
            x.q[4 * j] = v.x, x.q[4 * j + 1] = v.y, x.q[4 * j + 2] = v.z, x.q[4 * j + 3] = v.w;
        }
        return x;
    }
    // The piece's two groups as int8 values and their scale factors (expert_matmul.cuh decodes
    // a piece once and dots it with several activation rows).
    struct Decoded {
        int w0[8], w1[8];
        int scale0 = 0, scale1 = 0;
    };
    __device__ static Decoded decode(uint4 g, const uint8_t *t, int lane, const Scales &, int64_t) {
        const LaneTables lt(t, lane);
        Decoded d;
        decode_group(lt, g.x, g.y, d.w0);
        decode_group(lt, g.z, g.w, d.w1);
        d.scale0 = group_scale(g.y);
        d.scale1 = group_scale(g.w);
        return d;
    }
    __device__ static Sums dot_decoded(const Decoded &d, const XPiece &x, const Scales &) {
        return {group_dot(d.w0, x.q, d.scale0) + group_dot(d.w1, x.q + 8, d.scale1)};
    }
    __device__ static Sums dot(uint4 g, const XPiece &x, const uint8_t *t, int lane,
                               const Scales &sc) {
        return dot_decoded(decode(g, t, lane, sc, 0), x, sc);
    }
    __device__ static Sums add(Sums a, Sums b) {
        return {a.s + b.s};
    }
    __device__ static Sums shuffle(Sums a, int x) {
        return {__shfl_xor_sync(0xffffffffu, a.s, x)};
    }
    __device__ static float term(Sums s, const Scales &sc, float dx) {
        return __half2float(__ushort_as_half(sc.d)) * dx * static_cast<float>(s.s);
    }

    // expert_mma.cuh: lane c of a quad holds bytes 16 c .. 16 c + 15 of the super-block (groups
    // 2 c and 2 c + 1); product j is group j, whose words the quad's lane j / 2 shares, and lane c
    // decodes its grid point c: values 8 c .. 8 c + 7, the factor 2 ls + 1.
    struct MmaRow {
        uint4 q;
        uint16_t d = 0;
    };
    __device__ static MmaRow mma_row(const uint8_t *row, const uint8_t *rec, int64_t sb, int c) {
        return {__ldcs(reinterpret_cast<const uint4 *>(row) + sb * 4 + c),
                __ldcs(reinterpret_cast<const uint16_t *>(rec))};
    }
    __device__ static expert_mma::MmaA mma_a(const MmaRow &r, int j, const uint8_t *t, int lane,
                                             int c) {
        const int src = (lane & ~3) | (j >> 1);
        const uint32_t indices = __shfl_sync(0xffffffffu, (j & 1) ? r.q.z : r.q.x, src);
        const uint32_t signs_scale = __shfl_sync(0xffffffffu, (j & 1) ? r.q.w : r.q.y, src);
        int w0, w1;
        LaneTables(t, lane).point(indices, signs_scale, c, w0, w1);
        return {w0, w1, group_scale(signs_scale)};
    }
    __device__ static int mma_x_offset(int j, int c) {
        return 32 * j + 8 * c;
    }
    __device__ static Sums mma_sums(int scaled, const MmaRow &, const int16_t *) {
        return {scaled};
    }
    __device__ static Scales mma_scales(const MmaRow &r) {
        return {r.d};
    }
};

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
    // repack_iq2_xxs on the device: the group data are the segment, the scale the rest.
    const BlockSplit split = block_split(GgmlType::IQ2_XXS);
    static_assert(sizeof(quant::BlockIQ2_XXS) == 2 + kGroupBytes);
    const int64_t n_blocks = n_experts * n_rows * (k / kQK);
    qs_ = DeviceBuffer(size_t(n_blocks) * kGroupBytes);
    d_ = DeviceBuffer(size_t(n_blocks) * sizeof(uint16_t));
    upload_split_blocks(ggml_blocks, n_blocks, split.block_bytes, split.seg_off, split.seg_len,
                        qs_.get(), d_.get());
    expert_matvec::prepare<Iq2xxsFormat>();
    expert_matmul::prepare<Iq2xxsFormat>();
    expert_mma::prepare<Iq2xxsFormat>();
    const int64_t expert_blocks = n_rows * (k / kQK);
    table_ = ResidentExpertTable(qs_.get(), size_t(expert_blocks) * kGroupBytes, d_.get(),
                                 size_t(expert_blocks) * sizeof(uint16_t), n_experts);
    view_ = {qs_.as<uint8_t>(), d_.as<uint16_t>(), n_rows, k, n_experts, table_.table()};
}

Iq2xxsWeights::Iq2xxsWeights(int64_t n_rows, int64_t k, int64_t n_experts,
                             const ExpertTable &table) {
    if (k % kQK != 0) throw ds4::Error("IQ2_XXS rows must hold a multiple of 256 values");
    upload_tables_once();
    expert_matvec::prepare<Iq2xxsFormat>();
    expert_matmul::prepare<Iq2xxsFormat>();
    expert_mma::prepare<Iq2xxsFormat>();
    view_ = {nullptr, nullptr, n_rows, k, n_experts, table};
}

void matvec_iq2_xxs(const Iq2xxsExperts &w, const int32_t *ids, int n_ids, const Q8_KActivation &x,
                    float *y, cudaStream_t stream, bool x_per_slot) {
    if (n_ids <= 0 || w.n_rows == 0) return;
    expert_matvec::launch<Iq2xxsFormat>(w.table, w.n_rows, w.k, ids, n_ids, x_per_slot, x.q, x.d,
                                        x.bsums, y, stream);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void matvec_iq2_xxs_pair(const Iq2xxsExperts &a, const Iq2xxsExperts &b, const int32_t *ids,
                         int n_ids, const Q8_KActivation &x, float *ya, float *yb,
                         cudaStream_t stream) {
    if (a.n_rows != b.n_rows || a.k != b.k || a.n_experts != b.n_experts)
        throw ds4::Error("matvec_iq2_xxs_pair: two tensors of one shape");
    if (n_ids <= 0 || a.n_rows == 0) return;
    const expert_matvec::Second second{b.table, yb, n_ids};
    expert_matvec::launch<Iq2xxsFormat>(a.table, a.n_rows, a.k, ids, n_ids, false, x.q, x.d,
                                        x.bsums, ya, stream, second);
    DS4_CUDA_CHECK(cudaGetLastError());
}

void matmul_iq2_xxs_grouped(const Iq2xxsExperts &w, const ExpertGroups &groups,
                            const Q8_KActivation &x, float *y, cudaStream_t stream) {
    if (w.n_rows == 0) return;
    if (mma_enabled())
        expert_mma::launch<Iq2xxsFormat>(w.table, w.n_rows, w.k, groups, x.q, x.d, x.bsums, y,
                                         stream);
    else
        expert_matmul::launch<Iq2xxsFormat>(w.table, w.n_rows, w.k, groups, x.q, x.d, x.bsums, y,
                                            stream);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda
