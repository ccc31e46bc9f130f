#include "runtime/forward.h"

#include <fmt/format.h>

#include "common/error.h"
#include "runtime/attention.h"
#include "runtime/moe.h"

namespace ds4::runtime {

void forward(Ops &ops, const model::HParams &hp, const model::ModelWeights &w,
             std::span<const int32_t> tokens, std::vector<float> &logits) {
    const uint32_t E = hp.n_embd;
    const int64_t n = static_cast<int64_t>(tokens.size()), p0 = ops.n_past();
    if (n == 0) throw Error("eval of an empty batch");
    for (int32_t token : tokens)
        if (token < 0 || static_cast<uint32_t>(token) >= hp.n_vocab)
            throw Error(fmt::format("token id {} outside the vocabulary of {}", token, hp.n_vocab));
    if (p0 + n > ops.ctx())
        throw Error(fmt::format("context full: positions {}..{} do not fit a context of {} tokens",
                                p0, p0 + n - 1, ops.ctx()));

    ops.begin_batch(tokens);
    try {
        // Every token's n_hc streams start as its embedding.
        const size_t width = size_t(hp.n_hc) * E;
        float *X = ops.buffer(n * width);
        ops.embed(X);
        float *mix = ops.buffer(n * hp.n_hc_mix()), *x_in = ops.buffer(n * E);
        float *XN = ops.buffer(n * E), *Y = ops.buffer(n * E);
        for (uint32_t il = 0; il < hp.n_layer; ++il) {
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

        // Only the last token's logits are needed.
        float *head = ops.buffer(E), *normed = ops.buffer(E), *out = ops.buffer(hp.n_vocab);
        ops.hc_head(X + (n - 1) * width, head);
        ops.rms_norm(head, w.output_norm, normed, 1, E);
        ops.linear(w.output, normed, out, 1);
        logits.resize(hp.n_vocab);
        ops.read(out, hp.n_vocab, logits.data());
    } catch (...) {
        ops.abort_step();
        throw;
    }
}

}  // namespace ds4::runtime
