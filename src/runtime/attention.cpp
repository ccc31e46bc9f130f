#include "runtime/attention.h"

namespace ds4::runtime {

void attention_sublayer(Ops &ops, const model::HParams &hp, const model::LayerWeights &L,
                        uint32_t il, const float *XN, int64_t n, float *Y) {
    const size_t scratch = ops.mark();
    const uint32_t H = hp.n_head, D = hp.head_dim, QL = hp.q_lora_rank;
    const bool compressed = hp.compress_ratio[il] != 0;
    const bool indexed = hp.attention_kind(il) == model::AttentionKind::Overlapped;

    // Projections of the whole batch, those of XN first (kv right after q_a, and the
    // compressors' and the indexer's together: a backend may round XN once for both Q8_0
    // products, and run the float ones of one input as one launch); then those of QR.
    // Queries: q = q_b . rmsnorm(q_a . xn); the core norms each head and rotates it.
    float *QA = ops.buffer(n * QL), *QR = ops.buffer(n * QL), *Q = ops.buffer(n * H * D);
    float *KV = ops.buffer(n * D);
    ops.linear(L.attn_q_a, XN, QA, n);
    ops.linear(L.attn_kv, XN, KV, n);
    AttentionInputs in{.q = Q, .kv = KV};
    // The compressors' and the indexer's products of XN are a branch beside the queries'
    // chain (q_a, its norm, q_b): the attention core is the first to read them.
    ops.begin_branch();
    // The compressors' value and score rows (docs/MODEL.md 4.4).
    auto project = [&](model::Tensor kv, model::Tensor gate, const float *&K, const float *&S) {
        const int64_t width = static_cast<int64_t>(kv->ne[1]);
        float *k = ops.buffer(n * width), *s = ops.buffer(n * width);
        ops.linear(kv, XN, k, n);
        ops.linear(gate, XN, s, n);
        K = k;
        S = s;
    };
    if (compressed) project(L.comp_kv, L.comp_gate, in.comp_kv, in.comp_score);
    // The indexer's queries and head weights are read only where a token sees more compressed
    // rows than the indexer keeps, (p + 1) / ratio > top_k (docs/MODEL.md 4.5): before the
    // batch's last token does, they are not computed (but for a backend that replays one
    // captured step at every position).
    const bool queries = indexed && ((ops.n_past() + n) / hp.compress_ratio[il] > hp.idx_top_k ||
                                     (n == 1 && ops.replays_steps()));
    if (indexed) {
        project(L.idx_comp_kv, L.idx_comp_gate, in.idx_kv, in.idx_score);
        if (queries) {
            in.idx_q = ops.buffer(n * hp.n_idx_head * hp.idx_head_dim);
            in.idx_w = ops.buffer(n * hp.n_idx_head);
            ops.linear(L.idx_proj, XN, in.idx_w, n);
        }
    }
    ops.end_branch();
    ops.rms_norm(QA, L.attn_q_a_norm, QR, n, QL);
    ops.linear(L.attn_q_b, QR, Q, n);
    if (queries) ops.linear(L.idx_q_b, QR, in.idx_q, n);
    ops.join_branch();

    float *O = ops.buffer(n * H * D);
    ops.attention_core(il, in, n, O);

    // Grouped output: each group of heads through its own low-rank block, then one projection.
    float *LOW = ops.buffer(n * hp.n_out_group * hp.o_lora_rank);
    ops.linear_groups(L.attn_output_a, hp.n_out_group, O, LOW, n);
    ops.linear(L.attn_output_b, LOW, Y, n);
    ops.release(scratch);
}

}  // namespace ds4::runtime
