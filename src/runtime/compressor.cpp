#include "runtime/compressor.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/compressor_pool.h"
#include "backend/cpu/vector_ops.h"
#include "quant/quant.h"

namespace ds4::runtime {

bool compressor_push(ForwardContext &ctx, uint32_t il, const CompressorWeights &cw,
                     CompressorState &st, uint32_t d, const float *kv, const float *sc, int64_t p,
                     float *row) {
    const uint32_t r = ctx.hp.compress_ratio[il];
    const bool overlap = ctx.hp.compressor_coff(il) == 2;
    const uint32_t W = st.width;  // coff * d
    // ape is [ratio][W]: the additive score bias of this token's phase in its window.
    std::vector<float> ape(W);
    const int64_t phase = p % r;
    const size_t ape_row_bytes = cw.ape->n_bytes / cw.ape->ne[1];
    quant::dequantize_row(cw.ape->type, cw.ape->data + phase * ape_row_bytes, ape.data(), W);
    const size_t slot = overlap ? r + phase : phase;
    std::copy(kv, kv + W, st.kv.begin() + slot * W);
    for (uint32_t j = 0; j < W; ++j) st.score[slot * W + j] = sc[j] + ape[j];
    if ((p + 1) % r != 0) return false;

    // Pool each column j of the output over the window's candidate rows.
    std::vector<float> pooled(d);
    backend::cpu::compressor_pool(st.kv.data(), st.score.data(), r, overlap, d, W, pooled.data());
    if (overlap) {  // the current window becomes the previous one
        std::copy(st.kv.begin() + size_t(r) * W, st.kv.begin() + size_t(2 * r) * W, st.kv.begin());
        std::copy(st.score.begin() + size_t(r) * W, st.score.begin() + size_t(2 * r) * W,
                  st.score.begin());
    }
    const float *norm_w = reinterpret_cast<const float *>(cw.norm->data);
    backend::cpu::rms_norm(pooled.data(), norm_w, row, d, ctx.hp.rms_eps);
    backend::cpu::rope_tail(row, d, ctx.rope_for_layer(il), p + 1 - r, false);
    return true;
}

}  // namespace ds4::runtime
