#include "runtime/indexer.h"

#include <cmath>
#include <numeric>
#include <string>

#include "backend/cpu/indexer_score.h"
#include "backend/cpu/qat_sim.h"
#include "common/error.h"

namespace ds4::runtime {

std::vector<uint32_t> indexer_select(ForwardContext &ctx, uint32_t il, const LayerState &st,
                                     float *q, float *w, int64_t p) {
    const model::HParams &hp = ctx.hp;
    const uint32_t n_rows = static_cast<uint32_t>(st.comp.size());
    std::vector<uint32_t> all(n_rows);
    std::iota(all.begin(), all.end(), 0u);
    if (n_rows <= hp.idx_top_k) return all;
    if (!q || !w)
        throw Error("internal: the indexer selects at position " + std::to_string(p) +
                    " without its queries");

    const uint32_t H = hp.n_idx_head, I = hp.idx_head_dim;
    const backend::cpu::RopeAngles angles(ctx.rope_for_layer(il), p);
    for (uint32_t h = 0; h < H; ++h) {
        backend::cpu::rope_tail(q + size_t(h) * I, I, angles, false);
        if (ctx.opts.qat_sim) backend::cpu::indexer_qat(q + size_t(h) * I, I);
    }
    const float wscale = static_cast<float>(1.0 / std::sqrt(double(I) * H));
    std::vector<float> rows(size_t(n_rows) * I), score(n_rows);
    for (uint32_t c = 0; c < n_rows; ++c) st.idx.get(c, rows.data() + size_t(c) * I);
    backend::cpu::indexer_scores(q, w, wscale, rows.data(), n_rows, H, I, score.data());
    all.resize(hp.idx_top_k);
    backend::cpu::top_k_ascending(score.data(), n_rows, hp.idx_top_k, all.data());
    return all;
}

}  // namespace ds4::runtime
