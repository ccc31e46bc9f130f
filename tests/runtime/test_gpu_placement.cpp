// The multi-GPU placement plan (runtime/gpu_placement.h) on the published Flash layouts, built in
// memory: every tensor held once (layers) or cut into shards that cover it exactly (tensors), the
// byte totals of docs/MODEL.md Appendix A, the layer ranges against an exhaustive search, uneven
// splits, the fit check and its message, and the attention state against the CPU cache's own
// allocation.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "../model_loading/in_memory_model.h"
#include "common/error.h"
#include "model/synthetic_model.h"
#include "runtime/gpu_placement.h"
#include "runtime/kv_cache.h"

using namespace ds4;
using namespace ds4::runtime;

namespace {

constexpr uint64_t kQ2Bytes = 86714775900ull, kQ4Bytes = 164628167004ull;  // docs/MODEL.md A
constexpr uint64_t kGiB = 1ull << 30;

struct Flash {
    test::InMemoryModel q2, q4;
    Flash() {
        const model::HParams hp = model::shape_preset("flash", 129280);
        test::build_in_memory(q2, hp, GgmlType::IQ2_XXS, GgmlType::Q2_K);
        test::build_in_memory(q4, hp, GgmlType::Q4_K, GgmlType::Q4_K);
    }
};
const Flash &flash() {
    static const Flash f;
    return f;
}

uint64_t weight_total(const GpuPlacement &p) {
    uint64_t b = 0;
    for (const GpuShare &g : p.gpus) b += g.weight_bytes;
    return b;
}

uint64_t largest_share(const GpuPlacement &p) {
    uint64_t m = 0;
    for (const GpuShare &g : p.gpus) m = std::max(m, g.total());
    return m;
}

// The weights and state of layers [a, b) of a plan made for one GPU, which holds everything.
struct LayerCosts {
    std::vector<uint64_t> layer;   // weights + state
    uint64_t first = 0, last = 0;  // the embedding; the output side
};
LayerCosts layer_costs(const test::InMemoryModel &m, uint32_t ctx) {
    const GpuPlacement one = plan_gpu_placement(m.hp, m.w, GpuSplit::Layers, 1, ctx, 1);
    LayerCosts c;
    c.layer.assign(m.hp.n_layer, 0);
    for (uint32_t il = 0; il < m.hp.n_layer; ++il)
        c.layer[il] = layer_state_bytes(m.hp, il, m.hp.sliding_window, ctx, 4);
    for (const TensorPlacement &t : one.tensors) {
        if (t.layer >= 0)
            c.layer[size_t(t.layer)] += t.bytes;
        else if (t.name == "token_embd.weight")
            c.first += t.bytes;
        else
            c.last += t.bytes;
    }
    return c;
}

TEST(GpuPlacement, LayerSplitHoldsEveryTensorOnceInContiguousRanges) {
    for (const test::InMemoryModel *m : {&flash().q2, &flash().q4})
        for (uint32_t n : {1u, 2u, 3u, 4u, 8u, 43u}) {
            const GpuPlacement p = plan_gpu_placement(m->hp, m->w, GpuSplit::Layers, n, 65536, 1);
            ASSERT_EQ(p.gpus.size(), n);
            EXPECT_EQ(weight_total(p), m == &flash().q2 ? kQ2Bytes : kQ4Bytes) << n;
            uint32_t next = 0;
            for (const GpuShare &g : p.gpus) {
                EXPECT_EQ(g.first_layer, next) << n;
                EXPECT_GT(g.end_layer, g.first_layer) << n << ": a GPU without layers";
                next = g.end_layer;
            }
            EXPECT_EQ(next, m->hp.n_layer);
            for (const TensorPlacement &t : p.tensors) {
                uint32_t holders = 0, holder = 0;
                for (uint32_t g = 0; g < n; ++g)
                    if (t.gpu_bytes[g] != 0) ++holders, holder = g;
                ASSERT_EQ(holders, 1u) << t.name;
                EXPECT_EQ(t.gpu_bytes[holder], t.bytes) << t.name;
                if (t.layer >= 0) {
                    EXPECT_GE(uint32_t(t.layer), p.gpus[holder].first_layer) << t.name;
                    EXPECT_LT(uint32_t(t.layer), p.gpus[holder].end_layer) << t.name;
                } else {
                    EXPECT_EQ(holder, t.name == "token_embd.weight" ? 0u : n - 1) << t.name;
                }
            }
        }
}

// The planner's ranges against every split point (2 GPUs) and every pair of them (3 GPUs).
TEST(GpuPlacement, LayerSplitIsAsBalancedAsAnExhaustiveSearch) {
    const uint32_t ctx = 1u << 20;
    for (const test::InMemoryModel *m : {&flash().q2, &flash().q4}) {
        const LayerCosts c = layer_costs(*m, ctx);
        const size_t L = c.layer.size();
        auto sum = [&](size_t a, size_t b) {
            uint64_t s = 0;
            for (size_t i = a; i < b; ++i) s += c.layer[i];
            return s;
        };
        uint64_t best2 = std::numeric_limits<uint64_t>::max();
        for (size_t a = 1; a < L; ++a)
            best2 = std::min(best2, std::max(c.first + sum(0, a), sum(a, L) + c.last));
        uint64_t best3 = std::numeric_limits<uint64_t>::max();
        for (size_t a = 1; a < L; ++a)
            for (size_t b = a + 1; b < L; ++b)
                best3 =
                    std::min(best3, std::max({c.first + sum(0, a), sum(a, b), sum(b, L) + c.last}));
        EXPECT_EQ(largest_share(plan_gpu_placement(m->hp, m->w, GpuSplit::Layers, 2, ctx, 1)),
                  best2);
        EXPECT_EQ(largest_share(plan_gpu_placement(m->hp, m->w, GpuSplit::Layers, 3, ctx, 1)),
                  best3);
    }
}

// The case the layer split exists for: the q4 layout (153 GiB) does not fit one 139 GiB card
// and fits two.
TEST(GpuPlacement, Q4NeedsTwoH200sAndTheErrorSaysHowMuch) {
    const test::InMemoryModel &q4 = flash().q4;
    const uint64_t h200 = 139 * kGiB;
    const GpuPlacement one = plan_gpu_placement(q4.hp, q4.w, GpuSplit::Layers, 1, 65536, 1024);
    try {
        check_placement_fits(one, {h200}, kGiB);
        FAIL() << "153 GiB fit 139";
    } catch (const Error &e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("the layers split does not fit: GPU 0 needs "), std::string::npos)
            << what;
        EXPECT_NE(what.find(" GiB (153.32 GiB of weights, "), std::string::npos) << what;
        EXPECT_NE(what.find("for 65536 positions, 1.00 GiB for the backend) and has 139.00 GiB "
                            "free"),
                  std::string::npos)
            << what;
    }
    const GpuPlacement two = plan_gpu_placement(q4.hp, q4.w, GpuSplit::Layers, 2, 65536, 1024);
    EXPECT_NO_THROW(check_placement_fits(two, {h200, h200}, kGiB));
    EXPECT_LT(largest_share(two), 80 * kGiB);
    const GpuPlacement tp = plan_gpu_placement(q4.hp, q4.w, GpuSplit::Tensors, 2, 65536, 1024);
    EXPECT_NO_THROW(check_placement_fits(tp, {h200, h200}, kGiB));
    EXPECT_THROW(check_placement_fits(two, {h200}, kGiB), Error);  // planned for 2, 1 found
}

TEST(GpuPlacement, TensorSplitShardsCoverEveryTensorExactly) {
    for (const test::InMemoryModel *m : {&flash().q2, &flash().q4})
        for (uint32_t n : {1u, 2u, 3u, 8u, 16u}) {
            const GpuPlacement p = plan_gpu_placement(m->hp, m->w, GpuSplit::Tensors, n, 4096, 1);
            uint64_t replicated = 0, sharded = 0;
            for (const TensorPlacement &t : p.tensors) {
                if (t.axis == ShardAxis::Whole) {
                    for (uint32_t g = 0; g < n; ++g) EXPECT_EQ(t.gpu_bytes[g], t.bytes) << t.name;
                    replicated += t.bytes;
                    continue;
                }
                uint64_t next = 0, bytes = 0;
                for (uint32_t g = 0; g < n; ++g) {
                    EXPECT_EQ(t.ranges[g].begin, next) << t.name << " on " << n;
                    EXPECT_GE(t.ranges[g].end, t.ranges[g].begin) << t.name;
                    next = t.ranges[g].end;
                    bytes += t.gpu_bytes[g];
                }
                EXPECT_EQ(next, t.extent) << t.name << " on " << n;
                EXPECT_EQ(bytes, t.bytes) << t.name << " on " << n;
                sharded += t.bytes;
            }
            EXPECT_EQ(replicated + sharded, m == &flash().q2 ? kQ2Bytes : kQ4Bytes);
            EXPECT_EQ(weight_total(p), sharded + n * replicated);
            for (const GpuShare &g : p.gpus) EXPECT_EQ(g.replicated_bytes, replicated);
        }
}

// Uneven splits: 8 head groups and 8 blocks of 256 expert columns over 3 GPUs are 2, 3, 3; over
// 16 GPUs, half of them get none.
TEST(GpuPlacement, TensorSplitDealsUnitsAsEvenlyAsTheyDivide) {
    const test::InMemoryModel &q2 = flash().q2;
    const GpuPlacement p3 = plan_gpu_placement(q2.hp, q2.w, GpuSplit::Tensors, 3, 4096, 1);
    auto ranges = [](const GpuPlacement &p, const std::string &name) {
        std::vector<uint64_t> sizes;
        for (const TensorPlacement &t : p.tensors)
            if (t.name == name)
                for (const auto &r : t.ranges) sizes.push_back(r.end - r.begin);
        return sizes;
    };
    const uint64_t group = 8 * 512;  // heads per group x head_dim rows of q_b
    EXPECT_EQ(ranges(p3, "blk.7.attn_q_b.weight"),
              (std::vector<uint64_t>{2 * group, 3 * group, 3 * group}));
    EXPECT_EQ(ranges(p3, "blk.7.attn_sinks.weight"), (std::vector<uint64_t>{16, 24, 24}));
    EXPECT_EQ(ranges(p3, "blk.7.attn_output_b.weight"), (std::vector<uint64_t>{2048, 3072, 3072}));
    EXPECT_EQ(ranges(p3, "blk.7.ffn_down_exps.weight"), (std::vector<uint64_t>{512, 768, 768}));
    EXPECT_EQ(ranges(p3, "blk.7.ffn_up_exps.weight"), (std::vector<uint64_t>{512, 768, 768}));
    // The shared expert (Q8_0, blocks of 32) is cut where the routed ones (blocks of 256) are,
    // so that every GPU's routed and shared hidden widths are equal.
    EXPECT_EQ(ranges(p3, "blk.7.ffn_down_shexp.weight"), (std::vector<uint64_t>{512, 768, 768}));
    EXPECT_EQ(ranges(p3, "blk.7.ffn_gate_shexp.weight"), (std::vector<uint64_t>{512, 768, 768}));
    EXPECT_EQ(ranges(p3, "output.weight"), (std::vector<uint64_t>{43093, 43093, 43094}));
    const GpuPlacement p16 = plan_gpu_placement(q2.hp, q2.w, GpuSplit::Tensors, 16, 4096, 1);
    const auto q_b = ranges(p16, "blk.0.attn_q_b.weight");
    EXPECT_EQ(std::count(q_b.begin(), q_b.end(), 0u), 8);
    EXPECT_EQ(std::count(q_b.begin(), q_b.end(), group), 8);
}

TEST(GpuPlacement, DescribesWhatEachGpuHolds) {
    const test::InMemoryModel &q2 = flash().q2;
    const std::string layers =
        describe_placement(q2.hp, plan_gpu_placement(q2.hp, q2.w, GpuSplit::Layers, 2, 4096, 1));
    EXPECT_EQ(layers.rfind("GPU 0: layers 0-", 0), 0u) << layers;
    EXPECT_NE(layers.find(", token embedding; "), std::string::npos) << layers;
    EXPECT_NE(layers.find("-42, output head; "), std::string::npos) << layers;
    const std::string tensors =
        describe_placement(q2.hp, plan_gpu_placement(q2.hp, q2.w, GpuSplit::Tensors, 2, 4096, 1));
    EXPECT_NE(tensors.find("GPU 1: head groups 4-7 of 8, expert hidden columns 1024-2047 of 2048, "
                           "vocabulary rows 64640-129279 of 129280; "),
              std::string::npos)
        << tensors;
    EXPECT_NE(tensors.find(" GiB on every GPU)"), std::string::npos) << tensors;
}

TEST(GpuPlacement, RefusesWhatCannotBePlaced) {
    const test::InMemoryModel &q2 = flash().q2;
    EXPECT_THROW(plan_gpu_placement(q2.hp, q2.w, GpuSplit::Layers, 0, 4096, 1), Error);
    EXPECT_THROW(plan_gpu_placement(q2.hp, q2.w, GpuSplit::Tensors, 0, 4096, 1), Error);
    EXPECT_THROW(plan_gpu_placement(q2.hp, q2.w, GpuSplit::Layers, 44, 4096, 1), Error);
    EXPECT_EQ(parse_gpu_split("layers"), GpuSplit::Layers);
    EXPECT_EQ(parse_gpu_split("tensors"), GpuSplit::Tensors);
    EXPECT_THROW(parse_gpu_split("pipeline"), Error);
}

// The state of one layer, f32 and f16, is the CPU cache's own allocation; a plan's state for
// one GPU and batches of one token is the whole f32 cache. (The CUDA backend's, whose ring holds
// a batch more, is checked against Session::kv_bytes_for in tests/cuda/test_cuda_model.cpp.)
TEST(GpuPlacement, StateBytesAreTheCacheAllocation) {
    for (const char *shape : {"tiny", "small"}) {
        const model::HParams hp = model::shape_preset(shape, 512);
        for (uint32_t ctx : {64u, 1000u, 4096u})
            for (bool f16 : {false, true}) {
                const KvCache cache(hp, ctx, f16);
                for (uint32_t il = 0; il < hp.n_layer; ++il) {
                    const LayerState &L = cache.layers[il];
                    const uint64_t allocated = L.raw.bytes() + L.comp.bytes() + L.idx.bytes() +
                                               L.comp_state.bytes() + L.idx_state.bytes();
                    EXPECT_EQ(layer_state_bytes(hp, il, hp.sliding_window, ctx, f16 ? 2 : 4),
                              allocated)
                        << shape << " layer " << il << " ctx " << ctx << " f16 " << f16;
                }
            }
    }
    const test::InMemoryModel &q2 = flash().q2;
    const GpuPlacement one = plan_gpu_placement(q2.hp, q2.w, GpuSplit::Layers, 1, 4096, 1);
    EXPECT_EQ(one.gpus[0].state_bytes, KvCache(q2.hp, 4096, false).bytes());
}

}  // namespace
