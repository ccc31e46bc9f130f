// The model split by tensors (runtime/tensor_shards.h, forward_tensor_split): each rank holds its
// heads, output groups, expert hidden columns and vocabulary rows (the plan of
// runtime/gpu_placement.h) and computes its part of every sublayer; the parts' outputs added are
// the sublayer's output. Checked on the CPU against the unsplit model (itself checked against
// transformers and llama.cpp): the split changes only the order of the additions of each output
// projection, so
//   - f32 weights, QAT off (no activation rounding): logits within 1e-5 of the largest, in
//     prefill chunks and decode steps (measured below that);
//   - the trained tiny model (q8_0, QAT on, its default), whose margins are a trained model's:
//     the same greedy tokens for 48 steps and the same top-1 at every prompt position. (Random
//     quantized models are not compared: a one-ulp change moves their quantized activations by a
//     step, test_cuda_model.cpp says why.)
// And the parts' bytes are the plan's; a rank that would get none of a tensor is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "experts/expert_source.h"
#include "runtime/cpu_ops.h"
#include "runtime/forward.h"
#include "runtime/gpu_placement.h"
#include "runtime/session.h"
#include "runtime/tensor_shards.h"
#include "tiny_session_model.h"

using namespace ds4;
using namespace ds4::runtime;

namespace {

constexpr uint32_t kCtx = 256;

// A model split over n ranks on the CPU, and the same model whole, one session each.
class Split {
  public:
    Split(Model &m, uint32_t n, ForwardOptions fo) : m_(m) {
        const model::HParams &hp = m.hparams();
        plan_ = plan_gpu_placement(hp, m.weights(), GpuSplit::Tensors, n, kCtx, 64);
        for (uint32_t r = 0; r < n; ++r) {
            shards_.push_back(std::make_unique<TensorShard>(hp, m.weights(), plan_, r));
            const TensorShard &s = *shards_.back();
            sources_.push_back(experts::make_resident_source(s.weights()));
            ops_.push_back(std::make_unique<CpuOps>(s.hparams(), s.weights(), m.pool(),
                                                    *sources_.back(), fo, kCtx, fo.qat_sim));
            ranks_.push_back({ops_.back().get(), &s.hparams(), &s.weights(), s.vocab_begin()});
        }
        whole_.resize(1);
        whole_[0] = {
            std::make_unique<CpuOps>(hp, m.weights(), m.pool(), m.experts(), fo, kCtx, fo.qat_sim),
            {0, hp.n_layer}};
    }
    // The logits of the split and the whole model after `tokens`.
    std::pair<std::vector<float>, std::vector<float>> eval(std::span<const int32_t> tokens) {
        std::vector<float> a, b;
        forward_tensor_split(ranks_, m_.hparams(), tokens, a);
        forward(whole_, m_.hparams(), m_.weights(), tokens, b);
        return {a, b};
    }
    const GpuPlacement &plan() const { return plan_; }
    const TensorShard &shard(size_t r) const { return *shards_[r]; }

  private:
    Model &m_;
    GpuPlacement plan_;
    std::vector<std::unique_ptr<TensorShard>> shards_;
    std::vector<std::unique_ptr<experts::ExpertSource>> sources_;
    std::vector<std::unique_ptr<Ops>> ops_;
    std::vector<TensorRank> ranks_;
    std::vector<Stage> whole_;
};

double rel_diff(const std::vector<float> &a, const std::vector<float> &b) {
    double d = 0, m = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
        d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
        m = std::max(m, std::fabs(double(b[i])));
    }
    return d / std::max(m, 1e-30);
}

int32_t argmax(const std::vector<float> &v) {
    return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

TEST(TensorSplit, F32LogitsFollowTheWholeModel) {
    auto m = Model::load(test::tiny_model(model::QuantMix::F32, 7), {.n_threads = 2});
    const ForwardOptions fo{.qat_sim = false};
    Split s(*m, 2, fo);
    const auto prompt = test::made_up_prompt(53);  // the window, both ratios, the indexer
    double worst = 0;
    for (size_t i = 0; i < prompt.size(); i += 16) {
        const auto [a, b] =
            s.eval(std::span(prompt).subspan(i, std::min<size_t>(16, prompt.size() - i)));
        worst = std::max(worst, rel_diff(a, b));
    }
    for (int step = 0; step < 16; ++step) {
        const int32_t t = int32_t(step * 37 % 512);
        const auto [a, b] = s.eval(std::span(&t, 1));
        worst = std::max(worst, rel_diff(a, b));
    }
    EXPECT_LE(worst, 1e-5);
    EXPECT_GT(worst, 0.0) << "the additions' order changed nothing: is the model split at all?";
    std::printf("max |split - whole| / max |whole|: %.3g\n", worst);
}

TEST(TensorSplit, TrainedModelGivesTheWholeModelsGreedyTokens) {
    auto m = Model::load(std::string(DS4_SOURCE_DIR) + "/models/promessi-mini-q8_0.gguf",
                         {.n_threads = 2});
    Split s(*m, 2, ForwardOptions{});
    const auto prompt = test::made_up_prompt(40, 101, 7);
    // Token by token through the prompt: the top-1 at every position.
    std::vector<float> last;
    for (size_t i = 0; i < prompt.size(); ++i) {
        const auto [a, b] = s.eval(std::span(&prompt[i], 1));
        ASSERT_EQ(argmax(a), argmax(b)) << "prompt position " << i;
        last = b;
    }
    for (int step = 0; step < 48; ++step) {
        const int32_t t = argmax(last);
        const auto [a, b] = s.eval(std::span(&t, 1));
        ASSERT_EQ(argmax(a), argmax(b)) << "greedy step " << step;
        last = b;
    }
}

TEST(TensorSplit, PartsHoldThePlansBytes) {
    auto m = Model::load(test::tiny_model(model::QuantMix::Q8_0, 7), {.n_threads = 2});
    Split s(*m, 2, ForwardOptions{});
    for (size_t r = 0; r < 2; ++r) {
        const TensorShard &p = s.shard(r);
        EXPECT_EQ(p.shard_bytes() + p.whole_bytes(), s.plan().gpus[r].weight_bytes) << r;
        EXPECT_EQ(p.whole_bytes(), s.plan().gpus[r].replicated_bytes) << r;
        EXPECT_EQ(p.hparams().n_head, m->hparams().n_head / 2);
        EXPECT_EQ(p.hparams().n_out_group, m->hparams().n_out_group / 2);
        EXPECT_EQ(p.hparams().n_ff_exp, m->hparams().n_ff_exp / 2);
    }
    EXPECT_EQ(s.shard(0).vocab_begin(), 0u);
    EXPECT_EQ(s.shard(0).vocab_end(), s.shard(1).vocab_begin());
    EXPECT_EQ(s.shard(1).vocab_end(), m->hparams().n_vocab);
}

TEST(TensorSplit, MoreRanksThanHeadGroupsAreRefused) {
    auto m = Model::load(test::tiny_model(model::QuantMix::Q8_0, 7), {.n_threads = 2});
    const GpuPlacement plan =
        plan_gpu_placement(m->hparams(), m->weights(), GpuSplit::Tensors, 3, kCtx, 64);
    try {  // 2 output groups over 3 ranks: one gets none
        for (uint32_t r = 0; r < 3; ++r) TensorShard(m->hparams(), m->weights(), plan, r);
        ADD_FAILURE() << "a rank with no heads was accepted";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("gets none of"), std::string::npos) << e.what();
    }
}

}  // namespace

namespace {

std::unique_ptr<Model> load_promessi(uint32_t ranks) {
    ModelOptions o{.n_threads = 2};
    if (ranks) {
        o.split = GpuSplit::Tensors;
        o.tensor_ranks = ranks;
    }
    return Model::load(std::string(DS4_SOURCE_DIR) + "/models/promessi-mini-q8_0.gguf", o);
}

// Through the session API (ModelOptions::split, tensor_ranks): prefill in chunks, greedy decode,
// rewind points and the serialised state.
TEST(TensorSplit, SessionsOverParts) {
    auto whole = load_promessi(0), split = load_promessi(2);
    ASSERT_TRUE(split->tensor_split());
    ASSERT_EQ(split->layer_ranges().size(), 2u);
    const SessionOptions so{.ctx = 256, .chunk = 16, .rewind_interval = 16};
    Session a(*whole, so), b(*split, so);
    const auto prompt = test::made_up_prompt(40, 101, 7);
    EXPECT_EQ(argmax(a.eval(prompt)), argmax(b.eval(prompt)));
    EXPECT_EQ(b.kv_bytes(), 2 * a.kv_bytes());  // each part holds the attention state
    EXPECT_EQ(Session::kv_bytes_for(*split, so), b.kv_bytes());  // what the tools check first
    EXPECT_EQ(Session::kv_bytes_for(*whole, so), a.kv_bytes());
    for (int step = 0; step < 24; ++step) {
        const int32_t t = argmax(a.logits());
        ASSERT_EQ(argmax(a.eval(std::span(&t, 1))), argmax(b.eval(std::span(&t, 1))))
            << "greedy step " << step;
    }
    // The split session's state, read into a fresh split session, continues with the same bits;
    // after a rewind, the same tokens give the same bits again.
    std::stringstream bytes;
    b.write_state(bytes);
    Session c(*split, so);
    c.read_state(bytes);
    const std::vector<int32_t> more = {5, 77, 300, 12};
    const std::vector<float> want = b.eval(more);
    EXPECT_EQ(c.eval(more), want);
    ASSERT_EQ(b.rewind(b.tokens().size() - 4), b.tokens().size() - 4);
    EXPECT_EQ(b.eval(more), want);
}

TEST(TensorSplit, BadOptionsAreRefused) {
    const std::string path = std::string(DS4_SOURCE_DIR) + "/models/promessi-mini-q8_0.gguf";
    ModelOptions one_rank, with_layers, ranks_alone;
    one_rank.split = with_layers.split = GpuSplit::Tensors;
    one_rank.tensor_ranks = 1;
    with_layers.tensor_ranks = ranks_alone.tensor_ranks = 2;
    with_layers.layer_starts = {2};
    for (const ModelOptions *o : {&one_rank, &with_layers, &ranks_alone})
        EXPECT_THROW(Model::load(path, *o), Error);
}

}  // namespace
