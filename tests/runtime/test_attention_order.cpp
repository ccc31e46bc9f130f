// The model order's attention sublayer (runtime/attention.cpp) against a recording backend: the
// indexer's query projections (idx_q_b, idx_proj) are computed exactly when a token of the batch
// sees more compressed rows than the indexer keeps, (p + 1) / ratio > top_k, and always for one
// token when the backend replays one captured step at every position. (That skipping them
// changes no output is what the whole-model tests check: transformers' and llama.cpp's logits
// on prompts that cross the threshold.)
#include <gtest/gtest.h>

#include <deque>
#include <string>
#include <vector>

#include "runtime/attention.h"
#include "runtime/ops.h"
#include "runtime/session.h"
#include "tiny_session_model.h"

namespace ds4::runtime {
namespace {

// Records the weights of every linear product; every other operation does nothing.
class RecordingOps final : public Ops {
  public:
    RecordingOps(int64_t n_past, bool replays) : n_past_(n_past), replays_(replays) {}
    std::vector<std::string> linears;

    uint32_t ctx() const override { return 1 << 20; }
    int64_t n_past() const override { return n_past_; }
    bool replays_steps() const override { return replays_; }
    void begin_batch(std::span<const int32_t>) override {}
    float *buffer(size_t n) override { return buffers_.emplace_back(n).data(); }
    size_t mark() const override { return buffers_.size(); }
    void release(size_t mark) override { buffers_.resize(mark); }
    void end_batch() override {}
    void embed(float *) override {}
    void linear(model::Tensor w, const float *, float *, int64_t) override {
        linears.push_back(w->name);
    }
    void linear_groups(model::Tensor w, uint32_t, const float *, float *, int64_t) override {
        linears.push_back(w->name);
    }
    void rms_norm(const float *, model::Tensor, float *, int64_t, int64_t) override {}
    void hc_pre(const HcWeights &, const float *, int64_t, float *, float *) override {}
    void hc_post(const float *, const float *, int64_t, float *) override {}
    void hc_head(const float *, float *) override {}
    void attention_core(uint32_t, const AttentionInputs &in, int64_t, float *) override {
        queries = in.idx_q != nullptr && in.idx_w != nullptr;
    }
    void moe_routed(uint32_t, const float *, const float *, int64_t, float *) override {}
    void swiglu(float *, const float *, int64_t, int64_t, float) override {}
    void moe_sum(const float *, const float *, int64_t, float *) override {}
    void read(const float *, size_t, float *) override {}
    void write(const float *, size_t, float *) override {}
    std::shared_ptr<const BackendState> save() const override { return nullptr; }
    void restore(const BackendState &) override {}
    size_t kv_bytes() const override { return 0; }

    bool queries = false;  // what attention_core was given

  private:
    int64_t n_past_;
    bool replays_;
    std::deque<std::vector<float>> buffers_;
};

TEST(AttentionOrder, IndexerQueriesOnlyWhereATokenSelects) {
    auto model = Model::load(ds4::test::tiny_session_model(3));
    const model::HParams &hp = model->hparams();
    uint32_t il = 0;  // the first layer with the indexer
    while (hp.attention_kind(il) != model::AttentionKind::Overlapped) ++il;
    const uint32_t r = hp.compress_ratio[il], k = hp.idx_top_k;
    // A batch ending at position p = n_past + n - 1 selects iff (p + 1) / r > k.
    const int64_t edge = int64_t(r) * (k + 1);  // the first n_past + n that selects
    struct Case {
        int64_t n_past, n;
        bool replays, want;
    };
    for (const Case c : {Case{0, edge - 1, false, false}, Case{0, edge, false, true},
                         Case{edge - 2, 1, false, false}, Case{edge - 1, 1, false, true},
                         Case{edge - 2, 1, true, true}, Case{0, edge - 1, true, false},
                         Case{3 * edge, 7, false, true}}) {
        RecordingOps ops(c.n_past, c.replays);
        std::vector<float> XN(size_t(c.n) * hp.n_embd), Y(XN.size());
        attention_sublayer(ops, hp, model->weights().layers[il], il, XN.data(), c.n, Y.data());
        int projections = 0;
        for (const std::string &name : ops.linears)
            if (name.find("indexer.attn_q_b") != std::string::npos ||
                name.find("indexer.proj") != std::string::npos)
                ++projections;
        EXPECT_EQ(projections, c.want ? 2 : 0)
            << "n_past " << c.n_past << ", " << c.n << " tokens, replays " << c.replays;
        EXPECT_EQ(ops.queries, c.want) << "n_past " << c.n_past << ", " << c.n << " tokens";
        EXPECT_GE(ops.linears.size(), 6u);  // q_a, q_b, kv, the compressors, the output
    }
}

}  // namespace
}  // namespace ds4::runtime
