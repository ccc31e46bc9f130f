#include "runtime/forward.h"

#include <fmt/format.h>

#include "common/error.h"
#include "runtime/attention.h"
#include "runtime/moe.h"

namespace ds4::runtime {

void forward(std::span<const Stage> stages, const model::HParams &hp, const model::ModelWeights &w,
             std::span<const int32_t> tokens, std::vector<float> &logits) {
    const uint32_t E = hp.n_embd;
    const int64_t n = static_cast<int64_t>(tokens.size()), p0 = stages.front().ops->n_past();
    if (n == 0) throw Error("eval of an empty batch");
    for (int32_t token : tokens)
        if (token < 0 || static_cast<uint32_t>(token) >= hp.n_vocab)
            throw Error(fmt::format("token id {} outside the vocabulary of {}", token, hp.n_vocab));
    for (const Stage &st : stages)
        if (st.ops->n_past() != p0)
            throw Error(fmt::format(
                "the layers {}..{} hold {} positions, the first layers {}: an evaluation failed "
                "half-way; rewind the session to its start",
                st.layers.begin, st.layers.end - 1, st.ops->n_past(), p0));
    if (p0 + n > stages.front().ops->ctx())
        throw Error(fmt::format("context full: positions {}..{} do not fit a context of {} tokens",
                                p0, p0 + n - 1, stages.front().ops->ctx()));

    // The token states handed from one stage to the next, through host memory.
    const size_t width = size_t(hp.n_hc) * E;
    std::vector<float> handed(stages.size() > 1 ? size_t(n) * width : 0);
    size_t begun = 0;  // the stages whose batch has begun (abort_step on a throw)
    try {
        for (size_t s = 0; s < stages.size(); ++s) {
            Ops &ops = *stages[s].ops;
            ops.begin_batch(tokens);
            ++begun;
            // Every token's n_hc streams start as its embedding.
            float *X = ops.buffer(n * width);
            if (s == 0)
                ops.embed(X);
            else
                ops.write(handed.data(), handed.size(), X);
            float *mix = ops.buffer(n * hp.n_hc_mix()), *x_in = ops.buffer(n * E);
            float *XN = ops.buffer(n * E), *Y = ops.buffer(n * E);
            for (uint32_t il = stages[s].layers.begin; il < stages[s].layers.end; ++il) {
                const model::LayerWeights &L = w.layers[il];
                ops.hc_pre({L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base}, X, n, mix, x_in);
                ops.rms_norm(x_in, L.attn_norm, XN, n, E);
                attention_sublayer(ops, hp, L, il, XN, n, Y);
                ops.hc_post(mix, Y, n, X);

                ops.hc_pre({L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base}, X, n, mix, x_in);
                ops.rms_norm(x_in, L.ffn_norm, XN, n, E);
                moe_sublayer(ops, hp, L, il, XN, n, Y);
                ops.hc_post(mix, Y, n, X);
            }
            ops.end_batch();
            if (s + 1 < stages.size()) {
                ops.read(X, handed.size(), handed.data());
                continue;
            }
            // Only the last token's logits are needed.
            float *head = ops.buffer(E), *normed = ops.buffer(E), *out = ops.buffer(hp.n_vocab);
            ops.hc_head(X + (n - 1) * width, head);
            ops.rms_norm(head, w.output_norm, normed, 1, E);
            ops.linear(w.output, normed, out, 1);
            logits.resize(hp.n_vocab);
            ops.read(out, hp.n_vocab, logits.data());
        }
    } catch (...) {
        for (size_t s = 0; s < begun; ++s) stages[s].ops->abort_step();
        throw;
    }
}

}  // namespace ds4::runtime
