#include "runtime/moe_routed.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/cpu/matmul.h"
#include "backend/cpu/routing.h"
#include "backend/cpu/vector_ops.h"
#include "common/error.h"

namespace ds4::runtime {

Routing route(ForwardContext &ctx, uint32_t il, const float *logits, int32_t token) {
    const model::HParams &hp = ctx.hp;
    const model::LayerWeights &L = ctx.w.layers[il];
    const int32_t *hash_ids = nullptr;
    if (L.tid2eid) {
        if (token < 0 || static_cast<uint64_t>(token) >= L.tid2eid->ne[1])
            throw Error("token id " + std::to_string(token) + " outside the hash routing table");
        hash_ids =
            reinterpret_cast<const int32_t *>(L.tid2eid->data) + size_t(token) * hp.n_expert_used;
        for (uint32_t i = 0; i < hp.n_expert_used; ++i)
            if (hash_ids[i] < 0 || static_cast<uint32_t>(hash_ids[i]) >= hp.n_expert)
                throw Error("hash routing table of layer " + std::to_string(il) + " names expert " +
                            std::to_string(hash_ids[i]));
    }
    const backend::cpu::RouteParams params{
        .n_expert = hp.n_expert,
        .n_used = hp.n_expert_used,
        .bias = L.exp_probs_b ? reinterpret_cast<const float *>(L.exp_probs_b->data) : nullptr,
        .normalize = hp.expert_weights_norm,
        .scale = hp.expert_weights_scale};
    Routing r;
    r.experts.resize(hp.n_expert_used);
    r.weights.resize(hp.n_expert_used);
    backend::cpu::route_experts(logits, params, hash_ids, r.experts.data(), r.weights.data());
    return r;
}

namespace {

// Calls layer_done(il) when the layer's pass over the expert source ends, however it ends.
class LayerPass {
  public:
    LayerPass(experts::ExpertSource &source, uint32_t il) : source_(source), il_(il) {}
    ~LayerPass() { source_.layer_done(il_); }
    LayerPass(const LayerPass &) = delete;
    LayerPass &operator=(const LayerPass &) = delete;

  private:
    experts::ExpertSource &source_;
    uint32_t il_;
};

// The rows of `all` (one per token) that an expert's users name, in their order: `all` itself
// when that is every row in order (decode), else a copy into `buffer`.
backend::cpu::ActivationRows expert_rows(const backend::cpu::ActivationRows &all,
                                         const std::vector<std::pair<int64_t, uint32_t>> &who,
                                         backend::cpu::ScratchBuffer &buffer) {
    bool identity = static_cast<int64_t>(who.size()) == all.m;
    for (size_t j = 0; identity && j < who.size(); ++j) identity = who[j].first == int64_t(j);
    if (identity) return all;
    backend::cpu::ActivationRows rows = all;
    rows.m = static_cast<int64_t>(who.size());
    auto *out = static_cast<uint8_t *>(buffer.reserve(all.row_stride * who.size()));
    for (size_t j = 0; j < who.size(); ++j)
        std::memcpy(out + j * all.row_stride,
                    static_cast<const uint8_t *>(all.data) + size_t(who[j].first) * all.row_stride,
                    all.row_stride);
    rows.data = out;
    return rows;
}

// A decode step's routed experts when the source's bytes stay valid (a resident mapping): the
// gate and up rows of every selected (expert, slot) pair in one parallel loop, the SwiGLUs,
// every down input quantized at once, and every down product in one more loop. Each output is
// the per-expert loop's (one vec_dot per row; each row rounded on its own), with 3 dispatches to
// the pool instead of 3-4 per expert.
void one_token_experts(ForwardContext &ctx, uint32_t il, const Routing &route,
                       const backend::cpu::ActivationRows &XQ,
                       const std::vector<uint32_t> &selected,
                       const std::vector<std::vector<std::pair<int64_t, uint32_t>>> &users,
                       float *slot_out) {
    using backend::cpu::dense_matrix;
    const model::HParams &hp = ctx.hp;
    const model::LayerWeights &L = ctx.w.layers[il];
    const uint32_t E = hp.n_embd, F = hp.n_ff_exp;
    const auto type_gu = L.ffn_gate_exps->type, type_d = L.ffn_down_exps->type;
    struct Pair {
        experts::ExpertBytes bytes;
        uint32_t slot;
    };
    std::vector<Pair> pairs;
    for (uint32_t e : selected) {
        const experts::ExpertBytes b = ctx.experts.get(il, e);
        for (const auto &[t, slot] : users[e]) pairs.push_back({b, slot});
    }
    const size_t P = pairs.size();
    std::vector<float> G(P * F), U(P * F), D(P * E);
    std::vector<backend::cpu::RowProduct> products;
    for (size_t p = 0; p < P; ++p) {
        products.push_back({dense_matrix(type_gu, pairs[p].bytes.gate, F, E), &XQ, 0, &G[p * F]});
        products.push_back({dense_matrix(type_gu, pairs[p].bytes.up, F, E), &XQ, 0, &U[p * F]});
    }
    backend::cpu::matvec_many(ctx.pool, products);
    // ds4 scales W2's input by the route weight; llama.cpp scales its output.
    const bool weight_after_down = ctx.opts.llama_cpp_rounding;
    for (size_t p = 0; p < P; ++p)
        backend::cpu::swiglu_clamped(&G[p * F], &U[p * F], F, hp.swiglu_clamp[il],
                                     weight_after_down ? 1.0f : route.weights[pairs[p].slot]);
    const backend::cpu::ActivationRows DQ =
        ctx.quantize(type_d, G.data(), int64_t(P), F, ctx.scratch);
    products.clear();
    for (size_t p = 0; p < P; ++p)
        products.push_back(
            {dense_matrix(type_d, pairs[p].bytes.down, E, F), &DQ, int64_t(p), &D[p * E]});
    backend::cpu::matvec_many(ctx.pool, products);
    for (size_t p = 0; p < P; ++p) {
        float *out = slot_out + size_t(pairs[p].slot) * E;
        const float w = weight_after_down ? route.weights[pairs[p].slot] : 1.0f;
        for (uint32_t d = 0; d < E; ++d) out[d] = D[p * E + d] * w;
    }
}

}  // namespace

void moe_routed_cpu(ForwardContext &ctx, uint32_t il, const float *XN, const float *logits,
                    std::span<const int32_t> tokens, float *slot_out) {
    const model::HParams &hp = ctx.hp;
    const model::LayerWeights &L = ctx.w.layers[il];
    const int64_t n = static_cast<int64_t>(tokens.size());
    const uint32_t E = hp.n_embd, F = hp.n_ff_exp, K = hp.n_expert_used;
    const float clamp = hp.swiglu_clamp[il];

    CpuScope scope(ctx.profile, "moe route + input");
    std::vector<Routing> routes(n);
    for (int64_t t = 0; t < n; ++t) routes[t] = route(ctx, il, logits + t * hp.n_expert, tokens[t]);

    // Group (token, slot) pairs by expert; every expert's output goes to its own slot so the
    // per-token sum below runs in selection order whatever the grouping.
    std::vector<std::vector<std::pair<int64_t, uint32_t>>> users(hp.n_expert);
    for (int64_t t = 0; t < n; ++t)
        for (uint32_t i = 0; i < K; ++i) users[routes[t].experts[i]].push_back({t, i});
    std::vector<float> G, U, D;
    const auto type_gu = L.ffn_gate_exps->type, type_d = L.ffn_down_exps->type;
    // Every token's input is quantized once for all the gate and up matrices it meets.
    const backend::cpu::ActivationRows XQ = ctx.quantize(type_gu, XN, n, E, ctx.expert_input);
    // The layer's pass over the expert source (experts/expert_source.h): the union of the batch's
    // experts announced in the loop's order, so that a streaming source has their reads in flight
    // together; each get's bytes are used before the next get; layer_done ends the pass, also
    // when a get or a product throws.
    std::vector<uint32_t> selected;
    for (uint32_t e = 0; e < hp.n_expert; ++e)
        if (!users[e].empty()) selected.push_back(e);
    scope.next(
        "moe experts (gate, up, swiglu, down)",
        double(L.ffn_gate_exps->n_bytes + L.ffn_up_exps->n_bytes + L.ffn_down_exps->n_bytes) *
            double(selected.size()) / double(hp.n_expert));
    ctx.experts.prefetch(il, selected);
    const LayerPass pass(ctx.experts, il);
    if (n == 1 && ctx.experts.bytes_stay_valid()) {
        one_token_experts(ctx, il, routes[0], XQ, selected, users, slot_out);
        return;
    }
    for (uint32_t e : selected) {
        const auto &who = users[e];
        const int64_t m = static_cast<int64_t>(who.size());
        const backend::cpu::ActivationRows X = expert_rows(XQ, who, ctx.expert_rows);
        const experts::ExpertBytes b = ctx.experts.get(il, e);
        G.resize(m * F);
        U.resize(m * F);
        D.resize(m * E);
        ctx.matmul(type_gu, b.gate, F, X, G.data());
        ctx.matmul(type_gu, b.up, F, X, U.data());
        // ds4 scales W2's input by the route weight; llama.cpp scales its output (the same in
        // exact arithmetic, but W2's Q8_0 activation rounding differs).
        const bool weight_after_down = ctx.opts.llama_cpp_rounding;
        auto route_weight = [&](int64_t j) { return routes[who[j].first].weights[who[j].second]; };
        for (int64_t j = 0; j < m; ++j)
            backend::cpu::swiglu_clamped(G.data() + j * F, U.data() + j * F, F, clamp,
                                         weight_after_down ? 1.0f : route_weight(j));
        ctx.matmul(type_d, b.down, E, F, G.data(), m, D.data());
        for (int64_t j = 0; j < m; ++j) {
            float *out = slot_out + (who[j].first * K + who[j].second) * E;
            const float w = weight_after_down ? route_weight(j) : 1.0f;
            for (uint32_t d = 0; d < E; ++d) out[d] = D[j * E + d] * w;
        }
    }
}

}  // namespace ds4::runtime
