#include "runtime/cpu_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <istream>
#include <ostream>

#include "backend/cpu/matmul.h"
#include "backend/cpu/vector_ops.h"
#include "common/error.h"
#include "quant/quant.h"
#include "runtime/attention_core.h"
#include "runtime/hyper_connections.h"
#include "runtime/kv_cache_io.h"
#include "runtime/moe_routed.h"

namespace ds4::runtime {
namespace {

size_t live_bytes(const RowStore &r) {
    return r.capacity() ? r.bytes() / r.capacity() * r.size() : 0;
}

const float *f32_or_null(model::Tensor t) {
    return t ? reinterpret_cast<const float *>(t->data) : nullptr;
}

}  // namespace

size_t CpuState::payload_bytes() const {
    size_t b = 0;
    for (const auto &l : cache.layers) {
        if (l.raw.capacity() == 0) continue;  // another stage's layer (layer_stages.h)
        b += 2 * sizeof(uint32_t) + live_bytes(l.raw) + live_bytes(l.comp) + live_bytes(l.idx) +
             l.comp_state.bytes() + l.idx_state.bytes();
    }
    return b;
}

CpuOps::CpuOps(const model::HParams &hp, const model::ModelWeights &w,
               backend::cpu::ThreadPool &pool, experts::ExpertSource &experts, ForwardOptions opts,
               uint32_t ctx, bool f16_rows, LayerRange layers)
    : ctx_(hp, w, pool, experts, opts),
      cache_(hp, ctx, f16_rows, layers),
      layers_(layers),
      buffers_(opts.buffer_fill) {}

void CpuOps::begin_batch(std::span<const int32_t> tokens) {
    // Decode after a prefill: the prefill chunk's buffers go back to the heap (a chunk's are
    // reused by the next chunk).
    if (tokens.size() == 1 && tokens_.size() > 1) buffers_.free_all();
    tokens_.assign(tokens.begin(), tokens.end());
    ctx_.profile.begin_batch(static_cast<int64_t>(tokens_.size()));
    buffers_.clear();
}

float *CpuOps::buffer(size_t n) {
    return buffers_.take(n);
}

void CpuOps::end_batch() {
    cache_.n_past += static_cast<int64_t>(tokens_.size());
    ctx_.profile.end_batch();
    // The batch's layers are done with every routed expert they got (the output head reads
    // none): a streaming expert source may reuse their slots, and counts one step of its decay.
    ctx_.experts.step_done();
}

void CpuOps::embed(float *X) {
    const CpuScope scope(ctx_.profile, "embed");
    const model::HParams &hp = ctx_.hp;
    const model::Tensor table = ctx_.w.token_embd;
    const uint32_t E = hp.n_embd, HC = hp.n_hc;
    std::vector<float> e(E);
    for (size_t t = 0; t < tokens_.size(); ++t) {
        quant::dequantize_row(table->type, table->data + size_t(tokens_[t]) * table->row_bytes(),
                              e.data(), E);
        for (uint32_t h = 0; h < HC; ++h) std::copy(e.begin(), e.end(), X + (t * HC + h) * E);
    }
}

void CpuOps::linear(model::Tensor w, const float *X, float *Y, int64_t m) {
    const CpuScope scope(ctx_.profile, "linear", w, double(m));
    ctx_.linear(w, X, Y, m);
}

void CpuOps::linear_groups(model::Tensor w, uint32_t groups, const float *X, float *Y, int64_t m) {
    const int64_t R = static_cast<int64_t>(w->ne[1]) / groups;
    const int64_t K = static_cast<int64_t>(w->ne[0]);
    const CpuScope scope(ctx_.profile, "linear", w, double(m));
    // X is m x groups rows of K: every row quantized once (each on its own, as a group's own
    // matmul would), then the groups' products in one pool loop, group g reading every
    // groups-th row from row g and writing every groups-th row of R outputs.
    const backend::cpu::ActivationRows XQ = ctx_.quantize(w->type, X, m * groups, K, ctx_.scratch);
    std::vector<backend::cpu::MatrixProduct> products;
    for (uint32_t g = 0; g < groups; ++g) {
        backend::cpu::ActivationRows xg = XQ;
        xg.data = static_cast<const uint8_t *>(XQ.data) + size_t(g) * XQ.row_stride;
        xg.m = m;
        xg.row_stride = XQ.row_stride * groups;
        products.push_back(
            {backend::cpu::dense_matrix(w->type, w->data + g * R * w->row_bytes(), R, K), xg,
             Y + size_t(g) * R, int64_t(groups) * R});
    }
    backend::cpu::matmul_many(ctx_.pool, products);
}

void CpuOps::rms_norm(const float *x, model::Tensor w, float *y, int64_t m, int64_t n) {
    const CpuScope scope(ctx_.profile, "rms_norm");
    // A token per task (one token runs inline): each row's norm is the serial one.
    ctx_.pool.parallel_for(m, 1, [&](int64_t t0, int64_t t1, int) {
        for (int64_t t = t0; t < t1; ++t)
            backend::cpu::rms_norm(x + t * n, f32_or_null(w), y + t * n, n, ctx_.hp.rms_eps);
    });
}

void CpuOps::hc_pre(const HcWeights &hc, const float *X, int64_t m, float *mix, float *x_in) {
    const CpuScope scope(ctx_.profile, "hc_pre", double(hc.fn->n_bytes) * double(m));
    runtime::hc_pre(ctx_, hc, X, m, mix, x_in);
}

void CpuOps::hc_post(const float *mix, const float *y, int64_t m, float *X) {
    const CpuScope scope(ctx_.profile, "hc_post");
    const uint32_t n = ctx_.hp.n_hc, E = ctx_.hp.n_embd, n_mix = ctx_.hp.n_hc_mix();
    // Each column's update is hc_post's.
    for_token_columns(ctx_.pool, m, E, [&](int64_t t, uint32_t d0, uint32_t d1) {
        runtime::hc_post_range(mix + t * n_mix, n, y + t * E, E, d0, d1, X + t * size_t(n) * E);
    });
}

void CpuOps::hc_head(const float *X, float *out) {
    const CpuScope scope(ctx_.profile, "hc_head");
    runtime::hc_head(ctx_, X, out);
}

void CpuOps::attention_core(uint32_t il, const AttentionInputs &in, int64_t m, float *O) {
    attention_core_cpu(ctx_, il, cache_.layers[il], in, cache_.n_past, m, O);
}

void CpuOps::moe_routed(uint32_t il, const float *XN, const float *logits, int64_t m,
                        float *slot_out) {
    if (m != static_cast<int64_t>(tokens_.size()))
        throw Error("moe_routed: the batch has " + std::to_string(tokens_.size()) + " tokens");
    moe_routed_cpu(ctx_, il, XN, logits, tokens_, slot_out);
}

void CpuOps::swiglu(float *G, const float *U, int64_t m, int64_t n, float clamp) {
    const CpuScope scope(ctx_.profile, "swiglu");
    // Element by element (an exp each: 2,048 a token, ~0.5 M for a 256-token chunk, which ran on
    // one thread), in ranges over the pool.
    for_token_columns(ctx_.pool, m, uint32_t(n), [&](int64_t t, uint32_t d0, uint32_t d1) {
        backend::cpu::swiglu_clamped(G + t * n + d0, U + t * n + d0, d1 - d0, clamp, 1.0f);
    });
}

void CpuOps::moe_sum(const float *slot_out, const float *shared, int64_t m, float *Y) {
    const uint32_t E = ctx_.hp.n_embd, K = ctx_.hp.n_expert_used;
    const CpuScope scope(ctx_.profile, "moe_sum");
    // Each output is 0 + the slots' outputs in slot order + the shared expert's, whatever the
    // split (it ran on one thread: ~7 MB of a 256-token chunk's slot outputs a layer).
    for_token_columns(ctx_.pool, m, E, [&](int64_t t, uint32_t d0, uint32_t d1) {
        float *y = Y + t * E;
        std::fill(y + d0, y + d1, 0.0f);
        for (uint32_t i = 0; i < K; ++i) {
            const float *o = slot_out + (t * K + i) * E;
            for (uint32_t d = d0; d < d1; ++d) y[d] += o[d];
        }
        for (uint32_t d = d0; d < d1; ++d) y[d] += shared[t * E + d];
    });
}

void CpuOps::read(const float *x, size_t n, float *host) {
    std::memcpy(host, x, n * sizeof(float));
}

void CpuOps::write(const float *host, size_t n, float *x) {
    std::memcpy(x, host, n * sizeof(float));
}

std::shared_ptr<const BackendState> CpuOps::save() const {
    return std::make_shared<CpuState>(cache_);
}

void CpuOps::write_state(std::ostream &out) const {
    write_kv_cache(out, cache_);
}

void CpuOps::read_state(std::istream &in, int64_t n_past) {
    cache_ = read_kv_cache(in, ctx_.hp, cache_.ctx, cache_.f16_rows, n_past, layers_);
}

void CpuOps::restore(const BackendState &state) {
    const auto *s = dynamic_cast<const CpuState *>(&state);
    if (s == nullptr) throw Error("restore: a snapshot of another backend");
    cache_ = s->cache;
}

size_t CpuTail::payload_bytes() const {
    size_t b = 0;
    for (const Layer &L : layers) b += L.raw.bytes() + L.comp_state.bytes() + L.idx_state.bytes();
    return b;
}

std::shared_ptr<const BackendState> CpuOps::save_tail() const {
    auto t = std::make_shared<CpuTail>();
    t->n_past = cache_.n_past;
    t->layers.reserve(cache_.layers.size());
    for (const LayerState &L : cache_.layers)
        t->layers.push_back({L.raw, L.comp_state, L.idx_state, L.comp.size(), L.idx.size()});
    return t;
}

void CpuOps::rewind(const BackendState &tail) {
    const auto *t = dynamic_cast<const CpuTail *>(&tail);
    if (t == nullptr || t->layers.size() != cache_.layers.size())
        throw Error("rewind: a rewind point of another backend or model");
    if (t->n_past > cache_.n_past) throw Error("rewind: a point after the current position");
    for (size_t il = 0; il < cache_.layers.size(); ++il) {
        const CpuTail::Layer &from = t->layers[il];
        if (from.comp_rows > cache_.layers[il].comp.size() ||
            from.idx_rows > cache_.layers[il].idx.size())
            throw Error("rewind: a point of another token history (rows it counts are missing)");
    }
    for (size_t il = 0; il < cache_.layers.size(); ++il) {
        const CpuTail::Layer &from = t->layers[il];
        LayerState &L = cache_.layers[il];
        L.raw = from.raw;
        L.comp_state = from.comp_state;
        L.idx_state = from.idx_state;
        L.comp.truncate(from.comp_rows);
        L.idx.truncate(from.idx_rows);
    }
    cache_.n_past = t->n_past;
}

}  // namespace ds4::runtime
