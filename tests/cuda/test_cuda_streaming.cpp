// Routed experts streamed on the CUDA backend (runtime/cuda/device_expert_tier.h): a device tier
// of slots fed by a host tier (the SSD-streaming cache) must give the resident CUDA run's logits
// bit for bit, at every device budget from the floor (one token's experts of one layer) to every
// expert, over a host tier that holds every expert, one that holds twice the floor (most gets
// then read the disk) and the file's own mapping (registered read-only), cold and preloaded, in
// prefill chunks (several rounds of experts a layer when the tier holds fewer than a chunk selects)
// and token by token, then in decode steps. The oracle is the resident CUDA backend, which
// test_cuda_model.cpp compares with the CPU; what this adds is that moving the bytes through slots
// changes nothing.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda_test_util.h"
#include "experts/fault_reader.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "tiny_session_model.h"

namespace ds4::cuda {
namespace {

using runtime::Backend;
using runtime::Model;
using runtime::ModelOptions;
using runtime::Session;

// The tiny shape with 32 experts a layer, 4 used (the CPU streaming tests' model), q2 experts.
const std::string &model_32_experts() {
    static std::string path;
    if (path.empty()) {
        model::HParams hp = model::shape_preset("tiny", 512);
        hp.n_expert = 32;
        hp.n_expert_used = 4;
        path = ::testing::TempDir() + "/cuda-stream-tiny-q2-32.gguf";
        ds4::test::write_made_up_model(hp, model::QuantMix::Q2, 13, path);
    }
    return path;
}

struct Trace {
    std::vector<std::vector<float>> logits;  // after each chunk, then each decode step
    std::vector<int32_t> decoded;
};

// A prompt in chunks, then `steps` decode steps: greedy, or (forced) the given tokens.
Trace run(Model &m, uint32_t chunk, int steps, const std::vector<int32_t> *forced) {
    const std::vector<int32_t> prompt = ds4::test::made_up_prompt(40);
    Session s(m, {.ctx = 256, .chunk = chunk});
    Trace t;
    for (size_t i = 0; i < prompt.size(); i += chunk) {
        const size_t n = std::min<size_t>(chunk, prompt.size() - i);
        t.logits.push_back(s.eval(std::span(prompt).subspan(i, n)));
    }
    for (int k = 0; k < steps; ++k) {
        const int32_t id = forced ? (*forced)[k] : runtime::argmax(s.logits());
        t.decoded.push_back(id);
        t.logits.push_back(s.eval(std::span(&id, 1)));
    }
    return t;
}

// host_slots 0: the host tier is the file's mapping (--ssd-streaming-host-cache mapped).
ModelOptions streamed(uint64_t device_slots, uint64_t host_slots, bool preload) {
    ModelOptions mo{.n_threads = 2, .backend = Backend::Cuda};
    mo.streaming.enabled = true;
    mo.streaming.host_tier = true;
    mo.streaming.host_mapped = host_slots == 0;
    mo.streaming.budget.experts = host_slots;
    mo.streaming.device.experts = device_slots;
    mo.streaming.preload = preload;
    return mo;
}

void expect_resident_bits(const std::string &path, uint32_t chunk) {
    auto resident = Model::load(path, {.n_threads = 2, .backend = Backend::Cuda});
    const model::HParams hp = resident->hparams();
    const int steps = 64;
    const Trace want = run(*resident, chunk, steps, nullptr);
    const uint64_t floor = hp.n_expert_used, total = uint64_t(hp.n_layer) * hp.n_expert;
    std::vector<uint64_t> device = {floor, floor + 1, 2 * floor, hp.n_expert, total / 2, total};
    std::sort(device.begin(), device.end());
    device.erase(std::unique(device.begin(), device.end()), device.end());
    for (uint64_t d : device)
        for (uint64_t h : {std::min(total, 2 * floor), total, uint64_t(0)})
            for (bool preload : {false, true}) {
                SCOPED_TRACE(testing::Message()
                             << path << ", chunk " << chunk << ", device tier " << d
                             << ", host tier " << (h ? std::to_string(h) : "mapped")
                             << (preload ? ", preloaded" : ", cold"));
                auto m = Model::load(path, streamed(d, h, preload));
                const Trace got = run(*m, chunk, steps, &want.decoded);
                ASSERT_EQ(got.logits.size(), want.logits.size());
                for (size_t i = 0; i < want.logits.size(); ++i)
                    ASSERT_EQ(got.logits[i], want.logits[i]) << "evaluation " << i;
                const auto st = m->device()->tier_stats();
                ASSERT_TRUE(st.has_value());
                EXPECT_EQ(st->slots, std::min(d, total));
                EXPECT_EQ(st->hits + st->misses, st->acquires);
                // Cold, the tier starts empty; preloaded, with the host tier's preload (all of
                // its slots, every expert when mapped; fewer than the 4096 cap here) as far as
                // it has room.
                EXPECT_EQ(st->preloaded, preload ? std::min({d, h ? h : total, total}) : 0u);
                if (h == 0) {
                    // The file's pages are pinned read-only where the device can (a failure
                    // would leave the bits but stage every transfer through the driver).
                    int read_only = 0;
                    ASSERT_EQ(cudaDeviceGetAttribute(&read_only,
                                                     cudaDevAttrHostRegisterReadOnlySupported, 0),
                              cudaSuccess);
                    if (read_only != 0) {
                        const std::vector<std::string> log = m->device()->tier_log();
                        EXPECT_TRUE(std::any_of(log.begin(), log.end(), [](const std::string &l) {
                            return l.find("pinned (read-only)") != std::string::npos;
                        }));
                    }
                }
                if (!preload) {
                    EXPECT_GT(st->misses, 0u);
                }
                if (!preload && d == total / 2 && hp.n_expert_used > 1) {
                    // Half of the experts in slots: some decode passes hit and miss both, and
                    // run their hits before the misses' uploads end.
                    EXPECT_GT(st->hits_first, 0u);
                }
                if (d == total) {
                    EXPECT_LE(st->misses, total) << "each expert uploaded once";
                }
            }
}

TEST(CudaStreaming, EveryDeviceBudgetGivesTheResidentBitsInChunks) {
    DS4_REQUIRE_CUDA_DEVICE();
    expect_resident_bits(ds4::test::tiny_model(model::QuantMix::Q2, 7), 16);
    expect_resident_bits(model_32_experts(), 16);
}

TEST(CudaStreaming, EveryDeviceBudgetGivesTheResidentBitsTokenByToken) {
    DS4_REQUIRE_CUDA_DEVICE();
    expect_resident_bits(model_32_experts(), 1);
}

// DS4_CUDA_HITS_FIRST=0 (read when a model's session starts): every pass one launch after its
// uploads, the same bits, and no pass counted as hits first.
TEST(CudaStreaming, HitsFirstOffGivesTheSameBits) {
    DS4_REQUIRE_CUDA_DEVICE();
    const std::string path = model_32_experts();
    auto resident = Model::load(path, {.n_threads = 2, .backend = Backend::Cuda});
    const model::HParams hp = resident->hparams();
    const Trace want = run(*resident, 1, 32, nullptr);
    const uint64_t half = uint64_t(hp.n_layer) * hp.n_expert / 2;
    for (const char *v : {"0", "1"}) {
        SCOPED_TRACE(testing::Message() << "DS4_CUDA_HITS_FIRST=" << v);
        ASSERT_EQ(setenv("DS4_CUDA_HITS_FIRST", v, 1), 0);
        auto m = Model::load(path, streamed(half, 0, false));
        const Trace got = run(*m, 1, 32, &want.decoded);
        unsetenv("DS4_CUDA_HITS_FIRST");
        ASSERT_EQ(got.logits.size(), want.logits.size());
        for (size_t i = 0; i < want.logits.size(); ++i)
            ASSERT_EQ(got.logits[i], want.logits[i]) << "evaluation " << i;
        const auto st = m->device()->tier_stats();
        ASSERT_TRUE(st.has_value());
        if (std::string(v) == "0")
            EXPECT_EQ(st->hits_first, 0u);
        else
            EXPECT_GT(st->hits_first, 0u);
    }
}

// The q4 mix's routed experts (Q4_K) go through the same slots.
TEST(CudaStreaming, Q4KExpertsGiveTheResidentBits) {
    DS4_REQUIRE_CUDA_DEVICE();
    expect_resident_bits(ds4::test::tiny_model(model::QuantMix::Q4, 7), 16);
}

// Faults of the host tier's reads on the GPU path (experts/fault_reader.h; each fires once): a
// read error or a file that ends early is a ds4::Error naming the layer and expert, after which
// the tier holds nothing half-filled or pinned, so a new session on the same model gives the
// resident bits; a short read is completed to the file's bytes.
TEST(CudaStreaming, HostTierFaultsAreClearErrorsAndTheModelGoesOn) {
    DS4_REQUIRE_CUDA_DEVICE();
    const std::string path = model_32_experts();
    auto resident = Model::load(path, {.n_threads = 2, .backend = Backend::Cuda});
    // In chunks of 16 (the prefill's rounds), and of 1: every token a one-token step, so the
    // faults then come between two captured segments (or their replays).
    const Trace want16 = run(*resident, 16, 16, nullptr), want1 = run(*resident, 1, 16, nullptr);
    const uint64_t floor = resident->hparams().n_expert_used;
    // Three raw reads an expert (gate, up, down): the first expert's up slab, and reads in later
    // rounds of the prefill (at 4 device and 8 host slots a 16-token chunk meets most of a
    // layer's 32 experts, in rounds of 4: hundreds of reads a chunk); token by token, a step
    // misses most of its 4 experts a layer, a few dozen reads a step.
    struct Case {
        uint32_t chunk;
        experts::FaultPlan plan;
    };
    for (const Case c : {Case{16, {experts::Fault::ReadError, 2, EIO}},
                         Case{16, {experts::Fault::ReadError, 200, EIO}},
                         Case{16, {experts::Fault::ShortThenEof, 150, EIO}},
                         Case{16, {experts::Fault::ShortOnce, 100, EIO}},
                         Case{1, {experts::Fault::ReadError, 300, EIO}},
                         Case{1, {experts::Fault::ShortThenEof, 400, EIO}},
                         Case{1, {experts::Fault::ShortOnce, 350, EIO}}}) {
        const experts::FaultPlan plan = c.plan;
        const Trace &want = c.chunk == 1 ? want1 : want16;
        SCOPED_TRACE(testing::Message() << "chunk " << c.chunk << ", fault " << int(plan.fault)
                                        << " at read " << plan.nth);
        ModelOptions mo = streamed(floor, 2 * floor, false);
        mo.streaming.make_reader = [plan](int fd) {
            return std::make_unique<experts::FaultReader>(fd, plan);
        };
        auto m = Model::load(path, mo);
        std::string err;
        Trace got;
        try {
            got = run(*m, c.chunk, 16, &want.decoded);
        } catch (const Error &e) {
            err = e.what();
        }
        if (plan.fault == experts::Fault::ShortOnce) {
            EXPECT_EQ(err, "");
        } else {
            EXPECT_NE(err.find(path), std::string::npos) << err;
            EXPECT_NE(err.find("layer "), std::string::npos) << err;
            EXPECT_NE(err.find(plan.fault == experts::Fault::ReadError ? "Input/output error"
                                                                       : "ended after"),
                      std::string::npos)
                << err;
            got = run(*m, c.chunk, 16, &want.decoded);  // a new session: the fault fired once
        }
        ASSERT_EQ(got.logits.size(), want.logits.size());
        for (size_t i = 0; i < want.logits.size(); ++i)
            ASSERT_EQ(got.logits[i], want.logits[i]) << "evaluation " << i;
        const auto st = m->device()->tier_stats();
        ASSERT_TRUE(st.has_value());
        EXPECT_EQ(st->hits + st->misses, st->acquires);
    }
}

// A streamed decode step is captured in n_layer + 1 segments at the first step and replayed after
// (DS4_CUDA_GRAPH_NODES makes the session's end say so), with the resident bits.
TEST(CudaStreaming, DecodeStepsReplayCapturedSegments) {
    DS4_REQUIRE_CUDA_DEVICE();
    const std::string path = model_32_experts();
    auto resident = Model::load(path, {.n_threads = 2, .backend = Backend::Cuda});
    const model::HParams hp = resident->hparams();
    const int steps = 16;
    const Trace want = run(*resident, 16, steps, nullptr);
    auto m = Model::load(path, streamed(2 * hp.n_expert_used, 0, true));
    ::setenv("DS4_CUDA_GRAPH_NODES", "1", 1);
    testing::internal::CaptureStderr();
    const Trace got = run(*m, 16, steps, &want.decoded);  // its session ends inside
    const std::string err = testing::internal::GetCapturedStderr();
    ::unsetenv("DS4_CUDA_GRAPH_NODES");
    ASSERT_EQ(got.logits.size(), want.logits.size());
    for (size_t i = 0; i < want.logits.size(); ++i)
        ASSERT_EQ(got.logits[i], want.logits[i]) << "evaluation " << i;
    EXPECT_NE(err.find(fmt::format("CUDA decode graph: {} segments", hp.n_layer + 1)),
              std::string::npos)
        << err;
    EXPECT_NE(err.find(fmt::format("replayed {} times", steps - 1)), std::string::npos) << err;
}

// Formats the routed kernels do not read through an expert table are refused with the reason.
TEST(CudaStreaming, DenseExpertFormatsAreRefused) {
    DS4_REQUIRE_CUDA_DEVICE();
    try {
        (void)Model::load(ds4::test::tiny_model(model::QuantMix::Q8_0, 7), streamed(4, 8, false));
        FAIL() << "Q8_0 experts were streamed";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("IQ2_XXS, Q2_K or Q4_K"), std::string::npos)
            << e.what();
    }
}

// A device tier given as a size below the floor is refused by the upload, naming the floor.
TEST(CudaStreaming, ASizeBelowTheFloorIsRefused) {
    DS4_REQUIRE_CUDA_DEVICE();
    ModelOptions mo = streamed(0, 8, false);
    mo.streaming.device.bytes = 1024;
    try {
        (void)Model::load(ds4::test::tiny_model(model::QuantMix::Q2, 7), mo);
        FAIL() << "a 1 KiB device tier was accepted";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("below the floor of 2"), std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace ds4::cuda
