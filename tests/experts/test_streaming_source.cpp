// The streaming source against the oracle (the same file's resident mapping): every byte of every
// expert it hands out, at budgets from the floor to all experts, with both readers, O_DIRECT on
// and off, under the runtime's pattern and random ones; its accounting; the eviction rules (a
// slot a consumer may still read is never reused); faults (read error, short read, truncation,
// and a file written in place) that must end in ds4::Error and never in wrong bytes; and the
// start-up refusals.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "common/error.h"
#include "experts/fault_reader.h"
#include "experts/streaming_source.h"
#include "stream_test_model.h"

using namespace ds4;
using namespace ds4::experts;
using ds4::test::diff_expert;
using ds4::test::OpenModel;
using ds4::test::stream_model;

namespace {

bool contains(const std::string &s, const std::string &part) {
    return s.find(part) != std::string::npos;
}

std::string error_of(const std::function<void()> &f) {
    try {
        f();
    } catch (const Error &e) {
        return e.what();
    }
    return "";
}

StreamingOptions options(uint64_t budget, ReaderKind kind = ReaderKind::Pool, bool direct = true) {
    StreamingOptions o;
    o.budget.experts = budget;
    o.n_expert_used = stream_model().hp.n_expert_used;
    o.direct_io = direct;
    o.reader.kind = kind;
    return o;
}

// A reader whose reads complete inside submit: a read into a slot that a consumer still reads
// lands at once, so a test sees it at its next check.
StreamingOptions synchronous(uint64_t budget, bool direct = false) {
    StreamingOptions o = options(budget, ReaderKind::Pool, direct);
    o.make_reader = [](int fd) { return std::make_unique<FaultReader>(fd, FaultPlan{}); };
    return o;
}

void expect_invariants(const ExpertStats &s) {
    EXPECT_TRUE(s.streaming);
    EXPECT_EQ(s.hits + s.misses, s.gets);
    EXPECT_EQ(s.bytes_read, s.misses * s.expert_bytes);
    EXPECT_GE(s.disk_bytes, s.bytes_read);
    if (s.misses > 0) {
        EXPECT_GT(s.io_busy_ns, 0u);
    }
}

// n distinct experts of n_expert, sorted; experts 0-2 four times as likely as the others (a
// router's favourites), so that hotness matters.
std::vector<uint32_t> skewed_pick(std::mt19937 &rng, uint32_t n_expert, uint32_t n) {
    std::vector<uint32_t> left(n_expert);
    std::iota(left.begin(), left.end(), 0u);
    std::vector<uint32_t> out;
    while (out.size() < n) {
        uint32_t total = 0;
        for (uint32_t e : left) total += e < 3 ? 4 : 1;
        uint32_t r = rng() % total;
        size_t i = 0;
        while (r >= (left[i] < 3 ? 4u : 1u)) r -= left[i++] < 3 ? 4 : 1;
        out.push_back(left[i]);
        left.erase(left.begin() + i);
    }
    std::sort(out.begin(), out.end());
    return out;
}

// ---- exactness at every budget, both readers, O_DIRECT on and off -----------------------------

using Case =
    std::tuple<std::string, bool, double>;  // reader, O_DIRECT, budget (fraction; 0: floor)

class Exactness : public ::testing::TestWithParam<Case> {
  protected:
    void SetUp() override {
        const auto [kind, direct, fraction] = GetParam();
        const OpenModel &m = stream_model();
        const uint64_t total = uint64_t(m.n_layer()) * m.n_expert();
        const uint64_t floor = m.hp.n_expert_used;
        budget_ = fraction < 0    ? 2 * floor
                  : fraction == 0 ? floor
                                  : std::max<uint64_t>(floor, uint64_t(double(total) * fraction));
        StreamingOptions o =
            options(budget_, kind == "pool" ? ReaderKind::Pool : ReaderKind::IoUring, direct);
        src_ = std::make_unique<StreamingSource>(*m.file, m.weights, o);
        for (const auto &n : src_->notices()) {
            if (kind == "io_uring" && contains(n, "io_uring unavailable")) GTEST_SKIP() << n;
            if (direct && contains(n, "O_DIRECT")) GTEST_SKIP() << n;
        }
        ASSERT_EQ(src_->stats().entries, std::min(budget_, total));
        ASSERT_EQ(src_->stats().direct_io, direct);
        ASSERT_STREQ(src_->stats().reader, kind == "pool" ? "pread pool" : "io_uring");
    }
    uint64_t budget_ = 0;
    std::unique_ptr<StreamingSource> src_;
};

// The runtime's pattern: per step, each layer announces its sorted experts (one token's, or a
// prefill chunk's union, up to all of them), gets each in order, and ends the layer.
TEST_P(Exactness, RuntimePatternGivesTheFileBytes) {
    const OpenModel &m = stream_model();
    std::mt19937 rng(11);
    uint64_t gets = 0;
    for (int step = 0; step < 40; ++step) {
        const bool chunk = step % 5 == 0;
        for (uint32_t il = 0; il < m.n_layer(); ++il) {
            const uint32_t n = chunk ? 1 + rng() % m.n_expert() : m.hp.n_expert_used;
            const std::vector<uint32_t> sel = skewed_pick(rng, m.n_expert(), n);
            src_->prefetch(il, sel);
            ExpertBytes prev{};
            uint32_t prev_e = 0;
            for (uint32_t e : sel) {
                // The previous expert's bytes are still valid here (the next get ends them).
                if (prev.gate) {
                    ASSERT_EQ(diff_expert(m, prev, il, prev_e), "");
                }
                const ExpertBytes b = src_->get(il, e);
                ++gets;
                ASSERT_EQ(diff_expert(m, b, il, e), "") << "step " << step;
                prev = b;
                prev_e = e;
            }
            src_->layer_done(il);
        }
        src_->step_done();
    }
    const ExpertStats s = src_->stats();
    EXPECT_EQ(s.gets, gets);
    expect_invariants(s);
    EXPECT_EQ(s.prefetch_unused, 0u);  // every announced expert was got
    if (budget_ >= uint64_t(m.n_layer()) * m.n_expert()) {
        EXPECT_LE(s.misses, uint64_t(m.n_layer()) * m.n_expert());  // each read once at most
    }
}

// Random consumers that keep the contract: gets of any layer, announcements that are not used,
// layers left without layer_done; every held expert of every layer is checked after each call.
TEST_P(Exactness, RandomAccessGivesTheFileBytes) {
    const OpenModel &m = stream_model();
    std::mt19937 rng(std::hash<double>()(std::get<2>(GetParam())) + 17);
    std::map<uint32_t, std::pair<uint32_t, ExpertBytes>> held;  // layer -> its last get
    // Held experts of other layers pin slots: keep their number below the budget.
    const uint32_t layers_in_play =
        std::min<uint32_t>(m.n_layer(), std::max<uint64_t>(1, budget_ - m.hp.n_expert_used + 1));
    for (int op = 0; op < 600; ++op) {
        const uint32_t il = rng() % layers_in_play;
        const int what = rng() % 10;
        if (what < 6) {
            const uint32_t e = rng() % m.n_expert();
            const ExpertBytes b = src_->get(il, e);
            ASSERT_EQ(diff_expert(m, b, il, e), "") << "op " << op;
            held[il] = {e, b};
        } else if (what < 8) {
            std::vector<uint32_t> list;
            for (uint32_t k = rng() % m.n_expert(); k > 0; --k)
                list.push_back(rng() % m.n_expert());
            src_->prefetch(il, list);  // unsorted, duplicates, maybe never got
        } else if (what == 8) {
            src_->layer_done(il);
            held.erase(il);
        } else {
            src_->step_done();
            held.clear();
        }
        for (const auto &[l, h] : held)
            ASSERT_EQ(diff_expert(m, h.second, l, h.first), "") << "held, op " << op;
    }
    const ExpertStats s = src_->stats();
    EXPECT_EQ(s.hits + s.misses, s.gets);
    EXPECT_EQ(s.bytes_read, s.misses * s.expert_bytes);
}

std::string case_name(const ::testing::TestParamInfo<Case> &info) {
    const auto [kind, direct, fraction] = info.param;
    std::string budget = fraction < 0    ? "TwiceFloor"
                         : fraction == 0 ? "Floor"
                                         : std::to_string(int(fraction * 100 + 0.5)) + "pct";
    return std::string(kind == "pool" ? "Pool" : "Uring") + (direct ? "Direct" : "Buffered") +
           budget;
}

INSTANTIATE_TEST_SUITE_P(Budgets, Exactness,
                         ::testing::Combine(::testing::Values("pool", "io_uring"),
                                            ::testing::Bool(),
                                            ::testing::Values(0.0, -1.0, 0.10, 0.25, 0.50, 1.0)),
                         case_name);

// ---- accounting ------------------------------------------------------------------------------

TEST(StreamingSource, AllExpertsCachedMeansEachIsReadOnce) {
    const OpenModel &m = stream_model();
    const uint64_t total = uint64_t(m.n_layer()) * m.n_expert();
    StreamingSource src(*m.file, m.weights, options(total));
    for (int pass = 0; pass < 3; ++pass)
        for (uint32_t il = 0; il < m.n_layer(); ++il) {
            for (uint32_t e = 0; e < m.n_expert(); ++e)
                ASSERT_EQ(diff_expert(m, src.get(il, e), il, e), "");
            src.layer_done(il);
        }
    const ExpertStats s = src.stats();
    expect_invariants(s);
    EXPECT_EQ(s.gets, 3 * total);
    EXPECT_EQ(s.misses, total);
    EXPECT_EQ(s.hits, 2 * total);
    EXPECT_EQ(s.entries, total);
    EXPECT_EQ(s.expert_bytes, expert_geometry(m.weights).payload());
}

TEST(StreamingSource, SelectionCountsCountGets) {
    const OpenModel &m = stream_model();
    StreamingSource src(*m.file, m.weights, options(4));
    const std::vector<ExpertKey> gets = {{0, 1}, {0, 1}, {2, 7}, {5, 0}, {0, 1}};
    for (const auto &k : gets) {
        (void)src.get(k.layer, k.expert);
        src.layer_done(k.layer);
    }
    const std::vector<uint64_t> c = src.selection_counts();
    ASSERT_EQ(c.size(), uint64_t(m.n_layer()) * m.n_expert());
    EXPECT_EQ(c[0 * m.n_expert() + 1], 3u);
    EXPECT_EQ(c[2 * m.n_expert() + 7], 1u);
    EXPECT_EQ(c[5 * m.n_expert() + 0], 1u);
    EXPECT_EQ(std::accumulate(c.begin(), c.end(), uint64_t(0)), gets.size());
}

TEST(StreamingSource, ResidentSourceReportsNoStreaming) {
    const ExpertStats s = stream_model().resident->stats();
    EXPECT_FALSE(s.streaming);
    EXPECT_EQ(s.entries + s.gets + s.hits + s.misses + s.bytes_read + s.io_wait_ns, 0u);
    EXPECT_TRUE(stream_model().resident->selection_counts().empty());
}

// ---- eviction --------------------------------------------------------------------------------

// Hotness outranks recency: an expert selected often survives a run of one-off experts that
// plain LRU would let evict it; once its count has decayed, recency decides again.
TEST(StreamingSource, HotExpertsSurviveUntilTheirCountDecays) {
    const OpenModel &m = stream_model();
    StreamingOptions o = synchronous(3);
    o.decay_interval = 16;
    StreamingSource src(*m.file, m.weights, o);
    auto get0 = [&](uint32_t e) {
        EXPECT_EQ(diff_expert(m, src.get(0, e), 0, e), "");
        src.layer_done(0);
    };
    for (int i = 0; i < 10; ++i) get0(0);
    for (uint32_t e = 1; e < m.n_expert(); ++e) get0(e);
    uint64_t misses = src.stats().misses;
    get0(0);
    EXPECT_EQ(src.stats().misses, misses) << "the hot expert was evicted";
    for (int i = 0; i < 16 * 5; ++i) src.step_done();  // 11 selections halve to 0
    for (uint32_t e = 1; e < m.n_expert(); ++e) get0(e);
    misses = src.stats().misses;
    get0(0);
    EXPECT_EQ(src.stats().misses, misses + 1) << "a decayed expert kept its slot";
}

// The contract: a layer's last get stays valid while other layers get, announce and end their
// passes. Reads complete inside submit here, so reusing a held slot would change its bytes before
// the next check.
TEST(StreamingSource, AHeldExpertIsNeverEvicted) {
    const OpenModel &m = stream_model();
    const uint32_t floor = m.hp.n_expert_used;
    StreamingSource src(*m.file, m.weights, synchronous(floor + 1));
    const ExpertBytes held = src.get(0, 3);
    std::mt19937 rng(2);
    for (int i = 0; i < 300; ++i) {
        const uint32_t il = 1 + rng() % (m.n_layer() - 1), e = rng() % m.n_expert();
        std::vector<uint32_t> list = {e, (e + 1) % m.n_expert(), (e + 5) % m.n_expert()};
        std::sort(list.begin(), list.end());
        src.prefetch(il, list);
        for (uint32_t x : list) ASSERT_EQ(diff_expert(m, src.get(il, x), il, x), "");
        src.layer_done(il);
        ASSERT_EQ(diff_expert(m, held, 0, 3), "") << "iteration " << i;
    }
}

// Announced experts that are not got yet are pinned too: a demand get of another expert in the
// same layer must not take their slots.
TEST(StreamingSource, AnnouncedExpertsAreNotEvictedBeforeTheirGet) {
    const OpenModel &m = stream_model();
    StreamingSource src(*m.file, m.weights, synchronous(4));
    const std::vector<uint32_t> list = {1, 2, 3, 4, 5, 6};
    src.prefetch(0, list);  // 3 fit (one slot stays free for demand)
    for (uint32_t e : {0u, 7u, 0u, 7u}) ASSERT_EQ(diff_expert(m, src.get(0, e), 0, e), "");
    const uint64_t misses = src.stats().misses;
    for (uint32_t e : list) ASSERT_EQ(diff_expert(m, src.get(0, e), 0, e), "");
    // 1-3 were read by the prefetch and 4-6 as slots came free (read-ahead), each once, and each
    // counted as a miss at its get.
    const ExpertStats s = src.stats();
    EXPECT_EQ(s.misses, misses + list.size());
    EXPECT_EQ(s.disk_bytes, s.bytes_read);
    EXPECT_EQ(s.prefetch_unused, 0u);
}

// More held experts than slots: a clear error, and the held bytes stay right.
TEST(StreamingSource, RunningOutOfSlotsIsAnErrorNotReuse) {
    const OpenModel &m = stream_model();
    const uint32_t floor = m.hp.n_expert_used;
    StreamingSource src(*m.file, m.weights, synchronous(floor));
    std::vector<ExpertBytes> held;
    for (uint32_t il = 0; il < floor; ++il) held.push_back(src.get(il, il));
    const std::string err = error_of([&] { (void)src.get(floor, 0); });
    EXPECT_TRUE(contains(err, "slots are in use")) << err;
    for (uint32_t il = 0; il < floor; ++il) EXPECT_EQ(diff_expert(m, held[il], il, il), "");
    src.layer_done(0);
    EXPECT_EQ(diff_expert(m, src.get(floor, 0), floor, 0), "");
}

// ---- preload ---------------------------------------------------------------------------------

TEST(StreamingSource, PreloadFillsTheCacheMostWantedFirst) {
    const OpenModel &m = stream_model();
    StreamingSource src(*m.file, m.weights, options(6, ReaderKind::Auto));
    std::vector<ExpertKey> keys;
    for (uint32_t i = 0; i < 10; ++i) keys.push_back({i % m.n_layer(), (3 * i) % m.n_expert()});
    src.preload(keys);
    ExpertStats s = src.stats();
    EXPECT_EQ(s.preloaded, 6u);
    EXPECT_EQ(s.disk_bytes >= 6 * s.expert_bytes, true);
    for (size_t i = 0; i < 6; ++i) {
        ASSERT_EQ(
            diff_expert(m, src.get(keys[i].layer, keys[i].expert), keys[i].layer, keys[i].expert),
            "");
        src.layer_done(keys[i].layer);
    }
    s = src.stats();
    EXPECT_EQ(s.hits, 6u);
    EXPECT_EQ(s.misses, 0u);
    src.preload(keys);  // full: no more reads
    EXPECT_EQ(src.stats().preloaded, 6u);
}

// ---- faults ----------------------------------------------------------------------------------

StreamingOptions faulty(FaultPlan plan, bool direct = false) {
    StreamingOptions o = options(4, ReaderKind::Pool, direct);
    o.make_reader = [plan](int fd) { return std::make_unique<FaultReader>(fd, plan); };
    return o;
}

TEST(StreamingSource, AnInjectedReadErrorIsAClearErrorAndNoBytes) {
    const OpenModel &m = stream_model();
    for (bool direct : {false, true}) {
        // Raw read 2 is the up slab of the first expert read.
        StreamingSource src(*m.file, m.weights,
                            faulty({.fault = Fault::ReadError, .nth = 2}, direct));
        const std::string err = error_of([&] { (void)src.get(4, 5); });
        EXPECT_TRUE(contains(err, m.file->path())) << err;
        EXPECT_TRUE(contains(err, "layer 4 expert 5")) << err;
        EXPECT_TRUE(contains(err, "ffn_up_exps")) << err;
        EXPECT_TRUE(contains(err, "Input/output error")) << err;
        // The failed slot was dropped: the next get reads again and gets the file's bytes.
        EXPECT_EQ(diff_expert(m, src.get(4, 5), 4, 5), "");
        const ExpertStats s = src.stats();
        EXPECT_EQ(s.gets, 1u);  // the failed get returned nothing
        EXPECT_EQ(s.misses, 1u);
        EXPECT_EQ(s.bytes_read, s.expert_bytes);
        EXPECT_GT(s.disk_bytes, 0u);
    }
}

TEST(StreamingSource, AnInjectedErrorInAPrefetchSurfacesAtItsGet) {
    const OpenModel &m = stream_model();
    // Raw reads 1-3 are expert 1, 4-6 expert 2: fail expert 2's down slab.
    StreamingSource src(*m.file, m.weights, faulty({.fault = Fault::ReadError, .nth = 6}));
    const std::vector<uint32_t> list = {1, 2, 3};
    src.prefetch(1, list);
    EXPECT_EQ(diff_expert(m, src.get(1, 1), 1, 1), "");
    const std::string err = error_of([&] { (void)src.get(1, 2); });
    EXPECT_TRUE(contains(err, "layer 1 expert 2")) << err;
    EXPECT_TRUE(contains(err, "ffn_down_exps")) << err;
    EXPECT_EQ(diff_expert(m, src.get(1, 3), 1, 3), "");
    EXPECT_EQ(diff_expert(m, src.get(1, 2), 1, 2), "");
}

TEST(StreamingSource, AShortReadIsCompletedToTheFileBytes) {
    const OpenModel &m = stream_model();
    for (bool direct : {false, true})
        for (uint64_t nth : {1, 2, 3}) {
            StreamingSource src(*m.file, m.weights,
                                faulty({.fault = Fault::ShortOnce, .nth = nth}, direct));
            EXPECT_EQ(diff_expert(m, src.get(3, 6), 3, 6), "") << nth << " direct " << direct;
        }
}

TEST(StreamingSource, AShortReadAtEndOfFileIsAClearError) {
    const OpenModel &m = stream_model();
    StreamingSource src(*m.file, m.weights, faulty({.fault = Fault::ShortThenEof, .nth = 3}));
    const std::string err = error_of([&] { (void)src.get(2, 1); });
    EXPECT_TRUE(contains(err, "layer 2 expert 1")) << err;
    EXPECT_TRUE(contains(err, "ffn_down_exps")) << err;
    EXPECT_TRUE(contains(err, "ended after")) << err;
}

// A copy of the model file, for the tests that cut it short.
std::string copy_model(const std::string &name) {
    const std::string to = ds4::test::unique_temp(name);
    std::filesystem::copy_file(stream_model().file->path(), to,
                               std::filesystem::copy_options::overwrite_existing);
    return to;
}

// The routed slab that ends last in the file, and where its last expert starts.
struct LastSlab {
    uint32_t layer = 0;
    uint64_t last_expert_at = 0;
};
LastSlab last_slab(const OpenModel &m) {
    LastSlab r;
    uint64_t best = 0;
    for (uint32_t il = 0; il < m.n_layer(); ++il)
        for (model::Tensor t :
             {m.weights.layers[il].ffn_gate_exps, m.weights.layers[il].ffn_up_exps,
              m.weights.layers[il].ffn_down_exps}) {
            const uint64_t off = m.file->data_offset() + t->offset;
            if (off + t->n_bytes > best) {
                best = off + t->n_bytes;
                r.layer = il;
                r.last_expert_at = off + t->n_bytes - t->n_bytes / t->ne[2];
            }
        }
    return r;
}

TEST(StreamingSource, AFileTruncatedDuringTheRunIsAClearError) {
    for (ReaderKind kind : {ReaderKind::Pool, ReaderKind::IoUring})
        for (bool direct : {false, true}) {
            const ds4::test::RemoveOnExit copy{copy_model("experts-truncated.gguf")};
            const std::string &path = copy.path;
            const OpenModel m(path);
            StreamingSource src(*m.file, m.weights, options(4, kind, direct));
            const LastSlab cut = last_slab(m);
            const uint32_t last = m.n_expert() - 1;
            ASSERT_EQ(diff_expert(stream_model(), src.get(cut.layer, 0), cut.layer, 0), "");
            ASSERT_EQ(::truncate(path.c_str(), off_t(cut.last_expert_at + 1000)), 0);
            const std::string err = error_of([&] { (void)src.get(cut.layer, last); });
            EXPECT_TRUE(contains(err, path)) << err;
            EXPECT_TRUE(contains(
                err, "layer " + std::to_string(cut.layer) + " expert " + std::to_string(last)))
                << err;
            EXPECT_TRUE(contains(err, "truncated")) << err;
        }
}

TEST(StreamingSource, AFileWrittenInPlaceDuringTheRunIsAClearError) {
    const ds4::test::RemoveOnExit copy{copy_model("experts-rewritten.gguf")};
    const std::string &path = copy.path;
    const OpenModel m(path);
    StreamingSource src(*m.file, m.weights, options(4));
    const LastSlab cut = last_slab(m);
    ASSERT_EQ(diff_expert(stream_model(), src.get(cut.layer, 0), cut.layer, 0), "");
    {  // one byte of the last expert rewritten, and a modification time that surely differs
        std::FILE *f = std::fopen(path.c_str(), "r+b");
        ASSERT_NE(f, nullptr);
        ASSERT_EQ(std::fseek(f, long(cut.last_expert_at), SEEK_SET), 0);
        ASSERT_EQ(std::fputc(0x5a, f), 0x5a);
        ASSERT_EQ(std::fclose(f), 0);
        const struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
        ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
    }
    const std::string err = error_of([&] { (void)src.get(cut.layer, m.n_expert() - 1); });
    EXPECT_TRUE(contains(err, path)) << err;
    EXPECT_TRUE(contains(err, "changed")) << err;
}

TEST(StreamingSource, AFileTruncatedBeforeTheStartIsRefused) {
    const ds4::test::RemoveOnExit copy{copy_model("experts-short.gguf")};
    const std::string &path = copy.path;
    const OpenModel m(path);
    ASSERT_EQ(::truncate(path.c_str(), off_t(last_slab(m).last_expert_at)), 0);
    const std::string err = error_of([&] { StreamingSource src(*m.file, m.weights, options(4)); });
    EXPECT_TRUE(contains(err, "truncated?")) << err;
}

// ---- start-up refusals -----------------------------------------------------------------------

TEST(StreamingSource, ABudgetBelowTheFloorIsRefusedWithTheFloor) {
    const OpenModel &m = stream_model();
    const uint32_t floor = m.hp.n_expert_used;
    std::string err = error_of([&] { StreamingSource s(*m.file, m.weights, options(floor - 1)); });
    EXPECT_TRUE(contains(err, "floor of " + std::to_string(floor) + " experts")) << err;

    StreamingOptions o = options(0);
    o.budget.bytes = floor * expert_geometry(m.weights).slot_bytes(true) - 1;
    err = error_of([&] { StreamingSource s(*m.file, m.weights, o); });
    EXPECT_TRUE(contains(err, "floor of " + std::to_string(floor) + " experts")) << err;

    o.budget.bytes += 1;
    EXPECT_EQ(StreamingSource(*m.file, m.weights, o).stats().entries, floor);

    o = options(8);
    o.n_expert_used = 0;
    err = error_of([&] { StreamingSource s(*m.file, m.weights, o); });
    EXPECT_TRUE(contains(err, "n_expert_used")) << err;
}

TEST(StreamingSource, UnequalExpertSizesAcrossLayersAreRefused) {
    const OpenModel &m = stream_model();
    model::ModelWeights w = m.weights;
    gguf::TensorInfo bigger = *w.layers[1].ffn_up_exps;
    bigger.n_bytes += bigger.ne[2] * 256;
    w.layers[1].ffn_up_exps = &bigger;
    const std::string err = error_of([&] { StreamingSource s(*m.file, w, options(8)); });
    EXPECT_TRUE(contains(err, "layer 1")) << err;
    EXPECT_TRUE(contains(err, "equal expert sizes")) << err;
}

TEST(StreamingSource, IoUringFailureFallsBackToThePoolWithTheSameBytes) {
    const OpenModel &m = stream_model();
    StreamingOptions o = options(5, ReaderKind::Auto);
    o.reader.simulate_uring_failure = true;
    StreamingSource src(*m.file, m.weights, o);
    ASSERT_FALSE(src.notices().empty());
    EXPECT_TRUE(contains(src.notices().back(), "io_uring unavailable")) << src.notices().back();
    EXPECT_STREQ(src.stats().reader, "pread pool");
    for (uint32_t e = 0; e < m.n_expert(); ++e) EXPECT_EQ(diff_expert(m, src.get(5, e), 5, e), "");
}

TEST(StreamingSource, OutOfRangeKeysAreErrors) {
    const OpenModel &m = stream_model();
    StreamingSource src(*m.file, m.weights, options(4));
    EXPECT_THROW((void)src.get(m.n_layer(), 0), Error);
    EXPECT_THROW((void)src.get(0, m.n_expert()), Error);
    const std::vector<uint32_t> bad = {m.n_expert()};
    EXPECT_THROW(src.prefetch(0, bad), Error);
    const std::vector<ExpertKey> bad_keys = {{m.n_layer(), 0}};
    EXPECT_THROW(src.preload(bad_keys), Error);
}

}  // namespace
