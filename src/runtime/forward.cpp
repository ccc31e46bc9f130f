#include "runtime/forward.h"

#include <fmt/format.h>

#include "common/error.h"
#include "runtime/attention.h"
#include "runtime/moe.h"

namespace ds4::runtime {
namespace {

// One backend's part of a batch: its operations, the model (or the part of it) it computes, and
// its buffers of the batch.
struct Part {
    Ops *ops = nullptr;
    const model::HParams *hp = nullptr;
    const model::ModelWeights *w = nullptr;
    float *X = nullptr, *mix = nullptr, *x_in = nullptr, *XN = nullptr, *Y = nullptr;
};

// Starts the batch on a part and takes its buffers; the first part of a model embeds the tokens,
// a later stage is handed the token states (`handed`).
void begin_part(Part &p, std::span<const int32_t> tokens, const std::vector<float> *handed) {
    const model::HParams &hp = *p.hp;
    const int64_t n = static_cast<int64_t>(tokens.size());
    const size_t width = size_t(hp.n_hc) * hp.n_embd;
    Ops &ops = *p.ops;
    ops.begin_batch(tokens);
    // Every token's n_hc streams start as its embedding.
    p.X = ops.buffer(n * width);
    if (handed)
        ops.write(handed->data(), handed->size(), p.X);
    else
        ops.embed(p.X);
    p.mix = ops.buffer(n * hp.n_hc_mix());
    p.x_in = ops.buffer(n * hp.n_embd);
    p.XN = ops.buffer(n * hp.n_embd);
    p.Y = ops.buffer(n * hp.n_embd);
}

// Several parts compute one sublayer's output as partial sums (a split by tensors): every part's
// Y becomes their sum, added in part order through host memory. One part: nothing to add.
void add_outputs(std::span<Part> parts, size_t count, std::vector<float> &sum,
                 std::vector<float> &one) {
    if (parts.size() == 1) return;
    sum.resize(count);
    one.resize(count);
    // Every read before any write: a write's host staging is free once its stream has been
    // waited for, which a read does.
    parts[0].ops->activate();
    parts[0].ops->read(parts[0].Y, count, sum.data());
    for (size_t i = 1; i < parts.size(); ++i) {
        parts[i].ops->activate();
        parts[i].ops->read(parts[i].Y, count, one.data());
        for (size_t j = 0; j < count; ++j) sum[j] += one[j];
    }
    for (Part &p : parts) {
        p.ops->activate();
        p.ops->write(sum.data(), count, p.Y);
    }
}

// Layers [begin, end) of DeepSeek V4 (docs/MODEL.md 4.8) over the parts in lock step: each
// sublayer on every part, the parts' outputs added, then the hyper-connection update on every
// part.
void run_layers(std::span<Part> parts, uint32_t begin, uint32_t end, int64_t n) {
    const uint32_t E = parts[0].hp->n_embd;
    std::vector<float> sum, one;
    // Parts take turns within a step, each on its own device; one part's batch runs on the
    // device its begin_batch made current.
    const auto activate = [&](Part &p) {
        if (parts.size() > 1) p.ops->activate();
    };
    for (uint32_t il = begin; il < end; ++il) {
        for (Part &p : parts) {
            const model::LayerWeights &L = p.w->layers[il];
            activate(p);
            p.ops->hc_pre({L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base}, p.X, n, p.mix, p.x_in);
            p.ops->rms_norm(p.x_in, L.attn_norm, p.XN, n, E);
            attention_sublayer(*p.ops, *p.hp, L, il, p.XN, n, p.Y);
        }
        add_outputs(parts, size_t(n) * E, sum, one);
        for (Part &p : parts) {
            const model::LayerWeights &L = p.w->layers[il];
            activate(p);
            p.ops->hc_post(p.mix, p.Y, n, p.X);
            p.ops->hc_pre({L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base}, p.X, n, p.mix, p.x_in);
            p.ops->rms_norm(p.x_in, L.ffn_norm, p.XN, n, E);
            moe_sublayer(*p.ops, *p.hp, L, il, p.XN, n, p.Y);
        }
        add_outputs(parts, size_t(n) * E, sum, one);
        for (Part &p : parts) {
            activate(p);
            p.ops->hc_post(p.mix, p.Y, n, p.X);
        }
    }
}

// The last token's logits of the part's vocabulary rows [v0, v0 + rows) into logits.
void head_logits(Part &p, int64_t n, uint64_t v0, std::vector<float> &logits) {
    const model::HParams &hp = *p.hp;
    const uint32_t E = hp.n_embd;
    const size_t width = size_t(hp.n_hc) * E, rows = p.w->output->ne[1];
    Ops &ops = *p.ops;
    float *head = ops.buffer(E), *normed = ops.buffer(E), *out = ops.buffer(rows);
    ops.hc_head(p.X + (n - 1) * width, head);
    ops.rms_norm(head, p.w->output_norm, normed, 1, E);
    ops.linear(p.w->output, normed, out, 1);
    ops.read(out, rows, logits.data() + v0);
}

// Checks before anything is evaluated; returns the batch's first position.
int64_t check_batch(std::span<Ops *const> ops, const model::HParams &hp,
                    std::span<const int32_t> tokens, const std::vector<LayerRange> &layers) {
    const int64_t n = static_cast<int64_t>(tokens.size()), p0 = ops.front()->n_past();
    if (n == 0) throw Error("eval of an empty batch");
    for (int32_t token : tokens)
        if (token < 0 || static_cast<uint32_t>(token) >= hp.n_vocab)
            throw Error(fmt::format("token id {} outside the vocabulary of {}", token, hp.n_vocab));
    for (size_t i = 0; i < ops.size(); ++i)
        if (ops[i]->n_past() != p0)
            throw Error(fmt::format(
                "the layers {}..{} hold {} positions, the first layers {}: an evaluation failed "
                "half-way; rewind the session to its start",
                layers[i].begin, layers[i].end - 1, ops[i]->n_past(), p0));
    if (p0 + n > ops.front()->ctx())
        throw Error(fmt::format("context full: positions {}..{} do not fit a context of {} tokens",
                                p0, p0 + n - 1, ops.front()->ctx()));
    return p0;
}

}  // namespace

void forward(std::span<const Stage> stages, const model::HParams &hp, const model::ModelWeights &w,
             std::span<const int32_t> tokens, std::vector<float> &logits) {
    std::vector<Ops *> ops;
    std::vector<LayerRange> layers;
    for (const Stage &st : stages) {
        ops.push_back(st.ops.get());
        layers.push_back(st.layers);
    }
    check_batch(ops, hp, tokens, layers);
    const int64_t n = static_cast<int64_t>(tokens.size());

    // The token states handed from one stage to the next, through host memory.
    std::vector<float> handed;
    size_t begun = 0;  // the stages whose batch has begun (abort_step on a throw)
    try {
        for (size_t s = 0; s < stages.size(); ++s) {
            Part p{ops[s], &hp, &w};
            begin_part(p, tokens, s == 0 ? nullptr : &handed);
            ++begun;
            run_layers(std::span(&p, 1), stages[s].layers.begin, stages[s].layers.end, n);
            p.ops->end_batch();
            if (s + 1 < stages.size()) {
                handed.resize(size_t(n) * hp.n_hc * hp.n_embd);
                p.ops->read(p.X, handed.size(), handed.data());
                continue;
            }
            logits.resize(hp.n_vocab);
            head_logits(p, n, 0, logits);
        }
    } catch (...) {
        for (size_t s = 0; s < begun; ++s) ops[s]->abort_step();
        throw;
    }
}

void forward_tensor_split(std::span<const TensorRank> ranks, const model::HParams &hp,
                          std::span<const int32_t> tokens, std::vector<float> &logits) {
    std::vector<Ops *> ops;
    for (const TensorRank &r : ranks) ops.push_back(r.ops);
    check_batch(ops, hp, tokens, std::vector<LayerRange>(ranks.size(), {0, hp.n_layer}));
    const int64_t n = static_cast<int64_t>(tokens.size());
    std::vector<Part> parts;
    for (const TensorRank &r : ranks) parts.push_back({r.ops, r.hp, r.w});
    size_t begun = 0;
    try {
        for (Part &p : parts) {
            begin_part(p, tokens, nullptr);
            ++begun;
        }
        run_layers(parts, 0, hp.n_layer, n);
        for (Part &p : parts) {
            p.ops->activate();
            p.ops->end_batch();
        }
        logits.resize(hp.n_vocab);
        for (size_t i = 0; i < parts.size(); ++i) {
            parts[i].ops->activate();
            head_logits(parts[i], n, ranks[i].vocab_begin, logits);
        }
    } catch (...) {
        for (size_t i = 0; i < begun; ++i) parts[i].ops->abort_step();
        throw;
    }
}

}  // namespace ds4::runtime
