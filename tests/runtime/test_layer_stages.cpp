// Sessions whose layers are split into ranges, each run by its own CPU backend instance holding
// the attention state of its layers only (runtime/layer_stages.h), against the same session
// unsplit, on the tiny synthetic model (6 layers: window 8, ratios 0, 0, 4, 16, 4, 16). The
// unsplit session is the one checked against transformers and llama.cpp; a split adds only the
// hand-over of the token states between ranges, so its logits must be the same bits at every
// step, for prefill chunks and decode, through saves, rewinds and serialised states, whatever
// the split. This is also what the CUDA backend's split over several GPUs is held to.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "runtime/cpu_ops.h"
#include "runtime/forward.h"
#include "runtime/layer_stages.h"
#include "runtime/session.h"
#include "session_bytes.h"
#include "tiny_session_model.h"

using namespace ds4;
using namespace ds4::runtime;
using ds4::test::read_into;
using ds4::test::state_of;

namespace {

std::unique_ptr<Model> load_tiny(std::vector<uint32_t> starts) {
    return Model::load(test::tiny_session_model(11),
                       {.n_threads = 2, .layer_starts = std::move(starts)});
}

// Every buffer filled with NaN when taken: a stage that read a value nobody wrote (the handed
// states among them) would turn the logits to NaN.
SessionOptions opts(uint32_t chunk) {
    SessionOptions o{.ctx = 128, .chunk = chunk};
    o.forward.buffer_fill = std::numeric_limits<float>::quiet_NaN();
    return o;
}

const std::vector<std::vector<uint32_t>> kSplits = {
    {1}, {2}, {3}, {5}, {1, 4}, {2, 3, 4}, {1, 2, 3, 4, 5}};

TEST(LayerStages, SplitLayersMakesConsecutiveRangesAndRefusesBadStarts) {
    const std::vector<uint32_t> none, two = {2, 5};
    ASSERT_EQ(split_layers(6, none).size(), 1u);
    EXPECT_EQ(split_layers(6, none)[0], (LayerRange{0, 6}));
    const auto r = split_layers(6, two);
    ASSERT_EQ(r.size(), 3u);
    EXPECT_EQ(r[0], (LayerRange{0, 2}));
    EXPECT_EQ(r[1], (LayerRange{2, 5}));
    EXPECT_EQ(r[2], (LayerRange{5, 6}));
    for (const std::vector<uint32_t> &bad :
         std::vector<std::vector<uint32_t>>{{0}, {6}, {7}, {3, 3}, {4, 2}}) {
        try {
            split_layers(6, bad);
            ADD_FAILURE() << "accepted a split at " << bad[0];
        } catch (const Error &e) {
            EXPECT_NE(std::string(e.what()).find("layer split at"), std::string::npos) << e.what();
        }
    }
    EXPECT_THROW(load_tiny({6}), Error);
}

TEST(LayerStages, EverySplitGivesTheUnsplitLogitsBitForBit) {
    auto whole = load_tiny({});
    const auto prompt = test::made_up_prompt(41);  // crosses the window, both ratios, the indexer
    const std::vector<int32_t> more = {3, 141, 59, 26, 5, 358, 97, 93, 238, 462};
    for (uint32_t chunk : {1u, 7u, 64u}) {
        Session ref(*whole, opts(chunk));
        std::vector<std::vector<float>> want{ref.eval(prompt)};
        for (int32_t t : more) want.push_back(ref.eval(std::span(&t, 1)));
        const size_t payload = ref.save().state->payload_bytes();
        for (const auto &starts : kSplits) {
            auto split = load_tiny(starts);
            ASSERT_EQ(split->layer_ranges().size(), starts.size() + 1);
            Session s(*split, opts(chunk));
            EXPECT_EQ(s.kv_bytes(), ref.kv_bytes());
            ASSERT_EQ(s.eval(prompt), want[0]) << "chunk " << chunk << ", split at " << starts[0];
            for (size_t i = 0; i < more.size(); ++i)
                ASSERT_EQ(s.eval(std::span(&more[i], 1)), want[i + 1])
                    << "chunk " << chunk << ", split at " << starts[0] << ", decode step " << i;
            // A snapshot's bytes (ds4-bench's kvcache_bytes) are the unsplit session's.
            EXPECT_EQ(s.save().state->payload_bytes(), payload);
        }
    }
}

TEST(LayerStages, SnapshotsAndRewindsOfASplitSession) {
    auto whole = load_tiny({}), split = load_tiny({2, 4});
    const auto prompt = test::made_up_prompt(30), next = test::made_up_prompt(9, 13, 1);
    Session ref(*whole, opts(8));
    ref.eval(prompt);
    const std::vector<float> want = ref.eval(next);

    SessionOptions o = opts(8);
    o.rewind_interval = 10;
    Session s(*split, o);
    s.eval(prompt);
    const Session::Snapshot snap = s.save();
    // Past the rewind point at 30 and back, then the same continuation.
    s.eval(test::made_up_prompt(12, 5, 3));
    ASSERT_EQ(s.rewind(30), 30u);
    EXPECT_EQ(s.eval(next), want);
    // The snapshot at 30 restored after other tokens.
    s.eval(test::made_up_prompt(7, 3, 8));
    s.restore(snap);
    EXPECT_EQ(s.eval(next), want);
    // A snapshot of an unsplit session is refused, the session left as it was.
    Session other(*whole, opts(8));
    EXPECT_THROW(s.restore(other.save()), Error);
    EXPECT_EQ(s.tokens().size(), 39u);
}

// Rows stored as f16 (the default) and as f32: the state's header says which.
class LayerStagesState : public ::testing::TestWithParam<int> {};

TEST_P(LayerStagesState, SerialisedStatesLoadAcrossSplits) {
    auto whole = load_tiny({}), a = load_tiny({2}), b = load_tiny({1, 3, 5});
    const auto prompt = test::made_up_prompt(41), next = test::made_up_prompt(11, 29, 7);
    SessionOptions o = opts(16);
    o.f16_rows = GetParam();
    Session ref(*whole, o);
    ref.eval(prompt);
    const std::string bytes = state_of(ref);
    const std::vector<float> want = ref.eval(next);

    // Written unsplit, read split; written split, the same bytes as unsplit, read otherwise split.
    Session sa(*a, o), sb(*b, o);
    read_into(sa, bytes);
    EXPECT_EQ(state_of(sa), bytes);
    read_into(sb, state_of(sa));
    EXPECT_EQ(sa.eval(next), want);
    EXPECT_EQ(sb.eval(next), want);

    // Bytes cut short are refused and every stage is left as it was.
    Session sc(*b, o);
    sc.eval(prompt);
    const std::string before = state_of(sc);
    EXPECT_THROW(read_into(sc, bytes.substr(0, bytes.size() - 100)), Error);
    EXPECT_EQ(state_of(sc), before);
    EXPECT_EQ(sc.eval(next), want);

    // The other row format is refused.
    SessionOptions other = o;
    other.f16_rows = 1 - GetParam();
    Session sd(*b, other);
    EXPECT_THROW(read_into(sd, bytes), Error);
}

INSTANTIATE_TEST_SUITE_P(Rows, LayerStagesState, ::testing::Values(1, 0),
                         [](const auto &info) { return info.param ? "f16" : "f32"; });

// The model order refuses to run stages that hold different positions (what an evaluation that
// failed half-way would leave) rather than attend over states of different lengths.
TEST(LayerStages, StagesOutOfStepAreRefused) {
    auto m = load_tiny({});
    const model::HParams &hp = m->hparams();
    const ForwardOptions fo;
    std::vector<Stage> split(2);
    split[0] = {std::make_unique<CpuOps>(hp, m->weights(), m->pool(), m->experts(), fo, 64, true,
                                         LayerRange{0, 3}),
                {0, 3}};
    split[1] = {std::make_unique<CpuOps>(hp, m->weights(), m->pool(), m->experts(), fo, 64, true,
                                         LayerRange{3, hp.n_layer}),
                {3, hp.n_layer}};
    std::vector<float> logits;
    const auto prompt = test::made_up_prompt(5);
    forward(std::span(split.data(), 1), hp, m->weights(), prompt, logits);  // the first only
    try {
        forward(split, hp, m->weights(), prompt, logits);
        ADD_FAILURE() << "ran stages out of step";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("rewind"), std::string::npos) << e.what();
    }
}

}  // namespace
