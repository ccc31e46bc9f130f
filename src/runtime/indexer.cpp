#include "runtime/indexer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/qat_sim.h"

namespace ds4::runtime {

std::vector<uint32_t> indexer_select(ForwardContext &ctx, uint32_t il, const LayerState &st,
                                     float *q, float *w, int64_t p) {
    const model::HParams &hp = ctx.hp;
    const uint32_t n_rows = static_cast<uint32_t>(st.comp.size());
    std::vector<uint32_t> all(n_rows);
    std::iota(all.begin(), all.end(), 0u);
    if (n_rows <= hp.idx_top_k) return all;

    const uint32_t H = hp.n_idx_head, I = hp.idx_head_dim;
    for (uint32_t h = 0; h < H; ++h) {
        backend::cpu::rope_tail(q + size_t(h) * I, I, ctx.rope_for_layer(il), p, false);
        if (ctx.opts.qat_sim) backend::cpu::indexer_qat(q + size_t(h) * I, I);
    }
    const float wscale = static_cast<float>(1.0 / std::sqrt(double(I) * H));
    for (uint32_t h = 0; h < H; ++h) w[h] *= wscale;

    // score[c] = sum_h relu(q_h . k_c) * w_h
    std::vector<float> score(n_rows), k(I);
    for (uint32_t c = 0; c < n_rows; ++c) {
        st.idx.get(c, k.data());
        float acc = 0.0f;
        for (uint32_t h = 0; h < H; ++h) {
            const float *qh = q + size_t(h) * I;
            float dot = 0.0f;
            for (uint32_t j = 0; j < I; ++j) dot += qh[j] * k[j];
            acc += std::max(dot, 0.0f) * w[h];
        }
        score[c] = acc;
    }
    // Top-k by score, ties to the lower row; returned ascending.
    std::partial_sort(all.begin(), all.begin() + hp.idx_top_k, all.end(),
                      [&](uint32_t a, uint32_t b) {
                          return score[a] > score[b] || (score[a] == score[b] && a < b);
                      });
    all.resize(hp.idx_top_k);
    std::sort(all.begin(), all.end());
    return all;
}

}  // namespace ds4::runtime
