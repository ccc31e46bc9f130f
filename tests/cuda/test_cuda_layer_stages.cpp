// A CUDA model whose layers are split into ranges (runtime/layer_stages.h, ModelOptions::gpus),
// against the same model unsplit on one device: the split only hands the token states from one
// range's session to the next (through host memory), so the logits must be the same bits, in
// prefill chunks and in decode steps replayed as CUDA graphs (the hand-over's copy is captured),
// through rewinds and serialised states. On one GPU both ranges go to device 0 (what the
// one-GPU device kinds can run); with two or more GPUs the planned split over devices 0 and 1 is
// checked too (the same kernels on the same GPU model give the same bits).
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "runtime/session.h"
#include "tiny_session_model.h"

namespace ds4::cuda {
namespace {

using runtime::Backend;
using runtime::Model;
using runtime::ModelOptions;
using runtime::Session;
using runtime::SessionOptions;

int device_count() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::unique_ptr<Model> load(std::vector<int> gpus, std::vector<uint32_t> starts) {
    ModelOptions o{.n_threads = 2, .backend = Backend::Cuda};
    o.gpus = std::move(gpus);
    o.layer_starts = std::move(starts);
    o.plan_ctx = 256;
    return Model::load(ds4::test::tiny_model(model::QuantMix::Q2, 7), o);
}

// The logits after the prompt (in chunks of 16) and after each of 12 greedy decode steps.
std::vector<std::vector<float>> run(Model &m) {
    Session s(m, {.ctx = 256, .chunk = 16});
    std::vector<std::vector<float>> out{s.eval(ds4::test::made_up_prompt(53))};
    for (int i = 0; i < 12; ++i) {
        const auto &l = out.back();
        const int32_t t = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
        out.push_back(s.eval(std::vector<int32_t>{t}));
    }
    return out;
}

void expect_same(const std::vector<std::vector<float>> &want,
                 const std::vector<std::vector<float>> &got, const std::string &what) {
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(want[i], got[i]) << what << ", eval " << i;
}

TEST(CudaLayerStages, TwoRangesOnOneDeviceGiveTheUnsplitBits) {
    DS4_REQUIRE_CUDA_DEVICE();
    auto whole = load({}, {});
    const auto want = run(*whole);
    for (const std::vector<uint32_t> &starts : std::vector<std::vector<uint32_t>>{{1}, {3}, {5}}) {
        auto split = load({0, 0}, starts);
        ASSERT_EQ(split->layer_ranges().size(), 2u);
        expect_same(want, run(*split), "split at " + std::to_string(starts[0]));
    }
    auto three = load({0, 0, 0}, {2, 4});
    expect_same(want, run(*three), "three ranges");
}

TEST(CudaLayerStages, RewindsAndStatesOfASplitModel) {
    DS4_REQUIRE_CUDA_DEVICE();
    auto whole = load({}, {}), split = load({0, 0}, {3});
    const auto prompt = ds4::test::made_up_prompt(40), next = ds4::test::made_up_prompt(9, 13, 1);
    Session ref(*whole, {.ctx = 256, .chunk = 16});
    ref.eval(prompt);
    std::stringstream bytes;
    ref.write_state(bytes);
    const std::vector<float> want = ref.eval(next);

    SessionOptions o{.ctx = 256, .chunk = 16, .rewind_interval = 20};
    Session s(*split, o);
    s.eval(prompt);
    s.eval(ds4::test::made_up_prompt(7, 5, 3));
    ASSERT_EQ(s.rewind(40), 40u);
    EXPECT_EQ(s.eval(next), want);
    // The unsplit session's state read into the split one, and the split one's written again:
    // the same bytes.
    Session t(*split, {.ctx = 256, .chunk = 16});
    t.read_state(bytes);
    std::stringstream again;
    t.write_state(again);
    EXPECT_EQ(again.str(), bytes.str());
    EXPECT_EQ(t.eval(next), want);
}

TEST(CudaLayerStages, PlannedSplitOverTwoDevices) {
    DS4_REQUIRE_CUDA_DEVICE();
    if (device_count() < 2) GTEST_SKIP() << "one CUDA device: the split over two needs two";
    auto whole = load({}, {}), split = load({0, 1}, {});
    ASSERT_EQ(split->layer_ranges().size(), 2u);
    EXPECT_EQ(split->placement_log().size(), 2u);
    expect_same(run(*whole), run(*split), "devices 0 and 1");
}

// The split by tensors (runtime/tensor_shards.h) on the trained tiny model, both parts on device
// 0: each sublayer's partial outputs added through host memory (a decode step's graph then ends
// at the first sum, the rest launched eagerly). The additions' order differs from the whole
// model's, so the check is the trained model's: the same top-1 at every prompt position and the
// same greedy tokens.
TEST(CudaLayerStages, TensorSplitOnOneDeviceGivesTheGreedyTokens) {
    DS4_REQUIRE_CUDA_DEVICE();
    const std::string path = std::string(DS4_SOURCE_DIR) + "/models/promessi-mini-q8_0.gguf";
    auto whole = Model::load(path, {.n_threads = 2, .backend = Backend::Cuda});
    ModelOptions o{.n_threads = 2, .backend = Backend::Cuda};
    o.gpus = {0, 0};
    o.split = runtime::GpuSplit::Tensors;
    auto split = Model::load(path, o);
    ASSERT_TRUE(split->tensor_split());
    EXPECT_EQ(split->placement_log().size(), 2u);
    auto top1 = [](const std::vector<float> &l) {
        return int32_t(std::max_element(l.begin(), l.end()) - l.begin());
    };
    Session a(*whole, {.ctx = 256, .chunk = 1}), b(*split, {.ctx = 256, .chunk = 1});
    for (int32_t t : ds4::test::made_up_prompt(40, 101, 7))
        ASSERT_EQ(top1(a.eval(std::vector<int32_t>{t})), top1(b.eval(std::vector<int32_t>{t})));
    for (int step = 0; step < 32; ++step) {
        const int32_t t = top1(a.logits());
        ASSERT_EQ(top1(a.eval(std::vector<int32_t>{t})), top1(b.eval(std::vector<int32_t>{t})))
            << "greedy step " << step;
    }
}

TEST(CudaLayerStages, ADeviceThatDoesNotExistIsRefused) {
    DS4_REQUIRE_CUDA_DEVICE();
    try {
        load({0, 1000}, {3});
        ADD_FAILURE() << "loaded onto device 1000";
    } catch (const runtime::BackendUnavailable &e) {
        EXPECT_NE(std::string(e.what()).find("device 1000 does not exist"), std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace ds4::cuda
