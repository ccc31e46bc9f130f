// IQ2_XXS quantizer (docs/MODEL.md 5.4): ggml's quantize_row_iq2_xxs_impl with every importance weight
// equal to 1, the same f32 arithmetic in the same order, so our blocks equal ggml's byte for byte
// (tests/quant/test_iq2_xxs_vs_ggml.py checks it against ggml's own library).
//
// Per 32-value group: signs with even parity, a search over 13 candidate scales, each 8-value
// pattern rounded to the levels {0, 1, 2} (grid bytes 8, 25, 43) and replaced, when that pattern
// is not one of the 256 grid points, by the best of its precomputed nearest grid points; then the
// weighted least-squares scale. The block's f16 d is max(scale) / 31, each group keeps the 4-bit
// ls with scale ~= d * (2 ls + 1) (so that dequant = d * (0.5 + ls) * 0.25 * grid * sign).
// Leaves out: importance matrices (ggml requires one for IQ2_XXS; ones give its weights below).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "quant/blocks.h"
#include "quant/iq2_tables.h"
#include "quant/kernels_ref.h"

namespace ds4::quant::ref {
namespace {

constexpr int kGroup = 32;               // values per 4-bit scale
constexpr int kGroups = kQK_K / kGroup;  // 8 per block
constexpr int kMaxLevel = 2;             // levels 0, 1, 2 <-> grid bytes 8, 25, 43
constexpr float kGroupMaxEps = 1e-15f;   // a group whose max |x| is below this is zero
constexpr int kNeighbourDistances = 2;   // neighbours: grid points at the 2 nearest distances
constexpr int kCodeCount = 0xAAAA + 1;   // codes of 8 two-bit levels, each level <= 2

// ggml's nearest_int (kquant_fit.h), inlined here: it runs ~15 times per value.
inline int round_to_int(float v) {
    const float shifted = v + 12582912.0f;
    int32_t bits;
    std::memcpy(&bits, &shifted, sizeof(bits));
    return (bits & 0x007fffff) - 0x00400000;
}

// Level of a grid byte; the search works with odd values 2 * level + 1 (1, 3, 5).
int grid_level(uint8_t byte) {
    return byte == 8 ? 0 : byte == 25 ? 1 : 2;
}

// An 8-value pattern is coded as sum level_i << 2i.
struct SearchTables {
    float grid_odd[256][8];  // 2 * level + 1 of each grid point, as f32
    // code -> grid index (>= 0) when the pattern is a grid point, else -(1 + position) of its
    // neighbour list in `neighbours`: a count, then the codes of the neighbours, ordered by
    // (distance, grid index). Codes with a level 3 never occur (levels are clamped to 0..2) and
    // map to grid point 0.
    std::vector<int32_t> code_to_grid;
    std::vector<uint16_t> neighbours;
};

// As ggml's iq2xs_init_impl for IQ2_XXS: squared distances in odd units; the neighbours of a
// pattern are the grid points at its two smallest distances, nearest first, ties by grid index.
SearchTables build_search_tables() {
    SearchTables t{};
    uint16_t grid_code[256];
    int grid_odd[256][8];
    t.code_to_grid.assign(kCodeCount, 0);
    std::vector<bool> on_grid(kCodeCount, false);
    for (int k = 0; k < 256; ++k) {
        uint16_t code = 0;
        for (int i = 0; i < 8; ++i) {
            const int level = grid_level((kIq2xxsGrid[k] >> (8 * i)) & 0xff);
            code |= static_cast<uint16_t>(level << (2 * i));
            grid_odd[k][i] = 2 * level + 1;
            t.grid_odd[k][i] = static_cast<float>(grid_odd[k][i]);
        }
        grid_code[k] = code;
        t.code_to_grid[code] = k;
        on_grid[code] = true;
    }
    for (int base3 = 0; base3 < 6561; ++base3) {  // every pattern of levels 0..2
        int code = 0, odd[8];
        for (int i = 0, rest = base3; i < 8; ++i, rest /= 3) {
            code |= (rest % 3) << (2 * i);
            odd[i] = 2 * (rest % 3) + 1;
        }
        if (on_grid[code]) continue;
        int d2[256];
        int nearest = std::numeric_limits<int>::max(), second = nearest;
        for (int k = 0; k < 256; ++k) {
            d2[k] = 0;
            for (int i = 0; i < 8; ++i)
                d2[k] += (grid_odd[k][i] - odd[i]) * (grid_odd[k][i] - odd[i]);
            if (d2[k] < nearest) {
                second = nearest;
                nearest = d2[k];
            } else if (d2[k] > nearest && d2[k] < second) {
                second = d2[k];
            }
        }
        t.code_to_grid[code] = -(1 + static_cast<int32_t>(t.neighbours.size()));
        const size_t count_at = t.neighbours.size();
        t.neighbours.push_back(0);
        for (int distance : {nearest, second})
            for (int k = 0; k < 256; ++k)
                if (d2[k] == distance) t.neighbours.push_back(grid_code[k]);
        t.neighbours[count_at] = static_cast<uint16_t>(t.neighbours.size() - count_at - 1);
    }
    return t;
}

const SearchTables &search_tables() {
    static const SearchTables tables = build_search_tables();  // built once, thread-safe
    return tables;
}

// The grid point for 8 non-negative values x at inverse scale id: the rounded pattern if it is on
// the grid, else the neighbour with the smallest sum w * (scale * odd - x)^2 (first one on ties).
// Each term takes one of 3 values per position, so they are computed once, and so are the 27
// partial sums of the first 3 positions; every sum adds its terms in ggml's order (from 0, which
// adds nothing to the first term), so the comparison, and the winner, is the same as ggml's.
int nearest_grid_point(const float *x, const float *w, float id, float scale,
                       const SearchTables &t) {
    uint32_t code = 0;
    for (int i = 0; i < 8; ++i) {
        const int l = std::clamp(round_to_int(0.5f * (id * x[i] - 1)), 0, kMaxLevel);
        code |= static_cast<uint32_t>(l) << (2 * i);
    }
    const int32_t m = t.code_to_grid[code];
    if (m >= 0) return m;
    float cost[8][4];
    for (int i = 0; i < 8; ++i) {
        for (int l = 0; l <= kMaxLevel; ++l) {
            const float diff = scale * static_cast<float>(2 * l + 1) - x[i];
            cost[i][l] = w[i] * diff * diff;
        }
    }
    float first3[64];  // (t0 + t1) + t2 by the low 6 bits of a code
    for (int l0 = 0; l0 <= kMaxLevel; ++l0) {
        for (int l1 = 0; l1 <= kMaxLevel; ++l1) {
            const float first2 = cost[0][l0] + cost[1][l1];
            for (int l2 = 0; l2 <= kMaxLevel; ++l2)
                first3[l0 | (l1 << 2) | (l2 << 4)] = first2 + cost[2][l2];
        }
    }
    const uint16_t *list = &t.neighbours[static_cast<size_t>(-m - 1)];
    // ggml starts from FLT_MAX and would find nothing if every sum overflowed; we start from the
    // first neighbour, which gives the same winner whenever ggml finds one.
    float best = std::numeric_limits<float>::infinity();
    uint32_t best_code = list[1];
    for (int j = 1; j <= list[0]; ++j) {
        const uint32_t c = list[j];
        float d2 = first3[c & 63];
        for (int i = 3; i < 8; ++i) d2 += cost[i][(c >> (2 * i)) & 3];
        if (d2 < best) {
            best = d2;
            best_code = c;
        }
    }
    return t.code_to_grid[best_code];
}

// ggml's make_qp_quants for 32 values on levels 0..nmax with weights w; here only the scale it
// returns is used (the centre of the scale search). As in ggml the levels are bytes: a negative
// level (a value whose sign the parity rule flipped) wraps modulo 256 where ggml stores it, which
// we keep so that the search starts from ggml's scale.
float make_qp_scale(int nmax, const float *x, const float *w) {
    uint8_t L[kGroup];
    float max = 0;
    for (int i = 0; i < kGroup; ++i) max = max > x[i] ? max : x[i];
    if (max == 0) return 0;
    float iscale = static_cast<float>(nmax) / max;
    for (int i = 0; i < kGroup; ++i) L[i] = static_cast<uint8_t>(round_to_int(iscale * x[i]));
    const float scale = 1 / iscale;
    float best_mse = 0;
    for (int i = 0; i < kGroup; ++i) {
        const float diff = x[i] - scale * L[i];
        best_mse += w[i] * diff * diff;
    }
    for (int is = -4; is <= 4; ++is) {
        if (is == 0) continue;
        const float iscale_is = (0.1f * static_cast<float>(is) + static_cast<float>(nmax)) / max;
        const float scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < kGroup; ++i) {
            const int l = std::min(nmax, round_to_int(iscale_is * x[i]));
            const float diff = x[i] - scale_is * static_cast<float>(l);
            mse += w[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < kGroup; ++i) {
        const int l = std::min(nmax, round_to_int(iscale * x[i]));
        L[i] = static_cast<uint8_t>(l);
        sumlx += w[i] * x[i] * static_cast<float>(l);
        suml2 += w[i] * static_cast<float>(l) * static_cast<float>(l);
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < kGroup; ++i) {
            float slx = sumlx - w[i] * x[i] * L[i];
            float sl2 = suml2 - w[i] * L[i] * L[i];
            if (slx > 0 && sl2 > 0) {
                const int new_l = std::min(nmax, round_to_int(x[i] * sl2 / slx));
                if (new_l != L[i]) {
                    slx += w[i] * x[i] * static_cast<float>(new_l);
                    sl2 += w[i] * static_cast<float>(new_l) * static_cast<float>(new_l);
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = static_cast<uint8_t>(new_l);
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    return sumlx / suml2;
}

// sum w x q and sum w q^2 over the group, q the odd values of its 4 grid points.
void weighted_sums(const float *x, const float *w, const uint8_t grid[4], const SearchTables &t,
                   float *sumqx, float *sumq2) {
    float qx = 0, q2 = 0;
    for (int k = 0; k < 4; ++k) {
        for (int i = 0; i < 8; ++i) {
            const float q = t.grid_odd[grid[k]][i];
            qx += w[8 * k + i] * x[8 * k + i] * q;
            q2 += w[8 * k + i] * q * q;
        }
    }
    *sumqx = qx;
    *sumq2 = q2;
}

// One group of 32 values: writes its grid indices (word 0) and sign patterns (word 1, bits
// 0..27) and returns its scale (>= 0; 0 for a zero group, whose words stay 0 as in ggml).
float quantize_group(const float *xb, float sigma2, const SearchTables &t, uint32_t word[2]) {
    float weight[kGroup], waux[kGroup], xval[kGroup];
    uint8_t signs[4];
    for (int i = 0; i < kGroup; ++i) {
        weight[i] = std::sqrt(sigma2 + xb[i] * xb[i]);
        waux[i] = std::sqrt(weight[i]);
    }
    // Signs of each 8 values, then parity: an odd count of negatives flips the value with the
    // smallest w x^2, so that 7 stored bits determine the 8th.
    for (int k = 0; k < 4; ++k) {
        const float *x8 = xb + 8 * k;
        const float *w8 = weight + 8 * k;
        int nflip = 0;
        uint8_t s = 0;
        for (int i = 0; i < 8; ++i) {
            xval[8 * k + i] = x8[i] >= 0 ? x8[i] : -x8[i];
            if (!(x8[i] >= 0)) {
                ++nflip;
                s |= static_cast<uint8_t>(1 << i);
            }
        }
        if (nflip % 2) {
            int imin = 0;
            float min = w8[0] * x8[0] * x8[0];
            for (int i = 1; i < 8; ++i) {
                const float ax = w8[i] * x8[i] * x8[i];
                if (ax < min) {
                    min = ax;
                    imin = i;
                }
            }
            xval[8 * k + imin] = -xval[8 * k + imin];
            s ^= static_cast<uint8_t>(1 << imin);
        }
        signs[k] = s & 127;
    }
    float max = xval[0];
    for (int i = 1; i < kGroup; ++i) max = max > xval[i] ? max : xval[i];
    word[0] = word[1] = 0;
    if (max < kGroupMaxEps) return 0;

    // Candidate inverse scales (5 + 0.1 is) / (3 * s0) around the 0..4-level fit s0.
    float scale = make_qp_scale(kMaxLevel + 2, xval, weight);
    const float eff_max = scale * (kMaxLevel + 1);
    float best = 0;
    uint8_t grid[4] = {0, 0, 0, 0};  // kept if no candidate fits (only with non-finite sums)
    for (int is = -6; is <= 6; ++is) {
        const float id =
            (static_cast<float>(2 * kMaxLevel + 1) + static_cast<float>(is) * 0.1f) / eff_max;
        const float this_scale = 1 / id;
        uint8_t candidate[4];
        for (int k = 0; k < 4; ++k)
            candidate[k] = static_cast<uint8_t>(
                nearest_grid_point(xval + 8 * k, waux + 8 * k, id, this_scale, t));
        float sumqx, sumq2;
        weighted_sums(xval, weight, candidate, t, &sumqx, &sumq2);
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            std::copy(candidate, candidate + 4, grid);
        }
    }
    // Re-round at the best scale, then its least-squares scale.
    if (scale > 0) {
        const float id = 1 / scale;
        for (int k = 0; k < 4; ++k)
            grid[k] =
                static_cast<uint8_t>(nearest_grid_point(xval + 8 * k, waux + 8 * k, id, scale, t));
        float sumqx, sumq2;
        weighted_sums(xval, weight, grid, t, &sumqx, &sumq2);
        if (sumq2 > 0) scale = sumqx / sumq2;
    }
    if (scale < 0) {  // stored scales are unsigned: flip every sign instead (ggml; never seen)
        scale = -scale;
        for (uint8_t &s : signs) s = static_cast<uint8_t>(~s & 127);
    }
    for (int k = 0; k < 4; ++k) {
        word[0] |= static_cast<uint32_t>(grid[k]) << (8 * k);
        word[1] |= static_cast<uint32_t>(signs[k]) << (7 * k);
    }
    return scale;
}

void check_finite(const float *x, int64_t block) {
    for (int i = 0; i < kQK_K; ++i)
        if (!std::isfinite(x[i]))
            throw Error("IQ2_XXS quantizer: value " + std::to_string(x[i]) + " at position " +
                        std::to_string(block * kQK_K + i) + " of the row is not finite");
}

}  // namespace

void quantize_row_iq2_xxs(const float *src, void *dst, int64_t n) {
    const SearchTables &t = search_tables();
    auto *blocks = static_cast<BlockIQ2_XXS *>(dst);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float *x = src + b * kQK_K;
        check_finite(x, b);
        float sumx2 = 0;
        for (int i = 0; i < kQK_K; ++i) sumx2 += x[i] * x[i];
        const float sigma2 = sumx2 / kQK_K;

        uint32_t words[2 * kGroups];
        float scales[kGroups];
        float max_scale = 0;
        for (int g = 0; g < kGroups; ++g) {
            scales[g] = quantize_group(x + kGroup * g, sigma2, t, &words[2 * g]);
            max_scale = max_scale > scales[g] ? max_scale : scales[g];
        }
        BlockIQ2_XXS &out = blocks[b];
        out.d = f32_to_f16(0.0f);
        if (max_scale == 0) {
            std::memset(out.qs, 0, sizeof(out.qs));
            continue;
        }
        // 4-bit ls against d = max_scale / 31: scale ~= d * (2 ls + 1) (against the f32 d)
        const float d = max_scale / 31;
        out.d = f32_to_f16(d);
        const float id = 1 / d;
        for (int g = 0; g < kGroups; ++g) {
            const int ls = std::clamp(round_to_int(0.5f * (id * scales[g] - 1)), 0, 15);
            words[2 * g + 1] |= static_cast<uint32_t>(ls) << 28;
        }
        std::memcpy(out.qs, words, sizeof(out.qs));
    }
}

}  // namespace ds4::quant::ref
