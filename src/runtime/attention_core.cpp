#include "runtime/attention_core.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <vector>

#include "backend/cpu/attention_mix.h"
#include "backend/cpu/qat_sim.h"
#include "backend/cpu/vector_ops.h"
#include "quant/quant.h"
#include "runtime/compressor.h"
#include "runtime/indexer.h"

namespace ds4::runtime {
namespace {

using backend::cpu::RowSegment;

const float *f32(model::Tensor t) {
    return reinterpret_cast<const float *>(t->data);
}

// What a token of the batch sees besides its raw window: the first n_comp compressed rows, or,
// where the indexer selected, those rows (ascending).
struct TokenView {
    size_t n_comp = 0;
    bool selects = false;
    std::vector<uint32_t> selected;
};

// Rows i of a store into out (row i at out + (i - first) * width), on the pool.
void gather(ForwardContext &ctx, const RowStore &store, size_t first, size_t end,
            const std::vector<uint32_t> *index, float *out) {
    const uint32_t w = store.width();
    const int64_t n = static_cast<int64_t>(index ? index->size() : end - first);
    ctx.pool.parallel_for(n, 32, [&](int64_t i0, int64_t i1, int) {
        for (int64_t i = i0; i < i1; ++i)
            store.get(index ? (*index)[size_t(i)] : first + size_t(i), out + size_t(i) * w);
    });
}

// What attending one token's heads needs of layer il.
struct HeadsSetup {
    uint32_t D;
    float scale;
    const float *sinks;
    const backend::cpu::RopeFreqs &rope;
};
HeadsSetup heads_setup(ForwardContext &ctx, uint32_t il) {
    const uint32_t D = ctx.hp.head_dim;
    return {D, static_cast<float>(1.0 / std::sqrt(double(D))), f32(ctx.w.layers[il].attn_sinks),
            ctx.rope_for_layer(il)};
}

// Scores of rows [r0, r1) of the two segments (in order, n_rows in all) against n_heads query
// heads q: scores[h * n_rows + j]. The f32 dot of the block-format kernels (SIMD, f64
// accumulation, the same result on every path); the multi-row form scores the heads against each
// row at once, with vec_dot's bits per head and row.
void score_rows(uint32_t D, const float *q, int64_t n_heads, const std::array<RowSegment, 2> &seg,
                size_t r0, size_t r1, size_t n_rows, float *scores) {
    const quant::TypeKernels &f32_dot = quant::kernels(GgmlType::F32);
    const size_t row_bytes = size_t(D) * sizeof(float);
    size_t offset = 0;
    for (const RowSegment &s : seg) {
        const size_t a = std::max(r0, offset), b = std::min(r1, offset + s.n);
        offset += s.n;
        if (a >= b) continue;
        const float *rows = s.rows + (a - (offset - s.n)) * D;
        if (f32_dot.vec_dot_multi != nullptr) {
            f32_dot.vec_dot_multi(D, rows, row_bytes, int64_t(b - a), q, row_bytes, n_heads,
                                  scores + a, int64_t(n_rows));
            continue;
        }
        for (int64_t h = 0; h < n_heads; ++h)
            for (size_t j = a; j < b; ++j)
                scores[size_t(h) * n_rows + j] =
                    f32_dot.vec_dot(D, rows + (j - a) * D, q + size_t(h) * D);
    }
}

// Every head of one token: scores of its rows (two segments, in order), softmax with the sink,
// the weighted sum of the rows, inverse RoPE on each output's tail. q: the token's H x D
// queries; o: its H x D outputs.
void attend_heads(ForwardContext &ctx, uint32_t il, const float *q,
                  const std::array<RowSegment, 2> &seg, int64_t p, std::vector<float> &scores,
                  float *o) {
    using namespace backend::cpu;
    const HeadsSetup c = heads_setup(ctx, il);
    const int64_t H = ctx.hp.n_head;
    const size_t n_rows = seg[0].n + seg[1].n;
    scores.resize(size_t(H) * n_rows);
    score_rows(c.D, q, H, seg, 0, n_rows, n_rows, scores.data());
    const RopeAngles angles(c.rope, p);
    for (int64_t h = 0; h < H; ++h) {
        float *oh = o + size_t(h) * c.D;
        attention_mix_head(scores.data() + size_t(h) * n_rows, seg.data(), 2, c.scale, c.sinks[h],
                           c.D, oh);
        rope_tail(oh, c.D, angles, true);
    }
}

// One token's heads over the pool in four phases: the scores by rows (every head against a chunk
// of rows), the softmax weights by heads, the weighted sums by values (a task: a 64-value slice
// of every row for 8 heads, the slice in registers for four heads at a time), the inverse RoPE by
// heads. Every value is computed by attend_heads' operations in its order (the same bits); the
// scores read each row once, where a task per range of heads read every row in each task (a
// decode step's attention on 16 threads read its rows 16 times).
void attend_token_split(ForwardContext &ctx, uint32_t il, const float *q,
                        const std::array<RowSegment, 2> &seg, int64_t p, std::vector<float> &scores,
                        std::vector<float> &den, float *o) {
    using namespace backend::cpu;
    const HeadsSetup c = heads_setup(ctx, il);
    const uint32_t D = c.D;
    const int64_t H = ctx.hp.n_head;
    const size_t n_rows = seg[0].n + seg[1].n;
    scores.resize(size_t(H) * n_rows);
    den.resize(size_t(H));
    constexpr int64_t kRowsPerTask = 16;
    ctx.pool.parallel_for(int64_t(n_rows), kRowsPerTask, [&](int64_t r0, int64_t r1, int) {
        score_rows(D, q, H, seg, size_t(r0), size_t(r1), n_rows, scores.data());
    });
    ctx.pool.parallel_for(H, 4, [&](int64_t h0, int64_t h1, int) {
        for (int64_t h = h0; h < h1; ++h)
            den[size_t(h)] =
                attention_softmax(scores.data() + size_t(h) * n_rows, n_rows, c.scale, c.sinks[h]);
    });
    // A task: kMixValues values of 8 heads (the published shape: 64 tasks).
    constexpr int64_t kHeadsPerTask = 8;
    const int64_t n_slices = (D + kMixValues - 1) / kMixValues;
    const int64_t n_groups = (H + kHeadsPerTask - 1) / kHeadsPerTask;
    ctx.pool.parallel_for(n_slices * n_groups, 1, [&](int64_t i0, int64_t i1, int) {
        for (int64_t i = i0; i < i1; ++i) {
            const uint32_t d0 = uint32_t(i % n_slices) * kMixValues;
            const int64_t h0 = i / n_slices * kHeadsPerTask, h1 = std::min(H, h0 + kHeadsPerTask);
            if (d0 + kMixValues <= D) {
                attention_mix_heads(scores.data() + size_t(h0) * n_rows, n_rows, den.data() + h0,
                                    size_t(h1 - h0), seg.data(), 2, D, d0, o + size_t(h0) * D);
                continue;
            }
            for (int64_t h = h0; h < h1; ++h)  // a head size that is no multiple of kMixValues
                attention_mix_range(scores.data() + size_t(h) * n_rows, seg.data(), 2,
                                    den[size_t(h)], D, d0, D, o + size_t(h) * D);
        }
    });
    const RopeAngles angles(c.rope, p);
    ctx.pool.parallel_for(H, 8, [&](int64_t h0, int64_t h1, int) {
        for (int64_t h = h0; h < h1; ++h) rope_tail(o + size_t(h) * D, D, angles, true);
    });
}

}  // namespace

void attention_core_cpu(ForwardContext &ctx, uint32_t il, LayerState &st, const AttentionInputs &in,
                        int64_t p0, int64_t n, float *O) {
    using namespace backend::cpu;
    const model::HParams &hp = ctx.hp;
    const model::LayerWeights &L = ctx.w.layers[il];
    const uint32_t H = hp.n_head, D = hp.head_dim;
    const int64_t W = hp.sliding_window;
    const RopeFreqs &rope = ctx.rope_for_layer(il);
    const bool compressed = hp.compress_ratio[il] != 0;
    const bool indexed = hp.attention_kind(il) == model::AttentionKind::Overlapped;

    // Every query head of the batch normed and rotated at its token's position, on the pool.
    {
        CpuScope scope(ctx.profile, "attention: q, kv, compressors");
        ctx.pool.parallel_for(n * H, 8, [&](int64_t i0, int64_t i1, int) {
            std::optional<RopeAngles> angles;  // of the task's current token
            for (int64_t i = i0; i < i1; ++i) {
                float *qh = in.q + size_t(i) * D;
                rms_norm(qh, nullptr, qh, D, hp.rms_eps);
                if (i == i0 || i % H == 0) angles.emplace(rope, p0 + i / H);
                rope_tail(qh, D, *angles, false);
            }
        });
    }

    // The raw rows the batch sees, positions [base, p0 + n), as f32 copies of what the ring
    // stores (the f16 rounding included): the rows before the batch are copied before its tokens
    // overwrite their ring slots, each token's row as it is stored.
    const int64_t base = std::max<int64_t>(0, p0 - W + 1);
    std::vector<float> raw(size_t(p0 + n - base) * D);
    {
        CpuScope scope(ctx.profile, "attention: gather rows");
        ctx.pool.parallel_for(p0 - base, 32, [&](int64_t i0, int64_t i1, int) {
            for (int64_t i = i0; i < i1; ++i)
                st.raw.get(static_cast<size_t>((base + i) % W), raw.data() + size_t(i) * D);
        });
    }

    // Per token, in position order: the cache updates (the KV row, the compressors, the
    // indexer's selection, which sees the rows pushed so far), and what the token sees.
    std::vector<TokenView> view(static_cast<size_t>(n));
    std::vector<float> kv(D), row(D), irow(hp.idx_head_dim);
    for (int64_t t = 0; t < n; ++t) {
        const int64_t p = p0 + t;
        CpuScope scope(ctx.profile, "attention: q, kv, compressors");
        // The token's KV row: rmsnorm, RoPE, FP8 on the non-rotary dims, into the window ring.
        rms_norm(in.kv + t * D, f32(L.attn_kv_a_norm), kv.data(), D, hp.rms_eps);
        rope_tail(kv.data(), D, rope, p, false);
        if (ctx.opts.qat_sim) fp8_e4m3_sim(kv.data(), hp.n_nope());
        st.raw.set(static_cast<size_t>(p % W), kv.data());
        st.raw.get(static_cast<size_t>(p % W), raw.data() + size_t(p - base) * D);
        if (!compressed) continue;

        const size_t W_comp = st.comp_state.width;
        if (compressor_push(ctx, il, {L.comp_ape, L.comp_kv, L.comp_gate, L.comp_norm},
                            st.comp_state, D, in.comp_kv + t * W_comp, in.comp_score + t * W_comp,
                            p, row.data())) {
            if (ctx.opts.qat_sim) fp8_e4m3_sim(row.data(), hp.n_nope());
            st.comp.push(row.data());
        }
        TokenView &v = view[size_t(t)];
        v.n_comp = st.comp.size();
        if (!indexed) continue;
        const size_t IWd = st.idx_state.width;
        if (compressor_push(ctx, il,
                            {L.idx_comp_ape, L.idx_comp_kv, L.idx_comp_gate, L.idx_comp_norm},
                            st.idx_state, hp.idx_head_dim, in.idx_kv + t * IWd,
                            in.idx_score + t * IWd, p, irow.data())) {
            if (ctx.opts.qat_sim) indexer_qat(irow.data(), hp.idx_head_dim);
            st.idx.push(irow.data());
        }
        // (no queries where no token of the batch selects: attention.cpp)
        scope.next("attention: indexer select");
        std::vector<uint32_t> selected = indexer_select(
            ctx, il, st, in.idx_q ? in.idx_q + t * hp.n_idx_head * hp.idx_head_dim : nullptr,
            in.idx_w ? in.idx_w + t * hp.n_idx_head : nullptr, p);
        if (selected.size() < v.n_comp) v.selects = true, v.selected = std::move(selected);
    }

    // The compressed rows the tokens that do not select see (a prefix of the store, the longest
    // being the last such token's), copied once for the batch.
    size_t n_shared = 0;
    for (const TokenView &v : view)
        if (!v.selects) n_shared = std::max(n_shared, v.n_comp);
    std::vector<float> comp(n_shared * D);
    CpuScope scope(ctx.profile, "attention: gather rows");
    gather(ctx, st.comp, 0, n_shared, nullptr, comp.data());

    // A batch of at least a token per thread: a task is a token (all its heads; a token that
    // selects copies its rows there). A smaller batch (decode): token by token, each over the
    // pool (attend_token_split), the rows of a token that selects copied first, on the pool.
    const bool by_token = n >= ctx.pool.n_threads();
    std::vector<std::vector<float>> selected_rows(static_cast<size_t>(by_token ? 0 : n));
    if (!by_token)
        for (int64_t t = 0; t < n; ++t)
            if (view[size_t(t)].selects) {
                const std::vector<uint32_t> &sel = view[size_t(t)].selected;
                selected_rows[size_t(t)].resize(sel.size() * D);
                gather(ctx, st.comp, 0, 0, &sel, selected_rows[size_t(t)].data());
            }
    scope.next("attention: attend");
    // Token t's rows: its raw window, then the compressed rows it sees (`selected`: the rows a
    // selecting token's indexer picked, copied).
    auto token_rows = [&](int64_t t, const std::vector<float> *selected) {
        const int64_t first = std::max<int64_t>(0, p0 + t - W + 1);
        const TokenView &v = view[size_t(t)];
        std::array<RowSegment, 2> seg = {
            RowSegment{raw.data() + size_t(first - base) * D, size_t(p0 + t - first + 1)},
            RowSegment{comp.data(), v.n_comp}};
        if (v.selects) seg[1] = {selected->data(), v.selected.size()};
        return seg;
    };
    if (!by_token) {
        std::vector<float> scores, den;
        for (int64_t t = 0; t < n; ++t) {
            const std::array<RowSegment, 2> seg = token_rows(t, &selected_rows[size_t(t)]);
            attend_token_split(ctx, il, in.q + size_t(t) * H * D, seg, p0 + t, scores, den,
                               O + size_t(t) * H * D);
        }
        return;
    }
    std::vector<std::vector<float>> scores(size_t(ctx.pool.n_threads())),
        rows(size_t(ctx.pool.n_threads()));
    ctx.pool.parallel_for(n, 1, [&](int64_t t0, int64_t t1, int thread) {
        for (int64_t t = t0; t < t1; ++t) {
            const TokenView &v = view[size_t(t)];
            std::vector<float> &own = rows[size_t(thread)];
            if (v.selects) {
                own.resize(v.selected.size() * D);
                for (size_t k = 0; k < v.selected.size(); ++k)
                    st.comp.get(v.selected[k], own.data() + k * D);
            }
            attend_heads(ctx, il, in.q + size_t(t) * H * D, token_rows(t, &own), p0 + t,
                         scores[size_t(thread)], O + size_t(t) * H * D);
        }
    });
}

}  // namespace ds4::runtime
