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

Routing route(ForwardContext &ctx, uint32_t il, const float *logits, int32_t token, bool on_pool) {
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
    if (!on_pool) {
        backend::cpu::route_experts(logits, params, hash_ids, r.experts.data(), r.weights.data());
        return r;
    }
    // The experts' probabilities in ranges on the pool, each the serial one.
    std::vector<float> prob(hp.n_expert);
    ctx.pool.parallel_for(hp.n_expert, 32, [&](int64_t e0, int64_t e1, int) {
        backend::cpu::router_probs(logits, uint32_t(e0), uint32_t(e1), prob.data());
    });
    backend::cpu::route_from_probs(prob.data(), params, hash_ids, r.experts.data(),
                                   r.weights.data());
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

// The routed experts of a batch when the source's bytes stay valid (a resident mapping): the
// gate and up products of every selected expert in one parallel loop, the SwiGLUs, every down
// input quantized at once, and every down product in one more loop. Each output is the
// per-expert loop's (each product computed as matmul_activations computes it; activation rows
// are quantized row by row), with 3 dispatches to the pool instead of 3-4 per expert: a prefill
// chunk meets nearly every expert of a layer, each with a few tokens, and a decode step six.
void experts_in_three_loops(ForwardContext &ctx, uint32_t il, const std::vector<Routing> &routes,
                            const backend::cpu::ActivationRows &XQ,
                            const std::vector<uint32_t> &selected,
                            const std::vector<std::vector<std::pair<int64_t, uint32_t>>> &users,
                            float *slot_out) {
    using backend::cpu::activation_rows;
    using backend::cpu::dense_matrix;
    const model::HParams &hp = ctx.hp;
    const model::LayerWeights &L = ctx.w.layers[il];
    const uint32_t E = hp.n_embd, F = hp.n_ff_exp, K = hp.n_expert_used;
    const auto type_gu = L.ffn_gate_exps->type, type_d = L.ffn_down_exps->type;
    // Expert e's (token, slot) pairs are rows [first[i], first[i] + users[e].size()) of G, U,
    // the down inputs and D, for e = selected[i]; their gate and up inputs the same rows of
    // `gathered`.
    std::vector<int64_t> first(selected.size() + 1, 0);
    for (size_t i = 0; i < selected.size(); ++i)
        first[i + 1] = first[i] + int64_t(users[selected[i]].size());
    const int64_t P = first.back();
    // Row p's token, route weight and output slot row (token x K + slot).
    std::vector<int64_t> token(static_cast<size_t>(P));
    std::vector<float> route_weight(static_cast<size_t>(P));
    std::vector<size_t> out_row(static_cast<size_t>(P));
    for (size_t i = 0; i < selected.size(); ++i)
        for (size_t j = 0; j < users[selected[i]].size(); ++j) {
            const auto &[t, slot] = users[selected[i]][j];
            const size_t p = size_t(first[i]) + j;
            token[p] = t;
            route_weight[p] = routes[size_t(t)].weights[slot];
            out_row[p] = size_t(t) * K + slot;
        }
    // The per-row steps below run on the pool, 8 rows a task (a prefill chunk has ~1,500).
    auto rows_on_pool = [&](auto &&row) {
        ctx.pool.parallel_for(P, 8, [&](int64_t p0, int64_t p1, int) {
            for (int64_t p = p0; p < p1; ++p) row(size_t(p));
        });
    };
    backend::cpu::ActivationRows gathered = XQ;
    gathered.m = P;
    auto *rows = static_cast<uint8_t *>(ctx.expert_rows.reserve(XQ.row_stride * size_t(P)));
    const auto *src = static_cast<const uint8_t *>(XQ.data);
    rows_on_pool([&](size_t p) {
        std::memcpy(rows + p * XQ.row_stride, src + size_t(token[p]) * XQ.row_stride,
                    XQ.row_stride);
    });
    gathered.data = rows;
    std::vector<experts::ExpertBytes> bytes;
    for (uint32_t e : selected) bytes.push_back(ctx.experts.get(il, e));
    // Every element of G, U and D is written by a product below before it is read.
    auto *G = static_cast<float *>(ctx.expert_gate.reserve(sizeof(float) * size_t(P) * F));
    auto *U = static_cast<float *>(ctx.expert_up.reserve(sizeof(float) * size_t(P) * F));
    auto *D = static_cast<float *>(ctx.expert_down.reserve(sizeof(float) * size_t(P) * E));
    std::vector<backend::cpu::MatrixProduct> products;
    for (size_t i = 0; i < selected.size(); ++i) {
        const int64_t m = first[i + 1] - first[i];
        const backend::cpu::ActivationRows X = activation_rows(gathered, first[i], m);
        products.push_back({dense_matrix(type_gu, bytes[i].gate, F, E), X, &G[first[i] * F]});
        products.push_back({dense_matrix(type_gu, bytes[i].up, F, E), X, &U[first[i] * F]});
    }
    backend::cpu::matmul_many(ctx.pool, products);
    // ds4 scales W2's input by the route weight; llama.cpp scales its output (the same in exact
    // arithmetic, but W2's Q8_0 activation rounding differs).
    const bool weight_after_down = ctx.opts.llama_cpp_rounding;
    rows_on_pool([&](size_t p) {
        backend::cpu::swiglu_clamped(&G[p * F], &U[p * F], F, hp.swiglu_clamp[il],
                                     weight_after_down ? 1.0f : route_weight[p]);
    });
    const backend::cpu::ActivationRows DQ = ctx.quantize(type_d, G, P, F, ctx.scratch);
    products.clear();
    for (size_t i = 0; i < selected.size(); ++i)
        products.push_back({dense_matrix(type_d, bytes[i].down, E, F),
                            activation_rows(DQ, first[i], first[i + 1] - first[i]),
                            &D[size_t(first[i]) * E]});
    backend::cpu::matmul_many(ctx.pool, products);
    rows_on_pool([&](size_t p) {
        float *out = slot_out + out_row[p] * E;
        const float w = weight_after_down ? route_weight[p] : 1.0f;
        for (uint32_t d = 0; d < E; ++d) out[d] = D[p * E + d] * w;
    });
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
    // One token: its experts' probabilities on the pool; several: the tokens on the pool.
    if (n == 1)
        routes[0] = route(ctx, il, logits, tokens[0], true);
    else
        ctx.pool.parallel_for(n, 1, [&](int64_t t0, int64_t t1, int) {
            for (int64_t t = t0; t < t1; ++t)
                routes[t] = route(ctx, il, logits + t * hp.n_expert, tokens[t], false);
        });

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
    if (ctx.experts.bytes_stay_valid()) {
        experts_in_three_loops(ctx, il, routes, XQ, selected, users, slot_out);
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
