#include "runtime/attention_core.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/attention_mix.h"
#include "backend/cpu/qat_sim.h"
#include "backend/cpu/vector_ops.h"
#include "quant/quant.h"
#include "runtime/compressor.h"
#include "runtime/indexer.h"

namespace ds4::runtime {
namespace {

const float *f32(model::Tensor t) {
    return reinterpret_cast<const float *>(t->data);
}

// softmax over the visible rows with the sink logit in the denominator only; K = V = the row;
// inverse RoPE on the output's tail. q: H x D; rows: n_rows x D; o: H x D.
void attend(ForwardContext &ctx, uint32_t il, const float *q, const std::vector<float> &rows,
            size_t n_rows, int64_t p, float *o) {
    using namespace backend::cpu;
    const model::HParams &hp = ctx.hp;
    const uint32_t H = hp.n_head, D = hp.head_dim;
    const float scale = static_cast<float>(1.0 / std::sqrt(double(D)));
    const float *sinks = f32(ctx.w.layers[il].attn_sinks);
    const RopeFreqs &rope = ctx.rope_for_layer(il);
    // The f32 dot of the block-format kernels (SIMD, f64 accumulation, same result on every
    // path). The multi-row form scores a thread's heads against each row at once, converting the
    // row once for all of them, with the bits of vec_dot per head and row.
    const quant::TypeKernels &f32_dot = quant::kernels(GgmlType::F32);
    const size_t row_bytes = size_t(D) * sizeof(float);
    ctx.pool.parallel_for(H, [&](int64_t h0, int64_t h1, int) {
        std::vector<float> scores(size_t(h1 - h0) * n_rows);
        if (f32_dot.vec_dot_multi != nullptr && n_rows > 0)
            f32_dot.vec_dot_multi(D, rows.data(), row_bytes, static_cast<int64_t>(n_rows),
                                  q + size_t(h0) * D, row_bytes, h1 - h0, scores.data(),
                                  static_cast<int64_t>(n_rows));
        else
            for (int64_t h = h0; h < h1; ++h)
                for (size_t j = 0; j < n_rows; ++j)
                    scores[size_t(h - h0) * n_rows + j] =
                        f32_dot.vec_dot(D, rows.data() + j * D, q + size_t(h) * D);
        for (int64_t h = h0; h < h1; ++h) {
            float *oh = o + size_t(h) * D;
            attention_mix_head(scores.data() + size_t(h - h0) * n_rows, n_rows, scale, sinks[h],
                               rows.data(), D, oh);
            rope_tail(oh, D, rope, p, true);
        }
    });
}

}  // namespace

void attention_core_cpu(ForwardContext &ctx, uint32_t il, LayerState &st, const AttentionInputs &in,
                        int64_t p0, int64_t n, float *O) {
    using namespace backend::cpu;
    const model::HParams &hp = ctx.hp;
    const model::LayerWeights &L = ctx.w.layers[il];
    const uint32_t H = hp.n_head, D = hp.head_dim;
    const RopeFreqs &rope = ctx.rope_for_layer(il);
    const bool compressed = hp.compress_ratio[il] != 0;
    const bool indexed = hp.attention_kind(il) == model::AttentionKind::Overlapped;

    // Every query head of the batch normed and rotated at its token's position, on the pool.
    {
        CpuScope scope(ctx.profile, "attention: q, kv, compressors");
        ctx.pool.parallel_for(n * H, 8, [&](int64_t i0, int64_t i1, int) {
            for (int64_t i = i0; i < i1; ++i) {
                float *qh = in.q + size_t(i) * D;
                rms_norm(qh, nullptr, qh, D, hp.rms_eps);
                rope_tail(qh, D, rope, p0 + i / H, false);
            }
        });
    }
    // Per token, in position order: cache updates, then attention over what that token sees.
    std::vector<float> kv(D), row(D), irow(hp.idx_head_dim), rows;
    for (int64_t t = 0; t < n; ++t) {
        const int64_t p = p0 + t;
        CpuScope scope(ctx.profile, "attention: q, kv, compressors");
        const float *q = in.q + t * H * D;
        // The token's KV row: rmsnorm, RoPE, FP8 on the non-rotary dims, into the window ring.
        rms_norm(in.kv + t * D, f32(L.attn_kv_a_norm), kv.data(), D, hp.rms_eps);
        rope_tail(kv.data(), D, rope, p, false);
        if (ctx.opts.qat_sim) fp8_e4m3_sim(kv.data(), hp.n_nope());
        st.raw.set(static_cast<size_t>(p % hp.sliding_window), kv.data());

        std::vector<uint32_t> selected;
        if (compressed) {
            const size_t W = st.comp_state.width;
            if (compressor_push(ctx, il, {L.comp_ape, L.comp_kv, L.comp_gate, L.comp_norm},
                                st.comp_state, D, in.comp_kv + t * W, in.comp_score + t * W, p,
                                row.data())) {
                if (ctx.opts.qat_sim) fp8_e4m3_sim(row.data(), hp.n_nope());
                st.comp.push(row.data());
            }
            if (indexed) {
                const size_t IWd = st.idx_state.width;
                if (compressor_push(
                        ctx, il, {L.idx_comp_ape, L.idx_comp_kv, L.idx_comp_gate, L.idx_comp_norm},
                        st.idx_state, hp.idx_head_dim, in.idx_kv + t * IWd, in.idx_score + t * IWd,
                        p, irow.data())) {
                    if (ctx.opts.qat_sim) indexer_qat(irow.data(), hp.idx_head_dim);
                    st.idx.push(irow.data());
                }
                // (no queries where no token of the batch selects: attention.cpp)
                scope.next("attention: indexer select");
                selected = indexer_select(
                    ctx, il, st,
                    in.idx_q ? in.idx_q + t * hp.n_idx_head * hp.idx_head_dim : nullptr,
                    in.idx_w ? in.idx_w + t * hp.n_idx_head : nullptr, p);
            } else {
                selected.resize(st.comp.size());
                for (uint32_t c = 0; c < selected.size(); ++c) selected[c] = c;
            }
        }

        // Visible rows: the raw window (oldest first), then the compressed rows.
        scope.next("attention: gather rows");
        const int64_t first = std::max<int64_t>(0, p - hp.sliding_window + 1);
        const size_t n_raw = static_cast<size_t>(p - first + 1);
        // (On the pool: a row of f16 values converts at a few ns a value.)
        rows.resize((n_raw + selected.size()) * D);
        ctx.pool.parallel_for(
            int64_t(n_raw + selected.size()), 32, [&](int64_t i0, int64_t i1, int) {
                for (int64_t i = i0; i < i1; ++i) {
                    float *out = rows.data() + size_t(i) * D;
                    if (size_t(i) < n_raw)
                        st.raw.get(static_cast<size_t>((first + i) % hp.sliding_window), out);
                    else
                        st.comp.get(selected[size_t(i) - n_raw], out);
                }
            });
        scope.next("attention: attend");
        attend(ctx, il, q, rows, n_raw + selected.size(), p, O + t * H * D);
    }
}

}  // namespace ds4::runtime
